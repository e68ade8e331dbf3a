//! Served-only wrong implementations that only a fault shows (`serve --variant`, the kill
//! matrix's `explore` gate with the interposed files that kill the service). Each answers a
//! lone client, a race over one key and a lost acknowledgement correctly; each goes wrong
//! only when the process serving a request dies in the middle of it.
//!
//! | variant | deviation | the fault that shows it |
//! |---|---|---|
//! | `claim-never-expires` | the key is claimed in one transaction (a placeholder ticket, empty title, and its receipt) and completed in a second (the ticket's content and its `ticket.created` row); a request waits for one of its own process with the same key, and a claim held by another process is answered "in progress" (503, `cause` `key-in-progress`) and has no expiry | the service killed between the two commits: after the restart the claim's owner is gone, and every retry with the key is answered "in progress" for ever |
//!
//! | `redis-lock-expires` | keys in Redis (`serve --variant redis-lock-expires --lease URL`): `SET` a lock `NX PX` (the `--lease-ttl-ms`), then `GET` the record under it, create the ticket and its event in PostgreSQL (no receipt), `SET` the record, `DEL` the lock; a held lock is "in progress" (503). The lock is never renewed and its holder never checks it still holds it | a request held past the lock's TTL (a pause): another takes the expired lock, finds no record and creates; the held one then creates too, two tickets for one key |
//! | `answer-stored-after-response` | the ticket and its event commit first; the answer is sent, and only then is the receipt stored, in a transaction of its own (a request of the same key on this process waits for it). A create whose `COMMIT` acknowledgement was lost is remembered until it is answered | the receipt's write failing after the answer (its connection cut there): the client's retry finds no receipt and creates again, two tickets |
//!
//! A claim records its owner (this process's instance id, in the placeholder's body). A
//! request of this process that failed after claiming (its `COMMIT` acknowledgement lost)
//! left a claim its own process may take over: a later request that finds a claim of this
//! process not in flight completes it. Only a claim of a process that is gone is stuck,
//! which is what a crash makes.

use std::collections::{HashMap, HashSet};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::domain::{CreateReport, DecisionPath, Receipt, Ticket, TicketRequest};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::protocol::{in_transaction, resolve, NewRows};
use crate::redis_keys::{RedisKeys, RedisLockError};
use crate::sequence_variants::{claim_with_placeholder, complete_claim, locked};
use crate::store::Store;

/// What a placeholder's body starts with; the owner's instance id follows.
const CLAIM_PREFIX: &str = "claim:";

/// This process's instance id: a fresh v4 UUID on first use.
fn instance() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| uuid::Uuid::new_v4().to_string())
}

/// The (tenant, key) pairs this process is creating now: at most one request per key at a
/// time (a second waits for the first to end), so a claim of this process found by the
/// request in flight for its key was left by an earlier request that failed.
static IN_FLIGHT: OnceLock<Mutex<HashSet<(String, String)>>> = OnceLock::new();

/// Signalled when a request leaves [`IN_FLIGHT`].
static FLIGHT_ENDED: Condvar = Condvar::new();

/// The longest a request waits for another request of this process with its key; then it is
/// answered "in progress".
const IN_FLIGHT_WAIT: Duration = Duration::from_secs(30);

/// Removes its (tenant, key) from [`IN_FLIGHT`] when dropped.
#[derive(Debug)]
struct Flight(String, String);

impl Drop for Flight {
    fn drop(&mut self) {
        locked(&IN_FLIGHT).remove(&(self.0.clone(), self.1.clone()));
        FLIGHT_ENDED.notify_all();
    }
}

/// What a claimed key's placeholder says.
enum Claim {
    /// Not a claim: the ticket has its content.
    Complete,
    /// A claim of this process: a request of ours failed after claiming.
    Orphaned,
    /// A claim of another process.
    Held,
}

fn claim_of(ticket: &Ticket) -> Claim {
    if !ticket.title.is_empty() {
        Claim::Complete
    } else if ticket.body.strip_prefix(CLAIM_PREFIX) == Some(instance()) {
        Claim::Orphaned
    } else {
        Claim::Held
    }
}

