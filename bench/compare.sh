#!/usr/bin/env bash
# spool vs llama.cpp on the same machine, threads and weights (not in CI; root for cgroups and
# drop_caches). A synthetic Qwen3-30B-A3B-shaped checkpoint (BF16, fewer layers) is written by
# `spool synth`, converted to a BF16 GGUF (bench/moe_to_gguf.py, gguf package), and both
# tools run llama-bench-style pp/tg tests: fully resident, then inside memory cgroups of 8 and
# 4 GiB (llama.cpp with mmap, as users run it; spool streaming experts with its auto budget).
# Runs are interleaved in rounds (llama.cpp, spool, ... then again; ROUNDS, CAP_ROUNDS). The physical limits are measured in the same
# run: memory read bandwidth (spool plan's probe) and direct-read disk bandwidth (fio).
# Writes bench/results/compare.md and bench/results/compare.png.
#
#   LLAMA_BIN=/path/to/llama.cpp/build/bin PYTHON=/path/to/venv/bin/python bench/compare.sh
#   PRESET=qwen3.6-35b-a3b LAYERS=4 NAME=compare-q36 bench/compare.sh     # the Qwen3.6-35B-A3B shape
#   MODEL=build/models/spool-demo-moe LABEL="demo model" CAPS= NAME=compare-demo bench/compare.sh
#   MODEL=/work/ckpt/q36-8L-Q4_K_M.gguf CAPS=1.3 LLAMA_FLAGS="--repack 0" NAME=compare-gguf bench/compare.sh
#     (GGUF mode: MODEL is a .gguf file and both tools run that same file; CAPS may be fractional
#      GiB; LLAMA_FLAGS go to every llama-bench run, e.g. --repack 0; LLAMA_VARIANTS="--repack 1"
#      adds a second llama.cpp run per config with those flags instead; SPOOL_VARIANTS="--act-bits 32" a second
#      spool run per config with those flags added; RESIDENT=0 runs the capped configs only;
#      IK_BIN=/path/to/ik_llama.cpp/build/bin adds ik_llama.cpp's llama-bench as a third tool, default flags)
# fio (disk bandwidth) and gnuplot (the PNG) are needed only for capped configs / the plot: a resident-only
# run (CAPS=) without them says so and skips those parts.
#
# llama.cpp is built outside the repository, e.g. from the llama-cpp-python sdist:
#   pip download --no-binary :all: --no-deps llama-cpp-python && tar xzf llama_cpp_python-*.tar.gz
#   cmake -S llama_cpp_python-*/vendor/llama.cpp -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
#     -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF && ninja -C build llama-bench
# PYTHON needs numpy and the gguf package (pip install gguf numpy, or llama.cpp's gguf-py).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
SPOOL=${SPOOL_BIN:-$BUILD/spool}
LLAMA_BIN=${LLAMA_BIN:-/work/scratch/llama.cpp/build/bin}
PYTHON=${PYTHON:-/work/scratch/venv/bin/python}
PRESET=${PRESET:-qwen3-30b-a3b}          # spool synth preset (qwen3-30b-a3b or qwen3.6-35b-a3b)
LAYERS=${LAYERS:-8}                      # 8 of Qwen3-30B-A3B's 48 layers: 10.4 GiB in BF16
DIR=${SPOOL_BENCH_DIR:-$HOME/.cache/spool-bench}
MODEL=${MODEL:-$DIR/${PRESET}-${LAYERS}l}
GGUF_MODE=0
case "$MODEL" in *.gguf) GGUF_MODE=1; GGUF=$MODEL ;; esac
# The table's model line: a GGUF file is named by its file name unless LABEL says what it is.
if [ "$GGUF_MODE" = 1 ]; then LABEL=${LABEL:-"GGUF $(basename "$MODEL")"}
else LABEL=${LABEL:-"synthetic $PRESET shape, $LAYERS layers"}; fi
GGUF=${GGUF:-$MODEL.bf16.gguf}
LLAMA_FLAGS=${LLAMA_FLAGS:-}           # extra llama-bench flags (e.g. --repack 0)
LLAMA_VARIANTS=${LLAMA_VARIANTS:-}     # another llama-bench run per config with these flags instead
SPOOL_VARIANTS=${SPOOL_VARIANTS:-}     # another spool run per config with these flags added
IK_BIN=${IK_BIN:-}                     # ik_llama.cpp's bin/ (llama-bench): a third tool when set
THREADS=${THREADS:-$(nproc)}
CAPS=${CAPS-"8 4"}                      # cgroup limits, GiB
RES_P=${RES_P:-512} RES_N=${RES_N:-128} RES_R=${RES_R:-2} ROUNDS=${ROUNDS:-3}   # resident tests: R repetitions per run, ROUNDS interleaved rounds
CAP_P=${CAP_P:-64} CAP_N=${CAP_N:-32} CAP_R=${CAP_R:-2} CAP_ROUNDS=${CAP_ROUNDS:-1}   # capped tests (each token may read from disk)
NAME=${NAME:-compare}
RESULTS=${RESULTS:-bench/results}           # where NAME.md / NAME.png go
OUT=$RESULTS/$NAME.md
PNG=$RESULTS/$NAME.png
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

