// Placement (TokenMixer::place, Ffn::place, DecoderModel's own weights) on a CPU-only machine. A
// layer that forgets to upload a weight still computes the right answer on the CPU (upload is the
// identity there) and, on CUDA, only slows down (the weight is staged over PCIe on every call;
// strict device mode catches it, but only on a GPU). PlacementCheckBackend makes the mistake
// visible here: it is a CpuBackend whose upload() / upload_floats() return copies in memory it
// owns, as a device backend's would, and whose ops that read a weight or a per-layer parameter
// vector record every one that is not such a copy. Every fixture checkpoint and the demo model run a
// prefill and a decode step (and the demo model its multi-token-prediction head) on it: no op may read a weight the model did not place (routed experts excepted:
// they come from the ExpertProvider, not place(); the contract's host arrays too: router
// selection bias, per-expert scales, attention sinks), and the logits equal CpuBackend's bit for
// bit (the copies are the weights the model reads).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <vector>

#include "support/golden.h"  // data_dir
#include "support/mtp.h"
#include "models/family.h"
#include "models/model.h"
#include "ops/cpu_backend.h"
#include "ops/thread_pool.h"

namespace spool::models {
namespace {

using spool::testing::data_dir;

// A CpuBackend whose uploads are copies it owns (as on a device), recording each op that reads a
// weight or parameter vector that is not one of them. Host memory and CpuBackend's kernels
// throughout: the results are CpuBackend's.
class PlacementCheckBackend final : public ops::CpuBackend {
 public:
  using CpuBackend::CpuBackend;

  ops::WeightView upload(const ops::WeightView& w) override {
    const uint64_t bytes = ops::packed_weight_bytes(w);
    uint8_t* dst = own(bytes);
    return ops::pack_weight(w, dst, ops::Device::kCpu, [](void* to, const void* from, size_t n) { std::memcpy(to, from, n); });
  }
  const float* upload_floats(std::span<const float> v) override {
    if (v.empty()) return v.data();
    float* dst = reinterpret_cast<float*>(own(v.size_bytes()));
    std::copy(v.begin(), v.end(), dst);
    return dst;
  }

  void matmul(const ops::WeightView& w, const float* x, int64_t T, float* y) override {
    check("matmul", w);
    CpuBackend::matmul(w, x, T, y);
  }
  void matmul_multi(std::span<const ops::MatmulOut> outs, const float* x, int64_t T) override {
    for (const ops::MatmulOut& o : outs) check("matmul_multi", *o.w);
    CpuBackend::matmul_multi(outs, x, T);
  }
  void expert_ffn(std::span<const ops::ExpertMats> experts, const ops::ExpertGroups& groups, size_t g0, const float* x,
                  int64_t H, ops::Activation act, float* y) override {
    for (const ops::ExpertMats& e : experts) {  // the matrices are the provider's; the biases the layer's
      check("expert_ffn (gate_bias)", e.gate_bias);
      check("expert_ffn (down_bias)", e.down_bias);
    }
    CpuBackend::expert_ffn(experts, groups, g0, x, H, act, y);
  }
  void causal_conv1d_silu(const float* x, int64_t T, int64_t C, const float* w, int K, float* state, float* out) override {
    check("causal_conv1d_silu", w);
    CpuBackend::causal_conv1d_silu(x, T, C, w, K, state, out);
  }
  void gdn_gates(const float* b, const float* a, const float* a_exp, const float* dt_bias, int64_t T, int n_v, float* beta,
                 float* g) override {
    check("gdn_gates (a_exp)", a_exp);
    check("gdn_gates (dt_bias)", dt_bias);
    CpuBackend::gdn_gates(b, a, a_exp, dt_bias, T, n_v, beta, g);
  }
  void rms_norm(const float* x, const float* w, int64_t rows, int64_t n, float eps, float* y) override {
    check("rms_norm", w);
    CpuBackend::rms_norm(x, w, rows, n, eps, y);
  }
  void rms_norm_gated(float* x, const float* z, const float* w, int64_t rows, int64_t n, float eps) override {
    check("rms_norm_gated", w);
    CpuBackend::rms_norm_gated(x, z, w, rows, n, eps);
  }
  void add_bias(float* y, const float* b, int64_t rows, int64_t n) override {
    check("add_bias", b);
    CpuBackend::add_bias(y, b, rows, n);
  }
  void add_gated_rows(float* out, const float* s, const float* x, const float* w, int64_t T, int64_t n) override {
    check("add_gated_rows", w);
    CpuBackend::add_gated_rows(out, s, x, w, T, n);
  }

  /// Each read of a weight or parameter vector that was not placed: "op: what" (one entry per op
  /// and weight shape, in the order first seen).
  const std::vector<std::string>& unplaced() const { return unplaced_; }

