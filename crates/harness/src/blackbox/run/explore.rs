//! The schedule search of interposed scenarios over [`crate::interpose::explore`]: one
//! set-up, many runs (PCT, depth-first, a first point), a fault swept over a racer's steps,
//! and the failing schedule kept for replay.

use super::judge::summarise;
use super::lanes::{ends_exploration, Frontier, Job, Lanes};
use super::prepare::{prepare, Prepared};
use super::race::{fresh_run_id, race};
use super::RunOptions;
use crate::blackbox::format::{FaultAt, TargetScenario};
use crate::blackbox::service::TargetError;
use crate::blackbox::{TargetOutcome, TargetRun};
use crate::interpose::explore::{Pct, Prefix};
use crate::verdict::Verdict;

/// Steps each racer took in each conducted wave of `run`: `[wave][racer]`.
pub(super) fn steps_per_racer(run: &TargetRun) -> Vec<Vec<u64>> {
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

/// `steps` (per wave, per racer) with every racer of a wave given the most steps any racer of
/// that wave took.
pub(super) fn widened(steps: &[Vec<u64>]) -> Vec<Vec<u64>> {
    steps
        .iter()
        .map(|k| {
            let most = k.iter().copied().max().unwrap_or(0);
            vec![most; k.len()]
        })
        .collect()
}

/// The schedules of `steps` (per wave, per racer), every step always enabled: the product of
/// each wave's count, bounded by `bound` preemptions per wave when given; `None` when too many
/// to count.
pub(super) fn schedule_count(steps: &[Vec<u64>], bound: Option<u32>) -> Option<u128> {
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
pub(super) fn explore(
    scenario: &TargetScenario,
    opts: &RunOptions,
) -> Result<TargetOutcome, TargetError> {
    use crate::blackbox::format::ExploreMode;
    use crate::interpose::explore::parse_schedule_id_for;
    let spec = scenario.schedule.clone().unwrap_or_default();
    let mode = opts.explore.unwrap_or(spec.mode);
    let widest = scenario
        .waves()
        .iter()
        .map(|(_, r)| r.len())
        .max()
        .unwrap_or(0);
    let replay = match &opts.schedule {
        Some(id) => {
            Some(parse_schedule_id_for(id, widest).map_err(|e| TargetError::Setup(e.to_string()))?)
        }
        None => None,
    };
    if !scenario.faults.is_empty() && mode == ExploreMode::FirstPoint && replay.is_none() {
        return Err(TargetError::Setup(
            format!("[[fault]] needs the steps released one at a time; first-point runs them free (drop {} first-point)", ticketflow_core::flags::EXPLORE),
        ));
    }
    let sweep = scenario.faults.iter().position(|f| f.at == FaultAt::Each);
    // Statements of the swept racer's first attempt that no run of the sweep cut.
    let mut sweep_missed: Option<Vec<String>> = None;
    let mut lanes = Lanes::new(scenario, opts, prepare(scenario, opts)?);
    let reduction = (replay.is_none()
        && sweep.is_none()
        && (mode == ExploreMode::Reduced
            || mode == ExploreMode::Auto && scenario.faults.is_empty()))
    .then(|| reduction_inputs(scenario, lanes.first()));
    let mut runs: Vec<TargetRun> = Vec::new();
    // Why a search that stopped at its limit did not finish: a PASS of it is PENDING.
    let mut unfinished: Option<String> = None;
    let coverage = if let Some(j) = sweep {
        let choices = replay.clone().unwrap_or_default();
        let (coverage, missed) = sweep_fault_steps(
            scenario,
            opts,
            lanes.first(),
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
        lanes.one(&mut runs, Some(&mut p))?;
        format!(
            "replayed schedule {} ({} divergence(s) where the service branched)",
            opts.schedule.as_deref().unwrap_or(""),
            p.divergences
        )
    } else if mode == ExploreMode::FirstPoint {
        lanes.run_all(&mut FirstPoints(opts.repeat.max(1)), &mut runs, usize::MAX)?;
        format!(
            "first point: {} run(s), every racer's first store command held, then all released and run free (no schedule explored){}",
            runs.len(),
            lanes.note()
        )
    } else {
        let searched = search_schedules(scenario, mode, widest, reduction, &mut runs, &mut lanes)?;
        unfinished = searched.unfinished;
        format!("{}{}", searched.coverage, lanes.note())
    };
    drop(lanes);
    let mut outcome = summarise(scenario, runs);
    let absorbed = outcome
        .runs
        .iter()
        .filter(|r| {
            r.checks
                .iter()
                .any(|c| c.name == "fault" && c.detail.contains(crate::blackbox::check::ABSORBED))
        })
        .count();
    let coverage = if absorbed > 0 {
        format!(
            "{coverage}; {absorbed} of {} run(s) cut a step the request never felt ({}: its first attempt answered as if nothing had happened), not counted as fault coverage",
            outcome.runs.len(),
            crate::blackbox::check::ABSORBED
        )
    } else {
        coverage
    };
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
    if let (Verdict::Pass, Some(why)) = (outcome.verdict, unfinished) {
        outcome.verdict = Verdict::Pending;
        outcome.reason = Some(why);
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

/// What a search ran: its coverage line, and, when it stopped at its limit before it was
/// complete, why (then a PASS is PENDING: schedules it was to run did not run).
pub(super) struct Searched {
    pub coverage: String,
    pub unfinished: Option<String>,
}

/// The reason a search that stopped at `limit` after `ran` schedules gives for its PENDING;
/// `what` says how far it got.
fn stopped_at_limit(limit: usize, what: &str) -> String {
    format!(
        "the search stopped at its limit of {limit} schedules before it was complete ({what}): the schedules it did not run were not checked. Raise [schedule] limit, or let the reduced search (mode \"reduced\", or \"auto\" without faults) cover every class"
    )
}

/// The schedule search of [`explore`] for `exhaustive`, `bounded`, `pct` and `auto`: the
/// default schedule first (it measures the steps), then PCT's seeded runs, or the
/// depth-first search over choice points within the preemption bound (`auto` also adds runs
/// whose first commands overlap). Returns the coverage line and, for a search stopped at
/// its limit, why it is unfinished (PCT's runs are its whole search: never unfinished).
///
/// Will return `Err` as [`race`] does.
///
/// Long because the PCT runs and the depth-first search share the first run, its step counts
/// and the run closure, and each states its coverage from them.
pub(super) fn search_schedules(
    scenario: &TargetScenario,
    mode: crate::blackbox::format::ExploreMode,
    widest: usize,
    reduction: Option<ReductionInputs>,
    runs: &mut Vec<TargetRun>,
    lanes: &mut Lanes<'_>,
) -> Result<Searched, TargetError> {
    use crate::blackbox::format::ExploreMode;
    use crate::interpose::explore::{miss_probability, pct_bound, Search};
    let spec = scenario.schedule.clone().unwrap_or_default();
    if let Some(inputs) = reduction {
        return search_reduced(scenario, mode, widest, inputs, runs, lanes);
    }
    // The default schedule first: it measures the steps.
    let mut first = Prefix::default();
    let stop = lanes.one(runs, Some(&mut first))?;
    let steps = runs.last().map(steps_per_racer).unwrap_or_default();
    let total: u64 = steps.iter().flatten().sum();
    let racers = widest;
    let mut unfinished = None;
    let coverage = if mode == ExploreMode::Pct {
        let k = usize::try_from(total).unwrap_or(usize::MAX);
        if !stop {
            let mut pct = PctRuns {
                next: 1,
                end: spec.runs as u64,
                seed: spec.seed,
                racers,
                steps: k,
                depth: spec.depth,
            };
            lanes.run_all(&mut pct, runs, usize::MAX)?;
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
        // `auto` decides from the longest path a racer of each wave took: a racer that only
        // replayed in the first run may create in another (and its retries add steps).
        let exhaustive_count = schedule_count(&widened(&steps), None);
        let bound = match mode {
            ExploreMode::Exhaustive => None,
            ExploreMode::Bounded => Some(spec.preemptions),
            _ => match exhaustive_count {
                Some(c) if c <= spec.limit as u128 => None,
                _ => Some(spec.preemptions),
            },
        };
        let expected = schedule_count(&steps, bound);
        let mut search = DepthFirst(Search::new(bound));
        let _ = search.0.next_prefix();
        if let Some(points) = runs.last().and_then(run_points) {
            search.0.record(0, &points);
        }
        let mut stopped_at_fail = stop;
        if !stop {
            stopped_at_fail = lanes.run_all(&mut search, runs, spec.limit)?;
        }
        let complete = search.0.is_empty() && !stopped_at_fail;
        // A schedule releases one command at a time, so two statements never run inside
        // the server at once: a race within one statement (two snapshots that each miss
        // the other's uncommitted row, a `WHERE NOT EXISTS` insert without a unique
        // index) is outside every schedule. `auto` adds runs in which every racer's first
        // command is released together, so they overlap there.
        let mut overlapped = 0;
        if mode == ExploreMode::Auto && !stopped_at_fail && scenario.faults.is_empty() {
            let before = runs.len();
            stopped_at_fail =
                lanes.run_open(&mut FirstPoints(AUTO_OVERLAP_RUNS), runs, usize::MAX)?;
            overlapped = runs.len() - before;
        }
        let how = match (bound, mode) {
            (None, _) => "exhaustive".to_string(),
            // Say why auto chose the bound: the count printed after is the bounded one.
            (Some(b), ExploreMode::Auto) => format!(
                "bounded, at most {b} preemption(s): auto, since every interleaving would be {} schedules (each racer of a wave given the most steps one took), over the limit of {}",
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
            let ran = runs.len() - overlapped;
            unfinished = Some(stopped_at_limit(
                spec.limit,
                &match expected {
                    Some(c) if c > ran as u128 => {
                        format!("{ran} schedule(s) run of about {c} if every step were always enabled")
                    }
                    Some(_) => format!(
                        "{ran} schedule(s) run, more than the count if every step were always enabled: lock waits and branches add schedules"
                    ),
                    None => format!("{ran} schedule(s) run of too many to count"),
                },
            ));
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
            overlap_note(overlapped, stopped_at_fail)
        )
    };
    Ok(Searched {
        coverage,
        unfinished,
    })
}

/// What the coverage line says of `auto`'s runs with every racer's first command released
/// together (`overlapped` of them; `failed`: the last one failed, and the verdict is its).
fn overlap_note(overlapped: usize, failed: bool) -> String {
    if overlapped == 0 {
        return String::new();
    }
    format!(
        "; and {overlapped} run(s) with every racer's first command released together, so statements overlapped inside the server (one at a time they never do; these runs are samples, not a proof){}",
        if failed {
            ": the last of them failed, so the failure needs statements running at once inside the server, which no one-at-a-time schedule above shows"
        } else {
            ""
        }
    )
}

/// What the reduced search needs from the set-up: the target database's catalog (or why it
/// could not be read) and the racers' symmetry classes per conducted wave.
pub(super) struct ReductionInputs {
    catalog: Result<crate::interpose::footprint::Catalog, String>,
    classes: Vec<Vec<usize>>,
    /// Per conducted wave, each racer's intent (scope and key), numbered in the wave.
    intents: Vec<Vec<usize>>,
}

/// Reads the catalog over the set-up's monitor session and finds the interchangeable racers:
/// in each wave, racers that send byte for byte the same request to the same instance (or to
/// instances the runner started from one command and environment) and expect the same
/// outcomes share a class.
fn reduction_inputs(scenario: &TargetScenario, prepared: &mut Prepared) -> ReductionInputs {
    let catalog = match prepared.monitor.as_mut() {
        Some(client) => crate::interpose::footprint::Catalog::read(client)
            .map_err(|e| format!("the catalog could not be read ({e})")),
        None => Err("no PostgreSQL database to read the catalog of".into()),
    };
    // Instances the runner started from one command and environment (their port aside) are
    // one process image: a request sent to either is the same request.
    let services = &scenario.target.services;
    let alike = services.len() > 1
        && services
            .iter()
            .all(|x| x.command == services[0].command && x.env == services[0].env);
    let (classes, intents) = scenario
        .waves()
        .iter()
        .filter(|(_, racers)| racers.len() > 1)
        .map(|(_, indices)| {
            let built = super::wave::build_wave(scenario, indices, &prepared.endpoints, "r0");
            let (signature, intent): (Vec<String>, Vec<String>) = built
                .iter()
                .map(|(i, b, base)| {
                    let r = &scenario.racers[*i];
                    let request = if alike {
                        format!("{:?}", b.request).replace(base.as_str(), "")
                    } else {
                        format!("{base} {:?}", b.request)
                    };
                    (
                        format!("{request} {:?} {:?}", r.expect, r.scope),
                        format!("{:?} {:?}", r.scope, r.key),
                    )
                })
                .unzip();
            (numbered(&signature), numbered(&intent))
        })
        .unzip();
    ReductionInputs {
        catalog,
        classes,
        intents,
    }
}

/// Each label's number: the position of its first occurrence (equal labels, one number).
fn numbered(labels: &[String]) -> Vec<usize> {
    labels
        .iter()
        .map(|x| labels.iter().position(|y| y == x).unwrap_or(0))
        .collect()
}

/// The steps a run released at its choice points, flattened across its conducted waves, and
/// the points per wave; the steps are empty when a wave released a step outside a point (a
/// pause), so they do not line up. Then the steps of each wave of one racer it followed.
type Trace = (
    Vec<crate::interpose::explore::ChoicePoint>,
    Vec<crate::interpose::reduce::Released>,
    Vec<usize>,
    Vec<Vec<crate::interpose::reduce::Released>>,
);

fn run_trace(run: &TargetRun) -> Trace {
    let (mut points, mut steps, mut waves, mut lone) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut aligned = true;
    let released = |t: &crate::interpose::conduct::StepTaken| crate::interpose::reduce::Released {
        racer: t.racer,
        store: t.store,
        session: t.session,
        text: t.text.clone(),
        blocked: t.blocked,
        status: crate::interpose::footprint::tx_status(&t.result),
        params: t.params.clone(),
        result: t.result.clone(),
    };
    for s in run
        .evidence
        .iter()
        .flat_map(|e| e.waves.iter())
        .filter_map(|w| w.schedule.as_ref())
    {
        if s.lone {
            lone.push(s.steps.iter().map(released).collect());
            continue;
        }
        aligned &= s.steps.len() == s.points.len();
        waves.push(s.points.len());
        points.extend(s.points.iter().cloned());
        steps.extend(s.steps.iter().map(released));
    }
    if !aligned {
        steps.clear();
    }
    (points, steps, waves, lone)
}

/// The reduced search of [`search_schedules`]: runs until every class of equivalent
/// interleavings under the dependency relation was run, a schedule fails, or the limit; then
/// (`auto`) the runs whose first commands overlap. Returns what it ran ([`Searched`]).
///
/// Will return `Err` as [`race`] does.
fn search_reduced(
    scenario: &TargetScenario,
    mode: crate::blackbox::format::ExploreMode,
    widest: usize,
    inputs: ReductionInputs,
    runs: &mut Vec<TargetRun>,
    lanes: &mut Lanes<'_>,
) -> Result<Searched, TargetError> {
    use crate::blackbox::format::ExploreMode;
    let spec = scenario.schedule.clone().unwrap_or_default();
    let mut unfinished = None;
    let catalog_note = inputs.catalog.as_ref().err().cloned();
    let search = crate::interpose::reduce::Reduced::new(
        inputs.catalog.ok(),
        inputs.classes.clone(),
        &inputs.intents,
    );
    let mut frontier = ReducedRuns(search);
    let mut stopped_at_fail = lanes.run_all(&mut frontier, runs, spec.limit)?;
    let search = frontier.0;
    let complete = search.complete() && !stopped_at_fail;
    let steps = runs.first().map(steps_per_racer).unwrap_or_default();
    let total: u64 = steps.iter().flatten().sum();
    let ran = runs.len();
    let mut overlapped = 0;
    if mode == ExploreMode::Auto && !stopped_at_fail {
        stopped_at_fail = lanes.run_open(&mut FirstPoints(AUTO_OVERLAP_RUNS), runs, usize::MAX)?;
        overlapped = runs.len() - ran;
    }
    let all =
        schedule_count(&steps, None).map_or("too many to count".to_string(), |c| c.to_string());
    let symmetric = inputs
        .classes
        .iter()
        .map(|c| c.len() - c.iter().collect::<std::collections::BTreeSet<_>>().len())
        .sum::<usize>();
    let end = if stopped_at_fail && overlapped == 0 {
        format!(
            "stopped at the first schedule that failed or could not run, after {} class(es)",
            search.classes_run()
        )
    } else if complete {
        format!(
            "complete over {} class(es) under the dependency relation ({all} interleavings if every step were always enabled){}",
            search.classes_run(),
            if search.explored > search.classes_run() {
                format!(
                    "; {} run(s) took a class already run",
                    search.explored - search.classes_run()
                )
            } else {
                String::new()
            }
        )
    } else {
        unfinished = Some(stopped_at_limit(
            spec.limit,
            &format!(
                "{} class(es) of the reduced search run, {all} interleavings if every step were always enabled",
                search.classes_run()
            ),
        ));
        format!(
            "stopped at the limit of {} schedules after {} class(es): not complete",
            spec.limit,
            search.classes_run()
        )
    };
    let mut notes = Vec::new();
    if search.redundant > 0 {
        notes.push(format!(
            "{} redundant run(s) (every racer holding a step asleep: an explored class, judged again)",
            search.redundant
        ));
    }
    if search.groups() > 1 {
        notes.push(format!(
            "racers in {} independent groups (no step of one depends on a step of another in any run seen), explored one group at a time: each group's classes beside one order of the others (the classes of the whole are their product){}",
            search.groups(),
            if search.restarts > 0 {
                format!("; started over {} time(s) when two groups were found tied", search.restarts)
            } else {
                String::new()
            }
        ));
    } else if search.restarts > 0 {
        notes.push(format!(
            "started over {} time(s) when racers explored apart were found tied",
            search.restarts
        ));
    }
    if symmetric > 0 {
        notes.push(format!(
            "{symmetric} racer(s) interchangeable with another (the same request to the same instance, or to instances started from one command): one per orbit"
        ));
    }
    if search.divergences > 0 {
        notes.push(format!(
            "{} divergence(s) where the service branched from a replayed prefix",
            search.divergences
        ));
    }
    if search.unanalysed > 0 {
        notes.push(format!(
            "{} run(s) with a step released outside a choice point, explored without reduction",
            search.unanalysed
        ));
    }
    if let Some(why) = catalog_note.filter(|_| total > 0) {
        notes.push(format!("{why}: every PostgreSQL write taken as dependent"));
    }
    let coverage = format!(
        "{widest} racers, {total} wire steps in the first run, {ran} schedule(s) run (reduced: {end}{}){}",
        notes.iter().map(|n| format!("; {n}")).collect::<String>(),
        overlap_note(overlapped, stopped_at_fail)
    );
    Ok(Searched {
        coverage,
        unfinished,
    })
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
pub(super) fn sweep_fault_steps(
    scenario: &TargetScenario,
    opts: &RunOptions,
    prepared: &mut Prepared,
    runs: &mut Vec<TargetRun>,
    j: usize,
    choices: &[usize],
    limit: usize,
) -> Result<(String, Option<Vec<String>>), TargetError> {
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

/// The shape ([`crate::interpose::steps::step_shape`]) of the step the swept racer's
/// fault cut in `run`, if it struck.
pub(super) fn cut_shape(run: &TargetRun, racer: &str) -> Option<String> {
    let f = sweep_fault(run, racer)?;
    Some(crate::interpose::steps::step_shape(
        f.store?,
        f.text.as_deref()?,
    ))
}

/// The swept racer's fault record in `run` (the conductor's label names the racer).
pub(super) fn sweep_fault<'r>(
    run: &'r TargetRun,
    racer: &str,
) -> Option<&'r crate::interpose::steps::FaultSeen> {
    run.evidence
        .as_ref()?
        .waves
        .iter()
        .filter_map(|w| w.schedule.as_ref())
        .flat_map(|s| s.faults.iter())
        .find(|f| f.is_on(racer))
}

/// Runs `auto` adds after its search, each with every racer's first store command released
/// together (the first point), so that the racers' statements overlap inside the server.
pub(crate) const AUTO_OVERLAP_RUNS: usize = 3;

/// The failing schedule `id` of `run` as a diagram and an isolation-tester spec; `None` when
/// the run followed no schedule (first point).
pub(super) fn failing_schedule(
    run: &TargetRun,
    id: &str,
    replay: &str,
) -> Option<crate::blackbox::FailingSchedule> {
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
    Some(crate::blackbox::FailingSchedule {
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
pub(super) fn fault_never_came(run: &TargetRun) -> bool {
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
pub(super) fn run_points(run: &TargetRun) -> Option<Vec<crate::interpose::explore::ChoicePoint>> {
    let e = run.evidence.as_ref()?;
    Some(
        e.waves
            .iter()
            .filter_map(|w| w.schedule.as_ref())
            .flat_map(|s| s.points.iter().cloned())
            .collect(),
    )
}

/// The depth-first search ([`crate::interpose::explore::Search`]) as a frontier: each
/// finished run's points give the prefixes after it.
pub(super) struct DepthFirst(pub(super) crate::interpose::explore::Search);

impl Frontier for DepthFirst {
    fn has_job(&self) -> bool {
        !self.0.is_empty()
    }

    fn next_job(&mut self) -> Option<Job> {
        self.0.next_prefix().map(|choices| {
            Job::Prefix(Prefix {
                choices,
                divergences: 0,
            })
        })
    }

    fn record(&mut self, job: Job, run: &TargetRun) {
        if let (Job::Prefix(p), Some(points)) = (job, run_points(run)) {
            self.0.record(p.choices.len(), &points);
        }
    }
}

/// The reduced search ([`crate::interpose::reduce::Reduced`]) as a frontier: each finished
/// run's trace is analysed for races; the next runs take the deepest points with
/// alternatives.
pub(super) struct ReducedRuns(pub(super) crate::interpose::reduce::Reduced);

impl Frontier for ReducedRuns {
    fn has_job(&self) -> bool {
        self.0.has_alternative()
    }

    fn next_job(&mut self) -> Option<Job> {
        self.0.next_chooser().map(Job::Reduced)
    }

    fn record(&mut self, job: Job, run: &TargetRun) {
        if let Job::Reduced(chooser) = job {
            let (points, steps, waves, lone) = run_trace(run);
            self.0.record(&points, &steps, &waves, &chooser, &lone);
        }
    }
}

/// PCT's runs `next..end` (each its own priorities and change points): independent of each
/// other.
pub(super) struct PctRuns {
    /// The next run's number.
    pub(super) next: u64,
    /// One past the last run's number.
    pub(super) end: u64,
    /// [`Pct::new`]'s seed, racers, steps and depth.
    pub(super) seed: u64,
    pub(super) racers: usize,
    pub(super) steps: usize,
    pub(super) depth: u32,
}

impl Frontier for PctRuns {
    fn has_job(&self) -> bool {
        self.next < self.end
    }

    fn next_job(&mut self) -> Option<Job> {
        (self.next < self.end).then(|| {
            self.next += 1;
            Job::Pct(Pct::new(
                self.seed,
                self.next - 1,
                self.racers,
                self.steps,
                self.depth,
            ))
        })
    }

    fn record(&mut self, _: Job, _: &TargetRun) {}
}

/// First-point runs (every racer's first command released together): `.0` of them left.
pub(super) struct FirstPoints(pub(super) usize);

impl Frontier for FirstPoints {
    fn has_job(&self) -> bool {
        self.0 > 0
    }

    fn next_job(&mut self) -> Option<Job> {
        (self.0 > 0).then(|| {
            self.0 -= 1;
            Job::FirstPoint
        })
    }

    fn record(&mut self, _: Job, _: &TargetRun) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_overlap_runs_say_when_the_failure_is_theirs() {
        assert_eq!(overlap_note(0, true), "");
        assert!(!overlap_note(3, false).contains("failed"));
        assert!(overlap_note(2, true).contains("2 run(s)"));
        assert!(overlap_note(2, true).contains("the last of them failed"));
    }

    #[test]
    fn auto_counts_each_racer_of_a_wave_at_the_longest_path_one_took() {
        // A creator of 9 steps and a replayer of 5: 2,002 interleavings as run, 48,620 if
        // the replayer creates in another schedule.
        let first = vec![vec![9, 5], vec![3]];
        assert_eq!(widened(&first), vec![vec![9, 9], vec![3]]);
        assert_eq!(schedule_count(&first, None), Some(2_002));
        assert_eq!(schedule_count(&widened(&first), None), Some(48_620));
    }
}
