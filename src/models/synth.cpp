#include "models/synth.h"

#include <sys/statvfs.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "common/error.h"
#include "common/files.h"
#include "common/sysinfo.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "models/family.h"
#include "models/spec.h"
#include "ops/weights.h"

namespace spool::models {

namespace fs = std::filesystem;

namespace {

// kBytes: uniform random bytes (MXFP4 codes); kE8m0: E8M0 scale bytes around 2^value.
enum class Init { kNormal, kConst, kALog, kDtBias, kBytes, kE8m0 };

struct TensorPlan {
  std::string name;
  std::vector<int64_t> shape;
  Init init = Init::kNormal;
  float value = 0.0f;  // std for kNormal, constant for kConst, log2 of the scale for kE8m0
  int layer = -1;
  bool u8 = false;     // stored as U8 whatever --dtype says (MXFP4 blocks and scales)
};

// Whether the family's released checkpoints keep the routed block as block_sparse_moe.experts.{e}.{w1,w3,w2}
// (Mixtral's naming): its tensor rules rename those to the normalised mlp.experts names, so synth
// writes them as released and the checkpoint reader renames them back.
bool released_as_block_sparse_moe(const std::string& family) {
  const Family* f = family_named(family);
  if (f == nullptr) return false;
  for (const io::TensorRename& r : f->tensors.renames)
    if (r.from.find(".block_sparse_moe.experts.") != std::string::npos) return true;
  return false;
}

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

// Fills `n` elements of dtype `dt` at `out` from a shared N(0,1) pool, scaled by std.
class Filler {
 public:
  explicit Filler(uint64_t seed) : rng_(seed), pool_(1 << 22) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto& x : pool_) x = nd(rng_);
  }
  void fill(const TensorPlan& t, io::DType dt, int64_t n, uint8_t* out) {
    if (t.init == Init::kBytes || t.init == Init::kE8m0) {
      for (int64_t i = 0; i < n; ++i)
        out[i] = static_cast<uint8_t>(t.init == Init::kBytes ? rng_() : static_cast<uint64_t>(127 + static_cast<int>(t.value)) + rng_() % 2);
      return;
    }
    const size_t es = io::dtype_size(dt);
    if (t.init == Init::kNormal || t.init == Init::kDtBias) {
      // Copy runs of a pre-scaled, pre-converted N(0, std) pool from random offsets: fast
      // enough to write tens of GB, and not periodic across experts.
      const float std = t.init == Init::kNormal ? t.value : 0.5f;
      const std::vector<uint8_t>& pool = scaled_pool(std, dt);
      const size_t pool_n = pool.size() / es;
      constexpr int64_t kRun = 1 << 16;
      std::uniform_int_distribution<size_t> start(0, pool_n - kRun - 1);
      for (int64_t i = 0; i < n; i += kRun) {
        const int64_t m = std::min(kRun, n - i);
        std::memcpy(out + i * es, pool.data() + start(rng_) * es, static_cast<size_t>(m) * es);
      }
      return;
    }
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    for (int64_t i = 0; i < n; ++i) {
      const float v = t.init == Init::kConst ? t.value : std::log(1.0f + 15.0f * u(rng_));  // kALog: log U(1, 16)
      store(v, dt, out + i * es);
    }
  }

 private:
  static void store(float v, io::DType dt, uint8_t* out) {
    if (dt == io::DType::F32) {
      std::memcpy(out, &v, 4);
    } else {
      const uint16_t h = dt == io::DType::BF16 ? ops::f32_to_bf16(v) : f32_to_f16(v);
      std::memcpy(out, &h, 2);
    }
  }
  const std::vector<uint8_t>& scaled_pool(float std, io::DType dt) {
    auto key = std::make_pair(std, static_cast<int>(dt));
    auto it = pools_.find(key);
    if (it != pools_.end()) return it->second;
    std::vector<uint8_t>& p = pools_[key];
    const size_t es = io::dtype_size(dt);
    p.resize(pool_.size() * es);
    for (size_t i = 0; i < pool_.size(); ++i) store(pool_[i] * std, dt, p.data() + i * es);
    return p;
  }
  static uint16_t f32_to_f16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const int32_t e = static_cast<int32_t>((u >> 23) & 0xff) - 127 + 15;
    if (e <= 0) return static_cast<uint16_t>(sign);
    if (e >= 31) return static_cast<uint16_t>(sign | 0x7bffu);
    uint32_t h = sign | (static_cast<uint32_t>(e) << 10) | ((u & 0x7fffffu) >> 13);
    if (u & 0x1000u) ++h;
    return static_cast<uint16_t>(h);
  }
  std::mt19937_64 rng_;
  std::vector<float> pool_;  // N(0, 1)
  std::map<std::pair<float, int>, std::vector<uint8_t>> pools_;
};

