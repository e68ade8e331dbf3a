//! The racer driver of scenarios with Redis in the loop (`[lease]`, docs/PROTOCOL.md §10),
//! used by [`super::runner`], which owns the database, the setup and the ground truth: two
//! racers run [`ticketflow_core::lease::create_with_lease`] in front of the implementation under test,
//! and the driver, not a sleep, decides the order. The first racer (the holder) takes the
//! lease and is held by the driver right after its receipt lookup; the driver then does the
//! scenario's [`LeaseEvent`] to the lease and waits until the key is observably gone; the second racer
//! takes the lease and proceeds; only then is the holder let go. The receipt must arbitrate:
//! one ticket, one receipt, one `ticket.created` event, one id.
//!
//! The lease lives in the database of `--lease` (default [`DEFAULT_URL`], db 14), under a
//! prefix of its own per run (`tfv-run-<uuid>:`), so parallel runs never share a key. The
//! `flush` and `restart` events run `FLUSHDB` on that database, never `FLUSHALL`, and refuse
//! db 0 (PENDING): other users' keys live there. A real restart would cut off every client of
//! the shared Redis, so `restart` is simulated: `FLUSHDB` (no persistence: a restart loses
//! every key) and `CLIENT KILL ID` of the holder's connection (its release then fails).
//!
//! Evidence ([`LeaseEvidence`]): every token, every lease operation with what it removed, what
//! the runner did, and for `two-tokens` who held the lease right after the old holder's
//! release. A scenario that needs Redis and cannot reach it is PENDING with the reason.
//! The database setting is not what these scenarios vary: SQLite runs WAL with lazy
//! transactions (a paused holder's open read must not block the second request), PostgreSQL
//! the file's isolation levels.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::check::{evaluate, GroundTruth};
use super::format::{LeaseEvent, Racer, Scenario};
use super::observed::{Hook, HookPoint, ObservedStore};
use super::{Check, RacerOutcome, RacerRecord, RunSetting, ScenarioRun};
use crate::barrier::Barrier;
use ticketflow_core::error::{DbErrorKind, StoreError};
use ticketflow_core::fingerprint::Fingerprint;
use ticketflow_core::lease::{
    create_with_lease, lease_key, LeaseConfig, LeaseError, LeaseOutcome, Leases, RedisLeases,
    DEFAULT_TTL, REDIS_TIMEOUT,
};
use ticketflow_core::protocol::RetryPolicy;
use ticketflow_core::store::sqlite::{JournalMode, SqliteConfig, TxMode};
use ticketflow_core::store::Store;
use ticketflow_core::variants::Implementation;

/// Where the lease scenarios find Redis when `--lease` is not given: loopback, db 14 (the
/// integration tests use 15 and below; db 0 is left to everyone else).
pub const DEFAULT_URL: &str = "redis://127.0.0.1:6379/14";

/// How every PENDING reason of a lease scenario that could not use Redis begins
/// ([`redis_pending`]); `--require-redis` turns these into a non-zero exit.
pub const REDIS_PENDING: &str = "Redis not usable: ";

/// Whether `reason` (a PENDING run's or a kill-matrix cell's) says Redis could not be used.
pub fn redis_pending(reason: Option<&str>) -> bool {
    reason.is_some_and(|r| r.starts_with(REDIS_PENDING))
}

/// How long the runner waits for a racer to reach its pause, or for the key to vanish.
pub(crate) const STEP_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a lease scenario finds Redis and what the runner does.
#[derive(Debug, Clone, Default)]
pub struct LeaseRunOptions {
    /// Redis URL and lease TTL (`--lease`, `--lease-ttl-ms`); `None`: [`DEFAULT_URL`] with
    /// [`DEFAULT_TTL`].
    pub config: Option<LeaseConfig>,
    /// A negative control: the runner does not do the scenario's event (the lease neither
    /// expires nor is flushed), so the second request finds it held.
    pub skip_event: bool,
    /// `redis-down` connects here (default: a loopback port nothing listens on). A negative
    /// control points it at a Redis that answers.
    pub down_url: Option<String>,
}

impl LeaseRunOptions {
    /// The lease scenarios' Redis: `url` checked against its server
    /// ([`LeaseConfig::validate`]), or [`DEFAULT_URL`] when none is given, with a TTL of
    /// `ttl_ms` milliseconds.
    ///
    /// Will return `Err` for a malformed URL, a TTL of 0 or above an hour, or a given URL
    /// whose database is out of its server's range.
    pub fn with_lease(
        url: Option<&str>,
        ttl_ms: u64,
    ) -> Result<LeaseRunOptions, ticketflow_core::lease::LeaseConfigError> {
        let config = match url {
            Some(url) => LeaseConfig::validate(url, ttl_ms)?,
            None => LeaseConfig::new(DEFAULT_URL, std::time::Duration::from_millis(ttl_ms))?,
        };
        Ok(LeaseRunOptions {
            config: Some(config),
            ..Default::default()
        })
    }

