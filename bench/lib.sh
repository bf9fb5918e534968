# Shared pieces of the bench scripts (sourced: compare.sh, mtp.sh). Memory cgroups need root.
#
#   run_in CG CMD...      runs CMD inside the memory cgroup CG (a directory; empty: no cgroup),
#                         prints its stdout, leaves its peak RSS (ru_maxrss, bytes) in $TMP/maxrss
#   mem_cgroup NAME GIB   makes a fresh memory cgroup of GIB GiB (fractional allowed) and prints its
#                         directory: cgroup v1's memory controller (/sys/fs/cgroup/memory/NAME,
#                         memory.limit_in_bytes) or cgroup v2 (/sys/fs/cgroup/NAME, memory.max)
#   cg_reset CG           before a run: drops the page cache, empties CG and resets its peak
#   cg_peak CG            CG's peak usage in bytes since the last reset (0 when the kernel keeps none)
#   disk_of PATH          the whole disk under PATH as MAJ:MIN (read throttles apply to disks)
#   throttle_cgroup NAME DEV BPS
#                         a cgroup reading at most BPS bytes/s from disk DEV (v1 blkio or v2 io); prints its directory

run_in() {
  local cg=$1; shift
  python3 - "$cg" "$TMP/maxrss" "$@" <<'PY'
import os, resource, subprocess, sys
cg, out, cmd = sys.argv[1], sys.argv[2], sys.argv[3:]
def enter():
    if cg:
        with open(os.path.join(cg, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
p = subprocess.run(cmd, preexec_fn=enter, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
open(out, "w").write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024))
sys.stdout.write(p.stdout.decode())
sys.exit(p.returncode)
PY
}

mem_cgroup() {
  local name=$1 gib=$2 cg limit knob
  # A whole number of pages: some kernels (a Firecracker VM's) store 0 for an unaligned limit.
  limit=$(python3 -c "import sys; print(int(float(sys.argv[1]) * 2**30) // 4096 * 4096)" "$gib")
  if [ -d /sys/fs/cgroup/memory ]; then
    cg=/sys/fs/cgroup/memory/$name knob=memory.limit_in_bytes
  elif grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
    echo +memory > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
    cg=/sys/fs/cgroup/$name knob=memory.max
  else
    echo "bench/lib.sh: no memory cgroup controller (cgroup v1 memory or v2 with memory)" >&2
    return 1
  fi
  rmdir "$cg" 2>/dev/null || true  # a fresh group: lowering the limit of one still charged fails (EBUSY)
  mkdir -p "$cg"
  echo "$limit" > "$cg/$knob"
  [ "$(cat "$cg/$knob")" = "$limit" ] || { echo "bench/lib.sh: could not set $cg's limit to $limit" >&2; return 1; }
  echo "$cg"
}

cg_reset() {
  local cg=$1
  sync; echo 3 > /proc/sys/vm/drop_caches
  echo 0 > "$cg/memory.force_empty" 2>/dev/null || true
  echo 0 > "$cg/memory.max_usage_in_bytes" 2>/dev/null || true
}

cg_peak() {
  local cg=$1
  if [ -f "$cg/memory.max_usage_in_bytes" ]; then cat "$cg/memory.max_usage_in_bytes"
  elif [ -f "$cg/memory.peak" ]; then cat "$cg/memory.peak"
  else echo 0; fi
}

# The whole disk under a path, as MAJ:MIN (throttles apply to disks, not partitions).
disk_of() {
  local d sys
  d=$(stat -c '%Hd:%Ld' "$(realpath "$1")")
  sys=/sys/dev/block/$d
  [ -e "$sys" ] || { echo "bench/lib.sh: no block device $d under $1 (tmpfs or overlay?)" >&2; return 1; }
  if [ -f "$sys/partition" ]; then d=$(cat "$(realpath "$sys/..")/dev"); fi
  echo "$d"
}

# A cgroup reading at most BPS bytes/s from disk DEV; prints its directory.
throttle_cgroup() {
  local name=$1 dev=$2 bps=$3 cg
  if [ -f /sys/fs/cgroup/blkio/blkio.throttle.read_bps_device ]; then
    cg=/sys/fs/cgroup/blkio/$name
    mkdir -p "$cg"
    echo "$dev $bps" > "$cg/blkio.throttle.read_bps_device"
  elif grep -qw io /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
    echo +io > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
    cg=/sys/fs/cgroup/$name
    mkdir -p "$cg"
    echo "$dev rbps=$bps" > "$cg/io.max"
  else
    echo "bench/lib.sh: no blkio (v1) or io (v2) cgroup controller" >&2
    return 1
  fi
  echo "$cg"
}
