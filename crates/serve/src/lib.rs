//! `ticketflow serve`: the protocol over HTTP, so two processes on two ports are the API
//! processes `api-a` and `api-b` (docs/PROTOCOL.md §1), and the black-box scenarios (`[target]`)
//! have a real service to race.
//!
//! | request | response |
//! |---|---|
//! | `POST /v1/tickets` with `Idempotency-Key`, `X-Tenant-Id` and JSON `{actor_id, title, body, priority}` | created: 201, `Location: /v1/tickets/{id}`, the ticket as JSON; replayed: 201, the same id, `Idempotent-Replayed: true`; conflict: 409 `application/problem+json` |
//! | `GET /v1/tickets/{id}` with `X-Tenant-Id` | 200 ticket JSON; 404 when the id is unknown **in this tenant** |
//! | `PATCH /v1/tickets/{id}` with `X-Tenant-Id` and JSON `{title?, body?, priority?}` | 200 ticket JSON (version + 1, a `ticket.updated` event); 404 as for GET |
//! | `GET /healthz` | 200 once a database session can be had (readiness) |
//!
//! Errors are RFC 9457 problem details (`application/problem+json`: `type`, `title`, `status`,
//! `detail`, plus members of our own): 400 when the request cannot be read (a missing or empty
//! `Idempotency-Key` or `X-Tenant-Id`, a header that is not UTF-8, a body that is
//! not a JSON object with exactly the four string fields or that names a member twice, a
//! malformed ticket id); 415 when a POST or PATCH body is not declared `application/json`
//! (or `application/*+json`); 422 when it
//! was read but breaks a domain rule (too long, NUL, unknown priority, empty patch); 404; 409;
//! 503 when no database session could be had in time (nothing was written), the database
//! refuses writes (SQLSTATE 25006, nothing was written), a key's lease stayed held past the
//! request's wait (`lease-held`, nothing was written) or the database connection failed
//! (outcome unknown: retry with the same key); 500 otherwise.
//!
//! The stores are synchronous (`postgres`, `rusqlite`), so each request runs the protocol on a
//! blocking thread (`tokio::task::spawn_blocking`) with a session from an r2d2 pool. A pool,
//! not a connection per request: a new PostgreSQL session costs a connect, an authentication
//! and six prepared statements, and the pool bounds how many sessions the service holds.
//! Preparing `INSERT INTO idempotency_receipts` takes a lock on that table, so a request on a
//! new session waits at its first prepare while the receipts table is locked; `--min-idle`
//! opens sessions at startup so requests are held where the protocol touches the table.
//! **Invariant:** one request holds one pooled session for its whole transaction, so N
//! concurrent creates are N server backends — what the black-box barrier counts. With
//! `--lease`, a request takes the lease or waits for it before it checks a session out, so a
//! request waiting on a held lease holds no session.
//!
//! `--variant NAME` serves one of the wrong implementations (docs/PROTOCOL.md §8) behind the same routes and
//! response shapes (the schema is left as it is, as for `create --variant`).
//! `--variant redis-check-then-lock` and `--variant redis-lock-expires` keep their keys in the
//! Redis of `--lease URL` (taken as the variant's record store, not as a lease; refused
//! without it; `redis-lock-expires` locks for `--lease-ttl-ms`): each create opens its own
//! Redis connection, so an interposer in front of Redis sees one session per request, and a
//! held lock is answered 503 with `Retry-After` (nothing was written; retry with the same key).

// The core's modules under the names this crate's code uses (`ticketflow_core::store`, …).
use ticketflow_core::flags::{AUTH_TOKENS, LEASE, MAX_CONNECTIONS, VARIANT};

mod auth;
mod conn;

pub use auth::{AuthError, TokenTableError, Tokens, MIN_TOKEN_LEN, TOKENS_ENV};
pub use conn::{fd_budget, Limits};

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Serialize;
use uuid::Uuid;

use ticketflow_core::domain::{
    now_utc, JsonBodyError, OutboxEvent, Outcome, Ticket, TicketPatch, TicketRequest,
    TICKET_CREATED,
};
use ticketflow_core::error::{DbErrorKind, Error, StoreError, Transient, TransientCause, Written};
use ticketflow_core::lease::{
    admit, lease_key, Admission, LeaseConfig, LeaseManager, LeaseOutcome, LeaseStats, PooledLeases,
};
use ticketflow_core::protocol::RetryPolicy;
use ticketflow_core::store::postgres::{self as pg, IsolationChoice, PgStore};
use ticketflow_core::store::sqlite::SqliteStore;
use ticketflow_core::store::url::DatabaseUrl;
use ticketflow_core::store::Store;
use ticketflow_core::variants::{Implementation, RedisLockError, Variant, LATE_OUTBOX_DELAY_MS};

use ticketflow_core::wire::problem;
use ticketflow_core::wire::{
    KEY_HEADER, PATH_HEADER, PROBLEM_JSON, REPLAYED_HEADER, TENANT_HEADER,
};

