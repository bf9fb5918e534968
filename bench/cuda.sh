#!/usr/bin/env bash
# spool on CUDA (dense part + KV in VRAM, routed experts in VRAM (static share or slots) with a pinned host-RAM tier
# behind them) against llama.cpp on CUDA with its experts on the CPU (`--cpu-moe`, and the best
# `--n-cpu-moe N` that fits), the way GPU owners run MoE models larger than their VRAM today.
# Runs on the GPU machine, as one job (it needs nothing from a previous run):
#  1. builds llama.cpp with CUDA (llama-bench, llama-quantize) from LLAMA_SRC (a source folder or a
#     .tar.xz of one, e.g. the llama-cpp-python sdist's vendor/llama.cpp) in the background, unless
#     LLAMA_BIN names a build;
#  2. meanwhile writes a synthetic of LAYERS layers with the shape of PRESET (`spool synth --preset
#     PRESET`, BF16; default qwen3.6-35b-a3b, also deepseek-v3-671b, glm-4.5-air, gpt-oss-120b or any
#     preset bench/moe_to_gguf.py converts), spool's q4 of it (`spool convert --recipe q4`) and the same
#     BF16 weights as GGUF (bench/moe_to_gguf.py) quantized by llama-quantize to Q4_K_M: both tools run
#     the same weights. gpt-oss's experts are MXFP4 as released: spool's q4 keeps them, and so does
#     llama-quantize here (--tensor-type ffn_*_exps=mxfp4; the rest Q4_K_M);
#  3. for each VRAM budget: a ballast process (PyTorch) takes the rest of the card so that both
#     engines see the same free VRAM; spool runs with `--vram-budget-gb auto` (the free VRAM) and a
#     host-RAM tier of RAM_TIER_GB, twice: `--vram-experts static` (a share of each layer's experts
#     in VRAM, the rest in mapped pinned host memory the GPU reads in place) and `--vram-experts
#     slots` (LRU VRAM slots copied from the pinned RAM tier); llama.cpp with -ngl 99 and --cpu-moe, and with --n-cpu-moe N
#     for the smallest N that loads in that VRAM (binary search): the best llama.cpp can do there. Decode tg$N and prefill pp$P, R interleaved
#     repetitions (llama.cpp, spool, llama.cpp, ...);
#  4. measures host->device GB/s (pinned and pageable) in the same run (`spool doctor`) and
#     spool's share of it (its host->device bytes per token x tokens/s);
#  5. writes $OUT/cuda.md (table) and $OUT/cuda.png (matplotlib), and the raw logs; for another
#     PRESET $OUT/cuda-PRESET.md, cuda-PRESET.png and logs named the same way.
#
# VRAM budgets are stated for the full model (BUDGETS, GiB: "16 8"; "24 16" for deepseek-v3-671b,
# whose dense part alone is ~9 GiB at Q4) and scaled to LAYERS: the layer-independent part
# (embeddings, output head, final norm: F GiB of the GGUF) stays, the rest scales with the layer
# count: budget_L = F + (B - F) * LAYERS / FULL, FULL the preset's layer count (40 for Qwen3.6-35B-A3B,
# 61 DeepSeek-V3, 46 GLM-4.5-Air, 36 gpt-oss-120b). So LAYERS=FULL is the exact protocol; fewer layers
# keep the same VRAM-to-model ratio per layer (the leading dense layers of DeepSeek / GLM make a cut
# model a little denser than the whole; LAYERS must exceed them). The host-RAM tier is sized like a
# 32 GB machine: RAM_TIER_GB (default: every expert, as 32 GB holds the 20 GB Qwen3.6 model).
# Disk: the BF16 checkpoint, spool's q4 and the BF16 GGUF exist together for a moment (then the q4 and
# the Q4_K_M GGUF stay): about 2.3 x the BF16 size of LAYERS layers in DIR (checked before the GGUF is
# written); a DeepSeek-V3 MoE layer is 22.6 GB in BF16, so LAYERS=4 (3 dense + 1 MoE, ~30 GB) peaks at
# ~69 GB there, more than the single-GPU device machine's 64 GB disk (docs/benchmarks.md lists sizes).
#
#   OUT=/tmp/out SPOOL=build-cuda/spool LLAMA_SRC=/path/llama-src.tar.xz LAYERS=40 bench/cuda.sh
#   PRESET=gpt-oss-120b LAYERS=8 OUT=/tmp/out SPOOL=build-cuda/spool LLAMA_BIN=/path/bin bench/cuda.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SPOOL=$(realpath "${SPOOL:-build-cuda/spool}")
LLAMA_SRC=${LLAMA_SRC:-}
LLAMA_BIN=${LLAMA_BIN:-}
PRESET=${PRESET:-qwen3.6-35b-a3b}
LAYERS=${LAYERS:-}  # default: the preset's full depth
P=${P:-512} N=${N:-128} R=${R:-2}
DIR=${DIR:-/tmp/spool-cuda-bench}
OUT=${OUT:-bench/results}
THREADS=${THREADS:-$(nproc)}
export THREADS LLAMA_FA=${LLAMA_FA:-OFF}
PYTHON=${PYTHON:-python3}
RAM_TIER_GB=${RAM_TIER_GB:-}
# The gguf package for bench/moe_to_gguf.py: installed, or llama.cpp's gguf-py (GGUF_PY; found in LLAMA_SRC).
GGUF_PY=${GGUF_PY:-}
# The preset's full depth, leading dense layers and display name (src/models/presets/*.json).
read -r FULL_LAYERS DENSE_LEAD MODEL_TYPE TITLE < <("$PYTHON" - "$PRESET" <<'PY'
import glob, json, sys
names = {"qwen3.6-35b-a3b": "Qwen3.6-35B-A3B", "deepseek-v3-671b": "DeepSeek-V3-671B", "glm-4.5-air": "GLM-4.5-Air",
         "gpt-oss-120b": "gpt-oss-120b"}
for f in sorted(glob.glob("src/models/presets/*.json")):
    for p in json.load(open(f)):
        if p["name"] == sys.argv[1]:
            c = {**p["config"], **p["config"].get("text_config", {})}
            print(c["num_hidden_layers"], c.get("first_k_dense_replace", 0), c["model_type"], names.get(p["name"], p["name"]))
            sys.exit(0)
sys.exit(f"cuda.sh: no preset {sys.argv[1]!r} in src/models/presets (spool synth --help lists them)")
PY
) || exit 1
LAYERS=${LAYERS:-$FULL_LAYERS}
[ "$LAYERS" -le "$FULL_LAYERS" ] || { echo "cuda.sh: LAYERS=$LAYERS exceeds $PRESET's $FULL_LAYERS layers"; exit 1; }
[ "$LAYERS" -gt "$DENSE_LEAD" ] || { echo "cuda.sh: $PRESET's first $DENSE_LEAD layers are dense: LAYERS=$LAYERS would have no experts"; exit 1; }
case "$PRESET" in
  deepseek-v3-671b) BUDGETS=${BUDGETS:-"24 16"} ;;
  *) BUDGETS=${BUDGETS:-"16 8"} ;;
