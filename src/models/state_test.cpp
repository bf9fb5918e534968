// models::State's snapshot / restore / truncate / serialize on real models (tiny fixtures with
// and without Gated DeltaNet layers, and the demo model): every way of bringing a state back to
// a position and continuing gives logits bit-identical to a fresh run with the same chunks, and
// every bad input throws spool::Error and leaves the state as it was.
#include "models/state.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "models/model.h"

namespace spool::models {
namespace {

struct Loaded {
  std::shared_ptr<io::Checkpoint> ckpt;
  std::unique_ptr<ops::ThreadPool> pool;
  std::unique_ptr<Model> model;
};

std::string model_dir(const std::string& name) {
  return name == "demo" ? std::string(SPOOL_DEFAULT_MODEL_DIR) : std::string(SPOOL_TEST_DATA_DIR) + "/models/" + name;
}

Loaded& get(const std::string& name) {
  static std::map<std::string, Loaded> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  Loaded l;
  l.ckpt = std::make_shared<io::Checkpoint>(io::Checkpoint::open(model_dir(name)));
  l.pool = std::make_unique<ops::ThreadPool>(2);
  l.model = load_model(l.ckpt, l.pool.get());
  return cache.emplace(name, std::move(l)).first->second;
}

// Deterministic token ids: `n` of them starting at `seed`, all below the vocabulary size.
std::vector<int32_t> tokens(const Model& m, int n, int seed) {
  std::vector<int32_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = static_cast<int32_t>((seed + 37 * i + i * i) % m.spec().vocab_size);
  return v;
}

// Runs `ids` as one forward call and returns the last position's logits.
std::vector<float> run(Model& m, State& st, const std::vector<int32_t>& ids) {
  std::vector<float> logits(m.spec().vocab_size);
  m.forward(ids, st, LogitsMode::kLast, logits.data());
  return logits;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::string image(const State& st) {
  std::string s;
  st.serialize(s);
  return s;
}

class StateOps : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    m_ = get(GetParam()).model.get();
    prefix_ = tokens(*m_, 11, 3);
    rest_ = tokens(*m_, 6, 101);
    other_ = tokens(*m_, 9, 55);
    State fresh = m_->new_state();
    run(*m_, fresh, prefix_);
    want_ = run(*m_, fresh, rest_);  // a fresh run: prefix, then rest
  }
  Model* m_ = nullptr;
  std::vector<int32_t> prefix_, rest_, other_;
  std::vector<float> want_;
};

TEST_P(StateOps, SnapshotRestoreContinuesBitForBit) {
  State st = m_->new_state();
  run(*m_, st, prefix_);
  const StateSnapshot snap = st.snapshot();
  EXPECT_EQ(snap.pos(), static_cast<int64_t>(prefix_.size()));
  EXPECT_FALSE(snap.has_kv());
  run(*m_, st, other_);  // a different continuation, then back
  st.restore(snap);
  EXPECT_EQ(st.pos, snap.pos());
  EXPECT_TRUE(same_bits(run(*m_, st, rest_), want_));
  // The same snapshot again (it is still valid: the state was rewound to its position, not below).
  run(*m_, st, other_);
  st.restore(snap);
  EXPECT_TRUE(same_bits(run(*m_, st, rest_), want_));
}

TEST_P(StateOps, SnapshotWithKvRestoresIntoAnotherState) {
  State st = m_->new_state();
  run(*m_, st, prefix_);
  const StateSnapshot snap = st.snapshot(/*with_kv=*/true);
  EXPECT_TRUE(snap.has_kv());
  State other = m_->new_state();
  run(*m_, other, other_);  // holds other rows that must be replaced
  other.restore(snap);
  EXPECT_TRUE(same_bits(run(*m_, other, rest_), want_));
  // A KV-less snapshot of another state is refused and changes nothing.
  State third = m_->new_state();
  run(*m_, third, other_);
  const std::string before = image(third);
  EXPECT_THROW(third.restore(st.snapshot()), Error);
  EXPECT_EQ(image(third), before);
}

TEST_P(StateOps, StaleSnapshotIsRefused) {
  State st = m_->new_state();
  run(*m_, st, prefix_);
  const StateSnapshot early = st.snapshot();
  run(*m_, st, rest_);
  const StateSnapshot late = st.snapshot();
  st.restore(early);     // rewinds below `late`: its KV rows are overwritten by the next forward
  run(*m_, st, other_);
  const std::string before = image(st);
  try {
    st.restore(late);
    ADD_FAILURE() << "a stale snapshot was restored";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("stale"), std::string::npos) << e.what();
  }
  EXPECT_EQ(image(st), before);
  st.reset();
  EXPECT_THROW(st.restore(early), Error);  // reset() rewinds to 0
  EXPECT_THROW(st.restore(StateSnapshot()), Error);
}

TEST_P(StateOps, SnapshotBytesDoNotGrowWithThePrefix) {
  State st = m_->new_state();
  run(*m_, st, prefix_);
  const StateSnapshot a = st.snapshot(), ak = st.snapshot(true);
  run(*m_, st, rest_);
  const StateSnapshot b = st.snapshot(), bk = st.snapshot(true);
  EXPECT_EQ(a.bytes(), b.bytes());
  EXPECT_GT(ak.bytes(), a.bytes());
  EXPECT_GE(bk.bytes(), ak.bytes());
}

