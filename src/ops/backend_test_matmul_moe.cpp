// Backend op table (backend_test.h): matrix products, the MoE expert path (grouped, uploaded,
// routed; SwiGLU, clamped SwiGLU, tanh-GELU), Gemma 4's elementwise ops and router selection.
#include "ops/backend_test.h"
#include <cmath>
#include <numeric>

#include "quant/convert.h"
#include "quant/recipe.h"

namespace spool::ops {
namespace {

using namespace op_table;

// ---- Matrix products -------------------------------------------------------------------------

struct MatmulShape {
  int64_t rows, cols, T;
};
// (The wide ones take the CUDA q4 GEMV's register Hadamard path: one block of 1024 .. 8192 columns.)
const MatmulShape kMatmulShapes[] = {{3, 64, 1}, {17, 128, 3}, {130, 256, 70}, {64, 512, 1}, {5, 192, 9},
                                     {24, 2048, 2}, {9, 4096, 1}, {4, 8192, 3}, {6, 1024, 1}};

[[maybe_unused]] const bool kMatmulOps = covers({"matmul"});
TEST_P(BackendOpTable, Matmul) {
  for (WKind k : kAllKinds)
    for (const MatmulShape& s : kMatmulShapes) {
      if (!fits(k, s.cols)) continue;  // a K-quant (256-wide blocks) needs cols % 256 == 0
      SCOPED_TRACE(std::string(wkind_name(k)) + " " + std::to_string(s.rows) + "x" + std::to_string(s.cols) + " T=" + std::to_string(s.T));
      const TestWeight w(k, s.rows, s.cols, 7 + s.rows);
      const std::vector<float> x = randn(s.T * s.cols, 11 + s.T);
      if (!group_runs(k)) {  // refused, clearly, rather than computed wrongly
        for_each_backend("matmul", [&](Backend& be, ReferenceBackend&) {
          std::vector<float> got(s.T * s.rows);
          EXPECT_THROW(be.matmul(w.view(), x.data(), s.T, got.data()), Error);
        });
        continue;
      }
      for_each_backend("matmul", [&](Backend& be, ReferenceBackend& ref) {
        std::vector<float> got(s.T * s.rows, NAN), want(got.size());
        be.matmul(w.view(), x.data(), s.T, got.data());
        ref.matmul(w.view(), x.data(), s.T, want.data());
        expect_close(got.data(), want.data(), static_cast<int64_t>(got.size()), 1e-4, "matmul");
      });
    }
}

[[maybe_unused]] const bool kMatmulMultiOps = covers({"matmul_multi"});
TEST_P(BackendOpTable, MatmulMulti) {
  for (WKind k : {WKind::kF32, WKind::kBF16, WKind::kF16, WKind::kQ4Rotated, WKind::kTernary, WKind::kQ5, WKind::kQ8Rotated,
                  WKind::kGgmlQ8_0, WKind::kGgmlIQ4_NL, WKind::kGgmlQ8_0Perm, WKind::kMxfp4})
    for (int64_t T : {1, 5, 33}) {
      if (!group_runs(k)) continue;
      SCOPED_TRACE(std::string(wkind_name(k)) + " T=" + std::to_string(T));
      const TestWeight a(k, 37, 128, 1), b(k, 5, 128, 2), c(k, 130, 128, 3);
      const std::vector<float> x = randn(T * 128, 4);
      for_each_backend("matmul_multi", [&](Backend& be, ReferenceBackend& ref) {
        const WeightView va = a.view(), vb = b.view(), vc = c.view();
        std::vector<float> g[3] = {std::vector<float>(T * 37), std::vector<float>(T * 5), std::vector<float>(T * 130)};
        std::vector<float> r[3] = {g[0], g[1], g[2]};
        const MatmulOut go[] = {{&va, g[0].data()}, {&vb, g[1].data()}, {&vc, g[2].data()}};
        const MatmulOut ro[] = {{&va, r[0].data()}, {&vb, r[1].data()}, {&vc, r[2].data()}};
        be.matmul_multi(go, x.data(), T);
        ref.matmul_multi(ro, x.data(), T);
        for (int i = 0; i < 3; ++i) expect_close(g[i].data(), r[i].data(), static_cast<int64_t>(g[i].size()), 1e-4, "matmul_multi");
      });
    }
}

[[maybe_unused]] const bool kMatmulHeadsOps = covers({"matmul_heads"});
// MLA's per-head products: n heads of one [rows, cols] float weight against strided slices of x
// (row stride ldx, head stride hx) into strided slices of y; the columns of y outside the heads'
// slices keep their values. T up to the decode kernels' limit and past it (the generic path).
TEST_P(BackendOpTable, MatmulHeads) {
  struct S {
    int n;
    int64_t rows, cols, T, hx_pad, hy_pad;
  };
  for (WKind k : {WKind::kF32, WKind::kBF16, WKind::kF16})
    for (const S& s : {S{16, 64, 32, 1, 8, 4}, S{3, 37, 24, 3, 0, 0}, S{5, 16, 13, 2, 3, 1}, S{4, 8, 40, 9, 0, 2}}) {
      SCOPED_TRACE(std::string(wkind_name(k)) + " heads=" + std::to_string(s.n) + " " + std::to_string(s.rows) + "x" +
                   std::to_string(s.cols) + " T=" + std::to_string(s.T));
      std::vector<std::unique_ptr<TestWeight>> store;
      std::vector<WeightView> w;
      for (int h = 0; h < s.n; ++h) {
        store.push_back(std::make_unique<TestWeight>(k, s.rows, s.cols, 50 + h));
        w.push_back(store.back()->view());
      }
      const int64_t hx = s.cols + s.hx_pad, hy = s.rows + s.hy_pad, ldx = s.n * hx + 5, ldy = s.n * hy + 3;
      const std::vector<float> x = randn(s.T * ldx, 21);
      const std::vector<float> y0 = randn(s.T * ldy, 22);
      for_each_backend("matmul_heads", [&](Backend& be, ReferenceBackend& ref) {
        std::vector<float> got = y0, want = y0, xs(s.T * s.cols), ys(s.T * s.rows);
        be.matmul_heads(w, x.data(), ldx, hx, s.T, got.data(), ldy, hy, xs.data(), ys.data());
        for (int h = 0; h < s.n; ++h) {  // (the op's definition, written out: head h's slice, the reference's matmul)
          for (int64_t t = 0; t < s.T; ++t)
            std::copy_n(x.data() + t * ldx + h * hx, s.cols, xs.data() + t * s.cols);
          ref.matmul(w[static_cast<size_t>(h)], xs.data(), s.T, ys.data());
          for (int64_t t = 0; t < s.T; ++t)
            std::copy_n(ys.data() + t * s.rows, s.rows, want.data() + t * ldy + h * hy);
        }
        expect_close(got.data(), want.data(), static_cast<int64_t>(got.size()), 1e-4, "matmul_heads");
        for (int64_t t = 0; t < s.T; ++t)  // padding between and after the heads: untouched
          for (int64_t c = 0; c < ldy; ++c)
            if (c >= s.n * hy || c % hy >= s.rows) EXPECT_EQ(got[t * ldy + c], y0[t * ldy + c]) << "t " << t << " column " << c;
      });
    }
}

// ---- MoE expert path -------------------------------------------------------------------------

struct MoeShape {
  int64_t T, H, I;
  int E, K;
};
const MoeShape kMoeShapes[] = {{1, 64, 32, 8, 2}, {7, 128, 64, 16, 4}, {40, 64, 96, 64, 8}, {3, 1024, 512, 4, 2}, {12, 64, 32, 16, 2}};
// Input scale of a shape: wide experts get smaller inputs, so that their outputs stay O(1) as a
// model's do (unit inputs over 1024 columns of 0.2-rms weights reach |y| ~ 500, where f32 rounding
// alone exceeds the tolerance's absolute floor near zero).
float moe_x_scale(const MoeShape& s) { return s.H > 256 ? 0.1f : 1.0f; }

// s.E experts of kind k (weights in `store`; each expert's gate and up share one sign vector, as
// spool's converter writes them), s.K distinct random experts per token (seeded by `route_seed`),
// grouped, and the active experts in group order.
struct MoeCase {
  std::vector<std::unique_ptr<TestWeight>> store;
  std::vector<ExpertMats> experts;
  std::vector<int> ids;
  ExpertGroups groups;
  std::vector<ExpertMats> active;
};
MoeCase make_moe_case(WKind k, const MoeShape& s, unsigned route_seed) {
  MoeCase c;
  c.experts.resize(s.E);
  for (int e = 0; e < s.E; ++e) {
    std::vector<int8_t> gs(s.H), ds(s.I);
    std::mt19937 g(e);
    for (auto& v : gs) v = (g() & 1) ? 1 : -1;
    for (auto& v : ds) v = (g() & 1) ? 1 : -1;
    c.store.push_back(std::make_unique<TestWeight>(k, s.I, s.H, 100 + e, &gs));
    c.store.push_back(std::make_unique<TestWeight>(k, s.I, s.H, 200 + e, &gs));
    c.store.push_back(std::make_unique<TestWeight>(k, s.H, s.I, 300 + e, &ds));
    c.experts[e] = {c.store[3 * e]->view(), c.store[3 * e + 1]->view(), c.store[3 * e + 2]->view()};
  }
  std::mt19937 g(route_seed);
  c.ids.resize(s.T * s.K);
  for (int64_t t = 0; t < s.T; ++t) {
    std::vector<int> perm(s.E);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), g);
    for (int j = 0; j < s.K; ++j) c.ids[t * s.K + j] = perm[j];
  }
  c.groups = group_by_expert(c.ids.data(), s.T, s.K, s.E);
  for (int e : c.groups.active) c.active.push_back(c.experts[e]);
  return c;
}

