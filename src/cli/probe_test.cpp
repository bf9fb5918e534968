// The memory probe's sizing (cli/probe.h): the last-level cache read from a fake sysfs CPU tree,
// and the buffer size derived from it and the available memory.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "cli/probe.h"

namespace spool::plan {
namespace {

namespace fs = std::filesystem;

// A scratch sysfs-like tree under gtest's temp dir, removed by the destructor.
struct FakeSysfs {
  fs::path root;
  explicit FakeSysfs(const std::string& name) : root(fs::path(testing::TempDir()) / ("probe_test_" + name)) {
    fs::remove_all(root);
    fs::create_directories(root);
  }
  ~FakeSysfs() { fs::remove_all(root); }
  // cpu<cpu>/cache/index<index>/{level,type,size,shared_cpu_list}
  void cache(int cpu, int index, int level, const std::string& type, const std::string& size, const std::string& shared) {
    const fs::path d = root / ("cpu" + std::to_string(cpu)) / "cache" / ("index" + std::to_string(index));
    fs::create_directories(d);
    std::ofstream(d / "level") << level << "\n";
    std::ofstream(d / "type") << type << "\n";
    std::ofstream(d / "size") << size << "\n";
    if (!shared.empty()) std::ofstream(d / "shared_cpu_list") << shared << "\n";
  }
};

TEST(ProbeLlc, OneSharedL3CountsOnce) {
  // This VM's layout: per-core L1d/L1i/L2, one L3 shared by both CPUs.
  FakeSysfs t("one_l3");
  for (int c = 0; c < 2; ++c) {
    const std::string self = std::to_string(c);
    t.cache(c, 0, 1, "Data", "48K", self);
    t.cache(c, 1, 1, "Instruction", "32K", self);
    t.cache(c, 2, 2, "Unified", "2048K", self);
    t.cache(c, 3, 3, "Unified", "266240K", "0-1");
  }
  fs::create_directories(t.root / "cpufreq");  // not a cpu<N> directory
  EXPECT_EQ(last_level_cache_bytes(t.root.string()), 266240ull << 10);
}

TEST(ProbeLlc, TwoSocketsSum) {
  // Two L3 instances (sockets, or AMD CCDs), two CPUs each: both count, once each.
  FakeSysfs t("two_l3");
  for (int c = 0; c < 4; ++c) {
    t.cache(c, 0, 1, "Data", "32K", std::to_string(c));
    t.cache(c, 3, 3, "Unified", "32M", c < 2 ? "0-1" : "2-3");
  }
  EXPECT_EQ(last_level_cache_bytes(t.root.string()), 64ull << 20);
}

TEST(ProbeLlc, HighestLevelOfDataOrUnifiedOnly) {
  // No L3; the L2 is the last level. An instruction cache at a higher level does not count.
  FakeSysfs t("l2_only");
  t.cache(0, 0, 1, "Data", "64K", "0");
  t.cache(0, 1, 2, "Unified", "1M", "0");
  t.cache(0, 2, 3, "Instruction", "8M", "0");
  t.cache(1, 0, 1, "Data", "64K", "1");
  t.cache(1, 1, 2, "Unified", "1M", "1");
  EXPECT_EQ(last_level_cache_bytes(t.root.string()), 2ull << 20);
}

TEST(ProbeLlc, MissingOrUnreadableTreeGivesZero) {
  EXPECT_EQ(last_level_cache_bytes((fs::path(testing::TempDir()) / "probe_test_absent").string()), 0u);
  FakeSysfs t("junk");
  t.cache(0, 0, 3, "Unified", "lots", "0");  // unparsable size
  EXPECT_EQ(last_level_cache_bytes(t.root.string()), 0u);
}

TEST(ProbeBuffer, FourTimesTheCacheWithinBounds) {
  constexpr uint64_t MiB = 1ull << 20, GiB = 1ull << 30;
  EXPECT_EQ(memory_probe_bytes(260 * MiB, 23 * GiB), 1040 * MiB);  // this VM: 4 x 260 MiB
  EXPECT_EQ(memory_probe_bytes(32 * MiB, 23 * GiB), 256 * MiB);    // small cache: the 256 MiB floor
  EXPECT_EQ(memory_probe_bytes(0, 0), 256 * MiB);                  // cache and memory unknown
  EXPECT_EQ(memory_probe_bytes(1536 * MiB, 64 * GiB), 2 * GiB);     // at most 2 GiB
  EXPECT_EQ(memory_probe_bytes(260 * MiB, 2 * GiB), 512 * MiB);    // a quarter of what is available
  EXPECT_EQ(memory_probe_bytes(260 * MiB, 40 * MiB), 16 * MiB);    // never below 16 MiB
  EXPECT_EQ(memory_probe_bytes(UINT64_MAX, 0), 2 * GiB);           // no overflow
  EXPECT_EQ(memory_probe_bytes(260 * MiB + 12345, 0) % MiB, 0u);   // whole MiB
}

}  // namespace
}  // namespace spool::plan
