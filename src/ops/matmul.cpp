// Highway kernels for matmul(): compiled once per SIMD target (foreach_target), dispatched at
// runtime. Decode (T == 1) streams each weight row once, converting bf16/f16 to f32 in
// registers; prefill (T > 1) converts a 4-row block of W to f32 once per token tile and reuses
// it for every token of the tile with a 4x2 register block.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/matmul.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "ops/ggml_blocks.h"
#include "ops/ggml_q8.h"
#include "ops/quant_q8.h"
#include "ops/matmul.h"
#include "ops/lora.h"

HWY_BEFORE_NAMESPACE();
namespace spool::ops {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

// Loads lanes [i, i + Lanes) of a weight row as f32.
struct RowF32 {
  const float* p;
  HWY_INLINE hn::Vec<DF> load(DF df, int64_t i) const { return hn::LoadU(df, p + i); }
  HWY_INLINE float at(int64_t i) const { return p[i]; }
};
struct RowBF16 {
  const uint16_t* p;
  HWY_INLINE hn::Vec<DF> load(DF df, int64_t i) const {
    const hn::Rebind<uint16_t, DF> d16;
    const hn::Rebind<uint32_t, DF> d32;
    return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(d32, hn::LoadU(d16, p + i))));
  }
  HWY_INLINE float at(int64_t i) const { return bf16_to_f32(p[i]); }
};
struct RowF16 {
  const uint16_t* p;
  HWY_INLINE hn::Vec<DF> load(DF df, int64_t i) const {
    const hn::Rebind<hwy::float16_t, DF> d16;
    return hn::PromoteTo(df, hn::LoadU(d16, reinterpret_cast<const hwy::float16_t*>(p + i)));
  }
  HWY_INLINE float at(int64_t i) const { return f16_to_f32(p[i]); }
};

// out[r] = dot(row_r, x) for R rows, one token.
template <int R, class Row>
HWY_INLINE void GemvBlock(const Row* rows, const float* HWY_RESTRICT x, int64_t cols, float* out) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  hn::Vec<DF> acc[R];
  for (int r = 0; r < R; ++r) acc[r] = hn::Zero(df);
  int64_t c = 0;
  for (; c + N <= cols; c += N) {
    const auto xv = hn::LoadU(df, x + c);
    for (int r = 0; r < R; ++r) acc[r] = hn::MulAdd(rows[r].load(df, c), xv, acc[r]);
  }
  for (int r = 0; r < R; ++r) {
    float s = hn::GetLane(hn::SumOfLanes(df, acc[r]));
    for (int64_t k = c; k < cols; ++k) s += rows[r].at(k) * x[k];
    out[r] = s;
  }
}

template <class Row, class Elem>
void GemvRowsT(const Elem* w, int64_t cols, const float* x, float* y, int64_t r0, int64_t r1) {
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) {
    Row rows[4] = {{w + r * cols}, {w + (r + 1) * cols}, {w + (r + 2) * cols}, {w + (r + 3) * cols}};
    GemvBlock<4>(rows, x, cols, y + r);
  }
  for (; r < r1; ++r) {
    Row rows[1] = {{w + r * cols}};
    GemvBlock<1>(rows, x, cols, y + r);
  }
}

// out[t * ldo + r] = dot(row_r, x_t) for R rows and TT tokens (stride ldx): GemvBlock's
// arithmetic per token (one accumulator per row, the same order), each weight vector loaded
// once for the TT tokens. A few tokens (a speculative verify step) read the weights once.
template <int R, int TT, class Row>
HWY_INLINE void GemvBlockT(const Row* rows, const float* HWY_RESTRICT x, int64_t ldx, int64_t cols, float* out, int64_t ldo) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  hn::Vec<DF> acc[TT][R];
  for (int t = 0; t < TT; ++t)
    for (int r = 0; r < R; ++r) acc[t][r] = hn::Zero(df);
  int64_t c = 0;
  for (; c + N <= cols; c += N) {
    hn::Vec<DF> wv[R];
    for (int r = 0; r < R; ++r) wv[r] = rows[r].load(df, c);
    for (int t = 0; t < TT; ++t) {
      const auto xv = hn::LoadU(df, x + t * ldx + c);
      for (int r = 0; r < R; ++r) acc[t][r] = hn::MulAdd(wv[r], xv, acc[t][r]);
    }
  }
  for (int t = 0; t < TT; ++t)
    for (int r = 0; r < R; ++r) {
      float s = hn::GetLane(hn::SumOfLanes(df, acc[t][r]));
      for (int64_t k = c; k < cols; ++k) s += rows[r].at(k) * x[t * ldx + k];
      out[t * ldo + r] = s;
    }
}

