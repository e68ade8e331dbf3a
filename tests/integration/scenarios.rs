use std::path::PathBuf;

use ticketflow_core::domain::{DecisionPath, OutcomeKind};
use ticketflow_core::store::postgres::IsolationLevel;
use ticketflow_core::store::sqlite::SqliteConfig;
use ticketflow_core::store::Backend;
use ticketflow_core::variants::Implementation;
use ticketflow_harness::load::load_dir;
use ticketflow_harness::scenario::format::{LockMode, Scenario};
use ticketflow_harness::scenario::runner::{run_postgres, run_sqlite, PgOptions, SqliteOptions};
use ticketflow_harness::scenario::{Evidence, RunSetting, ScenarioRun};
use ticketflow_harness::verdict::Verdict;

use crate::support::{pg_url, repo_path};

/// The shipped library scenarios without Redis in the loop (the `[lease]` ones, which have
/// lease evidence instead of barrier evidence, are tests/integration/lease_scenarios.rs's).
fn shipped() -> Vec<Scenario> {
    load_dir(&repo_path("scenarios"))
        .unwrap()
        .into_iter()
        .filter(|s| s.lease.is_none())
        .collect()
}

/// PostgreSQL options for tests: process racers use the built binary, not this test binary.
pub fn pg_opts(url: &str, isolation: IsolationLevel) -> PgOptions {
    let mut opts = PgOptions::new(crate::support::server(url));
    opts.isolation = isolation;
    opts.worker_exe = Some(PathBuf::from(env!("CARGO_BIN_EXE_ticketflow")));
    opts
}

fn sqlite_opts(setting: RunSetting) -> SqliteOptions {
    let RunSetting::Sqlite { journal, tx } = setting else {
        unreachable!()
    };
    SqliteOptions {
        config: SqliteConfig {
            journal,
            tx,
            ..SqliteConfig::default()
        },
        ..SqliteOptions::default()
    }
}

/// Every real protocol paired with every setting.
fn implementations_x<T: Copy>(settings: impl IntoIterator<Item = T>) -> Vec<(Implementation, T)> {
    let settings: Vec<T> = settings.into_iter().collect();
    Implementation::PROTOCOLS
        .into_iter()
        .flat_map(|i| settings.iter().map(move |&s| (i, s)))
        .collect()
}

fn shipped_named(name: &str) -> Scenario {
    shipped().into_iter().find(|s| s.name == name).unwrap()
}

#[test]
fn shipped_scenarios_pass_in_every_sqlite_mode() {
    let scenarios = shipped();
    // Library scenarios only; k and l are black-box (tests/integration/blackbox.rs).
    assert_eq!(scenarios.len(), 18);
    for s in scenarios
        .iter()
        .filter(|s| s.backends.contains(&Backend::Sqlite))
    {
        for (implementation, setting) in implementations_x(RunSetting::sqlite_matrix()) {
            let opts = SqliteOptions {
                implementation,
                ..sqlite_opts(setting)
            };
            let run = run_sqlite(s, &opts);
            assert_eq!(
                run.verdict,
                Verdict::Pass,
                "{} ({}, {}): {:?} {:?}",
                s.name,
                implementation.name(),
                setting.label(),
                run.reason,
                run.checks.iter().find(|c| !c.passed())
            );
            assert!(matches!(run.evidence, Some(Evidence::Sqlite { .. })));
        }
    }
}

