//! Runs a scenario on SQLite or PostgreSQL and collects evidence.
//!
//! PostgreSQL: each run gets its own scratch database (created, migrated, dropped afterwards,
//! also when the run fails). Each racer runs on its own connection (in a thread, or in a
//! `ticketflow worker` process); the runner records its backend pid. A controller connection
//! takes the barrier lock ([`LockMode`]): `LOCK TABLE idempotency_receipts IN ACCESS
//! EXCLUSIVE MODE` (racers held at the lookup), `… IN EXCLUSIVE MODE` (held at the receipt
//! INSERT) or a transaction-level advisory lock (held after the lookup). The runner polls
//! `pg_locks` every 10 ms until every racer pid is seen waiting on that lock (blocked by the
//! controller, per `pg_blocking_pids`), records that evidence and commits to release it.
//! Racers that do not all arrive before the deadline make the scenario FAIL with "racers
//! never reached the barrier".
//!
//! SQLite: racers share a temporary database file, each on its own connection, and meet at
//! an in-process barrier right after their first receipt lookup (before `begin` in immediate
//! mode, where the lookup already holds the write lock). This proves control flow only, not
//! PostgreSQL isolation or lock visibility.
//!
//! A `[lease]` scenario goes through the same doors (the same SQLite file or scratch database,
//! schema, setup, ground truth and checks) with another racer driver in place of the barrier:
//! the lease driver of [`super::lease`] orders its two racers around the lease event and adds
//! the `lease` check.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::capacity::{check_scenario, CapacityError};
use super::check::{barrier_check, evaluate, GroundTruth};
use super::format::{LockMode, Racer, RacerKind, Scenario};
use super::lease::LeaseDriver;
use super::observed::{Hook, HookPoint, ObservedStore};
use super::racer::{race, race_postgres, RacerRun, ADVISORY_KEY};
use super::timeline::{ms, now_us, ControllerTimes};
use super::worker::{WorkerConfig, WorkerError, WorkerProcess};
use super::{Check, Evidence, LockWait, RacerRecord, RunSetting, ScenarioRun, Verdict};
use crate::barrier::server::{gather, Among, Controller, Gathered, ServerLock, Waiter};
use crate::barrier::Barrier;
use crate::shortage::Shortage;
use ticketflow_core::error::{DbErrorKind, StoreError};
use ticketflow_core::fingerprint::Fingerprint;
use ticketflow_core::protocol::{create_ticket, CreateOptions, RetryPolicy};
use ticketflow_core::store::call::StoreCall;
use ticketflow_core::store::postgres::{self as pg, IsolationLevel, PgStore};
use ticketflow_core::store::sqlite::{SqliteConfig, SqliteStore, TxMode};
use ticketflow_core::store::url::PgServer;
use ticketflow_core::store::{Backend, Store};
use ticketflow_core::variants::Implementation;

/// The relation every PostgreSQL racer must be seen waiting on.
pub(crate) const BARRIER_RELATION: &str = "idempotency_receipts";
pub use crate::barrier::server::POLL_INTERVAL;

/// Options for a PostgreSQL run.
#[derive(Debug, Clone)]
pub struct PgOptions {
    /// Server to use; scratch databases are created there.
    pub server: PgServer,
    /// Isolation level of the racers' transactions.
    pub isolation: IsolationLevel,
    /// The create implementation the racers run (a wrong variant for the kill matrix).
    pub implementation: Implementation,
    /// Retry policy of the racers' creates.
    pub retry: RetryPolicy,
    /// SQL run in the scratch database after migrations, before setup. For negative controls
    /// (for example dropping the receipt constraint); empty in normal runs.
    pub after_migrate_sql: Vec<String>,
    /// Locks this table instead of `idempotency_receipts` (relation lock modes only). A
    /// negative control uses it to show the barrier check fails when racers are not held
    /// where the runner expects them.
    pub lock_table: Option<String>,
    /// Overrides the scenario's barrier timeout.
    pub barrier_timeout: Option<Duration>,
    /// Where a `[lease]` scenario finds Redis, and its TTL.
    pub lease: super::lease::LeaseRunOptions,
    /// The `ticketflow` binary for process racers and for `{ticketflow}` in a black-box
    /// scenario's service commands (default: the running executable).
    pub worker_exe: Option<PathBuf>,
}

