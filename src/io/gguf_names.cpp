#include "io/gguf_names.h"

#include <charconv>
#include <vector>

namespace spool::io {

namespace {

// ---- Table: every architecture --------------------------------------------------------------
const std::vector<GgufRow>& common_rows() {
  static const std::vector<GgufRow> r = {
      {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_output.weight", "self_attn.o_proj.weight"},
      {"ffn_gate_inp.weight", "mlp.gate.weight", GgufTransform::kNone, GgufShape::kReversed, 0, false, /*as_float=*/true},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},  // dense (mlp_only) layers
      {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"},
  };
  return r;
}

// Parses "blk.N." at the start of `name`; returns N and the rest.
std::optional<std::pair<int, std::string_view>> split_block(std::string_view name) {
  if (!name.starts_with("blk.")) return std::nullopt;
  name.remove_prefix(4);
  int n = 0;
  auto [p, ec] = std::from_chars(name.data(), name.data() + name.size(), n);
  if (ec != std::errc() || p == name.data() || n < 0 || n >= (1 << 24) || p == name.data() + name.size() || *p != '.')
    return std::nullopt;
  return std::make_pair(n, std::string_view(p + 1, name.data() + name.size() - p - 1));
}

}  // namespace

std::vector<GgufRow> qk_norm_block_rows(const std::string& post_norm, GgufTransform t) {
  return {
      {"attn_norm.weight", "input_layernorm.weight", t},
      {post_norm + ".weight", "post_attention_layernorm.weight", t},
      {"attn_q_norm.weight", "self_attn.q_norm.weight", t},
      {"attn_k_norm.weight", "self_attn.k_norm.weight", t},
  };
}

std::optional<GgufTensorMap> map_gguf_tensor(const GgufArch& a, std::string_view name) {
  GgufTensorMap m;
  if (name == "token_embd.weight") return GgufTensorMap{"embed_tokens.weight"};
  if (name == "output.weight") return GgufTensorMap{"lm_head.weight"};
  if (name == "output_norm.weight") {
    m.hf_name = "norm.weight";
    if (a.hybrid) m.transform = GgufTransform::kNormMinus1;
    return m;
  }
  for (const GgufRow& r : a.globals)
    if (name == r.gguf) {
      m.hf_name = r.hf;
      m.transform = r.transform;
      m.shape = r.shape;
      m.as_float = r.as_float;
      return m;
    }
  auto blk = split_block(name);
  if (!blk) return std::nullopt;
  const auto [layer, rest] = *blk;
  const std::string p = "layers." + std::to_string(layer) + ".";
  m.layer = layer;
  if (rest.starts_with("nextn.")) {  // the multi-token-prediction head of block `layer`
    struct Nextn {
      const char* gguf;
      const char* hf;      // under layers.N. (MtpLayout::kNextnLayer)
      const char* mtp_hf;  // the MtpLayout::kMtpPrefix name, or null: as hf
      bool norm;
    };
    static const Nextn kNextn[] = {
        {"eh_proj.weight", "eh_proj.weight", "mtp.fc.weight", false},
        {"enorm.weight", "enorm.weight", "mtp.pre_fc_norm_embedding.weight", true},
        {"hnorm.weight", "hnorm.weight", "mtp.pre_fc_norm_hidden.weight", true},
        {"shared_head_norm.weight", "shared_head.norm.weight", "mtp.norm.weight", true},
        {"shared_head_head.weight", "shared_head.head.weight", nullptr, false},
        {"embed_tokens.weight", "embed_tokens.weight", nullptr, false},
    };
    for (const Nextn& n : kNextn)
      if (rest.substr(6) == n.gguf) {
        m.nextn = true;
        m.hf_name = a.mtp == MtpLayout::kMtpPrefix && n.mtp_hf != nullptr ? std::string(n.mtp_hf) : p + n.hf;
        if (n.norm && a.hybrid) m.transform = GgufTransform::kNormMinus1;
        return m;
      }
    return std::nullopt;
  }
  // Merged routed experts [E, out, in]: one contiguous slab per expert.
  struct Exps {
    const char* gguf;
    ExpertProj proj;
    bool gate_up;
  };
  for (const Exps& e : {Exps{"ffn_gate_exps.weight", ExpertProj::kGate, false}, Exps{"ffn_up_exps.weight", ExpertProj::kUp, false},
                        Exps{"ffn_down_exps.weight", ExpertProj::kDown, false},
                        Exps{"ffn_gate_up_exps.weight", ExpertProj::kGate, true}}) {
    if (rest == e.gguf) {
      m.merged_experts = true;
      m.proj = e.proj;
      m.gate_up = e.gate_up;
      m.hf_name = p + "mlp.experts";
      if (a.split_gate_up && !e.gate_up && e.proj != ExpertProj::kDown)  // gate_up split by the converter
        m.transform = e.proj == ExpertProj::kGate ? GgufTransform::kInterleaveUp : GgufTransform::kWithGate;
      return m;
    }
  }
  // The family's rows first: they override the common ones (llama's permuted q/k).
  const std::vector<GgufRow>* tables[] = {&a.rows, &common_rows()};
  for (const auto* t : tables)
    for (const GgufRow& r : *t)
      if (rest == r.gguf) {
        m.hf_name = p + r.hf;
        m.transform = r.transform;
        m.shape = r.shape;
        m.v_block = r.v_block;
        m.v_after_qk = r.v_after_qk;
        m.as_float = r.as_float;
        if (m.transform == GgufTransform::kALog && !a.v_tiled) m.v_block = 0;
        return m;
      }
  return std::nullopt;
}

std::vector<int64_t> gguf_unpermute_order(int64_t n, int64_t n_heads) {
  const int64_t hd = n / n_heads, half = hd / 2;
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t h = 0; h < n_heads; ++h)
    for (int64_t k = 0; k < half; ++k)
      for (int64_t s = 0; s < 2; ++s) order[h * hd + s * half + k] = h * hd + 2 * k + s;
  return order;
}

std::vector<int64_t> gguf_tiled_of_grouped(int64_t n_k, int64_t n_v) {
  const int64_t r = n_v / n_k;
  std::vector<int64_t> m(static_cast<size_t>(n_v));
  for (int64_t g = 0; g < n_k; ++g)
    for (int64_t q = 0; q < r; ++q) m[g * r + q] = q * n_k + g;
  return m;
}

std::pair<std::vector<int64_t>, std::vector<int64_t>> gguf_ba_split_rows(int64_t n_k, int64_t n_v) {
  const int64_t R = n_v / n_k;
  std::pair<std::vector<int64_t>, std::vector<int64_t>> rows;
  for (int64_t g = 0; g < n_k; ++g)
    for (int64_t q = 0; q < R; ++q) {
      rows.first.push_back(g * 2 * R + q);
      rows.second.push_back(g * 2 * R + R + q);
    }
  return rows;
}

}  // namespace spool::io
