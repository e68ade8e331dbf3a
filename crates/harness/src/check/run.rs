//! `check`: histories generated, each sent to the service as a black-box scenario on one
//! shared set-up and judged by the model; the first failure shrunk, replayed and written.
//!
//! A history becomes a scenario ([`scenario_for`]): step `i` is wave `i + 1`, a concurrent
//! group is a wave of its requests released by the file's barrier (with the interposer, in an
//! order a PCT chooser seeded from the check's seed picks), a settle is `settle_after` on the
//! wave before it. Each run has a fresh `{run}`, so no history meets another's keys.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::SeedableRng;

use super::bodies::template_of;
use super::file::CheckFile;
use super::generate::{generate, OpKind, Pools};
use super::shrink::shrink;
use crate::blackbox::format::{BarrierKind, ModelExpect, TargetRacer, TargetScenario};
use crate::blackbox::rules::AnswerKind;
use crate::blackbox::run::{RunOptions, Session};
use crate::blackbox::service::TargetError;
use crate::blackbox::TargetRun;
use crate::oracle::history::{Body, History, Step};
use crate::verdict::Verdict;

/// The scenario that sends `history` against `file`'s target.
pub fn scenario_for(file: &CheckFile, history: &History) -> TargetScenario {
    let mut s = file.template.clone();
    let scopes = file.scopes();
    let endpoints = s.target.endpoints();
    let mut racers = Vec::new();
    let mut settle_after = Vec::new();
    let mut wave = 0u32;
    for (i, step) in history.steps.iter().enumerate() {
        if let Step::Settle = step {
            if wave > 0 && !settle_after.contains(&wave) {
                settle_after.push(wave);
            }
            continue;
        }
        wave += 1;
        let many = step.requests().len() > 1;
        for (j, r) in step.requests().iter().enumerate() {
            let name = if many {
                format!("s{}{}", i + 1, char::from(b'a' + (j % 26) as u8))
            } else {
                format!("s{}", i + 1)
            };
            let expect = match r.body {
                Body::Invalid => [AnswerKind::Rejected, AnswerKind::Conflict].into(),
                Body::Valid { .. } => Default::default(),
            };
            racers.push(TargetRacer {
                group: name.clone(),
                name,
                n: racers.len() + 1,
                scope: scopes.get(r.scope).cloned().flatten(),
                key: format!("k{}", r.key + 1),
                body: template_of(&file.body, file.invalid_body.as_ref(), r.body),
                via: (endpoints.len() > 1)
                    .then(|| endpoints.get(r.instance).cloned())
                    .flatten(),
                wave,
                expect,
            });
        }
    }
    // A trailing settle is the one after the last answer, which every history has.
    settle_after.retain(|w| *w < wave);
    s.racers = racers;
    s.counts = Vec::new();
    s.faults = Vec::new();
    s.model = Some(ModelExpect {
        settle_ms: file.settle_ms,
        settle_after,
    });
    s
}

/// How many times a history that did not run as declared is sent again before it counts as
/// PENDING.
pub const PENDING_RESENDS: usize = 2;

/// Sends histories to one set-up.
pub struct Runner<'a> {
    file: &'a CheckFile,
    opts: &'a RunOptions,
    session: Session,
    seed: u64,
    runs: u64,
}

impl<'a> Runner<'a> {
    /// Sets the file's target up once (database, services, interposers, barrier lock).
    ///
    /// Will return `Err` for what stops a run before anything is sent.
    pub fn open(file: &'a CheckFile, opts: &'a RunOptions, seed: u64) -> Result<Self, TargetError> {
        // The widest wave a history has: a group of four requests.
        let mut widest = file.template.clone();
        let probe = widest.racers[0].clone();
        widest.racers = (0..4)
            .map(|i| TargetRacer {
                name: format!("probe-{i}"),
                ..probe.clone()
            })
            .collect();
        Ok(Runner {
            session: Session::open(&widest, opts)?,
            file,
            opts,
            seed,
            runs: 0,
        })
    }

