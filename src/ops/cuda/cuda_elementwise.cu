// CudaBackend norms (RMSNorm, L2, gated RMSNorm), elementwise ops (add, bias, SwiGLU, sigmoid
// gates), 2-D copies, and the host boundary: row_to_f32 (embedding rows) and to_host.
#include "ops/cuda/cuda_internal.h"

namespace spool::ops::cu {
namespace {

__global__ void k_swiglu(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = silu_f(gate[i]) * up[i];
}

__global__ void k_add(float* y, const float* x, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] += x[i];
}

// y[r, c] += b[c] over rows of n (grid-stride over rows * n elements).
__global__ void k_add_bias(float* y, const float* b, int64_t rows, int64_t n) {
  const int64_t total = rows * n;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] += b[i % n];
}

__global__ void k_mul_sigmoid(float* x, const float* g, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] *= sigmoid_f(g[i]);
}

// x[i] *= a (a > 0 or not: any float).
__global__ void k_scale(float* x, int64_t n, float a) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] *= a;
}

// x[i] = cap * tanh(x[i] / cap) (ops::softcap).
__global__ void k_softcap(float* x, int64_t n, float cap) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = cap * tanhf(x[i] / cap);
}

// w[i] *= f[i].
__global__ void k_mul(float* w, const float* f, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    w[i] *= f[i];
}

// One block per row. mode 0: y = x / sqrt(mean(x^2) + eps) * w; 1: x = x / sqrt(sum(x^2) + eps) * post;
// 2: x = rms_norm(x) * w * silu(z); 3: x += z, then mode 0 (add_rms_norm: each thread adds the
// elements it then squares, so the sums are mode 0's over the updated x).
__global__ void __launch_bounds__(1024) k_norm(int mode, float* x, const float* w, const float* z, int64_t n, float eps, float post, float* y) {
  float* xr = x + blockIdx.x * n;
  float* yr = y + blockIdx.x * n;
  float ss = 0.0f;
  if (mode == 3) {
    const float* zr = z + blockIdx.x * n;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const float v = xr[i] + zr[i];
      xr[i] = v;
      ss += v * v;
    }
    mode = 0;
  } else {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
  }
  ss = block_sum(ss);
  if (mode == 1) {
    const float inv = 1.0f / sqrtf(ss + eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * inv * post;
    return;
  }
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
  if (mode == 0) {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * inv * w[i];
  } else {
    const float* zr = z + blockIdx.x * n;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * inv * w[i] * silu_f(zr[i]);
  }
}

// One block per row: out[t] += sigmoid(x[t] . w) * s[t] (gate 1 without w).
__global__ void __launch_bounds__(1024) k_add_gated_rows(float* out, const float* s, const float* x, const float* w, int64_t n) {
  const int64_t t = blockIdx.x;
  float gate = 1.0f;
  if (w != nullptr) {
    float d = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) d += x[t * n + i] * w[i];
    gate = sigmoid_f(block_sum(d));
  }
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) out[t * n + i] += gate * s[t * n + i];
}

__global__ void k_row_to_f32(int type, const void* src, int64_t n, float* dst) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (type == kWF32) {
      dst[i] = static_cast<const float*>(src)[i];
    } else {
      const uint16_t h = static_cast<const uint16_t*>(src)[i];
      dst[i] = type == kWF16 ? __half2float(__ushort_as_half(h)) : __uint_as_float(static_cast<uint32_t>(h) << 16);
    }
  }
}

}  // namespace

void launch_swiglu(cudaStream_t stream, const float* gate, const float* up, int64_t n, float* out) {
  k_swiglu<<<blocks_for(n), 256, 0, stream>>>(gate, up, n, out);
  CU_LAUNCHED("k_swiglu");
}

}  // namespace spool::ops::cu

