#!/usr/bin/env bash
# Runs the whole test suite: builds (scripts/setup.sh), runs ctest, then
#  - cross-builds the kernel tests for aarch64 and runs them under qemu (scripts/test-aarch64.sh),
#  - rebuilds the input-parsing, streaming, CLI, server and batching tests and the libFuzzer
#    targets with clang under AddressSanitizer + UBSan (build-asan/), runs the tests,
#  - rebuilds the threaded tests under ThreadSanitizer (build-tsan/) and runs them: request
#    queue, cancellation, prompt and disk caches, continuous batching, pipelined batch steps,
#  - runs each fuzzer (built in build-asan/) for FUZZ_SECONDS (30; the suite stays near 30 minutes on 2 cores).
# Pass --slow to include the full dev-corpus perplexity test. Each step prints its duration.
# With SPOOL_NO_SKIP=1 (.ci/run sets it) a skipped test fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

jobs="$(nproc)"
fuzz_seconds="${FUZZ_SECONDS:-30}"
t_start=$SECONDS
step() { echo "test.sh: $1 done in $((SECONDS - t_step)) s (total $((SECONDS - t_start)) s)"; t_step=$SECONDS; }
t_step=$SECONDS

# The CUDA backend (when nvcc is installed) is compiled for one architecture here, to keep the
# suite's build short; its GPU tests report "skipped" on a machine without a GPU
# (scripts/test-cuda.sh runs them on one). SPOOL_CUDA_ARCHS="80;86;89;90;120" builds them all.
cmake -S . -B build -DSPOOL_CUDA_ARCHS="${SPOOL_CUDA_ARCHS:-90}" >/dev/null
cmake --build build -j"$jobs"
exclude=(-LE slow)
[ "${1:-}" = "--slow" ] && exclude=()
ctest --test-dir build --output-on-failure -j"$jobs" "${exclude[@]}"
step "build + ctest"

# The kernel tests (ops, int8 kernels, backend capabilities) cross-built for aarch64 and run under
# qemu-user, with and without the dot-product extension: the NEON code is tested code.
scripts/test-aarch64.sh
step "aarch64 kernel tests (qemu)"

# Sanitizer step: one clang build with AddressSanitizer + UBSan (and libFuzzer's coverage
# instrumentation) serves the tests labelled "sanitize" (parsers, bad input, CLI error paths,
# streaming, the server's HTTP, engine and batching tests) and the fuzzers below: one build
# instead of two keeps the suite short on 2 cores. -O1 without debug info and one SIMD target
# keep it quick; on a CPU with AVX2 (x86-64-v3) that one target is AVX2, which runs the model tests
# several times faster than the SSE2 baseline.
san_flags="-O1"
grep -qw avx2 /proc/cpuinfo 2>/dev/null && grep -qw fma /proc/cpuinfo && grep -qw bmi2 /proc/cpuinfo && san_flags="-O1 -march=x86-64-v3"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS="$san_flags" -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DSPOOL_FUZZ=ON -DSPOOL_CUDA=OFF -DSPOOL_HWY_STATIC_ONLY=ON -DSPOOL_BUILD_BENCH=OFF >/dev/null
fuzzers=(safetensors_fuzz config_fuzz tokenizer_fuzz template_fuzz output_parser_fuzz gguf_fuzz ggml_blocks_fuzz anthropic_request_fuzz
  responses_request_fuzz lora_request_fuzz json_schema_fuzz predictor_trace_fuzz lora_adapter_fuzz)
# Only what the sanitize-labelled tests need: parsers, the streaming provider (threads, I/O
# callbacks, cache lifetimes), the CLI with its tests, and the server.
cmake --build build-asan -j"$jobs" --target spool io_test gguf_test ggml_iquants_test quant_q8_test sysinfo_test tokenizer_test template_test \
  streaming_test expert_profile_test warm_start_test predictor_test routing_trace_test lora_ops_test cli_test plan_test placement_test plan_source_test output_parser_test server_request_test server_http_test server_engine_test \
  server_batch_test anthropic_test anthropic_http_test server_responses_test chat_format_test chat_golden_test constrain_test \
  "${fuzzers[@]}"