    /// The configured lease, or [`DEFAULT_URL`] with [`DEFAULT_TTL`].
    ///
    /// Will return `Err` only for a malformed `--lease` (already refused by the CLI).
    pub fn lease_config(&self) -> Result<LeaseConfig, ticketflow_core::lease::LeaseConfigError> {
        match &self.config {
            Some(c) => Ok(c.clone()),
            None => LeaseConfig::new(DEFAULT_URL, DEFAULT_TTL),
        }
    }
}

/// One lease operation, as the runner saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeaseOp {
    /// The racer, or `runner`.
    pub actor: String,
    /// `SET NX PX`, `release (compare-and-delete)`, `release (plain DEL)`, `PEXPIRE`,
    /// `FLUSHDB`, `CLIENT KILL`, `connect`.
    pub op: String,
    /// The token it used, when it used one.
    pub token: Option<String>,
    /// What happened: `taken`, `held by <token>`, `removed <token>`, `removed nothing (held
    /// by …)`, or the Redis error.
    pub result: String,
}

/// What the lease did in one run.
#[derive(Debug, Clone, Serialize)]
pub struct LeaseEvidence {
    /// The scenario's event.
    pub event: LeaseEvent,
    /// The Redis URL (no credentials are accepted).
    pub url: String,
    /// The lease key (`lease:{tenant}:{key}`; in Redis under the run's prefix).
    pub key: String,
    /// Lease TTL, milliseconds.
    pub ttl_ms: u64,
    /// Each racer's token, in acquisition order.
    pub tokens: Vec<(String, String)>,
    /// Every lease operation, in order.
    pub ops: Vec<LeaseOp>,
    /// What the lease did for each racer.
    pub outcomes: Vec<(String, LeaseOutcome)>,
    /// `two-tokens`: the token holding the lease right after the old holder's release.
    pub holder_after_old_release: Option<Option<String>>,
    /// What was simulated rather than done for real, if anything.
    pub simulated: Option<String>,
}

impl LeaseEvidence {
    /// A stable label for a token: `L1`, `L2` in acquisition order (`L?` if unknown).
    pub fn label(&self, token: &str) -> String {
        self.tokens
            .iter()
            .position(|(_, t)| t == token)
            .map(|i| format!("L{}", i + 1))
            .unwrap_or_else(|| "L?".into())
    }
}

/// A [`Leases`] that records every operation and keeps the run's keys under its prefix.
struct Recorder<'l> {
    inner: RedisLeases,
    prefix: String,
    actor: String,
    log: &'l Mutex<Vec<LeaseOp>>,
    /// Set (by the runner, `restart` only) once it has killed this racer's connection: a
    /// release that fails from then on is the injected fault ([`Recorder::injected`]).
    severed: Option<&'l AtomicBool>,
}

impl Recorder<'_> {
    /// A release's result `r`, with what the evidence records for it (`said`): a release that
    /// failed on the connection the runner killed to simulate a Redis restart is the expected
    /// result of the injected fault, not a problem. It is recorded as such, logged at INFO
    /// (below the default level) and handed on as "removed nothing", which is all
    /// [`create_with_lease`] makes of a failed release besides its WARN. Any other failure,
    /// here or elsewhere, is handed on as it is, and warns.
    fn injected(
        &self,
        op: &str,
        r: Result<bool, LeaseError>,
        said: String,
    ) -> (Result<bool, LeaseError>, String) {
        match r {
            Err(e) if self.severed.is_some_and(|s| s.load(Ordering::SeqCst)) => {
                tracing::info!(
                    actor = %self.actor,
                    op,
                    error = %e,
                    "lease release failed on the connection the runner killed to simulate a \
                     Redis restart: the expected result; the lease was flushed"
                );
                (
                    Ok(false),
                    format!(
                        "{said} (expected: the runner killed this connection to simulate a \
                         Redis restart)"
                    ),
                )
            }
            r => (r, said),
        }
    }

    fn push(&self, op: &str, token: Option<&str>, result: String) {
        if let Ok(mut log) = self.log.lock() {
            log.push(LeaseOp {
                actor: self.actor.clone(),
                op: op.to_string(),
                token: token.map(str::to_string),
                result,
            });
        }
    }

    fn removed(before: Option<String>, r: &Result<bool, LeaseError>) -> String {
        match (r, before) {
            (Ok(true), Some(t)) => format!("removed {t}"),
            (Ok(true), None) => "removed a key".into(),
            (Ok(false), Some(t)) => format!("removed nothing (held by {t})"),
            (Ok(false), None) => "removed nothing (no lease)".into(),
            (Err(e), _) => e.to_string(),
        }
    }
}

