#!/usr/bin/env bash
# Runs the whole test suite: builds (scripts/setup.sh), runs ctest, then rebuilds the
# input-parsing tests under AddressSanitizer + UBSan (build-asan/) and runs them.
# Pass --slow to include the full dev-corpus perplexity test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

jobs="$(nproc)"
cmake --build build -j"$jobs"
exclude=(-LE slow)
[ "${1:-}" = "--slow" ] && exclude=()
ctest --test-dir build --output-on-failure -j"$jobs" "${exclude[@]}"

# Sanitizer step: the tests labelled "sanitize" (parsers, bad input, CLI error paths).
# -O1 without debug info and one SIMD target keep this build quick on small machines.
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS="-O1" -DSPOOL_SANITIZE=ON \
  -DSPOOL_HWY_STATIC_ONLY=ON -DSPOOL_BUILD_BENCH=OFF >/dev/null
# Only what the sanitize-labelled tests need: parsers, the streaming provider (threads, I/O
# callbacks, cache lifetimes) and the CLI with its tests.
cmake --build build-asan -j"$jobs" --target spool io_test tokenizer_test template_test streaming_test cli_test plan_test output_parser_test server_request_test
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j"$jobs" -L sanitize
echo "test.sh: all tests passed"
