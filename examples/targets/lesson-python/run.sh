#!/usr/bin/env bash
# Race the lesson-python example service with TicketFlow Verify's black-box scenarios.
#
#   examples/targets/lesson-python/run.sh                      every isolation level
#   examples/targets/lesson-python/run.sh --level serializable one level (repeatable)
#   examples/targets/lesson-python/run.sh --interposed         only scenarios/interposed/*.toml
#                                       (the runner starts the two instances itself behind its
#                                       interposer; with --level as above)
#   examples/targets/lesson-python/run.sh --serve-only read-committed
#                                       start two instances, print their URLs, wait (bounded)
#
# Steps: a venv in ./.venv with the pinned requirements; the fingerprint golden-vector test; a
# scratch database on 127.0.0.1:5432 (user postgres, trust auth) with schema.sql; per isolation
# level two instances (api-a, api-b) on free loopback ports, each waited for on /healthz; then
# `$TICKETFLOW scenario run FILE` for every scenarios/*.toml, then for every
# scenarios/interposed/*.toml (the runner starts its own two instances at the level, from
# TFV_ISOLATION, with {database_url} pointing at its interposer, and explores the schedules of
# their statements). On exit the instances are stopped and the database dropped. Every wait is
# bounded.
#
# Each scenario file states what this service should get per level in a comment line
#   # lesson-python expects: read-committed=pass repeatable-read=fail serializable=fail
# (pass/fail = the runner's verdict PASS/FAIL, read from its --json; any = either). The run exits 0
# when every result is as expected, 1 otherwise, 2 on a setup error.
#
# Environment: TICKETFLOW (the runner binary; default: cargo run --quiet --manifest-path $ROOT/Cargo.toml --),
# TFV_PG_PORT (5432), TFV_SERVE_SECONDS (--serve-only limit, 3600), TFV_SCENARIO_TIMEOUT
# (seconds per runner call, 600), TFV_KEEP_LOGS (keep logs and runner JSON), PYTHON (python3).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
PG_HOST=127.0.0.1
PG_PORT=${TFV_PG_PORT:-5432}
PG_USER=postgres
LEVELS_ALL=(read-committed repeatable-read serializable)
export PYTHONDONTWRITEBYTECODE=1   # keep __pycache__ out of the work tree

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
die() { echo "run.sh: $*" >&2; exit 2; }

levels=()
serve_only=""
interposed_only=0
while [ $# -gt 0 ]; do
    case "$1" in
        --level) [ $# -ge 2 ] || usage; levels+=("$2"); shift 2 ;;
        --serve-only) [ $# -ge 2 ] || usage; serve_only=$2; shift 2 ;;
        --interposed) interposed_only=1; shift ;;
        -h|--help) usage ;;
        *) echo "run.sh: unknown argument $1" >&2; usage ;;
    esac
done
[ -n "$serve_only" ] && levels=("$serve_only")
[ ${#levels[@]} -eq 0 ] && levels=("${LEVELS_ALL[@]}")
for l in "${levels[@]}"; do
    case " ${LEVELS_ALL[*]} " in *" $l "*) ;; *) die "unknown isolation level $l (one of: ${LEVELS_ALL[*]})" ;; esac
done

# ---- cleanup (registered before anything is started) -----------------------------------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tfv-lesson-python.XXXXXX")
DB=""
PIDS=()
keep_logs=0

