#include "io/tensor_names.h"

#include <charconv>

#include "common/error.h"
#include "io/family_rules.h"

namespace spool::io {

namespace {

constexpr int kMaxIndex = 1 << 24;

// Consumes `prefix` from the front of `s`.
bool eat(std::string_view& s, std::string_view prefix) {
  if (s.substr(0, prefix.size()) != prefix) return false;
  s.remove_prefix(prefix.size());
  return true;
}

// Consumes a decimal index followed by '.'.
bool eat_index(std::string_view& s, int* out) {
  int v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p == s.data() || v < 0 || v >= kMaxIndex || p == s.data() + s.size() || *p != '.') return false;
  if (s[0] == '0' && p - s.data() > 1) return false;  // no leading zeros
  *out = v;
  s.remove_prefix(static_cast<size_t>(p - s.data()) + 1);
  return true;
}

bool parse_part(std::string_view s, ExpertPart* part) {
  if (s == "weight") *part = ExpertPart::kWeight;
  else if (s == "qweight") *part = ExpertPart::kQWeight;
  else if (s == "scales") *part = ExpertPart::kScales;
  else if (s == "codebook") *part = ExpertPart::kCodebook;
  else if (s == "blocks") *part = ExpertPart::kMxBlocks;
  else if (s == "e8m0_scales") *part = ExpertPart::kMxScales;
  else return false;
  return true;
}

}  // namespace

std::optional<ExpertName> parse_expert_name(std::string_view s) {
  ExpertName n;
  if (!eat(s, "layers.") || !eat_index(s, &n.layer)) return std::nullopt;
  // Fused experts directly under the layer (HF Gemma 4: layers.{L}.experts.{gate_up_proj,down_proj}).
  const bool layer_level = eat(s, "experts.");
  if (!layer_level && !eat(s, "mlp.experts.")) return std::nullopt;
  if (layer_level && s != "gate_up_proj" && s != "down_proj") return std::nullopt;
  if (s == "gate_up_proj" || s == "gate_up_proj.weight" || s == "down_proj" || s == "down_proj.weight") {
    n.fused = true;
    n.proj = s[0] == 'g' ? ExpertProj::kGate : ExpertProj::kDown;
    return n;
  }
  if (!eat_index(s, &n.expert)) return std::nullopt;
  if (eat(s, "gate_proj.")) n.proj = ExpertProj::kGate;
  else if (eat(s, "up_proj.")) n.proj = ExpertProj::kUp;
  else if (eat(s, "down_proj.")) n.proj = ExpertProj::kDown;
  else return std::nullopt;
  if (!parse_part(s, &n.part)) return std::nullopt;
  return n;
}

std::optional<int> parse_router_name(std::string_view s) {
  int layer = 0;
  if (!eat(s, "layers.") || !eat_index(s, &layer)) return std::nullopt;
  if (s == "mlp.gate.weight" || s == "mlp.gate.e_score_correction_bias") return layer;
  return std::nullopt;
}

std::string apply_renames(const std::vector<TensorRename>& rules, std::string_view name, bool* squeeze) {
  *squeeze = false;
  for (const TensorRename& r : rules) {
    // Walk `from` and `name` segment by segment; "{L}" / "{E}" take a decimal index.
    std::string_view pat = r.from, s = name;
    int idx[2] = {-1, -1};
    bool ok = true;
    while (ok && !pat.empty()) {
      const size_t pd = pat.find('.');
      const std::string_view seg = pat.substr(0, pd);
      pat = pd == std::string_view::npos ? std::string_view() : pat.substr(pd + 1);
      const bool last = pd == std::string_view::npos;
      if (seg == "{L}" || seg == "{E}") {
        int v = 0;
        if (last) {  // an index as the last segment: the rest of the name
          auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
          ok = ec == std::errc() && p == s.data() + s.size() && !s.empty() && v >= 0 && v < kMaxIndex && !(s[0] == '0' && s.size() > 1);
          s = {};
        } else {
          ok = eat_index(s, &v);
        }
        idx[seg[1] == 'L' ? 0 : 1] = v;
      } else if (last) {
        ok = s == seg;
        s = {};
      } else {
        ok = s.size() > seg.size() && s.substr(0, seg.size()) == seg && s[seg.size()] == '.';
        if (ok) s.remove_prefix(seg.size() + 1);
      }
    }
    if (!ok || !s.empty()) continue;
    std::string out;
    std::string_view to = r.to;
    while (!to.empty()) {
      const size_t pd = to.find('.');
      const std::string_view seg = to.substr(0, pd);
      to = pd == std::string_view::npos ? std::string_view() : to.substr(pd + 1);
      if (!out.empty()) out += '.';
      if (seg == "{L}" || seg == "{E}") out += std::to_string(idx[seg[1] == 'L' ? 0 : 1]);
      else out += seg;
    }
    *squeeze = r.squeeze_leading_one;
    return out;
  }
  return "";
}

std::string expert_tensor_name(int layer, int expert, ExpertProj proj, ExpertPart part) {
  static const char* proj_names[] = {"gate_proj", "up_proj", "down_proj"};
  static const char* part_names[] = {"weight", "qweight", "scales", "codebook", "blocks", "e8m0_scales"};
  return strfmt("layers.%d.mlp.experts.%d.%s.%s", layer, expert, proj_names[static_cast<int>(proj)],
                part_names[static_cast<int>(part)]);
}

std::string expert_signs_name(int layer, ExpertProj proj) {
  return "layers." + std::to_string(layer) + ".mlp.experts." + (proj == ExpertProj::kDown ? "down" : "gate_up") + ".signs";
}

}  // namespace spool::io