impl PgOptions {
    /// Defaults for `server`: READ COMMITTED, default retry, the receipts table as barrier.
    pub fn new(server: PgServer) -> Self {
        PgOptions {
            server,
            isolation: IsolationLevel::ReadCommitted,
            implementation: Implementation::default(),
            retry: RetryPolicy::default(),
            after_migrate_sql: Vec::new(),
            lock_table: None,
            barrier_timeout: None,
            lease: super::lease::LeaseRunOptions::default(),
            worker_exe: None,
        }
    }
}

/// Options for a SQLite run; the default runs the `savepoint` protocol with the default
/// retry policy in the default SQLite configuration.
#[derive(Debug, Clone, Default)]
pub struct SqliteOptions {
    /// Journal mode, transaction mode, busy timeout.
    pub config: SqliteConfig,
    /// The create implementation the racers run.
    pub implementation: Implementation,
    /// Retry policy of the racers' creates.
    pub retry: RetryPolicy,
    /// SQL run after migrations, before setup (negative controls only).
    pub after_migrate_sql: Vec<String>,
    /// Overrides the scenario's barrier timeout.
    pub barrier_timeout: Option<Duration>,
    /// Where a `[lease]` scenario finds Redis, and its TTL.
    pub lease: super::lease::LeaseRunOptions,
}

/// The SQL to run after migrations: the implementation's schema change, then the caller's.
pub(crate) fn schema_sql(
    implementation: Implementation,
    backend: Backend,
    extra: &[String],
) -> Vec<String> {
    implementation
        .schema_sql(backend)
        .map(str::to_string)
        .into_iter()
        .chain(extra.iter().cloned())
        .collect()
}

pub(crate) fn tenants_of(scenario: &Scenario) -> BTreeSet<String> {
    let mut t: BTreeSet<String> = scenario.racers.iter().map(|r| r.tenant.clone()).collect();
    t.extend(scenario.setup.iter().map(|s| s.tenant.clone()));
    t.extend(scenario.expect.rows.keys().cloned());
    t
}

pub(crate) fn keys_of(scenario: &Scenario) -> BTreeSet<(String, String)> {
    scenario
        .racers
        .iter()
        .map(|r| (r.tenant.clone(), r.key.clone()))
        .collect()
}

