//! One run of a black-box scenario, and `--repeat`.
//!
//! A run: pick a fresh `{run}`; open (or create) the target database when the barrier or the
//! count queries need it; start the declared services; check every endpoint accepts
//! connections; read the target's PostgreSQL version and `default_transaction_isolation`;
//! then, wave by wave, send every racer's request on its own thread: a wave of two or more
//! racers is released by the scenario's barrier, a wave of one is sent as it is. After its
//! first answer each racer runs the retry phase (in-progress, listed statuses, transport
//! errors; bounded attempts, doubling backoff). Then the counts, then [`super::check`].
//!
//! Faults (`[[fault]]`, interposed scenarios): the conductor cuts the named racer's step
//! ([`crate::interpose::conduct::Conductor::run_with_faults`]); a wave of one racer with a
//! fault is conducted too. With a fault the retry phase also retries 5xx answers (what a
//! service answers when it lost its store connection), so the client's retry with the same
//! key is what the checks judge. `each = true` sweeps the fault over the racer's steps, one
//! run per step. With `[target] lock_ttl_ms`, after each wave a racer still answered "in
//! progress" retries until answered or the TTL (plus [`super::check::TTL_MARGIN_MS`]) has
//! passed ([`super::TtlWait`]).
//!
//! Barriers: [`crate::barrier::server`] for a table or advisory lock, counted among every
//! session of the target database but the runner's own (the runner cannot tell which server
//! session serves which client); the in-process [`crate::barrier::Barrier`] with
//! [`super::client::Held`] for the HTTP-level release; [`super::pause`] for `redis-pause`.
//! Count queries run on the target database, or, for Redis counts, on a direct connection to
//! `redis_url` ([`super::redis_store`]).

use crate::store::url::PgServer;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::check;
use super::client::{self, ClientError, Held, HttpAnswer, HttpRequest};
use super::format::{BarrierKind, BodyTemplate, FaultAt, TargetRacer, TargetScenario};
use super::rules::{classify, AnswerKind};
use super::service::{db, target_db, Services, TargetDb, TargetError};
use super::template::{self, Vars};
use super::{
    AnswerSeen, Attempt, CountSeen, RacerRun, TargetEvidence, TargetOutcome, TargetRun,
    WaveEvidence,
};
use crate::barrier::server::{gather, Among, Controller, Gathered, ServerLock};
use crate::barrier::Barrier;
use crate::fingerprint::sha256_hex;
use crate::scenario::capacity::FDS_PER_HTTP_RACER;
use crate::scenario::runner::ms;
use crate::scenario::timeline::now_us;
use crate::store::postgres::{self as pg, IsolationLevel, PgStore};
use crate::store::url::redact;
use crate::verdict::Verdict;

/// A PASS behind the HTTP-level barrier needs at least this many repeats: nothing on the server
/// shows that the requests overlapped, so one lucky interleaving is not evidence.
pub const MIN_HTTP_REPEATS: usize = 3;

/// How to run black-box scenarios.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// PostgreSQL server for scratch databases (scenarios with services and no database_url).
    pub pg: PgServer,
    /// What `{ticketflow}` names in service commands (default: the running binary).
    pub exe: Option<PathBuf>,
    /// Overrides every scenario's barrier timeout.
    pub barrier_timeout: Option<Duration>,
    /// Runs per scenario (`--repeat`), at least 1.
    pub repeat: usize,
    /// Called with a line of progress every [`WAIT_NOTICE`] while a wave's requests are still
    /// out (the CLI prints it on stderr), so a slow or silent target never means a silent
    /// harness. `None`: nothing is said.
    pub on_wait: Option<fn(&str)>,
    /// Overrides the `[schedule]` mode of interposed scenarios (`--explore`).
    pub explore: Option<super::format::ExploreMode>,
    /// Runs only this schedule id of interposed scenarios (`--schedule`).
    pub schedule: Option<String>,
    /// Explores on after a failing schedule (`--keep-going`).
    pub keep_going: bool,
}

/// How often [`RunOptions::on_wait`] hears that a wave is still waiting.
pub const WAIT_NOTICE: Duration = Duration::from_secs(10);

impl RunOptions {
    /// Defaults: one run, scratch databases on `pg`.
    pub fn new(pg: PgServer) -> Self {
        RunOptions {
            pg,
            exe: None,
            barrier_timeout: None,
            repeat: 1,
            on_wait: None,
            explore: None,
            schedule: None,
            keep_going: false,
        }
    }
}

/// Runs `scenario` `opts.repeat` times (each with a fresh `{run}`) and sums up.
///
/// Will return `Err` when the first run could not start for a reason that is the scenario's or
/// the caller's (an unreachable endpoint or database, a table that does not exist): nothing
/// was raced, and repeating would not help.
pub fn run_repeated(
    scenario: &TargetScenario,
    opts: &RunOptions,
) -> Result<TargetOutcome, TargetError> {
    if scenario.barrier.kind == BarrierKind::Interposer {
        return explore(scenario, opts);
    }
    let mut runs = Vec::new();
    for i in 0..opts.repeat.max(1) {
        match run_target(scenario, opts) {
            Ok(run) => runs.push(run),
            Err(e) if i == 0 => return Err(e),
            Err(e) => runs.push(not_run(scenario, e.to_string())),
        }
    }
    Ok(summarise(scenario, runs))
}

/// Steps each racer took in each conducted wave of `run`: `[wave][racer]`.
fn steps_per_racer(run: &TargetRun) -> Vec<Vec<u64>> {
    run.evidence
        .iter()
        .flat_map(|e| e.waves.iter())
        .filter_map(|w| w.schedule.as_ref().map(|s| (w.racers, s)))
        .map(|(n, s)| {
            let mut k = vec![0u64; n];
            for step in &s.steps {
                if let Some(x) = k.get_mut(step.racer) {
                    *x += 1;
                }
            }
            k
        })
        .collect()
}

/// The schedules of `steps` (per wave, per racer), every step always enabled: the product of
/// each wave's count, bounded by `bound` preemptions per wave when given; `None` when too many
/// to count.
fn schedule_count(steps: &[Vec<u64>], bound: Option<u32>) -> Option<u128> {
    use crate::interpose::explore::{bounded_interleavings, interleavings};
    steps.iter().try_fold(1u128, |acc, k| {
        let c = match bound {
            None => interleavings(k)?,
            Some(b) => bounded_interleavings(k, b)?,
        };
        acc.checked_mul(c)
    })
}

/// An interposed scenario: one set-up, then the runs its schedule mode (or `--explore`,
/// `--schedule`) asks for, each from a fresh `{run}`; stops at the first failing schedule
/// unless `--keep-going`. The outcome's coverage says what was explored.
///
/// Will return `Err` as [`run_repeated`] does, or [`TargetError::Setup`] for a schedule id
/// that does not parse.
///
/// Long because every mode shares its one set-up and the run closure; the search and the sweep
/// are functions of their own.
fn explore(scenario: &TargetScenario, opts: &RunOptions) -> Result<TargetOutcome, TargetError> {
    use super::format::ExploreMode;
    use crate::interpose::explore::{parse_schedule_id, Chooser, Prefix};
    let spec = scenario.schedule.clone().unwrap_or_default();
    let mode = opts.explore.unwrap_or(spec.mode);
    let replay = match &opts.schedule {
        Some(id) => Some(parse_schedule_id(id).map_err(|e| TargetError::Setup(e.to_string()))?),
        None => None,
    };
    if !scenario.faults.is_empty() && mode == ExploreMode::FirstPoint && replay.is_none() {
        return Err(TargetError::Setup(
            format!("[[fault]] needs the steps released one at a time; first-point runs them free (drop {} first-point)", crate::flags::EXPLORE),
        ));
    }
    let sweep = scenario.faults.iter().position(|f| f.at == FaultAt::Each);
    // Statements of the swept racer's first attempt that no run of the sweep cut.
    let mut sweep_missed: Option<Vec<String>> = None;
    let mut prepared = prepare(scenario, opts)?;
    let widest = scenario
        .waves()
        .iter()
        .map(|(_, r)| r.len())
        .max()
        .unwrap_or(0);
    let mut runs: Vec<TargetRun> = Vec::new();
    let mut one = |runs: &mut Vec<TargetRun>,
                   chooser: Option<&mut dyn Chooser>|
     -> Result<bool, TargetError> {
        let run = race(scenario, opts, &mut prepared, &fresh_run_id(), chooser)?;
        let stop = ends_exploration(&run, opts);
        runs.push(run);
        Ok(stop)
    };
    let coverage = if let Some(j) = sweep {
        let choices = replay.clone().unwrap_or_default();
        let (coverage, missed) = sweep_fault_steps(
            scenario,
            opts,
            &mut prepared,
            &mut runs,
            j,
            &choices,
            spec.limit,
        )?;
        sweep_missed = missed;
        coverage
    } else if let Some(choices) = replay {
        let mut p = Prefix {
            choices,
            divergences: 0,
        };
        one(&mut runs, Some(&mut p))?;
        format!(
            "replayed schedule {} ({} divergence(s) where the service branched)",
            opts.schedule.as_deref().unwrap_or(""),
            p.divergences
        )
    } else if mode == ExploreMode::FirstPoint {
        for _ in 0..opts.repeat.max(1) {
            if one(&mut runs, None)? {
                break;
            }
        }
        format!(
            "first point: {} run(s), every racer's first store command held, then all released and run free (no schedule explored)",
            runs.len()
        )
    } else {
        search_schedules(scenario, mode, widest, &mut runs, &mut one)?
    };
    drop(prepared);
    let mut outcome = summarise(scenario, runs);
    if outcome.verdict == Verdict::Fail {
        if let Some(run) = outcome.runs.iter().find(|r| r.verdict == Verdict::Fail) {
            let id = run
                .evidence
                .as_ref()
                .and_then(|e| e.schedule_id.clone())
                .unwrap_or_default();
            let replay = crate::argv::reproduce_schedule(&scenario.file, &id);
            outcome.failing_schedule = failing_schedule(run, &id, &replay);
            let mut reason = run.reason.clone().unwrap_or_default();
            // A sweep's failing run is known by the step it cut.
            let cut = run
                .evidence
                .iter()
                .flat_map(|e| e.waves.iter())
                .filter_map(|w| w.schedule.as_ref())
                .flat_map(|s| s.faults.iter())
                .find(|f| f.struck());
            if let (Some(_), Some(f)) = (sweep, cut) {
                reason = format!("with {}: {reason}", f.label);
            }
            outcome.reason = Some(if id.is_empty() {
                reason
            } else {
                format!("schedule {id} failed: {reason} (replay: {replay})")
            });
        }
    }
    if let (Verdict::Pass, Some(missed)) = (outcome.verdict, &sweep_missed) {
        outcome.verdict = Verdict::Pending;
        outcome.reason = Some(format!(
            "the sweep reached its limit of {} runs before it cut {}",
            scenario.schedule.clone().unwrap_or_default().limit,
            missed.join(", ")
        ));
    }
    outcome.coverage = Some(coverage);
    Ok(outcome)
}

/// A run, as [`explore`] makes each: `true` when the exploration stops after it (a FAIL
/// without `--keep-going`, or a run that could not be set up as declared).
type RunOne<'a> = dyn FnMut(
        &mut Vec<TargetRun>,
        Option<&mut dyn crate::interpose::explore::Chooser>,
    ) -> Result<bool, TargetError>
    + 'a;

