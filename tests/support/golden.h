// Test helpers: read golden tensors (safetensors written by transformers) and compare logits.
#pragma once

#include <algorithm>

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "io/safetensors.h"
#include "ops/weights.h"

namespace spool::testing {

/// Directory of the build tree's copy of tests/data.
inline std::string data_dir() { return SPOOL_TEST_DATA_DIR; }

/// Tensor `t` of `f` as f32: F32 as stored, BF16 widened exactly. std::runtime_error naming
/// `name` for another dtype.
inline std::vector<float> tensor_f32(const io::SafetensorsFile& f, const io::TensorInfo& t, const std::string& name) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  if (t.dtype == io::DType::F32) {
    std::memcpy(v.data(), f.data(t), t.nbytes);
  } else if (t.dtype == io::DType::BF16) {
    const uint8_t* p = f.data(t);
    for (size_t i = 0; i < v.size(); ++i) v[i] = ops::bf16_to_f32(static_cast<uint16_t>(p[2 * i] | (p[2 * i + 1] << 8)));
  } else {
    throw std::runtime_error(name + " is neither F32 nor BF16");
  }
  return v;
}

/// A golden safetensors file with typed accessors.
class Golden {
 public:
  explicit Golden(const std::string& path) : f_(io::SafetensorsFile::open(path)) {}
  std::vector<float> f32(const std::string& name) const { return tensor_f32(f_, get(name), name); }
  std::vector<int32_t> i32(const std::string& name) const {
    const io::TensorInfo& t = get(name);
    std::vector<int32_t> v(static_cast<size_t>(t.numel()));
    if (t.dtype == io::DType::I32) {
      std::memcpy(v.data(), f_.data(t), t.nbytes);
    } else {
      EXPECT_EQ(t.dtype, io::DType::I64) << name;
      const int64_t* p = reinterpret_cast<const int64_t*>(f_.data(t));
      for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int32_t>(p[i]);
    }
    return v;
  }
  std::vector<int64_t> shape(const std::string& name) const { return get(name).shape; }
  bool has(const std::string& name) const { return f_.find(name) != nullptr; }

 private:
  const io::TensorInfo& get(const std::string& name) const {
    const io::TensorInfo* t = f_.find(name);
    if (t == nullptr) throw std::runtime_error("golden tensor missing: " + name);
    return *t;
  }
  io::SafetensorsFile f_;
};

/// Row r of [rows, cols]: {max |got - ref|, max |ref|}.
inline std::pair<double, double> row_diff(const float* got, const float* ref, int64_t r, int64_t cols) {
  double md = 0.0, mr = 0.0;
  for (int64_t c = 0; c < cols; ++c) {
    md = std::max(md, std::fabs(static_cast<double>(got[r * cols + c]) - ref[r * cols + c]));
    mr = std::max(mr, std::fabs(static_cast<double>(ref[r * cols + c])));
  }
  return {md, mr};
}

/// The worst row's max |got - ref| / max |ref| over [rows, cols] (max |got - ref| for a row
/// whose ref is all zero).
inline double max_row_ratio(const std::vector<float>& got, const std::vector<float>& ref, int64_t rows, int64_t cols) {
  double worst = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    const auto [md, mr] = row_diff(got.data(), ref.data(), r, cols);
    worst = std::max(worst, mr > 0 ? md / mr : md);
  }
  return worst;
}

/// Per row r of [rows, cols]: max |got - ref| <= tol * max |ref|. Returns the worst ratio
/// max|d| / max|ref| over rows; reports the first failing row.
inline double expect_rows_close(const float* got, const float* ref, int64_t rows, int64_t cols, double tol,
                                const std::string& what) {
  double worst = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    const auto [md, mr] = row_diff(got, ref, r, cols);
    const double ratio = mr > 0 ? md / mr : md;
    worst = std::max(worst, ratio);
    EXPECT_LE(ratio, tol) << what << ": row " << r << " max|diff| " << md << " max|ref| " << mr;
    if (ratio > tol) break;
  }
  return worst;
}

/// The whole of `got` against `ref` (same size, every element of got finite): max |got - ref|
/// <= tol * max |ref|. Returns max |got - ref| / max |ref| (max |got - ref| when ref is all zero).
inline double expect_max_rel_close(const std::vector<float>& got, const std::vector<float>& ref, double tol) {
  EXPECT_EQ(got.size(), ref.size());
  if (got.size() != ref.size()) return INFINITY;
  for (size_t i = 0; i < got.size(); ++i)
    if (!std::isfinite(got[i])) {
      ADD_FAILURE() << "element " << i << " is " << got[i];
      return INFINITY;
    }
  const auto [md, mr] = row_diff(got.data(), ref.data(), 0, static_cast<int64_t>(got.size()));
  EXPECT_LE(md, tol * mr) << "max |diff| " << md << ", max |ref| " << mr;
  return mr > 0 ? md / mr : md;
}

/// Index of the largest element (first on ties), as torch.argmax.
inline int32_t argmax(const float* x, int64_t n) {
  int64_t b = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[b]) b = i;
  return static_cast<int32_t>(b);
}

/// The greedy pick behind the tiny fixtures' `greedy_ids`: tests/reference/make_fixtures*.py ran
/// transformers' generate with min_new_tokens = max_new_tokens, whose MinNewTokensLengthLogitsProcessor
/// sets every EOS logit to -inf at each step, so the argmax (first on ties) runs over the other
/// tokens. `eos`: the model's EOS ids (ModelSpec::eos_token_ids). A model whose best token is EOS
/// (the 16-expert ERNIE fixture's first step) continues with its second best, as transformers does.
inline int32_t argmax_except(const float* x, int64_t n, const std::vector<int64_t>& eos) {
  auto banned = [&](int64_t i) { return std::find(eos.begin(), eos.end(), i) != eos.end(); };
  int64_t b = -1;
  for (int64_t i = 0; i < n; ++i)
    if (!banned(i) && (b < 0 || x[i] > x[b])) b = i;
  return static_cast<int32_t>(b < 0 ? 0 : b);
}

}  // namespace spool::testing