[[maybe_unused]] const bool kExpertFfnAndCombineOps = covers({"expert_ffn", "moe_combine"});
TEST_P(BackendOpTable, ExpertFfnAndCombine) {
  std::vector<WKind> kinds = {WKind::kF32,          WKind::kBF16,     WKind::kF16,     WKind::kQ4Rotated, WKind::kQ3,
                              WKind::kTernaryRotated, WKind::kQ5,       WKind::kQ6Rotated, WKind::kQ8Rotated,
                              WKind::kGgmlQ8_0,       WKind::kGgmlQ4_1, WKind::kGgmlMXFP4};
  // Three of the i-quant / ternary kinds (one decode-then-dot path for all nine; Matmul runs every
  // one), on the 1024 x 512 shape (256-column blocks).
  kinds.insert(kinds.end(), {WKind::kGgmlIQ1_M, WKind::kGgmlIQ2_XXS, WKind::kGgmlTQ1_0});
  for (WKind k : kinds)
    for (const MoeShape& s : kMoeShapes) {
      if (!group_runs(k) || !fits(k, s.H) || !fits(k, s.I)) continue;
      SCOPED_TRACE(std::string(wkind_name(k)) + " T=" + std::to_string(s.T) + " E=" + std::to_string(s.E));
      // Random distinct experts per token, random weights.
      const MoeCase c = make_moe_case(k, s, 5);
      const ExpertGroups& groups = c.groups;
      const std::vector<ExpertMats>& active = c.active;
      const std::vector<float> wts = randn(s.T * s.K, 6, 0.5f);
      const std::vector<float> x = randn(s.T * s.H, 7, moe_x_scale(s));
      for_each_backend("expert_ffn", [&](Backend& be, ReferenceBackend& ref) {
        std::vector<float> y(s.T * s.K * s.H, NAN), yr(y.size(), NAN);
        // Acquired in two batches (as a small streaming cache hands them out).
        const size_t half = active.size() / 2;
        be.expert_ffn(std::span<const ExpertMats>(active.data(), half), groups, 0, x.data(), s.H, Activation::kSwiGLU, y.data());
        be.expert_ffn(std::span<const ExpertMats>(active.data() + half, active.size() - half), groups, half, x.data(), s.H,
                      Activation::kSwiGLU, y.data());
        ref.expert_ffn(active, groups, 0, x.data(), s.H, Activation::kSwiGLU, yr.data());
        expect_close(y.data(), yr.data(), static_cast<int64_t>(y.size()), 2e-4, "expert_ffn");
      });
      for_each_backend("moe_combine", [&](Backend& be, ReferenceBackend& ref) {
        std::vector<float> yr(s.T * s.K * s.H, NAN);
        ref.expert_ffn(active, groups, 0, x.data(), s.H, Activation::kSwiGLU, yr.data());
        std::vector<float> out(s.T * s.H, NAN), outr(out.size(), NAN);
        be.moe_combine(yr.data(), groups, wts.data(), s.H, out.data());
        ref.moe_combine(yr.data(), groups, wts.data(), s.H, outr.data());
        expect_close(out.data(), outr.data(), static_cast<int64_t>(out.size()), 1e-5, "moe_combine");
      });
    }
}