/// What `ticketflow serve` needs.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Address to listen on, e.g. `127.0.0.1:8080` (port 0 picks a free port).
    pub listen: SocketAddr,
    /// A PostgreSQL server and database, or a SQLite file.
    pub database_url: DatabaseUrl,
    /// The protocol, or a wrong variant.
    pub implementation: Implementation,
    /// Most database sessions held at once (r2d2 `max_size`), at least 1.
    pub pool_size: u32,
    /// Sessions opened at startup and kept open (at most `pool_size`). 0: sessions open on
    /// demand. With `min_idle == pool_size` the service never opens a session while it runs,
    /// so a request never waits on a lock while preparing its statements.
    pub min_idle: u32,
    /// How long a request waits for a free session before a 503.
    pub pool_timeout: Duration,
    /// After the shutdown signal, how long requests in flight may take before the service
    /// stops anyway.
    pub shutdown_grace: Duration,
    /// Connection and request limits (timeouts, maximum connections).
    pub limits: Limits,
    /// Bearer tokens that decide the tenant ([`Tokens`]); `None`: the open mode, which
    /// trusts the `X-Tenant-Id` header of any caller.
    pub auth: Option<Tokens>,
    /// PostgreSQL isolation level of every transaction (`None`: READ COMMITTED); refused
    /// for SQLite.
    pub isolation: Option<IsolationChoice>,
    /// A Redis lease in front of the receipt for every create ([`ticketflow_core::lease`]); `None`:
    /// no lease. With `redis-check-then-lock` its URL is that variant's record store
    /// instead, and no lease is taken.
    pub lease: Option<LeaseConfig>,
}

