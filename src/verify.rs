//! `ticketflow verify`: run every scenario on every backend and decide the exit code.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::killmatrix::{KillMatrix, KillOptions, LoomReport};
use crate::props::SuiteResult;

/// Cases per property gate in the kill matrix (unless `PROPTEST_CASES` is set).
pub const KILL_MATRIX_CASES: u32 = 24;
use crate::protocol::RetryPolicy;
use crate::scenario::format::{load_dir, Backend, Scenario, ScenarioError};
use crate::scenario::runner::{run_postgres, run_sqlite, PgOptions, SqliteOptions, DEFAULT_PG_URL};
use crate::scenario::{RunSetting, ScenarioRun, Verdict};
use crate::store::postgres::{self as pg, IsolationLevel};
use crate::store::sqlite::SqliteConfig;

/// Exit code: every run PASSed (PENDING allowed unless PostgreSQL is required).
pub const EXIT_PASS: i32 = 0;
/// Exit code: at least one FAIL.
pub const EXIT_FAIL: i32 = 1;
/// Exit code: usage error or a bad scenario file; nothing ran.
pub const EXIT_USAGE: i32 = 2;
/// Exit code: a PostgreSQL run was PENDING under `--require-postgres`.
pub const EXIT_PENDING: i32 = 3;

/// Where to find PostgreSQL: `--pg-url`, else `DATABASE_URL` when it is a `postgres://` URL,
/// else [`DEFAULT_PG_URL`].
pub fn resolve_pg_url(flag: Option<&str>, database_url: Option<&str>) -> String {
    if let Some(url) = flag {
        return url.to_string();
    }
    match database_url {
        Some(u) if u.starts_with("postgres://") || u.starts_with("postgresql://") => u.to_string(),
        _ => DEFAULT_PG_URL.to_string(),
    }
}

/// Checks once that the server answers, so an absent server costs one connect timeout, not
/// one per scenario. Returns the reason it is unusable.
pub fn probe_postgres(url: &str) -> Result<(), String> {
    let mut config = pg::parse_url(url).map_err(|e| e.to_string())?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(5));
    }
    pg::connect(&config)
        .map(drop)
        .map_err(|e| format!("PostgreSQL unreachable: {e}"))
}

/// Which matrix cells to run.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Backends (empty = both).
    pub backends: Vec<Backend>,
    /// PostgreSQL isolation levels (empty = what each scenario allows, by default all three).
    pub isolation: Vec<IsolationLevel>,
    /// SQLite settings (empty = all six).
    pub sqlite: Vec<RunSetting>,
}

impl Selection {
    /// The settings to run for `scenario`.
    pub fn settings(&self, scenario: &Scenario) -> Vec<RunSetting> {
        let backends = if self.backends.is_empty() {
            Backend::ALL.to_vec()
        } else {
            self.backends.clone()
        };
        let mut out = Vec::new();
        if backends.contains(&Backend::Sqlite) && scenario.backends.contains(&Backend::Sqlite) {
            if self.sqlite.is_empty() {
                out.extend(RunSetting::sqlite_matrix());
            } else {
                out.extend(self.sqlite.iter().copied());
            }
        }
        if backends.contains(&Backend::Postgres) && scenario.backends.contains(&Backend::Postgres) {
            for level in &scenario.isolation {
                if self.isolation.is_empty() || self.isolation.contains(level) {
                    out.push(RunSetting::Postgres { isolation: *level });
                }
            }
        }
        out
    }
}

