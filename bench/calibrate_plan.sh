#!/usr/bin/env bash
# Planner calibration (not in CI): for each run, `spool generate --json` reports the measured
# peak RSS (VmHWM), then `spool plan --json` with the same flags and the context the run used
# (prompt + decoded positions) predicts it. Prints a markdown table and writes
# bench/results/calibrate_plan.md.
#   bench/calibrate_plan.sh                        # demo model, quantized demo, synthetic 35B shape
#   SYNTH=/path/to/synthetic-checkpoint QUANT=/path/to/quantized-demo bench/calibrate_plan.sh
# Root is needed only for the cgroup row (skipped otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
SPOOL=$BUILD/spool
DEMO=$BUILD/models/spool-demo-moe
SYNTH=${SYNTH:-$HOME/.cache/spool-bench/qwen3.6-35b-a3b-4l}
QUANT=${QUANT:-$BUILD/models/spool-demo-moe-tq3a-tqTe-down4}
OUT=bench/results/calibrate_plan.md
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

[ -x "$SPOOL" ] || { echo "calibrate_plan.sh: build spool first ($SPOOL)"; exit 1; }
[ -d "$QUANT" ] || "$SPOOL" convert --model "$DEMO" --out "$QUANT" >/dev/null
if [ ! -f "$SYNTH/config.json" ]; then
  "$SPOOL" synth --preset qwen3.6-35b-a3b --layers 4 --out "$SYNTH"
fi
corpus=tests/data/corpus/dev.txt
head -c 3000 "$corpus" > "$TMP/p778.txt"      # 778 tokens with the demo tokenizer
head -c 13500 "$corpus" > "$TMP/p3500.txt"    # ~3500 tokens
head -c 2300 "$corpus" > "$TMP/p600.txt"      # ~600 tokens

rows=()
# calibrate NAME MODEL PROMPT_FILE MAX_TOKENS "extra flags" [cgroup dir]
calibrate() {
  local name=$1 model=$2 prompt=$3 n=$4 flags=$5 cg=${6:-}
  local pre=()
  [ -n "$cg" ] && pre=(sh -c "echo \$\$ > $cg/cgroup.procs; exec \"\$0\" \"\$@\"")
  [ -n "$cg" ] && { echo 0 > "$cg/memory.force_empty" 2>/dev/null || true; }  # drop the group's page cache
  local gen
  gen=$("${pre[@]}" "$SPOOL" generate -m "$model" --file "$prompt" --temp 0 --max-tokens "$n" $flags --json 2>"$TMP/gen.err") ||
    { cat "$TMP/gen.err"; exit 1; }
  local ctx
  ctx=$(python3 -c "import json,sys; d=json.loads(sys.argv[1]); print(len(d['prompt_ids']) + len(d['output_ids']) - 1)" "$gen")
  # plan takes the plan-relevant flags of the run (stream, budget, kv bits, prefill step).
  local pflags
  pflags=$(echo " $flags " | sed -e 's/ --max-active-experts [0-9]*//' -e 's/ --prefetch-workers [0-9]*//' -e 's/ --no-page-cache//' -e 's/ --use-page-cache//')
  [ -n "$cg" ] && { echo 0 > "$cg/memory.force_empty" 2>/dev/null || true; }  # same starting usage as the run had
  local plan
  plan=$("${pre[@]}" "$SPOOL" plan -m "$model" --ctx-size "$ctx" $pflags --json 2>"$TMP/plan.err") || true
  [ -n "$plan" ] || { cat "$TMP/plan.err"; exit 1; }
  local engine_budget
  engine_budget=$(grep -o 'cache budget auto: [0-9.]* [KMG]iB' "$TMP/gen.err" | head -1 | sed 's/cache budget auto: //' || true)
  rows+=("$(python3 - "$name" "$gen" "$plan" "$flags" "$ctx" "$engine_budget" <<'PY'
import json, sys
name, gen, plan, flags, ctx, eb = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
meas, pred = gen["peak_rss_bytes"], plan["peak_bytes"]
c = plan["components"]
mib = lambda b: b / 2**20
parts = f"dense {mib(c['dense_resident']):.0f} + experts {mib(c['experts_resident'] + c['expert_cache']):.0f} + KV/state {mib(c['kv'] + c['recurrent_state'] + c['kv_grow_transient']):.1f} + work {mib(c['workspace']):.0f} + tok/rt {mib(c['tokenizer'] + c['runtime']):.0f}"
budget = f"{plan['cache_budget_bytes']/2**30:.2f} GiB" if plan["verdict"] == "stream" else "-"
if eb: budget += f" (engine auto: {eb})"
print(f"| {name} | `{flags.strip() or '(defaults)'}` | {ctx} | {plan['verdict']} | {budget} | {parts} | {mib(pred):.1f} | {mib(meas):.1f} | {100*(pred-meas)/meas:+.2f}% |")
PY
)")
  echo "${rows[-1]}"
}

calibrate "demo resident (bf16)" "$DEMO" "$TMP/p778.txt" 64 ""
calibrate "demo quantized (tq3a-tqTe-down4)" "$QUANT" "$TMP/p778.txt" 64 ""
calibrate "demo long context" "$DEMO" "$TMP/p3500.txt" 64 ""
calibrate "demo long context, --kv-bits 8" "$DEMO" "$TMP/p3500.txt" 64 "--kv-bits 8"
calibrate "demo, --prefill-step-size 128" "$DEMO" "$TMP/p3500.txt" 32 "--prefill-step-size 128"
calibrate "synthetic 35B-A3B 4L, streaming 1 GiB" "$SYNTH" "$TMP/p600.txt" 16 "--stream --cache-budget-gb 1"
calibrate "synthetic 35B-A3B 4L, streaming 2.5 GiB" "$SYNTH" "$TMP/p600.txt" 16 "--stream --cache-budget-gb 2.5"
calibrate "synthetic 35B-A3B 4L, resident" "$SYNTH" "$TMP/p600.txt" 16 "--no-stream"
CG=/sys/fs/cgroup/memory/spool4g
if [ "$(id -u)" -eq 0 ] && [ -d "$CG" ]; then
  calibrate "synthetic 35B-A3B 4L, 4 GiB cgroup, auto" "$SYNTH" "$TMP/p600.txt" 16 "" "$CG"
fi

{
  echo "Planner calibration: \`spool plan\` predicted peak vs measured VmHWM (\`spool generate --json\` peak_rss_bytes),"
  echo "$(nproc) threads, $(date -u +%Y-%m-%d). Context = prompt + decoded positions of the run; MiB = 2^20 bytes."
  echo
  echo "| run | flags | context | verdict | cache budget | predicted components (MiB) | predicted MiB | measured MiB | error |"
  echo "|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} | tee "$OUT"
