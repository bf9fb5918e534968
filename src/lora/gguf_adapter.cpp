// llama.cpp GGUF LoRA adapters (convert_lora_to_gguf.py writes them, src/llama-adapter.cpp reads
// them): the same A and B matrices as PEFT's, under the base model's GGUF tensor names, with the
// converter's reorderings applied to B's rows (what the base weight's rows got) and A's columns
// (the base weight's columns). lora/adapter.h has the format; here each tensor is mapped back.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>

#include "common/error.h"
#include "common/ggml_types.h"
#include "io/gguf.h"
#include "io/gguf_names.h"
#include "io/tensor_names.h"
#include "lora/adapter.h"
#include "ops/ggml_blocks.h"

namespace spool::lora {

namespace {

// The tensor's values as f32 (any type spool reads: F32, F16, BF16, block types).
std::vector<float> values_f32(const io::GgufFile& g, const io::GgufTensor& t) {
  const bool is_float = t.type == GgmlType::F32 || t.type == GgmlType::F16 || t.type == GgmlType::BF16;
  if (!is_float && !ops::ggml_supported(t.type)) {
    const GgmlTypeTraits tr = ggml_type_traits(t.type);
    fail("%s: tensor '%s' has type %s, which spool cannot read", g.path().c_str(), t.name.c_str(), tr.name ? tr.name : "unknown");
  }
  std::vector<float> v(static_cast<size_t>(t.numel()));
  ops::ggml_dequantize_row(t.type, g.data(t), t.numel(), v.data());
  return v;
}

// Rows of an [rows, cols] row-major matrix, reordered: out row i = in row src[i].
std::vector<float> gather_rows(const std::vector<float>& m, int64_t cols, const std::vector<int64_t>& src) {
  std::vector<float> out(src.size() * static_cast<size_t>(cols));
  for (size_t i = 0; i < src.size(); ++i) std::memcpy(out.data() + i * cols, m.data() + src[i] * cols, static_cast<size_t>(cols) * 4);
  return out;
}

}  // namespace

Adapter load_gguf_adapter(const std::string& path, const io::Checkpoint& base, const io::RulesResolver& rules) {
  namespace fs = std::filesystem;
  if (!fs::exists(path)) fail("%s: no such LoRA adapter file", path.c_str());
  const io::GgufFile g = io::GgufFile::open(path, /*map=*/true);
  const std::string type = g.get_string("general.type").value_or("");
  if (type != "adapter")
    fail("%s: general.type is '%s', not 'adapter': this GGUF is not a LoRA adapter (give the base model with --model)", path.c_str(),
         type.c_str());
  const std::string adapter_type = g.get_string("adapter.type").value_or("");
  if (adapter_type != "lora")
    fail("%s: adapter.type is '%s'; spool runs LoRA adapters (adapter.type 'lora'), not control vectors or others", path.c_str(),
         adapter_type.c_str());
  if (g.find_key("adapter.alora.invocation_tokens") != nullptr)
    fail("%s: activated LoRA (adapter.alora.invocation_tokens) is not supported: spool runs plain LoRA adapters", path.c_str());
  const std::string arch_name = g.architecture();
  const io::GgufArch* arch = rules.by_gguf_arch ? rules.by_gguf_arch(arch_name) : nullptr;
  if (arch == nullptr) fail("%s: GGUF architecture '%s' is not one spool loads", path.c_str(), arch_name.c_str());
  // The adapter's architecture must be the base's: the same GGUF architecture for a GGUF base,
  // otherwise one of the base family's (its tensor-name rules are the same).
  const bool same = base.gguf() != nullptr ? base.gguf()->architecture() == arch_name
                                           : rules.by_model_type != nullptr && rules.by_model_type(arch->model_type) != nullptr &&
                                                 rules.by_model_type(arch->model_type) == rules.by_model_type(base.model_type());
  if (!same)
    fail("%s: the adapter is for architecture '%s', the base model is %s", path.c_str(), arch_name.c_str(),
         base.gguf() != nullptr ? ("'" + base.gguf()->architecture() + "'").c_str() : base.model_type().c_str());
  const double alpha = g.get_float("adapter.lora.alpha").value_or(0.0);
  // What the A and B matrices may take as f32: a few times the file (block types expand up to ~20x;
  // tensors of a GGUF may share their bytes, so the sum of their sizes is not bounded by the file).
  const uint64_t file_bytes = std::filesystem::file_size(path);
  const uint64_t max_floats = (uint64_t{32} * file_bytes + (uint64_t{16} << 20)) / 4;
  uint64_t floats = 0;
  const io::Config& cfg = base.config();  // (heads for the reorderings)

  Adapter ad;
  ad.path = path;
  ad.name = fs::path(path).stem().string();
  ad.config.lora_alpha = alpha;

  struct Pair {
    const io::GgufTensor* a = nullptr;
    const io::GgufTensor* b = nullptr;
  };
  std::map<std::string, Pair> pairs;  // base tensor name -> lora_a, lora_b
  for (const io::GgufTensor& t : g.tensors()) {
    if (t.name.ends_with(".lora_a"))
      pairs[t.name.substr(0, t.name.size() - 7)].a = &t;
    else if (t.name.ends_with(".lora_b"))
      pairs[t.name.substr(0, t.name.size() - 7)].b = &t;
    else
      fail("%s: tensor '%s' is not a LoRA matrix (<tensor>.lora_a / .lora_b)", path.c_str(), t.name.c_str());
  }
  if (pairs.empty()) fail("%s: no LoRA tensors (<tensor>.lora_a / .lora_b)", path.c_str());

  std::map<int, size_t> expert_index;  // layer -> ad.experts
  for (const auto& entry : pairs) {
    const std::string& name = entry.first;  // (not a structured binding: the lambda below captures it)
    const Pair& p = entry.second;
    if (p.a == nullptr) fail("%s: '%s.lora_b' has no '%s.lora_a' beside it", path.c_str(), name.c_str(), name.c_str());
    if (p.b == nullptr) fail("%s: '%s.lora_a' has no '%s.lora_b' beside it", path.c_str(), name.c_str(), name.c_str());
    const io::GgufTensor& ta = *p.a;
    const io::GgufTensor& tb = *p.b;
    const std::optional<io::GgufTensorMap> m = io::map_gguf_tensor(*arch, name);
    if (!m) fail("%s: '%s' is not a tensor of the %s layout spool knows", path.c_str(), name.c_str(), arch_name.c_str());
    auto refuse = [&](const char* why) { fail("%s: '%s': LoRA on %s is not supported", path.c_str(), name.c_str(), why); };
    if (m->nextn) refuse("the multi-token-prediction head");
    if (m->layer >= cfg.get_int("num_hidden_layers")) refuse("a block after the main layers (the multi-token-prediction head)");
    if (name == "token_embd.weight") refuse("the token embedding");
    using T = io::GgufTransform;
    if (m->transform == T::kKvbFromKb || m->transform == T::kWithKb)
      refuse("MLA's attn_k_b / attn_v_b (kv_b_proj split per head; spool applies LoRA to kv_b_proj from PEFT adapters)");
    if (m->transform == T::kInterleaveUp || m->transform == T::kWithGate) refuse("gpt-oss's split gate/up experts");
    if (m->transform == T::kNormMinus1 || m->transform == T::kALog || m->shape != io::GgufShape::kReversed || m->as_float)
      refuse("a norm, vector or table (only matrices take LoRA terms)");
    for (const io::GgufTensor* t : {&ta, &tb})
      for (int d = 0; d < 4; ++d)
        if (t->ne[d] <= 0 || t->ne[d] > (int64_t{1} << 31))
          fail("%s: '%s' has shape %s: every dimension must be in [1, 2^31]", path.c_str(), t->name.c_str(), t->shape_string().c_str());
    const int64_t rank = tb.ne[0];
    if (ta.ne[1] != rank)
      fail("%s: '%s': lora_a is %s and lora_b %s: lora_a must be {in, r} and lora_b {r, out} (lora_a is not transposed?)",
           path.c_str(), name.c_str(), ta.shape_string().c_str(), tb.shape_string().c_str());
    const bool experts3d = m->merged_experts;
    if (experts3d ? (ta.n_dims != 3 || tb.n_dims != 3 || ta.ne[2] != tb.ne[2]) : (ta.n_dims != 2 || tb.n_dims != 2))
      fail("%s: '%s': %s, got %s and %s", path.c_str(), name.c_str(),
           experts3d ? "expert LoRA must be lora_a {in, r, experts} and lora_b {r, out, experts}" : "lora_a and lora_b must be matrices",
           ta.shape_string().c_str(), tb.shape_string().c_str());
    if (rank > std::min(ta.ne[0], tb.ne[1]))
      fail("%s: '%s': rank %lld is above min(in, out) = %lld", path.c_str(), name.c_str(), (long long)rank,
           (long long)std::min(ta.ne[0], tb.ne[1]));
    // (all dimensions >= 1: the GGUF reader has bounded each tensor's bytes, so its numel, by the file)
    floats += static_cast<uint64_t>(ta.numel()) + static_cast<uint64_t>(tb.numel());
    if (floats > max_floats)
      fail("%s: its LoRA matrices would take %.1f GB as f32, far more than the file's %.1f MB holds", path.c_str(),
           static_cast<double>(floats) * 4e-9, static_cast<double>(file_bytes) * 1e-6);
    const float scale = alpha != 0 ? static_cast<float>(alpha / static_cast<double>(rank)) : 1.0f;
    std::vector<float> a = values_f32(g, ta), b = values_f32(g, tb);

    if (m->merged_experts) {  // a {in, r, E}, b {r, out, E}: per expert A_e [r, in], B_e [out, r]
      const int64_t E = ta.ne[2], in = ta.ne[0], out = tb.ne[1];
      // A_e's rows are already expert-major ([E * r, in]); B goes to PEFT's ParamWrapper layout
      // [out, r * E] with column k * E + e (what LoraSet::experts reads).
      std::vector<float> bw(static_cast<size_t>(out * rank * E));
      for (int64_t e = 0; e < E; ++e)
        for (int64_t o = 0; o < out; ++o)
          for (int64_t k = 0; k < rank; ++k) bw[o * (rank * E) + k * E + e] = b[(e * out + o) * rank + k];
      std::string module = io::expert_tensor_name(m->layer, 0, io::ExpertProj::kGate);
      module = module.substr(0, module.find(".0.gate_proj"));  // "layers.N.mlp.experts"
      auto [it, fresh] = expert_index.emplace(m->layer, ad.experts.size());
      if (fresh) ad.experts.push_back(ExpertLora{module, module, {}});
      ExpertWrapper w{name, 0, rank * E, in, out, std::move(a), std::move(bw)};
      w.target = m->gate_up ? ExpertWrapper::Target::kGateUp
                 : m->proj == io::ExpertProj::kGate ? ExpertWrapper::Target::kGate
                 : m->proj == io::ExpertProj::kUp   ? ExpertWrapper::Target::kUp
                                                    : ExpertWrapper::Target::kDown;
      w.rank = rank;
      w.scale = scale;
      ad.experts[it->second].wrappers.push_back(std::move(w));
      continue;
    }
    int64_t in = ta.ne[0], out = tb.ne[1];
    // Undo the converter's reorderings: of the weight's rows on B, of its columns on A.
    if (m->transform == T::kUnpermuteQ || m->transform == T::kUnpermuteK) {
      // llama arch: HF row s * hd/2 + k of head h was stored at h * hd + 2k + s.
      const int64_t nh = cfg.get_int(m->transform == T::kUnpermuteQ ? "num_attention_heads" : "num_key_value_heads");
      if (nh <= 0 || out % nh != 0 || (out / nh) % 2 != 0)
        fail("%s: '%s' has %lld output rows, not %lld heads of an even head size", path.c_str(), name.c_str(), (long long)out, (long long)nh);
      b = gather_rows(b, rank, io::gguf_unpermute_order(out, nh));
    }
    const bool tiled = arch->v_tiled && (m->transform == T::kVRows || m->transform == T::kVCols);
    if (tiled) {
      const int64_t n_k = cfg.get_int("linear_num_key_heads"), n_v = cfg.get_int("linear_num_value_heads");
      const int64_t d_k = cfg.get_int("linear_key_head_dim"), d_v = cfg.get_int("linear_value_head_dim");
      if (n_k <= 0 || n_v % n_k != 0) fail("%s: the base's linear_num_value_heads is not a multiple of linear_num_key_heads", path.c_str());
      const int64_t vb = m->v_block < 0 ? d_v : m->v_block;
      const int64_t off = m->v_after_qk ? 2 * n_k * d_k : 0;
      const int64_t n = m->transform == T::kVRows ? out : in;
      if (off + n_v * vb != n)
        fail("%s: '%s' has %lld %s, expected %lld (V heads %lld x %lld after %lld)", path.c_str(), name.c_str(), (long long)n,
             m->transform == T::kVRows ? "output rows" : "input columns", (long long)(off + n_v * vb), (long long)n_v, (long long)vb,
             (long long)off);
      const std::vector<int64_t> heads = io::gguf_tiled_of_grouped(n_k, n_v);
      std::vector<int64_t> src(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) src[i] = i < off ? i : off + heads[(i - off) / vb] * vb + (i - off) % vb;
      if (m->transform == T::kVRows) {
        b = gather_rows(b, rank, src);
      } else {  // columns of A [r, in]
        std::vector<float> na(a.size());
        for (int64_t k = 0; k < rank; ++k)
          for (int64_t i = 0; i < in; ++i) na[k * in + i] = a[k * in + src[i]];
        a = std::move(na);
      }
    }
    if (m->transform == T::kBaSplitB) {
      // qwen3next ssm_ba: rows grouped per k-head [b_g (R) | a_g (R)] -> in_proj_b, in_proj_a (one A).
      const int64_t n_k = cfg.get_int("linear_num_key_heads"), n_v = cfg.get_int("linear_num_value_heads");
      if (n_k <= 0 || n_v % n_k != 0 || out != 2 * n_v)
        fail("%s: '%s' has %lld output rows, expected %lld (b and a rows of the V heads)", path.c_str(), name.c_str(), (long long)out,
             (long long)(2 * n_v));
      const auto [rb, ra] = io::gguf_ba_split_rows(n_k, n_v);
      const std::string an = "layers." + std::to_string(m->layer) + ".linear_attn.in_proj_a.weight";
      ad.dense.push_back(DenseLora{an, name + " (a rows)", rank, in, n_v, scale, a, gather_rows(b, rank, ra)});
      b = gather_rows(b, rank, rb);
      out = n_v;
    }
    ad.dense.push_back(DenseLora{m->hf_name, name, rank, in, out, scale, std::move(a), std::move(b)});
  }
  ad.config.r = ad.dense.empty() ? ad.experts.front().wrappers.front().rank : ad.dense.front().rank;
  return ad;
}

}  // namespace spool::lora