// Experts whose weights live on the backend (uploaded, as VRAM-resident experts and expert slots
// are) give the same bits as the same experts read from host views: on CUDA, packed SwiGLU experts run
// in grouped launches (jobs of at most 8 rows, host views copied up for the call) whichever memory
// holds them, with the same row arithmetic.
// (Every packed type: q2, q3, q5, q6, q8 take the grouped launches as q4 does.)
const WKind kPackedKinds[] = {WKind::kQ4, WKind::kQ4Rotated, WKind::kQ2, WKind::kQ3, WKind::kQ5, WKind::kQ6Rotated, WKind::kQ8, WKind::kQ8Rotated};
TEST_P(BackendOpTable, ExpertFfnUploadedEqualsHostViews) {
  for (WKind k : kPackedKinds)
    for (const MoeShape& s : kMoeShapes) {
      SCOPED_TRACE(std::string(wkind_name(k)) + " T=" + std::to_string(s.T) + " E=" + std::to_string(s.E));
      const MoeCase c = make_moe_case(k, s, 9);
      const ExpertGroups& groups = c.groups;
      const std::vector<ExpertMats>& active = c.active;
      const std::vector<float> x = randn(s.T * s.H, 8, moe_x_scale(s));
      for_each_backend("expert_ffn", [&](Backend& be, ReferenceBackend& ref) {
        std::vector<ExpertMats> up(active);
        for (ExpertMats& m : up) m = {be.upload(m.gate), be.upload(m.up), be.upload(m.down)};
        std::vector<float> yh(s.T * s.K * s.H, NAN), yu(yh.size(), NAN), yr(yh.size(), NAN);
        be.expert_ffn(active, groups, 0, x.data(), s.H, Activation::kSwiGLU, yh.data());
        be.expert_ffn(up, groups, 0, x.data(), s.H, Activation::kSwiGLU, yu.data());
        ref.expert_ffn(active, groups, 0, x.data(), s.H, Activation::kSwiGLU, yr.data());
        expect_close(yu.data(), yr.data(), static_cast<int64_t>(yu.size()), 2e-4, "expert_ffn (uploaded)");
        EXPECT_EQ(std::memcmp(yh.data(), yu.data(), yh.size() * sizeof(float)), 0) << "uploaded experts differ from host views";
      });
    }
}