float lin(int64_t in) { return 1.0f / std::sqrt(static_cast<float>(in)); }

// Layer i of spec s (mixer, FFN and their norms), its tensors named `p` + "...". out_scale
// divides the output projections (1 / sqrt(2 * the main stack's depth)).
void plan_layer(std::vector<TensorPlan>& v, const ModelSpec& s, int i, const std::string& p, bool fused, float out_scale) {
  const int64_t H = s.hidden_size;
  const float norm_id = s.norm_one_plus ? 0.0f : 1.0f;  // stored value of an identity norm
  {
    v.push_back({p + "input_layernorm.weight", {H}, Init::kConst, norm_id, i});
    v.push_back({p + "post_attention_layernorm.weight", {H}, Init::kConst, norm_id, i});
    if (s.sandwich_norms) {
      v.push_back({p + "pre_feedforward_layernorm.weight", {H}, Init::kConst, norm_id, i});
      v.push_back({p + "post_feedforward_layernorm.weight", {H}, Init::kConst, norm_id, i});
    }
    if (s.parallel_dense_ffn && s.ffns[i] == FfnKind::kMoE) {  // the dense MLP beside the experts and its norms
      const int64_t I = s.dense_intermediate;
      for (const char* n : {"pre_feedforward_layernorm_2", "post_feedforward_layernorm_1", "post_feedforward_layernorm_2"})
        v.push_back({p + n + ".weight", {H}, Init::kConst, norm_id, i});
      v.push_back({p + "mlp.gate_proj.weight", {I, H}, Init::kNormal, lin(H), i});
      v.push_back({p + "mlp.up_proj.weight", {I, H}, Init::kNormal, lin(H), i});
      v.push_back({p + "mlp.down_proj.weight", {H, I}, Init::kNormal, lin(I) * out_scale, i});
    }
    if (s.residual_scale) v.push_back({p + "layer_scalar", {1}, Init::kConst, 1.0f, i});
    if (s.mixers[i] == MixerKind::kMLA) {  // DeepSeek MLA (models/mla.h)
      const auto& m = s.mla;
      const int64_t nh = s.attn.n_heads, qd = m.qk_nope_head_dim + m.qk_rope_head_dim;
      const std::string q = p + "self_attn.";
      if (m.q_lora_rank > 0) {
        v.push_back({q + "q_a_proj.weight", {m.q_lora_rank, H}, Init::kNormal, lin(H), i});
        v.push_back({q + "q_a_layernorm.weight", {m.q_lora_rank}, Init::kConst, 1.0f, i});
        v.push_back({q + "q_b_proj.weight", {nh * qd, m.q_lora_rank}, Init::kNormal, lin(m.q_lora_rank), i});
      } else {
        v.push_back({q + "q_proj.weight", {nh * qd, H}, Init::kNormal, lin(H), i});
      }
      v.push_back({q + "kv_a_proj_with_mqa.weight", {m.kv_lora_rank + m.qk_rope_head_dim, H}, Init::kNormal, lin(H), i});
      v.push_back({q + "kv_a_layernorm.weight", {m.kv_lora_rank}, Init::kConst, 1.0f, i});
      v.push_back({q + "kv_b_proj.weight", {nh * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank}, Init::kNormal, lin(m.kv_lora_rank), i});
      v.push_back({q + "o_proj.weight", {H, nh * m.v_head_dim}, Init::kNormal, lin(nh * m.v_head_dim) * out_scale, i});
    } else if (s.mixers[i] == MixerKind::kAttention) {
      const auto& a = s.attn_of(i);
      const std::string q = p + "self_attn.";
      v.push_back({q + "q_proj.weight", {a.n_heads * a.head_dim * (a.output_gate ? 2 : 1), H}, Init::kNormal, lin(H), i});
      v.push_back({q + "k_proj.weight", {a.n_kv_heads * a.head_dim, H}, Init::kNormal, lin(H), i});
      if (!a.k_eq_v) v.push_back({q + "v_proj.weight", {a.n_kv_heads * a.head_dim, H}, Init::kNormal, lin(H), i});
      v.push_back({q + "o_proj.weight", {H, a.n_heads * a.head_dim}, Init::kNormal, lin(a.n_heads * a.head_dim) * out_scale, i});
      if (a.qkv_bias) {  // GLM-4.5 attention_bias, gpt-oss
        v.push_back({q + "q_proj.bias", {a.n_heads * a.head_dim}, Init::kNormal, 0.02f, i});
        v.push_back({q + "k_proj.bias", {a.n_kv_heads * a.head_dim}, Init::kNormal, 0.02f, i});
        v.push_back({q + "v_proj.bias", {a.n_kv_heads * a.head_dim}, Init::kNormal, 0.02f, i});
      }
      if (a.o_bias) v.push_back({q + "o_proj.bias", {H}, Init::kConst, 0.0f, i});  // gpt-oss
      if (a.sinks) v.push_back({q + "sinks", {a.n_heads}, Init::kConst, 0.0f, i});
      if (a.qk_norm != QkNorm::kNone) {  // per head, or over the whole projection
        const bool whole = a.qk_norm == QkNorm::kWholeProjection;
        v.push_back({q + "q_norm.weight", {whole ? a.n_heads * a.head_dim : a.head_dim}, Init::kConst, norm_id, i});
        v.push_back({q + "k_norm.weight", {whole ? a.n_kv_heads * a.head_dim : a.head_dim}, Init::kConst, norm_id, i});
      }
    } else {
      const auto& g = s.gdn;
      const std::string q = p + "linear_attn.";
      if (g.layout == GdnLayout::kGroupedQkvz) {
        v.push_back({q + "in_proj_qkvz.weight", {2 * g.key_dim() + 2 * g.value_dim(), H}, Init::kNormal, lin(H), i});
        v.push_back({q + "in_proj_ba.weight", {2 * g.n_v, H}, Init::kNormal, lin(H), i});
      } else {
        v.push_back({q + "in_proj_qkv.weight", {g.conv_dim(), H}, Init::kNormal, lin(H), i});
        v.push_back({q + "in_proj_z.weight", {g.value_dim(), H}, Init::kNormal, lin(H), i});
        v.push_back({q + "in_proj_b.weight", {g.n_v, H}, Init::kNormal, lin(H), i});
        v.push_back({q + "in_proj_a.weight", {g.n_v, H}, Init::kNormal, lin(H), i});
      }
      v.push_back({q + "conv1d.weight", {g.conv_dim(), 1, g.conv_kernel}, Init::kNormal, 0.5f, i});
      v.push_back({q + "A_log", {g.n_v}, Init::kALog, 0.0f, i});
      v.push_back({q + "dt_bias", {g.n_v}, Init::kDtBias, 0.0f, i});
      v.push_back({q + "norm.weight", {g.d_v}, Init::kConst, 1.0f, i});
      v.push_back({q + "out_proj.weight", {H, g.value_dim()}, Init::kNormal, lin(g.value_dim()) * out_scale, i});
    }
    const std::string m = p + "mlp.";
    if (s.ffns[i] == FfnKind::kDense) {
      const int64_t I = s.dense_intermediate;
      v.push_back({m + "gate_proj.weight", {I, H}, Init::kNormal, lin(H), i});
      v.push_back({m + "up_proj.weight", {I, H}, Init::kNormal, lin(H), i});
      v.push_back({m + "down_proj.weight", {H, I}, Init::kNormal, lin(I) * out_scale, i});
      return;
    }
    const auto& mo = s.moe;
    const int64_t E = mo.n_experts, I = mo.intermediate;
    if (mo.gate_up == GateUpLayout::kFusedInterleaved) {  // gpt-oss as released: router with bias; experts
      // fused: MXFP4, or float [E, in, out], with biases
      v.push_back({m + "router.weight", {E, H}, Init::kNormal, lin(H), i});
      v.push_back({m + "router.bias", {E}, Init::kConst, 0.0f, i});
      if (fused) {
        // FP4 codes have rms ~2.9: scales 2^-7 .. 2^-6 (gate_up) give weights of std ~0.03, about
        // 1/sqrt(H) at H = 2880; down a quarter of that (the output projections are scaled down).
        v.push_back({m + "experts.gate_up_proj_blocks", {E, 2 * I, H / 32, 16}, Init::kBytes, 0.0f, i, true});
        v.push_back({m + "experts.gate_up_proj_scales", {E, 2 * I, H / 32}, Init::kE8m0, -7.0f, i, true});
        v.push_back({m + "experts.down_proj_blocks", {E, H, I / 32, 16}, Init::kBytes, 0.0f, i, true});
        v.push_back({m + "experts.down_proj_scales", {E, H, I / 32}, Init::kE8m0, -9.0f, i, true});
      } else {
        v.push_back({m + "experts.gate_up_proj", {E, H, 2 * I}, Init::kNormal, lin(H), i});
        v.push_back({m + "experts.down_proj", {E, I, H}, Init::kNormal, lin(I) * out_scale, i});
      }
      v.push_back({m + "experts.gate_up_proj_bias", {E, 2 * I}, Init::kConst, 0.0f, i});
      v.push_back({m + "experts.down_proj_bias", {E, H}, Init::kConst, 0.0f, i});
      return;
    }
    if (mo.block_prefix != "mlp.") {  // a router and fused experts under layers.{i}.{block_prefix} (Gemma 4)
      const std::string b = p + mo.block_prefix;
      v.push_back({b + mo.router_weight, {E, H}, Init::kNormal, lin(H), i});
      if (mo.router_input_scale) v.push_back({b + "router.scale", {H}, Init::kConst, 1.0f, i});
      if (mo.per_expert_scale) v.push_back({b + "router.per_expert_scale", {E}, Init::kConst, 1.0f, i});
      v.push_back({b + "experts.gate_up_proj", {E, 2 * I, H}, Init::kNormal, lin(H), i});
      v.push_back({b + "experts.down_proj", {E, H, I}, Init::kNormal, lin(I) * out_scale, i});
      return;
    }
    // block_sparse_moe.experts.{e}.{w1,w3,w2} as released (MiniMax-M2: its bias beside the gate)
    const bool mixtral = released_as_block_sparse_moe(s.family);
    v.push_back({(mixtral ? p + "block_sparse_moe." : m) + "gate.weight", {E, H}, Init::kNormal, lin(H), i});
    if (mo.score_bias)
      v.push_back({mixtral ? p + "block_sparse_moe.e_score_correction_bias" : m + "gate.e_score_correction_bias", {E}, Init::kConst, 0.0f, i});
    if (mixtral) {
      for (int64_t e = 0; e < E; ++e) {
        const std::string x = p + "block_sparse_moe.experts." + std::to_string(e) + ".";
        v.push_back({x + "w1.weight", {I, H}, Init::kNormal, lin(H), i});
        v.push_back({x + "w3.weight", {I, H}, Init::kNormal, lin(H), i});
        v.push_back({x + "w2.weight", {H, I}, Init::kNormal, lin(I) * out_scale, i});
      }
    } else if (fused) {
      v.push_back({m + "experts.gate_up_proj", {E, 2 * I, H}, Init::kNormal, lin(H), i});
      v.push_back({m + "experts.down_proj", {E, H, I}, Init::kNormal, lin(I) * out_scale, i});
    } else {
      for (int64_t e = 0; e < E; ++e) {
        const std::string x = m + "experts." + std::to_string(e) + ".";
        v.push_back({x + "gate_proj.weight", {I, H}, Init::kNormal, lin(H), i});
        v.push_back({x + "up_proj.weight", {I, H}, Init::kNormal, lin(H), i});
        v.push_back({x + "down_proj.weight", {H, I}, Init::kNormal, lin(I) * out_scale, i});
      }
    }
    if (mo.shared_intermediate > 0) {
      const int64_t S = mo.shared_intermediate;
      const std::string se = m + mo.shared_name + ".";
      v.push_back({se + "gate_proj.weight", {S, H}, Init::kNormal, lin(H), i});
      v.push_back({se + "up_proj.weight", {S, H}, Init::kNormal, lin(H), i});
      v.push_back({se + "down_proj.weight", {H, S}, Init::kNormal, lin(S) * out_scale, i});
      if (mo.shared_expert_gate) v.push_back({m + "shared_expert_gate.weight", {1, H}, Init::kNormal, lin(H), i});
    }
  }
}

