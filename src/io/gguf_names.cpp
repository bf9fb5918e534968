#include "io/gguf_names.h"

#include <charconv>
#include <vector>

namespace spool::io {

namespace {

// ---- Architectures ------------------------------------------------------------------------
// "llama" is loaded only with routed experts (Mixtral: llama.cpp converts MixtralForCausalLM to
// arch llama with ffn_*_exps); a dense Llama file is rejected by the config reader.
const GgufArch kArchs[] = {
    {"qwen3moe", "qwen3_moe", GgufFamily::kQwen3Moe, /*hybrid=*/false, /*v_tiled=*/false},
    {"qwen3next", "qwen3_next", GgufFamily::kQwen3Next, /*hybrid=*/true, /*v_tiled=*/false},
    {"qwen35moe", "qwen3_5_moe_text", GgufFamily::kQwen35Moe, /*hybrid=*/true, /*v_tiled=*/true},
    {"olmoe", "olmoe", GgufFamily::kOlmoe, false, false},
    {"llama", "mixtral", GgufFamily::kMixtral, false, false},
    {"glm4moe", "glm4_moe", GgufFamily::kGlm4Moe, false, false},
    {"minimax-m2", "minimax_m2", GgufFamily::kMinimaxM2, false, false},
    {"deepseek2", "deepseek_v3", GgufFamily::kDeepseek2, false, false},
    {"gpt-oss", "gpt_oss", GgufFamily::kGptOss, false, false},
};

// One row: GGUF per-layer suffix (after "blk.N.") -> HF suffix (after "layers.N.").
struct Row {
  const char* gguf;
  const char* hf;
  GgufTransform transform = GgufTransform::kNone;
  GgufShape shape = GgufShape::kReversed;
  int v_block = 0;  // 0: none; -1: d_v (filled by the loader); 1: one element per head
  bool v_after_qk = false;
};

// ---- Table: every architecture --------------------------------------------------------------
const std::vector<Row>& common_rows() {
  static const std::vector<Row> r = {
      {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_output.weight", "self_attn.o_proj.weight"},
      {"ffn_gate_inp.weight", "mlp.gate.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},  // dense (mlp_only) layers
      {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"},
  };
  return r;
}

// ---- Table: qwen3moe and olmoe (q/k norms over the whole projection: same names) -------------
// (no value transforms)
const std::vector<Row>& qwen3moe_rows() {
  static const std::vector<Row> r = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"attn_q_norm.weight", "self_attn.q_norm.weight"},
      {"attn_k_norm.weight", "self_attn.k_norm.weight"},
  };
  return r;
}

// ---- Table: minimax-m2 (full-projection q/k norms, sigmoid router with correction bias) -------
// The converter renames block_sparse_moe.e_score_correction_bias to e_score_correction.bias, so
// it lands on exp_probs_b.bias; io::Checkpoint normalises the safetensors name to mlp.gate.*.
const std::vector<Row>& minimax_m2_rows() {
  static const std::vector<Row> r = [] {
    std::vector<Row> v = qwen3moe_rows();
    v.push_back({"exp_probs_b.bias", "mlp.gate.e_score_correction_bias"});
    return v;
  }();
  return r;
}

// ---- Table: llama with experts (Mixtral) -----------------------------------------------------
// llama.cpp's LlamaModel permutes the rows of q_proj (n_head heads) and k_proj (n_head_kv heads)
// for ggml's adjacent-pair RoPE; HF Mixtral rotates halves, so the loader undoes it. The
// router and experts keep their names (block_sparse_moe.gate -> mlp.gate, as io::Checkpoint
// normalises the safetensors names).
const std::vector<Row>& llama_rows() {
  static const std::vector<Row> r = {
      {"attn_q.weight", "self_attn.q_proj.weight", GgufTransform::kUnpermuteQ},
      {"attn_k.weight", "self_attn.k_proj.weight", GgufTransform::kUnpermuteK},
      {"attn_norm.weight", "input_layernorm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
  };
  return r;
}

// ---- Table: glm4moe (GLM-4.5 / 4.6) ----------------------------------------------------------
// post_attention_layernorm is ATTN_POST_NORM for this arch; q/k/v biases; optional per-head q/k
// norms; DeepSeek-style shared experts and router correction bias. No q/k permutation (NeoX RoPE).
const std::vector<Row>& glm4moe_rows() {
  static const std::vector<Row> r = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"post_attention_norm.weight", "post_attention_layernorm.weight"},
      {"attn_q_norm.weight", "self_attn.q_norm.weight"},
      {"attn_k_norm.weight", "self_attn.k_norm.weight"},
      {"attn_q.bias", "self_attn.q_proj.bias"},
      {"attn_k.bias", "self_attn.k_proj.bias"},
      {"attn_v.bias", "self_attn.v_proj.bias"},
      {"exp_probs_b.bias", "mlp.gate.e_score_correction_bias"},
      {"ffn_gate_shexp.weight", "mlp.shared_experts.gate_proj.weight"},
      {"ffn_up_shexp.weight", "mlp.shared_experts.up_proj.weight"},
      {"ffn_down_shexp.weight", "mlp.shared_experts.down_proj.weight"},
  };
  return r;
}

// ---- Table: qwen3next and qwen35moe (norms stored as 1 + w; GDN tensors) --------------------
const std::vector<Row>& hybrid_rows(bool tiled) {
  constexpr auto N1 = GgufTransform::kNormMinus1;
  const GgufTransform V = tiled ? GgufTransform::kVRows : GgufTransform::kNone;
  static const std::vector<Row> shared = {
      {"attn_norm.weight", "input_layernorm.weight", N1},
      {"post_attention_norm.weight", "post_attention_layernorm.weight", N1},
      {"attn_q_norm.weight", "self_attn.q_norm.weight", N1},
      {"attn_k_norm.weight", "self_attn.k_norm.weight", N1},
      {"ffn_gate_shexp.weight", "mlp.shared_expert.gate_proj.weight"},
      {"ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight"},
      {"ffn_down_shexp.weight", "mlp.shared_expert.down_proj.weight"},
      {"ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight", GgufTransform::kNone, GgufShape::kRowVector},
      {"ssm_norm.weight", "linear_attn.norm.weight"},  // RMSNormGated: no +1 offset
  };
  static const std::vector<Row> next = [&] {
    std::vector<Row> r = shared;
    r.push_back({"attn_qkv.weight", "linear_attn.in_proj_qkv.weight"});
    r.push_back({"attn_gate.weight", "linear_attn.in_proj_z.weight"});
    r.push_back({"ssm_in.weight", "linear_attn.in_proj_qkvz.weight"});  // legacy layout, HF rows unchanged
    r.push_back({"ssm_ba.weight", "linear_attn.in_proj_b.weight", GgufTransform::kBaSplitB});  // a: see map_gguf_tensor
    r.push_back({"ssm_conv1d.weight", "linear_attn.conv1d.weight", GgufTransform::kNone, GgufShape::kConv1d});
    r.push_back({"ssm_dt.bias", "linear_attn.dt_bias"});
    r.push_back({"ssm_a", "linear_attn.A_log", GgufTransform::kALog});
    r.push_back({"ssm_out.weight", "linear_attn.out_proj.weight"});
    return r;
  }();
  static const std::vector<Row> q35 = [&] {
    std::vector<Row> r = shared;
    const auto VR = GgufTransform::kVRows;
    r.push_back({"attn_qkv.weight", "linear_attn.in_proj_qkv.weight", VR, GgufShape::kReversed, -1, true});
    r.push_back({"attn_gate.weight", "linear_attn.in_proj_z.weight", VR, GgufShape::kReversed, -1});
    r.push_back({"ssm_beta.weight", "linear_attn.in_proj_b.weight", VR, GgufShape::kReversed, 1});
    r.push_back({"ssm_alpha.weight", "linear_attn.in_proj_a.weight", VR, GgufShape::kReversed, 1});
    r.push_back({"ssm_conv1d.weight", "linear_attn.conv1d.weight", VR, GgufShape::kConv1d, -1, true});
    r.push_back({"ssm_dt.bias", "linear_attn.dt_bias", VR, GgufShape::kReversed, 1});
    r.push_back({"ssm_a", "linear_attn.A_log", GgufTransform::kALog, GgufShape::kReversed, 1});
    r.push_back({"ssm_out.weight", "linear_attn.out_proj.weight", GgufTransform::kVCols, GgufShape::kReversed, -1});
    return r;
  }();
  (void)V;
  return tiled ? q35 : next;
}

// ---- Table: deepseek2 (DeepSeek-V2 / V2-Lite / V3, MLA) -----------------------------------------
// q: attn_q_a + attn_q_a_norm + attn_q_b, or attn_q ("lite"); kv_b_proj as attn_kv_b (older
// files) or split into attn_k_b (per head, transposed) + attn_v_b (files with key_length_mla).
// No q/k permutation (ggml's adjacent-pair RoPE is HF DeepSeek's interleaved rope).
const std::vector<Row>& deepseek2_rows() {
  static const std::vector<Row> r = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"attn_q_a.weight", "self_attn.q_a_proj.weight"},
      {"attn_q_a_norm.weight", "self_attn.q_a_layernorm.weight"},
      {"attn_q_b.weight", "self_attn.q_b_proj.weight"},
      {"attn_kv_a_mqa.weight", "self_attn.kv_a_proj_with_mqa.weight"},
      {"attn_kv_a_norm.weight", "self_attn.kv_a_layernorm.weight"},
      {"attn_kv_b.weight", "self_attn.kv_b_proj.weight"},
      {"attn_k_b.weight", "self_attn.kv_b_proj.weight", GgufTransform::kKvbFromKb},
      {"attn_v_b.weight", "self_attn.kv_b_proj.weight", GgufTransform::kWithKb},
      {"exp_probs_b.bias", "mlp.gate.e_score_correction_bias"},
      {"ffn_gate_shexp.weight", "mlp.shared_experts.gate_proj.weight"},
      {"ffn_up_shexp.weight", "mlp.shared_experts.up_proj.weight"},
      {"ffn_down_shexp.weight", "mlp.shared_experts.down_proj.weight"},
  };
  return r;
}

