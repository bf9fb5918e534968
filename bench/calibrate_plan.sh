#!/usr/bin/env bash
# Planner calibration (not in CI): for each run, `spool generate --json` reports the measured
# peak RSS (VmHWM), then `spool plan --json` with the same flags and the context the run used
# (prompt + decoded positions) predicts it. Prints a markdown table and writes
# bench/results/calibrate_plan.md.
#   bench/calibrate_plan.sh                        # demo model, quantized demo, synthetic 35B shape
#   SYNTH=/path/to/synthetic-checkpoint QUANT=/path/to/quantized-demo bench/calibrate_plan.sh
#   SKIP_SYNTH=1 bench/calibrate_plan.sh           # demo rows only (no 7.8 GB synthetic checkpoint)
# Prompts are exact token counts (--prompt-ids cut from the dev corpus's encoding). The
# cgroup row needs root and a writable memory cgroup (v2 with the memory controller, or v1);
# it is skipped with a note otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
SPOOL=$BUILD/spool
DEMO=$BUILD/models/spool-demo-moe
SYNTH=${SYNTH:-$HOME/.cache/spool-bench/qwen3.6-35b-a3b-4l}
QUANT=${QUANT:-$BUILD/models/spool-demo-moe-tq3a-tqTe-down4}
OUT=bench/results/calibrate_plan.md
TMP=$(mktemp -d)
CG=""
cleanup() {
  [ -n "$CG" ] && rmdir "$CG" 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT

[ -x "$SPOOL" ] || { echo "calibrate_plan.sh: build spool first ($SPOOL)"; exit 1; }
[ -d "$QUANT" ] || "$SPOOL" convert --model "$DEMO" --out "$QUANT" >/dev/null
if [ -z "${SKIP_SYNTH:-}" ] && [ ! -f "$SYNTH/config.json" ]; then
  "$SPOOL" synth --preset qwen3.6-35b-a3b --layers 4 --out "$SYNTH"
fi
# Token ids of the dev corpus (demo tokenizer); prompts are its first N ids.
"$SPOOL" tokenize --text "$(head -c 20000 tests/data/corpus/dev.txt)" --json > "$TMP/ids.json"
ids() { python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['ids'][:int(sys.argv[2])])))" "$TMP/ids.json" "$1"; }

rows=()
notes=()
# calibrate NAME MODEL PROMPT_TOKENS MAX_TOKENS "extra flags" [cgroup dir]
calibrate() {
  local name=$1 model=$2 np=$3 n=$4 flags=$5 cg=${6:-}
  local pre=()
  [ -n "$cg" ] && pre=(sh -c "echo \$\$ > $cg/cgroup.procs; exec \"\$0\" \"\$@\"")
  [ -n "$cg" ] && { echo 0 > "$cg/memory.force_empty" 2>/dev/null || true; }  # v1: drop the group's page cache
  local gen
  gen=$("${pre[@]}" "$SPOOL" generate -m "$model" --prompt-ids "$(ids "$np")" --temp 0 --max-tokens "$n" $flags --json 2>"$TMP/gen.err") ||
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
  rows+=("$(python3 - "$name" "$gen" "$plan" "$flags" "$np" "$ctx" <<'PY'
import json, sys
name, gen, plan, flags, np_, ctx = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
meas, pred = gen["peak_rss_bytes"], plan["peak_bytes"]
c = plan["components"]
m = gen["stats"]["memory"]
mib = lambda b: b / 2**20
parts = f"dense {mib(c['dense_resident']):.0f} + experts {mib(c['experts_resident'] + c['expert_cache']):.0f} + KV/state {mib(c['kv'] + c['recurrent_state'] + c['kv_grow_transient']):.1f} + work {mib(c['workspace']):.0f} + tok/tables/rt {mib(c['tokenizer']):.1f}/{mib(c['tables']):.1f}/{mib(c['runtime']):.1f}"
budget = f"{plan['cache_budget_bytes']/2**30:.2f} GiB" if plan["verdict"] == "stream" else "-"
if m["streaming"] and m["cache_budget_auto"]:
    budget += f" (engine auto: {m['cache_budget_bytes']/2**30:.2f} GiB)"
print(f"| {name} | `{flags.strip() or '(defaults)'}` | {np_} + {len(gen['output_ids'])} | {ctx} | {plan['verdict']} | {budget} | {parts} | {mib(pred):.1f} | {mib(meas):.1f} | {100*(pred-meas)/meas:+.2f}% |")
PY
)")
  echo "${rows[-1]}"
}

