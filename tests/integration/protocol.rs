use chrono::{DateTime, Utc};
use ticketflow::domain::{OutboxEvent, Receipt, Ticket};
use ticketflow::store::{Store, StoreResult};
use ticketflow::{
    create_ticket, get_ticket, update_ticket, DecisionPath, Error, OutcomeKind, TicketPatch,
    TicketRequest, ValidationError,
};
use uuid::Uuid;

use crate::support::{b0, counts, TestDb};

fn kind(store: &mut dyn Store, tenant: &str, key: &str, req: &TicketRequest) -> OutcomeKind {
    create_ticket(store, tenant, key, req)
        .unwrap()
        .outcome
        .kind()
}

#[test]
fn retry_with_same_body_replays_ticket() {
    for db in TestDb::all("replay") {
        let mut s = db.open();
        let first = create_ticket(s.as_mut(), "A", "key-1", &b0()).unwrap();
        let again = create_ticket(s.as_mut(), "A", "key-1", &b0()).unwrap();
        assert_eq!(first.outcome.kind(), OutcomeKind::Created, "{}", db.name());
        assert_eq!(again.outcome.kind(), OutcomeKind::Replayed, "{}", db.name());
        assert_eq!((again.http_status, again.replayed), (201, true));
        // One transaction each: nothing was retried.
        assert_eq!((first.attempts, again.attempts), (1, 1));
        assert!(first.retried.is_empty() && again.retried.is_empty());
        assert_eq!(again.path, DecisionPath::FromLookup);
        assert_eq!(
            first.outcome.ticket(),
            again.outcome.ticket(),
            "{}",
            db.name()
        );
        assert_eq!(db.counts("A"), counts(1, 1, 1), "{}", db.name());
    }
}

#[test]
fn same_key_with_different_body_conflicts_and_writes_nothing() {
    for db in TestDb::all("conflict") {
        let mut s = db.open();
        create_ticket(s.as_mut(), "A", "key-1", &b0()).unwrap();
        let mut other = b0();
        other.body = "y2".into();
        let r = create_ticket(s.as_mut(), "A", "key-1", &other).unwrap();
        assert_eq!(r.outcome.kind(), OutcomeKind::Conflict, "{}", db.name());
        assert_eq!(r.http_status, 409);
        assert_eq!(db.counts("A"), counts(1, 1, 1), "{}", db.name());
    }
}

#[test]
fn one_connection_serves_created_replayed_conflict_created() {
    // Field report: a pool of size 1 must never see 25P02 between outcomes.
    for db in TestDb::all("pool_of_one") {
        let mut s = db.open();
        let mut x2 = b0();
        x2.title = "x2".into();
        let got = [
            kind(s.as_mut(), "A", "key-1", &b0()),
            kind(s.as_mut(), "A", "key-1", &b0()),
            kind(s.as_mut(), "A", "key-1", &x2),
            kind(s.as_mut(), "A", "key-2", &b0()),
        ];
        use OutcomeKind::*;
        assert_eq!(got, [Created, Replayed, Conflict, Created], "{}", db.name());
        assert_eq!(db.counts("A"), counts(2, 2, 2), "{}", db.name());
    }
}

#[test]
fn each_changed_field_conflicts_and_the_original_still_replays() {
    for db in TestDb::all("one_field") {
        let mut s = db.open();
        assert_eq!(kind(s.as_mut(), "A", "key-1", &b0()), OutcomeKind::Created);
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
                kind(s.as_mut(), "A", "key-1", &r),
                OutcomeKind::Conflict,
                "{}",
                db.name()
            );
        }
        assert_eq!(kind(s.as_mut(), "A", "key-1", &b0()), OutcomeKind::Replayed);
        assert_eq!(db.counts("A"), counts(1, 1, 1), "{}", db.name());
    }
}

