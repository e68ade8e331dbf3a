//! An in-memory [`Store`] with the PostgreSQL READ COMMITTED semantics the create protocol
//! relies on, built on the crate's `sync` shim: std types in ordinary tests, loom's under
//! `cfg(ticketflow_loom)`, where the model checker explores every interleaving of the
//! sessions that share one [`MemoryDb`] (`tests/loom/`).
//!
//! What it models, statement by statement (every statement is one critical section, as one
//! round trip to a server is one step of a race):
//!
//! - a session runs one transaction at a time; a statement outside `begin` … `commit` runs
//!   in a transaction of its own (autocommit);
//! - each statement of a transaction sees the rows committed before it (READ COMMITTED) plus
//!   the transaction's own writes; other transactions' uncommitted rows are invisible; a
//!   commit makes all of its rows visible at once;
//! - the unique index on receipts (`tenant_id`, `idempotency_key`): an insert that meets a
//!   committed receipt, or one of its own transaction, fails with unique violation (SQLSTATE
//!   23505); one that meets another transaction's uncommitted key waits until that
//!   transaction ends, then fails with 23505 if it committed and proceeds if it rolled back
//!   (or rolled back to a savepoint taken before its insert);
//! - row locks for [`Store::update_ticket`]: a second updater of a ticket waits for the
//!   first transaction to end, then updates the latest committed version;
//! - a lock wait that would close a cycle fails with deadlock (40P01), as PostgreSQL's
//!   detector would (it picks this waiter as the victim);
//! - the failed-transaction state: after a statement error inside a transaction, every
//!   statement fails with `in_failed_sql_transaction` (25P02) until `ROLLBACK TO SAVEPOINT`
//!   of a savepoint taken before the error, or `rollback`; `commit` of a failed transaction
//!   rolls it back and reports success, as PostgreSQL answers `COMMIT` there with `ROLLBACK`;
//! - savepoints: `ROLLBACK TO` keeps the savepoint and releases the locks taken after it,
//!   `RELEASE` drops it and every later one; an unknown name is 3B001 and fails the
//!   transaction;
//! - foreign keys to a ticket of the same tenant (23503): an outbox row's at its insert, a
//!   receipt's at commit (deferred, as migration 0002 makes it on the SQL backends; a failed
//!   check rolls the transaction back), and the primary keys on ticket and event ids (23505,
//!   checked against visible rows only: the ids are fresh UUIDs, so no insert ever waits on
//!   them);
//! - `INSERT … ON CONFLICT DO NOTHING` on the receipt ([`Store::insert_receipt_if_absent`]):
//!   waits for an in-flight holder of the key like a plain insert, then does nothing, without
//!   an error, if the key is taken.
//! - the `single-statement` protocol's statement ([`Store::claim_and_create`]) outside a
//!   transaction: its inserts and its commit are two steps (as on a server, where another
//!   session can meet the uncommitted key in between); a receipt committed before it is met
//!   with its ticket; an in-flight holder is waited for, and if it commits the statement
//!   answers "taken, unseen", since that receipt is newer than the statement's snapshot.
//!
//! What it does not model: snapshots longer than a statement (REPEATABLE READ,
//! SERIALIZABLE), durability and crashes, SQL, the CHECK constraints of the migrations.
//!
//! [`MemoryOptions::receipt_unique_index`] `= false` is the schema of docs/PROTOCOL.md §8, #3: receipts
//! are neither checked nor waited for. [`MemoryOptions::trace`] records every statement with
//! its session and result ([`MemoryDb::trace`]), in the order the database ran them: a failing
//! loom model prints it as the interleaving it found.
//!
//! **Leases beside the rows.** [`MemoryDb::lease_client`] gives a session's view of a lease
//! table with Redis's semantics ([`crate::store::leases::MemoryLeases`]: `SET NX PX`,
//! compare-and-delete, a plain `DEL`, expiry) kept under the same lock as the rows, so loom
//! interleaves lease operations with statements, the trace shows both in one order, and
//! every lease operation is kept in [`MemoryDb::lease_history`] (which token was taken,
//! which release removed which token). Time passes only when the model says so
//! ([`MemoryDb::advance_lease_clock`]); a request that found the lease held pauses until a
//! commit or a lease operation happens ([`MemoryLeaseClient`]'s `pause`), not for a while.
//!
//! **Invariant:** every read is scoped by tenant (tickets by (`tenant_id`, `id`), receipts by
//! (`tenant_id`, `idempotency_key`)), as the [`Store`] trait requires.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::leases::{LeaseError, Leases, MemoryLeases};
use crate::domain::{OutboxEvent, Receipt, Ticket, TicketPatch, TICKET_CREATED};
use crate::error::{DbErrorKind, StoreError};
use crate::store::{Backend, Claimed, RowCounts, Store, StoreResult};
use crate::sync::{self, Arc, Condvar, Mutex, MutexGuard};

const RECEIPTS_PKEY: &str = "idempotency_receipts_pkey";

/// How a [`MemoryDb`] behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryOptions {
    /// The unique index on receipts (`tenant_id`, `idempotency_key`); default `true`.
    /// `false` is the schema wrong implementation 3 (`check-then-insert`) runs on.
    pub receipt_unique_index: bool,
    /// Record every statement in [`MemoryDb::trace`]; default `false` (the trace grows
    /// without bound).
    pub trace: bool,
}

impl Default for MemoryOptions {
    fn default() -> Self {
        MemoryOptions {
            receipt_unique_index: true,
            trace: false,
        }
    }
}

/// Every committed row, read at one instant (one critical section): what a reader outside
/// any transaction can see.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommittedRows {
    /// Tickets, in commit order.
    pub tickets: Vec<Ticket>,
    /// Outbox rows, in commit order.
    pub outbox: Vec<OutboxEvent>,
    /// Receipts, in commit order.
    pub receipts: Vec<Receipt>,
}

impl CommittedRows {
    /// Rows of one tenant, counted like the SQL backends' `row_counts`.
    pub fn counts(&self, tenant_id: &str) -> RowCounts {
        let n = |c: usize| c as i64;
        RowCounts {
            tickets: n(self
                .tickets
                .iter()
                .filter(|t| t.tenant_id == tenant_id)
                .count()),
            receipts: n(self
                .receipts
                .iter()
                .filter(|r| r.tenant_id == tenant_id)
                .count()),
            created_events: n(self
                .outbox
                .iter()
                .filter(|e| e.tenant_id == tenant_id && e.event_type == TICKET_CREATED)
                .count()),
        }
    }
}

