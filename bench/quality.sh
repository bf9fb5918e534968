#!/usr/bin/env bash
# Quantization quality table (not in CI): converts the demo model with every recipe, then scores
# each on the dev corpus against the bf16 model: perplexity, mean KL(bf16 || model) per token,
# top-1 agreement, size on disk and bits per weight; plus K-reduction (--max-active-experts).
# Writes bench/results/quality.md (a markdown table, also pasted into docs/quantization.md).
#   bench/quality.sh                 # the whole dev corpus (~214 windows of 512 tokens)
#   CHUNKS=20 bench/quality.sh       # a quick look at the first 20 windows
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
CHUNKS=${CHUNKS:-0}
THREADS=${THREADS:-$(nproc)}
RECIPES=${RECIPES:-"q4 tq3 tq3-g64 q2 tq3a-tqTe tq3a-tqTe-down4 tq3a-tqTe-down3 q8 q6 q5 q4-hi8 q4-hi6 q4-hi8-down6 q5-hi8"}
KS=${KS:-"6 4 2"}
WORK=${WORK:-build/quality}
OUT=bench/results/quality.md
DEMO=build/models/spool-demo-moe
DEV=tests/data/corpus/dev.txt

scripts/setup.sh >/dev/null
mkdir -p "$WORK" bench/results

# params = weights of the bf16 model (every tensor), for bits per weight.
params=$(python3 - "$DEMO" <<'EOF'
import json, struct, sys, glob, math
n = 0
for f in glob.glob(sys.argv[1] + "/*.safetensors"):
    with open(f, "rb") as fh:
        h = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
    n += sum(math.prod(v["shape"]) for k, v in h.items() if k != "__metadata__")
print(n)
EOF
)
size_of() { du -cb "$1"/*.safetensors | tail -1 | cut -f1; }

# One row: label, model dir, extra flags.
row() {
  local label=$1 dir=$2; shift 2
  local j
  j=$(build/spool perplexity --model "$dir" -f "$DEV" --chunks "$CHUNKS" -t "$THREADS" --kl-reference "$DEMO" --json "$@" 2>"$WORK/last.err") ||
    { echo "quality.sh: perplexity of $label failed:" >&2; cat "$WORK/last.err" >&2; exit 1; }
  local bytes; bytes=$(size_of "$dir")
  python3 - "$label" "$bytes" "$params" "$j" <<'EOF'
import json, sys
label, size, params, j = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
r = j["reference"]
print(f"| {label} | {j['ppl']:.3f} | {r['mean_kl']:.4f} | {100*r['top1_agreement']:.1f}% | {size/2**20:.2f} MiB | {8*size/params:.2f} |")
EOF
}

{
  echo "Demo model (spool-demo-moe, 20M params, 64 experts top-8) on the dev corpus$([ "$CHUNKS" != 0 ] && echo " (first $CHUNKS windows)")."
  echo "KL = mean KL(bf16 || model) per token in nats; top-1 = tokens whose argmax equals bf16's; bits/weight over the"
  echo "whole checkpoint (embeddings, norms and routers stay bf16; header bytes included)."
  echo
  echo "| model | perplexity | KL to bf16 | top-1 | size on disk | bits/weight |"
  echo "|---|---|---|---|---|---|"
  row "bf16 (K=8)" "$DEMO"
  for r in $RECIPES; do
    rm -rf "${WORK:?}/$r"  # always fresh: a conversion takes under a second
    build/spool convert --model "$DEMO" --recipe "$r" --out "$WORK/$r" -t "$THREADS" >/dev/null 2>"$WORK/last.err" ||
      { echo "quality.sh: convert $r failed:" >&2; cat "$WORK/last.err" >&2; exit 1; }
    row "$r" "$WORK/$r"
  done
  for k in $KS; do row "bf16, K=$k" "$DEMO" --max-active-experts "$k"; done
} | tee "$OUT"
echo "quality.sh: wrote $OUT"
