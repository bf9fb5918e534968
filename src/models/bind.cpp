#include "models/bind.h"

#include <cstring>

#include "common/error.h"
#include "experts/weight_views.h"
#include "ops/ggml_blocks.h"

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

thread_local lora::LoraSet* t_lora = nullptr;  // LoraBindScope

ops::WeightView with_lora(ops::WeightView v, const std::string& name) {
  if (t_lora != nullptr) v.lora = t_lora->dense(name, v.rows, v.cols);
  return v;
}

}  // namespace

LoraBindScope::LoraBindScope(lora::LoraSet* set) {
  if (t_lora != nullptr) fail("LoraBindScope: a scope is already open on this thread");
  t_lora = set;
}

LoraBindScope::~LoraBindScope() { t_lora = nullptr; }

lora::LoraSet* lora_binding() { return t_lora; }

ops::WeightView bind_matrix(const io::Checkpoint& ck, const std::string& name, int64_t rows, int64_t cols) {
  const std::string suffix = ".weight";
  if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
    return with_lora(experts::bind_weight(ck, name.substr(0, name.size() - suffix.size()), rows, cols), name);
  return with_lora(experts::view_of(shaped(ck, name, {rows, cols})), name);
}

ops::WeightView bind_float_matrix(const io::Checkpoint& ck, const std::string& name, int64_t rows, int64_t cols) {
  if (ck.find(name) == nullptr) {
    const std::string base = name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0 ? name.substr(0, name.size() - 7) : name;
    if (ck.find(base + ".qweight") != nullptr)
      fail("%s: '%s' is quantized, but it must be stored as F32/F16/BF16 (spool convert keeps it in bf16)", ck.dir().c_str(),
           name.c_str());
  }
  return with_lora(experts::view_of(shaped(ck, name, {rows, cols})), name);
}

std::vector<const io::TensorRef*> embed_row_tensors(const io::Checkpoint& ck) {
  if (const io::TensorRef* t = ck.find("embed_tokens.weight")) return {t};
  const io::TensorRef *q = ck.find("embed_tokens.qweight"), *s = ck.find("embed_tokens.scales");
  if (q != nullptr && s != nullptr) return {q, s};
  return {};
}

std::vector<float> bind_f32(const io::Checkpoint& ck, const std::string& name, const std::vector<int64_t>& shape) {
  const io::TensorRef& t = shaped(ck, name, shape);
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (t.ggml) {  // a small GGUF tensor in a block type (the loader converts most of them already)
    if (t.data == nullptr) fail("tensor '%s': checkpoint was opened without data", t.name.c_str());
    ops::ggml_dequantize_row(t.ggml_type, t.data, t.numel(), out.data());
    return out;
  }
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

ops::WeightView gather_rows(const ops::WeightView& src, const std::vector<std::pair<int64_t, int64_t>>& ranges,
                            std::vector<uint8_t>* storage) {
  if (src.lora != nullptr) fail("gather_rows: a matrix with LoRA terms cannot be regrouped (its B rows would not follow)");
  int64_t rows = 0;
  for (auto [r0, n] : ranges) {
    if (r0 < 0 || n < 0 || r0 + n > src.rows) fail("gather_rows: rows [%lld, %lld) outside %lld", (long long)r0, (long long)(r0 + n), (long long)src.rows);
    rows += n;
  }
  ops::WeightView v = src;
  v.rows = rows;
  if (src.type != ops::WType::kQuant) {
    const int64_t rb = src.type == ops::WType::kGgml ? static_cast<int64_t>(ggml_row_bytes(src.ggml, static_cast<uint64_t>(src.cols)))
                                                      : src.cols * ops::wtype_size(src.type);
    storage->resize(static_cast<size_t>(rows * rb));
    int64_t at = 0;
    for (auto [r0, n] : ranges) {
      std::memcpy(storage->data() + at * rb, static_cast<const uint8_t*>(src.data) + r0 * rb, n * rb);
      at += n;
    }
    v.data = storage->data();
    return v;
  }
  const ops::QuantView& q = src.quant;
  const int64_t qb = q.row_bytes(), sb = q.groups_per_row() * 2;
  storage->resize(static_cast<size_t>(rows * (qb + sb)));
  uint8_t* codes = storage->data();
  uint8_t* scales = storage->data() + rows * qb;  // may be unaligned: QuantView readers use memcpy loads
  int64_t at = 0;
  for (auto [r0, n] : ranges) {
    std::memcpy(codes + at * qb, q.qweight + r0 * qb, n * qb);
    std::memcpy(scales + at * sb, reinterpret_cast<const uint8_t*>(q.scales) + r0 * sb, n * sb);
    at += n;
  }
  v.quant.rows = rows;
  v.quant.qweight = codes;
  v.quant.scales = reinterpret_cast<const uint16_t*>(scales);
  return v;
}

}  // namespace spool::models
