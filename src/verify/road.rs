//! The one road of a run over scenarios. `verify` (a directory's scenarios, its self-checks on)
//! and `scenario run` (the given files, self-checks off) both go through [`travel`]: probe
//! PostgreSQL, run the library scenarios on their matrix cells, run the black-box scenarios,
//! then the self-checks when they are on. One function, [`exit_code_of`], maps what a run
//! travelled to the process exit code for both commands.

use super::*;
use ticketflow_harness::blackbox::{TargetOutcome, TargetScenario};
use ticketflow_harness::faults::FaultReport;
use ticketflow_harness::soak::SoakReport;

/// What a run does with a scenario that cannot be run as given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AsGiven {
    /// Reported PENDING with the reason, and the run goes on (`verify`: a black-box scenario
    /// whose PostgreSQL is not selected or not usable, or whose target cannot be set up).
    Pending,
    /// Refused ([`Refusal`], exit 2) before anything runs or, for a black-box scenario that
    /// cannot be set up, as soon as it is met (`scenario run`: the user named each file).
    Refuse,
}

/// The self-checks of `verify` that its filters selected: they run after the scenarios.
pub(super) struct SelfChecks<'a> {
    /// `verify`'s options (the seed, the scenario directory, the restart, the jobs).
    pub(super) opts: &'a VerifyOptions,
    /// Every library scenario loaded, selected or not (the kill matrix runs over them all).
    pub(super) all_scenarios: &'a [Scenario],
    /// The property suites selected (`fingerprint`, `sequential`, `concurrent`).
    pub(super) suites: Vec<&'static str>,
    /// Whether the kill matrix runs.
    pub(super) kill: bool,
    /// Whether the fault cases run.
    pub(super) faults: bool,
    /// Whether the short soak runs.
    pub(super) soak: bool,
}

/// A run over scenarios, as [`travel`] takes it.
pub(super) struct Road<'a> {
    /// The library scenarios to run, in order.
    pub(super) scenarios: &'a [Scenario],
    /// The black-box scenarios to run, in order.
    pub(super) targets: &'a [TargetScenario],
    /// The matrix cells.
    pub(super) selection: &'a Selection,
    /// The PostgreSQL server, the implementation and the lease of the library runs.
    pub(super) base: PgOptions,
    /// The racers' retry policy.
    pub(super) retry: RetryPolicy,
    /// How each black-box scenario runs (repeats, barrier timeout, exploration).
    pub(super) blackbox: ticketflow_harness::blackbox::RunOptions,
    /// What a scenario that cannot be run as given becomes.
    pub(super) as_given: AsGiven,
    /// Independent runs at once (1: one after another).
    pub(super) jobs: usize,
    /// Show a progress bar on stderr.
    pub(super) progress: bool,
    /// `verify`'s self-checks; `None` for `scenario run`.
    pub(super) checks: Option<SelfChecks<'a>>,
}

/// What a [`travel`] ran, in the order it ran.
pub(super) struct Travelled {
    /// Every library run, scenario order then matrix order.
    pub(super) runs: Vec<ScenarioRun>,
    /// Every black-box scenario, with its repeats.
    pub(super) targets: Vec<TargetOutcome>,
    /// The property suites (none without self-checks).
    pub(super) suites: Vec<SuiteResult>,
    /// The kill matrix, when it ran.
    pub(super) kill: Option<KillMatrix>,
    /// The loom models read (`None`: not read, without self-checks).
    pub(super) loom: Option<LoomReport>,
    /// The fault cases, when they ran.
    pub(super) faults: Option<FaultReport>,
    /// The short soak, when it ran.
    pub(super) soak: Option<SoakReport>,
    /// Why PostgreSQL was unusable (`None`: it answered, or was not needed).
    pub(super) pg_unusable: Option<String>,
    /// How long each phase took.
    pub(super) timings: Timings,
}

/// What a run of the given files (`scenario run`) refuses; nothing of that scenario ran.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
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
        source: Box<ticketflow_harness::scenario::capacity::CapacityError>,
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
        source: Box<ticketflow_harness::blackbox::service::TargetError>,
    },
}