/// What the claim transaction found or did.
enum Claimed {
    /// The key was answered (replayed or refused) from a complete receipt.
    Answered(Box<CreateReport>),
    /// This request now owns the claim on ticket `id` (new, or an orphan taken over).
    Ours(uuid::Uuid),
}

/// `claim-never-expires` (module docs).
pub(crate) fn claim_never_expires<S: Store + ?Sized>(
    store: &mut S,
    tenant_id: &str,
    key: &str,
    request: &TicketRequest,
) -> Result<CreateReport> {
    let fingerprint = Fingerprint::of(request);
    let rows = NewRows::new(tenant_id, key, request, &fingerprint.hash);
    let placeholder = Ticket {
        title: String::new(),
        body: format!("{CLAIM_PREFIX}{}", instance()),
        ..rows.ticket.clone()
    };
    // A request of this process with the key is running: wait for it to end.
    let flight = fly(tenant_id, key)?;
    let met = |store: &mut S, receipt: &Receipt| -> Result<Claimed> {
        if receipt.payload_hash != fingerprint.hash {
            return resolve(store, receipt, &fingerprint, DecisionPath::FromLookup)
                .map(|r| Claimed::Answered(Box::new(r)));
        }
        let ticket = store
            .find_ticket(tenant_id, receipt.ticket_id)?
            .ok_or_else(|| Error::DanglingReceipt {
                idempotency_key: key.to_string(),
                ticket_id: receipt.ticket_id,
            })?;
        match claim_of(&ticket) {
            Claim::Complete => resolve(store, receipt, &fingerprint, DecisionPath::FromLookup)
                .map(|r| Claimed::Answered(Box::new(r))),
            Claim::Orphaned => Ok(Claimed::Ours(ticket.id)),
            // DEVIATION: a claim has no expiry; its owner is assumed alive.
            Claim::Held => Err(Error::KeyInProgress {
                idempotency_key: key.to_string(),
            }),
        }
    };
    let claimed = in_transaction(store, |store| {
        if let Some(receipt) = store.find_receipt(tenant_id, key)? {
            return met(store, &receipt);
        }
        if claim_with_placeholder(store, &placeholder, &rows.receipt)? {
            return Ok(Claimed::Ours(placeholder.id));
        }
        match store.find_receipt(tenant_id, key)? {
            Some(receipt) => met(store, &receipt),
            None => Err(Error::WinnerNotVisible {
                idempotency_key: key.to_string(),
            }),
        }
    });
    let id = match claimed? {
        Claimed::Answered(report) => return Ok(*report),
        Claimed::Ours(id) => id,
    };
    // DEVIATION: the claim is committed; the answer it stands for is completed only now, in
    // a transaction of its own. A process that dies here leaves the claim for ever.
    let ticket = complete_claim(store, tenant_id, id, request)?;
    drop(flight);
    Ok(CreateReport::created(ticket))
}

/// `redis-lock-expires` (module docs): the lock is taken first and the record read under it,
/// so two requests never both pass the check while the lock holds; it holds for `lock_ttl_ms`
/// only, and nothing notices when it has expired under a slow holder.
///
/// Will return `Err` as [`crate::variants::redis_check_then_lock`] does.
pub fn redis_lock_expires<S: Store + ?Sized>(
    store: &mut S,
    redis: &mut redis::Connection,
    tenant_id: &str,
    key: &str,
    request: &TicketRequest,
    lock_ttl_ms: u64,
) -> std::result::Result<CreateReport, RedisLockError> {
    crate::domain::validate_create(tenant_id, key, request).map_err(Error::from)?;
    let fingerprint = Fingerprint::of(request);
    let mut keys = RedisKeys::new(redis, tenant_id, key);
    if !keys.lock(lock_ttl_ms)? {
        return Err(RedisLockError::InProgress {
            idempotency_key: key.to_string(),
        });
    }
    if let Some(text) = keys.record()? {
        keys.unlock();
        return keys.replay(store, &text, &fingerprint);
    }
    // DEVIATION: the lock is taken to last as long as this request does; it lasts
    // `lock_ttl_ms`, and this request goes on whether it still holds it or not.
    keys.create(store, request, &fingerprint)
}

