//! A short Redis lease per (tenant, key) in front of the receipt (docs/PROTOCOL.md §10): it may
//! **reduce** contention — racers that find the lease held wait for the holder's receipt
//! instead of all inserting and losing on the unique violation — but it never decides
//! anything. The receipt's unique constraint stays the arbiter: Redis data can expire, be
//! flushed or lost in a failover, and a holder paused past the TTL still runs its
//! transaction beside the next holder.
//!
//! The flow of one create with a lease ([`create_with_lease`]):
//! 1. `SET lease:{tenant}:{key} TOKEN NX PX TTL` with a fresh token (UUID v4).
//! 2. Acquired: run the create transaction, then release with a compare-and-delete (a Lua
//!    script that deletes the key only while it still holds **this** token, so an old
//!    holder never deletes a newer holder's lease).
//! 3. Held by another request: wait, bounded by `wait` (default: the TTL), polling with
//!    doubling pauses (1 ms up to 20 ms) until the receipt is visible, or the lease is gone;
//!    then run the normal protocol — the receipt decides (replay, conflict, or create if the
//!    holder failed). `serve` takes the lease or waits for it ([`admit`]) **before** it checks
//!    a database session out of its pool, so a waiting request holds no session, and bounds
//!    the wait by its request timeout as well.
//! 4. Redis unreachable, slow (connect, read and write timeouts of [`REDIS_TIMEOUT`]) or
//!    erroring: proceed without the lease, counted as "no lease" and logged without bodies.
//!    The lease never causes a failed request.
//!
//! A lease key holds only the tenant and the idempotency key (`:` and `%` percent-encoded so
//! the two parts cannot run together); a token is a random UUID. Neither ever contains a
//! request body.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::domain::CreateReport;
use crate::error::Result;
use crate::store::Store;

/// Connect, read and write timeout of every Redis call: past it the create goes on without
/// the lease.
pub const REDIS_TIMEOUT: Duration = Duration::from_millis(200);

/// The default lease TTL: long enough for a create transaction, short enough that a
/// crashed holder blocks nobody for long.
pub const DEFAULT_TTL: Duration = Duration::from_millis(2_000);

/// The longest lease TTL accepted: one hour. A lease covers one create transaction
/// (milliseconds) and its TTL is how long a crashed holder blocks its key, so a longer TTL is
/// a mistake (seconds given as milliseconds, a "never expire" value) that would leave a key
/// unusable for days; an hour also keeps every deadline computed from it far from overflow.
pub const MAX_TTL: Duration = Duration::from_secs(3_600);

/// Connect, read and write timeout of the start-up check of the Redis database
/// ([`LeaseConfig::check_database`]).
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(1);

/// Compare-and-delete: deletes `KEYS[1]` only while it holds `ARGV[1]`; returns 1 when it
/// deleted, 0 otherwise (the lease expired, was flushed, or another token holds it).
pub const RELEASE_SCRIPT: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";

/// Why a lease option cannot be used: a usage error (exit 2). Every URL in it has its
/// password replaced by `***`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseConfigError {
    /// The URL is not `redis://HOST:PORT/DB`.
    #[error("bad lease URL {url:?}: {reason} (expected redis://HOST:PORT/DB)")]
    BadUrl {
        /// The URL as given, password hidden ([`crate::store::url::redact`]).
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// A TTL of 0 would make every lease expire before it is used.
    #[error("the lease TTL must be above 0 ms")]
    ZeroTtl,
    /// A TTL above [`MAX_TTL`].
    #[error(
        "the lease TTL must be at most {max_ms} ms (1 hour: how long a crashed holder may block \
         its key), got {ttl_ms} ms"
    )]
    TtlTooLong {
        /// The TTL given, milliseconds.
        ttl_ms: u128,
        /// [`MAX_TTL`], milliseconds.
        max_ms: u128,
    },
    /// The Redis server refused `SELECT DB`: the database number is out of its range
    /// (`databases` in its configuration, 16 by default: 0 to 15).
    #[error("lease URL {url}: Redis refused database {db}: {reason}")]
    Database {
        /// The URL, password redacted.
        url: String,
        /// The database number asked for.
        db: u32,
        /// The server's answer, and its range when it tells it.
        reason: String,
    },
}

