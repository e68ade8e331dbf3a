//! One racer's create call, observed step by step with its hooks (the barrier's, a process
//! dying after a commit): shared by the racer threads of a run and `ticketflow worker`.

use std::time::Instant;

use super::format::{LockMode, Racer};
use super::observed::{Hook, HookPoint, ObservedStore};
use super::timeline::Step;
use super::{RacerOutcome, RacerResult};
use ticketflow_core::domain::TicketRequest;
use ticketflow_core::protocol::RetryPolicy;
use ticketflow_core::store::postgres::{self as pg, PgStore};
use ticketflow_core::store::Store;
use ticketflow_core::variants::Implementation;

/// Key of the advisory lock used by [`LockMode::Advisory`] (fits in `pg_locks.objid`).
pub const ADVISORY_KEY: i64 = 0x7466_0001;

/// What a racer hands back.
pub(super) struct RacerRun {
    pub(super) result: RacerResult,
    pub(super) steps: Vec<Step>,
    pub(super) first_lookup_empty: Option<bool>,
    pub(super) released_at: Option<Instant>,
    pub(super) done_at: Instant,
}

/// One create request as a racer sends it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CreateCall<'r> {
    /// Tenant id.
    pub tenant: &'r str,
    /// Idempotency key.
    pub key: &'r str,
    /// The request.
    pub request: &'r TicketRequest,
}

impl<'r> From<&'r Racer> for CreateCall<'r> {
    fn from(r: &'r Racer) -> Self {
        CreateCall {
            tenant: &r.tenant,
            key: &r.key,
            request: &r.request,
        }
    }
}

/// Runs one racer's create through an [`ObservedStore`] with `hook`. `unreached` runs when the
/// racer ended without reaching its hook (so a barrier can be broken for the others).
pub(super) fn race<'a, S: Store + ?Sized>(
    store: &'a mut S,
    call: CreateCall<'_>,
    hooks: Vec<(HookPoint, Hook<'a, S>)>,
    implementation: Implementation,
    retry: &RetryPolicy,
    unreached: impl FnOnce(),
) -> RacerRun {
    let has_barrier = hooks
        .iter()
        .any(|(p, _)| matches!(p, HookPoint::BeforeBegin | HookPoint::AfterFirstLookup));
    let mut observed = ObservedStore::new(store, hooks);
    let result = implementation
        .create(&mut observed, call.tenant, call.key, call.request, retry)
        .map(|r| RacerOutcome::from(&r))
        .map_err(|e| e.to_string());
    if has_barrier && !observed.hook_reached {
        unreached();
    }
    RacerRun {
        result,
        first_lookup_empty: observed.first_lookup_empty,
        released_at: observed.released_at,
        steps: std::mem::take(&mut observed.steps),
        done_at: Instant::now(),
    }
}

/// The racer's side of a PostgreSQL barrier: with [`LockMode::Advisory`], wait for the
/// controller's advisory lock (shared) right after the first receipt lookup; relation locks
/// need no racer-side action. With `die_after_commits`, the process exits (code 137, no
/// reply) right after that many commits: a client dying between its transactions.
pub(super) fn pg_hooks<'a>(
    lock: LockMode,
    die_after_commits: Option<u32>,
) -> Vec<(HookPoint, Hook<'a, PgStore>)> {
    let mut hooks: Vec<(HookPoint, Hook<'a, PgStore>)> = Vec::new();
    if let Some(n) = die_after_commits {
        hooks.push((
            HookPoint::AfterCommit(n),
            Box::new(|_: &mut PgStore| std::process::exit(137)),
        ));
    }
    hooks.extend(pg_barrier_hook(lock));
    hooks
}

pub(super) fn pg_barrier_hook<'a>(lock: LockMode) -> Option<(HookPoint, Hook<'a, PgStore>)> {
    match lock {
        LockMode::Advisory => Some((
            HookPoint::AfterFirstLookup,
            Box::new(|s: &mut PgStore| {
                s.client()
                    .batch_execute(&format!(
                        "SELECT pg_advisory_xact_lock_shared({ADVISORY_KEY})"
                    ))
                    .map_err(|e| pg::classify("advisory barrier", e))
            }),
        )),
        LockMode::AccessExclusive | LockMode::Exclusive => None,
    }
}

/// Runs one PostgreSQL racer's create on `store` (a thread racer, or inside `ticketflow
/// worker`). Returns the outcome (or error text) and the recorded steps.
pub(crate) fn race_postgres(
    store: &mut PgStore,
    call: CreateCall<'_>,
    lock: LockMode,
    implementation: Implementation,
    retry: &RetryPolicy,
    die_after_commits: Option<u32>,
) -> (RacerResult, Vec<Step>) {
    let hooks = pg_hooks(lock, die_after_commits);
    let run = race(store, call, hooks, implementation, retry, || {});
    (run.result, run.steps)
}
