#!/usr/bin/env bash
# MLA expert streaming benchmark (issue 12; not in CI; root for the memory cgroup and drop_caches).
#
# A DeepSeek-V2-Lite-shaped synthetic checkpoint (MLA attention, 64 routed experts top-6 + 2
# shared, real widths, the first L layers for each L in LAYERS), converted to spool q4, decoded
# by `spool bench` twice: resident (--no-stream), then inside a memory cgroup at CAP_FRACTION
# (0.5) x the checkpoint's size, where the loader streams the routed experts from disk with the
# automatic cache budget. Reported per run: decode tok/s, expert-cache hit rate, MB read from
# disk per token, experts acquired per token, peak RSS (VmHWM), and the cgroup's own peak
# (memory.max_usage_in_bytes / memory.peak: page cache included). spool plan's view of the same
# cgroup (verdict, cache budget, expected hit rate) is listed per checkpoint.
# Writes bench/results/mla_stream.md.
#
#   bench/mla_stream.sh
#   PRESET=deepseek-v3-671b LAYERS=4 bench/mla_stream.sh   # V3 widths (7168 hidden, 256 experts)
#
# Checkpoints go to CKPT_DIR (default /work/ckpt): `spool synth --preset $PRESET --layers L`
# (bf16), then `spool convert --recipe q4`. The bf16 copy is deleted after conversion when it is
# larger than 5 GB (KEEP_BF16=1 keeps it); q4 copies over 5 GB are deleted at the end too
# (KEEP_Q4=1 keeps them).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
SPOOL=${SPOOL:-$BUILD/spool}
PRESET=${PRESET:-deepseek-v2-lite}
LAYERS=${LAYERS:-6 10}
CKPT_DIR=${CKPT_DIR:-/work/ckpt}
THREADS=${THREADS:-$(nproc)}
NGEN=${NGEN:-32}
REPS=${REPS:-2}
CAP_FRACTION=${CAP_FRACTION:-0.5}
OUT=${OUT:-bench/results/mla_stream.md}
TMP=$(mktemp -d)
CG=
cleanup() {
  [ -n "$CG" ] && rmdir "$CG" 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT

[ "$(id -u)" -eq 0 ] || { echo "mla_stream.sh: run as root (memory cgroup, drop_caches)"; exit 1; }
[ -x "$SPOOL" ] || { echo "mla_stream.sh: build spool first ($SPOOL)"; exit 1; }
mkdir -p "$CKPT_DIR"

# Memory cgroup (v2 memory.max, else v1 memory.limit_in_bytes); its limit is set per checkpoint.
if [ -f /sys/fs/cgroup/cgroup.controllers ] && grep -q memory /sys/fs/cgroup/cgroup.controllers; then
  CG=/sys/fs/cgroup/spool-mla-stream; mkdir -p $CG
  cg_limit() { echo "$1" > $CG/memory.max; }
  cg_peak() { cat $CG/memory.peak 2>/dev/null || echo 0; }
  cg_reset() { :; }
else
  CG=/sys/fs/cgroup/memory/spool-mla-stream; mkdir -p $CG
  cg_limit() { echo "$1" > $CG/memory.limit_in_bytes; }
  cg_peak() { cat $CG/memory.max_usage_in_bytes; }
  cg_reset() { echo 0 > $CG/memory.max_usage_in_bytes; }
fi

# in_cg CG CMD...: CMD inside the cgroup (CG empty: none).
in_cg() {
  local cg=$1; shift
  if [ -n "$cg" ]; then sh -c "echo \$\$ > $cg/cgroup.procs; exec \"\$@\"" sh "$@"; else "$@"; fi
}

# run MODEL CONFIG CG FLAGS: one `spool bench` tg run, page cache dropped first; appends a table row.
run() {
  local model=$1 config=$2 cg=$3 flags=$4 peak=0
  sync; echo 3 > /proc/sys/vm/drop_caches
  [ -n "$cg" ] && cg_reset
  # shellcheck disable=SC2086
  in_cg "$cg" "$SPOOL" bench -m "$model" -t "$THREADS" -p 0 -n "$NGEN" -r "$REPS" -o json $flags 2>"$TMP/bench.err" > "$TMP/bench.json" ||
    { echo "spool bench failed ($config):"; cat "$TMP/bench.err"; exit 1; }
  [ -n "$cg" ] && peak=$(cg_peak)
  python3 - "$config" "$TMP/bench.json" "$peak" >> "$TMP/rows.txt" <<'PY'
import json, sys
config, js, cg_peak = sys.argv[1], json.load(open(sys.argv[2])), int(sys.argv[3])
t = js[0]
stream = t["streaming"]
hit = f"{100 * t['cache_hit_rate']:.1f}%" if stream else "- (resident)"
mb = f"{t['bytes_read_per_token'] / 1e6:.1f}" if stream else "0"
exp = f"{t['experts_acquired_per_token']:.1f}" if stream else "-"
cg = f"{cg_peak / 2**30:.2f}" if cg_peak else "-"
print(f"| {config} | {t['avg_ts']:.2f} ± {t['stddev_ts']:.2f} | {hit} | {mb} | {exp} | {t['peak_rss_bytes'] / 2**30:.2f} | {cg} |")
PY
  tail -1 "$TMP/rows.txt"
}

: > "$TMP/models.txt"
for L in $LAYERS; do
  MODEL=$CKPT_DIR/$PRESET-${L}l-q4
  BF16=$CKPT_DIR/$PRESET-${L}l-bf16
  if [ ! -f "$MODEL/config.json" ]; then
    [ -f "$BF16/config.json" ] || "$SPOOL" synth --preset "$PRESET" --layers "$L" --out "$BF16" --threads "$THREADS"
    "$SPOOL" convert --model "$BF16" --out "$MODEL" --recipe q4
    if [ "${KEEP_BF16:-0}" != 1 ] && [ "$(du -sb "$BF16" | cut -f1)" -gt 5000000000 ]; then rm -rf "$BF16"; fi
  fi
  model_bytes=$(python3 -c "import os,sys; print(sum(os.path.getsize(os.path.join(sys.argv[1], f)) for f in os.listdir(sys.argv[1]) if f.endswith('.safetensors')))" "$MODEL")
  cap_bytes=$(python3 -c "print(int($model_bytes * $CAP_FRACTION))")
  cg_limit "$cap_bytes"
  sync; echo 3 > /proc/sys/vm/drop_caches
  # The planner's view inside the cgroup (verdict, cache budget, expected hit rate).
  in_cg "$CG" "$SPOOL" plan -m "$MODEL" --threads "$THREADS" --ctx-size $((NGEN + 1)) --json 2>/dev/null > "$TMP/plan.json" || true
  python3 - "$L" "$MODEL" "$model_bytes" "$cap_bytes" "$TMP/plan.json" >> "$TMP/models.txt" <<'PY'
import json, sys
L, model, model_bytes, cap, plan_path = sys.argv[1:6]
cfg = json.load(open(f"{model}/config.json"))
try:
    p = json.load(open(plan_path))
    plan = (f"plan in the cgroup: **{p['verdict']}**, cache budget {p['cache_budget_bytes'] / 2**30:.2f} GiB, "
            f"expected hit rate >= {100 * p['expected_hit_rate']:.0f}%, resident dense {p['resident_weight_bytes'] / 2**30:.2f} GiB, "
            f"KV {p['kv_bytes_per_token']} B/token")
except Exception:
    plan = "plan in the cgroup: no JSON"
print(f"- {L} layers ({cfg.get('first_k_dense_replace', 0)} dense): {int(model_bytes) / 2**30:.2f} GiB q4, cgroup limit "
      f"{int(cap) / 2**30:.2f} GiB; {plan}")
PY
  tail -1 "$TMP/models.txt"
  gib=$(python3 -c "print(f'{$model_bytes/2**30:.2f}')")
  run "$MODEL" "$L layers ($gib GiB), resident" "" "--no-stream"
  run "$MODEL" "$L layers ($gib GiB), cgroup ${CAP_FRACTION}x, streamed" "$CG" ""
  if [ "${KEEP_Q4:-0}" != 1 ] && [ "$model_bytes" -gt 5000000000 ]; then rm -rf "$MODEL"; fi
done

python3 - "$OUT" "$TMP/rows.txt" "$TMP/models.txt" "$PRESET" "$THREADS" "$NGEN" "$REPS" "$CAP_FRACTION" <<'PY'
import datetime, sys, platform
out, rows, models, preset, threads, ngen, reps, frac = sys.argv[1:9]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
with open(out, "w") as f:
    f.write(f"""MLA expert streaming (bench/mla_stream.sh): {threads} threads, {cpu}, {datetime.date.today()}.
Checkpoints: synthetic {preset} shape at real widths (MLA, kv_lora_rank 512 + 64 RoPE dims; 64 routed experts
top-6 + 2 shared), the first N layers, spool q4 (`spool convert --recipe q4`):
{open(models).read().rstrip()}

`spool bench -p 0 -n {ngen} -r {reps}` (tg{ngen}, random token ids, one warm-up run), page cache dropped before each row.
Resident: `--no-stream`. Cgroup: memory limit {frac} x the checkpoint (cgroup v1 memory.limit_in_bytes); the loader
streams the routed experts with the automatic cache budget.

The machine is shared with other work and was loaded during the run: tok/s is indicative only.
The figures that matter here are the hit rate and the MB read from disk per token.

| config | decode tok/s | expert hit rate | MB read from disk / token | experts acquired / token | peak RSS GiB (VmHWM) | cgroup peak GiB (incl. page cache) |
|---|---|---|---|---|---|---|
""")
    f.write(open(rows).read())
print(open(out).read())
PY
