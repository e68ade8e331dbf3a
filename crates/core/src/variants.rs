//! The five wrong implementations of docs/PROTOCOL.md §8, each a small, clearly named deviation from
//! [`crate::protocol::create_ticket`], so the harness can show that its gates catch them.
//! The real protocol is not bent to make room for them: each variant is its own function
//! that reuses the protocol's pieces where it does not deviate.
//!
//! | variant | deviation | expected symptom |
//! |---|---|---|
//! | `key-only` | compares only the key, not the fingerprint | a different intent is replayed |
//! | `noncanonical-fingerprint` | hashes a `HashMap`'s debug string | false conflicts on honest retries |
//! | `check-then-insert` | no savepoint, no unique-violation handling; run without the receipt constraint | two tickets under a race |
//! | `abandon-outer-tx` | no savepoint; after the unique violation reads on in the failed transaction | 25P02 on PostgreSQL; orphan ticket and event elsewhere |
//! | `split-transactions` | ticket, outbox row and receipt in three transactions | half states after a fault or to a concurrent reader |
//!
//! And one wrong implementation of the `on-conflict` protocol, a negative control showing the
//! gates hold that protocol to the same rules ([`Variant::ON_CONFLICT`]):
//!
//! | variant | deviation | expected symptom |
//! |---|---|---|
//! | `on-conflict-ignores-loss` | ignores that `ON CONFLICT DO NOTHING` returned no row: inserts its ticket and event anyway and answers created | two tickets and two `ticket.created` rows for one key; racers hold different ids |
//!
//! And one wrong implementation of the `single-statement` protocol ([`Variant::SINGLE_STATEMENT`]):
//!
//! | variant | deviation | expected symptom |
//! |---|---|---|
//! | `single-statement-skips-reread` | forgets the loser's second statement: an empty answer (the key taken by a winner the statement's snapshot could not see) is taken for a win | a loser of an in-flight race answers created with a ticket id that was never written; two created for one key (PostgreSQL; on SQLite a writer always sees the winner, so it is the protocol there) |
//!
//! And two wrong uses of the Redis lease in front of the receipt (docs/PROTOCOL.md §10,
//! [`Variant::LEASE`]); they are judged with Redis in the loop (the lease scenarios), since
//! without a lease they are not what they claim to be:
//!
//! | variant | deviation | expected symptom |
//! |---|---|---|
//! | `lease-unsafe-release` | the real protocol, but the lease is released with a plain `DEL` | an old holder paused past the TTL deletes the newer holder's lease |
//! | `lease-as-arbiter` | the lease is the only guard: check-then-insert, no receipt unique constraint | after the lease expires or is flushed under a paused holder, two tickets for one key |
//!
//! And two served-only wrong implementations whose window lies between the service's own
//! store commands, where a barrier that holds every request at one point and then lets them
//! run free rarely lands; the interposer's exploration (docs/INTERPOSER.md) finds them, and
//! the kill matrix's `explore` gate is for them ([`Variant::EXPLORED`], with
//! `split-transactions`). A client that is not raced sees correct behaviour from both (201,
//! then a replay with the same body):
//!
//! | variant | deviation | expected symptom |
//! |---|---|---|
//! | `answer-in-second-transaction` | the key is claimed and the effect committed in one transaction (a placeholder ticket, empty title and body, and the receipt pointing at it), but the answer is completed in a second one (the ticket updated to the request's content, version 2, and its `ticket.created` outbox row) | a replay that reads the receipt between the two commits answers the placeholder: its body differs from the creator's answer (the black-box `same answer` check) |
//! | `redis-check-then-lock` | keys in Redis, not in the receipt table: `GET` the record, else `SET` a lock `NX PX`, create the ticket and its event in PostgreSQL (no receipt), `SET` the record, `DEL` the lock; a held lock answers 503 (retry with the same key) | a request whose `GET` ran before the record existed and whose `SET NX` runs after the `DEL` takes a fresh lock and creates a second ticket |

//!
//! And seven served-only wrong implementations that no single race shows, each needing a
//! sequence of requests ([`Variant::SEQUENCE`], documented in [`crate::sequence_variants`]):
//! `replay-rerendered`, `cache-without-scope`, `fingerprint-on-race-path-only`,
//! `refused-overwrites-fingerprint`, `late-outbox-after-replay`, `replay-newest`,
//! `key-hash-collision`. `ticketflow check` (generated histories) must kill each.
//!
//! And three served-only wrong implementations that only a fault of production shows, each
//! documented in [`crate::fault_variants`] and judged by an interposed file with its fault
//! (docs/INTERPOSER.md "Faults at a step"): `claim-never-expires` (the service killed at a
//! step), `redis-lock-expires` (a request paused past its lock's TTL),
//! `answer-stored-after-response` (a write cut after the answer).
//!
//! And one served-only wrong handling of a lost commit acknowledgement ([`Variant::SERVED_ONLY`];
//! judged by the interposer's cut after a `COMMIT`, docs/INTERPOSER.md "Faults at a step"):
//!
//! | variant | deviation | expected symptom |
//! |---|---|---|
//! | `lost-ack-creates-again` | a connection lost at `COMMIT` is read as "not created"; the client's retry with that key creates again | after a lost acknowledgement, two tickets and two `ticket.created` rows for one key, and the retry answered created with a second id; without the fault it is the protocol |
use std::collections::HashMap;