impl Leases for Recorder<'_> {
    fn acquire(&mut self, key: &str, token: &str, ttl: Duration) -> Result<bool, LeaseError> {
        let k = format!("{}{key}", self.prefix);
        let r = self.inner.acquire(&k, token, ttl);
        let result = match &r {
            Ok(true) => "taken".to_string(),
            Ok(false) => match self.inner.holder(&k) {
                Ok(Some(t)) => format!("held by {t}"),
                _ => "held by another".into(),
            },
            Err(e) => e.to_string(),
        };
        self.push("SET NX PX", Some(token), result);
        r
    }

    fn release(&mut self, key: &str, token: &str) -> Result<bool, LeaseError> {
        let k = format!("{}{key}", self.prefix);
        let before = self.inner.holder(&k).ok().flatten();
        let op = "release (compare-and-delete)";
        let r = self.inner.release(&k, token);
        let said = Self::removed(before, &r);
        let (r, said) = self.injected(op, r, said);
        self.push(op, Some(token), said);
        r
    }

    fn delete(&mut self, key: &str) -> Result<bool, LeaseError> {
        let k = format!("{}{key}", self.prefix);
        let before = self.inner.holder(&k).ok().flatten();
        let op = "release (plain DEL)";
        let r = self.inner.delete(&k);
        let said = Self::removed(before, &r);
        let (r, said) = self.injected(op, r, said);
        self.push(op, None, said);
        r
    }

    fn holder(&mut self, key: &str) -> Result<Option<String>, LeaseError> {
        self.inner.holder(&format!("{}{key}", self.prefix))
    }
}

/// Why a lease scenario cannot run here (PENDING with this reason), or `None`.
fn unusable(event: LeaseEvent, config: &LeaseConfig) -> Option<String> {
    if !event.needs_redis() {
        return None;
    }
    // The number, not its text: `/00` is db 0 to Redis too.
    let db = config
        .url
        .rsplit('/')
        .next()
        .and_then(|d| d.parse::<u32>().ok());
    if event.flushes() && db == Some(0) {
        return Some(format!(
            "{REDIS_PENDING}refusing FLUSHDB on db 0 of {} (shared with other users): give {} a \
             dedicated database number",
            config.url,
            ticketflow_core::flags::LEASE
        ));
    }
    match RedisLeases::connect(config).and_then(|mut r| r.client_id()) {
        Ok(_) => None,
        Err(e) => Some(format!("{REDIS_PENDING}unreachable at {}: {e}", config.url)),
    }
}

/// The SQLite configuration of every `[lease]` run: `base` in WAL with lazy transactions (a
/// paused holder's open read must not block the second request).
pub(crate) fn sqlite_config(base: SqliteConfig) -> SqliteConfig {
    SqliteConfig {
        journal: JournalMode::Wal,
        tx: TxMode::Lazy,
        ..base
    }
}

/// The racer driver of a `[lease]` scenario in [`super::runner`]: its event and the lease it
/// runs in front of the racers' creates.
pub(crate) struct LeaseDriver {
    event: LeaseEvent,
    config: LeaseConfig,
    opts: LeaseRunOptions,
}

impl LeaseDriver {
    /// The driver of `scenario` (`None` without `[lease]`).
    ///
    /// Will return `Err` with the PENDING reason when its lease cannot be used here (no
    /// Redis, db 0 for a flush, …): decided before any database exists.
    // The `Err` is a String: it is not an error but the run's PENDING reason, as
    // `ScenarioRun::pending` takes it.
    pub(crate) fn prepare(
        scenario: &Scenario,
        opts: &LeaseRunOptions,
    ) -> Result<Option<LeaseDriver>, String> {
        let Some(lease) = scenario.lease else {
            return Ok(None);
        };
        let event = lease.event;
        let config = opts.lease_config().map_err(|e| e.to_string())?;
        if let Some(why) = unusable(event, &config) {
            return Err(why);
        }
        Ok(Some(LeaseDriver {
            event,
            config,
            opts: opts.clone(),
        }))
    }

    /// Races the scenario's two racers on `stores`, one store each, around the event.
    pub(crate) fn race<S: Store + Send>(
        &self,
        scenario: &Scenario,
        implementation: Implementation,
        retry: &RetryPolicy,
        stores: [&mut S; 2],
    ) -> Raced {
        drive(
            scenario,
            self.event,
            &self.config,
            &self.opts,
            implementation,
            retry,
            stores,
        )
    }
}

/// What a race with Redis in the loop produced, before it is judged ([`judge`]).
pub(crate) struct Raced {
    racers: Vec<RacerRecord>,
    outcomes: Vec<Option<LeaseOutcome>>,
    /// Problems with the runner's control of the race (the "barrier" check).
    control: Vec<String>,
    /// What the runner did, in words.
    did: String,
    evidence: LeaseEvidence,
    release_to_done_ms: Option<f64>,
}

