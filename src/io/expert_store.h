// ExpertStore: where every routed expert lives on disk, as read plans that fill one buffer
// per expert. Built from the safetensors headers (io::Checkpoint); never reads expert data.
//
// An expert is up to three tensors (gate, up, down). Tensors adjacent in a file are merged
// into one extent (per-expert checkpoints usually store down|gate|up back to back; the fused
// layout gives gate+up as one range and down as another). Each extent is read into its own
// region of the expert's buffer. In direct-I/O mode extents are widened to 4096-byte
// boundaries (O_DIRECT needs aligned offsets, lengths and buffers) and placed at aligned
// buffer offsets; the projection pointers skip the widening.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/checkpoint.h"

namespace spool::io {

/// Alignment of direct-I/O reads and expert buffers (bytes).
constexpr uint64_t kDirectIoAlign = 4096;

/// One contiguous file range of an expert and where it goes in the expert's buffer.
struct ExpertExtent {
  int shard = 0;
  uint64_t file_offset = 0;  // first byte read (aligned in direct mode)
  uint64_t length = 0;       // bytes read (aligned in direct mode)
  uint64_t buf_offset = 0;   // destination offset inside the expert buffer
};

/// Read plan of one expert.
struct ExpertLocation {
  std::vector<ExpertExtent> extents;
  /// Offset inside the buffer of each [projection][part] tensor (gate/up/down x weight,
  /// qweight, scales, codebook, MXFP4 blocks, E8M0 scales); UINT64_MAX where the part is absent.
  uint64_t part_offset[3][kExpertParts];
  uint64_t payload_bytes = 0;           // sum of the three tensors' sizes
  uint64_t read_bytes = 0;              // sum of extent lengths (>= payload in direct mode)
};

class ExpertStore {
 public:
  /// Plans reads for experts [0, n_experts) of every layer in `moe_layers` (true = MoE).
  /// `direct` widens extents for O_DIRECT. Throws spool::Error if an expert tensor is missing.
  ExpertStore(const Checkpoint& ckpt, const std::vector<bool>& moe_layers, int n_experts, bool direct);

  const ExpertLocation& at(int layer, int expert) const { return plans_[index(layer, expert)]; }
  bool has_layer(int layer) const { return layer >= 0 && layer < static_cast<int>(moe_layers_.size()) && moe_layers_[layer]; }
  int n_experts() const { return n_experts_; }
  int n_layers() const { return static_cast<int>(moe_layers_.size()); }
  /// Buffer size that fits any expert (multiple of kDirectIoAlign).
  uint64_t slot_bytes() const { return slot_bytes_; }
  bool direct() const { return direct_; }
  /// Number of expert tensors covered (3 per expert).
  int64_t tensor_count() const { return tensor_count_; }
  /// Payload bytes of all experts.
  uint64_t total_bytes() const { return total_bytes_; }

 private:
  size_t index(int layer, int expert) const { return static_cast<size_t>(layer) * n_experts_ + expert; }
  std::vector<bool> moe_layers_;
  int n_experts_ = 0;
  bool direct_ = false;
  std::vector<ExpertLocation> plans_;
  uint64_t slot_bytes_ = 0, total_bytes_ = 0;
  int64_t tensor_count_ = 0;
};

}  // namespace spool::io
