//! The paths the racers took: created, replayed (and how), conflict, errors, retries.

use std::fmt::Write as _;

use crate::domain::{DecisionPath, OutcomeKind};
use crate::scenario::{ScenarioRun, Verdict};

/// Counts of the paths racers took in one run: created, replay from lookup, replay after a
/// unique violation, conflict, errors, and retried transactions.
fn paths(r: &ScenarioRun) -> String {
    let mut created = 0;
    let mut lookup = 0;
    let mut after_uv = 0;
    let mut conflict = 0;
    let mut errors = 0;
    let mut retries = 0;
    for rc in &r.racers {
        match &rc.result {
            Ok(o) => {
                retries += o.attempts.saturating_sub(1);
                match (o.kind, o.path) {
                    (OutcomeKind::Created, _) => created += 1,
                    (OutcomeKind::Conflict, _) => conflict += 1,
                    (
                        OutcomeKind::Replayed,
                        Some(
                            DecisionPath::AfterUniqueViolation | DecisionPath::AfterInsertConflict,
                        ),
                    ) => after_uv += 1,
                    (OutcomeKind::Replayed, _) => lookup += 1,
                }
            }
            Err(_) => errors += 1,
        }
    }
    format!("{created} | {lookup} | {after_uv} | {conflict} | {errors} | {retries}")
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