esac
# File names: the default preset keeps the names of earlier runs (cuda.md, q36-*), others carry the preset.
if [ "$PRESET" = qwen3.6-35b-a3b ]; then TAG=q36 SUF=; else TAG=$PRESET SUF=-$PRESET; fi
# llama-quantize: Q4_K_M; gpt-oss's experts stay MXFP4 as released (spool's q4 keeps them too).
QUANT_ARGS=()
QUANT_NOTE=Q4_K_M
if [ "$MODEL_TYPE" = gpt_oss ]; then
  QUANT_ARGS=(--tensor-type ffn_gate_exps=mxfp4 --tensor-type ffn_up_exps=mxfp4 --tensor-type ffn_down_exps=mxfp4)
  QUANT_NOTE="Q4_K_M (experts MXFP4 as released)"
fi
mkdir -p "$DIR" "$OUT"
LOG=$OUT/cuda-bench$SUF.log
: > "$LOG"
t0=$SECONDS
say() { echo "[$((SECONDS - t0)) s] $*" | tee -a "$LOG"; }

[ -x "$SPOOL" ] || { echo "cuda.sh: no spool binary at $SPOOL (build with -DSPOOL_CUDA=ON)"; exit 1; }
nvidia-smi -L >/dev/null 2>&1 || { echo "cuda.sh: no GPU (nvidia-smi -L failed)"; exit 1; }

