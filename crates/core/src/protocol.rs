//! The idempotent create protocol, `get_ticket` and `update_ticket`, written once over
//! [`Store`]: the one home of the idempotency rules (docs/PROTOCOL.md §4).
//!
//! **Invariant:** ticket, `ticket.created` outbox row and receipt commit together or not at
//! all; the receipt's unique key on (tenant, key), not a prior SELECT, decides a race.
//!
//! **Invariant:** on a unique violation of the receipt only the savepoint is rolled back, so
//! the outer transaction can still read the committed winner (docs/PROTOCOL.md §4.2 step 7).
//!
//! Three create protocols ([`Protocol`]) share the decision rule and the retry (the first two
//! also the lookup):
//! - `savepoint` (default; docs/PROTOCOL.md §4): lookup; in a savepoint insert ticket, event and
//!   receipt; on the receipt's unique violation roll back to the savepoint and read the winner.
//! - `on-conflict`: lookup; claim the key with `INSERT … ON CONFLICT DO NOTHING RETURNING` on
//!   the receipt (pointing at a ticket id generated here, UUID v4); only if a row came back,
//!   insert the ticket and its event. No savepoint, no error path: a taken key is "no row",
//!   after which a new statement reads the winner. Under READ COMMITTED the insert waited for
//!   an in-flight holder, so the winner is committed and visible; under REPEATABLE READ /
//!   SERIALIZABLE PostgreSQL answers 40001 instead and the whole transaction is retried. The
//!   receipt's foreign key is checked at commit (migration 0002), so the ticket may follow it.
//! - `single-statement` (docs/PROTOCOL.md §5.1): no explicit transaction. One statement, its own
//!   transaction, claims the key with the receipt's `ON CONFLICT DO NOTHING` and inserts ticket
//!   and event from the claim's `RETURNING` row (data-modifying CTEs), or returns the receipt
//!   its snapshot sees with that receipt's ticket: one round trip for a create, a replay or a
//!   conflict. A loser that waited for an in-flight winner (READ COMMITTED: committed after the
//!   statement's snapshot, so it cannot read it) sends a second statement that reads the winner;
//!   under REPEATABLE READ / SERIALIZABLE that case is 40001 and the statement is retried.

use std::time::Duration;

use uuid::Uuid;

use crate::domain::{
    now_utc, validate_create, validate_patch, validate_tenant, CreateReport, DecisionPath,
    OutboxEvent, Outcome, Receipt, Ticket, TicketPatch, TicketRequest, TICKET_CREATED,
    TICKET_UPDATED,
};
use crate::error::{DbErrorKind, Error, Result};
use crate::fingerprint::Fingerprint;
use crate::store::{Claimed, Store};

/// Name of the savepoint around the three inserts.
pub const CREATE_SAVEPOINT: &str = "ticketflow_create";

/// What to do with a create request given the receipt visible for its (tenant, key): the
/// pure decision rule of docs/PROTOCOL.md §4.1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// No receipt: create.
    Create,
    /// Same fingerprint: replay this ticket.
    Replay(Uuid),
    /// Different fingerprint: conflict.
    Conflict,
}

/// Decides create / replay / conflict from the receipt visible for the request's
/// (tenant, key) and the request's fingerprint hash. The caller looks the receipt up by
/// (tenant, key), so a receipt of another tenant never reaches this function.
pub fn decide(receipt: Option<&Receipt>, request_hash: &str) -> Decision {
    match receipt {
        None => Decision::Create,
        Some(r) if r.payload_hash == request_hash => Decision::Replay(r.ticket_id),
        Some(_) => Decision::Conflict,
    }
}

/// Bounded retry of a whole transaction after a transient failure: serialization failure
/// (SQLSTATE 40001), deadlock (40P01), SQLite busy (`SQLITE_BUSY`, `SQLITE_BUSY_SNAPSHOT`), or
/// a receipt unique violation whose winner this transaction's snapshot cannot see (REPEATABLE
/// READ). Backoff before attempt `n + 1` is uniformly random in
/// `[0, min(max_backoff, base_backoff * 2^(n-1))]` ("full jitter").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, at least 1 (1 = no retry).
    pub max_attempts: u32,
    /// Backoff cap of the first retry.
    pub base_backoff: Duration,
    /// Backoff cap of any retry.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    /// 10 attempts, 2 ms base, 100 ms cap.
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 10,
            base_backoff: Duration::from_millis(2),
            max_backoff: Duration::from_millis(100),
        }
    }
}

