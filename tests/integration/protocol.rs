//! create / get / update behaviour: each body runs over every store (memory, SQLite,
//! PostgreSQL) × every real protocol (`savepoint`, `on-conflict`) through
//! [`for_each_store_and_protocol`], so a failure names its backend and protocol. Tests of one
//! protocol or of the SQL backends only follow at the end.

use chrono::{DateTime, Utc};
use ticketflow_core::domain::{OutboxEvent, Receipt, Ticket};
use ticketflow_core::store::postgres::{IsolationLevel, PgStore};
use ticketflow_core::store::{Claimed, Store, StoreResult};
use ticketflow_core::{
    create_ticket, get_ticket, update_ticket, CreateOptions, DecisionPath, Error, OutcomeKind,
    Protocol, TicketPatch, TicketRequest, ValidationError,
};
use uuid::Uuid;

use crate::support::{b0, counts, for_each_store_and_protocol, Case, TestDb};

fn kind(
    case: &Case,
    store: &mut dyn Store,
    tenant: &str,
    key: &str,
    req: &TicketRequest,
) -> OutcomeKind {
    case.create(store, tenant, key, req).unwrap().outcome.kind()
}

#[test]
fn retry_with_same_body_replays_ticket() {
    for_each_store_and_protocol("replay", |db| {
        let mut s = db.open();
        let first = db.create(s.as_mut(), "A", "key-1", &b0()).unwrap();
        let again = db.create(s.as_mut(), "A", "key-1", &b0()).unwrap();
        assert_eq!(first.outcome.kind(), OutcomeKind::Created);
        assert_eq!(again.outcome.kind(), OutcomeKind::Replayed);
        assert_eq!((again.http_status, again.replayed), (201, true));
        // One transaction each: nothing was retried.
        assert_eq!((first.attempts, again.attempts), (1, 1));
        assert!(first.retried.is_empty() && again.retried.is_empty());
        assert_eq!(again.path, DecisionPath::FromLookup);
        assert_eq!(first.outcome.ticket(), again.outcome.ticket());
        assert_eq!(db.counts("A"), counts(1, 1, 1));
    });
}

#[test]
fn same_key_with_different_body_conflicts_and_writes_nothing() {
    for_each_store_and_protocol("conflict", |db| {
        let mut s = db.open();
        db.create(s.as_mut(), "A", "key-1", &b0()).unwrap();
        let mut other = b0();
        other.body = "y2".into();
        let r = db.create(s.as_mut(), "A", "key-1", &other).unwrap();
        assert_eq!(r.outcome.kind(), OutcomeKind::Conflict);
        assert_eq!(r.http_status, 409);
        assert_eq!(r.path, DecisionPath::FromLookup);
        assert_eq!(db.counts("A"), counts(1, 1, 1));
    });
}

#[test]
fn one_connection_serves_created_replayed_conflict_created() {
    // Field report: a pool of size 1 must never see 25P02 between outcomes.
    for_each_store_and_protocol("pool_of_one", |db| {
        let mut s = db.open();
        let mut x2 = b0();
        x2.title = "x2".into();
        let got = [
            kind(db, s.as_mut(), "A", "key-1", &b0()),
            kind(db, s.as_mut(), "A", "key-1", &b0()),
            kind(db, s.as_mut(), "A", "key-1", &x2),
            kind(db, s.as_mut(), "A", "key-2", &b0()),
        ];
        use OutcomeKind::*;
        assert_eq!(got, [Created, Replayed, Conflict, Created]);
        assert_eq!(db.counts("A"), counts(2, 2, 2));
    });
}

