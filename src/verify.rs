//! `ticketflow verify`: run every scenario on every backend and decide the exit code.

use crate::scenario::lease::{redis_pending, LeaseRunOptions};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::jobs::{run_ordered, Pool, Ran, Weighed};
use crate::killmatrix::{KillMatrix, KillOptions, LoomReport};
use crate::props::SuiteResult;
use crate::report::{Context, ExportedSpec, PhaseTiming, ReportInput, Timings};
use crate::store::scratch::{scratch_cost, ScratchCost};

/// Cases per property gate in the kill matrix (unless `PROPTEST_CASES` is set).
pub const KILL_MATRIX_CASES: u32 = 24;
use crate::protocol::RetryPolicy;
use crate::scenario::format::{load_all, LoadError, Loaded, Scenario};
use crate::scenario::runner::{run_postgres, run_sqlite, PgOptions, SqliteOptions};
use crate::scenario::{RunSetting, ScenarioRun, Verdict};
use crate::store::postgres::IsolationLevel;
use crate::store::sqlite::SqliteConfig;
use crate::store::url::probe_postgres;
use crate::store::Backend;

pub use crate::exit::{EXIT_FAIL, EXIT_PASS, EXIT_PENDING, EXIT_USAGE};

/// `--backend`: one backend or both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum BackendChoice {
    // `help = None`: `--help` lists the bare names, as it always has.
    /// SQLite only.
    #[value(help = None::<&str>)]
    Sqlite,
    /// PostgreSQL only.
    #[value(help = None::<&str>)]
    Postgres,
    /// Both, in report order.
    #[default]
    #[value(help = None::<&str>)]
    Both,
}

impl BackendChoice {
    /// The backends chosen, in report order.
    pub fn backends(self) -> Vec<Backend> {
        match self {
            BackendChoice::Sqlite => vec![Backend::Sqlite],
            BackendChoice::Postgres => vec![Backend::Postgres],
            BackendChoice::Both => Backend::ALL.to_vec(),
        }
    }
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
    /// The backends selected: [`Selection::backends`], or both when it is empty.
    pub fn backends(&self) -> Vec<Backend> {
        if self.backends.is_empty() {
            Backend::ALL.to_vec()
        } else {
            self.backends.clone()
        }
    }

    /// The settings to run for `scenario`.
    pub fn settings(&self, scenario: &Scenario) -> Vec<RunSetting> {
        let backends = self.backends();
        let mut out = Vec::new();
        if backends.contains(&Backend::Sqlite) && scenario.backends.contains(&Backend::Sqlite) {
            // A lease scenario varies the lease, not the database: SQLite runs WAL, lazy.
            let wal_lazy = RunSetting::Sqlite {
                journal: crate::store::sqlite::JournalMode::Wal,
                tx: crate::store::sqlite::TxMode::Lazy,
            };
            if scenario.lease.is_some() {
                if self.sqlite.is_empty() || self.sqlite.contains(&wal_lazy) {
                    out.push(wal_lazy);
                }
            } else if self.sqlite.is_empty() {
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
    run_all_with(scenarios, selection, base, retry, pg_unusable, &|_| {})
}

/// [`run_all`], calling `done` after each run (for progress).
pub fn run_all_with(
    scenarios: &[Scenario],
    selection: &Selection,
    base: &PgOptions,
    retry: &RetryPolicy,
    pg_unusable: Option<&str>,
    done: &dyn Fn(&ScenarioRun),
) -> Vec<ScenarioRun> {
    run_all_on(
        scenarios,
        selection,
        base,
        retry,
        pg_unusable,
        Pool::SERIAL,
        &mut |r| done(r),
    )
    .results
}

/// One run of [`run_all_on`]: a scenario on a matrix cell.
struct Cell<'a> {
    scenario: &'a Scenario,
    setting: RunSetting,
}

impl Weighed for Cell<'_> {
    /// A PostgreSQL run holds its racers' sessions, the runner's own and the admin session.
    /// A `[lease]` run, on either backend, runs alone: the lease scenarios share one Redis
    /// database, which one of them flushes, and the same lease keys.
    fn sessions(&self) -> u64 {
        if self.scenario.lease.is_some() {
            return u64::MAX;
        }
        match self.setting {
            RunSetting::Postgres { .. } => scenario_sessions(self.scenario),
            RunSetting::Sqlite { .. } => 0,
        }
    }
}

/// The PostgreSQL sessions a run of `scenario` holds at most: its racers, the runner's own
/// ([`crate::scenario::capacity::RUNNER_SESSIONS`]) and the admin session that creates and
/// drops the scratch database.
pub fn scenario_sessions(scenario: &Scenario) -> u64 {
    let runner = crate::scenario::capacity::RUNNER_SESSIONS.unsigned_abs();
    scenario.racers.len() as u64 + runner + 1
}

/// [`run_all_with`] with independent runs at once within `pool` ([`crate::jobs`]); `done` sees
/// the runs in the serial order as they finish. Returns the runs in that order and their
/// summed duration.
pub fn run_all_on(
    scenarios: &[Scenario],
    selection: &Selection,
    base: &PgOptions,
    retry: &RetryPolicy,
    pg_unusable: Option<&str>,
    pool: Pool,
    done: &mut dyn FnMut(&ScenarioRun),
) -> Ran<ScenarioRun> {
    let cells: Vec<Cell<'_>> = scenarios
        .iter()
        .flat_map(|scenario| {
            selection
                .settings(scenario)
                .into_iter()
                .map(move |setting| Cell { scenario, setting })
        })
        .collect();
    let work = |cell: &Cell<'_>| {
        let (scenario, setting) = (cell.scenario, cell.setting);
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
                    lease: base.lease.clone(),
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
        run
    };
    run_ordered(&cells, pool, &work, done)
}

/// The exit code for a set of verdicts: FAIL ([`EXIT_FAIL`]) beats PENDING ([`EXIT_PENDING`]),
/// which beats PASS ([`EXIT_PASS`]). `decisive` verdicts count as they are: a PENDING there is
/// something that did not run or could not be set up as declared (a barrier not reached, a
/// scenario that does not fit), never a success. `postgres_fallback` verdicts are the
/// documented embedded fallback: runs left PENDING because no PostgreSQL server answers at
/// the built-in default URL; their PENDING counts only when PostgreSQL is required.
pub fn exit_code(
    decisive: impl IntoIterator<Item = Verdict>,
    postgres_fallback: impl IntoIterator<Item = Verdict>,
    require_postgres: bool,
) -> i32 {
    let decisive: Vec<Verdict> = decisive.into_iter().collect();
    let fallback: Vec<Verdict> = postgres_fallback.into_iter().collect();
    if decisive.contains(&Verdict::Fail) || fallback.contains(&Verdict::Fail) {
        EXIT_FAIL
    } else if decisive.contains(&Verdict::Pending)
        || (require_postgres && fallback.contains(&Verdict::Pending))
    {
        EXIT_PENDING
    } else {
        EXIT_PASS
    }
}

/// Whether `run` is PENDING because the PostgreSQL server could not be reached (the embedded
/// fallback of [`exit_code`]), as opposed to a run that could not be set up as declared.
fn postgres_missing_run(run: &ScenarioRun, pg_unusable: Option<&str>) -> bool {
    run.verdict == Verdict::Pending
        && run.backend == Backend::Postgres
        && (pg_unusable.is_some() && run.reason.as_deref() == pg_unusable
            || run
                .reason
                .as_deref()
                .is_some_and(|r| r.starts_with(crate::scenario::runner::PG_UNREACHABLE)))
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
    run_selected_property_suites(
        &["fingerprint", "sequential", "concurrent"],
        backends,
        pg_url,
        pg_unusable,
        seed,
        implementation,
    )
}

/// [`run_property_suites`], running only the suites named in `suites` (`fingerprint`,
/// `sequential`, `concurrent`); the others do not run at all.
pub fn run_selected_property_suites(
    suites: &[&str],
    backends: &[Backend],
    pg_url: &str,
    pg_unusable: Option<&str>,
    seed: Option<u64>,
    implementation: crate::variants::Implementation,
) -> Vec<SuiteResult> {
    let mut out = Vec::new();
    run_selected_property_suites_with(
        suites,
        backends,
        pg_url,
        pg_unusable,
        seed,
        implementation,
        &mut |s| out.push(s),
    );
    out
}

/// One property suite of [`run_selected_property_suites_on`], on one backend.
enum SuiteJob<'a> {
    Fingerprint,
    Run {
        suite: &'static str,
        backend: Backend,
        pending: Option<&'a str>,
    },
}

/// PostgreSQL sessions of the concurrent suite at most: 8 racing threads, its setup and
/// ground-truth sessions and the admin session.
const CONCURRENT_SUITE_SESSIONS: u64 = 12;
/// PostgreSQL sessions of the sequential suite at most.
const SEQUENTIAL_SUITE_SESSIONS: u64 = 4;

impl Weighed for SuiteJob<'_> {
    fn sessions(&self) -> u64 {
        match self {
            SuiteJob::Run {
                suite,
                backend: Backend::Postgres,
                pending: None,
            } => match *suite {
                "concurrent" => CONCURRENT_SUITE_SESSIONS,
                _ => SEQUENTIAL_SUITE_SESSIONS,
            },
            _ => 0,
        }
    }
}

