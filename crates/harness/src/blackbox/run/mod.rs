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

mod counts;
mod crash;
mod explore;
mod judge;
mod lanes;
mod prepare;
mod race;
mod wave;

use std::path::PathBuf;
use std::time::Duration;
use ticketflow_core::store::url::PgServer;

use super::format::{BarrierKind, TargetScenario};
use super::service::TargetError;
use super::{TargetOutcome, TargetRun};
use crate::verdict::Verdict;
pub use judge::{not_run, summarise};
use race::{fresh_run_id, run_inner};

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
    /// Where the services the runner starts keep their stdout and stderr: a folder per
    /// scenario in it, two files per start (`NAME-N.stdout.log`, `NAME-N.stderr.log`).
    /// `None`: anonymous temporary files, gone with the run (the end of stderr is still
    /// quoted when a service exits).
    pub service_logs: Option<PathBuf>,
    /// Schedules of an interposed exploration run side by side (`--parallel`): at most this
    /// many at once, each *lane* on a set-up of its own (its own scratch database, services
    /// and interposers), so no run sees another's sessions. Used by the reduced,
    /// `exhaustive`, `bounded` and `pct` searches (and `first-point` repeats); replays and
    /// fault sweeps run one at a time. Scenarios whose lanes would share something are run
    /// on one lane (see `lanes`). 1 (the default): one at a time.
    pub parallel: usize,
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
            service_logs: None,
            parallel: 1,
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
        return explore::explore(scenario, opts);
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

/// A scenario's set-up (database, services, interposers, barrier lock) kept for many runs of
/// scenarios that share its `[target]` and `[barrier]` and differ in their racers: each run
/// has a fresh `{run}`, so no run meets another's keys or scopes.
pub struct Session {
    prepared: prepare::Prepared,
}

impl Session {
    /// Sets `scenario` up. Its widest wave bounds the widest wave a later run may have (the
    /// file descriptors are checked for it).
    ///
    /// Will return `Err` as [`run_target`] does for what stops a run before anything is raced.
    pub fn open(scenario: &TargetScenario, opts: &RunOptions) -> Result<Session, TargetError> {
        Ok(Session {
            prepared: prepare::prepare(scenario, opts)?,
        })
    }

    /// One run of `scenario` (same target and barrier as the one opened) with a fresh `{run}`;
    /// an interposed wave's steps are released in the order `chooser` picks (`None`: first
    /// point).
    ///
    /// Will return `Err` for what stops a run before anything is raced (a request that cannot
    /// be sent).
    pub fn run(
        &mut self,
        scenario: &TargetScenario,
        opts: &RunOptions,
        chooser: Option<&mut dyn crate::interpose::explore::Chooser>,
    ) -> Result<TargetRun, TargetError> {
        race::race(scenario, opts, &mut self.prepared, &fresh_run_id(), chooser)
    }
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
            match e.shortage() {
                Some(short) => run.reason = Some(short.reason(&e.to_string())),
                None => run.verdict = Verdict::Fail,
            }
            Ok(run)
        }
    }
}