use crate::domain::{validate_create, CreateReport, DecisionPath, Ticket, TicketRequest};
use crate::error::{DbErrorKind, Error, Result, StoreError};
use crate::fingerprint::{sha256_hex, Fingerprint};
use crate::protocol::{
    decide_met, in_transaction, resolve, resolve_winner, CreateOptions, NewRows, Protocol,
    RetryPolicy, CREATE_SAVEPOINT,
};
use crate::redis_keys::RedisKeys;
pub use crate::redis_keys::{redis_lock_keys, RedisLockError, RedisRecord, REDIS_RECORD_TTL_SECS};
use crate::sequence_variants;
use crate::store::{Backend, Claimed, Store};

/// One of docs/PROTOCOL.md §8's wrong implementations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Variant {
    /// 1. Compare only the key, not the fingerprint.
    KeyOnly,
    /// 2. A non-canonical fingerprint (a `HashMap`'s debug string, whose order is random).
    NoncanonicalFingerprint,
    /// 3. Check-then-insert; meant to run without the receipt's unique constraint.
    CheckThenInsert,
    /// 4. On the unique violation, keep using the failed outer transaction instead of rolling
    ///    back to a savepoint.
    AbandonOuterTx,
    /// 5. Ticket, outbox row and receipt in three separate transactions.
    SplitTransactions,
    /// The `on-conflict` protocol, but a taken key (no row returned) is not noticed: the
    /// ticket and event are inserted anyway and the answer is "created".
    OnConflictIgnoresLoss,
    /// The `single-statement` protocol without its second statement: an answer of "taken, but
    /// not visible" is read as a win, and the request is answered created with its own
    /// (never written) ticket.
    SingleStatementSkipsReread,
    /// Served only (a black-box negative control, not one of the five): keys are not
    /// scoped by tenant. Every request is run by the real protocol in one namespace shared
    /// by all tenants, so another tenant's request with the same key and body is replayed
    /// the first tenant's ticket (the cross-tenant replay docs/PROTOCOL.md §9 forbids).
    TenantBlind,
    /// The real protocol behind the lease, but the lease is released with a plain `DEL`
    /// ([`crate::lease::Release::PlainDelete`]): an old holder deletes a newer holder's lease.
    LeaseUnsafeRelease,
    /// The lease is the only guard: check-then-insert behind the lease, run without the
    /// receipt's unique constraint.
    LeaseAsArbiter,
    /// Served only: the key is claimed with a placeholder ticket (empty title and body) and
    /// its receipt in one transaction; the ticket gets its content (an update: version 2) and
    /// its `ticket.created` outbox row in a second one. A replay between the two commits is
    /// answered the placeholder.
    AnswerInSecondTransaction,
    /// Served only (`serve --variant redis-check-then-lock --lease URL`): idempotency records
    /// and locks in Redis, no receipt: `GET` record, `SET` lock `NX PX`, create, `SET`
    /// record, `DEL` lock ([`redis_check_then_lock`]). A request that checked before the
    /// record existed and locks after the `DEL` creates a second ticket.
    RedisCheckThenLock,
    /// Served only: the real protocol, but a create whose connection was lost at `COMMIT` (the
    /// outcome unknown, [`crate::error::Written::Unknown`]) is taken for "not created"; the
    /// service remembers the key, and the client's retry with it creates again instead of
    /// replaying.
    LostAckCreatesAgain,
    /// Served only, sequences ([`crate::sequence_variants`]): a replay is re-rendered with
    /// `updated_at` set to the time of the replay.
    ReplayRerendered,
    /// Served only, sequences: an in-process answer cache keyed without the tenant.
    CacheWithoutScope,
    /// Served only, sequences: the fingerprint is compared only after a unique violation.
    FingerprintOnRacePathOnly,
    /// Served only, sequences: a refused body's fingerprint replaces the key's.
    RefusedOverwritesFingerprint,
    /// Served only, sequences: the protocol, but `serve` writes a second `ticket.created` row
    /// 300 ms after answering a replay ([`LATE_OUTBOX_DELAY_MS`]).
    LateOutboxAfterReplay,
    /// Served only, sequences: a replay answers the tenant's newest ticket.
    ReplayNewest,
    /// Served only, sequences: keys that differ only in their last character are indexed
    /// as one, in process memory.
    KeyHashCollision,
    /// Served only, faults ([`crate::fault_variants`]): the key is claimed in one transaction
    /// and completed in a second; a claim of another process is answered "in progress" and
    /// never expires, so a process killed between the two leaves its key stuck.
    ClaimNeverExpires,
    /// Served only, faults ([`crate::fault_variants`]): keys in Redis, the lock taken first
    /// and the record read under it; the lock expires after `--lease-ttl-ms` and a holder
    /// held past it goes on and creates after another holder did.
    RedisLockExpires,
    /// Served only, faults ([`crate::fault_variants`]): the ticket and event commit, the
    /// answer is sent, and only then is the receipt stored; a receipt lost after the answer
    /// leaves the key free, and the retry creates again.
    AnswerStoredAfterResponse,
}

/// How long after answering a replay `late-outbox-after-replay` writes its extra event.
pub const LATE_OUTBOX_DELAY_MS: u64 = 300;

