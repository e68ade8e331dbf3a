//! Each scenario check is shown to FAIL on the fault it is for, on both backends.

use std::path::Path;
use std::time::Duration;

use ticketflow_core::store::postgres::IsolationLevel;
use ticketflow_core::store::sqlite::{JournalMode, SqliteConfig, TxMode};
use ticketflow_core::RetryPolicy;
use ticketflow_harness::scenario::format::Scenario;
use ticketflow_harness::scenario::runner::{run_postgres, run_sqlite, PgOptions, SqliteOptions};
use ticketflow_harness::scenario::ScenarioRun;
use ticketflow_harness::verdict::Verdict;

use crate::support::{pg_url, repo_path};

fn scenario(file: &str) -> Scenario {
    Scenario::load(&repo_path(&format!("scenarios/{file}")))
        .unwrap()
        .remove(0)
}

/// Scenario text with one substitution, parsed as if it were the original file.
fn edited(file: &str, from: &str, to: &str) -> Scenario {
    let path = repo_path(&format!("scenarios/{file}"));
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(from), "{file} has no {from:?}");
    Scenario::parse(
        Path::new(&format!("{file} (edited)")),
        &text.replacen(from, to, 1),
    )
    .unwrap()
    .remove(0)
}

/// A shipped scenario with its PostgreSQL racers held at the receipt INSERT (the EXCLUSIVE
/// barrier), after every lookup: without the receipt key each racer then creates on every
/// run, a FAIL by construction. Held at the lookup (the default), a racer whose lock is granted
/// after another's commit sees its receipt and replays, so such a control passed under CI load.
pub(crate) fn held_at_insert(file: &str) -> Scenario {
    let text = std::fs::read_to_string(repo_path(&format!("scenarios/{file}"))).unwrap();
    let (from, to) = if text.contains("\n[barrier]\n") {
        ("\n[barrier]\n", "\n[barrier]\nlock = \"exclusive\"\n")
    } else {
        (
            "\n[[racers]]\n",
            "\n[barrier]\nlock = \"exclusive\"\n\n[[racers]]\n",
        )
    };
    edited(file, from, to)
}

fn failed_checks(run: &ScenarioRun) -> Vec<&'static str> {
    run.checks
        .iter()
        .filter(|c| !c.passed())
        .map(|c| c.name)
        .collect()
}

fn assert_fails(run: &ScenarioRun, check: &str) {
    assert_eq!(
        run.verdict,
        Verdict::Fail,
        "{} on {}: expected FAIL",
        run.scenario,
        run.backend.name()
    );
    assert!(
        failed_checks(run).contains(&check),
        "{} on {}: expected check {check:?} to fail, failed: {:?} ({:?})",
        run.scenario,
        run.backend.name(),
        failed_checks(run),
        run.reason
    );
}

/// Runs on SQLite and (when reachable) PostgreSQL.
fn both(s: &Scenario, sqlite_sql: &[&str], pg_sql: &[&str]) -> Vec<ScenarioRun> {
    let mut runs = vec![run_sqlite(
        s,
        &SqliteOptions {
            after_migrate_sql: sqlite_sql.iter().map(|x| x.to_string()).collect(),
            ..Default::default()
        },
    )];
    if let Some(url) = pg_url() {
        let mut opts = PgOptions::new(crate::support::server(&url));
        opts.after_migrate_sql = pg_sql.iter().map(|x| x.to_string()).collect();
        runs.push(run_postgres(s, &opts));
    }
    runs
}

pub use ticketflow_core::variants::{
    PG_DROP_RECEIPT_KEY as PG_NO_RECEIPT_KEY, SQLITE_DROP_RECEIPT_KEY as SQLITE_NO_RECEIPT_KEY,
};

#[test]
fn without_the_receipt_constraint_scenario_a_fails() {
    for run in both(
        &held_at_insert("a-same-key-same-body.toml"),
        &[SQLITE_NO_RECEIPT_KEY],
        &[PG_NO_RECEIPT_KEY],
    ) {
        // Both racers create: two tickets, two receipts, two ids.
        for check in ["outcome counts", "same ticket", "convergence", "rows"] {
            assert_fails(&run, check);
        }
    }
}