    /// Sends `history` once (fresh `{run}`) and judges it.
    ///
    /// Will return `Err` for what stops the run before anything is sent.
    pub fn run(&mut self, history: &History) -> Result<TargetRun, TargetError> {
        let scenario = scenario_for(self.file, history);
        self.runs += 1;
        if scenario.barrier.kind == BarrierKind::Interposer {
            let mut chooser = crate::interpose::explore::Pct::new(self.seed, self.runs, 4, 24, 2);
            self.session.run(&scenario, self.opts, Some(&mut chooser))
        } else {
            self.session.run(&scenario, self.opts, None)
        }
    }
}

/// How `check` runs (the command line's flags over the file's `[check]`).
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// The black-box runner's options.
    pub run: RunOptions,
    /// `--seed`.
    pub seed: Option<u64>,
    /// `--histories`.
    pub histories: Option<usize>,
    /// `--budget` (seconds).
    pub budget_s: Option<u64>,
    /// `--shrink-runs`.
    pub shrink_runs: Option<usize>,
    /// `--replays`.
    pub replays: Option<usize>,
    /// Where the minimal failing history's scenario file goes (default
    /// `ticketflow-check/<name>-seed<seed>.toml`).
    pub out: Option<PathBuf>,
    /// Called with each history's line as soon as it is judged (the CLI prints progress, or a
    /// JSON line per history under `--json`).
    pub on_history: Option<fn(&HistoryLine)>,
}

/// What a check covered.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Coverage {
    /// The seed (`--seed` reproduces the run).
    pub seed: u64,
    /// Histories sent.
    pub histories: usize,
    /// Histories that did not run as declared (PENDING).
    pub pending: usize,
    /// Requests sent (first attempts; retries aside).
    pub requests: usize,
    /// Operations by kind.
    pub operations: BTreeMap<String, usize>,
    /// Concurrent groups by size (2, 3, 4 requests).
    pub group_sizes: BTreeMap<usize, usize>,
    /// Interposed schedules explored: each group of each run of a history with the
    /// interposer barrier (`[check] schedules` runs per history).
    pub schedules: usize,
    /// Recounts after a settle time (one per history, plus settles inside histories).
    pub settles: usize,
    /// The settle time, milliseconds.
    pub settle_ms: u64,
    /// Count queries the file declares (`[target.count]`); with none, nothing is recounted
    /// after a settle and only answers are judged.
    pub count_queries: usize,
    /// Seconds spent.
    pub seconds: f64,
    /// What the model did not cover here, in words.
    pub not_covered: Vec<String>,
}

impl Coverage {
    /// The coverage as lines a person reads.
    pub fn lines(&self) -> Vec<String> {
        let ops: Vec<String> = self
            .operations
            .iter()
            .map(|(k, n)| format!("{n} {k}"))
            .collect();
        let sizes: Vec<String> = self
            .group_sizes
            .iter()
            .map(|(k, n)| format!("{n}×{k}"))
            .collect();
        let mut lines = vec![
            format!(
                "seed {} (ticketflow check FILE --seed {} reproduces it); {} {} ({} did not run), {} requests, {:.1} s",
                self.seed,
                self.seed,
                self.histories,
                if self.histories == 1 { "history" } else { "histories" },
                self.pending,
                self.requests,
                self.seconds
            ),
            format!("operations: {}", ops.join(", ")),
            format!(
                "concurrent groups: {} ({}); schedules explored: {}; faults: none",
                self.group_sizes.values().sum::<usize>(),
                if sizes.is_empty() {
                    "none".to_string()
                } else {
                    sizes.join(", ")
                },
                self.schedules
            ),
            if self.count_queries == 0 {
                "effects not counted: [target.count] has no query, so only answers were judged (a service that answers right but writes twice passes)".to_string()
            } else {
                format!(
                    "effects recounted {} time(s) after a settle time of {} ms",
                    self.settles, self.settle_ms
                )
            },
        ];
        for n in &self.not_covered {
            lines.push(format!("not covered: {n}"));
        }
        lines
    }