// ---- Table: gpt-oss (llama.cpp LLM_ARCH_OPENAI_MOE, converter class GptOssModel) ---------------
// post_attention_layernorm is ATTN_POST_NORM for this arch; biases on q/k/v/o; sinks written as
// attn_sinks.weight; the router (mlp.router) as ffn_gate_inp with its bias; the experts' biases
// beside their merged weights (ffn_{gate,up,down}_exps.bias, {I or H, E}). gate and up were
// split out of HF's interleaved gate_up (even rows gate, odd rows up): kInterleaveUp rebuilds it.
const std::vector<Row>& gpt_oss_rows() {
  static const std::vector<Row> r = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"post_attention_norm.weight", "post_attention_layernorm.weight"},
      {"attn_q.bias", "self_attn.q_proj.bias"},
      {"attn_k.bias", "self_attn.k_proj.bias"},
      {"attn_v.bias", "self_attn.v_proj.bias"},
      {"attn_output.bias", "self_attn.o_proj.bias"},
      {"attn_sinks.weight", "self_attn.sinks"},
      {"ffn_gate_inp.weight", "mlp.router.weight"},
      {"ffn_gate_inp.bias", "mlp.router.bias"},
      {"ffn_gate_exps.bias", "mlp.experts.gate_up_proj_bias", GgufTransform::kInterleaveUp},
      {"ffn_up_exps.bias", "mlp.experts.gate_up_proj_bias", GgufTransform::kWithGate},
      {"ffn_down_exps.bias", "mlp.experts.down_proj_bias"},
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