# A memory cgroup with a limit of LIMIT bytes for the cgroup rows: v2 (under the cgroup2 mount's
# root, memory enabled there) or v1 (under this process's memory cgroup). Sets CG; "" if none.
make_cgroup() {
  local limit=$1 v2 v1 path
  CG=""
  [ "$(id -u)" -eq 0 ] || return 0
  v2=$(awk '{ for (i = 1; i <= NF; i++) if ($i == "-") break; if ($(i + 1) == "cgroup2") { print $5; exit } }' /proc/self/mountinfo)
  if [ -n "$v2" ] && grep -qw memory "$v2/cgroup.controllers" 2>/dev/null &&
     { grep -qw memory "$v2/cgroup.subtree_control" || echo +memory > "$v2/cgroup.subtree_control"; } 2>/dev/null &&
     mkdir "$v2/spool-calibrate-$$" 2>/dev/null; then
    CG=$v2/spool-calibrate-$$
    echo "$limit" > "$CG/memory.max"
    return 0
  fi
  v1=$(awk '{ for (i = 1; i <= NF; i++) if ($i == "-") break; if ($(i + 1) == "cgroup" && ("," $(i + 3) ",") ~ /,memory,/) { print $5; exit } }' /proc/self/mountinfo)
  path=$(awk -F: '("," $2 ",") ~ /,memory,/ { print $3; exit }' /proc/self/cgroup)
  if [ -n "$v1" ] && mkdir "$v1${path%/}/spool-calibrate-$$" 2>/dev/null; then
    CG=$v1${path%/}/spool-calibrate-$$
    echo "$limit" > "$CG/memory.limit_in_bytes"
  fi
}

# Demo model (bf16, resident): prompt lengths, contexts, prefill steps, int8 KV.
calibrate "demo, 7-token prompt" "$DEMO" 7 64 ""
calibrate "demo, 16-token prompt" "$DEMO" 16 16 ""
calibrate "demo, context 256" "$DEMO" 241 16 ""
calibrate "demo, context 1024" "$DEMO" 1009 16 ""
calibrate "demo, context 4096" "$DEMO" 4081 16 ""
calibrate "demo, context 4096, --kv-bits 8" "$DEMO" 4081 16 "--kv-bits 8"
calibrate "demo, context 1024, step 64" "$DEMO" 1009 16 "--prefill-step-size 64"
calibrate "demo, context 1024, step 128" "$DEMO" 1009 16 "--prefill-step-size 128"
calibrate "demo, context 1024, step 512" "$DEMO" 1009 16 "--prefill-step-size 512"
calibrate "demo quantized (tq3a-tqTe-down4)" "$QUANT" 778 64 ""
if [ -z "${SKIP_SYNTH:-}" ]; then
  calibrate "synthetic 35B-A3B 4L, streaming 1 GiB" "$SYNTH" 600 16 "--stream --cache-budget-gb 1"
  calibrate "synthetic 35B-A3B 4L, streaming 2.5 GiB" "$SYNTH" 600 16 "--stream --cache-budget-gb 2.5"
  calibrate "synthetic 35B-A3B 4L, resident" "$SYNTH" 600 16 "--no-stream"
  synth_bytes=$(cat "$SYNTH"/*.safetensors | wc -c)
  make_cgroup $((synth_bytes * 6 / 10 / 4096 * 4096))
  if [ -n "$CG" ]; then
    calibrate "synthetic 35B-A3B 4L, cgroup at 0.6 x model ($(python3 -c "print(f'{$synth_bytes*0.6/2**30:.2f}')") GiB), auto" "$SYNTH" 600 16 "" "$CG"
  else
    notes+=("cgroup row skipped: needs root and a writable memory cgroup")
  fi
fi

{
  echo "Planner calibration: \`spool plan\` predicted peak vs measured VmHWM (\`spool generate --json\` peak_rss_bytes),"
  echo "$(nproc) threads, $(date -u +%Y-%m-%d). Tokens = prompt + generated; context = positions the run held (prompt + decoded);"
  echo "MiB = 2^20 bytes. Engine auto = the budget \`spool generate\` chose on its own (stats.memory of --json)."
  echo
  echo "| run | flags | tokens | context | verdict | cache budget | predicted components (MiB) | predicted MiB | measured MiB | error |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  for n in "${notes[@]}"; do echo; echo "$n"; done
} | tee "$OUT"
