//! Loom models of the create protocol (docs/PROTOCOL.md §4): the real `create_ticket` and
//! three wrong implementations of docs/PROTOCOL.md §8, run by 2 or 3 racing sessions over `store::memory`, whose
//! `Mutex`/`Condvar` are loom's under `cfg(ticketflow_loom)`. Loom runs each model once per
//! interleaving of the sessions' statements (every statement is one critical section), up to
//! a preemption bound, and every run is checked:
//!
//! - `same-body`: every racer sends the same request under one key → every racer gets the
//!   same ticket id, exactly one created it, and one ticket, one receipt and one
//!   `ticket.created` row are committed;
//! - `different-bodies`: every racer sends its own request under one key → one winner, the
//!   others conflict, and the receipt holds the winner's fingerprint and ticket;
//! - `observer`: one or two same-body racers and a reader that reads every committed row at
//!   once while they run → the reader never sees a receipt, ticket or event without the other
//!   two (and the same-body checks hold).
//!
//! The protocol must pass every model. Wrong implementations 3 (`check-then-insert`, on a
//! store without the receipts' unique index), 4 (`abandon-outer-tx`) and 5
//! (`split-transactions`) must fail every 2-racer model (5 also the 1-racer reader model, the
//! only one where a lone create can go wrong): the test asserts that loom found an
//! interleaving that breaks an invariant and prints it (the store's statement trace).
//!
//! The second create protocol (`on-conflict`: the receipt claimed first with `INSERT … ON
//! CONFLICT DO NOTHING`, ticket and event only if won) must pass the same six models, and its
//! wrong variant `on-conflict-ignores-loss` must fail every 2-racer model.
//!
//! The Redis lease in front of the receipt (`ticketflow_core::lease`), over the lease table
//! the memory store keeps beside its rows (`MemoryDb::lease_client`: Redis's `SET NX PX`,
//! compare-and-delete and `DEL`, one critical section each, in the same trace as the
//! statements). Racers run the real `create_with_lease`; a `clock` thread moves the lease
//! clock by one TTL at any point of the interleaving, expiring every lease taken before it,
//! so expiry can land inside a holder's transaction:
//!
//! - `lease-expiry-2`: 2 same-body racers and a `clock` thread that moves the clock at any
//!   point of the interleaving → the same-body checks (1/1/1, one
//!   id, one creator) and the lease's exclusion while it lives; some interleaving must have
//!   had a second holder take the expired lease while the first was still inside, with the
//!   receipt arbitrating (a reply after the unique violation);
//! - `lease-release-3`: 3 same-body racers, api-a slow: one TTL passes on the lease clock
//!   just before its commit (inside its transaction, at a fixed point of its thread rather
//!   than on a clock thread: a fourth thread multiplies the interleavings past the lane's
//!   budget) → the same checks, and some interleaving must have had an old holder's
//!   compare-and-delete meet a newer holder's token and leave it alone.
//!
//! The protocol with the lease must pass both. `lease-as-arbiter` (check-then-insert on a
//! store without the receipts' unique index, the lease its only guard) must fail
//! `lease-expiry-2`: expiry lets two holders in and both insert. `lease-unsafe-release` (the
//! protocol, released with a plain `DEL`) must fail `lease-release-3`: an old holder deletes
//! the newer holder's live lease and a third request takes it while the newer one is still
//! inside — the receipt still keeps the rows at 1/1/1, the lease's exclusion is what breaks.
//!
//! Bounds: 2 threads are explored up to 5 preemptions, 3 threads up to 3 (see [`bound`]).
//!
//! Compiled only with `--features loom` (`crates/core/build.rs` then sets `cfg(ticketflow_loom)`
//! on the core); run by `scripts/loom.sh`, which also collects one JSON line per model (written to
//! `$TICKETFLOW_LOOM_REPORT`) into `reports/loom.json`.

#![cfg(feature = "loom")]

use std::io::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use loom::model::Builder;
use ticketflow_core::domain::{OutboxEvent, Receipt};
use ticketflow_core::lease::{create_with_lease, LeaseConfig, LeaseOutcome, Release};
use ticketflow_core::store::memory::{
    lease_exclusion_breach, CommittedRows, LeaseEvent, LeaseEventKind, MemoryDb, MemoryOptions,
};
use ticketflow_core::store::{Backend, Claimed, Store, StoreResult};
use ticketflow_core::variants::{Implementation, Variant};
use ticketflow_core::{
    CreateReport, DecisionPath, Fingerprint, OutcomeKind, Protocol, RetryPolicy, Ticket,
    TicketPatch, TicketRequest,
};
use uuid::Uuid;

const TENANT: &str = "A";
const KEY: &str = "key-1";
/// Starts the panic message of a broken invariant, so a failing model is told apart from
/// any other panic (a loom deadlock, a bug in the harness).
const VIOLATION: &str = "INVARIANT VIOLATED";
/// Stack of each racer, in words (loom's default is 32 KiB).
const STACK_WORDS: usize = 64 * 1024;