# Left out here (they run in the plain build above): Footprint.WorkspaceMatchesMeasuredAllocation
# (RSS growth) and Checkpoint.OneTableCountedByTableBytes (mallinfo2 heap growth) measure the
# allocator, which ASan replaces; of the demo's 64 streaming configurations, those at cache budgets
# 50 and 100 and those with one I/O worker (budgets 0 and 10 with 8 workers run: every eviction and
# hit path, both I/O engines, O_DIRECT and page cache, prefetch on and off; the fixture families'
# configurations all run); Cli.ConvertThenGenerate and Cli.TokenizeInfoPerplexity (whole-model
# conversion and a perplexity run at -O1 without SIMD take 5 of the step's minutes; the CLI's
# parsing, loading and error paths stay covered by the other Cli tests); and the 8-request
# Demo/BatchedEqualsAlone (the batch engine's slots, queue, stop strings, cancellation and errors
# run here in BatchEngine.*). Together they were 17 of the step's 30 CPU-minutes.
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j"$jobs" -L sanitize \
  -E 'Footprint\.WorkspaceMatchesMeasuredAllocation|Checkpoint\.OneTableCountedByTableBytes|Demo/BitIdentical\.StreamingEqualsResident/demo_budget(50_|100_|[0-9]+_w1_)|Cli\.(ConvertThenGenerate|TokenizeInfoPerplexity)$|Demo/BatchedEqualsAlone\.'
step "ASan + UBSan"

# ThreadSanitizer: the tests whose threads share state: HTTP workers and the engine thread, the
# request queue (full queue, health while busy), cancellation on disconnect and mid-batch, the
# prompt cache, continuous batching with stop strings, the two pipelined groups of a
# streamed batch step (also with the --expert-profile recorder), the profile's periodic saver and
# the page-cache warmer. (Each costs minutes under TSan on 2 cores: one test per mechanism.)
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS="$san_flags" -DSPOOL_TSAN=ON -DSPOOL_CUDA=OFF \
  -DSPOOL_HWY_STATIC_ONLY=ON -DSPOOL_BUILD_BENCH=OFF >/dev/null
cmake --build build-tsan -j"$jobs" --target server_http_test server_engine_test server_batch_test batch_test expert_profile_test \
  warm_start_test
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
  ctest --test-dir build-tsan --output-on-failure -j"$jobs" \
  -R '^(HttpApi\.(HealthIs503WhileLoadingThen200|EndpointsAndStreaming|FullQueueIs503AndHealthAnsweredWhileBusy|DisconnectCancelsAndTheNextRequestRuns)|ServerEngine\.SameRequestTwiceAndPrefixPlusOneReuseWithoutChangingOutput|BatchEngine\.StopStringAndCancellationMidBatchLeaveTheOthersUnchanged|BatchForward\.PipelinedGroupsReadEachExpertOnce|ProfileSaver\.SavesPeriodicallyAndAtTheEnd|PageCacheWarmer\.ReadsEveryFileAndStopsBetweenChunks|WarmStart\.(RecorderKeepsBatchedStepsPipelined|WarmPageCacheReadsTheFilesAndLeavesOutputsUnchanged))$'
step "ThreadSanitizer"

# Fuzzers: every libFuzzer target of fuzz/ (built in build-asan above) for a bounded time, two
# at a time (one per core). Corpora persist in build-asan/corpus/NAME; the seeds are the
# repository's own files.
mkdir -p build-asan/corpus build-asan/logs
seed() {  # seed NAME FILES...: copy seeds into a new corpus
  local dir="build-asan/corpus/$1"; shift
  [ -d "$dir" ] && return 0
  mkdir -p "$dir"
  local i=0 f
  for f in "$@"; do [ -f "$f" ] && cp "$f" "$dir/seed$((i++))"; done
  return 0
}
seed safetensors_fuzz tests/data/models/*/golden.safetensors
seed config_fuzz tests/data/models/*/config.json models/spool-demo-moe/config.json
seed tokenizer_fuzz tests/data/tokenizer/qwen3/encode_cases.json
seed template_fuzz tests/data/tokenizers/qwen3_5/chat_template.jinja
seed output_parser_fuzz
seed gguf_fuzz tests/data/gguf/*.gguf
seed lora_adapter_fuzz tests/data/lora/*/*.gguf
if [ ! -d build-asan/corpus/ggml_blocks_fuzz ]; then  # one seed per ggml type id: the id byte, then 2 random blocks' worth
  mkdir -p build-asan/corpus/ggml_blocks_fuzz
  python3 -c "
