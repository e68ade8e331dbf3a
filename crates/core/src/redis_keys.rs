//! The Redis side of the served `redis-*` variants (`redis-check-then-lock` in
//! [`crate::variants`], `redis-lock-expires` in [`crate::fault_variants`]): the record and lock
//! keys of (tenant, key), the record stored under them, the errors, and the steps the variants
//! share (read the record, take the lock, replay a record, create and record).

use crate::domain::{now_utc, CreateReport, DecisionPath, Receipt, TicketRequest};
use crate::error::Error;
use crate::fingerprint::Fingerprint;
use crate::protocol::{decide_met, in_transaction, NewRows};
use crate::store::Store;

/// How long the `redis-*` variants keep a record (`SET … EX`), in seconds: replays within
/// it are answered from the record. Short, since the variant exists for tests.
pub const REDIS_RECORD_TTL_SECS: u64 = 600;

/// The `redis-*` variants' keys for (tenant, key): `(record, lock)`, both under the prefix
/// `ticketflow:rctl:`, the tenant and key encoded as [`crate::lease::lease_key`] does (so
/// the two parts cannot run together).
pub fn redis_lock_keys(tenant_id: &str, key: &str) -> (String, String) {
    let both = crate::lease::lease_key(tenant_id, key);
    let both = both.strip_prefix("lease:").unwrap_or(&both);
    (
        format!("ticketflow:rctl:rec:{both}"),
        format!("ticketflow:rctl:lock:{both}"),
    )
}

/// What the `redis-*` variants store under the record key: the request's fingerprint hash
/// and the ticket created for it (JSON).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RedisRecord {
    /// SHA-256 hex of the canonical request ([`Fingerprint`]).
    pub payload_hash: String,
    /// The ticket created under the key.
    pub ticket_id: uuid::Uuid,
}

/// Why a create of a `redis-*` variant did not answer.
#[derive(Debug, thiserror::Error)]
pub enum RedisLockError {
    /// Another request holds the key's lock: nothing was written; retry with the same key.
    #[error(
        "a request with idempotency key {idempotency_key:?} is in progress (its lock is held)"
    )]
    InProgress {
        /// The key.
        idempotency_key: String,
    },
    /// A Redis command failed or timed out; after the lock was taken the ticket may have been
    /// created (`written_maybe`).
    #[error("redis {operation}: {source}")]
    Redis {
        /// `GET record`, `SET lock`, `SET record`, `DEL lock`.
        operation: &'static str,
        /// Whether the ticket may have been committed before the failure.
        written_maybe: bool,
        /// The client's error.
        #[source]
        source: redis::RedisError,
    },
    /// The record under the key is not the JSON this variant writes.
    #[error("redis record for key {idempotency_key:?} is unreadable: {message}")]
    BadRecord {
        /// The key.
        idempotency_key: String,
        /// The parser's message.
        message: String,
    },
    /// Validation, or the PostgreSQL part (the create, or the replay's read of the ticket).
    #[error(transparent)]
    Create(#[from] Error),
}

/// One request's keys in the Redis of the `redis-*` variants, and the steps they share:
/// read the record, take the lock, replay a record, create and record.
pub(crate) struct RedisKeys<'a> {
    redis: &'a mut redis::Connection,
    tenant_id: &'a str,
    key: &'a str,
    record_key: String,
    lock_key: String,
}

impl<'a> RedisKeys<'a> {
    /// The keys of (tenant, key) ([`redis_lock_keys`]) on `redis`.
    pub(crate) fn new(redis: &'a mut redis::Connection, tenant_id: &'a str, key: &'a str) -> Self {
        let (record_key, lock_key) = redis_lock_keys(tenant_id, key);
        RedisKeys {
            redis,
            tenant_id,
            key,
            record_key,
            lock_key,
        }
    }

    fn failed(
        operation: &'static str,
        written_maybe: bool,
    ) -> impl Fn(redis::RedisError) -> RedisLockError {
        move |source| RedisLockError::Redis {
            operation,
            written_maybe,
            source,
        }
    }

    /// `GET` record: its text, if the key has one.
    pub(crate) fn record(&mut self) -> std::result::Result<Option<String>, RedisLockError> {
        redis::cmd("GET")
            .arg(&self.record_key)
            .query(self.redis)
            .map_err(Self::failed("GET record", false))
    }

    /// `SET` lock `NX PX ttl_ms`: whether this request took it.
    pub(crate) fn lock(&mut self, ttl_ms: u64) -> std::result::Result<bool, RedisLockError> {
        let taken: Option<String> = redis::cmd("SET")
            .arg(&self.lock_key)
            .arg("1")
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms.max(1))
            .query(self.redis)
            .map_err(Self::failed("SET lock", false))?;
        Ok(taken.is_some())
    }

    /// `DEL` lock, its failure ignored (the lock then ends with its TTL).
    pub(crate) fn unlock(&mut self) {
        let _: redis::RedisResult<i64> = redis::cmd("DEL").arg(&self.lock_key).query(self.redis);
    }

    /// The answer a stored record gives: its ticket (read from `store`) replayed, or a
    /// conflict for another body.
    pub(crate) fn replay<S: Store + ?Sized>(
        &self,
        store: &mut S,
        text: &str,
        fingerprint: &Fingerprint,
    ) -> std::result::Result<CreateReport, RedisLockError> {
        let record: RedisRecord =
            serde_json::from_str(text).map_err(|e| RedisLockError::BadRecord {
                idempotency_key: self.key.to_string(),
                message: e.to_string(),
            })?;
        let receipt = Receipt {
            tenant_id: self.tenant_id.to_string(),
            idempotency_key: self.key.to_string(),
            payload_hash: record.payload_hash,
            ticket_id: record.ticket_id,
            created_at: now_utc(),
        };
        let ticket = store
            .find_ticket(self.tenant_id, record.ticket_id)
            .map_err(Error::from)?;
        Ok(decide_met(
            &receipt,
            ticket,
            fingerprint,
            DecisionPath::FromLookup,
        )?)
    }

    /// Creates the ticket and its event in one transaction (no receipt), then `SET` record
    /// (`EX` [`REDIS_RECORD_TTL_SECS`]) and `DEL` lock. A failed create lets go of the lock at
    /// once (nothing was written).
    pub(crate) fn create<S: Store + ?Sized>(
        &mut self,
        store: &mut S,
        request: &TicketRequest,
        fingerprint: &Fingerprint,
    ) -> std::result::Result<CreateReport, RedisLockError> {
        let rows = NewRows::new(self.tenant_id, self.key, request, &fingerprint.hash);
        let created = in_transaction(store, |store| {
            store.insert_ticket(&rows.ticket)?;
            store.insert_outbox(&rows.event)?;
            Ok(())
        });
        if let Err(e) = created {
            // Nothing was written: let the next request in at once rather than after the TTL.
            self.unlock();
            return Err(e.into());
        }
        let record = RedisRecord {
            payload_hash: fingerprint.hash.clone(),
            ticket_id: rows.ticket.id,
        };
        let text = serde_json::to_string(&record).expect("a record serializes");
        let () = redis::cmd("SET")
            .arg(&self.record_key)
            .arg(text)
            .arg("EX")
            .arg(REDIS_RECORD_TTL_SECS)
            .query(self.redis)
            .map_err(Self::failed("SET record", true))?;
        let _: i64 = redis::cmd("DEL")
            .arg(&self.lock_key)
            .query(self.redis)
            .map_err(Self::failed("DEL lock", true))?;
        Ok(CreateReport::created(rows.ticket))
    }
}
