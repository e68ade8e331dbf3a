use std::collections::BTreeSet;

use ticketflow_core::variants::{Implementation, Variant};
use ticketflow_core::Protocol;
use ticketflow_harness::argv::implementation_args;
use ticketflow_harness::blackbox::format::ExploreMode;
use ticketflow_harness::blackbox::{RunOptions, TargetOutcome, TargetScenario};
use ticketflow_harness::killmatrix::{load_interposed, with_serve_args};
use ticketflow_harness::verdict::Verdict;

use crate::support::{pg_url, repo_path};

/// The shipped two-racer file (bounded, at most one preemption: 18 schedules against the
/// real protocol), serving `implementation`.
fn two_racers(implementation: Implementation) -> TargetScenario {
    let all = load_interposed(&repo_path("scenarios/interposed")).unwrap();
    let s = all
        .iter()
        .find(|s| {
            s.file
                .file_name()
                .is_some_and(|f| f == "two-racers-same-key.toml")
        })
        .expect("scenarios/interposed/two-racers-same-key.toml");
    with_serve_args(s, &implementation_args(implementation))
}

fn run(s: &TargetScenario, url: &str, parallel: usize, schedule: Option<String>) -> TargetOutcome {
    let opts = RunOptions {
        exe: Some(std::path::PathBuf::from(env!("CARGO_BIN_EXE_ticketflow"))),
        explore: Some(ExploreMode::Bounded),
        schedule,
        parallel,
        ..RunOptions::new(crate::support::server(url))
    };
    ticketflow_harness::blackbox::run_repeated(s, &opts).unwrap()
}

/// The schedule ids of `o`'s runs.
fn ids(o: &TargetOutcome) -> BTreeSet<String> {
    o.runs
        .iter()
        .filter_map(|r| r.evidence.as_ref()?.schedule_id.clone())
        .collect()
}

fn coverage(o: &TargetOutcome) -> &str {
    o.coverage.as_deref().unwrap_or("")
}

#[test]
fn side_by_side_the_bounded_search_runs_the_schedules_it_runs_one_at_a_time() {
    let Some(url) = pg_url() else { return };
    let s = two_racers(Implementation::Protocol(Protocol::Savepoint));
    let one = run(&s, &url, 1, None);
    let two = run(&s, &url, 2, None);
    for o in [&one, &two] {
        assert_eq!(o.verdict, Verdict::Pass, "{}", coverage(o));
        assert!(coverage(o).contains("search complete"), "{}", coverage(o));
    }
    assert!(
        !coverage(&one).contains("side by side"),
        "{}",
        coverage(&one)
    );
    assert!(
        coverage(&two).contains("ran side by side on 2 lanes"),
        "{}",
        coverage(&two)
    );
    assert_eq!(one.runs.len(), two.runs.len());
    assert_eq!(ids(&one), ids(&two));
    assert_eq!(ids(&one).len(), one.runs.len(), "a schedule ran twice");
}

#[test]
fn side_by_side_split_transactions_still_fail_and_the_failing_schedule_replays() {
    let Some(url) = pg_url() else { return };
    let s = two_racers(Implementation::Variant(Variant::SplitTransactions));
    let o = run(&s, &url, 2, None);
    assert_eq!(o.verdict, Verdict::Fail, "{}", coverage(&o));
    let failing = o.runs.iter().find(|r| r.verdict == Verdict::Fail).unwrap();
    let id = crate::support::schedule_of(failing);
    let again = run(&s, &url, 2, Some(id.clone()));
    assert_eq!(
        again.verdict,
        Verdict::Fail,
        "replay {id}: {}",
        coverage(&again)
    );
    assert_eq!(again.runs.len(), 1, "a replay is one run, on one lane");
}

#[test]
fn a_service_with_state_across_keys_runs_one_schedule_at_a_time_and_says_why() {
    let Some(url) = pg_url() else { return };
    let mut s = two_racers(Implementation::Protocol(Protocol::Savepoint));
    s.target.state_across_keys = true;
    let o = run(&s, &url, 2, None);
    assert_eq!(o.verdict, Verdict::Pass, "{}", coverage(&o));
    assert!(
        coverage(&o).contains("one schedule at a time: [target] state_across_keys"),
        "{}",
        coverage(&o)
    );
    assert!(
        !coverage(&o).contains("side by side on"),
        "{}",
        coverage(&o)
    );
}
