//! The in-memory store (`store::memory`) on std: the protocol's behaviour on it, and the
//! PostgreSQL READ COMMITTED semantics the loom models rely on (lock waits on the receipts'
//! unique index, savepoints, the failed-transaction state 25P02, atomic commits).
//! Concurrency is synchronised by observed lock waits (`MemoryDb::wait_for_waiters`), never by
//! sleeping; the timeouts given to it are watchdogs against a hang, not part of a check.

use std::time::Duration;

use ticketflow_core::protocol::NewRows;
use ticketflow_core::store::memory::{MemoryDb, MemoryOptions, MemorySession};
use ticketflow_core::store::Store;
use ticketflow_core::variants::{Implementation, Variant};
use ticketflow_core::{
    get_ticket, update_ticket, CreateReport, DbErrorKind, DecisionPath, Error, Fingerprint,
    OutcomeKind, RetryPolicy, StoreError, TicketPatch, TicketRequest,
};

use crate::protocol::CommitsAfterLookup;
use crate::support::{b0, counts, create};

/// Long enough never to fire on a healthy run; only stops a broken one from hanging.
const WATCHDOG: Duration = Duration::from_secs(60);

fn rows(tenant: &str, key: &str, request: &TicketRequest) -> NewRows {
    NewRows::new(tenant, key, request, &Fingerprint::of(request).hash)
}

fn code(e: &StoreError) -> &str {
    e.code.as_deref().unwrap_or("")
}

/// Begins a transaction and inserts ticket, event and receipt for (tenant, key) without
/// committing: the in-flight holder of the key.
fn hold_key(s: &mut MemorySession, tenant: &str, key: &str) -> NewRows {
    let r = rows(tenant, key, &b0());
    s.begin().unwrap();
    s.insert_ticket(&r.ticket).unwrap();
    s.insert_outbox(&r.event).unwrap();
    s.insert_receipt(&r.receipt).unwrap();
    r
}

/// Runs `steps` (tenant, key, request, expected outcome) on one session, in order.
fn check(db: &MemoryDb, steps: &[(&str, &str, TicketRequest, OutcomeKind)]) {
    let mut s = db.session("api-a");
    for (i, (tenant, key, request, want)) in steps.iter().enumerate() {
        let got = create(&mut s, tenant, key, request).unwrap();
        assert_eq!(got.outcome.kind(), *want, "step {i}: {tenant}/{key}");
        assert!(!s.in_transaction(), "step {i} left a transaction open");
    }
}

#[test]
fn memory_store_creates_replays_and_conflicts_like_the_sql_backends() {
    use OutcomeKind::*;
    let db = MemoryDb::new();
    let mut x2 = b0();
    x2.title = "x2".into();
    check(
        &db,
        &[
            ("A", "key-1", b0(), Created),
            ("A", "key-1", b0(), Replayed),
            ("A", "key-1", x2, Conflict),
            ("A", "key-2", b0(), Created),
        ],
    );
    assert_eq!(db.row_counts("A"), counts(2, 2, 2));
    let mut s = db.session("api-b");
    assert_eq!(s.backend(), ticketflow_core::store::Backend::Memory);
    let first = create(&mut s, "A", "key-1", &b0()).unwrap();
    assert_eq!(first.path, DecisionPath::FromLookup);
    assert_eq!((first.http_status, first.replayed), (201, true));
}

#[test]
fn memory_store_keeps_tenants_apart() {
    use OutcomeKind::*;
    let db = MemoryDb::new();
    let mut u2 = b0();
    u2.actor_id = "u2".into();
    check(
        &db,
        &[
            ("A", "key-1", b0(), Created),
            ("B", "key-1", b0(), Created),
            ("B", "key-1", b0(), Replayed),
            ("A", "key-1", u2, Conflict),
        ],
    );
    assert_eq!(db.row_counts("A"), counts(1, 1, 1));
    assert_eq!(db.row_counts("B"), counts(1, 1, 1));
    let mut s = db.session("reader");
    let a = create(&mut s, "A", "key-1", &b0()).unwrap();
    let a_id = a.outcome.ticket().unwrap().id;
    assert!(matches!(
        get_ticket(&mut s, "B", a_id),
        Err(Error::NotFound { .. })
    ));
    let patch = TicketPatch {
        title: Some("stolen".into()),
        ..Default::default()
    };
    assert!(matches!(
        update_ticket(&mut s, "B", a_id, &patch),
        Err(Error::NotFound { .. })
    ));
    assert_eq!(get_ticket(&mut s, "A", a_id).unwrap().title, "x");
}