impl Variant {
    /// All five, in the order of docs/PROTOCOL.md §8.
    pub const ALL: [Variant; 5] = [
        Variant::KeyOnly,
        Variant::NoncanonicalFingerprint,
        Variant::CheckThenInsert,
        Variant::AbandonOuterTx,
        Variant::SplitTransactions,
    ];

    /// Wrong implementations of the `on-conflict` protocol.
    pub const ON_CONFLICT: [Variant; 1] = [Variant::OnConflictIgnoresLoss];

    /// Wrong implementations of the `single-statement` protocol.
    pub const SINGLE_STATEMENT: [Variant; 1] = [Variant::SingleStatementSkipsReread];

    /// Variants only `serve --variant` offers, for black-box negative controls. The kill
    /// matrix runs none of them through its library gates; those of [`Variant::EXPLORED`] it
    /// runs through its interposed gates (`explore`, `first-point`).
    pub const SERVED_ONLY: [Variant; 14] = [
        Variant::TenantBlind,
        Variant::AnswerInSecondTransaction,
        Variant::RedisCheckThenLock,
        Variant::LostAckCreatesAgain,
        Variant::ReplayRerendered,
        Variant::CacheWithoutScope,
        Variant::FingerprintOnRacePathOnly,
        Variant::RefusedOverwritesFingerprint,
        Variant::LateOutboxAfterReplay,
        Variant::ReplayNewest,
        Variant::KeyHashCollision,
        Variant::ClaimNeverExpires,
        Variant::RedisLockExpires,
        Variant::AnswerStoredAfterResponse,
    ];

    /// The served variants only a sequence of requests shows
    /// ([`crate::sequence_variants`]): the kill matrix's `check` gate must kill each, and its
    /// `starter` gate (the five files `target init` writes) is shown beside it.
    pub const SEQUENCE: [Variant; 7] = [
        Variant::ReplayRerendered,
        Variant::CacheWithoutScope,
        Variant::FingerprintOnRacePathOnly,
        Variant::RefusedOverwritesFingerprint,
        Variant::LateOutboxAfterReplay,
        Variant::ReplayNewest,
        Variant::KeyHashCollision,
    ];

    /// The served wrong implementations whose window lies between the service's own store
    /// commands, or at a lost acknowledgement of one (`lost-ack-creates-again`, found by the
    /// interposed file with a `[[fault]]`), or at a crash of the service between two of them
    /// (`claim-never-expires`, found by the file that kills it): the kill matrix's `explore` gate (the interposer's bounded exploration,
    /// docs/INTERPOSER.md) must kill each of them; its `first-point` gate runs them too, for
    /// the record.
    pub const EXPLORED: [Variant; 7] = [
        Variant::SplitTransactions,
        Variant::AnswerInSecondTransaction,
        Variant::RedisCheckThenLock,
        Variant::LostAckCreatesAgain,
        Variant::ClaimNeverExpires,
        Variant::RedisLockExpires,
        Variant::AnswerStoredAfterResponse,
    ];

    /// Whether the variant keeps its keys in Redis and needs a Redis URL to be served
    /// (`serve --lease URL`): `redis-check-then-lock`, `redis-lock-expires`.
    pub fn needs_redis(self) -> bool {
        matches!(
            self,
            Variant::RedisCheckThenLock | Variant::RedisLockExpires
        )
    }

    /// Wrong uses of the Redis lease: the kill matrix judges them by its `lease` gate only
    /// (the lease scenarios, Redis in the loop).
    pub const LEASE: [Variant; 2] = [Variant::LeaseUnsafeRelease, Variant::LeaseAsArbiter];

    /// Every variant: the five, then [`Variant::ON_CONFLICT`], [`Variant::SINGLE_STATEMENT`]
    /// and [`Variant::LEASE`].
    pub fn every() -> impl Iterator<Item = Variant> {
        Variant::ALL
            .into_iter()
            .chain(Variant::ON_CONFLICT)
            .chain(Variant::SINGLE_STATEMENT)
            .chain(Variant::LEASE)
    }

