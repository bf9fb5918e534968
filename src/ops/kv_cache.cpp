#include "ops/kv_cache.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "ops/kv_kernels.h"
#include "ops/vec.h"
#include "ops/weights.h"

namespace spool::ops {

KvType kv_type_from_bits(int bits) {
  if (bits == 32) return KvType::kF32;
  if (bits == 16) return KvType::kF16;
  if (bits == 8) return KvType::kI8;
  throw UsageError(strfmt("--kv-bits must be 32, 16 or 8 (got %d)", bits));
}

void KvCache::touch() {
  static std::atomic<uint64_t> counter{0};
  gen_ = ++counter;
}

KvCache::KvCache(const KvCache& o) { *this = o; }

void KvCache::take_shape(const KvCache& o) {
  fetch_ = nullptr;  // (the source's rows are settled: nothing here is deferred)
  gen_ = o.gen_;
  type_ = o.type_;
  n_kv_ = o.n_kv_, hd_ = o.hd_, vd_ = o.vd_, groups_ = o.groups_;
  cap_ = o.cap_, window_ = o.window_, base_ = o.base_;
}

KvCache& KvCache::operator=(const KvCache& o) {
  if (this == &o) return *this;
  o.settle();
  take_shape(o);
  k_ = o.k_, v_ = o.v_, ks_ = o.ks_, vs_ = o.vs_;
  return *this;
}

KvCache::KvCache(KvCache&& o) noexcept(false) { *this = std::move(o); }

KvCache& KvCache::operator=(KvCache&& o) noexcept(false) {
  if (this == &o) return *this;
  o.settle();  // (a device mirror is keyed by the cache's address: the rows must be in host storage)
  take_shape(o);
  k_ = std::move(o.k_), v_ = std::move(o.v_), ks_ = std::move(o.ks_), vs_ = std::move(o.vs_);
  // The source holds nothing now: an empty cache of the same geometry (its next reserve() allocates).
  o.k_.clear(), o.v_.clear(), o.ks_.clear(), o.vs_.clear();
  o.cap_ = 0;
  o.base_ = 0;
  o.touch();
  return *this;
}

void KvCache::defer_rows(int64_t lo, int64_t hi, RowFetch fetch) {
  if (lo < 0 || hi <= lo || hi > cap_ || !fetch) fail("KV cache: cannot defer rows [%lld, %lld) of %lld", (long long)lo, (long long)hi, (long long)cap_);
  if (fetch_) {  // one range per cache: widen it (the same device wrote both)
    lo = std::min(lo, def_lo_);
    hi = std::max(hi, def_hi_);
  }
  fetch_ = std::move(fetch);
  def_lo_ = lo;
  def_hi_ = hi;
  touch();
}

void KvCache::settle() const {
  if (!fetch_) return;
  RowFetch f = std::move(fetch_);
  fetch_ = nullptr;  // (the fetch reads storage through the *_storage() accessors, which do not settle)
  try {
    f(const_cast<KvCache&>(*this), def_lo_, def_hi_);
  } catch (...) {
    fetch_ = std::move(f);
    throw;
  }
}

void KvCache::configure(KvType type, int n_kv_heads, int head_dim, bool keys_only, int64_t window) {
  if (window < 0 || (window > 0 && keys_only)) fail("KV cache: a window of %lld is not supported here", (long long)window);
  fetch_ = nullptr;  // contents dropped
  touch();
  type_ = type;
  n_kv_ = n_kv_heads;
  hd_ = head_dim;
  vd_ = keys_only ? 0 : head_dim;
  groups_ = (head_dim % kKvGroup == 0 && head_dim > kKvGroup) ? head_dim / kKvGroup : 1;
  cap_ = 0;
  window_ = window;
  base_ = 0;
  k_.clear();
  v_.clear();
  ks_.clear();
  vs_.clear();
}

uint64_t KvCache::bytes_per_position() const {
  uint64_t n = static_cast<uint64_t>(n_kv_) * (hd_ + vd_) * elem();
  if (type_ == KvType::kI8) n += (vd_ > 0 ? 2ull : 1ull) * n_kv_ * groups_ * sizeof(float);
  return n;
}

uint64_t KvCache::saved_bytes(int64_t n) const {
  return static_cast<uint64_t>(std::max<int64_t>(n - first_kept(n), 0)) * bytes_per_position();
}

int64_t KvCache::window_rows(int64_t window, int64_t chunk) { return window - 1 + std::max(chunk, window / 8); }

void KvCache::reallocate(int64_t cap, int64_t from, int64_t n) {
  const int64_t off = from - base_;  // physical row of `from`
  const int es = elem();
  std::vector<uint8_t> k(static_cast<size_t>(n_kv_) * hd_ * cap * es), v(static_cast<size_t>(n_kv_) * vd_ * cap * es);
  for (int64_t row = 0; row < static_cast<int64_t>(n_kv_) * hd_ && n > 0; ++row)  // key rows: (head, dim)
    std::memcpy(k.data() + row * cap * es, k_.data() + (row * cap_ + off) * es, n * es);
  for (int h = 0; h < n_kv_ && n > 0; ++h)  // value rows: (head, position)
    std::memcpy(v.data() + h * cap * vd_ * es, v_.data() + (h * cap_ + off) * vd_ * es, n * vd_ * es);
  if (type_ == KvType::kI8) {
    std::vector<float> ks(static_cast<size_t>(n_kv_) * groups_ * cap), vs(vd_ > 0 ? ks.size() : 0);
    for (int64_t row = 0; row < static_cast<int64_t>(n_kv_) * groups_ && n > 0; ++row)
      std::copy_n(ks_.data() + row * cap_ + off, n, ks.data() + row * cap);
    for (int h = 0; h < n_kv_ && n > 0 && vd_ > 0; ++h)
      std::copy_n(vs_.data() + (h * cap_ + off) * groups_, n * groups_, vs.data() + h * cap * groups_);
    ks_.swap(ks);
    vs_.swap(vs);
  }
  k_.swap(k);
  v_.swap(v);
  cap_ = cap;
  base_ = from;
  touch();
}

void KvCache::move_rows(int64_t from, int64_t n) {
  const int64_t off = from - base_;
  if (off != 0 && n > 0) {
    const int es = elem();
    for (int64_t row = 0; row < static_cast<int64_t>(n_kv_) * hd_; ++row)
      std::memmove(k_.data() + row * cap_ * es, k_.data() + (row * cap_ + off) * es, n * es);
    for (int h = 0; h < n_kv_; ++h)
      std::memmove(v_.data() + h * cap_ * vd_ * es, v_.data() + (h * cap_ + off) * vd_ * es, n * vd_ * es);
    if (type_ == KvType::kI8) {
      for (int64_t row = 0; row < static_cast<int64_t>(n_kv_) * groups_; ++row)
        std::memmove(ks_.data() + row * cap_, ks_.data() + row * cap_ + off, n * sizeof(float));
      for (int h = 0; h < n_kv_ && vd_ > 0; ++h)
        std::memmove(vs_.data() + h * cap_ * groups_, vs_.data() + (h * cap_ + off) * groups_, n * groups_ * sizeof(float));
    }
  }
  base_ = from;
  touch();
}

void KvCache::reserve(int64_t positions, int64_t keep) {
  if (positions - base_ <= cap_) return;
  settle();  // rows move or are copied below
  // Growth of an unbounded cache (and of a windowed one until the window bound caps it).
  auto grown = [&](int64_t need) {
    const int64_t c = std::max<int64_t>({need, 2 * cap_, 256});
    return (c + 255) / 256 * 256;
  };
  if (window_ <= 0) {
    reallocate(grown(positions), 0, std::clamp<int64_t>(keep, 0, cap_));
    return;
  }
  // Windowed: only rows [lo, keep) are still needed; move them to the front when the new
  // positions then fit, otherwise grow (to at most window_rows(W, T) rows).
  const int64_t lo = std::max(base_, first_kept(keep));
  const int64_t n = std::max<int64_t>(0, std::min(keep, base_ + cap_) - lo);
  const int64_t span = positions - lo;
  if (span <= cap_) return move_rows(lo, n);
  const int64_t limit = std::max(span, window_rows(window_, positions - keep));
  reallocate(std::min(grown(span), limit), lo, n);
}

void KvCache::clear() {
  fetch_ = nullptr;  // every position is forgotten
  move_rows(0, 0);
}

int64_t kv_capacity_for(int64_t prompt, int64_t total, int64_t step, int64_t window) {
  KvCache c;  // no heads: the growth and moves of KvCache::reserve without any bytes
  c.configure(KvType::kF32, 0, 0, false, window);
  step = std::max<int64_t>(step, 1);
  for (int64_t p = 0; p < prompt; p += step) c.reserve(std::min(prompt, p + step), p);
  for (int64_t p = prompt; p < total; ++p) c.reserve(p + 1, p);
  return c.capacity();
}

namespace {

// Symmetric int8 of n values: returns the scale (max|x| / 127; 0 for an all-zero group).
float quantize_i8(const float* x, int n, int8_t* out) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float scale = amax / 127.0f;
  const float inv = scale > 0 ? 1.0f / scale : 0.0f;
  for (int i = 0; i < n; ++i) out[i] = static_cast<int8_t>(std::lrint(std::clamp(x[i] * inv, -127.0f, 127.0f)));
  return scale;
}

}  // namespace

