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

Workspace::Workspace(size_t bytes, Device device) : device_(device) {
  if (device != Device::kCpu) fail("workspace: no allocator for device %s in this build", device_name(device));
  bytes = (bytes + kAlign - 1) / kAlign * kAlign;
  if (bytes == 0) bytes = kAlign;
  void* p = ::mmap(nullptr, bytes + kAlign, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED) fail("workspace: cannot reserve %zu bytes (%s)", bytes, std::strerror(errno));
  std::memcpy(p, &bytes, sizeof bytes);  // size header in the first (touched) line
  base_ = static_cast<char*>(p) + kAlign;
  mem_.reset(base_);
  cap_ = bytes;
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