/// One statement as the database ran it: which session, what, and what came back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceEntry {
    /// The session's name ([`MemoryDb::session`]).
    pub session: String,
    /// The statement, e.g. `insert receipt (A, key-1)`.
    pub statement: String,
    /// `ok`, a short description of the rows returned, `waits for api-a`, or `error 23505`.
    pub result: String,
}

impl fmt::Display for TraceEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:<10} {:<44} -> {}",
            self.session, self.statement, self.result
        )
    }
}

/// A shared in-memory database: the committed rows, the locks of transactions in flight
/// (unique-index entries and row locks) and who waits for whom. Cloning gives another handle
/// on the same database; [`MemoryDb::session`] opens a session on it.
#[derive(Clone)]
pub struct MemoryDb {
    shared: Arc<Shared>,
}

struct Shared {
    options: MemoryOptions,
    state: Mutex<State>,
    /// Signalled when locks are released: lock waiters re-check.
    released: Condvar,
    /// Signalled when a transaction starts waiting for a lock: for
    /// [`MemoryDb::wait_for_waiters`]. Separate from `released`, or two waiters would wake
    /// each other for ever.
    waits_changed: Condvar,
    /// Signalled, while a lease client is paused, when a commit or a lease operation changed
    /// something ([`State::changes`]).
    changed: Condvar,
}

type TxId = u64;

#[derive(Default)]
struct State {
    tickets: Vec<Ticket>,
    outbox: Vec<OutboxEvent>,
    receipts: Vec<Receipt>,
    /// Lock → the transaction holding it (and its session's name, for the trace).
    locks: BTreeMap<LockTag, (TxId, String)>,
    /// Waiting transaction → the transaction it waits for.
    waiting: BTreeMap<TxId, TxId>,
    next_tx: TxId,
    trace: Option<Vec<TraceEntry>>,
    /// The lease table (Redis's semantics on a clock the model moves).
    leases: MemoryLeases,
    /// Token → the lease client that took it: the trace and the history name owners.
    lease_owners: BTreeMap<String, String>,
    /// Every lease operation that changed or tried to take a lease, in order.
    lease_history: Vec<LeaseEvent>,
    /// Counts commits and lease changes: a paused lease client waits for it to move.
    changes: u64,
    /// Lease clients paused right now (nobody to signal when 0: the models without leases
    /// run exactly as before).
    paused: usize,
}

/// What a transaction can hold until it ends.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum LockTag {
    /// An uncommitted entry of the receipts' unique index.
    Receipt { tenant_id: String, key: String },
    /// A ticket row being updated.
    TicketRow(Uuid),
}

enum Write {
    Ticket(Ticket),
    TicketUpdate(Ticket),
    Outbox(OutboxEvent),
    Receipt(Receipt),
}

struct SavepointMark {
    name: String,
    writes: usize,
    locks: usize,
}

struct Tx {
    id: TxId,
    writes: Vec<Write>,
    /// Locks in the order taken, so a savepoint rollback releases the later ones.
    locks: Vec<LockTag>,
    savepoints: Vec<SavepointMark>,
    failed: bool,
}

impl Tx {
    /// The latest version of a ticket this transaction wrote.
    fn own_ticket(&self, tenant_id: &str, id: Uuid) -> Option<&Ticket> {
        self.writes.iter().rev().find_map(|w| match w {
            Write::Ticket(t) | Write::TicketUpdate(t) if t.id == id && t.tenant_id == tenant_id => {
                Some(t)
            }
            _ => None,
        })
    }

    fn own_receipt(&self, tenant_id: &str, key: &str) -> Option<&Receipt> {
        self.writes.iter().find_map(|w| match w {
            Write::Receipt(r) if r.tenant_id == tenant_id && r.idempotency_key == key => Some(r),
            _ => None,
        })
    }

    fn wrote_ticket_id(&self, id: Uuid) -> bool {
        self.writes
            .iter()
            .any(|w| matches!(w, Write::Ticket(t) if t.id == id))
    }

    fn wrote_event_id(&self, id: Uuid) -> bool {
        self.writes
            .iter()
            .any(|w| matches!(w, Write::Outbox(e) if e.id == id))
    }
}

impl State {
    fn new_tx(&mut self) -> Tx {
        self.next_tx += 1;
        Tx {
            id: self.next_tx,
            writes: Vec::new(),
            locks: Vec::new(),
            savepoints: Vec::new(),
            failed: false,
        }
    }

    fn committed_ticket(&self, tenant_id: &str, id: Uuid) -> Option<&Ticket> {
        self.tickets
            .iter()
            .find(|t| t.id == id && t.tenant_id == tenant_id)
    }

    /// The ticket as this transaction's next statement sees it.
    fn visible_ticket(&self, tx: &Tx, tenant_id: &str, id: Uuid) -> Option<Ticket> {
        tx.own_ticket(tenant_id, id)
            .or_else(|| self.committed_ticket(tenant_id, id))
            .cloned()
    }

    fn visible_receipt(&self, tx: &Tx, tenant_id: &str, key: &str) -> Option<Receipt> {
        tx.own_receipt(tenant_id, key)
            .or_else(|| {
                self.receipts
                    .iter()
                    .find(|r| r.tenant_id == tenant_id && r.idempotency_key == key)
            })
            .cloned()
    }

    /// Whether `waiter` waiting for `holder` would close a cycle of waits.
    fn would_deadlock(&self, waiter: TxId, holder: TxId) -> bool {
        let mut next = Some(holder);
        for _ in 0..=self.waiting.len() {
            match next {
                Some(t) if t == waiter => return true,
                Some(t) => next = self.waiting.get(&t).copied(),
                None => return false,
            }
        }
        false
    }

    fn push_trace(&mut self, session: &str, statement: impl FnOnce() -> String, result: String) {
        if let Some(trace) = &mut self.trace {
            trace.push(TraceEntry {
                session: session.to_string(),
                statement: statement(),
                result,
            });
        }
    }

    /// Something a paused lease client may be waiting for happened.
    fn bump(&mut self, shared: &Shared) {
        self.changes += 1;
        if self.paused > 0 {
            shared.changed.notify_all();
        }
    }