[ "$ROUNDS" -ge 1 ] && [ "$CAP_ROUNDS" -ge 1 ] || { echo "compare.sh: ROUNDS and CAP_ROUNDS must be >= 1"; exit 1; }
[ "$(id -u)" -eq 0 ] || { echo "compare.sh: run as root (memory cgroups, drop_caches)"; exit 1; }
[ -x "$SPOOL" ] || { echo "compare.sh: build spool first ($SPOOL)"; exit 1; }
[ -x "$LLAMA_BIN/llama-bench" ] || { echo "compare.sh: no llama-bench in $LLAMA_BIN (see the header of this script)"; exit 1; }
[ -z "$IK_BIN" ] || [ -x "$IK_BIN/llama-bench" ] || { echo "compare.sh: no llama-bench in IK_BIN=$IK_BIN"; exit 1; }
if [ -n "$CAPS" ]; then command -v fio >/dev/null || { echo "compare.sh: install fio (capped configs measure the disk)"; exit 1; }; fi
HAVE_GNUPLOT=1
command -v gnuplot >/dev/null || { HAVE_GNUPLOT=0; echo "compare.sh: no gnuplot (apt-get install gnuplot-nox): the table only, no PNG"; }

if [ "$GGUF_MODE" = 1 ]; then
  [ -f "$MODEL" ] || { echo "compare.sh: $MODEL not found"; exit 1; }
else
  [ -f "$MODEL/config.json" ] || "$SPOOL" synth --preset "$PRESET" --layers "$LAYERS" --out "$MODEL"
  [ -f "$GGUF" ] || "$PYTHON" bench/moe_to_gguf.py "$MODEL" "$GGUF"
fi

