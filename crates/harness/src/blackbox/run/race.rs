//! One run on a prepared scenario: its waves in order, the counts, the verdict.

use std::time::{Duration, Instant};

use super::counts::count_rows;
use super::crash::{Restarts, ServiceCrash};
use super::prepare::{prepare, Prepared};
use super::wave::{
    build_wave, check_requests, racer_run, run_wave, step_faults, wait_out_ttl, Release,
};
use super::RunOptions;
use crate::barrier::server::Controller;
use crate::blackbox::check;
use crate::blackbox::format::CountExpectation;
use crate::blackbox::format::TargetScenario;
use crate::blackbox::history::{count_bindings, Recount};
use crate::blackbox::rules::AnswerKind;
use crate::blackbox::service::{db, TargetError};
use crate::blackbox::{Attempt, CountSeen, RacerRun, TargetEvidence, TargetRun};
use crate::scenario::timeline::now_us;
use ticketflow_core::store::postgres::{self as pg};

/// A fresh `{run}` value: `r` and 8 hex digits.
pub(crate) fn fresh_run_id() -> String {
    format!("r{:08x}", rand::random::<u32>())
}

pub(super) fn run_inner(
    scenario: &TargetScenario,
    opts: &RunOptions,
    run_id: &str,
) -> Result<TargetRun, TargetError> {
    let mut prepared = prepare(scenario, opts)?;
    race(scenario, opts, &mut prepared, run_id, None)
}

