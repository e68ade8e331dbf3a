//! The Redis lease section: the `[lease]` scenarios' verdicts, the kill matrix's lease gate,
//! each run's lease evidence (tokens labelled `L1`, `L2`, never printed) and what the lease
//! scenarios cannot prove.

use std::fmt::Write as _;

use super::md;
use ticketflow_harness::killmatrix::{GateOutcome, KillMatrix};
use ticketflow_harness::scenario::lease::LeaseEvidence;
use ticketflow_harness::scenario::{Scenario, ScenarioRun};
use ticketflow_harness::verdict::Verdict;

const CANNOT_PROVE: &str = "\
- **A real Redis failover with lost writes is simulated**, not run: a lost lease is a `PEXPIRE` \
(expiry), a `FLUSHDB` of the lease database (lost data) or a `FLUSHDB` with `CLIENT KILL` of the \
holder's connection (a restart without persistence; Redis is shared, so it is not restarted). \
Replication lag, a split brain with two primaries each granting the lease, and clock drift \
between Redis nodes are not run.
- The holder is paused by the runner at one point (after its receipt lookup, before its \
inserts); other pause points are not raced with Redis in the loop.
- `redis-down` proves that requests go through without a lease when nothing listens; a Redis \
that answers slowly is covered only by the client's timeouts (`REDIS_TIMEOUT`), not raced.
- SQLite runs prove control flow only, as everywhere in this report.";

/// Verdict over the lease runs: FAIL beats PENDING beats PASS; PENDING when none ran.
fn verdict(runs: &[&ScenarioRun]) -> Verdict {
    if runs.iter().any(|r| r.verdict == Verdict::Fail) {
        Verdict::Fail
    } else if runs.is_empty() || runs.iter().any(|r| r.verdict == Verdict::Pending) {
        Verdict::Pending
    } else {
        Verdict::Pass
    }
}

/// Replaces every token in `text` by its label.
fn labelled(ev: &LeaseEvidence, text: &str) -> String {
    let mut out = text.to_string();
    for (_, token) in &ev.tokens {
        out = out.replace(token.as_str(), &ev.label(token));
    }
    out
}