#[test]
fn each_changed_field_conflicts_and_the_original_still_replays() {
    for_each_store_and_protocol("one_field", |db| {
        let mut s = db.open();
        assert_eq!(
            kind(db, s.as_mut(), "A", "key-1", &b0()),
            OutcomeKind::Created
        );
        let changes: [fn(&mut TicketRequest); 4] = [
            |r| r.actor_id = "u2".into(),
            |r| r.title = "x!".into(),
            |r| r.body = "y ".into(),
            |r| r.priority = "low".into(),
        ];
        for change in changes {
            let mut r = b0();
            change(&mut r);
            assert_eq!(
                kind(db, s.as_mut(), "A", "key-1", &r),
                OutcomeKind::Conflict
            );
        }
        assert_eq!(
            kind(db, s.as_mut(), "A", "key-1", &b0()),
            OutcomeKind::Replayed
        );
        assert_eq!(db.counts("A"), counts(1, 1, 1));
    });
}

#[test]
fn tenants_are_independent_and_never_see_each_other() {
    for_each_store_and_protocol("tenants", |db| {
        let mut s = db.open();
        use OutcomeKind::*;
        let mut u2 = b0();
        u2.actor_id = "u2".into();
        let steps = [
            ("A", "key-1", b0(), Created),
            ("B", "key-1", b0(), Created),
            ("B", "key-1", b0(), Replayed),
            ("A", "key-1", b0(), Replayed),
            ("B", "key-9", b0(), Created),
            ("A", "key-9", b0(), Created),
            ("A", "key-1", u2, Conflict),
        ];
        let mut a_ticket = None;
        for (tenant, key, req, want) in steps {
            let r = db.create(s.as_mut(), tenant, key, &req).unwrap();
            assert_eq!(r.outcome.kind(), want, "{tenant}/{key}");
            if (tenant, key) == ("A", "key-1") && a_ticket.is_none() {
                a_ticket = r.outcome.ticket().map(|t| t.id);
            }
        }
        assert_eq!(db.counts("A"), counts(2, 2, 2));
        assert_eq!(db.counts("B"), counts(2, 2, 2));
        let a_id = a_ticket.unwrap();
        assert!(matches!(
            get_ticket(s.as_mut(), "B", a_id),
            Err(Error::NotFound { .. })
        ));
        let patch = TicketPatch {
            title: Some("stolen".into()),
            ..Default::default()
        };
        assert!(matches!(
            update_ticket(s.as_mut(), "B", a_id, &patch),
            Err(Error::NotFound { .. })
        ));
        assert_eq!(get_ticket(s.as_mut(), "A", a_id).unwrap().title, "x");
    });
}

#[test]
fn update_bumps_version_writes_an_event_and_replay_shows_the_current_ticket() {
    for_each_store_and_protocol("update", |db| {
        let mut s = db.open();
        let created = db.create(s.as_mut(), "A", "key-1", &b0()).unwrap();
        let id = created.outcome.ticket().unwrap().id;
        let patch = TicketPatch {
            title: Some("x, edited".into()),
            priority: Some("urgent".into()),
            body: None,
        };
        let updated = update_ticket(s.as_mut(), "A", id, &patch).unwrap();
        assert_eq!(
            (
                updated.version,
                updated.title.as_str(),
                updated.priority.as_str()
            ),
            (2, "x, edited", "urgent")
        );
        assert_eq!(updated.body, "y");
        assert!(updated.updated_at >= updated.created_at);
        assert_eq!(db.events("ticket.updated"), 1);
        // The receipt keeps only the id, so a replay shows the ticket as it is now (docs/PROTOCOL.md §4.3).
        let replay = db.create(s.as_mut(), "A", "key-1", &b0()).unwrap();
        assert_eq!(replay.outcome.kind(), OutcomeKind::Replayed);
        assert_eq!(replay.outcome.ticket().unwrap(), &updated);
        assert!(matches!(
            update_ticket(s.as_mut(), "A", id, &TicketPatch::default()),
            Err(Error::Validation(ValidationError::EmptyPatch))
        ));
        assert!(matches!(
            update_ticket(s.as_mut(), "A", Uuid::new_v4(), &patch),
            Err(Error::NotFound { .. })
        ));
    });
}