// The routed expert path (Backend::expert_ffn_routed over a make_expert_table table, routing ids
// and weights in device memory) gives the bits of expert_ffn + moe_combine over the same uploaded
// experts. Backends without the path give no table; experts outside it (not a packed type: f32,
// ternary) give none either.
[[maybe_unused]] const bool kExpertFfnRoutedOps = covers({"expert_ffn_routed", "make_expert_table", "routed_takes_shared"});
TEST_P(BackendOpTable, ExpertFfnRoutedEqualsGroupedExpertsAndCombine) {
  for (WKind k : kPackedKinds)
    for (const MoeShape& s : kMoeShapes) {
      SCOPED_TRACE(std::string(wkind_name(k)) + " T=" + std::to_string(s.T) + " E=" + std::to_string(s.E));
      const MoeCase c = make_moe_case(k, s, 11);
      const std::vector<float> x = randn(s.T * s.H, 12, moe_x_scale(s)), wts = randn(s.T * s.K, 13, 0.5f);
      for_each_backend("expert_ffn_routed", [&](Backend& be, ReferenceBackend&) {
        std::vector<ExpertMats> all(c.experts);
        for (ExpertMats& m : all) m = {be.upload(m.gate), be.upload(m.up), be.upload(m.down)};
        const void* table = be.make_expert_table(all);
        if (be.max_routed_pairs() == 0) {
          EXPECT_EQ(table, nullptr);
          return;
        }
        ASSERT_NE(table, nullptr);
        // A table of experts the path does not take (f32): none.
        const MoeCase f = make_moe_case(WKind::kF32, MoeShape{1, s.H, s.I, 2, 1}, 1);
        std::vector<ExpertMats> fu(f.experts);
        for (ExpertMats& m : fu) m = {be.upload(m.gate), be.upload(m.up), be.upload(m.down)};
        EXPECT_EQ(be.make_expert_table(fu), nullptr);
        // The host-grouped path over the same experts.
        std::vector<ExpertMats> active;
        for (int e : c.groups.active) active.push_back(all[e]);
        std::vector<float> y(s.T * s.K * s.H, NAN), want(s.T * s.H, NAN), got(want.size(), NAN);
        be.expert_ffn(active, c.groups, 0, x.data(), s.H, Activation::kSwiGLU, y.data());
        be.moe_combine(y.data(), c.groups, wts.data(), s.H, want.data());
        // ids / weights in device memory.
        std::vector<float> idbits(c.ids.size());
        std::memcpy(idbits.data(), c.ids.data(), c.ids.size() * sizeof(int));
        DeviceFloats dids(be.device(), idbits.size()), dw(be.device(), wts.size());
        dids.upload(idbits.data());
        dw.upload(wts.data());
        const int* ids = reinterpret_cast<const int*>(dids.data());
        if (s.T * s.K > be.max_routed_pairs()) {
          EXPECT_THROW(be.expert_ffn_routed(table, x.data(), s.T, s.H, ids, dw.data(), s.K, got.data()), Error);
          return;
        }
        be.expert_ffn_routed(table, x.data(), s.T, s.H, ids, dw.data(), s.K, got.data());
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << "routed path differs from expert_ffn + moe_combine";
        // A shared expert of the routed experts' shape in the same launches: the bits of its own
        // forward (matmul_multi gate and up, swiglu, matmul down), the routed output unchanged.
        // (gate and up with different rotation signs: a job taking the wrong one shows)
        const TestWeight sg(k, s.I, s.H, 501), su(k, s.I, s.H, 502), sd(k, s.H, s.I, 503);
        const ExpertMats sh = {be.upload(sg.view()), be.upload(su.view()), be.upload(sd.view())};
        const bool takes = be.routed_takes_shared(table, sh, s.T);
        EXPECT_EQ(takes, s.T <= 8) << "a shared expert of the table's shape and formats, up to 8 tokens";
        if (takes) {
          std::vector<float> g(s.T * s.I), u(g.size()), own(s.T * s.H, NAN), fused(own.size(), NAN), got2(want.size(), NAN);
          const MatmulOut gu[] = {{&sh.gate, g.data()}, {&sh.up, u.data()}};
          be.matmul_multi(gu, x.data(), s.T);
          be.swiglu(g.data(), u.data(), s.T * s.I, g.data());
          be.matmul(sh.down, g.data(), s.T, own.data());
          be.expert_ffn_routed(table, x.data(), s.T, s.H, ids, dw.data(), s.K, got2.data(), &sh, fused.data());
          EXPECT_EQ(std::memcmp(got2.data(), want.data(), got2.size() * sizeof(float)), 0) << "routed output changed by the shared expert";
          EXPECT_EQ(std::memcmp(fused.data(), own.data(), own.size() * sizeof(float)), 0) << "shared expert in the routed launches differs";
          const ExpertMats wide = {be.upload(c.experts[0].down), be.upload(c.experts[0].down), be.upload(c.experts[0].gate)};
          EXPECT_FALSE(be.routed_takes_shared(table, wide, s.T)) << "a shared expert of another shape";
          EXPECT_THROW(be.expert_ffn_routed(table, x.data(), s.T, s.H, ids, dw.data(), s.K, got2.data(), &wide, fused.data()), Error);
        }
        EXPECT_THROW(be.expert_ffn_routed(table, x.data(), s.T, s.H, c.ids.data(), dw.data(), s.K, got.data()), Error) << "host ids";
      });
    }
}