/// One racer's create: [`Implementation::create`] on a new session, with one attempt
/// (under READ COMMITTED nothing here is transient, and a retry would sleep, which loom
/// cannot model). Errors are text with their database kind.
fn create(
    implementation: Implementation,
    db: &MemoryDb,
    racer: &str,
    request: &TicketRequest,
) -> Result<CreateReport, String> {
    let mut session = db.session(racer);
    implementation
        .create(&mut session, TENANT, KEY, request, &RetryPolicy::NONE)
        .map_err(|e| match e.db_kind() {
            Some(kind) => format!("{e} [{kind:?}]"),
            None => e.to_string(),
        })
}

/// The lease TTL of the lease models; the `clock` thread advances the lease clock by it once.
const LEASE_TTL: std::time::Duration = std::time::Duration::from_millis(2_000);

/// The lease configuration of the lease models. The wait bound is far beyond anything a model
/// run takes: time passes only on the `clock` thread, so a waiter stops when the receipt
/// shows or the lease is gone (released, deleted or expired) — which is when a waiter whose
/// bound equals the TTL would stop at the latest anyway.
fn lease_config() -> LeaseConfig {
    LeaseConfig {
        url: "memory".into(),
        ttl: LEASE_TTL,
        wait: std::time::Duration::from_secs(3_600),
    }
}

/// One racer's create behind the lease: [`create_with_lease`] with the lease table beside the
/// memory store and `release`, around [`Implementation::create`] as in [`create`].
fn create_leased(
    implementation: Implementation,
    release: Release,
    db: &MemoryDb,
    racer: &str,
    request: &TicketRequest,
    slow: bool,
) -> (Result<CreateReport, String>, LeaseOutcome) {
    let mut session = SlowCommit {
        session: db.session(racer),
        db: slow.then(|| db.clone()),
    };
    let mut leases = db.lease_client(racer);
    let (result, outcome) = create_with_lease(
        Some(&mut leases),
        &lease_config(),
        release,
        &mut session,
        TENANT,
        KEY,
        |s| implementation.create(s, TENANT, KEY, request, &RetryPolicy::NONE),
    );
    let result = result.map_err(|e| match e.db_kind() {
        Some(kind) => format!("{e} [{kind:?}]"),
        None => e.to_string(),
    });
    (result, outcome)
}

/// A memory session whose first `commit` is preceded by one TTL on the lease clock when `db`
/// is set: a holder paused past its lease inside its transaction, at a fixed point of its own
/// thread (cheaper for loom than a clock thread). Every other call passes through.
struct SlowCommit {
    session: ticketflow_core::store::memory::MemorySession,
    db: Option<MemoryDb>,
}

impl Store for SlowCommit {
    fn backend(&self) -> Backend {
        self.session.backend()
    }
    fn begin(&mut self) -> StoreResult<()> {
        self.session.begin()
    }
    fn savepoint(&mut self, name: &str) -> StoreResult<()> {
        self.session.savepoint(name)
    }
    fn rollback_to_savepoint(&mut self, name: &str) -> StoreResult<()> {
        self.session.rollback_to_savepoint(name)
    }
    fn release_savepoint(&mut self, name: &str) -> StoreResult<()> {
        self.session.release_savepoint(name)
    }
    fn commit(&mut self) -> StoreResult<()> {
        if let Some(db) = self.db.take() {
            db.advance_lease_clock(LEASE_TTL);
        }
        self.session.commit()
    }
    fn rollback(&mut self) -> StoreResult<()> {
        self.session.rollback()
    }
    fn find_receipt(&mut self, tenant_id: &str, key: &str) -> StoreResult<Option<Receipt>> {
        self.session.find_receipt(tenant_id, key)
    }
    fn insert_ticket(&mut self, ticket: &Ticket) -> StoreResult<()> {
        self.session.insert_ticket(ticket)
    }
    fn insert_outbox(&mut self, event: &OutboxEvent) -> StoreResult<()> {
        self.session.insert_outbox(event)
    }
    fn insert_receipt(&mut self, receipt: &Receipt) -> StoreResult<()> {
        self.session.insert_receipt(receipt)
    }
    fn insert_receipt_if_absent(&mut self, receipt: &Receipt) -> StoreResult<bool> {
        self.session.insert_receipt_if_absent(receipt)
    }
    fn claim_and_create(
        &mut self,
        ticket: &Ticket,
        event: &OutboxEvent,
        receipt: &Receipt,
    ) -> StoreResult<Claimed> {
        // The statement is the transaction: the pause comes before it.
        if let Some(db) = self.db.take() {
            db.advance_lease_clock(LEASE_TTL);
        }
        self.session.claim_and_create(ticket, event, receipt)
    }
    fn find_receipt_and_ticket(
        &mut self,
        tenant_id: &str,
        key: &str,
    ) -> StoreResult<Option<(Receipt, Option<Ticket>)>> {
        self.session.find_receipt_and_ticket(tenant_id, key)
    }
    fn find_ticket(&mut self, tenant_id: &str, id: Uuid) -> StoreResult<Option<Ticket>> {
        self.session.find_ticket(tenant_id, id)
    }
    fn update_ticket(
        &mut self,
        tenant_id: &str,
        id: Uuid,
        patch: &TicketPatch,
        now: chrono::DateTime<chrono::Utc>,
    ) -> StoreResult<Option<Ticket>> {
        self.session.update_ticket(tenant_id, id, patch, now)
    }
}

