//! The checks that turn a finished race into a verdict. Pure functions over what the runner
//! recorded and counted; the same checks run on every backend.

use std::collections::{BTreeMap, BTreeSet};

use uuid::Uuid;

use super::format::Scenario;
use super::{Check, RacerRecord, Verdict};
use ticketflow_core::domain::OutcomeKind;
use ticketflow_core::store::RowCounts;

/// Receipts found by direct SQL for one (tenant, key): (payload hash, ticket id) each.
pub(crate) type ReceiptRows = BTreeMap<(String, String), Vec<(String, Uuid)>>;

/// What the database holds after the race, read by direct SQL.
#[derive(Debug, Clone, Default)]
pub(crate) struct GroundTruth {
    /// Row counts per tenant that appears in the scenario.
    pub rows: BTreeMap<String, RowCounts>,
    /// Receipts per (tenant, key) that appears among the racers.
    pub receipts: ReceiptRows,
    /// A black-box target: its receipts' layout is its own, so convergence is judged from
    /// what the clients saw (`receipts` stays empty) and the rows counted.
    pub black_box: bool,
}

/// Runs every check. `barrier` is the runner's own barrier check, placed first.
pub(crate) fn evaluate(
    scenario: &Scenario,
    barrier: Check,
    racers: &[RacerRecord],
    truth: &GroundTruth,
) -> Vec<Check> {
    let mut checks = vec![barrier, racer_errors(racers)];
    checks.extend(outcomes(scenario, racers));
    checks.extend(outcome_counts(scenario, racers));
    checks.extend(same_ticket(scenario, racers));
    checks.extend(distinct_tickets(scenario, racers));
    checks.push(if truth.black_box {
        client_convergence(racers)
    } else {
        convergence(scenario, racers, truth)
    });
    checks.extend(rows(scenario, truth));
    checks
}

/// The outcome kind racer `name` got, if it got one.
fn kind_of(racers: &[RacerRecord], name: &str) -> Option<OutcomeKind> {
    racers
        .iter()
        .find(|r| r.name == name)
        .and_then(|r| r.result.as_ref().ok().map(|o| o.kind))
}

/// The ticket id racer `name` got, if it got one.
fn id_of(racers: &[RacerRecord], name: &str) -> Option<Uuid> {
    racers
        .iter()
        .find(|r| r.name == name)
        .and_then(|r| r.result.as_ref().ok().and_then(|o| o.ticket_id))
}

/// Every racer got an outcome.
fn racer_errors(racers: &[RacerRecord]) -> Check {
    let errors: Vec<String> = racers
        .iter()
        .filter_map(|r| r.result.as_ref().err().map(|e| format!("{}: {e}", r.name)))
        .collect();
    Check::of_problems(
        "racer errors",
        errors,
        format!("all {} racers returned an outcome", racers.len()),
    )
}

/// Allowed outcomes per racer, when the scenario lists any.
fn outcomes(scenario: &Scenario, racers: &[RacerRecord]) -> Option<Check> {
    let mut problems = Vec::new();
    for (name, allowed) in &scenario.expect.outcomes {
        match kind_of(racers, name) {
            Some(k) if allowed.contains(&k) => {}
            got => problems.push(format!(
                "{name}: expected {}, got {}",
                join_kinds(allowed),
                got.map(|k| k.to_string())
                    .unwrap_or_else(|| "no outcome".into())
            )),
        }
    }
    (!scenario.expect.outcomes.is_empty()).then(|| {
        Check::of_problems(
            "outcomes",
            problems,
            format!("{} racers as expected", scenario.expect.outcomes.len()),
        )
    })
}

/// How many racers created, replayed, got a conflict, for the counts the scenario expects.
fn outcome_counts(scenario: &Scenario, racers: &[RacerRecord]) -> Option<Check> {
    let count = |k: OutcomeKind| {
        racers
            .iter()
            .filter(|r| kind_of(racers, &r.name) == Some(k))
            .count()
    };
    let mut problems = Vec::new();
    let mut seen = Vec::new();
    for (kind, want) in [
        (OutcomeKind::Created, scenario.expect.created),
        (OutcomeKind::Replayed, scenario.expect.replayed),
        (OutcomeKind::Conflict, scenario.expect.conflict),
    ] {
        if let Some(want) = want {
            let got = count(kind);
            seen.push(format!("{kind}={got}"));
            if got != want {
                problems.push(format!("expected {want} {kind}, got {got}"));
            }
        }
    }
    (!seen.is_empty()).then(|| Check::of_problems("outcome counts", problems, seen.join(", ")))
}

