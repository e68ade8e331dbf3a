//! Runs summed up into an outcome (the verdict over repeats), and a run that did not happen.

use super::MIN_HTTP_REPEATS;
use crate::blackbox::format::TargetScenario;
use crate::blackbox::{TargetOutcome, TargetRun};
use crate::verdict::Verdict;

/// Sums up repeats into one verdict ([`TargetOutcome::verdict`]).
pub fn summarise(scenario: &TargetScenario, runs: Vec<TargetRun>) -> TargetOutcome {
    let count = |v: Verdict| runs.iter().filter(|r| r.verdict == v).count();
    let (passes, failures, pending) = (
        count(Verdict::Pass),
        count(Verdict::Fail),
        count(Verdict::Pending),
    );
    let ran = passes + failures;
    let server_side = scenario.barrier.kind.server_side();
    let (verdict, reason) = if failures > 0 {
        let first = runs
            .iter()
            .find(|r| r.verdict == Verdict::Fail)
            .and_then(|r| r.reason.clone())
            .unwrap_or_default();
        (
            Verdict::Fail,
            Some(if runs.len() > 1 {
                format!(
                    "{failures} of {} repeats failed; first: {first}",
                    runs.len()
                )
            } else {
                first
            }),
        )
    } else if passes == 0 {
        (
            Verdict::Pending,
            Some(
                runs.iter()
                    .find_map(|r| r.reason.clone())
                    .unwrap_or_else(|| "did not run".into()),
            ),
        )
    } else if used_http_barrier(&runs) && passes < MIN_HTTP_REPEATS {
        (
            Verdict::Pending,
            Some(format!(
                "HTTP-level barrier (no server-side proof): {passes} passing run(s); a PASS needs {} {MIN_HTTP_REPEATS} or more",
                ticketflow_core::flags::REPEAT
            )),
        )
    } else if pending > 0 {
        (
            Verdict::Pending,
            Some(format!("{pending} of {} repeats did not run", runs.len())),
        )
    } else {
        (Verdict::Pass, None)
    };
    TargetOutcome {
        scenario: scenario.name.clone(),
        file: scenario.file.display().to_string(),
        barrier: scenario.barrier.kind.name().to_string(),
        server_side,
        verdict,
        reason,
        passes,
        failures,
        pending,
        flake_rate: if ran == 0 {
            0.0
        } else {
            failures as f64 / ran as f64
        },
        coverage: None,
        failing_schedule: None,
        runs,
    }
}

/// Whether any wave of `runs` was released by the HTTP-level barrier (waves of one racer use
/// no barrier, so a scenario made only of them needs no repeats).
pub(super) fn used_http_barrier(runs: &[TargetRun]) -> bool {
    runs.iter().any(|r| {
        r.evidence
            .as_ref()
            .is_some_and(|e| e.waves.iter().any(|w| w.barrier == "http"))
    })
}

/// A run that did not happen (PENDING with `reason`).
pub fn not_run(scenario: &TargetScenario, reason: String) -> TargetRun {
    TargetRun {
        scenario: scenario.name.clone(),
        file: scenario.file.display().to_string(),
        verdict: Verdict::Pending,
        reason: Some(reason),
        evidence_line: None,
        checks: Vec::new(),
        racers: Vec::new(),
        answers: Vec::new(),
        counts: Vec::new(),
        evidence: None,
    }
}