void KvCache::write(int64_t position, const float* k, const float* v) {
  if (position < base_ || position - base_ >= cap_)
    fail("KV cache: position %lld is outside the rows held [%lld, %lld)", (long long)position, (long long)base_, (long long)(base_ + cap_));
  settle();
  touch();
  const int64_t pos = position - base_;  // its row
  const int gd = group_dim();
  for (int h = 0; h < n_kv_; ++h) {
    const float* kh = k + h * hd_;
    const float* vh = v + h * hd_;
    const int64_t vrow = (static_cast<int64_t>(h) * cap_ + pos) * hd_;
    switch (type_) {
      case KvType::kF32: {
        float* kb = reinterpret_cast<float*>(k_.data());
        for (int d = 0; d < hd_; ++d) kb[(static_cast<int64_t>(h) * hd_ + d) * cap_ + pos] = kh[d];
        if (vd_ > 0) std::memcpy(reinterpret_cast<float*>(v_.data()) + vrow, vh, hd_ * sizeof(float));
        break;
      }
      case KvType::kF16: {
        uint16_t* kb = reinterpret_cast<uint16_t*>(k_.data());
        for (int d = 0; d < hd_; ++d) kb[(static_cast<int64_t>(h) * hd_ + d) * cap_ + pos] = f32_to_f16(kh[d]);
        if (vd_ > 0) {
          uint16_t* vb = reinterpret_cast<uint16_t*>(v_.data()) + vrow;
          for (int d = 0; d < hd_; ++d) vb[d] = f32_to_f16(vh[d]);
        }
        break;
      }
      case KvType::kI8: {
        int8_t q[1024];
        int8_t* kb = reinterpret_cast<int8_t*>(k_.data());
        for (int g = 0; g < groups_; ++g) {
          ks_[(static_cast<int64_t>(h) * groups_ + g) * cap_ + pos] = quantize_i8(kh + g * gd, gd, q);
          for (int d = 0; d < gd; ++d) kb[(static_cast<int64_t>(h) * hd_ + g * gd + d) * cap_ + pos] = q[d];
          if (vd_ > 0)
            vs_[(static_cast<int64_t>(h) * cap_ + pos) * groups_ + g] =
                quantize_i8(vh + g * gd, gd, reinterpret_cast<int8_t*>(v_.data()) + vrow + g * gd);
        }
        break;
      }
    }
  }
}