/// The schedule search of [`explore`] for `exhaustive`, `bounded`, `pct` and `auto`: the
/// default schedule first (it measures the steps), then PCT's seeded runs, or the
/// depth-first search over choice points within the preemption bound (`auto` also adds runs
/// whose first commands overlap). Returns the coverage line.
///
/// Will return `Err` as [`race`] does.
///
/// Long because the PCT runs and the depth-first search share the first run, its step counts
/// and the run closure, and each states its coverage from them.
fn search_schedules(
    scenario: &TargetScenario,
    mode: super::format::ExploreMode,
    widest: usize,
    runs: &mut Vec<TargetRun>,
    one: &mut RunOne<'_>,
) -> Result<String, TargetError> {
    use super::format::ExploreMode;
    use crate::interpose::explore::{miss_probability, pct_bound, Pct, Prefix, Search};
    let spec = scenario.schedule.clone().unwrap_or_default();
    // The default schedule first: it measures the steps.
    let mut first = Prefix::default();
    let stop = one(runs, Some(&mut first))?;
    let steps = runs.last().map(steps_per_racer).unwrap_or_default();
    let total: u64 = steps.iter().flatten().sum();
    let racers = widest;
    let coverage = if mode == ExploreMode::Pct {
        let k = usize::try_from(total).unwrap_or(usize::MAX);
        if !stop {
            for r in 1..spec.runs {
                let mut pct = Pct::new(spec.seed, r as u64, racers, k, spec.depth);
                if one(runs, Some(&mut pct))? {
                    break;
                }
            }
        }
        let p = pct_bound(racers, k, spec.depth);
        format!(
            "{racers} racers, {total} wire steps, PCT: {} run(s) of depth {} (seed {}): one run finds a depth-{} bug with probability at least {p:.4}; all of them miss it with probability at most {:.4}",
            runs.len(),
            spec.depth,
            spec.seed,
            spec.depth,
            miss_probability(p, runs.len())
        )
    } else {
        let exhaustive_count = schedule_count(&steps, None);
        let bound = match mode {
            ExploreMode::Exhaustive => None,
            ExploreMode::Bounded => Some(spec.preemptions),
            _ => match exhaustive_count {
                Some(c) if c <= spec.limit as u128 => None,
                _ => Some(spec.preemptions),
            },
        };
        let expected = schedule_count(&steps, bound);
        let mut search = Search::new(bound);
        let _ = search.next_prefix();
        if let Some(points) = runs.last().and_then(run_points) {
            search.record(&points);
        }
        let mut stopped_at_fail = stop;
        if !stop {
            while runs.len() < spec.limit {
                let Some(prefix) = search.next_prefix() else {
                    break;
                };
                let mut p = Prefix {
                    choices: prefix,
                    divergences: 0,
                };
                if one(runs, Some(&mut p))? {
                    stopped_at_fail = true;
                    break;
                }
                if let Some(points) = runs.last().and_then(run_points) {
                    search.record(&points);
                }
            }
        }
        let complete = search.next_prefix().is_none() && !stopped_at_fail;
        // A schedule releases one command at a time, so two statements never run inside
        // the server at once: a race within one statement (two snapshots that each miss
        // the other's uncommitted row, a `WHERE NOT EXISTS` insert without a unique
        // index) is outside every schedule. `auto` adds runs in which every racer's first
        // command is released together, so they overlap there.
        let mut overlapped = 0;
        if mode == ExploreMode::Auto && !stopped_at_fail && scenario.faults.is_empty() {
            for _ in 0..AUTO_OVERLAP_RUNS {
                overlapped += 1;
                if one(runs, None)? {
                    stopped_at_fail = true;
                    break;
                }
            }
        }
        let how = match (bound, mode) {
            (None, _) => "exhaustive".to_string(),
            // Say why auto chose the bound: the count printed after is the bounded one.
            (Some(b), ExploreMode::Auto) => format!(
                "bounded, at most {b} preemption(s): auto, since every interleaving would be {} schedules, over the limit of {}",
                exhaustive_count.map_or("too many to count".to_string(), |c| c.to_string()),
                spec.limit
            ),
            (Some(b), _) => format!("bounded, at most {b} preemption(s)"),
        };
        let of = match expected {
            Some(c) => format!("{c}"),
            None => "too many to count".into(),
        };
        let end = if stopped_at_fail {
            "stopped at the first schedule that failed or could not run".to_string()
        } else if complete {
            "search complete".to_string()
        } else {
            format!("stopped at the limit of {} schedules", spec.limit)
        };
        // The count assumes every step always enabled; lock waits (a racer that cannot
        // go) and branches make the real number differ, so it is stated as an estimate.
        // Retries after an "in progress" answer are steps the first run (which runs
        // each racer to its end in turn) does not take, so the count leaves them out.
        let retried = runs
            .iter()
            .filter(|r| r.racers.iter().any(|x| x.attempts.len() > 1))
            .count();
        format!(
            "{racers} racers, {total} wire steps in the first run, {} schedule(s) run ({how}; {end}; {of} if every step were always enabled{}){}",
            runs.len() - overlapped,
            if retried > 0 {
                format!("; that count is from the first run's steps and leaves out the steps of retries, which {retried} schedule(s) took")
            } else {
                String::new()
            },
            if overlapped > 0 {
                format!("; and {overlapped} run(s) with every racer's first command released together, so statements overlapped inside the server (one at a time they never do; these runs are samples, not a proof)")
            } else {
                String::new()
            }
        )
    };
    Ok(coverage)
}

/// A fault sweep (`[[fault]] each = true`, the fault `j`): one run per step of the racer's
/// first attempt, each following `choices` (the default schedule when empty), until a step
/// number never comes (that run only marks the sweep's end), a run fails or cannot run, or
/// `limit` runs have run; then a run aimed at each statement shape no numbered run cut.
/// Returns the coverage line, and the shapes the limit left uncut (which make a passing
/// sweep PENDING).
///
/// Will return `Err` as [`race`] does.
///
/// Long because the numbered runs and the aimed runs share one run closure and the reference
/// run, and the coverage line is built from both.
fn sweep_fault_steps(
    scenario: &TargetScenario,
    opts: &RunOptions,
    prepared: &mut Prepared,
    runs: &mut Vec<TargetRun>,
    j: usize,
    choices: &[usize],
    limit: usize,
) -> Result<(String, Option<Vec<String>>), TargetError> {
    use crate::interpose::explore::Prefix;
    // One run per step of the racer's first attempt, each following the default schedule
    // (or the replayed one), until a step number never comes: that run only marks the
    // sweep's end. A run that could not be set up as declared ends it too.
    let racer_name = scenario.racers[scenario.faults[j].racer].name.clone();
    // A run with the fault put at `at`, following `choices`.
    let mut run_at = |at: FaultAt| -> Result<TargetRun, TargetError> {
        let mut at_step = scenario.clone();
        at_step.faults[j].at = at;
        let mut p = Prefix {
            choices: choices.to_vec(),
            divergences: 0,
        };
        race(&at_step, opts, prepared, &fresh_run_id(), Some(&mut p))
    };
    let mut k = 1;
    // The run in which the next step number never came: its counted steps are the
    // first attempt's, the reference each sweep run's cut is checked against.
    let mut reference: Option<Vec<String>> = None;
    let ended = loop {
        let run = run_at(FaultAt::Step(k))?;
        if k > 1 && fault_never_came(&run) {
            reference = sweep_fault(&run, &racer_name).map(|f| f.counted_shapes.clone());
            break format!("step {k} never came");
        }
        let stop = ends_exploration(&run, opts);
        runs.push(run);
        if stop {
            break format!("stopped at step {k}, which failed or could not run");
        }
        if runs.len() >= limit {
            break format!("stopped at the limit of {limit} runs");
        }
        k += 1;
    };
    let swept = runs.len();
    // A step number can name another statement in another run (a connection the
    // service opened in the request's path in one run only, a branch), so the numbered
    // runs alone may never cut some statement. The run that ended the sweep has the
    // first attempt's steps: each statement shape no numbered run cut is aimed at by a
    // run of its own, which cuts the first step of that shape. A shape the service does
    // not take again is named in the coverage; one the limit left unrun makes a passing
    // sweep PENDING, never PASS.
    let mut by_shape = 0;
    let mut not_taken_again: Vec<String> = Vec::new();
    let mut over_limit: Vec<String> = Vec::new();
    if let Some(reference) = reference.filter(|_| !runs.iter().any(|r| r.verdict == Verdict::Fail))
    {
        let cut: std::collections::HashSet<String> = runs
            .iter()
            .filter_map(|r| cut_shape(r, &racer_name))
            .collect();
        let mut missing: Vec<String> = Vec::new();
        for shape in reference {
            if !cut.contains(&shape) && !missing.contains(&shape) {
                missing.push(shape);
            }
        }
        let short = |shape: &str| crate::interpose::hub::clip_to(shape, 80);
        for shape in missing {
            if runs.len() >= limit {
                over_limit.push(short(&shape));
                continue;
            }
            let run = run_at(FaultAt::Shape(shape.clone()))?;
            by_shape += 1;
            let failed = run.verdict == Verdict::Fail;
            if cut_shape(&run, &racer_name).is_none() {
                not_taken_again.push(short(&shape));
                // Like the run that ended the numbered sweep, it cut nothing: it only
                // marks what was not taken, unless it failed on its own.
                if !failed {
                    continue;
                }
            }
            runs.push(run);
            if failed && !opts.keep_going {
                break;
            }
        }
    }
    let f = &scenario.faults[j];
    let mut coverage =
        format!(
        "{}: {} run(s), steps 1 to {} of {}'s first attempt, each with the {} schedule; {ended}",
        f.describe(scenario, &f.at),
        runs.len(),
        swept,
        racer_name,
        if choices.is_empty() { "default" } else { "replayed" }
    );
    if by_shape > 0 {
        coverage.push_str(&format!(
            "; {by_shape} run(s) aimed at a statement no numbered run had cut (a step number named another statement in another run)"
        ));
    }
    if !not_taken_again.is_empty() {
        coverage.push_str(&format!(
            "; not taken again when aimed at (those runs cut nothing and are not among the runs counted), so never cut: {}",
            not_taken_again.join(", ")
        ));
    }
    if !over_limit.is_empty() {
        coverage.push_str(&format!(
            "; never cut, the limit reached first: {}",
            over_limit.join(", ")
        ));
    }
    Ok((coverage, (!over_limit.is_empty()).then_some(over_limit)))
}

/// The shape ([`crate::interpose::conduct::step_shape`]) of the step the swept racer's
/// fault cut in `run`, if it struck.
fn cut_shape(run: &TargetRun, racer: &str) -> Option<String> {
    let f = sweep_fault(run, racer)?;
    Some(crate::interpose::conduct::step_shape(
        f.store?,
        f.text.as_deref()?,
    ))
}

/// The swept racer's fault record in `run` (the conductor's label names the racer).
fn sweep_fault<'r>(
    run: &'r TargetRun,
    racer: &str,
) -> Option<&'r crate::interpose::conduct::FaultSeen> {
    run.evidence
        .as_ref()?
        .waves
        .iter()
        .filter_map(|w| w.schedule.as_ref())
        .flat_map(|s| s.faults.iter())
        .find(|f| f.is_on(racer))
}

/// Whether an exploration stops after `run`: a FAIL (unless `--keep-going`), or a run that
/// could not be set up as declared (a racer never reached the store), since the next
/// schedules would meet the same obstacle.
fn ends_exploration(run: &TargetRun, opts: &RunOptions) -> bool {
    match run.verdict {
        Verdict::Fail => !opts.keep_going,
        Verdict::Pending => true,
        Verdict::Pass => false,
    }
}

