#include "ops/workspace.h"

#include <sys/mman.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "common/error.h"

namespace spool::ops {

// Host arenas come from mmap, populated at once (MAP_POPULATE): the arena is committed memory
// from the start, so the peak a run reaches does not depend on how long its prompts happen to
// be (the planner counts the whole arena), and it goes back to the OS when freed.
void Workspace::Free::operator()(void* p) const {
  if (p == nullptr) return;
  size_t bytes;
  std::memcpy(&bytes, static_cast<char*>(p) - kAlign, sizeof bytes);
  ::munmap(static_cast<char*>(p) - kAlign, bytes + kAlign);
}

namespace {
DeviceAllocator g_cuda_alloc;
}

void set_device_allocator(Device device, DeviceAllocator a) {
  if (device == Device::kCuda) g_cuda_alloc = a;
}

void device_copy(Device device, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (device == Device::kCpu) {
    std::memcpy(dst, src, bytes);
    return;
  }
  if (g_cuda_alloc.copy == nullptr) fail("device copy: no allocator for device %s (create its backend first)", device_name(device));
  g_cuda_alloc.copy(dst, src, bytes);
}

DeviceFloats::DeviceFloats(Device device, size_t n) : n_(n), device_(device) {
  if (device == Device::kCpu || g_cuda_alloc.alloc == nullptr || g_cuda_alloc.copy == nullptr)
    fail("device buffer: no allocator for device %s (create its backend first)", device_name(device));
  p_ = static_cast<float*>(g_cuda_alloc.alloc(std::max<size_t>(n, 1) * sizeof(float)));
  if (p_ == nullptr) fail("device buffer: cannot allocate %zu bytes on device %s", n * sizeof(float), device_name(device));
  const std::vector<float> zeros(n, 0.0f);
  upload(zeros.data());
}
DeviceFloats::DeviceFloats(const DeviceFloats& o) : DeviceFloats() { *this = o; }
DeviceFloats& DeviceFloats::operator=(const DeviceFloats& o) {
  if (this == &o) return *this;
  if (o.p_ == nullptr) {
    *this = DeviceFloats();
    return *this;
  }
  if (p_ == nullptr || n_ != o.n_ || device_ != o.device_) *this = DeviceFloats(o.device_, o.n_);
  if (n_) g_cuda_alloc.copy(p_, o.p_, n_ * sizeof(float));
  return *this;
}
DeviceFloats& DeviceFloats::operator=(DeviceFloats&& o) noexcept {
  if (this != &o) {
    if (p_ != nullptr && g_cuda_alloc.free != nullptr) g_cuda_alloc.free(p_);
    p_ = std::exchange(o.p_, nullptr);
    n_ = std::exchange(o.n_, 0);
    device_ = o.device_;
  }
  return *this;
}
DeviceFloats::~DeviceFloats() {
  if (p_ != nullptr && g_cuda_alloc.free != nullptr) g_cuda_alloc.free(p_);
}
void DeviceFloats::upload(const float* src) {
  if (p_ != nullptr && n_) g_cuda_alloc.copy(p_, src, n_ * sizeof(float));
}
void DeviceFloats::download(float* dst) const {
  if (p_ != nullptr && n_) g_cuda_alloc.copy(dst, p_, n_ * sizeof(float));
}

Workspace::Workspace(size_t bytes, Device device) : device_(device) {
  if (device != Device::kCpu && g_cuda_alloc.alloc == nullptr)
    fail("workspace: no allocator for device %s (build with -DSPOOL_CUDA=ON and create its backend first)",
         device_name(device));
  bytes = (bytes + kAlign - 1) / kAlign * kAlign;
  if (bytes == 0) bytes = kAlign;
  // A device arena's host mapping is only the shadow ints() are served from: not populated.
  const int populate = device == Device::kCpu ? MAP_POPULATE : 0;
  void* p = ::mmap(nullptr, bytes + kAlign, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | populate, -1, 0);
  if (p == MAP_FAILED) fail("workspace: cannot reserve %zu bytes (%s)", bytes, std::strerror(errno));
  std::memcpy(p, &bytes, sizeof bytes);  // size header in the first (touched) line
  base_ = static_cast<char*>(p) + kAlign;
  mem_.reset(base_);
  cap_ = bytes;
  if (device != Device::kCpu) {
    host_ = base_;
    void* d = g_cuda_alloc.alloc(bytes);
    if (d == nullptr) fail("workspace: cannot allocate %zu bytes on device %s", bytes, device_name(device));
    dev_ = std::unique_ptr<void, DevFree>(d, DevFree{g_cuda_alloc.free});
    base_ = static_cast<char*>(d);
  }
}

void* Workspace::take(size_t bytes) {
  const size_t at = used_;
  used_ += (bytes + kAlign - 1) / kAlign * kAlign;
  if (used_ > high_) high_ = used_;
  if (base_ == nullptr) return nullptr;
  if (used_ > cap_)
    fail("workspace: a forward pass needs more than the %zu bytes sized for it (asked %zu at %zu); this is a sizing bug",
         cap_, bytes, at);
  return base_ + at;
}

}  // namespace spool::ops
