#!/usr/bin/env bash
# End-to-end test of `spool serve` with an official Python SDK: one runner for the three clients.
# Usage: tests/e2e/sdk_client.sh openai|responses|anthropic SPOOL_BINARY BUILD_DIR
#   openai     the `openai` client on /v1/chat/completions and /v1/completions (openai_client.py)
#   responses  the `openai` SDK's responses.create (plain, streamed, forced and round-trip function
#              calls, previous_response_id, stored responses, errors) and one agent loop of the
#              `openai-agents` SDK (Runner.run with a function tool, the first turn forced;
#              OpenAIResponsesModel on an AsyncOpenAI client pointed at the server, tracing off)
#   anthropic  the `anthropic` SDK on /v1/messages and /v1/messages/count_tokens (anthropic_client.py)
# Creates BUILD_DIR/e2e-<name>-venv (python3 -m venv; pip install the SDKs), starts the server on a
# free loopback port with the demo model and runs tests/e2e/<script>.py against it.
# Exit 77 (ctest SKIP_RETURN_CODE) only when PyPI cannot be reached to install the SDKs, and only
# outside CI: with SPOOL_NO_SKIP=1 (.ci/run sets it) that case fails (exit 1) instead.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
name="$1"
spool="$2"
build="$3"
case "$name" in
  openai) packages=(openai); imports="openai"; script=openai_client.py; base=/v1
    serve_args=(--ctx-size 512) ;;
  responses) packages=(openai openai-agents); imports="openai, agents"; script=responses_client.py; base=/v1
    serve_args=(--ctx-size 1024 --responses-store 8) ;;
  anthropic) packages=(anthropic); imports="anthropic"; script=anthropic_client.py; base=""
    serve_args=(--ctx-size 512) ;;
  *) echo "usage: $0 openai|responses|anthropic SPOOL_BINARY BUILD_DIR" >&2; exit 2 ;;
esac
venv="$build/e2e-$name-venv"
work="$build/test-tmp/e2e-$name"
mkdir -p "$work"

if ! "$venv/bin/python" -c "import $imports" 2>/dev/null; then
  python3 -m venv "$venv"
  if ! "$venv/bin/pip" install -q --disable-pip-version-check "${packages[@]}"; then
    if ! curl -sf -m 15 -o /dev/null "https://pypi.org/simple/${packages[-1]}/"; then
      if [ "${SPOOL_NO_SKIP:-0}" = 1 ]; then
        echo "e2e: FAIL: PyPI is unreachable, cannot install ${packages[*]} (SPOOL_NO_SKIP=1: no skip in CI)" >&2
        exit 1
      fi
      echo "e2e: SKIP: PyPI is unreachable, cannot install ${packages[*]}"
      exit 77
    fi
    echo "e2e: pip install ${packages[*]} failed although PyPI is reachable" >&2
    exit 1
  fi
fi

log="$work/serve.log"
"$spool" serve --port 0 --api-key e2e-key --threads 2 --prefill-step-size 16 "${serve_args[@]}" >"$log" 2>&1 &
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
OPENAI_AGENTS_DISABLE_TRACING=1 "$venv/bin/python" "$here/$script" "http://127.0.0.1:$port$base" e2e-key
echo "e2e: $name client test passed"