/// Why the service could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The database URL is not usable, or migrating it failed.
    #[error("database {url}: {source}")]
    Database {
        /// The URL, password hidden.
        url: String,
        /// The cause.
        #[source]
        source: Box<Error>,
    },
    /// The session pool could not be built (the first session failed).
    #[error("cannot open a session pool: {0}")]
    Pool(#[from] r2d2::Error),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The async runtime could not start, or serving failed.
    #[error("server: {0}")]
    Io(#[from] std::io::Error),
    /// A limit cannot be honoured, e.g. more connections than file descriptors allow.
    #[error("{0}")]
    Limits(String),
    /// The options do not fit together, e.g. `redis-check-then-lock` without `--lease`.
    #[error("{0}")]
    Usage(String),
}

/// One pooled database session.
pub enum Session {
    /// PostgreSQL, at the service's `--isolation` (READ COMMITTED by default).
    Postgres(Box<PgStore>),
    /// A SQLite file.
    Sqlite(Box<SqliteStore>),
}

impl Session {
    /// The session as the protocol's [`Store`].
    pub fn store(&mut self) -> &mut dyn Store {
        match self {
            Session::Postgres(s) => s.as_mut(),
            Session::Sqlite(s) => s.as_mut(),
        }
    }
}

/// Opens sessions for the pool. Migrations run once, before the pool is built, so a new
/// session only connects and prepares its statements.
#[derive(Debug)]
pub struct SessionManager {
    url: DatabaseUrl,
    isolation: IsolationChoice,
}

impl SessionManager {
    /// A manager for `url`; applies pending migrations once, now.
    ///
    /// Will return `Err` for an unreachable database or a failed migration.
    pub fn new(url: &DatabaseUrl) -> Result<Self, Error> {
        Self::with_isolation(url, None)
    }

    /// As [`SessionManager::new`], with PostgreSQL transactions at `isolation` (`None`: READ
    /// COMMITTED).
    ///
    /// Will return `Err` as [`SessionManager::new`] does, or
    /// [`Error::IsolationNotApplicable`] for an `isolation` with a SQLite URL.
    pub fn with_isolation(
        url: &DatabaseUrl,
        isolation: Option<IsolationChoice>,
    ) -> Result<Self, Error> {
        if isolation.is_some() && matches!(url, DatabaseUrl::Sqlite(_)) {
            return Err(Error::IsolationNotApplicable);
        }
        match url {
            DatabaseUrl::Postgres(server) => {
                let mut client = pg::connect_as(server.config(), pg::SessionRole::Admin)?;
                pg::migrate_client(&mut client)?;
            }
            DatabaseUrl::Sqlite(path) => {
                SqliteStore::open(path)?;
            }
        }
        Ok(SessionManager {
            url: url.clone(),
            isolation: isolation.unwrap_or_default(),
        })
    }
}

impl r2d2::ManageConnection for SessionManager {
    type Connection = Session;
    type Error = StoreError;

    fn connect(&self) -> Result<Session, StoreError> {
        match &self.url {
            DatabaseUrl::Postgres(server) => {
                Ok(Session::Postgres(Box::new(PgStore::from_client_choice(
                    pg::connect_as(server.config(), pg::SessionRole::Serve)?,
                    self.isolation,
                )?)))
            }
            DatabaseUrl::Sqlite(path) => Ok(Session::Sqlite(Box::new(SqliteStore::open(path)?))),
        }
    }

    /// Runs before a session is handed out: it must be idle outside a transaction
    /// ([`PgStore::check_idle`]; for SQLite no transaction open), else the pool discards it
    /// and opens another, so a session left in a failed transaction never serves a request.
    fn is_valid(&self, conn: &mut Session) -> Result<(), StoreError> {
        match conn {
            Session::Postgres(s) => s.check_idle(),
            Session::Sqlite(s) if s.in_transaction() => Err(StoreError {
                kind: DbErrorKind::InFailedTransaction,
                backend: ticketflow_core::store::Backend::Sqlite,
                operation: "check session",
                code: None,
                message: "the session is inside an open transaction".into(),
            }),
            Session::Sqlite(_) => Ok(()),
        }
    }

    /// Runs when a session comes back: a closed connection, or one whose `ROLLBACK` failed
    /// ([`PgStore::is_broken`]), or a SQLite session still in a transaction, is discarded.
    fn has_broken(&self, conn: &mut Session) -> bool {
        match conn {
            Session::Postgres(s) => s.is_broken(),
            Session::Sqlite(s) => s.in_transaction(),
        }
    }
}

struct AppState {
    pool: r2d2::Pool<SessionManager>,
    implementation: Implementation,
    auth: Option<Tokens>,
    lease: Option<LeaseState>,
    /// The record store of `redis-check-then-lock` and `redis-lock-expires` (the `--lease`
    /// URL), with the variant and the lease TTL (the latter's lock TTL); `None` otherwise.
    redis_keys: Option<(redis::Client, Variant, u64)>,
}

/// Connect, read and write timeout of `redis-check-then-lock`'s Redis connection: longer than
/// the lease's, since under an interposer a command may be held for a while on purpose.
pub const VARIANT_REDIS_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs a `redis-check-then-lock` create on a fresh Redis connection (one per request, so an
/// interposer in front of Redis sees each request's commands on a session of their own).
fn redis_variant_create(
    (client, variant, lock_ttl_ms): &(redis::Client, Variant, u64),
    store: &mut dyn Store,
    tenant: &str,
    key: &str,
    request: &TicketRequest,
) -> Result<ticketflow_core::domain::CreateReport, Problem> {
    let connected = client
        .get_connection_with_timeout(VARIANT_REDIS_TIMEOUT)
        .and_then(|c| {
            c.set_read_timeout(Some(VARIANT_REDIS_TIMEOUT))?;
            c.set_write_timeout(Some(VARIANT_REDIS_TIMEOUT))?;
            Ok(c)
        });
    let mut conn = connected.map_err(|source| {
        redis_problem(&RedisLockError::Redis {
            operation: "connect",
            written_maybe: false,
            source,
        })
    })?;
    match variant {
        Variant::RedisLockExpires => ticketflow_core::fault_variants::redis_lock_expires(
            store,
            &mut conn,
            tenant,
            key,
            request,
            *lock_ttl_ms,
        ),
        _ => {
            ticketflow_core::variants::redis_check_then_lock(store, &mut conn, tenant, key, request)
        }
    }
    .map_err(|e| redis_problem(&e))
}

/// The answer to a failed `redis-check-then-lock` create: a held lock or a Redis failure is
/// 503 (retry with the same key), saying whether the ticket may have been written; the rest as
/// [`problem_of`].
fn redis_problem(e: &RedisLockError) -> Problem {
    let transient = |cause, written| {
        tracing::warn!(error = %e, "redis-check-then-lock answered 503");
        Problem::transient(Transient { cause, written }, Route::Create)
    };
    match e {
        RedisLockError::InProgress { .. } => {
            transient(TransientCause::Contention, Written::Nothing)
        }
        RedisLockError::Redis {
            written_maybe: false,
            ..
        } => transient(TransientCause::Connection, Written::Nothing),
        RedisLockError::Redis { .. } => transient(TransientCause::Connection, Written::Unknown),
        RedisLockError::BadRecord { .. } => Problem::internal(e),
        RedisLockError::Create(inner) => problem_of(inner, Route::Create),
    }
}

/// The lease of `serve --lease`: its configuration, a pool of Redis connections (opened on
/// demand, so Redis may be down at start-up; one is checked out per Redis command, see
/// [`PooledLeases`]), the longest a request waits for a held lease, and the counters.
struct LeaseState {
    config: LeaseConfig,
    pool: r2d2::Pool<LeaseManager>,
    /// The lease's own wait (the TTL) cut to nine tenths of the request timeout, so a request
    /// behind a stuck lease gets its own 503 (`lease-held`, nothing written) before the
    /// request timeout's, and its blocking thread ends with it.
    wait: Duration,
    stats: LeaseStats,
}

impl LeaseState {
    fn new(config: &LeaseConfig, size: u32, request_timeout: Duration) -> Self {
        let pool = r2d2::Pool::builder()
            .max_size(size)
            .min_idle(Some(0))
            .connection_timeout(ticketflow_core::lease::REDIS_TIMEOUT)
            .build_unchecked(LeaseManager(config.clone()));
        LeaseState {
            config: config.clone(),
            pool,
            wait: config.wait.min(request_timeout * 9 / 10),
            stats: LeaseStats::default(),
        }
    }

    /// Runs one create behind the lease, on a blocking thread. The lease is taken, or waited
    /// for, **before** a database session is checked out, so a request waiting for a held
    /// lease holds no session (only an idle one, borrowed for each receipt lookup while it
    /// waits, and none when none is idle): a stuck key never starves other keys of sessions.
    /// A wait cut short by the request's budget with the lease still held is 503 `lease-held`
    /// (nothing written); a wait that ran its full TTL goes on as the protocol says (the
    /// receipt decides).
    fn create(
        &self,
        sessions: &r2d2::Pool<SessionManager>,
        implementation: Implementation,
        tenant: &str,
        key: &str,
        request: &TicketRequest,
    ) -> Result<(ticketflow_core::domain::CreateReport, LeaseOutcome), Problem> {
        let lease = lease_key(tenant, key);
        let mut leases = PooledLeases(&self.pool);
        let admission = admit(
            Some(&mut leases),
            &self.config,
            self.wait,
            &lease,
            &mut || {
                sessions
                    .try_get()
                    .is_some_and(|mut s| matches!(s.store().find_receipt(tenant, key), Ok(Some(_))))
            },
        );
        let release = implementation.release();
        if let Admission::Waited {
            timed_out: true,
            waited_ms,
            ..
        } = admission
        {
            if self.wait < self.config.wait {
                self.stats
                    .record(&admission.finish(Some(&mut leases), &lease, release));
                tracing::warn!(tenant = ?tenant, waited_ms, "the key's lease stayed held past this request's wait; answered 503");
                return Err(Problem::transient(
                    Transient {
                        cause: TransientCause::LeaseHeld,
                        written: Written::Nothing,
                    },
                    Route::Create,
                ));
            }
        }
        let mut session = match sessions.get() {
            Ok(s) => s,
            Err(e) => {
                self.stats
                    .record(&admission.finish(Some(&mut leases), &lease, release));
                return Err(no_session(&e, Route::Create));
            }
        };
        let retry = RetryPolicy::default();
        let result = implementation.create(session.store(), tenant, key, request, &retry);
        drop(session);
        let outcome = admission.finish(Some(&mut leases), &lease, release);
        self.stats.record(&outcome);
        result
            .map(|r| (r, outcome))
            .map_err(|e| problem_of(&e, Route::Create))
    }
}

/// The 503 of a request that got no database session within the pool's wait.
fn no_session(e: &r2d2::Error, route: Route) -> Problem {
    tracing::warn!(error = %e, "no database session available; answered 503");
    Problem::transient(
        Transient {
            cause: TransientCause::NoSession,
            written: Written::Nothing,
        },
        route,
    )
}

/// A bound, ready service: the pool is open and the socket listens.
pub struct Service {
    listener: tokio::net::TcpListener,
    router: Router,
    state: Arc<AppState>,
    shutdown_grace: Duration,
    limits: Limits,
}

impl Service {
    /// The address actually bound (the real port when `listen` had port 0).
    ///
    /// Will return `Err` only if the OS cannot report it.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` completes, then stops accepting and lets requests in flight
    /// finish (graceful shutdown), for at most the configured grace period.
    ///
    /// Will return `Err` if accepting connections fails.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        let (tx, mut rx) = tokio::sync::watch::channel(false);
        let serving = conn::serve_connections(self.listener, self.router, self.limits, rx.clone());
        let signal = async move {
            shutdown.await;
            let _ = tx.send(true);
            // Keep the sender: connections read the flag until they end.
            std::future::pending::<()>().await
        };
        let grace = self.shutdown_grace;
        let deadline = async move {
            if rx.wait_for(|stopping| *stopping).await.is_err() {
                // The server ended first; this branch never decides.
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(grace).await;
        };
        tokio::select! {
            () = serving => {}
            () = signal => {}
            () = deadline => {
                tracing::warn!(grace_ms = grace.as_millis() as u64, "requests still in flight after the shutdown grace period; stopping anyway");
            }
        }
        // The `postgres` client blocks on its own runtime when dropped, which must not
        // happen on an async worker: the last reference to the pool goes on a blocking thread.
        let state = self.state;
        if let Some(lease) = &state.lease {
            let c = lease.stats.counts();
            tracing::info!(
                held = c.held,
                waited = c.waited,
                no_lease = c.no_lease,
                release_missed = c.release_missed,
                "lease counts"
            );
        }
        let _ = tokio::task::spawn_blocking(move || drop(state)).await;
        Ok(())
    }
}

/// Binds the socket, then migrates the database and opens the session pool (so a port in use
/// fails before the database is touched). Must be called inside a tokio runtime.
///
/// Will return `Err` for a bad or unreachable database, a failed migration, or an address that
/// cannot be bound.
pub async fn bind(config: &ServeConfig) -> Result<Service, ServeError> {
    let limits = checked_limits(config)?;
    let redis_keys = match (config.implementation, &config.lease) {
        (Implementation::Variant(v), Some(lease)) if v.needs_redis() => Some((
            redis::Client::open(lease.url.as_str())
                .map_err(|e| ServeError::Usage(format!("{LEASE} {}: {e}", lease.url)))?,
            v,
            u64::try_from(lease.ttl.as_millis()).unwrap_or(u64::MAX),
        )),
        (Implementation::Variant(v), None) if v.needs_redis() => {
            return Err(ServeError::Usage(format!(
                "{VARIANT} {v} keeps its keys in Redis: give {LEASE} redis://HOST:PORT/DB"
            )))
        }
        _ => None,
    };
    // The port first: a port in use fails the start before the database is touched (no
    // migration, no session). Connections that arrive meanwhile wait in the listen backlog.
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| ServeError::Bind {
            addr: config.listen,
            source,
        })?;
    let (url, isolation) = (config.database_url.clone(), config.isolation);
    let manager =
        tokio::task::spawn_blocking(move || SessionManager::with_isolation(&url, isolation))
            .await
            .map_err(|e| ServeError::Io(std::io::Error::other(e)))?
            .map_err(|source| ServeError::Database {
                url: config.database_url.redacted(),
                source: Box::new(source),
            })?;
    let (size, timeout) = (config.pool_size.max(1), config.pool_timeout);
    let min_idle = config.min_idle.min(size);
    let pool = tokio::task::spawn_blocking(move || {
        let builder = r2d2::Pool::builder()
            .max_size(size)
            // A new session prepares `INSERT INTO idempotency_receipts`, which takes a lock
            // on that table. Sessions therefore open only on demand or all at startup, never
            // as a background refill, which would show up as a lock waiter no request stands
            // behind. Kept sessions are never recycled (that would be a refill too).
            .min_idle(Some(min_idle))
            .connection_timeout(timeout);
        let builder = if min_idle > 0 {
            builder.idle_timeout(None).max_lifetime(None)
        } else {
            builder
        };
        builder.build(manager)
    })
    .await
    .map_err(|e| ServeError::Io(std::io::Error::other(e)))??;
    let state = Arc::new(AppState {
        pool,
        implementation: config.implementation,
        auth: config.auth.clone(),
        // `redis-check-then-lock` uses the `--lease` Redis as its record store, not as a lease.
        lease: match redis_keys {
            Some(_) => None,
            None => config
                .lease
                .as_ref()
                .map(|l| LeaseState::new(l, size, limits.request_timeout)),
        },
        redis_keys,
    });
    if config.auth.is_none() && !config.listen.ip().is_loopback() {
        tracing::warn!(listen = %config.listen, "serving without authentication on a non-loopback address: any caller can act as any tenant (see {AUTH_TOKENS})");
    }
    let router = Router::new()
        .route("/v1/tickets", post(create))
        .route("/v1/tickets/{id}", get(read).patch(update))
        .route("/healthz", get(health))
        .with_state(Arc::clone(&state));
    Ok(Service {
        listener,
        router,
        state,
        shutdown_grace: config.shutdown_grace,
        limits,
    })
}

/// The configured limits, refused when the process cannot honour them: more connections
/// than its file descriptors allow ([`fd_budget`]), or a zero timeout.
fn checked_limits(config: &ServeConfig) -> Result<Limits, ServeError> {
    let limits = config.limits;
    let zero = [
        ("header-read timeout", limits.header_read_timeout),
        ("idle timeout", limits.idle_timeout),
        ("request timeout", limits.request_timeout),
    ]
    .into_iter()
    .find(|(_, d)| d.is_zero());
    if let Some((name, _)) = zero {
        return Err(ServeError::Limits(format!("the {name} must be above 0")));
    }
    if limits.max_connections == 0 {
        return Err(ServeError::Limits(format!(
            "{MAX_CONNECTIONS} must be at least 1"
        )));
    }
    if let Some(budget) = fd_budget(config.pool_size) {
        if limits.max_connections as u64 > budget {
            return Err(ServeError::Limits(format!(
                "{MAX_CONNECTIONS} {} exceeds what this process's file descriptors allow: {budget} \
                 (RLIMIT_NOFILE less {} pooled sessions and a reserve); lower it or raise the limit \
                 (ulimit -n)",
                limits.max_connections, config.pool_size
            )));
        }
    }
    Ok(limits)
}

/// Runs the service on a new multi-threaded runtime until `shutdown` completes. `ready` is
/// called with the bound address once the service accepts connections (the CLI prints it).
///
/// Will return `Err` as [`bind`] and [`Service::run`] do.
pub fn serve_blocking(
    config: &ServeConfig,
    ready: impl FnOnce(SocketAddr),
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(async {
        let service = bind(config).await?;
        ready(service.local_addr()?);
        service.run(shutdown).await
    });
    // A request past the grace period may still sit on a blocking thread (waiting for a
    // session or the database); dropping the runtime would wait for it.
    runtime.shutdown_timeout(Duration::from_millis(100));
    result
}

/// An RFC 9457 problem details body.
#[derive(Debug, Clone, Serialize)]
pub struct Problem {
    /// A URI naming the problem type (`about:blank` when the status says it all).
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Short summary of the type.
    pub title: &'static str,
    /// The HTTP status.
    pub status: u16,
    /// This occurrence, in words.
    pub detail: String,
    /// Members of our own (conflict: `idempotency_key`, `request_hash`; 503: `written`,
    /// `cause`; 500: `error_id`).
    #[serde(flatten)]
    pub extensions: serde_json::Map<String, serde_json::Value>,
    /// Seconds for a `Retry-After` header (RFC 9110 §10.2.3), sent with 503s; not a member.
    #[serde(skip)]
    pub retry_after: Option<u32>,
    /// A `WWW-Authenticate` challenge (RFC 6750 §3), sent with 401s; not a member.
    #[serde(skip)]
    pub www_authenticate: Option<&'static str>,
}

impl Problem {
    fn new(
        status: StatusCode,
        kind: &'static str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Self {
        Problem {
            kind,
            title,
            status: status.as_u16(),
            detail: detail.into(),
            extensions: serde_json::Map::new(),
            retry_after: None,
            www_authenticate: None,
        }
    }

    fn with(mut self, name: &str, value: impl Serialize) -> Self {
        let value = serde_json::to_value(value).expect("extension members serialize");
        self.extensions.insert(name.to_string(), value);
        self
    }

    /// 503 for a failure a retry may cure: what happened, what was written, and what the
    /// caller should do next for this route; `Retry-After: RETRY_AFTER_SECS`.
    fn transient(t: Transient, route: Route) -> Self {
        let advice = match (route, t.written) {
            (Route::Create, Written::Nothing) => {
                "nothing was written; retry with the same Idempotency-Key"
            }
            (Route::Create, Written::Unknown) => {
                "the ticket may or may not have been created; retry with the same \
                 Idempotency-Key, which replays it if it was"
            }
            (Route::Update, Written::Nothing) => {
                "nothing was written; the update can be sent again"
            }
            (Route::Update, Written::Unknown) => {
                "the update may or may not have been applied; read the ticket's version before \
                 sending it again"
            }
            (Route::Read, _) => "nothing was written; retry",
        };
        let mut problem = Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            problem::TEMPORARILY_UNAVAILABLE,
            "Temporarily unavailable",
            format!("{}; {advice}", t.cause.describe()),
        )
        .with("written", t.written)
        .with("cause", t.cause);
        problem.retry_after = Some(RETRY_AFTER_SECS);
        problem
    }

    /// 500 for a bug or a broken invariant. The error itself goes to the log under a fresh
    /// `error_id`; the caller gets the id, never the error's text (SQL, internal steps).
    fn internal(error: &dyn std::fmt::Display) -> Self {
        let error_id = Uuid::new_v4();
        tracing::error!(%error_id, error = %error, "request failed on an internal error");
        Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            problem::INTERNAL_ERROR,
            "Internal Server Error",
            "the request failed on an internal error; the service log has it under this \
             answer's error_id",
        )
        .with("error_id", error_id.to_string())
    }

    fn bad_request(detail: impl Into<String>) -> Self {
        Problem::new(
            StatusCode::BAD_REQUEST,
            problem::UNREADABLE_REQUEST,
            "Request cannot be read",
            detail,
        )
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&self).expect("problems serialize");
        let mut response = (status, [(header::CONTENT_TYPE, PROBLEM_JSON)], body).into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if let Some(challenge) = self.www_authenticate {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(challenge),
            );
        }
        response
    }
}

