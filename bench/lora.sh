#!/usr/bin/env bash
# What unmerged LoRA adapters cost prefill and decode (issue 33: "one rank-8 adapter costs <= 10%
# decode on the demo and on the 35B-shaped checkpoint with a rank-16 adapter on attention and
# experts"), with 0, 1 and 4 distinct adapters active in a batch. One `spool bench` invocation per
# model measures every D of DISTINCT side by side (--lora-distinct: repetitions interleaved across
# D, so the machine's drift falls on all rows alike), each adapter loaded 4 times (four adapters
# computationally: each has its own terms and row scales). Models:
#   demo   the demo model (build/models/spool-demo-moe) with its trained rank-8 adapter (ADAPTER,
#          default the build tree's copy of tests/data/lora/spool-demo-moe-dev: attention, Gated
#          DeltaNet and shared-expert linears, no routed experts);
#   synth  a Qwen3.6-35B-A3B-shaped synthetic of LAYERS layers (`spool synth`, bf16, then `spool
#          convert --recipe q4`) with a random rank-RANK (alpha 2 x RANK) adapter on attention, Gated
#          DeltaNet, the shared expert and the routed experts (bench/make_lora_adapter.py).
# Prints a markdown table (model, distinct adapters D, parallel sequences, pp t/s, tg t/s: medians of
# the repetitions; tg cost = 1 - tg t/s / the D = 0 row's) and writes it with the raw rows to OUT.
#
#   bench/lora.sh                                    # both models, LAYERS=2
#   MODELS=demo R=10 bench/lora.sh
#   MODELS=synth LAYERS=4 RANK=16 DIR=/tmp/x bench/lora.sh
#
# Environment: SPOOL_BIN (build/spool), MODELS ("demo synth"), ADAPTER, LAYERS (2), RANK (16),
# P (128), N (64), R (5), PARALLEL (1,4), DISTINCT (0,1,4), THREADS (nproc), DIR (/tmp/spool-lora-bench:
# the synthetic model and adapter, kept between runs), OUT (bench/results/lora.md), PYTHON (python3:
# the standard library only), SPOOL_FLAGS (added to every bench run).
# D = 0 runs with all adapters loaded and off (a row whose scale is 0 skips the LoRA products: the
# base cost); D > 0: sequence i of a batch runs adapter i mod D, so D = 4 with one sequence is one
# adapter (the pp rows run adapter 0).
set -euo pipefail
cd "$(dirname "$0")/.."
SPOOL=${SPOOL_BIN:-build/spool}
MODELS=${MODELS:-demo synth}
ADAPTER=${ADAPTER:-build/tests/data/lora/spool-demo-moe-dev}
LAYERS=${LAYERS:-2}
RANK=${RANK:-16}
P=${P:-128} N=${N:-64} R=${R:-5}
PARALLEL=${PARALLEL:-1,4}
DISTINCT=${DISTINCT:-0,1,4}
THREADS=${THREADS:-$(nproc)}
DIR=${DIR:-/tmp/spool-lora-bench}
OUT=${OUT:-bench/results/lora.md}
PYTHON=${PYTHON:-python3}
SPOOL_FLAGS=${SPOOL_FLAGS:-}
[ -x "$SPOOL" ] || { echo "lora.sh: no spool binary at $SPOOL (cmake --build build --target spool)"; exit 1; }
mkdir -p "$DIR"
t0=$SECONDS
say() { echo "[$((SECONDS - t0)) s] $*" >&2; }

# bench_model NAME MODEL_DIR ADAPTER_DIR: the bench JSON in $DIR/NAME.json, its table in $DIR/NAME.md
bench_model() {
  local name=$1 model=$2 adapter=$3 args
  args=(-m "$model" -p "$P" -n "$N" -r "$R" -t "$THREADS" --parallel "$PARALLEL" --lora-distinct "$DISTINCT"
    --lora "$adapter" --lora "$adapter" --lora "$adapter" --lora "$adapter")
  say "bench $name: spool bench ${args[*]} $SPOOL_FLAGS"
  # shellcheck disable=SC2086
  "$SPOOL" bench "${args[@]}" $SPOOL_FLAGS -o json > "$DIR/$name.json" 2> "$DIR/$name.log" ||
    { tail -20 "$DIR/$name.log"; exit 1; }
  echo "spool bench ${args[*]} $SPOOL_FLAGS" > "$DIR/$name.cmd"
}

