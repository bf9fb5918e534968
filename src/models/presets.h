// Published architecture shapes (config.json contents) of supported model families, for
// synthetic checkpoints (spool synth) and planning. Values from the released config.json
// files as transcribed in the repository's docs (Qwen3.6-35B-A3B, Qwen3-30B-A3B,
// Qwen3-Next-80B-A3B), plus small test shapes.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace spool::models {

struct Preset {
  std::string name;
  std::string description;
  nlohmann::ordered_json config;  // config.json as the release writes it
  bool fused_experts = false;     // the release's expert layout
  std::string prefix;             // text-model tensor prefix, e.g. "model.language_model."
};

/// All presets.
const std::vector<Preset>& presets();
/// Preset by name; throws spool::UsageError listing the names if unknown.
const Preset& preset(const std::string& name);

}  // namespace spool::models