import os, random
r = random.Random(7)
for i in range(43):
    open(f'build-asan/corpus/ggml_blocks_fuzz/seed{i}', 'wb').write(bytes([i]) + bytes(r.randrange(256) for _ in range(2 * 292)))"
fi
seed anthropic_request_fuzz tests/data/anthropic/*.json
seed responses_request_fuzz tests/data/responses/*.json
if [ ! -d build-asan/corpus/lora_request_fuzz ]; then  # the lora field's shapes, a model name, a POST body
  mkdir -p build-asan/corpus/lora_request_fuzz
  printf '%s' '{"model":"m","lora":[{"id":0,"scale":0.5},{"id":2}]}' > build-asan/corpus/lora_request_fuzz/seed0
  printf '%s' '{"model":"beta","messages":[]}' > build-asan/corpus/lora_request_fuzz/seed1
  printf '%s' '[{"id":1,"scale":1e39},{"id":"0","scale":1}]' > build-asan/corpus/lora_request_fuzz/seed2
fi
if [ ! -d build-asan/corpus/json_schema_fuzz ]; then  # the real templates' tool schemas
  mkdir -p build-asan/corpus/json_schema_fuzz
  python3 - build-asan/corpus/json_schema_fuzz tests/data/chat/*/chat_cases.json <<'PY'
import json, sys
out, n = sys.argv[1], 0
for f in sys.argv[2:]:
    d = json.load(open(f))
    for case in d["cases"] if isinstance(d, dict) else d:
        for tool in case.get("tools") or []:
            params = (tool.get("function") or tool).get("parameters")
            if isinstance(params, dict):
                open(f"{out}/seed{n}", "w").write(json.dumps(params))
                n += 1
PY
fi
if [ ! -d build-asan/corpus/predictor_trace_fuzz ]; then  # a routing trace with guesses (docs/routing-trace.md)
  mkdir -p build-asan/corpus/predictor_trace_fuzz
  printf '%s\n' '{"format":"spool-routing-trace","version":1,"model_type":"qwen3_moe","n_layers":2,"moe_layers":[0,1],"n_experts":4,"top_k":2,"source":"calibrate","guesses":2,"guess_source":"router"}' \
    '{"l":0,"t":0,"e":[1,3],"w":[0.6,0.4]}' '{"l":1,"t":0,"e":[0,2],"w":[0.7,0.3],"g":[2,1]}' \
    > build-asan/corpus/predictor_trace_fuzz/seed0
fi
run_fuzzer() {  # a fuzzer without seeds starts from an empty corpus
  mkdir -p "build-asan/corpus/$1"
  SPOOL_FUZZ_TOKENIZER_DIR="$PWD/build/tests/data/tokenizers/qwen3" \
    "build-asan/fuzz/$1" -max_total_time="$fuzz_seconds" -timeout=20 -rss_limit_mb=4096 -max_len=65536 \
    -print_final_stats=1 "build-asan/corpus/$1" >"build-asan/logs/$1.log" 2>&1
}
pids=() names=()
failed=0
for f in "${fuzzers[@]}"; do
  run_fuzzer "$f" &
  pids+=($!) names+=("$f")
  if [ ${#pids[@]} -ge "$jobs" ]; then
    wait "${pids[0]}" || { echo "test.sh: ${names[0]} found a crash:"; tail -60 "build-asan/logs/${names[0]}.log"; failed=1; }
    pids=("${pids[@]:1}") names=("${names[@]:1}")
  fi
done
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || { echo "test.sh: ${names[$i]} found a crash:"; tail -60 "build-asan/logs/${names[$i]}.log"; failed=1; }
done
for f in "${fuzzers[@]}"; do echo "test.sh: $f: $(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "build-asan/logs/$f.log" || echo '?')"; done
[ "$failed" = 0 ] || exit 1
step "fuzzers (${#fuzzers[@]} x ${fuzz_seconds} s)"
echo "test.sh: all tests passed"
