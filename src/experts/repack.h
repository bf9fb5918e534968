// Relayout of a checkpoint's routed experts: expert e of layer l in the output is expert
// perm[l][e] of the input, and the router rows (and DeepSeek's e_score_correction_bias) are
// permuted the same way, so the model routes to the same weights and computes the same
// output. Tensor names, dtypes, shapes, shard files and every other file stay the same.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "io/checkpoint.h"

namespace spool::experts {

/// Writes the permuted checkpoint to `out_dir` (created; must be empty or absent).
/// progress(done_bytes, total_bytes). Throws spool::Error on bad perm sizes or I/O errors.
void repack(const io::Checkpoint& in, const std::vector<std::vector<int>>& perm, const std::string& out_dir,
            const std::function<void(uint64_t, uint64_t)>& progress);

}  // namespace spool::experts
