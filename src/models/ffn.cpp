#include "models/ffn.h"

#include "common/error.h"
#include "models/bind.h"

namespace spool::models {

namespace {
std::string layer_prefix(int layer) { return "layers." + std::to_string(layer) + "."; }
}  // namespace

void DenseFfn::bind_layer(const io::Checkpoint& ck, const ModelSpec& spec, int layer) {
  mlp_.bind(ck, layer_prefix(layer) + "mlp.", spec.hidden_size, spec.dense_intermediate, glu_activation(spec.activation));
}

void DenseFfn::take_scratch(ops::Workspace& ws, const ModelSpec& spec, int64_t T) const {
  DenseMlp::Scratch::take(ws, T, spec.dense_intermediate);
}

void DenseFfn::forward(const float* x, const float*, int64_t N, const FfnStep&, float* out, ops::Backend& be,
                       ops::Workspace& ws) const {
  mlp_.forward(x, N, out, be, ws);
}

void MoeFfn::bind_layer(const io::Checkpoint& ck, const ModelSpec& spec, int layer) {
  moe_.bind(ck, layer_prefix(layer) + spec.moe.block_prefix, spec);
}

void MoeFfn::take_scratch(ops::Workspace& ws, const ModelSpec& spec, int64_t T) const {
  MoeBlock::Scratch::take(ws, spec.moe, spec.hidden_size, T, spec.moe.top_k);
}

void MoeFfn::forward(const float* x, const float* residual, int64_t N, const FfnStep& step, float* out, ops::Backend& be,
                     ops::Workspace& ws) const {
  // All rows of the step together: each routed expert acquired once.
  moe_.forward(x, N, step.layer, step.top_k, *step.provider, *step.on_route, *step.on_margin, out, be, ws, *step.between,
               residual, step.route_override, step.row0, step.after_prepare, &step.within, step.ep);
}

void ParallelDenseMoeFfn::bind_layer(const io::Checkpoint& ck, const ModelSpec& spec, int layer) {
  if (!spec.sandwich_norms) fail("%s: a parallel dense FFN needs sandwich norms", ck.dir().c_str());
  const std::string p = layer_prefix(layer);
  hidden_ = spec.hidden_size;
  eps_ = spec.rms_norm_eps;
  pre2_ = bind_norm(ck, p + "pre_feedforward_layernorm_2.weight", hidden_, spec.norm_one_plus);
  post1_ = bind_norm(ck, p + "post_feedforward_layernorm_1.weight", hidden_, spec.norm_one_plus);
  post2_ = bind_norm(ck, p + "post_feedforward_layernorm_2.weight", hidden_, spec.norm_one_plus);
  pre2_p_ = pre2_.data();
  post1_p_ = post1_.data();
  post2_p_ = post2_.data();
  moe_.bind(ck, p + spec.moe.block_prefix, spec);
  mlp_.bind(ck, p + "mlp.", hidden_, spec.dense_intermediate, glu_activation(spec.activation));
}

void ParallelDenseMoeFfn::place(ops::Backend& be) {
  pre2_p_ = be.upload_floats(pre2_);
  post1_p_ = be.upload_floats(post1_);
  post2_p_ = be.upload_floats(post2_);
  moe_.place(be);
  mlp_.place(be);
}

void ParallelDenseMoeFfn::take_scratch(ops::Workspace& ws, const ModelSpec& spec, int64_t T) const {
  // forward(): two [T, H] rows, then each branch in turn.
  const int64_t H = spec.hidden_size;
  ws.floats(T * H);
  ws.floats(T * H);
  {
    ops::WorkspaceScope inner(ws);
    DenseMlp::Scratch::take(ws, T, spec.dense_intermediate);
  }
  MoeBlock::Scratch::take(ws, spec.moe, H, T, spec.moe.top_k);
}

void ParallelDenseMoeFfn::forward(const float* x, const float* residual, int64_t N, const FfnStep& step, float* out,
                                  ops::Backend& be, ops::Workspace& ws) const {
  const int64_t H = hidden_;
  ops::WorkspaceScope scope(ws);
  float* x2 = ws.floats(N * H);
  float* y2 = ws.floats(N * H);
  mlp_.forward(x, N, out, be, ws);
  be.rms_norm(out, post1_p_, N, H, eps_, out);
  be.rms_norm(residual, pre2_p_, N, H, eps_, x2);
  moe_.forward(x2, N, step.layer, step.top_k, *step.provider, *step.on_route, *step.on_margin, y2, be, ws, *step.between,
               residual, step.route_override, step.row0, step.after_prepare, &step.within, step.ep);
  be.rms_norm(y2, post2_p_, N, H, eps_, y2);
  be.add(out, y2, N * H);
}

}  // namespace spool::models