/// The memory store an implementation runs on: without the receipts' unique index for
/// `check-then-insert`, and with the statement trace a failing model prints.
fn memory_options(implementation: Implementation) -> MemoryOptions {
    MemoryOptions {
        receipt_unique_index: !matches!(implementation, Implementation::Variant(v) if v.drops_receipt_constraint()),
        trace: true,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    SameBody,
    DifferentBodies,
    Observer,
    /// Same-body racers behind the lease, and the clock.
    LeaseExpiry,
    /// Same-body racers behind the lease, the first one slow (a TTL passes before its
    /// commit); checks that an old holder's release met a newer token.
    LeaseRelease,
}

impl Shape {
    fn name(self) -> &'static str {
        match self {
            Shape::SameBody => "same-body",
            Shape::DifferentBodies => "different-bodies",
            Shape::Observer => "observer",
            Shape::LeaseExpiry => "lease-expiry",
            Shape::LeaseRelease => "lease-release",
        }
    }

    fn leased(self) -> bool {
        matches!(self, Shape::LeaseExpiry | Shape::LeaseRelease)
    }

    /// Threads beside the racers: the observer's reader, `lease-expiry`'s clock.
    fn extra_threads(self) -> usize {
        usize::from(matches!(self, Shape::Observer | Shape::LeaseExpiry))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Pass,
    Fail,
}

impl Expect {
    fn name(self) -> &'static str {
        match self {
            Expect::Pass => "pass",
            Expect::Fail => "fail",
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Model {
    shape: Shape,
    implementation: Implementation,
    racers: usize,
    preemption_bound: usize,
    expected: Expect,
    /// How a lease holder releases (lease shapes only).
    release: Release,
    /// The name recorded for a wrong implementation that is not (only) a [`Variant`]: the
    /// wrong uses of the lease (`Variant::LEASE`).
    label: Option<&'static str>,
}

const RACERS: [&str; 3] = ["api-a", "api-b", "api-c"];

impl Model {
    fn name(&self) -> String {
        format!("{}-{}", self.shape.name(), self.racers)
    }

    /// Loom threads: the racers, the reader of the observer model, the clock of the lease
    /// models.
    fn threads(&self) -> usize {
        self.racers + self.shape.extra_threads()
    }

    /// What the report names the implementation: the variant's or protocol's name, `… +
    /// lease` for the protocol behind the lease, or the lease variant's label.
    fn implementation_name(&self) -> String {
        match (self.label, self.shape.leased()) {
            (Some(label), _) => label.to_string(),
            (None, true) => format!("{} + lease", self.implementation.name()),
            (None, false) => self.implementation.name().to_string(),
        }
    }

    /// `compare-and-delete` or `plain-del` for the lease models.
    fn release_name(&self) -> Option<&'static str> {
        self.shape.leased().then_some(match self.release {
            Release::CompareAndDelete => "compare-and-delete",
            Release::PlainDelete => "plain-del",
        })
    }

    fn request(&self, racer: usize) -> TicketRequest {
        let mut request = TicketRequest {
            actor_id: "u1".into(),
            title: "printer jammed".into(),
            body: "E-42".into(),
            priority: "high".into(),
        };
        if self.shape == Shape::DifferentBodies {
            request.body = format!("E-42 seen by {}", RACERS[racer]);
        }
        request
    }

    /// One execution: start the racers (and the reader), join them, check the invariants.
    /// Panics with [`VIOLATION`], the racers' results and the statement trace when an
    /// invariant does not hold.
    fn execute(&self, stats: &Stats) {
        let db = MemoryDb::with_options(memory_options(self.implementation));
        let racers: Vec<_> = (0..self.racers)
            .map(|i| {
                let (db, model, request) = (db.clone(), *self, self.request(i));
                loom::thread::Builder::new()
                    .stack_size(STACK_WORDS)
                    .spawn(move || {
                        if model.shape.leased() {
                            // In `lease-release`, api-a is slow: a TTL passes just before its
                            // commit.
                            let slow = model.shape == Shape::LeaseRelease && i == 0;
                            let (result, outcome) = create_leased(
                                model.implementation,
                                model.release,
                                &db,
                                RACERS[i],
                                &request,
                                slow,
                            );
                            (result, Some(outcome))
                        } else {
                            (create(model.implementation, &db, RACERS[i], &request), None)
                        }
                    })
                    .expect("spawn a racer")
            })
            .collect();
        let clock = (self.shape == Shape::LeaseExpiry).then(|| {
            let db = db.clone();
            loom::thread::Builder::new()
                .stack_size(STACK_WORDS)
                .spawn(move || db.advance_lease_clock(LEASE_TTL))
                .expect("spawn the clock")
        });
        let reader = (self.shape == Shape::Observer).then(|| {
            let db = db.clone();
            loom::thread::Builder::new()
                .stack_size(STACK_WORDS)
                .spawn(move || db.observe("reader"))
                .expect("spawn the reader")
        });
        let (results, leases): (Vec<Result<CreateReport, String>>, Vec<Option<LeaseOutcome>>) =
            racers
                .into_iter()
                .map(|h| h.join().expect("racers do not panic"))
                .unzip();
        let observed = reader.map(|h| h.join().expect("the reader does not panic"));
        if let Some(clock) = clock {
            clock.join().expect("the clock does not panic");
        }
        let committed = db.committed();
        let history = db.lease_history();
        stats.record(&results, &db);
        stats.record_leases(&results, &leases, &history);
        let checked = self
            .check(&results, observed.as_ref(), &committed)
            .and_then(|()| self.check_lease(&history, &committed));
        if let Err(violation) = checked {
            let mut text = format!(
                "{VIOLATION}: {violation}\nmodel {} / {}: {} thread(s)\nracers:\n",
                self.name(),
                self.implementation_name(),
                self.threads()
            );
            for (i, result) in results.iter().enumerate() {
                let lease = match &leases[i] {
                    Some(outcome) => format!(" [lease: {}]", describe_lease(outcome)),
                    None => String::new(),
                };
                text.push_str(&format!("  {}: {}{lease}\n", RACERS[i], describe(result)));
            }
            text.push_str("interleaving (statements in the order the store ran them):\n");
            for entry in db.trace() {
                text.push_str(&format!("  {entry}\n"));
            }
            panic!("{text}");
        }
    }

    /// The lease models only: the lease's exclusion while it lives (no request takes it while
    /// another is inside under a token that neither expired nor was flushed).
    fn check_lease(&self, history: &[LeaseEvent], committed: &CommittedRows) -> Result<(), String> {
        if !self.shape.leased() {
            return Ok(());
        }
        lease_exclusion_breach(history).map_err(|breach| {
            format!(
                "lease exclusion broken: {breach}; committed rows {} (the receipt still arbitrated)",
                committed.counts(TENANT)
            )
        })
    }

    fn check(
        &self,
        results: &[Result<CreateReport, String>],
        observed: Option<&CommittedRows>,
        committed: &CommittedRows,
    ) -> Result<(), String> {
        let mut reports = Vec::new();
        for (i, result) in results.iter().enumerate() {
            match result {
                Ok(r) => reports.push(r),
                Err(e) => return Err(format!("{} failed: {e}", RACERS[i])),
            }
        }
        if let Some(seen) = observed {
            whole(seen).map_err(|e| format!("the reader saw a half-committed create: {e}"))?;
        }
        whole(committed).map_err(|e| format!("committed rows after the race: {e}"))?;
        let counts = committed.counts(TENANT);
        if (counts.tickets, counts.receipts, counts.created_events) != (1, 1, 1) {
            return Err(format!(
                "committed tickets/receipts/created events = {counts}, want 1/1/1"
            ));
        }
        let created: Vec<usize> = (0..reports.len())
            .filter(|&i| reports[i].outcome.kind() == OutcomeKind::Created)
            .collect();
        if created.len() != 1 {
            return Err(format!("{} racers created, want exactly 1", created.len()));
        }
        let winner = created[0];
        let winner_id = reports[winner].outcome.ticket().map(|t| t.id);
        let receipt = &committed.receipts[0];
        if Some(receipt.ticket_id) != winner_id {
            return Err(format!(
                "the receipt points at {}, not at the creator's ticket",
                receipt.ticket_id
            ));
        }
        if receipt.payload_hash != Fingerprint::of(&self.request(winner)).hash {
            return Err("the receipt does not hold the creator's fingerprint".into());
        }
        for (i, report) in reports.iter().enumerate() {
            let want = match self.shape {
                _ if i == winner => OutcomeKind::Created,
                Shape::SameBody | Shape::Observer | Shape::LeaseExpiry | Shape::LeaseRelease => {
                    OutcomeKind::Replayed
                }
                Shape::DifferentBodies => OutcomeKind::Conflict,
            };
            if report.outcome.kind() != want {
                return Err(format!(
                    "{} got {}, want {want}",
                    RACERS[i],
                    report.outcome.kind()
                ));
            }
            if want == OutcomeKind::Replayed && report.outcome.ticket().map(|t| t.id) != winner_id {
                return Err(format!("{} holds another ticket id", RACERS[i]));
            }
        }
        Ok(())
    }
}

/// Counters over all executions of one model (std atomics: they live outside loom).
#[derive(Default)]
struct Stats {
    executions: AtomicUsize,
    /// Executions in which some transaction waited for another's lock.
    lock_waits: AtomicUsize,
    /// Racer replies decided after a unique violation (docs/PROTOCOL.md §4.2 step 7) or, for `on-conflict`,
    /// after the receipt claim found the key taken.
    after_unique_violation: AtomicUsize,
    /// Lease models: executions in which a request took the lease while another was inside
    /// (its lease expired) and some reply came after the unique violation: the receipt
    /// arbitrated between two holders.
    two_holders_arbitrated: AtomicUsize,
    /// Lease models: executions in which a request found the lease held, waited and saw the
    /// receipt (the lease spared it an insert).
    waited_saw_receipt: AtomicUsize,
    /// Lease models: executions in which an old holder's release met a newer holder's token
    /// (compare-and-delete left it alone; a plain DEL removed it).
    release_met_newer_token: AtomicUsize,
}

impl Stats {
    fn record_leases(
        &self,
        results: &[Result<CreateReport, String>],
        outcomes: &[Option<LeaseOutcome>],
        history: &[LeaseEvent],
    ) {
        if outcomes.iter().all(Option::is_none) {
            return;
        }
        // (client, token) of the requests inside, from their acquire to their own release.
        let mut inside: Vec<(&str, &str)> = Vec::new();
        let mut two_holders = false;
        let mut met_newer = false;
        for event in history {
            let client = event.client.as_str();
            match &event.kind {
                LeaseEventKind::Acquired { token, .. } => {
                    two_holders |= !inside.is_empty();
                    inside.push((client, token));
                }
                LeaseEventKind::Released { .. } => inside.retain(|(c, _)| *c != client),
                LeaseEventKind::ReleaseMissed { holder, .. } => {
                    met_newer |= holder.is_some();
                    inside.retain(|(c, _)| *c != client);
                }
                LeaseEventKind::Deleted { removed, .. } => {
                    let own = inside.iter().find(|(c, _)| *c == client).map(|(_, t)| *t);
                    met_newer |= removed.is_some() && removed.as_deref() != own;
                    inside.retain(|(c, _)| *c != client);
                }
                _ => {}
            }
        }
        let after_unique_violation = results.iter().any(|r| {
            matches!(r, Ok(r) if matches!(
                r.path,
                DecisionPath::AfterUniqueViolation | DecisionPath::AfterInsertConflict
            ))
        });
        if two_holders && after_unique_violation {
            self.two_holders_arbitrated.fetch_add(1, Ordering::Relaxed);
        }
        if met_newer {
            self.release_met_newer_token.fetch_add(1, Ordering::Relaxed);
        }
        if outcomes.iter().any(|o| {
            matches!(
                o,
                Some(LeaseOutcome::Waited {
                    receipt_seen: true,
                    ..
                })
            )
        }) {
            self.waited_saw_receipt.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn record(&self, results: &[Result<CreateReport, String>], db: &MemoryDb) {
        let after = results
            .iter()
            .filter(|r| {
                matches!(r, Ok(r) if matches!(
                    r.path,
                    DecisionPath::AfterUniqueViolation | DecisionPath::AfterInsertConflict
                ))
            })
            .count();
        self.after_unique_violation
            .fetch_add(after, Ordering::Relaxed);
        if db.trace().iter().any(|t| t.result.starts_with("waits for")) {
            self.lock_waits.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Every row belongs to a whole create: each receipt points at a ticket that has exactly one
/// `ticket.created` event, and each ticket has a receipt.
fn whole(rows: &CommittedRows) -> Result<(), String> {
    let created = |id: Uuid| {
        rows.outbox
            .iter()
            .filter(|e| e.aggregate_id == id && e.event_type == "ticket.created")
            .count()
    };
    for r in &rows.receipts {
        let ticket = rows
            .tickets
            .iter()
            .find(|t| t.id == r.ticket_id && t.tenant_id == r.tenant_id);
        if ticket.is_none() {
            return Err(format!(
                "receipt {}/{} without its ticket",
                r.tenant_id, r.idempotency_key
            ));
        }
        if created(r.ticket_id) != 1 {
            return Err(format!(
                "receipt {}/{} whose ticket has {} ticket.created events",
                r.tenant_id,
                r.idempotency_key,
                created(r.ticket_id)
            ));
        }
    }
    for t in &rows.tickets {
        if !rows.receipts.iter().any(|r| r.ticket_id == t.id) {
            return Err(format!(
                "ticket {} without a receipt ({} ticket.created events)",
                short(t.id),
                created(t.id)
            ));
        }
    }
    for e in &rows.outbox {
        if !rows.tickets.iter().any(|t| t.id == e.aggregate_id) {
            return Err(format!("{} event without its ticket", e.event_type));
        }
    }
    Ok(())
}

fn short(id: Uuid) -> String {
    id.simple().to_string()[..8].to_string()
}

fn describe_lease(outcome: &LeaseOutcome) -> String {
    match outcome {
        LeaseOutcome::Held { released: true } => "held; its release deleted a lease".into(),
        LeaseOutcome::Held { released: false } => "held; its release deleted nothing".into(),
        LeaseOutcome::Waited {
            receipt_seen: true, ..
        } => "waited, saw the receipt".into(),
        LeaseOutcome::Waited { .. } => "waited until the lease was gone".into(),
        LeaseOutcome::NoLease { reason } => format!("none ({reason})"),
    }
}

fn describe(result: &Result<CreateReport, String>) -> String {
    match result {
        Ok(r) => match r.outcome.ticket() {
            Some(t) => format!("{} ticket {} ({})", r.outcome.kind(), short(t.id), r.path),
            None => format!("{} ({})", r.outcome.kind(), r.path),
        },
        Err(e) => format!("error: {e}"),
    }
}

/// Loom's limit on scheduling decisions in one execution (its default), set here so the
/// environment (`LOOM_MAX_BRANCHES`) cannot change a model.
const MAX_BRANCHES: usize = 1_000;

/// Keeps the panic hook from printing an invariant violation a second time: [`run`] prints
/// it (and asserts on it); every other panic is printed as usual.
fn quiet_violations() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let message = payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied());
            if !message.is_some_and(|m| m.starts_with(VIOLATION)) {
                default(info);
            }
        }));
    });
}

