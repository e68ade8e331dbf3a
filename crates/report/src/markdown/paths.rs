//! The paths the racers took: created, replayed (and how), conflict, errors, retries.

use std::fmt::Write as _;

use ticketflow_core::domain::{DecisionPath, OutcomeKind};
use ticketflow_harness::scenario::ScenarioRun;
use ticketflow_harness::verdict::Verdict;

/// Counts of the paths racers took in one run: created, replay from the lookup, replay after
/// the receipt INSERT lost (a unique violation, or an `ON CONFLICT` that inserted nothing),
/// conflict, errors, and retried transactions.
#[derive(Debug, Default)]
pub(super) struct PathCounts {
    pub created: u32,
    pub replay_lookup: u32,
    pub replay_after_loss: u32,
    pub conflict: u32,
    pub errors: u32,
    pub retries: u32,
}

impl PathCounts {
    /// The counts of `r`'s racers.
    pub fn of(r: &ScenarioRun) -> Self {
        let mut c = PathCounts::default();
        for rc in &r.racers {
            match &rc.result {
                Ok(o) => {
                    c.retries += o.attempts.saturating_sub(1);
                    match (o.kind, o.path) {
                        (OutcomeKind::Created, _) => c.created += 1,
                        (OutcomeKind::Conflict, _) => c.conflict += 1,
                        (
                            OutcomeKind::Replayed,
                            Some(
                                DecisionPath::AfterUniqueViolation
                                | DecisionPath::AfterInsertConflict,
                            ),
                        ) => c.replay_after_loss += 1,
                        (OutcomeKind::Replayed, _) => c.replay_lookup += 1,
                    }
                }
                Err(_) => c.errors += 1,
            }
        }
        c
    }
}

/// The paths of one run as table cells.
fn paths(r: &ScenarioRun) -> String {
    let c = PathCounts::of(r);
    format!(
        "{} | {} | {} | {} | {} | {}",
        c.created, c.replay_lookup, c.replay_after_loss, c.conflict, c.errors, c.retries
    )
}

pub(super) fn render_paths(out: &mut String, runs: &[ScenarioRun]) {
    let _ = writeln!(out, "# Paths the racers took\n");
    let _ = writeln!(
        out,
        "Per run: racers that created; replayed from the first receipt lookup; replayed after the \
         receipt INSERT lost the key (a unique violation, docs/PROTOCOL.md §4.2 step 7, or with the on-conflict \
         protocol an `ON CONFLICT DO NOTHING` that inserted nothing); got a conflict; failed; and \
         transactions retried (serialization failure 40001, deadlock 40P01, SQLite busy, or a \
         winner invisible to a REPEATABLE READ snapshot). Which racer takes which path depends on \
         scheduling, so these counts can differ between runs that pass alike.\n"
    );
    let _ = writeln!(
        out,
        "| scenario | setting | created | replay (lookup) | replay (after the receipt INSERT lost) | conflict | errors | retries |\n|---|---|---|---|---|---|---|---|"
    );
    for r in runs.iter().filter(|r| r.verdict != Verdict::Pending) {
        let _ = writeln!(
            out,
            "| {} | {} | {} |",
            r.scenario,
            r.setting.label(),
            paths(r)
        );
    }
    out.push('\n');
}