namespace spool::ops::cu {

void rms_norm(CudaBackend::Impl& I, const float* x, const float* w, int64_t rows, int64_t n, float eps, float* y) {
  if (rows <= 0) return;
  const float* xd = I.in(x, rows * n);
  const float* wd = I.in(w, n, false);
  auto yo = I.out(y, rows * n, false);
  k_norm<<<static_cast<unsigned>(rows), row_threads(n), 0, I.stream>>>(0, const_cast<float*>(xd), wd, nullptr, n, eps, 1.0f, yo.d);
  CU_LAUNCHED("k_norm");
  I.finish(yo);
}

void add_rms_norm(CudaBackend::Impl& I, float* h, const float* x, const float* w, int64_t rows, int64_t n, float eps, float* y) {
  if (rows <= 0) return;
  const float* xd = I.in(x, rows * n);
  const float* wd = I.in(w, n, false);
  auto ho = I.out(h, rows * n, true);
  auto yo = I.out(y, rows * n, false);
  k_norm<<<static_cast<unsigned>(rows), row_threads(n), 0, I.stream>>>(3, ho.d, wd, xd, n, eps, 1.0f, yo.d);
  CU_LAUNCHED("k_norm");
  I.finish(ho);
  I.finish(yo);
}

void l2_norm(CudaBackend::Impl& I, float* x, int64_t rows, int64_t n, float eps, float post_scale) {
  if (rows <= 0) return;
  auto xo = I.out(x, rows * n, true);
  k_norm<<<static_cast<unsigned>(rows), row_threads(n), 0, I.stream>>>(1, xo.d, nullptr, nullptr, n, eps, post_scale, xo.d);
  CU_LAUNCHED("k_norm");
  I.finish(xo);
}

void rms_norm_gated(CudaBackend::Impl& I, float* x, const float* z, const float* w, int64_t rows, int64_t n, float eps) {
  if (rows <= 0) return;
  auto xo = I.out(x, rows * n, true);
  const float* zd = I.in(z, rows * n);
  const float* wd = I.in(w, n, false);
  k_norm<<<static_cast<unsigned>(rows), row_threads(n), 0, I.stream>>>(2, xo.d, wd, zd, n, eps, 1.0f, xo.d);
  CU_LAUNCHED("k_norm");
  I.finish(xo);
}

void add(CudaBackend::Impl& I, float* y, const float* x, int64_t n) {
  if (n <= 0) return;
  const float* xd = I.in(x, n);
  auto yo = I.out(y, n, true);
  k_add<<<blocks_for(n), 256, 0, I.stream>>>(yo.d, xd, n);
  CU_LAUNCHED("k_add");
  I.finish(yo);
}

void add_bias(CudaBackend::Impl& I, float* y, const float* b, int64_t rows, int64_t n) {
  if (rows <= 0 || n <= 0) return;
  const float* bd = I.in(b, n, false);  // a parameter vector: host or uploaded
  auto yo = I.out(y, rows * n, true);
  k_add_bias<<<blocks_for(rows * n), 256, 0, I.stream>>>(yo.d, bd, rows, n);
  CU_LAUNCHED("k_add_bias");
  I.finish(yo);
}

void swiglu(CudaBackend::Impl& I, const float* gate, const float* up, int64_t n, float* out) {
  if (n <= 0) return;
  const float* ud = I.in(up, n);
  // out may alias gate: copy gate in first when out is a host buffer.
  auto oo = I.out(out, n, out == gate);
  const float* gd = out == gate ? oo.d : I.in(gate, n);
  k_swiglu<<<blocks_for(n), 256, 0, I.stream>>>(gd, ud, n, oo.d);
  CU_LAUNCHED("k_swiglu");
  I.finish(oo);
}

void mul_sigmoid(CudaBackend::Impl& I, float* x, const float* gate, int64_t n) {
  if (n <= 0) return;
  const float* gd = I.in(gate, n);
  auto xo = I.out(x, n, true);
  k_mul_sigmoid<<<blocks_for(n), 256, 0, I.stream>>>(xo.d, gd, n);
  CU_LAUNCHED("k_mul_sigmoid");
  I.finish(xo);
}

void scale(CudaBackend::Impl& I, float* x, int64_t n, float a) {
  if (n <= 0) return;
  auto xo = I.out(x, n, true);
  k_scale<<<blocks_for(n), 256, 0, I.stream>>>(xo.d, n, a);
  CU_LAUNCHED("k_scale");
  I.finish(xo);
}

void softcap(CudaBackend::Impl& I, float* x, int64_t n, float cap) {
  if (n <= 0) return;
  auto xo = I.out(x, n, true);
  k_softcap<<<blocks_for(n), 256, 0, I.stream>>>(xo.d, n, cap);
  CU_LAUNCHED("k_softcap");
  I.finish(xo);
}

void mul_indexed(CudaBackend::Impl& I, float* w, const int* ids, const float* table, int64_t n) {
  if (n <= 0) return;
  // ids and table are host arrays (the routing ids the host grouped by): the factors go up as
  // one small copy, the weights stay where they are.
  std::vector<float> f(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) f[i] = table[ids[i]];
  const float* fd = I.in(f.data(), n);
  auto wo = I.out(w, n, true);
  k_mul<<<blocks_for(n), 256, 0, I.stream>>>(wo.d, fd, n);
  CU_LAUNCHED("k_mul");
  I.finish(wo);
}

void add_gated_rows(CudaBackend::Impl& I, float* out, const float* s, const float* x, const float* w, int64_t T, int64_t n) {
  if (T <= 0) return;
  const float* sd = I.in(s, T * n);
  const float* xd = w ? I.in(x, T * n) : nullptr;
  const float* wd = I.in(w, n, false);
  auto oo = I.out(out, T * n, true);
  k_add_gated_rows<<<static_cast<unsigned>(T), row_threads(n), 0, I.stream>>>(oo.d, sd, xd, wd, n);
  CU_LAUNCHED("k_add_gated_rows");
  I.finish(oo);
}

void copy_2d(CudaBackend::Impl& I, float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  CU(cudaMemcpy2DAsync(dst, static_cast<size_t>(ld_dst) * 4, src, static_cast<size_t>(ld_src) * 4, static_cast<size_t>(cols) * 4,
                       static_cast<size_t>(rows), cudaMemcpyDefault, I.stream));
  if (!is_device_ptr(dst) || !is_device_ptr(src)) {
    I.staged += static_cast<uint64_t>(rows * cols) * 4;
    CU(cudaStreamSynchronize(I.stream));
  }
}

void row_to_f32(CudaBackend::Impl& I, WType t, const void* src, int64_t n, float* dst) {
  if (n <= 0) return;
  if (t == WType::kQuant) fail("row_to_f32: rows of quantized tables cannot be read");
  const int64_t bytes = n * wtype_size(t);
  const void* sd = I.in(static_cast<const uint8_t*>(src), bytes, false);
  auto dd = I.out(dst, n, false);
  k_row_to_f32<<<blocks_for(n), 256, 0, I.stream>>>(t == WType::kF32 ? kWF32 : t == WType::kF16 ? kWF16 : kWBF16, sd, n, dd.d);
  CU_LAUNCHED("k_row_to_f32");
  I.finish(dd);
}

void to_host(CudaBackend::Impl& I, const float* src, int64_t n, float* dst) {
  if (n <= 0) return;
  CU(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * 4, cudaMemcpyDefault, I.stream));
  CU(cudaStreamSynchronize(I.stream));
}

}  // namespace spool::ops::cu
