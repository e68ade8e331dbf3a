//! REPORT.md sections for black-box scenarios ([`ticketflow_harness::blackbox`]): the verdict table and each
//! scenario's evidence. Incidental values (ids, the `{run}` value, timestamps, UUIDs) are
//! replaced by stable labels so the report diffs cleanly between runs; `report.json` keeps
//! them. Whatever may quote the target (answers, errors, ids, the request's path) is written
//! as inline code ([`ticketflow_harness::contain::code`]), so a target's Markdown or HTML is shown, never
//! rendered.

use std::fmt::Write as _;

use regex::Regex;

use super::{anchor, md};
use ticketflow_harness::blackbox::{TargetOutcome, TargetRun};
use ticketflow_harness::contain::{block_fence, code};
use ticketflow_harness::verdict::Verdict;

/// Replaces a run's ids (`ID1`, `ID2`, … in racer order), its `{run}` value, ISO-8601
/// timestamps and UUIDs in `text`.
pub struct Stable {
    ids: Vec<String>,
    run_id: Option<String>,
    time: Regex,
    uuid: Regex,
}

impl Stable {
    /// Labels for `run`.
    pub fn for_run(run: &TargetRun) -> Self {
        let mut ids: Vec<String> = Vec::new();
        for r in &run.racers {
            for a in &r.attempts {
                if let Some(id) = &a.id {
                    if !ids.contains(id) {
                        ids.push(id.clone());
                    }
                }
            }
        }
        Stable {
            ids,
            run_id: run.evidence.as_ref().map(|e| e.run_id.clone()),
            time: Regex::new(
                r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:?\d{2})?",
            )
            .expect("valid regex"),
            uuid: Regex::new(
                r"(?i)\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b",
            )
            .expect("valid regex"),
        }
    }

    /// The label of an id (`ID2`), or the id itself when unknown.
    pub fn id(&self, id: &str) -> String {
        self.ids
            .iter()
            .position(|x| x == id)
            .map(|i| format!("ID{}", i + 1))
            .unwrap_or_else(|| id.to_string())
    }

    /// `text` with incidental values replaced.
    pub fn text(&self, text: &str) -> String {
        let mut out = text.to_string();
        // Longest ids first, so an id that contains another is replaced whole.
        let mut ids: Vec<(usize, &String)> = self.ids.iter().enumerate().collect();
        ids.sort_by_key(|(_, id)| std::cmp::Reverse(id.len()));
        for (i, id) in ids {
            // Short integer ids are replaced only where they stand alone.
            if id.chars().all(|c| c.is_ascii_digit()) {
                let re = Regex::new(&format!(r"\b{id}\b")).expect("digits are a valid regex");
                out = re.replace_all(&out, format!("ID{}", i + 1)).into_owned();
            } else {
                out = out.replace(id.as_str(), &format!("ID{}", i + 1));
            }
        }
        if let Some(run) = &self.run_id {
            out = out.replace(run.as_str(), "{run}");
        }
        let out = self.time.replace_all(&out, "<time>");
        self.uuid.replace_all(&out, "<uuid>").into_owned()
    }
}