/// One racer: its create behind the lease, through an [`ObservedStore`] with `hooks`.
#[allow(clippy::too_many_arguments)]
fn race_one<S: Store + ?Sized>(
    store: &mut S,
    racer: &Racer,
    leases: Option<&mut dyn Leases>,
    config: &LeaseConfig,
    implementation: Implementation,
    retry: &RetryPolicy,
    hooks: Vec<(HookPoint, Hook<'_, S>)>,
    released: Option<Instant>,
) -> (RacerRecord, LeaseOutcome) {
    let mut observed = ObservedStore::new(store, hooks);
    let (result, outcome) = create_with_lease(
        leases,
        config,
        implementation.release(),
        &mut observed,
        &racer.tenant,
        &racer.key,
        |s| implementation.create(s, &racer.tenant, &racer.key, &racer.request, retry),
    );
    let done = Instant::now();
    let record = RacerRecord {
        name: racer.name.clone(),
        tenant: racer.tenant.clone(),
        key: racer.key.clone(),
        fingerprint: Fingerprint::of(&racer.request).hash,
        backend_pid: None,
        os_pid: None,
        result: result
            .map(|r| RacerOutcome::from(&r))
            .map_err(|e| e.to_string()),
        steps: std::mem::take(&mut observed.steps),
        done_after_release_ms: released
            .or(observed.released_at)
            .map(|r| super::timeline::ms(done.saturating_duration_since(r))),
    };
    (record, outcome)
}

/// A hook that tells the runner the racer paused, then waits for the runner's go.
fn pause_hook<'a, S: Store + ?Sized>(
    paused: mpsc::Sender<()>,
    go: mpsc::Receiver<()>,
) -> Hook<'a, S> {
    let go = Mutex::new(go);
    Box::new(move |s: &mut S| {
        let backend = s.backend();
        let timeout = |message: &str| StoreError {
            kind: DbErrorKind::Timeout,
            backend,
            operation: "lease pause",
            code: None,
            message: message.to_string(),
        };
        paused.send(()).map_err(|_| timeout("the runner is gone"))?;
        let go = go.lock().map_err(|_| timeout("poisoned"))?;
        go.recv_timeout(STEP_TIMEOUT)
            .map_err(|_| timeout("the runner never let the racer go"))
    })
}

/// A hook that waits at the in-process `barrier` (the `redis-down` race).
fn barrier_hook<S: Store + ?Sized>(barrier: &Barrier) -> Hook<'_, S> {
    Box::new(move |st: &mut S| {
        let backend = st.backend();
        barrier
            .wait(STEP_TIMEOUT)
            .map(drop)
            .map_err(|e| StoreError {
                kind: DbErrorKind::Timeout,
                backend,
                operation: "barrier",
                code: None,
                message: e.to_string(),
            })
    })
}

/// The runner's own Redis session.
struct Admin {
    conn: redis::Connection,
}

impl Admin {
    fn connect(url: &str) -> Result<Admin, redis::RedisError> {
        let client = redis::Client::open(url)?;
        let conn = client.get_connection_with_timeout(REDIS_TIMEOUT)?;
        Ok(Admin { conn })
    }

    fn exists(&mut self, key: &str) -> Result<bool, redis::RedisError> {
        redis::cmd("EXISTS")
            .arg(key)
            .query::<i64>(&mut self.conn)
            .map(|n| n > 0)
    }