impl RetryPolicy {
    /// One attempt, no retry: the savepoint protocol (docs/PROTOCOL.md §4.2) without the retry of §7.5. Negative controls use it.
    pub const NONE: RetryPolicy = RetryPolicy {
        max_attempts: 1,
        base_backoff: Duration::ZERO,
        max_backoff: Duration::ZERO,
    };

    /// The random backoff before retry number `retry` (1-based).
    pub fn backoff(&self, retry: u32) -> Duration {
        let exp = self
            .base_backoff
            .saturating_mul(1u32 << retry.saturating_sub(1).min(20));
        let cap = exp.min(self.max_backoff);
        if cap.is_zero() {
            return Duration::ZERO;
        }
        let micros = rand::Rng::gen_range(&mut rand::thread_rng(), 0..=cap.as_micros() as u64);
        Duration::from_micros(micros)
    }
}

/// Which create protocol runs (see the module docs); `savepoint` by default.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Default,
    serde::Serialize,
    serde::Deserialize,
)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    // The variants' doc lines are also their `--protocol` help text.
    /// The default (docs/PROTOCOL.md §4): inserts in a savepoint; a unique violation rolls back to it.
    #[default]
    Savepoint,
    /// Receipt first with INSERT … ON CONFLICT DO NOTHING RETURNING; ticket and event only
    /// if the key was won.
    OnConflict,
    /// One statement, its own transaction (docs/PROTOCOL.md §5.1): claim, ticket and event in data-modifying CTEs, or the receipt met; a second statement only after an in-flight winner.
    SingleStatement,
}

impl Protocol {
    /// The three protocols, the default first.
    pub const ALL: [Protocol; 3] = [
        Protocol::Savepoint,
        Protocol::OnConflict,
        Protocol::SingleStatement,
    ];

    /// The `--protocol` name: `savepoint`, `on-conflict` or `single-statement`.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Savepoint => "savepoint",
            Protocol::OnConflict => "on-conflict",
            Protocol::SingleStatement => "single-statement",
        }
    }

    /// Parses a `--protocol` name; `None` for anything else.
    pub fn parse(name: &str) -> Option<Protocol> {
        Protocol::ALL.into_iter().find(|p| p.name() == name)
    }
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether an error is transient, so the whole transaction may be run again.
pub fn is_retryable(e: &Error) -> bool {
    match e {
        Error::Store(s) => matches!(
            s.kind,
            DbErrorKind::SerializationFailure | DbErrorKind::Deadlock | DbErrorKind::Busy
        ),
        Error::WinnerNotVisible { .. } => true,
        _ => false,
    }
}

/// A short label for why an attempt was retried, e.g. `serialization failure (40001)`.
fn retry_label(e: &Error) -> String {
    match e {
        Error::Store(s) => match &s.code {
            Some(code) => format!("{:?} ({code}) at {}", s.kind, s.operation),
            None => format!("{:?} at {}", s.kind, s.operation),
        },
        other => other.to_string(),
    }
}

