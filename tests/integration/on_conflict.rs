//! The second create protocol (`on-conflict`: receipt first with INSERT … ON CONFLICT DO
//! NOTHING RETURNING, ticket and event only if the key was won) passes every gate the
//! `savepoint` protocol passes, and the gates catch a broken on-conflict variant.

use std::path::PathBuf;

use ticketflow::domain::{DecisionPath, OutcomeKind};
use ticketflow::killmatrix::{fault_gate, GateOutcome, KillOptions};
use ticketflow::props::{self, SuiteBackend, SuiteConfig};
use ticketflow::scenario::format::{load_dir, Scenario};
use ticketflow::scenario::runner::{run_postgres, run_sqlite, PgOptions, SqliteOptions};
use ticketflow::scenario::{RunSetting, Verdict};
use ticketflow::store::memory::MemoryDb;
use ticketflow::store::postgres::{IsolationLevel, PgStore};
use ticketflow::store::sqlite::SqliteConfig;
use ticketflow::store::Backend;
use ticketflow::store::Store;
use ticketflow::variants::{Implementation, Variant};
use ticketflow::{create_ticket_using, Protocol, RetryPolicy};

use crate::protocol::CommitsAfterLookup;
use crate::support::{b0, counts, pg_url, repo_path, TestDb};

const ON_CONFLICT: Implementation = Implementation::OnConflict;
const BROKEN: Implementation = Implementation::Variant(Variant::OnConflictIgnoresLoss);

fn shipped() -> Vec<Scenario> {
    load_dir(&repo_path("scenarios")).unwrap()
}

fn create(s: &mut dyn Store, key: &str, r: &ticketflow::TicketRequest) -> ticketflow::CreateReport {
    create_ticket_using(
        s,
        Protocol::OnConflict,
        "A",
        key,
        r,
        &RetryPolicy::default(),
    )
    .unwrap()
}

fn sqlite_opts(setting: RunSetting, implementation: Implementation) -> SqliteOptions {
    let RunSetting::Sqlite { journal, tx } = setting else {
        unreachable!()
    };
    SqliteOptions {
        config: SqliteConfig {
            journal,
            tx,
            ..SqliteConfig::default()
        },
        implementation,
        ..SqliteOptions::default()
    }
}

fn pg_opts(url: &str, isolation: IsolationLevel, implementation: Implementation) -> PgOptions {
    let mut opts = PgOptions::new(url);
    opts.isolation = isolation;
    opts.implementation = implementation;
    opts.worker_exe = Some(PathBuf::from(env!("CARGO_BIN_EXE_ticketflow")));
    opts
}

#[test]
fn create_replay_and_conflict_on_every_backend() {
    for db in TestDb::all("oc_basic") {
        let mut s = db.open();
        let first = create(s.as_mut(), "key-1", &b0());
        assert_eq!(first.outcome.kind(), OutcomeKind::Created, "{}", db.name());
        let again = create(s.as_mut(), "key-1", &b0());
        assert_eq!(again.outcome.kind(), OutcomeKind::Replayed);
        assert_eq!(again.path, DecisionPath::FromLookup);
        assert_eq!(
            again.outcome.ticket().map(|t| t.id),
            first.outcome.ticket().map(|t| t.id)
        );
        let mut other = b0();
        other.body = "changed".into();
        let c = create(s.as_mut(), "key-1", &other);
        assert_eq!(c.outcome.kind(), OutcomeKind::Conflict, "{}", db.name());
        assert_eq!(db.counts("A"), counts(1, 1, 1), "{}", db.name());
    }
}

#[test]
fn loser_of_the_receipt_claim_replays_the_committed_winner_without_a_savepoint() {
    for db in TestDb::all("oc_loser") {
        let winner_id = std::cell::Cell::new(None);
        let mut loser = CommitsAfterLookup {
            inner: db.open(),
            rival: Some(Box::new(|| {
                let mut rival = db.open();
                winner_id.set(
                    create(rival.as_mut(), "key-1", &b0())
                        .outcome
                        .ticket()
                        .map(|t| t.id),
                );
            })),
        };
        let r = create(&mut loser, "key-1", &b0());
        assert_eq!(r.outcome.kind(), OutcomeKind::Replayed, "{}", db.name());
        assert_eq!(r.path, DecisionPath::AfterInsertConflict, "{}", db.name());
        assert_eq!(r.attempts, 1, "{}: no retry at READ COMMITTED", db.name());
        assert_eq!(r.outcome.ticket().map(|t| t.id), winner_id.get());
        assert_eq!(db.counts("A"), counts(1, 1, 1), "{}", db.name());
    }
}