#[test]
fn tenants_are_independent_and_never_see_each_other() {
    for db in TestDb::all("tenants") {
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
            let r = create_ticket(s.as_mut(), tenant, key, &req).unwrap();
            assert_eq!(r.outcome.kind(), want, "{} {tenant}/{key}", db.name());
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
    }
}

#[test]
fn update_bumps_version_writes_an_event_and_replay_shows_the_current_ticket() {
    for db in TestDb::all("update") {
        let mut s = db.open();
        let created = create_ticket(s.as_mut(), "A", "key-1", &b0()).unwrap();
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
        let updated_events =
            db.scalar("SELECT count(*) FROM outbox_events WHERE event_type = 'ticket.updated'");
        assert_eq!(updated_events, 1, "{}", db.name());
        // The receipt keeps only the id, so a replay shows the ticket as it is now (SPEC §5).
        let replay = create_ticket(s.as_mut(), "A", "key-1", &b0()).unwrap();
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
    }
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
    for db in TestDb::all("validation") {
        let mut s = db.open();
        for (what, key, req) in &cases {
            let err = create_ticket(s.as_mut(), "A", key, req).unwrap_err();
            assert!(
                matches!(err, Error::Validation(_)),
                "{} {what}: {err}",
                db.name()
            );
            assert_eq!(err.http_status(), 422);
        }
        assert_eq!(db.counts("A"), counts(0, 0, 0), "{}", db.name());
        assert_eq!(kind(s.as_mut(), "A", "key-1", &b0()), OutcomeKind::Created);
        assert_eq!(db.counts("A"), counts(1, 1, 1), "{}", db.name());
    }
}

#[test]
fn quotes_and_sql_metacharacters_are_stored_verbatim() {
    for db in TestDb::all("verbatim") {
        let mut s = db.open();
        let nasty = "'; DROP TABLE tickets; -- \"quoted\" \\ % _ $1 ?1";
        let req = TicketRequest {
            actor_id: nasty.into(),
            title: nasty.into(),
            body: nasty.into(),
            priority: "low".into(),
        };
        let r = create_ticket(s.as_mut(), nasty, nasty, &req).unwrap();
        let t = get_ticket(s.as_mut(), nasty, r.outcome.ticket().unwrap().id).unwrap();
        assert_eq!(
            (t.actor_id.as_str(), t.title.as_str(), t.body.as_str()),
            (nasty, nasty, nasty)
        );
        assert_eq!(kind(s.as_mut(), nasty, nasty, &req), OutcomeKind::Replayed);
        // Keys that differ only in case or a trailing space are different keys.
        assert_eq!(kind(s.as_mut(), "A", "Key-1", &b0()), OutcomeKind::Created);
        assert_eq!(kind(s.as_mut(), "A", "key-1", &b0()), OutcomeKind::Created);
        assert_eq!(kind(s.as_mut(), "A", "key-1 ", &b0()), OutcomeKind::Created);
    }
}

/// A store that lets another session commit the same key right after this session's first
/// receipt lookup saw nothing: the loser path (SPEC §4 step 4) is forced, not left to luck.
pub struct CommitsAfterLookup<'a> {
    pub inner: Box<dyn Store>,
    pub rival: Option<Box<dyn FnOnce() + 'a>>,
}