// gpt-oss experts (Activation::kClampedSwiGLU): one fused gate_up [2I, H] with interleaved
// gate/up rows, biases on gate_up and down, float and MXFP4 weights. The reference's
// pre-activations are checked to reach the clamp (|u| > 7) so that the clamps are exercised.
TEST_P(BackendOpTable, ExpertFfnClampedSwiGLU) {
  for (WKind k : {WKind::kF32, WKind::kBF16, WKind::kMxfp4, WKind::kGgmlQ8_0})
    for (const MoeShape& s : kMoeShapes) {
      if (!group_runs(k)) continue;
      SCOPED_TRACE(std::string(wkind_name(k)) + " T=" + std::to_string(s.T) + " E=" + std::to_string(s.E));
      std::vector<std::unique_ptr<TestWeight>> store;
      std::vector<ExpertMats> experts(s.E);
      const std::vector<float> gub = randn(s.E * 2 * s.I, 8, 3.0f), db = randn(s.E * s.H, 9, 0.5f);
      for (int e = 0; e < s.E; ++e) {
        store.push_back(std::make_unique<TestWeight>(k, 2 * s.I, s.H, 400 + e));
        store.push_back(std::make_unique<TestWeight>(k, s.H, s.I, 500 + e));
        experts[e].gate = store[2 * e]->view();
        experts[e].down = store[2 * e + 1]->view();
        experts[e].gate_bias = gub.data() + e * 2 * s.I;
        experts[e].down_bias = db.data() + e * s.H;
      }
      std::mt19937 g(5);
      std::vector<int> ids(s.T * s.K);
      for (int64_t t = 0; t < s.T; ++t) {
        std::vector<int> perm(s.E);
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), g);
        for (int j = 0; j < s.K; ++j) ids[t * s.K + j] = perm[j];
      }
      const std::vector<float> x = randn(s.T * s.H, 7, 3.0f);
      const ExpertGroups groups = group_by_expert(ids.data(), s.T, s.K, s.E);
      std::vector<ExpertMats> active;
      for (int e : groups.active) active.push_back(experts[e]);
      {  // the clamps are reached
        std::vector<float> u(2 * s.I);
        ReferenceBackend ref;
        ref.matmul(active[0].gate, x.data() + (groups.rows[0] / s.K) * s.H, 1, u.data());
        float mx = 0, mn = 0;
        for (int64_t i = 0; i < 2 * s.I; ++i) {
          const float v = u[i] + active[0].gate_bias[i];
          mx = std::max(mx, v);
          mn = std::min(mn, v);
        }
        EXPECT_GT(mx, 7.0f);
        EXPECT_LT(mn, -7.0f);
      }
      for_each_backend("expert_ffn", [&](Backend& be, ReferenceBackend& ref) {
        std::vector<float> y(s.T * s.K * s.H, NAN), yr(y.size(), NAN);
        const size_t half = active.size() / 2;
        // The biases where this backend reads them (device memory on a GPU), as the model binds them.
        const float* gub_be = be.upload_floats(gub);
        const float* db_be = be.upload_floats(db);
        std::vector<ExpertMats> on_be = active;
        for (size_t j = 0; j < on_be.size(); ++j) {
          on_be[j].gate_bias = gub_be + (active[j].gate_bias - gub.data());
          on_be[j].down_bias = db_be + (active[j].down_bias - db.data());
        }
        be.expert_ffn(std::span<const ExpertMats>(on_be.data(), half), groups, 0, x.data(), s.H, Activation::kClampedSwiGLU, y.data());
        be.expert_ffn(std::span<const ExpertMats>(on_be.data() + half, on_be.size() - half), groups, half, x.data(), s.H,
                      Activation::kClampedSwiGLU, y.data());
        ref.expert_ffn(active, groups, 0, x.data(), s.H, Activation::kClampedSwiGLU, yr.data());
        expect_close(y.data(), yr.data(), static_cast<int64_t>(y.size()), 2e-4, "expert_ffn (clamped SwiGLU)");
      });
    }
}

