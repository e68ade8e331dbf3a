//! Schedules side by side: an exploration's runs spread over *lanes*, each lane a set-up of
//! its own ([`Prepared`]: its scratch database, services and interposers), so that no run
//! sees another's sessions, locks or snapshots, and every run still starts from a fresh
//! `{run}`.
//!
//! A search hands out its next runs through a [`Frontier`] and takes each finished run back;
//! a lane that is free takes the next one. With one lane the runs come one after another, in
//! the order the search hands them out: the same runs as a search without lanes.
//!
//! A lane is opened when the search has a run to hand out and every open lane is busy (a
//! search that never has two runs to hand out never pays for a second set-up); one that
//! cannot be set up leaves the others running, and the coverage line says so.

use std::sync::mpsc;

use super::prepare::{prepare, Prepared};
use super::race::{fresh_run_id, race};
use super::RunOptions;
use crate::blackbox::format::TargetScenario;
use crate::blackbox::service::TargetError;
use crate::blackbox::TargetRun;
use crate::interpose::explore::{Chooser, Pct, Prefix};
use crate::verdict::Verdict;

/// What a lane runs: a prefix of choices, a PCT run, a run of the reduced search, or a
/// first-point run (every racer's first command held, then all released together).
#[derive(Debug)]
pub(super) enum Job {
    /// Follows the prefix, then the default order.
    Prefix(Prefix),
    /// A PCT run.
    Pct(Pct),
    /// A run of the reduced search.
    Reduced(crate::interpose::reduce::SleepChooser),
    /// First point: no schedule followed.
    FirstPoint,
}

impl Job {
    fn chooser(&mut self) -> Option<&mut dyn Chooser> {
        match self {
            Job::Prefix(p) => Some(p),
            Job::Pct(p) => Some(p),
            Job::Reduced(c) => Some(c),
            Job::FirstPoint => None,
        }
    }
}

/// A search as lanes see it.
pub(super) trait Frontier {
    /// Whether [`Frontier::next_job`] would hand out a run now.
    fn has_job(&self) -> bool;
    /// The next run to hand out now; `None` when there is none until a run out ends (or the
    /// search is over).
    fn next_job(&mut self) -> Option<Job>;
    /// Takes a finished run back, with the job it followed.
    fn record(&mut self, job: Job, run: &TargetRun);
}

/// An exploration's set-ups: the first (every run that is not side by side goes there) and
/// the lanes opened beside it.
pub(super) struct Lanes<'a> {
    scenario: &'a TargetScenario,
    opts: &'a RunOptions,
    prepared: Vec<Prepared>,
    /// Lanes wanted (at least 1), after what the scenario allows.
    wanted: usize,
    /// Why fewer lanes than `opts.parallel` are used, once known.
    why_fewer: Option<String>,
    /// Runs that ran beside another.
    pub(super) side_by_side: usize,
    /// The most lanes open at once.
    lanes_used: usize,
}

impl<'a> Lanes<'a> {
    /// The first set-up, prepared already; the lanes the scenario allows of `opts.parallel`.
    pub(super) fn new(scenario: &'a TargetScenario, opts: &'a RunOptions, first: Prepared) -> Self {
        let (wanted, why_fewer) = match (opts.parallel > 1, one_lane_only(scenario)) {
            (true, Some(why)) => (1, Some(why)),
            _ => (opts.parallel.max(1), None),
        };
        Lanes {
            scenario,
            opts,
            prepared: vec![first],
            wanted,
            why_fewer,
            side_by_side: 0,
            lanes_used: 1,
        }
    }

    /// The first set-up.
    pub(super) fn first(&mut self) -> &mut Prepared {
        &mut self.prepared[0]
    }

    /// One run on the first set-up, following `chooser`; pushed to `runs`. Returns whether
    /// the exploration stops after it ([`ends_exploration`]).
    ///
    /// Will return `Err` as [`race`] does.
    pub(super) fn one(
        &mut self,
        runs: &mut Vec<TargetRun>,
        chooser: Option<&mut dyn Chooser>,
    ) -> Result<bool, TargetError> {
        let run = race(
            self.scenario,
            self.opts,
            &mut self.prepared[0],
            &fresh_run_id(),
            chooser,
        )?;
        let stop = ends_exploration(&run, self.opts);
        runs.push(run);
        Ok(stop)
    }

    /// What the coverage line says of the lanes: how many ran side by side, or why one lane
    /// was used when more were asked; empty when nothing is to be said.
    pub(super) fn note(&self) -> String {
        let mut parts = Vec::new();
        if self.side_by_side > 0 {
            parts.push(format!(
                "{} of the runs ran side by side on {} lanes (each lane its own scratch database, services and interposers)",
                self.side_by_side,
                self.lanes_used
            ));
        }
        if let Some(why) = &self.why_fewer {
            parts.push(why.clone());
        }
        parts.iter().map(|p| format!("; {p}")).collect()
    }

    /// Sets up one more lane, if fewer than wanted are open; a lane that cannot be set up
    /// stops the opening (the reason kept for [`Lanes::note`]).
    fn open_one(&mut self, open: usize) -> Option<Prepared> {
        if open >= self.wanted {
            return None;
        }
        match prepare(self.scenario, self.opts) {
            Ok(p) => Some(p),
            Err(e) => {
                self.why_fewer = Some(format!(
                    "{} lane(s) asked, {open} set up: another could not be ({e})",
                    self.wanted
                ));
                self.wanted = open;
                None
            }
        }
    }

