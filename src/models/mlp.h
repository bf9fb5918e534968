// Gated feed-forward: down(act(gate(x)) * up(x)), bias-free, act silu (HF Qwen2MoeMLP /
// LlamaMLP) or tanh GELU (HF Gemma4TextMLP, hidden_activation gelu_pytorch_tanh).
#pragma once

#include <string>

#include "io/checkpoint.h"
#include "models/spec.h"
#include "ops/backend.h"
#include "ops/weights.h"
#include "ops/workspace.h"

namespace spool::models {

/// The backend's gated activation for a spec's ActivationKind: kSilu -> kSwiGLU, kGeluTanh ->
/// kGeluTanhGLU, kClampedSwiGLU -> kClampedSwiGLU (experts with the interleaved gate_up only).
inline ops::Activation glu_activation(ActivationKind k) {
  switch (k) {
    case ActivationKind::kGeluTanh: return ops::Activation::kGeluTanhGLU;
    case ActivationKind::kClampedSwiGLU: return ops::Activation::kClampedSwiGLU;
    case ActivationKind::kSilu: break;
  }
  return ops::Activation::kSwiGLU;
}

/// A dense gated MLP (a dense layer's FFN, a shared expert, Gemma 4's MLP beside the experts).
class DenseMlp {
 public:
  /// Scratch of one forward over T tokens with intermediate width I: gate and up [T, I].
  struct Scratch {
    float *g, *u;
    static Scratch take(ops::Workspace& ws, int64_t T, int64_t I) { return {ws.floats(T * I), ws.floats(T * I)}; }
  };

  /// Binds `{prefix}{gate,up,down}_proj.weight`: gate/up [inter, hidden], down [hidden, inter];
  /// `act` the activation of gate (kSwiGLU or kGeluTanhGLU; spool::Error otherwise).
  void bind(const io::Checkpoint& ck, const std::string& prefix, int hidden, int inter,
            ops::Activation act = ops::Activation::kSwiGLU);
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
  /// The activation bind() was given.
  ops::Activation activation() const { return act_; }
  /// The three projections as an expert (for a backend that runs a shared expert beside the
  /// routed ones: Backend::routed_takes_shared; SwiGLU ones only).
  ops::ExpertMats mats() const { return {gate_, up_, down_}; }

 private:
  ops::WeightView gate_, up_, down_;
  ops::Activation act_ = ops::Activation::kSwiGLU;
};

}  // namespace spool::models