/// The REPORT.md section on the Redis lease: the lease scenarios' table, the kill matrix's
/// lease gate, then each run's evidence.
///
/// Long because it writes one section top to bottom, each part from the same runs.
pub(super) fn render_lease(
    out: &mut String,
    scenarios: &[Scenario],
    runs: &[ScenarioRun],
    kill: Option<&KillMatrix>,
) {
    let lease_names: Vec<&str> = scenarios
        .iter()
        .filter(|s| s.lease.is_some())
        .map(|s| s.name.as_str())
        .collect();
    let mine: Vec<&ScenarioRun> = runs
        .iter()
        .filter(|r| lease_names.contains(&r.scenario.as_str()))
        .collect();
    let gate: Vec<_> = kill
        .map(|k| k.cells.iter().filter(|c| c.gate == "lease").collect())
        .unwrap_or_default();
    if mine.is_empty() && gate.is_empty() {
        return;
    }
    let _ = writeln!(out, "## Redis lease in front of the receipt\n");
    let _ = writeln!(
        out,
        "Verdict: **{}**. A short Redis lease per (tenant, key) may cut contention; it never \
         decides. Each scenario pauses the holder after its receipt lookup (a barrier the runner \
         controls), takes its lease away (expiry, flush, simulated restart) and waits until the \
         key is gone, lets a second request take a new lease and proceed, then lets the holder \
         go on: the receipt must still give one ticket, one receipt, one `ticket.created` event \
         and one id. Tokens are shown as `L1` (the holder's) and `L2` (the second request's).\n",
        verdict(&mine)
    );
    let _ = writeln!(
        out,
        "| scenario | event | backend | verdict | lease per racer | rows (A) | detail |\n|---|---|---|---|---|---|---|"
    );
    for r in &mine {
        let event = r
            .lease
            .as_ref()
            .map(|e| e.event.name())
            .or_else(|| {
                scenarios
                    .iter()
                    .find(|s| s.name == r.scenario)
                    .and_then(|s| s.lease)
                    .map(|l| l.event.name())
            })
            .unwrap_or("");
        let per_racer = r
            .lease
            .as_ref()
            .map(|e| {
                e.outcomes
                    .iter()
                    .map(|(n, o)| format!("{n}: {}", o.name()))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        let rows = r
            .rows
            .values()
            .next()
            .map(|c| format!("{}/{}/{}", c.tickets, c.receipts, c.created_events))
            .unwrap_or_default();
        let detail = match (&r.lease, &r.reason) {
            (Some(e), Some(why)) => labelled(e, why),
            (None, Some(why)) => why.clone(),
            _ => r
                .checks
                .iter()
                .find(|c| c.name == "lease")
                .map(|c| c.detail.clone())
                .unwrap_or_default(),
        };
        let _ = writeln!(
            out,
            "| {} | {event} | {} | **{}** | {} | {rows} | {} |",
            r.scenario,
            r.setting.label(),
            r.verdict,
            md(&per_racer),
            md(&strip_ids(&detail))
        );
    }
    out.push('\n');
    if !gate.is_empty() {
        let _ = writeln!(
            out,
            "Kill matrix, gate `lease` (scenarios `expire`, `two-tokens`, `flush`): a lease \
             variant must be killed, a real protocol must survive.\n"
        );
        let _ = writeln!(
            out,
            "| implementation | backend | lease gate | detail |\n|---|---|---|---|"
        );
        for c in gate
            .iter()
            .filter(|c| !matches!(c.outcome, GateOutcome::NotApplicable(_)))
        {
            let (status, detail) = match &c.outcome {
                GateOutcome::Killed(d) => ("killed", d.as_str()),
                GateOutcome::Survived => ("survived", ""),
                GateOutcome::Pending(d) => ("PENDING", d.as_str()),
                GateOutcome::NotApplicable(d) => ("n/a", d.as_str()),
            };
            let _ = writeln!(
                out,
                "| {} | {} | {status} | {} |",
                c.implementation.name(),
                c.backend,
                md(&strip_ids(detail))
            );
        }
        out.push('\n');
    }
    let _ = writeln!(out, "<details><summary>Lease evidence per run</summary>\n");
    for r in &mine {
        let Some(e) = &r.lease else { continue };
        let _ = writeln!(
            out,
            "**{} [{}]**: key `{}`, TTL {} ms, Redis `{}`.\n",
            r.scenario,
            r.setting.label(),
            e.key,
            e.ttl_ms,
            e.url
        );
        for op in &e.ops {
            let token = op
                .token
                .as_deref()
                .map(|t| format!(" {}", e.label(t)))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "- {}: `{}`{token} → {}",
                op.actor,
                op.op,
                md(&labelled(e, &op.result))
            );
        }
        if let Some(h) = &e.holder_after_old_release {
            let _ = writeln!(
                out,
                "- right after the old holder's release the key held: {}",
                h.as_deref()
                    .map(|t| e.label(t))
                    .unwrap_or_else(|| "nothing".into())
            );
        }
        if let Some(c) = r.checks.iter().find(|c| c.name == "barrier") {
            let _ = writeln!(out, "- runner: {}", md(&c.detail));
        }
        if let Some(s) = &e.simulated {
            let _ = writeln!(out, "- simulated: {s}");
        }
        out.push('\n');
    }
    let _ = writeln!(out, "</details>\n");
    let _ = writeln!(
        out,
        "What the lease scenarios cannot prove:\n\n{CANNOT_PROVE}\n"
    );
}

/// Drops the 8-hex ticket id prefixes a gate's detail may quote ("hold 1a2b3c4d, …"), so the
/// table does not change from run to run.
fn strip_ids(text: &str) -> String {
    text.split(' ')
        .map(|w| {
            let bare = w.trim_end_matches(',');
            if bare.len() == 8 && bare.chars().all(|c| c.is_ascii_hexdigit()) {
                w.replace(bare, "T?")
            } else {
                w.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}
