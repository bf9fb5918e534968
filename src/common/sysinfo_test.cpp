// cgroup memory accounting (common/sysinfo.h) on fixture text: limit files, memory.stat of
// v1 and v2, /proc/self/cgroup + mountinfo mapping, and the walk up the hierarchy over fixture
// directories. The live test in a real cgroup is tests/e2e/cgroup_budget.sh.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "common/sysinfo.h"

namespace spool {
namespace {

// memory.stat of a cgroup v1 group (Linux 5.15, trimmed): local counters, then total_* over
// the hierarchy below it.
const char* kV1Stat =
    "cache 1048576\nrss 4096\nrss_huge 0\nshmem 0\nmapped_file 0\ninactive_anon 0\nactive_anon 4096\n"
    "inactive_file 524288\nactive_file 524288\nunevictable 0\nhierarchical_memory_limit 3221225472\n"
    "hierarchical_memsw_limit 9223372036854771712\ntotal_cache 2147483648\ntotal_rss 104857600\n"
    "total_inactive_anon 0\ntotal_active_anon 104857600\ntotal_inactive_file 1610612736\n"
    "total_active_file 536870912\ntotal_unevictable 0\n";

// memory.stat of a cgroup v2 group (Linux 6.1, trimmed): already hierarchical, no total_*.
const char* kV2Stat =
    "anon 104857600\nfile 2147483648\nkernel 4194304\nkernel_stack 65536\npagetables 1048576\nsec_pagetables 0\n"
    "percpu 0\nsock 0\nvmalloc 0\nshmem 0\nfile_mapped 1073741824\nfile_dirty 0\nfile_writeback 0\n"
    "anon_thp 0\ninactive_anon 0\nactive_anon 104857600\ninactive_file 1879048192\nactive_file 268435456\n"
    "unevictable 0\nslab_reclaimable 1048576\nslab_unreclaimable 524288\nworkingset_refault_file 12\n";

TEST(CgroupParse, LimitFiles) {
  EXPECT_EQ(parse_cgroup_limit("3221225472\n"), 3221225472ull);  // v1 and v2
  EXPECT_EQ(parse_cgroup_limit("max\n"), 0u);                     // v2: no limit
  EXPECT_EQ(parse_cgroup_limit("9223372036854771712\n"), 0u);     // v1: no limit (page-counter max)
  EXPECT_EQ(parse_cgroup_limit(""), 0u);                          // missing file
  EXPECT_EQ(parse_cgroup_limit("12abc"), 0u);                     // junk
}

TEST(CgroupParse, InactiveFileV1UsesTheHierarchicalTotal) {
  EXPECT_EQ(parse_inactive_file(kV1Stat, 1), 1610612736ull);
  // A v1 kernel without total_* lines: the local counter.
  EXPECT_EQ(parse_inactive_file("cache 10\ninactive_file 8192\nactive_file 4096\n", 1), 8192u);
}

TEST(CgroupParse, InactiveFileV2) {
  EXPECT_EQ(parse_inactive_file(kV2Stat, 2), 1879048192ull);
  EXPECT_EQ(parse_inactive_file("anon 1\n", 2), 0u);
}

const char* kMountinfo =
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";

TEST(CgroupDirs, HybridV1MemoryAndV2Unified) {
  const auto d = cgroup_memory_dirs("9:name=systemd:/\n4:memory:/ci/job7\n1:cpu:/\n0::/ci/job7\n", kMountinfo);
  ASSERT_EQ(d.size(), 6u);
  EXPECT_EQ(d[0].path, "/sys/fs/cgroup/memory/ci/job7");
  EXPECT_EQ(d[0].version, 1);
  EXPECT_EQ(d[1].path, "/sys/fs/cgroup/memory/ci");
  EXPECT_EQ(d[2].path, "/sys/fs/cgroup/memory");
  EXPECT_EQ(d[3].path, "/sys/fs/cgroup/unified/ci/job7");
  EXPECT_EQ(d[3].version, 2);
  EXPECT_EQ(d[5].path, "/sys/fs/cgroup/unified");
}

TEST(CgroupDirs, V2OnlyAndNamespaces) {
  // Unified hierarchy mounted at /sys/fs/cgroup (systemd, Docker with cgroupns=private: the
  // container sees its own cgroup as "/").
  const char* mi = "28 22 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
  auto d = cgroup_memory_dirs("0::/\n", mi);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].path, "/sys/fs/cgroup");
  d = cgroup_memory_dirs("0::/user.slice/user-0.slice/session-1.scope\n", mi);
  ASSERT_EQ(d.size(), 4u);
  EXPECT_EQ(d[0].path, "/sys/fs/cgroup/user.slice/user-0.slice/session-1.scope");
  EXPECT_EQ(d[3].path, "/sys/fs/cgroup");
  // A bind mount of a sub-hierarchy (Docker with cgroupns=host mounts the container's own
  // group): paths are relative to the mount's root.
  const char* bind = "700 690 0:26 /docker/abc /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw\n";
  d = cgroup_memory_dirs("0::/docker/abc\n", bind);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].path, "/sys/fs/cgroup");
  // A path outside the mount's root (another namespace's view): the mount point only.
  d = cgroup_memory_dirs("0::/../../other\n", mi);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].path, "/sys/fs/cgroup");
  // No mountinfo: the default mount points.
  d = cgroup_memory_dirs("4:memory:/a\n", "");
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].path, "/sys/fs/cgroup/memory/a");
}

