//! A black-box outcome in words: the answers grouped as the report shows them, which
//! response headers the text shows, and the summary the terminal prints.

use super::format::TargetScenario;
use super::{AnswerGroup, RacerRun};
use crate::verdict::Verdict;

/// Identical final answers with their racers, largest group first; each summary shows the
/// headers [`super::summary::shown_header`] names.
pub(crate) fn group_answers(scenario: &TargetScenario, racers: &[RacerRun]) -> Vec<AnswerGroup> {
    let mut groups: Vec<AnswerGroup> = Vec::new();
    for r in racers {
        let last = r.last();
        let summary = match &last.answer {
            Ok(a) => {
                let headers: Vec<String> = a
                    .headers
                    .iter()
                    .filter(|(n, _)| super::summary::shown_header(scenario, n))
                    .map(|(n, v)| format!("{n}: {v}"))
                    .collect();
                format!(
                    "HTTP {}{}{}{}",
                    a.status,
                    if headers.is_empty() {
                        String::new()
                    } else {
                        format!(" [{}]", headers.join("; "))
                    },
                    if a.body_excerpt.is_empty() {
                        String::new()
                    } else {
                        format!(" {}", a.body_excerpt)
                    },
                    last.note
                        .as_ref()
                        .map(|n| format!(" ({n})"))
                        .unwrap_or_default()
                )
            }
            Err(e) => format!("no answer: {e}"),
        };
        match groups
            .iter_mut()
            .find(|g| g.summary == summary && g.kind == last.kind)
        {
            Some(g) => {
                g.count += 1;
                g.racers.push(r.name.clone());
            }
            None => groups.push(AnswerGroup {
                count: 1,
                kind: last.kind,
                summary,
                racers: vec![r.name.clone()],
            }),
        }
    }
    groups.sort_by_key(|g| std::cmp::Reverse(g.count));
    groups
}

/// Whether the text output shows a response header named `name`: the ones the verdict reads
/// (content type, location, retry-after, the replay marker, the id header and every header a
/// rule names) and any whose name looks like an idempotency or replay marker (`idempot` or
/// `replay`, case-insensitive), so a service's own marker is seen without curl. `--json` and
/// report.json keep every header whatever this says.
pub fn shown_header(scenario: &TargetScenario, name: &str) -> bool {
    let t = &scenario.target;
    let lower = name.to_ascii_lowercase();
    if lower.contains("idempot") || lower.contains("replay") {
        return true;
    }
    let fixed = [
        "content-type",
        "location",
        "retry-after",
        ticketflow_core::wire::REPLAYED_HEADER,
    ];
    let by_rule = t
        .rules
        .iter()
        .filter_map(|r| r.header.as_ref().map(|h| h.0.as_str()));
    let by_id = match &t.id {
        super::rules::IdSource::Header { name, .. } => Some(name.as_str()),
        _ => None,
    };
    fixed
        .into_iter()
        .chain(by_rule)
        .chain(by_id)
        .any(|x| x.eq_ignore_ascii_case(name))
}

