#!/usr/bin/env bash
# express-idempotency field example: install, start two node instances sharing one
# Redis db (keys) and one scratch PostgreSQL database (orders), run the scenarios, clean up.
#   examples/targets/express-idempotency/run.sh               # run scenarios/*.toml; exit 0 when every verdict is the one recorded (# expect:)
#   examples/targets/express-idempotency/run.sh --interposed  # only scenarios/interposed/*.toml (the runner starts the instances behind its interposer)
#   examples/targets/express-idempotency/run.sh --serve-only  # start, print URLs, serve until Ctrl-C (or TFV_SERVE_SECONDS, default 3600)
# Without a flag: scenarios/*.toml against the two instances started here, then
# scenarios/interposed/*.toml (the runner starts its own two instances with {database_url} and
# {redis_url} pointing at its interposer, on this script's database and Redis key prefix).
# Needs: node (20) + npm, python3 (free ports), psql, redis-cli, curl; PostgreSQL on 127.0.0.1:5432 (trust, user
# postgres), Redis on 127.0.0.1:6379.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
SERVE_ONLY=0
INTERPOSED_ONLY=0
case "${1:-}" in
  --serve-only) SERVE_ONLY=1 ;;
  --interposed) INTERPOSED_ONLY=1 ;;
  "") ;;
  *) echo "usage: $0 [--serve-only | --interposed]" >&2; exit 2 ;;
esac

export PGHOST=127.0.0.1 PGPORT=5432 PGUSER=postgres
REDIS_DB=13
RUN=$(python3 -c 'import secrets; print(secrets.token_hex(4))')
DB="tfv_expidem_$RUN"
# The library stores each Idempotency-Key as a Redis key of the same name, with no prefix of its
# own: the scenarios put TFV_KEY_PREFIX in front of every wire key, and cleanup deletes those.
export TFV_KEY_PREFIX="tfv-expidem-$RUN-"
LOGS=$(mktemp -d "${TMPDIR:-/tmp}/tfv-expidem-$RUN.XXXX")
PIDS=()
KEEP_LOGS=1   # cleared when every verdict is as expected (TFV_KEEP_LOGS=1 keeps them anyway)
# shellcheck source=../common.sh
. "$HERE/../common.sh"

cleanup() {
  set +e
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
  for _ in $(seq 50); do   # up to 5 s for a graceful stop, then SIGKILL
    alive=0; for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break; sleep 0.1
  done
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null; done
  timeout 20 psql -q -d postgres -c "DROP DATABASE IF EXISTS \"$DB\" WITH (FORCE)" >/dev/null
  timeout 20 redis-cli -h 127.0.0.1 -n "$REDIS_DB" --scan --pattern "$TFV_KEY_PREFIX*" \
    | timeout 20 xargs -r -n 100 redis-cli -h 127.0.0.1 -n "$REDIS_DB" del >/dev/null
  echo "stopped instances, dropped $DB, deleted redis db $REDIS_DB keys $TFV_KEY_PREFIX*" >&2
  if [ "$KEEP_LOGS" = 1 ]; then echo "logs kept: $LOGS" >&2; else rm -rf "$LOGS"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# 1. install into node_modules/ from package-lock.json (re-done when the lock file changes)
if [ ! -f "$HERE/node_modules/.tfv-installed" ] || ! cmp -s "$HERE/package-lock.json" "$HERE/node_modules/.tfv-installed"; then
  (cd "$HERE" && timeout 600 npm ci --no-audit --no-fund --loglevel=error)
  cp "$HERE/package-lock.json" "$HERE/node_modules/.tfv-installed"
fi

# the runner (checked, and built by cargo, before anything is started)
[ "$SERVE_ONLY" = 1 ] || tfv_runner "$ROOT" || exit 2

# 2. scratch database with the business table
timeout 20 psql -q -d postgres -c "CREATE DATABASE \"$DB\""
timeout 20 psql -q -v ON_ERROR_STOP=1 -d "$DB" -f "$HERE/schema.sql"
export TARGET_DATABASE_URL="postgresql://$PGUSER@$PGHOST:$PGPORT/$DB"
export TFV_DATABASE_URL="$TARGET_DATABASE_URL" TFV_REDIS_URL="redis://127.0.0.1:6379/$REDIS_DB"

# 3. two instances on free loopback ports
read -r PORT_A PORT_B < <(python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
for name in a b; do
  port=PORT_${name^^}
  (cd "$HERE" && PORT="${!port}" exec node app.js) \
      >"$LOGS/api-$name.log" 2>&1 &
  PIDS+=($!)
done
export TFV_URL_A="http://127.0.0.1:$PORT_A" TFV_URL_B="http://127.0.0.1:$PORT_B"

for url in "$TFV_URL_A" "$TFV_URL_B"; do   # up to 30 s each
  for i in $(seq 60); do
    curl -fsS --max-time 1 "$url/healthz" >/dev/null 2>&1 && break
    [ "$i" = 60 ] && { echo "$url did not answer within 30 s; logs in $LOGS" >&2; exit 2; }
    sleep 0.5
  done
done

echo "api-a: $TFV_URL_A"
echo "api-b: $TFV_URL_B"
echo "TARGET_DATABASE_URL=$TARGET_DATABASE_URL"
echo "redis: db $REDIS_DB, keys $TFV_KEY_PREFIX* (export TFV_KEY_PREFIX=$TFV_KEY_PREFIX for hand-made requests); logs: $LOGS"

if [ "$SERVE_ONLY" = 1 ]; then
  limit=${TFV_SERVE_SECONDS:-3600}   # bounded: stops by itself after this many seconds
  echo "serving for up to $limit s; Ctrl-C stops both instances and cleans up"
  for _ in $(seq "$limit"); do
    for pid in "${PIDS[@]}"; do
      kill -0 "$pid" 2>/dev/null || { echo "an instance exited; see $LOGS" >&2; exit 2; }
    done
    sleep 1
  done
  echo "serve limit of $limit s reached" >&2
  exit 0
fi

cd "$HERE"
# one runner call per file, so that each verdict is compared with the one the file records
# ("# expect: pass|fail|any — what was found"); HTTP-barrier files run --repeat ${TFV_REPEAT:-5}
shopt -s nullglob
files=(scenarios/*.toml)
interposed=(scenarios/interposed/*.toml)
[ "$INTERPOSED_ONLY" = 0 ] || files=()
[ ${#files[@]} -gt 0 ] || [ ${#interposed[@]} -gt 0 ] || { echo "no scenario files in $HERE/scenarios" >&2; exit 2; }
for f in "${files[@]}"; do
  want=$(tfv_expected "$f") || exit 2
  tfv_scenario "$f" "$want" "$LOGS"
done
# The interposed files start their own instances (relative paths: run from $HERE) and explore
# schedules in one runner call each, so no --repeat.
for f in "${interposed[@]}"; do
  want=$(tfv_expected "$f") || exit 2
  tfv_scenario "$f" "$want" "$LOGS" interposed
done
if tfv_summary; then
  [ -n "${TFV_KEEP_LOGS:-}" ] || KEEP_LOGS=0
  exit 0
fi
echo "unexpected verdicts; runner JSON and service logs kept in $LOGS" >&2
exit 1
