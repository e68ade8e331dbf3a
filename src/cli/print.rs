//! What the commands print on stdout: one summary line per run, suite or part; JSON for the
//! ticket commands. A closed pipe (`… | head`) is the reader's choice, not an error.
//!
//! `verify`'s lines add up to its `TOTAL` line: a line that begins with a verdict (`PASS`,
//! `FAIL`, `PENDING`) carries one verdict, unless it ends with a tally such as
//! `[33 verdicts: 30 PASS, 3 PENDING]`, which gives its count; lines that carry none begin
//! otherwise (`-`, `COUNTS`, `TOTAL`, indented detail).

use std::io::Write as _;

/// A line on stdout through [`ticketflow_harness::contain::terminal`]: secrets masked and
/// control characters escaped, whatever a target put in the text; a closed pipe ends the run
/// as SIGPIPE would ([`ticketflow_harness::cleanup::say`]).
macro_rules! say {
    ($($arg:tt)*) => {{
        let line = ticketflow_harness::contain::terminal(&format!($($arg)*));
        ticketflow_harness::cleanup::say(&line);
    }};
}

use ticketflow::verify::{Finished, VerifyOutcome};
use ticketflow_harness::blackbox::TargetOutcome;
use ticketflow_harness::scenario::ScenarioRun;
use ticketflow_harness::verdict::Verdict;

/// Pretty JSON on stdout, its strings masked and escaped ([`ticketflow_harness::contain::json`]).
pub fn json(value: &impl serde::Serialize) {
    let text = serde_json::to_string_pretty(value).expect("outcome types serialize");
    ticketflow_harness::cleanup::say(&ticketflow_harness::contain::json(&text));
}

/// One JSON object on one line of stdout, contained as [`json`] is.
fn json_line(value: &impl serde::Serialize) {
    let text = serde_json::to_string(value).expect("outcome types serialize");
    ticketflow_harness::cleanup::say(&ticketflow_harness::contain::json(&text));
}

/// One line per run: verdict, backend, scenario and the reason when not PASS.
pub fn run_summary(r: &ScenarioRun) {
    say!(
        "{:<8} {:<9} {:<26} {}{}",
        r.verdict.to_string(),
        r.backend.name(),
        r.setting.label(),
        r.scenario,
        reason(r.reason.as_ref())
    );
}

/// A black-box scenario's verdict: one line, then for a FAIL the distinct answers and the
/// checks that failed (follow-on failures in one line).
pub fn target_summary(t: &TargetOutcome) {
    let text = ticketflow_harness::contain::terminal(
        &ticketflow_harness::blackbox::summary::summary_text(t),
    );
    let _ = write!(std::io::stdout(), "{text}");
}

/// `scenario run`'s output: every run, then every black-box scenario, as summary lines (each
/// black-box scenario followed by its runs' `{run}` ids, [`run_ids`]) or (with `json`) one
/// JSON object per line.
pub fn run_files(runs: &[ScenarioRun], targets: &[TargetOutcome], json: bool) {
    for r in runs {
        if json {
            json_line(r);
        } else {
            run_summary(r);
        }
    }
    for t in targets {
        if json {
            json_line(t);
        } else {
            target_summary(t);
            let _ = write!(std::io::stdout(), "{}", run_ids(t));
        }
    }
}