# ---- 1. llama.cpp with CUDA, in the background ------------------------------------------------
llama_dir=
if [ -z "$LLAMA_BIN" ]; then
  [ -n "$LLAMA_SRC" ] || { echo "cuda.sh: set LLAMA_BIN (a llama.cpp CUDA build's bin/) or LLAMA_SRC"; exit 1; }
  llama_dir=$LLAMA_SRC
  if [ -f "$LLAMA_SRC" ]; then
    rm -rf "$DIR/llama-src" && mkdir -p "$DIR/llama-src"
    tar -C "$DIR/llama-src" -xJf "$LLAMA_SRC"
    llama_dir=$(find "$DIR/llama-src" -mindepth 1 -maxdepth 1 -type d | head -1)
  fi
  [ -f "$llama_dir/CMakeLists.txt" ] || { echo "cuda.sh: LLAMA_SRC ($LLAMA_SRC) holds no llama.cpp source"; exit 1; }
  [ -n "$GGUF_PY" ] || [ ! -d "$llama_dir/gguf-py" ] || GGUF_PY=$llama_dir/gguf-py
fi
build_llama() {
  local src=$llama_dir
  # A trimmed source (tools/ with llama-bench and quantize only, no audio library): build just those two tools.
  # FlashAttention kernels are left out by default (LLAMA_FA=ON builds them): they are a third of
  # the CUDA build (which must fit one 10-minute job on the device machine), and at these lengths
  # (pp512, tg128; 1 in 4 layers has attention) llama.cpp's attention path is a small part of a step.
  [ -d "$src/vendor/miniaudio" ] || sed -i '/add_subdirectory(miniaudio)/d' "$src/vendor/CMakeLists.txt"
  [ -d "$src/tools/server" ] || printf 'find_package(Threads REQUIRED)\nllama_add_compile_flags()\nadd_subdirectory(llama-bench)\nadd_subdirectory(quantize)\n' > "$src/tools/CMakeLists.txt"
  cmake -S "$src" -B "$DIR/llama-build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DGGML_NATIVE=ON -DGGML_CUDA_NCCL=OFF -DGGML_CUDA_FA="$LLAMA_FA" -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=ON > "$OUT/llama-build.log" 2>&1
  ninja -C "$DIR/llama-build" -j"$THREADS" llama-bench llama-quantize >> "$OUT/llama-build.log" 2>&1
}
if [ -z "$LLAMA_BIN" ]; then
  LLAMA_BIN=$DIR/llama-build/bin
  ( s=$SECONDS; build_llama && echo "llama.cpp built in $((SECONDS - s)) s" >> "$LOG" || { echo "llama.cpp build FAILED" >> "$LOG"; tail -30 "$OUT/llama-build.log" >> "$LOG"; } ) &
  build_pid=$!
else
  build_pid=
fi

# ---- 2. the checkpoint, both ways ---------------------------------------------------------------
BF16=$DIR/$TAG-${LAYERS}l.bf16 Q4=$DIR/$TAG-${LAYERS}l-q4 GGUF=$DIR/$TAG-${LAYERS}l-Q4_K_M.gguf
if [ ! -f "$Q4/config.json" ] || [ ! -f "$GGUF" ]; then
  say "synth ($PRESET, $LAYERS of $FULL_LAYERS layers, BF16)"
  [ -f "$BF16/config.json" ] || "$SPOOL" synth --preset "$PRESET" --layers "$LAYERS" --out "$BF16" --no-check -t "$THREADS" >> "$LOG" 2>&1
  say "spool convert --recipe q4"
  [ -f "$Q4/config.json" ] || "$SPOOL" convert -m "$BF16" --recipe q4 -o "$Q4" -t "$THREADS" >> "$LOG" 2>&1
  say "moe_to_gguf (BF16 GGUF)"
  if [ ! -f "$GGUF" ]; then  # the BF16 GGUF is about the checkpoint's size, written beside it
    need=$(du -sb "$BF16" | cut -f1) free=$(df -B1 --output=avail "$DIR" | tail -1)
    [ "$free" -gt $((need + need / 50)) ] || { echo "cuda.sh: the BF16 GGUF needs ~$(numfmt --to=iec "$need") in $DIR, $(numfmt --to=iec "$free") free: use fewer LAYERS or a DIR on a larger disk" | tee -a "$LOG"; exit 1; }
  fi
  [ -f "$GGUF" ] || PYTHONPATH=$GGUF_PY "$PYTHON" bench/moe_to_gguf.py "$BF16" "$BF16.gguf" >> "$LOG" 2>&1
  rm -rf "$BF16"
  if [ -n "$build_pid" ]; then wait "$build_pid" || true; build_pid=; fi
  [ -x "$LLAMA_BIN/llama-quantize" ] || { echo "cuda.sh: no llama-quantize in $LLAMA_BIN"; cat "$LOG"; exit 1; }
  say "llama-quantize $QUANT_NOTE"
  [ -f "$GGUF" ] || "$LLAMA_BIN/llama-quantize" ${QUANT_ARGS[@]+"${QUANT_ARGS[@]}"} "$BF16.gguf" "$GGUF" Q4_K_M "$THREADS" >> "$OUT/llama-quantize$SUF.log" 2>&1
  rm -f "$BF16.gguf"