load_start=$(cut -d' ' -f1 /proc/loadavg)
names=()
for m in $MODELS; do
  case "$m" in
  demo)
    [ -f "$ADAPTER/adapter_config.json" ] || { echo "lora.sh: no adapter at $ADAPTER (build the spool_test_data target or set ADAPTER)"; exit 1; }
    bench_model demo build/models/spool-demo-moe "$ADAPTER"
    names+=("demo|spool-demo-moe (bf16), trained rank-8 adapter")
    ;;
  synth)
    bf16=$DIR/q36-${LAYERS}l.bf16 q4=$DIR/q36-${LAYERS}l.q4 ad=$DIR/q36-${LAYERS}l.lora-r$RANK
    if [ ! -f "$q4/config.json" ]; then
      say "synth qwen3.6-35b-a3b, $LAYERS layers (bf16)"
      [ -f "$bf16/config.json" ] || "$SPOOL" synth --preset qwen3.6-35b-a3b --layers "$LAYERS" --out "$bf16" --no-check -t "$THREADS" > "$DIR/synth.log" 2>&1 ||
        { tail -20 "$DIR/synth.log"; exit 1; }
      say "convert --recipe q4"
      "$SPOOL" convert -m "$bf16" --recipe q4 -o "$q4" -t "$THREADS" > "$DIR/convert.log" 2>&1 || { tail -20 "$DIR/convert.log"; exit 1; }
    fi
    if [ ! -f "$ad/adapter_config.json" ]; then
      # The adapter is shaped from the bf16 checkpoint's headers (the q4 one stores packed codes).
      [ -f "$bf16/config.json" ] || "$SPOOL" synth --preset qwen3.6-35b-a3b --layers "$LAYERS" --out "$bf16" --no-check -t "$THREADS" > "$DIR/synth.log" 2>&1
      say "rank-$RANK adapter"
      "$PYTHON" bench/make_lora_adapter.py "$bf16" "$ad" --rank "$RANK" --alpha $((2 * RANK)) >&2
    fi
    rm -rf "$bf16"
    bench_model synth "$q4" "$ad"
    names+=("synth|Qwen3.6-35B-A3B shape, $LAYERS layers, q4, random rank-$RANK adapter (attention, Gated DeltaNet, shared and routed experts)")
    ;;
  *) echo "lora.sh: unknown model '$m' (demo or synth)"; exit 1 ;;
  esac
done
load_end=$(cut -d' ' -f1 /proc/loadavg)

"$PYTHON" - "$DIR" "$OUT" "$load_start" "$load_end" "$THREADS" "${names[@]}" <<'PY'
import json, os, platform, statistics, sys, time
d, out, l0, l1, threads = sys.argv[1:6]
models = [a.split("|", 1) for a in sys.argv[6:]]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.machine())
lines = [f"# LoRA adapters, unmerged: cost of 0 / 1 / 4 distinct adapters in a batch ({time.strftime('%Y-%m-%d')})", "",
         f"Machine: {cpu}, {os.cpu_count()} CPUs, {threads} threads; load average {l0} at the start, {l1} at the end. "
         "t/s: the median of the repetitions (mean ± sd and every sample in the raw rows below: other jobs share "
         "the machine, and the median resists their bursts); tg cost = 1 - tg t/s / the D = 0 row's of the same "
         "parallel (same invocation, repetitions interleaved across D); D = 0: the adapters loaded, every scale 0 "
         "(the base's products).", ""]
summary = ["| model | adapters distinct D | parallel | pp t/s | tg t/s | tg cost vs D=0 |", "|---|---:|---:|---:|---:|---:|"]
med = lambda r: statistics.median(r["samples_ts"])
raw = []
for name, label in models:
    rows = json.load(open(os.path.join(d, name + ".json")))
    cmd = open(os.path.join(d, name + ".cmd")).read().strip()
    pp = {r["lora_distinct"]: r for r in rows if r["n_gen"] == 0}
    tg = {(r["lora_distinct"], r["n_parallel"]): r for r in rows if r["n_gen"] > 0}
    par = sorted({p for _, p in tg})
    for (D, n), r in sorted(tg.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        base = tg.get((0, n))
        cost = f"{100 * (1 - med(r) / med(base)):+.1f}%" if base and D != 0 else "-"
        p = pp.get(D) if n == par[0] else None
        pps = f"{med(p):.1f}" if p else "-"
        summary.append(f"| {name} | {D} | {n} | {pps} | {med(r):.2f} | {cost} |")
    raw.append(f"### {name}: {label}")
    raw.append("")
    raw.append(f"`{cmd}` ({rows[0]['model_type']}, {rows[0]['backend']}, peak RSS {rows[0]['peak_rss_bytes'] / 2**20:.0f} MiB)")
    raw.append("")
    raw.append("| test | t/s mean ± sd | median | samples |")
    raw.append("|---|---:|---:|---|")
    for r in rows:
        raw.append(f"| {r['test']} | {r['avg_ts']:.2f} ± {r['stddev_ts']:.2f} | {med(r):.2f} | {', '.join(f'{x:.1f}' for x in r['samples_ts'])} |")
    raw.append("")
table = "\n".join(summary)
print(table)
models_md = "\n".join(f"- **{n}**: {l}" for n, l in models)
open(out, "w").write("\n".join(lines) + models_md + "\n\n" + table + "\n\n## Raw rows\n\n" + "\n".join(raw).rstrip() + "\n")
print(f"\nwritten to {out}", file=sys.stderr)
PY
say "done"