/// The verdict table of black-box scenarios.
pub fn render_verdicts(out: &mut String, targets: &[TargetOutcome]) {
    if targets.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "## Verdicts: black-box targets (HTTP clients of a service)\n"
    );
    let _ = writeln!(
        out,
        "Racers are HTTP clients of running services, not library calls. A table-lock or advisory \
         barrier is proven on the target's PostgreSQL: the runner releases its lock only after it \
         has counted as many waiting lock requests as racers (it cannot tell which server session \
         serves which client). An HTTP-level barrier (keys in Redis or memory) opens every \
         connection and writes every request but its last byte, then releases them together: \
         nothing on the server proves the overlap, so such a PASS needs `--repeat`. Verdicts come \
         from the answers as the scenario's rules classify them, per intent (scope + key + body), \
         and the scenario's count queries. The negative controls in `scenarios/negative/` must \
         FAIL; `tests/integration/blackbox.rs` checks that they do.\n"
    );
    let _ = writeln!(
        out,
        "| scenario | racers | barrier | repeats | verdict | evidence, or why not |\n|---|---|---|---|---|---|"
    );
    for t in targets {
        let shown = t.shown();
        let why = match (t.verdict, shown) {
            (Verdict::Pass, Some(r)) => r
                .evidence_line
                .as_deref()
                .map(|l| Stable::for_run(r).text(l))
                .unwrap_or_default(),
            (_, Some(r)) => Stable::for_run(r).text(t.reason.as_deref().unwrap_or_default()),
            (_, None) => t.reason.clone().unwrap_or_default(),
        };
        let _ = writeln!(
            out,
            "| [{}]({}/{}#{}) | {} | {} | {} | **{}** | {} |",
            t.scenario,
            super::DETAILS_DIR,
            super::BLACK_BOX_FILE,
            anchor(&t.scenario),
            shown.map(|r| r.racers.len()).unwrap_or(0),
            t.runs
                .iter()
                .find_map(|r| r.evidence.as_ref().map(|e| e.barrier.clone()))
                .unwrap_or_else(|| t.barrier.clone()),
            repeats(t),
            t.verdict,
            code(&excerpt(&why, 400))
        );
    }
    out.push('\n');
}

/// Every black-box run's `{run}` id, repeat by repeat, as a table (nothing without black-box
/// scenarios): the value the service saw wherever the scenario's templates put `{run}`, so a
/// FAIL can be found in the service's logs. A run that did not start has none (`-`). These
/// ids change from run to run, so only a report of given files shows them here.
pub fn render_run_ids(out: &mut String, targets: &[TargetOutcome]) {
    if targets.is_empty() {
        return;
    }
    let _ = writeln!(out, "### Black-box runs and their `{{run}}` ids\n");
    let _ = writeln!(
        out,
        "Each run sent its own `{{run}}` value wherever the scenario's templates use it (keys, \
         headers, bodies): search the service's logs for it to match a run, a FAIL above all, \
         with what the service did.\n"
    );
    let _ = writeln!(
        out,
        "| scenario | repeat (or schedule) | verdict | `{{run}}` id |\n|---|---|---|---|"
    );
    let run_id = |r: &TargetRun| {
        r.evidence.as_ref().map_or_else(
            || "- (did not start)".to_string(),
            |e| format!("`{}`", md(&e.run_id)),
        )
    };
    for t in targets {
        if t.explored() && t.runs.len() > 1 {
            // Explored schedules: the failing ones first, then the first ones run, at most
            // SHOWN_SCHEDULES rows; report.json has every one.
            let mut shown: Vec<&TargetRun> = t
                .runs
                .iter()
                .filter(|r| r.verdict != Verdict::Pass)
                .collect();
            shown.extend(t.runs.iter().filter(|r| r.verdict == Verdict::Pass));
            let more = t.runs.len().saturating_sub(SHOWN_SCHEDULES);
            for r in shown.into_iter().take(SHOWN_SCHEDULES) {
                let _ = writeln!(
                    out,
                    "| {} | schedule `{}` | **{}** | {} |",
                    md(&t.scenario),
                    r.evidence
                        .as_ref()
                        .and_then(|e| e.schedule_id.as_deref())
                        .unwrap_or("-"),
                    r.verdict,
                    run_id(r)
                );
            }
            if more > 0 {
                let _ = writeln!(
                    out,
                    "| {} | … and {more} more schedules ({} in all, {} failing) | | every one in report.json |",
                    md(&t.scenario),
                    t.runs.len(),
                    t.failures
                );
            }
            continue;
        }
        for (n, r) in t.runs.iter().enumerate() {
            let _ = writeln!(
                out,
                "| {} | {} | **{}** | {} |",
                md(&t.scenario),
                n + 1,
                r.verdict,
                run_id(r)
            );
        }
    }
    out.push('\n');
}

