#include "models/bind.h"

#include "common/error.h"
#include "experts/resident.h"

namespace spool::models {

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

const io::TensorRef& shaped(const io::Checkpoint& ck, const std::string& name, const std::vector<int64_t>& shape) {
  const io::TensorRef& t = ck.tensor(name);
  if (t.shape != shape)
    fail("%s: tensor '%s' has shape %s, expected %s (config.json and weights disagree)", ck.dir().c_str(), name.c_str(),
         t.shape_str().c_str(), shape_str(shape).c_str());
  return t;
}

}  // namespace

ops::WeightView bind_matrix(const io::Checkpoint& ck, const std::string& name, int64_t rows, int64_t cols) {
  return experts::view_of(shaped(ck, name, {rows, cols}));
}

std::vector<float> bind_f32(const io::Checkpoint& ck, const std::string& name, const std::vector<int64_t>& shape) {
  const io::TensorRef& t = shaped(ck, name, shape);
  std::vector<float> out(static_cast<size_t>(t.numel()));
  ops::WeightView v = experts::view_of(t);
  ops::row_to_f32(v.type, v.data, t.numel(), out.data());
  return out;
}

std::vector<float> bind_norm(const io::Checkpoint& ck, const std::string& name, int64_t n, bool one_plus) {
  std::vector<float> w = bind_f32(ck, name, {n});
  if (one_plus)
    for (float& x : w) x = 1.0f + x;
  return w;
}

void append_rows(const io::TensorRef& src, int64_t r0, int64_t n, std::vector<uint8_t>* dst) {
  const int64_t row_bytes = static_cast<int64_t>(src.nbytes / static_cast<uint64_t>(src.shape[0]));
  const uint8_t* p = src.data + r0 * row_bytes;
  dst->insert(dst->end(), p, p + n * row_bytes);
}

}  // namespace spool::models