/// Groups holding one ticket id.
fn same_ticket(scenario: &Scenario, racers: &[RacerRecord]) -> Option<Check> {
    if scenario.expect.same_ticket.is_empty() {
        return None;
    }
    let mut problems = Vec::new();
    for group in &scenario.expect.same_ticket {
        let ids: BTreeSet<Option<Uuid>> = group.iter().map(|n| id_of(racers, n)).collect();
        if ids.len() != 1 || ids.contains(&None) {
            problems.push(format!(
                "[{}] hold {}",
                group.join(", "),
                ids.iter().map(short_id).collect::<Vec<_>>().join(", ")
            ));
        }
    }
    Some(Check::of_problems(
        "same ticket",
        problems,
        format!(
            "{} group(s) each hold one id",
            scenario.expect.same_ticket.len()
        ),
    ))
}

/// Groups holding pairwise different ids.
fn distinct_tickets(scenario: &Scenario, racers: &[RacerRecord]) -> Option<Check> {
    if scenario.expect.distinct_tickets.is_empty() {
        return None;
    }
    let mut problems = Vec::new();
    for group in &scenario.expect.distinct_tickets {
        let ids: Vec<Option<Uuid>> = group.iter().map(|n| id_of(racers, n)).collect();
        let unique: BTreeSet<_> = ids.iter().flatten().collect();
        if unique.len() != group.len() {
            problems.push(format!(
                "[{}] hold {}",
                group.join(", "),
                ids.iter().map(short_id).collect::<Vec<_>>().join(", ")
            ));
        }
    }
    Some(Check::of_problems(
        "distinct tickets",
        problems,
        format!(
            "{} group(s) hold different ids",
            scenario.expect.distinct_tickets.len()
        ),
    ))
}

/// Row counts by direct SQL, when the scenario expects any.
fn rows(scenario: &Scenario, truth: &GroundTruth) -> Option<Check> {
    let mut problems = Vec::new();
    for (tenant, want) in &scenario.expect.rows {
        let got = truth.rows.get(tenant).copied().unwrap_or_default();
        if (got.tickets, got.receipts, got.created_events)
            != (want.tickets, want.receipts, want.created_events)
        {
            problems.push(format!(
                "tenant {tenant}: expected {}/{}/{}, counted {got}",
                want.tickets, want.receipts, want.created_events
            ));
        }
    }
    if scenario.expect.rows.is_empty() {
        return None;
    }
    let seen: Vec<String> = truth
        .rows
        .iter()
        .map(|(t, c)| format!("{t}: {c}"))
        .collect();
    Some(Check::of_problems(
        "rows",
        problems,
        format!("tickets/receipts/created events {}", seen.join(", ")),
    ))
}

/// Convergence (docs/PROTOCOL.md §4) as a check against the stored receipt of each (tenant, key): exactly one receipt;
/// every racer whose fingerprint matches it holds its ticket id (created or replayed); every
/// other racer got a conflict; at most one racer created, and exactly one when no setup
/// request used the key.
fn convergence(scenario: &Scenario, racers: &[RacerRecord], truth: &GroundTruth) -> Check {
    let setup_keys: BTreeSet<(String, String)> = scenario
        .setup
        .iter()
        .map(|s| (s.tenant.clone(), s.key.clone()))
        .collect();
    let mut by_key: BTreeMap<(String, String), Vec<&RacerRecord>> = BTreeMap::new();
    for r in racers {
        by_key
            .entry((r.tenant.clone(), r.key.clone()))
            .or_default()
            .push(r);
    }
    let mut problems = Vec::new();
    for (tk, group) in &by_key {
        let label = format!("{}/{}", tk.0, tk.1);
        let stored = truth.receipts.get(tk).cloned().unwrap_or_default();
        if stored.len() != 1 {
            problems.push(format!(
                "{label}: {} receipts stored, expected 1",
                stored.len()
            ));
            continue;
        }
        let (hash, ticket_id) = &stored[0];
        let mut created = 0;
        for r in group {
            let Ok(outcome) = &r.result else { continue };
            if outcome.kind == OutcomeKind::Created {
                created += 1;
            }
            if &r.fingerprint == hash {
                if outcome.kind == OutcomeKind::Conflict {
                    problems.push(format!(
                        "{}: same body as the receipt but got conflict",
                        r.name
                    ));
                } else if outcome.ticket_id != Some(*ticket_id) {
                    problems.push(format!(
                        "{}: holds {} but the receipt names {}",
                        r.name,
                        short_id(&outcome.ticket_id),
                        short_id(&Some(*ticket_id))
                    ));
                }
            } else if outcome.kind != OutcomeKind::Conflict {
                problems.push(format!(
                    "{}: body differs from the receipt's but got {}",
                    r.name, outcome.kind
                ));
            }
        }
        let want_created = if setup_keys.contains(tk) { 0 } else { 1 };
        if created != want_created {
            problems.push(format!(
                "{label}: {created} racers created, expected {want_created}"
            ));
        }
    }
    Check::of_problems(
        "convergence",
        problems,
        format!(
            "{} key(s): one receipt each, same-body racers hold its id, other bodies conflict",
            by_key.len()
        ),
    )
}