#[test]
fn loser_with_another_body_gets_a_conflict_after_the_insert_conflict() {
    for db in TestDb::all("oc_conflict") {
        let mut loser = CommitsAfterLookup {
            inner: db.open(),
            rival: Some(Box::new(|| {
                create(db.open().as_mut(), "key-1", &b0());
            })),
        };
        let mut other = b0();
        other.title = "another title".into();
        let r = create(&mut loser, "key-1", &other);
        assert_eq!(r.outcome.kind(), OutcomeKind::Conflict, "{}", db.name());
        assert_eq!(r.path, DecisionPath::AfterInsertConflict, "{}", db.name());
        assert_eq!(db.counts("A"), counts(1, 1, 1), "{}", db.name());
    }
}

/// Under REPEATABLE READ and SERIALIZABLE, ON CONFLICT DO NOTHING meeting a row its
/// snapshot cannot see raises 40001; the whole transaction is retried and replays.
#[test]
fn repeatable_read_loser_gets_40001_and_the_retry_replays() {
    let Some(db) = TestDb::postgres("oc_rr") else {
        return;
    };
    for level in [IsolationLevel::RepeatableRead, IsolationLevel::Serializable] {
        let key = format!("key-{level:?}");
        let config = db.pg_config().unwrap().clone();
        let mut loser = CommitsAfterLookup {
            inner: Box::new(PgStore::connect(&config, level).unwrap()),
            rival: Some(Box::new(|| {
                create(db.open().as_mut(), &key, &b0());
            })),
        };
        let r = create(&mut loser, &key, &b0());
        assert_eq!(r.outcome.kind(), OutcomeKind::Replayed, "{level:?}");
        assert_eq!(r.attempts, 2, "{level:?}: {:?}", r.retried);
        assert!(r.retried[0].contains("40001"), "{level:?}: {:?}", r.retried);
    }
}

#[test]
fn the_deferred_receipt_foreign_key_still_refuses_a_receipt_without_its_ticket() {
    for db in TestDb::all("oc_fkey") {
        let rows = ticketflow::protocol::NewRows::new("A", "key-1", &b0(), &"a".repeat(64));
        let mut s = db.open();
        s.begin().unwrap();
        assert!(s.insert_receipt_if_absent(&rows.receipt).unwrap());
        let e = s.commit().unwrap_err();
        assert_eq!(
            e.kind,
            ticketflow::DbErrorKind::OtherConstraint,
            "{}",
            db.name()
        );
        let _ = s.rollback();
        assert_eq!(db.counts("A"), counts(0, 0, 0), "{}", db.name());
    }
}

#[test]
fn memory_store_conflicting_claim_waits_for_the_holder_then_does_nothing() {
    let db = MemoryDb::new();
    let rows = ticketflow::protocol::NewRows::new("A", "key-1", &b0(), &"a".repeat(64));
    let mut holder = db.session("holder");
    holder.begin().unwrap();
    assert!(holder.insert_receipt_if_absent(&rows.receipt).unwrap());
    holder.insert_ticket(&rows.ticket).unwrap();
    std::thread::scope(|scope| {
        let waiter = scope.spawn(|| {
            let mut other = db.session("other");
            let mut mine = rows.receipt.clone();
            mine.ticket_id = uuid::Uuid::new_v4();
            other.begin().unwrap();
            let inserted = other.insert_receipt_if_absent(&mine).unwrap();
            // Not failed: the transaction goes on and reads the winner.
            let seen = other.find_receipt("A", "key-1").unwrap();
            other.commit().unwrap();
            (inserted, seen.map(|r| r.ticket_id))
        });
        assert!(db.wait_for_waiters(1, std::time::Duration::from_secs(10)));
        holder.commit().unwrap();
        let (inserted, seen) = waiter.join().unwrap();
        assert!(!inserted);
        assert_eq!(seen, Some(rows.ticket.id));
    });
    assert_eq!(db.row_counts("A"), counts(1, 1, 0));
}

#[test]
fn shipped_scenarios_pass_in_every_sqlite_mode() {
    for s in shipped()
        .iter()
        .filter(|s| s.backends.contains(&Backend::Sqlite))
    {
        for setting in RunSetting::sqlite_matrix() {
            let run = run_sqlite(s, &sqlite_opts(setting, ON_CONFLICT));
            assert_eq!(
                run.verdict,
                Verdict::Pass,
                "{} ({}): {:?} {:?}",
                s.name,
                setting.label(),
                run.reason,
                run.checks.iter().find(|c| !c.passed)
            );
        }
    }
}

