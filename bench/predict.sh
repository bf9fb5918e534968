#!/usr/bin/env bash
# Expert prediction on a disk-bound machine (issue 32): decode with experts streamed from a
# read-throttled disk, with
#   lru     the expert cache alone (misses read when a layer asks for them),
#   router  + exact next-layer prefetch: the next router applied one layer early (--prefetch-next M),
#   head    + the same prefetch guided by trained predictor heads (--predictor P --prefetch-next M),
#   routeby routing by the heads' predictions (--predictor P --route-by-predictor; not exact),
# for 1 and 4 sequences decoded together, on trained models with real routing (the tokens are
# consecutive text: `spool bench --text`). Prints and writes a table (tok/s, hit rate, MB read
# per token, stall ms per token, wasted prefetch MB per token) and a PNG.
#
# The testbed (root): a cgroup whose reads from the model's disk are throttled to BPS bytes/s
# (cgroup v1 blkio.throttle.read_bps_device, or v2 io.max rbps), the experts read with O_DIRECT
# (--no-page-cache: the page cache cannot hide the disk) into a cache of FRAC of the experts'
# bytes. Modes run interleaved, ROUNDS rounds; tok/s is the mean over rounds.
#
#   MODELS="build/models/spool-demo-moe /path/to/spool-wide-moe" \
#   TRAIN=train.txt TEXT=heldout.txt bench/predict.sh
#
# TRAIN: the text the predictors are trained on (spool calibrate --train-predictor, cached in
# $DIR); TEXT: the decoded text (held out from TRAIN). BPS (default 1e9), FRAC (0.25), M (guesses
# per token for prefetch, default top-k: on a disk-bound run every wrong guess costs a read), N (tokens per sequence, 64), R (repetitions per
# run, 2), ROUNDS (2), PARALLEL (1,4), THREADS (all), OUT (bench/results/predict.md).
#
# REPLAY=DIR (optional): also a checkpoint of another size (a 35B-shaped synthetic: spool synth +
# convert) with the first model's routing replayed (`spool bench --routing-trace`), from traces of
# TEXT that carry the prefetch's guesses (calibrate --trace-guesses M): modes lru, router (the
# next router's guesses) and head (the trained heads'), with --prefetch-next M.
set -euo pipefail
cd "$(dirname "$0")/.."
SPOOL=$(realpath "${SPOOL:-build/spool}")
MODELS=${MODELS:-build/models/spool-demo-moe}
TRAIN=${TRAIN:?TRAIN=text to train the predictors on}
TEXT=${TEXT:?TEXT=held-out text to decode}
BPS=${BPS:-1000000000}
FRAC=${FRAC:-0.25}
N=${N:-64} R=${R:-2} ROUNDS=${ROUNDS:-2} PARALLEL=${PARALLEL:-1,4}
THREADS=${THREADS:-$(nproc)}
OUT=${OUT:-bench/results/predict.md}
DIR=${DIR:-/tmp/spool-predict}
PYTHON=${PYTHON:-python3}  # matplotlib for the PNG (optional)
mkdir -p "$DIR"
[ "$(id -u)" = 0 ] || { echo "predict.sh: needs root (a blkio/io cgroup)" >&2; exit 1; }
source bench/lib.sh  # disk_of, throttle_cgroup

# Bytes of every routed expert of a checkpoint (from the safetensors headers).
expert_bytes() {
  "$PYTHON" - "$1" <<'EOF'
import json, os, struct, sys
d, n = sys.argv[1], 0
for f in os.listdir(d):
    if not f.endswith(".safetensors"): continue
    with open(os.path.join(d, f), "rb") as fh:
        h = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
    n += sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in h.items() if ".mlp.experts." in k)
print(n)
EOF
}