#[test]
fn invalid_input_writes_nothing_and_does_not_poison_the_key() {
    let mut cases: Vec<(&str, String, TicketRequest)> = Vec::new();
    cases.push(("empty key", String::new(), b0()));
    cases.push(("long key", "k".repeat(256), b0()));
    let mut r = b0();
    r.priority = "bogus".into();
    cases.push(("priority", "key-1".into(), r));
    let mut r = b0();
    r.title = "t".repeat(201);
    cases.push(("title", "key-1".into(), r));
    let mut r = b0();
    r.body = "b".repeat(64 * 1024 + 1);
    cases.push(("body", "key-1".into(), r));
    for field in 0..4 {
        let mut r = b0();
        let [a, t, b, p] = [&mut r.actor_id, &mut r.title, &mut r.body, &mut r.priority];
        [a, t, b, p].into_iter().nth(field).unwrap().push('\0');
        cases.push(("nul", "key-1".into(), r));
    }
    cases.push(("nul in key", "key\0-1".into(), b0()));
    for_each_store_and_protocol("validation", |db| {
        let mut s = db.open();
        for (what, key, req) in &cases {
            let err = db.create(s.as_mut(), "A", key, req).unwrap_err();
            assert!(matches!(err, Error::Validation(_)), "{what}: {err}");
            assert_eq!(err.http_status(), 422);
        }
        assert_eq!(db.counts("A"), counts(0, 0, 0));
        assert_eq!(
            kind(db, s.as_mut(), "A", "key-1", &b0()),
            OutcomeKind::Created
        );
        assert_eq!(db.counts("A"), counts(1, 1, 1));
    });
}

#[test]
fn quotes_and_sql_metacharacters_are_stored_verbatim() {
    for_each_store_and_protocol("verbatim", |db| {
        let mut s = db.open();
        let nasty = "'; DROP TABLE tickets; -- \"quoted\" \\ % _ $1 ?1";
        let req = TicketRequest {
            actor_id: nasty.into(),
            title: nasty.into(),
            body: nasty.into(),
            priority: "low".into(),
        };
        let r = db.create(s.as_mut(), nasty, nasty, &req).unwrap();
        let t = get_ticket(s.as_mut(), nasty, r.outcome.ticket().unwrap().id).unwrap();
        assert_eq!(
            (t.actor_id.as_str(), t.title.as_str(), t.body.as_str()),
            (nasty, nasty, nasty)
        );
        assert_eq!(
            kind(db, s.as_mut(), nasty, nasty, &req),
            OutcomeKind::Replayed
        );
        // Keys that differ only in case or a trailing space are different keys.
        assert_eq!(
            kind(db, s.as_mut(), "A", "Key-1", &b0()),
            OutcomeKind::Created
        );
        assert_eq!(
            kind(db, s.as_mut(), "A", "key-1", &b0()),
            OutcomeKind::Created
        );
        assert_eq!(
            kind(db, s.as_mut(), "A", "key-1 ", &b0()),
            OutcomeKind::Created
        );
    });
}

/// Negative control of the helper: a body failing in one cell fails the test, and the
/// message names that cell's backend and protocol (and no other).
#[test]
fn a_failing_cell_is_reported_with_its_backend_and_protocol() {
    let failed = std::panic::catch_unwind(|| {
        for_each_store_and_protocol("helper", |db| {
            let memory_on_conflict =
                db.backend() == "memory" && db.protocol == Protocol::OnConflict;
            assert!(!memory_on_conflict, "deliberate failure");
        })
    })
    .expect_err("the failing cell fails the test");
    let message = failed.downcast_ref::<String>().expect("a text panic");
    assert!(message.contains("on 1 of the"), "{message}");
    assert!(
        message.contains("memory/on-conflict: deliberate failure"),
        "{message}"
    );
    assert!(!message.contains("sqlite/"), "{message}");
}

/// A store that lets another session commit the same key right after this session's first
/// receipt lookup saw nothing: the loser path (docs/PROTOCOL.md §4.2 step 7) is forced, not left to luck.
pub struct CommitsAfterLookup<'a> {
    pub inner: Box<dyn Store>,
    pub rival: Option<Box<dyn FnOnce() + 'a>>,
}

