#!/usr/bin/env bash
# `ticketflow check` against `serve` on a scratch database, SEEDS invocations per
# implementation, each with its own seed and the default budget of scenarios/check/serve.toml:
# the three real protocols must PASS every one, and each variant that only a sequence of
# requests shows (sequence_variants) must FAIL every one. Prints one line per implementation
# and exits 1 when any invocation went the other way. Shrinking and replays are skipped
# (--shrink-runs 0 --replays 0): they do not change whether a history fails.
#   scripts/check-proof.sh [SEEDS [NAME...]]   SEEDS default 20 (about 40 s per protocol
#   invocation, 3 s per variant); NAMEs (protocol-savepoint, key-hash-collision, …) pick some
set -euo pipefail
cd "$(dirname "$0")/.."
seeds="${1:-20}"
shift || true
only=" $* "
scripts/pg-up >/dev/null
cargo build --release --quiet
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A copy: a rebuild while the proof runs must not change the binary under it.
cp target/release/ticketflow "$work/ticketflow"
bin="$work/ticketflow"
bad=0
run() { # name, flag words for serve, expected verdict (PASS or FAIL)
  local name=$1 flags=$2 want=$3 got=0 first=""
  if [ "$only" != "  " ] && [[ "$only" != *" $name "* ]]; then return; fi
  sed "s/\"serve\", \"--pool-size\"/\"serve\", $flags, \"--pool-size\"/" scenarios/check/serve.toml >"$work/$name.toml"
  for seed in $(seq 1 "$seeds"); do
    verdict=$("$bin" check "$work/$name.toml" --seed "$seed" --shrink-runs 0 --replays 0 \
      --out "$work/$name-$seed-min.toml" 2>/dev/null | head -1 | cut -d' ' -f1 || true)
    if [ "$verdict" = "$want" ]; then got=$((got + 1)); else first="${first:-seed $seed: $verdict}"; fi
  done
  echo "$name: $want in $got of $seeds${first:+ (first other: $first)}"
  [ "$got" = "$seeds" ] || bad=1
}
for p in savepoint on-conflict single-statement; do run "protocol-$p" "\"--protocol\", \"$p\"" PASS; done
for v in replay-rerendered cache-without-scope fingerprint-on-race-path-only refused-overwrites-fingerprint \
  late-outbox-after-replay replay-newest key-hash-collision; do
  run "$v" "\"--variant\", \"$v\"" FAIL
done
exit "$bad"
