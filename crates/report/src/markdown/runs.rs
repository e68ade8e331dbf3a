//! The Scenarios section: each scenario, its race drawn at READ COMMITTED, and every run's
//! evidence (reproduce command, lock waits, racers, rows, checks).

use std::fmt::Write as _;

use super::{md, DETAILS_DIR, PATHS_FILE};
use crate::{mermaid, Context, TicketLabels};
use ticketflow_core::store::postgres::IsolationLevel;
use ticketflow_harness::scenario::format::{RacerKind, Scenario};
use ticketflow_harness::scenario::{Evidence, LockWait, RunSetting, ScenarioRun};

/// "## Scenario runs" in REPORT.md: one evidence line per run (verdict, outcomes, rows, what
/// the barrier saw) and a link to the scenario's detail file.
pub(super) fn render_run_index(out: &mut String, scenarios: &[Scenario], runs: &[ScenarioRun]) {
    if runs.is_empty() {
        return;
    }
    let _ = writeln!(out, "## Scenario runs\n");
    let _ = writeln!(
        out,
        "One line per run; each scenario's file has its race diagram, reproduce command, lock \
         waits, racers, rows and checks. Paths every racer took: [{PATHS_FILE}]({DETAILS_DIR}/{PATHS_FILE}).\n"
    );
    for s in scenarios {
        let mine: Vec<&ScenarioRun> = runs.iter().filter(|r| r.scenario == s.name).collect();
        if mine.is_empty() {
            continue;
        }
        let _ = writeln!(
            out,
            "- [`{}`]({DETAILS_DIR}/{}):",
            s.name,
            super::scenario_file(&s.name)
        );
        for r in mine {
            let _ = writeln!(
                out,
                "  - {} {}: **{}** — {}",
                r.backend.name(),
                r.setting.label(),
                r.verdict,
                evidence_line(r)
            );
        }
    }
    out.push('\n');
}

/// One line of evidence for a run: outcomes, rows counted, the barrier's witness, or why it
/// did not pass.
fn evidence_line(r: &ScenarioRun) -> String {
    let c = super::paths::PathCounts::of(r);
    let counted: Vec<String> = [
        (c.created, "created"),
        (c.replay_lookup + c.replay_after_loss, "replayed"),
        (c.conflict, "conflict"),
        (c.errors, "errors"),
        (c.retries, "retries"),
    ]
    .iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, what)| format!("{n} {what}"))
    .collect();
    // A run that never raced (not run, or broken before its racers) has no racers to count.
    let mut parts = Vec::new();
    if !r.racers.is_empty() {
        parts.push(format!("{} racers: {}", r.racers.len(), counted.join(", ")));
    }
    // The barrier's witness (racers seen waiting, in pg_locks or in-process) is in the
    // scenario's file; here only whether it held.
    if let Some(barrier) = r.checks.iter().find(|c| c.name == "barrier") {
        parts.push(if barrier.passed() {
            "barrier held".to_string()
        } else {
            format!("barrier: {}", md(&barrier.detail))
        });
    }
    if let Some(failed) = r.checks.iter().find(|c| !c.passed()) {
        parts.push(format!("failed {}: {}", failed.name, md(&failed.detail)));
    }
    if let Some(reason) = &r.reason {
        parts.push(md(reason));
    }
    parts.join("; ")
}

/// One scenario's detail file: its description, its race at READ COMMITTED as a sequence
/// diagram, then each of its runs.
pub(super) fn render_scenario(out: &mut String, s: &Scenario, runs: &[ScenarioRun], ctx: &Context) {
    {
        let _ = writeln!(out, "# Scenario {}\n", s.name);
        let _ = writeln!(out, "{}\n", s.description.trim());
        let _ = writeln!(
            out,
            "File: `{}`. Racers: {}.\n",
            s.file.display(),
            s.racers.len()
        );
        let mine: Vec<&ScenarioRun> = runs.iter().filter(|r| r.scenario == s.name).collect();
        // The race at READ COMMITTED (PostgreSQL's default level), drawn where a reader sees it.
        let shown: Option<&ScenarioRun> = mine.iter().copied().find(|r| {
            r.setting
                == RunSetting::Postgres {
                    isolation: IsolationLevel::ReadCommitted,
                }
        });
        if let Some(d) = shown.and_then(|r| mermaid::sequence_diagram(r, &TicketLabels::for_run(r)))
        {
            let _ = writeln!(out, "The race on PostgreSQL at READ COMMITTED:\n\n{d}");
        }
        for r in mine {
            render_run(out, s, r, ctx, shown.is_some_and(|x| std::ptr::eq(x, r)));
        }
    }
}

/// One run in a `<details>` block: verdict, reason, reproduce command, the evidence of its
/// backend, racers, rows and checks. `drawn_above`: its diagram is already shown above.
fn render_run(out: &mut String, s: &Scenario, r: &ScenarioRun, ctx: &Context, drawn_above: bool) {
    let tickets = TicketLabels::for_run(r);
    let _ = writeln!(
        out,
        "<details><summary>{} ({}) — <b>{}</b></summary>\n",
        r.backend.name(),
        r.setting.label(),
        r.verdict
    );
    if let Some(reason) = &r.reason {
        let _ = writeln!(out, "Reason: {}\n", md(reason));
    }
    render_reproduce(out, s, r, ctx);
    match &r.evidence {
        Some(Evidence::Postgres { .. }) => {
            render_postgres_evidence(out, r);
            if !drawn_above {
                if let Some(d) = mermaid::sequence_diagram(r, &tickets) {
                    let _ = writeln!(out, "{d}");
                }
            }
        }
        Some(Evidence::Sqlite {
            observed_no_receipt,
            journal_mode,
            sqlite_version,
        }) => {
            let _ = writeln!(
                out,
                "SQLite {sqlite_version}, journal mode {journal_mode}; {observed_no_receipt} racer(s) saw no receipt at the barrier. Control flow only.\n"
            );
        }
        None => {}
    }
    render_racers(out, r, &tickets);
    render_rows_and_checks(out, r);
    let _ = writeln!(out, "</details>\n");
}