/// Seconds a 503 asks the client to wait before retrying (`Retry-After`).
pub const RETRY_AFTER_SECS: u32 = 1;

/// Which route failed, so a 503's advice fits what the caller asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// `POST /v1/tickets`: retry with the same Idempotency-Key.
    Create,
    /// `GET`, `/healthz`: nothing is written.
    Read,
    /// `PATCH`: not idempotent; an unknown outcome needs a read first.
    Update,
}

/// The answer to a failed request: 422 and 404 for the caller's mistakes, 503 (with
/// `Retry-After`) for failures a retry may cure ([`Error::transient`]: timeouts, cancels, lost
/// connections, contention after the last retry), 500 for everything else.
fn problem_of(e: &Error, route: Route) -> Problem {
    match e {
        Error::Validation(v) => Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            problem::INVALID_REQUEST,
            "Invalid request",
            v.to_string(),
        ),
        Error::NotFound { .. } => Problem::new(
            StatusCode::NOT_FOUND,
            "about:blank",
            "Not Found",
            "no such ticket in this tenant",
        ),
        other => match other.transient() {
            Some(t) => {
                tracing::warn!(error = %other, written = ?t.written, "request failed transiently; answered 503");
                Problem::transient(t, route)
            }
            None => Problem::internal(other),
        },
    }
}