#[test]
fn shipped_scenarios_pass_at_every_isolation_level() {
    let Some(url) = pg_url() else { return };
    for s in shipped()
        .iter()
        .filter(|s| s.backends.contains(&Backend::Postgres))
    {
        for isolation in s.isolation.clone() {
            let run = run_postgres(s, &pg_opts(&url, isolation, ON_CONFLICT));
            assert_eq!(
                run.verdict,
                Verdict::Pass,
                "{} ({isolation:?}): {:?} {:?}",
                s.name,
                run.reason,
                run.checks.iter().find(|c| !c.passed)
            );
        }
    }
}

fn suite_backends() -> Vec<SuiteBackend> {
    let mut v = vec![SuiteBackend::Sqlite];
    v.extend(pg_url().map(|url| SuiteBackend::Postgres { url }));
    v
}

#[test]
fn property_suites_pass_on_every_backend() {
    for b in suite_backends() {
        for suite in ["sequential", "concurrent"] {
            let cases = match suite {
                "sequential" => props::sequential::DEFAULT_CASES,
                _ => props::concurrent::DEFAULT_CASES,
            };
            let c = SuiteConfig::new(suite, cases, None, false);
            let r = match suite {
                "sequential" => props::sequential::run(&b, ON_CONFLICT, &c),
                _ => props::concurrent::run(&b, ON_CONFLICT, &c),
            };
            assert_eq!(
                r.verdict,
                Verdict::Pass,
                "{suite} on {}: {:?}",
                r.backend_name(),
                r.reason
            );
        }
    }
}

#[test]
fn fault_cases_pass() {
    let url = pg_url();
    let report = ticketflow::faults::run_protocol(
        Protocol::OnConflict,
        url.as_deref().unwrap_or("postgres://127.0.0.1:1/none"),
        url.is_none().then_some("no server"),
    );
    for c in &report.cases {
        if url.is_none() && c.backend == Backend::Postgres {
            continue;
        }
        assert_eq!(
            c.verdict,
            Verdict::Pass,
            "{} on {}: {}",
            c.name,
            c.backend,
            c.detail
        );
        assert!(c.name.ends_with("[on-conflict]"), "{}", c.name);
    }
    assert!(report.faults_injected >= 3);
}

fn kill_opts(pg: Option<&str>) -> KillOptions {
    KillOptions {
        pg_url: pg.unwrap_or_default().to_string(),
        pg_unusable: None,
        cases: 8,
        seed: None,
        loom_report: "reports/loom.json".into(),
        worker_exe: Some(env!("CARGO_BIN_EXE_ticketflow").into()),
    }
}

#[test]
fn the_client_dying_after_commit_leaves_no_half_state() {
    let pg = pg_url();
    let mut backends = vec![Backend::Sqlite];
    if pg.is_some() {
        backends.push(Backend::Postgres);
    }
    for b in backends {
        assert_eq!(
            fault_gate(b, ON_CONFLICT, &kill_opts(pg.as_deref())),
            GateOutcome::Survived,
            "{b:?}"
        );
    }
}

/// Negative control: an on-conflict variant that ignores "no row returned" is caught by the
/// race scenarios (two tickets under one key) on every backend, and by the concurrent suite.
#[test]
fn gates_catch_the_on_conflict_variant_that_ignores_a_lost_key() {
    let scenario = shipped()
        .into_iter()
        .find(|s| s.name == "e-eight-racers-same-body")
        .unwrap();
    let run = run_sqlite(
        &scenario,
        &sqlite_opts(RunSetting::sqlite_matrix()[0], BROKEN),
    );
    assert_eq!(run.verdict, Verdict::Fail, "sqlite: {:?}", run.reason);
    if let Some(url) = pg_url() {
        let run = run_postgres(
            &scenario,
            &pg_opts(&url, IsolationLevel::ReadCommitted, BROKEN),
        );
        assert_eq!(run.verdict, Verdict::Fail, "postgres: {:?}", run.reason);
    }
    // SQLite's lazy mode serializes writers; whether a generated batch races is luck there,
    // so only PostgreSQL must catch it in the suite.
    if let Some(url) = pg_url() {
        let r = props::concurrent::run(
            &SuiteBackend::Postgres { url },
            BROKEN,
            &SuiteConfig::new("concurrent", props::concurrent::DEFAULT_CASES, None, false),
        );
        assert_eq!(r.verdict, Verdict::Fail, "postgres concurrent suite");
    }
}
