// CudaBackend memory: device allocations (tracked, so that is_device_ptr rarely asks the driver),
// the pinned staging ring for small host inputs, uploads of weights and parameter vectors, weight
// slots filled on a copy stream ordered by events (fences, stalls), page-locked host memory, and
// the public CUDA helpers of cuda_backend.h (device count / info, CudaBuffer, H2D bandwidth).
#include "ops/cuda/cuda_internal.h"
#include "ops/lora.h"

namespace spool::ops::cu {

void check_cuda(cudaError_t e, const char* what, const char* file, int line) {
  // (cudaGetLastError clears a non-sticky error, so a refused call does not fail the next launch check)
  if (e != cudaSuccess) (void)cudaGetLastError();
  if (e != cudaSuccess) fail("CUDA error %s (%s) in %s (%s:%d)", cudaGetErrorName(e), cudaGetErrorString(e), what, file, line);
}

std::atomic<uint64_t> g_pointer_queries{0};

namespace {
// Every allocation dev_alloc made and dev_free has not given back: [start, end) by start, so that
// is_device_ptr answers for them without a CUDA call (an op checks each of its pointers; a decode
// step makes hundreds of such checks).
std::mutex g_ranges_mu;
std::map<uintptr_t, uintptr_t> g_ranges;

}  // namespace

void* dev_alloc(size_t n) {
  void* p = nullptr;
  if (n == 0) n = 1;
  if (cudaMalloc(&p, n) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(g_ranges_mu);
  g_ranges[reinterpret_cast<uintptr_t>(p)] = reinterpret_cast<uintptr_t>(p) + n;
  return p;
}
void dev_free(void* p) {
  if (p == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(g_ranges_mu);
    g_ranges.erase(reinterpret_cast<uintptr_t>(p));
  }
  (void)cudaFree(p);
}
// Whether p lies in an allocation of dev_alloc's.
static bool in_dev_alloc(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(g_ranges_mu);
  auto it = g_ranges.upper_bound(a);
  if (it == g_ranges.begin()) return false;
  --it;
  return a < it->second;
}
// Synchronous copy between any host / device memory (after the device's queued work: the legacy
// default stream orders it after the backend's blocking stream).
void dev_copy(void* dst, const void* src, size_t n) {
  if (n == 0) return;
  check_cuda(cudaMemcpy(dst, src, n, cudaMemcpyDefault), "cudaMemcpy (device buffer)", __FILE_NAME__, __LINE__);
}


bool is_device_ptr(const void* p) {
  if (p == nullptr) return false;
  if (in_dev_alloc(p)) return true;
  ++g_pointer_queries;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

}  // namespace spool::ops::cu

namespace spool::ops {

// ---- Public helpers ------------------------------------------------------------------------------

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

CudaDeviceInfo cuda_device_info(int index) {
  CudaDeviceInfo info;
  cudaDeviceProp p{};
  if (index < 0 || index >= cuda_device_count() || cudaGetDeviceProperties(&p, index) != cudaSuccess) {
    (void)cudaGetLastError();
    return info;
  }
  std::snprintf(info.name, sizeof info.name, "%s", p.name);
  info.total_bytes = p.totalGlobalMem;
  int prev = 0;
  size_t free_b = 0, total_b = 0;
  if (cudaGetDevice(&prev) == cudaSuccess && cudaSetDevice(index) == cudaSuccess) {
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) info.free_bytes = free_b;
    (void)cudaSetDevice(prev);
  }
  (void)cudaGetLastError();
  info.major = p.major;
  info.minor = p.minor;
  return info;
}

CudaBuffer::CudaBuffer(size_t bytes) : n_(bytes) {
  p_ = dev_alloc(bytes);
  if (p_ == nullptr) fail("cuda: cannot allocate %zu bytes of device memory", bytes);
}
CudaBuffer& CudaBuffer::operator=(CudaBuffer&& o) noexcept {
  if (this != &o) {
    if (p_) dev_free(p_);
    p_ = o.p_;
    n_ = o.n_;
    o.p_ = nullptr;
    o.n_ = 0;
  }
  return *this;
}
CudaBuffer::~CudaBuffer() {
  if (p_) dev_free(p_);
}
double cuda_h2d_gbps(int index, size_t bytes, bool pinned, int reps) {
  if (index < 0 || index >= cuda_device_count()) fail("cuda: no CUDA device %d", index);
  CU(cudaSetDevice(index));
  CudaBuffer d(bytes);
  void* h = nullptr;
  std::vector<uint8_t> pageable;
  if (pinned) {
    CU(cudaMallocHost(&h, bytes));
  } else {
    pageable.resize(bytes);
    h = pageable.data();
  }
  std::memset(h, 1, bytes);
  double best = 0;
  cudaEvent_t a, b;
  CU(cudaEventCreate(&a));
  CU(cudaEventCreate(&b));
  for (int i = 0; i < std::max(1, reps) + 1; ++i) {  // the first copy warms up
    CU(cudaEventRecord(a));
    CU(cudaMemcpy(d.get(), h, bytes, cudaMemcpyHostToDevice));
    CU(cudaEventRecord(b));
    CU(cudaEventSynchronize(b));
    float ms = 0;
    CU(cudaEventElapsedTime(&ms, a, b));
    if (i > 0 && ms > 0) best = std::max(best, static_cast<double>(bytes) / (ms * 1e-3) / 1e9);
  }
  (void)cudaEventDestroy(a);
  (void)cudaEventDestroy(b);
  if (pinned) (void)cudaFreeHost(h);
  return best;
}

void CudaBuffer::upload(const void* src, size_t n) {
  if (n > n_) fail("cuda: upload of %zu bytes into a buffer of %zu", n, n_);
  if (n) CU(cudaMemcpy(p_, src, n, cudaMemcpyHostToDevice));
}
void CudaBuffer::download(void* dst, size_t n) const {
  if (n > n_) fail("cuda: download of %zu bytes from a buffer of %zu", n, n_);
  if (n) CU(cudaMemcpy(dst, p_, n, cudaMemcpyDeviceToHost));
}

// ---- Backend state: staging, uploads, weight slots -------------------------------------------------

cudaEvent_t CudaBackend::Impl::take_event(bool timing) {
  std::vector<cudaEvent_t>& pool = timing ? spare_timing : spare_events;
  if (!pool.empty()) {
    cudaEvent_t e = pool.back();
    pool.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  CU(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  return e;
}

void CudaBackend::Impl::poll_fences(uint64_t upto, bool block) {
  while (!fences.empty()) {
    auto [t, e] = fences.front();
    if (block && t <= upto) {
      CU(cudaEventSynchronize(e));
    } else {
      const cudaError_t r = cudaEventQuery(e);
      if (r == cudaErrorNotReady) break;
      CU(r);
    }
    done_ticket = t;
    spare_events.push_back(e);
    fences.pop_front();
  }
}

void CudaBackend::Impl::harvest_stalls() {
  while (!stalls.empty()) {
    auto [a, b] = stalls.front();
    const cudaError_t r = cudaEventQuery(b);
    if (r == cudaErrorNotReady) break;
    CU(r);
    float ms = 0;
    CU(cudaEventElapsedTime(&ms, a, b));
    stall_s += static_cast<double>(ms) * 1e-3;
    spare_timing.push_back(a);
    spare_timing.push_back(b);
    stalls.pop_front();
  }
}

void CudaBackend::Impl::h2d(void* dst, const void* src, size_t bytes) {
  if (pinned == nullptr || bytes > kPinnedRing / 4) {
    CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
    return;
  }
  size_t at = round_up(pinned_at, 64);
  if (at + bytes > kPinnedRing) {
    CU(cudaStreamSynchronize(stream));
    at = 0;
  }
  std::memcpy(pinned + at, src, bytes);
  CU(cudaMemcpyAsync(dst, pinned + at, bytes, cudaMemcpyHostToDevice, stream));
  pinned_at = at + bytes;
}

WeightView CudaBackend::Impl::dev_weight(const WeightView& w) {
  check_supported(w);
  if (w.type == WType::kQuant) validate(w.quant);
  if (w.device == Device::kCuda) return w;
  if (strict)
    fail("cuda (strict device mode): %s would copy host weight %s [%lld x %lld] to the GPU for this call; upload it at load "
         "(Backend::upload) or run without SPOOL_STRICT_DEVICE / --strict-device",
         current_op ? current_op : "an op", w.name ? w.name : "(unnamed)", (long long)w.rows, (long long)w.cols);
  const size_t n = weight_bytes(w);
  staged += n;
  return copy_weight(w, arena->get(n), stream);
}

void CudaBackend::synchronize() {
  CU(cudaStreamSynchronize(impl_->copy_stream));
  CU(cudaStreamSynchronize(impl_->stream));
}

void* CudaBackend::stream_handle() const { return impl_->stream; }

int CudaBackend::device_index() const { return impl_->device; }
uint64_t CudaBackend::staged_bytes() const { return impl_->staged; }
uint64_t CudaBackend::uploaded_bytes() const { return impl_->uploaded; }

const float* CudaBackend::upload_floats(std::span<const float> v) {
  if (v.empty() || is_device_ptr(v.data())) return v.data();
  const size_t n = v.size() * sizeof(float);
  void* p = dev_alloc(n);
  if (p == nullptr) fail("cuda: cannot allocate %zu bytes of device memory for a parameter vector", n);
  impl_->uploads.push_back(p);
  impl_->uploaded += n;
  CU(cudaMemcpy(p, v.data(), n, cudaMemcpyHostToDevice));
  return static_cast<const float*>(p);
}

WeightView CudaBackend::upload(const WeightView& w) {  // (LoRA terms stay with the view: Impl::mm adds them)
  if (w.device == Device::kCuda || w.empty()) return w;
  check_supported(w);
  if (w.type == WType::kQuant) validate(w.quant);
  const size_t n = weight_bytes(w);
  void* p = dev_alloc(n);
  if (p == nullptr) fail("cuda: cannot allocate %zu bytes of device memory for a [%lld x %lld] weight", n, (long long)w.rows, (long long)w.cols);
  impl_->uploads.push_back(p);
  impl_->uploaded += n;
  const WeightView d = copy_weight(w, p, impl_->stream);
  CU(cudaStreamSynchronize(impl_->stream));  // the host view may be unmapped after return
  return d;
}

void* CudaBackend::alloc_weight_slot(uint64_t bytes) {
  void* p = dev_alloc(static_cast<size_t>(bytes));
  if (p == nullptr) fail("cuda: cannot allocate %llu bytes of device memory for a weight slot", (unsigned long long)bytes);
  impl_->uploads.push_back(p);
  impl_->uploaded += bytes;  // VRAM held (the budget counts it like uploads)
  return p;
}

WeightView CudaBackend::copy_weight_into(const WeightView& w, void* slot) {
  Impl& I = *impl_;
  check_supported(w);
  if (w.type == WType::kQuant) validate(w.quant);
  I.slot_copied += weight_bytes(w);
  // After the kernels issued so far (they may read the slot's previous contents), on the copy
  // stream: it overlaps whatever the compute stream is given next, until wait_weight_copies().
  CU(cudaEventRecord(I.compute_point, I.stream));
  CU(cudaStreamWaitEvent(I.copy_stream, I.compute_point, 0));
  I.copies_since_fence = true;
  return copy_weight(w, slot, I.copy_stream);
}

uint64_t CudaBackend::weight_copy_fence() {
  Impl& I = *impl_;
  if (!I.copies_since_fence) return I.last_fence;
  cudaEvent_t e = I.take_event(false);
  CU(cudaEventRecord(e, I.copy_stream));
  I.fences.emplace_back(I.next_ticket, e);
  I.last_fence = I.next_ticket++;
  I.copies_since_fence = false;
  return I.last_fence;
}

void CudaBackend::wait_weight_copies(uint64_t ticket) {
  Impl& I = *impl_;
  I.harvest_stalls();
  I.poll_fences(ticket, false);
  if (ticket <= I.done_ticket) return;  // finished already: nothing to wait for
  cudaEvent_t fence = nullptr;
  for (auto& [t, e] : I.fences)  // the first fence at or after the ticket covers it
    if (t >= ticket) {
      fence = e;
      break;
    }
  if (fence == nullptr) fail("cuda: wait for weight copies of ticket %llu, which was never issued", (unsigned long long)ticket);
  cudaEvent_t a = I.take_event(true), b = I.take_event(true);
  CU(cudaEventRecord(a, I.stream));
  CU(cudaStreamWaitEvent(I.stream, fence, 0));
  CU(cudaEventRecord(b, I.stream));
  I.stalls.emplace_back(a, b);
}

bool CudaBackend::weight_copies_done(uint64_t ticket, bool block) {
  Impl& I = *impl_;
  I.poll_fences(ticket, block);
  return ticket <= I.done_ticket;
}

double CudaBackend::weight_copy_stall_seconds() const {
  impl_->harvest_stalls();
  return impl_->stall_s;
}

bool CudaBackend::pin_host(void* p, uint64_t bytes) {
  if (p == nullptr || bytes == 0) return false;
  if (cudaHostRegister(p, static_cast<size_t>(bytes), cudaHostRegisterDefault) == cudaSuccess) return true;
  (void)cudaGetLastError();  // not pinned: copies from it stay pageable (slower, same bytes)
  return false;
}

void CudaBackend::unpin_host(void* p) {
  if (p != nullptr && cudaHostUnregister(p) != cudaSuccess) (void)cudaGetLastError();
}

uint64_t CudaBackend::slot_copied_bytes() const { return impl_->slot_copied; }

void* CudaBackend::alloc_host_mapped(uint64_t bytes) {
  void* p = nullptr;
  // Write-combined: the host only writes it (once); the GPU reads it over PCIe without snooping CPU caches.
  if (cudaHostAlloc(&p, std::max<uint64_t>(bytes, 1), cudaHostAllocMapped | cudaHostAllocWriteCombined) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  void* d = nullptr;
  if (cudaHostGetDevicePointer(&d, p, 0) != cudaSuccess || d != p) {  // kernels take the host address (unified addressing)
    (void)cudaGetLastError();
    (void)cudaFreeHost(p);
    return nullptr;
  }
  impl_->host_mapped.push_back(p);
  impl_->host_mapped_bytes += bytes;
  return p;
}

uint64_t CudaBackend::host_mapped_bytes() const { return impl_->host_mapped_bytes; }

}  // namespace spool::ops