void KvCache::copy_prefix(const KvCache& o, int64_t n) {
  o.settle();
  settle();
  if (o.type_ != type_ || o.n_kv_ != n_kv_ || o.hd_ != hd_ || o.vd_ != vd_ || o.window_ != window_)
    fail("KV cache snapshot has a different geometry");
  if (!o.holds(n))
    fail("KV cache: positions [%lld, %lld) are no longer held (rows from %lld)", (long long)o.first_kept(n), (long long)n, (long long)o.base_);
  const int64_t first = first_kept(n), rows = n - first;
  if (window_ <= 0) {
    reserve(n, 0);
  } else if (cap_ < rows) {
    reallocate(rows, first, 0);
  } else {
    base_ = first;
  }
  touch();
  const int es = elem();
  const int64_t off = first - o.base_;  // physical row of `first` in o (this cache: row 0)
  for (int64_t row = 0; row < static_cast<int64_t>(n_kv_) * hd_; ++row)
    std::memcpy(k_.data() + row * cap_ * es, o.k_.data() + (row * o.cap_ + off) * es, rows * es);
  for (int h = 0; h < n_kv_; ++h)
    std::memcpy(v_.data() + h * cap_ * vd_ * es, o.v_.data() + (h * o.cap_ + off) * vd_ * es, rows * vd_ * es);
  if (type_ == KvType::kI8) {
    for (int64_t row = 0; row < static_cast<int64_t>(n_kv_) * groups_; ++row)
      std::copy_n(o.ks_.data() + row * o.cap_ + off, rows, ks_.data() + row * cap_);
    for (int h = 0; h < n_kv_ && vd_ > 0; ++h)
      std::copy_n(o.vs_.data() + (h * o.cap_ + off) * groups_, rows * groups_, vs_.data() + h * cap_ * groups_);
  }
}

