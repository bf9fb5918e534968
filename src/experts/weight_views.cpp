#include "experts/weight_views.h"

#include <cmath>
#include <optional>
#include <cstring>

#include "common/error.h"
#include "ops/ggml_blocks.h"

namespace spool::experts {

ops::WeightView view_of(const io::TensorRef& t) {
  if (t.ggml) {  // a GGUF matrix in a ggml block type: [shape[0], prod(rest)] blocks along the rows
    if (t.shape.empty()) fail("tensor '%s' is a scalar, expected a matrix", t.name.c_str());
    if (t.data == nullptr) fail("tensor '%s': checkpoint was opened without data", t.name.c_str());
    ops::WeightView v = ops::ggml_weight_view(t.ggml_type, t.shape[0], t.shape[0] == 0 ? 0 : t.numel() / t.shape[0], t.data,
                                              t.name.c_str());
    v.col_perm = t.col_perm;
    ops::GgmlView g;
    g.type = v.ggml;
    g.rows = v.rows;
    g.cols = v.cols;
    g.data = t.data;
    g.name = t.name.c_str();
    ops::validate(g);  // supported type, whole blocks per row (the message names the type and tensor)
    return v;
  }
  ops::WeightView v;
  switch (t.dtype) {
    case io::DType::F32: v.type = ops::WType::kF32; break;
    case io::DType::BF16: v.type = ops::WType::kBF16; break;
    case io::DType::F16: v.type = ops::WType::kF16; break;
    default: fail("tensor '%s': dtype %s cannot be used as a weight", t.name.c_str(), io::dtype_name(t.dtype));
  }
  if (t.shape.empty()) fail("tensor '%s' is a scalar, expected a matrix", t.name.c_str());
  v.rows = t.shape[0];
  v.cols = t.shape[0] == 0 ? 0 : t.numel() / t.shape[0];
  v.data = t.data;
  if (v.data == nullptr) fail("tensor '%s': checkpoint was opened without data", t.name.c_str());
  return v;
}

bool codebook_ok(const float* cb, int levels) {
  float c[256];
  if (levels < 1 || levels > 256) return false;
  std::memcpy(c, cb, sizeof(float) * levels);  // may be unaligned inside the file
  for (int i = 0; i < levels; ++i)
    if (!std::isfinite(c[i]) || (i > 0 && !(c[i] > c[i - 1]))) return false;
  return true;
}

ops::WeightView quant_view_of(const io::TensorRef& qweight, const io::TensorRef& scales, const io::TensorRef* codebook,
                              const io::TensorRef* signs, int64_t rows, int64_t cols, const std::string& what, bool check_data) {
  const char* w = what.c_str();
  ops::QuantView q;
  if (codebook == nullptr) {  // q8 on its fixed grid: one byte per code
    if (scales.shape.size() == 2 && scales.shape[0] == rows && scales.shape[1] >= 1 && cols % scales.shape[1] == 0 &&
        qweight.shape != std::vector<int64_t>{rows, cols})
      fail("%s: missing codebook tensor (only q8, one byte per weight, may omit it; qweight has shape %s)", w,
           qweight.shape_str().c_str());
    q.type = ops::QType::kQ8;
  } else {
    if (codebook->shape.size() != 1) fail("%s: codebook must be 1-D, got %s", w, codebook->shape_str().c_str());
    switch (codebook->shape[0]) {
      case 3: q.type = ops::QType::kTernary; break;
      case 4: q.type = ops::QType::kQ2; break;
      case 8: q.type = ops::QType::kQ3; break;
      case 16: q.type = ops::QType::kQ4; break;
      case 32: q.type = ops::QType::kQ5; break;
      case 64: q.type = ops::QType::kQ6; break;
      case 256: q.type = ops::QType::kQ8; break;
      default: fail("%s: codebook has %lld entries (3, 4, 8, 16, 32, 64 or 256 expected)", w, (long long)codebook->shape[0]);
    }
  }
  if (scales.shape.size() != 2 || scales.shape[0] != rows || scales.shape[1] < 1 || cols % scales.shape[1] != 0)
    fail("%s: scales have shape %s, expected [%lld, G] with G dividing %lld", w, scales.shape_str().c_str(), (long long)rows,
         (long long)cols);
  q.rows = rows;
  q.cols = cols;
  q.group = static_cast<int>(cols / scales.shape[1]);
  const int64_t row_bytes = scales.shape[1] * ops::qtype_group_bytes(q.type, q.group);
  if (qweight.shape != std::vector<int64_t>{rows, row_bytes})
    fail("%s: qweight has shape %s, expected [%lld, %lld] for %d-entry codebook groups of %d", w, qweight.shape_str().c_str(),
         (long long)rows, (long long)row_bytes, ops::qtype_levels(q.type), q.group);
  if (signs != nullptr && signs->shape != std::vector<int64_t>{cols})
    fail("%s: signs have shape %s, expected [%lld]", w, signs->shape_str().c_str(), (long long)cols);
  q.qweight = qweight.data;
  q.scales = reinterpret_cast<const uint16_t*>(scales.data);
  q.codebook = codebook != nullptr ? reinterpret_cast<const float*>(codebook->data) : ops::q8_grid();
  q.signs = signs ? reinterpret_cast<const int8_t*>(signs->data) : nullptr;
  if (check_data && q.codebook != nullptr && !codebook_ok(q.codebook, ops::qtype_levels(q.type)))
    fail("%s: codebook entries are not finite and strictly ascending (corrupt file?)", w);
  if (check_data && q.signs != nullptr)
    for (int64_t i = 0; i < cols; ++i)
      if (q.signs[i] != 1 && q.signs[i] != -1)
        fail("%s: sign vector entry %lld is %d (must be +1 or -1)", w, (long long)i, static_cast<int>(q.signs[i]));
  if (q.qweight != nullptr) {
    try {
      ops::validate(q);
    } catch (const Error& e) {
      fail("%s: %s", w, e.what());
    }
  }
  return ops::quant_weight_view(q);
}

ops::WeightView bind_weight(const io::Checkpoint& ck, const std::string& base, int64_t rows, int64_t cols) {
  if (const io::TensorRef* t = ck.find(base + ".weight")) {
    if (t->shape != std::vector<int64_t>{rows, cols})
      fail("%s: tensor '%s' has shape %s, expected [%lld, %lld] (config.json and weights disagree)", ck.dir().c_str(),
           t->name.c_str(), t->shape_str().c_str(), (long long)rows, (long long)cols);
    return view_of(*t);
  }
  if (ck.find(base + ".qweight") == nullptr) fail("%s: missing tensor '%s.weight'", ck.dir().c_str(), base.c_str());
  return quant_view_of(ck.tensor(base + ".qweight"), ck.tensor(base + ".scales"), ck.find(base + ".codebook"),
                       signs_of(ck, base + ".signs"), rows, cols, ck.dir() + ": " + base);
}

const io::TensorRef* signs_of(const io::Checkpoint& ck, const std::string& name) {
  const std::optional<bool> rotated = ck.quant_rotated();
  if (!rotated)
    fail("%s: quantized tensors but config.json has no spool 'quantization' block (was the checkpoint written by spool "
         "convert?)", ck.dir().c_str());
  const io::TensorRef* t = ck.find(name);
  if (*rotated && t == nullptr)
    fail("%s: missing sign vector '%s' (config.json says rotation \"hadamard\")", ck.dir().c_str(), name.c_str());
  if (!*rotated && t != nullptr)
    fail("%s: sign vector '%s' present but config.json says rotation \"none\"", ck.dir().c_str(), name.c_str());
  return t;
}


ExpertWeights expert_views(const io::Checkpoint& ck, int layer, int expert, int hidden, int inter, bool check_data) {
  ops::WeightView v[3];
  // gpt-oss: no up projection; gate holds gate and up rows interleaved.
  const bool fused = !ck.has_expert(layer, expert, io::ExpertProj::kUp);
  const int64_t rows[3] = {fused ? 2 * static_cast<int64_t>(inter) : inter, inter, hidden}, cols[3] = {hidden, hidden, inter};
  for (int p = 0; p < 3; ++p) {
    const auto proj = static_cast<io::ExpertProj>(p);
    if (fused && proj == io::ExpertProj::kUp) continue;
    if (const io::TensorRef* b = ck.expert_part(layer, expert, proj, io::ExpertPart::kMxBlocks)) {
      const io::TensorRef* s = ck.expert_part(layer, expert, proj, io::ExpertPart::kMxScales);
      const int64_t G = cols[p] / 32;
      if (cols[p] % 32 != 0 || b->shape != std::vector<int64_t>{rows[p], G, 16})
        fail("%s: MXFP4 expert tensor '%s' has shape %s, expected [%lld, %lld, 16]", ck.dir().c_str(), b->name.c_str(),
             b->shape_str().c_str(), (long long)rows[p], (long long)G);
      if (s == nullptr) fail("%s: MXFP4 expert tensor '%s' has no E8M0 scales", ck.dir().c_str(), b->name.c_str());
      if (s->shape != std::vector<int64_t>{rows[p], G})
        fail("%s: MXFP4 scales '%s' have shape %s, expected [%lld, %lld]", ck.dir().c_str(), s->name.c_str(),
             s->shape_str().c_str(), (long long)rows[p], (long long)G);
      if (b->data == nullptr || s->data == nullptr) fail("tensor '%s': checkpoint was opened without data", b->name.c_str());
      v[p] = ops::mxfp4_weight_view(rows[p], cols[p], b->data, s->data);
      continue;
    }
    if (const io::TensorRef* t = ck.expert_part(layer, expert, proj, io::ExpertPart::kWeight)) {
      if (t->shape != std::vector<int64_t>{rows[p], cols[p]})
        fail("%s: expert tensor '%s' has shape %s, expected [%lld, %lld]", ck.dir().c_str(), t->name.c_str(),
             t->shape_str().c_str(), (long long)rows[p], (long long)cols[p]);
      v[p] = view_of(*t);
      continue;
    }
    const io::TensorRef* q = ck.expert_part(layer, expert, proj, io::ExpertPart::kQWeight);
    const io::TensorRef* s = ck.expert_part(layer, expert, proj, io::ExpertPart::kScales);
    const io::TensorRef* c = ck.expert_part(layer, expert, proj, io::ExpertPart::kCodebook);
    if (q == nullptr || s == nullptr)
      fail("%s: missing expert tensor %s", ck.dir().c_str(), io::expert_tensor_name(layer, expert, proj).c_str());
    v[p] = quant_view_of(*q, *s, c, signs_of(ck, io::expert_signs_name(layer, proj)), rows[p], cols[p],
                         ck.dir() + ": " + io::expert_tensor_name(layer, expert, proj, io::ExpertPart::kQWeight), check_data);
  }
  return {v[0], v[1], v[2]};
}

}  // namespace spool::experts
