//! The lease table: where the short per-(tenant, key) leases of [`crate::lease`] live, in
//! Redis ([`RedisLeases`], pooled for `serve` by [`LeaseManager`]) or in memory beside the
//! memory store's rows ([`MemoryLeases`], for the loom models). Only the commands and their
//! configuration are here; what a create does with a lease (acquire, wait, release, and the
//! receipt that decides) is [`crate::lease`].

use std::time::Duration;

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
