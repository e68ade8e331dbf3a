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
use crate::scratch::{ScratchDb, ScratchError};
use crate::verdict::{Check, Verdict};
use ticketflow_core::store::postgres as pg;
use ticketflow_core::store::url::PgServer;
use ticketflow_core::variants::Implementation;
use ticketflow_core::wire::{KEY_HEADER, TENANT_HEADER};

mod checks;
mod faults;
mod report;
mod traffic;

use checks::*;
use faults::*;

pub use traffic::*;

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
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
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
    pub pg: PgServer,
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
    pub fn new(pg: PgServer) -> Self {
        SoakOptions {
            pg,
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
        crate::bench::require_loopback(&self.pg).map_err(|e| SoakError::Options(e.to_string()))
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
        source: ticketflow_core::StoreError,
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
    #[serde(serialize_with = "crate::verdict::json::verdicts")]
    pub invariants: Vec<Check>,
    /// What else ran on the machine at the same time (`verify` runs its soak beside the kill
    /// matrix and the fault cases), so the figures are not the soak's alone; `None`: it ran
    /// alone.
    pub alongside: Option<String>,
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
        Err(e) => match crate::shortage::Shortage::in_text(&e.to_string()) {
            Some(short) => SoakReport::pending(opts, short.reason(&e.to_string())),
            None => SoakReport::not_run(opts, Verdict::Fail, e.to_string()),
        },
    }
}

/// A soak in progress: the scratch database and the two services. [`run`] is start, drive,
/// finish; the stages are public so a test can change the database between drive and finish
/// (a planted fault each check must catch).
pub struct Soak {
    opts: SoakOptions,
    kinds: Vec<FaultKind>,
    db: ScratchDb,
    specs: Vec<ServiceSpec>,
    services: Services,
    base_urls: Vec<String>,
    tenants: Vec<String>,
    faults: Vec<FaultRecord>,
    settle_problem: Option<String>,
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
        let db = ScratchDb::postgres(&opts.pg, "soak")?;
        if let Some(sql) = opts
            .implementation
            .schema_sql(ticketflow_core::store::Backend::Postgres)
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
        let pool = opts.service_pool();
        let specs: Vec<ServiceSpec> = ["api-a", "api-b"]
            .into_iter()
            .map(|name| {
                let command = crate::argv::ServeArgs::new()
                    .pool_size(pool)
                    .pool_timeout_ms(2000)
                    .shutdown_grace_ms(500)
                    .implementation(opts.implementation)
                    .into_vec();
                ServiceSpec {
                    name: name.into(),
                    command,
                    ready_path: "/healthz".into(),
                    ready_timeout_ms: 15_000,
                    env: Default::default(),
                }
            })
            .collect();
        let services = Services::start(&specs, &exe, &db_url, None)?;
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

    /// After the traffic: a service that is down is started again, then both must answer
    /// `/healthz` within [`SETTLE_TIMEOUT`]; what did not is kept for the evidence.
    fn settle(&mut self) {
        let began = Instant::now();
        let mut problems = Vec::new();
        for index in 0..self.specs.len() {
            if !self.services.is_running(index) {
                if let Err(e) = self.services.restart(index) {
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
                    .map(|name| Check::pending(name, &why))
                    .collect()
            }
        };
        invariants.extend(sql_checks);
        invariants.push(check_conflicts(&traffic.intents));
        invariants.push(check_gets(&traffic.intents));
        invariants.push(match self.db.connect_postgres() {
            Ok(mut c) => check_sessions(&mut c, &self.db_name()),
            Err(e) => Check::pending(
                INVARIANTS[6],
                format!("PostgreSQL unreachable after the soak: {e}"),
            ),
        });
        invariants.push(check_answers(&traffic.intents, traffic.faults_end_ms));
        if let Some(p) = &self.settle_problem {
            // The services did not come back after the faults: the faults check says so.
            if let Some(i) = invariants.iter_mut().find(|i| i.name == INVARIANTS[0]) {
                i.verdict = Verdict::Fail;
                i.detail = format!("{}; after the soak: {p}", i.detail);
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

    fn faults_injected(&self) -> Check {
        judge_faults(&self.kinds, &self.faults)
    }
}

impl std::fmt::Debug for Soak {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Soak")
            .field("db", &self.db)
            .field("services", &self.base_urls)
            .field("pg_url", &self.opts.pg.redacted())
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
            r.detail.contains("1 of them in the fault-free tail"),
            "{}",
            r.detail
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
        let ok = SoakOptions::new(
            PgServer::parse("postgres://postgres@127.0.0.1:5432/postgres").unwrap(),
        );
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
                pg: PgServer::parse("postgres://postgres@db.example.com/postgres").unwrap(),
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
        assert!(r.detail.contains("no time left"), "{}", r.detail);
        let gated = [record(RestartPostgres, Verdict::Pending)];
        let r = judge_faults(&[RestartPostgres], &gated);
        assert_eq!(r.verdict, Verdict::Pending);
        assert!(r.detail.contains("local"), "{}", r.detail);
        let broke = [record(KillService, Verdict::Fail)];
        assert_eq!(judge_faults(&[KillService], &broke).verdict, Verdict::Fail);
    }

    #[test]
    fn a_pending_check_makes_the_soak_pending_and_a_failing_one_fail() {
        let checks = [
            Check::pass(INVARIANTS[1], "x"),
            Check::pending(INVARIANTS[4], "y"),
        ];
        assert_eq!(overall(&checks).0, Verdict::Pending);
        let checks = [
            Check::fail(INVARIANTS[1], "x"),
            Check::pending(INVARIANTS[4], "y"),
        ];
        assert_eq!(overall(&checks).0, Verdict::Fail);
    }
}