    /// Why no gate can tell this variant from its protocol on `backend`, or `None` when one
    /// can: on SQLite a writer waits for the database lock and then sees the latest commit,
    /// so the `single-statement` protocol never gets "taken, unseen" there, and
    /// `single-statement-skips-reread` runs exactly as the protocol does.
    pub fn not_applicable_on(self, backend: Backend) -> Option<&'static str> {
        match (self, backend) {
            (Variant::SingleStatementSkipsReread, Backend::Sqlite) => Some(
                "on SQLite a writer always sees the winner, so the skipped second statement is never needed",
            ),
            _ => None,
        }
    }

    /// Whether this is a wrong use of the lease ([`Variant::LEASE`]).
    pub fn is_lease(self) -> bool {
        Variant::LEASE.contains(&self)
    }

    /// The `--variant` name, e.g. `check-then-insert`.
    pub fn name(self) -> &'static str {
        match self {
            Variant::KeyOnly => "key-only",
            Variant::NoncanonicalFingerprint => "noncanonical-fingerprint",
            Variant::CheckThenInsert => "check-then-insert",
            Variant::AbandonOuterTx => "abandon-outer-tx",
            Variant::SplitTransactions => "split-transactions",
            Variant::OnConflictIgnoresLoss => "on-conflict-ignores-loss",
            Variant::SingleStatementSkipsReread => "single-statement-skips-reread",
            Variant::TenantBlind => "tenant-blind",
            Variant::LeaseUnsafeRelease => "lease-unsafe-release",
            Variant::LeaseAsArbiter => "lease-as-arbiter",
            Variant::AnswerInSecondTransaction => "answer-in-second-transaction",
            Variant::RedisCheckThenLock => "redis-check-then-lock",
            Variant::LostAckCreatesAgain => "lost-ack-creates-again",
            Variant::ReplayRerendered => "replay-rerendered",
            Variant::CacheWithoutScope => "cache-without-scope",
            Variant::FingerprintOnRacePathOnly => "fingerprint-on-race-path-only",
            Variant::RefusedOverwritesFingerprint => "refused-overwrites-fingerprint",
            Variant::LateOutboxAfterReplay => "late-outbox-after-replay",
            Variant::ReplayNewest => "replay-newest",
            Variant::KeyHashCollision => "key-hash-collision",
            Variant::ClaimNeverExpires => "claim-never-expires",
            Variant::RedisLockExpires => "redis-lock-expires",
            Variant::AnswerStoredAfterResponse => "answer-stored-after-response",
        }
    }

    /// Parses a `--variant` name.
    pub fn parse(name: &str) -> Option<Variant> {
        Variant::every()
            .chain(Variant::SERVED_ONLY)
            .find(|v| v.name() == name)
    }

    /// Whether the variant is meant to run on a schema without the receipt's unique
    /// constraint (the "no unique constraint" half of docs/PROTOCOL.md §8, #3).
    pub fn drops_receipt_constraint(self) -> bool {
        matches!(self, Variant::CheckThenInsert | Variant::LeaseAsArbiter)
    }

    /// Creates a ticket the wrong way (reached through [`Implementation::create`]).
    /// Validation is the same as the real protocol's.
    fn create<S: Store + ?Sized>(
        self,
        store: &mut S,
        tenant_id: &str,
        key: &str,
        request: &TicketRequest,
    ) -> Result<CreateReport> {
        validate_create(tenant_id, key, request)?;
        match self {
            Variant::KeyOnly => key_only(store, tenant_id, key, request),
            Variant::NoncanonicalFingerprint => {
                let fingerprint = noncanonical_fingerprint(request);
                in_transaction(store, |store| {
                    crate::protocol::create_in_transaction(
                        store,
                        tenant_id,
                        key,
                        request,
                        &fingerprint,
                    )
                })
            }
            // The lease is taken (or not) around this call by the caller
            // ([`crate::lease::create_with_lease`]); inside it, `lease-as-arbiter` trusts its
            // SELECT as `check-then-insert` does.
            Variant::CheckThenInsert | Variant::LeaseAsArbiter => {
                check_then_insert(store, tenant_id, key, request)
            }
            Variant::LeaseUnsafeRelease => crate::protocol::create_ticket(
                store,
                tenant_id,
                key,
                request,
                &CreateOptions::default(),
            ),
            Variant::AbandonOuterTx => abandon_outer_tx(store, tenant_id, key, request),
            Variant::SplitTransactions => split_transactions(store, tenant_id, key, request),
            Variant::OnConflictIgnoresLoss => {
                on_conflict_ignores_loss(store, tenant_id, key, request)
            }
            Variant::SingleStatementSkipsReread => {
                single_statement_skips_reread(store, tenant_id, key, request)
            }
            Variant::LostAckCreatesAgain => lost_ack_creates_again(store, tenant_id, key, request),
            Variant::ClaimNeverExpires => {
                crate::fault_variants::claim_never_expires(store, tenant_id, key, request)
            }
            Variant::AnswerStoredAfterResponse => {
                crate::fault_variants::answer_stored_after_response(store, tenant_id, key, request)
            }
            Variant::AnswerInSecondTransaction => {
                answer_in_second_transaction(store, tenant_id, key, request)
            }
            // Their keys live in Redis, which this path has no connection to: `serve` runs
            // them with the Redis of `--lease`.
            Variant::RedisCheckThenLock | Variant::RedisLockExpires => {
                Err(Error::Store(StoreError {
                    kind: DbErrorKind::Other,
                    backend: store.backend(),
                    operation: self.name(),
                    code: None,
                    message: format!(
                        "this variant keeps its keys in Redis: serve it with `ticketflow serve {} \
                         {} {} redis://HOST:PORT/DB`",
                        crate::flags::VARIANT,
                        self.name(),
                        crate::flags::LEASE
                    ),
                }))
            }
            Variant::ReplayRerendered => {
                sequence_variants::replay_rerendered(store, tenant_id, key, request)
            }
            Variant::CacheWithoutScope => {
                sequence_variants::cache_without_scope(store, tenant_id, key, request)
            }
            Variant::FingerprintOnRacePathOnly => {
                sequence_variants::fingerprint_on_race_path_only(store, tenant_id, key, request)
            }
            Variant::RefusedOverwritesFingerprint => {
                sequence_variants::refused_overwrites_fingerprint(store, tenant_id, key, request)
            }
            // Its deviation is after the answer, in `serve`.
            Variant::LateOutboxAfterReplay => crate::protocol::create_ticket(
                store,
                tenant_id,
                key,
                request,
                &CreateOptions::default(),
            ),
            Variant::ReplayNewest => {
                sequence_variants::replay_newest(store, tenant_id, key, request)
            }
            Variant::KeyHashCollision => {
                sequence_variants::key_hash_collision(store, tenant_id, key, request)
            }
            // DEVIATION: the tenant is dropped; one key namespace (and one owner) for all.
            Variant::TenantBlind => crate::protocol::create_ticket(
                store,
                TENANT_BLIND_NAMESPACE,
                key,
                request,
                &CreateOptions::default(),
            ),
        }
    }
}

