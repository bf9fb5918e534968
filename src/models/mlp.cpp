#include "models/mlp.h"

#include "models/bind.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"

namespace spool::models {

void DenseMlp::bind(const io::Checkpoint& ck, const std::string& prefix, int hidden, int inter) {
  gate_ = bind_matrix(ck, prefix + "gate_proj.weight", inter, hidden);
  up_ = bind_matrix(ck, prefix + "up_proj.weight", inter, hidden);
  down_ = bind_matrix(ck, prefix + "down_proj.weight", hidden, inter);
}

void DenseMlp::forward(const float* x, int64_t T, float* out, ops::ThreadPool* pool) {
  const int64_t I = gate_.rows;
  g_.resize(T * I);
  u_.resize(T * I);
  ops::matmul_multi({{&gate_, g_.data()}, {&up_, u_.data()}}, x, T, pool);  // [T, I] each
  ops::swiglu(g_.data(), u_.data(), T * I, g_.data());
  ops::matmul(down_, g_.data(), T, out, pool);  // [T, H]
}

}  // namespace spool::models
