//! `ticketflow soak`: two `ticketflow serve` processes on one scratch PostgreSQL database,
//! driven for a fixed duration by N client connections with mixed traffic while faults are
//! injected on a schedule; afterwards the database is checked by SQL against every answer the
//! clients were given.
//!
//! **Traffic.** Each connection is a thread with its own seeded generator (`--seed` + its
//! index) and sends, one request at a time, to either service:
//!
//! | share | request | expected answer |
//! |---|---|---|
//! | 30 % | create with a new key (random tenant, one of the bodies) | 201 |
//! | 15 % | retry of one of the connection's earlier keys, same body | 201, the same id |
//! | 20 % | create of the *contested* key: one key shared by every connection for a few sends, so several race on it | 201, one id for all |
//! | 10 % | conflict: an acknowledged key with another body | 409 |
//! | 20 % | GET of an acknowledged id in its tenant | 200 |
//! | 5 % | GET of an acknowledged id from another tenant | 404 |
//!
//! A request that gets a transport error or a 503 is sent again with the same key and body
//! (a GET the same way), through the other service, at most [`MAX_ATTEMPTS`] times, with a
//! jittered exponential backoff ([`BASE_BACKOFF`] doubling to [`MAX_BACKOFF`], or the
//! answer's `Retry-After` when shorter). Every intent and every attempt's answer (status, id,
//! latency, or the transport error) is recorded.
//!
//! **Faults** ([`FaultKind`]), one at a time in the order asked, [`FAULT_GAP`] apart, from the
//! first tenth of the run (at most 500 ms in) until the fault-free tail (the last quarter, at
//! least 1 s) begins: `kill-service` (SIGKILL one service, alternating, and start it again on
//! its port after [`KILL_DOWN`]), `terminate-backends` (`pg_terminate_backend` of every
//! session of the scratch database), `statement-timeout` (`ALTER DATABASE … SET
//! statement_timeout` on the scratch database only, its sessions terminated so the pools
//! reconnect with it, held [`SoakOptions::statement_timeout_hold`] (default
//! [`TIMEOUT_HOLD`]), then `RESET` and the sessions opened under it terminated again — except
//! one that stays in a transaction (`idle in transaction`, aborted or not) for a second, which
//! is left alone so the checks can see whether the service recovers it), and `restart-postgres`
//! (`pg_ctlcluster … restart`, only when asked for and the server is a local cluster, as
//! `verify --restart-postgres`: it cuts every session on that server; PENDING otherwise).
//!
//! **Checks**, after the traffic stopped, the faults ended and both services answer
//! `/healthz` ([`INVARIANTS`]): every requested fault kind was injected; tickets = receipts =
//! `ticket.created` events per tenant; every id answered with 201 exists in its tenant; every
//! key holds exactly one id across all its answers and receipts; every conflict answered 409
//! (a 201 is a failure); every GET answered its tenant (200 with the id; 404 from another
//! tenant); no session of the scratch database stays in a transaction; no 500 and no status
//! the protocol does not give. A check that could not run (PostgreSQL unreachable) is
//! PENDING with the reason, never PASS.
//!
//! Load goes only to `127.0.0.1`: the services listen on loopback and a PostgreSQL server not
//! on loopback is refused; duration, connections and tenants are bounded ([`MAX_DURATION`],
//! [`MAX_CONNECTIONS`], [`MAX_TENANTS`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use uuid::Uuid;

use crate::blackbox::client::{self, HttpRequest};
use crate::blackbox::format::ServiceSpec;
use crate::blackbox::service::{Services, TargetError};
use crate::scenario::Verdict;
use crate::store::postgres as pg;
use crate::store::scratch::{ScratchDb, ScratchError};
use crate::store::url::{parse_postgres, redact};
use crate::variants::Implementation;
use crate::wire::{KEY_HEADER, TENANT_HEADER};

/// Longest soak accepted.
pub const MAX_DURATION: Duration = Duration::from_secs(600);
/// Shortest soak accepted.
pub const MIN_DURATION: Duration = Duration::from_secs(1);
/// Most client connections accepted.
pub const MAX_CONNECTIONS: usize = 64;
/// Most tenants accepted.
pub const MAX_TENANTS: usize = 100;
/// Attempts per intent (the first send and its retries).
pub const MAX_ATTEMPTS: u32 = 10;
/// Backoff cap before the first retry; doubles per retry, full jitter above half.
pub const BASE_BACKOFF: Duration = Duration::from_millis(20);
/// Backoff cap of any retry (also caps a `Retry-After`).
pub const MAX_BACKOFF: Duration = Duration::from_millis(640);
/// Time limit of one HTTP attempt, connect to last byte.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause between two faults.
pub const FAULT_GAP: Duration = Duration::from_millis(250);
/// How long a killed service stays down before it is started again.
pub const KILL_DOWN: Duration = Duration::from_millis(200);
/// How long the short `statement_timeout` stays set unless told otherwise.
pub const TIMEOUT_HOLD: Duration = Duration::from_millis(500);
/// How long, after the traffic, the services and the database may take to answer again.
pub const SETTLE_TIMEOUT: Duration = Duration::from_secs(20);
/// Sends of one contested key before the next one is drawn.
const CONTESTED_USES: u32 = 6;

/// The names of the checks, in report order.
pub const INVARIANTS: [&str; 8] = [
    "faults injected",
    "tickets = receipts = created events per tenant",
    "every 201 id exists in its tenant",
    "one id per key",
    "conflicts answered 409",
    "GETs answer their tenant",
    "no session left in a transaction",
    "no 500 or unexpected answers",
];

/// A fault the soak injects on its schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// SIGKILL one service and start it again on its port.
    KillService,
    /// `pg_terminate_backend` of every session of the scratch database.
    TerminateBackends,
    /// A short `statement_timeout` on the scratch database, then reset.
    StatementTimeout,
    /// Restart the local PostgreSQL cluster (only when asked; cuts every session on it).
    RestartPostgres,
}

impl FaultKind {
    /// The kinds a soak injects unless told otherwise (not the restart, which must be asked
    /// for).
    pub const DEFAULT: [FaultKind; 3] = [
        FaultKind::KillService,
        FaultKind::TerminateBackends,
        FaultKind::StatementTimeout,
    ];

    /// Its name, as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillService => "kill-service",
            FaultKind::TerminateBackends => "terminate-backends",
            FaultKind::StatementTimeout => "statement-timeout",
            FaultKind::RestartPostgres => "restart-postgres",
        }
    }
}

impl std::fmt::Display for FaultKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a soak runs.
#[derive(Debug, Clone)]
pub struct SoakOptions {
    /// The PostgreSQL server (on loopback) where the scratch database is created.
    pub pg_url: String,
    /// How long the traffic runs, [`MIN_DURATION`] to [`MAX_DURATION`].
    pub duration: Duration,
    /// Client connections (threads), 1 to [`MAX_CONNECTIONS`].
    pub connections: usize,
    /// Tenants the traffic is spread over, 1 to [`MAX_TENANTS`].
    pub tenants: usize,
    /// Seed of the traffic generators (connection `i` uses `seed + i`).
    pub seed: u64,
    /// Fault kinds to inject, in schedule order (duplicates ignored); empty: no faults.
    pub faults: Vec<FaultKind>,
    /// What the services serve: the protocol, or a wrong variant (a negative control).
    pub implementation: Implementation,
    /// The `ticketflow` binary to start the services from (default: this executable).
    pub exe: Option<PathBuf>,
    /// The short `statement_timeout` of the `statement-timeout` fault, 1 ms to 1 s.
    pub statement_timeout: Duration,
    /// How long the `statement-timeout` fault keeps it set, at most a quarter of `duration`;
    /// `None`: [`TIMEOUT_HOLD`], or a quarter of `duration` when that is shorter.
    pub statement_timeout_hold: Option<Duration>,
}

impl SoakOptions {
    /// Each service's `--pool-size`: [`SoakOptions::connections`], clamped to 2–16.
    fn service_pool(&self) -> usize {
        self.connections.clamp(2, 16)
    }

    /// The PostgreSQL sessions a soak may hold at once: the pools of its two services
    /// (`--pool-size`, the connections clamped to 2–16, each), a third pool's worth for a
    /// killed service's sessions still ending while its replacement opens its own, and a few
    /// of its own (scratch database, checks, fault injection).
    pub fn pg_sessions(&self) -> u64 {
        3 * self.service_pool() as u64 + 4
    }