/// A required header as text: 400 when missing, repeated, empty or not UTF-8 (two tenants or
/// two keys in one request are ambiguous, never "the first one").
fn required_header(headers: &HeaderMap, name: &str, label: &str) -> Result<String, Problem> {
    if headers.get_all(name).iter().count() > 1 {
        return Err(Problem::bad_request(format!(
            "more than one {label} header"
        )));
    }
    let value = headers
        .get(name)
        .ok_or_else(|| Problem::bad_request(format!("missing {label} header")))?;
    let text = std::str::from_utf8(value.as_bytes())
        .map_err(|_| Problem::bad_request(format!("{label} header is not UTF-8")))?;
    if text.is_empty() {
        return Err(Problem::bad_request(format!("{label} header is empty")));
    }
    Ok(text.to_string())
}

fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8], shape: &str) -> Result<T, Problem> {
    ticketflow_core::domain::json_object(body).map_err(|e| {
        Problem::bad_request(match e {
            JsonBodyError::Shape(e) | JsonBodyError::DuplicateMember(e) => {
                format!("body must be {shape}: {e}")
            }
            JsonBodyError::NotObject { .. } => format!("body must be {shape}"),
            // `NotUtf8` comes only from `TicketRequest::from_json`; it reads "not valid UTF-8".
            other => format!("body is {other}"),
        })
    })
}