// The scalar reference of the clamped SwiGLU against a hand computation of one expert row:
// interleaved gate (even) / up (odd), min(gate, 7), clamp(up, -7, 7), (up + 1) * g * sigmoid(1.702 g).
TEST(BackendOps, ClampedSwiGLUReferenceByHand) {
  // gate_up rows (I = 2): u = W x + b with W = identity rows on a 4-wide x, biases zero.
  const float w[4 * 4] = {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1};
  const float down[2 * 2] = {1, 0, 0, 1};
  const float x[4] = {9.0f, -9.0f, -1.5f, 0.25f};  // gate0 9 -> 7, up0 -9 -> -7; gate1 -1.5, up1 0.25
  ExpertMats m;
  m.gate = WeightView{WType::kF32, 4, 4, w};
  m.down = WeightView{WType::kF32, 2, 2, down};
  const int ids[1] = {0};
  const ExpertGroups g = group_by_expert(ids, 1, 1, 1);
  float y[2];
  ReferenceBackend ref;
  std::vector<float> xh(x, x + 4);
  ref.expert_ffn(std::span<const ExpertMats>(&m, 1), g, 0, xh.data(), 2, Activation::kClampedSwiGLU, y);
  auto sig = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
  EXPECT_NEAR(y[0], (-7.0 + 1.0) * 7.0 * sig(1.702 * 7.0), 1e-5);
  EXPECT_NEAR(y[1], (0.25 + 1.0) * -1.5 * sig(1.702 * -1.5), 1e-6);
}

