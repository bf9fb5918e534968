// The feed-forward blocks of a decoder layer as Ffn implementations (layer.h):
//   DenseFfn             y = mlp(x)                                (FfnKind::kDense)
//   MoeFfn               y = moe(x)                                (FfnKind::kMoE)
//   ParallelDenseMoeFfn  y = N_post1(mlp(x)) + N_post2(moe(N_pre2(r)))  (FfnKind::kMoE with
//                        ModelSpec::parallel_dense_ffn: HF Gemma 4's Gemma4TextDecoderLayer)
// x is the FFN's normed input (the decoder applies post_attention_layernorm or, with sandwich
// norms, pre_feedforward_layernorm), r the residual stream; the decoder adds y to r (after
// post_feedforward_layernorm with sandwich norms).
#pragma once

#include <string>
#include <vector>

#include "models/layer.h"
#include "models/mlp.h"
#include "models/moe.h"

namespace spool::models {

/// A dense layer's gated MLP (`layers.{i}.mlp.{gate,up,down}_proj`, ModelSpec::dense_intermediate,
/// ModelSpec::activation).
class DenseFfn final : public Ffn {
 public:
  // Ffn (layer.h):
  void bind_layer(const io::Checkpoint& ck, const ModelSpec& spec, int layer) override;
  void place(ops::Backend& be) override { mlp_.place(be); }
  void take_scratch(ops::Workspace& ws, const ModelSpec& spec, int64_t T) const override;
  void forward(const float* x, const float* residual, int64_t N, const FfnStep& step, float* out, ops::Backend& be,
               ops::Workspace& ws) const override;
  bool routed() const override { return false; }

 private:
  DenseMlp mlp_;
};

/// A MoE layer's routed experts (and shared expert) under `layers.{i}.{MoeSpec::block_prefix}`.
class MoeFfn final : public Ffn {
 public:
  // Ffn (layer.h):
  void bind_layer(const io::Checkpoint& ck, const ModelSpec& spec, int layer) override;
  void place(ops::Backend& be) override { moe_.place(be); }
  void take_scratch(ops::Workspace& ws, const ModelSpec& spec, int64_t T) const override;
  void forward(const float* x, const float* residual, int64_t N, const FfnStep& step, float* out, ops::Backend& be,
               ops::Workspace& ws) const override;
  bool routed() const override { return true; }
  const MoeBlock* moe() const override { return &moe_; }

 private:
  MoeBlock moe_;
};

/// A dense MLP and the MoE block side by side on one layer (ModelSpec::parallel_dense_ffn, which
/// needs sandwich norms): y = N_post1(mlp(x)) + N_post2(moe(N_pre2(r))) with the norms
/// `layers.{i}.post_feedforward_layernorm_1`, `post_feedforward_layernorm_2` and
/// `pre_feedforward_layernorm_2` (x = pre_feedforward_layernorm(r), applied by the decoder).
class ParallelDenseMoeFfn final : public Ffn {
 public:
  // Ffn (layer.h):
  void bind_layer(const io::Checkpoint& ck, const ModelSpec& spec, int layer) override;
  void place(ops::Backend& be) override;
  void take_scratch(ops::Workspace& ws, const ModelSpec& spec, int64_t T) const override;
  void forward(const float* x, const float* residual, int64_t N, const FfnStep& step, float* out, ops::Backend& be,
               ops::Workspace& ws) const override;
  bool routed() const override { return true; }
  const MoeBlock* routed_block() const override { return &moe_; }

 private:
  DenseMlp mlp_;
  MoeBlock moe_;
  int hidden_ = 0;
  float eps_ = 1e-6f;
  std::vector<float> pre2_, post1_, post2_;  // effective RMSNorm weights [H]
  const float *pre2_p_ = nullptr, *post1_p_ = nullptr, *post2_p_ = nullptr;  // where the backend reads them
};

}  // namespace spool::models
