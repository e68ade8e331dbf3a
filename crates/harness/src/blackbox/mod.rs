//! Black-box verification of any idempotent HTTP endpoint (docs/PROTOCOL.md §9): a scenario file with a
//! `[target]` describes the request (any method, path, headers, JSON or raw body), scopes
//! (tenants, users, API keys, each with its own headers), how answers are classified
//! (ordered rules and presets for the IETF draft, Stripe-like services and our own `serve`),
//! where the id is, a retry phase, count queries on the target's database, and the barrier:
//! a table lock or an advisory lock observed in the target's `pg_locks`, or an HTTP-level
//! release for key stores the database cannot see (Redis, memory).
//!
//! - [`format`](mod@format): the file format; [`template`]: placeholders; [`rules`]: classification;
//! - [`client`]: the HTTP/1.1 client (whole requests, or all but the last byte held back);
//! - [`service`]: scratch database and services started for a run;
//! - [`run`]: one run and `--repeat`; [`check`]: the verdict; [`summary`]: the outcome in words;
//! - [`init`]: `ticketflow target init`, the starter scenario set;
//! - [`redis_store`]: Redis counts and the runner's direct Redis connection; [`pause`]: the
//!   `CLIENT PAUSE` barrier.

pub mod check;
pub mod client;
pub mod diagram;
pub mod format;
pub mod history;
pub mod init;
pub mod isolation;
pub mod pause;
pub mod redis_store;
pub mod rules;
pub mod run;
pub mod service;
pub mod summary;
pub mod template;

use serde::Serialize;

pub use format::{is_target_file, TargetScenario};
pub use rules::AnswerKind;
pub use run::{run_repeated, run_target, RunOptions};

use crate::barrier::server::Waiter;
use crate::verdict::{Check, Verdict};

/// One answer as the report shows it (the full body is kept for the checks, not serialised).
#[derive(Debug, Clone, Serialize)]
pub struct AnswerSeen {
    /// HTTP status.
    pub status: u16,
    /// Every response header, as received, in order (the text output shows the ones
    /// [`summary::shown_header`] names).
    pub headers: Vec<(String, String)>,
    /// The first 240 characters of the body.
    pub body_excerpt: String,
    /// The whole body.
    #[serde(skip)]
    pub body: Vec<u8>,
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

/// One attempt of a racer: a request and what came back.
#[derive(Debug, Clone, Serialize)]
pub struct Attempt {
    /// Microseconds since the epoch when the request started (for a held request: when its
    /// last bytes were released).
    pub started_us: u64,
    /// Microseconds since the epoch when the answer (or error) was complete.
    pub finished_us: u64,
    /// The answer, or the transport error in words.
    // A String: a record of what was seen, serialized into the report as the message.
    pub answer: Result<AnswerSeen, String>,
    /// The classification.
    pub kind: AnswerKind,
    /// The rule that decided (`file:line` or `preset ietf`), if any.
    pub rule: Option<String>,
    /// The id, for created and replayed answers.
    pub id: Option<String>,
    /// Why the answer is an error when a rule matched but something was missing (no id), or
    /// why no rule matched.
    pub note: Option<String>,
}

impl Attempt {
    /// An attempt that got no answer: `error` in words, classified `kind` (an error or a
    /// timeout), with `note` saying why; no rule, no id.
    pub(crate) fn unanswered(
        started_us: u64,
        finished_us: u64,
        error: String,
        kind: AnswerKind,
        note: String,
    ) -> Attempt {
        Attempt {
            started_us,
            finished_us,
            answer: Err(error),
            kind,
            rule: None,
            id: None,
            note: Some(note),
        }
    }
}

/// What one racer did.
#[derive(Debug, Clone, Serialize)]
pub struct RacerRun {
    /// Racer name.
    pub name: String,
    /// Its group (the name in the file).
    pub group: String,
    /// Wave.
    pub wave: u32,
    /// Scope name.
    pub scope: Option<String>,
    /// Logical key.
    pub key: String,
    /// The key sent.
    pub wire_key: String,
    /// SHA-256 (hex) of the body bytes sent.
    pub body_sha256: String,
    /// SHA-256 (hex) of the body's intent (its canonical JSON when it is JSON): same intent =
    /// same scope, key and intent, so members reordered or re-spaced are the same body.
    #[serde(skip)]
    pub intent_sha256: String,
    /// Method and path.
    pub request: String,
    /// The base URL it was sent to (a service's or one of `base_urls`).
    pub endpoint: String,
    /// Every attempt, in order (first, retries).
    pub attempts: Vec<Attempt>,
}

impl RacerRun {
    /// The final attempt. Every racer has at least one.
    pub fn last(&self) -> &Attempt {
        self.attempts
            .last()
            .expect("a racer has at least one attempt")
    }

