//! A [`Store`] wrapper that records every operation a racer performs and runs a harness hook
//! at one point of the protocol: the SQLite runner's in-process barrier (after the first
//! receipt lookup, so every racer has observed "no receipt" before any inserts — the
//! after-lookup barrier — or before `begin` in immediate mode), or the PostgreSQL advisory-lock wait.
//! The protocol code is not touched.

use std::time::Instant;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::timeline::{now_us, Step};
use ticketflow_core::domain::{OutboxEvent, Receipt, Ticket, TicketPatch};
use ticketflow_core::error::{DbErrorKind, StoreError};
use ticketflow_core::store::call::StoreCall;
use ticketflow_core::store::{Claimed, Store, StoreResult};

/// Where a [`Hook`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookPoint {
    /// Before the first `begin`.
    BeforeBegin,
    /// Right after the first receipt lookup returned successfully.
    AfterFirstLookup,
    /// Right after the n-th successful commit of a transaction that wrote rows (a fault
    /// point: a client dying between transactions). Read-only commits do not count.
    AfterCommit(u32),
    /// Right before the first `commit` of a transaction that wrote rows (a pause point: the
    /// racer holds its inserts uncommitted).
    BeforeWriteCommit,
    /// Right after the first successful ticket insert (a fault point: an error between the
    /// ticket and its outbox row).
    AfterTicketInsert,
}

/// A harness action run once on the racer's own session, e.g. waiting at a barrier. An `Err`
/// aborts the racer's create with that error.
pub type Hook<'a, S> = Box<dyn FnMut(&mut S) -> StoreResult<()> + Send + 'a>;

/// Recording wrapper around a store.
pub struct ObservedStore<'a, S: Store + ?Sized> {
    inner: &'a mut S,
    hooks: Vec<(HookPoint, Hook<'a, S>)>,
    lookups: usize,
    begins: usize,
    commits: u32,
    wrote: bool,
    /// The operations performed, in order, with their arguments and times; e.g. `find
    /// receipt -> none`, `insert receipt -> unique violation (23505)`.
    pub steps: Vec<Step>,
    /// Whether the first lookup saw no receipt.
    pub first_lookup_empty: Option<bool>,
    /// Whether the hook was reached (it may still have failed).
    pub hook_reached: bool,
    /// When the hook returned successfully (for a barrier: when it let this racer go).
    pub released_at: Option<Instant>,
}

impl<'a, S: Store + ?Sized> ObservedStore<'a, S> {
    /// Wraps `inner`, running each hook once at its point.
    pub fn new(inner: &'a mut S, hooks: Vec<(HookPoint, Hook<'a, S>)>) -> Self {
        ObservedStore {
            inner,
            hooks,
            lookups: 0,
            begins: 0,
            commits: 0,
            wrote: false,
            steps: Vec::new(),
            first_lookup_empty: None,
            hook_reached: false,
            released_at: None,
        }
    }

    fn run_hook(&mut self, point: HookPoint) -> StoreResult<()> {
        let Some(i) = self.hooks.iter().position(|(p, _)| *p == point) else {
            return Ok(());
        };
        let (_, mut hook) = self.hooks.remove(i);
        // Only the barrier points mark "reached"; fault and pause points do not.
        let barrier = matches!(point, HookPoint::BeforeBegin | HookPoint::AfterFirstLookup);
        if barrier {
            self.hook_reached = true;
        }
        let started = now_us();
        match hook(self.inner) {
            Ok(()) => {
                if barrier {
                    self.released_at = Some(Instant::now());
                    self.push("barrier released".into(), StoreCall::Barrier, started);
                }
                Ok(())
            }
            Err(e) => {
                self.push(
                    format!("barrier -> {}", e.message),
                    StoreCall::Barrier,
                    started,
                );
                Err(e)
            }
        }
    }

    fn push(&mut self, what: String, call: StoreCall, started_us: u64) {
        self.steps.push(Step {
            what,
            call,
            started_us,
            finished_us: now_us(),
        });
    }

    /// Records a receipt lookup `op` as `op -> found`, `op -> none` or the error, and counts it.
    fn record_lookup<T>(
        &mut self,
        op: &str,
        call: StoreCall,
        started: u64,
        r: &StoreResult<Option<T>>,
    ) {
        let what = match r {
            Ok(Some(_)) => format!("{op} -> found"),
            Ok(None) => format!("{op} -> none"),
            Err(e) => format!("{op} -> {}", describe(e)),
        };
        self.push(what, call, started);
        self.lookups += 1;
    }

    /// After the first lookup (just recorded): notes whether it saw no receipt and, when it
    /// succeeded, runs the after-first-lookup hook (the barrier).
    fn after_first_lookup<T>(&mut self, r: &StoreResult<Option<T>>) -> StoreResult<()> {
        if self.lookups == 1 {
            self.first_lookup_empty = Some(matches!(r, Ok(None)));
            if r.is_ok() {
                self.run_hook(HookPoint::AfterFirstLookup)?;
            }
        }
        Ok(())
    }

    fn note<T>(
        &mut self,
        op: &str,
        call: StoreCall,
        started: u64,
        r: StoreResult<T>,
    ) -> StoreResult<T> {
        let what = match &r {
            Ok(_) => op.to_string(),
            Err(e) => format!("{op} -> {}", describe(e)),
        };
        self.push(what, call, started);
        r
    }
}