/// Runs `road`: probes PostgreSQL when something selected uses it, refuses what cannot be run
/// as given ([`AsGiven::Refuse`]), runs the library scenarios on the selected cells within the
/// session budget, then each black-box scenario (a failing schedule's spec into `specs` when
/// given), then the self-checks. `finished` hears each part as soon as it is done.
///
/// Will return `Err` only under [`AsGiven::Refuse`]: `--isolation` with a black-box scenario,
/// a library scenario that does not fit a selected backend (both before anything runs), or a
/// black-box scenario that could not race.
///
/// Long on purpose: this is the one place that orders the phases and shares what they share
/// (the session budget's pools, the progress bar, the phase timer, the scratch recycling, the
/// soak thread beside the kill matrix); each phase itself is one call.
pub(super) fn travel(
    road: &Road<'_>,
    mut specs: Option<&mut ticketflow_harness::outputs::OutputDir>,
    finished: &dyn Fn(Finished<'_>),
) -> Result<Travelled, Refusal> {
    let refuse = road.as_given == AsGiven::Refuse;
    if refuse && !road.targets.is_empty() && !road.selection.isolation.is_empty() {
        return Err(Refusal::IsolationForTargets);
    }
    let backends = road.selection.backends();
    let wants_pg = backends.contains(&Backend::Postgres);
    let cells_on_pg = road.scenarios.iter().any(|s| {
        road.selection
            .settings(s)
            .iter()
            .any(|x| x.backend() == Backend::Postgres)
    });
    // The self-checks all use PostgreSQL when it is selected; the scenarios only when a cell is
    // on it.
    let pg_unusable = (wants_pg && (road.checks.is_some() || cells_on_pg))
        .then(|| pg_unusable(&road.base.server))
        .flatten();
    if refuse {
        refuse_what_cannot_fit(
            road.scenarios,
            road.selection,
            (cells_on_pg && pg_unusable.is_none()).then_some(&road.base.server),
        )?;
    }
    let checks = road.checks.as_ref();
    let cells: usize = road
        .scenarios
        .iter()
        .map(|s| road.selection.settings(s).len())
        .sum();
    let check_items = checks.map_or(0, |c| {
        c.suites
            .iter()
            .map(|s| {
                if *s == "fingerprint" {
                    1
                } else {
                    backends.len()
                }
            })
            .sum::<usize>()
            + usize::from(c.kill)
            + usize::from(c.faults)
            + usize::from(c.soak)
    });
    let bar = progress_bar(
        road.progress,
        (cells + road.targets.len() + check_items) as u64,
    );
    // A serial run needs no budget: one item at a time, whatever it holds.
    let budget = if road.jobs > 1 {
        session_budget(&road.base.server, pg_unusable.as_deref())
    } else {
        ticketflow_harness::jobs::UNBOUNDED_SESSIONS
    };
    let pool = Pool::new(road.jobs, budget);
    let mut timer = PhaseTimer::start(road.jobs);
    // Scratch databases are emptied and reused rather than dropped until the phases end.
    let recycling = ticketflow_harness::scratch::recycling();
    let mark = timer.mark();
    let ran = run_all_on(
        road.scenarios,
        road.selection,
        &road.base,
        &road.retry,
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
    let mut targets = Vec::with_capacity(road.targets.len());
    for t in road.targets {
        let skip = match road.as_given {
            AsGiven::Pending => needs_pg_skip(t, wants_pg, pg_unusable.as_deref()),
            // Run as given: its own databases decide.
            AsGiven::Refuse => None,
        };
        let mut outcome = run_target(t, &road.blackbox, skip, road.as_given)?;
        if let Some(out) = specs.as_deref_mut() {
            // A write error is kept in the outcome as the reason it has no spec.
            let _ = ticketflow_harness::blackbox::isolation::export_schedule(&mut outcome, out);
        }
        tracing::info!(scenario = %outcome.scenario, verdict = %outcome.verdict, "black-box scenario finished");
        bar.suspend(|| finished(Finished::Target(&outcome)));
        bar.inc(1);
        bar.set_message(outcome.scenario.clone());
        targets.push(outcome);
    }
    timer.phase(mark, "black-box targets", targets.len(), None);
    let mut travelled = Travelled {
        runs,
        targets,
        suites: Vec::new(),
        kill: None,
        loom: None,
        faults: None,
        soak: None,
        pg_unusable,
        timings: Timings::default(),
    };
    if let Some(checks) = checks {
        run_self_checks(
            checks,
            &backends,
            &mut travelled,
            (pool, budget),
            &mut timer,
            &bar,
            finished,
        );
    }
    let mark = timer.mark();
    let spares = ticketflow_harness::scratch::spares();
    drop(recycling);
    timer.phase(mark, "spare scratch databases dropped", spares, None);
    bar.finish_and_clear();
    travelled.timings = timer.finish();
    Ok(travelled)
}

/// Why the black-box scenario `t` is not run by a `verify` (`None`: it runs): it needs
/// PostgreSQL, and PostgreSQL is not selected (`wants_pg`) or is unusable (`pg_unusable`).
fn needs_pg_skip(t: &TargetScenario, wants_pg: bool, pg_unusable: Option<&str>) -> Option<String> {
    let needs_pg = t.barrier.kind.server_side()
        || !t.target.counts.is_empty()
        || !t.target.services.is_empty();
    match (needs_pg, wants_pg, pg_unusable) {
        (true, false, _) => Some("PostgreSQL not selected (--backend sqlite)".to_string()),
        (true, true, Some(why)) => Some(why.to_string()),
        _ => None,
    }
}

/// The black-box scenario `t` run with `opts`, or PENDING for `skip`'s reason. A setup error
/// (unreachable endpoint, missing table) is PENDING with its reason under [`AsGiven::Pending`],
/// and refused under [`AsGiven::Refuse`].
fn run_target(
    t: &TargetScenario,
    opts: &ticketflow_harness::blackbox::RunOptions,
    skip: Option<String>,
    as_given: AsGiven,
) -> Result<TargetOutcome, Refusal> {
    use ticketflow_harness::blackbox::run;
    if let Some(why) = skip {
        return Ok(run::summarise(t, vec![run::not_run(t, why)]));
    }
    match (run::run_repeated(t, opts), as_given) {
        (Ok(outcome), _) => Ok(outcome),
        (Err(e), AsGiven::Pending) => Ok(run::summarise(t, vec![run::not_run(t, e.to_string())])),
        // Nothing raced: the scenario or its target is not usable as given.
        (Err(source), AsGiven::Refuse) => Err(Refusal::Target {
            file: t.file.clone(),
            source: Box::new(source),
        }),
    }
}

/// `verify`'s self-checks, after the scenarios: the property suites, the loom models read, the
/// kill matrix and the fault cases, and the short soak (beside those two when it can be), each
/// into `travelled` and heard by `finished`. `pool` is the scenarios' pool with the session
/// budget it was made from.
///
/// Long because the soak's thread spans the kill matrix and the fault cases: it is started
/// before them and joined after, so the three cannot be split apart without handing the
/// thread around.
fn run_self_checks(
    checks: &SelfChecks<'_>,
    backends: &[Backend],
    travelled: &mut Travelled,
    (pool, budget): (Pool, u64),
    timer: &mut PhaseTimer,
    bar: &indicatif::ProgressBar,
    finished: &dyn Fn(Finished<'_>),
) {
    let opts = checks.opts;
    let pg_unusable = travelled.pg_unusable.clone();
    let pg_unusable = pg_unusable.as_deref();
    let wants_pg = backends.contains(&Backend::Postgres);
    let implementation = ticketflow_core::variants::Implementation::Protocol(opts.protocol);
    bar.set_message("property suites");
    let mark = timer.mark();
    let ran = run_selected_property_suites_on(
        &checks.suites,
        backends,
        &opts.pg,
        pg_unusable,
        opts.seed,
        implementation,
        pool,
        &mut |s| {
            bar.suspend(|| finished(Finished::Suite(s)));
            bar.inc(1);
        },
    );
    timer.phase(mark, "property suites", ran.results.len(), Some(ran.busy));
    travelled.suites = ran.results;
    let (loom_path, loom) = load_loom(&opts.scenarios);
    bar.suspend(|| {
        finished(Finished::Loom {
            report: &loom,
            path: &loom_path,
        })
    });
    // The soak runs beside the kill matrix and the fault cases: it is traffic for a fixed
    // time, and they leave the machine room. Its sessions come out of their budget. Under
    // `--restart-postgres` it runs alone at the end instead, since the restart cuts every
    // session on the server.
    let soak_options = short_soak_options(opts);
    let beside = soak_beside_what(checks.kill, checks.faults);
    let soak_alongside = checks.soak
        && wants_pg
        && pg_unusable.is_none()
        && !opts.restart_postgres
        && beside.is_some();
    let pool_beside_soak = if soak_alongside {
        Pool::new(
            opts.jobs,
            budget.saturating_sub(soak_options.pg_sessions()).max(1),
        )
    } else {
        pool
    };
    let soak_started = Instant::now();
    let soak_beside = soak_alongside.then(|| {
        let s = soak_options.clone();
        std::thread::spawn(move || {
            let started = Instant::now();
            let mut report = ticketflow_harness::soak::run(&s);
            report.alongside = beside.map(str::to_string);
            (report, started.elapsed())
        })
    });
    bar.set_message("kill matrix");
    let mark = timer.mark();
    if checks.kill {
        let (k, busy) = run_kill_matrix(
            opts,
            checks.all_scenarios,
            pg_unusable,
            &loom_path,
            &loom,
            pool_beside_soak,
        );
        bar.suspend(|| finished(Finished::KillMatrix(&k)));
        bar.inc(1);
        // Its gate runs, as the summary counts them (not the cells whose gate does not apply).
        timer.phase(mark, "kill matrix (gate runs)", k.gate_runs(), Some(busy));
        travelled.kill = Some(k);
    }
    travelled.loom = Some(loom);
    bar.set_message("fault cases");
    let mark = timer.mark();
    if checks.faults {
        let f = run_fault_cases(opts, pg_unusable);
        bar.suspend(|| finished(Finished::Faults(&f)));
        // The cases that ran, as the headline's "N fault cases (R ran: …)" counts them.
        timer.phase(mark, "fault cases (ran)", f.tally().ran, None);
        travelled.faults = Some(f);
    }
    bar.inc(u64::from(checks.faults));
    bar.set_message("soak");
    let soak = match soak_beside {
        Some(thread) => {
            let (report, took) = joined_soak(thread, &soak_options, soak_started);
            timer.phase_beside("soak", took, beside.unwrap_or_default());
            Some(report)
        }
        None => {
            let mark = timer.mark();
            let soak = checks
                .soak
                .then(|| run_short_soak(&soak_options, wants_pg, pg_unusable));
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
    travelled.soak = soak;
}

/// The exit code of a run, `verify` and `scenario run` alike: FAIL beats PENDING beats PASS
/// ([`exit_code`]). Library runs, black-box scenarios that never started and the soak PENDING
/// for want of the PostgreSQL server, and the property suites, kill matrix and fault cases
/// (PENDING only for their PostgreSQL parts), are the embedded fallback: their PENDING counts
/// only under `require_postgres`. Every other PENDING is decisive. Runs PENDING for want of
/// Redis count only under `require_redis`, and only when nothing else decided the exit.
pub(super) fn exit_code_of(t: &Travelled, require_postgres: bool, require_redis: bool) -> i32 {
    let unusable = t.pg_unusable.as_deref();
    let (fallback_runs, decisive_runs): (Vec<&ScenarioRun>, Vec<&ScenarioRun>) = t
        .runs
        .iter()
        .filter(|r| !redis_pending_run(r))
        .partition(|r| postgres_missing_run(r, unusable));
    // A black-box scenario that never started (no run has evidence) was skipped for want of
    // PostgreSQL; one that raced and is PENDING was not run as declared.
    let (fallback_targets, decisive_targets): (Vec<_>, Vec<_>) = t
        .targets
        .iter()
        .partition(|t| t.runs.iter().all(|r| r.evidence.is_none()));
    let decisive = decisive_runs
        .iter()
        .map(|r| r.verdict)
        .chain(decisive_targets.iter().map(|t| t.verdict))
        // A loom model with an unexpected result fails verify; a missing report does not
        // block it (it is shown PENDING).
        .chain(
            t.loom
                .as_ref()
                .is_some_and(|l| l.verdict() == Verdict::Fail)
                .then_some(Verdict::Fail),
        );
    let fallback = fallback_runs
        .iter()
        .map(|r| r.verdict)
        .chain(fallback_targets.iter().map(|t| t.verdict))
        .chain(t.suites.iter().map(|s| s.verdict))
        .chain(t.kill.iter().map(|k| k.postgres_verdict()))
        .chain(t.faults.iter().map(|f| f.postgres_verdict()))
        // The soak runs on PostgreSQL only: its PENDING is a PostgreSQL PENDING.
        .chain(t.soak.iter().map(|s| s.verdict));
    let code = exit_code(decisive, fallback, require_postgres);
    if code == EXIT_PASS && require_redis && redis_missing(t) {
        EXIT_PENDING
    } else {
        code
    }
}

/// Whether `run` is PENDING because Redis could not be used: `require_redis`'s business, left
/// out of the PostgreSQL requirement ([`exit_code`]).
fn redis_pending_run(run: &ScenarioRun) -> bool {
    run.verdict == Verdict::Pending && redis_pending(run.reason.as_deref())
}

/// Whether a `[lease]` run or a lease-gate cell is PENDING because Redis could not be used
/// (`--require-redis` makes that exit 3).
fn redis_missing(t: &Travelled) -> bool {
    t.runs.iter().any(|r| redis_pending(r.reason.as_deref()))
        || t.kill.as_ref().is_some_and(|k| {
            k.cells.iter().any(|c| {
                matches!(&c.outcome, ticketflow_harness::killmatrix::GateOutcome::Pending(why) if redis_pending(Some(why)))
            })
        })
}