stop_instances() {
    local pid
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do
        # Bounded: 5 s for a clean exit, then SIGKILL.
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    PIDS=()
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    stop_instances
    if [ -n "$DB" ]; then
        timeout 30 dropdb -h "$PG_HOST" -p "$PG_PORT" -U "$PG_USER" --if-exists --force "$DB" \
            || echo "run.sh: could not drop database $DB" >&2
    fi
    if [ "$keep_logs" = 1 ] || [ "$rc" -ne 0 ]; then
        echo "run.sh: service logs kept in $WORK" >&2
    else
        rm -rf "$WORK"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- Python environment ----------------------------------------------------------------------
VENV="$HERE/.venv"
PY="$VENV/bin/python"
if [ ! -x "$PY" ]; then
    "${PYTHON:-python3}" -m venv "$VENV" || die "cannot create $VENV (python3 -m venv)"
fi
stamp="$VENV/.requirements.sha256"
want=$(sha256sum "$HERE/requirements.txt" | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
    timeout 600 "$PY" -m pip install --disable-pip-version-check --quiet -r "$HERE/requirements.txt" \
        || die "pip install -r requirements.txt failed"
    echo "$want" > "$stamp"
fi

(cd "$HERE" && timeout 60 "$PY" test_fingerprint.py) || die "fingerprint golden vectors do not match"

# ---- the runner (checked before anything is started) ------------------------------------------
# shellcheck source=../common.sh
. "$HERE/../common.sh"
if [ -z "$serve_only" ]; then
    tfv_runner "$ROOT" || exit 2
fi

# ---- scratch database --------------------------------------------------------------------------
timeout 10 pg_isready -q -h "$PG_HOST" -p "$PG_PORT" \
    || die "PostgreSQL is not accepting connections on $PG_HOST:$PG_PORT"
DB="tfv_lesson_py_$(date +%s)_$$"
timeout 30 createdb -h "$PG_HOST" -p "$PG_PORT" -U "$PG_USER" "$DB" || { DB=""; die "createdb failed"; }
timeout 30 psql -X -q -v ON_ERROR_STOP=1 -h "$PG_HOST" -p "$PG_PORT" -U "$PG_USER" -d "$DB" \
    -f "$HERE/schema.sql" || die "applying schema.sql failed"
DATABASE_URL="postgresql://$PG_USER@$PG_HOST:$PG_PORT/$DB"

# ---- instances ---------------------------------------------------------------------------------
# start_pair LEVEL: api-a and api-b on free loopback ports (each binds port 0 and writes its URL);
# sets URL_A and URL_B once both answer /healthz, or fails after 20 s.
start_pair() {
    local level=$1 name
    URL_A="" URL_B=""
    for name in api-a api-b; do
        rm -f "$WORK/$name.url"
        (cd "$HERE" && exec "$PY" app.py --database-url "$DATABASE_URL" --isolation "$level" \
            --host 127.0.0.1 --port 0 --url-file "$WORK/$name.url" --name "$name") \
            >>"$WORK/$name.$level.log" 2>&1 &
        PIDS+=($!)
    done
    local deadline=$((SECONDS + 20)) url
    for name in api-a api-b; do
        until [ -s "$WORK/$name.url" ] && url=$(cat "$WORK/$name.url") \
            && curl -fsS --max-time 2 "$url/healthz" >/dev/null 2>&1; do
            if [ $SECONDS -ge $deadline ]; then
                tail -n 20 "$WORK/$name.$level.log" >&2 || true
                die "$name ($level) did not answer /healthz within 20 s"
            fi
            sleep 0.1
        done
        if [ "$name" = api-a ]; then URL_A=$url; else URL_B=$url; fi
    done
}

if [ -n "$serve_only" ]; then
    keep_logs=1
    start_pair "$serve_only"
    limit=${TFV_SERVE_SECONDS:-3600}
    cat <<EOF
lesson-python ($serve_only), two instances:
  api-a  $URL_A
  api-b  $URL_B
  database  $DATABASE_URL   (dropped when this script exits)
  logs      $WORK
Try:
  curl -si -X POST $URL_A/v1/tickets -H 'Content-Type: application/json' \\
       -H 'X-Tenant-Id: t1' -H 'Idempotency-Key: k1' \\
       -d '{"actor_id":"u1","title":"Printer jammed","body":"Floor 3 printer shows E-42","priority":"high"}'
  psql $DATABASE_URL
Serving for at most $limit s (TFV_SERVE_SECONDS); Ctrl-C stops the instances and drops the database.
EOF
    deadline=$((SECONDS + limit))
    while [ $SECONDS -lt $deadline ]; do
        for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null || die "an instance exited; see $WORK"; done
        sleep 1
    done
    echo "run.sh: serve limit of $limit s reached" >&2
    exit 0
fi

# ---- scenario runs -----------------------------------------------------------------------------
shopt -s nullglob
files=("$HERE"/scenarios/*.toml)
interposed=("$HERE"/scenarios/interposed/*.toml)
[ "$interposed_only" = 0 ] || files=()
[ ${#files[@]} -gt 0 ] || [ ${#interposed[@]} -gt 0 ] || die "no scenario files in $HERE/scenarios"
# The interposed files start the service with a relative path (.venv/bin/python app.py).
cd "$HERE"

for level in "${levels[@]}"; do
    export TARGET_DATABASE_URL=$DATABASE_URL TFV_ISOLATION=$level
    if [ ${#files[@]} -gt 0 ]; then
        start_pair "$level"
        export TFV_URL_A=$URL_A TFV_URL_B=$URL_B
        echo "== $level: api-a $URL_A, api-b $URL_B"
        for f in "${files[@]}"; do
            want=$(tfv_expected "$f" "$level") || exit 2
            # runner JSON in $WORK (kept when a result is unexpected or TFV_KEEP_LOGS is set)
            tfv_scenario "$f" "$want" "$WORK" "$level"
        done
        stop_instances
    fi
    # The runner starts its own instances for these (TFV_ISOLATION is the level) and explores
    # schedules in one call per file, so no --repeat.
    for f in "${interposed[@]}"; do
        want=$(tfv_expected "$f" "$level") || exit 2
        tfv_scenario "$f" "$want" "$WORK" "$level-interposed"
    done
done

[ -z "${TFV_KEEP_LOGS:-}" ] || keep_logs=1
tfv_summary || { keep_logs=1; exit 1; }