/// Runs `model` under loom, checks that its result is the expected one, prints and records
/// (`$TICKETFLOW_LOOM_REPORT`) bounds, interleavings explored and wall time.
fn run(model: Model) {
    let stats = std::sync::Arc::new(Stats::default());
    quiet_violations();
    let mut builder = Builder::new();
    builder.max_threads = model.threads() + 1;
    builder.max_branches = MAX_BRANCHES;
    builder.preemption_bound = Some(model.preemption_bound);
    // Exhaustive within the bound: no cut-off by count or time, whatever the environment says.
    builder.max_permutations = None;
    builder.max_duration = None;
    builder.checkpoint_file = None;
    let counter = stats.clone();
    let start = Instant::now();
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        builder.check(move || {
            counter.executions.fetch_add(1, Ordering::Relaxed);
            model.execute(&counter);
        })
    }));
    let wall_ms = start.elapsed().as_millis();
    let interleavings = stats.executions.load(Ordering::Relaxed);
    let count = |c: &AtomicUsize| c.load(Ordering::Relaxed);
    let (lock_waits, after_unique_violation) = (
        count(&stats.lock_waits),
        count(&stats.after_unique_violation),
    );
    let (two_holders_arbitrated, waited_saw_receipt, release_met_newer_token) = (
        count(&stats.two_holders_arbitrated),
        count(&stats.waited_saw_receipt),
        count(&stats.release_met_newer_token),
    );
    let (result, finding) = match &outcome {
        Ok(()) => (Expect::Pass, None),
        Err(payload) => {
            let message = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "(non-string panic)".into());
            (Expect::Fail, Some(message))
        }
    };
    let lease_line = match model.release_name() {
        Some(release) => format!(
            "; lease released by {release}: {two_holders_arbitrated} with two holders and the \
             receipt arbitrating, {waited_saw_receipt} with a waiter that saw the receipt, \
             {release_met_newer_token} with a release meeting a newer token"
        ),
        None => String::new(),
    };
    println!(
        "model {} / {}: {} thread(s), preemption bound {}: {} interleaving(s) in {} ms \
         ({} with a lock wait, {} replies after a unique violation{lease_line}): {} (expected {})",
        model.name(),
        model.implementation_name(),
        model.threads(),
        model.preemption_bound,
        interleavings,
        wall_ms,
        lock_waits,
        after_unique_violation,
        result.name(),
        model.expected.name()
    );
    if let Some(message) = &finding {
        println!("{message}");
    }
    if let Ok(path) = std::env::var("TICKETFLOW_LOOM_REPORT") {
        let mut line = serde_json::json!({
            "name": model.name(),
            "implementation": model.implementation_name(),
            "threads": model.threads(),
            "racers": model.racers,
            "preemption_bound": model.preemption_bound,
            "interleavings": interleavings,
            "wall_ms": wall_ms as u64,
            "expected": model.expected.name(),
            "result": result.name(),
            "executions_with_lock_wait": lock_waits,
            "replies_after_unique_violation": after_unique_violation,
            "finding": finding.as_deref().and_then(|m| m.lines().next()),
        });
        if let Some(release) = model.release_name() {
            line["lease_release"] = release.into();
            line["executions_with_two_holders_arbitrated"] = two_holders_arbitrated.into();
            line["executions_with_a_waiter_that_saw_the_receipt"] = waited_saw_receipt.into();
            line["executions_with_a_release_meeting_a_newer_token"] =
                release_met_newer_token.into();
        }
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("open {path}: {e}"));
        writeln!(file, "{line}").unwrap_or_else(|e| panic!("write {path}: {e}"));
    }
    match (model.expected, &finding) {
        (Expect::Pass, Some(message)) => panic!("the model should pass but failed:\n{message}"),
        (Expect::Fail, None) => panic!(
            "loom found no interleaving that breaks {} ({} explored)",
            model.implementation_name(),
            interleavings
        ),
        // Not vacuous either: expiry let a second holder in while the first was inside, and
        // the receipt decided between them; and the lease did spare some waiter its insert.
        (Expect::Pass, None) if model.shape == Shape::LeaseExpiry => assert!(
            two_holders_arbitrated > 0 && waited_saw_receipt > 0,
            "the lease model never had two holders with the receipt arbitrating \
             ({two_holders_arbitrated}), or never a waiter that saw the receipt \
             ({waited_saw_receipt})"
        ),
        // An old holder's release met a newer holder's token (and left it alone).
        (Expect::Pass, None) if model.shape == Shape::LeaseRelease => assert!(
            release_met_newer_token > 0,
            "the lease model never had an old holder's release meet a newer token"
        ),
        (Expect::Fail, Some(message)) => assert!(
            message.starts_with(VIOLATION),
            "the model failed, but not on an invariant:\n{message}"
        ),
        // Not vacuous: with 2 or more racers some interleaving must have made one wait for
        // another's uncommitted key and answer after the unique violation (docs/PROTOCOL.md §4.2 step 7).
        (Expect::Pass, None) if model.racers >= 2 => assert!(
            lock_waits > 0 && after_unique_violation > 0,
            "the model never reached the unique-violation path \
             ({lock_waits} executions with a lock wait, {after_unique_violation} replies after it)"
        ),
        (Expect::Pass, None) => {}
    }
}

