//! One wave conducted at the store: every racer's first command held, then one step at a
//! time in the order a [`Chooser`] gives.
//!
//! Start: racer 0's request is sent, and the conductor waits until a session holds a step
//! that no other racer owns: that session is racer 0's. Then racer 1, and so on; so each
//! racer's first command is held at the proxy before the next request leaves, and sessions are
//! tied to racers without guessing. A racer whose request is answered without a command, or
//! is not seen at the store within the start timeout, is recorded so.
//!
//! Steps: at a quiescent point (every unfinished racer holds a step at the proxy, or its
//! step waits in the server for a lock: `pg_blocking_pids` of its backend), the chooser picks
//! one held racer, whose step is released; the conductor waits until that step's reply is in
//! or it is seen waiting. A racer busy outside the store (its service between two commands)
//! is waited for up to the step timeout; a step taken then is taken without quiescence, and
//! the evidence says so and how long was waited. A session that starts a step while no racer
//! can own it is tied to the busy racer when there is one (several: the first, counted as a
//! guess), otherwise released unscheduled (counted).
//!
//! A racer resting in a wait the runner controls (its retry backoff, a killed service's
//! restart: [`Racers::resting`]) counts as quiescent: it can send nothing until the runner
//! lets it, so a point never waits for it.
//!
//! Polling: a racer whose held step has the read-only shape ([`read_only`]) of its last
//! [`POLL_REPEATS`] released steps is spinning (a duplicate that polls the store until the
//! first request's row appears); while another racer holds a step it yields as below, so the
//! search does not keep releasing the polls of a waiter while the request it waits for sits
//! at the proxy (CHESS's fairness for spin loops). A poll while no other racer holds a step is
//! released as any step is.
//!
//! Fairness: a racer whose request was answered "in progress" and that retries yields, as in
//! CHESS's fair scheduling (Musuvathi and Qadeer, "Fair stateless model checking", PLDI 2008):
//! at the first point after its yield it is not enabled while any racer that held a step or
//! waited in the server at that point still holds one, until each of those has been released
//! once. Without it the search keeps choosing the retrier (each retry is a new step) while the
//! holder of a lock sits at the proxy, and the retries run out: a schedule real time would not
//! produce, since the holder's command completes during the retrier's backoff. A racer whose
//! every held rival is itself waiting on a yield is enabled anyway (no point is left empty).
//!
//! Faults ([`Conductor::run_with_faults`]): a [`StepFault`] names a racer and one step of its
//! first attempt (the steps released before its retry starts, what its service sends after
//! the first answer included), by index or by the words its
//! statement starts with; when the schedule releases that step, it is released with the cut
//! ([`Action::CutBefore`], [`Action::CutAfter`]) and the evidence records what the server did
//! with it ([`FaultSeen`]). Each fault strikes at most once per wave.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::explore::{ChoicePoint, Chooser, HeldStep};
use super::hub::{Action, CutOutcome, Hub, Phase, SessionView, StoreKind};
use super::steps::{cut_result, read_only, step_shape, strike, FaultSeen, StepFault};

/// What a conductor needs of an interposer's shared state: the [`Hub`] of an interposer in
/// this process, or one reached over the control protocol of a running `ticketflow
/// interpose` ([`super::control::RemoteHub`]). Each method means what the `Hub` method of the
/// same name does.
pub trait HubControl {
    /// Starts a run: from now every step is held until released ([`Hub::begin`]).
    fn begin(&self);
    /// Ends a run: every held step goes on ([`Hub::end`]).
    fn end(&self);
    /// Every open session and the current version ([`Hub::view`]).
    fn view(&self) -> (u64, Vec<SessionView>);
    /// Releases session `id`'s held step; `false` when it holds none ([`Hub::release`]).
    fn release(&self, id: u64) -> bool;
    /// Releases session `id`'s held step with `action` (forward, or a cut); `false` when it
    /// holds none ([`Hub::release_with`]).
    fn release_with(&self, id: u64, action: Action) -> bool;
    /// What the server did with session `id`'s cut step, once known ([`Hub::cut_outcome`]).
    fn cut_outcome(&self, id: u64) -> Option<CutOutcome>;
    /// Session `id`'s view, open or closed since the run began ([`Hub::session`]).
    fn session(&self, id: u64) -> Option<SessionView>;
    /// Whether session `id`'s connection is still open ([`Hub::is_open`]).
    fn is_open(&self, id: u64) -> bool;
    /// Waits until the version differs from `seen` or `deadline` passes; returns the version
    /// ([`Hub::wait_change`]).
    fn wait_change(&self, seen: u64, deadline: Instant) -> u64;
    /// The version now, without waiting.
    fn version(&self) -> u64 {
        self.wait_change(u64::MAX, Instant::now())
    }
    /// Why this hub could not be conducted (a control connection that broke), if it could
    /// not; then its views were empty and the wave is not evidence. A local hub: never.
    fn lost(&self) -> Option<String> {
        None
    }
}