impl Store for CommitsAfterLookup<'_> {
    fn backend(&self) -> ticketflow_core::store::Backend {
        self.inner.backend()
    }
    fn begin(&mut self) -> StoreResult<()> {
        self.inner.begin()
    }
    fn savepoint(&mut self, n: &str) -> StoreResult<()> {
        self.inner.savepoint(n)
    }
    fn rollback_to_savepoint(&mut self, n: &str) -> StoreResult<()> {
        self.inner.rollback_to_savepoint(n)
    }
    fn release_savepoint(&mut self, n: &str) -> StoreResult<()> {
        self.inner.release_savepoint(n)
    }
    fn commit(&mut self) -> StoreResult<()> {
        self.inner.commit()
    }
    fn rollback(&mut self) -> StoreResult<()> {
        self.inner.rollback()
    }
    fn find_receipt(&mut self, t: &str, k: &str) -> StoreResult<Option<Receipt>> {
        let r = self.inner.find_receipt(t, k);
        if let Some(rival) = self.rival.take() {
            rival();
        }
        r
    }
    fn insert_ticket(&mut self, t: &Ticket) -> StoreResult<()> {
        self.inner.insert_ticket(t)
    }
    fn insert_outbox(&mut self, e: &OutboxEvent) -> StoreResult<()> {
        self.inner.insert_outbox(e)
    }
    fn insert_receipt(&mut self, r: &Receipt) -> StoreResult<()> {
        self.inner.insert_receipt(r)
    }
    fn insert_receipt_if_absent(&mut self, r: &Receipt) -> StoreResult<bool> {
        self.inner.insert_receipt_if_absent(r)
    }
    fn claim_and_create(
        &mut self,
        t: &Ticket,
        e: &OutboxEvent,
        r: &Receipt,
    ) -> StoreResult<Claimed> {
        // The statement is the lookup: the rival commits right before it, so it meets the
        // committed winner.
        if let Some(rival) = self.rival.take() {
            rival();
        }
        self.inner.claim_and_create(t, e, r)
    }
    fn find_receipt_and_ticket(
        &mut self,
        t: &str,
        k: &str,
    ) -> StoreResult<Option<(Receipt, Option<Ticket>)>> {
        self.inner.find_receipt_and_ticket(t, k)
    }
    fn find_ticket(&mut self, t: &str, id: Uuid) -> StoreResult<Option<Ticket>> {
        self.inner.find_ticket(t, id)
    }
    fn update_ticket(
        &mut self,
        t: &str,
        id: Uuid,
        p: &TicketPatch,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<Ticket>> {
        self.inner.update_ticket(t, id, p, now)
    }
}

#[test]
fn loser_of_the_receipt_race_replays_the_committed_winner() {
    for_each_store_and_protocol("loser_path", |db| {
        let winner_id = std::cell::Cell::new(None);
        let mut loser = CommitsAfterLookup {
            inner: db.open(),
            rival: Some(Box::new(|| {
                let mut rival = db.open();
                let r = db.create(rival.as_mut(), "A", "key-1", &b0()).unwrap();
                winner_id.set(r.outcome.ticket().map(|t| t.id));
            })),
        };
        let r = db.create(&mut loser, "A", "key-1", &b0()).unwrap();
        assert_eq!(r.outcome.kind(), OutcomeKind::Replayed);
        // savepoint: after the unique violation; on-conflict: after the claim returned no row.
        assert_eq!(r.path, db.loser_path());
        assert_eq!(r.attempts, 1, "no retry at READ COMMITTED: {:?}", r.retried);
        assert_eq!(r.outcome.ticket().map(|t| t.id), winner_id.get());
        assert_eq!(db.counts("A"), counts(1, 1, 1));
    });
}

