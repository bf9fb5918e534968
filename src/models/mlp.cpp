#include "models/mlp.h"

#include "common/error.h"
#include "models/bind.h"

namespace spool::models {

void DenseMlp::bind(const io::Checkpoint& ck, const std::string& prefix, int hidden, int inter, ops::Activation act) {
  if (act != ops::Activation::kSwiGLU && act != ops::Activation::kGeluTanhGLU)
    fail("%s: %sgate_proj: a dense MLP takes a SwiGLU or tanh-GELU activation", ck.dir().c_str(), prefix.c_str());
  act_ = act;
  gate_ = bind_matrix(ck, prefix + "gate_proj.weight", inter, hidden);
  up_ = bind_matrix(ck, prefix + "up_proj.weight", inter, hidden);
  down_ = bind_matrix(ck, prefix + "down_proj.weight", hidden, inter);
}

void DenseMlp::place(ops::Backend& be) {
  gate_ = be.upload(gate_);
  up_ = be.upload(up_);
  down_ = be.upload(down_);
}

void DenseMlp::forward(const float* x, int64_t T, float* out, ops::Backend& be, ops::Workspace& ws) const {
  ops::WorkspaceScope scope(ws);
  forward(x, T, out, be, Scratch::take(ws, T, gate_.rows));
}

void DenseMlp::forward(const float* x, int64_t T, float* out, ops::Backend& be, const Scratch& s) const {
  const int64_t I = gate_.rows;
  const ops::MatmulOut gu[] = {{&gate_, s.g}, {&up_, s.u}};
  be.matmul_multi(gu, x, T);         // [T, I] each
  if (act_ == ops::Activation::kSwiGLU) {
    be.swiglu(s.g, s.u, T * I, s.g);
  } else {
    be.gelu_tanh_glu(s.g, s.u, T * I, s.g);
  }
  be.matmul(down_, s.g, T, out);     // [T, H]
}

}  // namespace spool::models