impl HubControl for Hub {
    fn begin(&self) {
        Hub::begin(self);
    }
    fn end(&self) {
        Hub::end(self);
    }
    fn view(&self) -> (u64, Vec<SessionView>) {
        Hub::view(self)
    }
    fn release(&self, id: u64) -> bool {
        Hub::release(self, id)
    }
    fn release_with(&self, id: u64, action: Action) -> bool {
        Hub::release_with(self, id, action)
    }
    fn cut_outcome(&self, id: u64) -> Option<CutOutcome> {
        Hub::cut_outcome(self, id)
    }
    fn session(&self, id: u64) -> Option<SessionView> {
        Hub::session(self, id)
    }
    fn is_open(&self, id: u64) -> bool {
        Hub::is_open(self, id)
    }
    fn wait_change(&self, seen: u64, deadline: Instant) -> u64 {
        Hub::wait_change(self, seen, deadline)
    }
}

/// So that `&Arc<Hub>` ([`super::Interposer::hub`]) is a hub a conductor takes as it is.
impl<H: HubControl + ?Sized> HubControl for Arc<H> {
    fn begin(&self) {
        (**self).begin();
    }
    fn end(&self) {
        (**self).end();
    }
    fn view(&self) -> (u64, Vec<SessionView>) {
        (**self).view()
    }
    fn release(&self, id: u64) -> bool {
        (**self).release(id)
    }
    fn release_with(&self, id: u64, action: Action) -> bool {
        (**self).release_with(id, action)
    }
    fn cut_outcome(&self, id: u64) -> Option<CutOutcome> {
        (**self).cut_outcome(id)
    }
    fn session(&self, id: u64) -> Option<SessionView> {
        (**self).session(id)
    }
    fn is_open(&self, id: u64) -> bool {
        (**self).is_open(id)
    }
    fn wait_change(&self, seen: u64, deadline: Instant) -> u64 {
        (**self).wait_change(seen, deadline)
    }
    fn lost(&self) -> Option<String> {
        (**self).lost()
    }
}

/// What a conductor needs to crash the service that serves a racer ([`StepFault::kill`]): the
/// runner's own processes, reached through this so that the conductor never starts one.
pub trait Crash: Send {
    /// Freezes the process serving racer `racer` (index in the wave) where it is (`SIGSTOP`):
    /// from now on it runs no code, so it neither sees the cut nor answers anything.
    ///
    /// Will return `Err` in words when there is no such process or it is not running.
    fn freeze(&mut self, racer: usize) -> Result<(), String>;
    /// Kills the frozen process with `SIGKILL`, starts it again as it was started (command,
    /// environment, port) and waits until it answers its ready path; returns what happened in
    /// words (service, old and new pid, how long the restart took).
    ///
    /// Will return `Err` in words when it could not be started again.
    fn kill_and_restart(&mut self, racer: usize) -> Result<String, String>;
    /// The processes that exited on their own since the last call (not killed by
    /// [`Crash::kill_and_restart`]), each in words, each reported once.
    fn exited(&mut self) -> Vec<String>;
}

/// What the conductor needs to know of the racers' requests.
pub trait Racers: Sync {
    /// How many racers the wave has.
    fn count(&self) -> usize;
    /// Lets racer `i` send its request.
    fn go(&self, i: usize);
    /// Racer `i`'s first answer is in (or its request failed).
    fn answered(&self, i: usize) -> bool;
    /// Racer `i` is done: every attempt (first and retries) is over.
    fn finished(&self, i: usize) -> bool;
    /// How long ago racer `i` finished, if it has: its sessions are still conducted for
    /// [`Conductor::after_answer`] after it. Default: long ago, when finished.
    fn finished_since(&self, i: usize) -> Option<Duration> {
        self.finished(i).then_some(Duration::MAX)
    }
    /// Racer `i` has started a second attempt (a retry): from then on its steps are the
    /// retry's, not its first attempt's. Default: as soon as its first answer is in.
    fn retrying(&self, i: usize) -> bool {
        self.answered(i)
    }
    /// How many "in progress" answers racer `i` is retrying after, so far: each one is a
    /// yield ([`Conductor::run`] lets the racers it yields to go first). Default: 0, a racer
    /// that never yields.
    fn yields(&self, _i: usize) -> usize {
        0
    }
    /// Whether racer `i` is resting in a wait the runner itself controls (a retry's backoff,
    /// a wait for a killed service to be back): it will send nothing before the wait ends, so
    /// a choice point does not wait for it as it waits for a racer busy in its service.
    /// Default: never.
    fn resting(&self, _i: usize) -> bool {
        false
    }
}

/// How a wave is conducted.
pub enum Plan<'c> {
    /// Every racer's first command held, then all released at once and run free.
    FirstPoint,
    /// One step at a time in the chooser's order; `first_index` is the number of choice
    /// points of earlier waves (the chooser's indices run across the run).
    Steps {
        /// The chooser.
        chooser: &'c mut dyn Chooser,
        /// Choice points met before this wave.
        first_index: usize,
    },
}

/// How racer `i`'s first command was met.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "seen")]
pub enum Start {
    /// Held at the proxy: `session` of `store`, its first step's text.
    Held {
        /// Store.
        store: StoreKind,
        /// Session number in that interposer.
        session: u64,
        /// The statement or command.
        text: String,
    },
    /// Answered before any command of it reached the store.
    AnsweredFirst,
    /// Neither held nor answered within the start timeout.
    NotSeen {
        /// Milliseconds waited.
        waited_ms: u64,
    },
}