fi
if [ -n "$build_pid" ]; then wait "$build_pid" || true; fi
[ -x "$LLAMA_BIN/llama-bench" ] || { echo "cuda.sh: no llama-bench in $LLAMA_BIN"; cat "$LOG"; exit 1; }

# ---- sizes, budgets, the link ------------------------------------------------------------------
read -r gguf_bytes fixed_bytes < <(PYTHONPATH=$GGUF_PY "$PYTHON" - "$GGUF" <<'PY'
import sys, gguf
r = gguf.GGUFReader(sys.argv[1])
fixed = sum(int(t.n_bytes) for t in r.tensors if not t.name.startswith("blk."))
import os
print(os.path.getsize(sys.argv[1]), fixed)
PY
)
q4_bytes=$(du -sb "$Q4" | cut -f1)
[ -n "$RAM_TIER_GB" ] || RAM_TIER_GB=$("$PYTHON" -c "print(round($q4_bytes / 2**30 + 0.5, 1))")
"$SPOOL" doctor > "$OUT/doctor.log" 2>&1 || true
link=$(grep -o 'host->device [0-9.]* GB/s pinned, [0-9.]* GB/s pageable' "$OUT/doctor.log" | head -1 || true)
h2d_pinned=$(echo "$link" | awk '{print $2}')
say "GGUF $QUANT_NOTE $(numfmt --to=iec "$gguf_bytes"), layer-independent $(numfmt --to=iec "$fixed_bytes"); spool q4 $(numfmt --to=iec "$q4_bytes"); $link"

scaled() {  # scaled B: the VRAM budget (GiB) of the full FULL_LAYERS-layer model, scaled to LAYERS
  "$PYTHON" -c "f=$fixed_bytes/2**30; print(round(f + ($1 - f) * $LAYERS / $FULL_LAYERS, 2))"
}

# ---- 3. ballast and runs ---------------------------------------------------------------------------
ballast_pid=
ballast_on() {  # ballast_on GIB: leave GIB of VRAM free
  rm -f "$DIR/ballast.ready"
  "$PYTHON" - "$1" "$DIR/ballast.ready" <<'PY' &
import sys, time, torch
torch.cuda.init()
torch.empty(1, device="cuda")
free, total = torch.cuda.mem_get_info()
want = int(float(sys.argv[1]) * 2**30)
b = torch.empty(max(free - want, 0), dtype=torch.uint8, device="cuda")
free2, _ = torch.cuda.mem_get_info()
open(sys.argv[2], "w").write(f"{free2}\n")
time.sleep(36000)
PY
  ballast_pid=$!
  for _ in $(seq 1 120); do [ -s "$DIR/ballast.ready" ] && break; sleep 0.5; done
  [ -s "$DIR/ballast.ready" ] || { echo "cuda.sh: ballast did not start"; exit 1; }
  say "ballast: $(nvidia-smi --query-gpu=memory.free --format=csv,noheader) free (asked $1 GiB)"
}
ballast_off() {
  if [ -n "$ballast_pid" ]; then
    kill "$ballast_pid" 2>/dev/null || true
    wait "$ballast_pid" 2>/dev/null || true
  fi
  ballast_pid=
}
on_exit() {
  ballast_off
  if [ -n "${build_pid:-}" ]; then kill -- -"$build_pid" 2>/dev/null || kill "$build_pid" 2>/dev/null || true; fi
}
trap on_exit EXIT

results=$OUT/cuda-results$SUF.tsv
printf 'budget_gib\tengine\tconfig\ttest\trep\tts\tnote\n' > "$results"