/// A Redis call that failed: the create goes on without the lease.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("redis {operation}: {message}")]
pub struct LeaseError {
    /// `connect`, `acquire`, `release`, `read holder`.
    pub operation: &'static str,
    /// The client's message (never a key's value or a body).
    pub message: String,
}

/// Where the lease lives and how long it lasts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    /// Parsed `redis://HOST:PORT/DB`.
    pub url: String,
    /// Lease time to live (`PX`).
    pub ttl: Duration,
    /// Longest wait of a request that found the lease held; defaults to the TTL.
    pub wait: Duration,
}

impl LeaseConfig {
    /// Checks `url` (`redis://HOST:PORT/DB`: host, port and a database number all given) and
    /// `ttl` (above 0, at most [`MAX_TTL`]). Does not connect; see [`LeaseConfig::validate`].
    ///
    /// Will return `Err` for any other URL shape, or a TTL of 0 or above [`MAX_TTL`].
    pub fn new(url: &str, ttl: Duration) -> Result<LeaseConfig, LeaseConfigError> {
        let bad = |reason: &str| LeaseConfigError::BadUrl {
            url: crate::store::url::redact(url),
            reason: reason.to_string(),
        };
        let rest = url
            .strip_prefix("redis://")
            .ok_or_else(|| bad("the scheme must be redis://"))?;
        let (authority, db) = rest
            .split_once('/')
            .ok_or_else(|| bad("no /DB database number"))?;
        if authority.contains('@') {
            return Err(bad("credentials are not supported"));
        }
        let (host, port) = authority.rsplit_once(':').ok_or_else(|| bad("no :PORT"))?;
        if host.is_empty() {
            return Err(bad("no host"));
        }
        port.parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| bad("the port is not a number from 1 to 65535"))?;
        db.parse::<u32>()
            .map_err(|_| bad("the database is not a number"))?;
        if ttl.is_zero() {
            return Err(LeaseConfigError::ZeroTtl);
        }
        if ttl > MAX_TTL {
            return Err(LeaseConfigError::TtlTooLong {
                ttl_ms: ttl.as_millis(),
                max_ms: MAX_TTL.as_millis(),
            });
        }
        redis::Client::open(url).map_err(|e| bad(&e.to_string()))?;
        Ok(LeaseConfig {
            url: url.to_string(),
            ttl,
            wait: ttl,
        })
    }

    /// The one check of a `--lease URL` with `--lease-ttl-ms MS` that every command runs at
    /// start: [`LeaseConfig::new`] (URL shape, TTL above 0 and at most [`MAX_TTL`]), then
    /// [`LeaseConfig::check_database`] (the database number is in the server's range).
    ///
    /// Will return `Err` as those two do; a Redis that cannot be reached now is not an error
    /// (the lease is optional: a create goes on without it).
    pub fn validate(url: &str, ttl_ms: u64) -> Result<LeaseConfig, LeaseConfigError> {
        let config = LeaseConfig::new(url, Duration::from_millis(ttl_ms))?;
        if !config.check_database()? {
            tracing::warn!(url = %crate::store::url::redact(url), "lease: Redis cannot be reached now, so its database number is not checked; creates go on without the lease until it answers");
        }
        Ok(config)
    }

    /// Connects to the server of the URL (database 0, within [`CHECK_TIMEOUT`]) and selects the
    /// URL's database: `Ok(true)` when the server accepted it, `Ok(false)` when the server could
    /// not be reached (or failed otherwise than by refusing the number), so nothing was checked.
    ///
    /// Will return `Err` ([`LeaseConfigError::Database`]) when the server answers `SELECT DB`
    /// with an error, e.g. `ERR DB index is out of range`; the message adds the server's range
    /// when `CONFIG GET databases` tells it.
    pub fn check_database(&self) -> Result<bool, LeaseConfigError> {
        let Some((server, db)) = self.url.rsplit_once('/') else {
            return Ok(false);
        };
        let Ok(db) = db.parse::<u32>() else {
            return Ok(false);
        };
        let connected = redis::Client::open(format!("{server}/0"))
            .and_then(|c| c.get_connection_with_timeout(CHECK_TIMEOUT))
            .and_then(|c| {
                c.set_read_timeout(Some(CHECK_TIMEOUT))?;
                c.set_write_timeout(Some(CHECK_TIMEOUT))?;
                Ok(c)
            });
        let Ok(mut conn) = connected else {
            return Ok(false);
        };
        match redis::cmd("SELECT").arg(db).query::<()>(&mut conn) {
            Ok(()) => Ok(true),
            // An error reply (it has a code such as `ERR`): the server refused the number.
            Err(e) if e.code().is_some() => {
                let range = redis::cmd("CONFIG")
                    .arg("GET")
                    .arg("databases")
                    .query::<Vec<String>>(&mut conn)
                    .ok()
                    .and_then(|v| v.get(1).and_then(|n| n.parse::<u64>().ok()))
                    .map(|n| {
                        format!(
                            " (this server has {n} databases: 0 to {})",
                            n.saturating_sub(1)
                        )
                    })
                    .unwrap_or_default();
                Err(LeaseConfigError::Database {
                    url: crate::store::url::redact(&self.url),
                    db,
                    reason: format!("{e}{range}"),
                })
            }
            Err(_) => Ok(false),
        }
    }
}

