// SwiGLU feed-forward: down(silu(gate(x)) * up(x)), bias-free (HF Qwen2MoeMLP / LlamaMLP).
#pragma once

#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "ops/thread_pool.h"
#include "ops/weights.h"

namespace spool::models {

class DenseMlp {
 public:
  /// Binds `{prefix}{gate,up,down}_proj.weight`: gate/up [inter, hidden], down [hidden, inter].
  void bind(const io::Checkpoint& ck, const std::string& prefix, int hidden, int inter);
  /// x: [T, hidden] -> out: [T, hidden] (overwritten).
  void forward(const float* x, int64_t T, float* out, ops::ThreadPool* pool);
  /// True once bind() has run.
  bool bound() const { return !gate_.empty(); }

 private:
  ops::WeightView gate_, up_, down_;
  std::vector<float> g_, u_;
};

}  // namespace spool::models
