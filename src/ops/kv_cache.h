// KvCache: the keys and values of one attention layer for one sequence, stored as f32, f16
// or int8 (--kv-bits 32 | 16 | 8), in the layouts the attention kernels read:
//   keys transposed, one row per (head, dimension):  K[(h * head_dim + d) * capacity + p]
//   values one row per (head, position):             V[(h * capacity + p) * head_dim + d]
// int8 stores per-group scales (groups of kKvGroup dims of one position's vector, symmetric,
// scale = max|x| / 127): Ks[(h * groups + g) * capacity + p], Vs[(h * capacity + p) * groups + g].
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ops/thread_pool.h"

namespace spool::ops {

/// Element type of a KV cache.
enum class KvType { kF32, kF16, kI8 };

/// Dims per int8 scale group (or head_dim when it is smaller or not a multiple).
constexpr int kKvGroup = 32;

/// KvType for --kv-bits (32, 16 or 8); throws spool::UsageError otherwise.
KvType kv_type_from_bits(int bits);

class KvCache {
 public:
  /// Sets the geometry; drops contents. `keys_only`: the cache stores keys only (no value rows,
  /// write() ignores v): the MLA latent cache, one "key" of kv_lora_rank + qk_rope_head_dim per
  /// position whose first kv_lora_rank elements double as the value (Backend::mla_attention).
  void configure(KvType type, int n_kv_heads, int head_dim, bool keys_only = false);
  /// Makes room for `positions`, keeping the first `keep` positions.
  void reserve(int64_t positions, int64_t keep);
  /// Stores position `pos` of every KV head: k, v [n_kv_heads, head_dim] f32.
  void write(int64_t pos, const float* k, const float* v);
  /// Copies positions [0, n) from `other` (same geometry), growing as needed.
  void copy_prefix(const KvCache& other, int64_t n);
  /// Appends positions [0, n) to `out` in a capacity-independent layout (key rows, value rows,
  /// then the int8 scales): exactly n * bytes_per_position() bytes. n <= capacity().
  void save_prefix(int64_t n, std::string& out) const;
  /// Makes positions [0, n) those of `data` written by save_prefix with the same geometry and
  /// type (later positions are left as they are). Throws spool::Error when `data` is not
  /// n * bytes_per_position() bytes.
  void load_prefix(std::string_view data, int64_t n);

  /// Dequantized key / value (tests, debugging).
  float key(int h, int64_t p, int d) const;
  float value(int h, int64_t p, int d) const;

  KvType type() const { return type_; }
  int n_kv_heads() const { return n_kv_; }
  int head_dim() const { return hd_; }
  /// Whether the cache holds keys only (configure(..., keys_only = true)).
  bool keys_only() const { return vd_ == 0 && hd_ > 0; }
  int groups() const { return groups_; }
  int group_dim() const { return hd_ / groups_; }
  int64_t capacity() const { return cap_; }
  /// Bytes held.
  uint64_t bytes() const { return k_.size() + v_.size() + (ks_.size() + vs_.size()) * sizeof(float); }
  /// Bytes per position (all heads, keys and values, scales included).
  uint64_t bytes_per_position() const;
  /// Changes whenever the contents or geometry change (a process-wide counter, so two caches
  /// never share a value unless one is a copy of the other with the same contents). A GPU
  /// backend keeps a device mirror of the cache and re-uploads it when this moves.
  uint64_t generation() const { return gen_; }

  const uint8_t* k_data() const { return k_.data(); }
  const uint8_t* v_data() const { return v_.data(); }
  const float* k_scales() const { return ks_.data(); }
  const float* v_scales() const { return vs_.data(); }

 private:
  int elem() const { return type_ == KvType::kF32 ? 4 : type_ == KvType::kF16 ? 2 : 1; }
  void touch();  // new generation
  uint64_t gen_ = 0;
  KvType type_ = KvType::kF32;
  int n_kv_ = 0, hd_ = 0, vd_ = 0, groups_ = 1;  // vd_: value dims per head (hd_, or 0 keys-only)
  int64_t cap_ = 0;
  std::vector<uint8_t> k_, v_;
  std::vector<float> ks_, vs_;
};

/// out[t, h, :] = softmax_p(scale * q[t, h] . k[kvh, p]) @ v[kvh, p] over p <= pos0 + t,
/// kvh = h / (n_heads / n_kv_heads) (HF repeat_kv). The cache must hold [0, pos0 + T).
/// q: [T, n_heads, head_dim] f32; out: [T, n_heads, head_dim]. Parallel over (KV head,
/// query tile); scores and softmax in f32.
/// window > 0 (sliding-window attention, HF Mixtral/Mistral): only keys p with
/// pos0 + t - p < window are seen. sinks (may be null; [n_heads], gpt-oss): per query head a
/// logit that joins each row's softmax denominator and has no value (rows sum to < 1).
void attention(const float* q, int64_t T, int n_heads, const KvCache& kv, int64_t pos0, float scale, float* out,
               ThreadPool* pool, int64_t window = 0, const float* sinks = nullptr);

}  // namespace spool::ops
