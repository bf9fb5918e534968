#!/usr/bin/env bash
# Installs the Debian 12 packages spool needs (only those missing) and builds the spool
# binary (Release, Ninja) into build/, unpacking the demo model next to it. Safe to run
# again: it only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build pkg-config xz-utils git
  nlohmann-json3-dev libcli11-dev libcpp-httplib-dev libpcre2-dev libutf8proc-dev libhwy-dev
  liburing-dev libcurl4-openssl-dev libopenblas-dev
  libgtest-dev libgmock-dev libbenchmark-dev clang libclang-rt-14-dev
  python3-venv curl
  openmpi-bin libopenmpi-dev
)
# scripts/test-aarch64.sh (run by scripts/test.sh) cross-builds the kernel tests for aarch64 and
# runs them under qemu-user: on an amd64 machine, the cross compiler, qemu and the arm64
# (multiarch) builds of Highway, GoogleTest and the C++ runtime.
sudo_cmd=()
[ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
if [ "$(dpkg --print-architecture)" = amd64 ]; then
  packages+=(g++-aarch64-linux-gnu qemu-user libhwy-dev:arm64 libgtest-dev:arm64 libstdc++6:arm64 libc6:arm64)
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    echo "setup: adding the arm64 architecture (dpkg --add-architecture arm64)"
    "${sudo_cmd[@]}" dpkg --add-architecture arm64
  fi
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# With nvcc, the CUDA backend is built for this machine's GPU ("native"), or for one architecture
# (90) where there is none, on the first configure; -DSPOOL_CUDA_ARCHS="80;86;89;90;120" builds all.
cuda_archs=()
if [ ! -f build/CMakeCache.txt ] && command -v nvcc >/dev/null 2>&1; then
  if nvidia-smi -L >/dev/null 2>&1; then cuda_archs=(-DSPOOL_CUDA_ARCHS=native); else cuda_archs=(-DSPOOL_CUDA_ARCHS=90); fi
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${cuda_archs[@]}" >/dev/null
# The spool binary and the demo model only; scripts/test.sh builds the tests.
cmake --build build -j"$(nproc)" --target spool
