#!/bin/sh
# First start: create the cluster, the POSTGRES_USER role with its password and POSTGRES_DB, and
# accept password logins from other containers (what the official image's entrypoint does).
set -eu
: "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}"
user="${POSTGRES_USER:-postgres}"
db="${POSTGRES_DB:-$user}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    pwfile=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
    initdb --username="$user" --pwfile="$pwfile" --auth-local=scram-sha-256 --auth-host=scram-sha-256 \
        --encoding=UTF8 --locale=C.UTF-8 -D "$PGDATA" >/dev/null
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    if [ "$db" != "postgres" ]; then
        postgres --single -D "$PGDATA" -j postgres <<SQL >/dev/null
CREATE DATABASE "$db" OWNER "$user";
SQL
    fi
fi
if [ "${1:-}" = "postgres" ]; then
    shift
    exec postgres -D "$PGDATA" -c listen_addresses='*' "$@"
fi
exec "$@"