llama_run() {  # llama_run BUDGET LABEL REP FLAGS...: one llama-bench run (pp and tg); appends rows
  local b=$1 label=$2 rep=$3; shift 3
  local j=$DIR/llama.json
  if ! timeout 300 "$LLAMA_BIN/llama-bench" -m "$GGUF" -ngl 99 -t "$THREADS" -p "$P" -n "$N" -r 1 -o json "$@" > "$j" 2> "$DIR/llama.err"; then
    printf '%s\tllama.cpp\t%s\t-\t%s\t0\tfailed\n' "$b" "$label" "$rep" >> "$results"
    return 1
  fi
  "$PYTHON" - "$j" "$b" "$label" "$rep" >> "$results" <<'PY'
import json, sys
j, b, label, rep = sys.argv[1], *sys.argv[2:]
for r in json.load(open(j)):
    t = f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']}"
    print(f"{b}\tllama.cpp\t{label}\t{t}\t{rep}\t{r['avg_ts']:.2f}\t")
PY
}
llama_fits() {  # llama_fits N: does -ncmoe N load, take a pp$P prompt and decode within the free VRAM?
  timeout 120 "$LLAMA_BIN/llama-bench" -m "$GGUF" -ngl 99 -t "$THREADS" -p "$P" -n 2 -r 1 --n-cpu-moe "$1" > /dev/null 2>&1
}
spool_run() {  # spool_run BUDGET REP MODE: one spool bench run (pp and tg) with --vram-experts MODE; appends rows
  local b=$1 rep=$2 mode=$3 j=$DIR/spool.json label
  case "$mode" in
    static) label="static: VRAM share + mapped pinned RAM" ;;
    *) label="slots + pinned RAM tier" ;;
  esac
  if ! timeout 300 "$SPOOL" bench -m "$Q4" --device cuda --vram-budget-gb auto --cache-budget-gb "$RAM_TIER_GB" --vram-experts "$mode" \
      -t "$THREADS" -p "$P" -n "$N" -r 1 -o json > "$j" 2> "$DIR/spool.err"; then
    printf '%s\tspool\t%s\t-\t%s\t0\tfailed\n' "$b" "$label" "$rep" >> "$results"
    tail -5 "$DIR/spool.err" >> "$LOG"
    return 1
  fi
  cat "$DIR/spool.err" >> "$OUT/spool-runs$SUF.log"
  local share
  share=$(grep -o 'experts placed statically: [0-9]* of [0-9]*' "$DIR/spool.err" | awk '{printf "%.0f%% of the experts in VRAM", 100 * $4 / $6}' || true)
  "$PYTHON" - "$j" "$b" "$rep" "$label" "$share" >> "$results" <<'PY'
import json, sys
j, b, rep, label, share = sys.argv[1:]
for r in json.load(open(j)):
    t = f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']}"
    h2d = r.get("h2d_bytes_per_token", 0)
    hit = r.get("vram_hit_rate", None)
    note = share if share else f"h2d/token {h2d/2**20:.1f} MiB" + (f", VRAM hit {100*hit:.1f}%" if hit is not None else "")
    print(f"{b}\tspool\t{label}\t{t}\t{rep}\t{r['avg_ts']:.2f}\t{note}")
PY
}

for B in $BUDGETS; do
  b=$(scaled "$B")
  ballast_on "$b"
  # The best --n-cpu-moe: the fewest layers with experts on the CPU that still load (fits(n) holds
  # for every n above the smallest that fits: binary search over [0, LAYERS - 1]).
  best=
  lo=0 hi=$((LAYERS - 1))
  if llama_fits "$hi"; then
    best=$hi
    while [ "$lo" -lt "$best" ]; do
      mid=$(((lo + best) / 2))
      if llama_fits "$mid"; then best=$mid; else lo=$((mid + 1)); fi
    done
  fi
  say "budget $B GiB (scaled: $b GiB): best --n-cpu-moe ${best:-none (only --cpu-moe loads)}"
  for ((rep = 1; rep <= R; rep++)); do
    llama_run "$B" "--cpu-moe" "$rep" --n-cpu-moe "$LAYERS" || say "llama.cpp --cpu-moe failed at $B GiB: $(tail -2 "$DIR/llama.err")"
    spool_run "$B" "$rep" static || say "spool (static) failed at $B GiB"
    spool_run "$B" "$rep" slots || say "spool (slots) failed at $B GiB"
    [ -z "$best" ] || llama_run "$B" "--n-cpu-moe $best" "$rep" --n-cpu-moe "$best" || say "llama.cpp -ncmoe $best failed"
  done
  ballast_off