    /// Polls until `key` is gone (the observable end of an expiry or a flush), at most
    /// [`STEP_TIMEOUT`]. Returns the polls made.
    fn wait_gone(&mut self, key: &str) -> Result<u32, GoneError> {
        let started = Instant::now();
        let mut polls = 0;
        loop {
            polls += 1;
            if !self.exists(key)? {
                return Ok(polls);
            }
            if started.elapsed() > STEP_TIMEOUT {
                return Err(GoneError::StillThere { polls });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Why the runner could not see a lease key go ([`Admin::wait_gone`]); the `Display` is the
/// control problem the run reports.
#[derive(Debug, thiserror::Error)]
enum GoneError {
    /// Redis did not answer `EXISTS`.
    #[error(transparent)]
    Redis(#[from] redis::RedisError),
    /// The key outlived [`STEP_TIMEOUT`].
    #[error("the lease key was still there after {polls} polls")]
    StillThere {
        /// The polls made.
        polls: u32,
    },
}

/// The lease operations of one race, the racers' (through their [`Recorder`]s) and the
/// runner's, in order; the racers' keys live in Redis under the run's own `prefix`.
struct Recording {
    log: Mutex<Vec<LeaseOp>>,
    prefix: String,
}

impl Recording {
    fn new() -> Recording {
        Recording {
            log: Mutex::new(Vec::new()),
            prefix: format!("tfv-run-{}:", uuid::Uuid::new_v4().simple()),
        }
    }

    /// An operation of `actor` that used no token.
    fn push(&self, actor: &str, op: &str, result: String) {
        if let Ok(mut l) = self.log.lock() {
            l.push(LeaseOp {
                actor: actor.into(),
                op: op.into(),
                token: None,
                result,
            });
        }
    }

    /// A recording lease client for `actor` on `config`'s Redis; `None` when it cannot
    /// connect (the failed connect is recorded).
    fn recorder(&self, actor: &str, config: &LeaseConfig) -> Option<Recorder<'_>> {
        match RedisLeases::connect(config) {
            Ok(inner) => Some(Recorder {
                inner,
                prefix: self.prefix.clone(),
                actor: actor.to_string(),
                log: &self.log,
                severed: None,
            }),
            Err(e) => {
                self.push(actor, "connect", e.to_string());
                None
            }
        }
    }
}

/// What every racer of one lease race shares.
struct Racing<'a> {
    holder: &'a Racer,
    second: &'a Racer,
    implementation: Implementation,
    retry: &'a RetryPolicy,
    recording: &'a Recording,
}

/// What the racers did, before the evidence is completed.
struct Ran {
    racers: Vec<RacerRecord>,
    outcomes: Vec<Option<LeaseOutcome>>,
    /// What the runner did, in words.
    did: String,
    /// When the runner let the racers go on.
    released: Option<Instant>,
}

/// Runs the two racers in the order the event needs. Never panics: a problem of control is
/// reported in `control` (a FAIL of the "barrier" check).
fn drive<S: Store + Send>(
    scenario: &Scenario,
    event: LeaseEvent,
    config: &LeaseConfig,
    opts: &LeaseRunOptions,
    implementation: Implementation,
    retry: &RetryPolicy,
    stores: [&mut S; 2],
) -> Raced {
    let recording = Recording::new();
    let racing = Racing {
        holder: &scenario.racers[0],
        second: &scenario.racers[1],
        implementation,
        retry,
        recording: &recording,
    };
    let key = lease_key(&racing.holder.tenant, &racing.holder.key);
    let mut evidence = LeaseEvidence {
        event,
        url: config.url.clone(),
        key,
        ttl_ms: config.ttl.as_millis() as u64,
        tokens: Vec::new(),
        ops: Vec::new(),
        outcomes: Vec::new(),
        holder_after_old_release: None,
        simulated: (event == LeaseEvent::Restart).then(|| {
            "a Redis restart is simulated by FLUSHDB of the lease database and CLIENT KILL of \
             the holder's connection: Redis is shared, a real restart would cut off other users"
                .to_string()
        }),
    };
    let mut control = Vec::new();
    let ran = if event == LeaseEvent::RedisDown {
        let down = match &opts.down_url {
            Some(u) => LeaseConfig::new(u, config.ttl).unwrap_or_else(|_| config.clone()),
            None => LeaseConfig {
                url: free_loopback_url(),
                ..config.clone()
            },
        };
        evidence.url = down.url.clone();
        race_redis_down(&racing, &down, stores)
    } else {
        race_around_event(
            &racing,
            event,
            config,
            opts.skip_event,
            stores,
            &mut evidence,
            &mut control,
        )
    };
    evidence.ops = recording.log.into_inner().unwrap_or_default();
    for op in &evidence.ops {
        if op.op == "SET NX PX" && op.result == "taken" {
            if let Some(t) = &op.token {
                evidence.tokens.push((op.actor.clone(), t.clone()));
            }
        }
    }
    evidence.outcomes = ran
        .racers
        .iter()
        .zip(&ran.outcomes)
        .filter_map(|(r, o)| o.clone().map(|o| (r.name.clone(), o)))
        .collect();
    let release_to_done_ms = ran
        .released
        .map(|r| super::timeline::ms(Instant::now().saturating_duration_since(r)));
    Raced {
        racers: ran.racers,
        outcomes: ran.outcomes,
        control,
        did: ran.did,
        evidence,
        release_to_done_ms,
    }
}

/// `redis-down`: Redis at `down` does not answer, so both racers go on without the lease and
/// meet at an in-process barrier after their receipt lookup.
fn race_redis_down<S: Store + Send>(
    r: &Racing<'_>,
    down: &LeaseConfig,
    [sa, sb]: [&mut S; 2],
) -> Ran {
    let barrier = Barrier::new(2);
    let mut ra = r.recording.recorder(&r.holder.name, down);
    let mut rb = r.recording.recorder(&r.second.name, down);
    let ((rec_a, out_a), (rec_b, out_b)) = std::thread::scope(|s| {
        let (ha, hb) = (barrier_hook::<S>(&barrier), barrier_hook::<S>(&barrier));
        let (ra, rb) = (ra.as_mut(), rb.as_mut());
        let a = s.spawn(move || {
            race_one(
                sa,
                r.holder,
                ra.map(|l| l as &mut dyn Leases),
                down,
                r.implementation,
                r.retry,
                vec![(HookPoint::AfterFirstLookup, ha)],
                None,
            )
        });
        let b = s.spawn(move || {
            race_one(
                sb,
                r.second,
                rb.map(|l| l as &mut dyn Leases),
                down,
                r.implementation,
                r.retry,
                vec![(HookPoint::AfterFirstLookup, hb)],
                None,
            )
        });
        (join(a, r.holder), join(b, r.second))
    });
    Ran {
        racers: vec![rec_a, rec_b],
        outcomes: vec![out_a, out_b],
        did: format!(
            "Redis unreachable at {}: both racers met at an in-process barrier after their \
             receipt lookup",
            down.url
        ),
        released: None,
    }
}

/// Every event but `redis-down`: the holder takes the lease and pauses after its receipt
/// lookup; the runner does the event ([`do_event`]) unless `skip_event`; the second racer
/// goes on (for `two-tokens` it too pauses after its lookup, and the holder is let go first);
/// then the other is let go.
///
/// Long because it is one `thread::scope`: the racers are scoped threads borrowing the
/// stores, and every step of the runner between them runs inside that scope, in order.
#[allow(clippy::too_many_arguments)]
fn race_around_event<S: Store + Send>(
    r: &Racing<'_>,
    event: LeaseEvent,
    config: &LeaseConfig,
    skip_event: bool,
    [sa, sb]: [&mut S; 2],
    evidence: &mut LeaseEvidence,
    control: &mut Vec<String>,
) -> Ran {
    let (holder, second) = (r.holder, r.second);
    let full = format!("{}{}", r.recording.prefix, evidence.key);
    let mut admin = match Admin::connect(&config.url) {
        Ok(a) => Some(a),
        Err(e) => {
            control.push(format!("the runner could not reach Redis: {e}"));
            None
        }
    };
    // The holder's connection was killed by the runner (`restart`): see `Recorder::severed`.
    let severed = AtomicBool::new(false);
    let mut ra = r.recording.recorder(&holder.name, config);
    if event == LeaseEvent::Restart {
        if let Some(rec) = ra.as_mut() {
            rec.severed = Some(&severed);
        }
    }
    let holder_id = ra.as_mut().and_then(|rec| rec.inner.client_id().ok());
    let mut rb = r.recording.recorder(&second.name, config);
    let (paused_a, wait_a) = mpsc::channel();
    let (go_a, let_a) = mpsc::channel();
    let (paused_b, wait_b) = mpsc::channel();
    let (go_b, let_b) = mpsc::channel();
    let mut did = String::new();
    let mut released = None;
    let (rec_a, out_a, rec_b, out_b) = std::thread::scope(|s| {
        let (ra, rb) = (ra.as_mut(), rb.as_mut());
        let hook_a = pause_hook::<S>(paused_a, let_a);
        let a = s.spawn(move || {
            race_one(
                sa,
                holder,
                ra.map(|l| l as &mut dyn Leases),
                config,
                r.implementation,
                r.retry,
                vec![(HookPoint::AfterFirstLookup, hook_a)],
                None,
            )
        });
        if wait_a.recv_timeout(STEP_TIMEOUT).is_err() {
            control.push(format!(
                "{} never paused after its receipt lookup",
                holder.name
            ));
        }
        // The event, then wait until the key is observably gone.
        if skip_event {
            did.push_str("the runner did nothing to the lease (negative control); ");
        } else if let Some(admin) = admin.as_mut() {
            let target = EventTarget {
                key: &full,
                holder_id,
                severed: &severed,
            };
            if let Some(op) = do_event(admin, event, &target, r.recording, control) {
                did.push_str(&format!(
                    "{} paused after its lookup; {op} by the runner; the key seen gone; ",
                    holder.name
                ));
            }
        }
        let hooks_b: Vec<(HookPoint, Hook<'_, S>)> = if event == LeaseEvent::TwoTokens {
            vec![(
                HookPoint::AfterFirstLookup,
                pause_hook::<S>(paused_b, let_b),
            )]
        } else {
            drop((paused_b, let_b));
            Vec::new()
        };
        let b = s.spawn(move || {
            race_one(
                sb,
                second,
                rb.map(|l| l as &mut dyn Leases),
                config,
                r.implementation,
                r.retry,
                hooks_b,
                None,
            )
        });
        let (rec_a, out_a, rec_b, out_b);
        if event == LeaseEvent::TwoTokens {
            if wait_b.recv_timeout(STEP_TIMEOUT).is_err() {
                control.push(format!(
                    "{} never paused after its receipt lookup",
                    second.name
                ));
            }
            released = Some(Instant::now());
            let _ = go_a.send(());
            (rec_a, out_a) = join(a, holder);
            let now = admin.as_mut().map(|a| {
                redis::cmd("GET")
                    .arg(&full)
                    .query::<Option<String>>(&mut a.conn)
            });
            match now {
                Some(Ok(h)) => evidence.holder_after_old_release = Some(h),
                Some(Err(e)) => control.push(format!("reading the holder failed: {e}")),
                None => {}
            }
            let _ = go_b.send(());
            (rec_b, out_b) = join(b, second);
            did.push_str(&format!(
                "{} took the lease and paused after its lookup; {} went on, committed and \
                 released; then {} went on",
                second.name, holder.name, second.name
            ));
        } else {
            (rec_b, out_b) = join(b, second);
            released = Some(Instant::now());
            let _ = go_a.send(());
            (rec_a, out_a) = join(a, holder);
            did.push_str(&format!(
                "{} ran to its end; then {} went on",
                second.name, holder.name
            ));
        }
        (rec_a, out_a, rec_b, out_b)
    });
    Ran {
        racers: vec![rec_a, rec_b],
        outcomes: vec![out_a, out_b],
        did,
        released,
    }
}

/// Where the runner's event strikes: the lease key in Redis, and the holder's connection.
struct EventTarget<'a> {
    key: &'a str,
    /// The holder's Redis client id (`CLIENT ID`), for `restart`'s `CLIENT KILL`.
    holder_id: Option<i64>,
    /// Set once the holder's connection was killed.
    severed: &'a AtomicBool,
}

/// The runner's event on the lease: `PEXPIRE key 1` (`expire`, `two-tokens`) or `FLUSHDB`
/// (`flush`, `restart`), for `restart` then `CLIENT KILL ID` of the holder's connection; then
/// waits until the key is observably gone. Each command is recorded. Returns the command's
/// name when the key was seen gone; a problem goes to `control`.
fn do_event(
    admin: &mut Admin,
    event: LeaseEvent,
    target: &EventTarget<'_>,
    recording: &Recording,
    control: &mut Vec<String>,
) -> Option<&'static str> {
    let done = match event {
        LeaseEvent::Expire | LeaseEvent::TwoTokens => redis::cmd("PEXPIRE")
            .arg(target.key)
            .arg(1)
            .query::<i64>(&mut admin.conn)
            .map(|n| format!("{n} key set to expire in 1 ms"))
            .map_err(|e| e.to_string()),
        _ => redis::cmd("FLUSHDB")
            .query::<String>(&mut admin.conn)
            .map_err(|e| e.to_string()),
    };
    let op = match event {
        LeaseEvent::Expire | LeaseEvent::TwoTokens => "PEXPIRE",
        _ => "FLUSHDB",
    };
    recording.push("runner", op, done.clone().unwrap_or_else(|e| e));
    if let Err(e) = done {
        control.push(format!("{op} failed: {e}"));
    }
    if event == LeaseEvent::Restart {
        let killed = match target.holder_id {
            Some(id) => redis::cmd("CLIENT")
                .arg("KILL")
                .arg("ID")
                .arg(id)
                .query::<i64>(&mut admin.conn)
                .map(|n| format!("{n} connection (the holder's) closed"))
                .map_err(|e| e.to_string()),
            None => Err("the holder's client id is unknown".into()),
        };
        recording.push(
            "runner",
            "CLIENT KILL",
            killed.clone().unwrap_or_else(|e| e),
        );
        match killed {
            // From now on the holder's failing release is the injected fault.
            Ok(_) => target.severed.store(true, Ordering::SeqCst),
            Err(e) => control.push(format!("CLIENT KILL failed: {e}")),
        }
    }
    match admin.wait_gone(target.key) {
        Ok(_) => Some(op),
        Err(e) => {
            control.push(e.to_string());
            None
        }
    }
}

/// Joins a racer thread; a panic becomes the racer's error, never the runner's.
fn join(
    h: std::thread::ScopedJoinHandle<'_, (RacerRecord, LeaseOutcome)>,
    racer: &Racer,
) -> (RacerRecord, Option<LeaseOutcome>) {
    match h.join() {
        Ok((r, o)) => (r, Some(o)),
        Err(_) => (
            RacerRecord {
                name: racer.name.clone(),
                tenant: racer.tenant.clone(),
                key: racer.key.clone(),
                fingerprint: Fingerprint::of(&racer.request).hash,
                backend_pid: None,
                os_pid: None,
                result: Err("racer thread panicked".into()),
                steps: Vec::new(),
                done_after_release_ms: None,
            },
            None,
        ),
    }
}

/// A loopback URL where nothing listens: a port the OS handed out, then closed.
fn free_loopback_url() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(1);
    format!("redis://127.0.0.1:{port}/0")
}

