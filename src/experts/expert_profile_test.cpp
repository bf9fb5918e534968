// Expert profiles (--expert-profile): the decayed counts, the file's round trip and its errors
// (corrupt, truncated, foreign), the router fingerprint, the periodic saver, and the page-cache
// warmer (--warm-page-cache) reading files and stopping between chunks.
#include "experts/expert_profile.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/error.h"
#include "io/checkpoint.h"
#include "io/page_cache_warmer.h"
#include "models/family.h"
#include "support/golden.h"

namespace spool::experts {
namespace {

namespace fs = std::filesystem;

std::string tmp_path(const std::string& name) {
  const fs::path d = fs::path(::testing::TempDir()) / ("spool_profile_test_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return (d / name).string();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

ProfileShape small_shape() {
  ProfileShape s;
  s.model_type = "test_moe";
  s.n_layers = 4;
  s.moe_layers = {1, 3};
  s.n_experts = 6;
  s.top_k = 2;
  s.router_hash = "0123456789abcdef";
  s.expert_bytes = 4096;
  return s;
}

double count_of(const ProfileData& d, int ordinal, int expert) {
  return d.counts[static_cast<size_t>(ordinal) * static_cast<size_t>(d.shape.n_experts) + static_cast<size_t>(expert)];
}

// One token: layer 1 routes `a`, layer 3 routes `b` (a record of the first MoE layer is a new token).
void token(ExpertProfile& p, std::vector<int> a, std::vector<int> b) {
  p.record(1, a);
  p.record(3, b);
}

TEST(ExpertProfile, CountsDecayWithTheHalfLife) {
  ExpertProfile p(small_shape(), /*half_life=*/10);
  token(p, {0, 1}, {2, 3});
  for (int i = 0; i < 10; ++i) token(p, {4, 5}, {4, 5});
  const ProfileData d = p.snapshot();
  EXPECT_EQ(d.tokens_total, 11u);
  EXPECT_NEAR(count_of(d, 0, 0), 0.5, 1e-12);  // recorded 10 tokens ago: half
  EXPECT_NEAR(count_of(d, 1, 3), 0.5, 1e-12);
  double recent = 0;
  for (int a = 0; a < 10; ++a) recent += std::exp2(-a / 10.0);
  EXPECT_NEAR(count_of(d, 0, 4), recent, 1e-12);
  EXPECT_NEAR(d.weight, recent + 0.5, 1e-12);
  EXPECT_EQ(count_of(d, 0, 2), 0.0);
  // Layers that are not MoE layers and experts out of range are ignored (no new token either).
  p.record(0, std::vector<int>{1});
  p.record(3, std::vector<int>{-1, 6});
  EXPECT_EQ(p.snapshot().counts, d.counts);
  EXPECT_EQ(p.tokens_total(), 11u);
}

TEST(ExpertProfile, LongRunsRenormalizeWithoutLosingPrecision) {
  ExpertProfile p(small_shape(), /*half_life=*/1);  // the growth factor passes 2^64 after 64 tokens
  for (int i = 0; i < 1000; ++i) token(p, {i == 0 ? 5 : 0}, {1});
  const ProfileData d = p.snapshot();
  EXPECT_NEAR(count_of(d, 0, 0), 2.0, 1e-9);  // sum of 2^-a, a = 0..998
  EXPECT_NEAR(count_of(d, 1, 1), 2.0, 1e-9);
  EXPECT_LT(count_of(d, 0, 5), 1e-200);        // 999 half-lives ago
  EXPECT_TRUE(std::isfinite(d.weight));
}

TEST(ExpertProfile, FileRoundTripAndHottestOrder) {
  ExpertProfile p(small_shape(), 1000);
  for (int i = 0; i < 30; ++i) token(p, {0, i % 3 == 0 ? 2 : 1}, {5, 4});
  const std::string path = tmp_path("round.json");
  write_profile(path, p.snapshot());
  const ProfileData back = read_profile(path);
  const ProfileData want = p.snapshot();
  EXPECT_EQ(back.shape.mismatch(want.shape), "");
  EXPECT_EQ(back.shape.top_k, 2);
  EXPECT_EQ(back.shape.expert_bytes, 4096u);
  EXPECT_EQ(back.half_life, 1000);
  EXPECT_EQ(back.tokens_total, 30u);
  ASSERT_EQ(back.counts.size(), want.counts.size());
  for (size_t i = 0; i < want.counts.size(); ++i) EXPECT_NEAR(back.counts[i], want.counts[i], 1e-5 * want.counts[i]) << i;
  EXPECT_NEAR(back.weight, want.weight, 1e-5 * want.weight);
  // Hottest first: layer 1's expert 0 and layer 3's 5 and 4 (30 each; ties by layer, expert), then 1 (20), then 2 (10).
  const std::vector<std::pair<int, int>> hot = hottest(back);
  const std::vector<std::pair<int, int>> order = {{1, 0}, {3, 4}, {3, 5}, {1, 1}, {1, 2}};
  EXPECT_EQ(hot, order);
  // A seeded profile continues from the stored counts.
  ExpertProfile q(small_shape(), 1000);
  q.seed(back);
  EXPECT_EQ(q.tokens_total(), 30u);
  EXPECT_EQ(q.tokens_this_run(), 0u);
  token(q, {3}, {3});
  EXPECT_EQ(q.tokens_this_run(), 1u);
  EXPECT_NEAR(count_of(q.snapshot(), 0, 0), count_of(back, 0, 0) * std::exp2(-1 / 1000.0), 1e-9);
}

TEST(ExpertProfile, BadFilesAreErrorsNamingTheFileAndTheProblem) {
  ExpertProfile p(small_shape(), 1000);
  token(p, {0, 1}, {2, 3});
  const std::string good = tmp_path("good.json");
  write_profile(good, p.snapshot());
  const std::string text = read_text(good);
  auto expect_error = [&](const std::string& name, const std::string& content, const std::string& what) {
    const std::string path = tmp_path(name);
    write_text(path, content);
    try {
      read_profile(path);
      ADD_FAILURE() << name << ": no error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      EXPECT_NE(msg.find(what), std::string::npos) << name << ": " << msg;
    }
  };
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    const size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return at == std::string::npos ? t : t.replace(at, from.size(), to);
  };
  expect_error("truncated.json", text.substr(0, text.size() / 2), "not JSON");
  expect_error("empty.json", "", "not JSON");
  expect_error("trace.json", "{\"format\":\"spool-routing-trace\",\"version\":1}", "not an expert profile");
  expect_error("version.json", replaced("\"version\": 1", "\"version\": 2"), "version 2");
  expect_error("nolayers.json", replaced("\"n_layers\": 4,", ""), "no \"n_layers\"");
  expect_error("badtype.json", replaced("\"n_experts\": 6", "\"n_experts\": \"6\""), "\"n_experts\"");
  expect_error("unsorted.json", replaced("[1,3]", "[3,1]"), "ascending");
  expect_error("outside.json", replaced("[1,3]", "[1,4]"), "ascending");
  expect_error("rows.json", replaced("\"counts\": [", "\"counts\": [[0,0,0,0,0,0],"), "one per MoE layer");
  expect_error("short.json", replaced("[1.0,1.0,0.0,0.0,0.0,0.0]", "[1.0,1.0,0.0]"), "counts of layer 1");
  expect_error("negative.json", replaced("[1.0,1.0,0.0,0.0,0.0,0.0]", "[1.0,-1.0,0.0,0.0,0.0,0.0]"), "not a finite number >= 0");
  expect_error("halflife.json", replaced("\"half_life_tokens\": 1000.0", "\"half_life_tokens\": 0"), "half_life_tokens");
  EXPECT_THROW(read_profile(tmp_path("missing.json")), Error);
  EXPECT_NO_THROW(read_profile(good));
}

TEST(ExpertProfile, ForeignProfilesAreNamedByWhatDiffers) {
  const ProfileShape mine = small_shape();
  EXPECT_EQ(mine.mismatch(mine), "");
  ProfileShape other = mine;
  other.top_k = 1;         // informational: --max-active-experts records the same model
  other.expert_bytes = 1;  // informational: another quantization of the same routers
  EXPECT_EQ(mine.mismatch(other), "");
  other = mine;
  other.model_type = "qwen3_moe";
  EXPECT_NE(mine.mismatch(other).find("model_type qwen3_moe"), std::string::npos);
  other = mine;
  other.n_experts = 8;
  EXPECT_NE(mine.mismatch(other).find("8 experts"), std::string::npos);
  other = mine;
  other.router_hash = "ffffffffffffffff";
  EXPECT_NE(mine.mismatch(other).find("router_hash ffffffffffffffff"), std::string::npos);
  other = mine;
  other.moe_layers = {1, 2};
  EXPECT_NE(mine.mismatch(other).find("MoE layers [1,2]"), std::string::npos);
  ExpertProfile p(mine, 10);
  ProfileData d = p.snapshot();
  d.shape.n_experts = 5;
  d.counts.resize(10);
  EXPECT_THROW(p.seed(d), Error);
  EXPECT_THROW(ExpertProfile(mine, 0), UsageError);
  EXPECT_THROW(ExpertProfile(mine, NAN), UsageError);
}

TEST(ExpertProfile, RouterFingerprintFollowsTheRouterBytes) {
  const std::string demo = SPOOL_DEFAULT_MODEL_DIR;
  const std::vector<int> layers = {0, 1, 2, 3, 4, 5, 6, 7};
  int hashed = 0;
  const std::string h = router_fingerprint(models::open_checkpoint(demo), layers, "gate", &hashed);
  EXPECT_EQ(hashed, 8);  // layers.L.mlp.gate.weight, not shared_expert_gate.weight
  EXPECT_EQ(h.size(), 16u);
  EXPECT_EQ(router_fingerprint(models::open_checkpoint(demo), layers, "gate"), h);
  EXPECT_NE(router_fingerprint(models::open_checkpoint(demo), {0, 1, 2, 3, 4, 5, 6}, "gate"), h);
  // A copy whose router of layer 5 has one byte changed: another fingerprint.
  const fs::path copy = tmp_path("demo_copy");
  fs::remove_all(copy);
  fs::create_directories(copy);
  for (const auto& f : fs::directory_iterator(demo)) fs::copy_file(f.path(), copy / f.path().filename());
  const io::Checkpoint ck = models::open_checkpoint(copy.string());
  const io::TensorRef* router = ck.find("layers.5.mlp.gate.weight");
  ASSERT_NE(router, nullptr);
  const std::string shard = ck.shards()[router->shard].path();
  const uint64_t at = router->offset + router->nbytes / 2;
  {
    const int fd = ::open(shard.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    uint8_t b = 0;
    ASSERT_EQ(::pread(fd, &b, 1, static_cast<off_t>(at)), 1);
    b ^= 0x01;
    ASSERT_EQ(::pwrite(fd, &b, 1, static_cast<off_t>(at)), 1);
    ::close(fd);
  }
  EXPECT_NE(router_fingerprint(models::open_checkpoint(copy.string()), layers, "gate"), h);
  fs::remove_all(copy);
}

TEST(ProfileSaver, SavesPeriodicallyAndAtTheEnd) {
  auto p = std::make_shared<ExpertProfile>(small_shape(), 100);
  const std::string path = tmp_path("saver.json");
  fs::remove(path);
  {
    ProfileSaver s(p, path, /*interval_s=*/0.02);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_FALSE(fs::exists(path));  // nothing recorded: nothing written
    token(*p, {0}, {1});
    for (int i = 0; i < 200 && !fs::exists(path); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_TRUE(fs::exists(path));  // a periodic save
    EXPECT_EQ(read_profile(path).tokens_total, 1u);
    token(*p, {0}, {1});
    s.finish();  // the last save
    EXPECT_EQ(read_profile(path).tokens_total, 2u);
  }
  // A failed write is a warning, never an exception.
  token(*p, {0}, {1});
  ProfileSaver bad(p, tmp_path("no_such_dir") + "/x/profile.json", 0);
  EXPECT_FALSE(bad.save_if_changed());
}

// Writes `path` to disk and asks the kernel to drop its pages from the page cache; true when
// none is resident afterwards (a tmpfs keeps them).
bool drop_from_page_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return false;
  ::fsync(fd);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  const uint64_t size = fs::file_size(path);
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  bool dropped = map != MAP_FAILED;
  if (dropped) {
    std::vector<unsigned char> vec((size + 4095) / 4096 + 1);
    dropped = mincore(map, size, vec.data()) == 0;
    for (size_t i = 0; dropped && i < (size + static_cast<uint64_t>(getpagesize()) - 1) / static_cast<uint64_t>(getpagesize()); ++i)
      dropped = (vec[i] & 1) == 0;
    ::munmap(map, size);
  }
  ::close(fd);
  return dropped;
}

TEST(PageCacheWarmer, ReadsEveryFileAndStopsBetweenChunks) {
  const std::string a = tmp_path("warm_a.bin"), b = tmp_path("warm_b.bin");
  const uint64_t size_a = 3 * io::PageCacheWarmer::kChunk + 123;
  write_text(a, std::string(size_a, 'x'));
  write_text(b, std::string(1000, 'y'));
  const bool dropped = drop_from_page_cache(a);
  {
    io::PageCacheWarmer w({a, b}, /*log=*/false);
    w.wait();
    const io::WarmResult r = w.result();
    EXPECT_TRUE(r.done);
    EXPECT_FALSE(r.stopped);
    EXPECT_EQ(r.error, "");
    EXPECT_EQ(r.bytes_total, size_a + 1000);
    EXPECT_EQ(r.bytes_read + r.bytes_resident, r.bytes_total);
    if (dropped) EXPECT_GE(r.bytes_read, size_a);  // the dropped file was read again
    else std::printf("(%s stayed in the page cache: the read path is not exercised here)\n", a.c_str());
  }
  {  // read again: every chunk is resident now, none is read
    io::PageCacheWarmer w({a}, false);
    w.wait();
    EXPECT_EQ(w.result().bytes_read, 0u);
    EXPECT_EQ(w.result().bytes_resident, size_a);
  }
  {  // a missing file: an error in the result, not an exception
    io::PageCacheWarmer w({a, tmp_path("missing.bin")}, false);
    w.wait();
    EXPECT_NE(w.result().error.find("missing.bin"), std::string::npos);
  }
  // stop() right away: the thread ends at its first check, before the file's first chunk or (when it
  // ran before stop() was called: seen once under TSan) after it. stop() once it has read a chunk of
  // a 512 MiB (sparse) file: it ends after that chunk or the next, long before the end.
  const std::string big = tmp_path("warm_big.bin");
  const uint64_t big_size = uint64_t{512} << 20;
  {
    const int fd = ::open(big.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(big_size)), 0);
    ::close(fd);
  }
  {
    io::PageCacheWarmer w({big}, false);
    w.stop();
    EXPECT_TRUE(w.result().stopped);
    EXPECT_LE(w.result().bytes_read, io::PageCacheWarmer::kChunk);
  }
  io::PageCacheWarmer w({big}, false);
  // (SCHED_IDLE: on a busy machine the first chunk may take a while)
  for (int i = 0; i < 30000 && w.result().bytes_read == 0 && !w.result().done; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const auto t0 = std::chrono::steady_clock::now();
  w.stop();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  const io::WarmResult r = w.result();
  EXPECT_TRUE(r.done);
  EXPECT_TRUE(r.stopped);
  EXPECT_GT(r.bytes_read, 0u);
  EXPECT_LT(r.bytes_read, big_size / 2);
  drop_from_page_cache(big);
  fs::remove(big);
}

}  // namespace
}  // namespace spool::experts