/// Runs `scenarios` on the selected settings. PostgreSQL runs are PENDING with
/// `pg_unusable`'s reason when it is `Some`. `base` supplies URL, retry policy and worker
/// binary; the isolation level comes from each setting.
pub fn run_all(
    scenarios: &[Scenario],
    selection: &Selection,
    base: &PgOptions,
    retry: &RetryPolicy,
    pg_unusable: Option<&str>,
) -> Vec<ScenarioRun> {
    let mut runs = Vec::new();
    for scenario in scenarios {
        for setting in selection.settings(scenario) {
            let run = match (setting, pg_unusable) {
                (RunSetting::Sqlite { journal, tx }, _) => {
                    let opts = SqliteOptions {
                        config: SqliteConfig {
                            journal,
                            tx,
                            ..SqliteConfig::default()
                        },
                        retry: *retry,
                        implementation: base.implementation,
                        ..SqliteOptions::default()
                    };
                    run_sqlite(scenario, &opts)
                }
                (RunSetting::Postgres { .. }, Some(reason)) => {
                    ScenarioRun::pending(scenario, setting, reason.to_string())
                }
                (RunSetting::Postgres { isolation }, None) => {
                    let mut opts = base.clone();
                    opts.isolation = isolation;
                    opts.retry = *retry;
                    run_postgres(scenario, &opts)
                }
            };
            tracing::info!(scenario = %run.scenario, setting = %run.setting.label(), verdict = %run.verdict, "scenario finished");
            runs.push(run);
        }
    }
    runs
}

/// The exit code for a set of verdicts: FAIL beats PENDING; PENDING counts only when
/// PostgreSQL is required.
pub fn exit_code(verdicts: impl IntoIterator<Item = Verdict>, require_postgres: bool) -> i32 {
    let verdicts: Vec<Verdict> = verdicts.into_iter().collect();
    if verdicts.contains(&Verdict::Fail) {
        EXIT_FAIL
    } else if require_postgres && verdicts.contains(&Verdict::Pending) {
        EXIT_PENDING
    } else {
        EXIT_PASS
    }
}

/// Runs the property suites on a real protocol (`implementation`: `protocol` or
/// `on-conflict`): fingerprint, then sequential and concurrent on each selected backend.
/// `seed` fixes every suite's generator (random when `None`); case counts follow
/// `PROPTEST_CASES` or each suite's default. Failures persist under `proptest-regressions/`.
pub fn run_property_suites(
    backends: &[Backend],
    pg_url: &str,
    pg_unusable: Option<&str>,
    seed: Option<u64>,
    implementation: crate::variants::Implementation,
) -> Vec<SuiteResult> {
    use crate::props::{concurrent, fingerprint, sequential, SuiteBackend, SuiteConfig};
    let mut out = vec![fingerprint::run(&SuiteConfig::new(
        "fingerprint",
        fingerprint::DEFAULT_CASES,
        seed,
        true,
    ))];
    for backend in backends {
        let target = match backend {
            Backend::Sqlite => SuiteBackend::Sqlite,
            Backend::Postgres => SuiteBackend::Postgres {
                url: pg_url.to_string(),
            },
        };
        let seq = SuiteConfig::new("sequential", sequential::DEFAULT_CASES, seed, true);
        let conc = SuiteConfig::new("concurrent", concurrent::DEFAULT_CASES, seed, true);
        match (backend, pg_unusable) {
            (Backend::Postgres, Some(reason)) => {
                for (suite, config) in [("sequential", &seq), ("concurrent", &conc)] {
                    out.push(SuiteResult::pending(
                        suite,
                        "postgres",
                        implementation,
                        config,
                        reason.to_string(),
                    ));
                }
            }
            _ => {
                out.push(sequential::run(&target, implementation, &seq));
                out.push(concurrent::run(&target, implementation, &conc));
            }
        }
    }
    out
}

/// Options of `ticketflow verify`.
#[derive(Debug, Clone)]
pub struct VerifyOptions {
    /// Directory of scenario files.
    pub scenarios: PathBuf,
    /// PostgreSQL URL.
    pub pg_url: String,
    /// Matrix cells to run.
    pub selection: Selection,
    /// Where REPORT.md goes.
    pub report: PathBuf,
    /// Make PENDING PostgreSQL runs an error (exit 3).
    pub require_postgres: bool,
    /// The racers' retry policy.
    pub retry: RetryPolicy,
    /// Seed for the property suites (random when `None`).
    pub seed: Option<u64>,
    /// Run the kill matrix (every gate against the five wrong implementations).
    pub kill_matrix: bool,
    /// Include the fault case that restarts the local PostgreSQL cluster.
    pub restart_postgres: bool,
    /// The create protocol of the scenario matrix and the property suites. Both protocols
    /// run the kill matrix and the fault cases as controls whichever is chosen.
    pub protocol: crate::protocol::Protocol,
}