/// The lease operations, on Redis ([`RedisLeases`]) or in memory ([`MemoryLeases`]).
pub trait Leases {
    /// `SET key token NX PX ttl`: `true` when this call took the lease.
    ///
    /// Will return `Err` when the lease store cannot be reached or answers an error.
    fn acquire(&mut self, key: &str, token: &str, ttl: Duration) -> Result<bool, LeaseError>;
    /// Compare-and-delete ([`RELEASE_SCRIPT`]): `true` when `token` still held the lease and
    /// it was deleted.
    ///
    /// Will return `Err` as [`Leases::acquire`] does.
    fn release(&mut self, key: &str, token: &str) -> Result<bool, LeaseError>;
    /// A plain `DEL key`, whoever holds it: what the `lease-unsafe-release` wrong variant does.
    ///
    /// Will return `Err` as [`Leases::acquire`] does.
    fn delete(&mut self, key: &str) -> Result<bool, LeaseError>;
    /// The token holding the lease now, if any.
    ///
    /// Will return `Err` as [`Leases::acquire`] does.
    fn holder(&mut self, key: &str) -> Result<Option<String>, LeaseError>;
    /// Pauses a request that found the lease held, for at most `pause`, before it looks at
    /// the receipt and the lease again. The default sleeps (Redis); the loom model's leases
    /// (`store::memory::MemoryLeaseClient`) instead wait until a commit or a lease operation
    /// may have changed the answer, since a model checker has no clock to sleep on.
    fn pause(&mut self, pause: Duration) {
        std::thread::sleep(pause);
    }
}

/// Leases in Redis, on one connection with [`REDIS_TIMEOUT`] for connect, read and write.
pub struct RedisLeases {
    conn: redis::Connection,
    release: redis::Script,
}

impl std::fmt::Debug for RedisLeases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLeases").finish_non_exhaustive()
    }
}

fn redis_err(operation: &'static str) -> impl Fn(redis::RedisError) -> LeaseError {
    move |e| LeaseError {
        operation,
        message: e.to_string(),
    }
}

