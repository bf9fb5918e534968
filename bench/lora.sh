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
#   synth  Qwen3.6-35B-A3B-shaped synthetics of each depth in LAYERS (`spool synth`, bf16, then `spool
#          convert --recipe q4`; 4 layers = the family's 3 Gated DeltaNet + 1 full-attention block) with
#          a random rank-RANK (alpha 2 x RANK) adapter on attention, Gated DeltaNet, the shared expert and
#          the routed experts (bench/make_lora_adapter.py).
# Prints a markdown table (model, distinct adapters D, parallel sequences, pp t/s, tg t/s: medians of
# the repetitions; tg cost = 1 - tg t/s / the D = 0 row's) and writes it with the raw rows to OUT.
# A few-layer synthetic spends most of a decode step in its lm_head (a 248k-token vocabulary), which
# has no LoRA terms, so its cost understates the full model's: with two depths in LAYERS the table
# adds the cost projected to FULL_LAYERS (40) layers from the per-layer base and LoRA times (the
# formula is in the Python below).
#
#   bench/lora.sh                                    # demo, and synthetics of 2 and 4 layers
#   MODELS=demo R=10 bench/lora.sh
#   MODELS=synth LAYERS=4 RANK=16 DIR=/tmp/x bench/lora.sh
#
# Environment: SPOOL_BIN (build/spool), MODELS ("demo synth"), DEMO (build/models/spool-demo-moe), ADAPTER, LAYERS ("2 4"), FULL_LAYERS (40), RANK (16),
# P (128), N (64), R (5), R_DEMO (R: the demo's repetitions; they are cheap), PARALLEL (1,4), DISTINCT (0,1,4), THREADS (nproc), DIR (/tmp/spool-lora-bench:
# the synthetic model and adapter, kept between runs), OUT (bench/results/lora.md), PYTHON (python3:
# the standard library only), SPOOL_FLAGS (added to every bench run), REPORT_ONLY (1: rewrite OUT from
# the bench JSON already in DIR, running only what is missing).
# D = 0 runs with all adapters loaded and off (a row whose scale is 0 skips the LoRA products: the
# base cost); D > 0: sequence i of a batch runs adapter i mod D, so D = 4 with one sequence is one
# adapter (the pp rows run adapter 0).
set -euo pipefail
cd "$(dirname "$0")/.."
SPOOL=${SPOOL_BIN:-build/spool}
MODELS=${MODELS:-demo synth}
DEMO=${DEMO:-build/models/spool-demo-moe}
ADAPTER=${ADAPTER:-build/tests/data/lora/spool-demo-moe-dev}
LAYERS=${LAYERS:-2 4}
RANK=${RANK:-16}
P=${P:-128} N=${N:-64} R=${R:-5} R_DEMO=${R_DEMO:-$R}
PARALLEL=${PARALLEL:-1,4}
DISTINCT=${DISTINCT:-0,1,4}
THREADS=${THREADS:-$(nproc)}
DIR=${DIR:-/tmp/spool-lora-bench}
OUT=${OUT:-bench/results/lora.md}
PYTHON=${PYTHON:-python3}
SPOOL_FLAGS=${SPOOL_FLAGS:-}
FULL_LAYERS=${FULL_LAYERS:-40}
[ -x "$SPOOL" ] || { echo "lora.sh: no spool binary at $SPOOL (cmake --build build --target spool)"; exit 1; }
mkdir -p "$DIR"
t0=$SECONDS
say() { echo "[$((SECONDS - t0)) s] $*" >&2; }

