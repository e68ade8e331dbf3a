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

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::explore::{ChoicePoint, Chooser};
use super::hub::{Hub, Phase, SessionView, StoreKind};

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
    /// Waits until the version differs from `seen` or `deadline` passes; returns the version
    /// ([`Hub::wait_change`]).
    fn wait_change(&self, seen: u64, deadline: Instant) -> u64;
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
    fn wait_change(&self, seen: u64, deadline: Instant) -> u64 {
        (**self).wait_change(seen, deadline)
    }
    fn lost(&self) -> Option<String> {
        (**self).lost()
    }
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
    /// The server's answer once in: transaction status (`I`, `T`, `E`), the error, or
    /// `running` when it was still at the server when the next point came.
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
    /// Why the wave was not conducted as declared, if it was not.
    pub problem: Option<String>,
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
}

type Key = (usize, u64);

/// Where each racer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Where {
    Finished,
    Held(Key),
    AtServer(Key),
    Blocked(Key),
    Busy,
}

impl Conductor<'_> {
    fn views(&self) -> Vec<(Key, SessionView)> {
        self.hubs
            .iter()
            .enumerate()
            .flat_map(|(h, hub)| hub.view().1.into_iter().map(move |v| ((h, v.id), v)))
            .collect()
    }

    fn wait_a_little(&self, until: Instant) {
        // The hubs signal every change of theirs; a racer's answer and a server-side lock
        // wait are not signalled, so the wait is short: an observed-condition poll.
        let until = until.min(Instant::now() + Duration::from_millis(2));
        if let Some(h) = self.hubs.first() {
            let (v, _) = h.view();
            h.wait_change(v, until);
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
    pub fn run(&mut self, racers: &dyn Racers, mut plan: Plan<'_>) -> WaveSchedule {
        let n = racers.count();
        let mut out = WaveSchedule {
            start: vec![None; n],
            ..WaveSchedule::default()
        };
        for h in &self.hubs {
            h.begin();
        }
        let mut owner: HashMap<Key, usize> = HashMap::new();
        for i in 0..n {
            racers.go(i);
            let began = Instant::now();
            let until = (began + self.start_timeout).min(self.deadline);
            out.start[i] = Some(loop {
                let fresh = self.views().into_iter().find(|(k, v)| {
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
                    break Start::NotSeen {
                        waited_ms: u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX),
                    };
                }
                self.wait_a_little(until);
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
        'wave: loop {
            let point_started = Instant::now();
            let (wheres, views, quiescent) = loop {
                let views = self.views();
                let wheres = self.locate(racers, &views, &mut owner, &mut out);
                if wheres.iter().all(|w| *w == Where::Finished) {
                    break 'wave;
                }
                let quiescent = wheres
                    .iter()
                    .all(|w| matches!(w, Where::Finished | Where::Held(_) | Where::Blocked(_)));
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
                self.wait_a_little(self.deadline);
            };
            let waited = point_started.elapsed();
            let enabled: Vec<usize> = (0..n)
                .filter(|&r| matches!(wheres[r], Where::Held(_)))
                .collect();
            let chosen = chooser.choose(first_index + out.points.len(), &enabled, last);
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
            });
            out.waited_us += u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
            self.hubs[key.0].release(key.1);
            last = Some(chosen);
            let (blocked, result) = self.follow(key, view.completed, view.store);
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
        self.release_all();
        out
    }

    /// Waits until the step released on `key` has its reply, or waits in the server, or the
    /// step timeout passes: `(seen blocked, result)`.
    fn follow(&mut self, key: Key, completed_before: u64, store: StoreKind) -> (bool, String) {
        let until = (Instant::now() + self.step_timeout).min(self.deadline);
        loop {
            let view = self.hubs[key.0]
                .view()
                .1
                .into_iter()
                .find(|v| v.id == key.1);
            let Some(v) = view else {
                return (false, "connection closed".into());
            };
            if v.completed > completed_before && v.phase != Phase::AtServer {
                let result = match (&v.last_error, v.tx_status) {
                    (Some(e), _) => e.clone(),
                    (None, Some(s)) => s.to_string(),
                    (None, None) => "ok".into(),
                };
                return (false, result);
            }
            if store == StoreKind::Postgres && v.phase == Phase::AtServer {
                if let Some(pid) = v.backend_pid {
                    if !self.blocked(&[pid]).is_empty() {
                        return (true, "waiting for a lock".into());
                    }
                }
            }
            if Instant::now() >= until {
                return (false, "running".into());
            }
            self.wait_a_little(until);
        }
    }

    /// Where every racer is, tying new sessions to racers.
    fn locate(
        &mut self,
        racers: &dyn Racers,
        views: &[(Key, SessionView)],
        owner: &mut HashMap<Key, usize>,
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
                    if busy.len() > 1 {
                        out.guessed += 1;
                    }
                    owner.insert(k, r);
                    wheres[r] = Where::Held(k);
                }
                None => {
                    out.unowned += 1;
                    self.hubs[k.0].release(k.1);
                }
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