/// Result of a verify run.
#[derive(Debug)]
pub struct VerifyOutcome {
    /// Every run.
    pub runs: Vec<ScenarioRun>,
    /// Every property suite.
    pub suites: Vec<SuiteResult>,
    /// The kill matrix, when it ran.
    pub kill: Option<KillMatrix>,
    /// Faults and bad input.
    pub faults: crate::faults::FaultReport,
    /// The process exit code.
    pub exit_code: i32,
}

/// Runs `verify`: load scenarios, run them, write the report.
///
/// Will return `Err` for a bad scenario file (nothing runs) or when the report cannot be
/// written.
pub fn verify(opts: &VerifyOptions) -> Result<VerifyOutcome, VerifyError> {
    let scenarios = load_dir(&opts.scenarios)?;
    if scenarios.is_empty() {
        return Err(VerifyError::NoScenarios(opts.scenarios.clone()));
    }
    let backends = if opts.selection.backends.is_empty() {
        Backend::ALL.to_vec()
    } else {
        opts.selection.backends.clone()
    };
    let wants_pg = backends.contains(&Backend::Postgres);
    let pg_unusable = if wants_pg {
        probe_postgres(&opts.pg_url).err()
    } else {
        None
    };
    let implementation = crate::variants::Implementation::of_protocol(opts.protocol);
    let mut base = PgOptions::new(opts.pg_url.clone());
    base.implementation = implementation;
    let runs = run_all(
        &scenarios,
        &opts.selection,
        &base,
        &opts.retry,
        pg_unusable.as_deref(),
    );
    let suites = run_property_suites(
        &backends,
        &opts.pg_url,
        pg_unusable.as_deref(),
        opts.seed,
        implementation,
    );
    let loom = LoomReport::load(&opts.scenarios.join("../reports/loom.json"));
    let kill = opts.kill_matrix.then(|| {
        crate::killmatrix::run_with_loom(
            &scenarios,
            &KillOptions {
                pg_url: opts.pg_url.clone(),
                pg_unusable: pg_unusable.clone(),
                cases: KILL_MATRIX_CASES,
                seed: opts.seed,
                loom_report: opts.scenarios.join("../reports/loom.json"),
                worker_exe: None,
            },
            &loom,
        )
    });
    let mut faults =
        crate::faults::run(&opts.pg_url, pg_unusable.as_deref(), opts.restart_postgres);
    // The second create protocol is a control too: its fault cases must pass.
    faults.absorb(crate::faults::run_protocol(
        crate::protocol::Protocol::OnConflict,
        &opts.pg_url,
        pg_unusable.as_deref(),
    ));
    let text = crate::report::render(
        &scenarios,
        &runs,
        &suites,
        kill.as_ref(),
        &loom,
        &faults,
        &crate::report::Context::capture(opts),
    );
    write_report(&opts.report, &text)?;
    let verdicts = runs
        .iter()
        .map(|r| r.verdict)
        .chain(suites.iter().map(|s| s.verdict))
        .chain(kill.iter().map(|k| k.postgres_verdict()))
        .chain(std::iter::once(faults.postgres_verdict()))
        // A loom model with an unexpected result fails verify; a missing report does not
        // block it (it is shown PENDING).
        .chain((loom.verdict() == Verdict::Fail).then_some(Verdict::Fail));
    Ok(VerifyOutcome {
        exit_code: exit_code(verdicts, opts.require_postgres),
        runs,
        suites,
        kill,
        faults,
    })
}

fn write_report(path: &Path, text: &str) -> Result<(), VerifyError> {
    std::fs::write(path, text).map_err(|source| VerifyError::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// Why `verify` could not run.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// A scenario file is bad.
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
    /// The directory holds no `*.toml`.
    #[error("no scenario files (*.toml) in {0}")]
    NoScenarios(PathBuf),
    /// The report could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// Target.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}
