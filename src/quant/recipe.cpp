#include "quant/recipe.h"

#include "common/error.h"
#include "io/tensor_names.h"
#include "quant/codebook.h"

namespace spool::quant {

namespace {

ClassSpec q(ops::QType t, int g) { return ClassSpec{false, t, g}; }

// "2", "3", "4", "5", "6", "8" or "ternary".
ops::QType parse_bits(const std::string& v, const char* flag) {
  if (v == "ternary") return ops::QType::kTernary;
  for (ops::QType t : ops::kAllQTypes)
    if (t != ops::QType::kTernary && v == std::to_string(ops::qtype_bits(t))) return t;
  throw UsageError(strfmt("%s must be 2, 3, 4, 5, 6, 8 or ternary (got '%s')", flag, v.c_str()));
}

}  // namespace

std::string ClassSpec::describe() const {
  if (keep) return "bf16";
  return strfmt("%s g%d", qtype_name(type), group);
}

const char* class_name(TensorClass c) {
  switch (c) {
    case TensorClass::kDense: return "dense";
    case TensorClass::kLmHead: return "lm_head";
    case TensorClass::kExpertGateUp: return "expert_gate_up";
    case TensorClass::kExpertDown: return "expert_down";
    case TensorClass::kEmbed: return "embed_tokens";
    default: return "kept";
  }
}

const ClassSpec& Recipe::spec(TensorClass c) const {
  static const ClassSpec keep;
  switch (c) {
    case TensorClass::kDense: return dense;
    case TensorClass::kLmHead: return lm_head;
    case TensorClass::kExpertGateUp: return expert_gate_up;
    case TensorClass::kExpertDown: return expert_down;
    case TensorClass::kEmbed: return embed;
    default: return keep;
  }
}

const ClassSpec& Recipe::spec_for(const std::string& key, TensorClass c) const {
  if (c == TensorClass::kKeep) return spec(c);
  auto it = tensor_specs.find(key);
  return it != tensor_specs.end() ? it->second : spec(c);
}

const std::vector<std::string>& recipe_names() {
  static const std::vector<std::string> v = {"q4",     "tq3",    "tq3-g64", "q2",     "tq3a-tqTe",    "tq3a-tqTe-down3",
                                             "tq3a-tqTe-down4", "q8", "q6", "q5", "q4-hi8", "q4-hi6", "q4-hi8-down6", "q5-hi8"};
  return v;
}

Recipe recipe(const std::string& name) {
  using ops::QType;
  Recipe r;
  r.name = name;
  auto all = [&](ClassSpec s) { r.dense = r.lm_head = r.expert_gate_up = r.expert_down = s; };
  if (name == "q4") all(q(QType::kQ4, 64));
  else if (name == "tq3") all(q(QType::kQ3, 32));
  else if (name == "tq3-g64") all(q(QType::kQ3, 64));
  else if (name == "q2") all(q(QType::kQ2, 64));
  else if (name == "tq3a-tqTe" || name == "tq3a-tqTe-down3" || name == "tq3a-tqTe-down4") {
    all(q(QType::kQ3, 64));
    r.expert_gate_up = q(QType::kTernary, 64);
    r.expert_down = name == "tq3a-tqTe" ? q(QType::kTernary, 64) : name == "tq3a-tqTe-down3" ? q(QType::kQ3, 64) : q(QType::kQ4, 64);
  } else if (name == "q8" || name == "q6" || name == "q5") {
    all(q(name == "q8" ? QType::kQ8 : name == "q6" ? QType::kQ6 : QType::kQ5, 64));
  } else if (name == "q4-hi8" || name == "q4-hi6" || name == "q4-hi8-down6" || name == "q5-hi8") {
    // The few sensitive bytes high (dense: attention, DeltaNet, shared experts; lm_head), the
    // routed experts (most of an MoE's bytes) at 4 or 5 bits.
    all(q(name == "q4-hi6" ? QType::kQ6 : QType::kQ8, 64));
    r.expert_gate_up = r.expert_down = q(name == "q5-hi8" ? QType::kQ5 : QType::kQ4, 64);
    if (name == "q4-hi8-down6") r.expert_down = q(QType::kQ6, 64);
  } else {
    std::string list;
    for (const auto& n : recipe_names()) list += (list.empty() ? "" : ", ") + n;
    throw UsageError(strfmt("unknown recipe '%s' (known: %s)", name.c_str(), list.c_str()));
  }
  return r;
}

void apply_overrides(Recipe* r, const RecipeOverrides& o) {
  ClassSpec* classes[4] = {&r->dense, &r->lm_head, &r->expert_gate_up, &r->expert_down};
  if (o.bits) {
    if (*o.bits < 2 || *o.bits > 8 || *o.bits == 7)
      throw UsageError(strfmt("--bits must be 2, 3, 4, 5, 6 or 8 (got %d)", *o.bits));
    for (ClassSpec* c : classes) *c = ClassSpec{false, parse_bits(std::to_string(*o.bits), "--bits"), c->group};
  }
  if (o.attn_bits) r->dense = ClassSpec{false, parse_bits(*o.attn_bits, "--attn-bits"), r->dense.group};
  if (o.lm_head_bits) r->lm_head = ClassSpec{false, parse_bits(*o.lm_head_bits, "--lm-head-bits"), r->lm_head.group};
  if (o.expert_bits) {
    const ops::QType t = parse_bits(*o.expert_bits, "--expert-bits");
    r->expert_gate_up = ClassSpec{false, t, r->expert_gate_up.group};
    if (!o.expert_down_bits) r->expert_down = ClassSpec{false, t, r->expert_down.group};
  }
  if (o.expert_down_bits) r->expert_down = ClassSpec{false, parse_bits(*o.expert_down_bits, "--expert-down-bits"), r->expert_down.group};
  if (o.group_size) {
    if (*o.group_size != 32 && *o.group_size != 64 && *o.group_size != 128)
      throw UsageError(strfmt("--group-size must be 32, 64 or 128 (got %d)", *o.group_size));
    for (ClassSpec* c : classes) c->group = *o.group_size;
  }
  if (o.embed_bits) {
    if (*o.embed_bits == "bf16") {
      r->embed = ClassSpec{};
    } else {
      try {
        r->embed = ClassSpec{false, parse_bits(*o.embed_bits, "--embed-bits"), r->dense.group};
      } catch (const UsageError&) {
        throw UsageError(strfmt("--embed-bits must be 2, 3, 4, 5, 6, 8, ternary or bf16 (got '%s')", o.embed_bits->c_str()));
      }
    }
  }
}

TensorClass classify(std::string_view n, const std::vector<int64_t>& shape) {
  if (std::optional<io::ExpertName> e = io::parse_expert_name(n))
    return e->proj == io::ExpertProj::kDown ? TensorClass::kExpertDown : TensorClass::kExpertGateUp;
  if (shape.size() != 2 || !n.ends_with(".weight")) return TensorClass::kKeep;
  if (n == "lm_head.weight") return TensorClass::kLmHead;
  if (n == "embed_tokens.weight") return TensorClass::kEmbed;  // (MTP copies stay bf16 below: never read)
  if (io::parse_router_name(n) || n.find("shared_expert_gate") != std::string_view::npos || n.find("in_proj_a.") != std::string_view::npos ||
      n.find("in_proj_b.") != std::string_view::npos || n.find("in_proj_ba.") != std::string_view::npos ||
      n.find("conv1d") != std::string_view::npos || n.find("norm") != std::string_view::npos ||
      n.find("embed_tokens") != std::string_view::npos)
    return TensorClass::kKeep;
  return TensorClass::kDense;
}

int effective_group(int requested, int64_t cols) {
  if (requested <= cols && cols % requested == 0) return requested;
  for (int g : {128, 64, 32})
    if (g <= requested && g <= cols && cols % g == 0) return g;
  return static_cast<int>(cols);
}

}  // namespace spool::quant
