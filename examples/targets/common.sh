# Shared by the field examples' run.sh (sourced, not run): find the runner, run one scenario
# file, compare its verdict with the one recorded as expected, print the summary.
#
#   tfv_runner ROOT              sets TFV_CMD: "$TICKETFLOW" (a path to the binary, or a command
#                                line without quoted spaces) or cargo run on ROOT/Cargo.toml;
#                                checks it starts (the first cargo call builds it)
#   tfv_expected FILE [LEVEL]    the expectation recorded in FILE: pass | fail | pending | any
#                                ("# expect: fail — why" or, with LEVEL,
#                                 "# lesson-python expects: read-committed=pass ...")
#   tfv_scenario FILE WANT OUT [LABEL]
#                                runs FILE once, or --repeat $TFV_REPEAT (5) when its barrier is
#                                kind = "http", with --json into OUT/; prints the verdict, the
#                                reason, the coverage of an interposed file (schedules run, mode) and
#                                (FAIL) the distinct final answers; records the result
#   tfv_summary                  prints the table; returns 1 if any result was unexpected
#
# Verdicts: PASS, FAIL, PENDING (runner exit 0/1/3, read from its JSON; `any` = pass or fail), or
# error(2) (bad file or unreachable target: nothing raced), timeout, error(exit N).

TFV_RESULTS=()
TFV_UNEXPECTED=0

tfv_runner() {
    local root=$1
    if [ -n "${TICKETFLOW:-}" ]; then
        if [ -x "$TICKETFLOW" ]; then TFV_CMD=("$TICKETFLOW"); else read -ra TFV_CMD <<<"$TICKETFLOW"; fi
    else
        TFV_CMD=(cargo run --quiet --manifest-path "$root/Cargo.toml" --)
    fi
    timeout "${TFV_BUILD_TIMEOUT:-1200}" "${TFV_CMD[@]}" --help >/dev/null 2>&1 || {
        echo "run.sh: the runner does not start: ${TFV_CMD[*]} --help failed (cargo build, or set TICKETFLOW)" >&2
        return 1
    }
}

tfv_expected() {
    local file=$1 level=${2:-} e
    if [ -n "$level" ]; then
        e=$(sed -n 's/^# lesson-python expects:.*'"$level"'=\([a-z]*\).*/\1/p' "$file" | head -n1)
    else
        e=$(sed -n 's/^# expect: *\([a-z]*\).*/\1/p' "$file" | head -n1)
    fi
    case $e in
        pass|fail|pending|any) echo "$e" ;;
        *) echo "run.sh: $file records no expected verdict${level:+ for $level}" >&2; return 1 ;;
    esac
}

# Reads one outcome line of `scenario run --json`; prints "VERDICT passes failures" (mode
# verdict) or the human summary (mode summary).
TFV_PY='
import json, sys
mode, path = sys.argv[1], sys.argv[2]
o = None
for line in open(path, encoding="utf-8"):
    line = line.strip()
    if line.startswith("{"):
        o = json.loads(line)
if o is None:
    print("NONE 0 0" if mode == "verdict" else "   (no JSON outcome)")
    sys.exit(0)
if mode == "verdict":
    print(o["verdict"], o.get("passes", 0), o.get("failures", 0))
    sys.exit(0)
runs = o.get("runs", [])
# The runs of an interposed file are its schedules, not repeats.
what = "schedules" if o.get("coverage") else "repeats"
rep = " [%d %s: %d pass, %d fail]" % (len(runs), what, o.get("passes", 0), o.get("failures", 0)) if len(runs) > 1 else ""
shown = next((r for r in runs if r.get("verdict") == o["verdict"]), runs[0] if runs else None)
line = o.get("reason") or (shown or {}).get("evidence_line") or ""
print("   %-7s %s%s -- %s" % (o["verdict"], o["scenario"], rep, line))
if o.get("coverage"):
    print("           coverage: %s" % o["coverage"])
if o["verdict"] == "FAIL" and shown:
    for g in shown.get("answers", []):
        s = g["summary"]
        s = s if len(s) <= 360 else s[:357] + "..."
        print("           %d x %-11s %s (%s)" % (g["count"], g["kind"], s, ", ".join(g["racers"])))
    for c in shown.get("checks", []):
        if not c.get("passed") and not c.get("follows_from"):
            d = c["detail"]
            print("         FAILED %s: %s" % (c["name"], d if len(d) <= 400 else d[:397] + "..."))
'

tfv_scenario() {
    local file=$1 want=$2 out=$3 label=${4:-} repeat=1 rc got json base
    base=$(basename "$file" .toml)
    if grep -Eq '^[[:space:]]*kind[[:space:]]*=[[:space:]]*"http"' "$file"; then repeat=${TFV_REPEAT:-5}; fi
    json="$out/$base${label:+.$label}.json"
    echo "-- ${label:+$label }$base (--repeat $repeat)"
    set +e
    timeout "${TFV_SCENARIO_TIMEOUT:-600}" "${TFV_CMD[@]}" scenario run --json --repeat "$repeat" "$file" \
        >"$json" 2>"$json.stderr"
    rc=$?
    set -e
    case $rc in
        0|1|3)
            read -r got _ _ < <(python3 -c "$TFV_PY" verdict "$json")
            python3 -c "$TFV_PY" summary "$json"
            # the exit code must agree with the verdict (PENDING exits 3)
            case "$rc:$got" in 0:PASS|1:FAIL|3:PENDING) ;; *) got="$got(exit $rc)" ;; esac
            got=$(echo "$got" | tr '[:upper:]' '[:lower:]') ;;
        2) got="error(2)"; sed 's/^/   /' "$json.stderr" >&2 ;;
        124) got="timeout" ;;
        *) got="error(exit $rc)"; tail -n 5 "$json.stderr" | sed 's/^/   /' >&2 ;;
    esac
    local verdict="as expected"
    if [ "$want" = any ] && { [ "$got" = pass ] || [ "$got" = fail ]; }; then :
    elif [ "$got" != "$want" ]; then verdict="UNEXPECTED"; TFV_UNEXPECTED=1; fi
    TFV_RESULTS+=("$(printf '%-16s %-30s x%-2s got %-8s expected %-5s %s' \
        "${label:--}" "$base" "$repeat" "$got" "$want" "$verdict")")
}

tfv_summary() {
    echo
    echo "== summary (expected = what was found and recorded in each scenario file; see NOTES.md, FIELD.md)"
    printf '%s\n' "${TFV_RESULTS[@]}"
    [ "$TFV_UNEXPECTED" = 0 ]
}
