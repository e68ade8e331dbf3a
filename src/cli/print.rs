//! What the commands print on stdout: one summary line per run, suite or part; JSON for the
//! ticket commands. A closed pipe (`… | head`) is the reader's choice, not an error.

use std::io::Write as _;

use ticketflow::scenario::ScenarioRun;
use ticketflow::target::TargetOutcome;
use ticketflow::verify::{Finished, VerifyOutcome};

/// Pretty JSON on stdout.
pub fn json(value: &impl serde::Serialize) {
    let text = serde_json::to_string_pretty(value).expect("outcome types serialize");
    let _ = writeln!(std::io::stdout(), "{text}");
}

/// One line per run: verdict, backend, scenario and the reason when not PASS.
pub fn run_summary(r: &ScenarioRun) {
    println!(
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
    print!("{}", ticketflow::target::check::summary_text(t));
}

/// `scenario run`'s output: every run, then every black-box scenario, as summary lines or
/// (with `json`) one JSON object per line.
pub fn run_files(runs: &[ScenarioRun], targets: &[TargetOutcome], json: bool) {
    for r in runs {
        if json {
            println!("{}", serde_json::to_string(r).expect("runs serialize"));
        } else {
            run_summary(r);
        }
    }
    for t in targets {
        if json {
            println!("{}", serde_json::to_string(t).expect("outcomes serialize"));
        } else {
            target_summary(t);
        }
    }
}

/// One part of `verify` as soon as it finished, flushed at once: what was printed survives
/// an interrupt, whether stdout is a terminal, a pipe or a file.
pub fn finished(part: Finished<'_>) {
    match part {
        Finished::Run(r) => run_summary(r),
        Finished::Target(t) => target_summary(t),
        Finished::Suite(s) => println!(
            "{:<8} {:<9} {:<26} property suite {} ({} cases, seed {}){}",
            s.verdict.to_string(),
            s.backend_name(),
            s.implementation.name(),
            s.suite,
            s.cases,
            s.seed,
            reason(s.reason.as_ref())
        ),
        Finished::KillMatrix(k) => {
            let problems = k.problems();
            let problems = if problems.is_empty() {
                String::new()
            } else {
                format!(" — {}", problems.join("; "))
            };
            let verdict = k.verdict().to_string();
            println!("{verdict:<8} kill matrix: {}{problems}", k.summary());
        }
        Finished::Faults(f) => println!(
            "{:<8} faults and bad input: {} faults injected, {} inputs tried",
            f.verdict().to_string(),
            f.faults_injected,
            f.inputs_tried
        ),
        Finished::Soak(s) => {
            let f = &s.figures;
            if f.requests == 0 {
                println!(
                    "{:<8} soak: did not run{}",
                    s.verdict.to_string(),
                    reason(s.reason.as_ref())
                );
            } else {
                println!(
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
        println!(
            "-        not selected by --filter: {} part(s) (listed in the report)",
            outcome.not_selected.len()
        );
    }
    if outcome.kill.is_none() && no_kill_matrix {
        println!("PENDING  kill matrix: skipped (--no-kill-matrix)");
    }
    for spec in &outcome.specs {
        println!(
            "FAIL     {} [{}]: race exported to {}",
            spec.scenario,
            spec.setting,
            spec.path.display()
        );
    }
}

/// The last line of `verify`: the totals REPORT.md's headline shows, where the report is and
/// how long the run took, e.g. `TOTAL    412 PASS, 0 FAIL, 2 PENDING — REPORT.md — 58.2 s`.
pub fn verify_totals(outcome: &VerifyOutcome, report: &std::path::Path, took: std::time::Duration) {
    println!(
        "TOTAL    {} — {} — {:.1} s",
        outcome.totals,
        report.display(),
        took.as_secs_f64()
    );
}

/// ` — REASON`, or nothing.
fn reason(reason: Option<&String>) -> String {
    reason.map(|x| format!(" — {x}")).unwrap_or_default()
}

/// Text already formatted by the library (the soak report), as is.
pub fn text(text: &str) {
    let _ = write!(std::io::stdout(), "{text}");
}