/// The terminal summary of a black-box scenario: one line (verdict, repeats, evidence or
/// reason); for a FAIL also the distinct final answers of the first failing repeat and its
/// failed checks, follow-on failures named in one line.
pub fn summary_text(t: &super::TargetOutcome) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let repeats = if t.runs.len() > 1 && t.explored() {
        // Runs, not schedules: `auto` adds runs whose first commands overlap, which the
        // coverage line counts apart from the schedules.
        format!(
            " [{} explored runs: {}]",
            t.runs.len(),
            crate::verdict::pass_fail_not_run(t.passes, t.failures, t.pending)
        )
    } else if t.runs.len() > 1 {
        format!(
            " [{} repeats: {} pass, {} fail, flake rate {:.0}%]",
            t.runs.len(),
            t.passes,
            t.failures,
            t.flake_rate * 100.0
        )
    } else {
        String::new()
    };
    let mut line = match (t.verdict, t.shown()) {
        (Verdict::Pass, Some(r)) => r.evidence_line.clone().unwrap_or_default(),
        _ => t.reason.clone().unwrap_or_default(),
    };
    if let Some(c) = &t.coverage {
        line = format!("{line}; explored: {c}");
    }
    let _ = writeln!(
        out,
        "{:<8} {:<9} {:<26} {}{repeats} — {line}",
        t.verdict.to_string(),
        "target",
        format!("barrier: {}", t.barrier),
        t.scenario
    );
    if t.verdict == Verdict::Fail {
        if let Some(r) = t.shown() {
            let _ = writeln!(out, "         distinct final answers:");
            for g in &r.answers {
                let _ = writeln!(
                    out,
                    "           {}× {:<11} {} ({})",
                    g.count,
                    g.kind.name(),
                    g.summary,
                    g.racers.join(", ")
                );
            }
            let follow: Vec<&str> = r
                .checks
                .iter()
                .filter(|c| !c.passed() && c.follows_from.is_some())
                .map(|c| c.name)
                .collect();
            for c in r
                .checks
                .iter()
                .filter(|c| !c.passed() && c.follows_from.is_none())
            {
                let _ = writeln!(out, "         FAILED {}: {}", c.name, c.detail);
            }
            schedule_text(&mut out, r);
            if let Some(f) = &t.failing_schedule {
                failing_schedule_text(&mut out, f);
            }
            if !follow.is_empty() {
                let _ = writeln!(
                    out,
                    "         also failed, explained by the errors above: {}",
                    follow.join(", ")
                );
            }
        }
    }
    out
}

/// The steps of an interposed run as the store saw them, one line each:
/// `A  postgres#3  INSERT INTO orders … [params] → T`.
fn schedule_text(out: &mut String, run: &super::TargetRun) {
    use std::fmt::Write as _;
    let Some(e) = &run.evidence else { return };
    let Some(id) = &e.schedule_id else { return };
    let _ = writeln!(out, "         schedule {id}, as the store saw it:");
    for w in &e.waves {
        let Some(s) = &w.schedule else { continue };
        for step in &s.steps {
            let params = if step.params.is_empty() {
                String::new()
            } else {
                format!(" {:?}", step.params)
            };
            let _ = writeln!(
                out,
                "           {} {}#{} {}{} → {}{}",
                crate::interpose::explore::racer_letter(step.racer),
                step.store.name(),
                step.session,
                crate::blackbox::excerpt(&step.text, 120),
                params,
                step.result,
                match (step.blocked, step.quiescent) {
                    (true, true) => " (waited for a lock)",
                    (true, false) => " (waited for a lock; not quiescent)",
                    (false, true) => "",
                    (false, false) => " (not quiescent)",
                }
            );
        }
    }
}

/// The failing schedule's Mermaid diagram (indented, to paste into any Mermaid renderer) and
/// where its isolation-tester spec was written, or why it was not.
fn failing_schedule_text(out: &mut String, f: &super::FailingSchedule) {
    use std::fmt::Write as _;
    let _ = writeln!(
        out,
        "         schedule {} as a Mermaid sequence diagram:",
        f.schedule_id
    );
    for line in f.mermaid.lines() {
        let _ = writeln!(out, "           {line}");
    }
    let spec = match (
        &f.isolation_spec_path,
        &f.isolation_spec,
        &f.isolation_spec_missing,
    ) {
        (Some(path), _, _) => format!("written to {}", path.display()),
        (None, _, Some(why)) => format!("none: {why}"),
        (None, Some(_), None) => format!(
            "not written (give {}, for isolation-specs/ beside it, or {} DIR)",
            ticketflow_core::flags::REPORT,
            ticketflow_core::flags::EXPORT_ISOLATION_SPEC
        ),
        (None, None, None) => "none".into(),
    };
    let _ = writeln!(
        out,
        "         isolation-tester spec of its PostgreSQL steps: {spec}"
    );
}