/// [`run_selected_property_suites`], handing each suite's result to `done` as it finishes.
fn run_selected_property_suites_with(
    suites: &[&str],
    backends: &[Backend],
    pg_url: &str,
    pg_unusable: Option<&str>,
    seed: Option<u64>,
    implementation: crate::variants::Implementation,
    done: &mut dyn FnMut(SuiteResult),
) {
    let ran = run_selected_property_suites_on(
        suites,
        backends,
        pg_url,
        pg_unusable,
        seed,
        implementation,
        Pool::SERIAL,
        &mut |_| {},
    );
    for r in ran.results {
        done(r);
    }
}

/// [`run_selected_property_suites`] with suites at once within `pool`; `done` sees them in
/// the serial order (fingerprint, then sequential and concurrent per backend).
#[allow(clippy::too_many_arguments)]
fn run_selected_property_suites_on(
    suites: &[&str],
    backends: &[Backend],
    pg_url: &str,
    pg_unusable: Option<&str>,
    seed: Option<u64>,
    implementation: crate::variants::Implementation,
    pool: Pool,
    done: &mut dyn FnMut(&SuiteResult),
) -> Ran<SuiteResult> {
    use crate::props::{concurrent, fingerprint, sequential, SuiteBackend, SuiteConfig};
    let mut jobs = Vec::new();
    if suites.contains(&"fingerprint") {
        jobs.push(SuiteJob::Fingerprint);
    }
    for backend in backends {
        if SuiteBackend::on(*backend, pg_url).is_none() {
            continue;
        }
        let pending = match backend {
            Backend::Postgres => pg_unusable,
            _ => None,
        };
        for suite in ["sequential", "concurrent"] {
            if suites.contains(&suite) {
                jobs.push(SuiteJob::Run {
                    suite,
                    backend: *backend,
                    pending,
                });
            }
        }
    }
    let work = |job: &SuiteJob<'_>| match *job {
        SuiteJob::Fingerprint => fingerprint::run(&SuiteConfig::new(
            "fingerprint",
            fingerprint::DEFAULT_CASES,
            seed,
            true,
        )),
        SuiteJob::Run {
            suite,
            backend,
            pending,
        } => {
            let cases = match suite {
                "sequential" => sequential::DEFAULT_CASES,
                _ => concurrent::DEFAULT_CASES,
            };
            let config = SuiteConfig::new(suite, cases, seed, true);
            match (pending, SuiteBackend::on(backend, pg_url)) {
                (Some(_), _) | (None, None) => SuiteResult::pending(
                    suite,
                    Some(backend),
                    implementation,
                    &config,
                    reason_or_unsupported(pending),
                ),
                (None, Some(target)) => match suite {
                    "sequential" => sequential::run(&target, implementation, &config),
                    _ => concurrent::run(&target, implementation, &config),
                },
            }
        }
    };
    run_ordered(&jobs, pool, &work, done)
}

/// A PENDING suite's reason: PostgreSQL's, or (never reached: such jobs are not made) that
/// the backend runs no suite.
fn reason_or_unsupported(pending: Option<&str>) -> String {
    pending.map_or_else(|| "no suite on this backend".to_string(), str::to_string)
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
    /// Where REPORT.md goes; `report.json` and `report.junit.xml` go beside it.
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
    /// `--filter` patterns: run only what matches (see [`Filter`]); empty runs everything.
    pub filters: Vec<String>,
    /// Runs of each black-box scenario (`--repeat`), at least 1.
    pub repeat: usize,
    /// Show a progress bar on stderr (the CLI sets it when stderr is a terminal and `CI` is
    /// unset).
    pub progress: bool,
    /// Where the `[lease]` scenarios and the kill matrix's lease gate find Redis.
    pub lease: LeaseRunOptions,
    /// Make a scenario or gate that needs Redis and cannot reach it an error (exit 3).
    pub require_redis: bool,
    /// Independent runs at once ([`crate::jobs`]; 1: one after another). The default of the
    /// CLI is [`crate::jobs::default_jobs`].
    pub jobs: usize,
    /// `--force`: replace report files the tool did not write (not listed in their folder's
    /// manifest, [`crate::outputs`]); never through a symlink. `--update-report` sets it.
    pub force: bool,
}

/// What `--filter` selects. A pattern matches a part when the part's name contains it
/// (case-sensitive substring, as `cargo test` filters): scenario names, `property:fingerprint`,
/// `property:sequential`, `property:concurrent`, `kill-matrix`, `faults`, `soak`. Loom models are
/// read from `reports/loom.json`, not run, and always shown.
#[derive(Debug, Clone, Default)]
pub struct Filter(pub Vec<String>);

/// The names `--filter` can select besides scenarios.
pub const FILTERABLE_PARTS: [&str; 6] = [
    "property:fingerprint",
    "property:sequential",
    "property:concurrent",
    "kill-matrix",
    "faults",
    "soak",
];

impl Filter {
    /// Whether `name` is selected.
    pub fn selects(&self, name: &str) -> bool {
        self.0.is_empty() || self.0.iter().any(|p| name.contains(p.as_str()))
    }
}

/// Where an ordinary `verify` writes its report (gitignored in this repository): a run's
/// outputs never touch the tracked evidence unless `--update-report` asks for it.
pub const OUTPUT_DIR: &str = "ticketflow-report";

/// The options that narrow a `verify` run, each as `verify` names it in messages and in the
/// report (`--backend sqlite`, `--no-kill-matrix`, …): a run with any of them checks less
/// than a full run, or checks it with other settings than the shipped ones, so its report is
/// partial ([`report_location`]).
///
/// Narrowing: `--filter`; `--no-kill-matrix`; `--backend` other than `both`; `--isolation`
/// without all three levels; `--sqlite-journal` or `--sqlite-tx` without every value; a
/// `--protocol` other than the default (`savepoint`); a retry policy other than the default
/// (`--no-retry`, `--max-attempts`, `--base-backoff-ms`, `--max-backoff-ms`). Not narrowing:
/// `--repeat` (more runs of the black-box scenarios), `--restart-postgres` (one more case),
/// `--seed` (the same suites, replayable), `--scenarios`, `--pg-url`, `--lease`,
/// `--lease-ttl-ms`, `--jobs` and the `--require-*` options (where and how strictly, not what).
pub fn narrowed_by(opts: &VerifyOptions) -> Vec<String> {
    use crate::store::sqlite::{JournalMode, TxMode};
    let mut out = Vec::new();
    if !opts.filters.is_empty() {
        out.push("--filter".to_string());
    }
    if !opts.kill_matrix {
        out.push("--no-kill-matrix".to_string());
    }
    let backends = opts.selection.backends();
    if !Backend::ALL.iter().all(|b| backends.contains(b)) {
        let names: Vec<&str> = backends.iter().map(|b| b.name()).collect();
        out.push(format!("--backend {}", names.join(",")));
    }
    let isolation = &opts.selection.isolation;
    if !isolation.is_empty() && !IsolationLevel::ALL.iter().all(|l| isolation.contains(l)) {
        out.push("--isolation".to_string());
    }
    let sqlite = &opts.selection.sqlite;
    let journals = [JournalMode::Wal, JournalMode::Delete];
    let txs = [TxMode::Lazy, TxMode::Deferred, TxMode::Immediate];
    let has = |journal, tx| sqlite.contains(&RunSetting::Sqlite { journal, tx });
    if !sqlite.is_empty() {
        if !journals.iter().all(|&j| txs.iter().any(|&t| has(j, t))) {
            out.push("--sqlite-journal".to_string());
        }
        if !txs.iter().all(|&t| journals.iter().any(|&j| has(j, t))) {
            out.push("--sqlite-tx".to_string());
        }
    }
    if opts.protocol != crate::protocol::Protocol::default() {
        out.push(format!("--protocol {}", opts.protocol));
    }
    let shipped = RetryPolicy::default();
    if opts.retry == RetryPolicy::NONE && shipped != RetryPolicy::NONE {
        out.push("--no-retry".to_string());
    } else {
        if opts.retry.max_attempts != shipped.max_attempts {
            out.push("--max-attempts".to_string());
        }
        if opts.retry.base_backoff != shipped.base_backoff {
            out.push("--base-backoff-ms".to_string());
        }
        if opts.retry.max_backoff != shipped.max_backoff {
            out.push("--max-backoff-ms".to_string());
        }
    }
    out
}

/// Where REPORT.md goes, from `--report` (`explicit`), `--update-report` and the options that
/// narrowed the run (`narrowed_by`, from [`narrowed_by`]):
/// - `--update-report`: the tracked `REPORT.md` in the working directory (with its details
///   under `reports/details/`), only from a full run without `--report`;
/// - `--report PATH`: there;
/// - otherwise [`OUTPUT_DIR`]`/REPORT.md`, or [`OUTPUT_DIR`]`/partial/REPORT.md` for a narrowed
///   run, so a partial report never replaces a full one.
///
/// The folder is created when missing (but for `--update-report`'s, the working directory).
///
/// Will return `Err` ([`VerifyError::UpdateReport`], [`VerifyError::UpdateReportNarrowed`]) for
/// `--update-report` with `--report` or a narrowing option, or [`VerifyError::ReportPath`]
/// when the folder cannot be created.
pub fn report_location(
    explicit: Option<&Path>,
    update_report: bool,
    narrowed_by: &[String],
) -> Result<PathBuf, VerifyError> {
    let path = report_path(explicit, update_report, narrowed_by)?;
    let dir = path.parent().unwrap_or(Path::new(""));
    if !update_report && !dir.as_os_str().is_empty() {
        std::fs::create_dir_all(dir).map_err(|e| VerifyError::ReportPath {
            path: dir.to_path_buf(),
            why: format!("cannot create the output folder: {e}"),
        })?;
    }
    Ok(path)
}