    /// Defaults: 10 s, 8 connections, 3 tenants, seed 1, [`FaultKind::DEFAULT`], the
    /// protocol, this executable, a 1 ms statement timeout held [`TIMEOUT_HOLD`].
    pub fn new(pg_url: impl Into<String>) -> Self {
        SoakOptions {
            pg_url: pg_url.into(),
            duration: Duration::from_secs(10),
            connections: 8,
            tenants: 3,
            seed: 1,
            faults: FaultKind::DEFAULT.to_vec(),
            implementation: Implementation::default(),
            exe: None,
            statement_timeout: Duration::from_millis(1),
            statement_timeout_hold: None,
        }
    }

    /// Refuses options outside the documented bounds or a server not on loopback.
    ///
    /// Will return `Err` ([`SoakError::Options`]) naming the first bad option.
    pub fn validate(&self) -> Result<(), SoakError> {
        let bad = |m: String| Err(SoakError::Options(m));
        if self.duration < MIN_DURATION || self.duration > MAX_DURATION {
            return bad(format!(
                "duration {} must be between {} and {}",
                humantime::format_duration(self.duration),
                humantime::format_duration(MIN_DURATION),
                humantime::format_duration(MAX_DURATION)
            ));
        }
        if self.connections == 0 || self.connections > MAX_CONNECTIONS {
            return bad(format!(
                "connections {} must be between 1 and {MAX_CONNECTIONS}",
                self.connections
            ));
        }
        if self.tenants == 0 || self.tenants > MAX_TENANTS {
            return bad(format!(
                "tenants {} must be between 1 and {MAX_TENANTS}",
                self.tenants
            ));
        }
        if self.statement_timeout.is_zero() || self.statement_timeout > Duration::from_secs(1) {
            return bad("the fault's statement timeout must be between 1 ms and 1 s".into());
        }
        if let Some(hold) = self.statement_timeout_hold {
            if hold.is_zero() || hold > self.duration / 4 {
                return bad(format!(
                    "the statement timeout's hold {} must be more than 0 and at most a quarter \
                     of the duration",
                    humantime::format_duration(hold)
                ));
            }
        }
        crate::bench::require_loopback(&self.pg_url).map_err(|e| SoakError::Options(e.to_string()))
    }

    /// How long the `statement-timeout` fault holds the timeout.
    pub fn hold(&self) -> Duration {
        self.statement_timeout_hold
            .unwrap_or_else(|| TIMEOUT_HOLD.min(self.duration / 4))
    }

    fn fault_kinds(&self) -> Vec<FaultKind> {
        let mut seen = HashSet::new();
        self.faults
            .iter()
            .copied()
            .filter(|k| seen.insert(*k))
            .collect()
    }
}

