#include "ops/workspace.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

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

Workspace::Workspace(size_t bytes, Device device) : device_(device) {
  if (device != Device::kCpu && g_cuda_alloc.alloc == nullptr)
    fail("workspace: no allocator for device %s (build with -DSPOOL_CUDA=ON and create its backend first)",
         device_name(device));
  bytes = (bytes + kAlign - 1) / kAlign * kAlign;
  if (bytes == 0) bytes = kAlign;
  void* p = ::mmap(nullptr, bytes + kAlign, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
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
