// models::State's snapshot / restore / truncate / serialize on real models (tiny fixtures with
// and without Gated DeltaNet layers, and the demo model): every way of bringing a state back to
// a position and continuing gives logits bit-identical to a fresh run with the same chunks, and
// every bad input throws spool::Error and leaves the state as it was. Sliding-window models
// (gpt-oss, and Mixtral with a window of 6: "mixtral_w6") keep bounded caches: they give the
// logits of an unbounded cache bit for bit, hold at most KvCache::window_rows rows, and their
// snapshots / images / truncation follow the window.
#include "models/state.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "models/family.h"
#include "models/model.h"
#include "ops/cpu_backend.h"

namespace spool::models {
namespace {

struct Loaded {
  std::shared_ptr<io::Checkpoint> ckpt;
  std::unique_ptr<ops::ThreadPool> pool;
  std::unique_ptr<Model> model;
};

// "mixtral_w6": the mixtral fixture (sliding_window null) run with a window of 6.
constexpr int64_t kMixtralWindow = 6;

std::string model_dir(const std::string& name) {
  if (name == "mixtral_w6") return std::string(SPOOL_TEST_DATA_DIR) + "/models/mixtral";
  return name == "demo" ? std::string(SPOOL_DEFAULT_MODEL_DIR) : std::string(SPOOL_TEST_DATA_DIR) + "/models/" + name;
}

Loaded& get(const std::string& name) {
  static std::map<std::string, Loaded> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  Loaded l;
  l.ckpt = std::make_shared<io::Checkpoint>(models::open_checkpoint(model_dir(name)));
  l.pool = std::make_unique<ops::ThreadPool>(2);
  if (name == "mixtral_w6") {
    ModelSpec spec = build_spec(*l.ckpt);
    spec.attn.sliding_window = kMixtralWindow;
    l.model = family_named(spec.family)->load(l.ckpt, spec, std::make_shared<ops::CpuBackend>(l.pool.get()));
  } else {
    l.model = load_model(l.ckpt, l.pool.get());
  }
  return cache.emplace(name, std::move(l)).first->second;
}

// The same model's state with every cache unbounded (attention still masks by the window).
State unbounded_state(const Model& m, ops::KvType kv = ops::KvType::kF32) {
  ModelSpec s = m.spec();
  s.attn.window_bounds_kv = false;
  return State(s, kv);
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
  // (A KV-less snapshot already holds the sliding-window layers' rows: with_kv adds the others.)
  const bool unbounded = std::any_of(st.attn.begin(), st.attn.end(), [](const AttnCache& c) { return c.head_dim() > 0 && c.window() == 0; });
  if (unbounded) {
    EXPECT_GT(ak.bytes(), a.bytes());
  }
  EXPECT_GE(ak.bytes(), a.bytes());
  EXPECT_GE(bk.bytes(), ak.bytes());
}

TEST_P(StateOps, TruncateCutsAttentionOnlyStateAndRefusesRecurrentState) {
  State st = m_->new_state();
  run(*m_, st, prefix_);
  run(*m_, st, other_);
  const int64_t n = static_cast<int64_t>(prefix_.size());
  if (st.truncates_freely()) {
    st.truncate(n);
    EXPECT_EQ(st.pos, n);
    EXPECT_TRUE(same_bits(run(*m_, st, rest_), want_));
    return;
  }
  if (!st.has_recurrent()) {
    // Sliding-window layers: back to n while its window's rows are held (they are: the window
    // moved on by fewer than 9 positions), not to a position whose rows were dropped.
    ASSERT_TRUE(st.has_windowed_kv());
    const std::string before = image(st);
    try {
      st.truncate(1);
      ADD_FAILURE() << "truncated past the rows a sliding window still holds";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("sliding window"), std::string::npos) << e.what();
    }
    EXPECT_EQ(image(st), before);
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
  bad[4] = 3;  // version
  expect_refused(bad, n, "version");
  bad[4] = 1;  // the previous version (every position of every layer): refused, not misread
  expect_refused(bad, n, "older spool");
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
                                                                  "ernie4_5_moe", "mixtral_w6"));

// ---- Sliding-window models: bounded caches ----------------------------------------------------

class Windowed : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    m_ = get(GetParam()).model.get();
    W_ = m_->spec().attn.sliding_window;
    ASSERT_GT(W_, 0);
    ASSERT_TRUE(m_->spec().attn.window_bounds_kv);
  }
  // Greedy decoding from `prompt` for `steps` tokens (prompt prefilled in chunks of `chunk`),
  // every forward's last logits appended to `logits`; asserts the windowed layers' capacity
  // bound after every forward.
  std::vector<int32_t> generate(State& st, const std::vector<int32_t>& prompt, int64_t chunk, int steps,
                                std::vector<std::vector<float>>& logits) {
    std::vector<int32_t> out;
    int64_t largest = 0;
    auto step = [&](const std::vector<int32_t>& ids) {
      logits.push_back(run(*m_, st, ids));
      largest = std::max<int64_t>(largest, static_cast<int64_t>(ids.size()));
      for (size_t l = 0; l < st.attn.size(); ++l) {
        if (st.attn[l].window() == 0) continue;
        EXPECT_LE(st.attn[l].capacity(), ops::KvCache::window_rows(W_, largest)) << "layer " << l << " at " << st.pos;
        EXPECT_TRUE(st.attn[l].holds(st.pos));
      }
    };
    for (size_t i = 0; i < prompt.size(); i += static_cast<size_t>(chunk))
      step(std::vector<int32_t>(prompt.begin() + i, prompt.begin() + std::min(prompt.size(), i + static_cast<size_t>(chunk))));
    for (int s = 0; s < steps; ++s) {
      const std::vector<float>& l = logits.back();
      const int32_t next = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
      out.push_back(next);
      step({next});
    }
    return out;
  }
  Model* m_ = nullptr;
  int64_t W_ = 0;
};