// tanh-GELU experts (Activation::kGeluTanhGLU, HF Gemma4TextExperts): separate gate / up like
// SwiGLU, gelu_tanh(gate) * up; every backend (CUDA: k_gelu_tanh_glu after its generic
// gate / up products) against the reference's double arithmetic.
TEST_P(BackendOpTable, ExpertFfnGeluTanh) {
  for (const MoeShape& s : kMoeShapes) {
    SCOPED_TRACE("T=" + std::to_string(s.T) + " E=" + std::to_string(s.E));
    const MoeCase c = make_moe_case(WKind::kF32, s, 5);
    const std::vector<float> x = randn(s.T * s.H, 7, moe_x_scale(s));
    for_each_backend("expert_ffn", [&](Backend& be, ReferenceBackend& ref) {
      std::vector<float> y(s.T * s.K * s.H, NAN), yr(y.size(), NAN), ys(y.size(), NAN);
      be.expert_ffn(c.active, c.groups, 0, x.data(), s.H, Activation::kGeluTanhGLU, y.data());
      ref.expert_ffn(c.active, c.groups, 0, x.data(), s.H, Activation::kGeluTanhGLU, yr.data());
      expect_close(y.data(), yr.data(), static_cast<int64_t>(y.size()), 2e-4, "expert_ffn (tanh GELU)");
      ref.expert_ffn(c.active, c.groups, 0, x.data(), s.H, Activation::kSwiGLU, ys.data());
      double diff = 0;  // the activation matters: SwiGLU gives other rows
      for (size_t i = 0; i < y.size(); ++i) diff = std::max(diff, std::fabs(static_cast<double>(y[i]) - ys[i]));
      EXPECT_GT(diff, 1e-3);
    });
  }
}