/// The lease check: what each racer's lease must have been for the event.
fn lease_check(event: LeaseEvent, raced: &Raced) -> Check {
    let ev = &raced.evidence;
    let names: Vec<&str> = raced.racers.iter().map(|r| r.name.as_str()).collect();
    let kind = |i: usize| raced.outcomes.get(i).cloned().flatten();
    let mut problems = Vec::new();
    let label = |t: &str| ev.label(t);
    match event {
        LeaseEvent::RedisDown => {
            for (i, n) in names.iter().enumerate() {
                if !matches!(kind(i), Some(LeaseOutcome::NoLease { .. })) {
                    problems.push(format!(
                        "{n} was not counted as no lease: {}",
                        kind(i).map(|o| o.name()).unwrap_or("no outcome")
                    ));
                }
            }
        }
        _ => {
            for (i, n) in names.iter().enumerate() {
                if !matches!(kind(i), Some(LeaseOutcome::Held { .. })) {
                    problems.push(format!(
                        "{n} did not hold the lease ({}){}",
                        kind(i).map(|o| o.name()).unwrap_or("no outcome"),
                        if i == 1 {
                            ": the lease never went away while the holder was paused"
                        } else {
                            ""
                        }
                    ));
                }
            }
            if ev.tokens.len() == 2 && ev.tokens[0].1 == ev.tokens[1].1 {
                problems.push("both holders had the same token".into());
            }
            // The holder's lease was taken away under it: its own release removes nothing
            // (expired, flushed, or its connection killed).
            if let Some(LeaseOutcome::Held { released: true }) = kind(0) {
                problems.push(format!(
                    "{}'s release still found its own lease: it was never taken away",
                    names[0]
                ));
            }
        }
    }
    if event == LeaseEvent::TwoTokens {
        let new = ev.tokens.get(1).map(|(_, t)| t.clone());
        match (&ev.holder_after_old_release, &new) {
            (Some(Some(h)), Some(n)) if h == n => {}
            (Some(h), Some(n)) => problems.push(format!(
                "the old holder's release removed the new holder's lease: after it the key \
                 held {} instead of {}",
                h.as_deref().map(label).unwrap_or_else(|| "nothing".into()),
                label(n)
            )),
            _ => problems.push(
                "the new holder's token or the holder after the old release was not seen".into(),
            ),
        }
    }
    let ok = match event {
        LeaseEvent::RedisDown => {
            "both racers went through without a lease, counted as no lease".to_string()
        }
        LeaseEvent::TwoTokens => format!(
            "{} held L1, {} held L2; the old holder's release left L2 in place",
            names[0], names[1]
        ),
        _ => format!(
            "{} held L1, lost it mid-transaction; {} took L2 and proceeded",
            names[0], names[1]
        ),
    };
    Check::of_problems("lease", problems, ok)
}

