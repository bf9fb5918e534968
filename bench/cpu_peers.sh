#!/usr/bin/env bash
# Resident CPU decode/prefill of one Q4_K_M file: spool against llama.cpp (--repack 0 and default) and
# ik_llama.cpp, all built on the machine that runs them, as one job that needs nothing from a previous
# run (the device machine's host CPU, a fresh VM). Steps:
#  1. builds llama.cpp (llama-bench, llama-quantize; CPU only, GGML_NATIVE) from LLAMA_SRC and, when
#     IK_SRC is set, ik_llama.cpp's llama-bench from IK_SRC (source folders or .tar.xz of one), in the
#     background; AVX2=1 builds both for AVX2 + FMA + F16C only (no AVX-512) and runs spool with its
#     kernels restricted to AVX2 (SPOOL_HWY_TARGETS=AVX2), i.e. a laptop-class x86 CPU;
#  2. meanwhile writes a Qwen3.6-35B-A3B-shaped synthetic of LAYERS layers (`spool synth`, BF16), its
#     BF16 GGUF (bench/moe_to_gguf.py, with llama.cpp's gguf-py) and the Q4_K_M file (llama-quantize);
#  3. runs bench/compare.sh in GGUF mode, resident only (CAPS=), ROUNDS interleaved rounds, THREADS
#     threads: every tool reads the same file; memory read bandwidth measured in the same run.
# STAGE=build|model|bench|all (default all) runs one step, for machines that cap a job's time; the
# files live in DIR between steps.
#
#   LLAMA_SRC=/path/llama-src.tar.xz IK_SRC=/path/ik-src.tar.xz SPOOL=build/spool OUT=/tmp/out bench/cpu_peers.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SPOOL=$(realpath "${SPOOL:-build/spool}")
LLAMA_SRC=${LLAMA_SRC:?set LLAMA_SRC (llama.cpp source folder or .tar.xz)}
IK_SRC=${IK_SRC:-}
LAYERS=${LAYERS:-8}
THREADS=${THREADS:-$(nproc)}
ROUNDS=${ROUNDS:-3}
DIR=${DIR:-/tmp/spool-cpu-peers}
OUT=${OUT:-bench/results}
NAME=${NAME:-cpu-peers}
STAGE=${STAGE:-all}
AVX2=${AVX2:-0}
PYTHON=${PYTHON:-python3}
mkdir -p "$DIR" "$OUT"
LOG=$OUT/$NAME.log
t0=$SECONDS
say() { echo "[$((SECONDS - t0)) s] $*" | tee -a "$LOG"; }
[ -x "$SPOOL" ] || { echo "cpu_peers.sh: no spool binary at $SPOOL"; exit 1; }

# src_dir NAME SRC: a source folder for SRC (unpacked into DIR/NAME-src when SRC is a .tar.xz).
src_dir() {
  local name=$1 src=$2
  if [ -f "$src" ]; then
    if [ ! -d "$DIR/$name-src" ]; then mkdir -p "$DIR/$name-src" && tar -C "$DIR/$name-src" -xJf "$src"; fi
    find "$DIR/$name-src" -mindepth 1 -maxdepth 1 -type d | head -1
  else
    echo "$src"
  fi
}
isa=(-DGGML_NATIVE=ON)
[ "$AVX2" = 1 ] && isa=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF
  -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF)
sfx=$([ "$AVX2" = 1 ] && echo -avx2 || true)
LLAMA_BIN=$DIR/llama-build$sfx/bin IK_BIN=
[ -z "$IK_SRC" ] || IK_BIN=$DIR/ik-build$sfx/bin
llama_dir=$(src_dir llama "$LLAMA_SRC")
GGUF_PY=${GGUF_PY:-$llama_dir/gguf-py}