/// Convergence (docs/PROTOCOL.md §4, §9) from the clients' side, for black-box targets: per (tenant, key) exactly one racer
/// got "created"; every racer whose request body equals the creator's holds the creator's
/// ticket id (created, or replayed with the replay marker); every other body got 409.
fn client_convergence(racers: &[RacerRecord]) -> Check {
    let mut by_key: BTreeMap<(String, String), Vec<&RacerRecord>> = BTreeMap::new();
    for r in racers {
        by_key
            .entry((r.tenant.clone(), r.key.clone()))
            .or_default()
            .push(r);
    }
    let mut problems = Vec::new();
    for ((tenant, key), group) in &by_key {
        let creators: Vec<&&RacerRecord> = group
            .iter()
            .filter(|r| matches!(&r.result, Ok(o) if o.kind == OutcomeKind::Created))
            .collect();
        if creators.len() != 1 {
            problems.push(format!(
                "{tenant}/{key}: {} racers got \"created\", expected exactly 1",
                creators.len()
            ));
            continue;
        }
        let winner = creators[0];
        let winner_id = winner.result.as_ref().ok().and_then(|o| o.ticket_id);
        for r in group {
            let Ok(outcome) = &r.result else { continue };
            if r.fingerprint == winner.fingerprint {
                if outcome.kind == OutcomeKind::Conflict {
                    problems.push(format!(
                        "{}: same body as the creator {} but got 409",
                        r.name, winner.name
                    ));
                } else if outcome.ticket_id != winner_id {
                    problems.push(format!(
                        "{}: holds {} but the creator {} holds {}",
                        r.name,
                        short_id(&outcome.ticket_id),
                        winner.name,
                        short_id(&winner_id)
                    ));
                }
            } else if outcome.kind != OutcomeKind::Conflict {
                problems.push(format!(
                    "{}: body differs from the creator {}'s but got {} (HTTP {})",
                    r.name, winner.name, outcome.kind, outcome.http_status
                ));
            }
        }
    }
    Check::of_problems(
        "convergence",
        problems,
        format!(
            "{} key(s), seen by the clients: one 201 created each, same-body racers hold its id, other bodies 409",
            by_key.len()
        ),
    )
}

fn join_kinds(kinds: &BTreeSet<OutcomeKind>) -> String {
    kinds
        .iter()
        .map(|k| k.to_string())
        .collect::<Vec<_>>()
        .join(" or ")
}

/// First 8 hex digits of an id, or `none`.
pub(crate) fn short_id(id: &Option<Uuid>) -> String {
    match id {
        Some(id) => id.simple().to_string()[..8].to_string(),
        None => "none".into(),
    }
}

/// The `barrier` check: failed with `problem` when there is one, else passed with
/// `seen()` (what was seen waiting).
pub(crate) fn barrier_check(problem: Option<&str>, seen: impl FnOnce() -> String) -> Check {
    match problem {
        None => Check::pass("barrier", seen()),
        Some(p) => Check::fail("barrier", p),
    }
}

/// A run's verdict from its checks: PASS when every check passed, else FAIL with the failed
/// checks as the reason (`name: detail`, joined by ` | `).
pub(crate) fn verdict_of(checks: &[Check]) -> (Verdict, Option<String>) {
    let failed: Vec<String> = checks
        .iter()
        .filter(|c| !c.passed())
        .map(|c| format!("{}: {}", c.name, c.detail))
        .collect();
    if failed.is_empty() {
        (Verdict::Pass, None)
    } else {
        (Verdict::Fail, Some(failed.join(" | ")))
    }
}