// GemvRowsT for T tokens (x [T, cols], y [T, ldy]), token pairs over 4-row blocks.
template <class Row, class Elem>
void GemvRowsFew(const Elem* w, int64_t cols, const float* x, int64_t T, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  for (int64_t t = 0; t < T; t += 2) {
    const float* xt = x + t * cols;
    float* yt = y + t * ldy;
    const bool two = t + 1 < T;
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) {
      Row rows[4] = {{w + r * cols}, {w + (r + 1) * cols}, {w + (r + 2) * cols}, {w + (r + 3) * cols}};
      if (two) GemvBlockT<4, 2>(rows, xt, cols, cols, yt + r, ldy);
      else GemvBlockT<4, 1>(rows, xt, cols, cols, yt + r, ldy);
    }
    for (; r < r1; ++r) {
      Row rows[1] = {{w + r * cols}};
      if (two) GemvBlockT<1, 2>(rows, xt, cols, cols, yt + r, ldy);
      else GemvBlockT<1, 1>(rows, xt, cols, cols, yt + r, ldy);
    }
  }
}

template <int R>
void GemmRowBlock(const float* w, int64_t cols, const float* x, int64_t t0, int64_t t1, float* y, int64_t ldy) {
  int64_t t = t0;
  RowF32 rows[R];  // R f32 rows of stride cols (GemvBlockT's arithmetic)
  for (int r = 0; r < R; ++r) rows[r] = {w + r * cols};
  for (; t + 2 <= t1; t += 2) GemvBlockT<R, 2>(rows, x + t * cols, cols, cols, y + t * ldy, ldy);
  for (; t < t1; ++t) GemvBlockT<R, 1>(rows, x + t * cols, cols, cols, y + t * ldy, ldy);
}

constexpr int64_t kTokenTile = 64;
constexpr int64_t kFewTokens = 17;  // up to this many tokens (a verify step of --draft-max 16): GemvRowsFew, the
                                    // T = 1 arithmetic per token without an f32 copy of the weight rows

void MatmulRows(WType type, const void* data, int64_t cols, const float* x, int64_t T, float* y, int64_t ldy,
                int64_t r0, int64_t r1) {
  if (T == 1) {
    switch (type) {
      case WType::kF32: GemvRowsT<RowF32>(static_cast<const float*>(data), cols, x, y, r0, r1); return;
      case WType::kBF16: GemvRowsT<RowBF16>(static_cast<const uint16_t*>(data), cols, x, y, r0, r1); return;
      case WType::kF16: GemvRowsT<RowF16>(static_cast<const uint16_t*>(data), cols, x, y, r0, r1); return;
      case WType::kQuant:
      case WType::kGgml:
      case WType::kMxfp4: break;  // routed to quant_matmul_rows / ggml_matmul_rows by matmul_rows(); never here
    }
    return;
  }
  if (T <= kFewTokens && type != WType::kF32) {  // weights converted in registers, read once per token pair
    switch (type) {
      case WType::kBF16: GemvRowsFew<RowBF16>(static_cast<const uint16_t*>(data), cols, x, T, y, ldy, r0, r1); return;
      case WType::kF16: GemvRowsFew<RowF16>(static_cast<const uint16_t*>(data), cols, x, T, y, ldy, r0, r1); return;
      default: break;
    }
  }
  thread_local std::vector<float> scratch;
  if (type != WType::kF32 && scratch.size() < static_cast<size_t>(4 * cols)) scratch.resize(4 * cols);
  const int esz = wtype_size(type);
  for (int64_t t0 = 0; t0 < T; t0 += kTokenTile) {
    const int64_t t1 = std::min(T, t0 + kTokenTile);
    for (int64_t r = r0; r < r1; r += 4) {
      const int64_t nr = std::min<int64_t>(4, r1 - r);
      const float* wf;
      if (type == WType::kF32) {
        wf = static_cast<const float*>(data) + r * cols;
      } else {
        row_to_f32(type, static_cast<const uint8_t*>(data) + r * cols * esz, nr * cols, scratch.data());
        wf = scratch.data();
      }
      float* yr = y + r;
      switch (nr) {
        case 4: GemmRowBlock<4>(wf, cols, x, t0, t1, yr, ldy); break;
        case 3: GemmRowBlock<3>(wf, cols, x, t0, t1, yr, ldy); break;
        case 2: GemmRowBlock<2>(wf, cols, x, t0, t1, yr, ldy); break;
        default: GemmRowBlock<1>(wf, cols, x, t0, t1, yr, ldy); break;
      }
    }
  }
}