build_peers() {
  # A trimmed llama.cpp source (no server/UI, no audio library) builds just the two tools.
  [ -d "$llama_dir/vendor/miniaudio" ] || sed -i '/add_subdirectory(miniaudio)/d' "$llama_dir/vendor/CMakeLists.txt"
  cmake -S "$llama_dir" -B "$DIR/llama-build$sfx" -G Ninja -DCMAKE_BUILD_TYPE=Release "${isa[@]}" -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF > "$OUT/$NAME-llama-build.log" 2>&1
  ninja -C "$DIR/llama-build$sfx" -j"$(nproc)" llama-bench llama-quantize >> "$OUT/$NAME-llama-build.log" 2>&1
  if [ -n "$IK_SRC" ]; then
    local ik; ik=$(src_dir ik "$IK_SRC")
    cmake -S "$ik" -B "$DIR/ik-build$sfx" -G Ninja -DCMAKE_BUILD_TYPE=Release "${isa[@]}" -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF > "$OUT/$NAME-ik-build.log" 2>&1
    ninja -C "$DIR/ik-build$sfx" -j"$(nproc)" llama-bench >> "$OUT/$NAME-ik-build.log" 2>&1
  fi
}

BF16=$DIR/q36-${LAYERS}l.bf16 GGUF=$DIR/q36-${LAYERS}l-Q4_K_M.gguf
make_model() {  # needs llama-quantize (build_peers)
  [ -f "$GGUF" ] && return
  say "synth ($LAYERS layers, BF16)"
  [ -f "$BF16/config.json" ] || "$SPOOL" synth --preset qwen3.6-35b-a3b --layers "$LAYERS" --out "$BF16" --no-check -t "$THREADS" >> "$LOG" 2>&1
  say "moe_to_gguf (BF16 GGUF)"
  [ -f "$BF16.gguf" ] || PYTHONPATH=$GGUF_PY "$PYTHON" bench/moe_to_gguf.py "$BF16" "$BF16.gguf" >> "$LOG" 2>&1
  rm -rf "$BF16"
}
quantize() {
  [ -f "$GGUF" ] && return
  [ -x "$LLAMA_BIN/llama-quantize" ] || { echo "cpu_peers.sh: no llama-quantize in $LLAMA_BIN"; tail -20 "$OUT/$NAME-llama-build.log"; exit 1; }
  say "llama-quantize Q4_K_M"
  "$LLAMA_BIN/llama-quantize" "$BF16.gguf" "$GGUF" Q4_K_M "$THREADS" >> "$LOG" 2>&1
  rm -f "$BF16.gguf"
}

case "$STAGE" in build | all)
  say "building llama.cpp${IK_SRC:+ and ik_llama.cpp}${sfx:+ (AVX2 only)}"
  ( s=$SECONDS; build_peers && echo "peers built in $((SECONDS - s)) s" >> "$LOG" || { echo "peer build FAILED" >> "$LOG"; } ) &
  pid=$!
  make_model
  wait "$pid" || true
  grep -q FAILED "$LOG" && { tail -30 "$OUT/$NAME-llama-build.log" "$OUT/$NAME-ik-build.log" 2>/dev/null; exit 1; }
  quantize
  ;;
esac
case "$STAGE" in model) make_model; quantize ;; esac
case "$STAGE" in bench | all)
  [ -f "$GGUF" ] || { echo "cpu_peers.sh: no $GGUF (run STAGE=build first)"; exit 1; }
  say "bench/compare.sh, resident, $ROUNDS rounds, $THREADS threads"
  env_hwy=()
  [ "$AVX2" = 1 ] && env_hwy=(SPOOL_HWY_TARGETS=AVX2)
  env "${env_hwy[@]}" BUILD="$(dirname "$SPOOL")" SPOOL_BIN="$SPOOL" LLAMA_BIN="$LLAMA_BIN" IK_BIN="$IK_BIN" MODEL="$GGUF" CAPS= \
    LLAMA_FLAGS="--repack 0" LLAMA_VARIANTS="--repack 1" ROUNDS="$ROUNDS" THREADS="$THREADS" NAME="$NAME" \
    LABEL="Qwen3.6-35B-A3B shape, $LAYERS layers, Q4_K_M${sfx:+, AVX2 only}" RESULTS="$OUT" bash bench/compare.sh 2>&1 | tee -a "$LOG"
  ;;
esac
say "done"