/// The `ticketflow scenario run` command line that reruns `r` alone.
fn render_reproduce(out: &mut String, s: &Scenario, r: &ScenarioRun, ctx: &Context) {
    let server = match r.setting {
        RunSetting::Postgres { .. } if ctx.custom_pg_url => {
            format!(" {} '{}'", ticketflow_core::flags::PG_URL, ctx.pg_url)
        }
        _ => String::new(),
    };
    let protocol = match ctx.protocol {
        ticketflow_core::protocol::Protocol::Savepoint => String::new(),
        p => format!(" {} {}", ticketflow_core::flags::IMPLEMENTATION, p.name()),
    };
    let _ = writeln!(
        out,
        "Reproduce: `ticketflow scenario run {} {}{server}{protocol}`\n",
        s.file.display(),
        r.setting.cli_flags()
    );
}

/// A PostgreSQL run's barrier: server, isolation, the controller's lock and the racers seen
/// waiting on it. Nothing when `r` has no PostgreSQL evidence.
fn render_postgres_evidence(out: &mut String, r: &ScenarioRun) {
    let Some(Evidence::Postgres {
        server_version,
        isolation,
        lock_mode,
        window,
        racers_as,
        lock_statement,
        waits,
        controller_pid,
        ..
    }) = &r.evidence
    else {
        return;
    };
    let _ = writeln!(
        out,
        "PostgreSQL {server_version}, isolation {isolation}, racers as {}, in a scratch \
         database created and dropped for the run. The controller held `{lock_statement}` \
         ({}: {window}); `pg_locks` showed {} of {} racers waiting before the release.\n",
        match racers_as {
            RacerKind::Threads => "threads",
            RacerKind::Processes => "separate processes",
        },
        lock_mode.name(),
        waits.len(),
        r.racer_count,
    );
    render_waits(out, waits, *controller_pid);
}

/// The racers' lock waits seen in `pg_locks`, with who blocked each.
fn render_waits(out: &mut String, waits: &[LockWait], controller_pid: i32) {
    if waits.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "| racer | wait event | lock mode requested | blocked by |\n|---|---|---|---|"
    );
    for w in waits {
        let others: Vec<String> = w
            .blocked_by
            .iter()
            .filter(|p| **p != controller_pid)
            .map(|p| format!("pid {p}"))
            .collect();
        let by = match (w.blocked_by.contains(&controller_pid), others.is_empty()) {
            (true, true) => "the controller".to_string(),
            (true, false) => format!("the controller, {}", others.join(", ")),
            (false, _) => others.join(", "),
        };
        let _ = writeln!(
            out,
            "| {} | {}/{} | {} | {} |",
            w.racer,
            w.wait_event_type.as_deref().unwrap_or("-"),
            w.wait_event.as_deref().unwrap_or("-"),
            w.mode,
            by
        );
    }
    out.push('\n');
}

/// What each racer got back: outcome, decision path, ticket label, HTTP status (or its error).
fn render_racers(out: &mut String, r: &ScenarioRun, tickets: &TicketLabels) {
    if !r.racers.is_empty() {
        let _ = writeln!(
            out,
            "| racer | tenant / key | outcome | path | ticket | HTTP |\n|---|---|---|---|---|---|"
        );
        for rc in &r.racers {
            let (outcome, path, ticket, http) = match &rc.result {
                Ok(o) => (
                    o.kind.to_string(),
                    o.path_label(),
                    o.ticket_id
                        .map(|t| tickets.label(t))
                        .unwrap_or_else(|| "-".into()),
                    o.http_status.to_string(),
                ),
                Err(e) => (
                    format!("error: {}", md(e)),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                ),
            };
            let _ = writeln!(
                out,
                "| {} | {} / {} | {} | {} | {} | {} |",
                rc.name,
                md(&rc.tenant),
                md(&rc.key),
                outcome,
                path,
                ticket,
                http,
            );
        }
        out.push('\n');
    }
}

/// The row counts by direct SQL and every check with its result.
fn render_rows_and_checks(out: &mut String, r: &ScenarioRun) {
    if !r.rows.is_empty() {
        let rows: Vec<String> = r.rows.iter().map(|(t, c)| format!("{t}: {c}")).collect();
        let _ = writeln!(
            out,
            "Rows (tickets/receipts/created events) by direct SQL: {}.\n",
            rows.join(", ")
        );
    }
    if !r.checks.is_empty() {
        let _ = writeln!(out, "| check | result | detail |\n|---|---|---|");
        for c in &r.checks {
            let _ = writeln!(
                out,
                "| {} | {} | {} |",
                c.name,
                if c.passed() { "ok" } else { "**FAILED**" },
                md(&c.detail)
            );
        }
        out.push('\n');
    }
}
