#!/usr/bin/env bash
# Batched decoding benchmark (issue 11; not in CI; root for the memory cgroup and drop_caches).
#
# spool: aggregate decode tok/s with 1, 2, 4 and 8 sequences decoded together (`spool bench
# --parallel`, Model::forward_batch: one step = one token of every sequence), experts acquired
# and bytes read from disk per token, on a Qwen3.6-35B-A3B-shaped synthetic checkpoint (q4,
# 8 layers): resident, then inside a memory cgroup at 0.5x the checkpoint (experts streamed
# with the automatic cache budget).
# llama.cpp: llama-server -np 4 on the same weights as GGUF Q4_K_M (with the checkpoint's
# vocabulary added by bench/gguf_add_vocab.py), 1 and 4 concurrent /completion requests, same
# threads, same cgroup; its default (weight repacking) and --no-repack (plain mmap).
# Runs are interleaved (spool, llama.cpp) per configuration. Memory read bandwidth (spool
# plan's probe) and direct-read disk bandwidth (fio) are measured in the same run.
# Writes bench/results/batch.md and bench/results/batch.png.
#
#   LLAMA_BIN=/path/to/llama.cpp/build/bin bench/batch.sh
#   MODEL=/path/q4-checkpoint GGUF=/path/model-Q4_K_M.gguf bench/batch.sh
#
# The checkpoint: `spool synth --preset qwen3.6-35b-a3b --layers 8 --out DIR.bf16` then
# `spool convert --model DIR.bf16 --out DIR --recipe q4` (the script does this when MODEL is
# missing). The GGUF: bench/moe_to_gguf.py DIR.bf16 X.bf16.gguf, then
# `llama-quantize X.bf16.gguf X-Q4_K_M.gguf Q4_K_M` (also done here when GGUF is missing).
# llama.cpp is built outside the repository (see bench/compare.sh's header; targets
# llama-server and llama-quantize).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
SPOOL=$BUILD/spool
LLAMA_BIN=${LLAMA_BIN:-/work/scratch/llama-build/bin}
PYTHON=${PYTHON:-/work/scratch/venv/bin/python}
DIR=${SPOOL_BENCH_DIR:-$HOME/.cache/spool-bench}
MODEL=${MODEL:-$DIR/qwen3.6-35b-a3b-8l-q4}
BF16=${BF16:-${MODEL%-q4}-bf16}
GGUF=${GGUF:-$MODEL-Q4_K_M.gguf}
THREADS=${THREADS:-$(nproc)}
NGEN=${NGEN:-32}        # tokens generated per sequence
REPS=${REPS:-2}
LLAMA_REPS=${LLAMA_REPS:-$REPS}
PAR=${PAR:-1,2,4,8}
CAP_FRACTION=${CAP_FRACTION:-0.5}
NAME=${NAME:-batch}
OUT=bench/results/$NAME.md
PNG=bench/results/$NAME.png
TMP=$(mktemp -d)
SERVER_PID=
cleanup() {
  [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT

[ "$(id -u)" -eq 0 ] || { echo "batch.sh: run as root (memory cgroup, drop_caches)"; exit 1; }
[ -x "$SPOOL" ] || { echo "batch.sh: build spool first ($SPOOL)"; exit 1; }
command -v fio >/dev/null || { echo "batch.sh: install fio"; exit 1; }
command -v gnuplot >/dev/null || { echo "batch.sh: install gnuplot (apt-get install gnuplot-nox)"; exit 1; }

if [ ! -f "$MODEL/config.json" ]; then
  [ -f "$BF16/config.json" ] || "$SPOOL" synth --preset qwen3.6-35b-a3b --layers 8 --out "$BF16"
  "$SPOOL" convert --model "$BF16" --out "$MODEL" --recipe q4
fi
have_llama=1
if [ ! -x "$LLAMA_BIN/llama-server" ]; then
  echo "batch.sh: no llama-server in $LLAMA_BIN: spool rows only"
  have_llama=0
elif [ ! -f "$GGUF" ]; then
  [ -f "$BF16.bf16.gguf" ] || "$PYTHON" bench/moe_to_gguf.py "$BF16" "$BF16.bf16.gguf"
  "$LLAMA_BIN/llama-quantize" "$BF16.bf16.gguf" "$GGUF.novocab" Q4_K_M "$THREADS"
  "$PYTHON" bench/gguf_add_vocab.py "$GGUF.novocab" "$GGUF" "$MODEL/tokenizer.json"  # llama-server tokenizes
  rm -f "$GGUF.novocab"
fi

model_bytes=$(python3 -c "import os,sys; print(sum(os.path.getsize(os.path.join(sys.argv[1], f)) for f in os.listdir(sys.argv[1]) if f.endswith('.safetensors')))" "$MODEL")
cap_bytes=$(python3 -c "print(int($model_bytes * $CAP_FRACTION))")

# --- physical limits, measured now -------------------------------------------------------
plan_json=$("$SPOOL" plan -m "$MODEL" --threads "$THREADS" --no-stream --ctx-size 64 --json || true)
mem_gbps=$(python3 -c "import json,sys; print(round(json.loads(sys.argv[1])['mem_gbps'], 1))" "$plan_json")
active=$(python3 -c "import json,sys; print(json.loads(sys.argv[1])['active_bytes_per_token'])" "$plan_json")
shard=$(ls "$MODEL"/*.safetensors | head -1)
sync; echo 3 > /proc/sys/vm/drop_caches
disk_gbps=$(fio --name=probe --filename="$shard" --readonly --direct=1 --rw=randread --bs=4M --ioengine=psync \
  --numjobs=8 --group_reporting --runtime=10 --time_based --output-format=json 2>/dev/null |
  python3 -c "import json,sys; print(round(json.load(sys.stdin)['jobs'][0]['read']['bw']*1024/1e9, 3))")
echo "memory read bandwidth $mem_gbps GB/s; disk $disk_gbps GB/s; weights read per token $active B"

# Memory cgroup at CAP_FRACTION x the checkpoint (v2 memory.max, else v1).
if [ -f /sys/fs/cgroup/cgroup.controllers ] && grep -q memory /sys/fs/cgroup/cgroup.controllers; then
  CG=/sys/fs/cgroup/spool-batch; mkdir -p $CG; echo "$cap_bytes" > $CG/memory.max
else
  CG=/sys/fs/cgroup/memory/spool-batch; mkdir -p $CG; echo "$cap_bytes" > $CG/memory.limit_in_bytes
fi

# in_cg CG CMD...: CMD inside the cgroup (CG empty: none).
in_cg() {
  local cg=$1; shift
  if [ -n "$cg" ]; then sh -c "echo \$\$ > $cg/cgroup.procs; exec \"\$@\"" sh "$@"; else "$@"; fi
}

# spool: one row per N of --parallel.
spool_rows() {
  local config=$1 cg=$2 flags=$3
  sync; echo 3 > /proc/sys/vm/drop_caches
  # shellcheck disable=SC2086
  in_cg "$cg" "$SPOOL" bench -m "$MODEL" -t "$THREADS" -p 0 -n "$NGEN" -r "$REPS" --parallel "$PAR" -o json $flags 2>/dev/null \
    > "$TMP/spool.json"
  python3 - "$config" "$TMP/spool.json" "$mem_gbps" "$active" "$disk_gbps" >> "$TMP/rows.txt" <<'PY'
import json, sys
config, js, mem, active, disk = sys.argv[1], json.load(open(sys.argv[2])), float(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
base = next(t["avg_ts"] for t in js if t["n_parallel"] == 1)
for t in js:
    n = t["n_parallel"]
    mbt = t["bytes_read_per_token"] / 1e6
    stream = t.get("streaming", False)  # the expert columns exist when experts stream
    exp = f"{t['experts_acquired_per_token']:.1f}" if stream else "-"
    mb = f"{mbt:.1f}" if stream else "-"
    hit = f"{100*t['cache_hit_rate']:.1f}%" if stream else "-"
    print(f"| {config} | spool | {n} | {t['avg_ts']:.2f} ± {t['stddev_ts']:.2f} | {t['avg_ts']/base:.2f}x | "
          f"{exp} | {mb} | {hit} | {t['peak_rss_bytes']/2**30:.2f} |")
    print(f"DATA\t{config}\tspool\t{n}\t{t['avg_ts']:.4f}", file=sys.stderr)
PY
}

# llama.cpp: llama-server -np 4, 1 then 4 concurrent /completion requests of NGEN tokens.
# llama_rows CONFIG CG LABEL [SERVER FLAGS...]
llama_rows() {
  local config=$1 cg=$2 label=$3; shift 3
  [ "$have_llama" = 1 ] || return 0
  sync; echo 3 > /proc/sys/vm/drop_caches
  local port=$((18100 + RANDOM % 800))  # a fresh port per server (the last one may still hold its own)
  in_cg "$cg" "$LLAMA_BIN/llama-server" -m "$GGUF" -t "$THREADS" -np 4 -c $((4 * 256)) --port $port --host 127.0.0.1 "$@" \
    > "$TMP/server.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 1
  done
  python3 - "$config" "$port" "$NGEN" "$LLAMA_REPS" "$SERVER_PID" "$label" >> "$TMP/rows.txt" <<'PY'
import json, sys, threading, time, urllib.request, os
config, port, ngen, reps, pid, label = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
def alive():
    try:
        os.kill(pid, 0); return True
    except OSError:
        return False
def one(seed, out):
    body = json.dumps({"prompt": f"Sequence {seed}: the", "n_predict": ngen, "temperature": 0, "ignore_eos": True,
                       "cache_prompt": False}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", body, {"Content-Type": "application/json"})
    r = json.load(urllib.request.urlopen(req, timeout=3600))
    out.append(r["timings"]["predicted_n"])
base = None
for n in (1, 4):
    if not alive():
        print(f"| {config} | {label} | {n} | server exited (see below) | - | - | - | - | - |")
        continue
    ts = []
    for rep in range(reps + 1):  # first: warm-up
        out = []
        t0 = time.time()
        th = [threading.Thread(target=one, args=(rep * 10 + i, out)) for i in range(n)]
        for t in th: t.start()
        for t in th: t.join()
        dt = time.time() - t0
        if rep > 0 and len(out) == n:
            ts.append(sum(out) / dt)
    if not ts:
        print(f"| {config} | {label} | {n} | failed | - | - | - | - | - |")
        continue
    m = sum(ts) / len(ts)
    sd = (sum((x - m) ** 2 for x in ts) / max(len(ts) - 1, 1)) ** 0.5
    base = base or m
    print(f"| {config} | {label} | {n} | {m:.2f} ± {sd:.2f} | {m/base:.2f}x | - | - | - | - |")
    print(f"DATA\t{config}\t{label}\t{n}\t{m:.4f}", file=sys.stderr)
PY
  local rc=0
  kill "$SERVER_PID" 2>/dev/null || true
  wait "$SERVER_PID" 2>/dev/null || rc=$?
  SERVER_PID=
  # 143: stopped by us at the end; 137: killed (out of memory in the cgroup); 139: crashed.
  case $rc in
    0|143) ;;
    137) echo "$config, $label: llama-server was killed (out of memory)" >> "$TMP/notes.txt" ;;
    *) echo "$config, $label: llama-server exited with status $rc ($(grep -m1 -iE 'error|fault|abort' "$TMP/server.log" || tail -1 "$TMP/server.log"))" >> "$TMP/notes.txt" ;;
  esac
}

: > "$TMP/rows.txt"
: > "$TMP/notes.txt"
capcfg="cgroup $(python3 -c "print(round($cap_bytes/2**30, 2))") GiB"
spool_rows "resident" "" "--no-stream" 2>>"$TMP/data.tsv"
llama_rows "resident" "" "llama.cpp -np 4 (default)" 2>>"$TMP/data.tsv"
llama_rows "resident" "" "llama.cpp -np 4 --no-repack" --no-repack 2>>"$TMP/data.tsv"
spool_rows "$capcfg" "$CG" "" 2>>"$TMP/data.tsv"
llama_rows "$capcfg" "$CG" "llama.cpp -np 4 (default)" 2>>"$TMP/data.tsv"
llama_rows "$capcfg" "$CG" "llama.cpp -np 4 --no-repack" --no-repack 2>>"$TMP/data.tsv"

{
  echo "Batched decoding: aggregate decode tokens/s with N sequences decoded together, $THREADS threads,"
  echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(date -u +%Y-%m-%d)."
  echo "Checkpoint: synthetic Qwen3.6-35B-A3B shape, 8 layers, spool q4 ($(python3 -c "print(round($model_bytes/2**30, 2))") GiB);"
  echo "llama.cpp: the same bf16 weights as GGUF Q4_K_M (llama-quantize), llama-server -np 4, concurrent /completion requests."
  echo "spool: \`spool bench -p 0 -n $NGEN -r $REPS --parallel $PAR\` (tg$NGEN per sequence, random token ids)."
  echo "Cgroup: memory limit $CAP_FRACTION x the checkpoint, page cache dropped before each tool; spool streams experts (auto budget)."
  echo
  echo "Measured in the same run: memory read **$mem_gbps GB/s** (one token reads $(python3 -c "print(round($active/1e6))") MB of weights);"
  echo "direct-read disk **$disk_gbps GB/s** (fio)."
  echo
  echo "| config | tool | sequences | aggregate tok/s | vs 1 sequence | experts acquired / token | MB read from disk / token | expert hit rate | peak RSS GiB |"
  echo "|---|---|---|---|---|---|---|---|---|"
  cat "$TMP/rows.txt"
  if [ -s "$TMP/notes.txt" ]; then echo; sed 's/^/- /' "$TMP/notes.txt"; fi
} | tee "$OUT"

grep '^DATA' "$TMP/data.tsv" | cut -f2- > "$TMP/plot.tsv" || true
python3 - "$TMP/plot.tsv" "$TMP/plot.dat" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
keys = []
for c, tool, n, ts in rows:
    k = f"{c}, {tool}"
    if k not in keys:
        keys.append(k)
ns = sorted({int(n) for _, _, n, _ in rows})
with open(sys.argv[2], "w") as f:
    f.write("N " + " ".join(f'"{k}"' for k in keys) + "\n")
    for n in ns:
        vals = []
        for k in keys:
            v = [ts for c, tool, nn, ts in rows if f"{c}, {tool}" == k and int(nn) == n]
            vals.append(v[0] if v else "NaN")
        f.write(f"{n} " + " ".join(vals) + "\n")
PY
ncols=$(head -1 "$TMP/plot.dat" | python3 -c "import shlex,sys; print(len(shlex.split(sys.stdin.read())) - 1)")
gnuplot <<GP
set terminal pngcairo size 900,480 noenhanced font ",10"
set output "$PNG"
set title "Aggregate decode tokens/s vs concurrent sequences\nQwen3.6-35B-A3B shape, 8 layers, q4 / Q4_K_M, $THREADS threads"
set xlabel "sequences decoded together"
set ylabel "tokens/s (all sequences)"
set logscale x 2
set xtics (1, 2, 4, 8)
set yrange [0:*]
set grid
set key top left
set datafile missing "NaN"
plot for [i=2:$((ncols + 1))] "$TMP/plot.dat" using 1:i with linespoints lw 2 title columnheader(i)
GP
echo "wrote $OUT and $PNG"