fn describe(e: &StoreError) -> String {
    let kind = match e.kind {
        DbErrorKind::UniqueViolation => "unique violation",
        DbErrorKind::SerializationFailure => "serialization failure",
        DbErrorKind::Deadlock => "deadlock",
        DbErrorKind::Busy => "busy",
        DbErrorKind::InFailedTransaction => "in failed transaction",
        DbErrorKind::Timeout => "timeout",
        DbErrorKind::Connection => "connection lost",
        DbErrorKind::Unavailable => "insufficient resources",
        DbErrorKind::ReadOnly => "read-only",
        DbErrorKind::OtherConstraint => "constraint violation",
        DbErrorKind::Other => "error",
    };
    match &e.code {
        Some(code) => format!("{kind} ({code})"),
        None => kind.to_string(),
    }
}

impl<S: Store + ?Sized> Store for ObservedStore<'_, S> {
    fn backend(&self) -> ticketflow_core::store::Backend {
        self.inner.backend()
    }
    fn begin(&mut self) -> StoreResult<()> {
        self.begins += 1;
        if self.begins == 1 {
            self.run_hook(HookPoint::BeforeBegin)?;
        }
        let t = now_us();
        let r = self.inner.begin();
        self.note("begin", StoreCall::Begin, t, r)
    }
    fn savepoint(&mut self, name: &str) -> StoreResult<()> {
        let t = now_us();
        let r = self.inner.savepoint(name);
        let call = StoreCall::Savepoint { name: name.into() };
        self.note("savepoint", call, t, r)
    }
    fn rollback_to_savepoint(&mut self, name: &str) -> StoreResult<()> {
        let t = now_us();
        let r = self.inner.rollback_to_savepoint(name);
        let call = StoreCall::RollbackToSavepoint { name: name.into() };
        self.note("rollback to savepoint", call, t, r)
    }
    fn release_savepoint(&mut self, name: &str) -> StoreResult<()> {
        let t = now_us();
        let r = self.inner.release_savepoint(name);
        let call = StoreCall::ReleaseSavepoint { name: name.into() };
        self.note("release savepoint", call, t, r)
    }
    fn commit(&mut self) -> StoreResult<()> {
        if self.wrote {
            self.run_hook(HookPoint::BeforeWriteCommit)?;
        }
        let t = now_us();
        let r = self.inner.commit();
        let r = self.note("commit", StoreCall::Commit, t, r);
        if r.is_ok() && std::mem::take(&mut self.wrote) {
            self.commits += 1;
            self.run_hook(HookPoint::AfterCommit(self.commits))?;
        }
        r
    }
    fn rollback(&mut self) -> StoreResult<()> {
        self.wrote = false;
        let t = now_us();
        let r = self.inner.rollback();
        self.note("rollback", StoreCall::Rollback, t, r)
    }
    fn find_receipt(&mut self, tenant_id: &str, key: &str) -> StoreResult<Option<Receipt>> {
        let t = now_us();
        let r = self.inner.find_receipt(tenant_id, key);
        let call = StoreCall::FindReceipt {
            tenant_id: tenant_id.into(),
            key: key.into(),
        };
        self.record_lookup("find receipt", call, t, &r);
        self.after_first_lookup(&r)?;
        r
    }
    fn insert_ticket(&mut self, ticket: &Ticket) -> StoreResult<()> {
        self.wrote = true;
        let t = now_us();
        let r = self.inner.insert_ticket(ticket);
        let call = StoreCall::InsertTicket {
            ticket: ticket.clone(),
        };
        let r = self.note("insert ticket", call, t, r);
        if r.is_ok() {
            self.run_hook(HookPoint::AfterTicketInsert)?;
        }
        r
    }
    fn insert_outbox(&mut self, event: &OutboxEvent) -> StoreResult<()> {
        self.wrote = true;
        let t = now_us();
        let r = self.inner.insert_outbox(event);
        let call = StoreCall::InsertOutbox {
            event: event.clone(),
        };
        self.note("insert outbox", call, t, r)
    }
    fn insert_receipt_if_absent(&mut self, receipt: &Receipt) -> StoreResult<bool> {
        self.wrote = true;
        let t = now_us();
        let r = self.inner.insert_receipt_if_absent(receipt);
        let what = match &r {
            Ok(true) => "insert receipt on conflict -> inserted".to_string(),
            Ok(false) => "insert receipt on conflict -> taken".to_string(),
            Err(e) => format!("insert receipt on conflict -> {}", describe(e)),
        };
        let call = StoreCall::InsertReceiptIfAbsent {
            receipt: receipt.clone(),
        };
        self.push(what, call, t);
        r
    }
    fn insert_receipt(&mut self, receipt: &Receipt) -> StoreResult<()> {
        self.wrote = true;
        let t = now_us();
        let r = self.inner.insert_receipt(receipt);
        let call = StoreCall::InsertReceipt {
            receipt: receipt.clone(),
        };
        self.note("insert receipt", call, t, r)
    }
    fn claim_and_create(
        &mut self,
        ticket: &Ticket,
        event: &OutboxEvent,
        receipt: &Receipt,
    ) -> StoreResult<Claimed> {
        // The statement is its own transaction, and its lookup: a barrier "before begin" or
        // "after the first lookup" holds the racer right before it (so every racer looks for
        // the receipt after the release), and it is a write about to commit.
        if self.begins == 0 && self.lookups == 0 {
            self.begins += 1;
            self.run_hook(HookPoint::BeforeBegin)?;
        }
        self.lookups += 1;
        if self.lookups == 1 {
            self.run_hook(HookPoint::AfterFirstLookup)?;
        }
        self.run_hook(HookPoint::BeforeWriteCommit)?;
        let t = now_us();
        let r = self.inner.claim_and_create(ticket, event, receipt);
        let what = match &r {
            Ok(Claimed::Won) => "claim and create -> won".to_string(),
            Ok(Claimed::Met { .. }) => "claim and create -> found".to_string(),
            Ok(Claimed::TakenUnseen) => "claim and create -> taken, unseen".to_string(),
            Err(e) => format!("claim and create -> {}", describe(e)),
        };
        let call = StoreCall::ClaimAndCreate {
            ticket: Box::new(ticket.clone()),
            event: Box::new(event.clone()),
            receipt: Box::new(receipt.clone()),
        };
        self.push(what, call, t);
        if self.first_lookup_empty.is_none() {
            self.first_lookup_empty = Some(!matches!(r, Ok(Claimed::Met { .. })));
        }
        if matches!(r, Ok(Claimed::Won)) {
            self.commits += 1;
            self.run_hook(HookPoint::AfterCommit(self.commits))?;
        }
        r
    }
    fn find_before_claim(
        &mut self,
        tenant_id: &str,
        key: &str,
    ) -> StoreResult<Option<(Receipt, Option<Ticket>)>> {
        // Only a store that really reads here (SQLite) sends a statement: it is the first
        // lookup, with the barrier before (before begin) or after it, as for `find_receipt`.
        if self.inner.backend() != ticketflow_core::store::Backend::Sqlite {
            return self.inner.find_before_claim(tenant_id, key);
        }
        if self.begins == 0 {
            self.begins += 1;
            self.run_hook(HookPoint::BeforeBegin)?;
        }
        let t = now_us();
        let r = self.inner.find_before_claim(tenant_id, key);
        let call = StoreCall::FindReceiptAndTicket {
            tenant_id: tenant_id.into(),
            key: key.into(),
        };
        self.record_lookup("find receipt and ticket", call, t, &r);
        self.after_first_lookup(&r)?;
        r
    }
    fn find_receipt_and_ticket(
        &mut self,
        tenant_id: &str,
        key: &str,
    ) -> StoreResult<Option<(Receipt, Option<Ticket>)>> {
        let t = now_us();
        let r = self.inner.find_receipt_and_ticket(tenant_id, key);
        let call = StoreCall::FindReceiptAndTicket {
            tenant_id: tenant_id.into(),
            key: key.into(),
        };
        self.record_lookup("find receipt and ticket", call, t, &r);
        r
    }
    fn find_ticket(&mut self, tenant_id: &str, id: Uuid) -> StoreResult<Option<Ticket>> {
        let t = now_us();
        let r = self.inner.find_ticket(tenant_id, id);
        let call = StoreCall::FindTicket {
            tenant_id: tenant_id.into(),
            id,
        };
        self.note("find ticket", call, t, r)
    }
    fn update_ticket(
        &mut self,
        tenant_id: &str,
        id: Uuid,
        patch: &TicketPatch,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<Ticket>> {
        self.wrote = true;
        let t = now_us();
        let r = self.inner.update_ticket(tenant_id, id, patch, now);
        let call = StoreCall::UpdateTicket {
            tenant_id: tenant_id.into(),
            id,
            patch: patch.clone(),
            now,
        };
        self.note("update ticket", call, t, r)
    }
}
