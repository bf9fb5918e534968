#!/usr/bin/env bash
# Builds and runs spool's CUDA tests (the backend op table on CudaBackend: backend_test; fixture
# models on CUDA against the CPU, strict device mode for the fully native families:
# cuda_model_test; the capability table and strict mode per backend: capability_test; LoRA adapters
# against PEFT's goldens: lora_test; the NCCL communicator and expert parallelism over it, one rank:
# nccl_test, where the build has NCCL) on a machine
# with an NVIDIA GPU.
#
#   scripts/test-cuda.sh                  build with -DSPOOL_CUDA=ON in $BUILD_DIR and run the tests here
#   scripts/test-cuda.sh stage DIR        build here (no GPU needed), then put into DIR what the tests
#                                         need on a GPU machine that lacks the Debian -dev packages: the
#                                         test binaries and spool with the shared libraries not in a CUDA
#                                         image (Highway, the CUDA runtime), xz-compressed (bundle.tar.xz),
#                                         and this script; the test data is unpacked there from the
#                                         repository's tests/data and models/ (DIR must lie in the
#                                         working tree that travels, or be carried)
#   DIR/test-cuda.sh run DIR              on the GPU machine, from the repository root: run the staged tests
#                                         (builds there instead when DIR holds no binaries but cmake, nvcc
#                                         and ninja exist and the -dev packages are installed)
#
# Environment: SPOOL_CUDA_ARCHS (default 90), BUILD_DIR (default build-cuda), NO_BUILD=1 (stage BUILD_DIR's
# binaries as they are, e.g. build/ from scripts/test.sh, which compiles CUDA when nvcc is found), STAGE_SPOOL=0 (stage: the
# test binaries only, without spool), OUT (a folder for
# the logs, optional), STAGE_NCCL=1 (stage: also NCCL's libnccl.so.2, ~200 MB; by default `run` takes the GPU
# machine's, e.g. PyTorch's wheel's), SANITIZE=1 (also run compute-sanitizer memcheck over the CUDA cases),
# BENCH=1 (after the tests, `spool bench` CPU vs CUDA of the demo model and of a
# Qwen3.6-35B-A3B-shaped q4 synthetic of BENCH_LAYERS layers (default 8) made on the GPU machine,
# with the host->device bandwidth; logs bench*.log in $OUT), CUDA_BENCH=1 (bench/cuda.sh against llama.cpp,
# built there from DIR/llama-src.tar.xz), SKIP_TESTS=1 (run mode: only the benches).
# Exit status: that of the tests (0 when all pass; a GPU-less machine reports the CUDA cases as
# SKIPPED, so run this where `nvidia-smi -L` lists a GPU).
set -euo pipefail
shopt -s inherit_errexit  # a failed build inside $(build) stops the script

mode=${1:-local}
here=$(cd "$(dirname "$0")" && pwd)
archs=${SPOOL_CUDA_ARCHS:-90}
tests=(backend_test capability_test cuda_model_test lora_test nccl_test)  # (nccl_test: in builds with NCCL, SPOOL_NCCL)

build() {  # build [dir]: configure and build the CUDA test binaries
  local repo bdir
  repo=$(cd "$here/.." && pwd)
  bdir=${BUILD_DIR:-$repo/build-cuda}
  if [ "${NO_BUILD:-0}" = 1 ]; then  # stage what BUILD_DIR holds (e.g. build/, which has CUDA when nvcc is installed)
    grep -q 'SPOOL_CUDA:BOOL=ON' "$bdir/CMakeCache.txt" || { echo "test-cuda.sh: $bdir is not a CUDA build" >&2; return 1; }
    echo "$bdir"
    return
  fi
  local launch=()
  if command -v ccache >/dev/null; then
    launch=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
  cmake -S "$repo" -B "$bdir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPOOL_CUDA=ON -DSPOOL_CUDA_ARCHS="$archs" \
    -DSPOOL_BUILD_BENCH=OFF "${launch[@]}" >&2
  local targets=("${tests[@]}")
  grep -q 'SPOOL_NCCL:BOOL=ON' "$bdir/CMakeCache.txt" || targets=("${targets[@]/nccl_test}")
  cmake --build "$bdir" -j"$(nproc)" --target ${targets[@]} spool spool_test_data spool_model_data >&2
  echo "$bdir"
}