fn protocol(shape: Shape, racers: usize) -> Model {
    let threads = racers + shape.extra_threads();
    Model {
        shape,
        implementation: Implementation::Protocol(Protocol::Savepoint),
        racers,
        preemption_bound: bound(threads),
        expected: Expect::Pass,
        release: Release::CompareAndDelete,
        label: None,
    }
}

/// `lease-as-arbiter`: the lease is the only guard — check-then-insert on a store
/// without the receipts' unique index, behind a lease released safely. It must fail.
fn lease_as_arbiter(shape: Shape, racers: usize) -> Model {
    Model {
        implementation: Implementation::Variant(Variant::CheckThenInsert),
        expected: Expect::Fail,
        label: Some("lease-as-arbiter"),
        ..protocol(shape, racers)
    }
}

/// `lease-unsafe-release`: the protocol behind a lease released with a plain
/// `DEL`. It must fail.
fn lease_unsafe_release(shape: Shape, racers: usize) -> Model {
    Model {
        expected: Expect::Fail,
        release: Release::PlainDelete,
        label: Some("lease-unsafe-release"),
        ..protocol(shape, racers)
    }
}

/// A model of the `on-conflict` protocol: it must pass.
fn on_conflict(shape: Shape, racers: usize) -> Model {
    Model {
        implementation: Implementation::Protocol(Protocol::OnConflict),
        ..protocol(shape, racers)
    }
}

