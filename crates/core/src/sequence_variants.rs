//! Served-only wrong implementations that no single race shows (`serve --variant`, the
//! kill matrix's `check` gate, [`crate::variants::Variant::SEQUENCE`]). Each answers a lone
//! client and a concurrent race over one fresh key correctly; each goes wrong only in a
//! *sequence*: a request after the first answer, the original body after a refusal, two keys
//! in one scope, the same key from another scope, or an effect read after the answer.
//!
//! | variant | deviation | the sequence that shows it |
//! |---|---|---|
//! | `replay-rerendered` | a replay is rendered from the current row with `updated_at` set to now | a retry after the answer: its body differs from the first answer |
//! | `cache-without-scope` | an in-process answer cache keyed by (key, fingerprint), without the tenant | the same key and body from another tenant, after the first answer, on the same instance: answered the other tenant's ticket |
//! | `fingerprint-on-race-path-only` | the fingerprint is compared after a unique violation only; a receipt found by the lookup is replayed whatever the body | another body under a used key, after the answer: replayed instead of refused |
//! | `refused-overwrites-fingerprint` | a refused body's fingerprint replaces the key's (in process memory) | the original body again after a refusal, on the same instance: refused |
//! | `late-outbox-after-replay` | the protocol, but `serve` writes another `ticket.created` row 300 ms after answering a replay | a retry after the answer, then the counts read after a settle time: two events for one key |
//! | `replay-newest` | a replay answers the tenant's newest ticket created by this instance, not the keyed one | two keys in one scope, then a retry of the first on the same instance: the second key's ticket |
//! | `key-hash-collision` | an in-process index from a key digest that ignores the key's last character to the first key stored under it | two keys of one scope that differ only at the end, on the same instance: the second is replayed the first's ticket, or refused |
//!
//! It also holds the pieces the other served variants share with these: `replay_any`
//! (`key-only` replays whatever the body), `locked` (process state), and `claim_with_placeholder`
//! with `complete_claim` (a key claimed in one transaction and completed in a second).
//!
//! Process memory (the cache, the overwritten fingerprints, the newest ticket, the key index) is per
//! instance, as such state is in a real service: the sequence shows the defect when its
//! requests reach the same instance.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

use crate::domain::{
    now_utc, CreateReport, DecisionPath, OutboxEvent, Outcome, Receipt, Ticket, TicketPatch,
    TicketRequest, TICKET_CREATED,
};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::protocol::{
    create_in_transaction, in_transaction, resolve, CreateOptions, CREATE_SAVEPOINT,
};
use crate::store::Store;

