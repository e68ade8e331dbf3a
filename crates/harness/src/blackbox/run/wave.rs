//! One wave: its requests built and checked, sent on one thread each, released by the
//! scenario's barrier (directly, HTTP-held, a server lock, `CLIENT PAUSE` or the
//! interposer's conductor), then the retry phase and the key-TTL wait.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::WAIT_NOTICE;
use crate::barrier::server::{gather, Among, Controller, Gathered};
use crate::barrier::Barrier;
use crate::blackbox::check;
use crate::blackbox::client::{self, ClientError, Held, HttpAnswer, HttpRequest};
use crate::blackbox::excerpt;
use crate::blackbox::format::request::{build, Built};
use crate::blackbox::format::{FaultAt, FaultKind, TargetRacer, TargetScenario};
use crate::blackbox::rules::{classify, AnswerKind};
use crate::blackbox::service::TargetError;
use crate::blackbox::{AnswerSeen, Attempt, RacerRun, WaveEvidence};
use crate::scenario::timeline::ms;
use crate::scenario::timeline::now_us;

/// Builds every racer's request of every wave, as [`race`] will send them, and checks each
/// with [`client::check`] before the first is sent.
///
/// Will return `Err` ([`TargetError::Setup`]) naming the first racer whose request cannot be
/// sent; nothing was sent then.
pub(super) fn check_requests(
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

/// Classifies an answer (or a transport error) into an attempt. The bool says whether a
/// transport error was seen (a retry may be safe).
pub(super) fn attempt_of(
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

/// What a racer's retry phase tells its wave's conductor, and what it waits for.
pub(super) struct RetryWatch<'a> {
    /// Counts its "in progress" answers (each retry after one is a yield).
    pub(super) yields: &'a std::sync::atomic::AtomicUsize,
    /// Set while it sleeps in its backoff or waits for a restart.
    pub(super) resting: &'a AtomicBool,
    /// Counts its attempts, each before it is sent.
    pub(super) sent: &'a std::sync::atomic::AtomicUsize,
    /// With a kill fault in the wave: the restarts a retry waits for.
    pub(super) restarts: Option<&'a super::crash::Restarts>,
}

/// The longest a racer's retry waits for a killed service to be started again: above any
/// `ready_timeout_ms` a file would give; the restart ends the wait as soon as it is done.
const RESTART_WAIT_BOUND: Duration = Duration::from_secs(120);

/// Re-sends `request` while the last answer is retryable and attempts remain; with `restarts`
/// (a wave with a kill fault), transport errors are retried too, each retry once no service
/// is down.
pub(super) fn retry_phase(
    scenario: &TargetScenario,
    request: &HttpRequest,
    timeout: Duration,
    attempts: &mut Vec<Attempt>,
    mut transport: bool,
    watch: RetryWatch<'_>,
) {
    let RetryWatch {
        yields,
        resting,
        sent,
        restarts,
    } = watch;
    let t = &scenario.target;
    // A killed service's clients see their connection reset: a client retries that with the
    // same key once the service is back, and that retry is what the kill is for.
    let killed = restarts.is_some();
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
            || (transport && (t.retry.transport_errors || killed));
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
        resting.store(true, Ordering::SeqCst);
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(Duration::from_millis(t.retry.max_backoff_ms));
        if let Some(r) = restarts {
            r.wait(RESTART_WAIT_BOUND);
        }
        resting.store(false, Ordering::SeqCst);
        sent.fetch_add(1, Ordering::SeqCst);
        let started = now_us();
        let (a, tr) = attempt_of(scenario, started, client::send(request, timeout));
        transport = tr;
        attempts.push(a);
    }
}

/// How a wave's first requests are sent.
pub(super) enum Release<'a> {
    /// Sent as they are.
    Direct,
    /// Sent as they are, held by a lock the controller holds.
    Server(Box<Controller>, &'a mut postgres::Client),
    /// Written but for the last byte, released together.
    Http,
    /// Sent one by one, each held at the interposer at its first command, then conducted.
    /// With a kill among the faults, the restarts the racers' retries wait for.
    Interposed(
        Box<(
            crate::interpose::conduct::Conductor<'a>,
            crate::interpose::conduct::Plan<'a>,
            Vec<crate::interpose::steps::StepFault>,
            Option<&'a super::crash::Restarts>,
        )>,
    ),
    /// Sent while the Redis server's writes are paused, released by `CLIENT UNPAUSE` once
    /// every racer is seen blocked on a write ([`crate::blackbox::pause`]).
    RedisPause(&'a mut crate::blackbox::pause::PauseController),
}

/// The racers of an interposed wave as the conductor sees them: let go one by one, answered,
/// finished.
pub(super) struct Gate<'a> {
    go: Mutex<Vec<bool>>,
    let_go: std::sync::Condvar,
    finished: Vec<AtomicBool>,
    firsts: &'a FirstAnswers,
    /// Per racer, the "in progress" answers it is retrying after.
    yields: Vec<std::sync::atomic::AtomicUsize>,
    /// Per racer, whether it rests in the runner's own wait (backoff, a restart).
    resting: Vec<AtomicBool>,
    /// Per racer, the attempts it has started.
    sent: Vec<std::sync::atomic::AtomicUsize>,
    /// Per racer, when it finished.
    finished_at: Vec<Mutex<Option<Instant>>>,
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
    fn resting(&self, i: usize) -> bool {
        self.resting[i].load(Ordering::SeqCst)
    }
    fn finished_since(&self, i: usize) -> Option<Duration> {
        self.finished_at[i]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map(|t| t.elapsed())
    }
    fn retrying(&self, i: usize) -> bool {
        self.sent[i].load(Ordering::SeqCst) > 1
    }
}