# bench_model NAME MODEL_DIR ADAPTER_DIR REPS: the bench JSON in $DIR/NAME.json, its command in $DIR/NAME.cmd
bench_model() {
  local name=$1 model=$2 adapter=$3 reps=$4 args
  if [ "${REPORT_ONLY:-0}" = 1 ] && [ -f "$DIR/$name.json" ]; then return; fi
  args=(-m "$model" -p "$P" -n "$N" -r "$reps" -t "$THREADS" --parallel "$PARALLEL" --lora-distinct "$DISTINCT"
    --lora "$adapter" --lora "$adapter" --lora "$adapter" --lora "$adapter")
  say "bench $name: spool bench ${args[*]} $SPOOL_FLAGS"
  cut -d' ' -f1 /proc/loadavg > "$DIR/$name.load"
  # shellcheck disable=SC2086
  "$SPOOL" bench "${args[@]}" $SPOOL_FLAGS -o json > "$DIR/$name.json" 2> "$DIR/$name.log" ||
    { tail -20 "$DIR/$name.log"; exit 1; }
  echo "spool bench ${args[*]} $SPOOL_FLAGS" > "$DIR/$name.cmd"
  cut -d' ' -f1 /proc/loadavg >> "$DIR/$name.load"
}

names=()
for m in $MODELS; do
  case "$m" in
  demo)
    [ -f "$ADAPTER/adapter_config.json" ] || { echo "lora.sh: no adapter at $ADAPTER (build the spool_test_data target or set ADAPTER)"; exit 1; }
    bench_model demo "$DEMO" "$ADAPTER" "$R_DEMO"
    names+=("demo|spool-demo-moe (bf16, 8 layers), trained rank-8 adapter (attention, Gated DeltaNet, shared expert)|0")
    ;;
  synth)
    for L in $LAYERS; do
      bf16=$DIR/q36-${L}l.bf16 q4=$DIR/q36-${L}l.q4 ad=$DIR/q36-${L}l.lora-r$RANK
      synth() {
        [ -f "$bf16/config.json" ] && return
        say "synth qwen3.6-35b-a3b, $L layers (bf16)"
        "$SPOOL" synth --preset qwen3.6-35b-a3b --layers "$L" --out "$bf16" --no-check -t "$THREADS" > "$DIR/synth.log" 2>&1 ||
          { tail -20 "$DIR/synth.log"; exit 1; }
      }
      if [ ! -f "$q4/config.json" ]; then
        synth
        say "convert --recipe q4 ($L layers)"
        "$SPOOL" convert -m "$bf16" --recipe q4 -o "$q4" -t "$THREADS" > "$DIR/convert.log" 2>&1 || { tail -20 "$DIR/convert.log"; exit 1; }
      fi
      if [ ! -f "$ad/adapter_config.json" ]; then
        synth  # the adapter is shaped from the bf16 checkpoint's headers (the q4 one stores packed codes)
        say "rank-$RANK adapter ($L layers)"
        "$PYTHON" bench/make_lora_adapter.py "$bf16" "$ad" --rank "$RANK" --alpha $((2 * RANK)) >&2
      fi
      rm -rf "$bf16"
      bench_model "synth-${L}l" "$q4" "$ad" "$R"
      names+=("synth-${L}l|Qwen3.6-35B-A3B shape, $L layers, q4, random rank-$RANK adapter (attention, Gated DeltaNet, shared and routed experts)|$L")
    done
    ;;
  *) echo "lora.sh: unknown model '$m' (demo or synth)"; exit 1 ;;
  esac
done

"$PYTHON" - "$DIR" "$OUT" "$THREADS" "$FULL_LAYERS" "${names[@]}" <<'PY'
import json, os, platform, statistics, sys, time
d, out, threads, full = sys.argv[1:5]
full = int(full)
models = [a.split("|", 2) for a in sys.argv[5:]]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.machine())
lines = [f"# LoRA adapters, unmerged: cost of 0 / 1 / 4 distinct adapters in a batch ({time.strftime('%Y-%m-%d')})", "",
         f"Machine: {cpu}, {os.cpu_count()} CPUs, {threads} threads (load average, 1 min, at the start and end of "
         "each model's bench below). "
         "t/s: the median of the repetitions (mean ± sd and every sample in the raw rows below: other jobs share "
         "the machine, and the median resists their bursts); tg cost = 1 - tg t/s / the D = 0 row's of the same "
         "parallel (same invocation, repetitions interleaved across D); D = 0: the adapters loaded, every scale 0 "
         "(the base's products).", ""]
