#!/usr/bin/env bash
# The expert-cache budget inside a memory cgroup whose usage already holds the model's pages.
# Usage: tests/e2e/cgroup_budget.sh SPOOL_BINARY BUILD_DIR
#
# For each memory cgroup hierarchy this machine lets root write (v2: a cgroup2 mount whose
# cgroup.controllers has memory; v1: the memory controller's mount), it creates an outer group
# with a limit and an inner group without one (spool must walk up to find the limit), reads a
# scratch copy of the demo model into the page cache from inside the inner group (so the
# group's usage holds the model's pages, as after an earlier run), then checks:
#   1. `spool plan` reports available = limit - (usage - inactive file), not limit - usage;
#   2. with the limit set so that the auto budget lands inside (0, experts), `spool generate
#      --stream --json` picks the budget `spool plan` computes for the same settings (same
#      components exactly; the two processes' own usage differs by a few pages).
# Needs root and a writable cgroup filesystem. Without them it fails when CI is set and exits
# 77 (ctest SKIP_RETURN_CODE: reported as skipped) otherwise. Prints which version ran.
set -euo pipefail
spool="$1"
build="$2"
model="$build/models/spool-demo-moe"
work="$build/test-tmp/cgroup_budget_$$"
MiB=$((1 << 20))

skip_or_fail() {
  if [ -n "${CI:-}" ]; then
    echo "cgroup_budget: FAIL: $1 (CI is set: this test must run here; give the job root and a writable cgroup filesystem)" >&2
    exit 1
  fi
  echo "cgroup_budget: SKIP: $1"
  exit 77
}
die() {
  echo "cgroup_budget: FAIL: $*" >&2
  exit 1
}

[ "$(id -u)" -eq 0 ] || skip_or_fail "needs root to create memory cgroups"
[ -x "$spool" ] || die "no spool binary at $spool"
[ -f "$model/config.json" ] || die "no demo model at $model"

# Mount point and root of the v1 memory hierarchy and of the cgroup2 hierarchy (mountinfo:
# fields after " - " are fstype, source, super options).
read_mounts() {
  awk '{ for (i = 1; i <= NF; i++) if ($i == "-") break;
         fs = $(i + 1); so = "," $(i + 3) ",";
         if (fs == "cgroup2" && !v2) { print "v2", $4, $5; v2 = 1 }
         if (fs == "cgroup" && so ~ /,memory,/ && !v1) { print "v1", $4, $5; v1 = 1 } }' /proc/self/mountinfo
}
v1_root="" v1_mnt="" v2_root="" v2_mnt=""
while read -r v root mnt; do
  if [ "$v" = v1 ]; then v1_root=$root v1_mnt=$mnt; else v2_root=$root v2_mnt=$mnt; fi
done < <(read_mounts)