/// The create implementation under test: a real protocol (a control every gate must pass)
/// or a wrong variant (a negative control). Runners, suites, the kill matrix, `serve` and the
/// worker take it; [`Implementation::create`] is their one way in.
///
/// Its name ([`Implementation::name`], also its report.json form, see the `Serialize` impl)
/// is `protocol` for the `savepoint` protocol, `on-conflict`, or the variant's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Implementation {
    /// A real create protocol, [`crate::protocol::create_ticket`] with it.
    Protocol(Protocol),
    /// A wrong implementation (docs/PROTOCOL.md §8) (a negative control).
    Variant(Variant),
}

impl Default for Implementation {
    /// The `savepoint` protocol.
    fn default() -> Self {
        Implementation::Protocol(Protocol::Savepoint)
    }
}

impl Implementation {
    /// The three real protocols, the default first.
    pub const PROTOCOLS: [Implementation; 3] = [
        Implementation::Protocol(Protocol::Savepoint),
        Implementation::Protocol(Protocol::OnConflict),
        Implementation::Protocol(Protocol::SingleStatement),
    ];

    /// Runs a create. `retry` applies to the real protocols only: a variant runs its one
    /// transaction shape as written (`tenant-blind` runs the protocol with the default
    /// policy).
    ///
    /// Will return `Err` as [`crate::protocol::create_ticket`] does; a variant also returns
    /// the errors its deviation provokes (e.g. 25P02 for `abandon-outer-tx` on PostgreSQL).
    pub fn create<S: Store + ?Sized>(
        self,
        store: &mut S,
        tenant: &str,
        key: &str,
        request: &TicketRequest,
        retry: &RetryPolicy,
    ) -> Result<CreateReport> {
        match self {
            Implementation::Protocol(protocol) => crate::protocol::create_ticket(
                store,
                tenant,
                key,
                request,
                &CreateOptions {
                    protocol,
                    retry: *retry,
                },
            ),
            Implementation::Variant(v) => v.create(store, tenant, key, request),
        }
    }

    /// `protocol` (the `savepoint` protocol), `on-conflict` or the variant's name.
    pub fn name(self) -> &'static str {
        match self {
            Implementation::Protocol(Protocol::Savepoint) => "protocol",
            Implementation::Protocol(Protocol::OnConflict) => "on-conflict",
            Implementation::Protocol(Protocol::SingleStatement) => "single-statement",
            Implementation::Variant(v) => v.name(),
        }
    }

    /// Parses `protocol`, `on-conflict` or a variant name; `None` for anything else.
    pub fn parse(name: &str) -> Option<Implementation> {
        Implementation::PROTOCOLS
            .into_iter()
            .find(|i| i.name() == name)
            .or_else(|| Variant::parse(name).map(Implementation::Variant))
    }

    /// How this implementation releases a lease it holds: a plain `DEL` for
    /// `lease-unsafe-release`, the compare-and-delete otherwise.
    pub fn release(self) -> crate::lease::Release {
        match self {
            Implementation::Variant(Variant::LeaseUnsafeRelease) => {
                crate::lease::Release::PlainDelete
            }
            _ => crate::lease::Release::CompareAndDelete,
        }
    }

    /// Whether this is one of the real protocols (a control that every gate must pass).
    pub fn is_control(self) -> bool {
        matches!(self, Implementation::Protocol(_))
    }

    /// SQL that adapts a freshly migrated schema for this implementation on `backend`:
    /// only `check-then-insert` changes it, dropping the receipt's unique constraint (`None`
    /// for the memory store, which has no schema).
    pub fn schema_sql(self, backend: Backend) -> Option<&'static str> {
        match self {
            Implementation::Variant(v) if v.drops_receipt_constraint() => match backend {
                Backend::Sqlite => Some(SQLITE_DROP_RECEIPT_KEY),
                Backend::Postgres => Some(PG_DROP_RECEIPT_KEY),
                Backend::Memory => None,
            },
            _ => None,
        }
    }
}

/// The one tenant id `tenant-blind` stores every request under.
pub const TENANT_BLIND_NAMESPACE: &str = "all-tenants";

/// SQLite cannot drop a primary key, so the receipts table is rebuilt without one.
pub const SQLITE_DROP_RECEIPT_KEY: &str = "DROP TABLE idempotency_receipts; \
    CREATE TABLE idempotency_receipts (tenant_id TEXT NOT NULL, idempotency_key TEXT NOT NULL, \
    payload_hash TEXT NOT NULL, ticket_id TEXT NOT NULL, created_at TEXT NOT NULL);";
/// Drops the receipt's primary key on PostgreSQL.
pub const PG_DROP_RECEIPT_KEY: &str =
    "ALTER TABLE idempotency_receipts DROP CONSTRAINT idempotency_receipts_pkey";