# shape_of MODEL: sets k (experts per token), m (guesses per token), budget (GB: FRAC of the
# experts' bytes), one (one expert's bytes: the experts' bytes over the (layer, expert) pairs
# their tensors name), cg (the throttled cgroup for its disk).
shape_of() {
  local model=$1 all
  k=$("$PYTHON" -c "import json,sys; c=json.load(open(sys.argv[1])); c=c.get('text_config',c); print(c['num_experts_per_tok'])" "$model/config.json")
  m=${M:-$k}
  all=$(expert_bytes "$model")
  budget=$("$PYTHON" -c "import sys; print(f'{float(sys.argv[1]) * int(sys.argv[2]) / 1e9:.6f}')" "$FRAC" "$all")
  one=$("$PYTHON" - "$model" "$all" <<'EOF'
import json, os, struct, sys
d, total, n = sys.argv[1], int(sys.argv[2]), set()
for f in os.listdir(d):
    if not f.endswith(".safetensors"): continue
    with open(os.path.join(d, f), "rb") as fh:
        h = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
    for name in h:
        p = name.split(".")
        if ".mlp.experts." in name and "layers" in p and p[p.index("experts") + 1].isdigit():
            n.add((p[p.index("layers") + 1], p[p.index("experts") + 1]))
c = json.load(open(os.path.join(d, "config.json"))); c = c.get("text_config", c)
print(total // (len(n) or c["num_hidden_layers"] * c["num_experts"]))  # (fused expert tensors: every layer MoE)
EOF
)
  cg=$(throttle_cgroup spool-predict "$(disk_of "$model")" "$BPS")
}

# run_mode MODEL NAME MODE ROUND FLAGS...: one `spool bench` in the throttled cgroup; its rows,
# tagged, go to runs.jsonl.
run_mode() {
  local model=$1 name=$2 mode=$3 round=$4
  shift 4
  sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' _ "$cg" \
    "$SPOOL" bench -m "$model" --stream --no-page-cache --cache-budget-gb "$budget" -p 0 -n "$N" -r "$R" \
    --parallel "$PARALLEL" -t "$THREADS" -o json "$@" > "$DIR/run.json" 2> "$DIR/run.log" ||
    { echo "predict.sh: $name $mode failed:" >&2; tail -3 "$DIR/run.log" >&2; exit 1; }
  "$PYTHON" - "$DIR/run.json" "$name" "$mode" "$round" "$m" "$one" >> "$DIR/runs.jsonl" <<'EOF'
import json, sys
for r in json.load(open(sys.argv[1])):
    r.update(model=sys.argv[2], mode=sys.argv[3], round=int(sys.argv[4]), m=int(sys.argv[5]), expert_bytes=int(sys.argv[6]))
    print(json.dumps(r))
EOF
}

echo "# predict.sh $(date -u +%FT%TZ): BPS=$BPS FRAC=$FRAC N=$N R=$R ROUNDS=$ROUNDS PARALLEL=$PARALLEL THREADS=$THREADS" > "$DIR/runs.jsonl.log"
: > "$DIR/runs.jsonl"
for model in $MODELS; do
  name=$(basename "$model")
  pred=$DIR/$name-predictor.safetensors
  if [ ! -f "$pred" ]; then
    "$SPOOL" calibrate -m "$model" -f "$TRAIN" --train-predictor "$pred" -t "$THREADS" > "$DIR/$name-train.log" 2>&1
  fi
  "$SPOOL" calibrate -m "$model" -f "$TEXT" --predictor "$pred" -t "$THREADS" > "$DIR/$name-recall.log" 2>&1
  shape_of "$model"
  declare -A flags=(
    [lru]=""
    [router]="--prefetch-next $m"
    [head]="--predictor $pred --prefetch-next $m"
    [routeby]="--predictor $pred --route-by-predictor"
  )
  for round in $(seq 1 "$ROUNDS"); do
    for mode in lru router head routeby; do
      # shellcheck disable=SC2086
      run_mode "$model" "$name" "$mode" "$round" --text "$TEXT" ${flags[$mode]}
    done
  done
  sed -n '/^| layer/,/^| mean/p' "$DIR/$name-recall.log" > "$DIR/$name-recall.md"
done

if [ -n "${REPLAY:-}" ]; then
  first=$(echo "$MODELS" | awk '{print $1}')
  src=$(basename "$first")
  shape_of "$first"  # (the traces' guesses: M of the first model's)
  "$SPOOL" calibrate -m "$first" -f "$TEXT" --max-tokens 4096 --trace-out "$DIR/trace-router.jsonl" --trace-guesses "$m" -t "$THREADS" > "$DIR/trace-router.log" 2>&1
  "$SPOOL" calibrate -m "$first" -f "$TEXT" --max-tokens 4096 --trace-out "$DIR/trace-head.jsonl" --trace-guesses "$m" \
    --predictor "$DIR/$src-predictor.safetensors" -t "$THREADS" > "$DIR/trace-head.log" 2>&1
  name="$(basename "$REPLAY") (${src} routing)"
  shape_of "$REPLAY"
  declare -A rflags=(
    [lru]="--routing-trace $DIR/trace-router.jsonl"
    [router]="--routing-trace $DIR/trace-router.jsonl --prefetch-next $m"
    [head]="--routing-trace $DIR/trace-head.jsonl --prefetch-next $m"
  )
  for round in $(seq 1 "$ROUNDS"); do
    for mode in lru router head; do
      # shellcheck disable=SC2086
      run_mode "$REPLAY" "$name" "$mode" "$round" ${rflags[$mode]}
    done
  done
  MODELS="$MODELS|$name"
fi

"$PYTHON" - "$DIR" "$OUT" "$BPS" "$FRAC" "$N" "$R" "$ROUNDS" "$MODELS" <<'EOF'
import collections, json, os, statistics, sys
d, out, bps, frac, n, r, rounds, models = sys.argv[1:9]
rows = [json.loads(l) for l in open(os.path.join(d, "runs.jsonl"))]
g = collections.defaultdict(list)
for x in rows: g[(x["model"], x["n_parallel"], x["mode"])].append(x)
modes = ["lru", "router", "head", "routeby"]
label = {"lru": "LRU only", "router": "+ next-router prefetch", "head": "+ trained-head prefetch", "routeby": "route by heads (not exact)"}
lines = [f"Experts streamed with O_DIRECT from a disk throttled to {float(bps)/1e9:g} GB/s (cgroup), cache = {float(frac):.0%} of the experts' bytes; "
         f"`spool bench --text` (held-out text, {n} tokens per sequence, {r} repetitions x {rounds} interleaved rounds); "
         "prefetch reads up to M = top-k guesses per token (best first, at most 2 in flight, only while no miss is being read) into staging buffers beside the cache.", "",
         "| model | seqs | mode | tok/s | vs LRU | hit rate | MB read / token | stall ms / token | wasted prefetch MB / token |",
         "|---|---|---|---|---|---|---|---|---|"]
plot = collections.defaultdict(dict)
plain, _, replay = models.partition("|")
for model in [os.path.basename(m) for m in plain.split()] + ([replay] if replay else []):
    for seqs in sorted({k[1] for k in g if k[0] == model}):
        base = None
        for mode in modes:
            xs = g.get((model, seqs, mode))
            if not xs: continue
            ts = statistics.mean(x["avg_ts"] for x in xs)
            base = base or ts
            toks = int(n) * int(r) * seqs
            hit = statistics.mean(x["cache_hit_rate"] for x in xs)
            mb = statistics.mean(x["bytes_read_per_token"] for x in xs) / 1e6
            stall = statistics.mean(x.get("stall_s", 0) for x in xs) / toks * 1e3
            wasted = statistics.mean(x.get("prefetch_next_wasted_per_token", 0) * x["expert_bytes"] for x in xs) / 1e6
            lines.append(f"| {model} | {seqs} | {label[mode]} | {ts:.1f} | {ts / base:.2f}x | {hit:.1%} | {mb:.2f} | {stall:.2f} | {wasted:.2f} |")
            plot[(model, seqs)][mode] = ts / base
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4))
    keys = list(plot)
    w = 0.2
    for i, mode in enumerate(modes):
        ax.bar([j + i * w for j in range(len(keys))], [plot[k].get(mode, 0) for k in keys], w, label=label[mode])
    ax.set_xticks([j + 1.5 * w for j in range(len(keys))], [f"{m}\n{s} seq" for m, s in keys])
    ax.set_ylabel("decode tok/s vs LRU only")
    ax.axhline(1.0, color="gray", lw=0.5)
    ax.legend(fontsize=8)
    ax.set_title(f"Expert prediction, disk throttled to {float(bps)/1e9:g} GB/s, cache {float(frac):.0%} of experts")
    fig.tight_layout()
    fig.savefig(os.path.splitext(out)[0] + ".png", dpi=110)
except ImportError:
    print("(no matplotlib: no PNG)")
EOF
