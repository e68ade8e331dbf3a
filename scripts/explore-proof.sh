#!/usr/bin/env bash
# What exploration finds that the first point misses: runs the interposed scenarios of
# scenarios/interposed/ against `ticketflow serve` N times (default 20) under the file's own
# exploration (bounded, at most one preemption) and N times under `--explore first-point`
# (every racer held at its first store command, then all released and run free), and prints a
# Markdown table of FAIL / PASS / PENDING counts per (implementation, isolation level, mode).
#
# Implementations: the served wrong implementations exploration is for (split-transactions,
# answer-in-second-transaction, redis-check-then-lock) at READ COMMITTED, and the real
# protocols (savepoint, on-conflict, single-statement) at READ COMMITTED, REPEATABLE READ and
# SERIALIZABLE (`serve --isolation`). A wrong implementation should FAIL every exploration; a
# protocol should PASS every run of both modes.
#
# Needs PostgreSQL (DATABASE_URL if it is postgres://, else the loopback default, as
# `scenario run`) and, for redis-check-then-lock, Redis at the scenario file's redis_url
# (db 9); runs that cannot be set up count as PENDING. Uses target/release/ticketflow
# (TICKETFLOW overrides), building it if it is missing. Deletes the variant's Redis keys
# (ticketflow:rctl:*) from db 9 at the end.
#
# With --faults: the faults of production instead. Each interposed file with a fault is run N
# times under its own exploration against the wrong implementation it is for (which should
# FAIL every run) and the three protocols at READ COMMITTED (which should PASS every run, or
# be PENDING where their commands never reach the fault's step): the service killed after each
# step (claim-never-expires), a request paused past its lock's TTL (redis-lock-expires), a
# receipt write cut after the answer (answer-stored-after-response), the lost acknowledgement
# (lost-ack-creates-again).
#
# Usage: scripts/explore-proof.sh [--faults] [N]
set -euo pipefail
cd "$(dirname "$0")/.."

faults=false
if [ "${1:-}" = "--faults" ]; then
  faults=true
  shift
fi
n="${1:-20}"
case "$n" in
  '' | *[!0-9]* | 0) echo "usage: $0 [N]  (N: runs per implementation and mode, at least 1)" >&2; exit 2 ;;
esac
exe="${TICKETFLOW:-target/release/ticketflow}"
if [ ! -x "$exe" ]; then
  cargo build --release --quiet
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

pg_file=scenarios/interposed/two-racers-same-key.toml
redis_file=scenarios/interposed/two-racers-same-key-redis.toml

# A copy of FILE whose service command ends with the given serve arguments.
with_args() {
  local file=$1 out=$2
  shift 2
  local extra=""
  for a in "$@"; do extra="$extra, \"$a\""; done
  sed "s|\"--database-url\", \"{database_url}\"\]|\"--database-url\", \"{database_url}\"$extra]|" "$file" >"$out"
  grep -q -- "\"--database-url\", \"{database_url}\"$extra]" "$out" || {
    echo "cannot append the implementation's arguments to $file" >&2
    exit 1
  }
}

# Runs FILE N times with the extra `scenario run` options and prints "FAIL PASS PENDING".
count() {
  local file=$1
  shift
  local fail=0 pass=0 pending=0 verdict
  for _ in $(seq "$n"); do
    verdict=$("$exe" scenario run "$file" "$@" 2>/dev/null | awk '/ target /{print $1; exit}' || true)
    case "$verdict" in
      FAIL) fail=$((fail + 1)) ;;
      PASS) pass=$((pass + 1)) ;;
      *) pending=$((pending + 1)) ;;
    esac
  done
  echo "$fail $pass $pending"
}

rows=()
run_row() {
  local name=$1 level=$2 file=$3
  shift 3
  local copy="$work/$name-$level.toml"
  with_args "$file" "$copy" "$@" --isolation "$level"
  local explored first
  explored=$(count "$copy")
  first=$(count "$copy" --explore first-point)
  rows+=("$name|$level|$explored|$first")
  echo "done: $name at $level" >&2
}

# A fault file's row: N runs of its exploration (the first-point mode cannot strike a fault).
fault_row() {
  local name=$1 file=$2
  shift 2
  local copy="$work/$name-$(basename "$file")"
  with_args "$file" "$copy" "$@"
  rows+=("$name|$(basename "$file" .toml)|$(count "$copy")")
  echo "done: $name with $(basename "$file")" >&2
}

if $faults; then
  d=scenarios/interposed
  for spec in "two-racers-kill-each-step claim-never-expires" \
    "two-racers-pause-past-lock-ttl redis-lock-expires --lease {redis_url}" \
    "cut-after-the-answer answer-stored-after-response" \
    "two-racers-lost-ack lost-ack-creates-again"; do
    read -r file variant extra <<<"$spec"
    # shellcheck disable=SC2086
    fault_row "$variant" "$d/$file.toml" --variant "$variant" $extra
    for protocol in savepoint on-conflict single-statement; do
      fault_row "$protocol" "$d/$file.toml" --protocol "$protocol"
    done
  done
  if command -v redis-cli >/dev/null 2>&1; then
    redis-cli -n 9 --scan --pattern 'ticketflow:rctl:*' | xargs -r redis-cli -n 9 DEL >/dev/null || true
  fi
  echo "| implementation | file | FAIL / PASS / PENDING |"
  echo "|---|---|---|"
  for r in "${rows[@]}"; do
    IFS='|' read -r name file counted <<<"$r"
    read -r f p pn <<<"$counted"
    echo "| $name | $file | $f / $p / $pn |"
  done
  echo
  echo "$n runs per cell; $(date -u +%Y-%m-%d) with $("$exe" --version 2>/dev/null || echo ticketflow)"
  exit 0
fi

run_row split-transactions read-committed "$pg_file" --variant split-transactions
run_row answer-in-second-transaction read-committed "$pg_file" --variant answer-in-second-transaction
run_row redis-check-then-lock read-committed "$redis_file" --variant redis-check-then-lock --lease "{redis_url}"
for level in read-committed repeatable-read serializable; do
  for protocol in savepoint on-conflict single-statement; do
    run_row "$protocol" "$level" "$pg_file" --protocol "$protocol"
  done
done

if command -v redis-cli >/dev/null 2>&1; then
  redis-cli -n 9 --scan --pattern 'ticketflow:rctl:*' | xargs -r redis-cli -n 9 DEL >/dev/null || true
fi

echo "| implementation | isolation | exploration (bounded, 1 preemption): FAIL / PASS / PENDING | first-point: FAIL / PASS / PENDING |"
echo "|---|---|---|---|"
for r in "${rows[@]}"; do
  IFS='|' read -r name level explored first <<<"$r"
  read -r ef ep en <<<"$explored"
  read -r ff fp fn <<<"$first"
  echo "| $name | $level | $ef / $ep / $en | $ff / $fp / $fn |"
done
echo
echo "$n runs per cell; $(date -u +%Y-%m-%d) with $("$exe" --version 2>/dev/null || echo ticketflow)"