void KvCache::save_prefix(int64_t n, std::string& out) const {
  settle();
  if (!holds(n))
    fail("KV cache: cannot save positions [%lld, %lld): rows [%lld, %lld) are held", (long long)first_kept(n), (long long)n,
         (long long)base_, (long long)(base_ + cap_));
  const int64_t first = first_kept(n);
  if (n == first) return;
  const size_t es = static_cast<size_t>(elem()), un = static_cast<size_t>(n - first), cap = static_cast<size_t>(cap_);
  const size_t off = static_cast<size_t>(first - base_);
  out.reserve(out.size() + un * bytes_per_position());
  auto put = [&](const void* p, size_t bytes) { out.append(static_cast<const char*>(p), bytes); };
  for (size_t row = 0; row < static_cast<size_t>(n_kv_) * hd_; ++row) put(k_.data() + (row * cap + off) * es, un * es);
  for (size_t h = 0; h < static_cast<size_t>(n_kv_); ++h) put(v_.data() + (h * cap + off) * vd_ * es, un * vd_ * es);
  if (type_ == KvType::kI8) {
    for (size_t row = 0; row < static_cast<size_t>(n_kv_) * groups_; ++row) put(ks_.data() + row * cap + off, un * sizeof(float));
    for (size_t h = 0; h < static_cast<size_t>(n_kv_) && vd_ > 0; ++h)
      put(vs_.data() + (h * cap + off) * groups_, un * groups_ * sizeof(float));
  }
}

void KvCache::load_prefix(std::string_view data, int64_t n) {
  settle();
  if (n < 0 || data.size() != saved_bytes(n))
    fail("KV cache snapshot has %zu bytes, expected %llu for positions [%lld, %lld)", data.size(),
         (unsigned long long)saved_bytes(std::max<int64_t>(n, 0)), (long long)first_kept(n), (long long)n);
  const int64_t first = first_kept(n), rows = n - first;
  if (window_ <= 0) {
    if (rows == 0) return;
    reserve(n, 0);
  } else if (cap_ < rows) {
    reallocate(rows, first, 0);
  } else {
    base_ = first;  // (also with no rows: a window of 1, or n == 0)
  }
  touch();
  const size_t es = static_cast<size_t>(elem()), un = static_cast<size_t>(rows), cap = static_cast<size_t>(cap_);
  const char* p = data.data();
  auto get = [&](void* dst, size_t bytes) {
    std::memcpy(dst, p, bytes);
    p += bytes;
  };
  for (size_t row = 0; row < static_cast<size_t>(n_kv_) * hd_; ++row) get(k_.data() + row * cap * es, un * es);
  for (size_t h = 0; h < static_cast<size_t>(n_kv_); ++h) get(v_.data() + h * cap * vd_ * es, un * vd_ * es);
  if (type_ == KvType::kI8) {
    for (size_t row = 0; row < static_cast<size_t>(n_kv_) * groups_; ++row) get(ks_.data() + row * cap, un * sizeof(float));
    for (size_t h = 0; h < static_cast<size_t>(n_kv_) && vd_ > 0; ++h) get(vs_.data() + h * cap * groups_, un * groups_ * sizeof(float));
  }
}