const GgufArch* find_gguf_arch(std::string_view arch) {
  for (const GgufArch& a : kArchs)
    if (arch == a.name) return &a;
  return nullptr;
}

std::string gguf_arch_list() {
  std::string s;
  for (const GgufArch& a : kArchs) s += (s.empty() ? "" : ", ") + std::string(a.name);
  return s;
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
  auto blk = split_block(name);
  if (!blk) return std::nullopt;
  const auto [layer, rest] = *blk;
  const std::string p = "layers." + std::to_string(layer) + ".";
  m.layer = layer;
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
      if (a.family == GgufFamily::kGptOss && !e.gate_up && e.proj != ExpertProj::kDown)  // gate_up split by the converter
        m.transform = e.proj == ExpertProj::kGate ? GgufTransform::kInterleaveUp : GgufTransform::kWithGate;
      return m;
    }
  }
  // The family's table first: its rows override the common ones (llama's permuted q/k).
  const std::vector<Row>* own = nullptr;
  switch (a.family) {
    case GgufFamily::kQwen3Next: own = &hybrid_rows(false); break;
    case GgufFamily::kQwen35Moe: own = &hybrid_rows(true); break;
    case GgufFamily::kMixtral: own = &llama_rows(); break;
    case GgufFamily::kGlm4Moe: own = &glm4moe_rows(); break;
    case GgufFamily::kMinimaxM2: own = &minimax_m2_rows(); break;
    case GgufFamily::kDeepseek2: own = &deepseek2_rows(); break;
    case GgufFamily::kGptOss: own = &gpt_oss_rows(); break;
    case GgufFamily::kQwen3Moe:
    case GgufFamily::kOlmoe: own = &qwen3moe_rows(); break;
  }
  const std::vector<Row>* tables[] = {own, &common_rows()};
  for (const auto* t : tables)
    for (const Row& r : *t)
      if (rest == r.gguf) {
        m.hf_name = p + r.hf;
        m.transform = r.transform;
        m.shape = r.shape;
        m.v_block = r.v_block;
        m.v_after_qk = r.v_after_qk;
        if (m.transform == GgufTransform::kALog && !a.v_tiled) m.v_block = 0;
        return m;
      }
  return std::nullopt;
}

}  // namespace spool::io