# This process's cgroup path in a hierarchy, as a directory under its mount.
cg_dir() {  # version mount root
  local path
  if [ "$1" = 2 ]; then path=$(sed -n 's/^0:://p' /proc/self/cgroup | head -1)
  else path=$(awk -F: '("," $2 ",") ~ /,memory,/ { print $3; exit }' /proc/self/cgroup); fi
  [ "$3" != "/" ] && path=${path#"$3"}
  echo "$2${path%/}"
}

versions=()
if [ -n "$v2_mnt" ] && grep -qw memory "$v2_mnt/cgroup.controllers" 2>/dev/null; then versions+=(2); fi
if [ -n "$v1_mnt" ]; then versions+=(1); fi
[ ${#versions[@]} -gt 0 ] || skip_or_fail "no memory cgroup controller is mounted (v1 memory or cgroup2 with memory)"

mkdir -p "$work"
outer=""
cleanup() {
  [ -n "$outer" ] && { rmdir "$outer/run" 2>/dev/null || true; rmdir "$outer" 2>/dev/null || true; }
  rm -rf "$work"
}
trap cleanup EXIT

# A private copy of the model: no other process maps it, so its pages can be dropped and then
# charged to the test group when read from inside it.
cp -r "$model" "$work/model"
sync
python3 - "$work/model" <<'PY'
import os, sys
for f in os.listdir(sys.argv[1]):
    fd = os.open(os.path.join(sys.argv[1], f), os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
PY
model_bytes=$(stat -c %s "$work"/model/*.safetensors | awk '{ n += $1 } END { print n }')  # sizes only: reading them here would charge the pages to this group

ran=()
for ver in "${versions[@]}"; do
  if [ "$ver" = 2 ]; then
    base=$v2_mnt
    # v2: controllers are enabled per level; a group with processes cannot enable them for
    # children (except the root), so the test groups hang off the mount's root.
    grep -qw memory "$base/cgroup.subtree_control" || echo +memory > "$base/cgroup.subtree_control" 2>/dev/null ||
      { echo "cgroup_budget: v2: cannot enable the memory controller under $base"; continue; }
    limit_f=memory.max usage_f=memory.current inactive_key=inactive_file
  else
    base=$(cg_dir 1 "$v1_mnt" "$v1_root")
    limit_f=memory.limit_in_bytes usage_f=memory.usage_in_bytes inactive_key=total_inactive_file
  fi
  outer="$base/spool-cgtest-$$"
  mkdir "$outer" 2>/dev/null || { echo "cgroup_budget: v$ver: cannot create $outer"; outer=""; continue; }
  [ "$ver" = 2 ] && { echo +memory > "$outer/cgroup.subtree_control" || die "v2: cannot enable memory in $outer"; }
  mkdir "$outer/run"
  inner="$outer/run"
  in_cg() { sh -c 'echo $$ > "$0/cgroup.procs"; exec "$@"' "$inner" "$@"; }
  stat_of() { awk -v k="$inactive_key" '$1 == k { print $2 }' "$outer/memory.stat"; }

  # The group's limit must be the tightest constraint plan sees: below the machine's
  # MemAvailable (a busy machine can have less than 2 GiB available outside the group).
  avail_kb=$(awk '$1 == "MemAvailable:" { print $2 }' /proc/meminfo)
  L0=$((2048 * MiB))
  [ $((avail_kb * 1024 / 2)) -lt "$L0" ] && L0=$((avail_kb * 1024 / 2 / MiB * MiB))
  [ "$L0" -ge $((256 * MiB)) ] || die "the machine has only $((avail_kb / 1024)) MiB available: too little to test a cgroup limit"
  echo "$L0" > "$outer/$limit_f"
  in_cg cat "$work"/model/*.safetensors > /dev/null
  # memory.stat lags the page counters: the kernel flushes per-CPU statistics every 2 s.
  for _ in $(seq 1 40); do
    inactive=$(stat_of)
    [ "$inactive" -ge $((model_bytes * 9 / 10)) ] && break
    sleep 0.25
  done
  [ "$inactive" -ge $((model_bytes * 9 / 10)) ] ||
    die "v$ver: the group's inactive file pages ($inactive) do not hold the model ($model_bytes bytes) after reading it inside the group"

  common=(-m "$work/model" --threads 2 --prefill-step-size 64)
  plan() { in_cg "$spool" plan "${common[@]}" --stream --ctx-size 32 --json; }
  plan > /dev/null  # warm-up: the binary's own pages
  sleep 2.5         # one statistics flush period
  p0=$(plan)
  a0=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["available_bytes"])' "$p0")
  # What plan read of the binding cgroup while it ran (its own process's pages included).
  read -r cg_dir cg_limit usage inactive < <(python3 -c 'import json,sys; c=json.loads(sys.argv[1])["cgroup"]; print(c["dir"], c["limit_bytes"], c["usage_bytes"], c["inactive_file_bytes"])' "$p0")
  expected=$((L0 - (usage - inactive)))
  echo "cgroup_budget: v$ver: plan read $cg_dir: limit $cg_limit, usage $usage, inactive file $inactive (model $model_bytes); available $a0, expected $expected"
  [ "$cg_limit" = "$L0" ] || die "v$ver: plan's binding cgroup limit is $cg_limit ($cg_dir), not the test group's $L0 (the walk up from the inner group)"
  [ "$inactive" -ge $((model_bytes * 9 / 10)) ] ||
    die "v$ver: plan read $inactive inactive file bytes: the model's page cache ($model_bytes) is not counted as reclaimable"
  diff=$((a0 > expected ? a0 - expected : expected - a0))  # two reads, microseconds apart
  [ "$diff" -le $((2 * MiB)) ] ||
    die "v$ver: plan's available_bytes $a0 is not limit - (usage - inactive file) = $expected: page cache counted as used?"

  # A limit that leaves about half of the experts' bytes to the auto budget.
  L=$(python3 - "$p0" "$L0" "$a0" <<'PY'
import json, sys
p, L0, a0 = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
c = p["components"]
base = sum(c[k] for k in ("dense_resident", "kv", "recurrent_state", "kv_grow_transient", "workspace", "tokenizer", "runtime"))
unreclaimable = L0 - a0
print((unreclaimable + p["reserve_bytes"] + base + p["expert_bytes"] // 2) // 4096 * 4096)
PY
)
  echo "$L" > "$outer/$limit_f"
  p=$(plan)
  g=$(in_cg "$spool" generate "${common[@]}" --stream --prompt-ids 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16 -n 16 --temp 0 --json \
      2> "$work/gen.err") || { cat "$work/gen.err" >&2; die "v$ver: spool generate failed in the group"; }
  python3 - "$ver" "$p" "$g" "$L" <<'PY' || die "v$ver: see above"
import json, sys
ver, p, g, L = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4])
m, c = g["stats"]["memory"], p["components"]
MiB = 1 << 20
print(f"cgroup_budget: v{ver}: limit {L}: plan budget {p['cache_budget_bytes']} (available {p['available_bytes']}), "
      f"generate budget {m['cache_budget_bytes']} (available {m['available_bytes']}; {m['available_source']}); experts {p['expert_bytes']}")
ok = True
def check(cond, msg):
    global ok
    if not cond:
        print("cgroup_budget: " + msg, file=sys.stderr)
        ok = False
check(m["streaming"] and m["cache_budget_auto"], "generate did not stream with the auto budget")
check(f"cgroup v{ver}" in m["available_source"], f"generate's available memory does not come from the v{ver} cgroup: {m['available_source']}")
check(m["ctx_size"] == p["ctx_size"] == 32 and m["prefill_step"] == p["prefill_step"] == 64, "ctx / prefill step differ")
for gk, pk in (("dense_resident", ["dense_resident"]), ("state", ["kv", "recurrent_state", "kv_grow_transient"]),
               ("workspace", ["workspace"]), ("tokenizer", ["tokenizer"])):
    check(m[gk] == sum(c[k] for k in pk), f"component {gk}: generate {m[gk]} != plan {sum(c[k] for k in pk)}")
check(m["reserve_bytes"] == p["reserve_bytes"], "reserve differs")
bp, bg = p["cache_budget_bytes"], m["cache_budget_bytes"]
# The budget must be a real one: neither 0 (page cache counted as used) nor capped at the experts.
check(0 < bp < p["expert_bytes"], f"plan's budget {bp} is not inside (0, experts): the limit did not leave a partial budget")
# The two processes' own usage (stacks, heap, page tables) differs by a few pages; the kernel
# charges in batches of 64 pages per CPU.
check(abs(bg - bp) <= 2 * MiB, f"generate's auto budget {bg} != plan's {bp} (more than 2 MiB apart)")
sys.exit(0 if ok else 1)
PY
  ran+=("v$ver")
  rmdir "$inner" "$outer" 2>/dev/null || true
  outer=""
done
[ ${#ran[@]} -gt 0 ] || skip_or_fail "no memory cgroup could be created"
echo "cgroup_budget: PASS on cgroup ${ran[*]}"