/// One step released.
#[derive(Debug, Clone, Serialize)]
pub struct StepTaken {
    /// The racer (index in the wave).
    pub racer: usize,
    /// Its store.
    pub store: StoreKind,
    /// Its session.
    pub session: u64,
    /// Statement or command text.
    pub text: String,
    /// Bound parameters.
    pub params: Vec<String>,
    /// Whether the point was quiescent.
    pub quiescent: bool,
    /// Microseconds waited for quiescence before it.
    pub waited_us: u64,
    /// Seen waiting in the server for a lock after its release.
    pub blocked: bool,
    /// The server's answer ([`super::hub::SessionView::result_text`]): PostgreSQL's
    /// CommandComplete tags and transaction status (`INSERT 0 1 (T)`) or its error
    /// (`23505 duplicate key … (E)`), Redis' reply in one line (`+OK`, `nil`, `:1`). A step
    /// seen waiting for a lock (`blocked`) gets its reply once it is in; until then, and if
    /// it never comes within the wave, `waiting for a lock`. A step still running when the
    /// next point came gets its reply marked `(answered after the next point)`, or stays
    /// `running`. `connection closed` when the connection ended without a reply.
    pub result: String,
}

/// What happened in one conducted wave.
#[derive(Debug, Clone, Default, Serialize)]
pub struct WaveSchedule {
    /// Per racer, how its first command was met.
    pub start: Vec<Option<Start>>,
    /// The choice points, in order.
    pub points: Vec<ChoicePoint>,
    /// The steps released, in order (one per point).
    pub steps: Vec<StepTaken>,
    /// Points that were not quiescent.
    pub nonquiescent: usize,
    /// Microseconds waited for quiescence in all.
    pub waited_us: u64,
    /// Sessions tied to a racer by a guess.
    pub guessed: usize,
    /// Steps no racer could own, released unscheduled.
    pub unowned: usize,
    /// Yields: a racer answered "in progress" that retried, and let the racers holding a step
    /// go before it (fair scheduling).
    pub yields: usize,
    /// Choice points at which a yielding racer held a step and was left out of the choice.
    pub deferred: usize,
    /// Steps sent after their racer's last answer, within [`Conductor::after_answer`], and
    /// scheduled as its own (a service that stores its answer after the response).
    #[serde(default)]
    pub after_answer: usize,
    /// Of the yields, those of a racer polling: its held step repeated its last
    /// [`POLL_REPEATS`] released read-only steps while another racer held a step.
    #[serde(default)]
    pub polls_yielded: usize,
    /// Why the wave was not conducted as declared, if it was not.
    pub problem: Option<String>,
    /// The faults of the wave and what became of each ([`Conductor::run_with_faults`]).
    pub faults: Vec<FaultSeen>,
    /// When a racer was not seen at the store: the held sessions with bytes of a next command
    /// waiting behind their step ([`SessionView::queued`]), in words.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queued_behind: Vec<String>,
    /// Services that exited on their own during the wave ([`Crash::exited`]), each with the
    /// step after which the exit was seen.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exits: Vec<String>,
    /// A wave of one racer followed for a search that reads every step
    /// ([`super::explore::Chooser::follows_lone_waves`]): its points name no choice and are not
    /// part of the schedule's id.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lone: bool,
}

/// The stores and bounds of a conducted wave.
pub struct Conductor<'a> {
    /// Every interposer's hub (PostgreSQL, Redis), local or remote.
    pub hubs: Vec<&'a dyn HubControl>,
    /// A direct session on the PostgreSQL server, for `pg_blocking_pids`.
    pub monitor: Option<&'a mut postgres::Client>,
    /// How long a busy racer is waited for at a point.
    pub step_timeout: Duration,
    /// How long each racer may take to be seen at the store at the start.
    pub start_timeout: Duration,
    /// The wave's deadline: past it every held step is released and the wave is a problem.
    pub deadline: Instant,
    /// The runner's services, for faults that kill one (`None`: a kill is refused).
    pub crash: Option<&'a mut dyn Crash>,
    /// A wave of one racer followed, not scheduled
    /// ([`super::explore::Chooser::follows_lone_waves`]): marked in its [`WaveSchedule`], and
    /// a racer answered before any store command of it is no problem there.
    pub lone: bool,
    /// Released read-only steps of one shape after which a racer's next such step is a poll
    /// ([`POLL_REPEATS`] by default); 0: polls are never told apart.
    pub poll_repeats: usize,
    /// How long after a racer's last answer its sessions are still conducted as its own
    /// ([`AFTER_ANSWER`] by default): a service that stores its answer after the response
    /// does so then, and the schedule and the faults reach those steps.
    pub after_answer: Duration,
}

/// The default of [`Conductor::after_answer`]: 50 ms, time for a service to send the store
/// command that follows its response (at the proxy it is then held, whatever comes later).
pub const AFTER_ANSWER: Duration = Duration::from_millis(50);