/// Runs `auto` adds after its search, each with every racer's first store command released
/// together (the first point), so that the racers' statements overlap inside the server.
pub const AUTO_OVERLAP_RUNS: usize = 3;

/// The failing schedule `id` of `run` as a diagram and an isolation-tester spec; `None` when
/// the run followed no schedule (first point).
fn failing_schedule(run: &TargetRun, id: &str, replay: &str) -> Option<super::FailingSchedule> {
    let e = run.evidence.as_ref()?;
    if id.is_empty() {
        return None;
    }
    let mermaid = crate::blackbox::diagram::schedule_diagram(run)?;
    let (isolation_spec, isolation_spec_missing) =
        match crate::blackbox::isolation::render_schedule(run) {
            Ok(spec) => (Some(spec), None),
            Err(err) => (None, Some(err.to_string())),
        };
    Some(super::FailingSchedule {
        schedule_id: id.to_string(),
        run_id: e.run_id.clone(),
        replay: replay.to_string(),
        mermaid,
        isolation_spec,
        isolation_spec_missing,
        isolation_spec_path: None,
    })
}

/// Whether a fault of `run` never struck in a wave that was conducted as declared (the racer's
/// first attempt had fewer steps than the fault names).
fn fault_never_came(run: &TargetRun) -> bool {
    run.evidence.as_ref().is_some_and(|e| {
        e.waves.iter().any(|w| {
            w.problem.is_none()
                && w.schedule
                    .as_ref()
                    .is_some_and(|s| s.faults.iter().any(|f| !f.struck()))
        })
    })
}

/// Every choice point of `run`, across its waves.
fn run_points(run: &TargetRun) -> Option<Vec<crate::interpose::explore::ChoicePoint>> {
    let e = run.evidence.as_ref()?;
    Some(
        e.waves
            .iter()
            .filter_map(|w| w.schedule.as_ref())
            .flat_map(|s| s.points.iter().cloned())
            .collect(),
    )
}

/// Sums up repeats into one verdict ([`TargetOutcome::verdict`]).
pub fn summarise(scenario: &TargetScenario, runs: Vec<TargetRun>) -> TargetOutcome {
    let count = |v: Verdict| runs.iter().filter(|r| r.verdict == v).count();
    let (passes, failures, pending) = (
        count(Verdict::Pass),
        count(Verdict::Fail),
        count(Verdict::Pending),
    );
    let ran = passes + failures;
    let server_side = scenario.barrier.kind.server_side();
    let (verdict, reason) = if failures > 0 {
        let first = runs
            .iter()
            .find(|r| r.verdict == Verdict::Fail)
            .and_then(|r| r.reason.clone())
            .unwrap_or_default();
        (
            Verdict::Fail,
            Some(if runs.len() > 1 {
                format!(
                    "{failures} of {} repeats failed; first: {first}",
                    runs.len()
                )
            } else {
                first
            }),
        )
    } else if passes == 0 {
        (
            Verdict::Pending,
            Some(
                runs.iter()
                    .find_map(|r| r.reason.clone())
                    .unwrap_or_else(|| "did not run".into()),
            ),
        )
    } else if used_http_barrier(&runs) && passes < MIN_HTTP_REPEATS {
        (
            Verdict::Pending,
            Some(format!(
                "HTTP-level barrier (no server-side proof): {passes} passing run(s); a PASS needs {} {MIN_HTTP_REPEATS} or more",
                crate::flags::REPEAT
            )),
        )
    } else if pending > 0 {
        (
            Verdict::Pending,
            Some(format!("{pending} of {} repeats did not run", runs.len())),
        )
    } else {
        (Verdict::Pass, None)
    };
    TargetOutcome {
        scenario: scenario.name.clone(),
        file: scenario.file.display().to_string(),
        barrier: scenario.barrier.kind.name().to_string(),
        server_side,
        verdict,
        reason,
        passes,
        failures,
        pending,
        flake_rate: if ran == 0 {
            0.0
        } else {
            failures as f64 / ran as f64
        },
        coverage: None,
        failing_schedule: None,
        runs,
    }
}

/// Whether any wave of `runs` was released by the HTTP-level barrier (waves of one racer use
/// no barrier, so a scenario made only of them needs no repeats).
fn used_http_barrier(runs: &[TargetRun]) -> bool {
    runs.iter().any(|r| {
        r.evidence
            .as_ref()
            .is_some_and(|e| e.waves.iter().any(|w| w.barrier == "http"))
    })
}

/// A run that did not happen (PENDING with `reason`).
pub fn not_run(scenario: &TargetScenario, reason: String) -> TargetRun {
    TargetRun {
        scenario: scenario.name.clone(),
        file: scenario.file.display().to_string(),
        verdict: Verdict::Pending,
        reason: Some(reason),
        evidence_line: None,
        checks: Vec::new(),
        racers: Vec::new(),
        answers: Vec::new(),
        counts: Vec::new(),
        evidence: None,
    }
}

/// A fresh `{run}` value: `r` and 8 hex digits.
pub fn fresh_run_id() -> String {
    format!("r{:08x}", rand::random::<u32>())
}

/// One run with a fresh `{run}`.
///
/// Will return `Err` for what stops a run before anything is raced and is not the target's
/// fault: an unreachable database or endpoint, a barrier table that does not exist. A service
/// that will not start, or a database statement that fails during the run, is a FAIL run.
pub fn run_target(scenario: &TargetScenario, opts: &RunOptions) -> Result<TargetRun, TargetError> {
    let run_id = fresh_run_id();
    match run_inner(scenario, opts, &run_id) {
        Ok(run) => Ok(run),
        Err(
            e @ (TargetError::Unreachable { .. }
            | TargetError::Setup(_)
            | TargetError::Url(_)
            | TargetError::Capacity(_)),
        ) => Err(e),
        Err(e) => {
            let mut run = not_run(scenario, e.to_string());
            run.verdict = Verdict::Fail;
            Ok(run)
        }
    }
}

/// Racers' requests, built from the templates.
struct Built {
    request: HttpRequest,
    wire_key: String,
    body_sha256: String,
}

/// The placeholders' values for `racer` in run `run_id`.
fn vars_for(scenario: &TargetScenario, racer: &TargetRacer, run_id: &str) -> Vars {
    let t = &scenario.target;
    let mut vars: Vars = [
        ("run", run_id.to_string()),
        ("racer", racer.name.clone()),
        ("n", racer.n.to_string()),
    ]
    .into();
    if let Some(scope) = racer
        .scope
        .as_ref()
        .and_then(|s| t.scopes.iter().find(|x| &x.name == s))
    {
        let value = template::expand(&scope.value, &vars);
        vars.insert("scope", value);
    }
    vars.insert("key", racer.key.clone());
    let wire_key = template::expand(&t.request.key, &vars);
    vars.insert("key", wire_key);
    vars
}

/// A run id of the shape [`fresh_run_id`] makes, for checking requests at load.
pub(crate) const SAMPLE_RUN_ID: &str = "r00000000";

/// The request `racer` sends to `base_url` in run `run_id`, every placeholder filled.
pub(crate) fn build_request(
    scenario: &TargetScenario,
    racer: &TargetRacer,
    base_url: &str,
    run_id: &str,
) -> HttpRequest {
    build(scenario, racer, base_url, run_id).request
}

/// Builds every racer's request of every wave, as [`race`] will send them, and checks each
/// with [`client::check`] before the first is sent.
///
/// Will return `Err` ([`TargetError::Setup`]) naming the first racer whose request cannot be
/// sent; nothing was sent then.
fn check_requests(
    scenario: &TargetScenario,
    endpoints: &[(String, String)],
    run_id: &str,
) -> Result<(), TargetError> {
    for (_, indices) in scenario.waves() {
        for (i, b, _) in build_wave(scenario, &indices, endpoints, run_id) {
            client::check(&b.request).map_err(|e| {
                // The URL is not quoted: its path may hold an `${ENV}` secret.
                let why = match e {
                    ClientError::Url { reason, .. } => format!("the URL cannot be used: {reason}"),
                    other => other.to_string(),
                };
                TargetError::Setup(format!(
                    "racer {:?}'s request cannot be sent: {why}; nothing was sent",
                    scenario.racers[i].name
                ))
            })?;
        }
    }
    Ok(())
}

fn build(scenario: &TargetScenario, racer: &TargetRacer, base_url: &str, run_id: &str) -> Built {
    let t = &scenario.target;
    let vars = vars_for(scenario, racer, run_id);
    let mut headers: Vec<(String, String)> = Vec::new();
    let mut set = |name: &str, value: String| {
        headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        headers.push((name.to_string(), value));
    };
    for (n, v) in &t.request.headers {
        set(n, template::expand(v, &vars));
    }
    if let Some(scope) = racer
        .scope
        .as_ref()
        .and_then(|s| t.scopes.iter().find(|x| &x.name == s))
    {
        for (n, v) in &scope.headers {
            set(n, template::expand(v, &vars));
        }
    }
    set(&t.request.key_header, vars["key"].clone());
    let (body, content_type) = match scenario.body_of(racer) {
        BodyTemplate::Empty => (Vec::new(), None),
        BodyTemplate::Json(j) => (
            serde_json::to_vec(&template::expand_json(j, &vars)).expect("JSON values serialise"),
            Some("application/json".to_string()),
        ),
        BodyTemplate::Raw { text, content_type } => (
            template::expand(text, &vars).into_bytes(),
            Some(content_type.clone()),
        ),
    };
    let has_content_type = headers
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case("content-type"));
    if let (Some(ct), false) = (content_type, has_content_type) {
        headers.push(("Content-Type".into(), ct));
    }
    Built {
        request: HttpRequest {
            method: t.request.method.clone(),
            url: format!("{base_url}{}", template::expand(&t.request.path, &vars)),
            headers,
            body: body.clone(),
        },
        wire_key: vars["key"].clone(),
        body_sha256: sha256_hex(&body),
    }
}

/// Whether the text output shows a response header named `name`: the ones the verdict reads
/// (content type, location, retry-after, the replay marker, the id header and every header a
/// rule names) and any whose name looks like an idempotency or replay marker (`idempot` or
/// `replay`, case-insensitive), so a service's own marker is seen without curl. `--json` and
/// report.json keep every header whatever this says.
pub fn shown_header(scenario: &TargetScenario, name: &str) -> bool {
    let t = &scenario.target;
    let lower = name.to_ascii_lowercase();
    if lower.contains("idempot") || lower.contains("replay") {
        return true;
    }
    let fixed = [
        "content-type",
        "location",
        "retry-after",
        crate::wire::REPLAYED_HEADER,
    ];
    let by_rule = t
        .rules
        .iter()
        .filter_map(|r| r.header.as_ref().map(|h| h.0.as_str()));
    let by_id = match &t.id {
        super::rules::IdSource::Header { name, .. } => Some(name.as_str()),
        _ => None,
    };
    fixed
        .into_iter()
        .chain(by_rule)
        .chain(by_id)
        .any(|x| x.eq_ignore_ascii_case(name))
}