    /// Counts `history`, generated from `operations`; `schedules`: how many interposed runs
    /// (each in its own order of every group's steps) it had, 0 without the interposer.
    fn add(&mut self, history: &History, operations: &[OpKind], schedules: usize) {
        self.histories += 1;
        self.requests += history.request_count();
        for op in operations {
            *self.operations.entry(op_name(*op).into()).or_default() += 1;
        }
        for s in &history.steps {
            match s {
                Step::Group(rs) => {
                    *self.group_sizes.entry(rs.len()).or_default() += 1;
                    self.schedules += schedules;
                }
                Step::Settle => self.settles += 1,
                Step::One(_) => {}
            }
        }
        if self.settle_ms > 0 {
            self.settles += 1;
        }
    }
}

/// An operation kind's name in coverage lines.
pub fn op_name(op: OpKind) -> &'static str {
    match op {
        OpKind::First => "first request",
        OpKind::Retry => "retry",
        OpKind::Reshaped => "reordered or re-spaced",
        OpKind::OtherBody => "another body under a used key",
        OpKind::OtherScope => "a used key from another scope",
        OpKind::OtherKey => "another key in a used scope",
        OpKind::InvalidThenValid => "invalid then valid",
        OpKind::RefusedThenOriginal => "refused then original",
        OpKind::Group => "concurrent group",
        OpKind::Settle => "settle",
    }
}

/// The minimal failing history and how it was found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Failure {
    /// 1-based number of the history that failed first.
    pub history: usize,
    /// Its requests.
    pub original_requests: usize,
    /// The minimal history, as numbered lines with each request's answer.
    pub steps: Vec<String>,
    /// The minimal history's requests.
    pub requests: usize,
    /// Why it fails (the failing run's reason).
    pub reason: String,
    /// Re-runs spent shrinking; and whether the budget ran out first.
    pub shrink_runs: usize,
    /// Whether shrinking stopped at its budget (it may shrink further).
    pub shrink_budget_spent: bool,
    /// Replays of the minimal history that failed, of `replays`.
    pub replay_failures: usize,
    /// Replays run.
    pub replays: usize,
    /// The scenario file written, if it was.
    pub file: Option<PathBuf>,
    /// Why the scenario file could not be written.
    pub file_error: Option<String>,
    /// The requests of one failing replay as curl commands.
    pub curl: Vec<String>,
    /// The failing replay's schedule id, when interposed.
    pub schedule_id: Option<String>,
    /// The failing run of the minimal history (for the report's sequence diagram).
    #[serde(skip)]
    pub run: TargetRun,
}

/// A check's result.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CheckOutcome {
    /// The file.
    pub file: String,
    /// PASS, FAIL or PENDING.
    pub verdict: Verdict,
    /// Why, for FAIL and PENDING.
    pub reason: Option<String>,
    /// What was covered.
    pub coverage: Coverage,
    /// The minimal failing history.
    pub failure: Option<Failure>,
    /// Each history's verdict and steps, in order (for `--json`).
    pub histories: Vec<HistoryLine>,
}

/// One history in the outcome.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HistoryLine {
    /// 1-based number.
    pub number: usize,
    /// Its verdict.
    pub verdict: Verdict,
    /// Why, for FAIL and PENDING.
    pub reason: Option<String>,
    /// Its steps in words.
    pub steps: Vec<String>,
    /// The run id its keys and scopes carry.
    pub run_id: Option<String>,
}

/// The steps of `history` with each request's final answer from `run`.
pub fn steps_with_answers(
    history: &History,
    scopes: &[Option<String>],
    run: &TargetRun,
) -> Vec<String> {
    let mut lines = history.describe_with(scopes);
    let mut wave = 0;
    for (i, step) in history.steps.iter().enumerate() {
        if let Step::Settle = step {
            continue;
        }
        wave += 1;
        let answers: Vec<String> = run
            .racers
            .iter()
            .filter(|r| r.wave == wave)
            .map(|r| r.answer_line())
            .collect();
        if let Some(line) = lines.get_mut(i) {
            line.push_str(&format!("  → {}", answers.join(" | ")));
        }
    }
    lines
}

