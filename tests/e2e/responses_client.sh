#!/usr/bin/env bash
# End-to-end test of `spool serve`'s /v1/responses with the official `openai` Python SDK
# (responses.create: plain, streamed, a function-call round trip, previous_response_id, stored
# responses, errors) and one agent loop of the `openai-agents` SDK (Runner.run with a function
# tool, OpenAIResponsesModel on an AsyncOpenAI client pointed at the server, tracing off).
# Usage: tests/e2e/responses_client.sh SPOOL_BINARY BUILD_DIR
# Creates BUILD_DIR/e2e-responses-venv (python3 -m venv; pip install openai openai-agents), starts
# the server on a free loopback port with the demo model and runs tests/e2e/responses_client.py.
# Exit 77 (ctest SKIP_RETURN_CODE) only when PyPI cannot be reached to install the SDKs, and
# only outside CI: with SPOOL_NO_SKIP=1 (.ci/run sets it) that case fails (exit 1) instead.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
spool="$1"
build="$2"
venv="$build/e2e-responses-venv"
work="$build/test-tmp/e2e-responses"
mkdir -p "$work"

if ! "$venv/bin/python" -c "import openai, agents" 2>/dev/null; then
  python3 -m venv "$venv"
  if ! "$venv/bin/pip" install -q --disable-pip-version-check openai openai-agents; then
    if ! curl -sf -m 15 -o /dev/null https://pypi.org/simple/openai-agents/; then
      if [ "${SPOOL_NO_SKIP:-0}" = 1 ]; then
        echo "e2e: FAIL: PyPI is unreachable, cannot install the openai / openai-agents SDKs (SPOOL_NO_SKIP=1: no skip in CI)" >&2
        exit 1
      fi
      echo "e2e: SKIP: PyPI is unreachable, cannot install the openai / openai-agents SDKs"
      exit 77
    fi
    echo "e2e: pip install openai openai-agents failed although PyPI is reachable" >&2
    exit 1
  fi
fi

log="$work/serve.log"
"$spool" serve --port 0 --api-key e2e-key --threads 2 --ctx-size 1024 --prefill-step-size 16 --responses-store 8 >"$log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true' EXIT
port=""
for _ in $(seq 1 300); do
  port="$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log" | head -1)"
  if [ -n "$port" ] && curl -sf -o /dev/null "http://127.0.0.1:$port/health"; then break; fi
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "e2e: spool serve exited early:" >&2
    cat "$log" >&2
    exit 1
  fi
  sleep 0.1
done
curl -sf -o /dev/null "http://127.0.0.1:$port/health" || { echo "e2e: server not ready" >&2; cat "$log" >&2; exit 1; }
OPENAI_AGENTS_DISABLE_TRACING=1 "$venv/bin/python" "$here/responses_client.py" "http://127.0.0.1:$port/v1" e2e-key
echo "e2e: responses client test passed"
