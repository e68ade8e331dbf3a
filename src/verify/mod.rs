//! `ticketflow verify`: run every scenario on every backend and decide the exit code.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use ticketflow_core::store::url::PgServer;
use ticketflow_harness::scenario::lease::{redis_pending, LeaseRunOptions};

use ticketflow_harness::blackbox::isolation::ExportedSpec;
use ticketflow_harness::jobs::{run_ordered, Pool, Ran, Weighed};
use ticketflow_harness::killmatrix::{KillMatrix, KillOptions, LoomReport};
use ticketflow_harness::props::SuiteResult;
use ticketflow_harness::scratch::{scratch_cost, ScratchCost};
use ticketflow_report::{Context, PhaseTiming, ReportInput, Timings};

/// Cases per property gate in the kill matrix (unless `PROPTEST_CASES` is set).
pub const KILL_MATRIX_CASES: u32 = 24;
use ticketflow_core::protocol::RetryPolicy;
use ticketflow_core::store::postgres::IsolationLevel;
use ticketflow_core::store::sqlite::SqliteConfig;
use ticketflow_core::store::url::probe_postgres;
use ticketflow_core::store::Backend;
use ticketflow_harness::load::{load_all, LoadError, Loaded};
use ticketflow_harness::scenario::format::Scenario;
use ticketflow_harness::scenario::runner::{run_postgres, run_sqlite, PgOptions, SqliteOptions};
use ticketflow_harness::scenario::{RunSetting, ScenarioRun};
use ticketflow_harness::verdict::Verdict;

pub use crate::exit::{EXIT_FAIL, EXIT_PASS, EXIT_PENDING, EXIT_USAGE};

mod files;
mod matrix;
mod phases;
mod report_files;
mod road;
mod selection;

pub use files::*;
pub use matrix::*;
use phases::*;
pub use report_files::*;
pub use road::Refusal;
use road::*;
pub use selection::*;

/// Options of `ticketflow verify`.
#[derive(Debug, Clone)]
pub struct VerifyOptions {
    /// Directory of scenario files.
    pub scenarios: PathBuf,
    /// The PostgreSQL server.
    pub pg: PgServer,
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
    pub protocol: ticketflow_core::protocol::Protocol,
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
    /// Independent runs at once ([`ticketflow_harness::jobs`]; 1: one after another). The default of the
    /// CLI is [`ticketflow_harness::jobs::default_jobs`].
    pub jobs: usize,
    /// `--force`: replace report files the tool did not write (not listed in their folder's
    /// manifest, [`ticketflow_harness::outputs`]); never through a symlink. `--update-report` sets it.
    pub force: bool,
}