/// Classifies an answer (or a transport error) into an attempt. The bool says whether a
/// transport error was seen (a retry may be safe).
fn attempt_of(
    scenario: &TargetScenario,
    started_us: u64,
    result: Result<HttpAnswer, ClientError>,
) -> (Attempt, bool) {
    let finished_us = now_us();
    let answer = match result {
        Ok(a) => a,
        Err(e @ ClientError::Timeout { .. }) => {
            // Its own outcome: the service may still be working on it, and a retry would
            // wait as long again.
            let within = format!("no answer within {} ms", scenario.target.request_timeout_ms);
            return (
                Attempt::unanswered(
                    started_us,
                    finished_us,
                    e.to_string(),
                    AnswerKind::Timeout,
                    within,
                ),
                false,
            );
        }
        Err(e) => {
            let transport = e.is_transport();
            let note = if transport {
                "transport error"
            } else {
                "unreadable answer"
            };
            return (
                Attempt::unanswered(
                    started_us,
                    finished_us,
                    e.to_string(),
                    AnswerKind::Error,
                    note.into(),
                ),
                transport,
            );
        }
    };
    let t = &scenario.target;
    let json: Option<serde_json::Value> = serde_json::from_slice(&answer.body).ok();
    let (mut kind, rule) = match classify(&t.rules, &answer, json.as_ref()) {
        Some(r) => (r.outcome, Some(r.origin.clone())),
        None => (AnswerKind::Error, None),
    };
    let mut note = rule
        .is_none()
        .then(|| format!("no rule matched HTTP {}", answer.status));
    let mut id = None;
    if kind.has_resource() {
        match t.id.extract(&answer, json.as_ref()) {
            Ok(i) => id = Some(i),
            Err(e) => {
                note = Some(format!("{kind} by rule, but {e}"));
                kind = AnswerKind::Error;
            }
        }
    }
    let text = answer.body_text();
    let seen = AnswerSeen {
        status: answer.status,
        headers: answer.headers.clone(),
        body_excerpt: excerpt(&text, 240),
        body: answer.body,
    };
    (
        Attempt {
            started_us,
            finished_us,
            answer: Ok(seen),
            kind,
            rule,
            id,
            note,
        },
        false,
    )
}

/// The first `n` characters of `text`, whitespace runs folded, with `…` when cut.
pub fn excerpt(text: &str, n: usize) -> String {
    let folded: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if folded.chars().count() <= n {
        folded
    } else {
        format!("{}…", folded.chars().take(n).collect::<String>())
    }
}

/// Re-sends `request` while the last answer is retryable and attempts remain.
fn retry_phase(
    scenario: &TargetScenario,
    request: &HttpRequest,
    timeout: Duration,
    attempts: &mut Vec<Attempt>,
    mut transport: bool,
    yields: &std::sync::atomic::AtomicUsize,
) {
    let t = &scenario.target;
    let mut backoff = Duration::from_millis(t.retry.backoff_ms);
    loop {
        let last = attempts.last().expect("one attempt at least");
        // After a cut the service may answer 5xx (its store connection was lost): a client
        // retries that with the same key, and the retry is what the fault is for.
        let retryable = last.kind == AnswerKind::InProgress
            || last.answer.as_ref().is_ok_and(|a| {
                t.retry_statuses.contains(&a.status)
                    || (!scenario.faults.is_empty() && (500..=599).contains(&a.status))
            })
            || (transport && t.retry.transport_errors);
        if !retryable || attempts.len() as u32 >= t.retry.attempts {
            return;
        }
        // Counted before the backoff, so an interposed wave's conductor sees the yield before
        // the retry's first command can be held.
        if last.kind == AnswerKind::InProgress {
            yields.fetch_add(1, Ordering::SeqCst);
        }
        // The client's backoff before a retry (what a well-behaved client does); it orders
        // nothing in the harness.
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(Duration::from_millis(t.retry.max_backoff_ms));
        let started = now_us();
        let (a, tr) = attempt_of(scenario, started, client::send(request, timeout));
        transport = tr;
        attempts.push(a);
    }
}

/// How a wave's first requests are sent.
enum Release<'a> {
    /// Sent as they are.
    Direct,
    /// Sent as they are, held by a lock the controller holds.
    Server(Box<Controller>, &'a mut postgres::Client),
    /// Written but for the last byte, released together.
    Http,
    /// Sent one by one, each held at the interposer at its first command, then conducted.
    Interposed(
        Box<(
            crate::interpose::conduct::Conductor<'a>,
            crate::interpose::conduct::Plan<'a>,
            Vec<crate::interpose::conduct::StepFault>,
        )>,
    ),
    /// Sent while the Redis server's writes are paused, released by `CLIENT UNPAUSE` once
    /// every racer is seen blocked on a write ([`super::pause`]).
    RedisPause(&'a mut super::pause::PauseController),
}

/// The racers of an interposed wave as the conductor sees them: let go one by one, answered,
/// finished.
struct Gate<'a> {
    go: Mutex<Vec<bool>>,
    let_go: std::sync::Condvar,
    finished: Vec<AtomicBool>,
    firsts: &'a FirstAnswers,
    /// Per racer, the "in progress" answers it is retrying after.
    yields: Vec<std::sync::atomic::AtomicUsize>,
}

impl Gate<'_> {
    fn wait(&self, i: usize) {
        let mut g = self.go.lock().unwrap_or_else(|p| p.into_inner());
        while !g[i] {
            g = self.let_go.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn open_all(&self) {
        self.go
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter_mut()
            .for_each(|g| *g = true);
        self.let_go.notify_all();
    }
}

impl crate::interpose::conduct::Racers for Gate<'_> {
    fn count(&self) -> usize {
        self.finished.len()
    }
    fn go(&self, i: usize) {
        self.go.lock().unwrap_or_else(|p| p.into_inner())[i] = true;
        self.let_go.notify_all();
    }
    fn answered(&self, i: usize) -> bool {
        self.firsts.done[i].load(Ordering::SeqCst)
    }
    fn finished(&self, i: usize) -> bool {
        self.finished[i].load(Ordering::SeqCst)
    }
    fn yields(&self, i: usize) -> usize {
        self.yields[i].load(Ordering::SeqCst)
    }
}

/// Runs one wave; returns its evidence and each racer's run, in `indices` order.
///
/// Long because it is one `thread::scope`: the racers' threads, the release (HTTP, lock
/// barrier, Redis pause or interposer) and the end of the wave all run inside it, in order.
fn run_wave(
    scenario: &TargetScenario,
    wave: u32,
    built: &[(usize, Built, String)],
    release: Release<'_>,
    barrier_timeout: Duration,
    on_wait: Option<fn(&str)>,
) -> (WaveEvidence, Vec<Vec<Attempt>>) {
    let t = &scenario.target;
    let timeout = Duration::from_millis(t.request_timeout_ms);
    let n = built.len();
    let firsts = FirstAnswers::new(n);
    let http = HttpRelease {
        released_at: Mutex::new(Vec::new()),
        held_count: std::sync::atomic::AtomicUsize::new(0),
        local: Barrier::new(n),
        barrier_timeout,
    };
    let is_http = matches!(release, Release::Http);
    let gate = Gate {
        go: Mutex::new(vec![!matches!(release, Release::Interposed(_)); n]),
        let_go: std::sync::Condvar::new(),
        finished: (0..n).map(|_| AtomicBool::new(false)).collect(),
        firsts: &firsts,
        yields: (0..n)
            .map(|_| std::sync::atomic::AtomicUsize::new(0))
            .collect(),
    };
    let mut evidence = wave_evidence(scenario, wave, n, &release);
    let mut release = release;
    // The pause comes before any request leaves; when it cannot be taken the racers run free
    // and the wave's problem says why (the run cannot PASS).
    let mut paused = false;
    if let Release::RedisPause(controller) = &mut release {
        match controller.pause(barrier_timeout) {
            Ok(()) => paused = true,
            Err(e) => evidence.problem = Some(e),
        }
        evidence.lock_statement = controller.statement.clone();
    }
    let started = Instant::now();
    let (finished, wave_over) = std::sync::mpsc::channel::<()>();
    let results: Vec<Vec<Attempt>> = std::thread::scope(|sc| {
        if let Some(say) = on_wait {
            let firsts = &firsts;
            sc.spawn(move || {
                // A timed wait for the end of the wave, not a synchronisation: it only paces
                // the notices.
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    wave_over.recv_timeout(WAIT_NOTICE)
                {
                    let answered = firsts.done.iter().filter(|d| d.load(Ordering::SeqCst)).count();
                    say(&format!(
                        "{}: wave {wave} still waiting after {} s: {answered} of {n} first answers in (request timeout {} ms, barrier timeout {} ms)",
                        scenario.name,
                        started.elapsed().as_secs(),
                        t.request_timeout_ms,
                        barrier_timeout.as_millis()
                    ));
                }
            });
        }
        let handles: Vec<_> = built
            .iter()
            .enumerate()
            .map(|(i, (_, b, _))| {
                let (firsts, http, gate) = (&firsts, &http, &gate);
                sc.spawn(move || {
                    gate.wait(i);
                    let (first, transport) = if is_http {
                        http.send(scenario, &b.request, timeout)
                    } else {
                        let at = now_us();
                        attempt_of(scenario, at, client::send(&b.request, timeout))
                    };
                    firsts.record(i, &first);
                    let mut attempts = vec![first];
                    retry_phase(
                        scenario,
                        &b.request,
                        timeout,
                        &mut attempts,
                        transport,
                        &gate.yields[i],
                    );
                    gate.finished[i].store(true, Ordering::SeqCst);
                    attempts
                })
            })
            .collect();
        if let Release::Interposed(conducted) = release {
            let (mut conductor, plan, faults) = *conducted;
            let schedule = conductor.run_with_faults(&gate, plan, &faults);
            // Whatever happened, every racer may go now, so that the wave ends.
            gate.open_all();
            evidence.problem = interposed_problem(scenario, built, &firsts, &schedule);
            // A remote interposer whose control connection broke held nothing from then on.
            if let Some(lost) = conductor.hubs.iter().find_map(|h| h.lost()) {
                evidence.problem = Some(lost);
            }
            if evidence.problem.is_none() {
                evidence.reached_ms = Some(ms(started.elapsed()));
            }
            evidence.schedule = Some(schedule);
        } else if let Release::Server(controller, monitor) = release {
            let hold = ServerHold {
                scenario,
                built,
                firsts: &firsts,
                started,
                barrier_timeout,
            };
            hold.gather_and_release(*controller, monitor, &mut evidence);
        } else if let (Release::RedisPause(controller), true) = (release, paused) {
            let early = || {
                (0..n)
                    .find(|&i| firsts.done[i].load(Ordering::SeqCst))
                    .map(|i| {
                        format!(
                            "{}'s request was answered ({}) while Redis writes were paused, before it was seen blocked on a write: it answers without writing to Redis first (a read-only path, a refusal, a key store elsewhere)",
                            scenario.racers[built[i].0].name,
                            firsts.answer[i].lock().unwrap_or_else(|p| p.into_inner())
                        )
                    })
            };
            let g = controller.gather_and_release(n, barrier_timeout, &early);
            evidence.polls = g.polls;
            evidence.blocked_writers = Some(g.blocked);
            match g.problem {
                Some(p) => evidence.problem = Some(p),
                None => evidence.reached_ms = Some(g.reached_ms),
            }
        }
        let results = handles
            .into_iter()
            .map(|h| h.join().expect("racer thread panicked"))
            .collect();
        drop(finished);
        results
    });
    if is_http {
        http.judge(&mut evidence, n, started);
    }
    (evidence, results)
}

/// A wave's evidence before anything is sent: its number, racers and barrier name.
fn wave_evidence(
    scenario: &TargetScenario,
    wave: u32,
    racers: usize,
    release: &Release<'_>,
) -> WaveEvidence {
    WaveEvidence {
        wave,
        racers,
        barrier: match release {
            Release::Direct => "none".into(),
            Release::Server(..) => scenario.barrier.kind.name().into(),
            Release::Http => "http".into(),
            Release::Interposed(_) => "interposer".into(),
            Release::RedisPause(_) => "redis-pause".into(),
        },
        lock_statement: None,
        controller_pid: None,
        waits: Vec::new(),
        polls: 0,
        reached_ms: None,
        held: None,
        release_spread_us: None,
        problem: None,
        schedule: None,
        blocked_writers: None,
    }
}