/// Runs one wave; returns its evidence and each racer's run, in `indices` order.
///
/// Long because it is one `thread::scope`: the racers' threads, the release (HTTP, lock
/// barrier, Redis pause or interposer) and the end of the wave all run inside it, in order.
pub(super) fn run_wave(
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
        resting: (0..n).map(|_| AtomicBool::new(false)).collect(),
        sent: (0..n)
            .map(|_| std::sync::atomic::AtomicUsize::new(0))
            .collect(),
        finished_at: (0..n).map(|_| Mutex::new(None)).collect(),
    };
    let mut evidence = wave_evidence(scenario, wave, n, &release);
    let restarts = match &release {
        Release::Interposed(conducted) => conducted.3,
        _ => None,
    };
    let mut release = release;
    // The pause comes before any request leaves; when it cannot be taken the racers run free
    // and the wave's problem says why (the run cannot PASS).
    let mut paused = false;
    if let Release::RedisPause(controller) = &mut release {
        match controller.pause(barrier_timeout) {
            Ok(()) => paused = true,
            Err(e) => evidence.problem = Some(e.to_string()),
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
                    gate.sent[i].fetch_add(1, Ordering::SeqCst);
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
                        RetryWatch {
                            yields: &gate.yields[i],
                            resting: &gate.resting[i],
                            sent: &gate.sent[i],
                            restarts,
                        },
                    );
                    *gate.finished_at[i]
                        .lock()
                        .unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
                    gate.finished[i].store(true, Ordering::SeqCst);
                    attempts
                })
            })
            .collect();
        if let Release::Interposed(conducted) = release {
            let (mut conductor, plan, faults, _) = *conducted;
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
pub(super) fn wave_evidence(
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
        service_exits: Vec::new(),
    }
}

/// Each racer's first answer as the barrier watches it: done, "in progress", and a short text.
pub(super) struct FirstAnswers {
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
pub(super) struct HttpRelease {
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
pub(super) struct ServerHold<'a> {
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
pub(super) fn interposed_problem(
    scenario: &TargetScenario,
    built: &[(usize, Built, String)],
    firsts: &FirstAnswers,
    schedule: &crate::interpose::conduct::WaveSchedule,
) -> Option<String> {
    use crate::interpose::conduct::Start;
    // A wave of one followed, not raced: whether its request reached the store is no matter.
    if schedule.lone {
        return schedule.problem.clone();
    }
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
                    "{name}'s request was answered ({answer}) before any command of it reached an interposed store: its key store is not behind the interposer ({{database_url}}, {{redis_url}}), it answered from memory, or its PostgreSQL driver ends each statement with Flush and sends Sync later (pg8000's native interface), which the interposer does not hold as a step"
                ));
            }
            Some(Start::NotSeen { waited_ms }) if !schedule.queued_behind.is_empty() => {
                return Some(format!(
                    "{name}'s request was neither answered nor seen at an interposed store within {waited_ms} ms, and {}: the service sends several requests' commands over one store connection (a shared client), so {name}'s command waits behind another racer's held step; the interposer holds a connection's commands one at a time and cannot tell its requests apart. Give each request its own connection for the test (a pool), or race it with a barrier that does not hold store commands ([barrier] kind = \"http\")",
                    schedule.queued_behind.join("; ")
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
pub(super) fn early_reason(
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
pub(super) fn short_reason(seen: usize, n: usize, lock: &str, timeout: Duration) -> String {
    format!(
        "{seen} of {n} requests seen waiting on {lock} within {} ms: the others are queued before \
         the database (a connection pool smaller than the racers per instance, a worker limit, \
         an application-level lock) or wait on something else",
        timeout.as_millis()
    )
}

/// The conductor's faults for the wave of `indices` (scenario racer indices, in wave order):
/// each `[[fault]]` on one of them, its racer as the wave's index.
pub(super) fn step_faults(
    scenario: &TargetScenario,
    indices: &[usize],
) -> Vec<crate::interpose::steps::StepFault> {
    use crate::interpose::steps::{FaultStep, StepFault};
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
                cut: match f.kind {
                    FaultKind::Pause { .. } => crate::interpose::Action::Forward,
                    _ => f.cut.action(),
                },
                kill: f.kind == FaultKind::Kill,
                hold: match f.kind {
                    FaultKind::Pause { hold_ms } => Some(Duration::from_millis(hold_ms)),
                    _ => None,
                },
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
///
/// After a wave in which a service was killed (`killed`), the same is done without a
/// `lock_ttl_ms` too, for [`check::KILL_GRACE_MS`]: a key the crash did not leave stuck is answered
/// once the requests still in flight finish, and a retry phase that gave up early (its
/// attempts spent while another racer held the key) is not taken for a stuck key.
pub(super) fn wait_out_ttl(
    scenario: &TargetScenario,
    built: &[(usize, Built, String)],
    attempts: &mut [Vec<Attempt>],
    killed: bool,
) -> Vec<crate::blackbox::TtlWait> {
    let t = &scenario.target;
    let Some(ttl) = t.lock_ttl_ms.or(killed.then_some(check::KILL_GRACE_MS)) else {
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
        out.push(crate::blackbox::TtlWait {
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

/// The requests of one wave's racers (`indices`), each with its endpoint: the one the racer
/// names (`via`), else the endpoints in turn by racer number.
pub(super) fn build_wave(
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
pub(super) fn racer_run(
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
        intent_sha256: b.intent_sha256,
        request: format!(
            "{} {}",
            b.request.method,
            b.request.url.strip_prefix(&base).unwrap_or(&b.request.url)
        ),
        endpoint: base,
        attempts,
    }
}