# --- physical limits, measured now -------------------------------------------------------
plan_json=$("$SPOOL" plan -m "$MODEL" --threads "$THREADS" --no-stream --ctx-size "$RES_N" --json || true)
mem_gbps=$(python3 -c "import json,sys; print(round(json.loads(sys.argv[1])['mem_gbps'], 1))" "$plan_json")
active=$(python3 -c "import json,sys; print(json.loads(sys.argv[1])['active_bytes_per_token'])" "$plan_json")
if [ "$GGUF_MODE" = 1 ]; then shard=$MODEL; else shard=$(ls "$MODEL"/*.safetensors | head -1); fi
disk_gbps=0
if command -v fio >/dev/null; then
sync; echo 3 > /proc/sys/vm/drop_caches
disk_gbps=$(fio --name=probe --filename="$shard" --readonly --direct=1 --rw=randread --bs=4M --ioengine=psync \
  --numjobs=8 --group_reporting --runtime=10 --time_based --output-format=json 2>/dev/null |
  python3 -c "import json,sys; print(round(json.load(sys.stdin)['jobs'][0]['read']['bw']*1024/1e9, 3))")
fi
echo "memory read bandwidth $mem_gbps GB/s; direct-read disk bandwidth $disk_gbps GB/s; weights read per token $active B"

# --- runs ---------------------------------------------------------------------------------
# run_in, mem_cgroup, cg_reset, cg_peak (bench/lib.sh): runs inside memory cgroups.
. bench/lib.sh

rows=()
ratios=()
: > "$TMP/data.tsv"
# one_run CG P N R SPOOL_FLAGS TOOL: one llama-bench / spool bench run of TOOL, its JSON on stdout
# (a "failed" record when the tool crashed or was OOM-killed).
one_run() {
  local cg=$1 p=$2 n=$3 r=$4 sflags=$5 tool=$6 out
  local cmd
  if [ "$tool" = llama.cpp ]; then
    cmd=("$LLAMA_BIN/llama-bench" -m "$GGUF" -p "$p" -n "$n" -r "$r" -t "$THREADS" $LLAMA_FLAGS -o json)
  elif [ "${tool%% *}" = llama.cpp ]; then
    cmd=("$LLAMA_BIN/llama-bench" -m "$GGUF" -p "$p" -n "$n" -r "$r" -t "$THREADS" ${tool#llama.cpp } -o json)
  elif [ "$tool" = ik_llama.cpp ]; then
    cmd=("$IK_BIN/llama-bench" -m "$GGUF" -p "$p" -n "$n" -r "$r" -t "$THREADS" -o json)
  elif [ "$tool" = spool ]; then
    cmd=("$SPOOL" bench -m "$MODEL" -p "$p" -n "$n" -r "$r" -t "$THREADS" $sflags -o json)
  else
    cmd=("$SPOOL" bench -m "$MODEL" -p "$p" -n "$n" -r "$r" -t "$THREADS" $sflags ${tool#spool } -o json)
  fi
  # A tool killed part-way may have printed some of its JSON already: replace it, not append to it.
  if out=$(run_in "$cg" "${cmd[@]}") && python3 -c 'import json,sys; json.loads(sys.argv[1])' "$out" 2>/dev/null; then
    printf '%s\n' "$out"
  else
    echo '[{"n_gen":0,"n_prompt":0,"avg_ts":0,"stddev_ts":0,"failed":true}]'
  fi
}

# bench CONFIG CG P N R ROUNDS SPOOL_FLAGS: ROUNDS rounds, each running every tool once (R timed
# repetitions) back to back, so that each tool's samples spread over the whole run instead of one
# block per tool (this VM's memory bandwidth moves by tens of percent within minutes). Resident rounds
# measure the memory bandwidth first. Each tool's row pools its samples over the rounds it completed
# ("failed k/N rounds" otherwise); the ratios are per round.
bench() {
  local config=$1 cg=$2 p=$3 n=$4 r=$5 rounds=$6 sflags=$7
  local tests=("llama.cpp")
  [ -n "$LLAMA_VARIANTS" ] && tests+=("llama.cpp $LLAMA_VARIANTS")
  [ -n "$IK_BIN" ] && tests+=("ik_llama.cpp")
  tests+=("spool")
  [ -n "$SPOOL_VARIANTS" ] && tests+=("spool $SPOOL_VARIANTS")
  local rec="$TMP/runs.jsonl"
  : > "$rec"
  for round in $(seq 1 "$rounds"); do
    local bw=$mem_gbps
    if [ -z "$cg" ]; then
      bw=$("$SPOOL" plan -m "$MODEL" --threads "$THREADS" --no-stream --ctx-size "$n" --json |
        python3 -c "import json,sys; print(round(float(json.load(sys.stdin)['mem_gbps']), 1))") || bw=$mem_gbps
      echo "$bw" >> "$TMP/bw.txt"
    fi
    for tool in "${tests[@]}"; do
      [ -z "$cg" ] || cg_reset "$cg"
      local json rss cgpeak=0
      json=$(one_run "$cg" "$p" "$n" "$r" "$sflags" "$tool")
      rss=$(cat "$TMP/maxrss")
      [ -n "$cg" ] && cgpeak=$(cg_peak "$cg")
      python3 -c 'import json,sys; print(json.dumps({"round": int(sys.argv[1]), "tool": sys.argv[2], "bw": float(sys.argv[3]), "rss": int(sys.argv[4]), "cgpeak": int(sys.argv[5]), "runs": json.loads(sys.argv[6])}))' \
        "$round" "$tool" "$bw" "$rss" "$cgpeak" "$json" >> "$rec"
      echo "  $config, round $round/$rounds, $tool ($bw GB/s): $(python3 -c 'import json,sys; j=json.loads(sys.argv[1]); print("failed" if j[0].get("failed") else " ".join("%s %.2f" % ("pp%d" % t["n_prompt"] if t["n_gen"] == 0 else "tg%d" % t["n_gen"], t["avg_ts"]) for t in j))' "$json")"
    done
  done
  local out
  out=$(python3 - "$config" "$rec" "$disk_gbps" "$active" <<'PY'
import json, statistics as st, sys
config, rec, disk, active = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
recs = [json.loads(l) for l in open(rec)]
tools = list(dict.fromkeys(r["tool"] for r in recs))
def sd(v): return st.stdev(v) if len(v) > 1 else 0.0
per_round = {}  # (tool, round) -> (pp, tg) means
for t in tools:
    mine = [r for r in recs if r["tool"] == t]
    rss = max(r["rss"] for r in mine) / 2**30
    cgp = max(r["cgpeak"] for r in mine) / 2**30
    cg = f"{cgp:.2f}" if cgp else "-"
    ok = [r for r in mine if not r["runs"][0].get("failed")]
    failed = f" (failed {len(mine) - len(ok)}/{len(mine)} rounds)" if len(ok) < len(mine) else ""
    if not ok:
        print(f"| {config} | {t} | failed | failed | - | - | - | - | {rss:.2f} | {cg} |")
        print(f"DATA\t{config}\t{t}\t0\t0")
        continue
    pps, tgs, frac, hits, mbts = [], [], [], [], []
    for r in ok:
        pp = next(x for x in r["runs"] if x["n_gen"] == 0)
        tg = next(x for x in r["runs"] if x["n_prompt"] == 0)
        ps, ts = pp.get("samples_ts") or [pp["avg_ts"]], tg.get("samples_ts") or [tg["avg_ts"]]
        pps += ps
        tgs += ts
        per_round[(t, r["round"])] = (st.mean(ps), st.mean(ts))
        if r["bw"] > 0 and active > 0:
            frac += [x / (r["bw"] * 1e9 / active) for x in ts]
        if t.startswith("spool"):
            hits.append(tg["cache_hit_rate"])
            mbts.append(tg.get("bytes_read_per_token", 0) / 1e6)
    hit = f"{100 * st.mean(hits):.1f}%" if hits else "-"
    mbt = st.mean(mbts) if mbts else 0
    disk_frac = f"{100 * st.mean(tgs) * mbt / 1e3 / disk:.0f}%" if mbt > 0 and disk > 0 else "-"
    bound = f"{100 * st.mean(frac):.0f}%" if frac else "-"
    print(f"| {config} | {t}{failed} | {st.mean(pps):.2f} ± {sd(pps):.2f} | {st.mean(tgs):.2f} ± {sd(tgs):.2f} | "
          f"{bound} | {hit} | {mbt:.0f} | {disk_frac} | {rss:.2f} | {cg} |")
    print(f"DATA\t{config}\t{t}\t{st.mean(tgs):.4f}\t{st.mean(pps):.4f}")
rounds = sorted({r["round"] for r in recs})
bws = [r["bw"] for r in recs if r["tool"] == tools[0]]
for s in (t for t in tools if t.startswith("spool")):
    for l in (t for t in tools if t.startswith("llama.cpp") or t.startswith("ik_llama.cpp")):
        rs = [(per_round[(s, k)], per_round[(l, k)]) for k in rounds if (s, k) in per_round and (l, k) in per_round]
        if not rs:
            continue
        tg = [a[1] / b[1] for a, b in rs if b[1] > 0]
        pp = [a[0] / b[0] for a, b in rs if b[0] > 0]
        if not tg:
            continue
        fmt = lambda v: ", ".join(f"{x:.2f}x" for x in v)
        pre = f"prefill {fmt(pp)} (median {st.median(pp):.2f}x)" if pp else "prefill -"
        print(f"RATIO\t{config}: {s} / {l}: decode {fmt(tg)} per round (median {st.median(tg):.2f}x), "
              f"{pre}; memory read {min(bws):.1f}-{max(bws):.1f} GB/s")
PY
)
  while IFS= read -r line; do
    case "$line" in
      RATIO*) ratios+=("- ${line#RATIO	}") ;;
      DATA*) printf '%s\n' "$line" >> "$TMP/data.tsv"; continue ;;
      *) rows+=("$line") ;;
    esac
    echo "$line"
  done <<< "$out"
}

[ "${RESIDENT:-1}" = 1 ] && bench "resident" "" "$RES_P" "$RES_N" "$RES_R" "$ROUNDS" "--no-stream"
for cap in $CAPS; do
  cg=$(mem_cgroup "spool-cmp${cap}g" "$cap") || exit 1
  bench "cgroup ${cap} GiB" "$cg" "$CAP_P" "$CAP_N" "$CAP_R" "$CAP_ROUNDS" ""
done

model_gib=$(python3 -c "import os,sys; p=sys.argv[1]; b=os.path.getsize(p) if os.path.isfile(p) else sum(os.path.getsize(os.path.join(p, f)) for f in os.listdir(p) if f.endswith('.safetensors')); print(f'{b/2**30:.2f} GiB' if b >= 2**30 else f'{b/2**20:.0f} MiB')" "$MODEL")
if [ "$GGUF_MODE" = 1 ]; then same="the same GGUF file for both: $(basename "$MODEL")"; dtype=""
else same="same weights: safetensors for spool, GGUF for llama.cpp"; dtype=" BF16"; fi
{
  echo "spool vs llama.cpp (llama-bench built from the llama-cpp-python 0.3.36 sdist)${IK_BIN:+ and ik_llama.cpp (its llama-bench, default flags)}, $LABEL,"
  echo "$model_gib$dtype ($same), $THREADS threads${LLAMA_FLAGS:+, llama-bench $LLAMA_FLAGS},"
  echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) (family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | xargs) model $(grep -m1 '^model[[:space:]]' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) CPUs), $(date -u +%Y-%m-%d)."
  echo "Resident: pp$RES_P / tg$RES_N, $ROUNDS round(s) x $RES_R repetitions. Capped: pp$CAP_P / tg$CAP_N, $CAP_ROUNDS round(s) x $CAP_R repetitions, page cache dropped before each run."
  echo "Each round runs every tool once, back to back in the order of the table, so each tool's samples spread over the whole run; a row pools its"
  echo "samples (mean ± sd) over the rounds. llama.cpp maps the GGUF (mmap, its default); spool streams experts with its automatic cache budget."
  echo
  echo "Physical limits measured in the same run: memory read **$mem_gbps GB/s** at the start$([ -s "$TMP/bw.txt" ] && echo ", $(sort -n "$TMP/bw.txt" | head -1)-$(sort -n "$TMP/bw.txt" | tail -1) GB/s at the start of the resident rounds") (one token reads"
  echo "$(python3 -c "print(round($active/1e6))") MB of weights: decode bound $(python3 -c "print(round($mem_gbps*1e9/$active, 1))") tok/s at the start; tg / memory bound takes each sample against its round's bandwidth; the probe is a short read loop, a reference rather than a ceiling: an engine can exceed it);"
  if [ "$disk_gbps" != 0 ]; then echo "direct-read disk **$disk_gbps GB/s** (fio, 4 MiB random reads x 8)."; else echo "disk not measured (no fio; resident configs only)."; fi
  echo
  echo "| config | tool | pp t/s | tg t/s | tg / memory bound | expert hit rate | MB read/token | disk reads / disk bound | peak RSS GiB | cgroup peak GiB |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  if [ ${#ratios[@]} -gt 0 ]; then
    echo
    echo "Per-round ratios (each round's mean t/s, tools run back to back):"
    echo
    printf '%s\n' "${ratios[@]}"
  fi
} | tee "$OUT"

[ "$HAVE_GNUPLOT" = 1 ] || { echo "wrote $OUT (no gnuplot: no PNG)"; exit 0; }
grep '^DATA' "$TMP/data.tsv" | cut -f2- > "$TMP/plot.tsv"
python3 - "$TMP/plot.tsv" "$TMP/plot.dat" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
configs = []
for c, tool, tg, pp in rows:
    if c not in configs:
        configs.append(c)
with open(sys.argv[2], "w") as f:
    for c in configs:
        v = {tool: tg for cc, tool, tg, pp in rows if cc == c}
        f.write(f"\"{c}\" {v.get('llama.cpp', 0)} {v.get('spool', 0)}\n")
PY
gnuplot <<GP
set terminal pngcairo size 900,480 noenhanced font ",10"
set output "$PNG"
set title "Decode tokens/s (tg$RES_N resident, tg$CAP_N capped)\n$LABEL, $model_gib, $THREADS threads"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set ylabel "tokens/s"
set yrange [0:*]
set grid ytics
set key top right
plot "$TMP/plot.dat" using 2:xtic(1) title "llama.cpp (mmap)", "" using 3 title "spool"
GP
echo "wrote $OUT and $PNG"