/// Each racer's first answer as the barrier watches it: done, "in progress", and a short text.
struct FirstAnswers {
    done: Vec<AtomicBool>,
    in_progress: Vec<AtomicBool>,
    timed_out: Vec<AtomicBool>,
    answer: Vec<Mutex<String>>,
}

impl FirstAnswers {
    fn new(n: usize) -> Self {
        FirstAnswers {
            done: (0..n).map(|_| AtomicBool::new(false)).collect(),
            in_progress: (0..n).map(|_| AtomicBool::new(false)).collect(),
            timed_out: (0..n).map(|_| AtomicBool::new(false)).collect(),
            answer: (0..n).map(|_| Mutex::new(String::new())).collect(),
        }
    }

    /// Records racer `i`'s first answer.
    fn record(&self, i: usize, first: &Attempt) {
        *self.answer[i].lock().unwrap_or_else(|p| p.into_inner()) = match &first.answer {
            Ok(x) => format!("{} {}", x.status, first.kind),
            Err(_) if first.kind == AnswerKind::Timeout => {
                first.note.clone().unwrap_or_else(|| "no answer".into())
            }
            Err(e) => format!("error: {e}"),
        };
        self.timed_out[i].store(first.kind == AnswerKind::Timeout, Ordering::SeqCst);
        self.in_progress[i].store(first.kind == AnswerKind::InProgress, Ordering::SeqCst);
        self.done[i].store(true, Ordering::SeqCst);
    }
}

/// The HTTP-level release of one wave: requests written but for their last byte, held at an
/// in-process barrier, released together.
struct HttpRelease {
    /// µs since the epoch at which each request was released.
    released_at: Mutex<Vec<u64>>,
    /// Requests opened and written before the release.
    held_count: std::sync::atomic::AtomicUsize,
    local: Barrier,
    barrier_timeout: Duration,
}

impl HttpRelease {
    /// Sends one racer's first request through the barrier; `(attempt, transport error)`.
    fn send(
        &self,
        scenario: &TargetScenario,
        request: &HttpRequest,
        timeout: Duration,
    ) -> (Attempt, bool) {
        match Held::prepare(request, timeout) {
            Ok(held) => {
                self.held_count.fetch_add(1, Ordering::SeqCst);
                match self.local.wait(self.barrier_timeout) {
                    Ok(_) => {
                        let at = now_us();
                        self.released_at
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(at);
                        attempt_of(scenario, at, held.release())
                    }
                    Err(e) => (
                        Attempt::unanswered(
                            now_us(),
                            now_us(),
                            format!("not sent: {e}"),
                            AnswerKind::Error,
                            "HTTP barrier failed".into(),
                        ),
                        false,
                    ),
                }
            }
            Err(e) => {
                self.local.abandon();
                attempt_of(scenario, now_us(), Err(e))
            }
        }
    }

    /// After the wave: how many of `n` requests were held and released, and the spread of
    /// the releases; a problem when not all of them were.
    fn judge(self, evidence: &mut WaveEvidence, n: usize, started: Instant) {
        let held = self.held_count.load(Ordering::SeqCst);
        evidence.held = Some(held);
        let at = self
            .released_at
            .into_inner()
            .unwrap_or_else(|p| p.into_inner());
        if let (Some(min), Some(max)) = (at.iter().min(), at.iter().max()) {
            evidence.release_spread_us = Some(max - min);
        }
        if held < n {
            evidence.problem = Some(format!(
                "HTTP barrier: {held} of {n} requests could be opened and written before the release"
            ));
        } else if at.len() < n {
            evidence.problem = Some(format!(
                "HTTP barrier: {} of {n} requests released",
                at.len()
            ));
        } else {
            evidence.reached_ms = Some(ms(started.elapsed()));
        }
    }
}

/// A wave held by a lock the controller holds on the target's database.
struct ServerHold<'a> {
    scenario: &'a TargetScenario,
    built: &'a [(usize, Built, String)],
    firsts: &'a FirstAnswers,
    started: Instant,
    barrier_timeout: Duration,
}

impl ServerHold<'_> {
    /// Polls `pg_locks` through `monitor` until as many requests as racers still unanswered
    /// wait on the controller's lock, or a racer is answered before the release, or the
    /// deadline; then releases the lock whatever happened. Fills `evidence`.
    fn gather_and_release(
        &self,
        controller: Controller,
        monitor: &mut postgres::Client,
        evidence: &mut WaveEvidence,
    ) {
        let (scenario, built, firsts) = (self.scenario, self.built, self.firsts);
        let n = built.len();
        evidence.lock_statement = Some(controller.server_lock().statement());
        evidence.controller_pid = Some(controller.pid());
        let label = controller.server_lock().label();
        // A first answer "in progress" before the release is the service seeing the
        // concurrent request: that racer is accounted for (it retries after the release).
        // Any other answer before the release means the racer was never held.
        let stop = || {
            (0..n)
                .find(|&i| {
                    firsts.done[i].load(Ordering::SeqCst)
                        && !firsts.in_progress[i].load(Ordering::SeqCst)
                })
                .map(|i| {
                    early_reason(
                        scenario,
                        &built[i],
                        &label,
                        firsts.answer[i]
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .as_str(),
                        firsts.timed_out[i].load(Ordering::SeqCst),
                    )
                })
        };
        let want = || {
            n - firsts
                .in_progress
                .iter()
                .filter(|d| d.load(Ordering::SeqCst))
                .count()
        };
        let why_short = |seen: usize| short_reason(seen, n, &label, self.barrier_timeout);
        let gathered = gather(
            &controller,
            monitor,
            Among::AnyExcept(&[]),
            &want,
            self.started + self.barrier_timeout,
            &stop,
            &why_short,
        );
        match gathered {
            Gathered::Reached { waiters, at, polls } => {
                evidence.waits = waiters;
                evidence.polls = polls;
                evidence.reached_ms = Some(ms(at - self.started));
            }
            Gathered::Problem {
                reason,
                waiters,
                polls,
            } => {
                evidence.waits = waiters;
                evidence.polls = polls;
                evidence.problem = Some(reason);
            }
        }
        // Release whatever happened, so every request can finish.
        if let Err(e) = controller.release() {
            evidence
                .problem
                .get_or_insert(format!("controller could not release the lock: {e}"));
        }
    }
}

/// Why an interposed wave was not run as declared: a racer neither held at the store nor
/// answered "in progress" at the start, or the wave's own problem.
fn interposed_problem(
    scenario: &TargetScenario,
    built: &[(usize, Built, String)],
    firsts: &FirstAnswers,
    schedule: &crate::interpose::conduct::WaveSchedule,
) -> Option<String> {
    use crate::interpose::conduct::Start;
    for (i, start) in schedule.start.iter().enumerate() {
        let name = &scenario.racers[built[i].0].name;
        match start {
            Some(Start::Held { .. }) => {}
            Some(Start::AnsweredFirst) if firsts.in_progress[i].load(Ordering::SeqCst) => {}
            Some(Start::AnsweredFirst) => {
                let answer = firsts.answer[i]
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone();
                return Some(format!(
                    "{name}'s request was answered ({answer}) before any command of it reached an interposed store: its key store is not behind the interposer ({{database_url}}, {{redis_url}}), or it answered from memory"
                ));
            }
            Some(Start::NotSeen { waited_ms }) => {
                return Some(format!(
                    "{name}'s request was neither answered nor seen at an interposed store within {waited_ms} ms: queued before the store (a pool smaller than the racers, a worker limit, an in-process lock) or its store is not behind the interposer"
                ));
            }
            None => return Some(format!("{name} was not started")),
        }
    }
    schedule.problem.clone()
}

/// Why the barrier is not proven when a racer answered before the release, or got no answer
/// at all (`timed_out`) while the barrier waited for it.
fn early_reason(
    scenario: &TargetScenario,
    b: &(usize, Built, String),
    lock: &str,
    answer: &str,
    timed_out: bool,
) -> String {
    let name = &scenario.racers[b.0].name;
    if timed_out {
        return format!(
            "{name}'s request got {answer} and was never seen waiting on {lock}: the service \
             accepted the connection but did not reach its database (stalled, or queued before it)"
        );
    }
    format!(
        "{name}'s request was answered ({answer}) before the release without being seen waiting on {lock}: \
         under this lock it does not touch {lock} (its key store is elsewhere, or a read the lock \
         mode lets through), or it was answered before reaching the database (an in-process lock \
         or an in-progress marker)"
    )
}

/// Why fewer requests than racers were seen at the deadline.
fn short_reason(seen: usize, n: usize, lock: &str, timeout: Duration) -> String {
    format!(
        "{seen} of {n} requests seen waiting on {lock} within {} ms: the others are queued before \
         the database (a connection pool smaller than the racers per instance, a worker limit, \
         an application-level lock) or wait on something else",
        timeout.as_millis()
    )
}

fn run_inner(
    scenario: &TargetScenario,
    opts: &RunOptions,
    run_id: &str,
) -> Result<TargetRun, TargetError> {
    let mut prepared = prepare(scenario, opts)?;
    race(scenario, opts, &mut prepared, run_id, None)
}

/// What a run needs before its first request: the target database and a session on it, the
/// interposers in front of its stores, the started services, the endpoints, the barrier's lock.
/// Fields drop in order: the monitor, the control connection to a running interposer, the
/// services, the interposers, then the scratch database.
struct Prepared {
    monitor: Option<postgres::Client>,
    /// The stores of a running `ticketflow interpose` (`[target] interposer`), conducted over
    /// its control connection (closed, and its runs ended, when the last one drops).
    remote: Vec<crate::interpose::control::RemoteHub>,
    services: Services,
    interposers: Vec<crate::interpose::Interposer>,
    database: Option<TargetDb>,
    endpoints: Vec<(String, String)>,
    server_version: Option<String>,
    isolation: Option<String>,
    server_lock: Option<ServerLock>,
    /// The `redis-pause` barrier's connection.
    pause: Option<super::pause::PauseController>,
    /// A direct connection to `redis_url` for the Redis counts.
    redis: Option<redis::Connection>,
}

/// Sets a scenario up for one or more runs (an exploration runs many on one set-up).
fn prepare(scenario: &TargetScenario, opts: &RunOptions) -> Result<Prepared, TargetError> {
    let t = &scenario.target;
    // Refused before anything is set up: a wave's racers each hold a connection at once.
    let mut per_wave: BTreeMap<u32, usize> = BTreeMap::new();
    for r in &scenario.racers {
        *per_wave.entry(r.wave).or_default() += 1;
    }
    let widest = per_wave.values().copied().max().unwrap_or(0);
    crate::scenario::capacity::check_files(widest, FDS_PER_HTTP_RACER)?;
    let needs_db = scenario.barrier.kind.needs_database()
        || t.counts.iter().any(|q| q.redis.is_none())
        || !t.services.is_empty();
    let database: Option<TargetDb> = if needs_db {
        Some(target_db(
            &scenario.name,
            t.database_url.as_deref(),
            &opts.pg,
        )?)
    } else {
        None
    };
    let mut monitor = match &database {
        Some(d) => Some(
            pg::connect_as(&d.config, pg::SessionRole::Monitor).map_err(|e| {
                TargetError::Unreachable {
                    url: redact(&d.url),
                    reason: e.to_string(),
                }
            })?,
        ),
        None => None,
    };
    prepare_database(scenario, database.as_ref(), monitor.as_mut())?;
    let interposers = start_interposers(scenario, database.as_ref())?;
    let remote = connect_interposer(scenario, database.as_ref(), monitor.as_mut())?;
    let (services, endpoints) = start_endpoints(scenario, opts, database.as_ref(), &interposers)?;
    if let Some(m) = monitor.as_mut() {
        prepare_counts(scenario, m)?;
    }
    let (server_version, isolation) = match monitor.as_mut() {
        Some(m) => {
            let (version, iso) = server_facts(m)?;
            (Some(version), Some(iso))
        }
        None => (None, None),
    };
    let server_lock = server_lock(scenario, database.as_ref(), monitor.as_mut())?;
    let (pause, redis) = prepare_redis(scenario)?;
    Ok(Prepared {
        monitor,
        remote,
        services,
        interposers,
        database,
        endpoints,
        server_version,
        isolation,
        server_lock,
        pause,
        redis,
    })
}