impl Store for CommitsAfterLookup<'_> {
    fn backend(&self) -> ticketflow::store::Backend {
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
fn loser_of_the_receipt_insert_replays_the_committed_winner() {
    for db in TestDb::all("loser_path") {
        let winner_id = std::cell::Cell::new(None);
        let mut loser = CommitsAfterLookup {
            inner: db.open(),
            rival: Some(Box::new(|| {
                let mut rival = db.open();
                let r = create_ticket(rival.as_mut(), "A", "key-1", &b0()).unwrap();
                winner_id.set(r.outcome.ticket().map(|t| t.id));
            })),
        };
        let r = create_ticket(&mut loser, "A", "key-1", &b0()).unwrap();
        assert_eq!(r.outcome.kind(), OutcomeKind::Replayed, "{}", db.name());
        assert_eq!(r.path, DecisionPath::AfterUniqueViolation, "{}", db.name());
        assert_eq!(r.outcome.ticket().map(|t| t.id), winner_id.get());
        assert_eq!(db.counts("A"), counts(1, 1, 1), "{}", db.name());
    }
}

#[test]
fn loser_with_another_body_gets_a_conflict_after_the_unique_violation() {
    for db in TestDb::all("loser_conflict") {
        let mut loser = CommitsAfterLookup {
            inner: db.open(),
            rival: Some(Box::new(|| {
                create_ticket(db.open().as_mut(), "A", "key-1", &b0()).unwrap();
            })),
        };
        let mut other = b0();
        other.title = "another title".into();
        let r = create_ticket(&mut loser, "A", "key-1", &other).unwrap();
        assert_eq!(r.outcome.kind(), OutcomeKind::Conflict, "{}", db.name());
        assert_eq!(r.path, DecisionPath::AfterUniqueViolation, "{}", db.name());
        assert_eq!(db.counts("A"), counts(1, 1, 1), "{}", db.name());
    }
}

#[test]
fn migrations_are_recorded_once_and_reapplying_is_a_no_op() {
    for db in TestDb::all("migrations") {
        drop(db.open());
        drop(db.open());
        assert_eq!(
            db.scalar("SELECT count(*) FROM schema_migrations"),
            ticketflow::store::migrate::POSTGRES.len() as i64,
            "{}",
            db.name()
        );
    }
    let db = TestDb::sqlite();
    drop(db.open());
    if let Some(path) = db.sqlite_path() {
        let mut s = ticketflow::store::sqlite::SqliteStore::open(path).unwrap();
        assert!(s.migrate().unwrap().is_empty());
        s.execute_batch("UPDATE schema_migrations SET checksum = 'edited'")
            .unwrap();
        let err = ticketflow::store::sqlite::SqliteStore::open(path).unwrap_err();
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
        let mut s = db.open();
        let first = create_ticket(s.as_mut(), "A", "key-1", &b0()).unwrap();
        // Nothing is older than an hour yet.
        assert_eq!(
            ticketflow::store::prune_receipts(&url, std::time::Duration::from_secs(3600)).unwrap(),
            0
        );
        assert_eq!(
            ticketflow::store::prune_receipts(&url, std::time::Duration::ZERO).unwrap(),
            1
        );
        assert_eq!(
            db.counts("A"),
            counts(1, 0, 1),
            "{}: tickets and events stay",
            db.name()
        );
        let again = create_ticket(s.as_mut(), "A", "key-1", &b0()).unwrap();
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
    for db in TestDb::all("big_inputs") {
        if let Some(config) = db.pg_config() {
            // Ten thousand commits: skip the WAL flush per commit, which this test is not about.
            let name = config.get_dbname().unwrap().to_string();
            db.execute(&format!(
                "ALTER DATABASE \"{name}\" SET synchronous_commit = off"
            ));
        }
        let mut s = db.open();
        let mut huge = b0();
        huge.body = "b".repeat(1024 * 1024);
        let err = create_ticket(s.as_mut(), "A", "key-1", &huge).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Validation(ValidationError::TooLong { field: "body", .. })
            ),
            "{err}"
        );
        assert_eq!(db.counts("A"), counts(0, 0, 0));
        for i in 0..10_000 {
            let r = create_ticket(s.as_mut(), "A", &format!("key-{i}"), &b0()).unwrap();
            assert_eq!(r.outcome.kind(), OutcomeKind::Created);
        }
        // Each retry still finds its own receipt among ten thousand.
        for i in [0, 4_999, 9_999] {
            let r = create_ticket(s.as_mut(), "A", &format!("key-{i}"), &b0()).unwrap();
            assert_eq!(r.outcome.kind(), OutcomeKind::Replayed);
        }
        assert_eq!(
            db.counts("A"),
            counts(10_000, 10_000, 10_000),
            "{}",
            db.name()
        );
    }
}