/// Refuses a body that is not declared as JSON with 415 Unsupported Media Type (RFC 9110
/// §15.5.16): the `Content-Type` must be `application/json` or an `application/*+json` type
/// (RFC 6839), parameters such as `charset` allowed. A missing `Content-Type` is refused too, so
/// a body meant as something else never creates a ticket.
fn require_json(headers: &HeaderMap) -> Result<(), Problem> {
    let declared = headers
        .get(header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let media_type = declared.as_deref().map(|v| {
        v.split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase()
    });
    let is_json = media_type.as_deref().is_some_and(|m| {
        m == "application/json" || (m.starts_with("application/") && m.ends_with("+json"))
    });
    if is_json {
        return Ok(());
    }
    let got = match &declared {
        Some(v) => format!("got {v:?}"),
        None => "none was given".to_string(),
    };
    Err(Problem::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        problem::UNSUPPORTED_MEDIA_TYPE,
        "Unsupported Media Type",
        format!("Content-Type must be application/json ({got}); nothing was written"),
    ))
}

/// The tenant of a request: with authentication on, the one its bearer token maps to (401
/// without a known token, 400 when `X-Tenant-Id` is sent anyway); in the open mode, the
/// `X-Tenant-Id` header as sent.
fn tenant_of(state: &AppState, headers: &HeaderMap) -> Result<String, Problem> {
    let Some(tokens) = &state.auth else {
        return required_header(headers, TENANT_HEADER, "X-Tenant-Id");
    };
    tokens.tenant(headers).map_err(|e| match e {
        AuthError::TenantHeader => Problem::bad_request(
            "X-Tenant-Id is not accepted here: authentication is on and the bearer token \
             decides the tenant",
        ),
        AuthError::Unauthenticated(reason) => {
            let mut p = Problem::new(
                StatusCode::UNAUTHORIZED,
                problem::UNAUTHENTICATED,
                "Unauthenticated",
                format!("{reason}; send Authorization: Bearer TOKEN"),
            );
            // RFC 6750 §3: no error code when credentials are missing; `invalid_token` when
            // a token was sent but is not known.
            p.www_authenticate = Some(if reason == "unknown token" {
                r#"Bearer realm="ticketflow", error="invalid_token""#
            } else {
                r#"Bearer realm="ticketflow""#
            });
            p
        }
    })
}

