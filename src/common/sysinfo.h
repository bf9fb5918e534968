// Process and machine memory facts, read from /proc and cgroup files (Linux).
//
// Memory in containers: a cgroup's usage (v2 memory.current, v1 memory.usage_in_bytes)
// includes the page cache of files its processes read, e.g. a model's shards read by an
// earlier run. The kernel reclaims inactive file pages before it fails an allocation, so
// they are not "used": available = limit - (usage - inactive file), the signal kubelet's
// memory.available uses. The process's cgroup and each ancestor can set a limit; the one
// leaving the least available memory binds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace spool {

/// Peak resident set size of this process in bytes (VmHWM from /proc/self/status); 0 if unknown.
uint64_t peak_rss_bytes();
/// Current resident set size in bytes (VmRSS); 0 if unknown.
uint64_t current_rss_bytes();
/// Memory available to this process in bytes: min(MemAvailable, cgroup available) where the
/// cgroup figure is CgroupMemory::available() of the binding level (see cgroup_memory()).
/// Call it before reading model files: pages this process maps and touches become active
/// and then count as used.
uint64_t available_memory_bytes();
/// Total physical memory in bytes (MemTotal), capped by the tightest cgroup limit if one is set.
uint64_t total_memory_bytes();
/// The tightest cgroup v2/v1 memory limit of this process's cgroup and its ancestors in bytes,
/// or 0 if none is set.
uint64_t cgroup_memory_limit_bytes();
/// Seconds since an arbitrary fixed point (steady clock).
double now_seconds();
/// Human-readable byte count, e.g. "1.23 GiB".
std::string format_bytes(uint64_t bytes);

/// One memory-controller cgroup directory: `path` on this machine, `version` 1 or 2.
struct CgroupDir {
  std::string path;
  int version = 0;
};

/// Memory accounting of the cgroup level that leaves the least memory available.
struct CgroupMemory {
  int version = 0;             // 1 or 2; 0 when no cgroup limits memory (every other field 0 / "")
  std::string dir;             // the binding cgroup's directory
  uint64_t limit = 0;          // its limit in bytes (v2 memory.max, v1 memory.limit_in_bytes)
  uint64_t usage = 0;          // its usage in bytes (v2 memory.current, v1 memory.usage_in_bytes)
  uint64_t inactive_file = 0;  // its reclaimable file pages in bytes (memory.stat; see parse_inactive_file)
  uint64_t tightest_limit = 0; // the smallest limit of all levels (may belong to another level), bytes
  /// limit - (usage - inactive_file) in bytes, at least 0; 0 when version is 0.
  uint64_t available() const;
  /// One line for logs, e.g. "cgroup v1 /sys/fs/cgroup/memory/x: limit 3.00 GiB - (usage 1.2 GiB - inactive file 1.1 GiB)".
  std::string describe() const;
};

/// Parses a memory-limit file's text: v2 memory.max ("max" = no limit) or v1
/// memory.limit_in_bytes (values >= 2^60 mean no limit: the kernel's page-counter maximum).
/// Returns the limit in bytes, or 0 for no limit or unparsable text.
uint64_t parse_cgroup_limit(const std::string& text);

/// Reclaimable file pages in bytes from a memory.stat file's text ("key value" lines, values in
/// bytes). v1 (`version` 1): total_inactive_file (the hierarchy below the cgroup), else
/// inactive_file; v2: inactive_file (already hierarchical). 0 when the key is missing.
uint64_t parse_inactive_file(const std::string& memory_stat, int version);

/// The memory-controller directories of a process, innermost first, each hierarchy walked up
/// to its mount's root: from the text of /proc/<pid>/cgroup ("0::/path" for v2,
/// "N:...memory...:/path" for v1) and /proc/<pid>/mountinfo (which maps a hierarchy's paths to
/// its mount point; a cgroup v1 mount with the memory option, or a cgroup2 mount). Without a
/// matching mount, /sys/fs/cgroup/memory (v1) and /sys/fs/cgroup (v2) are assumed. A path
/// outside the mount's root (another cgroup namespace) maps to the mount point alone.
std::vector<CgroupDir> cgroup_memory_dirs(const std::string& proc_cgroup, const std::string& mountinfo);

/// Reads each directory's limit, usage and memory.stat (missing files = no limit at that
/// level, as v2's root cgroup and v2 hierarchies without the memory controller have) and
/// returns the level leaving the least memory available.
CgroupMemory cgroup_memory(const std::vector<CgroupDir>& dirs);

/// cgroup_memory() of this process (/proc/self/cgroup and /proc/self/mountinfo).
CgroupMemory cgroup_memory();

}  // namespace spool