/// An indented line naming the `{run}` id of each run of `t`, to find it in the service's
/// logs: `         {run} = ID` for one run, `         {run} by repeat: 1 = ID (PASS), 2 = ID
/// (FAIL)` for several; a run that did not start shows `-`. Explored schedules are named by
/// their schedule ids, the failing ones first and at most [`SHOWN_SCHEDULES`] in all:
/// `         {run} by schedule (412 schedules, 1 failing): AABB = ID (FAIL), … and 410 more`.
/// Empty when `t` has no runs.
pub fn run_ids(t: &TargetOutcome) -> String {
    let id = |r: &ticketflow_harness::blackbox::TargetRun| {
        r.evidence
            .as_ref()
            .map_or_else(|| "-".to_string(), |e| e.run_id.clone())
    };
    if t.explored() && t.runs.len() > 1 {
        let schedule = |r: &ticketflow_harness::blackbox::TargetRun| {
            r.evidence
                .as_ref()
                .and_then(|e| e.schedule_id.clone())
                .unwrap_or_else(|| "-".into())
        };
        // The failing schedules first (they are what the logs are searched for), then the
        // first ones run, up to the bound.
        let mut shown: Vec<&ticketflow_harness::blackbox::TargetRun> = t
            .runs
            .iter()
            .filter(|r| r.verdict != Verdict::Pass)
            .collect();
        shown.extend(t.runs.iter().filter(|r| r.verdict == Verdict::Pass));
        let more = t.runs.len().saturating_sub(SHOWN_SCHEDULES);
        shown.truncate(SHOWN_SCHEDULES);
        return format!(
            "         {{run}} by schedule ({} schedules, {} failing): {}{}\n",
            t.runs.len(),
            t.failures,
            shown
                .iter()
                .map(|r| format!("{} = {} ({})", schedule(r), id(r), r.verdict))
                .collect::<Vec<_>>()
                .join(", "),
            if more > 0 {
                format!(", … and {more} more")
            } else {
                String::new()
            }
        );
    }
    match t.runs.as_slice() {
        [] => String::new(),
        [only] => format!("         {{run}} = {}\n", id(only)),
        many => format!(
            "         {{run}} by repeat: {}\n",
            many.iter()
                .enumerate()
                .map(|(n, r)| format!("{} = {} ({})", n + 1, id(r), r.verdict))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// At most this many explored schedules are named by [`run_ids`].
pub const SHOWN_SCHEDULES: usize = 5;

/// One part of `verify` as soon as it finished, flushed at once: what was printed survives
/// an interrupt, whether stdout is a terminal, a pipe or a file.
pub fn finished(part: Finished<'_>) {
    match part {
        Finished::Run(r) => run_summary(r),
        Finished::Target(t) => target_summary(t),
        Finished::Suite(s) => say!(
            "{:<8} {:<9} {:<26} property suite {} ({} cases, seed {}){}",
            s.verdict.to_string(),
            s.backend_name(),
            s.implementation.name(),
            s.suite,
            s.cases,
            s.seed,
            reason(s.reason.as_ref())
        ),
        Finished::Loom { report, path } => {
            let items = ticketflow_report::loom_items(report);
            let verdicts: Vec<Verdict> = items.iter().map(|i| i.verdict).collect();
            let what = match (&report.unusable, &report.generated_at) {
                (Some(why), _) => format!("not read from {}: {why}", shown(path)),
                (None, at) => format!(
                    "{} read from {}{}, not run by verify",
                    items.len(),
                    shown(path),
                    at.as_ref()
                        .map(|at| format!(" (scripts/loom.sh at {at})"))
                        .unwrap_or_default()
                ),
            };
            say!(
                "{:<8} loom models: {what} {}",
                Verdict::of_all(verdicts.iter().copied()).to_string(),
                tally(&verdicts)
            );
        }
        Finished::KillMatrix(k) => {
            let problems = k.problems();
            let problems = if problems.is_empty() {
                String::new()
            } else {
                format!(" — {}", problems.join("; "))
            };
            let verdicts: Vec<Verdict> = k.rows().iter().map(|r| r.verdict).collect();
            say!(
                "{:<8} kill matrix: {}{problems} {}",
                k.verdict().to_string(),
                k.summary(),
                tally(&verdicts)
            );
        }
        Finished::Faults(f) => {
            // The cases that ran (or could not) on one line, each case left out by choice on
            // its own, so the reader sees how to run it.
            let verdicts: Vec<Verdict> = f.cases.iter().map(|c| c.verdict).collect();
            say!(
                "{:<8} faults and bad input: {} {}",
                f.verdict().to_string(),
                f.tally(),
                tally(&verdicts)
            );
            for (name, why) in &f.not_run {
                say!(
                    "{:<8} fault case: {name} — {why}",
                    Verdict::Pending.to_string()
                );
            }
        }
        Finished::Soak(s) => {
            let f = &s.figures;
            if f.requests == 0 {
                say!(
                    "{:<8} soak: did not run{}",
                    s.verdict.to_string(),
                    reason(s.reason.as_ref())
                );
            } else {
                say!(
                    "{:<8} soak: {} requests, {} req/s, p50 {} ms, p99 {} ms, faults {}{}{}",
                    s.verdict.to_string(),
                    f.requests,
                    f.req_per_s,
                    f.p50_ms,
                    f.p99_ms,
                    s.faults.len(),
                    s.alongside
                        .as_ref()
                        .map(|a| format!(" (beside {a}, sharing the machine)"))
                        .unwrap_or_default(),
                    reason(s.reason.as_ref())
                );
            }
        }
    }
    // `println!` flushes at each newline already (std's stdout is line-buffered even into a
    // file); this keeps it so should that ever change.
    let _ = std::io::stdout().flush();
}

/// The end of `verify`'s output, after every part was printed by [`finished`]: what
/// `--filter` left out, a skipped kill matrix and the exported races. The report paths follow
/// separately.
pub fn verify_tail(outcome: &VerifyOutcome, no_kill_matrix: bool) {
    if !outcome.not_selected.is_empty() {
        let n = outcome.not_selected.len();
        // Counted PENDING in TOTAL, as in the report's headline.
        say!(
            "{:<8} not selected by --filter: {n} part(s), listed in the report {}",
            Verdict::Pending.to_string(),
            tally(&vec![Verdict::Pending; n])
        );
    }
    if outcome.kill.is_none() && no_kill_matrix {
        say!("-        kill matrix: skipped (--no-kill-matrix); no verdict, so not in TOTAL");
    }
    for spec in &outcome.specs {
        say!(
            "-        failing race {} [{}] exported to {}",
            spec.scenario,
            spec.setting,
            spec.path.display()
        );
    }
}

/// The last lines of `verify`: what the verdicts are (`COUNTS`, the sum a reader can check
/// against the lines above) and `TOTAL`, the totals REPORT.md's headline shows, where the
/// report is and how long the run took, e.g. `TOTAL    412 PASS, 0 FAIL, 2 PENDING — 414
/// verdicts — REPORT.md — 58.2 s`.
pub fn verify_totals(outcome: &VerifyOutcome, report: &std::path::Path, took: std::time::Duration) {
    let t = &outcome.totals;
    let mut parts = vec![
        format!("{} scenario runs", outcome.runs.len()),
        format!("{} black-box scenarios", outcome.targets.len()),
        format!("{} property suites", outcome.suites.len()),
        match outcome.loom.unusable {
            Some(_) => "1 loom report (not usable)".to_string(),
            None => format!(
                "{} loom models",
                ticketflow_report::loom_items(&outcome.loom).len()
            ),
        },
    ];
    if let Some(f) = &outcome.faults {
        parts.push(format!("{} fault cases", f.tally().cases));
    }
    if outcome.soak.is_some() {
        parts.push("1 soak".to_string());
    }
    if let Some(k) = &outcome.kill {
        parts.push(format!("{} kill-matrix verdicts", k.rows().len()));
    }
    if t.not_selected > 0 {
        parts.push(format!("{} parts not selected", t.not_selected));
    }
    let all = t.pass + t.fail + t.pending;
    say!(
        "COUNTS   {} = {all} verdicts (a line above is one verdict unless it ends with [N verdicts: …])",
        parts.join(" + ")
    );
    say!(
        "TOTAL    {t} — {all} verdicts — {} — {:.1} s",
        report.display(),
        took.as_secs_f64()
    );
}

/// `[N verdicts: a PASS, b FAIL, c PENDING]` over `verdicts`, naming only the verdicts present:
/// how many of TOTAL's verdicts a line carries.
fn tally(verdicts: &[Verdict]) -> String {
    let by: Vec<String> = [Verdict::Pass, Verdict::Fail, Verdict::Pending]
        .into_iter()
        .filter_map(|v| {
            let n = verdicts.iter().filter(|x| **x == v).count();
            (n > 0).then(|| format!("{n} {v}"))
        })
        .collect();
    let n = verdicts.len();
    let noun = if n == 1 { "verdict" } else { "verdicts" };
    if by.is_empty() {
        format!("[{n} {noun}]")
    } else {
        format!("[{n} {noun}: {}]", by.join(", "))
    }
}

/// `path` without a `DIR/..` step (`scenarios/../reports/loom.json` is `reports/loom.json`).
fn shown(path: &std::path::Path) -> String {
    use std::path::Component;
    let mut out: Vec<Component<'_>> = Vec::new();
    for c in path.components() {
        match (c, out.last()) {
            (Component::ParentDir, Some(Component::Normal(_))) => {
                out.pop();
            }
            (Component::CurDir, _) => {}
            _ => out.push(c),
        }
    }
    out.iter()
        .collect::<std::path::PathBuf>()
        .display()
        .to_string()
}

/// ` — REASON`, or nothing.
fn reason(reason: Option<&String>) -> String {
    reason.map(|x| format!(" — {x}")).unwrap_or_default()
}

/// Text already formatted by the library (the soak report), contained as every line is.
pub fn text(text: &str) {
    let _ = write!(
        std::io::stdout(),
        "{}",
        ticketflow_harness::contain::terminal(text)
    );
}
