#!/usr/bin/env bash
# Resident CPU decode against the machine's memory bound, per --act-bits setting (and SIMD target).
# The bound is the bytes a token reads (spool plan: every resident matrix + the routed experts of one
# token) over the memory read bandwidth measured by `spool plan`'s probe (best of 0.3 s of SIMD sums
# over a buffer of 4x the last-level cache, 256 MiB to 2 GiB: DRAM, as the weights are read; JSON
# mem_probe_bytes). This VM's bandwidth moves within minutes, so each bench run sits between two
# probes and is set against their mean; the settings take turns within every round. On a shared
# machine the load of others comes and goes within a run: the table also gives, per setting, the best
# repetition's decode against the highest probe of all its rounds (both from the quietest moments).
#
#   MODEL=/path/q4 ROUNDS=3 MODES="32 8" TARGETS="native AVX2" bench/decode_bound.sh
#   SPOOLS="/tmp/spool-before build/spool" MODEL=... bench/decode_bound.sh   # a baseline and a change
#   ALSO_PROBE_MIB=256 MODEL=... bench/decode_bound.sh   # also the probe over a 256 MiB buffer
#
# MODES: --act-bits values; TARGETS: "native" (what the CPU supports) and/or Highway target lists for
# SPOOL_HWY_TARGETS (e.g. AVX2: an AVX2-only CPU's kernels on this one); SPOOLS: spool binaries to
# compare (default $SPOOL, else build/spool), taking turns within every round as the settings do (each
# run against its own probes); with more than one, the table names them (file name). PROBE_SPOOL: the
# binary whose `spool plan` probes (default build/spool). ALSO_PROBE_MIB: a second probe over that
# many MiB (--mem-probe-mib) around each run, shown beside the first (e.g. 256: the size the probe
# had before 2026-12-07, mostly cache on a CPU with a 260 MiB L3). Writes $OUT
# (markdown table: per setting the decode tok/s, GB/s it implies, the probe's GB/s and the ratio, each
# round and the median), logs beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
SPOOLS_ABS=()
for b in ${SPOOLS:-${SPOOL:-build/spool}}; do SPOOLS_ABS+=("$(realpath "$b")"); done
MODEL=${MODEL:?MODEL=a model directory (e.g. spool convert --recipe q4 of spool synth --preset qwen3.6-35b-a3b)}
ROUNDS=${ROUNDS:-3} N=${N:-64} REPS=${REPS:-3} THREADS=${THREADS:-0}
MODES=${MODES:-"32 8"} TARGETS=${TARGETS:-native}
PROBE_SPOOL=$(realpath "${PROBE_SPOOL:-build/spool}") ALSO_PROBE_MIB=${ALSO_PROBE_MIB:-}
OUT=${OUT:-bench/results/decode-bound.md}
LOG=${OUT%.md}.log
: > "$LOG"

probe() {  # GB/s from spool plan's memory probe, the bytes a decoded token reads, the probe's buffer
  # (--disk-gbps: no disk probe, which would read the model's shard for a second)
  "$PROBE_SPOOL" plan -m "$MODEL" -t "$THREADS" --disk-gbps 1 --json "$@" 2>>"$LOG" |
    python3 -c "import json,sys; d=json.load(sys.stdin); print(d['mem_gbps'], d['active_bytes_per_token'], d['mem_probe_bytes'])"
}
also() {  # GB/s of the ALSO_PROBE_MIB probe, or - without it
  if [ -n "$ALSO_PROBE_MIB" ]; then probe --mem-probe-mib "$ALSO_PROBE_MIB" | cut -d' ' -f1; else echo -; fi
}
rows=()
for r in $(seq "$ROUNDS"); do
  for tgt in $TARGETS; do
    for ab in $MODES; do
      for SPOOL in "${SPOOLS_ABS[@]}"; do
        read -r g0 bpt pbytes < <(probe)
        a0=$(also)
        env_tgt=()
        [ "$tgt" = native ] || env_tgt=(SPOOL_HWY_TARGETS="$tgt")
        tps=$(env "${env_tgt[@]}" "$SPOOL" bench -m "$MODEL" -t "$THREADS" -p 0 -n "$N" -r "$REPS" --act-bits "$ab" -o json 2>>"$LOG" |
          python3 -c "import json,sys; d=json.load(sys.stdin); print(d[0]['avg_ts'], max(d[0]['samples_ts']), d[0]['backend'])")
        a1=$(also)
        read -r g1 _ _ < <(probe)
        bin=$([ "${#SPOOLS_ABS[@]}" -gt 1 ] && basename "$SPOOL" || echo -)
        rows+=("$r|$bin|$tgt|$ab|$tps|$g0|$g1|$bpt|$pbytes|$a0|$a1")
        echo "round $r ${bin/#-/} $tgt act-bits $ab: $tps tok/s, probe $g0 / $g1 GB/s over $pbytes B${ALSO_PROBE_MIB:+; $ALSO_PROBE_MIB MiB probe $a0 / $a1 GB/s}" |
          tee -a "$LOG" >&2
      done
    done
  done