impl std::fmt::Display for Variant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl serde::Serialize for Implementation {
    /// The report.json shape: `{"kind": "protocol"}` (the `savepoint` protocol),
    /// `{"kind": "on-conflict"}`, or `{"kind": "variant", "variant": "<name>"}`.
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        match self {
            Implementation::Protocol(_) => {
                let mut s = serializer.serialize_struct("Implementation", 1)?;
                s.serialize_field("kind", self.name())?;
                s.end()
            }
            Implementation::Variant(v) => {
                let mut s = serializer.serialize_struct("Implementation", 2)?;
                s.serialize_field("kind", "variant")?;
                s.serialize_field("variant", v)?;
                s.end()
            }
        }
    }
}

/// Variant 2's fingerprint: the debug string of a `HashMap`. Each map gets its own random
/// hasher state, so the field order, and the hash, change from one request to the next.
pub fn noncanonical_fingerprint(request: &TicketRequest) -> Fingerprint {
    let fields: HashMap<&str, &str> = [
        ("actor_id", request.actor_id.as_str()),
        ("title", request.title.as_str()),
        ("body", request.body.as_str()),
        ("priority", request.priority.as_str()),
    ]
    .into_iter()
    .collect();
    let canonical = format!("{fields:?}");
    let hash = sha256_hex(canonical.as_bytes());
    Fingerprint { canonical, hash }
}

/// Variant 1: the real transaction shape, but any receipt for the key is replayed, whatever
/// the request's fingerprint.
fn key_only<S: Store + ?Sized>(
    store: &mut S,
    tenant_id: &str,
    key: &str,
    request: &TicketRequest,
) -> Result<CreateReport> {
    let fingerprint = Fingerprint::of(request);
    in_transaction(store, |store| {
        if let Some(receipt) = store.find_receipt(tenant_id, key)? {
            return sequence_variants::replay_any(store, &receipt, DecisionPath::FromLookup);
        }
        let rows = NewRows::new(tenant_id, key, request, &fingerprint.hash);
        store.savepoint(CREATE_SAVEPOINT)?;
        store.insert_ticket(&rows.ticket)?;
        store.insert_outbox(&rows.event)?;
        match store.insert_receipt(&rows.receipt) {
            Ok(()) => {
                store.release_savepoint(CREATE_SAVEPOINT)?;
                Ok(CreateReport::created(rows.ticket))
            }
            Err(e) if e.is_unique_violation() => {
                store.rollback_to_savepoint(CREATE_SAVEPOINT)?;
                match store.find_receipt(tenant_id, key)? {
                    Some(winner) => sequence_variants::replay_any(
                        store,
                        &winner,
                        DecisionPath::AfterUniqueViolation,
                    ),
                    None => Err(Error::WinnerNotVisible {
                        idempotency_key: key.to_string(),
                    }),
                }
            }
            Err(e) => Err(e.into()),
        }
    })
}

/// Variant 3: look, and if nothing is there insert, trusting the SELECT. No savepoint and no
/// handling of a unique violation; without the receipt constraint nothing stops a second
/// ticket.
fn check_then_insert<S: Store + ?Sized>(
    store: &mut S,
    tenant_id: &str,
    key: &str,
    request: &TicketRequest,
) -> Result<CreateReport> {
    let fingerprint = Fingerprint::of(request);
    in_transaction(store, |store| {
        if let Some(receipt) = store.find_receipt(tenant_id, key)? {
            return resolve(store, &receipt, &fingerprint, DecisionPath::FromLookup);
        }
        // DEVIATION: "I SELECTed first, so the key is mine."
        let rows = NewRows::new(tenant_id, key, request, &fingerprint.hash);
        store.insert_ticket(&rows.ticket)?;
        store.insert_outbox(&rows.event)?;
        store.insert_receipt(&rows.receipt)?;
        Ok(CreateReport::created(rows.ticket))
    })
}

/// Variant 4: no savepoint; on the receipt's unique violation the code goes on reading the
/// winner inside the failed outer transaction (PostgreSQL answers 25P02) and commits
/// whatever the transaction still holds.
fn abandon_outer_tx<S: Store + ?Sized>(
    store: &mut S,
    tenant_id: &str,
    key: &str,
    request: &TicketRequest,
) -> Result<CreateReport> {
    let fingerprint = Fingerprint::of(request);
    in_transaction(store, |store| {
        if let Some(receipt) = store.find_receipt(tenant_id, key)? {
            return resolve(store, &receipt, &fingerprint, DecisionPath::FromLookup);
        }
        let rows = NewRows::new(tenant_id, key, request, &fingerprint.hash);
        store.insert_ticket(&rows.ticket)?;
        store.insert_outbox(&rows.event)?;
        match store.insert_receipt(&rows.receipt) {
            Ok(()) => Ok(CreateReport::created(rows.ticket)),
            Err(e) if e.is_unique_violation() => {
                // DEVIATION: no ROLLBACK TO SAVEPOINT; the ticket and outbox inserts stay in
                // the transaction (where it survives at all).
                resolve_winner(store, tenant_id, key, &fingerprint)
            }
            Err(e) => Err(e.into()),
        }
    })
}