run_tests() {  # run_tests BIN_DIR: runs every test binary, logs to $OUT when set
  local bin=$1 rc=0 log
  nvidia-smi -L || echo "nvidia-smi: no GPU listed"
  for t in "${tests[@]}"; do
    log=${OUT:+$OUT/$t.log}
    echo "== $t"
    if [ ! -x "$bin/$t" ] && [ "$t" = nccl_test ]; then echo "nccl_test: not built (no NCCL in this build)"; continue; fi
    if [ -n "$log" ]; then
      "$bin/$t" --gtest_color=no > "$log" 2>&1 || rc=1
      grep -E '^\[  (FAILED|SKIPPED|PASSED) |^\[==========\]|Failure|rror' "$log" | head -80 || true
    else
      "$bin/$t" --gtest_color=no || rc=1
    fi
    if [ "${SANITIZE:-0}" = 1 ] && command -v compute-sanitizer >/dev/null; then
      echo "== compute-sanitizer memcheck: $t (CUDA cases)"
      timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/$t" --gtest_filter='*cuda*:CudaModel*:Nccl*:*/Nccl*' \
        --gtest_brief=1 > "${OUT:-/tmp}/$t.memcheck.log" 2>&1 || { echo "memcheck failed (rc $?)"; rc=1; }
      tail -5 "${OUT:-/tmp}/$t.memcheck.log"
    fi
  done
  return $rc
}

run_bench() {  # run_bench SPOOL DEMO_DIR: spool bench CPU vs CUDA (demo model, 35B-shaped q4 synthetic)
  local spool=$1 demo=$2 out=${OUT:-/tmp} layers=${BENCH_LAYERS:-8} rc=0
  local cores; cores=$(nproc)
  echo "== bench: demo model"
  for d in cpu cuda; do
    "$spool" bench -m "$demo" --device $d -t "$cores" -p 128 -n 64 -r 3 > "$out/bench-demo-$d.log" 2>&1 || rc=1
    grep -E '^\||GB/s|rror' "$out/bench-demo-$d.log" || tail -5 "$out/bench-demo-$d.log"
  done
  echo "== bench: qwen3.6-35b-a3b shape, $layers layers, q4 (synthetic)"
  local m=/tmp/spool-synth35 q=/tmp/spool-synth35-q4
  rm -rf "$m" "$q"
  ( time timeout 150 "$spool" synth --preset qwen3.6-35b-a3b --layers "$layers" --out "$m" --no-check -t "$cores" ) > "$out/synth.log" 2>&1 || { rc=1; tail -5 "$out/synth.log"; }
  ( time timeout 180 "$spool" convert -m "$m" --recipe q4 -o "$q" -t "$cores" ) > "$out/convert.log" 2>&1 || { rc=1; tail -5 "$out/convert.log"; }
  rm -rf "$m"
  tail -n 3 "$out/synth.log" "$out/convert.log"
  for d in cuda cpu; do
    timeout 90 "$spool" bench -m "$q" --device $d -t "$cores" -p 64 -n 32 -r 2 > "$out/bench-35b-$d.log" 2>&1 || rc=1
    grep -E '^\||GB/s|rror|experts|device' "$out/bench-35b-$d.log" | grep -v '^| ---' | tail -8
  done
  # Experts left in host memory (a VRAM budget below dense + KV + experts): copied per use.
  timeout 90 "$spool" bench -m "$q" --device cuda --vram-budget-gb 2 -p 64 -n 32 -r 2 > "$out/bench-35b-cuda-hostexperts.log" 2>&1 || rc=1
  grep -E '^\||GB/s|rror|VRAM|host memory' "$out/bench-35b-cuda-hostexperts.log" | grep -v '^| ---' | tail -8
  return $rc
}

