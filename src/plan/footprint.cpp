#include "plan/footprint.h"

#include <algorithm>

#include "io/expert_store.h"
#include "models/bind.h"
#include "models/model.h"
#include "models/state.h"
#include "ops/cpu_backend.h"
#include "ops/kv_cache.h"
#include "ops/matmul.h"

namespace spool::plan {

namespace {

constexpr uint64_t kF = sizeof(float);

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::char_traits<char>::length(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

}  // namespace

WeightBytes weight_bytes(const io::Checkpoint& ck, const models::ModelSpec& spec) {
  WeightBytes w;
  w.total = ck.total_bytes();
  w.experts = ck.expert_bytes();
  w.dense = w.total - w.experts;
  w.file_bytes = ck.file_bytes();
  w.tables = ck.table_bytes();
  w.shards = static_cast<int>(ck.shards().size());
  w.experts_quantized = ck.experts_quantized();
  // models/decoder.cpp reads embedding rows with pread when lm_head is its own tensor (float,
  // or quantized: lm_head.qweight). A spool-quantized table (embed_tokens.qweight) is read
  // the same way, its codes and scales (codebook and signs are a few bytes, resident).
  const bool tied = ck.find("lm_head.weight") == nullptr && ck.find("lm_head.qweight") == nullptr;
  if (!tied)
    for (const io::TensorRef* t : models::embed_row_tensors(ck)) w.embed_on_demand += t->nbytes;
  w.resident_dense = w.dense - w.embed_on_demand;
  // Copies made by models/bind.cpp (bind_f32 / bind_norm) and gated_deltanet.cpp (regroups).
  for (const auto& t : ck.tensors()) {
    if (ends_with(t.name, ".qweight")) w.any_quantized = true;
    if (t.expert_layer >= 0) continue;
    const std::string& n = t.name;
    if (ends_with(n, "norm.weight") || ends_with(n, "conv1d.weight") || ends_with(n, "A_log") || ends_with(n, "dt_bias") ||
        ends_with(n, "shared_expert_gate.weight"))
      w.f32_copies += static_cast<uint64_t>(t.numel()) * kF;
    if (ends_with(n, "in_proj_qkvz.weight") || ends_with(n, "in_proj_ba.weight")) w.f32_copies += t.nbytes;  // gathered rows
  }
  // GDN layers keep exp(A_log) (a_log_exp_) beside the A_log copy freed after bind: counted once.
  (void)spec;
  return w;
}

uint64_t expert_slot_bytes(const io::Checkpoint& ck, const models::ModelSpec& spec, bool direct) {
  if (ck.expert_bytes() == 0) return 0;
  std::vector<bool> moe(spec.n_layers);
  for (int i = 0; i < spec.n_layers; ++i) moe[i] = spec.ffns[i] == models::FfnKind::kMoE;
  io::ExpertStore store(ck, moe, spec.moe.n_experts, direct);
  return store.slot_bytes();
}

int64_t kv_capacity(int64_t prompt, int64_t total, int64_t step, int64_t window) {
  return ops::kv_capacity_for(prompt, total, step, window);
}

KvCapacity kv_capacities(const models::ModelSpec& s, int64_t prompt, int64_t total, int64_t step) {
  KvCapacity c;
  c.full = c.windowed = kv_capacity(prompt, total, step);
  int64_t window = 0;
  for (int i = 0; i < s.n_layers; ++i) window = std::max(window, models::State::kv_window(s, i));
  if (window > 0) c.windowed = kv_capacity(prompt, total, step, window);
  return c;
}

StateBytes state_bytes(const models::ModelSpec& s, const KvCapacity& capacity, int kv_bits) {
  StateBytes b;
  ops::KvCache probe;
  uint64_t per;
  if (s.attn.kv_latent_dim > 0) {
    // MLA: one latent vector of kv_lora_rank + qk_rope_head_dim per position (a keys-only cache).
    probe.configure(ops::kv_type_from_bits(kv_bits), 1, s.attn.kv_latent_dim, true);
    per = probe.bytes_per_position();
  } else {
    probe.configure(ops::kv_type_from_bits(kv_bits), s.attn.n_kv_heads, s.attn.head_dim);
    per = probe.bytes_per_position();
  }
  for (int i = 0; i < s.n_layers; ++i) {
    if (s.mixers[i] == models::MixerKind::kAttention && !s.attn_layers.empty()) {  // per-layer geometry
      probe.configure(ops::kv_type_from_bits(kv_bits), s.attn_of(i).n_kv_heads, s.attn_of(i).head_dim);
      per = probe.bytes_per_position();
    }
    if (s.mixers[i] == models::MixerKind::kAttention || s.mixers[i] == models::MixerKind::kMLA) {
      // Each layer at the capacity of its kind: a sliding-window layer's cache is bounded.
      const int64_t cap = models::State::kv_window(s, i) > 0 ? capacity.windowed : capacity.full;
      // KvCache::reserve doubles: the previous capacity is at most half of the final one; a
      // windowed cache grows from about its window to W - 1 + its largest chunk (slack W/8).
      const int64_t w = models::State::kv_window(s, i);
      const int64_t prev = w > 0 ? std::min<int64_t>(cap, w) : cap / 2 / 256 * 256;
      b.kv += per * static_cast<uint64_t>(cap);
      b.kv_per_token += per;
      b.snapshot += per * static_cast<uint64_t>(std::max<int64_t>(models::State::kv_window(s, i) - 1, 0));
      b.grow_transient = std::max(b.grow_transient, per * static_cast<uint64_t>(prev));
    } else {
      const auto& g = s.gdn;
      const uint64_t r = (static_cast<uint64_t>(g.conv_dim()) * (g.conv_kernel - 1) + static_cast<uint64_t>(g.n_v) * g.d_k * g.d_v) * kF;
      b.recurrent += r;
      b.snapshot += r;
    }
  }
  return b;
}

uint64_t workspace_bytes(const models::ModelSpec& s, int64_t T, int64_t ctx, int threads, bool quantized) {
  const uint64_t t = static_cast<uint64_t>(std::max<int64_t>(T, 1));
  const uint64_t H = s.hidden_size, V = s.vocab_size;
  const auto& a = s.attn;
  const auto& g = s.gdn;
  const auto& m = s.moe;
  // The one arena of the forward pass: the engine maps exactly this (Model::reserve_workspace).
  uint64_t n = models::workspace_arena_bytes(s, static_cast<int64_t>(t));
  uint64_t widest = H;  // widest matmul input (matmul.cpp per-thread bf16 row scratch: 4 rows)
  for (int i = 0; i < s.n_layers; ++i) {
    if (s.mixers[i] == models::MixerKind::kAttention) {
      widest = std::max<uint64_t>(widest, static_cast<uint64_t>(s.attn_of(i).n_heads) * s.attn_of(i).head_dim);
    } else if (s.mixers[i] == models::MixerKind::kMLA) {
      widest = std::max<uint64_t>(widest, static_cast<uint64_t>(a.n_heads) * s.mla.v_head_dim);
    } else {
      widest = std::max<uint64_t>(widest, g.value_dim());
    }
    widest = std::max<uint64_t>(widest, s.ffns[i] == models::FfnKind::kMoE ? m.intermediate : s.dense_intermediate);
  }
  int max_hd = a.head_dim;  // per-layer geometry: the widest head
  for (const auto& la : s.attn_layers) max_hd = std::max(max_hd, la.head_dim);
  // Kernel scratch, per pool thread (thread-local buffers inside the kernels): the expert
  // path's gathered rows (up to all T tokens on one expert), matmul.cpp row scratch, and the
  // attention tile's scores over the context (kv_cache.cpp, 32 query rows).
  const uint64_t per_thread = ops::expert_ffn_thread_bytes(static_cast<int64_t>(t), H, m.intermediate) + 4 * widest * kF +
                              (s.n_layers_of(models::MixerKind::kAttention) ? 32 * (static_cast<uint64_t>(ctx) + 2 * max_hd) * kF : 0) +
                              // mla.cpp: 16 query rows' scores over the context and one latent key row
                              (s.n_layers_of(models::MixerKind::kMLA) ? (16 + 1) * static_cast<uint64_t>(ctx) * kF : 0);
  n += per_thread * static_cast<uint64_t>(std::max(threads, 1));
  // The CPU backend's decode-sized expert calls (ops::expert_ffn_split_bytes; members, once), the
  // shared expert folded in: the widest of the routed and shared intermediate sizes.
  if (std::find(s.ffns.begin(), s.ffns.end(), models::FfnKind::kMoE) != s.ffns.end())
    n += ops::expert_ffn_split_bytes(static_cast<int64_t>(H), std::max<int64_t>(m.intermediate, m.shared_intermediate),
                                     static_cast<int64_t>(m.n_experts) + 1);
  if (quantized) {
    // quant_matmul.cpp `rot` (the calling thread rotates a whole matmul's input) and
    // matmul.cpp `rotated` (each thread rotates its expert's tokens).
    n += t * widest * kF + static_cast<uint64_t>(std::max(threads, 1)) * t * std::max<uint64_t>(H, m.intermediate) * kF;
    // ops::matmul_multi (up to ops::kMultiQuantRows tokens): a rotated copy of x and its int8
    // activations (4 bytes a column) per matrix of a Gated DeltaNet in_proj (four, each its own signs).
    if (s.n_layers_of(models::MixerKind::kGatedDeltaNet) > 0)
      n += 4 * std::min<uint64_t>(t, static_cast<uint64_t>(ops::kMultiQuantRows)) * H * (kF + 4);
  }
  n += V * kF + V * (kF + sizeof(int32_t)) + V * sizeof(int32_t);  // session.cpp logits_, sampler cand_, counts_
  return n;
}

uint64_t tokenizer_bytes(uint64_t json_bytes) {
  // Measured: peak heap of loading Qwen3's 11.4 MB tokenizer.json 88 MB, DeepSeek-V3's
  // 7.6 MB 54 MB, the demo's 0.57 MB 3.3 MB (`spool tokenize`, VmHWM minus `spool info`).
  return json_bytes * 15 / 2;
}

uint64_t runtime_base_bytes(int threads, uint64_t start_rss) {
  // Measured with a 0.5 ms /proc/self/status sampler: `spool generate` on the demo model maps
  // 0.8 MiB more of the executable and libraries than `spool info` (kernels, tokenizer code),
  // and each thread touches ~64 KiB of stack.
  const uint64_t start = start_rss ? start_rss : (15ull << 20);
  return start + (1ull << 20) + static_cast<uint64_t>(std::max(threads, 1)) * (64ull << 10);
}

uint64_t gguf_tokenizer_json_bytes(const io::GgufFile& g) {
  const io::GgufValue* tokens = g.find_key("tokenizer.ggml.tokens");
  if (tokens == nullptr || !tokens->is_array()) return 0;
  uint64_t n = 0;  // the compact JSON Tokenizer::from_gguf builds: token + ~10 bytes, merge + 4
  for (const std::string& t : tokens->strs) n += t.size() + 10;
  if (const io::GgufValue* merges = g.find_key("tokenizer.ggml.merges"); merges != nullptr && merges->is_array())
    for (const std::string& mg : merges->strs) n += mg.size() + 4;
  // Measured: loading Qwen3's tokenizer from tests/data/gguf/qwen3_tokenizer.gguf peaks at 124 MiB
  // of heap (the metadata strings, the JSON built, its text and the parse), where its 5.0 MB
  // compact JSON would count 36 MiB through plan::tokenizer_bytes (7.5 x, calibrated on
  // tokenizer.json files): the stand-in is 3.5 x the compact JSON.
  return n * 7 / 2;
}

}  // namespace spool::plan