fn ticket_id(raw: &str) -> Result<Uuid, Problem> {
    Uuid::parse_str(raw)
        .map_err(|_| Problem::bad_request(format!("{raw:?} is not a ticket id (UUID)")))
}

/// Runs `work` with a pooled session on a blocking thread; `route` shapes a 503's advice.
async fn with_session<T: Send + 'static>(
    state: &Arc<AppState>,
    route: Route,
    work: impl FnOnce(&mut dyn Store, Implementation) -> Result<T, Error> + Send + 'static,
) -> Result<T, Problem> {
    let state = Arc::clone(state);
    let joined = tokio::task::spawn_blocking(move || {
        let mut session = state.pool.get().map_err(|e| no_session(&e, route))?;
        work(session.store(), state.implementation).map_err(|e| problem_of(&e, route))
    })
    .await;
    joined.unwrap_or_else(|e| Err(Problem::internal(&format!("request task failed: {e}"))))
}

fn json_response(status: StatusCode, value: &impl Serialize) -> Response {
    let body = serde_json::to_vec(value).expect("tickets serialize");
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn create(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    match create_inner(&state, &headers, &body).await {
        Ok(r) | Err(r) => r,
    }
}

async fn create_inner(
    state: &Arc<AppState>,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, Response> {
    let p = |p: Problem| p.into_response();
    let tenant = tenant_of(state, headers).map_err(p)?;
    let key = required_header(headers, KEY_HEADER, "Idempotency-Key").map_err(p)?;
    require_json(headers).map_err(p)?;
    let request: TicketRequest = parse_json(body, TicketRequest::JSON_SHAPE).map_err(p)?;
    let (report, lease) = if state.lease.is_some() {
        let (t, k, app) = (tenant.clone(), key.clone(), Arc::clone(state));
        let joined = tokio::task::spawn_blocking(move || {
            let lease = app.lease.as_ref().expect("checked above");
            lease.create(&app.pool, app.implementation, &t, &k, &request)
        })
        .await;
        let (report, outcome) = joined
            .unwrap_or_else(|e| Err(Problem::internal(&format!("request task failed: {e}"))))
            .map_err(p)?;
        (report, Some(outcome))
    } else {
        let (t, k, app) = (tenant.clone(), key.clone(), Arc::clone(state));
        with_session(state, Route::Create, move |store, implementation| {
            let retry = RetryPolicy::default();
            // `redis-check-then-lock` answers its own failures (a held lock is a 503).
            if let Some(client) = &app.redis_keys {
                return Ok(redis_variant_create(client, store, &t, &k, &request));
            }
            implementation
                .create(store, &t, &k, &request, &retry)
                .map(Ok)
        })
        .await
        .map_err(p)?
        .map_err(p)
        .map(|r| (r, None))?
    };
    // Debug-quoted: a tenant such as `A outcome=created` cannot forge a log field.
    tracing::info!(tenant = ?tenant, outcome = %report.outcome.kind(), path = %report.path, "POST /v1/tickets");
    let status =
        StatusCode::from_u16(report.http_status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let path = HeaderValue::from_str(&ticketflow_core::wire::path_value(report.path))
        .expect("decision path names are ASCII");
    let mut response = match &report.outcome {
        Outcome::Created { ticket } | Outcome::Replayed { ticket } => {
            let mut r = json_response(status, ticket);
            if let Ok(v) = HeaderValue::from_str(&format!("/v1/tickets/{}", ticket.id)) {
                r.headers_mut().insert(header::LOCATION, v);
            }
            if report.replayed {
                r.headers_mut().insert(
                    HeaderName::from_static(REPLAYED_HEADER),
                    HeaderValue::from_static("true"),
                );
            }
            r
        }
        Outcome::Conflict { conflict } => {
            // `stored_hash` is left out on purpose: it is the digest of *another* request's
            // body, and a caller who can reuse a key could test guesses of that body against
            // it. The caller's own `request_hash` helps it check its canonical JSON.
            Problem::new(
                status,
                problem::KEY_CONFLICT,
                "Idempotency-Key reused with a different request",
                "this key was first used with a different request body in this tenant; \
                 use a new key for a new request",
            )
            .with("idempotency_key", &conflict.idempotency_key)
            .with("request_hash", &conflict.request_hash)
            .into_response()
        }
    };
    if let (Implementation::Variant(Variant::LateOutboxAfterReplay), Outcome::Replayed { ticket }) =
        (state.implementation, &report.outcome)
    {
        late_outbox(state, ticket.clone());
    }
    if state.implementation == Implementation::Variant(Variant::AnswerStoredAfterResponse) {
        if let Some(late) = ticketflow_core::fault_variants::take_late_receipt(&tenant, &key) {
            late_receipt(state, late);
        }
    }
    response
        .headers_mut()
        .insert(HeaderName::from_static(PATH_HEADER), path);
    if let Some(outcome) = lease {
        response.headers_mut().insert(
            HeaderName::from_static(ticketflow_core::wire::LEASE_HEADER),
            HeaderValue::from_static(outcome.name()),
        );
    }
    Ok(response)
}

/// `late-outbox-after-replay`'s deviation: [`LATE_OUTBOX_DELAY_MS`] after answering a
/// replay, another `ticket.created` row for its ticket, in a transaction of its own (an event
/// a background task writes after the answer, as a service that publishes on replay would).
fn late_outbox(state: &Arc<AppState>, ticket: Ticket) {
    let state = Arc::clone(state);
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(LATE_OUTBOX_DELAY_MS)).await;
        let written = with_session(&state, Route::Create, move |store, _| {
            // DEVIATION: a second creation event for a ticket that was only replayed.
            let event = OutboxEvent::for_ticket(&ticket, TICKET_CREATED, now_utc());
            store.begin()?;
            store.insert_outbox(&event)?;
            store.commit()?;
            Ok(())
        })
        .await;
        if let Err(e) = written {
            tracing::warn!(error = ?e.detail, "late-outbox-after-replay: the late event was not written");
        }
    });
}

