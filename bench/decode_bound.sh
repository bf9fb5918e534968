#!/usr/bin/env bash
# Resident CPU decode against the machine's memory bound, per --act-bits setting (and SIMD target).
# The bound is the bytes a token reads (spool plan: every resident matrix + the routed experts of one
# token) over the memory read bandwidth measured by `spool plan`'s probe (best of 0.3 s of a
# 256 MiB sum on the run's threads). This VM's bandwidth moves within minutes, so each bench run sits
# between two probes and is set against their mean; the settings take turns within every round.
#
#   MODEL=/path/q4 ROUNDS=3 MODES="32 8" TARGETS="native AVX2" bench/decode_bound.sh
#
# MODES: --act-bits values; TARGETS: "native" (what the CPU supports) and/or Highway target lists for
# SPOOL_HWY_TARGETS (e.g. AVX2: an AVX2-only CPU's kernels on this one). Writes $OUT (markdown table:
# per setting the decode tok/s, GB/s it implies, the probe's GB/s and the ratio, each round and the
# median), logs beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
SPOOL=$(realpath "${SPOOL:-build/spool}")
MODEL=${MODEL:?MODEL=a model directory (e.g. spool convert --recipe q4 of spool synth --preset qwen3.6-35b-a3b)}
ROUNDS=${ROUNDS:-3} N=${N:-64} REPS=${REPS:-3} THREADS=${THREADS:-0}
MODES=${MODES:-"32 8"} TARGETS=${TARGETS:-native}
OUT=${OUT:-bench/results/decode-bound.md}
LOG=${OUT%.md}.log
: > "$LOG"

probe() {  # GB/s from spool plan's memory probe, and the bytes a decoded token reads
  "$SPOOL" plan -m "$MODEL" -t "$THREADS" --json 2>>"$LOG" |
    python3 -c "import json,sys; d=json.load(sys.stdin); print(d['mem_gbps'], d['active_bytes_per_token'])"
}
rows=()
for r in $(seq "$ROUNDS"); do
  for tgt in $TARGETS; do
    for ab in $MODES; do
      read -r g0 bpt < <(probe)
      env_tgt=()
      [ "$tgt" = native ] || env_tgt=(SPOOL_HWY_TARGETS="$tgt")
      tps=$(env "${env_tgt[@]}" "$SPOOL" bench -m "$MODEL" -t "$THREADS" -p 0 -n "$N" -r "$REPS" --act-bits "$ab" -o json 2>>"$LOG" |
        python3 -c "import json,sys; d=json.load(sys.stdin); print(d[0]['avg_ts'], d[0]['backend'])")
      read -r g1 _ < <(probe)
      rows+=("$r|$tgt|$ab|$tps|$g0|$g1|$bpt")
      echo "round $r $tgt act-bits $ab: $tps tok/s, probe $g0 / $g1 GB/s" | tee -a "$LOG" >&2
    done
  done
done
printf '%s\n' "${rows[@]}" > "$LOG.rows"
python3 - "$MODEL" "$ROUNDS" "$N" "$REPS" "$LOG.rows" > "$OUT" <<'PY'
import statistics, sys, datetime, os
model, rounds, n, reps, rows = sys.argv[1:6]
runs = {}
for line in open(rows):
    r, tgt, ab, tps, g0, g1, bpt = line.strip().split("|")
    tps, backend = tps.split(" ", 1)
    gbps = float(tps) * float(bpt) / 1e9
    bound = (float(g0) + float(g1)) / 2
    runs.setdefault((tgt, ab, backend), []).append((float(tps), gbps, bound, gbps / bound))
bpt = float(line.strip().split("|")[-1])
print(f"Resident decode of `{os.path.basename(model.rstrip('/'))}` ({bpt / 1e6:.1f} MB read per token), `spool bench -p 0 -n {n} -r {reps}`, "
      f"{rounds} interleaved rounds, each run between two `spool plan` memory probes; {datetime.date.today()} (`bench/decode_bound.sh`).")
print()
print("| kernels | --act-bits | tok/s (median) | GB/s read | probe GB/s | % of the bound (median) | rounds (%) |")
print("|---|---|---|---|---|---|---|")
for (tgt, ab, backend), v in runs.items():
    med = statistics.median(x[3] for x in v)
    print(f"| {backend}{'' if tgt == 'native' else ' (SPOOL_HWY_TARGETS=' + tgt + ')'} | {ab} | {statistics.median(x[0] for x in v):.1f} | "
          f"{statistics.median(x[1] for x in v):.1f} | {statistics.median(x[2] for x in v):.1f} | {100 * med:.0f}% | "
          f"{' / '.join(f'{100 * x[3]:.0f}' for x in v)} |")
PY
cat "$OUT"