case "$mode" in
  local)
    bdir=$(build | tail -1)
    run_tests "$bdir/src/models"
    ;;
  stage)
    dir=${2:?usage: test-cuda.sh stage DIR}
    bdir=$(build | tail -1)
    rm -rf "$dir" && mkdir -p "$dir/lib"
    bins=()
    for t in "${tests[@]}"; do
      f=$(find "$bdir/src" -name "$t" -type f -perm -u+x | head -1)
      if [ -z "$f" ] && [ "$t" = nccl_test ]; then echo "stage: nccl_test not built here (no NCCL in this build)" >&2; continue; fi
      [ -n "$f" ] || { echo "stage: $t not built in $bdir" >&2; exit 1; }
      strip -o "$dir/$t" "$f" && bins+=("$t")
    done
    if [ "${STAGE_SPOOL:-1}" = 1 ]; then strip -o "$dir/spool" "$bdir/spool" && bins+=(spool); fi
    # Shared libraries from the Debian -dev packages spool builds against that a CUDA image lacks
    # (Highway, liburing, utf8proc, PCRE2, cpp-httplib, Open MPI and its hwloc / libevent) and the CUDA runtime; everything else (the C/C++
    # runtime, cuBLAS, libcurl and its TLS stack, OpenBLAS) is taken from the image, where the
    # device machine has it (checked with ldconfig -p there).
    for lib in $(for b in "${bins[@]}"; do ldd "$dir/$b"; done | awk '/=>/ {print $3}' | sort -u); do
      case "$(basename "$lib")" in
        libhwy*|liburing*|libutf8proc*|libpcre2*|libcpp-httplib*|libcudart*) cp -L "$lib" "$dir/lib/" ;;
        # Open MPI (src/dist): linked, initialised only under mpirun
        libmpi.so*|libopen-rte*|libopen-pal*|libhwloc*|libevent_core*|libevent_pthreads*) cp -L "$lib" "$dir/lib/" ;;
        # NCCL (src/dist/nccl_comm.cu; ~200 MB): taken from the GPU machine (PyTorch's wheel has
        # libnccl.so.2; `run` finds it) unless STAGE_NCCL=1
        libnccl*) if [ "${STAGE_NCCL:-0}" = 1 ]; then cp -L "$lib" "$dir/lib/"; fi ;;
      esac
    done
    # Test data is not staged: `run` unpacks the repository's tests/data and models/ on the GPU
    # machine (the working tree travels there anyway). Binaries and libraries travel xz-compressed.
    tar -C "$dir" -cf - "${bins[@]}" lib | xz -T0 -9 > "$dir/bundle.tar.xz"
    rm -rf "$dir/lib" "$dir/spool" "${bins[@]/#/$dir/}"
    echo "$bdir" > "$dir/build_dir"
    cp "$0" "$dir/test-cuda.sh"
    du -sh "$dir"
    ;;
  run)
    dir=$(cd "${2:?usage: test-cuda.sh run DIR}" && pwd)
    if [ ! -f "$dir/bundle.tar.xz" ]; then  # nothing staged: build here
      bdir=$(build | tail -1)
      run_tests "$bdir/src/models"
      exit
    fi
    tar -C "$dir" -xJf "$dir/bundle.tar.xz"
    bdir=$(cat "$dir/build_dir")
    # The binaries look for their data under the build directory they were built in: unpack the
    # repository's tests/data and models/ there as cmake/data.cmake does (*.tar.xz extracted into
    # the root, *.xz decompressed, other files copied), with python3 (no xz tool needed).
    repo=$(pwd)
    python3 - "$repo" "$bdir" <<'PY'
import lzma, os, shutil, sys, tarfile
repo, bdir = sys.argv[1:3]
for src, dst in (("tests/data", "tests/data"), ("models", "models")):
    src, dst = os.path.join(repo, src), os.path.join(bdir, dst)
    for d, _, names in os.walk(src):
        out = os.path.join(dst, os.path.relpath(d, src))
        os.makedirs(out, exist_ok=True)
        for n in names:
            f = os.path.join(d, n)
            if n.endswith(".tar.xz"):
                with tarfile.open(f, "r:xz") as t:
                    t.extractall(dst)
            elif n.endswith(".xz"):
                with lzma.open(f) as i, open(os.path.join(out, n[:-3]), "wb") as o:
                    shutil.copyfileobj(i, o)
            else:
                shutil.copy(f, out)
PY
    demo=$bdir/models/spool-demo-moe
    cublas=$(ldconfig -p | awk '/libcublas.so.13 / {print $NF; exit}')
    [ -n "$cublas" ] || cublas=$(find / -name 'libcublas.so.13' -not -path '*/proc/*' 2>/dev/null | head -1)
    # NCCL: the system's, else PyTorch's wheel (nvidia/nccl/lib) when not staged (STAGE_NCCL=1)
    nccl=
    if [ ! -e "$dir/lib/libnccl.so.2" ] && ! ldconfig -p | grep -q 'libnccl.so.2 '; then
      nccl=$(find / -name 'libnccl.so.2' -not -path '/proc/*' 2>/dev/null | head -1)
    fi
    export LD_LIBRARY_PATH=$dir/lib${cublas:+:$(dirname "$cublas")}${nccl:+:$(dirname "$nccl")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    rc=0
    for b in "${tests[@]}" spool; do  # a library the image lacks: say which, instead of failing later
      [ -x "$dir/$b" ] || continue
      missing=$(ldd "$dir/$b" | awk '/not found/ {print $1}' | tr '\n' ' ')
      if [ -n "$missing" ]; then echo "test-cuda.sh: $b needs libraries this machine lacks: $missing" >&2; rc=1; fi
    done
    [ $rc = 0 ] || exit $rc
    if [ "${SKIP_TESTS:-0}" != 1 ]; then run_tests "$dir" || rc=1; fi
    if [ "${BENCH:-0}" = 1 ]; then run_bench "$dir/spool" "$demo" || rc=1; fi
    # CUDA_BENCH=1: bench/cuda.sh (spool vs llama.cpp with CPU experts), llama.cpp built here from
    # DIR/llama-src.tar.xz (put it there before staging's transfer); PRESET, LAYERS etc. pass through.
    if [ "${CUDA_BENCH:-0}" = 1 ]; then SPOOL=$dir/spool LLAMA_SRC=$dir/llama-src.tar.xz bash bench/cuda.sh || rc=1; fi
    exit $rc
    ;;
  *)
    echo "usage: $0 [local | stage DIR | run DIR]" >&2
    exit 2
    ;;
esac