impl RedisLeases {
    /// Connects to `config.url`.
    ///
    /// Will return `Err` when Redis does not answer within [`REDIS_TIMEOUT`].
    pub fn connect(config: &LeaseConfig) -> Result<RedisLeases, LeaseError> {
        let client = redis::Client::open(config.url.as_str()).map_err(redis_err("connect"))?;
        let conn = client
            .get_connection_with_timeout(REDIS_TIMEOUT)
            .map_err(redis_err("connect"))?;
        conn.set_read_timeout(Some(REDIS_TIMEOUT))
            .map_err(redis_err("connect"))?;
        conn.set_write_timeout(Some(REDIS_TIMEOUT))
            .map_err(redis_err("connect"))?;
        Ok(RedisLeases {
            conn,
            release: redis::Script::new(RELEASE_SCRIPT),
        })
    }
}

impl RedisLeases {
    /// This connection's `CLIENT ID` (a harness kills it with `CLIENT KILL ID` to simulate a
    /// Redis restart without cutting off anyone else).
    ///
    /// Will return `Err` when Redis does not answer.
    pub fn client_id(&mut self) -> Result<i64, LeaseError> {
        redis::cmd("CLIENT")
            .arg("ID")
            .query(&mut self.conn)
            .map_err(redis_err("client id"))
    }
}

impl Leases for RedisLeases {
    fn acquire(&mut self, key: &str, token: &str, ttl: Duration) -> Result<bool, LeaseError> {
        let ms = ttl.as_millis().max(1) as u64;
        let set: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(ms)
            .query(&mut self.conn)
            .map_err(redis_err("acquire"))?;
        Ok(set.is_some())
    }

    fn release(&mut self, key: &str, token: &str) -> Result<bool, LeaseError> {
        let deleted: i64 = self
            .release
            .key(key)
            .arg(token)
            .invoke(&mut self.conn)
            .map_err(redis_err("release"))?;
        Ok(deleted == 1)
    }

    fn delete(&mut self, key: &str) -> Result<bool, LeaseError> {
        let deleted: i64 = redis::cmd("DEL")
            .arg(key)
            .query(&mut self.conn)
            .map_err(redis_err("release"))?;
        Ok(deleted == 1)
    }

    fn holder(&mut self, key: &str) -> Result<Option<String>, LeaseError> {
        redis::cmd("GET")
            .arg(key)
            .query(&mut self.conn)
            .map_err(redis_err("read holder"))
    }
}

/// Leases in memory with Redis's semantics (`SET NX PX`, compare-and-delete, expiry on
/// access), on a clock the caller moves ([`MemoryLeases::advance`]): the model tests and
/// the loom models run against.
#[derive(Debug, Default)]
pub struct MemoryLeases {
    now: Duration,
    held: std::collections::HashMap<String, (String, Duration)>,
}

impl MemoryLeases {
    /// Moves the clock forward (expiring leases whose TTL ran out).
    pub fn advance(&mut self, by: Duration) {
        self.now += by;
    }

    /// Drops every lease, as `FLUSHALL` or a Redis restart without persistence does.
    pub fn flush(&mut self) {
        self.held.clear();
    }

    /// The leases alive at the current time, as (key, token), ordered by key.
    pub fn live_leases(&mut self) -> Vec<(String, String)> {
        let now = self.now;
        self.held.retain(|_, (_, expires)| *expires > now);
        let mut live: Vec<(String, String)> = self
            .held
            .iter()
            .map(|(key, (token, _))| (key.clone(), token.clone()))
            .collect();
        live.sort();
        live
    }

    fn live(&mut self, key: &str) -> Option<&String> {
        let now = self.now;
        self.held.retain(|_, (_, expires)| *expires > now);
        self.held.get(key).map(|(token, _)| token)
    }
}

impl Leases for MemoryLeases {
    fn acquire(&mut self, key: &str, token: &str, ttl: Duration) -> Result<bool, LeaseError> {
        if self.live(key).is_some() {
            return Ok(false);
        }
        self.held
            .insert(key.to_string(), (token.to_string(), self.now + ttl));
        Ok(true)
    }

    fn release(&mut self, key: &str, token: &str) -> Result<bool, LeaseError> {
        if self.live(key).map(String::as_str) == Some(token) {
            self.held.remove(key);
            return Ok(true);
        }
        Ok(false)
    }

