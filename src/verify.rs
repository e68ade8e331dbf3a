//! `ticketflow verify`: run every scenario on every backend and decide the exit code.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::scenario::format::{load_dir, Backend, Scenario, ScenarioError};
use crate::scenario::runner::{run_postgres, run_sqlite, PgOptions, SqliteOptions, DEFAULT_PG_URL};
use crate::scenario::{ScenarioRun, Verdict};
use crate::store::postgres as pg;

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

/// Runs `scenarios` on the chosen backends. PostgreSQL runs are PENDING with `pg_unusable`'s
/// reason when it is `Some`.
pub fn run_all(
    scenarios: &[Scenario],
    backends: &[Backend],
    pg_opts: &PgOptions,
    pg_unusable: Option<&str>,
) -> Vec<ScenarioRun> {
    let mut runs = Vec::new();
    for scenario in scenarios {
        for backend in backends {
            if !scenario.backends.contains(backend) {
                continue;
            }
            let run = match (backend, pg_unusable) {
                (Backend::Sqlite, _) => run_sqlite(scenario, &SqliteOptions::default()),
                (Backend::Postgres, Some(reason)) => {
                    ScenarioRun::pending(scenario, Backend::Postgres, reason.to_string())
                }
                (Backend::Postgres, None) => run_postgres(scenario, pg_opts),
            };
            tracing::info!(scenario = %run.scenario, backend = run.backend.name(), verdict = %run.verdict, "scenario finished");
            runs.push(run);
        }
    }
    runs
}

/// The exit code for a set of runs: FAIL beats PENDING; PENDING counts only when PostgreSQL
/// is required.
pub fn exit_code(runs: &[ScenarioRun], require_postgres: bool) -> i32 {
    if runs.iter().any(|r| r.verdict == Verdict::Fail) {
        EXIT_FAIL
    } else if require_postgres && runs.iter().any(|r| r.verdict == Verdict::Pending) {
        EXIT_PENDING
    } else {
        EXIT_PASS
    }
}

/// Options of `ticketflow verify`.
#[derive(Debug, Clone)]
pub struct VerifyOptions {
    /// Directory of scenario files.
    pub scenarios: PathBuf,
    /// PostgreSQL URL.
    pub pg_url: String,
    /// Backends to run.
    pub backends: Vec<Backend>,
    /// Where REPORT.md goes.
    pub report: PathBuf,
    /// Make PENDING PostgreSQL runs an error (exit 3).
    pub require_postgres: bool,
}

/// Result of a verify run.
#[derive(Debug)]
pub struct VerifyOutcome {
    /// Every run.
    pub runs: Vec<ScenarioRun>,
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
    let pg_unusable = if opts.backends.contains(&Backend::Postgres) {
        probe_postgres(&opts.pg_url).err()
    } else {
        None
    };
    let runs = run_all(
        &scenarios,
        &opts.backends,
        &PgOptions::new(opts.pg_url.clone()),
        pg_unusable.as_deref(),
    );
    let text = crate::report::render(&scenarios, &runs, &crate::report::Context::capture(opts));
    write_report(&opts.report, &text)?;
    Ok(VerifyOutcome {
        exit_code: exit_code(&runs, opts.require_postgres),
        runs,
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