/// The runner's own connections to `[target] redis_url`, straight to it (never through the
/// interposer): the `redis-pause` barrier's controller, and one for the Redis counts the
/// scenario expects.
///
/// Will return `Err` ([`TargetError::Setup`]) when Redis does not answer, or the pause barrier
/// refuses the server ([`super::pause::PauseController::connect`]).
fn prepare_redis(
    scenario: &TargetScenario,
) -> Result<
    (
        Option<super::pause::PauseController>,
        Option<redis::Connection>,
    ),
    TargetError,
> {
    let Some(url) = scenario.target.redis_url.as_deref() else {
        return Ok((None, None));
    };
    let pause = match scenario.barrier.kind {
        BarrierKind::RedisPause => Some(super::pause::PauseController::connect(url)?),
        _ => None,
    };
    let counts_redis = scenario.counts.iter().any(|e| {
        e.values.keys().any(|name| {
            scenario
                .target
                .counts
                .iter()
                .any(|q| &q.name == name && q.redis.is_some())
        })
    });
    let redis = if counts_redis {
        Some(super::redis_store::connect(url, "Redis counts")?)
    } else {
        None
    };
    Ok((pause, redis))
}

/// The interposers of an interposed scenario: one in front of the target database, one in
/// front of `redis_url` when given. None for other barriers.
fn start_interposers(
    scenario: &TargetScenario,
    database: Option<&TargetDb>,
) -> Result<Vec<crate::interpose::Interposer>, TargetError> {
    use crate::interpose::{upstream_of, Interposer, Limits, StoreKind};
    if scenario.barrier.kind != BarrierKind::Interposer || scenario.target.interposer.is_some() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    let mut start = |store: StoreKind, url: &str| -> Result<(), TargetError> {
        let upstream = upstream_of(url)
            .map_err(|e| TargetError::Setup(format!("interposer for {}: {e}", redact(url))))?;
        let ip = Interposer::start(store, upstream, Limits::default())
            .map_err(|e| TargetError::Setup(format!("interposer for {}: {e}", redact(url))))?;
        out.push(ip);
        Ok(())
    };
    if let Some(d) = database {
        start(StoreKind::Postgres, &d.url)?;
    }
    if let Some(r) = &scenario.target.redis_url {
        start(StoreKind::Redis, r)?;
    }
    Ok(out)
}

/// The stores of the running `ticketflow interpose` a scenario names (`[target] interposer`),
/// after checking that it relays to the server `database_url` names (its upstream address, and
/// the backends of its open sessions in that database) and that the service's sessions go
/// through it. None when the scenario names none.
///
/// Will return [`TargetError::Setup`] when nothing answers at the control address, another
/// client controls it, it relays to another server or database, or no session of the service
/// ever went through it.
fn connect_interposer(
    scenario: &TargetScenario,
    database: Option<&TargetDb>,
    monitor: Option<&mut postgres::Client>,
) -> Result<Vec<crate::interpose::control::RemoteHub>, TargetError> {
    use crate::interpose::control::ControlClient;
    use crate::interpose::{upstream_of, StoreKind};
    let Some(addr) = scenario.target.interposer else {
        return Ok(Vec::new());
    };
    let setup = |m: String| TargetError::Setup(format!("[target] interposer {addr}: {m}"));
    let client = ControlClient::connect(addr, CONTROL_CONNECT_TIMEOUT)
        .map_err(|e| TargetError::Setup(e.to_string()))?;
    let info = client.greeting().clone();
    let (Some(d), Some(m)) = (database, monitor) else {
        return Err(setup(
            "needs database_url (the direct URL of the service's database)".into(),
        ));
    };
    let pg = info.store(StoreKind::Postgres).ok_or_else(|| {
        setup(format!(
            "it stands in front of no PostgreSQL (start it with {})",
            crate::flags::POSTGRES
        ))
    })?;
    let named = upstream_of(&d.url).map_err(|e| setup(format!("database_url: {e}")))?;
    // `localhost` may resolve to ::1 here and to 127.0.0.1 there: on loopback the port decides.
    let same = |a: std::net::SocketAddr, b: std::net::SocketAddr| {
        a == b || (a.ip().is_loopback() && b.ip().is_loopback() && a.port() == b.port())
    };
    if !same(pg.upstream, named) {
        return Err(setup(format!(
            "it relays PostgreSQL to {}, but database_url names {named}: the counts and lock waits would be read on another server",
            pg.upstream
        )));
    }
    if let (Some(r), Some(url)) = (info.store(StoreKind::Redis), &scenario.target.redis_url) {
        let named = upstream_of(url).map_err(|e| setup(format!("redis_url: {e}")))?;
        if !same(r.upstream, named) {
            return Err(setup(format!(
                "it relays Redis to {}, but redis_url names {named}",
                r.upstream
            )));
        }
    }
    if info.stores.iter().all(|s| s.opened == 0) {
        return Err(setup(format!(
            "no session of the service is behind the interposer: nothing ever connected to {}; point the service's database URL at it (as `ticketflow interpose` printed) and let it connect once (a request, or its pool opened at start-up)",
            pg.listen
        )));
    }
    let client = std::sync::Arc::new(client);
    let hubs = client.hubs();
    // The sessions open now: their backends must be in the database the counts read.
    let pids: Vec<i32> = hubs
        .iter()
        .filter(|h| h.store() == StoreKind::Postgres)
        .flat_map(|h| crate::interpose::conduct::HubControl::view(h).1)
        .filter_map(|v| v.backend_pid)
        .collect();
    if !pids.is_empty() {
        let rows = m
            .query(
                "SELECT DISTINCT datname::text FROM pg_stat_activity WHERE pid = ANY($1)",
                &[&pids],
            )
            .map_err(|e| pg::classify("read pg_stat_activity", e))
            .map_err(db("check the interposer's sessions"))?;
        let names: Vec<String> = rows
            .iter()
            .filter_map(|r| r.get::<_, Option<String>>(0))
            .collect();
        if names.is_empty() {
            return Err(setup(format!(
                "none of its sessions' backends ({pids:?}) is on the server database_url names: it relays to another PostgreSQL"
            )));
        }
        if let Some(other) = names.iter().find(|n| **n != d.name) {
            return Err(setup(format!(
                "the service's sessions use database {other:?}, but database_url names {:?}: the counts would read another database",
                d.name
            )));
        }
    }
    if let Some(lost) = client.lost() {
        return Err(setup(lost));
    }
    Ok(hubs)
}

/// How long a runner waits for a running interposer's control address to accept.
const CONTROL_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// One run on a prepared scenario. `chooser`: the interposer barrier's order of steps
/// (`None`: first point, every racer held at its first command, then all released).
fn race(
    scenario: &TargetScenario,
    opts: &RunOptions,
    p: &mut Prepared,
    run_id: &str,
    mut chooser: Option<&mut dyn crate::interpose::explore::Chooser>,
) -> Result<TargetRun, TargetError> {
    let barrier_timeout = opts
        .barrier_timeout
        .unwrap_or(Duration::from_millis(scenario.barrier.timeout_ms));
    let step_timeout = Duration::from_millis(
        scenario
            .schedule
            .clone()
            .unwrap_or_default()
            .step_timeout_ms,
    );
    let endpoints = p.endpoints.clone();
    check_requests(scenario, &endpoints, run_id)?;
    let mut racer_runs: Vec<Option<RacerRun>> = vec![None; scenario.racers.len()];
    let mut waves = Vec::new();
    let mut wave_points: Vec<usize> = Vec::new();
    let mut all_points = Vec::new();
    let mut ttl_waits = Vec::new();
    for (wave, indices) in scenario.waves() {
        let built = build_wave(scenario, &indices, &endpoints, run_id);
        let wave_faults = step_faults(scenario, &indices);
        let (evidence, mut attempts) = match (&p.server_lock, built.len()) {
            // A wave of one is sent as it is, unless a fault is to cut one of its steps.
            (_, 1) if wave_faults.is_empty() => run_wave(
                scenario,
                wave,
                &built,
                Release::Direct,
                barrier_timeout,
                opts.on_wait,
            ),
            (None, _) if p.pause.is_some() => {
                let controller = p.pause.as_mut().expect("checked just above");
                run_wave(
                    scenario,
                    wave,
                    &built,
                    Release::RedisPause(controller),
                    barrier_timeout,
                    opts.on_wait,
                )
            }
            (None, _) if !p.interposers.is_empty() || !p.remote.is_empty() => {
                let plan = match chooser.as_mut() {
                    Some(c) => crate::interpose::conduct::Plan::Steps {
                        chooser: &mut **c,
                        first_index: all_points.len(),
                    },
                    None => crate::interpose::conduct::Plan::FirstPoint,
                };
                let conductor = crate::interpose::conduct::Conductor {
                    hubs: p
                        .interposers
                        .iter()
                        .map(|i| &**i.hub() as &dyn crate::interpose::conduct::HubControl)
                        .chain(
                            p.remote
                                .iter()
                                .map(|h| h as &dyn crate::interpose::conduct::HubControl),
                        )
                        .collect(),
                    monitor: p.monitor.as_mut(),
                    step_timeout,
                    start_timeout: barrier_timeout,
                    deadline: Instant::now()
                        + barrier_timeout
                        + Duration::from_millis(scenario.target.request_timeout_ms)
                            * u32::try_from(built.len()).unwrap_or(u32::MAX).max(1),
                };
                let (evidence, attempts) = run_wave(
                    scenario,
                    wave,
                    &built,
                    Release::Interposed(Box::new((conductor, plan, wave_faults))),
                    barrier_timeout,
                    opts.on_wait,
                );
                if let Some(sched) = &evidence.schedule {
                    wave_points.push(sched.points.len());
                    all_points.extend(sched.points.iter().cloned());
                }
                (evidence, attempts)
            }
            (None, _) => run_wave(
                scenario,
                wave,
                &built,
                Release::Http,
                barrier_timeout,
                opts.on_wait,
            ),
            (Some(lock), _) => {
                let d = p
                    .database
                    .as_ref()
                    .expect("a server-side barrier has a database");
                let controller = Controller::lock(&d.config, lock.clone(), barrier_timeout)
                    .map_err(db("controller could not take the barrier lock"))?;
                let m = p
                    .monitor
                    .as_mut()
                    .expect("a server-side barrier has a database");
                run_wave(
                    scenario,
                    wave,
                    &built,
                    Release::Server(Box::new(controller), m),
                    barrier_timeout,
                    opts.on_wait,
                )
            }
        };
        ttl_waits.extend(wait_out_ttl(scenario, &built, &mut attempts));
        for ((i, b, base), attempts) in built.into_iter().zip(attempts) {
            racer_runs[i] = Some(racer_run(&scenario.racers[i], wave, b, base, attempts));
        }
        let unreached = evidence.problem.clone();
        waves.push(evidence);
        // The race was not run as declared: the verdict can no longer be a PASS, and later
        // waves (a retry after the answer) would only wait on a target that may not answer.
        if let Some(problem) = unreached {
            for (later, indices) in scenario.waves().into_iter().filter(|(w, _)| *w > wave) {
                for (i, b, base) in build_wave(scenario, &indices, &endpoints, run_id) {
                    let skipped = Attempt::unanswered(
                        now_us(),
                        now_us(),
                        format!("not sent: wave {wave}'s barrier was not reached ({problem})"),
                        AnswerKind::Error,
                        "not sent".into(),
                    );
                    racer_runs[i] = Some(racer_run(
                        &scenario.racers[i],
                        later,
                        b,
                        base,
                        vec![skipped],
                    ));
                }
            }
            break;
        }
    }
    let racers: Vec<RacerRun> = racer_runs
        .into_iter()
        .map(|r| r.expect("every racer is in one wave"))
        .collect();
    // Watched: a target database that stops answering ends the counts (unread) instead of the
    // run hanging; the count session's statement_timeout bounds a slow query server-side.
    let counts = match p.database.as_ref() {
        Some(d) => {
            let (mut counts, gave_up) = crate::deadline::watch(
                "count queries",
                &crate::deadline::Peer::of(&d.config),
                pg::SessionRole::Monitor.hard_deadline_for(&d.config),
                || count_rows(scenario, p.monitor.as_mut(), p.redis.as_mut(), run_id),
            );
            if let Some(gave_up) = gave_up {
                for c in counts.iter_mut().filter(|c| c.counted.is_err()) {
                    c.counted = Err(format!("count {:?} failed: {gave_up}", c.name));
                }
            }
            counts
        }
        None => count_rows(scenario, p.monitor.as_mut(), p.redis.as_mut(), run_id),
    };
    let evidence = TargetEvidence {
        run_id: run_id.to_string(),
        barrier: scenario.barrier.kind.describe(),
        server_side: scenario.barrier.kind.server_side(),
        server_version: p.server_version.clone(),
        isolation: p.isolation.clone(),
        database: p.database.as_ref().map(|d| d.name.clone()),
        scratch: p.database.as_ref().is_some_and(|d| d.is_scratch()),
        services: p.services.records.clone(),
        base_urls: endpoints.iter().map(|(_, u)| u.clone()).collect(),
        waves,
        schedule_id: ((!p.interposers.is_empty() || !p.remote.is_empty()) && chooser.is_some())
            .then(|| crate::interpose::explore::schedule_id(&all_points, &wave_points)),
        ttl_waits,
    };
    Ok(check::judge(scenario, racers, counts, evidence))
}