// The multi-token-prediction head of spec s (one layer after the main stack, as mtp_spec() lays
// it out: the last attention layer's mixer + a routed-expert FFN), in the layout s.mtp_layout
// names. io::MtpLayout::kMtpPrefix: mtp.fc [H, 2H], its pre-fc norms of the embedding and the
// hidden state, mtp.norm, and the layer as mtp.layers.0.*; kNextnLayer: the nextn layer under
// layers.{n_layers}. with eh_proj, enorm, hnorm and shared_head.{norm,head} (models/decoder.cpp
// bind_mtp).
void plan_mtp(std::vector<TensorPlan>& v, const ModelSpec& s, const std::string& prefix, bool fused) {
  const bool stacked = s.mtp_layout == io::MtpLayout::kMtpPrefix;
  ModelSpec with = s;
  with.mtp_layers = 1;
  const ModelSpec full = mtp_spec(with);
  const int64_t H = s.hidden_size;
  const int N = s.n_layers;
  const float out_scale = 1.0f / std::sqrt(2.0f * s.n_layers);
  const float norm_id = s.norm_one_plus ? 0.0f : 1.0f;
  const std::string p = stacked ? "mtp." : prefix + "layers." + std::to_string(N) + ".";
  v.push_back({p + (stacked ? "fc.weight" : "eh_proj.weight"), {H, 2 * H}, Init::kNormal, lin(2 * H), N});
  v.push_back({p + (stacked ? "pre_fc_norm_embedding.weight" : "enorm.weight"), {H}, Init::kConst, norm_id, N});
  v.push_back({p + (stacked ? "pre_fc_norm_hidden.weight" : "hnorm.weight"), {H}, Init::kConst, norm_id, N});
  plan_layer(v, full, N, stacked ? p + "layers.0." : p, fused, out_scale);
  v.push_back({p + (stacked ? "norm.weight" : "shared_head.norm.weight"), {H}, Init::kConst, norm_id, N});
  if (!stacked) v.push_back({p + "shared_head.head.weight", {s.vocab_size, H}, Init::kNormal, lin(H), N});
}