/// At most this many explored schedules are listed by [`render_run_ids`].
pub const SHOWN_SCHEDULES: usize = 5;

fn repeats(t: &TargetOutcome) -> String {
    if t.runs.len() <= 1 {
        return t.runs.len().to_string();
    }
    let counted = ticketflow_harness::verdict::pass_fail_not_run(t.passes, t.failures, t.pending);
    if t.explored() {
        return format!("{} schedules: {counted}", t.runs.len());
    }
    format!(
        "{}: {counted} (flake rate {:.0}%)",
        t.runs.len(),
        t.flake_rate * 100.0
    )
}

fn excerpt(text: &str, n: usize) -> String {
    ticketflow_harness::blackbox::excerpt(text, n)
}

/// Each black-box scenario's evidence: the run shown (the first failing repeat, else the
/// last), its checks, distinct answers and racers; for a failing interposed schedule its
/// steps as the store saw them, as a Mermaid sequence diagram, and where its
/// isolation-tester spec is.
pub fn render_details(
    out: &mut String,
    targets: &[TargetOutcome],
    descriptions: &[(String, String)],
) {
    if targets.is_empty() {
        return;
    }
    let _ = writeln!(out, "## Black-box scenarios\n");
    for t in targets {
        let _ = writeln!(out, "### {}\n", t.scenario);
        if let Some((_, d)) = descriptions.iter().find(|(n, _)| n == &t.scenario) {
            let _ = writeln!(out, "{}\n", d.trim());
        }
        let _ = writeln!(
            out,
            "File: {}. Verdict: **{}**{}.\n",
            code(&t.file),
            t.verdict,
            t.reason
                .as_deref()
                .map(|r| format!(" ({})", code(&excerpt(r, 300))))
                .unwrap_or_default()
        );
        if let Some(r) = t.shown() {
            render_run(out, r);
        }
        if let (Some(f), Some(r)) = (&t.failing_schedule, t.shown()) {
            render_failing_schedule(out, f, &Stable::for_run(r));
        }
    }
}

/// A failing interposed schedule: its id, the replay command, the Mermaid diagram of its
/// steps and its isolation-tester spec's file (or why it has none). Incidental values in the
/// diagram are replaced as in the rest of the run ([`Stable`]).
fn render_failing_schedule(
    out: &mut String,
    f: &ticketflow_harness::blackbox::FailingSchedule,
    stable: &Stable,
) {
    let _ = writeln!(
        out,
        "Failing schedule {}, as the store saw it (replay: {}):\n",
        code(&f.schedule_id),
        code(&f.replay)
    );
    // Stable's placeholders are written with Mermaid's entity codes, as the diagram's own
    // text is, so they are not read as HTML tags.
    let diagram = stable
        .text(&f.mermaid)
        .replace("<uuid>", "#lt;uuid#gt;")
        .replace("<time>", "#lt;time#gt;");
    // The fence outruns any backtick run in the statements the diagram quotes.
    let fence = block_fence(&diagram);
    let _ = writeln!(out, "{fence}mermaid\n{diagram}{fence}\n");
    let spec = match (&f.isolation_spec_path, &f.isolation_spec_missing) {
        (Some(p), _) => code(&p.display().to_string()),
        (None, Some(why)) => format!("none: {}", md(why)),
        (None, None) => "not written (its text is in report.json)".into(),
    };
    let _ = writeln!(
        out,
        "Isolation-tester spec of its PostgreSQL steps: {spec}.\n"
    );
}