// The Gemma 4 elementwise ops against their definitions in double: gelu_tanh_glu
// (0.5 g (1 + tanh(sqrt(2/pi)(g + 0.044715 g^3))) u), scale, softcap (c tanh(x / c)) and
// mul_indexed (w[i] * table[ids[i]]).
[[maybe_unused]] const bool kGemmaElementwiseOps = covers({"gelu_tanh_glu", "scale", "softcap", "mul_indexed"});
TEST_P(BackendOpTable, GemmaElementwise) {
  const int64_t n = 257;
  const std::vector<float> x = randn(n, 11, 6.0f), y = randn(n, 12, 2.0f);
  for_each_backend("gelu_tanh_glu", [&](Backend& be, ReferenceBackend&) {
    std::vector<float> a = x;
    be.gelu_tanh_glu(a.data(), y.data(), n, a.data());  // in place, as the MLP calls it
    for (int64_t i = 0; i < n; ++i) {
      const double g = x[i];
      const double want = 0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g))) * y[i];
      ASSERT_NEAR(a[i], want, 1e-5 * (1.0 + std::fabs(want))) << i;
    }
  });
  for_each_backend("scale", [&](Backend& be, ReferenceBackend&) {
    std::vector<float> a = x;
    be.scale(a.data(), n, 0.375f);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(a[i], x[i] * 0.375f) << i;
  });
  for_each_backend("softcap", [&](Backend& be, ReferenceBackend&) {
    std::vector<float> a = x;
    be.softcap(a.data(), n, 3.0f);
    for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(a[i], 3.0 * std::tanh(x[i] / 3.0), 1e-6) << i;
  });
  for_each_backend("mul_indexed", [&](Backend& be, ReferenceBackend&) {
    const std::vector<float> table = {0.5f, 2.0f, -1.0f, 3.0f};
    std::vector<int> ids(n);
    for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int>((i * 7) % 4);
    std::vector<float> a = x;
    be.mul_indexed(a.data(), ids.data(), table.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(a[i], x[i] * table[ids[i]]) << i;
  });
}

TEST(BackendOps, GroupByExpert) {
  const int ids[] = {3, 1, 1, 0, 3, 2};  // T = 3, K = 2
  const ExpertGroups g = group_by_expert(ids, 3, 2, 4);
  EXPECT_EQ(g.active, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(g.first, (std::vector<int64_t>{0, 1, 3, 4, 6}));
  EXPECT_EQ(g.rows, (std::vector<int64_t>{3, 1, 2, 5, 0, 4}));
  for (int64_t r = 0; r < 6; ++r) EXPECT_EQ(g.rows[g.row_of[r]], r);
  const int bad[] = {0, 4};
  EXPECT_THROW(group_by_expert(bad, 1, 2, 4), spool::Error);
}

[[maybe_unused]] const bool kRouteSoftmaxTopKOps = covers({"route_softmax_top_k"});
TEST_P(BackendOpTable, RouteSoftmaxTopK) {
  // (CUDA: a warp per token up to 512 experts, a block per token above: both sides of that line,
  // experts not a multiple of 32, k == E, and rows of tied and -inf logits, ties going to the lower id.)
  for (int E : {8, 64, 100, 256, 384, 520})
    for (int k : {1, 2, 8})
      for (bool renorm : {false, true}) {
        SCOPED_TRACE("E=" + std::to_string(E) + " k=" + std::to_string(k) + " renorm=" + std::to_string(renorm));
        const int64_t T = 9;
        std::vector<float> logits = randn(T * E, E + k, 2.0f);
        for (int e = 0; e < E; ++e) logits[E + e] = e % 3 == 0 ? 0.5f : -1.0f;  // row 1: ties
        for (int e = 0; e < E; ++e)
          if (e % 2 == 1) logits[2 * E + e] = -INFINITY;  // row 2: half -inf (k == E takes them too)
        for_each_backend("route_softmax_top_k", [&](Backend& be, ReferenceBackend& ref) {
          std::vector<float> l1 = logits, l2 = logits, w1(T * k), w2(T * k), m1(T), m2(T);
          std::vector<int> i1(T * k), i2(T * k);
          be.route_softmax_top_k(l1.data(), T, E, k, renorm, i1.data(), w1.data(), m1.data());
          ref.route_softmax_top_k(l2.data(), T, E, k, renorm, i2.data(), w2.data(), m2.data());
          EXPECT_EQ(i1, i2);
          expect_close(w1.data(), w2.data(), T * k, 1e-5, "routing weights");
          expect_close(m1.data(), m2.data(), T, 1e-5, "routing margins");
        });
      }
}

}  // namespace
}  // namespace spool::ops