float KvCache::key(int h, int64_t pos, int d) const {
  settle();
  if (pos < base_ || pos - base_ >= cap_)
    fail("KV cache: position %lld is not held (rows [%lld, %lld))", (long long)pos, (long long)base_, (long long)(base_ + cap_));
  const int64_t p = pos - base_;
  const int64_t i = (static_cast<int64_t>(h) * hd_ + d) * cap_ + p;
  switch (type_) {
    case KvType::kF32: return reinterpret_cast<const float*>(k_.data())[i];
    case KvType::kF16: return f16_to_f32(reinterpret_cast<const uint16_t*>(k_.data())[i]);
    default: return reinterpret_cast<const int8_t*>(k_.data())[i] * ks_[(static_cast<int64_t>(h) * groups_ + d / group_dim()) * cap_ + p];
  }
}

float KvCache::value(int h, int64_t pos, int d) const {
  settle();
  if (vd_ == 0) fail("KV cache: a keys-only (latent) cache holds no values");
  if (pos < base_ || pos - base_ >= cap_)
    fail("KV cache: position %lld is not held (rows [%lld, %lld))", (long long)pos, (long long)base_, (long long)(base_ + cap_));
  const int64_t p = pos - base_;
  const int64_t i = (static_cast<int64_t>(h) * cap_ + p) * hd_ + d;
  switch (type_) {
    case KvType::kF32: return reinterpret_cast<const float*>(v_.data())[i];
    case KvType::kF16: return f16_to_f32(reinterpret_cast<const uint16_t*>(v_.data())[i]);
    default: return reinterpret_cast<const int8_t*>(v_.data())[i] * vs_[(static_cast<int64_t>(h) * cap_ + p) * groups_ + d / group_dim()];
  }
}

namespace {
constexpr int64_t kQueryTile = 32;  // query rows (tokens x heads of one KV group) per task
}