#[test]
fn uncommitted_rows_are_invisible_and_a_commit_shows_them_all_at_once() {
    let db = MemoryDb::new();
    let mut writer = db.session("writer");
    let mut reader = db.session("reader");
    let r = hold_key(&mut writer, "A", "key-1");
    assert_eq!(reader.find_receipt("A", "key-1").unwrap(), None);
    assert_eq!(reader.find_ticket("A", r.ticket.id).unwrap(), None);
    assert_eq!(db.row_counts("A"), counts(0, 0, 0));
    // The writer sees its own rows.
    assert_eq!(
        writer.find_receipt("A", "key-1").unwrap(),
        Some(r.receipt.clone())
    );
    writer.commit().unwrap();
    assert_eq!(db.row_counts("A"), counts(1, 1, 1));
    assert_eq!(reader.find_receipt("A", "key-1").unwrap(), Some(r.receipt));
    assert_eq!(
        reader.find_ticket("A", r.ticket.id).unwrap(),
        Some(r.ticket)
    );
    // Tenant scoping: the same key and id read from another tenant find nothing.
    assert_eq!(reader.find_receipt("B", "key-1").unwrap(), None);
}

#[test]
fn colliding_insert_waits_then_fails_with_23505_when_the_holder_commits() {
    let db = MemoryDb::new();
    let mut holder = db.session("holder");
    hold_key(&mut holder, "A", "key-1");
    std::thread::scope(|scope| {
        let waiter = scope.spawn(|| {
            let mut s = db.session("waiter");
            let r = rows("A", "key-1", &b0());
            s.begin().unwrap();
            s.insert_ticket(&r.ticket).unwrap();
            let result = s.insert_receipt(&r.receipt);
            s.rollback().unwrap();
            result
        });
        assert!(db.wait_for_waiters(1, WATCHDOG), "the waiter never waited");
        holder.commit().unwrap();
        let err = waiter.join().unwrap().unwrap_err();
        assert_eq!(err.kind, DbErrorKind::UniqueViolation, "{err}");
        assert_eq!(code(&err), "23505");
    });
    assert_eq!(db.row_counts("A"), counts(1, 1, 1));
}

#[test]
fn colliding_insert_waits_then_proceeds_when_the_holder_rolls_back() {
    let db = MemoryDb::new();
    let mut holder = db.session("holder");
    hold_key(&mut holder, "A", "key-1");
    let winner = std::thread::scope(|scope| {
        let waiter = scope.spawn(|| {
            let mut s = db.session("waiter");
            create(&mut s, "A", "key-1", &b0()).unwrap()
        });
        assert!(db.wait_for_waiters(1, WATCHDOG), "the waiter never waited");
        holder.rollback().unwrap();
        waiter.join().unwrap()
    });
    assert_eq!(winner.outcome.kind(), OutcomeKind::Created);
    assert_eq!(db.row_counts("A"), counts(1, 1, 1));
}

#[test]
fn two_waiters_on_one_key_take_turns_after_the_holder_rolls_back() {
    let db = MemoryDb::new();
    let mut holder = db.session("holder");
    hold_key(&mut holder, "A", "key-1");
    let mut kinds = std::thread::scope(|scope| {
        let waiters: Vec<_> = ["w1", "w2"]
            .into_iter()
            .map(|name| {
                let db = &db;
                scope.spawn(move || create(&mut db.session(name), "A", "key-1", &b0()))
            })
            .collect();
        assert!(db.wait_for_waiters(2, WATCHDOG), "the waiters never waited");
        holder.rollback().unwrap();
        waiters
            .into_iter()
            .map(|w| {
                let r = w.join().unwrap().unwrap();
                (r.outcome.kind(), r.path)
            })
            .collect::<Vec<_>>()
    });
    kinds.sort_by_key(|(kind, _)| *kind);
    // One takes the key; the other waits again, for it, and replays after the 23505.
    assert_eq!(
        kinds,
        [
            (OutcomeKind::Created, DecisionPath::Created),
            (OutcomeKind::Replayed, DecisionPath::AfterUniqueViolation)
        ]
    );
    assert_eq!(db.row_counts("A"), counts(1, 1, 1));
}