    fn delete(&mut self, key: &str) -> Result<bool, LeaseError> {
        let live = self.live(key).is_some();
        self.held.remove(key);
        Ok(live)
    }

    fn holder(&mut self, key: &str) -> Result<Option<String>, LeaseError> {
        Ok(self.live(key).cloned())
    }
}

/// The Redis key of the lease for (tenant, key): `lease:{tenant}:{key}` with `%` and `:`
/// percent-encoded in both parts.
pub fn lease_key(tenant: &str, key: &str) -> String {
    let enc = |s: &str| s.replace('%', "%25").replace(':', "%3A");
    format!("lease:{}:{}", enc(tenant), enc(key))
}

/// What the lease did for one create.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "lease")]
pub enum LeaseOutcome {
    /// This request took the lease and ran the transaction under it.
    Held {
        /// The compare-and-delete removed our token (`false`: it had expired or been
        /// flushed, and maybe another request holds the key now).
        released: bool,
    },
    /// Another request held the lease; this one waited, then ran the normal protocol.
    Waited {
        /// How long it waited, milliseconds.
        waited_ms: u64,
        /// The receipt became visible while waiting (the normal protocol then replays or
        /// conflicts without inserting).
        receipt_seen: bool,
    },
    /// No lease: Redis was unreachable, slow or erroring; the receipt alone decided.
    NoLease {
        /// The Redis error, without keys or bodies.
        reason: String,
    },
}

/// Counters of a process's leases, for `serve`'s log and the benches.
#[derive(Debug, Default)]
pub struct LeaseStats {
    held: AtomicU64,
    waited: AtomicU64,
    no_lease: AtomicU64,
    release_missed: AtomicU64,
}

/// A snapshot of [`LeaseStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct LeaseCounts {
    /// Creates that ran under their own lease.
    pub held: u64,
    /// Creates that found the lease held and waited.
    pub waited: u64,
    /// Creates that ran without a lease because Redis failed.
    pub no_lease: u64,
    /// Held leases whose compare-and-delete found another token or none.
    pub release_missed: u64,
}

impl LeaseStats {
    /// Counts one outcome.
    pub fn record(&self, outcome: &LeaseOutcome) {
        let counter = match outcome {
            LeaseOutcome::Held { released: true } => &self.held,
            LeaseOutcome::Held { released: false } => {
                self.release_missed.fetch_add(1, Ordering::Relaxed);
                &self.held
            }
            LeaseOutcome::Waited { .. } => &self.waited,
            LeaseOutcome::NoLease { .. } => &self.no_lease,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The counts so far.
    pub fn counts(&self) -> LeaseCounts {
        LeaseCounts {
            held: self.held.load(Ordering::Relaxed),
            waited: self.waited.load(Ordering::Relaxed),
            no_lease: self.no_lease.load(Ordering::Relaxed),
            release_missed: self.release_missed.load(Ordering::Relaxed),
        }
    }
}

/// How a release is done: the safe compare-and-delete, or (the `lease-unsafe-release` wrong
/// variant) a plain `DEL`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Release {
    /// [`Leases::release`].
    #[default]
    CompareAndDelete,
    /// [`Leases::delete`]: an old holder may delete a newer holder's lease.
    PlainDelete,
}

/// Runs `create` for (tenant, key) behind a lease (see the module docs): acquire, or wait
/// bounded by `config.wait` for the receipt, or go on without a lease when `leases` fails
/// (or is `None`: Redis could not be reached at all). `create` runs exactly once, and its
/// result is returned as is: the lease never turns a create into an error.
///
/// Will return `Err` only as `create` does (or, while waiting, for a database error of the
/// receipt lookup).
#[allow(clippy::too_many_arguments)]
pub fn create_with_lease<S: Store + ?Sized>(
    mut leases: Option<&mut dyn Leases>,
    config: &LeaseConfig,
    release: Release,
    store: &mut S,
    tenant: &str,
    key: &str,
    create: impl FnOnce(&mut S) -> Result<CreateReport>,
) -> (Result<CreateReport>, LeaseOutcome) {
    let lease = lease_key(tenant, key);
    let admission = admit(
        leases.as_mut().map(|l| &mut **l as &mut dyn Leases),
        config,
        config.wait,
        &lease,
        &mut || matches!(store.find_receipt(tenant, key), Ok(Some(_))),
    );
    let result = create(store);
    let outcome = admission.finish(leases, &lease, release);
    (result, outcome)
}

/// What a request got from the lease before its create runs ([`admit`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// This request holds the lease under `token`; [`Admission::finish`] releases it.
    Held {
        /// The token this request set.
        token: String,
    },
    /// Another request held the lease; this one waited.
    Waited {
        /// How long it waited, milliseconds.
        waited_ms: u64,
        /// The receipt became visible while waiting.
        receipt_seen: bool,
        /// The wait ran out with the lease still held (neither the receipt nor the lease's
        /// end was seen).
        timed_out: bool,
    },
    /// No lease: Redis was unreachable, slow or erroring.
    NoLease {
        /// The Redis error, without keys or bodies.
        reason: String,
    },
}