    /// `tok:1a2b3c4d (api-a)`: a token as the trace shows it.
    fn token_name(&self, token: &str) -> String {
        let short: String = token.chars().take(8).collect();
        match self.lease_owners.get(token) {
            Some(owner) => format!("tok:{short} ({owner})"),
            None => format!("tok:{short}"),
        }
    }

    /// Releases `tags` held by `tx`; returns whether any was held (someone may be waiting).
    fn release(&mut self, tx: TxId, tags: &[LockTag]) -> bool {
        let mut any = false;
        for tag in tags {
            if self.locks.get(tag).is_some_and(|(holder, _)| *holder == tx) {
                self.locks.remove(tag);
                any = true;
            }
        }
        any
    }
}

impl Default for MemoryDb {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MemoryDb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryDb")
            .field("options", &self.shared.options)
            .finish_non_exhaustive()
    }
}

impl MemoryDb {
    /// An empty database with the receipts' unique index and no trace.
    pub fn new() -> Self {
        Self::with_options(MemoryOptions::default())
    }

    /// An empty database with these options.
    pub fn with_options(options: MemoryOptions) -> Self {
        let state = State {
            trace: options.trace.then(Vec::new),
            ..State::default()
        };
        MemoryDb {
            shared: Arc::new(Shared {
                options,
                state: Mutex::new(state),
                released: Condvar::new(),
                waits_changed: Condvar::new(),
                changed: Condvar::new(),
            }),
        }
    }

    /// The options the database was built with.
    pub fn options(&self) -> MemoryOptions {
        self.shared.options
    }

    /// A new session (a connection) named `name`; the name appears in the trace and in lock
    /// waits.
    pub fn session(&self, name: &str) -> MemorySession {
        MemorySession {
            db: self.clone(),
            name: name.to_string(),
            tx: None,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        sync::lock(&self.shared.state)
    }

    /// Every committed row, read in one critical section, so a commit is seen whole or not
    /// at all.
    pub fn committed(&self) -> CommittedRows {
        let state = self.state();
        CommittedRows {
            tickets: state.tickets.clone(),
            outbox: state.outbox.clone(),
            receipts: state.receipts.clone(),
        }
    }

    /// [`MemoryDb::committed`] as a reader named `reader` does it: the read is recorded in the
    /// trace (with what it saw), so a printed interleaving shows when the reader looked.
    pub fn observe(&self, reader: &str) -> CommittedRows {
        let mut state = self.state();
        let rows = CommittedRows {
            tickets: state.tickets.clone(),
            outbox: state.outbox.clone(),
            receipts: state.receipts.clone(),
        };
        state.push_trace(
            reader,
            || "read all committed rows".into(),
            format!(
                "{} ticket(s), {} event(s), {} receipt(s)",
                rows.tickets.len(),
                rows.outbox.len(),
                rows.receipts.len()
            ),
        );
        rows
    }

    /// Committed rows of one tenant: the harness's ground truth, like the SQL backends'
    /// `row_counts`.
    pub fn row_counts(&self, tenant_id: &str) -> RowCounts {
        self.committed().counts(tenant_id)
    }

    /// Every statement run so far, in order; empty unless [`MemoryOptions::trace`] is set.
    pub fn trace(&self) -> Vec<TraceEntry> {
        self.state().trace.clone().unwrap_or_default()
    }

    /// How many transactions are waiting for a lock right now.
    pub fn waiting(&self) -> usize {
        self.state().waiting.len()
    }

    /// Blocks until at least `n` transactions wait for a lock, or `timeout` has passed (not
    /// modelled under loom, where this blocks until the condition holds). Returns whether
    /// the condition holds: a test observes a lock wait instead of sleeping.
    pub fn wait_for_waiters(&self, n: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut state = self.state();
        while state.waiting.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            state = sync::wait_timeout(&self.shared.waits_changed, state, left);
        }
        true
    }

    /// A lease client named `name` on the lease table beside the rows (module docs); the
    /// name appears in the trace and the lease history.
    pub fn lease_client(&self, name: &str) -> MemoryLeaseClient {
        MemoryLeaseClient {
            db: self.clone(),
            name: name.to_string(),
            seen: 0,
        }
    }

    /// Moves the lease clock forward by `by` (leases whose TTL ran out expire), as the
    /// model's `clock` (traced, and kept in the lease history).
    pub fn advance_lease_clock(&self, by: Duration) {
        let mut state = self.state();
        let before = state.leases.live_leases();
        state.leases.advance(by);
        let after = state.leases.live_leases();
        let expired: Vec<(String, String)> =
            before.into_iter().filter(|l| !after.contains(l)).collect();
        let names: Vec<String> = expired.iter().map(|(_, t)| state.token_name(t)).collect();
        let result = if names.is_empty() {
            "nothing expired".into()
        } else {
            format!("expired {}", names.join(", "))
        };
        state.push_trace("clock", || format!("advance {} ms", by.as_millis()), result);
        state.lease_history.push(LeaseEvent {
            client: "clock".into(),
            kind: LeaseEventKind::Expired { leases: expired },
        });
        state.bump(&self.shared);
    }

    /// Drops every lease, as `FLUSHALL` or a Redis restart without persistence does (traced
    /// as `redis`, kept in the lease history).
    pub fn flush_leases(&self) {
        let mut state = self.state();
        let dropped = state.leases.live_leases();
        state.leases.flush();
        let names: Vec<String> = dropped.iter().map(|(_, t)| state.token_name(t)).collect();
        state.push_trace(
            "redis",
            || "FLUSHALL".into(),
            format!("dropped {} lease(s) {}", names.len(), names.join(", ")),
        );
        state.lease_history.push(LeaseEvent {
            client: "redis".into(),
            kind: LeaseEventKind::Flushed { leases: dropped },
        });
        state.bump(&self.shared);
    }

    /// Every lease operation so far, in order (acquires refused included; reads and pauses
    /// are only in the trace).
    pub fn lease_history(&self) -> Vec<LeaseEvent> {
        self.state().lease_history.clone()
    }

    /// The lease client that took `token`, if one did.
    pub fn lease_owner(&self, token: &str) -> Option<String> {
        self.state().lease_owners.get(token).cloned()
    }
}

/// One lease operation, as [`MemoryDb::lease_history`] keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseEvent {
    /// The lease client's name ([`MemoryDb::lease_client`]), or `clock`.
    pub client: String,
    /// What happened.
    pub kind: LeaseEventKind,
}