/// Whether `dir` is the shipped `scenarios/` of the working directory (the same directory,
/// however written): the only one `--update-report` takes.
pub fn is_shipped_scenarios(dir: &Path) -> bool {
    match (
        std::fs::canonicalize(dir),
        std::fs::canonicalize(DEFAULT_SCENARIOS),
    ) {
        (Ok(given), Ok(shipped)) => given == shipped,
        _ => dir == Path::new(DEFAULT_SCENARIOS),
    }
}

/// The scenario directory `verify` and `scenario run` read by default (`--scenarios`).
pub const DEFAULT_SCENARIOS: &str = "scenarios";

/// [`report_location`]'s choice of path, without creating any folder.
///
/// Will return `Err` as [`report_location`] does for `--update-report`.
pub fn report_path(
    explicit: Option<&Path>,
    update_report: bool,
    narrowed_by: &[String],
) -> Result<PathBuf, VerifyError> {
    match (explicit, update_report) {
        (Some(_), true) => Err(VerifyError::UpdateReport(
            "it always writes REPORT.md in the working directory; drop --report",
        )),
        (None, true) if !narrowed_by.is_empty() => {
            Err(VerifyError::UpdateReportNarrowed(narrowed_by.to_vec()))
        }
        (None, true) => Ok(PathBuf::from("REPORT.md")),
        (Some(path), false) => Ok(path.to_path_buf()),
        (None, false) if narrowed_by.is_empty() => Ok(Path::new(OUTPUT_DIR).join("REPORT.md")),
        (None, false) => Ok(Path::new(OUTPUT_DIR).join("partial").join("REPORT.md")),
    }
}

/// The loom report `verify` reads: `ticketflow-report/loom.json` (what `scripts/loom.sh`
/// writes on an ordinary run) when it is usable (fresh for the sources), else the tracked
/// `reports/loom.json` (written by `scripts/loom.sh --update-report`), both beside the
/// scenario directory's parent. Returns the path chosen and the loaded report.
pub fn load_loom(scenarios: &Path) -> (PathBuf, LoomReport) {
    let root = scenarios.join("..");
    let own = root.join(OUTPUT_DIR).join("loom.json");
    if own.exists() {
        let loaded = LoomReport::load(&own);
        if loaded.unusable.is_none() {
            return (own, loaded);
        }
    }
    let tracked = root.join("reports/loom.json");
    let loaded = LoomReport::load(&tracked);
    (tracked, loaded)
}

/// The paths of the three outputs for a REPORT.md path: `(REPORT.md, report.json,
/// report.junit.xml)`, the last two in the same directory.
pub fn output_paths(report: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let dir = report.parent().unwrap_or(Path::new(""));
    (
        report.to_path_buf(),
        dir.join("report.json"),
        dir.join("report.junit.xml"),
    )
}

/// Where isolation-tester specs of failing PostgreSQL runs go: `isolation-specs/` beside
/// REPORT.md.
pub fn spec_dir(report: &Path) -> PathBuf {
    report.parent().unwrap_or(Path::new("")).join(SPEC_DIR)
}

/// The folder, relative to REPORT.md's, of the isolation specs ([`spec_dir`]).
pub const SPEC_DIR: &str = "isolation-specs";

/// Result of a verify run.
#[derive(Debug)]
pub struct VerifyOutcome {
    /// Every run.
    pub runs: Vec<ScenarioRun>,
    /// Every black-box scenario, with its repeats.
    pub targets: Vec<crate::target::TargetOutcome>,
    /// Every property suite.
    pub suites: Vec<SuiteResult>,
    /// The kill matrix, when it ran.
    pub kill: Option<KillMatrix>,
    /// The loom models, read from the loom report (never run by `verify`).
    pub loom: LoomReport,
    /// Faults and bad input, when selected.
    pub faults: Option<crate::faults::FaultReport>,
    /// The short soak, when selected.
    pub soak: Option<crate::soak::SoakReport>,
    /// Isolation specs written for failing PostgreSQL runs.
    pub specs: Vec<ExportedSpec>,
    /// What `--filter` left out.
    pub not_selected: Vec<String>,
    /// PASS / FAIL / PENDING over everything, as REPORT.md's headline counts them.
    pub totals: crate::report::Totals,
    /// The process exit code.
    pub exit_code: i32,
}