#[test]
fn without_the_receipt_constraint_scenario_e_fails() {
    for run in both(
        &held_at_insert("e-eight-racers-same-body.toml"),
        &[SQLITE_NO_RECEIPT_KEY],
        &[PG_NO_RECEIPT_KEY],
    ) {
        assert_fails(&run, "convergence");
        assert_fails(&run, "rows");
    }
}

#[test]
fn an_inverted_outcome_expectation_fails() {
    let s = edited(
        "a-same-key-same-body.toml",
        "api-a = [\"created\", \"replayed\"]",
        "api-a = \"conflict\"",
    );
    for run in both(&s, &[], &[]) {
        assert_eq!(failed_checks(&run), ["outcomes"], "{:?}", run.reason);
    }
}

#[test]
fn a_wrong_outcome_count_fails() {
    let s = edited(
        "c-same-key-different-bodies.toml",
        "created = 1",
        "created = 2",
    );
    for run in both(&s, &[], &[]) {
        assert_eq!(failed_checks(&run), ["outcome counts"], "{:?}", run.reason);
    }
}

#[test]
fn a_same_ticket_group_across_tenants_fails() {
    let s = edited(
        "d-tenants-share-a-key.toml",
        "distinct_tickets = [[\"tenant-a\", \"tenant-b\"]]",
        "same_ticket = [[\"tenant-a\", \"tenant-b\"]]",
    );
    for run in both(&s, &[], &[]) {
        assert_eq!(failed_checks(&run), ["same ticket"], "{:?}", run.reason);
    }
}

#[test]
fn a_distinct_tickets_group_of_retries_fails() {
    let s = edited(
        "a-same-key-same-body.toml",
        "same_ticket = [[\"api-a\", \"api-b\"]]",
        "distinct_tickets = [[\"api-a\", \"api-b\"]]",
    );
    for run in both(&s, &[], &[]) {
        assert_eq!(
            failed_checks(&run),
            ["distinct tickets"],
            "{:?}",
            run.reason
        );
    }
}

#[test]
fn wrong_row_counts_fail() {
    let s = edited(
        "b-committed-receipt-different-body.toml",
        "tickets = 1",
        "tickets = 2",
    );
    for run in both(&s, &[], &[]) {
        assert_eq!(failed_checks(&run), ["rows"], "{:?}", run.reason);
    }
}

#[test]
fn a_racer_error_fails_and_breaks_the_barrier() {
    // The second racer's request is invalid (a file would be rejected at load, so it is made
    // here): it errors before reaching the barrier.
    let mut s = scenario("a-same-key-same-body.toml");
    s.racers[1].request.priority = "bogus".into();
    for run in both(&s, &[], &[]) {
        assert_fails(&run, "racer errors");
        assert_fails(&run, "barrier");
    }
}

#[test]
fn a_convergence_violation_is_caught_even_when_no_expectation_covers_it() {
    // Expectations stripped: convergence still runs. Scenario f holds both racers at the
    // receipt INSERT, after their lookups, so without the receipt key both create on every run:
    // a violation by construction. (Held at the lookup, as in scenario a, a racer whose lock
    // is granted after the other's commit sees its receipt and the run may pass under load:
    // this test failed that way once in CI.)
    let s = edited(
        "f-forced-unique-violation.toml",
        "[expect]\ncreated = 1\nreplayed = 1\nsame_ticket = [[\"api-a\", \"api-b\"]]\nrows = [{ tenant = \"A\", tickets = 1, receipts = 1, created_events = 1 }]",
        "[expect]",
    );
    for run in both(&s, &[SQLITE_NO_RECEIPT_KEY], &[PG_NO_RECEIPT_KEY]) {
        assert_eq!(failed_checks(&run), ["convergence"], "{:?}", run.reason);
    }
}