/// What a lease operation did. Tokens are whole; [`MemoryDb::lease_owner`] names a token's
/// taker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseEventKind {
    /// `SET key token NX PX` took the lease.
    Acquired {
        /// The lease key.
        key: String,
        /// The new holder's token.
        token: String,
    },
    /// `SET … NX` found the lease held by `holder`.
    Refused {
        /// The lease key.
        key: String,
        /// The token holding it.
        holder: String,
    },
    /// A compare-and-delete removed the caller's own token.
    Released {
        /// The lease key.
        key: String,
        /// The caller's token.
        token: String,
    },
    /// A compare-and-delete found another token (`holder`), or none, and removed nothing.
    ReleaseMissed {
        /// The lease key.
        key: String,
        /// The caller's token.
        token: String,
        /// The token holding the key instead, if any.
        holder: Option<String>,
    },
    /// A plain `DEL`: removed `removed` (whoever held it), or nothing.
    Deleted {
        /// The lease key.
        key: String,
        /// The token it removed, if a lease was live.
        removed: Option<String>,
    },
    /// The clock moved: these leases ran out of time.
    Expired {
        /// (key, token) of each expired lease.
        leases: Vec<(String, String)>,
    },
    /// Every lease dropped (`FLUSHALL`, a restart without persistence).
    Flushed {
        /// (key, token) of each lease dropped.
        leases: Vec<(String, String)>,
    },
}

/// Two requests inside their critical sections at once though neither lease ran out: the
/// mutual exclusion a lease promises while it lives, broken (found by
/// [`lease_exclusion_breach`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExclusionBreach {
    /// Who took the lease.
    pub taker: String,
    /// Who was still inside, holding a lease that had not expired.
    pub holder: String,
    /// The holder's token.
    pub holder_token: String,
    /// Who removed the holder's live lease with a plain `DEL`, if anyone did.
    pub removed_by: Option<String>,
}

impl fmt::Display for ExclusionBreach {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let short: String = self.holder_token.chars().take(8).collect();
        write!(
            f,
            "{} took the lease while {} was still inside under tok:{short}, which had not expired",
            self.taker, self.holder
        )?;
        match &self.removed_by {
            Some(by) => write!(f, " ({by}'s plain DEL had removed it)"),
            None => write!(f, " (nobody removed it)"),
        }
    }
}

impl std::error::Error for ExclusionBreach {}

/// Walks a lease history: a request is *inside* from its successful acquire until its own
/// release (compare-and-delete or `DEL`, whatever it removed). A lease taken while another
/// request is inside under a token that neither expired nor was flushed breaks the
/// exclusion. Expiry or a flush lets a second holder in; that is allowed (and the receipt
/// must then arbitrate).
///
/// Will return `Err` with the first breach, in history order.
pub fn lease_exclusion_breach(history: &[LeaseEvent]) -> Result<(), ExclusionBreach> {
    // client → its token, while inside.
    let mut inside: BTreeMap<&str, &str> = BTreeMap::new();
    // Tokens whose time ran out or that a flush dropped.
    let mut timed_out: Vec<&str> = Vec::new();
    // Token → who deleted it while it was live (a plain DEL by someone else).
    let mut removed_by: BTreeMap<&str, &str> = BTreeMap::new();
    for event in history {
        let client = event.client.as_str();
        match &event.kind {
            LeaseEventKind::Acquired { token, .. } => {
                if let Some((holder, holder_token)) = inside
                    .iter()
                    .find(|(c, t)| **c != client && !timed_out.contains(*t))
                {
                    return Err(ExclusionBreach {
                        taker: client.to_string(),
                        holder: holder.to_string(),
                        holder_token: holder_token.to_string(),
                        removed_by: removed_by.get(holder_token).map(|b| b.to_string()),
                    });
                }
                inside.insert(client, token);
            }
            LeaseEventKind::Released { .. } | LeaseEventKind::ReleaseMissed { .. } => {
                inside.remove(client);
            }
            LeaseEventKind::Deleted { removed, .. } => {
                if let Some(removed) = removed {
                    if inside.get(client) != Some(&removed.as_str()) {
                        removed_by.insert(removed.as_str(), client);
                    }
                }
                inside.remove(client);
            }
            LeaseEventKind::Expired { leases } | LeaseEventKind::Flushed { leases } => {
                timed_out.extend(leases.iter().map(|(_, t)| t.as_str()));
            }
            LeaseEventKind::Refused { .. } => {}
        }
    }
    Ok(())
}

/// A lease client on a [`MemoryDb`]: [`Leases`] over the lease table kept beside the rows
/// (module docs). Each operation is one critical section, recorded in the trace and in
/// [`MemoryDb::lease_history`]. Never fails.
pub struct MemoryLeaseClient {
    db: MemoryDb,
    name: String,
    /// [`State::changes`] at this client's last operation: `pause` waits for it to move.
    seen: u64,
}

impl fmt::Debug for MemoryLeaseClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryLeaseClient")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl MemoryLeaseClient {
    /// Runs one lease operation under the database's lock: `op` gets the state and returns
    /// (result, trace line's statement, trace line's result, history event if any).
    fn op<T>(
        &mut self,
        op: impl FnOnce(&mut State) -> (T, String, String, Option<LeaseEventKind>),
    ) -> T {
        let shared = &self.db.shared;
        let mut state = sync::lock(&shared.state);
        let (value, statement, result, event) = op(&mut state);
        state.push_trace(&self.name, || statement, result);
        if let Some(kind) = event {
            let changed = !matches!(kind, LeaseEventKind::Refused { .. });
            state.lease_history.push(LeaseEvent {
                client: self.name.clone(),
                kind,
            });
            if changed {
                state.bump(shared);
            }
        }
        self.seen = state.changes;
        value
    }
}

impl Leases for MemoryLeaseClient {
    fn acquire(&mut self, key: &str, token: &str, ttl: Duration) -> Result<bool, LeaseError> {
        let name = self.name.clone();
        Ok(self.op(|state| {
            let taken = state.leases.acquire(key, token, ttl).unwrap_or(false);
            let statement = format!(
                "SET {key} tok:{} NX PX {}",
                token.chars().take(8).collect::<String>(),
                ttl.as_millis()
            );
            if taken {
                state.lease_owners.insert(token.to_string(), name);
                let event = LeaseEventKind::Acquired {
                    key: key.to_string(),
                    token: token.to_string(),
                };
                (true, statement, "OK (taken)".into(), Some(event))
            } else {
                let holder = state.leases.holder(key).ok().flatten().unwrap_or_default();
                let result = format!("nil (held by {})", state.token_name(&holder));
                let event = LeaseEventKind::Refused {
                    key: key.to_string(),
                    holder,
                };
                (false, statement, result, Some(event))
            }
        }))
    }