summary = ["| model | adapters distinct D | parallel | pp t/s | pp cost vs D=0 | tg t/s | tg cost vs D=0 |",
           "|---|---:|---:|---:|---:|---:|---:|"]
med = lambda r: statistics.median(r["samples_ts"])
raw = []
synth = {}  # layers -> {(D, parallel): seconds per step (median)}
for name, label, layers in models:
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
        ppc = f"{100 * (1 - med(p) / med(pp[0])):+.1f}%" if p and D != 0 and 0 in pp else "-"
        summary.append(f"| {name} | {D} | {n} | {pps} | {ppc} | {med(r):.2f} | {cost} |")
        if int(layers) > 0:
            synth.setdefault(int(layers), {})[(D, n)] = n / med(r)
    raw.append(f"### {name}: {label}")
    raw.append("")
    load = open(os.path.join(d, name + ".load")).read().split()
    raw.append(f"`{cmd}` ({rows[0]['model_type']}, {rows[0]['backend']}, peak RSS {rows[0]['peak_rss_bytes'] / 2**20:.0f} MiB; "
               f"load average {' -> '.join(load)})")
    raw.append("")
    raw.append("| test | t/s mean ± sd | median | samples |")
    raw.append("|---|---:|---:|---|")
    for r in rows:
        raw.append(f"| {r['test']} | {r['avg_ts']:.2f} ± {r['stddev_ts']:.2f} | {med(r):.2f} | {', '.join(f'{x:.1f}' for x in r['samples_ts'])} |")
    raw.append("")
# Projection to the full depth: the lm_head and embedding (248k-token vocabulary) take most of a
# few-layer synthetic's step, and carry no LoRA terms, so its tg cost understates the full model's.
# Over the depths L measured, step time t0(L) = h + L b (least squares: fixed time h, per-layer base
# time b) and tD(L) - t0(L) = L dD (least squares through 0: per-layer LoRA time dD); at depth F the
# cost is 1 - (h + F b) / (h + F (b + dD)). Assumes every layer costs alike (the routed experts
# dominate; at these short contexts attention and Gated DeltaNet layers are close). Each depth is its
# own invocation: b carries the noise between them, dD only that within one.
if len(synth) >= 2:
    Ls = sorted(synth)
    summary += ["", f"Projected to {full} layers (from the {', '.join(map(str, Ls))}-layer runs; see bench/lora.sh):", "",
                "| adapters distinct D | parallel | step ms, fixed (head) | step ms per layer | LoRA ms per layer | tg cost at "
                f"{full} layers |", "|---:|---:|---:|---:|---:|---:|"]
    for (D, n) in sorted(synth[Ls[-1]], key=lambda k: (k[1], k[0])):
        pts = [(L, synth[L][(0, n)], synth[L][(D, n)]) for L in Ls if (0, n) in synth[L] and (D, n) in synth[L]]
        if D == 0 or len(pts) < 2:
            continue
        mL = sum(p[0] for p in pts) / len(pts)
        mt = sum(p[1] for p in pts) / len(pts)
        b = sum((L - mL) * (t - mt) for L, t, _ in pts) / sum((L - mL) ** 2 for L, _, _ in pts)
        h = mt - b * mL
        dD = sum(L * (tD - t) for L, t, tD in pts) / sum(L * L for L, _, _ in pts)
        cost = 1 - (h + full * b) / (h + full * (b + dD))
        summary.append(f"| {D} | {n} | {1e3 * h:.1f} | {1e3 * b:.2f} | {1e3 * dD:.2f} | {100 * cost:+.1f}% |")
table = "\n".join(summary)
print(table)
models_md = "\n".join(f"- **{n}**: {l}" for n, l, _ in models)
open(out, "w").write("\n".join(lines) + "\n" + models_md + "\n\n" + table + "\n\n## Raw rows\n\n" + "\n".join(raw).rstrip() + "\n")
print(f"\nwritten to {out}", file=sys.stderr)
PY
say "done"
