#!/usr/bin/env bash
# Expert-streaming benchmark (not in CI; needs root for the memory cgroup and drop_caches).
# Writes a synthetic Qwen3.6-35B-A3B-shaped checkpoint larger than a cgroup memory limit,
# measures the disk's direct-read bandwidth with fio, then runs spool generate inside the
# cgroup over cache budgets and K (--max-active-experts) and prints a markdown table.
#   bench/stream.sh                        # defaults below
#   LAYERS=8 LIMIT_GB=6 bench/stream.sh    # bigger model, other limit
set -euo pipefail
cd "$(dirname "$0")/.."
LAYERS=${LAYERS:-4}                 # 4 layers of the 35B shape = 8.2 GB in bf16
LIMIT_GB=${LIMIT_GB:-4}             # cgroup memory limit (model must be >= 1.5x this)
BUDGETS=${BUDGETS:-"0.5 1 2"}       # --cache-budget-gb values
KS=${KS:-"0 4 2"}                   # --max-active-experts values (0 = native top-8)
TOKENS=${TOKENS:-32}
THREADS=${THREADS:-$(nproc)}
DIR=${SPOOL_BENCH_DIR:-$HOME/.cache/spool-bench}
MODEL=$DIR/qwen3.6-35b-a3b-${LAYERS}l
OUT=bench/results/stream.md

scripts/setup.sh >/dev/null
command -v fio >/dev/null || { sudo_cmd=(); [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo); "${sudo_cmd[@]}" apt-get install -y -qq fio >/dev/null; }
[ "$(id -u)" -eq 0 ] || { echo "stream.sh: run as root (memory cgroup, drop_caches)"; exit 1; }

if [ ! -f "$MODEL/config.json" ]; then
  rm -rf "$MODEL"
  build/spool synth --preset qwen3.6-35b-a3b --layers "$LAYERS" --out "$MODEL"
fi
model_bytes=$(du -sbL "$MODEL" | cut -f1)
limit_bytes=$((LIMIT_GB * 1024 * 1024 * 1024))
python3 -c "import sys; m,l=$model_bytes,$limit_bytes; sys.exit(0 if m >= 1.5*l else 1)" ||
  { echo "stream.sh: model ($model_bytes B) is not >= 1.5x the limit ($limit_bytes B); raise LAYERS or lower LIMIT_GB"; exit 1; }

# Memory cgroup (v2 memory.max, else v1 memory.limit_in_bytes).
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  CG=/sys/fs/cgroup/spool-bench; mkdir -p $CG; echo "$limit_bytes" > $CG/memory.max; PEAK=$CG/memory.peak
else
  CG=/sys/fs/cgroup/memory/spool-bench; mkdir -p $CG; echo "$limit_bytes" > $CG/memory.limit_in_bytes; PEAK=$CG/memory.max_usage_in_bytes
fi

# Physical limit: direct random reads of expert-sized blocks, 8 in parallel (as spool reads).
expert_mb=6
shard=$(ls "$MODEL"/*.safetensors | head -1)
sync; echo 3 > /proc/sys/vm/drop_caches
disk_mbs=$(fio --name=probe --filename="$shard" --readonly --direct=1 --rw=randread --bs=${expert_mb}M --ioengine=psync \
  --numjobs=8 --group_reporting --runtime=10 --time_based --output-format=json 2>/dev/null |
  python3 -c "import json,sys; print(round(json.load(sys.stdin)['jobs'][0]['read']['bw']/1024, 1))")
echo "disk direct-read bandwidth (fio, ${expert_mb} MB random reads x 8): $disk_mbs MB/s"

rows=()
for k in $KS; do
  for b in $BUDGETS; do
    sync; echo 3 > /proc/sys/vm/drop_caches
    [ -f "$PEAK" ] && echo 0 > "$PEAK" 2>/dev/null || true
    json=$(sh -c "echo \$\$ > $CG/cgroup.procs; exec build/spool generate -m '$MODEL' --prompt 'The whale' --temp 0 \
      --max-tokens $TOKENS --threads $THREADS --stream --no-page-cache --cache-budget-gb $b --max-active-experts $k --json" 2>/dev/null)
    cg_peak=$(cat "$PEAK" 2>/dev/null || echo 0)
    rows+=("$(python3 - "$json" "$k" "$b" "$disk_mbs" "$cg_peak" "$limit_bytes" <<'PY'
import json, sys
d = json.loads(sys.argv[1]); k, b, disk, cg, lim = sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
s, t = d["stats"], d["timings"]
mbt = s["bytes_read_per_token"] / 1e6
tps = t["decode_tok_s"]
ach = mbt * tps
print(f"| {k if k != '0' else '8 (native)'} | {b} | {100*s['cache_hit_rate']:.1f}% | {mbt:.1f} | {tps:.2f} | "
      f"{d['peak_rss_bytes']/2**30:.2f} | {cg/2**30:.2f} / {lim/2**30:.0f} | {ach:.0f} | {100*ach/disk:.0f}% |")
PY
)")
    echo "${rows[-1]}"
  done
done
{
  echo "Expert streaming, synthetic Qwen3.6-35B-A3B shape ($LAYERS layers, $(python3 -c "print(round($model_bytes/2**30,1))") GiB bf16)"
  echo "in a ${LIMIT_GB} GiB memory cgroup, $THREADS threads, O_DIRECT, $TOKENS tokens, $(date -u +%Y-%m-%d)."
  echo "Disk direct-read bandwidth (fio, ${expert_mb} MB random reads x 8): **$disk_mbs MB/s**."
  echo
  echo "| K | cache GB | hit rate | MB/token | decode tok/s | peak RSS GiB | cgroup peak / limit GiB | disk MB/s | of disk limit |"
  echo "|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} | tee "$OUT"