TEST_P(StateOps, TruncateCutsAttentionOnlyStateAndRefusesRecurrentState) {
  State st = m_->new_state();
  run(*m_, st, prefix_);
  run(*m_, st, other_);
  const int64_t n = static_cast<int64_t>(prefix_.size());
  if (!st.has_recurrent()) {
    st.truncate(n);
    EXPECT_EQ(st.pos, n);
    EXPECT_TRUE(same_bits(run(*m_, st, rest_), want_));
    return;
  }
  const std::string before = image(st);
  try {
    st.truncate(n);
    ADD_FAILURE() << "truncated a state with recurrent layers";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("restore"), std::string::npos) << e.what();
  }
  EXPECT_EQ(image(st), before);
  st.truncate(st.pos);  // a no-op is fine
  EXPECT_EQ(image(st), before);
  EXPECT_THROW(st.truncate(st.pos + 1), Error);
  st.truncate(0);
  EXPECT_EQ(st.pos, 0);
  run(*m_, st, prefix_);
  EXPECT_TRUE(same_bits(run(*m_, st, rest_), want_));
}

TEST_P(StateOps, SerializeDeserializeGivesTheSameNextLogits) {
  State st = m_->new_state();
  run(*m_, st, prefix_);
  const int64_t n = static_cast<int64_t>(prefix_.size());
  const std::string img = image(st);
  const StateSnapshot snap = st.snapshot();
  run(*m_, st, other_);
  std::string at;
  st.serialize(snap, at);  // the image at the snapshot, taken later
  EXPECT_EQ(at, img);
  State fresh = m_->new_state();
  fresh.deserialize(img, n);
  EXPECT_EQ(fresh.pos, n);
  EXPECT_TRUE(same_bits(run(*m_, fresh, rest_), want_));
  // Into a state that already holds other positions, and with rows beyond n left behind.
  st.deserialize(img, n);
  EXPECT_TRUE(same_bits(run(*m_, st, rest_), want_));
}

TEST_P(StateOps, BadImagesThrowAndLeaveTheStateUntouched) {
  State src = m_->new_state();
  run(*m_, src, prefix_);
  const int64_t n = static_cast<int64_t>(prefix_.size());
  const std::string img = image(src);
  State st = m_->new_state();
  run(*m_, st, other_);
  const std::string before = image(st);
  auto expect_refused = [&](const std::string& bad, int64_t want_n, const char* needle) {
    try {
      st.deserialize(bad, want_n);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_EQ(image(st), before) << needle;
  };
  expect_refused(img.substr(0, img.size() - 1), n, "truncated");
  expect_refused(img.substr(0, 10), n, "truncated");
  expect_refused("", n, "magic");
  expect_refused(img + "x", n, "after its last layer");
  expect_refused(img, n + 1, "expected");
  std::string bad = img;
  bad[0] = 'X';
  expect_refused(bad, n, "magic");
  bad = img;
  bad[4] = 2;  // version
  expect_refused(bad, n, "version");
  bad = img;
  bad[16] = static_cast<char>(bad[16] + 1);  // layer count
  expect_refused(bad, n, "layers");
  bad = img;
  bad[20] = 7;  // first layer's kind
  expect_refused(bad, n, "kind");
  // Another KV type (--kv-bits) and another model's geometry.
  State f16(m_->spec(), ops::KvType::kF16);
  EXPECT_THROW(f16.deserialize(img, n), Error);
  try {
    f16.deserialize(img, n);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kv-bits"), std::string::npos) << e.what();
  }
  // A model of another geometry (the glm4_moe, minimax_m2 and ernie4_5_moe fixtures cache exactly
  // what the qwen3_moe fixture caches: 3 layers of 2 KV heads x 16, so its image is a valid one for them).
  const bool like_qwen3_moe = GetParam() == "glm4_moe" || GetParam() == "minimax_m2" || GetParam() == "ernie4_5_moe";
  const std::string other_model = GetParam() == "qwen3_moe" ? "qwen3_next" : like_qwen3_moe ? "olmoe" : "qwen3_moe";
  Model& o = *get(other_model).model;
  State os = o.new_state();
  run(o, os, tokens(o, static_cast<int>(n), 3));
  std::string oimg = image(os);
  expect_refused(oimg, n, "state image");
  // The state still continues as before.
  State ref = m_->new_state();
  run(*m_, ref, other_);
  EXPECT_TRUE(same_bits(run(*m_, st, rest_), run(*m_, ref, rest_)));
}

TEST_P(StateOps, QuantizedKvImagesRoundTrip) {
  for (ops::KvType t : {ops::KvType::kF16, ops::KvType::kI8}) {
    State a(m_->spec(), t), b(m_->spec(), t);
    run(*m_, a, prefix_);
    std::string img;
    a.serialize(img);
    b.deserialize(img, static_cast<int64_t>(prefix_.size()));
    EXPECT_EQ(image(b), img);
    EXPECT_TRUE(same_bits(run(*m_, b, rest_), run(*m_, a, rest_)));
  }
}

// qwen3_moe: attention only; qwen3_next: alternating; qwen3_5_moe_text and the demo: mostly GDN.
INSTANTIATE_TEST_SUITE_P(Models, StateOps, ::testing::Values("qwen3_moe", "qwen3_next", "qwen3_5_moe_text", "demo", "mixtral",
                                                                  "olmoe", "deepseek_v3", "deepseek_v2_lite", "glm4_moe",
                                                                  "glm4_moe_lite", "minimax_m2", "gpt_oss", "gpt_oss_mxfp4",
                                                                  "ernie4_5_moe"));

}  // namespace
}  // namespace spool::models