type Key = (usize, u64);

/// Racer `i`'s letter in schedule ids (`A` = the wave's first racer).
fn racer_letter(i: usize) -> String {
    char::from(b'A' + u8::try_from(i % 26).unwrap_or(0)).to_string()
}

/// How many consecutive released steps of one read-only shape make a racer's next held step
/// of that shape a poll: it then yields to the racers holding steps ([`Conductor::run`]).
pub const POLL_REPEATS: usize = 2;

/// The result of a step still at the server, not waiting for a lock, when the step timeout
/// passed.
const RUNNING: &str = "running";
/// Where each racer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Where {
    Finished,
    Held(Key),
    AtServer(Key),
    Blocked(Key),
    Busy,
}

/// How long a released PostgreSQL step runs before the server is asked whether it waits for
/// a lock (`pg_blocking_pids`).
const LOCK_ASK_AFTER: Duration = Duration::from_millis(1);

impl Conductor<'_> {
    /// Every hub's sessions, and the first hub's version they were read at (what
    /// [`Conductor::wait_a_little`] waits to change).
    fn views(&self) -> (u64, Vec<(Key, SessionView)>) {
        let mut first = 0;
        let views = self
            .hubs
            .iter()
            .enumerate()
            .flat_map(|(h, hub)| {
                let (version, views) = hub.view();
                if h == 0 {
                    first = version;
                }
                views.into_iter().map(move |v| ((h, v.id), v))
            })
            .collect();
        (first, views)
    }

    /// Waits until the first hub changes from `seen`, `until`, or 2 ms at most.
    fn wait_a_little(&self, seen: u64, until: Instant) {
        // The hubs signal every change of theirs; a racer's answer and a server-side lock
        // wait are not signalled, so the wait is short: an observed-condition poll.
        let until = until.min(Instant::now() + Duration::from_millis(2));
        if let Some(h) = self.hubs.first() {
            h.wait_change(seen, until);
        }
    }

    /// The PostgreSQL backends among `pids` that wait for a lock held by another session.
    fn blocked(&mut self, pids: &[i32]) -> Vec<i32> {
        let Some(m) = self.monitor.as_mut() else {
            return Vec::new();
        };
        if pids.is_empty() {
            return Vec::new();
        }
        m.query(
            "SELECT pid FROM unnest($1::int4[]) AS pid WHERE cardinality(pg_blocking_pids(pid)) > 0",
            &[&pids],
        )
        .map(|rows| rows.iter().map(|r| r.get::<_, i32>(0)).collect())
        .unwrap_or_default()
    }

    fn release_all(&self) {
        for h in &self.hubs {
            h.end();
        }
    }

    /// Conducts one wave: starts every racer, then follows `plan`. The hubs are in a run for
    /// the wave's length and out of it after.
    pub fn run(&mut self, racers: &dyn Racers, plan: Plan<'_>) -> WaveSchedule {
        self.run_with_faults(racers, plan, &[])
    }

    /// [`Conductor::run`], cutting at the steps `faults` name: when the schedule releases such
    /// a step it is released with the fault's cut, once per fault. A fault needs the steps
    /// released one at a time: under [`Plan::FirstPoint`] none strikes. The wave's
    /// [`WaveSchedule::faults`] says, per fault, which step was cut and what the server did
    /// with it, or that the step never came.
    // Long on purpose: one loop over the choice points whose state (session owners and
    // guesses, yields, steps whose reply is not in, the faults' strikes) every point reads
    // and writes; split, each part would take all of it.
    pub fn run_with_faults(
        &mut self,
        racers: &dyn Racers,
        mut plan: Plan<'_>,
        faults: &[StepFault],
    ) -> WaveSchedule {
        let n = racers.count();
        let mut out = WaveSchedule {
            start: vec![None; n],
            faults: faults.iter().map(FaultSeen::unstruck).collect(),
            lone: self.lone,
            ..WaveSchedule::default()
        };
        for h in &self.hubs {
            h.begin();
        }
        let mut owner: HashMap<Key, usize> = HashMap::new();
        // Sessions tied to their racer by a guess ([`Conductor::locate`]).
        let mut guesses: HashSet<Key> = HashSet::new();
        for i in 0..n {
            racers.go(i);
            let began = Instant::now();
            let until = (began + self.start_timeout).min(self.deadline);
            out.start[i] = Some(loop {
                let (seen, views) = self.views();
                let fresh = views.into_iter().find(|(k, v)| {
                    v.phase == Phase::Held && owner.get(k).map_or(true, |&o| racers.finished(o))
                });
                if let Some((k, v)) = fresh {
                    owner.insert(k, i);
                    break Start::Held {
                        store: v.store,
                        session: v.id,
                        text: v.step.text,
                    };
                }
                if racers.answered(i) {
                    break Start::AnsweredFirst;
                }
                if Instant::now() >= until {
                    // A command sent on a connection whose step is held waits behind it: a
                    // client that sends several requests over one connection.
                    out.queued_behind = self
                        .views()
                        .1
                        .into_iter()
                        .filter(|(_, v)| v.phase == Phase::Held && v.queued > 0)
                        .map(|(k, v)| {
                            format!(
                                "{} session #{} ({}'s, holding {}) has {} byte(s) of a next command waiting behind its held step",
                                v.store.name(),
                                v.id,
                                owner
                                    .get(&k)
                                    .map_or("no racer".to_string(), |&o| racer_letter(o)),
                                super::hub::clip_to(&v.step.text, 60),
                                v.queued
                            )
                        })
                        .collect();
                    break Start::NotSeen {
                        waited_ms: u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX),
                    };
                }
                self.wait_a_little(seen, until);
            });
        }
        let (chooser, first_index) = match &mut plan {
            Plan::FirstPoint => {
                self.release_all();
                return out;
            }
            Plan::Steps {
                chooser,
                first_index,
            } => (&mut **chooser, *first_index),
        };
        let mut last: Option<usize> = None;
        // Steps released whose reply was not in when the next point came (seen waiting for a
        // lock, or still running): `(index in out.steps, session, its completed count then)`.
        let mut unanswered: Vec<(usize, Key, u64)> = Vec::new();
        // Fair scheduling: the yields seen per racer, and the racers each one yields to.
        let mut yields_seen: Vec<usize> = (0..n).map(|i| racers.yields(i)).collect();
        let mut yields_to: Vec<Vec<usize>> = vec![Vec::new(); n];
        // Where each fault struck (hub, session), to read its outcome when the wave ends.
        let mut cut_at: Vec<Option<Key>> = vec![None; faults.len()];
        // Spin loops: per racer, the shape of its last released step and how many released
        // steps before it had the same read-only shape ([`POLL_REPEATS`]).
        let mut last_shape: Vec<Option<String>> = vec![None; n];
        let mut repeats: Vec<usize> = vec![0; n];
        // Steps held by a pause fault: (racer, session, fault, until, since).
        let mut paused: Vec<(usize, Key, usize, Instant, Instant)> = Vec::new();
        'wave: loop {
            self.resume_paused(&mut paused, &mut out);
            let point_started = Instant::now();
            let (wheres, views, quiescent) = loop {
                let (seen, views) = self.views();
                let wheres = self.locate(racers, &views, &mut owner, &mut guesses, &mut out);
                if wheres.iter().all(|w| *w == Where::Finished) {
                    if !(0..n).any(|r| self.lingers(racers, r)) {
                        break 'wave;
                    }
                    // Every racer answered; a service may still send what it does after its
                    // answer: wait for that, up to `after_answer`.
                    self.wait_a_little(seen, self.deadline);
                    continue;
                }
                // A racer resting in the runner's own wait is not waited for: nothing of its
                // can reach the store before the runner lets it go.
                let quiescent = wheres.iter().enumerate().all(|(r, w)| {
                    matches!(w, Where::Finished | Where::Held(_) | Where::Blocked(_))
                        || (*w == Where::Busy && racers.resting(r))
                });
                let any_held = wheres.iter().any(|w| matches!(w, Where::Held(_)));
                let now = Instant::now();
                if now >= self.deadline {
                    out.problem = Some(format!(
                        "the wave did not end by its deadline: {} of {n} racers still out",
                        wheres.iter().filter(|w| **w != Where::Finished).count()
                    ));
                    break 'wave;
                }
                if any_held && (quiescent || now >= point_started + self.step_timeout) {
                    if !quiescent {
                        out.nonquiescent += 1;
                    }
                    break (wheres, views, quiescent);
                }
                self.wait_a_little(seen, self.deadline);
            };
            let waited = point_started.elapsed();
            self.settle(&mut out.steps, &mut unanswered);
            self.note_exits(&mut out);
            // A paused racer's step is not a choice until its pause is over.
            let held: Vec<usize> = (0..n)
                .filter(|&r| matches!(wheres[r], Where::Held(_)))
                .filter(|r| !paused.iter().any(|p| p.0 == *r))
                .collect();
            if held.is_empty() {
                // Only paused steps are held: wait for the first pause to end (or a change).
                let until = paused
                    .iter()
                    .map(|p| p.3)
                    .min()
                    .unwrap_or(self.deadline)
                    .min(self.deadline)
                    .min(Instant::now() + Duration::from_millis(10));
                if let Some(h) = self.hubs.first() {
                    let (v, _) = h.view();
                    h.wait_change(v, until);
                }
                continue 'wave;
            }
            // The racers other than `r` that hold a step or have one at the server: those a
            // yield of `r` lets go first.
            let others_in_store = |r: usize| -> Vec<usize> {
                (0..n)
                    .filter(|&u| {
                        u != r
                            && matches!(
                                wheres[u],
                                Where::Held(_) | Where::Blocked(_) | Where::AtServer(_)
                            )
                    })
                    .collect()
            };
            for r in 0..n {
                let y = racers.yields(r);
                if y > yields_seen[r] {
                    yields_seen[r] = y;
                    out.yields += 1;
                    yields_to[r] = others_in_store(r);
                }
                // A racer polling (its held step repeats its last read-only steps) while others
                // hold steps yields to them, as a retry after "in progress" does.
                if let Where::Held(k) = wheres[r] {
                    let polling = self.poll_repeats > 0
                        && repeats[r] + 1 >= self.poll_repeats
                        && views
                            .iter()
                            .find(|(key, _)| *key == k)
                            .is_some_and(|(_, v)| {
                                last_shape[r].as_deref() == Some(&step_shape(v.store, &v.step.text))
                            });
                    if polling {
                        let to = others_in_store(r);
                        if !to.is_empty() {
                            out.yields += 1;
                            out.polls_yielded += 1;
                            yields_to[r] = to;
                            repeats[r] = 0;
                        }
                    }
                }
                yields_to[r].retain(|&u| wheres[u] != Where::Finished);
            }
            let fair: Vec<usize> = held
                .iter()
                .copied()
                .filter(|&r| !yields_to[r].iter().any(|u| held.contains(u)))
                .collect();
            if !fair.is_empty() && fair.len() < held.len() {
                out.deferred += 1;
            }
            let enabled = if fair.is_empty() { held } else { fair };
            let held_steps: Vec<HeldStep> = enabled
                .iter()
                .filter_map(|&r| match wheres[r] {
                    Where::Held(k) => {
                        views
                            .iter()
                            .find(|(key, _)| *key == k)
                            .map(|(_, v)| HeldStep {
                                racer: r,
                                store: v.store,
                                session: v.id,
                                text: v.step.text.clone(),
                                params: v.step.params.clone(),
                            })
                    }
                    _ => None,
                })
                .collect();
            let chosen =
                chooser.choose_held(first_index + out.points.len(), &enabled, last, &held_steps);
            let chosen = if enabled.contains(&chosen) {
                chosen
            } else {
                enabled[0]
            };
            let Where::Held(key) = wheres[chosen] else {
                unreachable!("an enabled racer holds a step")
            };
            let view = views
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.clone())
                .expect("a held session is in the view");
            out.points.push(ChoicePoint {
                enabled,
                chosen,
                last,
                held: held_steps,
            });
            out.waited_us += u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
            let fault = strike(
                faults,
                &mut out.faults,
                chosen,
                racers.retrying(chosen),
                guesses.contains(&key),
                &view,
            );
            if let Some((j, hold)) = fault.and_then(|j| faults[j].hold.map(|h| (j, h))) {
                // Held on: the others go on while it waits at the proxy.
                let now = Instant::now();
                paused.push((chosen, key, j, now + hold, now));
                self.deadline += hold;
                out.faults[j].result = format!(
                    "held at the proxy for {} ms while the other racers went on",
                    hold.as_millis()
                );
                last = Some(chosen);
                continue 'wave;
            }
            let action = fault.map_or(Action::Forward, |j| faults[j].cut);
            let kill = fault.filter(|&j| faults[j].kill);
            if let Some(j) = kill {
                if let Err(why) = self.freeze(chosen) {
                    out.faults[j].killed = Some(format!("not killed: {why}"));
                    out.problem = Some(format!("{}: {why}", faults[j].label));
                }
            }
            self.hubs[key.0].release_with(key.1, action);
            last = Some(chosen);
            let shape = step_shape(view.store, &view.step.text);
            if read_only(view.store, &shape) && last_shape[chosen].as_deref() == Some(&shape) {
                repeats[chosen] += 1;
            } else {
                repeats[chosen] = 0;
            }
            last_shape[chosen] = Some(shape);
            for to in &mut yields_to {
                to.retain(|&u| u != chosen);
            }
            let (blocked, mut result) = self.follow(key, view.completed, view.store);
            if fault.is_none() && (blocked || result == RUNNING) {
                unanswered.push((out.steps.len(), key, view.completed));
            }
            if let Some(j) = kill.filter(|_| out.problem.is_none()) {
                let (said, took) = self.kill_and_restart(chosen, &owner, &mut out.unowned);
                self.deadline += took;
                if let Err(why) = &said {
                    out.problem = Some(format!("{}: {why}", faults[j].label));
                }
                out.faults[j].killed = Some(said.unwrap_or_else(|e| e));
            }
            if let Some(j) = fault {
                cut_at[j] = Some(key);
                // A step cut after the server may still be running (waiting for a lock): its
                // outcome is read again when the wave ends.
                let outcome = self.hubs[key.0].cut_outcome(key.1);
                result = cut_result(action, outcome.as_ref());
                out.faults[j].outcome = outcome;
                out.faults[j].result = result.clone();
            }
            out.steps.push(StepTaken {
                racer: chosen,
                store: view.store,
                session: view.id,
                text: view.step.text,
                params: view.step.params,
                quiescent,
                waited_us: u64::try_from(waited.as_micros()).unwrap_or(u64::MAX),
                blocked,
                result,
            });
        }
        self.settle(&mut out.steps, &mut unanswered);
        self.note_exits(&mut out);
        for (f, key) in out.faults.iter_mut().zip(&cut_at) {
            if let (Some((h, session)), None) = (key, &f.outcome) {
                f.outcome = self.hubs[*h].cut_outcome(*session);
                f.result = cut_result(f.cut, f.outcome.as_ref());
            }
        }
        self.release_all();
        out
    }

    /// Whether racer `r` finished less than [`Conductor::after_answer`] ago.
    fn lingers(&self, racers: &dyn Racers, r: usize) -> bool {
        racers
            .finished_since(r)
            .is_some_and(|d| d < self.after_answer)
    }

    /// Forwards each paused step whose pause is over (or every one, past the wave's deadline),
    /// waits for it as for any released step, and records it as a step of its racer.
    fn resume_paused(
        &mut self,
        paused: &mut Vec<(usize, Key, usize, Instant, Instant)>,
        out: &mut WaveSchedule,
    ) {
        let now = Instant::now();
        let (due, later): (Vec<_>, Vec<_>) = paused
            .drain(..)
            .partition(|p| now >= p.3 || now >= self.deadline);
        *paused = later;
        for (racer, key, j, _, since) in due {
            let Some(view) = self.hubs[key.0].session(key.1) else {
                continue;
            };
            self.hubs[key.0].release_with(key.1, Action::Forward);
            let held_ms = since.elapsed().as_millis();
            let (blocked, result) = self.follow(key, view.completed, view.store);
            out.faults[j].result = format!(
                "held at the proxy for {held_ms} ms while the other racers went on, then forwarded: {result}"
            );
            out.steps.push(StepTaken {
                racer,
                store: view.store,
                session: view.id,
                text: view.step.text,
                params: view.step.params,
                // Released by its pause's end, not at a choice point: nothing was waited for.
                quiescent: true,
                waited_us: u64::try_from(held_ms.saturating_mul(1000)).unwrap_or(u64::MAX),
                blocked,
                result: format!("{result} (after a pause of {held_ms} ms)"),
            });
        }
    }

    /// Records the services that exited since the last point, with the last step released.
    fn note_exits(&mut self, out: &mut WaveSchedule) {
        let Some(crash) = self.crash.as_deref_mut() else {
            return;
        };
        for exit in crash.exited() {
            let at = match out.steps.last() {
                Some(s) => format!(
                    "seen after step {} ({}'s {} → {})",
                    out.steps.len(),
                    racer_letter(s.racer),
                    super::hub::clip_to(&s.text, 60),
                    s.result
                ),
                None => "seen before the first step was released".into(),
            };
            out.exits.push(format!("{exit}; {at}"));
        }
    }

    fn freeze(&mut self, racer: usize) -> Result<(), String> {
        match self.crash.as_deref_mut() {
            Some(c) => c.freeze(racer),
            None => Err("no service of the runner's to kill here".into()),
        }
    }

    /// Kills the frozen service of `racer` and starts it again ([`Crash::kill_and_restart`])
    /// on a thread of its own, while this one releases the steps no racer owns: the new
    /// process's own start-up commands (a pool filling itself, a migration check) must not
    /// wait for a schedule, and no racer is conducted until it is back. Returns what the
    /// restart said and how long it took.
    fn kill_and_restart(
        &mut self,
        racer: usize,
        owner: &HashMap<Key, usize>,
        unowned: &mut usize,
    ) -> (Result<String, String>, Duration) {
        let began = Instant::now();
        let Some(crash) = self.crash.as_deref_mut() else {
            return (
                Err("no service of the runner's to kill here".into()),
                began.elapsed(),
            );
        };
        let hubs = &self.hubs;
        // Each held step once: a released step shows as held until its session thread wakes.
        let mut released: HashSet<(usize, u64, u64)> = HashSet::new();
        let said = std::thread::scope(|sc| {
            let restart = sc.spawn(move || crash.kill_and_restart(racer));
            while !restart.is_finished() {
                for (h, hub) in hubs.iter().enumerate() {
                    let (version, views) = hub.view();
                    for v in views {
                        if v.phase == Phase::Held
                            && !owner.contains_key(&(h, v.id))
                            && released.insert((h, v.id, v.completed))
                            && hub.release(v.id)
                        {
                            *unowned += 1;
                        }
                    }
                    // Bounded so that the end of the restart is seen soon after it comes.
                    hub.wait_change(version, Instant::now() + Duration::from_millis(5));
                }
            }
            restart
                .join()
                .unwrap_or_else(|_| Err("the restart thread panicked".into()))
        });
        (said, began.elapsed())
    }

    /// The results of `unanswered` steps whose reply has come in since: a step that waited
    /// for a lock gets its reply (its `blocked` flag says it waited); one that was still
    /// running gets its reply marked as late. The others stay.
    fn settle(&self, steps: &mut [StepTaken], unanswered: &mut Vec<(usize, Key, u64)>) {
        unanswered.retain(|&(i, key, before)| {
            let Some(v) = self.hubs[key.0].session(key.1) else {
                return true;
            };
            if v.completed <= before || v.phase == Phase::AtServer {
                return true;
            }
            if let Some(step) = steps.get_mut(i) {
                step.result = if step.result == RUNNING {
                    format!("{} (answered after the next point)", v.result_text())
                } else {
                    v.result_text()
                };
            }
            false
        });
    }

    /// Waits until the step released on `key` has its reply, or waits in the server, or the
    /// step timeout passes: `(seen blocked, result)`.
    fn follow(&mut self, key: Key, completed_before: u64, store: StoreKind) -> (bool, String) {
        let until = (Instant::now() + self.step_timeout).min(self.deadline);
        // Most replies come well within this: the server is asked whether the step waits for
        // a lock only after it, not once per step.
        let ask_from = Instant::now() + LOCK_ASK_AFTER;
        loop {
            // The hub's version before the look, so a reply that lands after it wakes the wait.
            let version = self.hubs[key.0].version();
            // A session that closed is read from its last view: a reply delivered just before
            // the connection closed still shows its result.
            let Some(v) = self.hubs[key.0].session(key.1) else {
                return (false, "connection closed".into());
            };
            if v.completed > completed_before && v.phase != Phase::AtServer {
                return (false, v.result_text());
            }
            if !self.hubs[key.0].is_open(key.1) {
                return (false, "connection closed".into());
            }
            let now = Instant::now();
            if store == StoreKind::Postgres && v.phase == Phase::AtServer && now >= ask_from {
                if let Some(pid) = v.backend_pid {
                    if !self.blocked(&[pid]).is_empty() {
                        return (true, "waiting for a lock".into());
                    }
                }
            }
            if now >= until {
                return (false, RUNNING.into());
            }
            let wake = if now < ask_from {
                ask_from
            } else {
                now + Duration::from_millis(2)
            }
            .min(until);
            self.hubs[key.0].wait_change(version, wake);
        }
    }

    /// Where every racer is, tying new sessions to racers.
    ///
    /// A session that holds a step while no racer owns it is tied to the racer busy outside
    /// the store. The tie is a guess (counted, and kept in `guesses`) when several racers are
    /// busy, or when that racer owns another open session of the same store inside a
    /// transaction (status `T` or `E`): a request in the middle of a transaction goes on on
    /// its own connection, so the new one is most likely the service's own (a pool refilling
    /// itself after a lost connection, a health check).
    fn locate(
        &mut self,
        racers: &dyn Racers,
        views: &[(Key, SessionView)],
        owner: &mut HashMap<Key, usize>,
        guesses: &mut HashSet<Key>,
        out: &mut WaveSchedule,
    ) -> Vec<Where> {
        let n = racers.count();
        let finished: Vec<bool> = (0..n).map(|i| racers.finished(i)).collect();
        let mut wheres: Vec<Where> = (0..n)
            .map(|i| {
                if finished[i] {
                    Where::Finished
                } else {
                    Where::Busy
                }
            })
            .collect();
        let mut at_server_pids: Vec<(usize, Key, i32)> = Vec::new();
        // Sessions with a known, unfinished owner first.
        let mut orphans: Vec<Key> = Vec::new();
        for (k, v) in views {
            match owner.get(k) {
                Some(&o) if !finished[o] => match v.phase {
                    Phase::Held => wheres[o] = Where::Held(*k),
                    Phase::AtServer => {
                        if !matches!(wheres[o], Where::Held(_)) {
                            wheres[o] = Where::AtServer(*k);
                            if let Some(pid) = v.backend_pid {
                                at_server_pids.push((o, *k, pid));
                            }
                        }
                    }
                    Phase::Idle => {}
                },
                _ if v.phase == Phase::Held => orphans.push(*k),
                _ => {}
            }
        }
        for k in orphans {
            let busy: Vec<usize> = (0..n).filter(|&r| wheres[r] == Where::Busy).collect();
            match busy.first() {
                Some(&r) => {
                    let in_transaction_elsewhere = views.iter().any(|(other, v)| {
                        *other != k
                            && other.0 == k.0
                            && owner.get(other) == Some(&r)
                            && matches!(v.tx_status, Some('T' | 'E'))
                            && self.hubs[other.0].is_open(other.1)
                    });
                    if busy.len() > 1 || in_transaction_elsewhere {
                        out.guessed += 1;
                        guesses.insert(k);
                    }
                    owner.insert(k, r);
                    wheres[r] = Where::Held(k);
                }
                // No racer in flight: a step on a session of a racer that answered less than
                // `after_answer` ago (or, on a session no racer owns, of the only such racer)
                // is that racer's, sent after its answer (an answer stored late), and is
                // scheduled as its step.
                None => match owner
                    .get(&k)
                    .copied()
                    .filter(|&o| self.lingers(racers, o))
                    .or_else(|| {
                        let lingering: Vec<usize> =
                            (0..n).filter(|&r| self.lingers(racers, r)).collect();
                        (lingering.len() == 1 && !owner.contains_key(&k)).then(|| lingering[0])
                    }) {
                    Some(o) => {
                        owner.insert(k, o);
                        wheres[o] = Where::Held(k);
                        out.after_answer += 1;
                    }
                    None => {
                        out.unowned += 1;
                        self.hubs[k.0].release(k.1);
                    }
                },
            }
        }
        let pids: Vec<i32> = at_server_pids.iter().map(|x| x.2).collect();
        let blocked = self.blocked(&pids);
        for (o, k, pid) in at_server_pids {
            if blocked.contains(&pid) && wheres[o] == Where::AtServer(k) {
                wheres[o] = Where::Blocked(k);
            }
        }
        wheres
    }
}
