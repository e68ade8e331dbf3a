//! A [`Store`] wrapper that records every operation a racer performs and, for the SQLite
//! runner, holds the racer at an in-process [`Barrier`] right after its first receipt lookup,
//! so every racer has observed "no receipt" before any of them inserts (the lesson's local
//! check). The protocol code is not touched.

use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::barrier::Barrier;
use crate::domain::{OutboxEvent, Receipt, Ticket, TicketPatch};
use crate::error::{DbErrorKind, StoreError};
use crate::store::{Store, StoreResult};

/// Recording wrapper around a store.
pub struct ObservedStore<'a, S: Store + ?Sized> {
    inner: &'a mut S,
    barrier: Option<(&'a Barrier, Duration)>,
    lookups: usize,
    /// The operations performed, e.g. `find_receipt -> none`, `insert_receipt -> unique violation`.
    pub steps: Vec<String>,
    /// Whether the first lookup saw no receipt.
    pub first_lookup_empty: Option<bool>,
    /// When the barrier let this racer go.
    pub released_at: Option<std::time::Instant>,
}

impl<'a, S: Store + ?Sized> ObservedStore<'a, S> {
    /// Wraps `inner`; with `barrier`, waits there (at most the given time) after the first
    /// receipt lookup.
    pub fn new(inner: &'a mut S, barrier: Option<(&'a Barrier, Duration)>) -> Self {
        ObservedStore {
            inner,
            barrier,
            lookups: 0,
            steps: Vec::new(),
            first_lookup_empty: None,
            released_at: None,
        }
    }

    fn note<T>(&mut self, op: &str, r: StoreResult<T>) -> StoreResult<T> {
        match &r {
            Ok(_) => self.steps.push(op.to_string()),
            Err(e) => self.steps.push(format!("{op} -> {}", describe(e))),
        }
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
        DbErrorKind::OtherConstraint => "constraint violation",
        DbErrorKind::Other => "error",
    };
    match &e.code {
        Some(code) => format!("{kind} ({code})"),
        None => kind.to_string(),
    }
}

impl<S: Store + ?Sized> Store for ObservedStore<'_, S> {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn begin(&mut self) -> StoreResult<()> {
        let r = self.inner.begin();
        self.note("begin", r)
    }
    fn savepoint(&mut self, name: &str) -> StoreResult<()> {
        let r = self.inner.savepoint(name);
        self.note("savepoint", r)
    }
    fn rollback_to_savepoint(&mut self, name: &str) -> StoreResult<()> {
        let r = self.inner.rollback_to_savepoint(name);
        self.note("rollback to savepoint", r)
    }
    fn release_savepoint(&mut self, name: &str) -> StoreResult<()> {
        let r = self.inner.release_savepoint(name);
        self.note("release savepoint", r)
    }
    fn commit(&mut self) -> StoreResult<()> {
        let r = self.inner.commit();
        self.note("commit", r)
    }
    fn rollback(&mut self) -> StoreResult<()> {
        let r = self.inner.rollback();
        self.note("rollback", r)
    }
    fn find_receipt(&mut self, tenant_id: &str, key: &str) -> StoreResult<Option<Receipt>> {
        let r = self.inner.find_receipt(tenant_id, key);
        let step = match &r {
            Ok(Some(_)) => "find receipt -> found".to_string(),
            Ok(None) => "find receipt -> none".to_string(),
            Err(e) => format!("find receipt -> {}", describe(e)),
        };
        self.steps.push(step);
        self.lookups += 1;
        if self.lookups == 1 {
            self.first_lookup_empty = Some(matches!(r, Ok(None)));
            if let Some((barrier, timeout)) = self.barrier {
                if r.is_err() {
                    barrier.abandon();
                    return r;
                }
                if let Err(e) = barrier.wait(timeout) {
                    self.steps.push(format!("barrier -> {e}"));
                    return Err(StoreError {
                        kind: DbErrorKind::Timeout,
                        backend: self.inner.backend(),
                        operation: "barrier",
                        code: None,
                        message: e.to_string(),
                    });
                }
                self.released_at = Some(std::time::Instant::now());
                self.steps.push("barrier released".into());
            }
        }
        r
    }
    fn insert_ticket(&mut self, ticket: &Ticket) -> StoreResult<()> {
        let r = self.inner.insert_ticket(ticket);
        self.note("insert ticket", r)
    }
    fn insert_outbox(&mut self, event: &OutboxEvent) -> StoreResult<()> {
        let r = self.inner.insert_outbox(event);
        self.note("insert outbox", r)
    }
    fn insert_receipt(&mut self, receipt: &Receipt) -> StoreResult<()> {
        let r = self.inner.insert_receipt(receipt);
        self.note("insert receipt", r)
    }
    fn find_ticket(&mut self, tenant_id: &str, id: Uuid) -> StoreResult<Option<Ticket>> {
        let r = self.inner.find_ticket(tenant_id, id);
        self.note("find ticket", r)
    }
    fn update_ticket(
        &mut self,
        tenant_id: &str,
        id: Uuid,
        patch: &TicketPatch,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<Ticket>> {
        let r = self.inner.update_ticket(tenant_id, id, patch, now);
        self.note("update ticket", r)
    }
}