/// Runs `attempt` until it succeeds, fails with a non-transient error, or the policy's
/// attempts are used up. Returns the value and the labels of the retried failures.
fn with_retry<S: Store + ?Sized, T>(
    store: &mut S,
    policy: &RetryPolicy,
    mut attempt: impl FnMut(&mut S) -> Result<T>,
) -> Result<(T, Vec<String>)> {
    let mut retried = Vec::new();
    loop {
        match attempt(store) {
            Ok(value) => return Ok((value, retried)),
            Err(e) if is_retryable(&e) => {
                let attempts = retried.len() as u32 + 1;
                if attempts >= policy.max_attempts.max(1) {
                    return Err(if attempts == 1 {
                        e
                    } else {
                        Error::RetriesExhausted {
                            attempts,
                            source: Box::new(e),
                        }
                    });
                }
                tracing::debug!(attempt = attempts, error = %e, "transient failure; retrying the transaction");
                retried.push(retry_label(&e));
                let pause = policy.backoff(attempts);
                if !pause.is_zero() {
                    std::thread::sleep(pause);
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// How a create runs: which [`Protocol`] and which [`RetryPolicy`]. The default is the
/// `savepoint` protocol with the default retry policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CreateOptions {
    /// The create protocol.
    pub protocol: Protocol,
    /// Bounded retry of the whole transaction after a transient failure.
    pub retry: RetryPolicy,
}

impl CreateOptions {
    /// `protocol` with the default [`RetryPolicy`].
    pub fn new(protocol: Protocol) -> Self {
        CreateOptions {
            protocol,
            retry: RetryPolicy::default(),
        }
    }
}

/// Creates a ticket idempotently (docs/PROTOCOL.md §4, §5): the one entry point of both
/// protocols. One transaction looks up the receipt and replays or conflicts if found; else
/// it inserts ticket, `ticket.created` event and receipt (`savepoint`: in a savepoint, and on
/// the receipt's unique violation rolls back to it; `on-conflict`: receipt first, ticket and
/// event only if the key was won) and, when another transaction holds the key, decides
/// against the committed winner. Validation, fingerprint, lookup and decision rule are the
/// same for both protocols (module docs). A transient failure reruns the whole transaction
/// (see [`RetryPolicy`]); the report counts the attempts. With [`RetryPolicy::NONE`] a
/// losing transaction whose snapshot cannot see the winner fails with
/// [`Error::WinnerNotVisible`].
///
/// Will return `Err` for invalid input (nothing written, key not poisoned), for a database
/// error (the transaction is rolled back), or [`Error::RetriesExhausted`].
pub fn create_ticket<S: Store + ?Sized>(
    store: &mut S,
    tenant_id: &str,
    idempotency_key: &str,
    request: &TicketRequest,
    options: &CreateOptions,
) -> Result<CreateReport> {
    validate_create(tenant_id, idempotency_key, request)?;
    let fingerprint = Fingerprint::of(request);
    let (mut report, retried) = match options.protocol {
        // Its statement is a transaction of its own: no BEGIN around it.
        Protocol::SingleStatement => with_retry(store, &options.retry, |store| {
            create_single_statement(store, tenant_id, idempotency_key, request, &fingerprint)
        })?,
        Protocol::Savepoint | Protocol::OnConflict => {
            let body = match options.protocol {
                Protocol::OnConflict => create_on_conflict_in_transaction::<S>,
                _ => create_in_transaction::<S>,
            };
            with_retry(store, &options.retry, |store| {
                in_transaction(store, |store| {
                    body(store, tenant_id, idempotency_key, request, &fingerprint)
                })
            })?
        }
    };
    report.attempts = retried.len() as u32 + 1;
    report.retried = retried;
    Ok(report)
}

/// The `on-conflict` transaction body: lookup; claim the key with the receipt's
/// `INSERT … ON CONFLICT DO NOTHING RETURNING`; if won, insert ticket and event; if taken,
/// read the committed winner with a new statement and decide against it.
pub(crate) fn create_on_conflict_in_transaction<S: Store + ?Sized>(
    store: &mut S,
    tenant_id: &str,
    key: &str,
    request: &TicketRequest,
    fingerprint: &Fingerprint,
) -> Result<CreateReport> {
    if let Some(receipt) = store.find_receipt(tenant_id, key)? {
        return resolve(store, &receipt, fingerprint, DecisionPath::FromLookup);
    }
    // The ticket id is generated here (UUID v4) and goes into the receipt that claims the key.
    let NewRows {
        ticket,
        event,
        receipt,
    } = NewRows::new(tenant_id, key, request, &fingerprint.hash);
    if store.insert_receipt_if_absent(&receipt)? {
        store.insert_ticket(&ticket)?;
        store.insert_outbox(&event)?;
        tracing::debug!(tenant_id, ticket_id = %ticket.id, "created (on conflict)");
        return Ok(CreateReport::created(ticket));
    }
    // The key is taken. Under READ COMMITTED the insert waited for the holder, which
    // committed; this new statement sees its receipt. Nothing of ours was written.
    tracing::debug!(tenant_id, "receipt key taken; reading the winner");
    match store.find_receipt(tenant_id, key)? {
        Some(winner) => resolve(
            store,
            &winner,
            fingerprint,
            DecisionPath::AfterInsertConflict,
        ),
        None => Err(Error::WinnerNotVisible {
            idempotency_key: key.to_string(),
        }),
    }
}

/// The `single-statement` protocol (docs/PROTOCOL.md §5.1), one attempt: one statement that
/// is its own transaction claims the key and, if won, inserts ticket and event
/// ([`Store::claim_and_create`]); a receipt it meets is decided on at once. Only a loser that
/// waited for an in-flight winner (committed after the statement's snapshot, so not
/// readable by it) sends a second statement, which reads the winner and its ticket.
pub(crate) fn create_single_statement<S: Store + ?Sized>(
    store: &mut S,
    tenant_id: &str,
    key: &str,
    request: &TicketRequest,
    fingerprint: &Fingerprint,
) -> Result<CreateReport> {
    // Where a read is free (SQLite), a replay is that read alone: no rows are built for it.
    if let Some((receipt, ticket)) = store.find_before_claim(tenant_id, key)? {
        return decide_met(&receipt, ticket, fingerprint, DecisionPath::FromLookup);
    }
    let NewRows {
        ticket,
        event,
        receipt,
    } = NewRows::new(tenant_id, key, request, &fingerprint.hash);
    match store.claim_and_create(&ticket, &event, &receipt)? {
        Claimed::Won => {
            tracing::debug!(tenant_id, ticket_id = %ticket.id, "created (single statement)");
            Ok(CreateReport::created(ticket))
        }
        Claimed::Met { receipt, ticket } => {
            decide_met(&receipt, ticket, fingerprint, DecisionPath::FromLookup)
        }
        Claimed::TakenUnseen => {
            tracing::debug!(
                tenant_id,
                "receipt key taken by an in-flight winner; reading it"
            );
            match store.find_receipt_and_ticket(tenant_id, key)? {
                Some((receipt, ticket)) => decide_met(
                    &receipt,
                    ticket,
                    fingerprint,
                    DecisionPath::AfterInsertConflict,
                ),
                None => Err(Error::WinnerNotVisible {
                    idempotency_key: key.to_string(),
                }),
            }
        }
    }
}

/// [`resolve`] for a receipt read together with its ticket (`None`: dangling).
pub(crate) fn decide_met(
    receipt: &Receipt,
    ticket: Option<Ticket>,
    fingerprint: &Fingerprint,
    path: DecisionPath,
) -> Result<CreateReport> {
    let outcome = match decide(Some(receipt), &fingerprint.hash) {
        Decision::Replay(ticket_id) => Outcome::Replayed {
            ticket: ticket.ok_or_else(|| Error::DanglingReceipt {
                idempotency_key: receipt.idempotency_key.clone(),
                ticket_id,
            })?,
        },
        Decision::Conflict | Decision::Create => conflict(receipt, fingerprint),
    };
    Ok(CreateReport::new(outcome, path))
}

/// The conflict outcome for a request whose fingerprint differs from `receipt`'s.
fn conflict(receipt: &Receipt, fingerprint: &Fingerprint) -> Outcome {
    Outcome::Conflict {
        conflict: crate::domain::Conflict {
            tenant_id: receipt.tenant_id.clone(),
            idempotency_key: receipt.idempotency_key.clone(),
            stored_hash: receipt.payload_hash.clone(),
            request_hash: fingerprint.hash.clone(),
        },
    }
}

/// Runs `body` between `begin` and `commit`; on any error rolls back and returns the error.
pub(crate) fn in_transaction<S: Store + ?Sized, T>(
    store: &mut S,
    body: impl FnOnce(&mut S) -> Result<T>,
) -> Result<T> {
    if let Err(e) = store.begin() {
        // A BEGIN can fail because the session is still inside a transaction (PostgreSQL
        // 25P02 after an earlier failed ROLLBACK): end that transaction, so the session does
        // not answer every later request with the same error. A failed rollback marks the
        // session broken (`PgStore::is_broken`), and a pool then discards it.
        let _ = store.rollback();
        return Err(e.into());
    }
    match body(store) {
        Ok(value) => match store.commit() {
            Ok(()) => Ok(value),
            Err(e) => {
                let _ = store.rollback();
                Err(e.into())
            }
        },
        Err(e) => {
            // The original error matters more than a failed rollback (the session may be gone).
            let _ = store.rollback();
            Err(e)
        }
    }
}

pub(crate) fn create_in_transaction<S: Store + ?Sized>(
    store: &mut S,
    tenant_id: &str,
    key: &str,
    request: &TicketRequest,
    fingerprint: &Fingerprint,
) -> Result<CreateReport> {
    if let Some(receipt) = store.find_receipt(tenant_id, key)? {
        return resolve(store, &receipt, fingerprint, DecisionPath::FromLookup);
    }

    let NewRows {
        ticket,
        event,
        receipt,
    } = NewRows::new(tenant_id, key, request, &fingerprint.hash);

    store.savepoint(CREATE_SAVEPOINT)?;
    store.insert_ticket(&ticket)?;
    store.insert_outbox(&event)?;
    match store.insert_receipt(&receipt) {
        Ok(()) => {
            store.release_savepoint(CREATE_SAVEPOINT)?;
            tracing::debug!(tenant_id, ticket_id = %ticket.id, "created");
            Ok(CreateReport::created(ticket))
        }
        Err(e) if e.is_unique_violation() => {
            // Another transaction holds this (tenant, key) and has committed: undo only our
            // savepoint and read the winner with a new statement (docs/PROTOCOL.md §4.2 step 7).
            tracing::debug!(tenant_id, "receipt unique violation; reading the winner");
            store.rollback_to_savepoint(CREATE_SAVEPOINT)?;
            resolve_winner(store, tenant_id, key, fingerprint)
        }
        Err(e) => Err(e.into()),
    }
}

/// The three rows a create inserts: the ticket (version 1, `open`), its `ticket.created`
/// outbox event and the receipt pointing at it, all stamped with one timestamp.
#[derive(Debug, Clone)]
pub struct NewRows {
    /// The ticket.
    pub ticket: Ticket,
    /// Its `ticket.created` event.
    pub event: OutboxEvent,
    /// The receipt (tenant, key) → fingerprint hash, ticket id.
    pub receipt: Receipt,
}

impl NewRows {
    /// Builds the rows for a validated request with a fresh ticket id.
    pub fn new(tenant_id: &str, key: &str, request: &TicketRequest, hash: &str) -> Self {
        let now = now_utc();
        let ticket = Ticket {
            id: Uuid::new_v4(),
            tenant_id: tenant_id.to_string(),
            actor_id: request.actor_id.clone(),
            title: request.title.clone(),
            body: request.body.clone(),
            priority: request.priority.clone(),
            status: "open".to_string(),
            version: 1,
            created_at: now,
            updated_at: now,
        };
        let event = OutboxEvent::for_ticket(&ticket, TICKET_CREATED, now);
        let receipt = Receipt {
            tenant_id: tenant_id.to_string(),
            idempotency_key: key.to_string(),
            payload_hash: hash.to_string(),
            ticket_id: ticket.id,
            created_at: now,
        };
        NewRows {
            ticket,
            event,
            receipt,
        }
    }
}

/// After a unique violation on the receipt: reads the committed winner with a new statement
/// and decides against it (docs/PROTOCOL.md §4.2 step 7). [`Error::WinnerNotVisible`] when this
/// transaction's snapshot cannot see it (REPEATABLE READ).
pub(crate) fn resolve_winner<S: Store + ?Sized>(
    store: &mut S,
    tenant_id: &str,
    key: &str,
    fingerprint: &Fingerprint,
) -> Result<CreateReport> {
    match store.find_receipt(tenant_id, key)? {
        Some(winner) => resolve(
            store,
            &winner,
            fingerprint,
            DecisionPath::AfterUniqueViolation,
        ),
        None => Err(Error::WinnerNotVisible {
            idempotency_key: key.to_string(),
        }),
    }
}

/// Decides a request against an existing receipt (docs/PROTOCOL.md §4.2 step 4, and step 7 with the
/// winner's receipt): replay reads the ticket as it is now; otherwise a conflict.
pub(crate) fn resolve<S: Store + ?Sized>(
    store: &mut S,
    receipt: &Receipt,
    fingerprint: &Fingerprint,
    path: DecisionPath,
) -> Result<CreateReport> {
    let outcome = match decide(Some(receipt), &fingerprint.hash) {
        Decision::Replay(ticket_id) => Outcome::Replayed {
            ticket: store
                .find_ticket(&receipt.tenant_id, ticket_id)?
                .ok_or_else(|| Error::DanglingReceipt {
                    idempotency_key: receipt.idempotency_key.clone(),
                    ticket_id,
                })?,
        },
        // With a receipt, `decide` never answers `Create`.
        Decision::Conflict | Decision::Create => conflict(receipt, fingerprint),
    };
    Ok(CreateReport::new(outcome, path))
}

/// Reads a ticket of this tenant. Will return [`Error::NotFound`] when there is none, also
/// when the id belongs to another tenant (existence never leaks across tenants).
pub fn get_ticket<S: Store + ?Sized>(store: &mut S, tenant_id: &str, id: Uuid) -> Result<Ticket> {
    validate_tenant(tenant_id)?;
    store
        .find_ticket(tenant_id, id)?
        .ok_or(Error::NotFound { ticket_id: id })
}

/// Changes title, body and/or priority of a ticket of this tenant, bumps `version`, sets
/// `updated_at` and writes a `ticket.updated` outbox row, all in one transaction.
///
/// Will return `Err` for an invalid or empty patch, [`Error::NotFound`] for an unknown id
/// (or another tenant's), or a database error (rolled back). Transient failures are retried
/// with the default [`RetryPolicy`].
pub fn update_ticket<S: Store + ?Sized>(
    store: &mut S,
    tenant_id: &str,
    id: Uuid,
    patch: &TicketPatch,
) -> Result<Ticket> {
    validate_patch(tenant_id, patch)?;
    let (ticket, _) = with_retry(store, &RetryPolicy::default(), |store| {
        in_transaction(store, |store| {
            let now = now_utc();
            let ticket = store
                .update_ticket(tenant_id, id, patch, now)?
                .ok_or(Error::NotFound { ticket_id: id })?;
            store.insert_outbox(&OutboxEvent::for_ticket(&ticket, TICKET_UPDATED, now))?;
            Ok(ticket)
        })
    })?;
    Ok(ticket)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receipt(tenant: &str, hash: &str) -> Receipt {
        Receipt {
            tenant_id: tenant.into(),
            idempotency_key: "key-1".into(),
            payload_hash: hash.into(),
            ticket_id: Uuid::nil(),
            created_at: now_utc(),
        }
    }

    fn store_error(kind: DbErrorKind, code: &str) -> Error {
        Error::Store(crate::StoreError {
            kind,
            backend: crate::store::Backend::Postgres,
            operation: "insert receipt",
            code: Some(code.into()),
            message: "m".into(),
        })
    }

    #[test]
    fn transient_failures_are_retryable_and_labelled() {
        for (kind, code) in [
            (DbErrorKind::SerializationFailure, "40001"),
            (DbErrorKind::Deadlock, "40P01"),
            (DbErrorKind::Busy, "5"),
        ] {
            let e = store_error(kind, code);
            assert!(is_retryable(&e), "{kind:?}");
            let label = retry_label(&e);
            assert!(
                label.contains(code) && label.contains("insert receipt"),
                "{label}"
            );
        }
        let invisible = Error::WinnerNotVisible {
            idempotency_key: "k".into(),
        };
        assert!(is_retryable(&invisible));
        assert!(retry_label(&invisible).contains("no winner is visible"));
        for kind in [
            DbErrorKind::UniqueViolation,
            DbErrorKind::Timeout,
            DbErrorKind::Connection,
        ] {
            assert!(!is_retryable(&store_error(kind, "x")), "{kind:?}");
        }
        assert!(!is_retryable(&Error::NotFound {
            ticket_id: Uuid::nil()
        }));
    }

    #[test]
    fn backoff_is_full_jitter_under_an_exponential_cap() {
        let p = RetryPolicy {
            max_attempts: 5,
            base_backoff: Duration::from_millis(2),
            max_backoff: Duration::from_millis(5),
        };
        for _ in 0..200 {
            assert!(p.backoff(1) <= Duration::from_millis(2));
            assert!(p.backoff(2) <= Duration::from_millis(4));
            assert!(p.backoff(9) <= Duration::from_millis(5));
        }
        // The cap grows: some draw for retry 3 exceeds the first retry's cap.
        assert!((0..200).any(|_| p.backoff(3) > Duration::from_millis(2)));
        assert_eq!(RetryPolicy::NONE.backoff(3), Duration::ZERO);
    }

    #[test]
    fn decider_covers_the_three_canonical_cases() {
        let x = "x".repeat(64);
        let y = "y".repeat(64);
        let a_x = receipt("A", &x);
        // A/key-1/X committed: A/key-1/X replays, A/key-1/Y conflicts.
        assert_eq!(decide(Some(&a_x), &x), Decision::Replay(Uuid::nil()));
        assert_eq!(decide(Some(&a_x), &y), Decision::Conflict);
        // B/key-1/X: B's lookup finds no receipt, so it creates.
        assert_eq!(decide(None, &x), Decision::Create);
    }
}
