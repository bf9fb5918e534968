// SwiGLU feed-forward: down(silu(gate(x)) * up(x)), bias-free (HF Qwen2MoeMLP / LlamaMLP).
#pragma once

#include <string>

#include "io/checkpoint.h"
#include "ops/backend.h"
#include "ops/weights.h"
#include "ops/workspace.h"

namespace spool::models {

class DenseMlp {
 public:
  /// Scratch of one forward over T tokens with intermediate width I: gate and up [T, I].
  struct Scratch {
    float *g, *u;
    static Scratch take(ops::Workspace& ws, int64_t T, int64_t I) { return {ws.floats(T * I), ws.floats(T * I)}; }
  };

  /// Binds `{prefix}{gate,up,down}_proj.weight`: gate/up [inter, hidden], down [hidden, inter].
  void bind(const io::Checkpoint& ck, const std::string& prefix, int hidden, int inter);
  /// Moves the weights to where `be` reads them (Backend::upload; a no-op on host backends).
  void place(ops::Backend& be);
  /// x: [T, hidden] -> out: [T, hidden] (overwritten). Scratch from `ws` (given back on return).
  void forward(const float* x, int64_t T, float* out, ops::Backend& be, ops::Workspace& ws) const;
  /// The same with scratch the caller took (Scratch::take with T and intermediate()).
  void forward(const float* x, int64_t T, float* out, ops::Backend& be, const Scratch& s) const;
  /// True once bind() has run.
  bool bound() const { return !gate_.empty(); }
  /// Intermediate width (rows of gate_proj).
  int64_t intermediate() const { return gate_.rows; }
  /// The three projections as an expert (for a backend that runs a shared expert beside the
  /// routed ones: Backend::routed_takes_shared).
  ops::ExpertMats mats() const { return {gate_, up_, down_}; }

 private:
  ops::WeightView gate_, up_, down_;
};

}  // namespace spool::models