// Writes the files of one fixture cgroup directory.
std::string fixture_dir(const std::string& name, const std::map<std::string, std::string>& files) {
  const std::string dir = testing::TempDir() + "sysinfo_test/" + name;
  std::filesystem::create_directories(dir);
  for (const auto& [f, text] : files) std::ofstream(dir + "/" + f) << text;
  return dir;
}

TEST(CgroupMemory, V1PageCacheOfTheModelIsNotUsed) {
  // A 3 GiB group holding 2 GiB of page cache of which 1.5 GiB inactive, 100 MiB anonymous.
  const std::string job = fixture_dir("v1/job", {{"memory.limit_in_bytes", "3221225472\n"},
                                                 {"memory.usage_in_bytes", "2252341248\n"},
                                                 {"memory.stat", kV1Stat}});
  const std::string root = fixture_dir("v1", {{"memory.limit_in_bytes", "9223372036854771712\n"},
                                              {"memory.usage_in_bytes", "9999999999\n"}, {"memory.stat", kV1Stat}});
  const CgroupMemory m = cgroup_memory({{job, 1}, {root, 1}});
  EXPECT_EQ(m.version, 1);
  EXPECT_EQ(m.dir, job);
  EXPECT_EQ(m.limit, 3221225472ull);
  EXPECT_EQ(m.inactive_file, 1610612736ull);
  EXPECT_EQ(m.available(), 3221225472ull - (2252341248ull - 1610612736ull));
  EXPECT_EQ(m.tightest_limit, 3221225472ull);
}

TEST(CgroupMemory, V2TheParentCanBind) {
  // The child's limit is looser than its parent's, and the parent is fuller: the parent binds.
  const std::string child = fixture_dir("v2/parent/child", {{"memory.max", "max\n"}, {"memory.current", "1073741824\n"}, {"memory.stat", kV2Stat}});
  const std::string mid = fixture_dir("v2/parent", {{"memory.max", "4294967296\n"}, {"memory.current", "3221225472\n"},
                                                    {"memory.stat", "anon 1\ninactive_file 1073741824\n"}});
  const std::string top = fixture_dir("v2/top", {{"memory.max", "3758096384\n"}, {"memory.current", "2147483648\n"},
                                                 {"memory.stat", kV2Stat}});
  const std::string root = fixture_dir("v2", {{"memory.stat", kV2Stat}});  // the root group has no memory.max
  CgroupMemory m = cgroup_memory({{child, 2}, {mid, 2}, {root, 2}});
  EXPECT_EQ(m.version, 2);
  EXPECT_EQ(m.dir, mid);
  EXPECT_EQ(m.available(), 4294967296ull - (3221225472ull - 1073741824ull));
  // A smaller limit with more inactive file pages leaves more available: the available
  // figure, not the limit, picks the level; the tightest limit is still reported.
  m = cgroup_memory({{mid, 2}, {top, 2}});
  EXPECT_EQ(m.dir, mid);
  EXPECT_EQ(m.tightest_limit, 3758096384ull);
  EXPECT_EQ(cgroup_memory({{top, 2}}).available(), 3758096384ull - (2147483648ull - 1879048192ull));
  // No limit anywhere.
  EXPECT_EQ(cgroup_memory({{child, 2}, {root, 2}}).version, 0);
}

TEST(CgroupMemory, UsageBelowInactiveFileDoesNotWrap) {
  const std::string d = fixture_dir("v2/odd", {{"memory.max", "1048576\n"}, {"memory.current", "4096\n"}, {"memory.stat", kV2Stat}});
  EXPECT_EQ(cgroup_memory({{d, 2}}).available(), 1048576u);
}

}  // namespace
}  // namespace spool
