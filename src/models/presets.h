// Published architecture shapes (config.json contents) of supported model families, for
// synthetic checkpoints (spool synth) and planning: the released config.json files, plus small
// test shapes. Each family's presets are data, src/models/presets/<family>.json (a list of
// {name, description, fused_experts, prefix, config}), embedded into the binary at build time
// (cmake/embed_presets.cmake): nothing is read from disk at run time.
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
  std::string source;             // where the config comes from (release repository, or what a test shape is)
  std::vector<std::string> aliases;  // other names preset() accepts (an earlier release's name)
};

/// One embedded presets file: the registry name of its family (the file name without .json)
/// and its JSON text.
struct PresetFile {
  const char* family;
  const char* json;
};

/// Every src/models/presets/*.json, in file-name order (generated at build time).
const std::vector<PresetFile>& preset_files();

/// Parses a presets file's text (`label` names it in errors): a JSON array of objects with
/// name, description (strings), config (object), and optional source (string), aliases (strings),
/// fused_experts (bool, default false) and prefix (string, default "model."). Throws spool::Error naming the entry and field.
std::vector<Preset> parse_presets(const std::string& text, const std::string& label);

/// All presets, family by family in registry order (models::families()). Throws spool::Error
/// for a malformed presets file or one whose name is no registered family.
const std::vector<Preset>& presets();
/// Preset by name or alias; throws spool::UsageError listing the names if unknown.
const Preset& preset(const std::string& name);

}  // namespace spool::models
