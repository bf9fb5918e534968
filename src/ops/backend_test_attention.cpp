// Backend op table (backend_test.h): KV append and attention (plain, windowed, with sinks, MLA),
// grouped router selection and RoPE.
#include "ops/backend_test.h"

namespace spool::ops {
namespace {

using namespace op_table;

// ---- Attention -------------------------------------------------------------------------------

struct AttnShape {
  int n_heads, n_kv, hd;
  int64_t pos0, T;
};
// (pos0 300 and 5000: rows of several splits on the CUDA kernel, and of the most splits with more
// than its minimum keys each.)
const AttnShape kAttnShapes[] = {{4, 2, 32, 0, 1},   {4, 2, 32, 0, 40}, {8, 1, 64, 13, 7},
                                 {2, 2, 128, 300, 1}, {6, 3, 64, 5, 33}, {2, 1, 64, 5000, 2}};

// An empty unbounded cache of type kt for s.n_kv heads of s.hd, reserved for positions [0, P).
KvCache empty_cache(KvType kt, const AttnShape& s, int64_t P) {
  KvCache c;
  c.configure(kt, s.n_kv, s.hd);
  c.reserve(P, 0);
  return c;
}

// An unbounded cache holding positions [0, pos0 + T) of k, v (appended by `ref`).
KvCache full_cache(ReferenceBackend& ref, KvType kt, const AttnShape& s, const std::vector<float>& k, const std::vector<float>& v) {
  KvCache c = empty_cache(kt, s, s.pos0 + s.T);
  ref.kv_append(c, 0, s.pos0 + s.T, k.data(), v.data());
  return c;
}

[[maybe_unused]] const bool kKvAppendAndAttentionOps = covers({"kv_append", "attention"});
TEST_P(BackendOpTable, KvAppendAndAttention) {
  for (KvType kt : {KvType::kF32, KvType::kF16, KvType::kI8})
    for (const AttnShape& s : kAttnShapes) {
      SCOPED_TRACE("kv=" + std::to_string(static_cast<int>(kt)) + " heads=" + std::to_string(s.n_heads) + "/" +
                   std::to_string(s.n_kv) + " hd=" + std::to_string(s.hd) + " pos0=" + std::to_string(s.pos0) + " T=" + std::to_string(s.T));
      const int64_t P = s.pos0 + s.T, kvw = static_cast<int64_t>(s.n_kv) * s.hd;
      const std::vector<float> k = randn(P * kvw, 1), v = randn(P * kvw, 2), q = randn(s.T * s.n_heads * s.hd, 3);
      const float scale = 1.0f / std::sqrt(static_cast<float>(s.hd));
      for_each_backend("kv_append", [&](Backend& be, ReferenceBackend& ref) {
        KvCache c1 = empty_cache(kt, s, P), c2 = empty_cache(kt, s, P);
        // Earlier positions in one call, the new chunk in another (prefill then next chunk).
        be.kv_append(c1, 0, s.pos0, k.data(), v.data());
        be.kv_append(c1, s.pos0, s.T, k.data() + s.pos0 * kvw, v.data() + s.pos0 * kvw);
        ref.kv_append(c2, 0, P, k.data(), v.data());
        // A GPU backend leaves the rows in its mirror (deferred: no host round trip).
        if (be.device() != Device::kCpu) {
          EXPECT_TRUE(c1.has_deferred()) << "kv_append brought the rows to the host";
        }
        // Attention over the appended cache (a device backend reads what its kv_append wrote).
        std::vector<float> got(q.size(), NAN), want(q.size(), NAN);
        be.attention(q.data(), s.T, s.n_heads, c1, s.pos0, scale, got.data());
        ref.attention(q.data(), s.T, s.n_heads, c2, s.pos0, scale, want.data());
        expect_close(got.data(), want.data(), static_cast<int64_t>(got.size()), 1e-5, "attention after kv_append");
        if (be.device() != Device::kCpu) {
          EXPECT_TRUE(c1.has_deferred()) << "attention brought the deferred rows to the host";
        }
        // The host then reads the bytes KvCache::write stores (the device's f16 / int8 rounding).
        std::string img1, img2;
        c1.save_prefix(P, img1);
        c2.save_prefix(P, img2);
        EXPECT_TRUE(img1 == img2) << "stored KV bytes differ from KvCache::write's";
        const double store_tol = kt == KvType::kF32 ? 0 : kt == KvType::kF16 ? 1e-3 : 2e-2;
        for (int h = 0; h < s.n_kv; ++h)
          for (int64_t p = 0; p < P; ++p)
            for (int d = 0; d < s.hd; d += 7) {
              ASSERT_EQ(c1.key(h, p, d), c2.key(h, p, d));
              ASSERT_NEAR(c1.key(h, p, d), k[p * kvw + h * s.hd + d], store_tol * (1 + std::fabs(k[p * kvw + h * s.hd + d])) * 4);
              ASSERT_EQ(c1.value(h, p, d), c2.value(h, p, d));
            }
      });
      for_each_backend("attention", [&](Backend& be, ReferenceBackend& ref) {
        KvCache c1 = full_cache(ref, kt, s, k, v), c2 = full_cache(ref, kt, s, k, v);
        std::vector<float> got(q.size(), NAN), want(q.size(), NAN);
        be.attention(q.data(), s.T, s.n_heads, c1, s.pos0, scale, got.data());
        ref.attention(q.data(), s.T, s.n_heads, c2, s.pos0, scale, want.data());
        expect_close(got.data(), want.data(), static_cast<int64_t>(got.size()), 1e-5, "attention");
      });
    }
}

// DeepSeek routers: V3 (sigmoid + bias, groups by top-2 sum), Kimi-K2 (sigmoid + bias, one
// group), V2 (softmax, greedy or groups by max), with and without renormalisation and scaling.
// Each backend's own op and the generic Backend implementation (the one a GPU backend inherits).
[[maybe_unused]] const bool kRouteGroupedOps = covers({"route_grouped_top_k"});
TEST_P(BackendOpTable, RouteGroupedTopK) {
  struct C {
    int E, k, groups, topk_groups;
    bool sigmoid, top2, renorm;
    float scaling;
    bool neg_inf = false;  // GLM: dropped groups at -inf; the bias is shifted so that most s' < 0
  };
  for (const C& c : {C{16, 4, 4, 2, true, true, true, 2.5f}, C{256, 8, 8, 4, true, true, true, 2.5f}, C{24, 6, 1, 1, true, true, true, 2.827f},
                     C{16, 4, 1, 1, false, false, false, 1.0f}, C{160, 6, 8, 3, false, false, false, 16.0f},
                     C{64, 6, 1, 1, false, false, true, 1.0f}, C{16, 4, 2, 1, true, true, true, 2.5f, true}}) {
    SCOPED_TRACE("E=" + std::to_string(c.E) + " k=" + std::to_string(c.k) + " groups=" + std::to_string(c.groups) + "/" +
                 std::to_string(c.topk_groups) + " sigmoid=" + std::to_string(c.sigmoid));
    const int64_t T = 11;
    const std::vector<float> logits = randn(T * c.E, c.E + c.k, 2.0f);
    std::vector<float> bias = randn(c.E, 7, 0.3f);
    if (c.neg_inf)
      for (float& b : bias) b -= 0.8f;
    RouterParams r;
    r.mask_neg_inf = c.neg_inf;
    r.sigmoid = c.sigmoid;
    r.bias = c.sigmoid ? bias.data() : nullptr;
    r.n_group = c.groups;
    r.topk_group = c.topk_groups;
    r.group_top2_sum = c.top2;
    r.renormalize = c.renorm;
    r.scaling = c.scaling;
    for_each_backend("route_grouped_top_k", [&](Backend& be, ReferenceBackend& ref) {
      std::vector<float> w1(T * c.k), w2(T * c.k), w3(T * c.k), m1(T), m2(T), m3(T);
      std::vector<int> i1(T * c.k), i2(T * c.k), i3(T * c.k);
      be.route_grouped_top_k(logits.data(), T, c.E, c.k, r, i1.data(), w1.data(), m1.data());
      be.Backend::route_grouped_top_k(logits.data(), T, c.E, c.k, r, i3.data(), w3.data(), m3.data());
      ref.route_grouped_top_k(logits.data(), T, c.E, c.k, r, i2.data(), w2.data(), m2.data());
      EXPECT_EQ(i1, i2);
      EXPECT_EQ(i3, i2);
      expect_close(w1.data(), w2.data(), T * c.k, 1e-5, "grouped routing weights");
      expect_close(w3.data(), w2.data(), T * c.k, 1e-5, "grouped routing weights (generic)");
      expect_close(m1.data(), m2.data(), T, 1e-5, "grouped routing margins");
      if (c.groups > 1)  // group-limited: every chosen expert lies in one of topk_groups groups
        for (int64_t t = 0; t < T; ++t) {
          std::set<int> gs;
          for (int j = 0; j < c.k; ++j) gs.insert(i1[t * c.k + j] / (c.E / c.groups));
          EXPECT_LE(static_cast<int>(gs.size()), c.topk_groups);
        }
    });
  }
}

// A cache bounded by `window` (KvCache::configure) filled with positions [0, pos0 + T) of k, v
// by `be`: [0, pos0) appended in chunks of 3, then [pos0, pos0 + T) in one, each after the
// reserve() a forward makes (so its rows have moved once the positions pass the window).
KvCache windowed_cache(Backend& be, KvType kt, const AttnShape& s, int64_t window, const std::vector<float>& k,
                       const std::vector<float>& v) {
  const int64_t kvw = static_cast<int64_t>(s.n_kv) * s.hd;
  KvCache c;
  c.configure(kt, s.n_kv, s.hd, false, window);
  for (int64_t p = 0; p < s.pos0; p += 3) {
    const int64_t n = std::min<int64_t>(3, s.pos0 - p);
    c.reserve(p + n, p);
    be.kv_append(c, p, n, k.data() + p * kvw, v.data() + p * kvw);
  }
  c.reserve(s.pos0 + s.T, s.pos0);
  be.kv_append(c, s.pos0, s.T, k.data() + s.pos0 * kvw, v.data() + s.pos0 * kvw);
  return c;
}

// The trace of one windowed attention case.
std::string window_case(KvType kt, const AttnShape& s, int64_t window) {
  return "kv=" + std::to_string(static_cast<int>(kt)) + " heads=" + std::to_string(s.n_heads) + " pos0=" + std::to_string(s.pos0) +
         " T=" + std::to_string(s.T) + " window=" + std::to_string(window);
}

// Sliding-window attention (Mixtral): windows shorter than, equal to and longer than the
// positions, on every KV type; the generic implementation too; and over a cache bounded by the
// window (only its last rows held, moved to the front) the same results.
[[maybe_unused]] const bool kAttentionWindowOps = covers({"attention_window"});
TEST_P(BackendOpTable, AttentionWindow) {
  for (KvType kt : {KvType::kF32, KvType::kF16, KvType::kI8})
    for (const AttnShape& s : kAttnShapes)
      for (int64_t window : {1, 4, 37, 1000}) {
        SCOPED_TRACE(window_case(kt, s, window));
        const int64_t P = s.pos0 + s.T, kvw = static_cast<int64_t>(s.n_kv) * s.hd;
        const std::vector<float> k = randn(P * kvw, 1), v = randn(P * kvw, 2), q = randn(s.T * s.n_heads * s.hd, 3);
        const float scale = 1.0f / std::sqrt(static_cast<float>(s.hd));
        for_each_backend("attention_window", [&](Backend& be, ReferenceBackend& ref) {
          const KvCache c = full_cache(ref, kt, s, k, v);
          std::vector<float> got(q.size(), NAN), gen(q.size(), NAN), want(q.size(), NAN);
          be.attention_window(q.data(), s.T, s.n_heads, c, s.pos0, scale, window, got.data());
          be.Backend::attention_window(q.data(), s.T, s.n_heads, c, s.pos0, scale, window, gen.data());
          ref.attention_window(q.data(), s.T, s.n_heads, c, s.pos0, scale, window, want.data());
          expect_close(got.data(), want.data(), static_cast<int64_t>(got.size()), 1e-5, "attention_window");
          expect_close(gen.data(), want.data(), static_cast<int64_t>(got.size()), 1e-5, "attention_window (generic)");
          if (window >= P) {  // no masking: the plain op
            std::vector<float> full(q.size(), NAN);
            ref.attention(q.data(), s.T, s.n_heads, c, s.pos0, scale, full.data());
            expect_close(got.data(), full.data(), static_cast<int64_t>(got.size()), 1e-5, "window past the positions");
          }
          const KvCache w = windowed_cache(be, kt, s, window, k, v);
          EXPECT_LE(w.capacity(), KvCache::window_rows(window, std::max<int64_t>(3, s.T)));
          std::vector<float> bounded(q.size(), NAN), bounded_ref(q.size(), NAN);
          be.attention_window(q.data(), s.T, s.n_heads, w, s.pos0, scale, window, bounded.data());
          ref.attention_window(q.data(), s.T, s.n_heads, w, s.pos0, scale, window, bounded_ref.data());
          expect_close(bounded.data(), want.data(), static_cast<int64_t>(got.size()), 1e-5, "attention_window (bounded cache)");
          expect_close(bounded_ref.data(), want.data(), static_cast<int64_t>(got.size()), 1e-5, "reference (bounded cache)");
        });
      }
}

// gpt-oss attention sinks, with and without a window, every KV type: each backend's op and the
// generic one against the scalar reference; a sink of -1e30 must reduce to plain (windowed)
// attention, and a finite sink must change the result (rows then sum to less than 1).
[[maybe_unused]] const bool kAttentionSinksOps = covers({"attention_sinks"});
TEST_P(BackendOpTable, AttentionSinks) {
  for (KvType kt : {KvType::kF32, KvType::kF16, KvType::kI8})
    for (const AttnShape& s : kAttnShapes)
      for (int64_t window : {0, 4, 1000}) {
        SCOPED_TRACE(window_case(kt, s, window));
        const int64_t P = s.pos0 + s.T, kvw = static_cast<int64_t>(s.n_kv) * s.hd;
        const std::vector<float> k = randn(P * kvw, 1), v = randn(P * kvw, 2), q = randn(s.T * s.n_heads * s.hd, 3);
        // (Over thousands of keys a sink of N(0, 2) weighs next to nothing: there it is raised by
        // log(keys), so that it still changes the result.)
        std::vector<float> sinks = randn(s.n_heads, 4, 2.0f);
        const std::vector<float> none(s.n_heads, -1e30f);
        if (P > 1000)
          for (float& x : sinks) x += std::log(static_cast<float>(window > 0 ? std::min<int64_t>(window, P) : P));
        const float scale = 1.0f / std::sqrt(static_cast<float>(s.hd));
        for_each_backend("attention_sinks", [&](Backend& be, ReferenceBackend& ref) {
          const KvCache c = full_cache(ref, kt, s, k, v);
          std::vector<float> got(q.size(), NAN), gen(q.size(), NAN), want(q.size(), NAN);
          be.attention_sinks(q.data(), s.T, s.n_heads, c, s.pos0, scale, window, sinks.data(), got.data());
          be.Backend::attention_sinks(q.data(), s.T, s.n_heads, c, s.pos0, scale, window, sinks.data(), gen.data());
          ref.attention_sinks(q.data(), s.T, s.n_heads, c, s.pos0, scale, window, sinks.data(), want.data());
          expect_close(got.data(), want.data(), static_cast<int64_t>(got.size()), 1e-5, "attention_sinks");
          expect_close(gen.data(), want.data(), static_cast<int64_t>(got.size()), 1e-5, "attention_sinks (generic)");
          std::vector<float> off(q.size(), NAN), plain(q.size(), NAN);
          be.attention_sinks(q.data(), s.T, s.n_heads, c, s.pos0, scale, window, none.data(), off.data());
          ref.attention_window(q.data(), s.T, s.n_heads, c, s.pos0, scale, window, plain.data());
          expect_close(off.data(), plain.data(), static_cast<int64_t>(off.size()), 1e-5, "sinks at -inf = no sinks");
          double diff = 0;
          for (size_t i = 0; i < got.size(); ++i) diff = std::max(diff, static_cast<double>(std::fabs(got[i] - plain[i])));
          EXPECT_GT(diff, 1e-3) << "the sinks must change the result";
          if (window > 0) {  // gpt-oss's sliding layers: a cache bounded by the window
            const KvCache w = windowed_cache(be, kt, s, window, k, v);
            std::vector<float> bounded(q.size(), NAN);
            be.attention_sinks(q.data(), s.T, s.n_heads, w, s.pos0, scale, window, sinks.data(), bounded.data());
            expect_close(bounded.data(), want.data(), static_cast<int64_t>(got.size()), 1e-5, "attention_sinks (bounded cache)");
          }
        });
      }
}

// Absorbed MLA attention over a keys-only latent cache (DeepSeek): latent widths of the
// fixtures (32 + 8) and of V3 (512 + 64), every KV type, prefill and decode shapes.
[[maybe_unused]] const bool kMlaAttentionOps = covers({"mla_attention"});
TEST_P(BackendOpTable, MlaAttention) {
  struct M {
    int heads, R, P;
    int64_t pos0, T;
  };
  for (KvType kt : {KvType::kF32, KvType::kF16, KvType::kI8})
    for (const M& s : {M{4, 32, 8, 0, 24}, M{4, 32, 8, 24, 1}, M{16, 512, 64, 40, 1}, M{3, 64, 16, 5, 9},
                        // rows of more than 64 keys (split over the keys on CUDA), and a batch crossing that line
                        M{4, 64, 16, 3000, 2}, M{2, 32, 8, 60, 10}}) {
      SCOPED_TRACE("kv=" + std::to_string(static_cast<int>(kt)) + " heads=" + std::to_string(s.heads) + " R=" + std::to_string(s.R) +
                   " pos0=" + std::to_string(s.pos0) + " T=" + std::to_string(s.T));
      const int D = s.R + s.P;
      const int64_t N = s.pos0 + s.T;
      const std::vector<float> lat = randn(N * D, 4), q = randn(s.T * s.heads * D, 5);
      const float scale = 0.13f;
      for_each_backend("mla_attention", [&](Backend& be, ReferenceBackend& ref) {
        KvCache c;
        c.configure(kt, 1, D, true);
        c.reserve(N, 0);
        be.kv_append(c, 0, N, lat.data(), lat.data());
        EXPECT_EQ(c.bytes_per_position(), static_cast<uint64_t>(D) * (kt == KvType::kF32 ? 4 : kt == KvType::kF16 ? 2 : 1) +
                                              (kt == KvType::kI8 ? c.groups() * 4u : 0u));
        std::vector<float> got(s.T * s.heads * s.R, NAN), gen(got.size(), NAN), want(got.size(), NAN);
        be.mla_attention(q.data(), s.T, s.heads, c, s.pos0, scale, s.R, got.data());
        be.Backend::mla_attention(q.data(), s.T, s.heads, c, s.pos0, scale, s.R, gen.data());
        ref.mla_attention(q.data(), s.T, s.heads, c, s.pos0, scale, s.R, want.data());
        expect_close(got.data(), want.data(), static_cast<int64_t>(got.size()), 1e-5, "mla_attention");
        expect_close(gen.data(), want.data(), static_cast<int64_t>(got.size()), 1e-5, "mla_attention (generic)");
      });
    }
}

[[maybe_unused]] const bool kRopeOps = covers({"rope"});
TEST_P(BackendOpTable, Rope) {
  struct R {
    int rotary, hd, heads;
    int64_t T, pos0, stride_pad;
    bool pairs = false;
  };
  for (const R& r : {R{64, 64, 4, 3, 0, 0}, R{16, 64, 2, 5, 1000, 0}, R{128, 128, 3, 1, 262000, 0}, R{32, 64, 2, 4, 7, 64},
                     R{64, 64, 16, 3, 5, 0, true}, R{64, 192, 2, 2, 70000, 32, true}, R{576, 576, 1, 2, 9, 0, true}}) {
    SCOPED_TRACE("rotary=" + std::to_string(r.rotary) + " pos0=" + std::to_string(r.pos0) + (r.pairs ? " pairs" : ""));
    const Rope rope = Rope(r.rotary, 1e7).with_pairs(r.pairs);
    const int64_t stride = static_cast<int64_t>(r.heads) * r.hd + r.stride_pad;
    const std::vector<float> x = randn(r.T * stride, 9);
    for_each_backend("rope", [&](Backend& be, ReferenceBackend& ref) {
      std::vector<float> a = x, b = x;
      be.rope(rope, a.data(), r.T, stride, r.heads, r.hd, r.pos0);
      ref.rope(rope, b.data(), r.T, stride, r.heads, r.hd, r.pos0);
      expect_close(a.data(), b.data(), static_cast<int64_t>(a.size()), 1e-6, "rope");
    });
  }
}

}  // namespace
}  // namespace spool::ops