    /// Runs what `frontier` hands out until it has nothing left and no run is out, `runs`
    /// holds `limit` runs (those out included), or a run ends the exploration (the runs out
    /// then end, and are kept). A lane is opened when the search has a run to hand out and
    /// every open lane is busy, up to the lanes wanted. Each finished run is recorded and
    /// pushed to `runs` in the order they end. Returns whether a run ended the exploration.
    ///
    /// Will return `Err` with the first error a run returned ([`race`]), once the runs out
    /// have ended.
    pub(super) fn run_all(
        &mut self,
        frontier: &mut dyn Frontier,
        runs: &mut Vec<TargetRun>,
        limit: usize,
    ) -> Result<bool, TargetError> {
        self.run_lanes(frontier, runs, limit, true)
    }

    /// [`Lanes::run_all`] on the lanes open already (none opened for it): for a few runs
    /// that would not repay a lane's set-up.
    ///
    /// Will return `Err` as [`Lanes::run_all`] does.
    pub(super) fn run_open(
        &mut self,
        frontier: &mut dyn Frontier,
        runs: &mut Vec<TargetRun>,
        limit: usize,
    ) -> Result<bool, TargetError> {
        self.run_lanes(frontier, runs, limit, false)
    }

    /// [`Lanes::run_all`]; `may_open`: lanes may be opened.
    fn run_lanes(
        &mut self,
        frontier: &mut dyn Frontier,
        runs: &mut Vec<TargetRun>,
        limit: usize,
        may_open: bool,
    ) -> Result<bool, TargetError> {
        let (scenario, opts) = (self.scenario, self.opts);
        let mut owned = std::mem::take(&mut self.prepared);
        let mut side_by_side = 0;
        let (done_tx, done_rx) = mpsc::channel::<(usize, Job, Result<TargetRun, TargetError>)>();
        let result = std::thread::scope(|sc| {
            // Each lane's thread owns its set-up while it runs jobs, and gives it back.
            let spawn = |lane: usize, mut p: Prepared| {
                let (tx, rx) = mpsc::channel::<Job>();
                let done = done_tx.clone();
                let handle = sc.spawn(move || {
                    for mut job in rx {
                        let run = race(scenario, opts, &mut p, &fresh_run_id(), job.chooser());
                        if done.send((lane, job, run)).is_err() {
                            break;
                        }
                    }
                    p
                });
                (tx, handle)
            };
            let mut lanes: Vec<_> = owned
                .drain(..)
                .enumerate()
                .map(|(i, p)| spawn(i, p))
                .collect();
            let mut idle: Vec<usize> = (0..lanes.len()).rev().collect();
            let (mut out, mut stop, mut error) = (0usize, false, None);
            loop {
                while !stop && error.is_none() && runs.len() + out < limit && frontier.has_job() {
                    if idle.is_empty() && may_open {
                        if let Some(p) = self.open_one(lanes.len()) {
                            lanes.push(spawn(lanes.len(), p));
                            idle.push(lanes.len() - 1);
                        }
                    }
                    let Some(lane) = idle.pop() else {
                        break;
                    };
                    let Some(job) = frontier.next_job() else {
                        idle.push(lane);
                        break;
                    };
                    if out > 0 {
                        side_by_side += 1;
                    }
                    out += 1;
                    // A lane's thread ends only when its sender drops: the send cannot fail.
                    let _ = lanes[lane].0.send(job);
                }
                if out == 0 {
                    break;
                }
                let Ok((lane, job, run)) = done_rx.recv() else {
                    break;
                };
                out -= 1;
                idle.push(lane);
                match run {
                    Ok(run) => {
                        stop |= ends_exploration(&run, opts);
                        frontier.record(job, &run);
                        runs.push(run);
                    }
                    Err(e) => {
                        error.get_or_insert(e);
                    }
                }
            }
            for (tx, handle) in lanes {
                drop(tx);
                if let Ok(p) = handle.join() {
                    owned.push(p);
                }
            }
            match error {
                Some(e) => Err(e),
                None => Ok(stop),
            }
        });
        self.prepared = owned;
        self.lanes_used = self.lanes_used.max(self.prepared.len());
        self.side_by_side += side_by_side;
        result
    }
}

/// Whether an exploration stops after `run`: a FAIL (unless `--keep-going`), or a run that
/// could not be set up as declared (a racer never reached the store), since the next
/// schedules would meet the same obstacle.
pub(super) fn ends_exploration(run: &TargetRun, opts: &RunOptions) -> bool {
    match run.verdict {
        Verdict::Fail => !opts.keep_going,
        Verdict::Pending => true,
        Verdict::Pass => false,
    }
}

/// Why `scenario`'s schedules cannot run side by side, if they cannot: lanes need set-ups
/// that share nothing but the servers (each its own scratch database, services started by the
/// runner, interposers of its own).
pub(super) fn one_lane_only(scenario: &TargetScenario) -> Option<String> {
    let t = &scenario.target;
    let why = if t.interposer.is_some() {
        "the interposer is one you started ([target] interposer): one interposer conducts one run at a time"
    } else if t.database_url.is_some() {
        "the schedules share the database [target] database_url names: side by side, their transactions would meet each other's locks and snapshots"
    } else if t.services.is_empty() || !t.base_urls.is_empty() {
        "a service the runner does not start is shared by every lane"
    } else if t.state_across_keys {
        "[target] state_across_keys: the service keeps state that requests under different keys share"
    } else {
        return None;
    };
    Some(format!("one schedule at a time: {why}"))
}
