//! Each wrong implementation of SPEC §6 shows its symptom on every backend (the harness's
//! gates that kill them are issue-level work; this pins the deviations themselves).

use ticketflow::variants::Variant;
use ticketflow::{create_ticket, DbErrorKind, Error, OutcomeKind};

use crate::protocol::CommitsAfterLookup;
use crate::support::{b0, counts, TestDb};

/// Runs `variant`'s create for A/key-1/B0 while a rival session commits the same key right
/// after the variant's first lookup (a forced race).
fn forced_race(db: &TestDb, variant: Variant) -> Result<ticketflow::CreateReport, Error> {
    let mut loser = CommitsAfterLookup {
        inner: db.open(),
        rival: Some(Box::new(|| {
            create_ticket(db.open().as_mut(), "A", "key-1", &b0()).unwrap();
        })),
    };
    variant.create_ticket(&mut loser, "A", "key-1", &b0())
}

#[test]
fn key_only_replays_a_different_intent() {
    for db in TestDb::all("v_key_only") {
        let mut s = db.open();
        Variant::KeyOnly
            .create_ticket(s.as_mut(), "A", "key-1", &b0())
            .unwrap();
        let mut other = b0();
        other.body = "another body".into();
        let r = Variant::KeyOnly
            .create_ticket(s.as_mut(), "A", "key-1", &other)
            .unwrap();
        assert_eq!(r.outcome.kind(), OutcomeKind::Replayed, "{}", db.name());
    }
}

#[test]
fn noncanonical_fingerprint_conflicts_on_honest_retries() {
    for db in TestDb::all("v_noncanonical") {
        let mut s = db.open();
        let v = Variant::NoncanonicalFingerprint;
        v.create_ticket(s.as_mut(), "A", "key-1", &b0()).unwrap();
        let conflicts = (0..32)
            .filter(|_| {
                v.create_ticket(s.as_mut(), "A", "key-1", &b0())
                    .unwrap()
                    .outcome
                    .kind()
                    == OutcomeKind::Conflict
            })
            .count();
        assert!(
            conflicts > 0,
            "{}: 32 identical retries never conflicted",
            db.name()
        );
    }
}

#[test]
fn check_then_insert_without_the_constraint_makes_two_tickets() {
    for db in TestDb::all("v_check_then_insert") {
        drop(db.open()); // migrate
        let sql = match db.name() {
            "sqlite" => crate::negative_controls::SQLITE_NO_RECEIPT_KEY,
            _ => crate::negative_controls::PG_NO_RECEIPT_KEY,
        };
        db.execute(sql);
        let r = forced_race(&db, Variant::CheckThenInsert).unwrap();
        assert_eq!(r.outcome.kind(), OutcomeKind::Created, "{}", db.name());
        assert_eq!(db.counts("A"), counts(2, 2, 2), "{}", db.name());
    }
}

#[test]
fn abandon_outer_tx_fails_on_postgres_and_leaves_orphans_on_sqlite() {
    for db in TestDb::all("v_abandon") {
        let r = forced_race(&db, Variant::AbandonOuterTx);
        match db.name() {
            "postgres" => {
                let e = r.unwrap_err();
                assert_eq!(e.db_kind(), Some(DbErrorKind::InFailedTransaction), "{e}");
                assert_eq!(db.counts("A"), counts(1, 1, 1));
            }
            _ => {
                // SQLite keeps the transaction alive after a failed statement: the loser
                // "replays" but commits its own ticket and event beside the winner's.
                assert_eq!(r.unwrap().outcome.kind(), OutcomeKind::Replayed);
                assert_eq!(db.counts("A"), counts(2, 1, 2));
            }
        }
    }
}

#[test]
fn split_transactions_leave_an_orphan_ticket_and_event() {
    for db in TestDb::all("v_split") {
        let r = forced_race(&db, Variant::SplitTransactions).unwrap();
        assert_eq!(r.outcome.kind(), OutcomeKind::Replayed, "{}", db.name());
        assert_eq!(db.counts("A"), counts(2, 1, 2), "{}", db.name());
    }
}

#[test]
fn the_real_protocol_survives_the_same_forced_race() {
    for db in TestDb::all("v_control") {
        let mut loser = CommitsAfterLookup {
            inner: db.open(),
            rival: Some(Box::new(|| {
                create_ticket(db.open().as_mut(), "A", "key-1", &b0()).unwrap();
            })),
        };
        let r = create_ticket(&mut loser, "A", "key-1", &b0()).unwrap();
        assert_eq!(r.outcome.kind(), OutcomeKind::Replayed);
        assert_eq!(db.counts("A"), counts(1, 1, 1), "{}", db.name());
    }
}

#[test]
fn a_client_dying_between_transactions_exposes_split_transactions_only() {
    use ticketflow::killmatrix::{fault_gate, GateOutcome, KillOptions};
    use ticketflow::store::Backend;
    use ticketflow::variants::Implementation;
    let pg = crate::support::pg_url();
    let opts = KillOptions {
        pg_url: pg.clone().unwrap_or_default(),
        pg_unusable: None,
        cases: 8,
        seed: None,
        loom_report: "reports/loom.json".into(),
        worker_exe: Some(env!("CARGO_BIN_EXE_ticketflow").into()),
    };
    let mut backends = vec![Backend::Sqlite];
    if pg.is_some() {
        backends.push(Backend::Postgres);
    }
    for b in backends {
        // The real protocol commits once: dying after it leaves a whole create, and the
        // retry replays it.
        assert_eq!(
            fault_gate(b, Implementation::Protocol, &opts),
            GateOutcome::Survived,
            "{b:?}"
        );
        let split = fault_gate(
            b,
            Implementation::Variant(Variant::SplitTransactions),
            &opts,
        );
        let GateOutcome::Killed(why) = split else {
            panic!("{b:?}: {split:?}")
        };
        assert!(
            why.contains("0 created events and 0 receipts"),
            "{b:?}: {why}"
        );
    }
}
