#!/usr/bin/env bash
# The compose deployment, built and run end to end on this machine (docs/deploy.md, "Checked here"):
#
#   1. images: the CPU image (docker/Dockerfile) and PostgreSQL + Redis;
#   2. postgres + redis + migrate + web + a CPU worker from docker/compose.yaml, up to /healthz;
#   3. logs in (the demo admin from `manage.py seed_demo`), makes an API token on its page, and
#      launches configs/tiny-lora.yaml through the API; waits for the run to succeed;
#   4. restarts the stack (down, up): the run, its checkpoint and the login are still there;
#   5. stops the stack's worker and starts one from docker/compose.worker.yaml against the same
#      Postgres, Redis and data volume; a second run succeeds on it;
#   6. tears everything down (containers, volumes, networks; images stay for the next check).
#
# Images. By default postgres:17.6-bookworm and redis:7.4.5-bookworm (what a team runs) when the
# daemon has them or can pull them, and the CPU image from the official Python image. A machine
# that reaches no image registry sets TROUPE_CHECK_STANDIN=1 (or gets it when a pull fails): a
# Debian bookworm root file system from `mmdebstrap --variant=minbase` is imported as the base
# (plus this machine's extra certificate authorities, docker/standin/Dockerfile.base), and
# PostgreSQL and Redis are Debian's packages on it (docker/standin/Dockerfile.{postgres,redis}).
# TROUPE_CHECK_WHEELS=DIR serves a folder of wheels to the build (find-links) and takes torch from
# it instead of PyTorch's CPU index (a machine whose pip finds the CPU torch in a local folder;
# the default when PIP_FIND_LINKS names a local folder, TROUPE_CHECK_WHEELS= turns it off).
#
# Needs: docker (a daemon that answers), docker compose v2 or docker-compose >= 1.29, curl,
# python3; mmdebstrap for the stand-in base. Run from anywhere; prints each step with its time.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DOCKER_DIR="$ROOT/docker"
PROJECT=${TROUPE_CHECK_PROJECT:-troupe-check}
WORKER_PROJECT="$PROJECT-worker2"
PORT=${TROUPE_CHECK_PORT:-18000}
RUN_TIMEOUT=${TROUPE_CHECK_RUN_TIMEOUT:-900}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/troupe-compose-check.XXXXXX")
export DOCKER_BUILDKIT=${DOCKER_BUILDKIT:-0}  # the classic builder: no buildx plugin needed
STARTED=$(date +%s)
HTTP_PID=""

exec 3>&1  # the check's own lines, also from inside commands whose output is discarded
say() { printf '[%4ss] %s\n' "$(( $(date +%s) - STARTED ))" "$*" >&3; }
fail() { say "FAILED: $*"; exit 1; }
timed() {  # timed LABEL CMD...: run CMD, print how long it took
    local label=$1 t0; shift; t0=$(date +%s)
    "$@"
    say "$label: $(( $(date +%s) - t0 ))s"
}

# -- compose v2 or v1 ---------------------------------------------------------------------------------
if docker compose version >/dev/null 2>&1; then
    COMPOSE=(docker compose)
elif command -v docker-compose >/dev/null; then
    COMPOSE=(docker-compose)
else
    fail "neither 'docker compose' nor 'docker-compose' is installed"
fi
docker info >/dev/null 2>&1 || fail "no Docker daemon answers"

compose_file() {  # the file as compose reads it: v1 knows no top-level `name:` (-p names the project)
    local name=$1
    if [ "${COMPOSE[0]}" = docker-compose ]; then
        sed '/^name: /d' "$DOCKER_DIR/$name" > "$WORK/$name"
        echo "$WORK/$name"
    else
        echo "$DOCKER_DIR/$name"
    fi
}
stack() { "${COMPOSE[@]}" --project-directory "$DOCKER_DIR" -p "$PROJECT" -f "$MAIN_FILE" "$@"; }
worker2() { "${COMPOSE[@]}" --project-directory "$DOCKER_DIR" -p "$WORKER_PROJECT" -f "$WORKER_FILE" "$@"; }

cleanup() {
    local rc=$?
    if [ $rc -ne 0 ]; then
        say "logs (last 40 lines per service):"
        stack logs --tail 40 2>/dev/null || true
        worker2 logs --tail 40 2>/dev/null || true
    fi
    worker2 down -v --remove-orphans >/dev/null 2>&1 || true
    stack --profile cpu down -v --remove-orphans >/dev/null 2>&1 || stack down -v --remove-orphans >/dev/null 2>&1 || true
    [ -n "$HTTP_PID" ] && kill "$HTTP_PID" 2>/dev/null
    rm -rf "$WORK"
    exit $rc
}
trap cleanup EXIT

