// Parsing of normalised checkpoint tensor names that identify routed experts and routers,
// shared by the checkpoint loader and the repacker.
//   layers.{L}.mlp.experts.{E}.{gate,up,down}_proj.{weight,qweight,scales,codebook,blocks,e8m0_scales}  per expert
//   layers.{L}.mlp.experts.{gate_up_proj,down_proj}[.weight]                         fused [E, out, in]
//   layers.{L}.experts.{gate_up_proj,down_proj}                                      fused, under the layer (Gemma 4)
//   layers.{L}.mlp.gate.{weight,e_score_correction_bias}                              routers
// (a family's own names, e.g. Mixtral's block_sparse_moe.experts.{E}.w1, are renamed to these
// first: io::TensorNameRules, io::Checkpoint::normalized_name).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace spool::io {

/// Which projection of a routed expert a tensor is.
enum class ExpertProj { kGate = 0, kUp = 1, kDown = 2 };
/// Which part of a projection a tensor is: the float weight, or the packed codes, fp16
/// group scales and codebook of a quantized weight (docs/quant-format.md), or the FP4 blocks
/// and E8M0 scales of an MXFP4 weight as Hugging Face stores it (gpt-oss, ops::Mxfp4View).
enum class ExpertPart { kWeight = 0, kQWeight = 1, kScales = 2, kCodebook = 3, kMxBlocks = 4, kMxScales = 5 };
/// Number of ExpertPart values.
constexpr int kExpertParts = 6;

/// A parsed expert tensor name.
struct ExpertName {
  int layer = 0;
  int expert = -1;       // -1 for fused tensors (all experts)
  ExpertProj proj = ExpertProj::kGate;
  ExpertPart part = ExpertPart::kWeight;
  bool fused = false;    // [E, out, in] tensor; proj kGate means gate_up_proj (gate rows, then up rows)
};

/// Parses an expert tensor name; nullopt if the name is not one (or its numbers are out of
/// range: layer and expert ids must be < 2^24).
std::optional<ExpertName> parse_expert_name(std::string_view name);

/// Layer of a router tensor name (gate weight or correction bias); nullopt if not a router.
std::optional<int> parse_router_name(std::string_view name);

/// Name of the sign vector shared by every expert's `proj` of `layer` in spool's quantized
/// format: layers.{L}.mlp.experts.gate_up.signs (gate and up) or ...experts.down.signs.
std::string expert_signs_name(int layer, ExpertProj proj);

/// The canonical per-expert name: layers.{L}.mlp.experts.{E}.{proj}.{part}.
std::string expert_tensor_name(int layer, int expert, ExpertProj proj, ExpertPart part = ExpertPart::kWeight);

}  // namespace spool::io