#[test]
fn colliding_insert_proceeds_when_the_holder_rolls_back_to_a_savepoint() {
    let db = MemoryDb::new();
    let mut holder = db.session("holder");
    let r = rows("A", "key-1", &b0());
    holder.begin().unwrap();
    holder.insert_ticket(&r.ticket).unwrap();
    holder.savepoint("sp").unwrap();
    holder.insert_outbox(&r.event).unwrap();
    holder.insert_receipt(&r.receipt).unwrap();
    std::thread::scope(|scope| {
        let waiter = scope.spawn(|| {
            let mut s = db.session("waiter");
            create(&mut s, "A", "key-1", &b0()).unwrap()
        });
        assert!(db.wait_for_waiters(1, WATCHDOG), "the waiter never waited");
        // The holder's outer transaction stays open; only its key entry goes.
        holder.rollback_to_savepoint("sp").unwrap();
        let got = waiter.join().unwrap();
        assert_eq!(got.outcome.kind(), OutcomeKind::Created);
    });
    // The holder's ticket (before the savepoint) commits without event or receipt: the store
    // does what it is told, the protocol is what keeps the three together.
    holder.commit().unwrap();
    assert_eq!(db.row_counts("A"), counts(2, 1, 1));
}

#[test]
fn the_same_key_in_another_tenant_never_waits() {
    let db = MemoryDb::new();
    let mut holder = db.session("holder");
    hold_key(&mut holder, "A", "key-1");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut s = db.session("tenant-b");
            let _ = tx.send(create(&mut s, "B", "key-1", &b0()));
        });
        let got = rx
            .recv_timeout(WATCHDOG)
            .expect("tenant B's insert blocked on tenant A's key")
            .unwrap();
        assert_eq!(got.outcome.kind(), OutcomeKind::Created);
        holder.rollback().unwrap();
    });
    assert_eq!(db.row_counts("B"), counts(1, 1, 1));
    assert_eq!(db.row_counts("A"), counts(0, 0, 0));
}

#[test]
fn a_failed_transaction_refuses_statements_with_25p02_until_rollback() {
    let db = MemoryDb::new();
    let mut first = db.session("first");
    create(&mut first, "A", "key-1", &b0()).unwrap();
    let mut s = db.session("loser");
    let r = rows("A", "key-1", &b0());
    s.begin().unwrap();
    s.insert_ticket(&r.ticket).unwrap();
    let err = s.insert_receipt(&r.receipt).unwrap_err();
    assert_eq!(code(&err), "23505");
    let failed = [
        s.find_receipt("A", "key-1").unwrap_err(),
        s.find_ticket("A", r.ticket.id).unwrap_err(),
        s.insert_outbox(&r.event).unwrap_err(),
        s.savepoint("late").unwrap_err(),
        s.release_savepoint("late").unwrap_err(),
    ];
    for e in &failed {
        assert_eq!(e.kind, DbErrorKind::InFailedTransaction, "{e}");
        assert_eq!(code(e), "25P02");
    }
    // As PostgreSQL does, COMMIT of a failed transaction rolls it back.
    s.commit().unwrap();
    assert!(!s.in_transaction());
    assert_eq!(db.row_counts("A"), counts(1, 1, 1));
    // The session is usable again, and a new transaction starts clean.
    assert!(s.find_receipt("A", "key-1").unwrap().is_some());
    s.begin().unwrap();
    assert!(s.find_receipt("A", "key-1").unwrap().is_some());
    s.rollback().unwrap();
}

#[test]
fn rollback_to_a_savepoint_taken_before_the_error_clears_the_failed_state() {
    let db = MemoryDb::new();
    let mut first = db.session("first");
    let winner = create(&mut first, "A", "key-1", &b0()).unwrap();
    let mut s = db.session("loser");
    let r = rows("A", "key-1", &b0());
    s.begin().unwrap();
    s.savepoint("sp").unwrap();
    s.insert_ticket(&r.ticket).unwrap();
    s.insert_outbox(&r.event).unwrap();
    assert_eq!(code(&s.insert_receipt(&r.receipt).unwrap_err()), "23505");
    assert_eq!(code(&s.find_receipt("A", "key-1").unwrap_err()), "25P02");
    s.rollback_to_savepoint("sp").unwrap();
    let found = s.find_receipt("A", "key-1").unwrap().unwrap();
    assert_eq!(Some(found.ticket_id), winner.outcome.ticket().map(|t| t.id));
    // The savepoint's work is gone: the loser's ticket is no longer visible, even to itself.
    assert_eq!(s.find_ticket("A", r.ticket.id).unwrap(), None);
    s.commit().unwrap();
    assert_eq!(db.row_counts("A"), counts(1, 1, 1));
}

