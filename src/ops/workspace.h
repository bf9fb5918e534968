// Workspace: one arena for the activations of a forward pass. Layers take their scratch from
// it while they run and give it back (mark / release), so every layer of a model shares the
// same bytes and no layer owns buffers. A measuring workspace (no memory) runs the same take()
// calls and reports the bytes they need: the engine and the planner size the arena with one
// function (models::workspace_bytes), which measures the layers' own take() code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include "ops/backend.h"

namespace spool::ops {

/// Allocator of device memory for Workspace arenas (a GPU backend registers its own when it is
/// created; spool_ops itself links no GPU runtime). alloc returns nullptr on failure.
struct DeviceAllocator {
  void* (*alloc)(size_t bytes) = nullptr;
  void (*free)(void* p) = nullptr;
  /// Copies `bytes` between any two of host and device memory (synchronous); may be null
  /// (then DeviceFloats cannot be made for the device).
  void (*copy)(void* dst, const void* src, size_t bytes) = nullptr;
};
/// Registers the allocator of `device` (Device::kCuda); later registrations replace it.
void set_device_allocator(Device device, DeviceAllocator a);

/// Copies `bytes` between any two of host memory and `device`'s memory with its registered
/// allocator's copy (synchronous; memcpy for Device::kCpu). Throws spool::Error when the device
/// has no allocator.
void device_copy(Device device, void* dst, const void* src, size_t bytes);

/// n floats on `device` from its registered allocator (state that stays on a GPU between steps:
/// Gated DeltaNet conv and recurrent states). Zeroed at construction; copies are deep (a new
/// allocation holding the same values). Throws spool::Error when the device has no allocator or
/// the memory cannot be had.
class DeviceFloats {
 public:
  DeviceFloats() = default;
  DeviceFloats(Device device, size_t n);
  DeviceFloats(const DeviceFloats& o);
  DeviceFloats& operator=(const DeviceFloats& o);
  DeviceFloats(DeviceFloats&& o) noexcept { *this = std::move(o); }
  DeviceFloats& operator=(DeviceFloats&& o) noexcept;
  ~DeviceFloats();
  float* data() const { return p_; }
  size_t size() const { return n_; }
  bool empty() const { return p_ == nullptr; }
  /// Copies n = size() floats from host `src` into the buffer (synchronous).
  void upload(const float* src);
  /// Copies size() floats of the buffer to host `dst` (synchronous).
  void download(float* dst) const;

 private:
  float* p_ = nullptr;
  size_t n_ = 0;
  Device device_ = Device::kCpu;
};

class Workspace {
 public:
  /// Alignment of every buffer taken (bytes): a cache line and any SIMD vector.
  static constexpr size_t kAlign = 64;

  /// A measuring workspace: take() returns nullptr and only counts bytes.
  Workspace() = default;
  /// An arena of `bytes` on `device`, committed at once (host pages populated). Throws
  /// spool::Error when the memory cannot be had, or for a device whose allocator is not
  /// registered (set_device_allocator). A device arena also reserves (but does not touch) a
  /// host shadow of the same size, from which ints() is served at the same offsets, so that
  /// routing ids are host-visible on every device.
  Workspace(size_t bytes, Device device);
  /// A host arena over `bytes` of memory the caller owns (e.g. taken from another Workspace),
  /// valid while that memory is; nothing is freed on destruction. For a second, independent
  /// scope stack beside the first (DecoderModel's pipelined groups). `base` 64-byte aligned,
  /// or nullptr for a measuring workspace.
  static Workspace over(void* base, size_t bytes) {
    Workspace w;
    w.base_ = static_cast<char*>(base);
    w.cap_ = base == nullptr ? 0 : bytes;
    return w;
  }
  Workspace(Workspace&& o) noexcept { *this = std::move(o); }
  Workspace& operator=(Workspace&& o) noexcept {
    mem_ = std::move(o.mem_);
    base_ = std::exchange(o.base_, nullptr);
    cap_ = std::exchange(o.cap_, 0);
    used_ = std::exchange(o.used_, 0);
    high_ = std::exchange(o.high_, 0);
    device_ = o.device_;
    dev_ = std::move(o.dev_);
    host_ = std::exchange(o.host_, nullptr);
    return *this;
  }

  /// n floats (64-byte aligned). Throws spool::Error past the arena's capacity (a sizing bug).
  float* floats(int64_t n) { return static_cast<float*>(take(static_cast<size_t>(n) * sizeof(float))); }
  /// n 32-bit ints (host-visible on every device: routing ids).
  int* ints(int64_t n) {
    char* p = static_cast<char*>(take(static_cast<size_t>(n) * sizeof(int)));
    return reinterpret_cast<int*>(host_ != nullptr && p != nullptr ? host_ + (p - base_) : p);
  }
  /// `bytes` bytes, 64-byte aligned.
  void* take(size_t bytes);

  /// Current fill; release(mark()) gives back everything taken after it.
  size_t mark() const { return used_; }
  void release(size_t mark) { used_ = mark; }

  /// Most bytes in use at once since construction (measuring: the size the arena needs).
  size_t high_water() const { return high_; }
  /// Capacity in bytes (0 when measuring).
  size_t capacity() const { return cap_; }
  bool measuring() const { return base_ == nullptr; }
  Device device() const { return device_; }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  struct DevFree {
    void (*fn)(void*);  // (no initializer: a nested class with one is not default-constructible here)
    void operator()(void* p) const {
      if (p != nullptr && fn != nullptr) fn(p);
    }
  };
  std::unique_ptr<void, Free> mem_;       // host arena (kCpu) or host shadow (device arenas)
  std::unique_ptr<void, DevFree> dev_;    // device arena (base_) when device_ != kCpu
  char* base_ = nullptr;
  char* host_ = nullptr;                  // host shadow of a device arena (ints())
  size_t cap_ = 0, used_ = 0, high_ = 0;
  Device device_ = Device::kCpu;
};

/// Takes scratch from a workspace for one scope and gives it back on exit.
class WorkspaceScope {
 public:
  explicit WorkspaceScope(Workspace& ws) : ws_(ws), mark_(ws.mark()) {}
  ~WorkspaceScope() { ws_.release(mark_); }
  WorkspaceScope(const WorkspaceScope&) = delete;
  WorkspaceScope& operator=(const WorkspaceScope&) = delete;

 private:
  Workspace& ws_;
  size_t mark_;
};

}  // namespace spool::ops