impl Admission {
    /// Ends the lease part of a create whose transaction ran: releases a held lease (with
    /// `release`) and says what the lease did. A release that fails is logged and reported as
    /// not released (the lease then expires with its TTL).
    pub fn finish(
        self,
        leases: Option<&mut dyn Leases>,
        lease: &str,
        release: Release,
    ) -> LeaseOutcome {
        match self {
            Admission::Held { token } => {
                let released = match leases {
                    None => Ok(false),
                    Some(leases) => match release {
                        Release::CompareAndDelete => leases.release(lease, &token),
                        Release::PlainDelete => leases.delete(lease),
                    },
                };
                let released = released.unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "lease release failed; it expires with its TTL");
                    false
                });
                LeaseOutcome::Held { released }
            }
            Admission::Waited {
                waited_ms,
                receipt_seen,
                ..
            } => LeaseOutcome::Waited {
                waited_ms,
                receipt_seen,
            },
            Admission::NoLease { reason } => LeaseOutcome::NoLease { reason },
        }
    }
}

/// The lease part of a create before its transaction, touching no database session of its
/// own: `SET lease NX PX ttl` with a fresh token; when another request holds the lease, wait at
/// most `wait` (polling with pauses doubling from 1 ms to 20 ms) until `receipt_visible`
/// answers `true` or the lease is gone. `receipt_visible` is the only database access, and
/// the caller decides what it uses (`serve` borrows an idle pooled session only for the
/// lookup, and skips it when none is idle). A Redis failure, or `leases` being `None`, is
/// [`Admission::NoLease`].
pub fn admit(
    leases: Option<&mut dyn Leases>,
    config: &LeaseConfig,
    wait: Duration,
    lease: &str,
    receipt_visible: &mut dyn FnMut() -> bool,
) -> Admission {
    let Some(leases) = leases else {
        return Admission::NoLease {
            reason: "redis connect: unreachable".into(),
        };
    };
    let token = uuid::Uuid::new_v4().to_string();
    match leases.acquire(lease, &token, config.ttl) {
        Ok(true) => Admission::Held { token },
        Ok(false) => wait_for_receipt(leases, lease, wait, receipt_visible),
        Err(e) => {
            tracing::warn!(error = %e, "no lease: going on without it (the receipt decides)");
            Admission::NoLease {
                reason: e.to_string(),
            }
        }
    }
}