#[test]
fn loser_with_another_body_gets_a_conflict_after_losing_the_race() {
    for_each_store_and_protocol("loser_conflict", |db| {
        let mut loser = CommitsAfterLookup {
            inner: db.open(),
            rival: Some(Box::new(|| {
                db.create(db.open().as_mut(), "A", "key-1", &b0()).unwrap();
            })),
        };
        let mut other = b0();
        other.title = "another title".into();
        let r = db.create(&mut loser, "A", "key-1", &other).unwrap();
        assert_eq!(r.outcome.kind(), OutcomeKind::Conflict);
        assert_eq!(r.path, db.loser_path());
        assert_eq!(db.counts("A"), counts(1, 1, 1));
    });
}

/// `on-conflict` only: under REPEATABLE READ and SERIALIZABLE, ON CONFLICT DO NOTHING
/// meeting a row its snapshot cannot see raises 40001; the whole transaction is retried and
/// replays.
#[test]
fn on_conflict_repeatable_read_loser_gets_40001_and_the_retry_replays() {
    let Some(db) = TestDb::postgres("oc_rr") else {
        return;
    };
    let options = CreateOptions::new(Protocol::OnConflict);
    for level in [IsolationLevel::RepeatableRead, IsolationLevel::Serializable] {
        let key = format!("key-{level:?}");
        let config = db.pg_config().unwrap().clone();
        let mut loser = CommitsAfterLookup {
            inner: Box::new(PgStore::connect(&config, level).unwrap()),
            rival: Some(Box::new(|| {
                create_ticket(db.open().as_mut(), "A", &key, &b0(), &options).unwrap();
            })),
        };
        let r = create_ticket(&mut loser, "A", &key, &b0(), &options).unwrap();
        assert_eq!(r.outcome.kind(), OutcomeKind::Replayed, "{level:?}");
        assert_eq!(r.attempts, 2, "{level:?}: {:?}", r.retried);
        assert!(r.retried[0].contains("40001"), "{level:?}: {:?}", r.retried);
    }
}

/// `on-conflict` claims the key before its ticket exists: the receipt's deferred foreign key
/// (checked at commit) still refuses a claim whose ticket never came.
#[test]
fn the_deferred_receipt_foreign_key_still_refuses_a_receipt_without_its_ticket() {
    for db in TestDb::all("oc_fkey") {
        let rows = ticketflow_core::protocol::NewRows::new("A", "key-1", &b0(), &"a".repeat(64));
        let mut s = db.open();
        s.begin().unwrap();
        assert!(s.insert_receipt_if_absent(&rows.receipt).unwrap());
        let e = s.commit().unwrap_err();
        assert_eq!(
            e.kind,
            ticketflow_core::DbErrorKind::OtherConstraint,
            "{}",
            db.name()
        );
        let _ = s.rollback();
        assert_eq!(db.counts("A"), counts(0, 0, 0), "{}", db.name());
    }
}

#[test]
fn migrations_are_recorded_once_and_reapplying_is_a_no_op() {
    for db in TestDb::all("migrations") {
        drop(db.open());
        drop(db.open());
        assert_eq!(
            db.scalar("SELECT count(*) FROM schema_migrations"),
            ticketflow_core::store::migrate::POSTGRES.len() as i64,
            "{}",
            db.name()
        );
    }
    let db = TestDb::sqlite();
    drop(db.open());
    if let Some(path) = db.sqlite_path() {
        let mut s = ticketflow_core::store::sqlite::SqliteStore::open(path).unwrap();
        assert!(s.migrate().unwrap().is_empty());
        s.execute_batch("UPDATE schema_migrations SET checksum = 'edited'")
            .unwrap();
        let err = ticketflow_core::store::sqlite::SqliteStore::open(path).unwrap_err();
        assert!(err.message.contains("checksum"), "{err}");
    }
}