#[test]
fn racers_held_elsewhere_never_reach_the_receipt_barrier() {
    // The controller locks the outbox instead: racers pass the receipt lookup and block at the
    // outbox insert, so none is ever seen waiting on idempotency_receipts.
    let Some(url) = pg_url() else { return };
    let mut opts = PgOptions::new(crate::support::server(&url));
    opts.lock_table = Some("outbox_events".into());
    opts.barrier_timeout = Some(Duration::from_millis(500));
    let run = run_postgres(&scenario("a-same-key-same-body.toml"), &opts);
    assert_fails(&run, "barrier");
    assert!(run
        .reason
        .as_deref()
        .unwrap()
        .contains("racers never reached the barrier"));
}

#[test]
fn scratch_databases_are_dropped_after_a_failed_run() {
    let Some(url) = pg_url() else { return };
    let mut opts = PgOptions::new(crate::support::server(&url));
    opts.after_migrate_sql = vec![PG_NO_RECEIPT_KEY.into()];
    // Scenario f holds both racers at the receipt INSERT, after their lookups and ticket
    // inserts, so without the receipt key both commit a ticket on every run: a FAIL by
    // construction. (Held at the lookup instead, as in scenario a, a racer whose lock is
    // granted after the other's commit sees its receipt and the run may pass under load.)
    let run = run_postgres(&scenario("f-forced-unique-violation.toml"), &opts);
    assert_eq!(run.verdict, Verdict::Fail);
    let Some(ticketflow_harness::scenario::Evidence::Postgres { database, .. }) = &run.evidence
    else {
        panic!("no evidence")
    };
    let config = ticketflow_core::store::url::parse_postgres(&url).unwrap();
    let mut c = ticketflow_core::store::postgres::connect(&config).unwrap();
    let n: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_database WHERE datname = $1",
            &[database],
        )
        .unwrap()
        .get(0);
    assert_eq!(n, 0, "{database} still exists");
}

#[test]
fn without_retry_repeatable_read_and_serializable_losers_fail() {
    // The savepoint protocol without its retry (one attempt) is only right under READ COMMITTED (docs/PROTOCOL.md §7).
    let Some(url) = pg_url() else { return };
    let s = scenario("f-forced-unique-violation.toml");
    for isolation in [IsolationLevel::RepeatableRead, IsolationLevel::Serializable] {
        let mut opts = crate::scenarios::pg_opts(&url, isolation);
        opts.retry = RetryPolicy::NONE;
        let run = run_postgres(&s, &opts);
        assert_fails(&run, "racer errors");
        let errors: Vec<&String> = run
            .racers
            .iter()
            .filter_map(|r| r.result.as_ref().err())
            .collect();
        assert_eq!(errors.len(), 1, "{isolation:?}: {errors:?}");
        let expected = match isolation {
            // 23505, and the winner is invisible to the loser's snapshot.
            IsolationLevel::RepeatableRead => "no winner is visible",
            // SSI reports the same conflict as a serialization failure.
            _ => "40001",
        };
        assert!(errors[0].contains(expected), "{isolation:?}: {}", errors[0]);
    }
}

#[test]
fn without_retry_sqlite_deferred_transactions_fail_with_busy() {
    for journal in [JournalMode::Wal, JournalMode::Delete] {
        let opts = SqliteOptions {
            config: SqliteConfig {
                journal,
                tx: TxMode::Deferred,
                ..SqliteConfig::default()
            },
            retry: RetryPolicy::NONE,
            ..SqliteOptions::default()
        };
        let run = run_sqlite(&scenario("a-same-key-same-body.toml"), &opts);
        assert_fails(&run, "racer errors");
        let steps: Vec<&String> = run
            .racers
            .iter()
            .flat_map(|r| r.steps.iter().map(|s| &s.what))
            .collect();
        assert!(
            steps.iter().any(|s| s.contains("busy")),
            "{journal:?}: {steps:?}"
        );
    }
}

#[test]
fn without_the_receipt_constraint_process_racers_fail_too() {
    let Some(url) = pg_url() else { return };
    let mut opts = crate::scenarios::pg_opts(&url, IsolationLevel::ReadCommitted);
    opts.after_migrate_sql = vec![PG_NO_RECEIPT_KEY.into()];
    let run = run_postgres(&held_at_insert("j-two-api-processes.toml"), &opts);
    assert_fails(&run, "convergence");
    assert_fails(&run, "rows");
}