/// Variant 5: three transactions (ticket; outbox row; receipt). A loser of the receipt race
/// replays the winner, but its ticket and event are already committed; a crash between the
/// transactions leaves a ticket without event or receipt.
fn split_transactions<S: Store + ?Sized>(
    store: &mut S,
    tenant_id: &str,
    key: &str,
    request: &TicketRequest,
) -> Result<CreateReport> {
    let fingerprint = Fingerprint::of(request);
    if let Some(report) =
        in_transaction(store, |store| match store.find_receipt(tenant_id, key)? {
            Some(receipt) => {
                resolve(store, &receipt, &fingerprint, DecisionPath::FromLookup).map(Some)
            }
            None => Ok(None),
        })?
    {
        return Ok(report);
    }
    let rows = NewRows::new(tenant_id, key, request, &fingerprint.hash);
    // DEVIATION: each row commits on its own.
    in_transaction(store, |store| Ok(store.insert_ticket(&rows.ticket)?))?;
    in_transaction(store, |store| Ok(store.insert_outbox(&rows.event)?))?;
    match in_transaction(store, |store| Ok(store.insert_receipt(&rows.receipt)?)) {
        Ok(()) => Ok(CreateReport::created(rows.ticket)),
        Err(Error::Store(e)) if e.is_unique_violation() => in_transaction(store, |store| {
            resolve_winner(store, tenant_id, key, &fingerprint)
        }),
        Err(e) => Err(e),
    }
}

/// The `on-conflict-ignores-loss` variant: the `on-conflict` protocol's shape, but the
/// result of `ON CONFLICT DO NOTHING RETURNING` is ignored.
fn on_conflict_ignores_loss<S: Store + ?Sized>(
    store: &mut S,
    tenant_id: &str,
    key: &str,
    request: &TicketRequest,
) -> Result<CreateReport> {
    let fingerprint = Fingerprint::of(request);
    in_transaction(store, |store| {
        if let Some(receipt) = store.find_receipt(tenant_id, key)? {
            return resolve(store, &receipt, &fingerprint, DecisionPath::FromLookup);
        }
        let rows = NewRows::new(tenant_id, key, request, &fingerprint.hash);
        // DEVIATION: "no row returned" is not looked at; the key is taken to be ours.
        let _won = store.insert_receipt_if_absent(&rows.receipt)?;
        store.insert_ticket(&rows.ticket)?;
        store.insert_outbox(&rows.event)?;
        Ok(CreateReport::created(rows.ticket))
    })
}

fn single_statement_skips_reread<S: Store + ?Sized>(
    store: &mut S,
    tenant_id: &str,
    key: &str,
    request: &TicketRequest,
) -> Result<CreateReport> {
    let fingerprint = Fingerprint::of(request);
    if let Some((receipt, ticket)) = store.find_before_claim(tenant_id, key)? {
        return decide_met(&receipt, ticket, &fingerprint, DecisionPath::FromLookup);
    }
    let rows = NewRows::new(tenant_id, key, request, &fingerprint.hash);
    match store.claim_and_create(&rows.ticket, &rows.event, &rows.receipt)? {
        Claimed::Met { receipt, ticket } => {
            decide_met(&receipt, ticket, &fingerprint, DecisionPath::FromLookup)
        }
        // DEVIATION: no second statement; "taken, unseen" is read as a win.
        Claimed::Won | Claimed::TakenUnseen => Ok(CreateReport::created(rows.ticket)),
    }
}

/// The (tenant, key) pairs whose create lost its connection at `COMMIT` in this process, as
/// `lost-ack-creates-again` remembers them.
fn lost_acks() -> std::sync::MutexGuard<'static, std::collections::HashSet<(String, String)>> {
    static LOST: std::sync::OnceLock<
        std::sync::Mutex<std::collections::HashSet<(String, String)>>,
    > = std::sync::OnceLock::new();
    sequence_variants::locked(&LOST)
}

/// `lost-ack-creates-again`: the real protocol, except after a connection lost at `COMMIT`.
/// That failure leaves the outcome unknown (the commit may have happened, docs/PROTOCOL.md
/// and [`Error::transient`]); this service decides it did not, remembers the key, and runs
/// the client's retry with it as a first create: a fresh ticket and event, the receipt's
/// conflict ignored, answered created.
fn lost_ack_creates_again<S: Store + ?Sized>(
    store: &mut S,
    tenant_id: &str,
    key: &str,
    request: &TicketRequest,
) -> Result<CreateReport> {
    let pair = (tenant_id.to_string(), key.to_string());
    if lost_acks().remove(&pair) {
        // DEVIATION: "the COMMIT failed, so nothing was written": no lookup, create again.
        let fingerprint = Fingerprint::of(request);
        return in_transaction(store, |store| {
            let rows = NewRows::new(tenant_id, key, request, &fingerprint.hash);
            store.insert_ticket(&rows.ticket)?;
            store.insert_outbox(&rows.event)?;
            // DEVIATION: a receipt already there is "ours from the failed attempt".
            let _ours_anyway = store.insert_receipt_if_absent(&rows.receipt)?;
            Ok(CreateReport::created(rows.ticket))
        });
    }
    let result =
        crate::protocol::create_ticket(store, tenant_id, key, request, &CreateOptions::default());
    if let Err(e) = &result {
        if e.transient()
            .is_some_and(|t| t.written == crate::error::Written::Unknown)
        {
            lost_acks().insert(pair);
        }
    }
    result
}

