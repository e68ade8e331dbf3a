//! `ticketflow scenario run`: the given files (or directories) run with the suites off, their
//! report and their exported isolation specs.

use super::*;
use ticketflow_core::store::url::PgServer;

/// Options of `ticketflow scenario run`: the given files, library and black-box scenarios
/// alike.
#[derive(Debug, Clone)]
pub struct RunFilesOptions {
    /// Scenario files, in order.
    pub files: Vec<PathBuf>,
    /// The PostgreSQL server.
    pub pg: PgServer,
    /// Matrix cells to run; `isolation` must be empty when a file is a black-box scenario.
    pub selection: Selection,
    /// The racers' retry policy.
    pub retry: RetryPolicy,
    /// `protocol`, `on-conflict` or a wrong variant, for the library scenarios.
    pub implementation: ticketflow_core::variants::Implementation,
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
    /// Hears a progress line every [`ticketflow_harness::blackbox::run::WAIT_NOTICE`] while a black-box
    /// wave waits on its target ([`ticketflow_harness::blackbox::RunOptions::on_wait`]).
    pub on_wait: Option<fn(&str)>,
    /// `--explore`: [`ticketflow_harness::blackbox::RunOptions::explore`].
    pub explore: Option<ticketflow_harness::blackbox::format::ExploreMode>,
    /// `--schedule`: [`ticketflow_harness::blackbox::RunOptions::schedule`].
    pub schedule: Option<String>,
    /// `--keep-going`: [`ticketflow_harness::blackbox::RunOptions::keep_going`].
    pub keep_going: bool,
    /// `--parallel`: [`ticketflow_harness::blackbox::RunOptions::parallel`].
    pub parallel: usize,
    /// `--force`: replace files in `export_isolation_spec` (and the report's folders) that the
    /// tool did not write; never through a symlink ([`ticketflow_harness::outputs`]).
    pub force: bool,
    /// Where the services the black-box runs start keep their stdout and stderr (`None`:
    /// not kept; the end of a service's stderr is still quoted when it exits).
    pub service_logs: Option<PathBuf>,
}

/// What `scenario run` ran.
#[derive(Debug)]
pub struct RunFilesOutcome {
    /// Every library run, file order, then matrix order.
    pub runs: Vec<ScenarioRun>,
    /// Every black-box scenario, with its repeats.
    pub targets: Vec<ticketflow_harness::blackbox::TargetOutcome>,
    /// Isolation specs written (`--export-isolation-spec`): of the library runs, and of the
    /// black-box scenarios' failing schedules.
    pub specs: Vec<PathBuf>,
    /// The process exit code, decided as `verify`'s is (PostgreSQL required as
    /// [`RunFilesOptions::require_postgres`] says).
    pub exit_code: i32,
    /// The library scenarios loaded from the files, in file order (for the report).
    pub scenarios: Vec<Scenario>,
    /// Each black-box scenario's (name, description), in file order (for the report).
    pub target_descriptions: Vec<(String, String)>,
}

