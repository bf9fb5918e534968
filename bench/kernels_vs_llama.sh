#!/usr/bin/env bash
# spool's ggml-block kernels beside llama.cpp's CPU MUL_MAT on the same shapes, with the memory
# read bandwidth measured in the same run. Writes bench/results/kernels_vs_llama.md.
#
# llama.cpp: `test-backend-ops perf -o MUL_MAT -b CPU` at its perf shape m = 4096, k = 14336
# (weights [4096 x 14336] of the type, activations f32), n = 1 (GEMV) and n = 512 (GEMM), on
# hardware_concurrency / 2 threads (test-backend-ops' choice; 1 on a 2-core machine), without
# weight repacking (its test buffers are plain CPU buffers). spool: build/bench/quant_bench
# BM_GgmlGemv / BM_GgmlGemm at the same shape on THREADS threads (default: the same count), the
# same matrix every iteration as test-backend-ops does (so small types may partly sit in L3).
# llama.cpp converts the activations to its int8 / f16 dot types inside the op; spool keeps them
# f32 (its GGUF tests require logits within 1e-4 of the dequantized-float model), and for Q4_K /
# Q6_K also runs its int8-activation kernels (--act-bits 8: BM_GgmlQ8Gemv / BM_GgmlQ8Gemm).
# The two tools run back to back per type, so load changes hit both.
#
#   LLAMA_BIN=/work/llama-cpu/bin bench/kernels_vs_llama.sh
#   TYPES="Q4_K Q6_K" bench/kernels_vs_llama.sh          # a subset
#
# llama.cpp built outside the repository with tests, e.g.
#   cmake -S llama_cpp_python-*/vendor/llama.cpp -B /work/llama-cpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
#     -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=ON
#   ninja -C /work/llama-cpu test-backend-ops
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
QB=$BUILD/bench/quant_bench
LLAMA_BIN=${LLAMA_BIN:-/work/llama-cpu/bin}
TBO=$LLAMA_BIN/test-backend-ops
NCPU=$(nproc)
LLAMA_THREADS=$(( NCPU / 2 > 0 ? NCPU / 2 : 1 ))
THREADS=${THREADS:-$LLAMA_THREADS}
TYPES=${TYPES:-"F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS MXFP4"}
MIN_TIME=${MIN_TIME:-0.5}
OUT=${OUT:-bench/results/kernels_vs_llama.md}
M=4096 K=14336
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

[ -x "$QB" ] || { echo "kernels_vs_llama.sh: build quant_bench first (ninja -C $BUILD quant_bench)"; exit 1; }
[ -x "$TBO" ] || { echo "kernels_vs_llama.sh: no test-backend-ops in $LLAMA_BIN (see the header)"; exit 1; }
if [ "$THREADS" != 1 ] && [ "$THREADS" != 2 ]; then echo "kernels_vs_llama.sh: THREADS must be 1 or 2 (quant_bench's registered runs)"; exit 2; fi

# ggml type name -> (spool enum id, llama.cpp name, block elements, block bytes)
declare -A ID=([F32]=0 [F16]=1 [Q4_0]=2 [Q4_1]=3 [Q5_0]=6 [Q5_1]=7 [Q8_0]=8 [Q2_K]=10 [Q3_K]=11 [Q4_K]=12
  [Q5_K]=13 [Q6_K]=14 [IQ4_NL]=20 [IQ4_XS]=23 [BF16]=30 [MXFP4]=39)
declare -A LNAME=([F32]=f32 [F16]=f16 [BF16]=bf16 [Q8_0]=q8_0 [Q4_0]=q4_0 [Q4_1]=q4_1 [Q5_0]=q5_0 [Q5_1]=q5_1
  [Q2_K]=q2_K [Q3_K]=q3_K [Q4_K]=q4_K [Q5_K]=q5_K [Q6_K]=q6_K [IQ4_NL]=iq4_nl [IQ4_XS]=iq4_xs [MXFP4]=mxfp4)
declare -A BLK=([F32]="1 4" [F16]="1 2" [BF16]="1 2" [Q8_0]="32 34" [Q4_0]="32 18" [Q4_1]="32 20" [Q5_0]="32 22"
  [Q5_1]="32 24" [Q2_K]="256 84" [Q3_K]="256 110" [Q4_K]="256 144" [Q5_K]="256 176" [Q6_K]="256 210"
  [IQ4_NL]="32 18" [IQ4_XS]="256 136" [MXFP4]="32 17")
for t in $TYPES; do [ -n "${ID[$t]:-}" ] || { echo "kernels_vs_llama.sh: unknown type $t"; exit 2; }; done

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
"$QB" --benchmark_filter="BM_MemoryRead/MiB:1024/threads:$THREADS/" --benchmark_min_time=1 --benchmark_format=json \
  > "$TMP/mem.json" 2>/dev/null