#[test]
fn shipped_scenarios_pass_at_every_isolation_level_with_lock_evidence() {
    let Some(url) = pg_url() else { return };
    for s in shipped()
        .iter()
        .filter(|s| s.backends.contains(&Backend::Postgres))
    {
        for (implementation, isolation) in implementations_x(s.isolation.clone()) {
            let mut opts = pg_opts(&url, isolation);
            opts.implementation = implementation;
            let run = run_postgres(s, &opts);
            assert_eq!(
                run.verdict,
                Verdict::Pass,
                "{} ({}, {isolation:?}): {:?} {:?}",
                s.name,
                implementation.name(),
                run.reason,
                run.checks.iter().find(|c| !c.passed())
            );
            let Some(Evidence::Postgres {
                waits,
                controller_pid,
                ..
            }) = &run.evidence
            else {
                panic!("{}: no PostgreSQL evidence", s.name)
            };
            // Every racer pid was seen waiting on the barrier lock, blocked by the controller.
            assert_eq!(waits.len(), s.racers.len(), "{}", s.name);
            let pids: Vec<_> = run.racers.iter().map(|r| r.backend_pid.unwrap()).collect();
            for w in waits {
                assert_eq!(w.wait_event_type.as_deref(), Some("Lock"));
                assert!(w.blocked_by.contains(controller_pid));
                assert!(pids.contains(&w.pid));
            }
        }
    }
}

fn lock_modes_seen(run: &ScenarioRun) -> Vec<(String, String)> {
    let Some(Evidence::Postgres { waits, .. }) = &run.evidence else {
        panic!("no evidence")
    };
    waits
        .iter()
        .map(|w| (w.wait_event.clone().unwrap_or_default(), w.mode.clone()))
        .collect()
}

fn paths(run: &ScenarioRun) -> Vec<(OutcomeKind, DecisionPath, u32)> {
    let mut v: Vec<_> = run
        .racers
        .iter()
        .map(|r| {
            let o = r.result.as_ref().unwrap();
            (
                o.kind,
                o.path.expect("library racers report a path"),
                o.attempts,
            )
        })
        .collect();
    v.sort_by_key(|x| format!("{x:?}"));
    v
}

#[test]
fn each_lock_mode_holds_racers_at_its_own_window_and_forces_its_path() {
    let Some(url) = pg_url() else { return };
    let rc = IsolationLevel::ReadCommitted;
    // ACCESS EXCLUSIVE: racers wait for ACCESS SHARE at the lookup.
    let a = run_postgres(&shipped_named("a-same-key-same-body"), &pg_opts(&url, rc));
    assert!(lock_modes_seen(&a)
        .iter()
        .all(|(e, m)| e == "relation" && m == "AccessShareLock"));
    // EXCLUSIVE: the lookup passes; racers wait for ROW EXCLUSIVE at the receipt INSERT, and
    // the loser always takes the unique-violation path.
    let f = shipped_named("f-forced-unique-violation");
    assert_eq!(f.barrier.lock, LockMode::Exclusive);
    let run = run_postgres(&f, &pg_opts(&url, rc));
    assert!(lock_modes_seen(&run)
        .iter()
        .all(|(e, m)| e == "relation" && m == "RowExclusiveLock"));
    assert_eq!(
        paths(&run),
        [
            (OutcomeKind::Created, DecisionPath::Created, 1),
            (OutcomeKind::Replayed, DecisionPath::AfterUniqueViolation, 1)
        ]
    );
    for r in &run.racers {
        assert!(
            r.steps.iter().any(|s| s.what.starts_with("insert outbox")),
            "{:?}",
            r.steps
        );
    }
    // Advisory: racers wait on the advisory lock after the lookup, every one saw no receipt.
    let g = run_postgres(
        &shipped_named("g-advisory-after-lookup"),
        &pg_opts(&url, rc),
    );
    assert!(lock_modes_seen(&g)
        .iter()
        .all(|(e, m)| e == "advisory" && m == "ShareLock"));
    for r in &g.racers {
        let first: Vec<&str> = r.steps[..3].iter().map(|s| s.what.as_str()).collect();
        assert_eq!(first, ["begin", "find receipt -> none", "barrier released"]);
    }
}