/// One run of a black-box scenario: its evidence, the PASS line, distinct answers, checks,
/// racers and counts.
fn render_run(out: &mut String, r: &TargetRun) {
    let stable = Stable::for_run(r);
    render_evidence(out, r);
    if let Some(line) = &r.evidence_line {
        let _ = writeln!(out, "PASS: {}\n", code(&stable.text(line)));
    }
    if r.verdict != Verdict::Pass && !r.answers.is_empty() {
        let _ = writeln!(
            out,
            "Distinct final answers:\n\n| racers | outcome | answer |\n|---|---|---|"
        );
        for g in &r.answers {
            let _ = writeln!(
                out,
                "| {}× ({}) | {} | {} |",
                g.count,
                g.racers.join(", "),
                g.kind,
                code(&stable.text(&g.summary))
            );
        }
        out.push('\n');
    }
    if !r.checks.is_empty() {
        let _ = writeln!(out, "| check | result | detail |\n|---|---|---|");
        for c in &r.checks {
            let (result, detail) = match (c.passed(), c.follows_from) {
                (true, _) => ("ok".to_string(), stable.text(&c.detail)),
                (false, Some(from)) => (
                    format!("**FAILED** (follows from `{from}`)"),
                    excerpt(&stable.text(&c.detail), 160),
                ),
                (false, None) => ("**FAILED**".into(), stable.text(&c.detail)),
            };
            let _ = writeln!(out, "| {} | {result} | {} |", c.name, code(&detail));
        }
        out.push('\n');
    }
    render_racers(out, r, &stable);
    if !r.counts.is_empty() {
        let seen: Vec<String> = r
            .counts
            .iter()
            .map(|c| {
                format!(
                    "{} = {} (expected {})",
                    c.name,
                    c.counted
                        .as_ref()
                        .map(|v| v.to_string())
                        .unwrap_or_else(|e| e.clone()),
                    c.expected
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "Counted by the scenario's SQL: {}.\n",
            code(&seen.join(", "))
        );
    }
}

/// The barrier, the target database and the endpoints of run `r`.
fn render_evidence(out: &mut String, r: &TargetRun) {
    if let Some(e) = &r.evidence {
        let _ = writeln!(
            out,
            "Barrier: {}.{} Target database: {}{}. Endpoints: {}{}.\n",
            e.barrier,
            if e.server_side {
                ""
            } else {
                " **No server-side proof**: the requests were released together at the HTTP level."
            },
            e.server_version
                .as_deref()
                .map(|v| format!("PostgreSQL {}", code(v)))
                .unwrap_or_else(|| "none (no database needed)".into()),
            e.isolation
                .as_deref()
                .map(|i| format!(", default_transaction_isolation {}", code(i)))
                .unwrap_or_default(),
            e.base_urls.len(),
            if e.services.is_empty() {
                String::new()
            } else {
                format!(
                    " (started by the runner: {})",
                    e.services
                        .iter()
                        .map(|s| format!("`{}`", s.name))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        );
    }
}

/// Each racer's first and final answers, in a `<details>` block.
fn render_racers(out: &mut String, r: &TargetRun, stable: &Stable) {
    if !r.racers.is_empty() {
        let _ = writeln!(
            out,
            "<details><summary>Racers: first and final answers</summary>\n\n| racer | wave | scope / key | request | first answer | final answer | attempts | id |\n|---|---|---|---|---|---|---|---|"
        );
        for rc in &r.racers {
            let first = rc.attempts.first().expect("one attempt at least");
            let last = rc.last();
            let show = |a: &ticketflow_harness::blackbox::Attempt| match &a.answer {
                Ok(x) => format!("{} {}", x.status, a.kind),
                Err(e) => format!("error: {}", excerpt(e, 80)),
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} / {} | {} | {} | {} | {} | {} |",
                rc.name,
                rc.wave,
                md(rc.scope.as_deref().unwrap_or("-")),
                md(&rc.key),
                code(&stable.text(&rc.request)),
                code(&show(first)),
                code(&show(last)),
                rc.attempts.len(),
                rc.id()
                    .map(|i| code(&stable.id(i)))
                    .unwrap_or_else(|| "-".into())
            );
        }
        let _ = writeln!(out, "\n</details>\n");
    }
}
