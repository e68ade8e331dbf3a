//! A check's outcome as the lines printed on the terminal and as REPORT.md (with the minimal
//! failing history as a Mermaid sequence diagram) and JUnit XML.

use std::fmt::Write as _;

use quick_xml::events::{BytesDecl, BytesEnd, BytesStart, BytesText, Event};
use quick_xml::Writer;
use ticketflow_harness::blackbox::RacerRun;
use ticketflow_harness::check::run::{CheckOutcome, Failure};
use ticketflow_harness::verdict::Verdict;

/// The terminal summary: the verdict line, the coverage, and for a FAIL the minimal history,
/// the file that replays it, how often its replays failed, and curl lines.
pub fn summary_lines(outcome: &CheckOutcome) -> Vec<String> {
    let mut out = vec![format!(
        "{} check {}{}",
        outcome.verdict,
        outcome.file,
        outcome
            .reason
            .as_ref()
            .map(|r| format!(": {r}"))
            .unwrap_or_default()
    )];
    out.extend(
        outcome
            .coverage
            .lines()
            .into_iter()
            .map(|l| format!("  {l}")),
    );
    if let Some(f) = &outcome.failure {
        out.extend(failure_lines(f));
    }
    out
}

fn failure_lines(f: &Failure) -> Vec<String> {
    let mut out = vec![format!(
        "  minimal failing history ({} request(s), shrunk from {} in {} re-runs{}):",
        f.requests,
        f.original_requests,
        f.shrink_runs,
        if f.shrink_budget_spent {
            ", stopped at the shrink budget"
        } else {
            ""
        }
    )];
    out.extend(f.steps.iter().map(|s| format!("    {s}")));
    out.push(format!(
        "  it failed {} of {} replays of the written file's history",
        f.replay_failures, f.replays
    ));
    match (&f.file, &f.file_error) {
        (Some(p), _) => out.push(format!(
            "  replay it: ticketflow scenario run {}",
            p.display()
        )),
        (None, e) => out.push(format!(
            "  the replay file was not written: {}",
            e.as_deref().unwrap_or("no reason given")
        )),
    }
    if let Some(id) = &f.schedule_id {
        out.push(format!("  interposed schedule of the failing replay: {id}"));
    }
    out.push("  its requests as curl (one failing replay's keys):".into());
    for c in &f.curl {
        out.extend(c.lines().map(|l| format!("    {l}")));
    }
    out
}

/// The minimal failing history as a Mermaid `sequenceDiagram` (without the fence): one
/// message per request and its answer, concurrent groups in `par` blocks, settles as notes.
pub fn sequence_diagram(f: &Failure) -> String {
    let mut out = String::from(
        "sequenceDiagram\n    participant C as client\n    participant S as service\n",
    );
    let mut wave = 0u32;
    let mut by_wave: std::collections::BTreeMap<u32, Vec<&RacerRun>> = Default::default();
    for r in &f.run.racers {
        by_wave.entry(r.wave).or_default().push(r);
    }
    let text = |r: &RacerRun| {
        (
            format!(
                "{}: {}/{} body {}",
                r.name,
                r.scope.clone().unwrap_or_default(),
                r.key,
                &r.intent_sha256.get(..8).unwrap_or("")
            ),
            r.answer_line(),
        )
    };
    for (w, racers) in &by_wave {
        wave = *w;
        let par = racers.len() > 1;
        for (i, r) in racers.iter().enumerate() {
            if par {
                let _ = writeln!(
                    out,
                    "    {} sent together",
                    if i == 0 { "par" } else { "and" }
                );
            }
            let (req, ans) = text(r);
            let _ = writeln!(out, "    C->>S: {}", req.replace(';', ","));
            let _ = writeln!(out, "    S-->>C: {}", ans.replace(';', ","));
        }
        if par {
            let _ = writeln!(out, "    end");
        }
    }
    let _ = writeln!(
        out,
        "    Note over C,S: after wave {wave}: {}",
        f.reason
            .replace(';', ",")
            .chars()
            .take(160)
            .collect::<String>()
    );
    out
}