#[test]
fn savepoints_undo_later_work_keep_earlier_work_and_must_exist() {
    let db = MemoryDb::new();
    let mut s = db.session("s");
    let one = rows("A", "key-1", &b0());
    let two = rows("A", "key-2", &b0());
    s.begin().unwrap();
    s.insert_ticket(&one.ticket).unwrap();
    s.savepoint("sp").unwrap();
    s.insert_ticket(&two.ticket).unwrap();
    s.rollback_to_savepoint("sp").unwrap();
    // ROLLBACK TO keeps the savepoint: it can be rolled back to again, then released.
    s.insert_outbox(&one.event).unwrap();
    s.rollback_to_savepoint("sp").unwrap();
    s.release_savepoint("sp").unwrap();
    let err = s.rollback_to_savepoint("sp").unwrap_err();
    assert_eq!(code(&err), "3B001");
    assert_eq!(
        code(&s.find_ticket("A", one.ticket.id).unwrap_err()),
        "25P02"
    );
    s.rollback().unwrap();
    assert_eq!(db.row_counts("A"), counts(0, 0, 0));

    s.begin().unwrap();
    s.insert_ticket(&one.ticket).unwrap();
    s.savepoint("sp").unwrap();
    s.insert_ticket(&two.ticket).unwrap();
    s.rollback_to_savepoint("sp").unwrap();
    s.commit().unwrap();
    assert_eq!(db.row_counts("A"), counts(1, 0, 0));
    assert!(s.find_ticket("A", one.ticket.id).unwrap().is_some());
    assert!(s.find_ticket("A", two.ticket.id).unwrap().is_none());
    // Savepoints outside a transaction are an error (25P01), not a silent no-op.
    assert_eq!(code(&s.savepoint("sp").unwrap_err()), "25P01");
}

#[test]
fn foreign_keys_and_primary_keys_are_enforced() {
    let db = MemoryDb::new();
    let mut s = db.session("s");
    let r = rows("A", "key-1", &b0());
    // Autocommit statements: an event or receipt without its ticket is refused (23503).
    let e = s.insert_outbox(&r.event).unwrap_err();
    assert_eq!((e.kind, code(&e)), (DbErrorKind::OtherConstraint, "23503"));
    let e = s.insert_receipt(&r.receipt).unwrap_err();
    assert_eq!((e.kind, code(&e)), (DbErrorKind::OtherConstraint, "23503"));
    s.insert_ticket(&r.ticket).unwrap();
    assert_eq!(code(&s.insert_ticket(&r.ticket).unwrap_err()), "23505");
    // A receipt must point at a ticket of its own tenant.
    let mut other_tenant = r.receipt.clone();
    other_tenant.tenant_id = "B".into();
    assert_eq!(code(&s.insert_receipt(&other_tenant).unwrap_err()), "23503");
    assert_eq!(db.row_counts("A"), counts(1, 0, 0));
}

#[test]
fn a_wait_that_closes_a_cycle_fails_with_40p01() {
    let db = MemoryDb::new();
    let mut a = db.session("a");
    let mut b = db.session("b");
    let a1 = hold_key(&mut a, "A", "key-1");
    let b2 = hold_key(&mut b, "A", "key-2");
    std::thread::scope(|scope| {
        let a_waits = scope.spawn(move || {
            // a wants key-2, held by b.
            let mut r = rows("A", "key-2", &b0());
            r.receipt.ticket_id = a1.ticket.id;
            let result = a.insert_receipt(&r.receipt);
            a.rollback().unwrap();
            result
        });
        assert!(db.wait_for_waiters(1, WATCHDOG), "a never waited");
        // b wants key-1, held by a, which waits for b: a cycle.
        let mut r = rows("A", "key-1", &b0());
        r.receipt.ticket_id = b2.ticket.id;
        let err = b.insert_receipt(&r.receipt).unwrap_err();
        assert_eq!((err.kind, code(&err)), (DbErrorKind::Deadlock, "40P01"));
        b.rollback().unwrap();
        // b's rollback frees key-2: a proceeds.
        a_waits.join().unwrap().unwrap();
    });
}

#[test]
fn concurrent_updates_wait_for_the_row_and_apply_to_the_latest_version() {
    let db = MemoryDb::new();
    let mut s = db.session("first");
    let id = create(&mut s, "A", "key-1", &b0())
        .unwrap()
        .outcome
        .ticket()
        .unwrap()
        .id;
    let title = TicketPatch {
        title: Some("edited".into()),
        ..Default::default()
    };
    s.begin().unwrap();
    let v2 = s
        .update_ticket("A", id, &title, ticketflow_core::domain::now_utc())
        .unwrap()
        .unwrap();
    assert_eq!(v2.version, 2);
    let v3 = std::thread::scope(|scope| {
        let second = scope.spawn(|| {
            let priority = TicketPatch {
                priority: Some("urgent".into()),
                ..Default::default()
            };
            update_ticket(&mut db.session("second"), "A", id, &priority).unwrap()
        });
        assert!(
            db.wait_for_waiters(1, WATCHDOG),
            "the second update never waited"
        );
        s.commit().unwrap();
        second.join().unwrap()
    });
    assert_eq!(
        (v3.version, v3.title.as_str(), v3.priority.as_str()),
        (3, "edited", "urgent")
    );
}