/// The conductor's faults for the wave of `indices` (scenario racer indices, in wave order):
/// each `[[fault]]` on one of them, its racer as the wave's index.
fn step_faults(
    scenario: &TargetScenario,
    indices: &[usize],
) -> Vec<crate::interpose::conduct::StepFault> {
    use crate::interpose::conduct::{FaultStep, StepFault};
    scenario
        .faults
        .iter()
        .filter_map(|f| {
            let racer = indices.iter().position(|&i| i == f.racer)?;
            let at = match &f.at {
                FaultAt::Step(k) => FaultStep::Index(*k),
                FaultAt::Match(w) => FaultStep::Match(w.clone()),
                FaultAt::Shape(shape) => FaultStep::Shape(shape.clone()),
                // A sweep puts each step number in place before a run ([`explore`]); run
                // alone, `each` cuts the first step.
                FaultAt::Each => FaultStep::Index(1),
            };
            Some(StepFault {
                racer,
                at,
                store: f.store,
                cut: f.cut.action(),
                label: f.describe(scenario, &f.at),
            })
        })
        .collect()
}

/// After a wave, with `[target] lock_ttl_ms`: each racer whose last answer is still "in
/// progress" retries with the same key until it is answered otherwise, or until the TTL plus
/// [`check::TTL_MARGIN_MS`] has passed since the wave ended (a lock the service set during the
/// wave expires by then if it expires at all). The retries are appended to the racer's
/// attempts; the returned records are what the `key TTL` check judges.
fn wait_out_ttl(
    scenario: &TargetScenario,
    built: &[(usize, Built, String)],
    attempts: &mut [Vec<Attempt>],
) -> Vec<super::TtlWait> {
    let t = &scenario.target;
    let Some(ttl) = t.lock_ttl_ms else {
        return Vec::new();
    };
    let started = Instant::now();
    let deadline = started + Duration::from_millis(ttl + check::TTL_MARGIN_MS);
    let timeout = Duration::from_millis(t.request_timeout_ms);
    // The client's pause between tries: its own backoff, but often enough to see the lock
    // expire within a tenth of its TTL.
    let cap = Duration::from_millis(t.retry.max_backoff_ms.min(ttl / 10).max(1));
    let mut out = Vec::new();
    for ((i, b, _), tries) in built.iter().zip(attempts.iter_mut()) {
        if tries.last().map(|a| a.kind) != Some(AnswerKind::InProgress) {
            continue;
        }
        let before = tries.len();
        let mut backoff = Duration::from_millis(t.retry.backoff_ms.max(1)).min(cap);
        while tries.last().map(|a| a.kind) == Some(AnswerKind::InProgress)
            && Instant::now() < deadline
        {
            // A client's backoff between tries; the condition observed is the answer.
            std::thread::sleep(backoff.min(deadline.saturating_duration_since(Instant::now())));
            backoff = (backoff * 2).min(cap);
            let at = now_us();
            let (a, _) = attempt_of(scenario, at, client::send(&b.request, timeout));
            tries.push(a);
        }
        let last = tries.last().map(|a| a.kind).unwrap_or_default();
        out.push(super::TtlWait {
            racer: scenario.racers[*i].name.clone(),
            wire_key: b.wire_key.clone(),
            attempts: tries.len() - before,
            waited_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            answered: last != AnswerKind::InProgress,
            last,
        });
    }
    out
}

/// Readies the target database: our migrations when the scenario runs our own service, and
/// the scenario's `setup_sql` in a scratch database.
fn prepare_database(
    scenario: &TargetScenario,
    database: Option<&TargetDb>,
    monitor: Option<&mut postgres::Client>,
) -> Result<(), TargetError> {
    let t = &scenario.target;
    if let (true, Some(d)) = (t.own_service, database) {
        // Our migrations, as `ticketflow serve` would apply them.
        PgStore::connect(&d.config, IsolationLevel::ReadCommitted)
            .map_err(db("migrate the target database"))?;
    }
    if let (Some(d), Some(m)) = (database, monitor) {
        if d.is_scratch() && !t.setup_sql.is_empty() {
            run_setup_sql(m, &t.setup_sql)?;
        }
    }
    Ok(())
}

/// Runs `setup_sql` on the scratch database's session `m` in one transaction (`BEGIN`, each
/// entry, `COMMIT`), so PostgreSQL itself refuses what acts on the cluster rather than on
/// this database: `CREATE`/`DROP DATABASE`, `ALTER SYSTEM`, `VACUUM`, `CREATE TABLESPACE`,
/// `CREATE INDEX CONCURRENTLY` cannot run inside a transaction block (SQLSTATE 25001). After
/// each entry the transaction must still be open (a `SAVEPOINT` succeeds): an entry that ends
/// it (`COMMIT`, `ROLLBACK`, `END`) is refused before the next one runs. On any refusal the
/// transaction is rolled back.
///
/// What stays possible is what a transaction on this database may do with the URL's role:
/// roles (`CREATE`/`ALTER`/`DROP ROLE`) and `ALTER DATABASE … SET` are cluster-wide and
/// transactional.
///
/// Will return `Err` ([`TargetError::Setup`]) naming the entry (1-based), the server's message
/// and SQLSTATE; ([`TargetError::Database`]) when the session itself fails.
fn run_setup_sql(m: &mut postgres::Client, setup_sql: &[String]) -> Result<(), TargetError> {
    let fail = |m: &mut postgres::Client, n: usize, sql: &str, e: postgres::Error| {
        let _ = m.batch_execute("ROLLBACK");
        let Some(d) = e.as_db_error() else {
            return TargetError::Database {
                what: "run the scenario's setup_sql",
                source: pg::classify("run setup_sql", e),
            };
        };
        let why = if *d.code() == postgres::error::SqlState::ACTIVE_SQL_TRANSACTION {
            " — setup_sql runs inside one transaction on the scratch database: statements that act on the cluster (CREATE or DROP DATABASE, ALTER SYSTEM, VACUUM, CREATE TABLESPACE) are refused"
        } else {
            ""
        };
        TargetError::Setup(format!(
            "setup_sql entry {n} ({}) refused: {} (SQLSTATE {}){why}; nothing of setup_sql was kept",
            excerpt(sql, 60),
            d.message(),
            d.code().code()
        ))
    };
    m.batch_execute("BEGIN")
        .map_err(|e| pg::classify("run setup_sql", e))
        .map_err(db("run the scenario's setup_sql"))?;
    for (i, sql) in setup_sql.iter().enumerate() {
        let n = i + 1;
        if let Err(e) = m.batch_execute(sql) {
            return Err(fail(m, n, sql, e));
        }
        if let Err(e) = m.batch_execute("SAVEPOINT ticketflow_setup_sql") {
            let _ = m.batch_execute("ROLLBACK");
            return Err(
                if e.code() == Some(&postgres::error::SqlState::NO_ACTIVE_SQL_TRANSACTION) {
                    TargetError::Setup(format!(
                        "setup_sql entry {n} ({}) ended the runner's transaction (COMMIT, ROLLBACK or END): refused before the next entry; setup_sql runs inside one transaction on the scratch database (what ran before it may have been kept there)",
                        excerpt(sql, 60)
                    ))
                } else {
                    fail(m, n, sql, e)
                },
            );
        }
    }
    m.batch_execute("COMMIT")
        .map_err(|e| pg::classify("run setup_sql", e))
        .map_err(db("run the scenario's setup_sql"))
}

/// Starts the scenario's services and checks that every endpoint (theirs, then the listed
/// base URLs) accepts connections. Returns the services (stopped on drop) and the endpoints
/// as `(name, base URL)`.
fn start_endpoints(
    scenario: &TargetScenario,
    opts: &RunOptions,
    database: Option<&TargetDb>,
    interposers: &[crate::interpose::Interposer],
) -> Result<(Services, Vec<(String, String)>), TargetError> {
    use crate::interpose::{url_through, StoreKind};
    let t = &scenario.target;
    let exe: PathBuf = match &opts.exe {
        Some(p) => p.clone(),
        None => std::env::current_exe().map_err(|e| TargetError::Service {
            name: "-".into(),
            reason: format!("cannot locate the ticketflow binary: {e}"),
        })?,
    };
    // With interposers the services reach their stores through them.
    let through = |store: StoreKind, url: &str| -> String {
        interposers
            .iter()
            .find(|i| i.store() == store)
            .and_then(|i| url_through(url, i.addr()))
            .unwrap_or_else(|| url.to_string())
    };
    let database_url = database
        .map(|d| through(StoreKind::Postgres, &d.url))
        .unwrap_or_default();
    let redis_url = t
        .redis_url
        .as_deref()
        .map(|u| through(StoreKind::Redis, u))
        .unwrap_or_default();
    let specs: Vec<super::format::ServiceSpec> = t
        .services
        .iter()
        .map(|s| {
            let mut s = s.clone();
            for a in &mut s.command {
                *a = a.replace("{redis_url}", &redis_url);
            }
            s
        })
        .collect();
    let services = Services::start(&specs, &exe.to_string_lossy(), &database_url)?;
    let endpoints: Vec<(String, String)> = services
        .records
        .iter()
        .map(|s| (s.name.clone(), s.base_url.clone()))
        .chain(t.base_urls.iter().map(|u| (u.clone(), u.clone())))
        .collect();
    for (_, url) in &endpoints {
        check_reachable(url)?;
    }
    Ok((services, endpoints))
}