/// Remembered creates of `answer-stored-after-response` whose answer was never sent (a lost
/// `COMMIT` acknowledgement): (tenant, key) → the ticket id and the request's fingerprint hash.
static UNANSWERED: OnceLock<Mutex<HashMap<Pair, (uuid::Uuid, String)>>> = OnceLock::new();

/// Receipts of `answer-stored-after-response` to store after the answer, with the flight
/// that holds their key until then: (tenant, key) → the receipt.
static LATE: OnceLock<Mutex<HashMap<Pair, (Receipt, Flight)>>> = OnceLock::new();

/// A (tenant, key) pair.
type Pair = (String, String);

/// A receipt to store after the answer ([`take_late_receipt`]); the key's other requests on
/// this process wait until it is dropped.
pub struct LateReceipt {
    /// The receipt to insert.
    pub receipt: Receipt,
    _flight: Flight,
}

/// The receipt `answer-stored-after-response` left for (tenant, key) to be stored after the
/// answer, if any: `serve` takes it once the response is built and inserts it on a session of
/// its own, then drops it.
pub fn take_late_receipt(tenant_id: &str, key: &str) -> Option<LateReceipt> {
    locked(&LATE)
        .remove(&(tenant_id.to_string(), key.to_string()))
        .map(|(receipt, flight)| LateReceipt {
            receipt,
            _flight: flight,
        })
}

/// Waits until no other request of this process holds (tenant, key), then holds it.
fn fly(tenant_id: &str, key: &str) -> Result<Flight> {
    let pair = (tenant_id.to_string(), key.to_string());
    let until = Instant::now() + IN_FLIGHT_WAIT;
    let mut f = locked(&IN_FLIGHT);
    while f.contains(&pair) {
        let now = Instant::now();
        if now >= until {
            return Err(Error::KeyInProgress {
                idempotency_key: key.to_string(),
            });
        }
        f = FLIGHT_ENDED
            .wait_timeout(f, until - now)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
    f.insert(pair);
    Ok(Flight(tenant_id.to_string(), key.to_string()))
}

/// `answer-stored-after-response` (module docs). A new create is answered created with its
/// receipt left for [`take_late_receipt`]; everything else as the protocol would answer.
pub(crate) fn answer_stored_after_response<S: Store + ?Sized>(
    store: &mut S,
    tenant_id: &str,
    key: &str,
    request: &TicketRequest,
) -> Result<CreateReport> {
    let fingerprint = Fingerprint::of(request);
    let flight = fly(tenant_id, key)?;
    let pair = (tenant_id.to_string(), key.to_string());
    if let Some(receipt) = in_transaction(store, |store| Ok(store.find_receipt(tenant_id, key)?))? {
        return in_transaction(store, |store| {
            resolve(store, &receipt, &fingerprint, DecisionPath::FromLookup)
        });
    }
    let rows = NewRows::new(tenant_id, key, request, &fingerprint.hash);
    // A create of ours whose acknowledgement was lost: if its ticket committed, it is the key's.
    let remembered = locked(&UNANSWERED).get(&pair).cloned();
    if let Some((id, hash)) = remembered {
        if let Some(ticket) = in_transaction(store, |store| Ok(store.find_ticket(tenant_id, id)?))?
        {
            let receipt = Receipt {
                ticket_id: ticket.id,
                payload_hash: hash,
                ..rows.receipt.clone()
            };
            in_transaction(store, |store| Ok(store.insert_receipt(&receipt)?))?;
            locked(&UNANSWERED).remove(&pair);
            return in_transaction(store, |store| {
                resolve(store, &receipt, &fingerprint, DecisionPath::FromLookup)
            });
        }
    }
    locked(&UNANSWERED).insert(pair.clone(), (rows.ticket.id, fingerprint.hash.clone()));
    in_transaction(store, |store| {
        store.insert_ticket(&rows.ticket)?;
        store.insert_outbox(&rows.event)?;
        Ok(())
    })?;
    // DEVIATION: answered now; the receipt is stored after the answer, and once answered the
    // create is forgotten: a receipt that is never stored leaves the key free.
    locked(&UNANSWERED).remove(&pair);
    locked(&LATE).insert(pair, (rows.receipt.clone(), flight));
    Ok(CreateReport::created(rows.ticket))
}