// Per task: one KV head and a tile of queries of that head's group: scores against the
// transposed keys (SIMD over positions), causal mask + softmax per row, then P.V
// accumulated row by row with SIMD.
void attention(const float* q, int64_t T, int n_heads, const KvCache& kv, int64_t pos0, float scale, float* out,
               ThreadPool* pool, int64_t window, const float* sinks) {
  if (kv.keys_only()) fail("attention: the cache holds keys only (an MLA latent cache: use mla_attention)");
  kv.settle();  // once, before the pool's threads read the storage
  const int group = n_heads / kv.n_kv_heads();
  const int hd = kv.head_dim();
  const int64_t cap = kv.capacity(), base = kv.base();
  const int64_t first = window > 0 ? std::max<int64_t>(0, pos0 + 1 - window) : 0;  // earliest key any query sees
  if (first < base || pos0 + T - base > cap)
    fail("attention: positions [%lld, %lld) are needed, the cache holds [%lld, %lld)", (long long)first, (long long)(pos0 + T),
         (long long)base, (long long)(base + cap));
  const int64_t rows_per_head = T * group;  // query rows of one KV head: (t, g)
  const int64_t tiles = (rows_per_head + kQueryTile - 1) / kQueryTile;
  auto task = [&](int64_t i, int) {
    const int kvh = static_cast<int>(i / tiles);
    const int64_t r0 = (i % tiles) * kQueryTile;
    const int64_t nr = std::min(kQueryTile, rows_per_head - r0);
    // Row r of the tile is query (t, g) with t = (r0 + r) / group, head kvh * group + g.
    const int64_t n = pos0 + (r0 + nr - 1) / group + 1;  // keys any row of the tile may see
    thread_local std::vector<float> qs, sc, acc;
    qs.resize(nr * hd);
    sc.resize(nr * n);
    acc.assign(nr * hd, 0.0f);
    for (int64_t r = 0; r < nr; ++r) {
      const int64_t t = (r0 + r) / group, g = (r0 + r) % group;
      std::memcpy(qs.data() + r * hd, q + (t * n_heads + kvh * group + g) * hd, hd * sizeof(float));
    }
    // Sliding window: keys before k0 (the first row's window start, the earliest any row of the
    // tile sees) are neither read nor scored; m = n - k0 keys from k0 on.
    const int64_t k0 = window > 0 ? std::max<int64_t>(0, pos0 + r0 / group + 1 - window) : 0;
    const int64_t m = n - k0;
    const int64_t kp = k0 - base;                           // k0's row in the cache
    const int64_t krow0 = static_cast<int64_t>(kvh) * hd;  // first key row of this head
    const int64_t vrow0 = static_cast<int64_t>(kvh) * cap + kp;  // value row of (this head, k0)
    switch (kv.type()) {
      case KvType::kF32:
        scores_kt(qs.data(), hd, nr, reinterpret_cast<const float*>(kv.k_data()) + krow0 * cap + kp, cap, m, hd, sc.data(), m);
        break;
      case KvType::kF16:
        scores_kt_f16(qs.data(), hd, nr, reinterpret_cast<const uint16_t*>(kv.k_data()) + krow0 * cap + kp, cap, m, hd, sc.data(), m);
        break;
      case KvType::kI8:
        scores_kt_i8(qs.data(), hd, nr, reinterpret_cast<const int8_t*>(kv.k_data()) + krow0 * cap + kp,
                     kv.k_scales() + static_cast<int64_t>(kvh) * kv.groups() * cap + kp, cap, kv.group_dim(), m, hd, sc.data(), m);
        break;
    }
    for (int64_t r = 0; r < nr; ++r) {
      const int64_t visible = pos0 + (r0 + r) / group + 1 - k0;  // local: keys [lo, visible) of the m
      const int64_t lo = window > 0 ? std::max<int64_t>(0, visible + k0 - window) - k0 : 0;
      float* row = sc.data() + r * m;
      ops::scale(scale, row + lo, visible - lo);
      if (sinks != nullptr) {  // the head's sink joins the max and the denominator, then is dropped
        const float sink = sinks[kvh * group + (r0 + r) % group];
        float mx = sink;
        for (int64_t j = lo; j < visible; ++j) mx = std::max(mx, row[j]);
        float z = std::exp(sink - mx);
        for (int64_t j = lo; j < visible; ++j) z += (row[j] = std::exp(row[j] - mx));
        ops::scale(1.0f / z, row + lo, visible - lo);
      } else {
        softmax_inplace(row + lo, visible - lo);
      }
      std::fill(row, row + lo, 0.0f);
      std::fill(row + visible, row + m, 0.0f);
    }
    switch (kv.type()) {
      case KvType::kF32:
        accumulate_rows(sc.data(), m, nr, reinterpret_cast<const float*>(kv.v_data()) + vrow0 * hd, hd, m, hd, acc.data(), hd);
        break;
      case KvType::kF16:
        accumulate_rows_f16(sc.data(), m, nr, reinterpret_cast<const uint16_t*>(kv.v_data()) + vrow0 * hd, hd, m, hd, acc.data(), hd);
        break;
      case KvType::kI8:
        accumulate_rows_i8(sc.data(), m, nr, reinterpret_cast<const int8_t*>(kv.v_data()) + vrow0 * hd,
                           kv.v_scales() + vrow0 * kv.groups(), hd, kv.groups(), kv.group_dim(), m, hd, acc.data(), hd);
        break;
    }
    for (int64_t r = 0; r < nr; ++r) {
      const int64_t t = (r0 + r) / group, g = (r0 + r) % group;
      std::memcpy(out + (t * n_heads + kvh * group + g) * hd, acc.data() + r * hd, hd * sizeof(float));
    }
  };
  const int64_t tasks = static_cast<int64_t>(kv.n_kv_heads()) * tiles;
  if (pool == nullptr || tasks == 1 || T * n_heads * (pos0 + T) * hd < (1 << 14)) {
    for (int64_t i = 0; i < tasks; ++i) task(i, 0);
  } else {
    pool->run(tasks, task);
  }
}

}  // namespace spool::ops