/// Polls, with pauses doubling from 1 ms to 20 ms and for at most `wait`, until the receipt
/// is visible or the lease is gone. A Redis error ends the wait early.
fn wait_for_receipt(
    leases: &mut dyn Leases,
    lease: &str,
    wait: Duration,
    receipt_visible: &mut dyn FnMut() -> bool,
) -> Admission {
    let started = Instant::now();
    let mut pause = Duration::from_millis(1);
    let (receipt_seen, timed_out) = loop {
        if receipt_visible() {
            break (true, false);
        }
        if !matches!(leases.holder(lease), Ok(Some(_))) {
            break (false, false);
        }
        let left = wait.saturating_sub(started.elapsed());
        if left.is_zero() {
            break (false, true);
        }
        leases.pause(pause.min(left));
        pause = (pause * 2).min(Duration::from_millis(20));
    };
    Admission::Waited {
        waited_ms: started.elapsed().as_millis() as u64,
        receipt_seen,
        timed_out,
    }
}

/// Opens [`RedisLeases`] for an r2d2 pool (`serve`): a connection that failed is discarded.
#[derive(Debug, Clone)]
pub struct LeaseManager(pub LeaseConfig);

impl r2d2::ManageConnection for LeaseManager {
    type Connection = RedisLeases;
    type Error = LeaseError;

    fn connect(&self) -> Result<RedisLeases, LeaseError> {
        RedisLeases::connect(&self.0)
    }

    fn is_valid(&self, conn: &mut RedisLeases) -> Result<(), LeaseError> {
        redis::cmd("PING")
            .query::<String>(&mut conn.conn)
            .map(drop)
            .map_err(redis_err("ping"))
    }

    fn has_broken(&self, conn: &mut RedisLeases) -> bool {
        // After an I/O error or a timeout the reply stream may be out of step: never reuse.
        !redis::ConnectionLike::is_open(&conn.conn)
    }
}

/// Leases on a pool of Redis connections ([`LeaseManager`]), one checked out for each
/// operation and returned at once, so a request waiting for a held lease holds no
/// connection between its polls and a stuck key cannot use up the pool.
#[derive(Debug, Clone, Copy)]
pub struct PooledLeases<'a>(pub &'a r2d2::Pool<LeaseManager>);

impl PooledLeases<'_> {
    fn conn(
        &self,
        operation: &'static str,
    ) -> Result<r2d2::PooledConnection<LeaseManager>, LeaseError> {
        self.0.get().map_err(|e| LeaseError {
            operation,
            message: format!("no redis connection: {e}"),
        })
    }
}

impl Leases for PooledLeases<'_> {
    fn acquire(&mut self, key: &str, token: &str, ttl: Duration) -> Result<bool, LeaseError> {
        self.conn("acquire")?.acquire(key, token, ttl)
    }

    fn release(&mut self, key: &str, token: &str) -> Result<bool, LeaseError> {
        self.conn("release")?.release(key, token)
    }

    fn delete(&mut self, key: &str) -> Result<bool, LeaseError> {
        self.conn("release")?.delete(key)
    }

    fn holder(&mut self, key: &str) -> Result<Option<String>, LeaseError> {
        self.conn("read holder")?.holder(key)
    }
}

impl LeaseOutcome {
    /// `held`, `waited` or `no-lease`: the `ticketflow-lease` header of `serve`.
    pub fn name(&self) -> &'static str {
        match self {
            LeaseOutcome::Held { .. } => "held",
            LeaseOutcome::Waited { .. } => "waited",
            LeaseOutcome::NoLease { .. } => "no-lease",
        }
    }
}