    /// The final answer in a few words: `201 replayed id 7c…`, `409 conflict`, `no answer
    /// timeout`.
    pub fn answer_line(&self) -> String {
        let last = self.last();
        let status = last
            .answer
            .as_ref()
            .map(|a| a.status.to_string())
            .unwrap_or_else(|_| "no answer".into());
        match &last.id {
            Some(id) => format!("{status} {} id {id}", last.kind),
            None => format!("{status} {}", last.kind),
        }
    }

    /// The final classification.
    pub fn kind(&self) -> AnswerKind {
        self.last().kind
    }

    /// The final id.
    pub fn id(&self) -> Option<&str> {
        self.last().id.as_deref()
    }
}

/// How one wave was released.
#[derive(Debug, Clone, Serialize)]
pub struct WaveEvidence {
    /// Wave number.
    pub wave: u32,
    /// Racers in it.
    pub racers: usize,
    /// `table-lock`, `advisory`, `http` or `none` (a wave of one racer is sent as it is).
    pub barrier: String,
    /// The controller's statement, for a server-side barrier.
    pub lock_statement: Option<String>,
    /// The controller's backend pid.
    pub controller_pid: Option<i32>,
    /// Lock requests seen waiting at the last poll before the release.
    pub waits: Vec<Waiter>,
    /// Polls of `pg_locks`.
    pub polls: u32,
    /// Milliseconds from the first request until the barrier was reached.
    pub reached_ms: Option<f64>,
    /// HTTP-level release: connections opened and written but for their last byte.
    pub held: Option<usize>,
    /// HTTP-level release: microseconds between the first and the last release write.
    pub release_spread_us: Option<u64>,
    /// Why the barrier was not proven, if it was not.
    pub problem: Option<String>,
    /// The interposer barrier: how the wave was conducted at the store, step by step.
    pub schedule: Option<crate::interpose::conduct::WaveSchedule>,
    /// The `redis-pause` barrier: the clients seen blocked on a write at the last `CLIENT LIST`
    /// before the release (every racer's, when the barrier was reached).
    pub blocked_writers: Option<Vec<pause::ClientSeen>>,
    /// Runner-started services that exited during the wave without being told to (a crash of
    /// the service, not a kill fault's), each in words: its status, where in the wave it was
    /// seen, and the end of its stderr.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub service_exits: Vec<String>,
}

/// Evidence about the target.
#[derive(Debug, Clone, Serialize)]
pub struct TargetEvidence {
    /// The run's `{run}` value.
    pub run_id: String,
    /// The barrier in words.
    pub barrier: String,
    /// Whether the barrier is observed on the server (false for the HTTP-level release).
    pub server_side: bool,
    /// `server_version` of the target's PostgreSQL, when it has one.
    pub server_version: Option<String>,
    /// `default_transaction_isolation` read in the target database (what its sessions use
    /// unless they set their own).
    pub isolation: Option<String>,
    /// The target database's name.
    pub database: Option<String>,
    /// Whether the runner created (and dropped) that database.
    pub scratch: bool,
    /// Services the runner started.
    pub services: Vec<service::ServiceRecord>,
    /// The endpoints racers sent to.
    pub base_urls: Vec<String>,
    /// Each wave's release.
    pub waves: Vec<WaveEvidence>,
    /// The interposer barrier: the schedule this run followed, as its id
    /// ([`crate::interpose::explore::schedule_id`]).
    pub schedule_id: Option<String>,
    /// With `[target] lock_ttl_ms`: the racers still answered "in progress" after their wave,
    /// and how waiting out the TTL went.
    pub ttl_waits: Vec<TtlWait>,
}

/// A racer still answered "in progress" after its wave, retried until answered or past the
/// service's lock TTL plus [`check::TTL_MARGIN_MS`].
#[derive(Debug, Clone, Serialize)]
pub struct TtlWait {
    /// Racer name.
    pub racer: String,
    /// The key sent.
    pub wire_key: String,
    /// Tries after the wave.
    pub attempts: usize,
    /// Milliseconds from the wave's end to the last answer.
    pub waited_ms: u64,
    /// Whether it was answered otherwise than "in progress" in time.
    pub answered: bool,
    /// Its last answer's classification.
    pub last: AnswerKind,
}

/// A count query's result.
#[derive(Debug, Clone, Serialize)]
pub struct CountSeen {
    /// Query name.
    pub name: String,
    /// Scope bound, if any.
    pub scope: Option<String>,
    /// Logical key bound, if any.
    pub key: Option<String>,
    /// Expected value.
    pub expected: i64,
    /// Counted value, or the error.
    // A String: a record of what was seen, serialized into the report as the message.
    pub counted: Result<i64, String>,
}

/// Identical final answers, grouped for a readable FAIL.
#[derive(Debug, Clone, Serialize)]
pub struct AnswerGroup {
    /// How many racers got it.
    pub count: usize,
    /// The classification.
    pub kind: AnswerKind,
    /// Status, relevant headers and body excerpt in one line (or the transport error).
    pub summary: String,
    /// The racers.
    pub racers: Vec<String>,
}

/// One run of a black-box scenario.
#[derive(Debug, Clone, Serialize)]
pub struct TargetRun {
    /// Scenario name.
    pub scenario: String,
    /// Scenario file.
    pub file: String,
    /// PASS / FAIL / PENDING.
    pub verdict: Verdict,
    /// Why, when not PASS (the first failed check, or why it did not run).
    pub reason: Option<String>,
    /// One line of evidence for a PASS.
    pub evidence_line: Option<String>,
    /// The checks, in order.
    #[serde(serialize_with = "crate::verdict::json::held_after")]
    pub checks: Vec<Check>,
    /// Racers.
    pub racers: Vec<RacerRun>,
    /// Distinct final answers.
    pub answers: Vec<AnswerGroup>,
    /// Counts.
    pub counts: Vec<CountSeen>,
    /// Evidence (absent when it did not start).
    pub evidence: Option<TargetEvidence>,
}

/// A scenario run `--repeat` times.
#[derive(Debug, Clone, Serialize)]
pub struct TargetOutcome {
    /// Scenario name.
    pub scenario: String,
    /// Scenario file.
    pub file: String,
    /// The barrier kind (`table-lock`, `advisory`, `http`).
    pub barrier: String,
    /// Whether the barrier is observed on the server.
    pub server_side: bool,
    /// FAIL if any repeat failed; PENDING if none ran, or an HTTP-level barrier ran fewer than
    /// [`run::MIN_HTTP_REPEATS`] times with no failure; else PASS.
    pub verdict: Verdict,
    /// Why, when not PASS.
    pub reason: Option<String>,
    /// Repeats that passed.
    pub passes: usize,
    /// Repeats that failed.
    pub failures: usize,
    /// Repeats that did not run (PENDING).
    pub pending: usize,
    /// failures / (passes + failures); 0 when nothing ran.
    pub flake_rate: f64,
    /// The interposer barrier: what was explored, in words ("2 racers, 12 wire steps, 924 of
    /// 924 schedules (exhaustive)", the bound, or PCT's probabilities).
    pub coverage: Option<String>,
    /// The interposer barrier: the first failing schedule as a Mermaid diagram and an
    /// isolation-tester spec, when a schedule failed.
    pub failing_schedule: Option<FailingSchedule>,
    /// Every repeat.
    pub runs: Vec<TargetRun>,
}

/// The first failing schedule of an interposed scenario, rendered for people and for
/// PostgreSQL's isolation tester ([`crate::blackbox::diagram::schedule_diagram`],
/// [`crate::blackbox::isolation::render_schedule`]).
#[derive(Debug, Clone, Serialize)]
pub struct FailingSchedule {
    /// Its id (`AABBBA`, `/` between waves).
    pub schedule_id: String,
    /// The failing run's `{run}` value.
    pub run_id: String,
    /// The command that replays it: `ticketflow scenario run FILE --schedule ID`.
    pub replay: String,
    /// A Mermaid `sequenceDiagram` (without the Markdown fence) of the steps as the store saw
    /// them: one message per step with its statement and result, lock waits and steps taken
    /// without quiescence marked.
    pub mermaid: String,
    /// The isolation-tester spec of its PostgreSQL steps, when it has any and they can be
    /// written as one.
    pub isolation_spec: Option<String>,
    /// Why there is no spec, when there is none.
    pub isolation_spec_missing: Option<String>,
    /// Where the spec was written, once written (`isolation-specs/` beside the report, or
    /// `scenario run --export-isolation-spec DIR`).
    pub isolation_spec_path: Option<std::path::PathBuf>,
}

impl TargetOutcome {
    /// Whether its runs are schedules explored by the interposer barrier (each has a
    /// schedule id) rather than repeats.
    pub fn explored(&self) -> bool {
        self.runs
            .iter()
            .any(|r| r.evidence.as_ref().is_some_and(|e| e.schedule_id.is_some()))
    }

    /// The run the report details: the first failing one, else the last.
    pub fn shown(&self) -> Option<&TargetRun> {
        self.runs
            .iter()
            .find(|r| r.verdict == Verdict::Fail)
            .or(self.runs.last())
    }
}