fn progress_bar(enabled: bool, len: u64) -> indicatif::ProgressBar {
    if !enabled {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {wide_msg}",
    ) {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// What `verify`'s filters select: scenarios, black-box scenarios, property suites, the kill
/// matrix (only when `opts.kill_matrix`) and the fault cases, and what they leave out.
struct Selected {
    scenarios: Vec<Scenario>,
    targets: Vec<crate::target::TargetScenario>,
    suites: Vec<&'static str>,
    kill: bool,
    faults: bool,
    soak: bool,
    not_selected: Vec<String>,
}

/// Applies `opts.filters` to the loaded scenarios and the other parts of `verify`.
///
/// Will return `Err` if the filters select nothing.
fn select(
    opts: &VerifyOptions,
    all_scenarios: &[Scenario],
    targets: Vec<crate::target::TargetScenario>,
) -> Result<Selected, VerifyError> {
    let filter = Filter(opts.filters.clone());
    let mut not_selected: Vec<String> = Vec::new();
    let scenarios: Vec<Scenario> = all_scenarios
        .iter()
        .filter(|s| {
            let keep = filter.selects(&s.name);
            if !keep {
                not_selected.push(format!("scenario `{}`", s.name));
            }
            keep
        })
        .cloned()
        .collect();
    let target_scenarios: Vec<crate::target::TargetScenario> = targets
        .into_iter()
        .filter(|s| {
            let keep = filter.selects(&s.name);
            if !keep {
                not_selected.push(format!("scenario `{}`", s.name));
            }
            keep
        })
        .collect();
    let part = |name: &str, not_selected: &mut Vec<String>| {
        let keep = filter.selects(name);
        if !keep {
            not_selected.push(name.to_string());
        }
        keep
    };
    let suites_selected: Vec<&'static str> = ["fingerprint", "sequential", "concurrent"]
        .into_iter()
        .filter(|s| part(&format!("property:{s}"), &mut not_selected))
        .collect();
    let run_kill = opts.kill_matrix && part("kill-matrix", &mut not_selected);
    let run_faults = part("faults", &mut not_selected);
    let run_soak = part("soak", &mut not_selected);
    if scenarios.is_empty()
        && target_scenarios.is_empty()
        && suites_selected.is_empty()
        && !run_kill
        && !run_faults
        && !run_soak
    {
        return Err(VerifyError::NothingSelected(opts.filters.clone()));
    }
    Ok(Selected {
        scenarios,
        targets: target_scenarios,
        suites: suites_selected,
        kill: run_kill,
        faults: run_faults,
        soak: run_soak,
        not_selected,
    })
}

/// A part of `verify` that has just finished, handed to [`verify_reporting`]'s callback so
/// the caller can print it at once (an interrupt later loses nothing already printed).
#[derive(Debug, Clone, Copy)]
pub enum Finished<'a> {
    /// A library scenario's run on one matrix cell.
    Run(&'a ScenarioRun),
    /// A black-box scenario, with its repeats.
    Target(&'a crate::target::TargetOutcome),
    /// A property suite on one backend.
    Suite(&'a SuiteResult),
    /// The loom models, read (not run) from the loom report at `path`.
    Loom {
        /// The models as read, or why they could not be.
        report: &'a LoomReport,
        /// The file they were read from.
        path: &'a Path,
    },
    /// The kill matrix.
    KillMatrix(&'a KillMatrix),
    /// The fault and bad-input cases.
    Faults(&'a crate::faults::FaultReport),
    /// The short soak.
    Soak(&'a crate::soak::SoakReport),
}

/// Runs `verify`: load scenarios, run what is selected, write REPORT.md, `report.json` and
/// `report.junit.xml`, export failing PostgreSQL races as isolation specs.
///
/// Will return `Err` for a bad scenario file (nothing runs), a filter that selects nothing,
/// or when an output cannot be written.
pub fn verify(opts: &VerifyOptions) -> Result<VerifyOutcome, VerifyError> {
    verify_reporting(opts, &|_| {})
}

/// [`verify`], calling `finished` with each part as soon as it is done: runs and black-box
/// scenarios in order, then the property suites, the loom models read, the kill matrix, the
/// faults and the soak.
///
/// Will return `Err` as [`verify`] does.
pub fn verify_reporting(
    opts: &VerifyOptions,
    finished: &dyn Fn(Finished<'_>),
) -> Result<VerifyOutcome, VerifyError> {
    let loaded = match load_all(&opts.scenarios) {
        Err(LoadError::EmptyDirectory(_)) => Loaded::default(),
        other => other?,
    };
    let all_scenarios = loaded.scenarios;
    if all_scenarios.is_empty() && loaded.targets.is_empty() {
        return Err(VerifyError::NoScenarios(opts.scenarios.clone()));
    }
    check_report_path(&opts.report)?;
    // Refused before anything runs: a symlinked output folder, a foreign report file.
    let mut outputs = ReportOutputs::open(&opts.report, opts.force)?;
    let Selected {
        scenarios,
        targets: target_scenarios,
        suites: suites_selected,
        kill: run_kill,
        faults: run_faults,
        soak: run_soak,
        not_selected,
    } = select(opts, &all_scenarios, loaded.targets)?;

    let (backends, pg_unusable) = probe_selected(opts);
    let wants_pg = backends.contains(&Backend::Postgres);
    let implementation = crate::variants::Implementation::Protocol(opts.protocol);
    let mut base = PgOptions::new(opts.pg_url.clone());
    base.implementation = implementation;
    base.lease = opts.lease.clone();
    let cells: usize = scenarios
        .iter()
        .map(|s| opts.selection.settings(s).len())
        .sum();
    let bar = progress_bar(
        opts.progress,
        (cells
            + target_scenarios.len()
            + suites_selected
                .iter()
                .map(|s| {
                    if *s == "fingerprint" {
                        1
                    } else {
                        backends.len()
                    }
                })
                .sum::<usize>()
            + usize::from(run_kill)
            + usize::from(run_faults)
            + usize::from(run_soak)) as u64,
    );
    let budget = session_budget(&opts.pg_url, pg_unusable.as_deref());
    let pool = Pool::new(opts.jobs, budget);
    // The soak runs beside the kill matrix and the fault cases: it is traffic for a fixed
    // time, and they leave the machine room. Its sessions come out of their budget. Under
    // `--restart-postgres` it runs alone at the end instead, since the restart cuts every
    // session on the server.
    let soak_options = short_soak_options(opts);
    let beside = soak_beside_what(run_kill, run_faults);
    let soak_alongside =
        run_soak && wants_pg && pg_unusable.is_none() && !opts.restart_postgres && beside.is_some();
    let pool_beside_soak = if soak_alongside {
        Pool::new(
            opts.jobs,
            budget.saturating_sub(soak_options.pg_sessions()).max(1),
        )
    } else {
        pool
    };
    let mut timer = PhaseTimer::start(opts.jobs);
    // Scratch databases are emptied and reused rather than dropped until the phases end.
    let recycling = crate::store::scratch::recycling();
    let mark = timer.mark();
    let ran = run_all_on(
        &scenarios,
        &opts.selection,
        &base,
        &opts.retry,
        pg_unusable.as_deref(),
        pool,
        &mut |r: &ScenarioRun| {
            bar.suspend(|| finished(Finished::Run(r)));
            bar.inc(1);
            bar.set_message(format!("{} [{}]", r.scenario, r.setting.label()));
        },
    );
    timer.phase(mark, "scenario runs", ran.results.len(), Some(ran.busy));
    let runs = ran.results;
    let mark = timer.mark();
    // The black-box scenarios write their failing schedules' specs as each finishes (so its
    // printed line can name the file); the previous run's stale ones go when the report is
    // written.
    let targets = run_targets(
        &target_scenarios,
        opts,
        wants_pg,
        pg_unusable.as_deref(),
        &mut outputs.specs,
        &|t| {
            bar.suspend(|| finished(Finished::Target(t)));
            bar.inc(1);
            bar.set_message(t.scenario.clone());
        },
    );
    timer.phase(mark, "black-box targets", targets.len(), None);
    bar.set_message("property suites");
    let mark = timer.mark();
    let ran = run_selected_property_suites_on(
        &suites_selected,
        &backends,
        &opts.pg_url,
        pg_unusable.as_deref(),
        opts.seed,
        implementation,
        pool,
        &mut |s| {
            bar.suspend(|| finished(Finished::Suite(s)));
            bar.inc(1);
        },
    );
    timer.phase(mark, "property suites", ran.results.len(), Some(ran.busy));
    let suites: Vec<SuiteResult> = ran.results;
    let (loom_path, loom) = load_loom(&opts.scenarios);
    bar.suspend(|| {
        finished(Finished::Loom {
            report: &loom,
            path: &loom_path,
        })
    });
    let soak_started = Instant::now();
    let soak_beside = soak_alongside.then(|| {
        let s = soak_options.clone();
        std::thread::spawn(move || {
            let started = Instant::now();
            let mut report = crate::soak::run(&s);
            report.alongside = beside.map(str::to_string);
            (report, started.elapsed())
        })
    });
    bar.set_message("kill matrix");
    let mark = timer.mark();
    let kill = run_kill.then(|| {
        run_kill_matrix(
            opts,
            &all_scenarios,
            pg_unusable.as_deref(),
            &loom_path,
            &loom,
            pool_beside_soak,
        )
    });
    if let Some((k, _)) = &kill {
        bar.suspend(|| finished(Finished::KillMatrix(k)));
        bar.inc(1);
    }
    let (kill, kill_busy) = match kill {
        Some((k, busy)) => (Some(k), Some(busy)),
        None => (None, None),
    };
    if run_kill {
        // Its gate runs, as the summary counts them (not the cells whose gate does not apply).
        let cells = kill.as_ref().map_or(0, KillMatrix::gate_runs);
        timer.phase(mark, "kill matrix (gate runs)", cells, kill_busy);
    }
    bar.set_message("fault cases");
    let mark = timer.mark();
    let faults = run_faults.then(|| run_fault_cases(opts, pg_unusable.as_deref()));
    if let Some(f) = &faults {
        bar.suspend(|| finished(Finished::Faults(f)));
        // The cases that ran, as the headline's "N fault cases (R ran: …)" counts them.
        timer.phase(mark, "fault cases (ran)", f.tally().ran, None);
    }
    bar.inc(u64::from(run_faults));
    bar.set_message("soak");
    let soak = match soak_beside {
        Some(thread) => {
            let (report, took) = thread.join().unwrap_or_else(|panic| {
                // A panic is a bug of ours; the soak is then FAIL, not lost.
                let why = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                (
                    crate::soak::SoakReport::failed(
                        &soak_options,
                        format!("the soak panicked: {why}"),
                    ),
                    soak_started.elapsed(),
                )
            });
            timer.phase_beside("soak", took, beside.unwrap_or_default());
            Some(report)
        }
        None => {
            let mark = timer.mark();
            let soak =
                run_soak.then(|| run_short_soak(&soak_options, wants_pg, pg_unusable.as_deref()));
            if soak.is_some() {
                timer.phase(mark, "soak", 1, None);
            }
            soak
        }
    };
    if let Some(s) = &soak {
        bar.suspend(|| finished(Finished::Soak(s)));
        bar.inc(1);
    }
    let mark = timer.mark();
    let spares = crate::store::scratch::spares();
    drop(recycling);
    timer.phase(mark, "spare scratch databases dropped", spares, None);
    bar.finish_and_clear();

    let mut specs = export_failing_races(&runs, &mut outputs.specs);
    specs.extend(targets.iter().filter_map(|t| {
        let f = t.failing_schedule.as_ref()?;
        Some(ExportedSpec {
            scenario: t.scenario.clone(),
            setting: format!("schedule {}", f.schedule_id),
            path: f.isolation_spec_path.clone()?,
        })
    }));
    let mut ctx = report_context(opts);
    ctx.timings = timer.finish();
    let target_descriptions: Vec<(String, String)> = target_scenarios
        .iter()
        .map(|s| (s.name.clone(), s.description.clone()))
        .collect();
    let input = ReportInput {
        scenarios: &scenarios,
        runs: &runs,
        targets: &targets,
        target_descriptions: &target_descriptions,
        suites: &suites,
        kill: kill.as_ref(),
        loom: &loom,
        faults: faults.as_ref(),
        soak: soak.as_ref(),
        ctx: &ctx,
        specs: &specs,
        not_selected: &not_selected,
    };
    let mut exit_code = report_exit_code(&input, pg_unusable.as_deref(), opts.require_postgres);
    if exit_code == EXIT_PASS && opts.require_redis && redis_missing(&input) {
        exit_code = EXIT_PENDING;
    }
    write_outputs(outputs, &input, exit_code, &crate::report::Scope::Verify)?;
    let totals = crate::report::Totals::of(&input);
    Ok(VerifyOutcome {
        totals,
        exit_code,
        runs,
        targets,
        suites,
        kill,
        loom,
        faults,
        soak,
        specs,
        not_selected,
    })
}

/// The backends `verify` runs (the selection's, or both) and, when PostgreSQL is among them,
/// why it is unusable (`None`: it answered the probe).
fn probe_selected(opts: &VerifyOptions) -> (Vec<Backend>, Option<String>) {
    let backends = opts.selection.backends();
    let pg_unusable = backends
        .contains(&Backend::Postgres)
        .then(|| pg_unusable(&opts.pg_url))
        .flatten();
    (backends, pg_unusable)
}

/// Why the PostgreSQL server at `url` cannot be used (the probe's error, as PENDING reasons
/// quote it), or `None` when it answered.
fn pg_unusable(url: &str) -> Option<String> {
    probe_postgres(url).err().map(|e| e.to_string())
}

/// The output folders of a report at `report` (REPORT.md's path): its own folder (REPORT.md,
/// `report.json`, `report.steps.json`, `report.junit.xml`; files of an earlier report under
/// another name stay), [`crate::report::markdown::DETAILS_DIR`] and `isolation-specs/` (both
/// swept: a file the previous run listed and this one does not write is removed). Each keeps a
/// manifest ([`crate::outputs`]).
#[derive(Debug)]
pub struct ReportOutputs {
    /// REPORT.md's folder.
    pub root: crate::outputs::OutputDir,
    /// The detail pages' folder.
    pub details: crate::outputs::OutputDir,
    /// The isolation specs' folder ([`spec_dir`]).
    pub specs: crate::outputs::OutputDir,
    /// REPORT.md's file name.
    md_name: String,
}

impl ReportOutputs {
    /// Opens the output folders of a report at `report` and checks, before anything runs,
    /// that REPORT.md, `report.json`, `report.steps.json` and `report.junit.xml` can be
    /// written: none is a symlink or a foreign file (unless `force`), and neither
    /// `reports/`, `reports/details/` nor `isolation-specs/` is a symlink.
    ///
    /// Will return `Err` ([`VerifyError::Refused`]) for the first that cannot, or
    /// ([`VerifyError::ReportPath`]) for a path without a file name.
    pub fn open(report: &Path, force: bool) -> Result<Self, VerifyError> {
        use crate::outputs::OutputDir;
        let base = report.parent().unwrap_or(Path::new(""));
        let md_name = report
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| VerifyError::ReportPath {
                path: report.to_path_buf(),
                why: "it has no file name (UTF-8) to write REPORT.md as".into(),
            })?
            .to_string();
        let outputs = ReportOutputs {
            root: OutputDir::open(base, "", force, false)?,
            details: OutputDir::open(base, crate::report::markdown::DETAILS_DIR, force, true)?,
            specs: OutputDir::open(base, SPEC_DIR, force, true)?,
            md_name,
        };
        for name in outputs.root_names() {
            outputs.root.check(&name)?;
        }
        Ok(outputs)
    }

    /// The file names written into REPORT.md's folder.
    fn root_names(&self) -> [String; 4] {
        [
            self.md_name.clone(),
            "report.json".into(),
            "report.steps.json".into(),
            "report.junit.xml".into(),
        ]
    }
}

/// Writes REPORT.md, its detail files under `reports/details/`, `report.json`,
/// `report.steps.json` and `report.junit.xml` into `outputs` ([`output_paths`]), each
/// rendered for `scope`; `report.json`'s `exit_code` is `exit_code`. Every file is checked
/// before the first is written; then the stale files of the previous run are removed
/// ([`crate::outputs::OutputDir::finish`]) and the manifests written. Returns the paths
/// written: REPORT.md, the details folder, report.json, report.steps.json, report.junit.xml.
///
/// Will return `Err` ([`VerifyError::WriteRefused`]) when one of them cannot be written.
fn write_outputs(
    mut outputs: ReportOutputs,
    input: &ReportInput<'_>,
    exit_code: i32,
    scope: &crate::report::Scope,
) -> Result<Vec<PathBuf>, VerifyError> {
    let refused = VerifyError::WriteRefused;
    let details = crate::report::markdown::render_details(input);
    let [md, json, steps, junit] = outputs.root_names();
    let root_files = [
        (md, crate::report::markdown::render_scoped(input, scope)),
        (
            json,
            crate::report::json::render_scoped(input, exit_code, scope),
        ),
        (steps, crate::report::json::render_steps(input)),
        (junit, crate::report::junit::render_scoped(input, scope)),
    ];
    for (name, _) in &details {
        outputs.details.check(name).map_err(refused)?;
    }
    for (name, _) in &root_files {
        outputs.root.check(name).map_err(refused)?;
    }
    for (name, text) in &details {
        outputs
            .details
            .write(name, text.as_bytes())
            .map_err(refused)?;
    }
    let mut written = Vec::new();
    for (name, text) in &root_files {
        written.push(outputs.root.write(name, text.as_bytes()).map_err(refused)?);
    }
    let details_dir = outputs.details.path().to_path_buf();
    outputs.details.finish().map_err(refused)?;
    outputs.specs.finish().map_err(refused)?;
    outputs.root.finish().map_err(refused)?;
    written.insert(1, details_dir);
    Ok(written)
}

/// The kill matrix over `scenarios`, its loom gate read from `loom` (loaded from `loom_path`),
/// cells at once within `pool`; with the cells' summed duration.
fn run_kill_matrix(
    opts: &VerifyOptions,
    scenarios: &[Scenario],
    pg_unusable: Option<&str>,
    loom_path: &Path,
    loom: &LoomReport,
    pool: Pool,
) -> (KillMatrix, Duration) {
    crate::killmatrix::run_on(
        scenarios,
        &KillOptions {
            pg_url: opts.pg_url.clone(),
            pg_unusable: pg_unusable.map(str::to_string),
            cases: KILL_MATRIX_CASES,
            seed: opts.seed,
            loom_report: loom_path.to_path_buf(),
            worker_exe: None,
            lease: opts.lease.clone(),
            interposed: crate::killmatrix::load_interposed(
                &opts.scenarios.join(crate::killmatrix::INTERPOSED_DIR),
            ),
        },
        loom,
        pool,
    )
}

/// The exit code of a `verify` whose results are in `input` ([`exit_code`]): library runs,
/// black-box scenarios and the soak PENDING for want of the PostgreSQL server, and the
/// property suites, kill matrix and fault cases (PENDING only for their PostgreSQL parts), are
/// the embedded fallback; every other PENDING is decisive. Runs PENDING for want of Redis are
/// `--require-redis`'s business.
fn report_exit_code(
    input: &ReportInput<'_>,
    unusable: Option<&str>,
    require_postgres: bool,
) -> i32 {
    let (fallback_runs, decisive_runs): (Vec<&ScenarioRun>, Vec<&ScenarioRun>) = input
        .runs
        .iter()
        .filter(|r| !redis_pending_run(r))
        .partition(|r| postgres_missing_run(r, unusable));
    // A black-box scenario that never started (no run has evidence) was skipped for want of
    // PostgreSQL; one that raced and is PENDING was not run as declared.
    let (fallback_targets, decisive_targets): (Vec<_>, Vec<_>) = input
        .targets
        .iter()
        .partition(|t| t.runs.iter().all(|r| r.evidence.is_none()));
    let decisive = decisive_runs
        .iter()
        .map(|r| r.verdict)
        .chain(decisive_targets.iter().map(|t| t.verdict))
        // A loom model with an unexpected result fails verify; a missing report does not
        // block it (it is shown PENDING).
        .chain((input.loom.verdict() == Verdict::Fail).then_some(Verdict::Fail));
    let fallback = fallback_runs
        .iter()
        .map(|r| r.verdict)
        .chain(fallback_targets.iter().map(|t| t.verdict))
        .chain(input.suites.iter().map(|s| s.verdict))
        .chain(input.kill.iter().map(|k| k.postgres_verdict()))
        .chain(input.faults.iter().map(|f| f.postgres_verdict()))
        // The soak runs on PostgreSQL only: its PENDING is a PostgreSQL PENDING.
        .chain(input.soak.iter().map(|s| s.verdict));
    exit_code(decisive, fallback, require_postgres)
}

/// Whether `run` is PENDING because Redis could not be used: `require_redis`'s business, left
/// out of the PostgreSQL requirement ([`exit_code`]).
fn redis_pending_run(run: &ScenarioRun) -> bool {
    run.verdict == Verdict::Pending && redis_pending(run.reason.as_deref())
}

/// Whether a `[lease]` run or a lease-gate cell is PENDING because Redis could not be used
/// (`--require-redis` makes that exit 3).
fn redis_missing(input: &ReportInput<'_>) -> bool {
    input.runs.iter().any(|r| redis_pending(r.reason.as_deref()))
        || input.kill.is_some_and(|k| {
            k.cells.iter().any(|c| {
                matches!(&c.outcome, crate::killmatrix::GateOutcome::Pending(why) if redis_pending(Some(why)))
            })
        })
}

/// How long `verify`'s soak runs.
const VERIFY_SOAK: Duration = Duration::from_secs(4);
/// How long `verify`'s soak runs under `--restart-postgres` (the restart needs a longer window).
const VERIFY_SOAK_WITH_RESTART: Duration = Duration::from_secs(8);

/// What the soak runs beside (the report names it): the kill matrix and the fault cases, those
/// of them selected; `None` when neither runs, and the soak then runs on its own.
fn soak_beside_what(kill_matrix: bool, faults: bool) -> Option<&'static str> {
    match (kill_matrix, faults) {
        (true, true) => Some("the kill matrix and the fault cases"),
        (true, false) => Some("the kill matrix"),
        (false, true) => Some("the fault cases"),
        (false, false) => None,
    }
}

/// `verify`'s short soak: `ticketflow soak` for a few seconds ([`VERIFY_SOAK`]), 4
/// connections, 2 tenants, the default faults, and the PostgreSQL restart under
/// `--restart-postgres` ([`VERIFY_SOAK_WITH_RESTART`]).
fn short_soak_options(opts: &VerifyOptions) -> crate::soak::SoakOptions {
    use crate::soak::{FaultKind, SoakOptions};
    let mut s = SoakOptions::new(opts.pg_url.clone());
    s.connections = 4;
    s.tenants = 2;
    s.seed = opts.seed.unwrap_or(1);
    s.duration = VERIFY_SOAK;
    if opts.restart_postgres {
        s.faults.push(FaultKind::RestartPostgres);
        s.duration = VERIFY_SOAK_WITH_RESTART;
    }
    s
}

/// The soak of `s`, run now; PENDING when PostgreSQL is not selected or unusable.
fn run_short_soak(
    s: &crate::soak::SoakOptions,
    wants_pg: bool,
    pg_unusable: Option<&str>,
) -> crate::soak::SoakReport {
    use crate::soak::SoakReport;
    match (wants_pg, pg_unusable) {
        (false, _) => SoakReport::pending(s, "PostgreSQL not selected (--backend)"),
        (true, Some(why)) => SoakReport::pending(s, why),
        (true, None) => crate::soak::run(s),
    }
}

/// The fault and bad-input cases with the savepoint protocol (and the restart, if asked for),
/// then with each other create protocol.
fn run_fault_cases(opts: &VerifyOptions, pg_unusable: Option<&str>) -> crate::faults::FaultReport {
    use crate::protocol::Protocol;
    let mut faults = crate::faults::run(&opts.pg_url, pg_unusable, opts.restart_postgres);
    // The other create protocols are controls too: their fault cases must pass.
    for protocol in Protocol::ALL.into_iter().skip(1) {
        faults.absorb(crate::faults::run_protocol(
            protocol,
            &opts.pg_url,
            pg_unusable,
        ));
    }
    faults
}

/// Writes the isolation specs into `out` (`isolation-specs/` beside REPORT.md), one per
/// failing PostgreSQL run.
fn export_failing_races(
    runs: &[ScenarioRun],
    out: &mut crate::outputs::OutputDir,
) -> Vec<ExportedSpec> {
    let mut specs = Vec::new();
    for r in runs
        .iter()
        .filter(|r| r.verdict == Verdict::Fail && r.backend == Backend::Postgres)
    {
        // A run that failed before the race has no timeline; it is reported, not exported.
        if let Ok(path) = crate::report::isolation::export(r, out) {
            specs.push(ExportedSpec {
                scenario: r.scenario.clone(),
                setting: r.setting.label(),
                path,
            });
        }
    }
    specs
}

/// Runs the black-box scenarios: PENDING with `pg_unusable`'s reason when their PostgreSQL is
/// not selected or not usable; a setup error (unreachable endpoint, missing table) is PENDING
/// with its reason, nothing raced.
fn run_targets(
    targets: &[crate::target::TargetScenario],
    opts: &VerifyOptions,
    wants_pg: bool,
    pg_unusable: Option<&str>,
    specs: &mut crate::outputs::OutputDir,
    done: &dyn Fn(&crate::target::TargetOutcome),
) -> Vec<crate::target::TargetOutcome> {
    use crate::target::run;
    let run_opts = crate::target::RunOptions {
        repeat: opts.repeat.max(1),
        ..crate::target::RunOptions::new(opts.pg_url.clone())
    };
    targets
        .iter()
        .map(|t| {
            let needs_pg = t.barrier.kind.server_side()
                || !t.target.counts.is_empty()
                || !t.target.services.is_empty();
            let skip = match (needs_pg, wants_pg, pg_unusable) {
                (true, false, _) => Some("PostgreSQL not selected (--backend sqlite)".to_string()),
                (true, true, Some(why)) => Some(why.to_string()),
                _ => None,
            };
            let mut outcome = match skip {
                Some(why) => run::summarise(t, vec![run::not_run(t, why)]),
                None => run::run_repeated(t, &run_opts)
                    .unwrap_or_else(|e| run::summarise(t, vec![run::not_run(t, e.to_string())])),
            };
            // A failing schedule's spec goes beside the library runs' specs; a write error is
            // kept in the outcome as the reason it has none.
            let _ = crate::report::isolation::export_schedule(&mut outcome, specs);
            tracing::info!(scenario = %outcome.scenario, verdict = %outcome.verdict, "black-box scenario finished");
            done(&outcome);
            outcome
        })
        .collect()
}

/// Options of `ticketflow scenario run`: the given files, library and black-box scenarios
/// alike.
#[derive(Debug, Clone)]
pub struct RunFilesOptions {
    /// Scenario files, in order.
    pub files: Vec<PathBuf>,
    /// PostgreSQL URL.
    pub pg_url: String,
    /// Matrix cells to run; `isolation` must be empty when a file is a black-box scenario.
    pub selection: Selection,
    /// The racers' retry policy.
    pub retry: RetryPolicy,
    /// `protocol`, `on-conflict` or a wrong variant, for the library scenarios.
    pub implementation: crate::variants::Implementation,
    /// Write each PostgreSQL run's race as an isolation-tester spec into this directory.
    pub export_isolation_spec: Option<PathBuf>,
    /// Runs of each black-box scenario, at least 1.
    pub repeat: usize,
    /// Overrides every black-box barrier's timeout.
    pub barrier_timeout: Option<Duration>,
    /// Where the `[lease]` scenarios find Redis.
    pub lease: LeaseRunOptions,
    /// A `[lease]` scenario that needs Redis and cannot reach it makes the exit 3.
    pub require_redis: bool,
    /// Make PENDING runs an error (exit 3), as `verify`'s `require_postgres` does: asked
    /// for, or the PostgreSQL URL was given rather than the default.
    pub require_postgres: bool,
    /// Hears a progress line every [`crate::target::run::WAIT_NOTICE`] while a black-box
    /// wave waits on its target ([`crate::target::RunOptions::on_wait`]).
    pub on_wait: Option<fn(&str)>,
    /// `--explore`: [`crate::target::RunOptions::explore`].
    pub explore: Option<crate::target::format::ExploreMode>,
    /// `--schedule`: [`crate::target::RunOptions::schedule`].
    pub schedule: Option<String>,
    /// `--keep-going`: [`crate::target::RunOptions::keep_going`].
    pub keep_going: bool,
    /// `--force`: replace files in `export_isolation_spec` (and the report's folders) that the
    /// tool did not write; never through a symlink ([`crate::outputs`]).
    pub force: bool,
}

/// What `scenario run` ran.
#[derive(Debug)]
pub struct RunFilesOutcome {
    /// Every library run, file order, then matrix order.
    pub runs: Vec<ScenarioRun>,
    /// Every black-box scenario, with its repeats.
    pub targets: Vec<crate::target::TargetOutcome>,
    /// Isolation specs written (`--export-isolation-spec`): of the library runs, and of the
    /// black-box scenarios' failing schedules.
    pub specs: Vec<PathBuf>,
    /// The process exit code ([`exit_code`], PostgreSQL required as
    /// [`RunFilesOptions::require_postgres`] says).
    pub exit_code: i32,
    /// The library scenarios loaded from the files, in file order (for the report).
    pub scenarios: Vec<Scenario>,
    /// Each black-box scenario's (name, description), in file order (for the report).
    pub target_descriptions: Vec<(String, String)>,
}

/// Runs `scenario run`: loads `opts.files` (each a library or a black-box scenario), probes
/// PostgreSQL when a selected cell needs it (PostgreSQL runs are PENDING when it does not
/// answer), runs the library scenarios on the selected cells, then each black-box scenario,
/// and exports the PostgreSQL races when asked.
///
/// Will return `Err` for a file that cannot be read or parsed, `--isolation` with a black-box
/// scenario, a library scenario with more racers than a selected backend can hold
/// ([`RunFilesError::Capacity`], checked before anything runs), a black-box scenario that
/// could not race ([`RunFilesError::Target`]), or a spec that cannot be written.
pub fn run_files(opts: &RunFilesOptions) -> Result<RunFilesOutcome, RunFilesError> {
    let loaded = crate::scenario::format::load(
        &opts.files,
        crate::scenario::format::LoadHints {
            directory: None,
            file: Some("give a path from there"),
        },
    )?;
    let (scenarios, targets) = (loaded.scenarios, loaded.targets);
    // A symlinked or unreadable export folder is refused before anything runs.
    let mut export = opts
        .export_isolation_spec
        .as_deref()
        .map(|dir| crate::outputs::OutputDir::open(dir, "", opts.force, false))
        .transpose()?;
    if !targets.is_empty() && !opts.selection.isolation.is_empty() {
        return Err(RunFilesError::IsolationForTargets);
    }
    let wants_pg = scenarios.iter().any(|s| {
        opts.selection
            .settings(s)
            .iter()
            .any(|x| x.backend() == Backend::Postgres)
    });
    let unusable = wants_pg.then(|| pg_unusable(&opts.pg_url)).flatten();
    refuse_what_cannot_fit(
        &scenarios,
        &opts.selection,
        (wants_pg && unusable.is_none()).then_some(opts.pg_url.as_str()),
    )?;
    let mut base = PgOptions::new(opts.pg_url.clone());
    base.implementation = opts.implementation;
    base.lease = opts.lease.clone();
    let runs = run_all(
        &scenarios,
        &opts.selection,
        &base,
        &opts.retry,
        unusable.as_deref(),
    );
    let target_descriptions: Vec<(String, String)> = targets
        .iter()
        .map(|t| (t.name.clone(), t.description.clone()))
        .collect();
    let target_opts = crate::target::RunOptions {
        repeat: opts.repeat,
        barrier_timeout: opts.barrier_timeout,
        on_wait: opts.on_wait,
        explore: opts.explore,
        schedule: opts.schedule.clone(),
        keep_going: opts.keep_going,
        ..crate::target::RunOptions::new(opts.pg_url.clone())
    };
    let targets = targets
        .iter()
        .map(|t| {
            // Nothing raced: the scenario or its target is not usable as given.
            crate::target::run_repeated(t, &target_opts).map_err(|source| RunFilesError::Target {
                file: t.file.clone(),
                source: Box::new(source),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut specs = Vec::new();
    if let Some(dir) = export.as_mut() {
        for r in runs.iter().filter(|r| r.evidence.is_some()) {
            if r.backend == Backend::Postgres {
                let path = crate::report::isolation::export(r, dir).map_err(|source| {
                    RunFilesError::Export {
                        written: specs.clone(),
                        source,
                    }
                })?;
                specs.push(path);
            }
        }
    }
    let mut targets = targets;
    if let Some(mut dir) = export {
        specs.extend(export_schedules(&mut targets, &mut dir));
        dir.finish().map_err(|source| RunFilesError::Export {
            written: specs.clone(),
            source: source.into(),
        })?;
    }
    let (fallback, decisive): (Vec<&ScenarioRun>, Vec<&ScenarioRun>) = runs
        .iter()
        .filter(|r| !redis_pending_run(r))
        .partition(|r| postgres_missing_run(r, unusable.as_deref()));
    let mut exit_code = exit_code(
        decisive
            .iter()
            .map(|r| r.verdict)
            .chain(targets.iter().map(|t| t.verdict)),
        fallback.iter().map(|r| r.verdict),
        opts.require_postgres,
    );
    let redis_missing = runs.iter().any(|r| redis_pending(r.reason.as_deref()));
    if exit_code == EXIT_PASS && opts.require_redis && redis_missing {
        exit_code = EXIT_PENDING;
    }
    Ok(RunFilesOutcome {
        runs,
        targets,
        specs,
        exit_code,
        scenarios,
        target_descriptions,
    })
}

/// Writes the isolation-tester spec of each failing interposed schedule in `targets` into
/// the output folder `out` (`scenario run --export-isolation-spec DIR`, or `isolation-specs/`
/// beside its `--report`) and records each path in its outcome; returns the paths written. A
/// spec that cannot be written is not an error of the run: the outcome keeps the reason
/// ([`crate::target::FailingSchedule::isolation_spec_missing`]).
pub fn export_schedules(
    targets: &mut [crate::target::TargetOutcome],
    out: &mut crate::outputs::OutputDir,
) -> Vec<PathBuf> {
    targets
        .iter_mut()
        .filter_map(|t| {
            crate::report::isolation::export_schedule(t, out)
                .ok()
                .flatten()
        })
        .map(|s| s.path)
        .collect()
}

/// Refuses a `scenario run --report` path before anything runs: it must name a Markdown file
/// (`*.md`) that is not a directory. Its directory need not exist ([`write_files_report`]
/// creates it).
///
/// Will return `Err` ([`VerifyError::ReportPath`]) for a path without the `.md` extension or
/// one that is a directory.
pub fn check_files_report_path(report: &Path) -> Result<(), VerifyError> {
    let bad = |why: &str| VerifyError::ReportPath {
        path: report.to_path_buf(),
        why: why.to_string(),
    };
    if report.is_dir() {
        return Err(bad("it is a directory; give the REPORT.md path to write"));
    }
    if !report
        .extension()
        .is_some_and(|x| x.eq_ignore_ascii_case("md"))
    {
        return Err(bad(
            "not a Markdown path (*.md); report.json and report.junit.xml go beside it",
        ));
    }
    Ok(())
}

/// Writes the report of a `scenario run` over `opts.files` ([`crate::report::Scope::Files`]):
/// REPORT.md at `report`, its detail files under `reports/details/`, `report.json`,
/// `report.steps.json` and `report.junit.xml` beside it ([`output_paths`]), creating
/// `report`'s directory when it is missing, into `outputs` (opened before the run with
/// [`ReportOutputs::open`], so a foreign file or a symlink was refused before anything ran). The report covers exactly the library runs and
/// black-box outcomes in `outcome`, says so, and names none of `verify`'s self-checks as run;
/// `report.json`'s `exit_code` is `outcome.exit_code`. Returns the paths written.
///
/// Will return `Err` ([`VerifyError::ReportPath`]) when the directory cannot be created, or
/// ([`VerifyError::WriteRefused`]) when a file cannot be written.
pub fn write_files_report(
    report: &Path,
    outputs: ReportOutputs,
    opts: &RunFilesOptions,
    outcome: &RunFilesOutcome,
) -> Result<Vec<PathBuf>, VerifyError> {
    use crate::report::Scope;
    let dir = match report.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir).map_err(|e| VerifyError::ReportPath {
        path: dir.to_path_buf(),
        why: format!("cannot create the report's directory: {e}"),
    })?;
    let ctx = files_report_context(opts);
    let loom = LoomReport::default();
    let input = ReportInput {
        scenarios: &outcome.scenarios,
        runs: &outcome.runs,
        targets: &outcome.targets,
        target_descriptions: &outcome.target_descriptions,
        suites: &[],
        kill: None,
        loom: &loom,
        faults: None,
        soak: None,
        ctx: &ctx,
        specs: &[],
        not_selected: &[],
    };
    let scope = Scope::Files(opts.files.iter().map(|f| f.display().to_string()).collect());
    write_outputs(outputs, &input, outcome.exit_code, &scope)
}

/// The report's context of a `scenario run` with `opts`: the command line and PostgreSQL URL
/// with any password hidden, the version, the git commit of the working directory (when it is
/// a checkout), the time and the create protocol (the default one when a wrong
/// implementation ran). No filters, seed or timings: `scenario run` has none.
fn files_report_context(opts: &RunFilesOptions) -> Context {
    use crate::store::url::redact;
    let command = std::env::args()
        .enumerate()
        .map(|(i, a)| {
            if i == 0 {
                "ticketflow".to_string()
            } else {
                redact(&a)
            }
        })
        .collect::<Vec<_>>()
        .join(" ");
    Context {
        command,
        pg_url: redact(&opts.pg_url),
        custom_pg_url: opts.pg_url != crate::store::url::DEFAULT_PG_URL,
        version: env!("CARGO_PKG_VERSION").to_string(),
        git_commit: git_commit(),
        generated_at: crate::domain::iso8601(crate::domain::now_utc()),
        filters: Vec::new(),
        narrowed_by: Vec::new(),
        seed: None,
        protocol: match opts.implementation {
            crate::variants::Implementation::Protocol(p) => p,
            crate::variants::Implementation::Variant(_) => crate::protocol::Protocol::default(),
        },
        timings: Timings::default(),
    }
}

/// Refuses the library scenarios, before any runs, when a selected backend cannot hold one's
/// racers ([`crate::scenario::capacity`]): this process's file descriptors, and the free
/// connection slots of the PostgreSQL server at `pg_url` (`None`: not used or not reachable;
/// its runs are PENDING). A server whose slots cannot be read is left to the run, which fails
/// with the reason.
///
/// Will return `Err` ([`RunFilesError::Capacity`]) for the first scenario that does not fit.
fn refuse_what_cannot_fit(
    scenarios: &[Scenario],
    selection: &Selection,
    pg_url: Option<&str>,
) -> Result<(), RunFilesError> {
    use crate::scenario::capacity::{check_scenario, CapacityError};
    let mut admin = pg_url
        .and_then(|u| crate::store::url::parse_postgres(u).ok())
        .and_then(|c| {
            crate::store::postgres::connect_as(&c, crate::store::postgres::SessionRole::Admin).ok()
        });
    for s in scenarios {
        let backends: std::collections::BTreeSet<Backend> = selection
            .settings(s)
            .into_iter()
            .map(RunSetting::backend)
            .collect();
        for backend in backends {
            match check_scenario(s, backend, admin.as_mut()) {
                Ok(()) | Err(CapacityError::Probe(_)) => {}
                Err(source) => {
                    return Err(RunFilesError::Capacity {
                        file: s.file.clone(),
                        scenario: s.name.clone(),
                        backend,
                        source,
                    })
                }
            }
        }
    }
    Ok(())
}

/// Why `scenario run` could not run (or, for [`RunFilesError::Export`], finish).
#[derive(Debug, thiserror::Error)]
pub enum RunFilesError {
    /// A path cannot be read, a directory holds no `*.toml`, or a file is not a valid
    /// scenario.
    #[error(transparent)]
    Load(#[from] crate::scenario::format::LoadError),
    /// A library scenario has more racers than a selected backend can hold here; nothing ran.
    #[error("{}: scenario `{scenario}` on {backend}: {source}", file.display())]
    Capacity {
        /// The scenario's file.
        file: PathBuf,
        /// The scenario's name.
        scenario: String,
        /// The backend that cannot hold it.
        backend: Backend,
        /// The count, the limit and where it comes from.
        #[source]
        source: crate::scenario::capacity::CapacityError,
    },
    /// `--isolation` was given with a black-box scenario.
    #[error(
        "--isolation does not apply to a black-box scenario: the target's own sessions choose \
         their isolation level (the run records its default_transaction_isolation); set it on \
         the target's database or service"
    )]
    IsolationForTargets,
    /// A black-box scenario could not race (unreachable endpoint or database, a service that
    /// did not start); nothing raced.
    #[error("{}: {source}", file.display())]
    Target {
        /// The scenario's file.
        file: PathBuf,
        /// Cause.
        #[source]
        source: Box<crate::target::service::TargetError>,
    },
    /// The `--export-isolation-spec` folder is refused before anything runs: a symlink, an
    /// unreadable manifest ([`crate::outputs`]).
    #[error("--export-isolation-spec: {0}")]
    ExportFolder(#[from] crate::outputs::OutputError),
    /// An isolation spec could not be written; the runs happened.
    #[error("{source}")]
    Export {
        /// The specs written before this one.
        written: Vec<PathBuf>,
        /// Cause.
        #[source]
        source: crate::report::isolation::SpecError,
    },
}

/// Fails before anything runs when the outputs cannot be written: `report` is a directory,
/// or its directory does not exist or takes no new file.
fn check_report_path(report: &Path) -> Result<(), VerifyError> {
    let bad = |why: String| VerifyError::ReportPath {
        path: report.to_path_buf(),
        why,
    };
    if report.is_dir() {
        return Err(bad("it is a directory".into()));
    }
    let dir = match report.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(bad(format!("{} is not a directory", dir.display())));
    }
    tempfile::NamedTempFile::new_in(dir)
        .map(drop)
        .map_err(|e| bad(format!("cannot create a file in {}: {e}", dir.display())))
}

/// The report's context of a `verify` run with `opts`: the command line and PostgreSQL URL
/// with any password hidden, the version, the git commit of the working directory (when it is
/// a checkout), the time, the filters, seed and protocol.
fn report_context(opts: &VerifyOptions) -> Context {
    use crate::store::url::redact;
    Context {
        // Any argument that carries a URL is shown with its password hidden.
        command: std::env::args()
            .enumerate()
            .map(|(i, a)| {
                if i == 0 {
                    "ticketflow".to_string()
                } else {
                    redact(&a)
                }
            })
            .collect::<Vec<_>>()
            .join(" "),
        pg_url: redact(&opts.pg_url),
        custom_pg_url: opts.pg_url != crate::store::url::DEFAULT_PG_URL,
        version: env!("CARGO_PKG_VERSION").to_string(),
        git_commit: git_commit(),
        generated_at: crate::domain::iso8601(crate::domain::now_utc()),
        filters: opts.filters.clone(),
        narrowed_by: narrowed_by(opts),
        seed: opts.seed,
        protocol: opts.protocol,
        timings: Timings::default(),
    }
}

/// The PostgreSQL sessions `verify`'s runs may hold at once: the server's free slots now
/// ([`crate::scenario::capacity::slots`]) less [`crate::jobs::SESSION_MARGIN`]; unbounded
/// ([`crate::jobs::UNBOUNDED_SESSIONS`]) when PostgreSQL is not used or cannot be asked (then
/// every PostgreSQL run is PENDING or fails its own check, as it would alone).
///
/// Never `u64::MAX`: that is what a run that must run alone asks for (a `[lease]` run, the
/// kill matrix's lease gate), and such a run holds the whole budget, which the next one's
/// sessions are added to.
fn session_budget(pg_url: &str, pg_unusable: Option<&str>) -> u64 {
    use crate::jobs::UNBOUNDED_SESSIONS;
    if pg_unusable.is_some() {
        return UNBOUNDED_SESSIONS;
    }
    let slots = crate::store::url::parse_postgres(pg_url)
        .ok()
        .and_then(|c| {
            crate::store::postgres::connect_as(&c, crate::store::postgres::SessionRole::Admin).ok()
        })
        .and_then(|mut admin| crate::scenario::capacity::slots(&mut admin).ok());
    match slots {
        Some(s) => {
            // The probing session itself is closed by now.
            let free = s.max_connections - s.reserved - (s.in_use - 1);
            u64::try_from(free)
                .unwrap_or(0)
                .saturating_sub(crate::jobs::SESSION_MARGIN)
                .clamp(1, UNBOUNDED_SESSIONS)
        }
        None => UNBOUNDED_SESSIONS,
    }
}

/// Times `verify`'s phases ([`Timings`]).
struct PhaseTimer {
    started: Instant,
    timings: Timings,
}

/// When a phase started, and the scratch databases' cost then.
#[derive(Clone, Copy)]
struct Mark {
    at: Instant,
    scratch: ScratchCost,
}

impl PhaseTimer {
    fn start(jobs: usize) -> PhaseTimer {
        PhaseTimer {
            started: Instant::now(),
            timings: Timings {
                jobs,
                ..Timings::default()
            },
        }
    }

    fn mark(&self) -> Mark {
        Mark {
            at: Instant::now(),
            scratch: scratch_cost(),
        }
    }

    /// Records the phase `phase` begun at `mark` with `items`; `summed` is its items' own
    /// durations added up (`None`: they ran one after another, so the wall time).
    fn phase(&mut self, mark: Mark, phase: &'static str, items: usize, summed: Option<Duration>) {
        let wall = mark.at.elapsed();
        self.timings.phases.push(PhaseTiming {
            phase,
            items,
            wall_ms: ms(wall),
            summed_ms: ms(summed.unwrap_or(wall)),
            scratch: scratch_cost().since(mark.scratch),
            beside: None,
        });
    }

    /// Records the phase `phase` that ran `took` beside the phases `beside` names: one item,
    /// its own duration as wall and summed, and no scratch cost of its own (theirs includes
    /// it).
    fn phase_beside(&mut self, phase: &'static str, took: Duration, beside: &str) {
        self.timings.phases.push(PhaseTiming {
            phase,
            items: 1,
            wall_ms: ms(took),
            summed_ms: ms(took),
            scratch: ScratchCost::default(),
            beside: Some(beside.to_string()),
        });
    }

    fn finish(mut self) -> Timings {
        self.timings.wall_ms = ms(self.started.elapsed());
        self.timings
    }
}

/// `d` in milliseconds.
fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// `git rev-parse HEAD` of the working directory, when it is a git checkout.
fn git_commit() -> Option<String> {
    let mut git = std::process::Command::new("git");
    git.args(["rev-parse", "HEAD"]);
    let out = crate::child::output(git).ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_string())
}

/// Why `verify` could not run.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// The scenario directory cannot be read, or a scenario file is bad.
    #[error(transparent)]
    Load(#[from] crate::scenario::format::LoadError),
    /// The directory holds no `*.toml`.
    #[error("no scenario files (*.toml) in {0}")]
    NoScenarios(PathBuf),
    /// The report cannot be written where `--report` says (checked before anything runs).
    #[error("--report {path}: {why}")]
    ReportPath {
        /// The path given.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// `--filter` matched nothing.
    #[error("--filter {0:?} selects nothing; names are scenario names and {parts}", parts = FILTERABLE_PARTS.join(", "))]
    NothingSelected(Vec<String>),
    /// `--update-report` with `--report`: the tracked evidence is only ever replaced at its
    /// own place.
    #[error("--update-report rewrites the tracked REPORT.md from a full run: {0}")]
    UpdateReport(&'static str),
    /// `--update-report` with options that narrow the run ([`narrowed_by`]): the tracked
    /// evidence is only ever replaced by a full run.
    #[error(
        "--update-report rewrites the tracked REPORT.md from a full run, and {} narrow{} this one \
         (a partial run never replaces the full report); drop {}",
        .0.join(", "),
        if .0.len() == 1 { "s" } else { "" },
        if .0.len() == 1 { "it" } else { "them" }
    )]
    UpdateReportNarrowed(Vec<String>),
    /// An output folder or file of the report is refused before anything runs: a symlink, a
    /// foreign file without `--force`, an unreadable manifest ([`crate::outputs`]).
    #[error("--report: {0}")]
    Refused(#[from] crate::outputs::OutputError),
    /// A report file could not be written, or was refused, after the runs.
    #[error("the report was not written: {0}")]
    WriteRefused(crate::outputs::OutputError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_shipped_scenario_directory_counts_as_shipped() {
        // Unit tests run in the package root, where scenarios/ is.
        for same in ["scenarios", "./scenarios", "scenarios/../scenarios"] {
            assert!(is_shipped_scenarios(Path::new(same)), "{same}");
        }
        let elsewhere = tempfile::tempdir().unwrap();
        for other in [Path::new("scenarios/negative"), elsewhere.path()] {
            assert!(!is_shipped_scenarios(other), "{}", other.display());
        }
    }

    #[test]
    fn the_soak_is_said_to_run_beside_only_what_runs() {
        assert_eq!(
            soak_beside_what(true, true),
            Some("the kill matrix and the fault cases")
        );
        assert_eq!(soak_beside_what(true, false), Some("the kill matrix"));
        assert_eq!(soak_beside_what(false, true), Some("the fault cases"));
        assert_eq!(soak_beside_what(false, false), None);
    }
}
