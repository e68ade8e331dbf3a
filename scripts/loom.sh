#!/usr/bin/env bash
# Model-checks the create protocol with loom (tests/loom/main.rs): builds the `loom` test target
# in release mode with the `loom` feature, which crates/core/build.rs turns into our own cfg
# `ticketflow_loom` for the core crate only (`--cfg loom` would reach tokio inside the `postgres`
# crate and break its build; RUSTFLAGS would rebuild every dependency), in the ordinary target
# directory, so it reuses the release build's dependencies (`cargo run --release -- verify`),
# runs every model one at a time and writes reports/loom.json.
#
# Exits non-zero when the build or a test breaks, or when a model's result differs from the
# expected one (the protocol passes every model; the wrong implementations fail them).
# A full run writes ticketflow-report/loom.json (gitignored; `verify` reads it when it is fresh);
# `--update-report` (first argument) writes the tracked reports/loom.json instead, the evidence
# CI and the documented refresh step keep. Other arguments go to the test binary as a name filter
# (e.g. `scripts/loom.sh same_body`); a filtered run prints its models and writes no file.
set -euo pipefail
cd "$(dirname "$0")/.."

report=ticketflow-report/loom.json
if [ "${1:-}" = "--update-report" ]; then
  report=reports/loom.json
  shift
fi
# The files whose change makes the report stale, in this order (see docs/loom.md).
sources=(crates/core/src/protocol.rs crates/core/src/variants.rs crates/core/src/sequence_variants.rs crates/core/src/store/memory.rs crates/core/src/store/mod.rs crates/core/src/lease.rs crates/core/src/store/leases.rs tests/loom/main.rs)

lines=$(mktemp)
trap 'rm -f "$lines" "$lines.json"' EXIT

started=$(date +%s)
set +e
TICKETFLOW_LOOM_REPORT="$lines" \
  cargo test --release --features loom --test loom -- --nocapture --test-threads=1 "$@"
status=$?
set -e
elapsed=$(($(date +%s) - started))

models=$(grep -c . "$lines" || true)
# serde_json writes each line with sorted keys, so the two fields are found by plain text.
mismatched=$(grep -v -E '"expected":"(pass|fail)".*"result":"\1"' "$lines" | grep -c . || true)

echo "loom: $models model(s), $mismatched with an unexpected result, cargo test exit $status, ${elapsed}s in all (build included)"

if [ "$#" -eq 0 ] && [ "$models" -gt 0 ]; then
  sha=$(cat "${sources[@]}" | sha256sum | cut -d' ' -f1)
  {
    echo '{'
    echo '  "generated_by": "scripts/loom.sh",'
    echo "  \"generated_at\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\","
    echo "  \"source_sha256\": \"$sha\","
    printf '  "source_files": ["%s"],\n' "$(IFS=,; echo "${sources[*]}" | sed 's/,/", "/g')"
    echo '  "command": "cargo test --release --features loom --test loom -- --nocapture --test-threads=1",'
    echo "  \"cargo_test_exit\": $status,"
    echo "  \"models_total\": $models,"
    echo "  \"models_unexpected\": $mismatched,"
    echo '  "models": ['
    sed -e 's/^/    /' -e '$!s/$/,/' "$lines"
    echo '  ]'
    echo '}'
  } >"$lines.json"
  mkdir -p "$(dirname "$report")"
  mv "$lines.json" "$report"
  echo "loom: wrote $report (source_sha256 $sha)"
elif [ "$#" -ne 0 ]; then
  echo "loom: filtered run; no report written"
fi

if [ "$status" -ne 0 ]; then exit "$status"; fi
if [ "$models" -eq 0 ]; then
  echo "loom: no model ran" >&2
  exit 1
fi
if [ "$mismatched" -ne 0 ]; then
  echo "loom: $mismatched model(s) did not give the expected result" >&2
  exit 1
fi