    fn release(&mut self, key: &str, token: &str) -> Result<bool, LeaseError> {
        Ok(self.op(|state| {
            let statement = format!(
                "EVAL release {key} tok:{}",
                token.chars().take(8).collect::<String>()
            );
            let holder = state.leases.holder(key).ok().flatten();
            let removed = state.leases.release(key, token).unwrap_or(false);
            let (key, token) = (key.to_string(), token.to_string());
            if removed {
                (
                    true,
                    statement,
                    "1 (deleted its own lease)".into(),
                    Some(LeaseEventKind::Released { key, token }),
                )
            } else {
                let result = match &holder {
                    Some(other) => format!("0 (held by {}: left alone)", state.token_name(other)),
                    None => "0 (no lease: it expired)".into(),
                };
                let event = LeaseEventKind::ReleaseMissed { key, token, holder };
                (false, statement, result, Some(event))
            }
        }))
    }

    fn delete(&mut self, key: &str) -> Result<bool, LeaseError> {
        Ok(self.op(|state| {
            let holder = state.leases.holder(key).ok().flatten();
            let removed = state.leases.delete(key).unwrap_or(false);
            let result = match &holder {
                Some(token) => format!("1 (deleted {})", state.token_name(token)),
                None => "0 (no lease)".into(),
            };
            let event = LeaseEventKind::Deleted {
                key: key.to_string(),
                removed: holder,
            };
            (removed, format!("DEL {key}"), result, Some(event))
        }))
    }

    fn holder(&mut self, key: &str) -> Result<Option<String>, LeaseError> {
        Ok(self.op(|state| {
            let holder = state.leases.holder(key).ok().flatten();
            let result = match &holder {
                Some(token) => state.token_name(token),
                None => "nil".into(),
            };
            (holder, format!("GET {key}"), result, None)
        }))
    }

    /// Waits until a commit or a lease operation has happened since this client's last
    /// operation (under loom: only that, untimed; in ordinary tests also at most `pause`).
    fn pause(&mut self, pause: Duration) {
        let shared = &self.db.shared;
        let deadline = (!sync::MODEL_CHECKED).then(|| Instant::now() + pause);
        let mut state = sync::lock(&shared.state);
        state.paused += 1;
        while state.changes == self.seen {
            let left = match deadline {
                Some(deadline) => deadline.saturating_duration_since(Instant::now()),
                None => pause,
            };
            if left.is_zero() {
                break;
            }
            state = sync::wait_timeout(&shared.changed, state, left);
        }
        state.paused -= 1;
        let result = if state.changes == self.seen {
            "nothing changed"
        } else {
            "a commit or a lease changed"
        };
        state.push_trace(&self.name, || "pause".into(), result.into());
        self.seen = state.changes;
    }
}

/// One session on a [`MemoryDb`]: the [`Store`] the protocol runs on (`backend()` is
/// `memory`). Dropping it with a transaction open rolls the transaction back, as a closed
/// connection does.
pub struct MemorySession {
    db: MemoryDb,
    name: String,
    tx: Option<Tx>,
}

impl fmt::Debug for MemorySession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemorySession")
            .field("name", &self.name)
            .field("in_transaction", &self.tx.is_some())
            .field("failed", &self.tx.as_ref().is_some_and(|t| t.failed))
            .finish()
    }
}

/// A statement's hold on the database: the state lock, which a lock wait gives up while it
/// sleeps on the condition variable.
struct Conn<'a> {
    shared: &'a Shared,
    guard: Option<MutexGuard<'a, State>>,
    session: &'a str,
}

impl<'a> Conn<'a> {
    fn new(shared: &'a Shared, session: &'a str) -> Self {
        Conn {
            shared,
            guard: Some(sync::lock(&shared.state)),
            session,
        }
    }

    fn state(&mut self) -> &mut State {
        self.guard
            .as_mut()
            .expect("the state lock is held between waits")
    }

    /// Waits until no other transaction holds `tag`. Will return `Err` (deadlock, 40P01)
    /// when waiting would close a cycle.
    fn wait_for_lock(
        &mut self,
        tx: &Tx,
        tag: &LockTag,
        operation: &'static str,
        statement: &dyn Fn() -> String,
    ) -> StoreResult<()> {
        loop {
            let session = self.session;
            let state = self.state();
            let (holder, holder_name) = match state.locks.get(tag) {
                Some((holder, name)) if *holder != tx.id => (*holder, name.clone()),
                _ => return Ok(()),
            };
            if state.would_deadlock(tx.id, holder) {
                return Err(error(
                    DbErrorKind::Deadlock,
                    operation,
                    "40P01",
                    format!("deadlock detected: waiting for {holder_name}"),
                ));
            }
            state.waiting.insert(tx.id, holder);
            state.push_trace(session, statement, format!("waits for {holder_name}"));
            self.shared.waits_changed.notify_all();
            let guard = self.guard.take().expect("the state lock is held");
            self.guard = Some(sync::wait(&self.shared.released, guard));
            self.state().waiting.remove(&tx.id);
        }
    }

    fn take_lock(&mut self, tx: &mut Tx, tag: LockTag) {
        let session = self.session.to_string();
        let state = self.state();
        if !state.locks.contains_key(&tag) {
            state.locks.insert(tag.clone(), (tx.id, session));
            tx.locks.push(tag);
        }
    }