mem=$(python3 -c "import json,sys; print(round(json.load(open(sys.argv[1]))['benchmarks'][0]['GB/s'], 2))" "$TMP/mem.json")
echo "memory read $mem GB/s ($THREADS thread(s)); load $load_before"

: > "$TMP/rows"
for t in $TYPES; do
  id=${ID[$t]}
  "$QB" --benchmark_filter="BM_Ggml(Q8)?Gemv/type:$id/rows:$M/cols:$K/thr:$THREADS/stream:0/|BM_Ggml(Q8)?Gemm/type:$id/rows:$M/cols:$K/T:512/thr:$THREADS/" \
    --benchmark_min_time="$MIN_TIME" --benchmark_format=json > "$TMP/spool.$t.json" 2>/dev/null
  "$TBO" perf -o MUL_MAT -b CPU -p "type_a=${LNAME[$t]},type_b=f32,m=$M,n=(1|512),k=$K,bs=\[1,1\],nr=\[1,1\],per=\[0,1,2,3\]" \
    > "$TMP/llama.$t.txt" 2>&1 || true
  python3 - "$t" "${BLK[$t]}" "$TMP/spool.$t.json" "$TMP/llama.$t.txt" "$M" "$K" >> "$TMP/rows" <<'PY'
import json, re, sys
t, blk, sj, lt, m, k = sys.argv[1], sys.argv[2].split(), sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
nbytes = m * (k // int(blk[0])) * int(blk[1])           # the weight matrix
sp = {}
for b in json.load(open(sj))["benchmarks"]:
    sec = b["real_time"] * {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[b["time_unit"]]
    kind = "gemv" if "Gemv" in b["name"] else "gemm"
    sp[("q8" if b["name"].startswith("BM_GgmlQ8") else "") + kind] = sec
ll = {}
for line in open(lt):
    g = re.search(r"MUL_MAT\(type_a=[^,]+,type_b=f32,m=\d+,n=(\d+),.*?([\d.]+) us/run", line)
    if g: ll["gemv" if g.group(1) == "1" else "gemm"] = float(g.group(2)) * 1e-6
def gbs(d, key="gemv"): return f"{nbytes / d[key] / 1e9:.2f}" if key in d else "n/a"
def gfl(d, key="gemm"): return f"{2.0 * m * k * 512 / d[key] / 1e9:.1f}" if key in d else "n/a"
def ratio(key, lkey): return f"{ll[lkey] / sp[key]:.2f}" if key in sp and lkey in ll else "n/a"
q8 = "q8gemv" in sp  # the types with int8-activation kernels (--act-bits 8)
print(f"| {t} | {nbytes / 1e6:.1f} | {gbs(sp)} | {gbs(ll)} | {ratio('gemv', 'gemv')} | {gfl(sp)} | {gfl(ll)} | {ratio('gemm', 'gemm')} | "
      + (f"{gbs(sp, 'q8gemv')} ({ratio('q8gemv', 'gemv')}x) | {gfl(sp, 'q8gemm')} ({ratio('q8gemm', 'gemm')}x) |" if q8 else "- | - |"))
PY
  tail -1 "$TMP/rows"
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

{
  echo "# spool ggml-block kernels vs llama.cpp CPU MUL_MAT"
  echo
  echo "\`bench/kernels_vs_llama.sh\`, $(date -u +%Y-%m-%d), $cpu, $NCPU cores; spool $THREADS thread(s), llama.cpp"
  echo "test-backend-ops $LLAMA_THREADS thread(s) (its hardware_concurrency / 2); load average before $load_before, after $load_after."
  echo "Shape: test-backend-ops' MUL_MAT perf shape, weights [$M x $K] of the type, f32 activations; the same matrix each"
  echo "iteration in both tools (types up to ~40 MB may partly stay in L3). GEMV = n 1, GB/s = weight bytes / time;"
  echo "GEMM = n 512 tokens, GFLOP/s = 2 m k n / time. \"x\" = spool's rate / llama.cpp's (> 1: spool faster)."
  echo "Memory read bandwidth (bench/memory_read.h, 1 GiB, $THREADS thread(s)): **$mem GB/s** (a GEMV streaming from DRAM"
  echo "cannot exceed it; one cached in L3 can). llama.cpp quantizes the activations to int8 (or f16) inside the op and"
  echo "uses integer dot products; spool's f32-activation kernels (--act-bits 32, exact) are the first columns; for Q4_K / Q6_K"
  echo "it also quantizes them to int8 per 256 columns (--act-bits 8, the default for such GGUF files on AVX-512 CPUs;"
  echo "BM_GgmlQ8Gemv / BM_GgmlQ8Gemm, the activation quantization included; the last two columns)."
  echo
  echo "| type | MB | spool GEMV GB/s | llama.cpp GEMV GB/s | x | spool GEMM GFLOP/s | llama.cpp GEMM GFLOP/s | x | spool int8 GEMV GB/s (x) | spool int8 GEMM GFLOP/s (x) |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  cat "$TMP/rows"
} > "$OUT"
echo "wrote $OUT"