/// Result of a verify run.
#[derive(Debug)]
pub struct VerifyOutcome {
    /// Every run.
    pub runs: Vec<ScenarioRun>,
    /// Every black-box scenario, with its repeats.
    pub targets: Vec<ticketflow_harness::blackbox::TargetOutcome>,
    /// Every property suite.
    pub suites: Vec<SuiteResult>,
    /// The kill matrix, when it ran.
    pub kill: Option<KillMatrix>,
    /// The loom models, read from the loom report (never run by `verify`).
    pub loom: LoomReport,
    /// Faults and bad input, when selected.
    pub faults: Option<ticketflow_harness::faults::FaultReport>,
    /// The short soak, when selected.
    pub soak: Option<ticketflow_harness::soak::SoakReport>,
    /// Isolation specs written for failing PostgreSQL runs.
    pub specs: Vec<ExportedSpec>,
    /// What `--filter` left out.
    pub not_selected: Vec<String>,
    /// PASS / FAIL / PENDING over everything, as REPORT.md's headline counts them.
    pub totals: ticketflow_report::Totals,
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

/// A part of `verify` that has just finished, handed to [`verify_reporting`]'s callback so
/// the caller can print it at once (an interrupt later loses nothing already printed).
#[derive(Debug, Clone, Copy)]
pub enum Finished<'a> {
    /// A library scenario's run on one matrix cell.
    Run(&'a ScenarioRun),
    /// A black-box scenario, with its repeats.
    Target(&'a ticketflow_harness::blackbox::TargetOutcome),
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
    Faults(&'a ticketflow_harness::faults::FaultReport),
    /// The short soak.
    Soak(&'a ticketflow_harness::soak::SoakReport),
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
// Long because it is `verify` from load to outcome, step after step (load, select, travel the
// road, the exported specs, the report's input, the outputs); each step's values feed the next.
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
        suites,
        kill,
        faults,
        soak,
        not_selected,
    } = select(opts, &all_scenarios, loaded.targets)?;
    let mut base = PgOptions::new(opts.pg.clone());
    base.implementation = ticketflow_core::variants::Implementation::Protocol(opts.protocol);
    base.lease = opts.lease.clone();
    let road = Road {
        scenarios: &scenarios,
        targets: &target_scenarios,
        selection: &opts.selection,
        base,
        retry: opts.retry,
        blackbox: ticketflow_harness::blackbox::RunOptions {
            repeat: opts.repeat.max(1),
            ..ticketflow_harness::blackbox::RunOptions::new(opts.pg.clone())
        },
        as_given: AsGiven::Pending,
        jobs: opts.jobs,
        progress: opts.progress,
        checks: Some(SelfChecks {
            opts,
            all_scenarios: &all_scenarios,
            suites,
            kill,
            faults,
            soak,
        }),
    };
    let travelled = travel(&road, Some(&mut outputs.specs), finished)?;
    let exit_code = exit_code_of(&travelled, opts.require_postgres, opts.require_redis);
    let Travelled {
        runs,
        targets,
        suites,
        kill,
        loom,
        faults,
        soak,
        timings,
        ..
    } = travelled;
    // Read whenever the self-checks are on, as they always are for `verify`.
    let loom = loom.unwrap_or_default();
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
    ctx.timings = timings;
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
    write_outputs(
        outputs,
        &input,
        exit_code,
        &ticketflow_report::Scope::Verify,
    )?;
    let totals = ticketflow_report::Totals::of(&input);
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

/// The soak that ran beside the other phases, with how long it took; a panic in it (a bug of
/// ours) is a FAIL with the panic's message, never a lost soak.
fn joined_soak(
    thread: std::thread::JoinHandle<(ticketflow_harness::soak::SoakReport, Duration)>,
    options: &ticketflow_harness::soak::SoakOptions,
    started: Instant,
) -> (ticketflow_harness::soak::SoakReport, Duration) {
    thread.join().unwrap_or_else(|panic| {
        let why = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        (
            ticketflow_harness::soak::SoakReport::failed(
                options,
                format!("the soak panicked: {why}"),
            ),
            started.elapsed(),
        )
    })
}

/// Why the PostgreSQL server `pg` cannot be used (the probe's error, as PENDING reasons
/// quote it), or `None` when it answered.
fn pg_unusable(pg: &PgServer) -> Option<String> {
    probe_postgres(pg).err().map(|e| e.to_string())
}

/// Why `verify` could not run.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// The scenario directory cannot be read, or a scenario file is bad.
    #[error(transparent)]
    Load(#[from] ticketflow_harness::load::LoadError),
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
    /// foreign file without `--force`, an unreadable manifest ([`ticketflow_harness::outputs`]).
    #[error("--report: {0}")]
    Refused(#[from] ticketflow_harness::outputs::OutputError),
    /// A scenario refused as given ([`Refusal`]). `verify` reports such scenarios PENDING
    /// instead, so only a run of files as given (`scenario run`) meets one.
    #[error(transparent)]
    AsGiven(#[from] Refusal),
    /// A report file could not be written, or was refused, after the runs.
    #[error("the report was not written: {0}")]
    WriteRefused(ticketflow_harness::outputs::OutputError),
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
