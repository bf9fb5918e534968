#!/usr/bin/env bash
# The kernel tests on aarch64, on an x86-64 machine: cross-builds ops_test, ggml_q8_test, ggml_iquants_test, cpu_backend_test, cpu_targets_test,
# capability_test, sysinfo_test and quant_matmul_test (the codebook kernels, with src/quant's primitives) (cmake -DSPOOL_OPS_ONLY=ON: src/common and src/ops only, with Debian's
# aarch64-linux-gnu-g++ and the arm64 multiarch libhwy-dev / libgtest-dev; scripts/setup.sh
# installs them) into build-aarch64/ and runs them with ctest under qemu-aarch64 twice:
#  - QEMU_CPU=max: a CPU with the dot-product extension (the int8 kernels' "neon-dotprod"
#    variant, and "neon" through ops::q8_allow_dot_extension(false) in ggml_q8_test);
#  - QEMU_CPU=cortex-a72: Armv8.0 without it (the runtime check must pick "neon").
# Fails (exit 1) when a test fails or a tool is missing: never a silent skip. scripts/test.sh runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
for tool in aarch64-linux-gnu-g++ qemu-aarch64; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "test-aarch64.sh: $tool not found (scripts/setup.sh installs g++-aarch64-linux-gnu and qemu-user)" >&2
    exit 1
  fi
done
dir=build-aarch64
launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$dir" -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DCMAKE_BUILD_TYPE=Release \
  -DSPOOL_OPS_ONLY=ON -DSPOOL_CUDA=OFF -DSPOOL_BUILD_BENCH=OFF "${launcher[@]}" >/dev/null
cmake --build "$dir" -j"$(nproc)" --target ops_test ggml_q8_test ggml_iquants_test capability_test sysinfo_test cpu_backend_test cpu_targets_test \
  quant_matmul_test quant_q8_test
echo "test-aarch64.sh: built in $((SECONDS - t0)) s"
for cpu in max cortex-a72; do
  echo "test-aarch64.sh: qemu-aarch64 -cpu $cpu"
  QEMU_CPU="$cpu" ctest --test-dir "$dir" --output-on-failure -j"$(nproc)" --no-tests=error
done
echo "test-aarch64.sh: done in $((SECONDS - t0)) s"