    /// Checks the deferred foreign keys (each receipt's ticket, of the same tenant, must be
    /// visible), then applies the transaction's writes at once and releases its locks. Will
    /// return `Err` (23503) when a receipt's ticket is missing; the transaction is then
    /// rolled back, as PostgreSQL's `COMMIT` does when a deferred constraint fails.
    fn commit(&mut self, tx: Tx) -> StoreResult<()> {
        let shared = self.shared;
        let state = self.state();
        let dangling = tx.writes.iter().any(|w| {
            matches!(w, Write::Receipt(r)
                if state.visible_ticket(&tx, &r.tenant_id, r.ticket_id).is_none())
        });
        if dangling {
            self.abort(tx);
            return Err(foreign_key_violation(
                "commit",
                "idempotency_receipts_ticket_fkey",
            ));
        }
        let state = self.state();
        if !tx.writes.is_empty() {
            // Rows changed (not an autocommit read's transaction): paused lease clients look
            // again. Waking them on reads too would let two pollers wake each other for ever.
            state.bump(shared);
        }
        for write in tx.writes {
            match write {
                Write::Ticket(t) => state.tickets.push(t),
                Write::TicketUpdate(t) => {
                    if let Some(row) = state.tickets.iter_mut().find(|r| r.id == t.id) {
                        *row = t;
                    }
                }
                Write::Outbox(e) => state.outbox.push(e),
                Write::Receipt(r) => state.receipts.push(r),
            }
        }
        if state.release(tx.id, &tx.locks) {
            self.shared.released.notify_all();
        }
        Ok(())
    }

    /// Drops the transaction's writes and releases its locks.
    fn abort(&mut self, tx: Tx) {
        if self.state().release(tx.id, &tx.locks) {
            self.shared.released.notify_all();
        }
    }

    fn trace(&mut self, statement: impl FnOnce() -> String, result: String) {
        let session = self.session;
        self.state().push_trace(session, statement, result);
    }
}

fn error(
    kind: DbErrorKind,
    operation: &'static str,
    code: &str,
    message: impl Into<String>,
) -> StoreError {
    StoreError {
        kind,
        backend: Backend::Memory,
        operation,
        code: Some(code.to_string()),
        message: message.into(),
    }
}

fn unique_violation(operation: &'static str, constraint: &str) -> StoreError {
    error(
        DbErrorKind::UniqueViolation,
        operation,
        "23505",
        format!("duplicate key value violates unique constraint \"{constraint}\""),
    )
}

fn foreign_key_violation(operation: &'static str, constraint: &str) -> StoreError {
    error(
        DbErrorKind::OtherConstraint,
        operation,
        "23503",
        format!("insert violates foreign key constraint \"{constraint}\""),
    )
}

fn in_failed_transaction(operation: &'static str) -> StoreError {
    error(
        DbErrorKind::InFailedTransaction,
        operation,
        "25P02",
        "current transaction is aborted, commands ignored until end of transaction block",
    )
}

fn no_transaction(operation: &'static str) -> StoreError {
    error(
        DbErrorKind::Other,
        operation,
        "25P01",
        "savepoints can only be used in transaction blocks",
    )
}

fn no_savepoint(operation: &'static str, name: &str) -> StoreError {
    error(
        DbErrorKind::Other,
        operation,
        "3B001",
        format!("savepoint \"{name}\" does not exist"),
    )
}

fn outcome<T>(result: &StoreResult<T>, describe: impl FnOnce(&T) -> String) -> String {
    match result {
        Ok(value) => describe(value),
        Err(e) => format!("error {}", e.code.as_deref().unwrap_or("?")),
    }
}

fn ok(_: &()) -> String {
    "ok".to_string()
}

/// First 8 hex digits of an id: enough to tell rows apart in a trace.
fn short(id: Uuid) -> String {
    id.simple().to_string()[..8].to_string()
}

impl MemorySession {
    /// The session's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether a transaction is open.
    pub fn in_transaction(&self) -> bool {
        self.tx.is_some()
    }