/// `answer-stored-after-response`'s deviation: the receipt of a create is stored only now,
/// after its answer was built, on a session of its own; a failure is logged and nothing else
/// (the client already has its answer). The key's next request on this process waits for it.
fn late_receipt(state: &Arc<AppState>, late: ticketflow_core::fault_variants::LateReceipt) {
    let state = Arc::clone(state);
    tokio::spawn(async move {
        let receipt = late.receipt.clone();
        let written = with_session(&state, Route::Create, move |store, _| {
            store.begin()?;
            store.insert_receipt(&receipt)?;
            store.commit()?;
            Ok(())
        })
        .await;
        if let Err(e) = written {
            tracing::warn!(error = ?e.detail, "answer-stored-after-response: the receipt was not stored");
        }
        drop(late);
    });
}

async fn read(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let result = async {
        let tenant = tenant_of(&state, &headers)?;
        let id = ticket_id(&id)?;
        with_session(&state, Route::Read, move |store, _| {
            ticketflow_core::protocol::get_ticket(store, &tenant, id)
        })
        .await
    }
    .await;
    match result {
        Ok(ticket) => json_response(StatusCode::OK, &ticket),
        Err(p) => p.into_response(),
    }
}

async fn update(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let result = async {
        let tenant = tenant_of(&state, &headers)?;
        let id = ticket_id(&id)?;
        require_json(&headers)?;
        let patch: TicketPatch = parse_json(&body, TicketPatch::JSON_SHAPE)?;
        with_session(&state, Route::Update, move |store, _| {
            ticketflow_core::protocol::update_ticket(store, &tenant, id, &patch)
        })
        .await
    }
    .await;
    match result {
        Ok(ticket) => json_response(StatusCode::OK, &ticket),
        Err(p) => p.into_response(),
    }
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    match with_session(&state, Route::Read, |_, _| Ok(())).await {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(p) => p.into_response(),
    }
}