#[test]
fn repeatable_read_and_serializable_losers_retry_and_replay() {
    let Some(url) = pg_url() else { return };
    let f = shipped_named("f-forced-unique-violation");
    for implementation in Implementation::PROTOCOLS {
        for isolation in IsolationLevel::ALL {
            let mut opts = pg_opts(&url, isolation);
            opts.implementation = implementation;
            let run = run_postgres(&f, &opts);
            let what = format!("{} {isolation:?}", implementation.name());
            assert_eq!(run.verdict, Verdict::Pass, "{what}: {:?}", run.reason);
            // READ COMMITTED: the loser waited for the winner's key and reads it with a new
            // statement, in one attempt. Above it the loser's snapshot predates the winner's
            // commit: one retry, then a replay from the lookup (the single statement's own
            // read) of a fresh snapshot.
            //
            // The single statement at READ COMMITTED is not forced: it takes the barrier's
            // table lock while it is parsed, before its snapshot, and it is the winner's whole
            // transaction. A winner that commits before the loser's snapshot is read by the
            // loser's lookup; one that commits after it meets the loser's insert. Both are a
            // replay in one attempt, which is what this pins.
            let got = paths(&run);
            let loser = match (isolation, implementation.name()) {
                (IsolationLevel::ReadCommitted, "protocol") => {
                    vec![(OutcomeKind::Replayed, DecisionPath::AfterUniqueViolation, 1)]
                }
                (IsolationLevel::ReadCommitted, "single-statement") => vec![
                    (OutcomeKind::Replayed, DecisionPath::AfterInsertConflict, 1),
                    (OutcomeKind::Replayed, DecisionPath::FromLookup, 1),
                ],
                (IsolationLevel::ReadCommitted, _) => {
                    vec![(OutcomeKind::Replayed, DecisionPath::AfterInsertConflict, 1)]
                }
                // SERIALIZABLE may fail a retry once more: PostgreSQL's serializable snapshot
                // isolation allows false-positive serialization failures (SQLSTATE 40001;
                // "Serializable Isolation Level", "applications must be prepared to retry"),
                // seen once in CI with the single statement.
                (IsolationLevel::Serializable, _) => vec![
                    (OutcomeKind::Replayed, DecisionPath::FromLookup, 2),
                    (OutcomeKind::Replayed, DecisionPath::FromLookup, 3),
                ],
                _ => vec![(OutcomeKind::Replayed, DecisionPath::FromLookup, 2)],
            };
            assert!(
                got.len() == 2
                    && got[0] == (OutcomeKind::Created, DecisionPath::Created, 1)
                    && loser.contains(&got[1]),
                "{what}: {got:?}, loser expected one of {loser:?}"
            );
        }
    }
}

#[test]
fn process_racers_are_separate_processes_with_their_own_sessions() {
    let Some(url) = pg_url() else { return };
    let run = run_postgres(
        &shipped_named("j-two-api-processes"),
        &pg_opts(&url, IsolationLevel::ReadCommitted),
    );
    assert_eq!(run.verdict, Verdict::Pass, "{:?}", run.reason);
    let os: Vec<u32> = run.racers.iter().map(|r| r.os_pid.unwrap()).collect();
    assert_eq!(os.len(), 2);
    assert_ne!(os[0], os[1]);
    assert!(!os.contains(&std::process::id()));
}

#[test]
fn scale_gives_two_to_thirty_two_racers_with_timings() {
    let counts: Vec<usize> = shipped()
        .iter()
        .filter(|s| s.name.starts_with("h-many-racers-same-body"))
        .map(|s| s.racers.len())
        .collect();
    assert_eq!(counts, [2, 4, 8, 16, 32]);
    let mixed = shipped_named("i-many-racers-mixed-bodies-n32");
    let x = mixed
        .racers
        .iter()
        .filter(|r| r.request.body == "body X")
        .count();
    assert_eq!((mixed.racers.len(), x), (32, 16));
    let run = run_sqlite(&mixed, &SqliteOptions::default());
    assert_eq!(run.verdict, Verdict::Pass, "{:?}", run.reason);
    assert!(run.release_to_done_ms.is_some());
}

#[test]
fn unreachable_postgres_is_pending_never_pass() {
    let scenarios = shipped();
    // Port 1 on loopback: nothing listens there.
    let run = run_postgres(
        &scenarios[0],
        &PgOptions::new(crate::support::server(crate::support::UNREACHABLE_PG)),
    );
    assert_eq!(run.verdict, Verdict::Pending);
    assert!(run.reason.unwrap().contains("unreachable"));
}
