#!/usr/bin/env bash
# Expert parallelism over loopback MPI (docs/distributed.md): 1, 2 and 4 ranks on this machine, each
# rank in its own memory cgroup of FRAC x the model's file bytes, its experts streamed with O_DIRECT
# through its own cache (`--stream --no-page-cache`, budget auto: what the cgroup leaves), the
# machine's cores shared equally. One process in one such cgroup is the baseline: the point is the
# memory the ranks pool. Rank counts take turns within every round (this VM's disk and memory
# bandwidth move within minutes). Needs root (cgroups, drop_caches) and mpirun.
#
#   MODEL=/path/q35-q4 RANKS="1 2 4" FRAC=0.35 ROUNDS=2 P=64 N=32 bench/multi.sh
#
# Writes $OUT (markdown table: per rank count the median decode and prefill t/s over the rounds,
# bytes between ranks per token row, rank 0's share of time in collectives, each rank's peak RSS),
# logs beside it. DROP=0 skips dropping the page cache before each run (experts are read with O_DIRECT
# anyway; the drop keeps the dense part's first reads honest). BPS=N (bytes/s) also throttles each
# rank's reads from the model's disk to N in its own blkio / io cgroup: every rank, and the one
# process, gets a disk of that speed, as machines that each stream from their own SSD.
set -euo pipefail
cd "$(dirname "$0")/.."
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
source bench/lib.sh
SPOOL=$(realpath "${SPOOL:-build/spool}")
MODEL=${MODEL:?MODEL=a model directory (e.g. spool convert --recipe q4 of spool synth --preset qwen3.6-35b-a3b)}
RANKS=${RANKS:-"1 2 4"} FRAC=${FRAC:-0.35} ROUNDS=${ROUNDS:-2} P=${P:-64} N=${N:-32} REPS=${REPS:-2}
OUT=${OUT:-bench/results/multi.md}
LOG=${OUT%.md}.log
: > "$LOG"
command -v mpirun >/dev/null || { echo "multi.sh: mpirun not found (scripts/setup.sh installs Open MPI)" >&2; exit 1; }
bytes=$(du -b --apparent-size -c "$MODEL"/*.safetensors | tail -1 | cut -f1)
gib=$(python3 -c "print($bytes * $FRAC / 2**30)")
cores=$(nproc)
BPS=${BPS:-}
dev=
[ -z "$BPS" ] || dev=$(disk_of "$MODEL")

run_ranks() {  # run_ranks R ROUND: prints rank 0's bench output
  local R=$1 round=$2 t cgs=() r
  t=$(( cores / R )); [ "$t" -ge 1 ] || t=1
  if [ "${DROP:-1}" = 1 ]; then sync; echo 3 > /proc/sys/vm/drop_caches; fi  # (DROP=0: keep the page cache, e.g. a quick check)
  local ios=()
  for r in $(seq 0 $((R - 1))); do
    cgs+=("$(mem_cgroup "spool_multi_${R}_$r" "$gib")")
    [ -z "$BPS" ] || ios+=("$(throttle_cgroup "spool_multi_io_${R}_$r" "$dev" "$BPS")")
  done
  local args=(bench -m "$MODEL" -t "$t" -p "$P" -n "$N" -r "$REPS" --stream --no-page-cache)
  # (IOBASE empty: no read throttle; else rank r also joins ${IOBASE}_r)
  local iob=; [ -z "$BPS" ] || iob=${ios[0]%_0}
  if [ "$R" = 1 ]; then
    IOBASE=$iob run_in "${cgs[0]}" sh -c '[ -z "$IOBASE" ] || echo $$ > "${IOBASE}_0/cgroup.procs"; exec "$0" "$@"' "$SPOOL" "${args[@]}"
  else
    # Each rank moves itself into its own cgroups, then becomes spool.
    CGBASE=${cgs[0]%_0} IOBASE=$iob mpirun --allow-run-as-root --oversubscribe --bind-to none -x CGBASE -x IOBASE -n "$R" \
      sh -c 'echo $$ > "${CGBASE}_${OMPI_COMM_WORLD_RANK}/cgroup.procs" && { [ -z "$IOBASE" ] || echo $$ > "${IOBASE}_${OMPI_COMM_WORLD_RANK}/cgroup.procs"; } && exec "$0" "$@"' "$SPOOL" "${args[@]}" 2>>"$LOG"
  fi
  for cg in "${cgs[@]}" "${ios[@]}"; do rmdir "$cg" 2>/dev/null || true; done
}

rows=()
for round in $(seq "$ROUNDS"); do
  for R in $RANKS; do
    if ! out=$(run_ranks "$R" "$round"); then  # (e.g. killed in its cgroup: FRAC too small for the process)
      echo "round $round, $R rank(s): the run failed (see $LOG)" | tee -a "$LOG" >&2
      continue
    fi
    echo "$out" >> "$LOG"
    pp=$(echo "$out" | awk -F'|' -v t="pp$P" '$7 ~ " "t" " {print $8}' | awk '{print $1}')
    tg=$(echo "$out" | awk -F'|' -v t="tg$N" '$7 ~ " "t" " {print $8}' | awk '{print $1}')
    comm=$(echo "$out" | grep '^expert parallelism:' || echo "-")
    rss=$(echo "$out" | grep '^peak RSS' | cut -d' ' -f3-)
    rows+=("$R|$round|$tg|$pp|$comm|$rss")
    echo "round $round, $R rank(s): tg $tg t/s, pp $pp t/s; $comm" | tee -a "$LOG" >&2
  done
done

python3 - "$OUT" "$MODEL" "$FRAC" "$gib" "$cores" "$P" "$N" "${BPS:-0}" "${rows[@]}" <<'PY'
import re, statistics, sys, datetime
out, model, frac, gib, cores, P, N, bps = sys.argv[1:9]
rows = [r.split("|") for r in sys.argv[9:]]
bps_note = f", each rank's reads from the disk throttled to {float(bps) / 1e9:g} GB/s in its own cgroup" if float(bps) > 0 else ""
by = {}
for R, rnd, tg, pp, comm, rss in rows:
    by.setdefault(int(R), []).append((float(tg or 0), float(pp or 0), comm, rss))
base = statistics.median(t for t, _, _, _ in by.get(1, [(0, 0, "", "")])) or None
with open(out, "w") as f:
    f.write(f"Expert parallelism over loopback MPI: `{model}`, each rank in a memory cgroup of {float(frac):.2f} x the model's files "
            f"({float(gib):.2f} GiB), experts streamed with O_DIRECT through each rank's cache, {cores} cores shared equally{bps_note}; "
            f"`spool bench -p {P} -n {N} --stream --no-page-cache`, {datetime.date.today()} (`bench/multi.sh`).\n\n")
    f.write("| ranks | tg t/s (median) | pp t/s (median) | vs 1 rank (tg) | rounds (tg) | between ranks per token row | rank 0 in collectives | peak RSS per rank |\n")
    f.write("|---|---|---|---|---|---|---|---|\n")
    for R in sorted(by):
        v = by[R]
        tg = statistics.median(x[0] for x in v); pp = statistics.median(x[1] for x in v)
        comm = v[-1][2]
        per = re.search(r", ([0-9.]+ [KMG]?i?B) per token row", comm)
        coll = re.search(r"collectives ([0-9.]+) s of ([0-9.]+) s \(([0-9.]+)%\)", comm)
        rss = re.search(r"peak RSS per rank: (.*)$", comm)
        f.write(f"| {R} | {tg:.2f} | {pp:.2f} | {tg / base:.2f}x | {' / '.join(f'{x[0]:.2f}' for x in v)} | "
                f"{per.group(1) if per else '-'} | {coll.group(3) + '%' if coll else '-'} | {rss.group(1) if rss else v[-1][3]} |\n"
                if base else f"| {R} | {tg:.2f} | {pp:.2f} | - | - | - | - | - |\n")
print(open(out).read())
PY