done

# ---- 4. table and plot ---------------------------------------------------------------------------
"$PYTHON" - "$results" "$OUT" "$LAYERS" "$P" "$N" "$h2d_pinned" "$gguf_bytes" "$q4_bytes" "$fixed_bytes" "$link" \
  "$FULL_LAYERS" "$TITLE" "$SUF" "$QUANT_NOTE" <<'PY'
import collections, os, statistics, sys
res, out, layers, P, N, h2d, gguf_b, q4_b, fixed_b, link, full, title, suf, qnote = sys.argv[1:]
rows = [l.rstrip("\n").split("\t") for l in open(res)][1:]
agg = collections.OrderedDict()
notes = {}
for b, eng, cfg, test, rep, ts, note in rows:
    if test == "-":
        continue
    agg.setdefault((b, eng, cfg), {}).setdefault(test, []).append(float(ts))
    if note:
        notes[(b, eng, cfg, test)] = note
tg, pp = f"tg{N}", f"pp{P}"
lines = [f"# spool CUDA vs llama.cpp CUDA (experts on the CPU)", "",
         f"{title} shape, {layers} of {full} layers (synthetic weights): llama.cpp GGUF {qnote} "
         f"{int(gguf_b)/2**30:.2f} GiB, spool q4 {int(q4_b)/2**30:.2f} GiB (the same BF16 weights); "
         f"layer-independent part {int(fixed_b)/2**30:.2f} GiB. Budgets are for the {full}-layer model, scaled to {layers} layers "
         f"(see bench/cuda.sh). {link} (measured in this run). llama.cpp: CUDA build of this run, -ngl 99, "
         f"FlashAttention kernels {'on' if os.environ.get('LLAMA_FA') == 'ON' else 'not built'}; both engines {os.environ.get('THREADS')} threads.", "",
         f"| VRAM budget ({full} layers) | engine | config | {tg} t/s | {pp} t/s | notes |", "|---|---|---|---:|---:|---|"]
best = {}
for (b, eng, cfg), t in agg.items():
    m = {k: statistics.mean(v) for k, v in t.items()}
    note = notes.get((b, eng, cfg, tg), "")
    if eng == "spool" and note.startswith("h2d/token") and float(h2d) > 0:
        mib = float(note.split()[1])
        share = mib * 2**20 * m.get(tg, 0) / (float(h2d) * 1e9)
        note += f", {100*share:.0f}% of pinned H2D"
    lines.append(f"| {b} GiB | {eng} | {cfg} | {m.get(tg, 0):.2f} | {m.get(pp, 0):.2f} | {note} |")
    best.setdefault(b, {})[(eng, cfg)] = m
lines.append("")
for b, d in best.items():
    cm = d.get(("llama.cpp", "--cpu-moe"))
    nc = [m for (e, c), m in d.items() if c.startswith("--n-cpu-moe")]
    for (e, c), s in d.items():
        if e != "spool" or not cm:
            continue
        line = f"- {b} GiB, spool {c}: decode {s.get(tg,0)/max(cm.get(tg,1e-9),1e-9):.2f}x llama.cpp --cpu-moe, prefill {s.get(pp,0)/max(cm.get(pp,1e-9),1e-9):.2f}x"
        if nc:
            line += f"; vs best --n-cpu-moe: decode {s.get(tg,0)/max(nc[0].get(tg,1e-9),1e-9):.2f}x, prefill {s.get(pp,0)/max(nc[0].get(pp,1e-9),1e-9):.2f}x"
        lines.append(line)
open(f"{out}/cuda{suf}.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, test in zip(axes, (tg, pp)):
        labels, vals = [], []
        for (b, eng, cfg), t in agg.items():
            labels.append(f"{b} GiB\n{eng}\n{cfg}")
            vals.append(statistics.mean(t.get(test, [0])))
        ax.bar(range(len(vals)), vals, color=["tab:blue" if "spool" in l else "tab:gray" for l in labels])
        ax.set_xticks(range(len(vals)), labels, fontsize=6)
        ax.set_ylabel("tokens/s")
        ax.set_title(test)
    fig.suptitle(f"{title} shape, {layers} layers, Q4: spool CUDA vs llama.cpp CUDA with CPU experts")
    fig.tight_layout()
    fig.savefig(f"{out}/cuda{suf}.png", dpi=110)
except Exception as e:
    print("no plot:", e)
PY
say "done"