// 40+ positions (5+ windows of the fixtures) in three chunkings: one prefill of the whole
// prompt, a prompt then greedy decoding, token by token. The bounded cache gives the unbounded
// cache's logits bit for bit, holds at most window_rows(W, largest chunk) rows in its windowed
// layers and a fraction of the unbounded bytes.
TEST_P(Windowed, BoundedCacheGivesTheUnboundedLogitsBitForBit) {
  const std::vector<int32_t> prompt = tokens(*m_, 44, 7);
  for (int64_t chunk : {44, 12, 1}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    const int steps = chunk == 44 ? 12 : 30;  // (past W - 1 + 44 rows: the one-prefill cache moves too)
    std::vector<std::vector<float>> got, want;
    State bounded = m_->new_state(), unbounded = unbounded_state(*m_);
    ASSERT_TRUE(bounded.has_windowed_kv());
    ASSERT_FALSE(unbounded.has_windowed_kv());
    const std::vector<int32_t> a = generate(bounded, prompt, chunk, steps, got);
    const std::vector<int32_t> b = generate(unbounded, prompt, chunk, steps, want);
    EXPECT_EQ(a, b);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(same_bits(got[i], want[i])) << "forward " << i;
    EXPECT_GE(bounded.pos, 48);
    for (size_t l = 0; l < bounded.attn.size(); ++l) {
      if (bounded.attn[l].window() == 0) {
        EXPECT_EQ(bounded.attn[l].capacity(), unbounded.attn[l].capacity()) << l;  // full attention: unchanged
        continue;
      }
      EXPECT_GT(bounded.attn[l].base(), 0) << l;  // rows were dropped
      EXPECT_LE(bounded.attn[l].capacity(), ops::KvCache::window_rows(W_, chunk)) << l;
    }
    EXPECT_LT(bounded.bytes(), unbounded.bytes());
  }
}

// Snapshots (with and without KV), images and truncation with windowed layers, past the
// window: the snapshot carries the window's rows, so restoring it after the window moved on
// (its live rows overwritten) continues bit for bit; an image stores W - 1 rows per windowed layer.
TEST_P(Windowed, SnapshotsAndImagesCarryTheWindowRows) {
  const std::vector<int32_t> prefix = tokens(*m_, 30, 3), rest = tokens(*m_, 5, 101), other = tokens(*m_, 40, 55);
  State fresh = m_->new_state();
  run(*m_, fresh, prefix);
  const std::vector<float> want = run(*m_, fresh, rest);
  State st = m_->new_state();
  run(*m_, st, prefix);
  const int64_t n = static_cast<int64_t>(prefix.size());
  const StateSnapshot snap = st.snapshot(), snap_kv = st.snapshot(true);
  std::string img;
  st.serialize(img);
  for (int i = 0; i < 40; ++i) run(*m_, st, {other[i]});  // token by token: the window moves past n
  // The windowed layers no longer hold what position n needs: truncate refuses.
  EXPECT_THROW(st.truncate(n), Error);
  st.restore(snap);
  EXPECT_TRUE(same_bits(run(*m_, st, rest), want));
  for (int i = 0; i < 40; ++i) run(*m_, st, {other[i]});
  st.restore(snap_kv);
  EXPECT_TRUE(same_bits(run(*m_, st, rest), want));
  State loaded = m_->new_state();
  loaded.deserialize(img, n);
  EXPECT_TRUE(same_bits(run(*m_, loaded, rest), want));
  // The image holds W - 1 rows of each windowed layer, all n of the others.
  uint64_t want_bytes = 0;
  for (const ops::KvCache& c : m_->new_state().attn) {
    if (c.head_dim() == 0) continue;
    want_bytes += (c.window() > 0 ? static_cast<uint64_t>(W_ - 1) : static_cast<uint64_t>(n)) * c.bytes_per_position();
  }
  uint64_t got_bytes = img.size() - 20;  // header: magic, version, n, layer count
  for (const ops::KvCache& c : st.attn)
    if (c.head_dim() > 0) got_bytes -= 4 * 4 + 8 + 8;  // per attention layer: kind, type, heads, dims, window, byte count
  EXPECT_EQ(got_bytes, want_bytes);
  // A state with unbounded caches does not take the image (another window), and says so.
  State other_kind = unbounded_state(*m_);
  try {
    other_kind.deserialize(img, n);
    ADD_FAILURE() << "an unbounded state took a windowed image";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("window"), std::string::npos) << e.what();
  }
  EXPECT_THROW(other_kind.restore(snap_kv), Error);
  // int8 KV: the same round trip.
  State q(m_->spec(), ops::KvType::kI8), q2(m_->spec(), ops::KvType::kI8);
  run(*m_, q, prefix);
  std::string qimg;
  q.serialize(qimg);
  for (int i = 0; i < 20; ++i) run(*m_, q, {other[i]});
  q2.deserialize(qimg, n);
  q.deserialize(qimg, n);
  EXPECT_TRUE(same_bits(run(*m_, q, rest), run(*m_, q2, rest)));
}

INSTANTIATE_TEST_SUITE_P(Models, Windowed, ::testing::Values("gpt_oss", "gpt_oss_mxfp4", "mixtral_w6"));

}  // namespace
}  // namespace spool::models