 private:
  uint8_t* own(uint64_t bytes) {
    // 256-byte aligned, as pack_weight lays out its parts (packed_weight_bytes counts them whole)
    auto* p = static_cast<uint8_t*>(::operator new(std::max<uint64_t>(bytes, 1), std::align_val_t(256)));
    blocks_.push_back(std::unique_ptr<uint8_t, Free>(p));
    ranges_.push_back({p, p + bytes});
    return p;
  }
  bool owned(const void* p) const {
    const auto* b = static_cast<const uint8_t*>(p);
    return std::any_of(ranges_.begin(), ranges_.end(), [b](const Range& r) { return b >= r.lo && b < r.hi; });
  }
  void note(const std::string& what) {
    if (std::find(unplaced_.begin(), unplaced_.end(), what) == unplaced_.end()) unplaced_.push_back(what);
  }
  void check(const char* op, const ops::WeightView& w) {
    const void* p = w.data != nullptr ? w.data : static_cast<const void*>(w.quant.qweight);
    if (p != nullptr && !owned(p))
      note(std::string(op) + ": weight [" + std::to_string(w.rows) + ", " + std::to_string(w.cols) + "]" +
           (w.name ? std::string(" ") + w.name : std::string()));
  }
  void check(const char* op, const float* v) {  // null: the op's optional vector is absent
    if (v != nullptr && !owned(v)) note(std::string(op) + ": parameter vector");
  }

  struct Free {
    void operator()(uint8_t* p) const { ::operator delete(p, std::align_val_t(256)); }
  };
  struct Range {
    const uint8_t *lo, *hi;
  };
  std::vector<std::unique_ptr<uint8_t, Free>> blocks_;
  std::vector<Range> ranges_;
  std::vector<std::string> unplaced_;
};

// Logits of a prefill of `ids` (every position) and of one decode step after it.
std::vector<float> prefill_and_step(Model& m, const std::vector<int32_t>& ids) {
  const int64_t V = m.spec().vocab_size;
  State st = m.new_state();
  std::vector<float> out((ids.size() + 1) * V);
  m.forward(std::span<const int32_t>(ids.data(), ids.size()), st, LogitsMode::kAll, out.data());
  const int32_t next = ids.front();
  m.forward(std::span<const int32_t>(&next, 1), st, LogitsMode::kLast, out.data() + ids.size() * V);
  return out;
}

// Every checkpoint the tests have: each fixture under tests/data/models (a directory with a
// config.json: a new family's fixture is checked without being listed here) and the demo model.
std::vector<std::string> checkpoints() {
  std::vector<std::string> dirs;
  for (const auto& e : std::filesystem::directory_iterator(data_dir() + "/models"))
    if (std::filesystem::exists(e.path() / "config.json")) dirs.push_back(e.path().string());
  std::sort(dirs.begin(), dirs.end());
  dirs.push_back(SPOOL_DEFAULT_MODEL_DIR);
  return dirs;
}

class Placement : public ::testing::TestWithParam<std::string> {};

TEST_P(Placement, EveryWeightALayerReadsWasPlaced) {
  const std::string& dir = GetParam();
  io::Checkpoint::Options opt;
  opt.mtp = true;  // with its multi-token-prediction head where it has one (the demo model)
  auto ckpt = std::make_shared<io::Checkpoint>(models::open_checkpoint(dir, opt));
  const std::vector<int32_t> ids = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};  // past the gpt-oss fixtures' window of 8
  ops::ThreadPool pool(2);
  auto check = std::make_shared<PlacementCheckBackend>(&pool);
  auto placed = load_model(ckpt, check);
  std::vector<float> got = prefill_and_step(*placed, ids);
  if (placed->mtp_layers() > 0) {  // the head's own weights (DecoderModel's place)
    const std::vector<float> head = spool::testing::head_logits(*placed, ids);
    got.insert(got.end(), head.begin(), head.end());
  }
  std::string list;
  for (const std::string& s : check->unplaced()) list += "\n  " + s;
  EXPECT_TRUE(check->unplaced().empty()) << dir << ": ops read weights that place() did not upload:" << list;
  auto cpu = load_model(ckpt, std::make_shared<ops::CpuBackend>(&pool));
  std::vector<float> want = prefill_and_step(*cpu, ids);
  if (cpu->mtp_layers() > 0) {
    const std::vector<float> head = spool::testing::head_logits(*cpu, ids);
    want.insert(want.end(), head.begin(), head.end());
  }
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << "logits on the placed copies differ from CpuBackend's";
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, Placement, ::testing::ValuesIn(checkpoints()),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string n = std::filesystem::path(i.param).filename().string();
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// The enumeration found the fixtures (a data directory that did not unpack would leave the
// suite above empty rather than failing).
TEST(Placement, EveryFixtureIsChecked) { EXPECT_GE(checkpoints().size(), 22u); }

}  // namespace
}  // namespace spool::models
