// CudaBackend's LoRA products (ops/lora.h): y += s(t) B (A x_t) beside a weight's own product,
// whatever the weight's storage, in f32 on cuBLAS (no TF32: the handle's default math). Two SGEMMs
// per term: u [T, r] = x A^T, then y += (diag(s) u) B^T; the per-row scales s(t) = term.scale x
// the row's user scale (the LoraRowScales in scope on the calling thread, else the adapter's
// default) scale u's rows in between (cublasSdgmm), or fold into the second product's alpha when
// every row has the same one. A row whose scale is 0 adds exactly 0. The terms' A and B^T are
// copied to device memory at their first use and kept (they are the adapters' resident bytes).
#include <algorithm>

#include "common/error.h"
#include "ops/cuda/cuda_internal.h"
#include "ops/lora.h"

namespace spool::ops {

const float* CudaBackend::Impl::lora_matrix(const float* host, size_t n) {
  auto it = lora_dev.find(host);
  if (it != lora_dev.end()) {
    if (it->second.second < n) fail("cuda: a LoRA matrix of %zu floats was uploaded with %zu", n, it->second.second);
    return it->second.first;
  }
  void* p = dev_alloc(n * sizeof(float));
  if (p == nullptr) fail("cuda: cannot allocate %zu bytes of device memory for a LoRA matrix", n * sizeof(float));
  uploads.push_back(p);
  uploaded += n * sizeof(float);
  CU(cudaMemcpy(p, host, n * sizeof(float), cudaMemcpyHostToDevice));
  lora_dev.emplace(host, std::make_pair(static_cast<float*>(p), n));
  return static_cast<const float*>(p);
}

void CudaBackend::upload_lora(const LoraDelta& d) {
  if (d.rows <= 0 || d.cols <= 0) fail("cuda: LoRA terms without the shape of their weight");
  for (const LoraTerm& t : d.terms) {
    const int64_t ldbt = t.ldbt > 0 ? t.ldbt : d.rows;
    (void)impl_->lora_matrix(t.a, static_cast<size_t>(t.rank * d.cols));
    (void)impl_->lora_matrix(t.bt, static_cast<size_t>((t.rank - 1) * ldbt + d.rows));
  }
}

void CudaBackend::Impl::lora_add(const LoraDelta& d, const float* x, int64_t T, int64_t cols, float* y, int64_t rows, int64_t ldy,
                                 const int64_t* row_tok) {
  if (T <= 0 || d.terms.empty()) return;
  const LoraRowScales* rs = lora_rows();
  if (rs != nullptr && row_tok == nullptr && rs->rows != T)
    fail("LoRA: the per-row adapter scales cover %lld rows, the product has %lld", (long long)rs->rows, (long long)T);
  std::vector<float> s(static_cast<size_t>(T));
  for (const LoraTerm& term : d.terms) {
    if (rs != nullptr && (term.adapter < 0 || term.adapter >= rs->n_adapters))
      fail("LoRA: a term of adapter %d, but the per-row scales cover %d adapters", term.adapter, rs->n_adapters);
    const float deflt = term.user != nullptr ? *term.user : 1.0f;
    bool any = false, uniform = true;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t tok = row_tok != nullptr ? row_tok[t] : t;
      if (rs != nullptr && (tok < 0 || tok >= rs->rows))
        fail("LoRA: row %lld of the product is token %lld, beyond the %lld rows of per-row scales", (long long)t, (long long)tok,
             (long long)rs->rows);
      s[t] = term.scale * (rs != nullptr ? rs->scales[tok * rs->n_adapters + term.adapter] : deflt);
      any = any || s[t] != 0.0f;
      uniform = uniform && s[t] == s[0];
    }
    if (!any) continue;  // off for every row: nothing to add
    const int64_t r = term.rank, ldbt = term.ldbt > 0 ? term.ldbt : rows;
    const float* a = lora_matrix(term.a, static_cast<size_t>(r * cols));
    const float* bt = lora_matrix(term.bt, static_cast<size_t>((r - 1) * ldbt + rows));  // rows [0, r) of B^T, `rows` wide
    const Arena::Mark m = arena->mark();
    float* u = arena->get_n<float>(T * r);
    const float one = 1.0f, zero = 0.0f;
    // u (column-major [r, T]) = A x_t for every row t: A is [r, cols] row-major = [cols, r] column-major.
    check_blas(cublasSgemm(cublas(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(r), static_cast<int>(T), static_cast<int>(cols), &one, a,
                           static_cast<int>(cols), x, static_cast<int>(cols), &zero, u, static_cast<int>(r)),
               "cublasSgemm (LoRA A)");
    float alpha = 1.0f;
    if (uniform) {
      alpha = s[0];
    } else {
      const float* sd = in(s.data(), T, false);
      check_blas(cublasSdgmm(cublas(), CUBLAS_SIDE_RIGHT, static_cast<int>(r), static_cast<int>(T), u, static_cast<int>(r), sd, 1, u,
                             static_cast<int>(r)),
                 "cublasSdgmm (LoRA row scales)");
    }
    // y (column-major [rows, T], ld ldy) += B^T's columns: B^T is [r, ldbt] row-major = [ldbt, r] column-major.
    check_blas(cublasSgemm(cublas(), CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(rows), static_cast<int>(T), static_cast<int>(r), &alpha, bt,
                           static_cast<int>(ldbt), u, static_cast<int>(r), &one, y, static_cast<int>(ldy)),
               "cublasSgemm (LoRA B)");
    arena->release(m);
  }
}

}  // namespace spool::ops