#[test]
fn pruning_removes_receipts_only_and_a_pruned_key_creates_anew() {
    for db in TestDb::all("prune") {
        let url = match db.sqlite_path() {
            Some(path) => path.display().to_string(),
            None => db.url().unwrap(),
        };
        let url = ticketflow_core::store::url::DatabaseUrl::parse(&url).unwrap();
        let mut s = db.open();
        let first =
            create_ticket(s.as_mut(), "A", "key-1", &b0(), &CreateOptions::default()).unwrap();
        // Nothing is older than an hour yet.
        assert_eq!(
            ticketflow_core::store::prune_receipts(&url, std::time::Duration::from_secs(3600))
                .unwrap(),
            0
        );
        assert_eq!(
            ticketflow_core::store::prune_receipts(&url, std::time::Duration::ZERO).unwrap(),
            1
        );
        assert_eq!(
            db.counts("A"),
            counts(1, 0, 1),
            "{}: tickets and events stay",
            db.name()
        );
        let again =
            create_ticket(s.as_mut(), "A", "key-1", &b0(), &CreateOptions::default()).unwrap();
        assert_eq!(again.outcome.kind(), OutcomeKind::Created, "{}", db.name());
        assert_ne!(
            again.outcome.ticket().unwrap().id,
            first.outcome.ticket().unwrap().id
        );
        assert_eq!(db.counts("A"), counts(2, 1, 2), "{}", db.name());
    }
}

#[test]
fn a_one_megabyte_body_is_rejected_and_ten_thousand_keys_are_fine() {
    for_each_store_and_protocol("big_inputs", |db| {
        if let Some(sql) = db.sql() {
            if let Some(config) = sql.pg_config() {
                // Ten thousand commits: skip the WAL flush per commit, which this test is not
                // about.
                let name = config.get_dbname().unwrap().to_string();
                sql.execute(&format!(
                    "ALTER DATABASE \"{name}\" SET synchronous_commit = off"
                ));
            }
        }
        let mut s = db.open();
        let mut huge = b0();
        huge.body = "b".repeat(1024 * 1024);
        let err = db.create(s.as_mut(), "A", "key-1", &huge).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Validation(ValidationError::TooLong { field: "body", .. })
            ),
            "{err}"
        );
        assert_eq!(db.counts("A"), counts(0, 0, 0));
        for i in 0..10_000 {
            let r = db
                .create(s.as_mut(), "A", &format!("key-{i}"), &b0())
                .unwrap();
            assert_eq!(r.outcome.kind(), OutcomeKind::Created);
        }
        // Each retry still finds its own receipt among ten thousand.
        for i in [0, 4_999, 9_999] {
            let r = db
                .create(s.as_mut(), "A", &format!("key-{i}"), &b0())
                .unwrap();
            assert_eq!(r.outcome.kind(), OutcomeKind::Replayed);
        }
        assert_eq!(db.counts("A"), counts(10_000, 10_000, 10_000));
    });
}

/// Holds `holder` inside a transaction that has inserted the receipt, ticket and event for
/// (A, `key`) with `b0`'s fingerprint: an in-flight winner, not committed.
fn hold_in_flight(holder: &mut dyn Store, key: &str) -> Uuid {
    let hash = ticketflow_core::fingerprint::Fingerprint::of(&b0()).hash;
    let rows = ticketflow_core::protocol::NewRows::new("A", key, &b0(), &hash);
    holder.begin().unwrap();
    assert!(holder.insert_receipt_if_absent(&rows.receipt).unwrap());
    holder.insert_ticket(&rows.ticket).unwrap();
    holder.insert_outbox(&rows.event).unwrap();
    rows.ticket.id
}