done
printf '%s\n' "${rows[@]}" > "$LOG.rows"
python3 - "$MODEL" "$ROUNDS" "$N" "$REPS" "$LOG.rows" "$ALSO_PROBE_MIB" > "$OUT" <<'PY'
import statistics, sys, datetime, os
model, rounds, n, reps, rows, also_mib = sys.argv[1:7]
runs, sizes = {}, set()
for line in open(rows):
    r, binary, tgt, ab, tps, g0, g1, bpt, pbytes, a0, a1 = line.strip().split("|")
    tps, best, backend = tps.split(" ", 2)
    gbps = float(tps) * float(bpt) / 1e9
    bound = (float(g0) + float(g1)) / 2
    also = (float(a0) + float(a1)) / 2 if also_mib else None
    sizes.add(int(pbytes))
    runs.setdefault((binary, tgt, ab, backend), []).append((float(tps), gbps, bound, gbps / bound, also,
                                                           float(best) * float(bpt) / 1e9, max(float(g0), float(g1))))
bpt = float(line.strip().split("|")[7])
size = " / ".join(f"{s / 2**20:.0f} MiB" for s in sorted(sizes))
print(f"Resident decode of `{os.path.basename(model.rstrip('/'))}` ({bpt / 1e6:.1f} MB read per token), `spool bench -p 0 -n {n} -r {reps}`, "
      f"{rounds} interleaved rounds, each run between two `spool plan` memory probes over {size} "
      f"(4x the last-level cache){f' and two over {also_mib} MiB' if also_mib else ''}; {datetime.date.today()} (`bench/decode_bound.sh`).")
print()
several = any(b != "-" for b, *_ in runs)
extra_h = f" {also_mib} MiB probe GB/s | % of it |" if also_mib else ""
print(f"| {'binary | ' if several else ''}kernels | --act-bits | tok/s (median) | GB/s read | probe GB/s | % of the bound (median) | rounds (%) | "
      f"best: rep GB/s / highest probe |{extra_h}")
print(f"|{'---|' if several else ''}---|---|---|---|---|---|---|---|{'---|---|' if also_mib else ''}")
for (binary, tgt, ab, backend), v in runs.items():
    med = statistics.median(x[3] for x in v)
    extra = ""
    if also_mib:
        extra = f" {statistics.median(x[4] for x in v):.1f} | {100 * statistics.median(x[1] / x[4] for x in v):.0f}% |"
    print(f"| {binary + ' | ' if several else ''}{backend}{'' if tgt == 'native' else ' (SPOOL_HWY_TARGETS=' + tgt + ')'} | {ab} | {statistics.median(x[0] for x in v):.1f} | "
          f"{statistics.median(x[1] for x in v):.1f} | {statistics.median(x[2] for x in v):.1f} | {100 * med:.0f}% | "
          f"{' / '.join(f'{100 * x[3]:.0f}' for x in v)} | {max(x[5] for x in v):.1f} / {max(x[6] for x in v):.1f} = "
          f"{100 * max(x[5] for x in v) / max(x[6] for x in v):.0f}% |{extra}")
PY
cat "$OUT"