    /// Runs a data statement: in the open transaction (refused with 25P02 when it has
    /// failed; an error fails it), or in a transaction of its own when none is open.
    fn run<T>(
        &mut self,
        operation: &'static str,
        statement: impl Fn() -> String,
        body: impl FnOnce(&mut Conn<'_>, &mut Tx) -> StoreResult<T>,
        describe: impl FnOnce(&T) -> String,
    ) -> StoreResult<T> {
        let mut conn = Conn::new(&self.db.shared, &self.name);
        let result = match &mut self.tx {
            Some(tx) if tx.failed => Err(in_failed_transaction(operation)),
            Some(tx) => {
                let result = body(&mut conn, tx);
                if result.is_err() {
                    tx.failed = true;
                }
                result
            }
            None => {
                let mut tx = conn.state().new_tx();
                match body(&mut conn, &mut tx) {
                    Ok(value) => conn.commit(tx).map(|()| value),
                    Err(e) => {
                        conn.abort(tx);
                        Err(e)
                    }
                }
            }
        };
        conn.trace(&statement, outcome(&result, describe));
        result
    }

    /// Runs a transaction-control statement (`begin`, savepoints, `commit`, `rollback`).
    fn control<T>(
        &mut self,
        statement: impl FnOnce() -> String,
        body: impl FnOnce(&mut Conn<'_>, &mut Option<Tx>) -> StoreResult<T>,
        describe: impl FnOnce(&T) -> String,
    ) -> StoreResult<T> {
        let mut conn = Conn::new(&self.db.shared, &self.name);
        let result = body(&mut conn, &mut self.tx);
        conn.trace(statement, outcome(&result, describe));
        result
    }
}

impl Drop for MemorySession {
    fn drop(&mut self) {
        if let Some(tx) = self.tx.take() {
            let mut conn = Conn::new(&self.db.shared, &self.name);
            conn.abort(tx);
            conn.trace(|| "disconnect".into(), "rolled back".into());
        }
    }
}

impl Store for MemorySession {
    fn backend(&self) -> Backend {
        Backend::Memory
    }

    fn begin(&mut self) -> StoreResult<()> {
        self.control(
            || "begin".into(),
            |conn, tx| match tx {
                Some(_) => Err(error(
                    DbErrorKind::Other,
                    "begin",
                    "25001",
                    "there is already a transaction in progress",
                )),
                None => {
                    *tx = Some(conn.state().new_tx());
                    Ok(())
                }
            },
            ok,
        )
    }

    fn savepoint(&mut self, name: &str) -> StoreResult<()> {
        self.control(
            || format!("savepoint {name}"),
            |_, tx| match tx {
                None => Err(no_transaction("savepoint")),
                Some(tx) if tx.failed => Err(in_failed_transaction("savepoint")),
                Some(tx) => {
                    tx.savepoints.push(SavepointMark {
                        name: name.to_string(),
                        writes: tx.writes.len(),
                        locks: tx.locks.len(),
                    });
                    Ok(())
                }
            },
            ok,
        )
    }

    fn rollback_to_savepoint(&mut self, name: &str) -> StoreResult<()> {
        self.control(
            || format!("rollback to savepoint {name}"),
            |conn, tx| {
                let Some(tx) = tx else {
                    return Err(no_transaction("rollback to savepoint"));
                };
                // The most recent savepoint of that name, as PostgreSQL picks it.
                let Some(at) = tx.savepoints.iter().rposition(|s| s.name == name) else {
                    tx.failed = true;
                    return Err(no_savepoint("rollback to savepoint", name));
                };
                let mark = &tx.savepoints[at];
                let (writes, locks) = (mark.writes, mark.locks);
                tx.savepoints.truncate(at + 1);
                tx.writes.truncate(writes);
                let undone: Vec<LockTag> = tx.locks.split_off(locks);
                if conn.state().release(tx.id, &undone) {
                    conn.shared.released.notify_all();
                }
                tx.failed = false;
                Ok(())
            },
            ok,
        )
    }

    fn release_savepoint(&mut self, name: &str) -> StoreResult<()> {
        self.control(
            || format!("release savepoint {name}"),
            |_, tx| match tx {
                None => Err(no_transaction("release savepoint")),
                Some(tx) if tx.failed => Err(in_failed_transaction("release savepoint")),
                Some(tx) => match tx.savepoints.iter().rposition(|s| s.name == name) {
                    Some(at) => {
                        tx.savepoints.truncate(at);
                        Ok(())
                    }
                    None => {
                        tx.failed = true;
                        Err(no_savepoint("release savepoint", name))
                    }
                },
            },
            ok,
        )
    }

    fn commit(&mut self) -> StoreResult<()> {
        self.control(
            || "commit".into(),
            |conn, tx| {
                Ok(match tx.take() {
                    Some(tx) if tx.failed => {
                        conn.abort(tx);
                        false
                    }
                    Some(tx) => {
                        conn.commit(tx)?;
                        true
                    }
                    // PostgreSQL only warns: there is no transaction in progress.
                    None => true,
                })
            },
            |&committed| {
                if committed {
                    "ok".into()
                } else {
                    "rolled back (the transaction had failed)".into()
                }
            },
        )
        .map(drop)
    }

    fn rollback(&mut self) -> StoreResult<()> {
        self.control(
            || "rollback".into(),
            |conn, tx| {
                if let Some(tx) = tx.take() {
                    conn.abort(tx);
                }
                Ok(())
            },
            ok,
        )
    }

    fn find_receipt(&mut self, tenant_id: &str, key: &str) -> StoreResult<Option<Receipt>> {
        self.run(
            "find receipt",
            || format!("find receipt ({tenant_id}, {key})"),
            |conn, tx| Ok(conn.state().visible_receipt(tx, tenant_id, key)),
            |found| match found {
                Some(r) => format!("receipt -> ticket {}", short(r.ticket_id)),
                None => "none".into(),
            },
        )
    }

    fn insert_ticket(&mut self, ticket: &Ticket) -> StoreResult<()> {
        self.run(
            "insert ticket",
            || format!("insert ticket {}", short(ticket.id)),
            |conn, tx| {
                let state = conn.state();
                if tx.wrote_ticket_id(ticket.id) || state.tickets.iter().any(|t| t.id == ticket.id)
                {
                    return Err(unique_violation("insert ticket", "tickets_pkey"));
                }
                tx.writes.push(Write::Ticket(ticket.clone()));
                Ok(())
            },
            ok,
        )
    }

    fn insert_outbox(&mut self, event: &OutboxEvent) -> StoreResult<()> {
        self.run(
            "insert outbox event",
            || {
                format!(
                    "insert {} for ticket {}",
                    event.event_type,
                    short(event.aggregate_id)
                )
            },
            |conn, tx| {
                let state = conn.state();
                if tx.wrote_event_id(event.id) || state.outbox.iter().any(|e| e.id == event.id) {
                    return Err(unique_violation(
                        "insert outbox event",
                        "outbox_events_pkey",
                    ));
                }
                if state
                    .visible_ticket(tx, &event.tenant_id, event.aggregate_id)
                    .is_none()
                {
                    return Err(foreign_key_violation(
                        "insert outbox event",
                        "outbox_events_ticket_fkey",
                    ));
                }
                tx.writes.push(Write::Outbox(event.clone()));
                Ok(())
            },
            ok,
        )
    }

    fn insert_receipt(&mut self, receipt: &Receipt) -> StoreResult<()> {
        const OP: &str = "insert receipt";
        let unique = self.db.shared.options.receipt_unique_index;
        let statement = || {
            format!(
                "insert receipt ({}, {}) -> ticket {}",
                receipt.tenant_id,
                receipt.idempotency_key,
                short(receipt.ticket_id)
            )
        };
        self.run(
            OP,
            statement,
            |conn, tx| {
                if unique {
                    let tag = LockTag::Receipt {
                        tenant_id: receipt.tenant_id.clone(),
                        key: receipt.idempotency_key.clone(),
                    };
                    // Another transaction's uncommitted entry: wait for it to end.
                    conn.wait_for_lock(tx, &tag, OP, &statement)?;
                    let (tenant, key) = (&receipt.tenant_id, &receipt.idempotency_key);
                    if conn.state().visible_receipt(tx, tenant, key).is_some() {
                        return Err(unique_violation(OP, RECEIPTS_PKEY));
                    }
                    conn.take_lock(tx, tag);
                }
                // The foreign key to the ticket is deferred to commit (migration 0002).
                tx.writes.push(Write::Receipt(receipt.clone()));
                Ok(())
            },
            ok,
        )
    }

    fn insert_receipt_if_absent(&mut self, receipt: &Receipt) -> StoreResult<bool> {
        const OP: &str = "insert receipt on conflict do nothing";
        let unique = self.db.shared.options.receipt_unique_index;
        let statement = || {
            format!(
                "insert receipt ({}, {}) -> ticket {} on conflict do nothing",
                receipt.tenant_id,
                receipt.idempotency_key,
                short(receipt.ticket_id)
            )
        };
        self.run(
            OP,
            statement,
            |conn, tx| {
                if unique {
                    let tag = LockTag::Receipt {
                        tenant_id: receipt.tenant_id.clone(),
                        key: receipt.idempotency_key.clone(),
                    };
                    // As PostgreSQL's speculative insertion: wait for an in-flight holder,
                    // then do nothing if its row (or one of ours) is there.
                    conn.wait_for_lock(tx, &tag, OP, &statement)?;
                    let (tenant, key) = (&receipt.tenant_id, &receipt.idempotency_key);
                    if conn.state().visible_receipt(tx, tenant, key).is_some() {
                        return Ok(false);
                    }
                    conn.take_lock(tx, tag);
                }
                // Without the unique index there is no arbiter: the row goes in.
                tx.writes.push(Write::Receipt(receipt.clone()));
                Ok(true)
            },
            |&inserted| {
                if inserted {
                    "inserted".into()
                } else {
                    "taken: nothing".into()
                }
            },
        )
    }

    fn claim_and_create(
        &mut self,
        ticket: &Ticket,
        event: &OutboxEvent,
        receipt: &Receipt,
    ) -> StoreResult<Claimed> {
        const OP: &str = "claim and create";
        let unique = self.db.shared.options.receipt_unique_index;
        let (tenant, key) = (&receipt.tenant_id, &receipt.idempotency_key);
        let statement = || {
            format!(
                "claim ({tenant}, {key}) -> ticket {} with its ticket and event",
                short(receipt.ticket_id)
            )
        };
        let body = |conn: &mut Conn<'_>, tx: &mut Tx| {
            if unique {
                // The statement's snapshot: a receipt committed before it began is met
                // without waiting, and read with its ticket.
                let state = conn.state();
                if let Some(met) = state.visible_receipt(tx, tenant, key) {
                    let ticket = state.visible_ticket(tx, tenant, met.ticket_id);
                    return Ok(Claimed::Met {
                        receipt: met,
                        ticket,
                    });
                }
                let tag = LockTag::Receipt {
                    tenant_id: tenant.clone(),
                    key: key.clone(),
                };
                // An in-flight holder: wait for it to end. If it committed, its receipt is
                // newer than this statement's snapshot: taken, and unseen.
                conn.wait_for_lock(tx, &tag, OP, &statement)?;
                if conn.state().visible_receipt(tx, tenant, key).is_some() {
                    return Ok(Claimed::TakenUnseen);
                }
                conn.take_lock(tx, tag);
            }
            tx.writes.push(Write::Receipt(receipt.clone()));
            tx.writes.push(Write::Ticket(ticket.clone()));
            tx.writes.push(Write::Outbox(event.clone()));
            Ok(Claimed::Won)
        };
        let describe = |claimed: &Claimed| match claimed {
            Claimed::Won => "won: receipt, ticket and event inserted".to_string(),
            Claimed::Met { receipt, .. } => {
                format!("met receipt -> ticket {}", short(receipt.ticket_id))
            }
            Claimed::TakenUnseen => "taken by a commit after its snapshot: nothing".into(),
        };
        if self.tx.is_some() {
            return self.run(OP, statement, body, describe);
        }
        // Outside a transaction the statement is one of its own, and, as on a server, its
        // inserts and its commit are two steps: between them another session can meet the
        // uncommitted key and wait for it.
        let mut conn = Conn::new(&self.db.shared, &self.name);
        let mut tx = conn.state().new_tx();
        let result = body(&mut conn, &mut tx);
        conn.trace(statement, outcome(&result, describe));
        drop(conn);
        let mut conn = Conn::new(&self.db.shared, &self.name);
        let result = match result {
            Ok(claimed) => conn.commit(tx).map(|()| claimed),
            Err(e) => {
                conn.abort(tx);
                Err(e)
            }
        };
        conn.trace(
            || "end of statement: commit".into(),
            outcome(&result, |_| "ok".into()),
        );
        result
    }

    fn find_receipt_and_ticket(
        &mut self,
        tenant_id: &str,
        key: &str,
    ) -> StoreResult<Option<(Receipt, Option<Ticket>)>> {
        self.run(
            "find receipt and ticket",
            || format!("find receipt and ticket ({tenant_id}, {key})"),
            |conn, tx| {
                let state = conn.state();
                Ok(state.visible_receipt(tx, tenant_id, key).map(|r| {
                    let ticket = state.visible_ticket(tx, tenant_id, r.ticket_id);
                    (r, ticket)
                }))
            },
            |found| match found {
                Some((r, Some(_))) => format!("receipt -> ticket {}", short(r.ticket_id)),
                Some((r, None)) => format!("receipt -> missing ticket {}", short(r.ticket_id)),
                None => "none".into(),
            },
        )
    }

    fn find_ticket(&mut self, tenant_id: &str, id: Uuid) -> StoreResult<Option<Ticket>> {
        self.run(
            "find ticket",
            || format!("find ticket ({tenant_id}, {})", short(id)),
            |conn, tx| Ok(conn.state().visible_ticket(tx, tenant_id, id)),
            |found| match found {
                Some(t) => format!("ticket {} v{}", short(t.id), t.version),
                None => "none".into(),
            },
        )
    }

    fn update_ticket(
        &mut self,
        tenant_id: &str,
        id: Uuid,
        patch: &TicketPatch,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<Ticket>> {
        const OP: &str = "update ticket";
        let statement = || format!("update ticket ({tenant_id}, {})", short(id));
        self.run(
            OP,
            statement,
            |conn, tx| {
                // Like `UPDATE … WHERE tenant_id = $1 AND id = $2`: only a row the statement
                // sees is locked; if another transaction holds it, wait, then re-read the
                // latest committed version (PostgreSQL's EvalPlanQual).
                if conn.state().visible_ticket(tx, tenant_id, id).is_none() {
                    return Ok(None);
                }
                let tag = LockTag::TicketRow(id);
                conn.wait_for_lock(tx, &tag, OP, &statement)?;
                let Some(mut ticket) = conn.state().visible_ticket(tx, tenant_id, id) else {
                    return Ok(None);
                };
                if let Some(title) = &patch.title {
                    ticket.title = title.clone();
                }
                if let Some(body) = &patch.body {
                    ticket.body = body.clone();
                }
                if let Some(priority) = &patch.priority {
                    ticket.priority = priority.clone();
                }
                ticket.version += 1;
                ticket.updated_at = now;
                conn.take_lock(tx, tag);
                tx.writes.push(Write::TicketUpdate(ticket.clone()));
                Ok(Some(ticket))
            },
            |updated| match updated {
                Some(t) => format!("ticket {} v{}", short(t.id), t.version),
                None => "none".into(),
            },
        )
    }
}