/// Why a soak could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SoakError {
    /// An option is out of bounds, or the server is not on loopback.
    #[error("soak options: {0}")]
    Options(String),
    /// The scratch database could not be created (PostgreSQL unreachable: the soak is
    /// PENDING).
    #[error("scratch database: {0}")]
    Scratch(#[from] ScratchError),
    /// A direct SQL statement of the soak's own failed.
    #[error("{what}: {source}")]
    Sql {
        /// What the soak was doing.
        what: &'static str,
        /// The cause.
        #[source]
        source: crate::StoreError,
    },
    /// The services could not be started.
    #[error(transparent)]
    Service(#[from] TargetError),
    /// This executable cannot be located (to start the services from it).
    #[error("cannot locate the ticketflow binary: {0}")]
    Exe(#[source] std::io::Error),
}

impl SoakError {
    /// Whether the soak did not run for want of a PostgreSQL server (PENDING, not FAIL).
    pub fn is_unreachable(&self) -> bool {
        matches!(self, SoakError::Scratch(ScratchError::Unreachable(_)))
    }
}

/// One injected (or attempted) fault.
#[derive(Debug, Clone, Serialize)]
pub struct FaultRecord {
    /// The kind.
    pub kind: FaultKind,
    /// Milliseconds from the start of the traffic.
    pub at_ms: u64,
    /// How long injecting it took (a killed service's restart, a held timeout), milliseconds.
    pub took_ms: u64,
    /// PASS: injected; FAIL: injecting it broke something (a service did not come back);
    /// PENDING: it could not be injected here (the reason in `detail`).
    pub verdict: Verdict,
    /// What was done and seen.
    pub detail: String,
}

/// One check's result.
#[derive(Debug, Clone, Serialize)]
pub struct InvariantResult {
    /// Its name (one of [`INVARIANTS`]).
    pub name: &'static str,
    /// PASS, FAIL, or PENDING when it could not be checked.
    pub verdict: Verdict,
    /// What was counted (PASS), what broke it (FAIL, with examples), or why it did not run.
    pub evidence: String,
}

/// The measured figures of a soak. They vary from run to run and are never a verdict.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Figures {
    /// HTTP attempts sent (retries included).
    pub requests: usize,
    /// Intents (one per create or GET the clients meant; retries are attempts of one intent).
    pub intents: usize,
    /// Attempts after the first (retries).
    pub retries: usize,
    /// Intents with no final answer after [`MAX_ATTEMPTS`] (their last error was transport
    /// or 503).
    pub gave_up: usize,
    /// Seconds from the first to the last attempt.
    pub elapsed_s: f64,
    /// `requests / elapsed_s`.
    pub req_per_s: f64,
    /// Median latency of answered attempts, milliseconds.
    pub p50_ms: f64,
    /// 99th-percentile latency of answered attempts, milliseconds.
    pub p99_ms: f64,
    /// Attempts by HTTP status (`"201"`, …) and `"transport error"`.
    pub answers: BTreeMap<String, usize>,
}

/// What a soak did and found.
#[derive(Debug, Clone, Serialize)]
pub struct SoakReport {
    /// FAIL if a check or fault failed, else PENDING if one did not run, else PASS.
    pub verdict: Verdict,
    /// Why, when not PASS (the failing or pending checks by name, or the setup error).
    pub reason: Option<String>,
    /// What the services served (`protocol` or a variant's name).
    pub implementation: &'static str,
    /// Traffic duration, seconds.
    pub duration_s: f64,
    /// Client connections.
    pub connections: usize,
    /// Tenants.
    pub tenants: usize,
    /// The traffic seed.
    pub seed: u64,
    /// Fault kinds requested, in schedule order.
    pub faults_requested: Vec<FaultKind>,
    /// Faults injected (successfully) by kind.
    pub faults_injected: BTreeMap<String, usize>,
    /// Every fault, in order.
    pub faults: Vec<FaultRecord>,
    /// The figures.
    pub figures: Figures,
    /// The checks, in [`INVARIANTS`] order.
    pub invariants: Vec<InvariantResult>,
    /// What else ran on the machine at the same time (`verify` runs its soak beside the kill
    /// matrix and the fault cases), so the figures are not the soak's alone; `None`: it ran
    /// alone.
    pub alongside: Option<String>,
}

impl SoakReport {
    /// A soak that did not run: every check PENDING with `reason` (or FAIL when `fail`).
    fn not_run(opts: &SoakOptions, verdict: Verdict, reason: String) -> Self {
        SoakReport {
            verdict,
            reason: Some(reason.clone()),
            implementation: opts.implementation.name(),
            duration_s: opts.duration.as_secs_f64(),
            connections: opts.connections,
            tenants: opts.tenants,
            seed: opts.seed,
            faults_requested: opts.fault_kinds(),
            faults_injected: BTreeMap::new(),
            faults: Vec::new(),
            figures: Figures::default(),
            invariants: INVARIANTS
                .iter()
                .map(|name| InvariantResult {
                    name,
                    verdict: Verdict::Pending,
                    evidence: format!("did not run: {reason}"),
                })
                .collect(),
            alongside: None,
        }
    }

    /// A soak that broke before it could judge anything (`reason`): FAIL.
    pub fn failed(opts: &SoakOptions, reason: impl Into<String>) -> Self {
        SoakReport::not_run(opts, Verdict::Fail, reason.into())
    }

    /// A soak that did not run because `reason` (PostgreSQL unreachable, …): PENDING.
    pub fn pending(opts: &SoakOptions, reason: impl Into<String>) -> Self {
        SoakReport::not_run(opts, Verdict::Pending, reason.into())
    }

    /// The result of check `name`, if it is in the report.
    pub fn invariant(&self, name: &str) -> Option<&InvariantResult> {
        self.invariants.iter().find(|i| i.name == name)
    }

    /// The report for people: the settings, the figures, the faults and every check.
    pub fn text(&self) -> String {
        use std::fmt::Write as _;
        let f = &self.figures;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "soak: {} — {} s, 2 services ({}), {} connections, {} tenants, seed {}",
            self.verdict,
            self.duration_s,
            self.implementation,
            self.connections,
            self.tenants,
            self.seed
        );
        if let Some(r) = &self.reason {
            let _ = writeln!(out, "  reason: {r}");
        }
        let _ = writeln!(
            out,
            "requests {} ({} intents, {} retries, {} gave up), {:.1} req/s over {:.1} s, latency p50 {:.1} ms, p99 {:.1} ms",
            f.requests, f.intents, f.retries, f.gave_up, f.req_per_s, f.elapsed_s, f.p50_ms, f.p99_ms
        );
        let answers: Vec<String> = f.answers.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        let _ = writeln!(
            out,
            "answers by status: {}",
            if answers.is_empty() {
                "none".to_string()
            } else {
                answers.join(", ")
            }
        );
        let injected: Vec<String> = self
            .faults_requested
            .iter()
            .map(|k| {
                format!(
                    "{k} {}",
                    self.faults_injected.get(k.name()).copied().unwrap_or(0)
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "faults injected: {}",
            if injected.is_empty() {
                "none requested".into()
            } else {
                injected.join(", ")
            }
        );
        for r in &self.faults {
            let _ = writeln!(
                out,
                "  {:>7.2} s {} {}: {}",
                r.at_ms as f64 / 1000.0,
                r.verdict,
                r.kind,
                r.detail
            );
        }
        let _ = writeln!(out, "invariants:");
        for i in &self.invariants {
            let _ = writeln!(
                out,
                "  {:<7} {}: {}",
                i.verdict.to_string(),
                i.name,
                i.evidence
            );
        }
        out
    }
}

/// Runs a soak (module docs) and judges it. Never fails: a soak that cannot be set up is
/// PENDING (PostgreSQL unreachable) or FAIL (anything else) with the reason.
pub fn run(opts: &SoakOptions) -> SoakReport {
    if let Err(e) = opts.validate() {
        return SoakReport::not_run(opts, Verdict::Fail, e.to_string());
    }
    match Soak::start(opts) {
        Ok(mut soak) => {
            let traffic = soak.drive();
            soak.finish(&traffic)
        }
        Err(e) if e.is_unreachable() => SoakReport::pending(opts, e.to_string()),
        Err(e) => SoakReport::not_run(opts, Verdict::Fail, e.to_string()),
    }
}

/// A soak in progress: the scratch database and the two services. [`run`] is start, drive,
/// finish; the stages are public so a test can change the database between drive and finish
/// (a planted fault each check must catch).
pub struct Soak {
    opts: SoakOptions,
    kinds: Vec<FaultKind>,
    db: ScratchDb,
    db_url: String,
    exe: String,
    specs: Vec<ServiceSpec>,
    services: Services,
    base_urls: Vec<String>,
    tenants: Vec<String>,
    faults: Vec<FaultRecord>,
    settle_problem: Option<String>,
}

/// What the clients sent and got (opaque; [`Soak::finish`] judges it).
pub struct Traffic {
    intents: Vec<Intent>,
    faults_end_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    New,
    Retry,
    Contested,
    Conflict,
    Get,
    GetOtherTenant,
}

impl Op {
    fn is_create(self) -> bool {
        matches!(self, Op::New | Op::Retry | Op::Contested | Op::Conflict)
    }
}

#[derive(Debug, Clone)]
struct Attempt {
    status: Option<u16>,
    error: Option<String>,
    latency: Duration,
    at_ms: u64,
    id: Option<Uuid>,
    /// The `detail` of a problem answer (500s), for the evidence.
    detail: Option<String>,
}

#[derive(Debug, Clone)]
struct Intent {
    op: Op,
    tenant: usize,
    /// The key of a create; empty for a GET.
    key: String,
    /// Body number (creates).
    body: u64,
    /// For a GET: the id asked for and the tenant that created it.
    get: Option<(Uuid, usize)>,
    attempts: Vec<Attempt>,
}

impl Intent {
    fn last(&self) -> Option<&Attempt> {
        self.attempts.last()
    }
}

/// The request body number `n`; conflicts send `changed` ones (another title).
fn body_json(n: u64, changed: bool) -> String {
    let priority = ["low", "normal", "high", "urgent"][(n % 4) as usize];
    let title = if changed {
        format!("Soak ticket {n} (changed)")
    } else {
        format!("Soak ticket {n}")
    };
    serde_json::json!({
        "actor_id": format!("user-{}", n % 7),
        "title": title,
        "body": format!("Generated by ticketflow soak, body {n}"),
        "priority": priority,
    })
    .to_string()
}

fn sql(what: &'static str) -> impl Fn(postgres::Error) -> SoakError {
    move |e| SoakError::Sql {
        what,
        source: pg::classify(what, e),
    }
}

impl Soak {
    /// Creates the scratch database (migrated, adapted for the implementation) and starts the
    /// two services on free loopback ports, registered for cleanup.
    ///
    /// Will return `Err` for bad options, an unreachable server ([`SoakError::is_unreachable`]),
    /// a failed statement, or a service that does not start.
    pub fn start(opts: &SoakOptions) -> Result<Soak, SoakError> {
        opts.validate()?;
        let db = ScratchDb::postgres(&opts.pg_url, "soak")?;
        if let Some(sql) = opts
            .implementation
            .schema_sql(crate::store::Backend::Postgres)
        {
            db.execute(sql)?;
        }
        let db_url = db.url()?;
        let exe = match &opts.exe {
            Some(p) => p.clone(),
            None => std::env::current_exe().map_err(SoakError::Exe)?,
        }
        .to_string_lossy()
        .into_owned();
        let pool = opts.service_pool().to_string();
        let specs: Vec<ServiceSpec> = ["api-a", "api-b"]
            .into_iter()
            .map(|name| {
                let mut command: Vec<String> = [
                    "{ticketflow}",
                    "serve",
                    "--listen",
                    "127.0.0.1:{port}",
                    "--database-url",
                    "{database_url}",
                    "--pool-size",
                    &pool,
                    "--pool-timeout-ms",
                    "2000",
                    "--shutdown-grace-ms",
                    "500",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect();
                if let Implementation::Variant(v) = opts.implementation {
                    command.extend(["--variant".to_string(), v.name().to_string()]);
                }
                if let Implementation::Protocol(p) = opts.implementation {
                    command.extend(["--protocol".to_string(), p.name().to_string()]);
                }
                ServiceSpec {
                    name: name.into(),
                    command,
                    ready_path: "/healthz".into(),
                    ready_timeout_ms: 15_000,
                }
            })
            .collect();
        let services = Services::start(&specs, &exe, &db_url)?;
        let base_urls = services
            .records
            .iter()
            .map(|r| r.base_url.clone())
            .collect();
        // A run label keeps tenants apart from any other run's, should two share a database.
        let label: String = Uuid::new_v4().simple().to_string()[..6].to_string();
        let tenants = (0..opts.tenants)
            .map(|t| format!("soak-{label}-t{t}"))
            .collect();
        Ok(Soak {
            kinds: opts.fault_kinds(),
            opts: opts.clone(),
            db,
            db_url,
            exe,
            specs,
            services,
            base_urls,
            tenants,
            faults: Vec::new(),
            settle_problem: None,
        })
    }

    /// The scratch database (for tests that plant a fault before [`Soak::finish`]).
    pub fn database(&self) -> &ScratchDb {
        &self.db
    }

    /// The tenant ids the traffic uses.
    pub fn tenants(&self) -> &[String] {
        &self.tenants
    }

    /// Runs the traffic for the configured duration with the fault schedule beside it, then
    /// waits (bounded by [`SETTLE_TIMEOUT`]) until both services are up and answer again.
    pub fn drive(&mut self) -> Traffic {
        let started = Instant::now();
        let duration = self.opts.duration;
        let tail = (duration / 4).max(Duration::from_secs(1)).min(duration);
        let faults_end = started + (duration - tail);
        let traffic_end = started + duration;
        // Retries of an intent in flight at the end are bounded too.
        let hard_end = traffic_end + Duration::from_secs(15);
        let hot = Mutex::new(None::<Hot>);
        let (base_urls, tenant_names) = (self.base_urls.clone(), self.tenants.clone());
        let shared = Shared {
            base_urls: &base_urls,
            tenants: tenant_names.len(),
            tenant_names: &tenant_names,
            hot: &hot,
            started,
            traffic_end,
            hard_end,
        };
        let intents = std::thread::scope(|scope| {
            let clients: Vec<_> = (0..self.opts.connections)
                .map(|i| {
                    let shared = &shared;
                    let seed = self.opts.seed.wrapping_add(i as u64);
                    scope.spawn(move || client_loop(i, seed, shared))
                })
                .collect();
            self.run_fault_schedule(started, faults_end);
            let mut all = Vec::new();
            for c in clients {
                // A client thread only panics on a bug of ours; its records are then lost,
                // and the checks run on what the others recorded.
                if let Ok(v) = c.join() {
                    all.extend(v);
                }
            }
            all
        });
        self.settle();
        // The tail starts when the last fault is over (one begun near the end of the window
        // can outlast it).
        let last_fault_end = self.faults.iter().map(|f| f.at_ms + f.took_ms).max();
        Traffic {
            intents,
            faults_end_ms: last_fault_end
                .unwrap_or(0)
                .max((faults_end - started).as_millis() as u64),
        }
    }

    fn run_fault_schedule(&mut self, started: Instant, faults_end: Instant) {
        if self.kinds.is_empty() {
            return;
        }
        let first = started + (self.opts.duration / 10).min(Duration::from_millis(500));
        sleep_until(first);
        let mut n = 0usize;
        let mut gave_up: HashSet<FaultKind> = HashSet::new();
        while Instant::now() < faults_end && gave_up.len() < self.kinds.len() {
            let kind = self.kinds[n % self.kinds.len()];
            n += 1;
            if gave_up.contains(&kind) {
                continue;
            }
            let at_ms = started.elapsed().as_millis() as u64;
            let (verdict, detail) = match self.inject(kind, n) {
                Ok(detail) => (Verdict::Pass, detail),
                Err(FaultFailure::CannotInject(why)) => {
                    gave_up.insert(kind);
                    (Verdict::Pending, why)
                }
                Err(FaultFailure::Broke(why)) => (Verdict::Fail, why),
            };
            self.faults.push(FaultRecord {
                kind,
                at_ms,
                took_ms: (started.elapsed().as_millis() as u64).saturating_sub(at_ms),
                verdict,
                detail,
            });
            let next = Instant::now() + FAULT_GAP;
            if next >= faults_end {
                break;
            }
            sleep_until(next);
        }
    }

    fn admin(&self) -> Result<postgres::Client, String> {
        let server = parse_postgres(&self.opts.pg_url).map_err(|e| e.to_string())?;
        pg::connect_as(&server, pg::SessionRole::Admin).map_err(|e| e.to_string())
    }

    fn db_name(&self) -> String {
        self.db
            .pg()
            .map(|d| d.name().to_string())
            .unwrap_or_default()
    }

    fn inject(&mut self, kind: FaultKind, n: usize) -> Result<String, FaultFailure> {
        match kind {
            FaultKind::KillService => {
                let index = n % 2;
                let name = self.specs[index].name.clone();
                let Some(pid) = self.services.kill(index) else {
                    return Err(FaultFailure::Broke(format!("{name} was not running")));
                };
                std::thread::sleep(KILL_DOWN);
                let back = Instant::now();
                self.services
                    .restart(index, &self.specs[index], &self.exe, &self.db_url)
                    .map_err(|e| FaultFailure::Broke(format!("killed {name}; {e}")))?;
                Ok(format!(
                    "SIGKILL to {name} (pid {pid}); down {} ms, ready again {} ms after its start",
                    KILL_DOWN.as_millis(),
                    back.elapsed().as_millis()
                ))
            }
            FaultKind::TerminateBackends => {
                let n = self.terminate_all().map_err(FaultFailure::CannotInject)?;
                Ok(format!(
                    "pg_terminate_backend of {n} sessions of the scratch database"
                ))
            }
            FaultKind::StatementTimeout => self.statement_timeout(),
            FaultKind::RestartPostgres => {
                let began = Instant::now();
                crate::faults::restart_local_cluster(&self.opts.pg_url)
                    .map_err(|e| FaultFailure::CannotInject(e.to_string()))?;
                let back = self.wait_for_postgres();
                Ok(format!(
                    "pg_ctlcluster restart took {} ms; {back}",
                    began.elapsed().as_millis()
                ))
            }
        }
    }

    /// Terminates every session of the scratch database; returns how many.
    fn terminate_all(&self) -> Result<i64, String> {
        let mut admin = self.admin()?;
        admin
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE datname = $1 AND pid <> pg_backend_pid()",
                &[&self.db_name()],
            )
            .and_then(|r| r.try_get::<_, i64>(0))
            .map_err(|e| e.to_string())
    }

    fn statement_timeout(&mut self) -> Result<String, FaultFailure> {
        let name = self.db_name();
        let ms = self.opts.statement_timeout.as_millis().max(1);
        let mut admin = self.admin().map_err(FaultFailure::CannotInject)?;
        // The name is ours (`tf_soak_…`, lowercase letters, digits and `_`): quoted as is.
        admin
            .batch_execute(&format!(
                "ALTER DATABASE \"{name}\" SET statement_timeout = '{ms}ms'"
            ))
            .map_err(|e| FaultFailure::CannotInject(e.to_string()))?;
        let cut_at_start = self.terminate_all().unwrap_or(0);
        std::thread::sleep(self.opts.hold());
        let reset = admin
            .batch_execute(&format!(
                "ALTER DATABASE \"{name}\" RESET statement_timeout"
            ))
            .and_then(|()| admin.query_one("SELECT clock_timestamp()", &[]))
            .and_then(|r| r.try_get::<_, chrono::DateTime<chrono::Utc>>(0));
        let reset_at = match reset {
            Ok(t) => t,
            Err(e) => {
                return Err(FaultFailure::Broke(format!(
                    "could not reset statement_timeout on {name}: {e}"
                )))
            }
        };
        // Sessions opened under the timeout keep it: terminate them (the pools reconnect
        // without it), but leave one that stays in an aborted transaction alone, so the
        // checks see whether the service ever recovers it. A session only passing through
        // that state is caught on a later round.
        let mut cut_at_reset = 0i64;
        let mut left: Vec<(i32, String)> = Vec::new();
        for round in 0..20 {
            if round > 0 {
                std::thread::sleep(Duration::from_millis(50));
            }
            let cut = admin
                .query(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE datname = $1 AND pid <> pg_backend_pid() AND backend_start < $2 \
                     AND state IS DISTINCT FROM 'idle in transaction' \
                     AND state IS DISTINCT FROM 'idle in transaction (aborted)'",
                    &[&name, &reset_at],
                )
                .map_err(|e| FaultFailure::Broke(format!("terminate after the reset: {e}")))?;
            cut_at_reset += cut.len() as i64;
            let remaining = admin
                .query(
                    "SELECT pid, coalesce(state, '') FROM pg_stat_activity WHERE datname = $1 \
                     AND pid <> pg_backend_pid() AND backend_start < $2",
                    &[&name, &reset_at],
                )
                .map_err(|e| FaultFailure::Broke(format!("read sessions after the reset: {e}")))?;
            left = remaining
                .iter()
                .filter_map(|r| Some((r.try_get(0).ok()?, r.try_get(1).ok()?)))
                .collect();
            if left.is_empty() {
                break;
            }
        }
        let left_text = if left.is_empty() {
            String::new()
        } else {
            format!(
                "; {} session(s) still in a transaction after 1 s, left alone on purpose: {left:?}",
                left.len()
            )
        };
        Ok(format!(
            "statement_timeout = {ms} ms on the scratch database for {} ms; {cut_at_start} sessions terminated to pick it up, {cut_at_reset} after the reset{left_text}",
            self.opts.hold().as_millis()
        ))
    }

    /// Waits (bounded by [`SETTLE_TIMEOUT`]) until the server accepts a connection again.
    fn wait_for_postgres(&self) -> String {
        let began = Instant::now();
        while began.elapsed() < SETTLE_TIMEOUT {
            if self.admin().is_ok() {
                return format!("accepting again after {} ms", began.elapsed().as_millis());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        format!(
            "still not accepting connections after {} s",
            SETTLE_TIMEOUT.as_secs()
        )
    }

    /// After the traffic: a service that is down is started again, then both must answer
    /// `/healthz` within [`SETTLE_TIMEOUT`]; what did not is kept for the evidence.
    fn settle(&mut self) {
        let began = Instant::now();
        let mut problems = Vec::new();
        for index in 0..self.specs.len() {
            if !self.services.is_running(index) {
                if let Err(e) =
                    self.services
                        .restart(index, &self.specs[index], &self.exe, &self.db_url)
                {
                    problems.push(format!(
                        "{} could not be started again: {e}",
                        self.specs[index].name
                    ));
                }
            }
        }
        for (index, base) in self.base_urls.iter().enumerate() {
            let probe = HttpRequest::new("GET", format!("{base}/healthz"));
            let ok = loop {
                match client::send(&probe, Duration::from_secs(2)) {
                    Ok(a) if a.status == 200 => break true,
                    _ if began.elapsed() > SETTLE_TIMEOUT => break false,
                    _ => std::thread::sleep(Duration::from_millis(50)),
                }
            };
            if !ok {
                problems.push(format!(
                    "{} did not answer /healthz with 200 within {} s",
                    self.specs[index].name,
                    SETTLE_TIMEOUT.as_secs()
                ));
            }
        }
        self.settle_problem = (!problems.is_empty()).then(|| problems.join("; "));
    }

    /// Judges the traffic against the database (module docs); the services are stopped and
    /// the scratch database dropped when this returns.
    pub fn finish(self, traffic: &Traffic) -> SoakReport {
        let figures = figures(traffic);
        let mut invariants = Vec::new();
        invariants.push(self.faults_injected());
        let sql_checks = match self.db.connect_postgres() {
            Ok(mut c) => check_database(&mut c, &self.tenants, &traffic.intents),
            Err(e) => {
                let why = format!("PostgreSQL unreachable after the soak: {e}");
                INVARIANTS[1..4]
                    .iter()
                    .map(|name| pending(name, &why))
                    .collect()
            }
        };
        invariants.extend(sql_checks);
        invariants.push(check_conflicts(&traffic.intents));
        invariants.push(check_gets(&traffic.intents));
        invariants.push(match self.db.connect_postgres() {
            Ok(mut c) => check_sessions(&mut c, &self.db_name()),
            Err(e) => pending(
                INVARIANTS[6],
                &format!("PostgreSQL unreachable after the soak: {e}"),
            ),
        });
        invariants.push(check_answers(&traffic.intents, traffic.faults_end_ms));
        if let Some(p) = &self.settle_problem {
            // The services did not come back after the faults: the faults check says so.
            if let Some(i) = invariants.iter_mut().find(|i| i.name == INVARIANTS[0]) {
                i.verdict = Verdict::Fail;
                i.evidence = format!("{}; after the soak: {p}", i.evidence);
            }
        }
        let mut injected = BTreeMap::new();
        for f in self.faults.iter().filter(|f| f.verdict == Verdict::Pass) {
            *injected.entry(f.kind.name().to_string()).or_insert(0) += 1;
        }
        let (verdict, reason) = overall(&invariants);
        SoakReport {
            verdict,
            reason,
            implementation: self.opts.implementation.name(),
            duration_s: self.opts.duration.as_secs_f64(),
            connections: self.opts.connections,
            tenants: self.opts.tenants,
            seed: self.opts.seed,
            faults_requested: self.kinds.clone(),
            faults_injected: injected,
            faults: self.faults.clone(),
            figures,
            invariants,
            alongside: None,
        }
    }

    fn faults_injected(&self) -> InvariantResult {
        judge_faults(&self.kinds, &self.faults)
    }
}

enum FaultFailure {
    /// The fault cannot be injected here (PENDING).
    CannotInject(String),
    /// Injecting it broke something it should not have (FAIL).
    Broke(String),
}

/// The faults check: FAIL when injecting one broke something, PENDING when a requested kind
/// was never injected (it cannot be here, or the window was too short), else PASS.
fn judge_faults(kinds: &[FaultKind], faults: &[FaultRecord]) -> InvariantResult {
    let name = INVARIANTS[0];
    if kinds.is_empty() {
        return pass(name, "none requested (a fault-free soak)".into());
    }
    let broke: Vec<String> = faults
        .iter()
        .filter(|f| f.verdict == Verdict::Fail)
        .map(|f| format!("{}: {}", f.kind, f.detail))
        .collect();
    if !broke.is_empty() {
        return fail(name, broke.join("; "));
    }
    let counts: Vec<String> = kinds
        .iter()
        .map(|k| {
            let n = faults
                .iter()
                .filter(|f| f.kind == *k && f.verdict == Verdict::Pass)
                .count();
            format!("{k} ×{n}")
        })
        .collect();
    let missing: Vec<String> = kinds
        .iter()
        .filter(|k| {
            !faults
                .iter()
                .any(|f| f.kind == **k && f.verdict == Verdict::Pass)
        })
        .map(|k| {
            match faults
                .iter()
                .find(|f| f.kind == *k && f.verdict == Verdict::Pending)
            {
                Some(f) => format!("{k}: {}", f.detail),
                None => format!("{k}: no time left in the fault window (run longer)"),
            }
        })
        .collect();
    if missing.is_empty() {
        pass(name, counts.join(", "))
    } else {
        pending(name, &format!("not injected: {}", missing.join("; ")))
    }
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

fn pass(name: &'static str, evidence: String) -> InvariantResult {
    InvariantResult {
        name,
        verdict: Verdict::Pass,
        evidence,
    }
}

fn fail(name: &'static str, evidence: String) -> InvariantResult {
    InvariantResult {
        name,
        verdict: Verdict::Fail,
        evidence,
    }
}

fn pending(name: &'static str, why: &str) -> InvariantResult {
    InvariantResult {
        name,
        verdict: Verdict::Pending,
        evidence: why.to_string(),
    }
}

fn overall(invariants: &[InvariantResult]) -> (Verdict, Option<String>) {
    let named = |v: Verdict| -> Vec<&str> {
        invariants
            .iter()
            .filter(|i| i.verdict == v)
            .map(|i| i.name)
            .collect()
    };
    let failed = named(Verdict::Fail);
    if !failed.is_empty() {
        return (
            Verdict::Fail,
            Some(format!("failed: {}", failed.join(", "))),
        );
    }
    let pend = named(Verdict::Pending);
    if !pend.is_empty() {
        let why: Vec<String> = invariants
            .iter()
            .filter(|i| i.verdict == Verdict::Pending)
            .map(|i| format!("{}: {}", i.name, i.evidence))
            .collect();
        return (Verdict::Pending, Some(why.join("; ")));
    }
    (Verdict::Pass, None)
}

/// At most three examples, then how many more.
fn examples(items: &[String]) -> String {
    let shown: Vec<&str> = items.iter().take(3).map(String::as_str).collect();
    if items.len() > 3 {
        format!("{} (and {} more)", shown.join("; "), items.len() - 3)
    } else {
        shown.join("; ")
    }
}

struct Shared<'a> {
    base_urls: &'a [String],
    tenants: usize,
    tenant_names: &'a [String],
    hot: &'a Mutex<Option<Hot>>,
    started: Instant,
    traffic_end: Instant,
    hard_end: Instant,
}

struct Hot {
    tenant: usize,
    key: String,
    body: u64,
    uses_left: u32,
}

/// One client connection: sends intents one at a time until the traffic ends.
fn client_loop(index: usize, seed: u64, shared: &Shared<'_>) -> Vec<Intent> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut intents: Vec<Intent> = Vec::new();
    // Own creates (intent index) and own acknowledged ids (tenant, id, intent index).
    let mut creates: Vec<usize> = Vec::new();
    let mut acked: Vec<(usize, Uuid, usize)> = Vec::new();
    let mut n = 0u64;
    while Instant::now() < shared.traffic_end {
        n += 1;
        let roll: u32 = rng.gen_range(0..100);
        let mut intent = match roll {
            0..=29 => None,
            30..=44 if !creates.is_empty() => {
                let i = intents_pick(&mut rng, &creates);
                let o = &intents[i];
                Some(Intent {
                    op: Op::Retry,
                    tenant: o.tenant,
                    key: o.key.clone(),
                    body: o.body,
                    get: None,
                    attempts: Vec::new(),
                })
            }
            45..=64 => {
                let mut hot = shared.hot.lock().unwrap_or_else(|p| p.into_inner());
                let fresh = !matches!(hot.as_ref(), Some(h) if h.uses_left > 0);
                if fresh {
                    let tenant = rng.gen_range(0..shared.tenants);
                    *hot = Some(Hot {
                        tenant,
                        key: format!("hot-c{index}-{n}"),
                        body: rng.gen_range(0..1_000_000),
                        uses_left: CONTESTED_USES,
                    });
                }
                hot.as_mut().map(|h| {
                    h.uses_left -= 1;
                    Intent {
                        op: Op::Contested,
                        tenant: h.tenant,
                        key: h.key.clone(),
                        body: h.body,
                        get: None,
                        attempts: Vec::new(),
                    }
                })
            }
            65..=74 if !acked.is_empty() => {
                let (_, _, i) = acked[rng.gen_range(0..acked.len())];
                let o = &intents[i];
                Some(Intent {
                    op: Op::Conflict,
                    tenant: o.tenant,
                    key: o.key.clone(),
                    body: o.body,
                    get: None,
                    attempts: Vec::new(),
                })
            }
            75..=99 if !acked.is_empty() => {
                let (tenant, id, _) = acked[rng.gen_range(0..acked.len())];
                let other = roll >= 95 && shared.tenants > 1;
                let asked = if other {
                    (tenant + rng.gen_range(1..shared.tenants)) % shared.tenants
                } else {
                    tenant
                };
                Some(Intent {
                    op: if other { Op::GetOtherTenant } else { Op::Get },
                    tenant: asked,
                    key: String::new(),
                    body: 0,
                    get: Some((id, tenant)),
                    attempts: Vec::new(),
                })
            }
            _ => None,
        }
        .unwrap_or_else(|| Intent {
            op: Op::New,
            tenant: rng.gen_range(0..shared.tenants),
            key: format!("k-c{index}-{n}"),
            body: rng.gen_range(0..1_000_000),
            get: None,
            attempts: Vec::new(),
        });
        send_intent(&mut rng, shared, &mut intent);
        let position = intents.len();
        if intent.op == Op::New {
            creates.push(position);
        }
        if matches!(intent.op, Op::New | Op::Retry) {
            if let Some(id) = intent
                .last()
                .filter(|a| a.status == Some(201))
                .and_then(|a| a.id)
            {
                if !acked.iter().any(|(_, known, _)| *known == id) {
                    acked.push((intent.tenant, id, position));
                }
            }
        }
        intents.push(intent);
    }
    intents
}

fn intents_pick(rng: &mut StdRng, creates: &[usize]) -> usize {
    creates[rng.gen_range(0..creates.len())]
}

/// Sends `intent` until it gets an answer other than 503, or [`MAX_ATTEMPTS`] run out,
/// alternating services, recording each attempt.
fn send_intent(rng: &mut StdRng, shared: &Shared<'_>, intent: &mut Intent) {
    let first_service = rng.gen_range(0..shared.base_urls.len());
    let tenant = &shared.tenant_names[intent.tenant];
    for attempt in 0..MAX_ATTEMPTS {
        let base = &shared.base_urls[(first_service + attempt as usize) % shared.base_urls.len()];
        let request = match intent.get {
            Some((id, _)) => HttpRequest::new("GET", format!("{base}/v1/tickets/{id}"))
                .with_header(TENANT_HEADER, tenant.as_str()),
            None => HttpRequest::new("POST", format!("{base}/v1/tickets"))
                .with_header(KEY_HEADER, intent.key.as_str())
                .with_header(TENANT_HEADER, tenant.as_str())
                .with_header("content-type", "application/json")
                .with_body(body_json(intent.body, intent.op == Op::Conflict)),
        };
        let at_ms = shared.started.elapsed().as_millis() as u64;
        let began = Instant::now();
        let result = client::send(&request, REQUEST_TIMEOUT);
        let latency = began.elapsed();
        let (record, retry_after) = match result {
            Ok(answer) => {
                let json: Option<serde_json::Value> = serde_json::from_slice(&answer.body).ok();
                let id = json
                    .as_ref()
                    .and_then(|j| j.get("id"))
                    .and_then(|v| v.as_str())
                    .and_then(|s| Uuid::parse_str(s).ok());
                let detail = (answer.status >= 500)
                    .then(|| {
                        json.as_ref()
                            .and_then(|j| j.get("detail"))
                            .and_then(|v| v.as_str())
                            .map(|s| s.chars().take(200).collect::<String>())
                    })
                    .flatten();
                let retry_after = answer
                    .header("retry-after")
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .map(Duration::from_secs);
                (
                    Attempt {
                        status: Some(answer.status),
                        error: None,
                        latency,
                        at_ms,
                        id,
                        detail,
                    },
                    retry_after,
                )
            }
            Err(e) => (
                Attempt {
                    status: None,
                    error: Some(if e.is_transport() {
                        e.to_string()
                    } else {
                        format!("not a transport error: {e}")
                    }),
                    latency,
                    at_ms,
                    id: None,
                    detail: None,
                },
                None,
            ),
        };
        let again = match (&record.status, &record.error) {
            (Some(503), _) => true,
            (None, Some(e)) => !e.starts_with("not a transport error"),
            _ => false,
        };
        intent.attempts.push(record);
        if !again || attempt + 1 == MAX_ATTEMPTS || Instant::now() >= shared.hard_end {
            return;
        }
        let cap = (BASE_BACKOFF * 2u32.saturating_pow(attempt)).min(MAX_BACKOFF);
        let jittered = cap.mul_f64(rng.gen_range(0.5..1.0));
        std::thread::sleep(retry_after.map_or(jittered, |r| r.min(MAX_BACKOFF)));
    }
}

fn figures(traffic: &Traffic) -> Figures {
    let attempts: Vec<&Attempt> = traffic
        .intents
        .iter()
        .flat_map(|i| i.attempts.iter())
        .collect();
    let mut latencies: Vec<Duration> = attempts
        .iter()
        .filter(|a| a.status.is_some())
        .map(|a| a.latency)
        .collect();
    latencies.sort();
    let pct = |p: f64| -> f64 {
        if latencies.is_empty() {
            return 0.0;
        }
        let rank = ((p * latencies.len() as f64).ceil() as usize).clamp(1, latencies.len());
        latencies[rank - 1].as_secs_f64() * 1000.0
    };
    let mut answers = BTreeMap::new();
    for a in &attempts {
        let k = a
            .status
            .map_or_else(|| "transport error".to_string(), |s| s.to_string());
        *answers.entry(k).or_insert(0) += 1;
    }
    let last_ms = attempts
        .iter()
        .map(|a| a.at_ms + a.latency.as_millis() as u64)
        .max()
        .unwrap_or(0);
    let elapsed_s = (last_ms as f64 / 1000.0).max(0.001);
    let gave_up = traffic
        .intents
        .iter()
        .filter(|i| {
            i.last()
                .is_some_and(|a| a.status.is_none() || a.status == Some(503))
        })
        .count();
    let round = |x: f64| (x * 10.0).round() / 10.0;
    Figures {
        requests: attempts.len(),
        intents: traffic.intents.len(),
        retries: attempts.len().saturating_sub(traffic.intents.len()),
        gave_up,
        elapsed_s: round(elapsed_s),
        req_per_s: round(attempts.len() as f64 / elapsed_s),
        p50_ms: round(pct(0.50)),
        p99_ms: round(pct(0.99)),
        answers,
    }
}

/// The three SQL checks over the rows: counts per tenant, 201 ids present, one id per key.
fn check_database(
    client: &mut postgres::Client,
    tenants: &[String],
    intents: &[Intent],
) -> Vec<InvariantResult> {
    match database_checks(client, tenants, intents) {
        Ok(v) => v,
        Err(e) => {
            let why = format!("could not read the rows: {e}");
            INVARIANTS[1..4]
                .iter()
                .map(|name| pending(name, &why))
                .collect()
        }
    }
}

fn database_checks(
    client: &mut postgres::Client,
    tenants: &[String],
    intents: &[Intent],
) -> Result<Vec<InvariantResult>, SoakError> {
    let count_by_tenant = |client: &mut postgres::Client, sql_text: &str| {
        client
            .query(sql_text, &[&tenants])
            .map_err(sql("count rows per tenant"))
            .map(|rows| {
                rows.iter()
                    .filter_map(|r| {
                        Some((
                            r.try_get::<_, String>(0).ok()?,
                            r.try_get::<_, i64>(1).ok()?,
                        ))
                    })
                    .collect::<HashMap<String, i64>>()
            })
    };
    let tickets = count_by_tenant(
        client,
        "SELECT tenant_id, count(*) FROM tickets WHERE tenant_id = ANY($1) GROUP BY tenant_id",
    )?;
    let receipts = count_by_tenant(
        client,
        "SELECT tenant_id, count(*) FROM idempotency_receipts WHERE tenant_id = ANY($1) \
         GROUP BY tenant_id",
    )?;
    let events = count_by_tenant(
        client,
        "SELECT tenant_id, count(*) FROM outbox_events WHERE tenant_id = ANY($1) \
         AND event_type = 'ticket.created' GROUP BY tenant_id",
    )?;
    let mut out = Vec::new();

    // 1. tickets = receipts = created events, per tenant.
    let mut unequal = Vec::new();
    let (mut t_all, mut r_all, mut e_all) = (0, 0, 0);
    for t in tenants {
        let (a, b, c) = (
            tickets.get(t).copied().unwrap_or(0),
            receipts.get(t).copied().unwrap_or(0),
            events.get(t).copied().unwrap_or(0),
        );
        t_all += a;
        r_all += b;
        e_all += c;
        if a != b || b != c {
            unequal.push(format!(
                "{t}: {a} tickets, {b} receipts, {c} ticket.created events"
            ));
        }
    }
    out.push(if unequal.is_empty() {
        pass(
            INVARIANTS[1],
            format!(
                "{} tenants: {t_all} tickets = {r_all} receipts = {e_all} ticket.created events",
                tenants.len()
            ),
        )
    } else {
        fail(INVARIANTS[1], examples(&unequal))
    });

    // 2. every id answered with 201 exists in its tenant.
    let mut answered: BTreeMap<usize, HashSet<Uuid>> = BTreeMap::new();
    for i in intents.iter().filter(|i| i.op.is_create()) {
        for a in i.attempts.iter().filter(|a| a.status == Some(201)) {
            if let Some(id) = a.id {
                answered.entry(i.tenant).or_default().insert(id);
            }
        }
    }
    let mut missing = Vec::new();
    let mut total = 0usize;
    for (tenant, ids) in &answered {
        let ids: Vec<Uuid> = ids.iter().copied().collect();
        total += ids.len();
        let found: HashSet<Uuid> = client
            .query(
                "SELECT id FROM tickets WHERE tenant_id = $1 AND id = ANY($2)",
                &[&tenants[*tenant], &ids],
            )
            .map_err(sql("look up answered ids"))?
            .iter()
            .filter_map(|r| r.try_get(0).ok())
            .collect();
        for id in ids.iter().filter(|id| !found.contains(id)) {
            missing.push(format!("{id} (answered 201 to {})", tenants[*tenant]));
        }
    }
    out.push(if missing.is_empty() {
        pass(
            INVARIANTS[2],
            format!("{total} ids answered with 201, every one found in its tenant"),
        )
    } else {
        fail(
            INVARIANTS[2],
            format!(
                "{} of {total} missing: {}",
                missing.len(),
                examples(&missing)
            ),
        )
    });

    // 3. one id per key across every answer and receipt.
    let mut per_key: BTreeMap<(usize, &str), (HashSet<Uuid>, usize)> = BTreeMap::new();
    for i in intents.iter().filter(|i| i.op.is_create()) {
        let e = per_key.entry((i.tenant, i.key.as_str())).or_default();
        for a in i.attempts.iter().filter(|a| a.status == Some(201)) {
            if let Some(id) = a.id {
                e.0.insert(id);
            }
        }
        e.1 += usize::from(i.last().is_some_and(|a| a.status == Some(201)));
    }
    let mut stored: HashMap<(usize, String), Vec<Uuid>> = HashMap::new();
    for (t, tenant) in tenants.iter().enumerate() {
        for row in client
            .query(
                "SELECT idempotency_key, ticket_id FROM idempotency_receipts WHERE tenant_id = $1",
                &[tenant],
            )
            .map_err(sql("read receipts"))?
        {
            let (Ok(key), Ok(id)) = (row.try_get::<_, String>(0), row.try_get::<_, Uuid>(1)) else {
                continue;
            };
            stored.entry((t, key)).or_default().push(id);
        }
    }
    let mut split = Vec::new();
    let mut retried = 0usize;
    for ((tenant, key), (ids, acks)) in &per_key {
        let receipts = stored
            .get(&(*tenant, key.to_string()))
            .cloned()
            .unwrap_or_default();
        retried += usize::from(*acks > 1);
        let mut all: HashSet<Uuid> = ids.clone();
        all.extend(receipts.iter().copied());
        let lost = !ids.is_empty() && receipts.is_empty();
        if all.len() > 1 || receipts.len() > 1 || lost {
            split.push(format!(
                "{}/{key}: answered {} id(s), {} receipt(s), {} distinct id(s)",
                tenants[*tenant],
                ids.len(),
                receipts.len(),
                all.len()
            ));
        }
    }
    out.push(if split.is_empty() {
        pass(
            INVARIANTS[3],
            format!(
                "{} keys ({retried} answered 201 more than once): one id each, in the answers and the receipts",
                per_key.len()
            ),
        )
    } else {
        fail(
            INVARIANTS[3],
            format!("{} keys split: {}", split.len(), examples(&split)),
        )
    });
    Ok(out)
}

fn check_conflicts(intents: &[Intent]) -> InvariantResult {
    let name = INVARIANTS[4];
    let mut judged = 0usize;
    let mut wrong = Vec::new();
    for i in intents.iter().filter(|i| i.op == Op::Conflict) {
        match i.last().and_then(|a| a.status) {
            Some(409) => judged += 1,
            Some(201) => {
                judged += 1;
                wrong.push(format!("{} with another body: 201", i.key));
            }
            // 500s and unanswered ones are judged by the answers check.
            _ => {}
        }
    }
    if !wrong.is_empty() {
        fail(
            name,
            format!(
                "{} of {judged} conflicts answered 201: {}",
                wrong.len(),
                examples(&wrong)
            ),
        )
    } else if judged == 0 {
        pending(name, "no conflict was answered (run longer)")
    } else {
        pass(name, format!("{judged} conflicts, every one 409"))
    }
}

fn check_gets(intents: &[Intent]) -> InvariantResult {
    let name = INVARIANTS[5];
    let (mut own, mut other) = (0usize, 0usize);
    let mut wrong = Vec::new();
    for i in intents.iter().filter(|i| !i.op.is_create()) {
        let Some((id, _)) = i.get else { continue };
        let Some(a) = i.last() else { continue };
        match (i.op, a.status) {
            (Op::Get, Some(200)) if a.id == Some(id) => own += 1,
            (Op::Get, Some(s @ (200 | 404))) => {
                own += 1;
                wrong.push(format!("GET {id} in its tenant: {s}"));
            }
            (Op::GetOtherTenant, Some(404)) => other += 1,
            (Op::GetOtherTenant, Some(s @ 200)) => {
                other += 1;
                wrong.push(format!("GET {id} from another tenant: {s}"));
            }
            _ => {}
        }
    }
    if !wrong.is_empty() {
        fail(
            name,
            format!(
                "{} of {} GETs wrong: {}",
                wrong.len(),
                own + other,
                examples(&wrong)
            ),
        )
    } else if own == 0 {
        pending(name, "no GET was answered (run longer)")
    } else {
        pass(
            name,
            format!("{own} GETs in their tenant answered 200 with the id, {other} from another tenant 404"),
        )
    }
}

fn check_answers(intents: &[Intent], faults_end_ms: u64) -> InvariantResult {
    let name = INVARIANTS[7];
    let mut five_hundreds = 0usize;
    let mut in_tail = 0usize;
    let mut first_detail: Option<String> = None;
    let mut unexpected: BTreeMap<String, usize> = BTreeMap::new();
    for i in intents {
        for a in &i.attempts {
            let Some(s) = a.status else {
                if let Some(e) = a
                    .error
                    .as_ref()
                    .filter(|e| e.starts_with("not a transport"))
                {
                    *unexpected.entry(e.clone()).or_insert(0) += 1;
                }
                continue;
            };
            let expected = match i.op {
                Op::New | Op::Retry | Op::Contested => s == 201,
                Op::Conflict => s == 409 || s == 201,
                Op::Get | Op::GetOtherTenant => s == 200 || s == 404,
            };
            if s == 500 {
                five_hundreds += 1;
                in_tail += usize::from(a.at_ms >= faults_end_ms);
                if first_detail.is_none() {
                    first_detail = a.detail.clone();
                }
            } else if !(expected || s == 503) {
                *unexpected.entry(format!("{s} to {:?}", i.op)).or_insert(0) += 1;
            }
        }
    }
    let total: usize = intents.iter().map(|i| i.attempts.len()).sum();
    if five_hundreds == 0 && unexpected.is_empty() {
        return pass(
            name,
            format!("{total} answers: no 500, no unexpected status"),
        );
    }
    let mut parts = Vec::new();
    if five_hundreds > 0 {
        parts.push(format!(
            "{five_hundreds} answers 500 ({in_tail} of them in the fault-free tail){}",
            first_detail
                .map(|d| format!(", the first: {d:?}"))
                .unwrap_or_default()
        ));
    }
    for (what, n) in &unexpected {
        parts.push(format!("{n} × {what}"));
    }
    fail(name, parts.join("; "))
}

/// Reads the sessions of database `dbname` (other than this one) that are in a transaction;
/// one seen there on every read over about two seconds is left in a transaction (its negative
/// control plants an aborted session: `tests/integration/soak.rs`).
fn check_sessions(client: &mut postgres::Client, dbname: &str) -> InvariantResult {
    let name = INVARIANTS[6];
    let read =
        |client: &mut postgres::Client| -> Result<Vec<(i32, String, String)>, postgres::Error> {
            Ok(client
                .query(
                    "SELECT pid, state, left(coalesce(query, ''), 120) FROM pg_stat_activity \
                 WHERE datname = $1 AND pid <> pg_backend_pid() \
                 AND state IN ('idle in transaction', 'idle in transaction (aborted)')",
                    &[&dbname],
                )?
                .iter()
                .filter_map(|r| Some((r.try_get(0).ok()?, r.try_get(1).ok()?, r.try_get(2).ok()?)))
                .collect())
        };
    let mut seen = match read(client) {
        Ok(s) => s,
        Err(e) => return pending(name, &format!("could not read pg_stat_activity: {e}")),
    };
    let total = client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
            &[&dbname],
        )
        .and_then(|r| r.try_get::<_, i64>(0))
        .unwrap_or(0);
    // A session only passing through (a request still finishing) leaves within a moment; a
    // stuck one stays. Re-read until none is left or 20 reads (100 ms apart) agree.
    for _ in 0..20 {
        if seen.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        let now = match read(client) {
            Ok(s) => s,
            Err(e) => return pending(name, &format!("could not read pg_stat_activity: {e}")),
        };
        seen.retain(|(pid, _, _)| now.iter().any(|(p, _, _)| p == pid));
    }
    if seen.is_empty() {
        pass(
            name,
            format!("{total} sessions of the scratch database, none in a transaction"),
        )
    } else {
        let list: Vec<String> = seen
            .iter()
            .map(|(pid, state, query)| format!("pid {pid} {state} (last statement: {query:?})"))
            .collect();
        fail(
            name,
            format!(
                "{} of {total} sessions stayed in a transaction for 2 s: {}",
                seen.len(),
                examples(&list)
            ),
        )
    }
}

impl std::fmt::Debug for Soak {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Soak")
            .field("db", &self.db)
            .field("services", &self.base_urls)
            .field("pg_url", &redact(&self.opts.pg_url))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(status: u16, at_ms: u64) -> Attempt {
        Attempt {
            status: Some(status),
            error: None,
            latency: Duration::from_millis(1),
            at_ms,
            id: None,
            detail: Some("boom".into()),
        }
    }

    fn intent(op: Op, statuses: &[u16]) -> Intent {
        Intent {
            op,
            tenant: 0,
            key: "k".into(),
            body: 0,
            get: None,
            attempts: statuses.iter().map(|s| attempt(*s, 10)).collect(),
        }
    }

    #[test]
    fn a_500_or_an_unexpected_status_fails_the_answers_check() {
        let ok = [intent(Op::New, &[503, 201]), intent(Op::Conflict, &[409])];
        assert_eq!(check_answers(&ok, 5).verdict, Verdict::Pass);
        let bad = [intent(Op::New, &[500])];
        let r = check_answers(&bad, 5);
        assert_eq!(r.verdict, Verdict::Fail);
        assert!(
            r.evidence.contains("1 of them in the fault-free tail"),
            "{}",
            r.evidence
        );
        let odd = [intent(Op::New, &[422])];
        assert_eq!(check_answers(&odd, 5).verdict, Verdict::Fail);
    }

    #[test]
    fn a_conflict_answered_201_fails_and_none_answered_is_pending() {
        assert_eq!(
            check_conflicts(&[intent(Op::Conflict, &[409])]).verdict,
            Verdict::Pass
        );
        assert_eq!(
            check_conflicts(&[intent(Op::Conflict, &[201])]).verdict,
            Verdict::Fail
        );
        assert_eq!(
            check_conflicts(&[intent(Op::Conflict, &[503])]).verdict,
            Verdict::Pending
        );
    }

    #[test]
    fn a_get_of_an_acknowledged_id_answered_404_or_leaked_to_another_tenant_fails() {
        let id = Uuid::new_v4();
        let get = |op, status| {
            let mut i = intent(op, &[status]);
            i.get = Some((id, 0));
            i.attempts[0].id = (status == 200).then_some(id);
            i
        };
        assert_eq!(
            check_gets(&[get(Op::Get, 200), get(Op::GetOtherTenant, 404)]).verdict,
            Verdict::Pass
        );
        assert_eq!(check_gets(&[get(Op::Get, 404)]).verdict, Verdict::Fail);
        assert_eq!(
            check_gets(&[get(Op::Get, 200), get(Op::GetOtherTenant, 200)]).verdict,
            Verdict::Fail
        );
    }

    #[test]
    fn options_out_of_bounds_or_off_loopback_are_refused() {
        let ok = SoakOptions::new("postgres://postgres@127.0.0.1:5432/postgres");
        assert!(ok.validate().is_ok());
        for bad in [
            SoakOptions {
                connections: 0,
                ..ok.clone()
            },
            SoakOptions {
                duration: Duration::from_secs(3600),
                ..ok.clone()
            },
            SoakOptions {
                tenants: 1000,
                ..ok.clone()
            },
            SoakOptions {
                pg_url: "postgres://postgres@db.example.com/postgres".into(),
                ..ok.clone()
            },
        ] {
            assert!(matches!(bad.validate(), Err(SoakError::Options(_))));
        }
    }

    fn record(kind: FaultKind, verdict: Verdict) -> FaultRecord {
        FaultRecord {
            kind,
            at_ms: 0,
            took_ms: 0,
            verdict,
            detail: "needs a local Debian cluster".into(),
        }
    }

    #[test]
    fn a_requested_fault_that_never_ran_is_pending_and_one_that_broke_fails() {
        use FaultKind::*;
        let done = [record(KillService, Verdict::Pass)];
        assert_eq!(judge_faults(&[KillService], &done).verdict, Verdict::Pass);
        assert_eq!(judge_faults(&[], &[]).verdict, Verdict::Pass);
        // Requested, never injected: no time left, or the restart cannot happen here.
        let r = judge_faults(&[KillService, TerminateBackends], &done);
        assert_eq!(r.verdict, Verdict::Pending);
        assert!(r.evidence.contains("no time left"), "{}", r.evidence);
        let gated = [record(RestartPostgres, Verdict::Pending)];
        let r = judge_faults(&[RestartPostgres], &gated);
        assert_eq!(r.verdict, Verdict::Pending);
        assert!(r.evidence.contains("local"), "{}", r.evidence);
        let broke = [record(KillService, Verdict::Fail)];
        assert_eq!(judge_faults(&[KillService], &broke).verdict, Verdict::Fail);
    }

    #[test]
    fn a_pending_check_makes_the_soak_pending_and_a_failing_one_fail() {
        let checks = [pass(INVARIANTS[1], "x".into()), pending(INVARIANTS[4], "y")];
        assert_eq!(overall(&checks).0, Verdict::Pending);
        let checks = [fail(INVARIANTS[1], "x".into()), pending(INVARIANTS[4], "y")];
        assert_eq!(overall(&checks).0, Verdict::Fail);
    }
}