/// REPORT.md of a check.
pub fn markdown(outcome: &CheckOutcome) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# Check: {}\n", outcome.file);
    let _ = writeln!(
        out,
        "**{}**{}\n",
        outcome.verdict,
        outcome
            .reason
            .as_ref()
            .map(|r| format!(": {r}"))
            .unwrap_or_default()
    );
    let _ = writeln!(out, "## Coverage\n");
    for l in outcome.coverage.lines() {
        let _ = writeln!(out, "- {l}");
    }
    if let Some(f) = &outcome.failure {
        let _ = writeln!(out, "\n## Minimal failing history\n");
        for s in &f.steps {
            let _ = writeln!(out, "- {s}");
        }
        let _ = writeln!(out, "\n```mermaid\n{}```\n", sequence_diagram(f));
        if let Some(d) = ticketflow_harness::blackbox::diagram::schedule_diagram(&f.run) {
            let _ = writeln!(
                out,
                "The failing replay's interposed schedule:\n\n```mermaid\n{d}```\n"
            );
        }
        for l in failure_lines(f).iter().skip(1 + f.steps.len()) {
            let _ = writeln!(out, "{}", l.trim_start());
        }
    }
    let _ = writeln!(out, "\n## Histories\n");
    for h in &outcome.histories {
        let _ = writeln!(
            out,
            "- history {} ({}): {}{}",
            h.number,
            h.run_id.as_deref().unwrap_or("-"),
            h.verdict,
            h.reason
                .as_ref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        );
    }
    out
}

/// JUnit XML of a check: one test suite with one test case, a `<failure>` for a FAIL and a
/// `<skipped>` for a PENDING, with the reason (secrets masked, hazards escaped by
/// [`crate::junit::xml_safe`]).
pub fn junit(outcome: &CheckOutcome) -> String {
    let mut w = Writer::new_with_indent(Vec::new(), b' ', 2);
    let mut put = |e: Event<'_>| w.write_event(e).expect("writing XML to memory cannot fail");
    put(Event::Decl(BytesDecl::new("1.0", Some("UTF-8"), None)));
    let count = |v: Verdict| usize::from(outcome.verdict == v).to_string();
    let seconds = format!("{:.3}", outcome.coverage.seconds);
    let mut suite = BytesStart::new("testsuite");
    suite.push_attribute(("name", "ticketflow check"));
    suite.push_attribute(("tests", "1"));
    suite.push_attribute(("failures", count(Verdict::Fail).as_str()));
    suite.push_attribute(("errors", "0"));
    suite.push_attribute(("skipped", count(Verdict::Pending).as_str()));
    suite.push_attribute(("time", seconds.as_str()));
    put(Event::Start(suite));
    let file = crate::junit::xml_safe(&outcome.file);
    let mut case = BytesStart::new("testcase");
    case.push_attribute(("classname", "check"));
    case.push_attribute(("name", file.as_str()));
    case.push_attribute(("time", seconds.as_str()));
    let reason = crate::junit::xml_safe(outcome.reason.as_deref().unwrap_or(""));
    match outcome.verdict {
        Verdict::Pass => put(Event::Empty(case)),
        v => {
            put(Event::Start(case));
            let tag = if v == Verdict::Fail {
                "failure"
            } else {
                "skipped"
            };
            let mut e = BytesStart::new(tag);
            e.push_attribute(("message", reason.as_str()));
            put(Event::Start(e));
            let text = summary_lines(outcome).join("\n");
            put(Event::Text(BytesText::new(&crate::junit::xml_safe(&text))));
            put(Event::End(BytesEnd::new(tag)));
            put(Event::End(BytesEnd::new("testcase")));
        }
    }
    put(Event::End(BytesEnd::new("testsuite")));
    String::from_utf8(w.into_inner()).expect("quick-xml writes UTF-8") + "\n"
}