/// A model of the `single-statement` protocol: it must pass.
fn single_statement(shape: Shape, racers: usize) -> Model {
    Model {
        implementation: Implementation::Protocol(Protocol::SingleStatement),
        ..protocol(shape, racers)
    }
}

/// A model the protocol passes, run on a wrong implementation: it must fail.
fn wrong(variant: Variant, shape: Shape, racers: usize) -> Model {
    Model {
        implementation: Implementation::Variant(variant),
        expected: Expect::Fail,
        ..protocol(shape, racers)
    }
}

/// The preemption bound of a model with this many threads: how many times loom may switch
/// away from a thread that could go on. Every interleaving within the bound is explored;
/// each step up multiplies the interleavings by about 3 (2 threads) or 10 (3 threads).
fn bound(threads: usize) -> usize {
    if threads <= 2 {
        5
    } else {
        3
    }
}

#[test]
fn protocol_same_body_2_racers() {
    run(protocol(Shape::SameBody, 2));
}

#[test]
fn protocol_same_body_3_racers() {
    run(protocol(Shape::SameBody, 3));
}

#[test]
fn protocol_different_bodies_2_racers() {
    run(protocol(Shape::DifferentBodies, 2));
}

#[test]
fn protocol_different_bodies_3_racers() {
    run(protocol(Shape::DifferentBodies, 3));
}