/// The run's verdict: the scenario's expectations (rows, outcomes, one id), the runner's
/// control of the order (the "barrier" check) and the lease check.
pub(crate) fn judge(
    scenario: &Scenario,
    setting: RunSetting,
    raced: Raced,
    truth: &GroundTruth,
) -> ScenarioRun {
    let event = scenario
        .lease
        .map(|l| l.event)
        .unwrap_or(LeaseEvent::Expire);
    let control = Check::of_problems("barrier", raced.control.clone(), raced.did.clone());
    let mut checks = evaluate(scenario, control, &raced.racers, truth);
    checks.push(lease_check(event, &raced));
    ScenarioRun::judged(
        scenario,
        setting,
        checks,
        raced.racers,
        truth.rows.clone(),
        (None, Some(raced.evidence)),
        raced.release_to_done_ms,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raced(event: LeaseEvent, outcomes: [LeaseOutcome; 2], after: Option<Option<&str>>) -> Raced {
        let record = |name: &str| RacerRecord {
            name: name.into(),
            tenant: "A".into(),
            key: "k".into(),
            fingerprint: String::new(),
            backend_pid: None,
            os_pid: None,
            result: Err("not run".into()),
            steps: Vec::new(),
            done_after_release_ms: None,
        };
        Raced {
            racers: vec![record("holder"), record("second")],
            outcomes: outcomes.into_iter().map(Some).collect(),
            control: Vec::new(),
            did: String::new(),
            evidence: LeaseEvidence {
                event,
                url: DEFAULT_URL.into(),
                key: "lease:A:k".into(),
                ttl_ms: 100,
                tokens: vec![
                    ("holder".into(), "t1".into()),
                    ("second".into(), "t2".into()),
                ],
                ops: Vec::new(),
                outcomes: Vec::new(),
                holder_after_old_release: after.map(|h| h.map(str::to_string)),
                simulated: None,
            },
            release_to_done_ms: None,
        }
    }

    const KEPT: LeaseOutcome = LeaseOutcome::Held { released: false };
    const RELEASED: LeaseOutcome = LeaseOutcome::Held { released: true };

    #[test]
    fn the_lease_check_passes_what_each_event_must_show_and_fails_each_deviation() {
        let ok = |e, o, a| lease_check(e, &raced(e, o, a)).passed();
        assert!(ok(LeaseEvent::Expire, [KEPT, RELEASED], None));
        assert!(ok(
            LeaseEvent::TwoTokens,
            [KEPT, RELEASED],
            Some(Some("t2"))
        ));
        // The old holder's release deleted the new lease (a plain DEL).
        assert!(!ok(LeaseEvent::TwoTokens, [RELEASED, RELEASED], Some(None)));
        assert!(!ok(LeaseEvent::TwoTokens, [KEPT, RELEASED], Some(None)));
        // The holder's lease was never taken away.
        assert!(!ok(LeaseEvent::Flush, [RELEASED, RELEASED], None));
        // The second request waited instead of taking the lease.
        let waited = LeaseOutcome::Waited {
            waited_ms: 1,
            receipt_seen: false,
        };
        assert!(!ok(LeaseEvent::Restart, [KEPT, waited], None));
        let none = || LeaseOutcome::NoLease {
            reason: "down".into(),
        };
        assert!(ok(LeaseEvent::RedisDown, [none(), none()], None));
        assert!(!ok(LeaseEvent::RedisDown, [none(), KEPT], None));
    }
}
