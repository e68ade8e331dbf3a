//! The matrix of scenario runs and the property suites: which cells a selection holds,
//! and how they run on the bounded pool (each weighed by the PostgreSQL sessions it takes).

use super::*;
use ticketflow_core::store::url::PgServer;

/// `--backend`: one backend or both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum BackendChoice {
    // `help = None`: `--help` lists the bare names, as it always has.
    /// SQLite only.
    #[cfg_attr(feature = "cli", value(help = None::<&str>))]
    Sqlite,
    /// PostgreSQL only.
    #[cfg_attr(feature = "cli", value(help = None::<&str>))]
    Postgres,
    /// Both, in report order.
    #[default]
    #[cfg_attr(feature = "cli", value(help = None::<&str>))]
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
                journal: ticketflow_core::store::sqlite::JournalMode::Wal,
                tx: ticketflow_core::store::sqlite::TxMode::Lazy,
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
pub(super) struct Cell<'a> {
    pub(super) scenario: &'a Scenario,
    pub(super) setting: RunSetting,
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
            RunSetting::Postgres { .. } => {
                ticketflow_harness::scenario::capacity::scenario_sessions(self.scenario)
            }
            RunSetting::Sqlite { .. } => 0,
        }
    }
}

/// [`run_all_with`] with independent runs at once within `pool` ([`ticketflow_harness::jobs`]); `done` sees
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
pub(super) fn postgres_missing_run(run: &ScenarioRun, pg_unusable: Option<&str>) -> bool {
    run.verdict == Verdict::Pending
        && run.backend == Backend::Postgres
        && (pg_unusable.is_some() && run.reason.as_deref() == pg_unusable
            || run.reason.as_deref().is_some_and(|r| {
                r.starts_with(ticketflow_harness::scenario::runner::PG_UNREACHABLE)
            }))
}

/// Runs the property suites on a real protocol (`implementation`: `protocol` or
/// `on-conflict`): fingerprint, then sequential and concurrent on each selected backend.
/// `seed` fixes every suite's generator (random when `None`); case counts follow
/// `PROPTEST_CASES` or each suite's default. Failures persist under `proptest-regressions/`.
pub fn run_property_suites(
    backends: &[Backend],
    pg: &PgServer,
    pg_unusable: Option<&str>,
    seed: Option<u64>,
    implementation: ticketflow_core::variants::Implementation,
) -> Vec<SuiteResult> {
    run_selected_property_suites(
        &["fingerprint", "sequential", "concurrent"],
        backends,
        pg,
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
    pg: &PgServer,
    pg_unusable: Option<&str>,
    seed: Option<u64>,
    implementation: ticketflow_core::variants::Implementation,
) -> Vec<SuiteResult> {
    let mut out = Vec::new();
    run_selected_property_suites_with(
        suites,
        backends,
        pg,
        pg_unusable,
        seed,
        implementation,
        &mut |s| out.push(s),
    );
    out
}

/// One property suite of [`run_selected_property_suites_on`], on one backend.
pub(super) enum SuiteJob<'a> {
    Fingerprint,
    Run {
        suite: &'static str,
        backend: Backend,
        pending: Option<&'a str>,
    },
}

/// PostgreSQL sessions of the concurrent suite at most: 8 racing threads, its setup and
/// ground-truth sessions and the admin session.
pub(super) const CONCURRENT_SUITE_SESSIONS: u64 = 12;
/// PostgreSQL sessions of the sequential suite at most.
pub(super) const SEQUENTIAL_SUITE_SESSIONS: u64 = 4;

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
pub(super) fn run_selected_property_suites_with(
    suites: &[&str],
    backends: &[Backend],
    pg: &PgServer,
    pg_unusable: Option<&str>,
    seed: Option<u64>,
    implementation: ticketflow_core::variants::Implementation,
    done: &mut dyn FnMut(SuiteResult),
) {
    let ran = run_selected_property_suites_on(
        suites,
        backends,
        pg,
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
pub(super) fn run_selected_property_suites_on(
    suites: &[&str],
    backends: &[Backend],
    pg: &PgServer,
    pg_unusable: Option<&str>,
    seed: Option<u64>,
    implementation: ticketflow_core::variants::Implementation,
    pool: Pool,
    done: &mut dyn FnMut(&SuiteResult),
) -> Ran<SuiteResult> {
    use ticketflow_harness::props::{
        concurrent, fingerprint, sequential, SuiteBackend, SuiteConfig,
    };
    let mut jobs = Vec::new();
    if suites.contains(&"fingerprint") {
        jobs.push(SuiteJob::Fingerprint);
    }
    for backend in backends {
        if SuiteBackend::on(*backend, pg).is_none() {
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
            match (pending, SuiteBackend::on(backend, pg)) {
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
pub(super) fn reason_or_unsupported(pending: Option<&str>) -> String {
    pending.map_or_else(|| "no suite on this backend".to_string(), str::to_string)
}