#[test]
fn protocol_reader_beside_1_racer_never_sees_a_half_create() {
    run(protocol(Shape::Observer, 1));
}

#[test]
fn protocol_reader_beside_2_racers_never_sees_a_half_create() {
    run(protocol(Shape::Observer, 2));
}

#[test]
fn check_then_insert_fails_same_body() {
    run(wrong(Variant::CheckThenInsert, Shape::SameBody, 2));
}

#[test]
fn check_then_insert_fails_different_bodies() {
    run(wrong(Variant::CheckThenInsert, Shape::DifferentBodies, 2));
}

#[test]
fn check_then_insert_fails_observer() {
    run(wrong(Variant::CheckThenInsert, Shape::Observer, 2));
}

#[test]
fn abandon_outer_tx_fails_same_body() {
    run(wrong(Variant::AbandonOuterTx, Shape::SameBody, 2));
}

#[test]
fn abandon_outer_tx_fails_different_bodies() {
    run(wrong(Variant::AbandonOuterTx, Shape::DifferentBodies, 2));
}

#[test]
fn abandon_outer_tx_fails_observer() {
    run(wrong(Variant::AbandonOuterTx, Shape::Observer, 2));
}

#[test]
fn split_transactions_fails_same_body() {
    run(wrong(Variant::SplitTransactions, Shape::SameBody, 2));
}

