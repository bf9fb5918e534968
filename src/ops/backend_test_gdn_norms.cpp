// Backend op table (backend_test.h): Gated DeltaNet (conv1d, the delta rule, gates), norms,
// elementwise ops and the host copies (row_to_f32, to_host).
#include <cstring>

#include "ops/backend_test.h"

namespace spool::ops {
namespace {

using namespace op_table;

// ---- Gated DeltaNet --------------------------------------------------------------------------

[[maybe_unused]] const bool kCausalConv1dSiluOps = covers({"causal_conv1d_silu"});
TEST_P(BackendOpTable, CausalConv1dSilu) {
  for (int K : {2, 4})
    for (int64_t T : {1, 5, 70}) {
      SCOPED_TRACE("K=" + std::to_string(K) + " T=" + std::to_string(T));
      const int64_t C = 48;
      const std::vector<float> x = randn(T * C, 1), w = randn(C * K, 2, 0.5f), st = randn(C * (K - 1), 3);
      for_each_backend("causal_conv1d_silu", [&](Backend& be, ReferenceBackend& ref) {
        std::vector<float> s1 = st, s2 = st, o1(T * C, NAN), o2(T * C, NAN);
        be.causal_conv1d_silu(x.data(), T, C, w.data(), K, s1.data(), o1.data());
        ref.causal_conv1d_silu(x.data(), T, C, w.data(), K, s2.data(), o2.data());
        expect_close(o1.data(), o2.data(), T * C, 1e-5, "conv out");
        expect_close(s1.data(), s2.data(), static_cast<int64_t>(s1.size()), 0, "conv state");
      });
    }
}

[[maybe_unused]] const bool kGatedDeltaOps = covers({"gated_delta"});
TEST_P(BackendOpTable, GatedDelta) {
  struct G {
    int n_k, n_v, d_k, d_v;
    int64_t T;
    int chunk;
  };
  for (const G& c : {G{2, 4, 16, 32, 1, 64}, G{2, 4, 16, 32, 3, 64}, G{1, 2, 32, 16, 130, 64}, G{2, 2, 16, 16, 70, 16}}) {
    SCOPED_TRACE("T=" + std::to_string(c.T) + " chunk=" + std::to_string(c.chunk));
    std::vector<float> q = randn(c.T * c.n_k * c.d_k, 1), k = randn(c.T * c.n_k * c.d_k, 2);
    for (int64_t r = 0; r < c.T * c.n_k; ++r) {  // l2-normalised like the model's q and k
      for (auto* v : {&q, &k}) {
        double ss = 0;
        for (int d = 0; d < c.d_k; ++d) ss += (*v)[r * c.d_k + d] * (*v)[r * c.d_k + d];
        for (int d = 0; d < c.d_k; ++d) (*v)[r * c.d_k + d] /= static_cast<float>(std::sqrt(ss));
      }
    }
    const std::vector<float> v = randn(c.T * c.n_v * c.d_v, 3), b = randn(c.T * c.n_v, 4), gl = randn(c.T * c.n_v, 5);
    std::vector<float> beta(b.size()), g(gl.size());
    for (size_t i = 0; i < b.size(); ++i) {
      beta[i] = 1.0f / (1.0f + std::exp(-b[i]));
      g[i] = -std::fabs(gl[i]) * 0.3f;
    }
    const std::vector<float> s0 = randn(static_cast<size_t>(c.n_v) * c.d_k * c.d_v, 6, 0.1f);
    for_each_backend("gated_delta", [&](Backend& be, ReferenceBackend& ref) {
      std::vector<float> s1 = s0, s2 = s0, o1(v.size(), NAN), o2(v.size(), NAN);
      GatedDeltaArgs a;
      a.T = c.T;
      a.n_k = c.n_k;
      a.n_v = c.n_v;
      a.d_k = c.d_k;
      a.d_v = c.d_v;
      a.q = q.data();
      a.k = k.data();
      a.v = v.data();
      a.beta = beta.data();
      a.g = g.data();
      a.state = s1.data();
      a.out = o1.data();
      be.gated_delta(a, c.chunk);
      a.state = s2.data();
      a.out = o2.data();
      ref.gated_delta(a, c.chunk);
      expect_close(o1.data(), o2.data(), static_cast<int64_t>(o1.size()), 1e-4, "gated delta out");
      expect_close(s1.data(), s2.data(), static_cast<int64_t>(s1.size()), 1e-4, "gated delta state");
    });
  }
}

[[maybe_unused]] const bool kGdnGatesOps = covers({"gdn_gates"});
TEST_P(BackendOpTable, GdnGates) {
  const int64_t T = 11;
  const int nv = 6;
  const std::vector<float> b = randn(T * nv, 1, 3.0f), a = randn(T * nv, 2, 8.0f), ae = randn(nv, 3), dt = randn(nv, 4);
  std::vector<float> a_exp(nv);
  for (int h = 0; h < nv; ++h) a_exp[h] = std::exp(ae[h]);
  for_each_backend("gdn_gates", [&](Backend& be, ReferenceBackend& ref) {
    std::vector<float> b1(T * nv), g1(T * nv), b2(T * nv), g2(T * nv);
    be.gdn_gates(b.data(), a.data(), a_exp.data(), dt.data(), T, nv, b1.data(), g1.data());
    ref.gdn_gates(b.data(), a.data(), a_exp.data(), dt.data(), T, nv, b2.data(), g2.data());
    expect_close(b1.data(), b2.data(), T * nv, 1e-6, "beta");
    expect_close(g1.data(), g2.data(), T * nv, 1e-6, "g");
  });
}

// ---- Norms and elementwise -------------------------------------------------------------------

[[maybe_unused]] const bool kNormsOps = covers({"rms_norm", "l2_norm", "rms_norm_gated", "add_rms_norm"});
TEST_P(BackendOpTable, Norms) {
  for (int64_t n : {16, 128, 2048})
    for (int64_t rows : {1, 7}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " rows=" + std::to_string(rows));
      const std::vector<float> x = randn(rows * n, 1, 3.0f), w = randn(n, 2), z = randn(rows * n, 3);
      for_each_backend("rms_norm", [&](Backend& be, ReferenceBackend& ref) {
        std::vector<float> a(rows * n), b(rows * n);
        be.rms_norm(x.data(), w.data(), rows, n, 1e-6f, a.data());
        ref.rms_norm(x.data(), w.data(), rows, n, 1e-6f, b.data());
        expect_close(a.data(), b.data(), rows * n, 1e-5, "rms_norm");
      });
      for (float post : {1.0f, 0.125f})
        for_each_backend("l2_norm", [&](Backend& be, ReferenceBackend& ref) {
          std::vector<float> a = x, b = x;
          be.l2_norm(a.data(), rows, n, 1e-6f, post);
          ref.l2_norm(b.data(), rows, n, 1e-6f, post);
          expect_close(a.data(), b.data(), rows * n, 1e-5, "l2_norm");
        });
      for_each_backend("rms_norm_gated", [&](Backend& be, ReferenceBackend& ref) {
        std::vector<float> a = x, b = x;
        be.rms_norm_gated(a.data(), z.data(), w.data(), rows, n, 1e-6f);
        ref.rms_norm_gated(b.data(), z.data(), w.data(), rows, n, 1e-6f);
        expect_close(a.data(), b.data(), rows * n, 1e-5, "rms_norm_gated");
      });
      // The fused residual add + norm: the reference's values, and the same backend's add then
      // rms_norm bit for bit (the decoder's outputs do not change with the fusion).
      for_each_backend("add_rms_norm", [&](Backend& be, ReferenceBackend& ref) {
        std::vector<float> h1 = x, h2 = x, h3 = x, y1(rows * n), y2(rows * n), y3(rows * n);
        be.add_rms_norm(h1.data(), z.data(), w.data(), rows, n, 1e-6f, y1.data());
        ref.add_rms_norm(h2.data(), z.data(), w.data(), rows, n, 1e-6f, y2.data());
        expect_close(h1.data(), h2.data(), rows * n, 1e-6, "add_rms_norm residual");
        expect_close(y1.data(), y2.data(), rows * n, 1e-5, "add_rms_norm");
        be.add(h3.data(), z.data(), rows * n);
        be.rms_norm(h3.data(), w.data(), rows, n, 1e-6f, y3.data());
        EXPECT_EQ(0, std::memcmp(h1.data(), h3.data(), h1.size() * sizeof(float))) << "add_rms_norm residual: not add()'s bits";
        EXPECT_EQ(0, std::memcmp(y1.data(), y3.data(), y1.size() * sizeof(float))) << "add_rms_norm: not add() then rms_norm()'s bits";
      });
    }
}

[[maybe_unused]] const bool kElementwiseOps = covers({"add", "add_bias", "swiglu", "mul_sigmoid", "add_gated_rows", "copy_2d"});
TEST_P(BackendOpTable, Elementwise) {
  for (int64_t n : {1, 15, 1000}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const std::vector<float> x = randn(n, 1, 4.0f), y = randn(n, 2, 4.0f);
    for_each_backend("add", [&](Backend& be, ReferenceBackend& ref) {
      std::vector<float> a = y, b = y;
      be.add(a.data(), x.data(), n);
      ref.add(b.data(), x.data(), n);
      expect_close(a.data(), b.data(), n, 1e-7, "add");
    });
    for_each_backend("swiglu", [&](Backend& be, ReferenceBackend& ref) {
      std::vector<float> a = x, b(n);
      be.swiglu(a.data(), y.data(), n, a.data());  // in place, as the models call it
      ref.swiglu(x.data(), y.data(), n, b.data());
      expect_close(a.data(), b.data(), n, 1e-6, "swiglu");
    });
    for_each_backend("mul_sigmoid", [&](Backend& be, ReferenceBackend& ref) {
      std::vector<float> a = x, b = x;
      be.mul_sigmoid(a.data(), y.data(), n);
      ref.mul_sigmoid(b.data(), y.data(), n);
      expect_close(a.data(), b.data(), n, 1e-6, "mul_sigmoid");
    });
  }
  for (bool gated : {false, true}) {
    const int64_t T = 5, n = 96;
    const std::vector<float> out0 = randn(T * n, 1), s = randn(T * n, 2), x = randn(T * n, 3), w = randn(n, 4, 0.1f);
    for_each_backend("add_gated_rows", [&](Backend& be, ReferenceBackend& ref) {
      std::vector<float> a = out0, b = out0;
      be.add_gated_rows(a.data(), s.data(), x.data(), gated ? w.data() : nullptr, T, n);
      ref.add_gated_rows(b.data(), s.data(), x.data(), gated ? w.data() : nullptr, T, n);
      expect_close(a.data(), b.data(), T * n, 1e-6, "add_gated_rows");
    });
  }
  for (int64_t rows : {1, 7}) {  // attention q/k/v biases: rows of tokens, one bias vector
    const int64_t n = 48;
    const std::vector<float> y0 = randn(rows * n, 6, 2.0f), b = randn(n, 7);
    for_each_backend("add_bias", [&](Backend& be, ReferenceBackend& ref) {
      std::vector<float> a = y0, c = y0;
      be.add_bias(a.data(), b.data(), rows, n);
      ref.add_bias(c.data(), b.data(), rows, n);
      expect_close(a.data(), c.data(), rows * n, 1e-7, "add_bias");
    });
  }
  const std::vector<float> src = randn(6 * 40, 5);
  for_each_backend("copy_2d", [&](Backend& be, ReferenceBackend& ref) {
    std::vector<float> a(6 * 16, 0.0f), b(6 * 16, 0.0f);
    be.copy_2d(a.data(), 16, src.data() + 8, 40, 6, 16);
    ref.copy_2d(b.data(), 16, src.data() + 8, 40, 6, 16);
    expect_close(a.data(), b.data(), 6 * 16, 0, "copy_2d");
  });
}

[[maybe_unused]] const bool kRowToF32AndToHostOps = covers({"row_to_f32", "to_host"});
TEST_P(BackendOpTable, RowToF32AndToHost) {
  for (WKind k : {WKind::kF32, WKind::kBF16, WKind::kF16}) {
    SCOPED_TRACE(wkind_name(k));
    const TestWeight w(k, 1, 77, 3);
    for_each_backend("row_to_f32", [&](Backend& be, ReferenceBackend& ref) {
      std::vector<float> a(77, NAN), b(77, NAN);
      be.row_to_f32(w.view().type, w.raw.data(), 77, a.data());
      ref.row_to_f32(w.view().type, w.raw.data(), 77, b.data());
      expect_close(a.data(), b.data(), 77, 0, "row_to_f32");
    });
  }
  const std::vector<float> x = randn(33, 1);
  for_each_backend("to_host", [&](Backend& be, ReferenceBackend& ref) {
    std::vector<float> a(33, NAN), b(33, NAN);
    be.to_host(x.data(), 33, a.data());
    ref.to_host(x.data(), 33, b.data());
    expect_close(a.data(), b.data(), 33, 0, "to_host");
  });
}

}  // namespace
}  // namespace spool::ops