/// Connects for one request: `None` (counted as no lease by [`create_with_lease`]) when Redis
/// cannot be reached.
pub fn connect_or_none(config: &LeaseConfig) -> Option<RedisLeases> {
    RedisLeases::connect(config)
        .map_err(|e| tracing::warn!(error = %e, "no lease: redis unreachable"))
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_ttls_are_checked() {
        let ttl = Duration::from_millis(100);
        assert!(LeaseConfig::new("redis://127.0.0.1:6379/0", ttl).is_ok());
        for bad in [
            "http://127.0.0.1:6379/0",
            "redis://127.0.0.1:6379",
            "redis://127.0.0.1/0",
            "redis://:6379/0",
            "redis://127.0.0.1:0/0",
            "redis://127.0.0.1:99999/0",
            "redis://127.0.0.1:6379/x",
            "redis://u:p@127.0.0.1:6379/0",
        ] {
            let e = LeaseConfig::new(bad, ttl).unwrap_err();
            assert!(matches!(e, LeaseConfigError::BadUrl { .. }), "{bad}: {e}");
        }
        assert_eq!(
            LeaseConfig::new("redis://127.0.0.1:6379/0", Duration::ZERO),
            Err(LeaseConfigError::ZeroTtl)
        );
        assert!(LeaseConfig::new("redis://127.0.0.1:6379/0", MAX_TTL).is_ok());
        for too_long in [
            MAX_TTL + Duration::from_millis(1),
            Duration::from_millis(999_999_999),
            Duration::from_millis(u64::MAX),
        ] {
            let e = LeaseConfig::new("redis://127.0.0.1:6379/0", too_long).unwrap_err();
            assert!(matches!(e, LeaseConfigError::TtlTooLong { .. }), "{e}");
        }
        let e = LeaseConfig::new("redis://u:s3kr1t@127.0.0.1:6379/0", ttl).unwrap_err();
        assert!(!e.to_string().contains("s3kr1t"), "{e}");
    }

    #[test]
    fn a_wait_that_runs_out_says_so_and_a_waiter_looks_only_through_its_callback() {
        let mut m = MemoryLeases::default();
        let config = LeaseConfig::new("redis://127.0.0.1:6379/0", MAX_TTL).unwrap();
        assert!(m.acquire("k", "crashed", MAX_TTL).unwrap());
        let mut looked = 0;
        let admission = admit(
            Some(&mut m),
            &config,
            Duration::from_millis(5),
            "k",
            &mut || {
                looked += 1;
                false
            },
        );
        assert!(
            matches!(
                admission,
                Admission::Waited {
                    receipt_seen: false,
                    timed_out: true,
                    ..
                }
            ),
            "{admission:?}"
        );
        assert!(looked >= 2, "the receipt was looked at {looked} times");
        let admission = admit(Some(&mut m), &config, MAX_TTL, "k", &mut || true);
        assert!(
            matches!(
                admission,
                Admission::Waited {
                    receipt_seen: true,
                    timed_out: false,
                    ..
                }
            ),
            "{admission:?}"
        );
        let held = admit(Some(&mut m), &config, MAX_TTL, "other", &mut || false);
        let Admission::Held { token } = held.clone() else {
            panic!("{held:?}")
        };
        assert_eq!(m.holder("other").unwrap(), Some(token));
        assert_eq!(
            held.finish(Some(&mut m), "other", Release::CompareAndDelete),
            LeaseOutcome::Held { released: true }
        );
        assert_eq!(m.holder("other").unwrap(), None);
    }

    #[test]
    fn lease_keys_keep_tenant_and_key_apart_and_hold_nothing_else() {
        assert_eq!(lease_key("A", "k-1"), "lease:A:k-1");
        assert_ne!(lease_key("a:b", "c"), lease_key("a", "b:c"));
        assert_eq!(lease_key("a:b", "c%"), "lease:a%3Ab:c%25");
    }

    #[test]
    fn memory_leases_expire_and_only_their_token_releases_them() {
        let mut m = MemoryLeases::default();
        let ttl = Duration::from_millis(10);
        assert!(m.acquire("k", "t1", ttl).unwrap());
        assert!(!m.acquire("k", "t2", ttl).unwrap());
        m.advance(Duration::from_millis(11));
        assert!(
            m.acquire("k", "t2", ttl).unwrap(),
            "expired, so t2 takes it"
        );
        assert!(
            !m.release("k", "t1").unwrap(),
            "t1 must not release t2's lease"
        );
        assert_eq!(m.holder("k").unwrap().as_deref(), Some("t2"));
        assert!(
            m.delete("k").unwrap(),
            "a plain DEL removes whoever holds it"
        );
        assert!(m.acquire("k", "t3", ttl).unwrap());
        m.flush();
        assert_eq!(m.holder("k").unwrap(), None);
    }
}