#[test]
fn split_transactions_fails_different_bodies() {
    run(wrong(Variant::SplitTransactions, Shape::DifferentBodies, 2));
}

#[test]
fn split_transactions_fails_observer() {
    run(wrong(Variant::SplitTransactions, Shape::Observer, 2));
}

/// With one racer nothing else can go wrong: the only failure left is a reader that sees a
/// ticket before its receipt, the concurrent-reader half state of docs/PROTOCOL.md §8, #5.
#[test]
fn split_transactions_fails_reader_beside_1_racer() {
    run(wrong(Variant::SplitTransactions, Shape::Observer, 1));
}

#[test]
fn on_conflict_same_body_2_racers() {
    run(on_conflict(Shape::SameBody, 2));
}

#[test]
fn on_conflict_same_body_3_racers() {
    run(on_conflict(Shape::SameBody, 3));
}

#[test]
fn on_conflict_different_bodies_2_racers() {
    run(on_conflict(Shape::DifferentBodies, 2));
}

#[test]
fn on_conflict_different_bodies_3_racers() {
    run(on_conflict(Shape::DifferentBodies, 3));
}

#[test]
fn on_conflict_reader_beside_1_racer_never_sees_a_half_create() {
    run(on_conflict(Shape::Observer, 1));
}

#[test]
fn on_conflict_reader_beside_2_racers_never_sees_a_half_create() {
    run(on_conflict(Shape::Observer, 2));
}

#[test]
fn on_conflict_ignores_loss_fails_same_body() {
    run(wrong(Variant::OnConflictIgnoresLoss, Shape::SameBody, 2));
}

#[test]
fn on_conflict_ignores_loss_fails_different_bodies() {
    run(wrong(
        Variant::OnConflictIgnoresLoss,
        Shape::DifferentBodies,
        2,
    ));
}

#[test]
fn on_conflict_ignores_loss_fails_observer() {
    run(wrong(Variant::OnConflictIgnoresLoss, Shape::Observer, 2));
}

#[test]
fn single_statement_same_body_2_racers() {
    run(single_statement(Shape::SameBody, 2));
}

#[test]
fn single_statement_same_body_3_racers() {
    run(single_statement(Shape::SameBody, 3));
}

#[test]
fn single_statement_different_bodies_2_racers() {
    run(single_statement(Shape::DifferentBodies, 2));
}

#[test]
fn single_statement_different_bodies_3_racers() {
    run(single_statement(Shape::DifferentBodies, 3));
}

#[test]
fn single_statement_reader_beside_1_racer_never_sees_a_half_create() {
    run(single_statement(Shape::Observer, 1));
}

#[test]
fn single_statement_reader_beside_2_racers_never_sees_a_half_create() {
    run(single_statement(Shape::Observer, 2));
}

#[test]
fn single_statement_skips_reread_fails_same_body() {
    run(wrong(
        Variant::SingleStatementSkipsReread,
        Shape::SameBody,
        2,
    ));
}

#[test]
fn single_statement_skips_reread_fails_different_bodies() {
    run(wrong(
        Variant::SingleStatementSkipsReread,
        Shape::DifferentBodies,
        2,
    ));
}

#[test]
fn lease_expiry_during_the_transaction_2_racers() {
    run(protocol(Shape::LeaseExpiry, 2));
}

#[test]
fn lease_release_never_frees_a_newer_holders_lease_3_racers() {
    run(protocol(Shape::LeaseRelease, 3));
}

#[test]
fn lease_as_arbiter_fails_lease_expiry() {
    run(lease_as_arbiter(Shape::LeaseExpiry, 2));
}

#[test]
fn lease_unsafe_release_fails_lease_release() {
    run(lease_unsafe_release(Shape::LeaseRelease, 3));
}