/// Why a scenario run could not be carried out: the harness could not set up, race or read
/// back, as opposed to a check that failed (a finding, in the run's checks). The run is FAIL
/// with the error's `Display` as its reason.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RunError {
    /// The temporary directory of a SQLite run could not be created.
    #[error("cannot create a temporary directory: {0}")]
    TempDir(#[source] std::io::Error),
    /// A store call of the harness (connect, schema, row counts, receipts) failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A statement of the harness on the PostgreSQL setup session failed.
    #[error(transparent)]
    Sql(#[from] postgres::Error),
    /// A setup request of the scenario failed (`index` counts from 1).
    #[error("setup request {index} failed: {source}")]
    Setup {
        /// Which setup request, from 1.
        index: usize,
        /// The create's error.
        #[source]
        source: ticketflow_core::Error,
    },
    /// The controller could not take the barrier lock.
    #[error("controller could not take the barrier lock: {0}")]
    BarrierLock(#[source] StoreError),
    /// A racer's `ticketflow worker` process could not be started.
    #[error("cannot start a worker process: {0}")]
    Worker(#[source] WorkerError),
}

/// Commits the scenario's setup requests through the protocol. Returns the store calls made,
/// in order.
pub(crate) fn run_setup<S: Store + ?Sized>(
    store: &mut S,
    scenario: &Scenario,
) -> Result<Vec<StoreCall>, RunError> {
    let mut observed = ObservedStore::new(store, Vec::new());
    for (i, s) in scenario.setup.iter().enumerate() {
        create_ticket(
            &mut observed,
            &s.tenant,
            &s.key,
            &s.request,
            &CreateOptions::default(),
        )
        .map_err(|source| RunError::Setup {
            index: i + 1,
            source,
        })?;
    }
    Ok(observed.steps.into_iter().map(|s| s.call).collect())
}

fn record(
    racer: &Racer,
    pid: Option<i32>,
    run: &RacerRun,
    release: Option<Instant>,
) -> RacerRecord {
    RacerRecord {
        name: racer.name.clone(),
        tenant: racer.tenant.clone(),
        key: racer.key.clone(),
        fingerprint: Fingerprint::of(&racer.request).hash,
        backend_pid: pid,
        os_pid: None,
        result: run.result.clone(),
        steps: run.steps.clone(),
        done_after_release_ms: release.map(|r| ms(run.done_at.saturating_duration_since(r))),
    }
}

pub(crate) fn finish(
    scenario: &Scenario,
    setting: RunSetting,
    barrier: Check,
    racers: Vec<RacerRecord>,
    truth: GroundTruth,
    evidence: Evidence,
    release_to_done_ms: Option<f64>,
) -> ScenarioRun {
    let checks = evaluate(scenario, barrier, &racers, &truth);
    ScenarioRun::judged(
        scenario,
        setting,
        checks,
        racers,
        truth.rows,
        (Some(evidence), None),
        release_to_done_ms,
    )
}

/// How the reason of a run PENDING for want of its PostgreSQL server begins.
pub const PG_UNREACHABLE: &str = "PostgreSQL unreachable";

/// A run that failed with `reason`; PENDING instead when the reason names a shortage of the
/// environment ([`Shortage`]: no free connection, descriptor or port), which says nothing
/// about the implementation.
pub(crate) fn fail(scenario: &Scenario, setting: RunSetting, reason: String) -> ScenarioRun {
    if let Some(shortage) = Shortage::in_text(&reason) {
        return ScenarioRun::pending(scenario, setting, shortage.reason(&reason));
    }
    let mut run = ScenarioRun::pending(scenario, setting, reason);
    run.verdict = Verdict::Fail;
    run
}

// ---------------------------------------------------------------------------------------
// SQLite

/// Runs `scenario` on a fresh SQLite file database in a temporary directory.
///
/// PENDING (with the reason) when this process cannot open the racers' files
/// ([`super::capacity`]; nothing is created then); FAIL when anything in the run or its
/// checks fails.
pub fn run_sqlite(scenario: &Scenario, opts: &SqliteOptions) -> ScenarioRun {
    let config = match scenario.lease {
        None => opts.config,
        Some(_) => super::lease::sqlite_config(opts.config),
    };
    let setting = RunSetting::Sqlite {
        journal: config.journal,
        tx: config.tx,
    };
    let lease = match LeaseDriver::prepare(scenario, &opts.lease) {
        Ok(lease) => lease,
        Err(why) => return ScenarioRun::pending(scenario, setting, why),
    };
    // Refused before the file exists: a racer count the process cannot open files for.
    if let Err(e) = check_scenario(scenario, Backend::Sqlite, None) {
        return ScenarioRun::pending(scenario, setting, e.to_string());
    }
    let run = || -> Result<ScenarioRun, RunError> {
        let file = crate::scratch::ScratchSqlite::new("scenario.db").map_err(RunError::TempDir)?;
        let mut setup = file.open_with(&config)?;
        for sql in schema_sql(
            opts.implementation,
            Backend::Sqlite,
            &opts.after_migrate_sql,
        ) {
            setup.execute_batch(&sql)?;
        }
        run_setup(&mut setup, scenario)?;
        let open = || file.open_with(&config);
        match &lease {
            None => sqlite_at_barrier(scenario, opts, setting, &setup, open),
            Some(driver) => {
                let (mut a, mut b) = (open()?, open()?);
                let raced =
                    driver.race(scenario, opts.implementation, &opts.retry, [&mut a, &mut b]);
                drop((a, b));
                let truth = sqlite_ground_truth(&setup, scenario)?;
                Ok(super::lease::judge(scenario, setting, raced, &truth))
            }
        }
    };
    run().unwrap_or_else(|e| fail(scenario, setting, e.to_string()))
}

/// The racers of a scenario without `[lease]` on their own SQLite connections (`open`), held
/// at the in-process barrier, then judged against `setup`'s rows.
///
/// Long because it is one race from the racers' stores to the verdict, phase after phase
/// (the race at the in-process barrier, the barrier check, ground truth, evidence); each
/// phase's values feed the next.
fn sqlite_at_barrier(
    scenario: &Scenario,
    opts: &SqliteOptions,
    setting: RunSetting,
    setup: &SqliteStore,
    open: impl Fn() -> Result<SqliteStore, StoreError>,
) -> Result<ScenarioRun, RunError> {
    let mut stores = scenario
        .racers
        .iter()
        .map(|_| open())
        .collect::<Result<Vec<_>, _>>()?;

    let timeout = opts
        .barrier_timeout
        .unwrap_or(Duration::from_millis(scenario.barrier.timeout_ms));
    let barrier = Barrier::new(scenario.racers.len());
    // In immediate mode `begin` takes the write lock, so racers meet before it; otherwise
    // right after the first receipt lookup.
    let point = match opts.config.tx {
        TxMode::Immediate => HookPoint::BeforeBegin,
        TxMode::Lazy | TxMode::Deferred => HookPoint::AfterFirstLookup,
    };
    let runs: Vec<RacerRun> = std::thread::scope(|s| {
        let handles: Vec<_> = stores
            .iter_mut()
            .zip(&scenario.racers)
            .map(|(store, racer)| {
                let barrier = &barrier;
                let retry = &opts.retry;
                let implementation = opts.implementation;
                s.spawn(move || {
                    let hook: Hook<'_, SqliteStore> = Box::new(move |_: &mut SqliteStore| {
                        barrier.wait(timeout).map(drop).map_err(|e| StoreError {
                            kind: DbErrorKind::Timeout,
                            backend: Backend::Sqlite,
                            operation: "barrier",
                            code: None,
                            message: e.to_string(),
                        })
                    });
                    race(
                        store,
                        racer.into(),
                        vec![(point, hook)],
                        implementation,
                        retry,
                        || barrier.abandon(),
                    )
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("racer thread panicked"))
            .collect()
    });
    drop(stores);

    let release = runs.iter().filter_map(|r| r.released_at).min();
    let passed = runs.iter().filter(|r| r.released_at.is_some()).count();
    let saw_none = runs
        .iter()
        .filter(|r| r.released_at.is_some() && r.first_lookup_empty == Some(true))
        .count();
    let n = scenario.racers.len();
    let place = match point {
        HookPoint::BeforeBegin => "before begin",
        _ => "after their first receipt lookup",
    };
    let barrier_check = if passed == n {
        Check::pass(
            "barrier",
            format!("{n} racers met at the in-process barrier {place} ({saw_none} saw no receipt)"),
        )
    } else {
        Check::fail(
            "barrier",
            format!("racers never reached the barrier: {passed} of {n} passed it"),
        )
    };
    let racers: Vec<RacerRecord> = scenario
        .racers
        .iter()
        .zip(&runs)
        .map(|(racer, run)| record(racer, None, run, release))
        .collect();
    let truth = sqlite_ground_truth(setup, scenario)?;
    let evidence = Evidence::Sqlite {
        observed_no_receipt: saw_none,
        journal_mode: setup.journal_mode()?,
        sqlite_version: rusqlite::version().to_string(),
    };
    let done = release.and_then(|r| runs.iter().map(|x| x.done_at).max().map(|d| ms(d - r)));
    Ok(finish(
        scenario,
        setting,
        barrier_check,
        racers,
        truth,
        evidence,
        done,
    ))
}

// ---------------------------------------------------------------------------------------
// PostgreSQL

/// Runs `scenario` against the PostgreSQL server at `opts.url`, in a scratch database.
///
/// PENDING (with the reason) when the server cannot be reached or cannot hold the racers
/// ([`super::capacity`]; nothing is created then); FAIL when anything in the run or its
/// checks fails.
pub fn run_postgres(scenario: &Scenario, opts: &PgOptions) -> ScenarioRun {
    let setting = RunSetting::Postgres {
        isolation: opts.isolation,
    };
    let lease = match LeaseDriver::prepare(scenario, &opts.lease) {
        Ok(lease) => lease,
        Err(why) => return ScenarioRun::pending(scenario, setting, why),
    };
    let config = opts.server.config().clone();
    let mut admin = match pg::connect_as(&config, pg::SessionRole::Admin) {
        Ok(c) => c,
        Err(e) => {
            return ScenarioRun::pending(
                scenario,
                setting,
                format!("{PG_UNREACHABLE} at {}: {e}", opts.server.redacted()),
            )
        }
    };
    // Refused before the scratch database exists: more racers than the server has free
    // connection slots, or than this process can open descriptors for.
    let peer = ticketflow_core::deadline::Peer::of(&config);
    let admin_within = pg::SessionRole::Admin.hard_deadline_for(&config);
    match ticketflow_core::deadline::watch("capacity check", &peer, admin_within, || {
        check_scenario(scenario, Backend::Postgres, Some(&mut admin))
    }) {
        (Ok(()), _) => {}
        (Err(_), Some(gave_up)) => {
            return ScenarioRun::pending(scenario, setting, gave_up.to_string())
        }
        (Err(e @ CapacityError::Probe(_)), None) => return fail(scenario, setting, e.to_string()),
        (Err(e), None) => return ScenarioRun::pending(scenario, setting, e.to_string()),
    }
    let guard = match crate::scratch::ScratchDatabase::migrated(admin, &config, &scenario.name) {
        Ok(g) => g,
        Err(e) => return fail(scenario, setting, e.to_string()),
    };
    if let Some(driver) = lease {
        let result = postgres_lease(scenario, opts, setting, guard.config(), &driver);
        drop(guard);
        return result.unwrap_or_else(|e| fail(scenario, setting, e.to_string()));
    }
    // A safety net over the whole run: every wait inside has its own, shorter deadline; this
    // one ends a run stuck anywhere else (the server or a proxy stopped answering).
    let lock_within = opts
        .barrier_timeout
        .unwrap_or(Duration::from_millis(scenario.barrier.timeout_ms));
    let run_within = 2 * lock_within + 3 * admin_within;
    let (result, gave_up) = ticketflow_core::deadline::watch_quietly(
        &format!("scenario {}", scenario.name),
        &peer,
        run_within,
        || postgres_inner(scenario, opts, setting, guard.config(), guard.name()),
    );
    let result = match (result, gave_up) {
        (Err(_), Some(gave_up)) => Err(RunError::Store(ticketflow_core::error::StoreError {
            kind: ticketflow_core::error::DbErrorKind::Connection,
            backend: Backend::Postgres,
            operation: "run",
            code: None,
            message: gave_up.to_string(),
        })),
        (result, _) => result,
    };
    // Every connection to the scratch database is closed by now; drop it.
    drop(guard);
    result.unwrap_or_else(|e| match &e {
        // The barrier could not be set up as declared: not run, so PENDING.
        RunError::BarrierLock(s) if s.kind == ticketflow_core::error::DbErrorKind::Timeout => {
            ScenarioRun::pending(
                scenario,
                setting,
                Shortage::BarrierLock.reason(&e.to_string()),
            )
        }
        _ => fail(scenario, setting, e.to_string()),
    })
}

/// Runs the implementation's and the caller's schema SQL ([`schema_sql`]) on `setup`, then
/// the scenario's setup requests. Returns the SQL run and the setup's store calls.
fn prepare_postgres(
    setup: &mut PgStore,
    scenario: &Scenario,
    opts: &PgOptions,
) -> Result<(Vec<String>, Vec<StoreCall>), RunError> {
    let extra_schema = schema_sql(
        opts.implementation,
        Backend::Postgres,
        &opts.after_migrate_sql,
    );
    for sql in &extra_schema {
        setup.client().batch_execute(sql)?;
    }
    let setup_calls = run_setup(setup, scenario)?;
    Ok((extra_schema, setup_calls))
}

/// A `[lease]` scenario's two racers on their own sessions in the scratch database `db`,
/// driven around the lease event by `driver` (they wait on the runner and on Redis, each wait
/// with its own deadline, not at the barrier lock), then judged against its rows.
fn postgres_lease(
    scenario: &Scenario,
    opts: &PgOptions,
    setting: RunSetting,
    db: &postgres::Config,
    driver: &LeaseDriver,
) -> Result<ScenarioRun, RunError> {
    let mut setup = PgStore::connect(db, IsolationLevel::ReadCommitted)?;
    prepare_postgres(&mut setup, scenario, opts)?;
    let mut a = PgStore::connect(db, opts.isolation)?;
    let mut b = PgStore::connect(db, opts.isolation)?;
    let raced = driver.race(scenario, opts.implementation, &opts.retry, [&mut a, &mut b]);
    drop((a, b));
    let truth = pg_ground_truth(&mut setup, scenario)?;
    Ok(super::lease::judge(scenario, setting, raced, &truth))
}

/// The lock the controller holds for `mode`, the lock whose waiters count (the receipts
/// table or the advisory key; `table_override` holds another table instead, a negative
/// control), and the counted lock in words.
fn barrier_lock(mode: LockMode, table_override: Option<&str>) -> (ServerLock, ServerLock, String) {
    let table = |access_exclusive| ServerLock::Table {
        table: BARRIER_RELATION.to_string(),
        access_exclusive,
    };
    let watched = match mode {
        LockMode::AccessExclusive => table(true),
        LockMode::Exclusive => table(false),
        LockMode::Advisory => ServerLock::Advisory { key: ADVISORY_KEY },
    };
    let held = match (&watched, table_override) {
        (
            ServerLock::Table {
                access_exclusive, ..
            },
            Some(other),
        ) => ServerLock::Table {
            table: other.to_string(),
            access_exclusive: *access_exclusive,
        },
        _ => watched.clone(),
    };
    let target = match mode {
        LockMode::Advisory => format!("advisory lock {ADVISORY_KEY}"),
        _ => BARRIER_RELATION.to_string(),
    };
    (held, watched, target)
}

/// A racer's connection: in this process, or in a `ticketflow worker` process.
enum PgRacer {
    Thread(Box<PgStore>),
    Process(WorkerProcess),
}

impl PgRacer {
    fn pid(&self) -> i32 {
        match self {
            PgRacer::Thread(s) => s.backend_pid(),
            PgRacer::Process(w) => w.backend_pid(),
        }
    }

    fn os_pid(&self) -> Option<u32> {
        match self {
            PgRacer::Thread(_) => None,
            PgRacer::Process(w) => Some(w.os_pid()),
        }
    }

    fn run(
        &mut self,
        racer: &Racer,
        lock: LockMode,
        implementation: Implementation,
        retry: &RetryPolicy,
    ) -> RacerRun {
        let (result, steps) = match self {
            PgRacer::Thread(store) => {
                race_postgres(store, racer.into(), lock, implementation, retry, None)
            }
            PgRacer::Process(worker) => {
                match worker.create(&racer.tenant, &racer.key, &racer.request) {
                    Ok(reply) => (reply.result, reply.steps),
                    Err(e) => (Err(format!("worker process: {e}")), Vec::new()),
                }
            }
        };
        RacerRun {
            result,
            steps,
            first_lookup_empty: None,
            released_at: None,
            done_at: Instant::now(),
        }
    }
}

/// Long because it is one run from set-up to verdict, phase after phase (schema, racers'
/// sessions, the controller's lock, the race, lock waits, ground truth, evidence); each phase's
/// values feed the next.
fn postgres_inner(
    scenario: &Scenario,
    opts: &PgOptions,
    setting: RunSetting,
    config: &postgres::Config,
    database: &str,
) -> Result<ScenarioRun, RunError> {
    let lock_mode = scenario.barrier.lock;
    let mut setup = PgStore::connect_as(
        config,
        IsolationLevel::ReadCommitted,
        pg::SessionRole::Monitor,
    )?;
    let (extra_schema, setup_calls) = prepare_postgres(&mut setup, scenario, opts)?;
    let server_version: String = setup.client().query_one("SHOW server_version", &[])?.get(0);

    let mut racers = connect_racers(scenario, opts, config, database)?;
    let pids: Vec<i32> = racers.iter().map(PgRacer::pid).collect();
    let os_pids: Vec<Option<u32>> = racers.iter().map(PgRacer::os_pid).collect();
    let (held, watched, target) = barrier_lock(lock_mode, opts.lock_table.as_deref());
    let lock_within = opts
        .barrier_timeout
        .unwrap_or(Duration::from_millis(scenario.barrier.timeout_ms));
    let controller = Controller::lock_watching(config, held, watched, lock_within)
        .map_err(RunError::BarrierLock)?;
    let controller_pid = controller.pid();
    let lock_statement = controller.server_lock().statement();
    let locked_us = now_us();

    let mut monitor = setup;
    let race = race_at_barrier(
        scenario,
        opts,
        &mut racers,
        controller,
        &mut monitor,
        &pids,
        &target,
    );
    for r in racers {
        if let PgRacer::Process(w) = r {
            w.finish();
        }
    }

    let release_at = race.release_at;
    // The server's own clock says how long each statement had waited at the last poll; the
    // time from that poll to the release is added.
    let since_poll = release_at.saturating_duration_since(race.last_poll);
    let waits = lock_waits(race.last_rows, scenario, &pids, since_poll);
    let barrier_check = barrier_check(race.barrier_problem.as_deref(), || {
        format!(
            "{} racer backends seen waiting on {} ({}), blocked by the controller",
            waits.len(),
            target,
            waits.first().map(|w| w.mode.as_str()).unwrap_or("")
        )
    });
    let runs = race.runs;
    let records: Vec<RacerRecord> = scenario
        .racers
        .iter()
        .zip(&runs)
        .zip(pids.iter().zip(&os_pids))
        .map(|((racer, run), (pid, os_pid))| RacerRecord {
            os_pid: *os_pid,
            ..record(racer, Some(*pid), run, Some(release_at))
        })
        .collect();

    let peer = ticketflow_core::deadline::Peer::of(config);
    let truth = match ticketflow_core::deadline::watch(
        "ground truth (row counts)",
        &peer,
        pg::SessionRole::Monitor.hard_deadline_for(config),
        || pg_ground_truth(&mut monitor, scenario),
    ) {
        (Ok(t), _) => t,
        (Err(_), Some(gave_up)) => {
            return Err(RunError::Store(ticketflow_core::error::StoreError {
                kind: ticketflow_core::error::DbErrorKind::Connection,
                backend: Backend::Postgres,
                operation: "ground truth",
                code: None,
                message: gave_up.to_string(),
            }))
        }
        (Err(e), None) => return Err(e),
    };
    let evidence = Evidence::Postgres {
        server_version,
        isolation: opts.isolation.sql().to_string(),
        lock_mode,
        window: lock_mode.window().to_string(),
        racers_as: scenario.racers_as,
        database: database.to_string(),
        controller_pid,
        lock_statement,
        waits,
        barrier_reached_ms: race.reached_at.map(|r| ms(r - race.started)),
        polls: race.polls,
        controller: ControllerTimes {
            locked_us,
            all_waiting_us: race.all_waiting_us,
            released_us: race.released_us,
        },
        schema_sql: extra_schema,
        setup_calls,
    };
    let done = runs
        .iter()
        .map(|x| x.done_at)
        .max()
        .map(|d| ms(d.saturating_duration_since(release_at)));
    Ok(finish(
        scenario,
        setting,
        barrier_check,
        records,
        truth,
        evidence,
        done,
    ))
}

/// One connection per racer of `scenario`: a session in this process (threads) or a
/// `ticketflow worker` process (processes), in `database`.
fn connect_racers(
    scenario: &Scenario,
    opts: &PgOptions,
    config: &postgres::Config,
    database: &str,
) -> Result<Vec<PgRacer>, RunError> {
    let mut racers = Vec::new();
    for _ in &scenario.racers {
        racers.push(match scenario.racers_as {
            RacerKind::Threads => {
                PgRacer::Thread(Box::new(PgStore::connect(config, opts.isolation)?))
            }
            RacerKind::Processes => PgRacer::Process(
                WorkerProcess::spawn(
                    opts.worker_exe.as_deref(),
                    &WorkerConfig {
                        pg_url: opts.server.url().to_string(),
                        dbname: database.to_string(),
                        isolation: opts.isolation,
                        lock: scenario.barrier.lock,
                        implementation: opts.implementation,
                        retry: opts.retry,
                        die_after_commits: None,
                    },
                )
                .map_err(RunError::Worker)?,
            ),
        });
    }
    Ok(racers)
}

/// What happened at the barrier of one PostgreSQL run.
struct BarrierRace {
    /// Each racer's run, in racer order.
    runs: Vec<RacerRun>,
    /// The waiters at the last `pg_locks` poll, and when that poll returned.
    last_rows: Vec<Waiter>,
    last_poll: Instant,
    /// `pg_locks` polls made.
    polls: u32,
    /// Why the barrier check fails, if it does.
    barrier_problem: Option<String>,
    /// When polling started, and when every racer was seen waiting (if they were).
    started: Instant,
    reached_at: Option<Instant>,
    /// µs since the epoch when every racer was seen waiting.
    all_waiting_us: Option<u64>,
    /// When the controller released the lock (an `Instant`, and µs since the epoch).
    release_at: Instant,
    released_us: u64,
}

/// Starts every racer on its own thread, polls `pg_locks` through `monitor` until every racer
/// (`pids`) waits on the controller's lock (`target` names it in reasons) or the scenario's
/// deadline, releases the lock (consuming `controller`) whatever happened, and joins the
/// racers.
///
/// Long because it is one `thread::scope`: the racers' threads, the monitor's polls and the
/// release run inside it, in order.
fn race_at_barrier(
    scenario: &Scenario,
    opts: &PgOptions,
    racers: &mut [PgRacer],
    controller: Controller,
    monitor: &mut PgStore,
    pids: &[i32],
    target: &str,
) -> BarrierRace {
    let lock_mode = scenario.barrier.lock;
    let timeout = opts
        .barrier_timeout
        .unwrap_or(Duration::from_millis(scenario.barrier.timeout_ms));
    let started = Instant::now();
    let mut last_rows: Vec<Waiter> = Vec::new();
    let mut last_poll = started;
    let mut polls = 0u32;
    let mut barrier_problem: Option<String> = None;
    let mut reached_at: Option<Instant> = None;
    let mut all_waiting_us = None;
    let mut release: Option<Instant> = None;
    let mut released_us = 0;

    let runs: Vec<RacerRun> = std::thread::scope(|sc| {
        let handles: Vec<_> = racers
            .iter_mut()
            .zip(&scenario.racers)
            .map(|(r, racer)| {
                let retry = &opts.retry;
                let implementation = opts.implementation;
                sc.spawn(move || r.run(racer, lock_mode, implementation, retry))
            })
            .collect();
        // Poll pg_locks until every racer waits on the barrier lock, or the deadline.
        let stop = || {
            handles.iter().position(|h| h.is_finished()).map(|i| {
                format!(
                    "racers never reached the barrier: {} finished before it was seen waiting",
                    scenario.racers[i].name
                )
            })
        };
        let why_short = |seen: usize| {
            format!(
                "racers never reached the barrier: {seen} of {} seen waiting on {target} within {} ms",
                pids.len(),
                timeout.as_millis()
            )
        };
        match gather(
            &controller,
            monitor.client(),
            Among::Pids(pids),
            &|| pids.len(),
            started + timeout,
            &stop,
            &why_short,
        ) {
            Gathered::Reached {
                waiters,
                at,
                polls: n,
            } => {
                last_rows = waiters;
                last_poll = at;
                polls = n;
                reached_at = Some(at);
                all_waiting_us = Some(now_us());
            }
            Gathered::Problem {
                reason,
                waiters,
                polls: n,
            } => {
                last_rows = waiters;
                last_poll = Instant::now();
                polls = n;
                barrier_problem = Some(reason);
            }
        }
        // Release the barrier whatever happened, so every racer can finish.
        let release_started = now_us();
        if let Err(e) = controller.release() {
            barrier_problem.get_or_insert(format!("controller could not release the lock: {e}"));
        }
        release = Some(Instant::now());
        released_us = release_started;
        handles
            .into_iter()
            .map(|h| h.join().expect("racer thread panicked"))
            .collect()
    });
    BarrierRace {
        runs,
        last_rows,
        last_poll,
        polls,
        barrier_problem,
        started,
        reached_at,
        all_waiting_us,
        release_at: release.expect("set before the racers are joined"),
        released_us,
    }
}

/// The racers' lock waits from the last poll's `rows`, named by racer (`pids` is in racer
/// order); each wait is extended by `since_poll`, the time from that poll to the release.
fn lock_waits(
    rows: Vec<Waiter>,
    scenario: &Scenario,
    pids: &[i32],
    since_poll: Duration,
) -> Vec<LockWait> {
    rows.into_iter()
        .map(|w| LockWait {
            racer: pids
                .iter()
                .position(|p| *p == w.pid)
                .map(|i| scenario.racers[i].name.clone())
                .unwrap_or_default(),
            pid: w.pid,
            wait_event_type: w
                .wait_event
                .split_once('/')
                .map(|(t, _)| t.to_string())
                .filter(|t| t != "-"),
            wait_event: w
                .wait_event
                .split_once('/')
                .map(|(_, e)| e.to_string())
                .filter(|e| e != "-"),
            mode: w.mode,
            blocked_by: w.blocked_by,
            waited_ms: ((w.waiting_ms + since_poll.as_secs_f64() * 1000.0) * 100.0).round() / 100.0,
        })
        .collect()
}

/// Row counts per tenant and receipts per key of `scenario`, by direct SQL on SQLite.
pub(crate) fn sqlite_ground_truth(
    setup: &SqliteStore,
    scenario: &Scenario,
) -> Result<GroundTruth, RunError> {
    let mut truth = GroundTruth::default();
    for tenant in tenants_of(scenario) {
        let counts = setup.row_counts(&tenant)?;
        truth.rows.insert(tenant, counts);
    }
    for (tenant, key) in keys_of(scenario) {
        let rows = setup.receipts_for(&tenant, &key)?;
        truth.receipts.insert((tenant, key), rows);
    }
    Ok(truth)
}

/// Row counts per tenant and receipts per key of `scenario`, by direct SQL.
pub(crate) fn pg_ground_truth(
    monitor: &mut PgStore,
    scenario: &Scenario,
) -> Result<GroundTruth, RunError> {
    let mut truth = GroundTruth::default();
    for tenant in tenants_of(scenario) {
        let counts = pg::row_counts(monitor.client(), &tenant)?;
        truth.rows.insert(tenant, counts);
    }
    for (tenant, key) in keys_of(scenario) {
        let rows = pg::receipts_for(monitor.client(), &tenant, &key)?;
        truth.receipts.insert((tenant, key), rows);
    }
    Ok(truth)
}