/// Runs `scenario run`: the road of [`verify_reporting`] over the scenarios loaded from
/// `opts.files` (each a library or a black-box scenario), with the self-checks off and what
/// cannot be run as given refused ([`Refusal`]); then exports the PostgreSQL races when asked.
/// PostgreSQL is probed when a selected cell needs it (its runs are PENDING when it does not
/// answer); the exit code is decided by the same function as `verify`'s.
///
/// Will return `Err` for a file that cannot be read or parsed, `--isolation` with a black-box
/// scenario, a library scenario with more racers than a selected backend can hold
/// ([`Refusal::Capacity`], checked before anything runs), a black-box scenario that could not
/// race ([`Refusal::Target`]), or a spec that cannot be written.
pub fn run_files(opts: &RunFilesOptions) -> Result<RunFilesOutcome, RunFilesError> {
    let loaded = ticketflow_harness::load::load(
        &opts.files,
        ticketflow_harness::load::LoadHints {
            directory: None,
            file: Some("give a path from there"),
        },
    )?;
    let (scenarios, targets) = (loaded.scenarios, loaded.targets);
    // A schedule id whose letters name no racer replays nothing: refused before anything runs.
    if let Some(id) = &opts.schedule {
        for t in targets.iter().filter(|t| {
            t.barrier.kind == ticketflow_harness::blackbox::format::BarrierKind::Interposer
        }) {
            let widest = t.waves().iter().map(|(_, r)| r.len()).max().unwrap_or(0);
            ticketflow_harness::interpose::explore::parse_schedule_id_for(id, widest).map_err(
                |source| RunFilesError::Schedule {
                    scenario: t.name.clone(),
                    source,
                },
            )?;
        }
    }
    // A symlinked or unreadable export folder is refused before anything runs.
    let mut export = opts
        .export_isolation_spec
        .as_deref()
        .map(|dir| ticketflow_harness::outputs::OutputDir::open(dir, "", opts.force, false))
        .transpose()?;
    let mut base = PgOptions::new(opts.pg.clone());
    base.implementation = opts.implementation;
    base.lease = opts.lease.clone();
    let road = road::Road {
        scenarios: &scenarios,
        targets: &targets,
        selection: &opts.selection,
        base,
        retry: opts.retry,
        blackbox: ticketflow_harness::blackbox::RunOptions {
            repeat: opts.repeat,
            barrier_timeout: opts.barrier_timeout,
            on_wait: opts.on_wait,
            explore: opts.explore,
            schedule: opts.schedule.clone(),
            keep_going: opts.keep_going,
            parallel: opts.parallel,
            service_logs: opts.service_logs.clone(),
            ..ticketflow_harness::blackbox::RunOptions::new(opts.pg.clone())
        },
        as_given: road::AsGiven::Refuse,
        jobs: 1,
        progress: false,
        checks: None,
    };
    let mut travelled = road::travel(&road, None, &|_| {})?;
    let exit_code = road::exit_code_of(&travelled, opts.require_postgres, opts.require_redis);
    let mut specs = Vec::new();
    if let Some(dir) = export.as_mut() {
        for r in travelled.runs.iter().filter(|r| r.evidence.is_some()) {
            if r.backend == Backend::Postgres {
                let path =
                    ticketflow_harness::blackbox::isolation::export(r, dir).map_err(|source| {
                        RunFilesError::Export {
                            written: specs.clone(),
                            source,
                        }
                    })?;
                specs.push(path);
            }
        }
    }
    if let Some(mut dir) = export {
        specs.extend(export_schedules(&mut travelled.targets, &mut dir));
        dir.finish().map_err(|source| RunFilesError::Export {
            written: specs.clone(),
            source: source.into(),
        })?;
    }
    let target_descriptions: Vec<(String, String)> = targets
        .iter()
        .map(|t| (t.name.clone(), t.description.clone()))
        .collect();
    Ok(RunFilesOutcome {
        runs: travelled.runs,
        targets: travelled.targets,
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
/// ([`ticketflow_harness::blackbox::FailingSchedule::isolation_spec_missing`]).
pub fn export_schedules(
    targets: &mut [ticketflow_harness::blackbox::TargetOutcome],
    out: &mut ticketflow_harness::outputs::OutputDir,
) -> Vec<PathBuf> {
    targets
        .iter_mut()
        .filter_map(|t| {
            ticketflow_harness::blackbox::isolation::export_schedule(t, out)
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

/// Writes the report of a `scenario run` over `opts.files` ([`ticketflow_report::Scope::Files`]):
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
    use ticketflow_report::Scope;
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
pub(super) fn files_report_context(opts: &RunFilesOptions) -> Context {
    use ticketflow_core::store::url::redact;
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
        pg_url: opts.pg.redacted(),
        custom_pg_url: !opts.pg.is_default(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        git_commit: git_commit(),
        generated_at: ticketflow_core::domain::iso8601(ticketflow_core::domain::now_utc()),
        filters: Vec::new(),
        narrowed_by: Vec::new(),
        seed: None,
        protocol: match opts.implementation {
            ticketflow_core::variants::Implementation::Protocol(p) => p,
            ticketflow_core::variants::Implementation::Variant(_) => {
                ticketflow_core::protocol::Protocol::default()
            }
        },
        timings: Timings::default(),
    }
}

/// Refuses the library scenarios, before any runs, when a selected backend cannot hold one's
/// racers ([`ticketflow_harness::scenario::capacity`]): this process's file descriptors, and the free
/// connection slots of the PostgreSQL server `pg` (`None`: not used or not reachable;
/// its runs are PENDING). A server whose slots cannot be read is left to the run, which fails
/// with the reason.
///
/// Will return `Err` ([`Refusal::Capacity`]) for the first scenario that does not fit.
pub(super) fn refuse_what_cannot_fit(
    scenarios: &[Scenario],
    selection: &Selection,
    pg: Option<&PgServer>,
) -> Result<(), Refusal> {
    use ticketflow_harness::scenario::capacity::{check_scenario, CapacityError};
    let mut admin = pg.and_then(|pg| {
        ticketflow_core::store::postgres::connect_as(
            pg.config(),
            ticketflow_core::store::postgres::SessionRole::Admin,
        )
        .ok()
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
                    return Err(Refusal::Capacity {
                        file: s.file.clone(),
                        scenario: s.name.clone(),
                        backend,
                        source: Box::new(source),
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
    Load(#[from] ticketflow_harness::load::LoadError),
    /// A scenario refused as given: `--isolation` with a black-box scenario, a library
    /// scenario that does not fit a selected backend, a black-box scenario that could not race.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// `--schedule` names a racer the scenario does not have, or is not a schedule id.
    #[error("--schedule, scenario {scenario}: {source}")]
    Schedule {
        /// The scenario's name.
        scenario: String,
        /// What is wrong with the id.
        #[source]
        source: ticketflow_harness::interpose::explore::ScheduleIdError,
    },
    /// The `--export-isolation-spec` folder is refused before anything runs: a symlink, an
    /// unreadable manifest ([`ticketflow_harness::outputs`]).
    #[error("--export-isolation-spec: {0}")]
    ExportFolder(#[from] ticketflow_harness::outputs::OutputError),
    /// An isolation spec could not be written; the runs happened.
    #[error("{source}")]
    Export {
        /// The specs written before this one.
        written: Vec<PathBuf>,
        /// Cause.
        #[source]
        source: ticketflow_harness::blackbox::isolation::SpecError,
    },
}
