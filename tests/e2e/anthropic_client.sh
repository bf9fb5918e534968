#!/usr/bin/env bash
# End-to-end test of `spool serve`'s Anthropic Messages API with the official `anthropic` Python SDK.
# Usage: tests/e2e/anthropic_client.sh SPOOL_BINARY BUILD_DIR
# Creates BUILD_DIR/e2e-anthropic-venv (python3 -m venv; pip install anthropic), starts the server
# on a free loopback port with the demo model and runs tests/e2e/anthropic_client.py against it.
# Exit 77 (ctest SKIP_RETURN_CODE) only when PyPI cannot be reached to install the SDK, and only
# outside CI: with SPOOL_NO_SKIP=1 (.ci/run sets it) that case fails (exit 1) instead.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
spool="$1"
build="$2"
venv="$build/e2e-anthropic-venv"
work="$build/test-tmp/e2e-anthropic"
mkdir -p "$work"

if ! "$venv/bin/python" -c "import anthropic" 2>/dev/null; then
  python3 -m venv "$venv"
  if ! "$venv/bin/pip" install -q --disable-pip-version-check anthropic; then
    if ! curl -sf -m 15 -o /dev/null https://pypi.org/simple/anthropic/; then
      if [ "${SPOOL_NO_SKIP:-0}" = 1 ]; then
        echo "e2e: FAIL: PyPI is unreachable, cannot install the anthropic SDK (SPOOL_NO_SKIP=1: no skip in CI)" >&2
        exit 1
      fi
      echo "e2e: SKIP: PyPI is unreachable, cannot install the anthropic SDK"
      exit 77
    fi
    echo "e2e: pip install anthropic failed although PyPI is reachable" >&2
    exit 1
  fi
fi

log="$work/serve.log"
"$spool" serve --port 0 --api-key e2e-key --threads 2 --ctx-size 512 --prefill-step-size 16 >"$log" 2>&1 &
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
"$venv/bin/python" "$here/anthropic_client.py" "http://127.0.0.1:$port" e2e-key
echo "e2e: anthropic client test passed"