/// `answer-in-second-transaction`: the first transaction claims the key (a placeholder ticket
/// with an empty title and body, and the receipt pointing at it, as the protocol does with its
/// savepoint and unique-violation handling); the second completes the answer (the ticket
/// updated to the request's content, which makes it version 2, and its `ticket.created`
/// outbox row). Both commit for a client that is not raced, and its replays equal its answer.
fn answer_in_second_transaction<S: Store + ?Sized>(
    store: &mut S,
    tenant_id: &str,
    key: &str,
    request: &TicketRequest,
) -> Result<CreateReport> {
    let fingerprint = Fingerprint::of(request);
    let rows = NewRows::new(tenant_id, key, request, &fingerprint.hash);
    let placeholder = Ticket {
        title: String::new(),
        body: String::new(),
        ..rows.ticket.clone()
    };
    let met = in_transaction(store, |store| {
        if let Some(receipt) = store.find_receipt(tenant_id, key)? {
            return resolve(store, &receipt, &fingerprint, DecisionPath::FromLookup).map(Some);
        }
        if sequence_variants::claim_with_placeholder(store, &placeholder, &rows.receipt)? {
            Ok(None)
        } else {
            resolve_winner(store, tenant_id, key, &fingerprint).map(Some)
        }
    })?;
    if let Some(report) = met {
        return Ok(report);
    }
    // DEVIATION: the key is taken and committed; the answer it will replay is completed only
    // now, in a transaction of its own.
    let ticket = sequence_variants::complete_claim(store, tenant_id, rows.ticket.id, request)?;
    Ok(CreateReport::created(ticket))
}

/// How long `redis-check-then-lock`'s lock lives (`SET … NX PX`), in milliseconds: a
/// crashed holder blocks its key no longer than this.
pub const REDIS_LOCK_TTL_MS: u64 = 10_000;

/// `redis-check-then-lock` ([`Variant::RedisCheckThenLock`]): the idempotency record and a
/// lock live in Redis on `redis`; the ticket and its `ticket.created` event in `store`
/// (no receipt). `GET` record: a record replays its ticket (read from `store`) or is a
/// conflict for another body. Else `SET` lock `NX PX` [`REDIS_LOCK_TTL_MS`]: held by another
/// request, [`RedisLockError::InProgress`]. Else create in one transaction, `SET` the record
/// (`EX` [`REDIS_RECORD_TTL_SECS`]) and `DEL` the lock.
///
/// Will return `Err` for an invalid request, a held lock, a Redis failure or a PostgreSQL
/// failure ([`RedisLockError`]).
pub fn redis_check_then_lock<S: Store + ?Sized>(
    store: &mut S,
    redis: &mut redis::Connection,
    tenant_id: &str,
    key: &str,
    request: &TicketRequest,
) -> std::result::Result<CreateReport, RedisLockError> {
    validate_create(tenant_id, key, request).map_err(Error::from)?;
    let fingerprint = Fingerprint::of(request);
    let mut keys = RedisKeys::new(redis, tenant_id, key);
    if let Some(text) = keys.record()? {
        return keys.replay(store, &text, &fingerprint);
    }
    // DEVIATION: "nobody had a record when I looked, so a lock taken now makes the key mine";
    // a request that looked before the record existed may lock after the holder let go.
    if !keys.lock(REDIS_LOCK_TTL_MS)? {
        return Err(RedisLockError::InProgress {
            idempotency_key: key.to_string(),
        });
    }
    keys.create(store, request, &fingerprint)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for v in Variant::every().chain(Variant::SERVED_ONLY) {
            assert_eq!(Variant::parse(v.name()), Some(v));
            assert_eq!(
                Implementation::parse(v.name()),
                Some(Implementation::Variant(v))
            );
        }
        for p in Protocol::ALL {
            let i = Implementation::Protocol(p);
            assert_eq!(Implementation::parse(i.name()), Some(i));
            assert!(i.is_control());
        }
        assert_eq!(
            Implementation::PROTOCOLS.map(Implementation::name),
            ["protocol", "on-conflict", "single-statement"]
        );
        assert_eq!(Variant::parse("nope"), None);
        assert_eq!(Implementation::parse("savepoint"), None);
    }

    #[test]
    fn implementations_serialize_in_the_report_json_shape() {
        let json = |i: Implementation| serde_json::to_string(&i).unwrap();
        assert_eq!(json(Implementation::default()), r#"{"kind":"protocol"}"#);
        assert_eq!(
            json(Implementation::Protocol(Protocol::OnConflict)),
            r#"{"kind":"on-conflict"}"#
        );
        assert_eq!(
            json(Implementation::Variant(Variant::CheckThenInsert)),
            r#"{"kind":"variant","variant":"check-then-insert"}"#
        );
    }

    #[test]
    fn noncanonical_fingerprint_is_unstable_for_one_request() {
        let r = TicketRequest {
            actor_id: "u1".into(),
            title: "x".into(),
            body: "y".into(),
            priority: "high".into(),
        };
        // Random hasher states: within a few dozen maps two orders will have differed.
        let hashes: std::collections::BTreeSet<String> =
            (0..64).map(|_| noncanonical_fingerprint(&r).hash).collect();
        assert!(hashes.len() > 1);
    }
}