/// Runs a check: histories until one fails, `histories` have run, or the budget is spent;
/// a failure is shrunk, replayed `replays` times, and written as a scenario file.
///
/// Will return `Err` for what stops the first run before anything is sent (an unreachable
/// service or database, a request that cannot be built).
pub fn check(file: &CheckFile, opts: &CheckOptions) -> Result<CheckOutcome, TargetError> {
    let seed = opts.seed.or(file.seed).unwrap_or_else(rand::random);
    let histories = opts.histories.unwrap_or(file.histories).max(1);
    let budget = Duration::from_secs(opts.budget_s.unwrap_or(file.budget_s).max(1));
    let interposed = file.template.barrier.kind == BarrierKind::Interposer;
    let schedules = file.runs_per_history();
    let scopes = file.scopes();
    let pools = Pools {
        scopes: scopes.len(),
        keys: file.keys,
        bodies: file.bodies,
        instances: file.template.target.endpoints().len().max(1),
        operations: file.operations,
        invalid: file.invalid_body.is_some(),
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let mut coverage = Coverage {
        seed,
        settle_ms: file.settle_ms,
        count_queries: file.template.target.counts.len(),
        ..Coverage::default()
    };
    let started = Instant::now();
    let mut runner = Runner::open(file, &opts.run, seed)?;
    let mut lines = Vec::new();
    let mut failing: Option<(usize, History, TargetRun)> = None;
    let mut first_pending: Option<String> = None;
    for n in 1..=histories {
        if n > 1 && started.elapsed() >= budget {
            break;
        }
        let g = generate(&pools, &mut rng);
        // A history not run as declared (another session waited on the barrier's lock, a
        // request answered before the release) is sent again, fresh, up to twice. With the
        // interposer it runs `schedules` times, each in another order of its steps, until one
        // fails.
        let mut run = runner.run(&g.history)?;
        let mut ran = 1;
        loop {
            let mut resends = 0;
            while run.verdict == Verdict::Pending && resends < PENDING_RESENDS {
                run = runner.run(&g.history)?;
                resends += 1;
            }
            if run.verdict != Verdict::Pass || ran >= schedules {
                break;
            }
            run = runner.run(&g.history)?;
            ran += 1;
        }
        coverage.add(&g.history, &g.operations, if interposed { ran } else { 0 });
        let steps = steps_with_answers(&g.history, &scopes, &run);
        let line = HistoryLine {
            number: n,
            verdict: run.verdict,
            reason: run.reason.clone(),
            steps,
            run_id: run.evidence.as_ref().map(|e| e.run_id.clone()),
        };
        if let Some(tell) = opts.on_history {
            tell(&line);
        }
        lines.push(line);
        match run.verdict {
            Verdict::Fail => {
                failing = Some((n, g.history, run));
                break;
            }
            Verdict::Pending => {
                coverage.pending += 1;
                first_pending.get_or_insert_with(|| run.reason.clone().unwrap_or_default());
            }
            Verdict::Pass => {}
        }
    }
    coverage.not_covered = not_covered(file);
    let failure = match failing {
        Some((n, history, run)) => Some(minimise(file, opts, &mut runner, seed, n, history, run)?),
        None => None,
    };
    coverage.seconds = started.elapsed().as_secs_f64();
    let (verdict, reason) = match (&failure, first_pending) {
        (Some(f), _) => (
            Verdict::Fail,
            Some(format!(
                "history {} failed; minimal history of {} request(s): {}",
                f.history, f.requests, f.reason
            )),
        ),
        (None, Some(p)) => (
            Verdict::Pending,
            Some(format!(
                "{} of {} histories did not run as declared; first: {p}",
                coverage.pending, coverage.histories
            )),
        ),
        (None, None) => (Verdict::Pass, None),
    };
    Ok(CheckOutcome {
        file: file.path.display().to_string(),
        verdict,
        reason,
        coverage,
        failure,
        histories: lines,
    })
}

/// What the model and this file did not cover, in words.
fn not_covered(file: &CheckFile) -> Vec<String> {
    let mut out = vec![
        "faults at a step of a group (no kill, pause or cut is generated)".to_string(),
        "replay marking (a replay's Idempotent-Replayed header is not judged here)".to_string(),
        format!(
            "effects written later than settle_ms = {} ms after a history's last answer (raise settle_ms to wait longer)",
            file.settle_ms
        ),
        "members the body variants leave as they are (each variant changes the request body's first string member in name order, else its first number): a fingerprint that ignores another member passes"
            .to_string(),
    ];
    if file.invalid_body.is_none() {
        out.push("invalid bodies ([check] invalid_body is not given)".into());
    }
    if file.scopes().len() < 2 {
        out.push("keys shared across scopes (the target declares fewer than 2 scopes)".into());
    }
    if file.template.target.counts.is_empty() {
        out.push("effects ([target.count] has no query: only answers were judged)".into());
    }
    if !file.template.target.replay.same_answer {
        out.push("replays' bodies (same_answer = false: answers not compared)".into());
    }
    if file.template.target.endpoints().len() < 2 {
        out.push("requests spread over instances (one endpoint)".into());
    }
    out
}

/// Shrinks a failing history, replays the minimal one and writes its scenario file.
fn minimise(
    file: &CheckFile,
    opts: &CheckOptions,
    runner: &mut Runner<'_>,
    seed: u64,
    number: usize,
    history: History,
    run: TargetRun,
) -> Result<Failure, TargetError> {
    let mut last_failing = run;
    let replays = opts.replays.unwrap_or(file.replays);
    // With the interposer a candidate gets as many schedules as a history did: a failure
    // that needs an order of steps is not shrunk away by one unlucky order.
    let schedules = file.runs_per_history();
    let shrunk = shrink(
        &history,
        opts.shrink_runs.unwrap_or(file.shrink_runs),
        |candidate| {
            (0..schedules).any(|_| match runner.run(candidate) {
                Ok(r) if r.verdict == Verdict::Fail => {
                    last_failing = r;
                    true
                }
                _ => false,
            })
        },
    );
    let minimal = shrunk.history;
    let mut replay_failures = 0;
    let mut failing_run: Option<TargetRun> = None;
    for _ in 0..replays {
        let r = runner.run(&minimal)?;
        if r.verdict == Verdict::Fail {
            replay_failures += 1;
            failing_run.get_or_insert(r);
        }
    }
    let run = failing_run.unwrap_or(last_failing);
    let scenario = scenario_for(file, &minimal);
    let header = vec![
        format!(
            "Written by `ticketflow check {}` (seed {seed}, history {number}): the minimal failing history.",
            file.path.display()
        ),
        format!(
            "It failed {replay_failures} of {replays} replays. Replay: ticketflow scenario run THIS_FILE"
        ),
        format!("Why: {}", run.reason.clone().unwrap_or_default()),
    ];
    let text = super::replay::replay_file(file, &scenario, &header);
    let path = opts.out.clone().unwrap_or_else(|| {
        PathBuf::from("ticketflow-check").join(format!("{}-seed{seed}.toml", file.template.name))
    });
    let written = path
        .parent()
        .map_or(Ok(()), |d| {
            if d.as_os_str().is_empty() {
                Ok(())
            } else {
                std::fs::create_dir_all(d)
            }
        })
        .and_then(|()| std::fs::write(&path, &text))
        .map(|()| path.clone())
        .map_err(|e| format!("cannot write {}: {e}", path.display()));
    let (run_id, base_urls, schedule_id) = match &run.evidence {
        Some(e) => (e.run_id.clone(), e.base_urls.clone(), e.schedule_id.clone()),
        None => (String::new(), Vec::new(), None),
    };
    Ok(Failure {
        history: number,
        original_requests: history.request_count(),
        steps: steps_with_answers(&minimal, &file.scopes(), &run),
        requests: minimal.request_count(),
        reason: run.reason.clone().unwrap_or_default(),
        shrink_runs: shrunk.runs,
        shrink_budget_spent: shrunk.budget_spent,
        replay_failures,
        replays,
        file: written.as_ref().ok().cloned(),
        file_error: written.err(),
        curl: super::replay::curl_lines(&scenario, &base_urls, &run_id),
        schedule_id,
        run,
    })
}