/// The SQL a count query runs: its value as a `bigint`, each placeholder a text parameter.
fn count_sql(q: &super::format::CountQuery) -> String {
    format!("SELECT (({}))::bigint", q.bound_sql)
}

/// Prepares every count query the scenario expects against the target database before
/// anything is sent, so a typo, a missing table or a parameter the SQL cannot take as text is
/// a setup error naming the query's line, not a FAIL after the race. Preparing executes
/// nothing.
///
/// Will return `Err` ([`TargetError::Setup`]) for the first query the server refuses.
fn prepare_counts(
    scenario: &TargetScenario,
    monitor: &mut postgres::Client,
) -> Result<(), TargetError> {
    let used: std::collections::BTreeSet<&str> = scenario
        .counts
        .iter()
        .flat_map(|e| e.values.keys().map(String::as_str))
        .collect();
    for q in scenario
        .target
        .counts
        .iter()
        .filter(|q| used.contains(q.name.as_str()) && q.redis.is_none())
    {
        let types = vec![postgres::types::Type::TEXT; q.params.len()];
        if let Err(e) = monitor.prepare_typed(&count_sql(q), &types) {
            return Err(TargetError::Setup(format!(
                "{}: count query {:?} cannot run on the target database: {}{}",
                q.origin,
                q.name,
                e.as_db_error()
                    .map(|d| d.message().to_string())
                    .unwrap_or_else(|| e.to_string()),
                e.code()
                    .map(|c| format!(" (SQLSTATE {})", c.code()))
                    .unwrap_or_default()
            )));
        }
    }
    Ok(())
}

/// The target's PostgreSQL `server_version` and `default_transaction_isolation`.
fn server_facts(m: &mut postgres::Client) -> Result<(String, String), TargetError> {
    let version: String = m
        .query_one("SHOW server_version", &[])
        .map_err(|e| pg::classify("read server version", e))
        .map_err(db("read server version"))?
        .get(0);
    let iso: String = m
        .query_one("SHOW default_transaction_isolation", &[])
        .map_err(|e| pg::classify("read isolation level", e))
        .map_err(db("read isolation level"))?
        .get(0);
    Ok((version, iso))
}

/// The lock a server-side barrier holds (`None` for the HTTP-level barrier). A table lock
/// needs its table to exist in the target database: a setup error otherwise.
fn server_lock(
    scenario: &TargetScenario,
    database: Option<&TargetDb>,
    monitor: Option<&mut postgres::Client>,
) -> Result<Option<ServerLock>, TargetError> {
    Ok(match &scenario.barrier.kind {
        BarrierKind::TableLock {
            table,
            access_exclusive,
        } => {
            let m = monitor.expect("a server-side barrier has a database");
            let exists: bool = m
                .query_one("SELECT to_regclass($1) IS NOT NULL", &[table])
                .map_err(|e| pg::classify("find barrier table", e))
                .map_err(db("find barrier table"))?
                .get(0);
            if !exists {
                return Err(TargetError::Setup(format!(
                    "barrier table {table:?} does not exist in database {} (the service creates it on start? run it once first)",
                    database.map(|d| d.name.as_str()).unwrap_or("?")
                )));
            }
            Some(ServerLock::Table {
                table: table.clone(),
                access_exclusive: *access_exclusive,
            })
        }
        BarrierKind::Advisory { key } => Some(ServerLock::Advisory { key: *key }),
        BarrierKind::Http | BarrierKind::Interposer | BarrierKind::RedisPause => None,
    })
}

/// The requests of one wave's racers (`indices`), each with its endpoint: the one the racer
/// names (`via`), else the endpoints in turn by racer number.
fn build_wave(
    scenario: &TargetScenario,
    indices: &[usize],
    endpoints: &[(String, String)],
    run_id: &str,
) -> Vec<(usize, Built, String)> {
    indices
        .iter()
        .map(|&i| {
            let racer = &scenario.racers[i];
            let base = match &racer.via {
                Some(v) => endpoints
                    .iter()
                    .find(|(n, _)| n == v)
                    .map(|(_, u)| u.clone())
                    .expect("validated at load"),
                None => endpoints[(racer.n - 1) % endpoints.len()].1.clone(),
            };
            (i, build(scenario, racer, &base, run_id), base)
        })
        .collect()
}

/// What `racer` of `wave` sent (`b`, to `base`) and got back (`attempts`).
fn racer_run(
    racer: &TargetRacer,
    wave: u32,
    b: Built,
    base: String,
    attempts: Vec<Attempt>,
) -> RacerRun {
    RacerRun {
        name: racer.name.clone(),
        group: racer.group.clone(),
        wave,
        scope: racer.scope.clone(),
        key: racer.key.clone(),
        wire_key: b.wire_key,
        body_sha256: b.body_sha256,
        request: format!(
            "{} {}",
            b.request.method,
            b.request.url.strip_prefix(&base).unwrap_or(&b.request.url)
        ),
        endpoint: base,
        attempts,
    }
}

/// Refuses to race an endpoint that does not accept a TCP connection within 2 s.
fn check_reachable(base_url: &str) -> Result<(), TargetError> {
    let authority = base_url
        .strip_prefix("http://")
        .unwrap_or(base_url)
        .split('/')
        .next()
        .unwrap_or("");
    let with_port = if authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    use std::net::ToSocketAddrs as _;
    let addrs: Vec<_> = with_port
        .to_socket_addrs()
        .map_err(|e| TargetError::Setup(format!("{}: cannot resolve: {e}", redact(base_url))))?
        .collect();
    let mut last = None;
    for a in &addrs {
        match std::net::TcpStream::connect_timeout(a, Duration::from_secs(2)) {
            Ok(_) => return Ok(()),
            Err(e) => last = Some(e),
        }
    }
    Err(TargetError::Setup(format!(
        "{} is unreachable: {}; is the service running?",
        redact(base_url),
        last.map(|e| e.to_string())
            .unwrap_or_else(|| "no address".into())
    )))
}

/// Runs one SQL count (`sql`, from [`count_sql`], with its text parameters) in a transaction of
/// its own started `READ ONLY` (`START TRANSACTION READ ONLY`, then `SET LOCAL
/// statement_timeout` = `timeout_ms`), and rolls it back: a count that writes, directly or
/// through a function it calls, is refused by PostgreSQL (SQLSTATE 25006
/// `read_only_sql_transaction`) and changes nothing; one still running after `timeout_ms` is
/// cancelled (SQLSTATE 57014). NULL counts as 0.
///
/// `READ ONLY` does not stop a function whose effect lies outside the transaction
/// (`pg_terminate_backend`, `pg_cancel_backend`, `dblink`, `pg_sleep` up to the timeout):
/// only the privileges of the URL's role do.
///
/// Will return `Err` with the server's error, or a connection error.
fn read_count(
    client: &mut postgres::Client,
    sql: &str,
    params: &[&(dyn postgres::types::ToSql + Sync)],
    timeout_ms: u64,
) -> Result<i64, postgres::Error> {
    let mut tx = client.build_transaction().read_only(true).start()?;
    tx.batch_execute(&format!("SET LOCAL statement_timeout = {timeout_ms}"))?;
    let value = tx
        .query_one(sql, params)?
        .get::<_, Option<i64>>(0)
        .unwrap_or(0);
    tx.rollback()?;
    Ok(value)
}

/// A count's error in words: the server's message and SQLSTATE, and for a write refused by
/// the read-only transaction (25006) or a cancel at the count's timeout (57014), why.
fn count_error(err: &postgres::Error, t: &super::format::Target) -> String {
    let Some(d) = err.as_db_error() else {
        return err.to_string();
    };
    let code = d.code();
    let why = if *code == postgres::error::SqlState::READ_ONLY_SQL_TRANSACTION {
        " — count queries run in a READ ONLY transaction and must not write, not even through a function they call"
            .to_string()
    } else if *code == postgres::error::SqlState::QUERY_CANCELED {
        format!(
            " — a count query may run count_timeout_ms = {} ms",
            t.count_timeout_ms
        )
    } else {
        String::new()
    };
    format!("{} (SQLSTATE {}){why}", d.message(), code.code())
}

/// Runs each expected count with its bindings: SQL on the target database (`monitor`), each in
/// its own read-only transaction with its timeout ([`read_count`]); Redis counts on the
/// runner's direct connection to `redis_url` (`redis`).
fn count_rows(
    scenario: &TargetScenario,
    mut monitor: Option<&mut postgres::Client>,
    mut redis: Option<&mut redis::Connection>,
    run_id: &str,
) -> Vec<CountSeen> {
    let t = &scenario.target;
    let mut out = Vec::new();
    for e in &scenario.counts {
        // Bind {scope} and {key} as the racers sent them.
        let racer = scenario.racers.iter().find(|r| {
            e.key.as_ref().map_or(true, |k| &r.key == k)
                && e.scope
                    .as_ref()
                    .map_or(true, |s| r.scope.as_ref() == Some(s))
        });
        let vars = match racer {
            Some(r) => vars_for(scenario, r, run_id),
            None => [("run", run_id.to_string())].into(),
        };
        for (name, expected) in &e.values {
            let q = t
                .counts
                .iter()
                .find(|q| &q.name == name)
                .expect("validated at load");
            if let Some(words) = &q.redis {
                let bound: Vec<String> = words.iter().map(|w| template::expand(w, &vars)).collect();
                let counted = match redis.as_deref_mut() {
                    Some(conn) => super::redis_store::run_count(conn, &bound),
                    None => Err("no connection to redis_url".into()),
                }
                .map_err(|err| format!("count {name:?} failed: {err}"));
                out.push(CountSeen {
                    name: name.clone(),
                    scope: e.scope.clone(),
                    key: e.key.clone(),
                    expected: *expected,
                    counted,
                });
                continue;
            }
            let Some(monitor) = monitor.as_deref_mut() else {
                out.push(CountSeen {
                    name: name.clone(),
                    scope: e.scope.clone(),
                    key: e.key.clone(),
                    expected: *expected,
                    counted: Err(format!("count {name:?} failed: no database connection")),
                });
                continue;
            };
            let params: Vec<String> = q
                .params
                .iter()
                .map(|p| vars.get(p).cloned().unwrap_or_default())
                .collect();
            let refs: Vec<&(dyn postgres::types::ToSql + Sync)> = params
                .iter()
                .map(|p| p as &(dyn postgres::types::ToSql + Sync))
                .collect();
            let counted = read_count(monitor, &count_sql(q), &refs, t.count_timeout_ms)
                .map_err(|err| format!("count {name:?} failed: {}", count_error(&err, t)));
            out.push(CountSeen {
                name: name.clone(),
                scope: e.scope.clone(),
                key: e.key.clone(),
                expected: *expected,
                counted,
            });
        }
    }
    out
}