#[test]
fn without_the_unique_index_two_receipts_for_one_key_commit() {
    let db = MemoryDb::with_options(MemoryOptions {
        receipt_unique_index: false,
        ..MemoryOptions::default()
    });
    let mut a = db.session("a");
    let mut b = db.session("b");
    hold_key(&mut a, "A", "key-1");
    hold_key(&mut b, "A", "key-1");
    a.commit().unwrap();
    b.commit().unwrap();
    assert_eq!(db.row_counts("A"), counts(2, 2, 2));
}

#[test]
fn the_trace_lists_statements_in_the_order_the_database_ran_them() {
    let db = MemoryDb::with_options(MemoryOptions {
        trace: true,
        ..MemoryOptions::default()
    });
    let mut s = db.session("api-a");
    create(&mut s, "A", "key-1", &b0()).unwrap();
    let trace = db.trace();
    let statements: Vec<&str> = trace
        .iter()
        .map(|t| t.statement.split(' ').next().unwrap_or(""))
        .collect();
    assert_eq!(
        statements,
        [
            "begin",
            "find",
            "savepoint",
            "insert",
            "insert",
            "insert",
            "release",
            "commit"
        ]
    );
    assert!(trace.iter().all(|t| t.session == "api-a"));
    assert_eq!(trace[1].result, "none");
    assert!(MemoryDb::new().trace().is_empty());
}

/// Forced race (a rival commits the key right after the first lookup): the memory store
/// shows each wrong implementation's PostgreSQL symptom, and the protocol's recovery.
fn forced_race(db: &MemoryDb, variant: Option<Variant>) -> Result<CreateReport, Error> {
    let mut loser = CommitsAfterLookup {
        inner: Box::new(db.session("loser")),
        rival: Some(Box::new(|| {
            let mut rival = db.session("rival");
            create(&mut rival, "A", "key-1", &b0()).unwrap();
        })),
    };
    match variant {
        Some(v) => Implementation::Variant(v).create(
            &mut loser,
            "A",
            "key-1",
            &b0(),
            &RetryPolicy::default(),
        ),
        None => create(&mut loser, "A", "key-1", &b0()),
    }
}

#[test]
fn forced_race_on_memory_matches_postgres_for_the_protocol_and_the_variants() {
    let db = MemoryDb::new();
    let r = forced_race(&db, None).unwrap();
    assert_eq!(
        (r.outcome.kind(), r.path),
        (OutcomeKind::Replayed, DecisionPath::AfterUniqueViolation)
    );
    assert_eq!(db.row_counts("A"), counts(1, 1, 1));

    let db = MemoryDb::new();
    let e = forced_race(&db, Some(Variant::AbandonOuterTx)).unwrap_err();
    assert_eq!(e.db_kind(), Some(DbErrorKind::InFailedTransaction), "{e}");
    assert_eq!(db.row_counts("A"), counts(1, 1, 1));

    let db = MemoryDb::new();
    let r = forced_race(&db, Some(Variant::SplitTransactions)).unwrap();
    assert_eq!(r.outcome.kind(), OutcomeKind::Replayed);
    assert_eq!(db.row_counts("A"), counts(2, 1, 2));

    let db = MemoryDb::with_options(MemoryOptions {
        receipt_unique_index: false,
        ..MemoryOptions::default()
    });
    let r = forced_race(&db, Some(Variant::CheckThenInsert)).unwrap();
    assert_eq!(r.outcome.kind(), OutcomeKind::Created);
    assert_eq!(db.row_counts("A"), counts(2, 2, 2));
}

/// The `on-conflict` claim (`insert_receipt_if_absent`) of a key another transaction holds
/// waits for the holder and then inserts nothing, without failing the transaction.
#[test]
fn memory_store_conflicting_claim_waits_for_the_holder_then_does_nothing() {
    let db = MemoryDb::new();
    let rows = rows("A", "key-1", &b0());
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
        assert!(db.wait_for_waiters(1, WATCHDOG));
        holder.commit().unwrap();
        let (inserted, seen) = waiter.join().unwrap();
        assert!(!inserted);
        assert_eq!(seen, Some(rows.ticket.id));
    });
    assert_eq!(db.row_counts("A"), counts(1, 1, 0));
}