std::vector<TensorPlan> plan_tensors(const ModelSpec& s, const std::string& prefix, bool fused) {
  std::vector<TensorPlan> v;
  const int64_t H = s.hidden_size;
  const float out_scale = 1.0f / std::sqrt(2.0f * s.n_layers);
  const float norm_id = s.norm_one_plus ? 0.0f : 1.0f;  // stored value of an identity norm
  v.push_back({prefix + "embed_tokens.weight", {s.vocab_size, H}, Init::kNormal, 1.0f});
  for (int i = 0; i < s.n_layers; ++i) plan_layer(v, s, i, prefix + "layers." + std::to_string(i) + ".", fused, out_scale);
  v.push_back({prefix + "norm.weight", {H}, Init::kConst, norm_id});
  v.push_back({"lm_head.weight", {s.vocab_size, H}, Init::kNormal, lin(H)});
  return v;
}

}  // namespace

// write_synthetic, or with `headers_only` set, synthetic_headers: the headers are filled in and
// nothing is written.
static SynthResult synthesize(const SynthOptions& opt, const std::function<void(uint64_t, uint64_t)>& progress, SynthHeaders* headers_only) {
  const Preset& pr = preset(opt.preset);
  io::DType dt;
  if (opt.dtype == "bf16") dt = io::DType::BF16;
  else if (opt.dtype == "f16") dt = io::DType::F16;
  else if (opt.dtype == "f32") dt = io::DType::F32;
  else throw UsageError(strfmt("--dtype must be bf16, f16 or f32 (got '%s')", opt.dtype.c_str()));
  bool fused = pr.fused_experts;
  if (opt.layout == "fused") fused = true;
  else if (opt.layout == "per-expert") fused = false;
  else if (!opt.layout.empty()) throw UsageError(strfmt("--layout must be fused or per-expert (got '%s')", opt.layout.c_str()));

  // Config with the requested depth.
  nlohmann::ordered_json cfg = pr.config;
  nlohmann::ordered_json& text = cfg.contains("text_config") ? cfg["text_config"] : cfg;
  const int full_layers = text["num_hidden_layers"].get<int>();
  if (opt.layers < 0) throw UsageError(strfmt("--layers must be >= 1 (got %d)", opt.layers));
  const int layers = opt.layers > 0 ? opt.layers : full_layers;
  if (layers > full_layers) throw UsageError(strfmt("--layers %d exceeds the preset's %d layers", layers, full_layers));
  text["num_hidden_layers"] = layers;
  for (const char* key : {"layer_types", "mlp_layer_types"}) {  // per-layer lists (GLM-4.7-Flash: mlp_layer_types)
    if (!text.contains(key)) continue;
    nlohmann::ordered_json lt = nlohmann::ordered_json::array();
    for (int i = 0; i < layers; ++i) lt.push_back(text[key][i]);
    text[key] = lt;
  }
  text["dtype"] = opt.dtype == "bf16" ? "bfloat16" : opt.dtype == "f16" ? "float16" : "float32";
  io::Config raw(nlohmann::json::parse(cfg.dump()), "preset " + pr.name);
  ModelSpec spec = build_spec(io::text_config_of(raw, "preset"), {}, false, "preset " + pr.name);
  if (opt.mtp) {
    if (spec.mtp_layout == io::MtpLayout::kNone)
      throw UsageError(strfmt("--mtp: preset %s (family %s) has no multi-token-prediction layout (its family sets no "
                              "ModelSpec::mtp_layout)", pr.name.c_str(), spec.family.c_str()));
    bool attention = false;
    for (int i = 0; i < spec.n_layers; ++i) attention = attention || spec.mixers[i] == MixerKind::kAttention || spec.mixers[i] == MixerKind::kMLA;
    if (!attention)
      throw UsageError(strfmt("--mtp: the MTP layer copies the stack's attention layer, and the first %d layers of %s have none "
                              "(use more --layers)", layers, pr.name.c_str()));
    // The config's own key for the head's depth (the loader counts the layers it finds).
    text.erase("mtp_num_hidden_layers");
    text.erase("num_nextn_predict_layers");
    text[spec.mtp_layout == io::MtpLayout::kMtpPrefix ? "mtp_num_hidden_layers" : "num_nextn_predict_layers"] = 1;
  }

  std::vector<TensorPlan> plan = plan_tensors(spec, pr.prefix, fused);
  if (opt.mtp) plan_mtp(plan, spec, pr.prefix, fused);
  auto dtype_of = [&](const TensorPlan& t) { return t.u8 ? io::DType::U8 : dt; };
  uint64_t total = 0;
  bool any_u8 = false;
  for (const auto& t : plan) {
    total += static_cast<uint64_t>(numel(t.shape)) * io::dtype_size(dtype_of(t));
    any_u8 = any_u8 || t.u8;
  }
  // Float experts: the release's MXFP4 quantization_config does not describe them.
  if (!any_u8 && cfg.contains("quantization_config")) cfg.erase("quantization_config");
  if (headers_only != nullptr) {
    nlohmann::json h = nlohmann::json::object();  // not ordered_json: its lookups are linear (70k tensors)
    h["__metadata__"] = {{"format", "pt"}, {"spool", "synthetic"}};
    uint64_t off = 0;
    for (const auto& t : plan) {
      const auto d = dtype_of(t);
      const uint64_t n = static_cast<uint64_t>(numel(t.shape)) * io::dtype_size(d);
      h[t.name] = {{"dtype", io::dtype_name(d)}, {"shape", t.shape}, {"data_offsets", {off, off + n}}};
      off += n;
    }
    *headers_only = {cfg, h.dump(), total};
    return {total, 1, static_cast<int64_t>(plan.size()), spec.model_type};
  }

  if (opt.out_dir.empty()) throw UsageError("--out is required");
  if (fs::exists(opt.out_dir) && !fs::is_directory(opt.out_dir)) fail("--out %s exists and is not a directory", opt.out_dir.c_str());
  std::error_code ec;
  fs::create_directories(opt.out_dir, ec);
  if (ec) fail("%s: cannot create the directory (%s)", opt.out_dir.c_str(), ec.message().c_str());
  if (!opt.force && !fs::is_empty(opt.out_dir))
    fail("%s is not empty; choose an empty directory (or pass --force to overwrite spool's files there)", opt.out_dir.c_str());
  if (opt.force) {  // earlier weights (e.g. more shards and their index) must not survive
    for (const auto& e : fs::directory_iterator(opt.out_dir)) {
      const std::string n = e.path().filename().string();
      if (n.rfind("model", 0) == 0 && n.find(".safetensors") != std::string::npos) fs::remove(e.path());
    }
  }
  struct statvfs vfs;
  if (statvfs(opt.out_dir.c_str(), &vfs) == 0) {
    const uint64_t free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    if (total + (64ull << 20) > free_bytes)
      fail("%s: the checkpoint needs %s but only %s is free; use --layers to write fewer layers", opt.out_dir.c_str(),
           format_bytes(total).c_str(), format_bytes(free_bytes).c_str());
  }

  // Shards: whole layers per shard, new shard past shard_bytes.
  std::vector<std::vector<size_t>> shards(1);
  uint64_t cur = 0;
  int cur_layer = -2;
  for (size_t i = 0; i < plan.size(); ++i) {
    const uint64_t n = static_cast<uint64_t>(numel(plan[i].shape)) * io::dtype_size(dtype_of(plan[i]));
    if (plan[i].layer != cur_layer && cur > 0 && cur + n > opt.shard_bytes) {
      shards.emplace_back();
      cur = 0;
    }
    cur_layer = plan[i].layer;
    shards.back().push_back(i);
    cur += n;
  }
  Filler filler(opt.seed);
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  uint64_t done = 0;
  std::vector<uint8_t> buf;
  const int ns = static_cast<int>(shards.size());
  for (int s = 0; s < ns; ++s) {
    const std::string fname = ns == 1 ? "model.safetensors" : strfmt("model-%05d-of-%05d.safetensors", s + 1, ns);
    std::vector<io::SafetensorsWriter::Spec> specs;
    for (size_t i : shards[s]) {
      specs.push_back({plan[i].name, dtype_of(plan[i]), plan[i].shape});
      weight_map[plan[i].name] = fname;
    }
    io::SafetensorsWriter w(opt.out_dir + "/" + fname, specs, {{"format", "pt"}, {"spool", "synthetic"}});
    for (size_t i : shards[s]) {
      const int64_t n = numel(plan[i].shape);
      const io::DType tdt = dtype_of(plan[i]);
      const int64_t chunk = (32 << 20) / static_cast<int64_t>(io::dtype_size(tdt));
      for (int64_t off = 0; off < n; off += chunk) {
        const int64_t m = std::min(chunk, n - off);
        buf.resize(static_cast<size_t>(m) * io::dtype_size(tdt));
        filler.fill(plan[i], tdt, m, buf.data());
        w.append(buf.data(), buf.size());
        done += buf.size();
        if (progress) progress(done, total);
      }
    }
    w.finish();
  }
  auto write_json = [&](const std::string& name, const nlohmann::ordered_json& j) {
    write_file_atomic(opt.out_dir + "/" + name, j.dump(2) + "\n");
  };
  if (ns > 1) write_json("model.safetensors.index.json", {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}});
  write_json("config.json", cfg);
  write_json("generation_config.json", {{"eos_token_id", text["eos_token_id"]}, {"do_sample", true}, {"temperature", 1.0},
                                        {"top_p", 0.95}, {"top_k", 20}});
  if (!opt.tokenizer_dir.empty())
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"})
      if (fs::exists(opt.tokenizer_dir + "/" + f))
        fs::copy_file(opt.tokenizer_dir + "/" + f, opt.out_dir + "/" + f, fs::copy_options::overwrite_existing);
  SynthResult r;
  r.bytes = total;
  r.shards = ns;
  r.tensors = static_cast<int64_t>(plan.size());
  r.model_type = spec.model_type;
  return r;
}

SynthResult write_synthetic(const SynthOptions& opt, const std::function<void(uint64_t, uint64_t)>& progress) {
  return synthesize(opt, progress, nullptr);
}

SynthHeaders synthetic_headers(const SynthOptions& opt) {
  SynthHeaders h;
  synthesize(opt, nullptr, &h);
  return h;
}

}  // namespace spool::models
