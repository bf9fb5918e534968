// Warm starts (docs/streaming.md#warm-starts): a streamed demo model loaded with an
// --expert-profile recorded from earlier traffic misses fewer experts in its first tokens than a
// cold one and computes bit-identical logits; a foreign profile starts cold and is left as it is,
// a corrupt one is an error, a resident model ignores the flag; the recorder keeps a batched step
// pipelined; --warm-page-cache reads the files in the background without changing the outputs,
// and is skipped when the files do not fit.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "common/files.h"
#include "engine/loader.h"
#include "support/golden.h"
#include "support/load.h"

namespace spool::engine {
namespace {

namespace fs = std::filesystem;

std::string tmp_path(const std::string& name) {
  const fs::path d = fs::path(::testing::TempDir()) / ("spool_warm_test_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return (d / name).string();
}

// The demo's experts (8 MoE layers x 64) and the bytes of one cache slot.
struct DemoExperts {
  int64_t count = 0;
  uint64_t slot = 0;
};

DemoExperts demo_experts() {
  LoadedModel l = load(spool::testing::test_load_options(SPOOL_DEFAULT_MODEL_DIR, /*stream=*/true));
  return {static_cast<int64_t>(8) * l.model->spec().moe.n_experts, l.streaming->store().slot_bytes()};
}

// Streaming load options with a cache of `frac` of the demo's experts.
LoadOptions streamed(double frac, const std::string& profile = "") {
  static const DemoExperts e = demo_experts();
  LoadOptions o = spool::testing::test_load_options(SPOOL_DEFAULT_MODEL_DIR, true);
  o.cache_budget = strfmt("%.9f", frac * static_cast<double>(e.count) * static_cast<double>(e.slot) / (1ull << 30));
  o.expert_profile = profile;
  return o;
}

// `n_tokens` tokens of the dev text from character `from`.
std::vector<int32_t> dev_tokens(const LoadedModel& l, size_t from, size_t n_tokens) {
  const std::string text = read_whole_file(spool::testing::data_dir() + "/corpus/dev.txt");
  std::vector<int32_t> ids = l.tok->encode_prompt(text.substr(from, n_tokens * 8));
  EXPECT_GE(ids.size(), n_tokens);
  ids.resize(std::min(ids.size(), n_tokens));
  return ids;
}

// Traffic: `prompt` in chunks of `step`, then `decode` greedy tokens. The logits of every forward
// (concatenated) and the cache misses after the prompt and after each decode token.
struct Traffic {
  std::vector<float> logits;
  std::vector<uint64_t> misses;
};

Traffic serve(LoadedModel& l, const std::vector<int32_t>& prompt, int64_t step, int decode) {
  models::Model& m = *l.model;
  const int64_t V = m.spec().vocab_size;
  models::State st = m.new_state();
  std::vector<float> last(static_cast<size_t>(V));
  Traffic r;
  for (size_t i = 0; i < prompt.size(); i += static_cast<size_t>(step)) {
    const size_t n = std::min(prompt.size() - i, static_cast<size_t>(step));
    m.forward(std::span<const int32_t>(prompt.data() + i, n), st, models::LogitsMode::kLast, last.data());
    r.logits.insert(r.logits.end(), last.begin(), last.end());
  }
  r.misses.push_back(l.streaming->stats().misses);
  for (int d = 0; d < decode; ++d) {
    const int32_t next = spool::testing::argmax(last.data(), V);
    m.forward(std::span<const int32_t>(&next, 1), st, models::LogitsMode::kLast, last.data());
    r.logits.insert(r.logits.end(), last.begin(), last.end());
    r.misses.push_back(l.streaming->stats().misses);
  }
  return r;
}

TEST(WarmStart, ProfiledRestartMissesLessWithBitIdenticalLogits) {
  const std::string profile = tmp_path("demo_profile.json");
  fs::remove(profile);
  {  // the first run: no file yet, a cold cache; its routing is recorded and saved at the end
    LoadedModel l = load(streamed(0.35, profile));
    ASSERT_NE(l.profile, nullptr);
    EXPECT_EQ(l.streaming->stats().preloaded, 0u);
    const std::vector<int32_t> traffic = dev_tokens(l, 0, 384);
    serve(l, traffic, 64, 32);
    EXPECT_EQ(l.profile->tokens_this_run(), traffic.size() + 32);
    save_expert_profile(l);
  }
  ASSERT_TRUE(fs::exists(profile));
  EXPECT_EQ(experts::read_profile(profile).tokens_total, 384u + 32u);

  // Other text after the restart: cold, and warmed from the profile.
  LoadedModel cold = load(streamed(0.35));
  LoadedModel warm = load(streamed(0.35, profile));
  const std::vector<int32_t> prompt = dev_tokens(cold, 200000, 24);
  const auto s = warm.streaming->stats();
  // The profile fills the cache: every entry the budget holds (it has more experts than that).
  EXPECT_EQ(static_cast<int64_t>(s.preloaded), static_cast<int64_t>(warm.streaming->cache_budget() / warm.streaming->store().slot_bytes()));
  EXPECT_EQ(s.requests, 0u);  // preloading is no request: hit rates count the traffic only
  const Traffic c = serve(cold, prompt, 8, 32), w = serve(warm, prompt, 8, 32);
  ASSERT_EQ(c.logits.size(), w.logits.size());
  EXPECT_EQ(std::memcmp(c.logits.data(), w.logits.data(), c.logits.size() * sizeof(float)), 0) << "logits differ";
  // Fewer misses over the prompt and over the first 8 and 32 decode tokens.
  EXPECT_LT(w.misses[0], c.misses[0]);
  EXPECT_LT(w.misses[8], c.misses[8]);
  EXPECT_LT(w.misses[32], c.misses[32]);
  std::printf("misses after the 24-token prompt and 32 decode tokens: cold %llu, %llu; warm %llu, %llu\n",
              (unsigned long long)c.misses[0], (unsigned long long)c.misses[32], (unsigned long long)w.misses[0],
              (unsigned long long)w.misses[32]);
  // The warm run recorded on top of the stored profile.
  save_expert_profile(warm);
  EXPECT_EQ(experts::read_profile(profile).tokens_total, 384u + 32u + 24u + 32u);
}

TEST(WarmStart, ForeignProfileStartsColdAndIsLeftAsItIs) {
  const std::string path = tmp_path("foreign.json");
  {
    LoadedModel l = load(streamed(0.3, path));
    serve(l, dev_tokens(l, 0, 32), 32, 4);
    save_expert_profile(l);
  }
  std::string text = read_whole_file(path);
  const size_t at = text.find("\"router_hash\": \"");
  ASSERT_NE(at, std::string::npos);
  text.replace(at + 16, 16, "0000000000000000");
  write_file_atomic(path, text);
  LoadedModel l = load(streamed(0.3, path));
  EXPECT_EQ(l.profile, nullptr);
  EXPECT_EQ(l.streaming->stats().preloaded, 0u);
  serve(l, dev_tokens(l, 0, 16), 16, 2);
  save_expert_profile(l);
  EXPECT_EQ(read_whole_file(path), text);
}

TEST(WarmStart, CorruptProfileIsAnErrorNamingTheFile) {
  const std::string path = tmp_path("corrupt.json");
  {
    LoadedModel l = load(streamed(0.3, path));
    serve(l, dev_tokens(l, 0, 16), 16, 2);
    save_expert_profile(l);
  }
  const std::string text = read_whole_file(path);
  write_file_atomic(path, text.substr(0, text.size() - 40));  // a truncated file
  try {
    load(streamed(0.3, path));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not JSON"), std::string::npos) << e.what();
  }
  // A directory that does not exist is found before the model is read.
  LoadOptions o = streamed(0.3, tmp_path("no_such_dir") + "/p.json");
  EXPECT_THROW(load(o), Error);
  o = streamed(0.3, path);
  o.expert_profile_half_life = 0;
  EXPECT_THROW(load(o), UsageError);
}

TEST(WarmStart, ResidentModelIgnoresTheProfile) {
  const std::string path = tmp_path("resident.json");
  write_file_atomic(path, "not a profile");
  LoadOptions o = spool::testing::test_load_options(SPOOL_DEFAULT_MODEL_DIR, /*stream=*/false);
  o.stream = false;
  o.expert_profile = path;
  LoadedModel l = load(o);  // neither read nor written
  EXPECT_EQ(l.profile, nullptr);
  EXPECT_FALSE(l.model->hooks.on_route);
  save_expert_profile(l);
  EXPECT_EQ(read_whole_file(path), "not a profile");
}

// The recorder takes its calls in any order: a decode step of several streamed sequences still
// runs as two pipelined groups (the second group finds the experts the first one read: hits in
// the first step of an empty cache, which one unpipelined step never has).
TEST(WarmStart, RecorderKeepsBatchedStepsPipelined) {
  const std::string path = tmp_path("pipelined.json");
  fs::remove(path);
  LoadOptions o = streamed(1.0, path);
  LoadedModel l = load(o);
  ASSERT_NE(l.profile, nullptr);
  const int64_t V = l.model->spec().vocab_size;
  const std::vector<std::vector<int32_t>> prompts = {{10}, {11}, {500}, {10}};
  std::vector<models::State> st;
  for (size_t i = 0; i < prompts.size(); ++i) st.push_back(l.model->new_state());
  std::vector<std::vector<float>> logits(prompts.size(), std::vector<float>(static_cast<size_t>(V)));
  std::vector<models::SeqStep> batch;
  for (size_t i = 0; i < prompts.size(); ++i) batch.push_back({prompts[i], &st[i], models::LogitsMode::kLast, logits[i].data()});
  l.model->forward_batch(batch);
  EXPECT_GT(l.streaming->stats().hits, 0u);
  EXPECT_EQ(l.profile->tokens_this_run(), 4u);
}

// --warm-page-cache: the files are read in the background (the run does not wait for it), the
// outputs are those of a run without it; it is skipped when the files do not fit in the memory
// the run leaves free, or when expert reads bypass the page cache.
TEST(WarmStart, WarmPageCacheReadsTheFilesAndLeavesOutputsUnchanged) {
  LoadOptions o = streamed(0.3);
  o.page_cache = true;
  LoadedModel plain = load(o);
  o.warm_page_cache = true;
  o.available = uint64_t{64} << 30;  // the files fit
  LoadedModel warmed = load(o);
  ASSERT_NE(warmed.warmer, nullptr);
  const std::vector<int32_t> prompt = dev_tokens(plain, 1000, 24);
  const Traffic a = serve(plain, prompt, 8, 16), b = serve(warmed, prompt, 8, 16);
  EXPECT_EQ(std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * sizeof(float)), 0) << "logits differ";
  warmed.warmer->wait();
  const io::WarmResult r = warmed.warmer->result();
  EXPECT_TRUE(r.done);
  EXPECT_EQ(r.error, "");
  EXPECT_EQ(r.bytes_total, warmed.ckpt->file_bytes());
  EXPECT_EQ(r.bytes_read + r.bytes_resident, r.bytes_total);

  o.available = uint64_t{530} << 20;  // 530 MiB: the 512 MiB reserve and the run's needs leave too little
  EXPECT_EQ(load(o).warmer, nullptr);
  o.available.reset();
  o.page_cache = false;  // O_DIRECT expert reads: warming the page cache would not help them
  EXPECT_EQ(load(o).warmer, nullptr);
  o = spool::testing::test_load_options(SPOOL_DEFAULT_MODEL_DIR, false);
  o.stream = false;
  o.warm_page_cache = true;  // resident: read at load already
  EXPECT_EQ(load(o).warmer, nullptr);
}

}  // namespace
}  // namespace spool::engine
