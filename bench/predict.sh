#!/usr/bin/env bash
# Expert prediction on a disk-bound machine (issue 32): decode with experts streamed from a
# read-throttled disk, with
#   lru     the expert cache alone, LRU, a layer's experts computed once all are read (--no-hits-first),
#   hf      the same LRU cache, the cached experts computing while the misses are read (hits first, the default),
#   lfu     hits first with --cache-policy lfu (decayed request counts),
#   head    lfu + exact prefetch guided by trained predictor heads (--predictor P --prefetch-next M),
#   router  hits first + exact next-layer prefetch: the next router applied one layer early (--prefetch-next M),
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
# TEXT that carry the prefetch's guesses (calibrate --trace-guesses M): modes lru, hf, lfu and head
# (the trained heads' guesses, --prefetch-next M), and `spool plan --trace` run in the same cgroup
# for each of lru, hf and lfu: its predicted hit rate and tok/s beside the measured ones.
# MODES (default: lru hf lfu router head routeby) picks the modes of the plain models. SKIP_RUNS=1
# keeps the last runs (runs.jsonl) and redoes the rest: the plan predictions and the table.
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
  [ "${SKIP_RUNS:-0}" = 1 ] && return 0
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
[ "${SKIP_RUNS:-0}" = 1 ] || : > "$DIR/runs.jsonl"
for model in $MODELS; do
  name=$(basename "$model")
  pred=$DIR/$name-predictor.safetensors
  if [ ! -f "$pred" ]; then
    "$SPOOL" calibrate -m "$model" -f "$TRAIN" --train-predictor "$pred" -t "$THREADS" > "$DIR/$name-train.log" 2>&1
  fi
  "$SPOOL" calibrate -m "$model" -f "$TEXT" --predictor "$pred" -t "$THREADS" > "$DIR/$name-recall.log" 2>&1
  shape_of "$model"
  declare -A flags=(
    [lru]="--no-hits-first"
    [hf]=""
    [lfu]="--cache-policy lfu"
    [router]="--prefetch-next $m"
    [head]="--cache-policy lfu --predictor $pred --prefetch-next $m"
    [routeby]="--predictor $pred --route-by-predictor"
  )
  for round in $(seq 1 "$ROUNDS"); do
    for mode in ${MODES:-lru hf lfu router head routeby}; do
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
    [lru]="--routing-trace $DIR/trace-router.jsonl --no-hits-first"
    [hf]="--routing-trace $DIR/trace-router.jsonl"
    [lfu]="--routing-trace $DIR/trace-router.jsonl --cache-policy lfu"
    [head]="--routing-trace $DIR/trace-head.jsonl --cache-policy lfu --prefetch-next $m"
  )
  for round in $(seq 1 "$ROUNDS"); do
    for mode in lru hf lfu head; do
      # shellcheck disable=SC2086
      run_mode "$REPLAY" "$name" "$mode" "$round" ${rflags[$mode]}
    done
  done
  # plan --trace's prediction of the same runs, one per mode it models and number of sequences.
  # Outside the throttled cgroup: blk-throttle grants a group BPS x its 100 ms slice at once, so
  # a token's reads (tens of MB, the disk idle in between) run at the disk's own speed while the
  # average stays under BPS; plan's probe (1 s of back-to-back reads) would measure BPS instead.
  # The memory, disk and compute probes run once (the first call); every mode is then predicted
  # from the same rates, so the modes differ by their model only, not by the load of the moment.
  : > "$DIR/plan.jsonl"
  probes=""
  for seqs in ${PARALLEL//,/ }; do
    for mode in lru hf lfu; do
      pflags="--trace $DIR/trace-router.jsonl -n $N -r $R --parallel $seqs"
      [ "$mode" = lru ] && pflags="$pflags --no-hits-first"
      [ "$mode" = lfu ] && pflags="$pflags --cache-policy lfu"
      # shellcheck disable=SC2086
      "$SPOOL" plan -m "$REPLAY" --stream --cache-budget-gb "$budget" -t "$THREADS" --json $pflags $probes > "$DIR/plan.json" 2> "$DIR/plan.log" ||
        { echo "predict.sh: plan $mode failed:" >&2; tail -3 "$DIR/plan.log" >&2; exit 1; }
      [ -n "$probes" ] || probes=$("$PYTHON" -c "import json,sys; j=json.load(open(sys.argv[1])); print('--mem-gbps %.3f --disk-gbps %.3f --compute-gbps %.3f' % (j['mem_gbps'], j['disk_gbps'], j['trace']['compute_gbps']))" "$DIR/plan.json")
      echo "$probes" > "$DIR/plan-probes.txt"
      "$PYTHON" -c "import json,sys; t=json.load(open(sys.argv[1]))['trace']; print(json.dumps(dict(model=sys.argv[2], mode=sys.argv[3], n_parallel=int(sys.argv[4]), hit_rate=t['hit_rate'], tok_s=t['decode_tok_s'], stall_ms=t.get('stall_ms_per_token'))))" \
        "$DIR/plan.json" "$name" "$mode" "$seqs" >> "$DIR/plan.jsonl"
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
modes = ["lru", "hf", "lfu", "router", "head", "routeby"]
label = {"lru": "LRU only", "hf": "LRU, hits first", "lfu": "LFU, hits first", "router": "LRU, hits first + next-router prefetch",
         "head": "LFU, hits first + trained-head prefetch", "routeby": "route by heads (not exact)"}
lines = [f"Experts streamed with O_DIRECT from a disk throttled to {float(bps)/1e9:g} GB/s (cgroup), cache = {float(frac):.0%} of the experts' bytes; "
         f"`spool bench --text` (held-out text, {n} tokens per sequence, {r} repetitions x {rounds} interleaved rounds); "
         "prefetch reads up to M = top-k guesses per token (best first, at most 2 in flight, only while no miss is being read) into staging buffers beside the cache. "
         "tok/s: mean of the rounds (each round's in brackets; modes interleaved within a round).", "",
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
            per = " / ".join(f"{x['avg_ts']:.1f}" for x in sorted(xs, key=lambda x: x["round"]))
            lines.append(f"| {model} | {seqs} | {label[mode]} | {ts:.1f} ({per}) | {ts / base:.2f}x | {hit:.1%} | {mb:.2f} | {stall:.2f} | {wasted:.2f} |")
            plot[(model, seqs)][mode] = ts / base
pj = os.path.join(d, "plan.jsonl")
if replay and os.path.exists(pj) and os.path.getsize(pj):
    pp = os.path.join(d, "plan-probes.txt")
    probes = open(pp).read().strip() if os.path.exists(pp) else ""
    lines += ["", f"`spool plan --trace` (same trace, budget and tg test; outside the throttled cgroup; its probes once, before the predictions: `{probes}`) "
              f"against the measured {replay} rows:", "",
              "| seqs | mode | plan hit rate | measured | plan tok/s | measured | plan / measured tok/s | plan stall ms / token | measured |",
              "|---|---|---|---|---|---|---|---|---|"]
    for l in open(pj):
        p = json.loads(l)
        xs = g.get((p["model"], p["n_parallel"], p["mode"]))
        if not xs: continue
        ts = statistics.mean(x["avg_ts"] for x in xs)
        hit = statistics.mean(x["cache_hit_rate"] for x in xs)
        toks = int(n) * int(r) * p["n_parallel"]
        stall = statistics.mean(x.get("stall_s", 0) for x in xs) / toks * 1e3
        pt = p["tok_s"] or 0
        ps = p.get("stall_ms")
        lines.append(f"| {p['n_parallel']} | {label[p['mode']]} | {p['hit_rate']:.1%} | {hit:.1%} | {pt:.1f} | {ts:.1f} | {pt / ts:.2f} | "
                     f"{'-' if ps is None else f'{ps:.1f}'} | {stall:.1f} |")
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