/// One run on a prepared scenario. `chooser`: the interposer barrier's order of steps
/// (`None`: first point, every racer held at its first command, then all released).
// Long because it is one run in order: each wave released by its barrier kind (the interposed
// release shares the chooser and the schedule's points across waves), the later waves marked
// not sent once a barrier is not reached, the counts under a watch, then the evidence and the
// verdict; the steps share the prepared set-up mutably, so they stay in one body.
pub(super) fn race(
    scenario: &TargetScenario,
    opts: &RunOptions,
    p: &mut Prepared,
    run_id: &str,
    mut chooser: Option<&mut dyn crate::interpose::explore::Chooser>,
) -> Result<TargetRun, TargetError> {
    let barrier_timeout = opts
        .barrier_timeout
        .unwrap_or(Duration::from_millis(scenario.barrier.timeout_ms));
    let spec = scenario.schedule.clone().unwrap_or_default();
    let step_timeout = Duration::from_millis(spec.step_timeout_ms);
    let endpoints = p.endpoints.clone();
    check_requests(scenario, &endpoints, run_id)?;
    // A service that exited in an earlier run of this set-up (reported there) starts again.
    p.services.revive()?;
    let mut racer_runs: Vec<Option<RacerRun>> = vec![None; scenario.racers.len()];
    let mut waves = Vec::new();
    let mut wave_points: Vec<usize> = Vec::new();
    let mut all_points = Vec::new();
    let mut ttl_waits = Vec::new();
    let expectations = match scenario.model {
        Some(_) => count_bindings(scenario),
        None => scenario.counts.clone(),
    };
    let mut recounts: Vec<Recount> = Vec::new();
    let restarts = Restarts::default();
    for (wave, indices) in scenario.waves() {
        let built = build_wave(scenario, &indices, &endpoints, run_id);
        let wave_faults = step_faults(scenario, &indices);
        let interposed = !p.interposers.is_empty() || !p.remote.is_empty();
        // A wave of one followed (not scheduled) for a search that reads every step.
        let lone = built.len() == 1
            && interposed
            && p.server_lock.is_none()
            && chooser.as_ref().is_some_and(|c| c.follows_lone_waves());
        let (mut evidence, mut attempts) = match (&p.server_lock, built.len()) {
            // A wave of one is sent as it is, unless a fault is to cut one of its steps.
            (_, 1) if wave_faults.is_empty() && !lone => run_wave(
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
            (None, _) if interposed => {
                let kills = wave_faults.iter().any(|f| f.kill);
                // Present whenever the runner started the services: it also reports one that
                // exits on its own, at the step after which it was seen.
                let mut crash = (!p.services.records.is_empty()).then(|| {
                    ServiceCrash::new(
                        &mut p.services,
                        built.iter().map(|(_, _, base)| base.clone()).collect(),
                        &restarts,
                    )
                });
                let mut only = crate::interpose::explore::Prefix::default();
                let plan = match chooser.as_mut() {
                    Some(_) if lone => crate::interpose::conduct::Plan::Steps {
                        chooser: &mut only,
                        first_index: 0,
                    },
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
                    crash: crash
                        .as_mut()
                        .map(|c| c as &mut dyn crate::interpose::conduct::Crash),
                    poll_repeats: spec.poll_repeats,
                    lone,
                    // A wave of one followed is timed as one sent as it is: no window after the
                    // answer (what comes after passes unscheduled, as it would).
                    after_answer: if lone {
                        Duration::ZERO
                    } else {
                        Duration::from_millis(spec.after_answer_ms)
                    },
                };
                let (evidence, attempts) = run_wave(
                    scenario,
                    wave,
                    &built,
                    Release::Interposed(Box::new((
                        conductor,
                        plan,
                        wave_faults,
                        kills.then_some(&restarts),
                    ))),
                    barrier_timeout,
                    opts.on_wait,
                );
                if let Some(sched) = evidence.schedule.as_ref().filter(|s| !s.lone) {
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
                    .map_err(db(crate::blackbox::service::BARRIER_LOCK))?;
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
        // A service that exited on its own (seen by the conductor at a step, or now).
        let conducted_exits = evidence.schedule.as_ref().map(|s| s.exits.clone());
        evidence
            .service_exits
            .extend(conducted_exits.unwrap_or_default());
        evidence.service_exits.extend(
            p.services
                .exited()
                .into_iter()
                .map(|e| format!("{e}; seen after wave {wave}")),
        );
        let killed = evidence
            .schedule
            .iter()
            .flat_map(|s| s.faults.iter())
            .any(|f| f.struck() && f.killed.is_some());
        ttl_waits.extend(wait_out_ttl(scenario, &built, &mut attempts, killed));
        if let Some(schedule) = &evidence.schedule {
            note_timeouts_after_faults(schedule, &mut attempts);
        }
        for ((i, b, base), attempts) in built.into_iter().zip(attempts) {
            racer_runs[i] = Some(racer_run(&scenario.racers[i], wave, b, base, attempts));
        }
        let unreached = evidence.problem.clone();
        waves.push(evidence);
        if let Some(m) = scenario
            .model
            .as_ref()
            .filter(|m| unreached.is_none() && m.settle_after.contains(&wave))
        {
            // A settle inside the history: wait, then recount before the next wave.
            std::thread::sleep(Duration::from_millis(m.settle_ms));
            recounts.push(Recount {
                after_wave: Some(wave),
                counts: read_counts(scenario, &expectations, p, run_id),
            });
        }
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
    let counts = read_counts(scenario, &expectations, p, run_id);
    if let Some(m) = scenario.model.as_ref().filter(|m| m.settle_ms > 0) {
        // What the settle time is for: an effect the service writes after its answer.
        std::thread::sleep(Duration::from_millis(m.settle_ms));
        recounts.push(Recount {
            after_wave: None,
            counts: read_counts(scenario, &expectations, p, run_id),
        });
    }
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
    Ok(check::judge(scenario, racers, counts, recounts, evidence))
}

/// Reads `expectations`' counts. Watched: a target database that stops answering ends the
/// counts (unread) instead of the run hanging; the count session's statement_timeout bounds a
/// slow query server-side.
fn read_counts(
    scenario: &TargetScenario,
    expectations: &[CountExpectation],
    p: &mut Prepared,
    run_id: &str,
) -> Vec<CountSeen> {
    match p.database.as_ref() {
        Some(d) => {
            let (mut counts, gave_up) = ticketflow_core::deadline::watch(
                "count queries",
                &ticketflow_core::deadline::Peer::of(&d.config),
                pg::SessionRole::Monitor.hard_deadline_for(&d.config),
                || {
                    count_rows(
                        scenario,
                        expectations,
                        p.monitor.as_mut(),
                        p.redis.as_mut(),
                        run_id,
                    )
                },
            );
            if let Some(gave_up) = gave_up {
                for c in counts.iter_mut().filter(|c| c.counted.is_err()) {
                    c.counted = Err(format!("count {:?} failed: {gave_up}", c.name));
                }
            }
            counts
        }
        None => count_rows(
            scenario,
            expectations,
            p.monitor.as_mut(),
            p.redis.as_mut(),
            run_id,
        ),
    }
}

/// A request that timed out after a fault struck its racer says whether the service reached
/// its store again for it: the racer's steps the conductor released after the fault's step.
/// None means the service never got back to its store for that request (a pool held by the
/// lost connection, a driver waiting on a cancel), not that the store was slow.
/// `attempts` are the wave's, by the racer's index in the wave.
fn note_timeouts_after_faults(
    schedule: &crate::interpose::conduct::WaveSchedule,
    attempts: &mut [Vec<Attempt>],
) {
    for f in schedule.faults.iter().filter(|f| f.struck()) {
        let Some(racer) = attempts.get_mut(f.racer) else {
            continue;
        };
        let cut = schedule.steps.iter().position(|t| {
            t.racer == f.racer && Some(t.session) == f.session && Some(&t.text) == f.text.as_ref()
        });
        let words = match cut.map(|at| {
            schedule.steps[at + 1..]
                .iter()
                .filter(|t| t.racer == f.racer)
                .count()
        }) {
            Some(0) => format!(
                "no store step of this racer was seen after the fault ({}): the service never \
                 reached its store again for the request (a connection pool held by the lost \
                 connection, or a driver waiting on a cancel)",
                f.label
            ),
            Some(n) => format!(
                "{n} store step(s) of this racer were seen after the fault ({})",
                f.label
            ),
            None => format!(
                "the fault's step ({}) is not among the wave's released steps, so what the \
                 service did after it is unknown",
                f.label
            ),
        };
        for a in racer.iter_mut().filter(|a| a.kind == AnswerKind::Timeout) {
            a.note = Some(match a.note.take() {
                Some(note) => format!("{note}; {words}"),
                None => words.clone(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interpose::conduct::{StepTaken, WaveSchedule};
    use crate::interpose::steps::{FaultSeen, FaultStep, StepFault};
    use crate::interpose::{Action, StoreKind};

    fn step(racer: usize, session: u64, text: &str) -> StepTaken {
        StepTaken {
            racer,
            store: StoreKind::Postgres,
            session,
            text: text.into(),
            params: Vec::new(),
            quiescent: true,
            waited_us: 0,
            blocked: false,
            result: "COMMIT (I)".into(),
        }
    }

    fn cut_after_commit() -> FaultSeen {
        let fault = StepFault {
            racer: 1,
            at: FaultStep::Match("COMMIT".into()),
            store: Some(StoreKind::Postgres),
            cut: Action::CutAfter,
            kill: false,
            hold: None,
            label: "cut after B's COMMIT".into(),
        };
        FaultSeen {
            step: Some(3),
            session: Some(7),
            text: Some("COMMIT".into()),
            ..FaultSeen::unstruck(&fault)
        }
    }

    fn timed_out() -> Vec<Vec<Attempt>> {
        let attempt = |kind| Attempt::unanswered(0, 1, "timeout".into(), kind, "no answer".into());
        vec![
            vec![attempt(AnswerKind::Timeout)],
            vec![attempt(AnswerKind::Error), attempt(AnswerKind::Timeout)],
        ]
    }

    #[test]
    fn a_timeout_after_a_fault_says_whether_the_racer_reached_its_store_again() {
        let mut schedule = WaveSchedule {
            steps: vec![
                step(1, 7, "BEGIN"),
                step(1, 7, "COMMIT"),
                step(0, 5, "BEGIN"),
            ],
            faults: vec![cut_after_commit()],
            ..WaveSchedule::default()
        };
        let mut attempts = timed_out();
        note_timeouts_after_faults(&schedule, &mut attempts);
        let note = attempts[1][1].note.as_deref().unwrap();
        assert!(
            note.starts_with("no answer; no store step of this racer was seen after the fault"),
            "{note}"
        );
        assert_eq!(
            attempts[1][0].note.as_deref(),
            Some("no answer"),
            "not a timeout"
        );
        assert_eq!(
            attempts[0][0].note.as_deref(),
            Some("no answer"),
            "another racer"
        );

        schedule.steps.push(step(1, 9, "SELECT 1"));
        let mut attempts = timed_out();
        note_timeouts_after_faults(&schedule, &mut attempts);
        let note = attempts[1][1].note.as_deref().unwrap();
        assert!(
            note.contains("1 store step(s) of this racer were seen after"),
            "{note}"
        );
    }
}