# -- 1. images -----------------------------------------------------------------------------------------
BUILD_ARGS=()
POSTGRES_IMAGE=postgres:17.6-bookworm
REDIS_IMAGE=redis:7.4.5-bookworm
have_or_pull() { docker image inspect "$1" >/dev/null 2>&1 || docker pull -q "$1" >/dev/null 2>&1; }
if [ "${TROUPE_CHECK_STANDIN:-0}" != 1 ] && ! { have_or_pull "$POSTGRES_IMAGE" && have_or_pull "$REDIS_IMAGE" && have_or_pull python:3.11.14-slim-bookworm; }; then
    say "the official images are neither here nor pullable: building stand-ins from Debian packages"
    TROUPE_CHECK_STANDIN=1
fi
if [ "${TROUPE_CHECK_STANDIN:-0}" = 1 ]; then
    if ! docker image inspect troupe-standin-rootfs:bookworm >/dev/null 2>&1; then
        command -v mmdebstrap >/dev/null || fail "mmdebstrap is needed for the stand-in base (apt-get install mmdebstrap)"
        timed "base root file system (mmdebstrap minbase bookworm + python3)" \
            nice -n 10 mmdebstrap --quiet --variant=minbase --include=ca-certificates,python3,python3-venv,python-is-python3 \
            bookworm "$WORK/rootfs.tar"
        timed "docker import" docker import "$WORK/rootfs.tar" troupe-standin-rootfs:bookworm >/dev/null
        rm -f "$WORK/rootfs.tar"
    fi
    mkdir -p "$WORK/base/certs"
    cp /usr/local/share/ca-certificates/*.crt "$WORK/base/certs/" 2>/dev/null || true
    timed "stand-in base image" nice -n 10 docker build -q -f "$DOCKER_DIR/standin/Dockerfile.base" -t troupe-standin-base:bookworm "$WORK/base" >/dev/null
    timed "stand-in PostgreSQL image" nice -n 10 docker build -q -f "$DOCKER_DIR/standin/Dockerfile.postgres" -t troupe-standin-postgres:15 "$ROOT" >/dev/null
    timed "stand-in Redis image" nice -n 10 docker build -q -f "$DOCKER_DIR/standin/Dockerfile.redis" -t troupe-standin-redis:7 "$ROOT" >/dev/null
    POSTGRES_IMAGE=troupe-standin-postgres:15
    REDIS_IMAGE=troupe-standin-redis:7
    BUILD_ARGS+=(--build-arg BASE_IMAGE=troupe-standin-base:bookworm)
fi
if [ -z "${TROUPE_CHECK_WHEELS+set}" ] && [ -d "${PIP_FIND_LINKS:-}" ]; then
    TROUPE_CHECK_WHEELS=$PIP_FIND_LINKS  # the host's pip takes wheels (torch) from a local folder: so does the build
fi
if [ -n "${TROUPE_CHECK_WHEELS:-}" ]; then
    # The build reaches a local HTTP server over the host's network (the classic builder's --network host).
    WHEEL_PORT=${TROUPE_CHECK_WHEEL_PORT:-18765}  # fixed, so the build's layer cache holds from one check to the next
    python3 -m http.server "$WHEEL_PORT" --bind 127.0.0.1 --directory "$TROUPE_CHECK_WHEELS" >/dev/null 2>&1 &
    HTTP_PID=$!
    BUILD_ARGS+=(--network host --build-arg "PIP_FIND_LINKS=http://127.0.0.1:$WHEEL_PORT/" --build-arg TORCH_BACKEND=)
fi
timed "CPU image troupe:local (docker/Dockerfile)" nice -n 10 docker build -q "${BUILD_ARGS[@]}" -f "$DOCKER_DIR/Dockerfile" -t troupe:local "$ROOT" >/dev/null
say "images: $(docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E "^(troupe:local|${POSTGRES_IMAGE}|${REDIS_IMAGE}) " | paste -sd ',' | sed 's/,/, /g')"

# -- 2. the stack --------------------------------------------------------------------------------------
# The host's address on Docker's default bridge: Postgres and Redis are published there (not on
# 127.0.0.1, where the host may run its own), and the second worker's containers reach them there.
BRIDGE_IP=$(docker network inspect bridge --format '{{range .IPAM.Config}}{{.Gateway}}{{end}}')
[ -n "$BRIDGE_IP" ] || BRIDGE_IP=$(ip -4 -o addr show docker0 2>/dev/null | awk '{split($4, a, "/"); print a[1]; exit}')
[ -n "$BRIDGE_IP" ] || fail "cannot tell the host's address on Docker's bridge (docker0)"
secret() { python3 -c 'import secrets; print(secrets.token_hex(16))'; }
POSTGRES_PASSWORD=$(secret)
REDIS_PASSWORD=$(secret)
cat > "$WORK/env" <<EOF
SECRET_KEY=$(secret)$(secret)
DEBUG=false
ALLOWED_HOSTS=localhost,127.0.0.1
TROUPE_HTTPS=false
POSTGRES_PASSWORD=$POSTGRES_PASSWORD
REDIS_PASSWORD=$REDIS_PASSWORD
EOF
export TROUPE_ENV_FILE="$WORK/env" TROUPE_PORT="$PORT" POSTGRES_PASSWORD REDIS_PASSWORD
export TROUPE_POSTGRES_IMAGE="$POSTGRES_IMAGE" TROUPE_REDIS_IMAGE="$REDIS_IMAGE"
export TROUPE_SERVICES_BIND="$BRIDGE_IP"  # the second worker's containers reach Postgres and Redis there
MAIN_FILE=$(compose_file compose.yaml)
WORKER_FILE=$(compose_file compose.worker.yaml)
URL="http://127.0.0.1:$PORT"

wait_healthy() {  # until /healthz answers 200 with the database and Redis up
    local t0 i; t0=$(date +%s)
    for i in $(seq 1 120); do
        if curl -fsS -m 5 "$URL/healthz" 2>/dev/null | python3 -c 'import json, sys; sys.exit(json.load(sys.stdin)["status"] != "ok")' 2>/dev/null; then
            say "/healthz ok after $(( $(date +%s) - t0 ))s"
            return 0
        fi
        sleep 2
    done
    fail "/healthz did not answer ok"
}
up() { timed "$1" stack up -d --no-build postgres redis migrate web worker-cpu; wait_healthy; }
up "stack up (postgres, redis, migrate, web, worker-cpu)"

# -- 3. log in, a token, a run through the API ------------------------------------------------------------
LOGINS=$(stack exec -T web python manage.py seed_demo)
read -r ADMIN ADMIN_PASSWORD < <(echo "$LOGINS" | awk '$1 == "admin" {print $2, $4; exit}')
[ -n "$ADMIN" ] || fail "seed_demo printed no admin login: $LOGINS"
JAR="$WORK/cookies"
login() {
    rm -f "$JAR"
    local csrf
    csrf=$(curl -fsS -c "$JAR" "$URL/login/" | grep -o 'name="csrfmiddlewaretoken" value="[^"]*"' | head -1 | sed 's/.*value="//; s/"$//')
    curl -fsS -o /dev/null -w '%{http_code} %{redirect_url}' -b "$JAR" -c "$JAR" -H "Referer: $URL/login/" \
        --data-urlencode "csrfmiddlewaretoken=$csrf" --data-urlencode "username=$ADMIN" --data-urlencode "password=$ADMIN_PASSWORD" "$URL/login/"
}
[ "$(login | cut -d' ' -f1)" = 302 ] || fail "logging in as $ADMIN was refused"
say "logged in as $ADMIN"
CSRF=$(curl -fsS -b "$JAR" -c "$JAR" "$URL/account/tokens/" | grep -o 'name="csrfmiddlewaretoken" value="[^"]*"' | head -1 | sed 's/.*value="//; s/"$//')
TOKEN=$(curl -fsS -b "$JAR" -c "$JAR" -H "Referer: $URL/account/tokens/" --data-urlencode "csrfmiddlewaretoken=$CSRF" \
    --data-urlencode "name=compose check" "$URL/account/tokens/" | grep -o 'trp_[A-Za-z0-9_-]*' | head -1)
[ -n "$TOKEN" ] || fail "the API tokens page showed no new token"
say "made an API token on the tokens page"

api() { curl -fsS -H "Authorization: Bearer $TOKEN" "$@"; }
field() { python3 -c 'import json, sys; d = json.load(sys.stdin); print(eval(sys.argv[1], {}, {"d": d}))' "$1"; }
launch() {
    api -H "Content-Type: application/yaml" --data-binary @"$ROOT/configs/tiny-lora.yaml" "$URL/api/v1/runs/" | field 'd["id"]'
}
wait_run() {  # wait_run ID: until it succeeded (fails on failed/cancelled or the timeout)
    local id=$1 t0 status; t0=$(date +%s)
    while :; do
        status=$(api "$URL/api/v1/runs/$id/" | field 'd["status"]')
        case $status in
            succeeded) say "run $id succeeded after $(( $(date +%s) - t0 ))s"; return 0 ;;
            failed|cancelled) fail "run $id $status: $(api "$URL/api/v1/runs/$id/" | field 'd.get("error")')" ;;
        esac
        [ $(( $(date +%s) - t0 )) -lt "$RUN_TIMEOUT" ] || fail "run $id still $status after ${RUN_TIMEOUT}s"
        sleep 3
    done
}
checkpoints() { api "$URL/api/v1/runs/$1/" | field 'len(d["artifacts"]["checkpoints"])'; }
RUN1=$(launch)
say "launched run $RUN1 (configs/tiny-lora.yaml) through the API"
wait_run "$RUN1"
CKPT1=$(checkpoints "$RUN1")
[ "$CKPT1" -ge 1 ] || fail "run $RUN1 lists no checkpoint"
CKPT_URL=$(api "$URL/api/v1/runs/$RUN1/" | field 'd["artifacts"]["checkpoints"][-1]["policies"][0]["url"]')
api -o "$WORK/ckpt.zip" "$CKPT_URL" && python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).testzip()' "$WORK/ckpt.zip" \
    || fail "the checkpoint download is not a zip"
say "run $RUN1 has $CKPT1 checkpoint(s); the newest downloads as a zip ($(stat -c %s "$WORK/ckpt.zip") bytes)"

# -- 4. restart: volumes keep the run, its checkpoint and the users ---------------------------------------
timed "stack down (volumes kept)" stack --profile cpu down
up "stack up again"
[ "$(api "$URL/api/v1/runs/$RUN1/" | field 'd["status"]')" = succeeded ] || fail "run $RUN1 is gone or changed after the restart"
[ "$(checkpoints "$RUN1")" = "$CKPT1" ] || fail "run $RUN1's checkpoints changed after the restart"
api -o "$WORK/ckpt2.zip" "$CKPT_URL" && cmp -s "$WORK/ckpt.zip" "$WORK/ckpt2.zip" || fail "the checkpoint is not the same after the restart"
[ "$(login | cut -d' ' -f1)" = 302 ] || fail "$ADMIN cannot log in after the restart"
say "after the restart: run $RUN1 succeeded, its $CKPT1 checkpoint(s) identical, $ADMIN logs in, the token works"

# -- 5. a second worker from compose.worker.yaml against the same services ----------------------------------
DATA_VOLUME=$(docker volume inspect "${PROJECT}_data" --format '{{.Mountpoint}}')
export DATABASE_URL="postgres://troupe:$POSTGRES_PASSWORD@$BRIDGE_IP:5432/troupe"
export REDIS_URL="redis://:$REDIS_PASSWORD@$BRIDGE_IP:6379/0"
export TROUPE_SHARED_DATA="$DATA_VOLUME" TROUPE_WORKER_NAME=cpu1
timed "stack's worker stopped" stack stop worker-cpu
timed "second worker up (compose.worker.yaml, worker-cpu)" worker2 up -d --no-build worker-cpu
RUN2=$(launch)
say "launched run $RUN2; only the second worker is listening"
wait_run "$RUN2"
WORKER=$(stack exec -T web python manage.py shell -c "from webapp.models import Run; print(Run.objects.get(pk=$RUN2).worker)" | tail -1)
case $WORKER in cpu1@*) ;; *) fail "run $RUN2 ran on '$WORKER', not on the second worker" ;; esac
say "run $RUN2 ran on $WORKER (compose.worker.yaml) with $(checkpoints "$RUN2") checkpoint(s) in the shared data volume"

# -- 6. tear down ----------------------------------------------------------------------------------------
timed "second worker down" worker2 down -v
timed "stack down with its volumes" stack --profile cpu down -v
say "compose check passed in $(( $(date +%s) - STARTED ))s"