void RowToF32(WType type, const void* src, int64_t n, float* dst) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  if (type == WType::kF32) {
    std::copy_n(static_cast<const float*>(src), n, dst);
  } else if (type == WType::kBF16) {
    RowBF16 r{static_cast<const uint16_t*>(src)};
    for (; i + N <= n; i += N) hn::StoreU(r.load(df, i), df, dst + i);
    for (; i < n; ++i) dst[i] = r.at(i);
  } else {
    RowF16 r{static_cast<const uint16_t*>(src)};
    for (; i + N <= n; i += N) hn::StoreU(r.load(df, i), df, dst + i);
    for (; i < n; ++i) dst[i] = r.at(i);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace spool::ops
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace spool::ops {

HWY_EXPORT(MatmulRows);
HWY_EXPORT(RowToF32);

namespace {

GgmlView ggml_view(const WeightView& w) {
  GgmlView g;
  g.type = w.ggml;
  g.rows = w.rows;
  g.cols = w.cols;
  g.data = static_cast<const uint8_t*>(w.data);
  g.name = w.name;
  return g;
}

Mxfp4View mx_view(const WeightView& w) {
  Mxfp4View m;
  m.rows = w.rows;
  m.cols = w.cols;
  m.blocks = static_cast<const uint8_t*>(w.data);
  m.scales = w.mx_scales;
  m.name = w.name;
  return m;
}

// x with the view's column permutation applied (x'[t, c] = x[t, perm[c]]), in `buf`; x itself
// when the view has none.
const float* permuted_input(const WeightView& w, const float* x, int64_t T, std::vector<float>& buf) {
  if (w.col_perm == nullptr) return x;
  buf.resize(static_cast<size_t>(T * w.cols));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < w.cols; ++c) buf[t * w.cols + c] = x[t * w.cols + w.col_perm[c]];
  return buf.data();
}

// True when w's products take int8 activations (`int8_acts`: the caller's --act-bits option, a Q4_K / Q6_K
// weight, the SIMD int8 kernels available).
bool uses_q8(const WeightView& w, bool int8_acts) {
  return w.type == WType::kGgml && int8_acts && q8_supported(w.ggml) && q8_fast();
}

// True when w is a spool q4 / q8 matrix whose products take int8 activations (ops/quant_q8.h).
bool uses_quant_q8(const WeightView& w, bool int8_acts) {
  return w.type == WType::kQuant && int8_acts && quant_q8_supported(w.quant) && quant_q8_fast();
}

// x [T, cols] rotated by `signs` into buf (x itself when signs is nullptr).
const float* rotated_input(const int8_t* signs, const float* x, int64_t T, int64_t cols, std::vector<float>& buf) {
  if (signs == nullptr) return x;
  buf.resize(static_cast<size_t>(T * cols));
  for (int64_t t = 0; t < T; ++t) hadamard_rotate(signs, x + t * cols, cols, buf.data() + t * cols);
  return buf.data();
}

}  // namespace

void matmul_rows(const WeightView& w, const float* x, int64_t T, float* y, int64_t ldy, int64_t r0, int64_t r1, bool int8_acts) {
  if (r0 >= r1 || T <= 0) return;
  if (w.type == WType::kMxfp4) return mxfp4_matmul_rows(mx_view(w), x, T, y, ldy, r0, r1);
  if (w.type == WType::kGgml) {
    thread_local std::vector<float> permuted;
    const float* xp = permuted_input(w, x, T, permuted);
    if (uses_q8(w, int8_acts)) {
      thread_local Q8Acts qa;
      q8_quantize(xp, T, w.cols, qa);
      return ggml_q8_matmul_rows(ggml_view(w), qa, y, ldy, r0, r1);
    }
    ggml_matmul_rows(ggml_view(w), xp, T, y, ldy, r0, r1);
    return;
  }
  if (w.type == WType::kQuant) {
    // Rotate the input rows once for this call, then the quantized kernel.
    thread_local std::vector<float> rotated;
    const float* xr = rotated_input(w.quant.signs, x, T, w.cols, rotated);
    if (uses_quant_q8(w, int8_acts)) {
      thread_local QuantQ8Acts qa;
      quant_q8_prepare(xr, T, w.cols, qa);
      return quant_q8_matmul_rows(w.quant, qa, y, ldy, r0, r1);
    }
    quant_matmul_rows(w.quant, xr, T, y, ldy, r0, r1);
    return;
  }
  HWY_DYNAMIC_DISPATCH(MatmulRows)(w.type, w.data, w.cols, x, T, y, ldy, r0, r1);
}

void matmul_rows_pair(const WeightView& a, float* ya, const WeightView& b, float* yb, const float* x, int64_t T, bool int8_acts) {
  if (T <= 0) return;
  if (a.type == WType::kQuant && b.type == WType::kQuant && a.quant.signs == b.quant.signs && a.cols == b.cols) {
    thread_local std::vector<float> rotated;  // one rotation serves both (e.g. an expert's gate and up)
    const float* xr = rotated_input(a.quant.signs, x, T, a.cols, rotated);
    const bool qa8 = uses_quant_q8(a, int8_acts), qb8 = uses_quant_q8(b, int8_acts);
    thread_local QuantQ8Acts qa;  // and one quantization when both take int8 activations
    if (qa8 || qb8) quant_q8_prepare(xr, T, a.cols, qa);
    if (qa8) quant_q8_matmul_rows(a.quant, qa, ya, a.rows, 0, a.rows);
    else quant_matmul_rows(a.quant, xr, T, ya, a.rows, 0, a.rows);
    if (qb8) quant_q8_matmul_rows(b.quant, qa, yb, b.rows, 0, b.rows);
    else quant_matmul_rows(b.quant, xr, T, yb, b.rows, 0, b.rows);
    return;
  }
  if (uses_q8(a, int8_acts) && uses_q8(b, int8_acts) && a.col_perm == nullptr && b.col_perm == nullptr && a.cols == b.cols) {
    thread_local Q8Acts qa;  // one quantization serves both
    q8_quantize(x, T, a.cols, qa);
    ggml_q8_matmul_rows(ggml_view(a), qa, ya, a.rows, 0, a.rows);
    ggml_q8_matmul_rows(ggml_view(b), qa, yb, b.rows, 0, b.rows);
    return;
  }
  matmul_rows(a, x, T, ya, a.rows, 0, a.rows, int8_acts);
  matmul_rows(b, x, T, yb, b.rows, 0, b.rows, int8_acts);
}

void prepare_input(const WeightView& w, const float* x, int64_t T, bool int8_acts, PreparedInput& p) {
  if (T < 1) fail("prepare_input: %lld tokens (at least 1)", static_cast<long long>(T));
  p.T = T;
  p.cols = w.cols;
  p.quant = w.type == WType::kQuant;
  p.signs = p.quant ? w.quant.signs : nullptr;
  p.int8 = uses_quant_q8(w, int8_acts);
  const size_t n = static_cast<size_t>(T * w.cols);
  if (p.x.size() < n) p.x.resize(n);
  if (p.signs != nullptr) {
    for (int64_t t = 0; t < T; ++t) hadamard_rotate(p.signs, x + t * w.cols, w.cols, p.x.data() + t * w.cols);
  } else {
    std::copy_n(x, n, p.x.data());
  }
  if (p.int8) quant_q8_prepare(p.x.data(), T, w.cols, p.q);
}

bool prepared_for(const PreparedInput& p, const WeightView& w, bool int8_acts) {
  if (p.T < 1 || p.cols != w.cols || p.quant != (w.type == WType::kQuant)) return false;
  if (!p.quant) return true;
  const int8_t* s = w.quant.signs;
  if ((p.signs == nullptr) != (s == nullptr)) return false;
  if (s != nullptr && s != p.signs && std::memcmp(s, p.signs, static_cast<size_t>(w.cols)) != 0) return false;
  return p.int8 == uses_quant_q8(w, int8_acts);
}

void matmul_prepared_rows(const WeightView& w, const PreparedInput& p, float* y, int64_t ldy, int64_t r0, int64_t r1,
                          bool int8_acts) {
  if (!prepared_for(p, w, int8_acts))
    fail("matmul_prepared_rows: the input was prepared for another matrix (%lld columns; this one has %lld, or another "
         "rotation or activation type)", static_cast<long long>(p.cols), static_cast<long long>(w.cols));
  if (r0 >= r1) return;
  if (!p.quant) return matmul_rows(w, p.x.data(), p.T, y, ldy, r0, r1, int8_acts);
  if (p.int8) return quant_q8_matmul_rows(w.quant, p.q, y, ldy, r0, r1);
  quant_matmul_rows(w.quant, p.x.data(), p.T, y, ldy, r0, r1);
}

void row_to_f32(WType t, const void* src, int64_t n, float* dst) {
  if (t == WType::kQuant || t == WType::kGgml || t == WType::kMxfp4) fail("row_to_f32: a quantized weight has no float rows to read");
  HWY_DYNAMIC_DISPATCH(RowToF32)(t, src, n, dst);
}

namespace {
// W x alone (matmul() adds the view's LoRA terms after it).
void matmul_base(const WeightView& w, const float* x, int64_t T, float* y, ThreadPool* pool, bool int8_acts) {
  if (w.type == WType::kMxfp4) return mxfp4_matmul(mx_view(w), x, T, y, pool);
  if (w.type == WType::kGgml) {  // permute the input once, then the block kernels over rows
    std::vector<float> permuted;
    const float* xp = permuted_input(w, x, T, permuted);
    if (uses_q8(w, int8_acts)) {  // quantize the activations once, then the int8 kernels over rows
      thread_local Q8Acts qa;  // (this thread waits in ggml_q8_matmul while the workers read it)
      q8_quantize(xp, T, w.cols, qa);
      return ggml_q8_matmul(ggml_view(w), qa, y, pool);
    }
    ggml_matmul(ggml_view(w), xp, T, y, pool);
    return;
  }
  if (w.type == WType::kQuant) {
    if (uses_quant_q8(w, int8_acts)) {  // rotate and quantize once, then the int8 kernels over rows
      std::vector<float> rotated;
      const float* xr = rotated_input(w.quant.signs, x, T, w.cols, rotated);
      thread_local QuantQ8Acts qa;  // (this thread waits in parallel_for while the workers read it)
      quant_q8_prepare(xr, T, w.cols, qa);
      const QuantQ8Acts& acts = qa;  // (the workers' lambda must see the caller's, not their own thread_local)
      if (pool == nullptr || pool->size() == 1 || w.rows * w.cols * T < (1 << 15))
        return quant_q8_matmul_rows(w.quant, acts, y, w.rows, 0, w.rows);
      pool->parallel_for(w.rows, 16, [&](int64_t b, int64_t e, int) { quant_q8_matmul_rows(w.quant, acts, y, w.rows, b, e); });
      return;
    }
    quant_matmul(w.quant, x, T, y, pool);  // rotates once, then parallel over rows
    return;
  }
  const int64_t work = w.rows * w.cols * T;
  if (pool == nullptr || pool->size() == 1 || work < (1 << 15)) {
    matmul_rows(w, x, T, y, w.rows, 0, w.rows, int8_acts);
    return;
  }
  // Chunks of 16 rows keep threads off each other's cache lines of y.
  pool->parallel_for(w.rows, 16, [&](int64_t b, int64_t e, int) { matmul_rows(w, x, T, y, w.rows, b, e, int8_acts); });
}
}  // namespace

void matmul(const WeightView& w, const float* x, int64_t T, float* y, ThreadPool* pool, bool int8_acts) {
  matmul_base(w, x, T, y, pool, int8_acts);
  if (w.lora != nullptr) lora_add(w, x, T, y, w.rows);
}

void matmul_multi(std::span<const MatmulOut> outs, const float* x, int64_t T, ThreadPool* pool, bool int8_acts) {
  int64_t total = 0, work = 0;
  bool quantized = false;
  for (const auto& [w, y] : outs) {
    total += w->rows;
    work += w->rows * w->cols * T;
    quantized = quantized || w->type == WType::kQuant;
  }
  if (quantized && T > kMultiQuantRows) {  // prefill: one matrix at a time, one rotation buffer reused
    for (const auto& [w, y] : outs) matmul(*w, x, T, y, pool, int8_acts);  // (LoRA terms included)
    return;
  }
  // Everything the row kernels read besides the weights is made once here, before the one parallel
  // job (decided once per matrix, not per row chunk in the workers):
  // - spool q4 / q8 views (at most kMultiQuantRows tokens): x rotated once per distinct sign vector
  //   (compared by value; spool convert gives each tensor its own, so a Gated DeltaNet in_proj's four
  //   matrices take four), and quantized once per rotation when int8 activations are taken: the same
  //   bits as one matmul() per matrix, with one hand-off instead of one each;
  // - GGML views: x quantized once for those that take int8 activations; a view with a column
  //   permutation (GGUF's V-head reordering) gets x permuted once, and quantized once when it takes
  //   int8 activations, rather than once per chunk.
  // Buffers are the caller's thread's (the workers' lambda must see the caller's, not their own
  // thread_local), grown only: decode calls this several times per layer.
  thread_local Q8Acts this_threads_q8;
  Q8Acts& qa = this_threads_q8;
  thread_local std::vector<std::vector<float>> this_threads_rot;
  thread_local std::vector<QuantQ8Acts> this_threads_qq8;
  std::vector<std::vector<float>>& rot = this_threads_rot;
  std::vector<QuantQ8Acts>& qq8 = this_threads_qq8;
  std::vector<char> q8(outs.size(), 0), shared(outs.size(), 0);
  std::vector<int> rot_of(outs.size(), -1), qq8_of(outs.size(), -1);  // index into rot / qq8 (-1: none)
  std::vector<const int8_t*> rot_signs;     // the sign vector each rot[k] was made with
  std::vector<int64_t> rot_cols;
  std::vector<int> qq8_rot;                 // the rotation each qq8[k] quantizes (-2: x itself, no signs)
  std::vector<std::vector<float>> perm_x;  // (sized only when a permuted view is present)
  std::vector<Q8Acts> perm_q8;
  bool any_shared = false;
  for (size_t i = 0; i < outs.size(); ++i) {
    const WeightView& w = *outs[i].w;
    q8[i] = uses_q8(w, int8_acts);
    shared[i] = q8[i] && w.col_perm == nullptr;
    any_shared = any_shared || shared[i];
    if (w.type == WType::kGgml && w.col_perm != nullptr) {
      perm_x.resize(outs.size());
      perm_q8.resize(outs.size());
      permuted_input(w, x, T, perm_x[i]);
      if (q8[i]) q8_quantize(perm_x[i].data(), T, w.cols, perm_q8[i]);
    }
    if (w.type != WType::kQuant) continue;
    int r = -2;  // x itself (no rotation)
    if (w.quant.signs != nullptr) {
      for (size_t k = 0; k < rot_signs.size() && r < 0; ++k)
        if (rot_cols[k] == w.cols &&
            (rot_signs[k] == w.quant.signs || std::memcmp(rot_signs[k], w.quant.signs, static_cast<size_t>(w.cols)) == 0))
          r = static_cast<int>(k);
      if (r < 0) {
        r = static_cast<int>(rot_signs.size());
        rot_signs.push_back(w.quant.signs);
        rot_cols.push_back(w.cols);
        if (rot.size() <= static_cast<size_t>(r)) rot.resize(static_cast<size_t>(r) + 1);
        rotated_input(w.quant.signs, x, T, w.cols, rot[r]);
      }
      rot_of[i] = r;
    }
    if (!uses_quant_q8(w, int8_acts)) continue;
    int k = -1;
    for (size_t j = 0; j < qq8_rot.size() && k < 0; ++j)
      if (qq8_rot[j] == r && qq8[j].cols == w.cols) k = static_cast<int>(j);
    if (k < 0) {
      k = static_cast<int>(qq8_rot.size());
      qq8_rot.push_back(r);
      if (qq8.size() <= static_cast<size_t>(k)) qq8.resize(static_cast<size_t>(k) + 1);
      quant_q8_prepare(r >= 0 ? rot[r].data() : x, T, w.cols, qq8[k]);
    }
    qq8_of[i] = k;
  }
  if (any_shared) q8_quantize(x, T, outs[0].w->cols, qa);
  auto rows = [&](size_t i, int64_t r0, int64_t r1) {
    const WeightView& w = *outs[i].w;
    if (w.type == WType::kQuant) {
      if (qq8_of[i] >= 0) return quant_q8_matmul_rows(w.quant, qq8[qq8_of[i]], outs[i].y, w.rows, r0, r1);
      return quant_matmul_rows(w.quant, rot_of[i] >= 0 ? rot[rot_of[i]].data() : x, T, outs[i].y, w.rows, r0, r1);
    }
    if (shared[i]) return ggml_q8_matmul_rows(ggml_view(w), qa, outs[i].y, w.rows, r0, r1);
    if (!perm_x.empty() && !perm_x[i].empty()) {
      if (q8[i]) return ggml_q8_matmul_rows(ggml_view(w), perm_q8[i], outs[i].y, w.rows, r0, r1);
      return ggml_matmul_rows(ggml_view(w), perm_x[i].data(), T, outs[i].y, w.rows, r0, r1);
    }
    matmul_rows(w, x, T, outs[i].y, w.rows, r0, r1, int8_acts);
  };
  if (pool == nullptr || pool->size() == 1 || work < (1 << 15)) {
    for (size_t i = 0; i < outs.size(); ++i) rows(i, 0, outs[i].w->rows);
  } else {
    // Rows of all matrices, concatenated, split across threads in chunks of 16.
    pool->parallel_for(total, 16, [&](int64_t b, int64_t e, int) {
      int64_t base = 0;
      for (size_t i = 0; i < outs.size(); ++i) {
        const int64_t n = outs[i].w->rows, lo = std::max(b, base), hi = std::min(e, base + n);
        if (lo < hi) rows(i, lo - base, hi - base);
        base += n;
      }
    });
  }
  for (const auto& [w, y] : outs)  // the LoRA terms, each over whole rows once W's products are done
    if (w->lora != nullptr) lora_add(*w, x, T, y, w->rows);
}

namespace {
void matmul_reference_base(const WeightView& w, const float* x, int64_t T, float* y) {
  if (w.type == WType::kMxfp4) return mxfp4_matmul_reference(mx_view(w), x, T, y);
  if (w.type == WType::kGgml) {
    if (w.col_perm == nullptr) return ggml_matmul_reference(ggml_view(w), x, T, y);
    std::vector<float> xp(static_cast<size_t>(T * w.cols));  // its own gather, independent of permuted_input()
    for (int64_t i = 0; i < T * w.cols; ++i) xp[i] = x[(i / w.cols) * w.cols + w.col_perm[i % w.cols]];
    ggml_matmul_reference(ggml_view(w), xp.data(), T, y);
    return;
  }
  if (w.type == WType::kQuant) {
    quant_matmul_reference(w.quant, x, T, y);
    return;
  }
  std::vector<float> row(w.cols);
  for (int64_t r = 0; r < w.rows; ++r) {
    const uint8_t* src = static_cast<const uint8_t*>(w.data) + r * w.cols * wtype_size(w.type);
    for (int64_t c = 0; c < w.cols; ++c) {
      uint16_t h;
      if (w.type == WType::kF32) {
        std::memcpy(&row[c], src + 4 * c, 4);
      } else {
        std::memcpy(&h, src + 2 * c, 2);
        row[c] = w.type == WType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
      }
    }
    for (int64_t t = 0; t < T; ++t) {
      double s = 0;
      for (int64_t c = 0; c < w.cols; ++c) s += static_cast<double>(row[c]) * x[t * w.cols + c];
      y[t * w.rows + r] = static_cast<float>(s);
    }
  }
}

}  // namespace

void matmul_reference(const WeightView& w, const float* x, int64_t T, float* y) {
  matmul_reference_base(w, x, T, y);
  if (w.lora != nullptr) lora_add(w, x, T, y, w.rows);
}

const char* simd_target_name() {
  // Lower target bits are better; dispatch picks the best supported compiled-in target.
  const int64_t t = hwy::SupportedTargets() & HWY_TARGETS;
  return hwy::TargetName(t & -t);
}

}  // namespace spool::ops
#endif  // HWY_ONCE