/// The process-wide state in `cell`, created empty on first use; a poisoned lock is taken as
/// it is (the state is a set or map that a panic cannot leave half-written).
pub(crate) fn locked<T: Default>(cell: &'static OnceLock<Mutex<T>>) -> MutexGuard<'static, T> {
    cell.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Decides a request against `receipt` as if its fingerprint were the stored one: the key's
/// ticket is replayed whatever the body (the deviation of `key-only`, and of
/// `fingerprint-on-race-path-only` on its lookup path).
pub(crate) fn replay_any<S: Store + ?Sized>(
    store: &mut S,
    receipt: &Receipt,
    path: DecisionPath,
) -> Result<CreateReport> {
    // DEVIATION: pretend the stored fingerprint is ours.
    let same = Fingerprint {
        canonical: String::new(),
        hash: receipt.payload_hash.clone(),
    };
    resolve(store, receipt, &same, path)
}

/// Claims a key inside the caller's transaction: `placeholder` and `receipt` inserted under
/// the protocol's savepoint. `Ok(true)`: the key is now this request's; `Ok(false)`: another
/// request's receipt was there first (unique violation, rolled back to the savepoint; the
/// winner's receipt can be read). The first half of `answer-in-second-transaction` and
/// `claim-never-expires`.
pub(crate) fn claim_with_placeholder<S: Store + ?Sized>(
    store: &mut S,
    placeholder: &Ticket,
    receipt: &Receipt,
) -> Result<bool> {
    store.savepoint(CREATE_SAVEPOINT)?;
    store.insert_ticket(placeholder)?;
    match store.insert_receipt(receipt) {
        Ok(()) => {
            store.release_savepoint(CREATE_SAVEPOINT)?;
            Ok(true)
        }
        Err(e) if e.is_unique_violation() => {
            store.rollback_to_savepoint(CREATE_SAVEPOINT)?;
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}

/// Completes claimed ticket `id` in a transaction of its own: its content from `request` (an
/// update, which makes it version 2) and its `ticket.created` outbox row. The second half of
/// `answer-in-second-transaction` and `claim-never-expires`.
///
/// Will return `Err` ([`Error::NotFound`]) when the ticket is gone, or a store error.
pub(crate) fn complete_claim<S: Store + ?Sized>(
    store: &mut S,
    tenant_id: &str,
    id: uuid::Uuid,
    request: &TicketRequest,
) -> Result<Ticket> {
    let patch = TicketPatch {
        title: Some(request.title.clone()),
        body: Some(request.body.clone()),
        priority: Some(request.priority.clone()),
    };
    in_transaction(store, |store| {
        let ticket = store
            .update_ticket(tenant_id, id, &patch, now_utc())?
            .ok_or(Error::NotFound { ticket_id: id })?;
        store.insert_outbox(&OutboxEvent::for_ticket(
            &ticket,
            TICKET_CREATED,
            ticket.updated_at,
        ))?;
        Ok(ticket)
    })
}

/// The default create protocol.
fn protocol<S: Store + ?Sized>(
    store: &mut S,
    tenant_id: &str,
    key: &str,
    request: &TicketRequest,
) -> Result<CreateReport> {
    crate::protocol::create_ticket(store, tenant_id, key, request, &CreateOptions::default())
}

/// `replay-rerendered`: the protocol, but a replay's `updated_at` is the time of the replay.
pub(crate) fn replay_rerendered<S: Store + ?Sized>(
    store: &mut S,
    tenant_id: &str,
    key: &str,
    request: &TicketRequest,
) -> Result<CreateReport> {
    let mut report = protocol(store, tenant_id, key, request)?;
    if let Outcome::Replayed { ticket } = &mut report.outcome {
        // DEVIATION: re-rendered with a field changed.
        ticket.updated_at = now_utc();
    }
    Ok(report)
}

/// `cache-without-scope`: answers a (key, fingerprint) this process answered before from its
/// cache, whichever tenant asks.
pub(crate) fn cache_without_scope<S: Store + ?Sized>(
    store: &mut S,
    tenant_id: &str,
    key: &str,
    request: &TicketRequest,
) -> Result<CreateReport> {
    static CACHE: OnceLock<Mutex<HashMap<(String, String), Ticket>>> = OnceLock::new();
    let fingerprint = Fingerprint::of(request);
    // DEVIATION: the cache key has no tenant.
    let cache_key = (key.to_string(), fingerprint.hash.clone());
    if let Some(ticket) = locked(&CACHE).get(&cache_key).cloned() {
        return Ok(CreateReport::new(
            Outcome::Replayed { ticket },
            DecisionPath::FromLookup,
        ));
    }
    let report = protocol(store, tenant_id, key, request)?;
    if let Outcome::Created { ticket } | Outcome::Replayed { ticket } = &report.outcome {
        locked(&CACHE).insert(cache_key, ticket.clone());
    }
    Ok(report)
}

/// `fingerprint-on-race-path-only`: a receipt found by the lookup is replayed without
/// comparing fingerprints; the protocol's insert path (savepoint, unique violation, the
/// winner's receipt compared) is kept.
pub(crate) fn fingerprint_on_race_path_only<S: Store + ?Sized>(
    store: &mut S,
    tenant_id: &str,
    key: &str,
    request: &TicketRequest,
) -> Result<CreateReport> {
    let fingerprint = Fingerprint::of(request);
    in_transaction(store, |store| {
        if let Some(receipt) = store.find_receipt(tenant_id, key)? {
            // DEVIATION: on the lookup path the stored fingerprint is taken for ours.
            return replay_any(store, &receipt, DecisionPath::FromLookup);
        }
        create_in_transaction(store, tenant_id, key, request, &fingerprint)
    })
}

/// `refused-overwrites-fingerprint`: after a refusal, the refused body's fingerprint is the
/// one this process compares the key's requests with.
pub(crate) fn refused_overwrites_fingerprint<S: Store + ?Sized>(
    store: &mut S,
    tenant_id: &str,
    key: &str,
    request: &TicketRequest,
) -> Result<CreateReport> {
    static STORED: OnceLock<Mutex<HashMap<(String, String), String>>> = OnceLock::new();
    let fingerprint = Fingerprint::of(request);
    let pair = (tenant_id.to_string(), key.to_string());
    let overwritten = locked(&STORED).get(&pair).cloned();
    let report = match overwritten {
        Some(hash) => in_transaction(store, |store| {
            let receipt = store.find_receipt(tenant_id, key)?.ok_or_else(|| {
                crate::error::Error::WinnerNotVisible {
                    idempotency_key: key.to_string(),
                }
            })?;
            // DEVIATION: compared with the overwritten fingerprint, not the receipt's.
            let stored = crate::domain::Receipt {
                payload_hash: hash,
                ..receipt
            };
            resolve(store, &stored, &fingerprint, DecisionPath::FromLookup)
        })?,
        None => protocol(store, tenant_id, key, request)?,
    };
    if let Outcome::Conflict { .. } = report.outcome {
        // DEVIATION: the refused body's fingerprint is stored for the key.
        locked(&STORED).insert(pair, fingerprint.hash);
    }
    Ok(report)
}

/// `replay-newest`: a replay answers the newest ticket this process created for the tenant.
pub(crate) fn replay_newest<S: Store + ?Sized>(
    store: &mut S,
    tenant_id: &str,
    key: &str,
    request: &TicketRequest,
) -> Result<CreateReport> {
    static NEWEST: OnceLock<Mutex<HashMap<String, Ticket>>> = OnceLock::new();
    let mut report = protocol(store, tenant_id, key, request)?;
    match &mut report.outcome {
        Outcome::Created { ticket } => {
            locked(&NEWEST).insert(tenant_id.to_string(), ticket.clone());
        }
        Outcome::Replayed { ticket } => {
            // DEVIATION: the tenant's newest ticket, not the one the key created.
            if let Some(newest) = locked(&NEWEST).get(tenant_id) {
                *ticket = newest.clone();
            }
        }
        Outcome::Conflict { .. } => {}
    }
    Ok(report)
}

/// The digest `key-hash-collision` indexes a key by: the key without its last character.
pub fn colliding_key(key: &str) -> &str {
    match key.char_indices().last() {
        Some((at, _)) if at > 0 => &key[..at],
        _ => key,
    }
}

/// `key-hash-collision`: an in-process index from (tenant, [`colliding_key`]) to the first key
/// this process stored under it; a later key with the same digest is run as that first key.
pub(crate) fn key_hash_collision<S: Store + ?Sized>(
    store: &mut S,
    tenant_id: &str,
    key: &str,
    request: &TicketRequest,
) -> Result<CreateReport> {
    static INDEX: OnceLock<Mutex<HashMap<(String, String), String>>> = OnceLock::new();
    let digest = (tenant_id.to_string(), colliding_key(key).to_string());
    // DEVIATION: the index keeps one key per digest, and keys that differ only in their last
    // character share a digest.
    let stored = locked(&INDEX)
        .entry(digest)
        .or_insert_with(|| key.to_string())
        .clone();
    protocol(store, tenant_id, &stored, request)
}

#[cfg(test)]
mod tests {
    use super::colliding_key;

    #[test]
    fn keys_that_differ_only_at_the_end_collide() {
        assert_eq!(colliding_key("tfv-r1-k1"), colliding_key("tfv-r1-k2"));
        assert_ne!(colliding_key("tfv-r1-k1"), colliding_key("tfv-r2-k1"));
        assert_eq!(colliding_key("k"), "k");
        assert_eq!(colliding_key("kå"), "k");
    }
}