/// Waits until the PostgreSQL session `pid` is waiting for a lock (polled, bounded).
fn wait_until_lock_waiting(observer: &mut postgres::Client, pid: i32) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let waiting: bool = observer
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock')",
                &[&pid],
            )
            .unwrap()
            .get(0);
        if waiting {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "pid {pid} never waited for a lock"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// `single-statement`, the loser of an in-flight race on PostgreSQL: its statement waits for
/// the uncommitted winner, which then commits. At READ COMMITTED the statement's snapshot
/// cannot see that receipt, so the protocol sends its second statement and replays
/// (`AfterInsertConflict`, one attempt); at REPEATABLE READ and SERIALIZABLE the statement
/// gets 40001 and the retried statement meets the receipt. The negative control
/// (`single-statement-skips-reread`) answers created with a ticket that was never written.
#[test]
fn single_statement_loser_of_an_in_flight_winner_reads_it_with_a_second_statement() {
    use ticketflow_core::variants::{Implementation, Variant};
    let Some(db) = TestDb::postgres("ss_inflight") else {
        return;
    };
    let config = db.pg_config().unwrap().clone();
    let mut observer = config.connect(postgres::NoTls).unwrap();
    let protocol = Implementation::Protocol(Protocol::SingleStatement);
    let skips = Implementation::Variant(Variant::SingleStatementSkipsReread);
    let cases = [
        (IsolationLevel::ReadCommitted, protocol),
        (IsolationLevel::RepeatableRead, protocol),
        (IsolationLevel::Serializable, protocol),
        (IsolationLevel::ReadCommitted, skips),
    ];
    for (level, implementation) in cases {
        let key = format!("key-{level:?}-{}", implementation.name());
        let mut holder = PgStore::connect(&config, IsolationLevel::ReadCommitted).unwrap();
        let winner = hold_in_flight(&mut holder, &key);
        let mut loser = PgStore::connect(&config, level).unwrap();
        let pid = loser.backend_pid();
        let r = std::thread::scope(|s| {
            let racer = s.spawn(|| {
                let retry = ticketflow_core::RetryPolicy::default();
                implementation.create(&mut loser, "A", &key, &b0(), &retry)
            });
            wait_until_lock_waiting(&mut observer, pid);
            holder.commit().unwrap();
            racer.join().unwrap().unwrap()
        });
        let what = format!("{level:?} {}", implementation.name());
        if implementation == skips {
            assert_eq!(r.outcome.kind(), OutcomeKind::Created, "{what}");
            assert_ne!(r.outcome.ticket().map(|t| t.id), Some(winner), "{what}");
            continue;
        }
        assert_eq!(r.outcome.kind(), OutcomeKind::Replayed, "{what}");
        assert_eq!(r.outcome.ticket().map(|t| t.id), Some(winner), "{what}");
        if level == IsolationLevel::ReadCommitted {
            assert_eq!(r.path, DecisionPath::AfterInsertConflict, "{what}");
            assert_eq!(r.attempts, 1, "{what}: {:?}", r.retried);
        } else {
            assert_eq!(r.path, DecisionPath::FromLookup, "{what}");
            assert_eq!(r.attempts, 2, "{what}: {:?}", r.retried);
            assert!(r.retried[0].contains("40001"), "{what}: {:?}", r.retried);
        }
    }
    assert_eq!(db.counts("A"), counts(4, 4, 4));
}

/// The same in-flight race on the memory store (the loom models' store): the statement
/// waits for the uncommitted winner and answers "taken, unseen"; the second statement
/// reads the winner.
#[test]
fn single_statement_in_flight_race_on_the_memory_store() {
    let db = ticketflow_core::store::memory::MemoryDb::new();
    let mut holder = db.session("holder");
    let winner = hold_in_flight(&mut holder, "key-1");
    let mut loser = db.session("loser");
    let options = CreateOptions::new(Protocol::SingleStatement);
    let r = std::thread::scope(|s| {
        let racer = s.spawn(|| create_ticket(&mut loser, "A", "key-1", &b0(), &options));
        assert!(db.wait_for_waiters(1, std::time::Duration::from_secs(20)));
        holder.commit().unwrap();
        racer.join().unwrap().unwrap()
    });
    assert_eq!(r.outcome.kind(), OutcomeKind::Replayed);
    assert_eq!(r.outcome.ticket().map(|t| t.id), Some(winner));
    assert_eq!(r.path, DecisionPath::AfterInsertConflict);
    assert_eq!(db.row_counts("A"), counts(1, 1, 1));
}
