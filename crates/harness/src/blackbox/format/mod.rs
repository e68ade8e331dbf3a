//! Black-box scenario files: a `[target]` table makes a scenario file describe HTTP clients
//! of a service instead of library racers. TOML, unknown fields rejected, every error names
//! the file and, where known, the line. The full format is in docs/your-service.md; the
//! shape:
//!
//! ```toml
//! name = "orders-same-body"
//! description = "4 clients, one key and body, two instances: one created, one id"
//! [barrier]
//! kind = "table-lock"             # table-lock | advisory | http | interposer | redis-pause
//! table = "idempotency_keys"      # table-lock: any table of the target database
//! lock = "exclusive"              # access-exclusive | exclusive
//! [target]
//! base_urls = ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
//! database_url = "${TARGET_DATABASE_URL}"
//! preset = "ietf"                 # ticketflow | ietf | stripe | none
//! [target.request]
//! method = "POST"
//! path = "/orders"
//! body = { item = "book", note = "{run}" }
//! [[racers]]
//! name = "client"
//! count = 4
//! key = "k1"
//! ```
//!
//! With `[barrier] kind = "interposer"`, `[[fault]]` entries cut one racer's connection to its
//! store at one step, or kill the service that serves it there (docs/INTERPOSER.md, "Faults
//! at a step"):
//!
//! ```toml
//! [[fault]]
//! racer = "client-1"      # a racer's name, or its letter (A = the scenario's first racer)
//! match = "COMMIT"        # or step = 9 (1-based, of its first attempt), or each = true
//! store = "postgres"      # optional: only this store's steps count
//! cut = "after"           # before: never forwarded; after: done, the reply withheld
//!
//! [[fault]]
//! kind = "kill"           # SIGKILL the racer's service at the step, restart it, retry
//! racer = "client-2"
//! each = true
//! when = "after"          # before: the step never forwarded; after: done at the server
//!
//! [[fault]]
//! kind = "pause"          # hold the step at the proxy while the others go on
//! racer = "client-3"
//! match = "BEGIN"
//! hold_ms = 1500          # then forward it
//! ```

mod fields;
mod parse;
mod raw;
pub mod request;
pub mod target;
pub(crate) use fields::toml_to_json as toml_json;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde::Deserialize;

use super::rules::{AnswerKind, IdSource, Preset, Rule};
use raw::{default_ready_path, default_ready_timeout_ms};

/// What a released `redis-pause` wave proves, in the verdict's words.
pub const PROVES: &str =
    "every racer's first write was inside Redis at release; reads were not held";

/// What holds the racers of a wave until every request is in flight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BarrierKind {
    /// The controller holds `LOCK TABLE {table} IN {mode} MODE` in the target database; the
    /// release waits until as many ungranted lock requests on that table as racers are seen.
    TableLock {
        /// Table name, optionally schema-qualified.
        table: String,
        /// `ACCESS EXCLUSIVE` (`true`) or `EXCLUSIVE` (`false`).
        access_exclusive: bool,
    },
    /// The controller holds `pg_advisory_xact_lock(key)`; the service's requests take the same
    /// advisory lock (bigint form) and are seen waiting on it.
    Advisory {
        /// The bigint advisory key.
        key: i64,
    },
    /// No server-side lock: every connection is opened and every request written except its
    /// last byte, then the last bytes are released together. Proves less (nothing shows the
    /// requests overlapped on the server); a PASS needs `--repeat`.
    Http,
    /// The runner's interposer stands between the services it starts and their PostgreSQL
    /// and Redis (`{database_url}`, `{redis_url}`): each racer's first command is held at the
    /// proxy, then the wave runs as the scenario's [`ScheduleSpec`] says, one step at a time.
    Interposer,
    /// `CLIENT PAUSE <timeout_ms> WRITE` on `[target] redis_url` (Redis 6.2 or later): the
    /// racers' requests are sent, `CLIENT LIST` is read until as many clients as racers are
    /// seen blocked on a write (`flags=b`, their `cmd=`), then `CLIENT UNPAUSE`. Proves that
    /// every racer's first write was inside Redis at the release; reads were not held. It
    /// pauses every client of that Redis server ([`super::pause`]).
    RedisPause,
}

impl BarrierKind {
    /// `table-lock`, `advisory` or `http`.
    pub fn name(&self) -> &'static str {
        match self {
            BarrierKind::TableLock { .. } => "table-lock",
            BarrierKind::Advisory { .. } => "advisory",
            BarrierKind::Http => "http",
            BarrierKind::Interposer => "interposer",
            BarrierKind::RedisPause => "redis-pause",
        }
    }

    /// In words, for the report: `EXCLUSIVE lock on orders`.
    pub fn describe(&self) -> String {
        match self {
            BarrierKind::TableLock {
                table,
                access_exclusive,
            } => format!(
                "{} lock on `{table}`",
                if *access_exclusive {
                    "ACCESS EXCLUSIVE"
                } else {
                    "EXCLUSIVE"
                }
            ),
            BarrierKind::Advisory { key } => format!("advisory lock {key}"),
            BarrierKind::Http => "HTTP-level release (no server-side proof)".into(),
            BarrierKind::Interposer => {
                "interposer: every request's first store command held at the proxy".into()
            }
            BarrierKind::RedisPause => {
                format!("Redis CLIENT PAUSE WRITE: {}", PROVES)
            }
        }
    }

    /// Whether the barrier is observed on the target's database.
    pub fn server_side(&self) -> bool {
        !matches!(self, BarrierKind::Http)
    }

    /// Whether the barrier needs the target's PostgreSQL (a lock there, or the interposer in
    /// front of it); the Redis pause and the HTTP-level release do not.
    pub(crate) fn needs_database(&self) -> bool {
        !matches!(self, BarrierKind::Http | BarrierKind::RedisPause)
    }
}

/// The barrier and its deadline.
#[derive(Debug, Clone)]
pub struct TargetBarrier {
    /// The kind.
    pub kind: BarrierKind,
    /// Milliseconds the racers of a wave may take to be seen at the barrier.
    pub timeout_ms: u64,
}

/// How an interposed wave is run after every racer's first command is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ExploreMode {
    /// `reduced` when the scenario has no `[[fault]]`; with one, `exhaustive` when the
    /// schedules of the first run's steps number at most the limit, else `bounded`.
    Auto,
    /// One schedule per class of equivalent interleavings (partial-order reduction with sleep
    /// sets and symmetry, [`crate::interpose::reduce`]), depth-first.
    Reduced,
    /// Every interleaving, depth-first.
    Exhaustive,
    /// Every interleaving with at most `preemptions` preemptions.
    Bounded,
    /// `runs` runs of probabilistic concurrency testing with bug depth `depth`.
    Pct,
    /// Held at the first command, then released together and run free (the cheapest).
    FirstPoint,
}

impl ExploreMode {
    /// The name in files and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            ExploreMode::Auto => "auto",
            ExploreMode::Reduced => "reduced",
            ExploreMode::Exhaustive => "exhaustive",
            ExploreMode::Bounded => "bounded",
            ExploreMode::Pct => "pct",
            ExploreMode::FirstPoint => "first-point",
        }
    }

    /// Parses a name; `None` for anything else.
    pub fn parse(name: &str) -> Option<Self> {
        [
            ExploreMode::Auto,
            ExploreMode::Reduced,
            ExploreMode::Exhaustive,
            ExploreMode::Bounded,
            ExploreMode::Pct,
            ExploreMode::FirstPoint,
        ]
        .into_iter()
        .find(|m| m.name() == name)
    }
}

/// The `[schedule]` table of an interposed scenario.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleSpec {
    /// The mode. Default `auto`.
    pub mode: ExploreMode,
    /// The preemption bound of `bounded` (and of `auto` above the limit). Default 2.
    pub preemptions: u32,
    /// Most schedules run by `exhaustive` and `bounded`. Default 500.
    pub limit: usize,
    /// Runs of `pct`. Default 50.
    pub runs: usize,
    /// Bug depth of `pct` (change points + 1). Default 2.
    pub depth: u32,
    /// Seed of `pct`. Default 1.
    pub seed: u64,
    /// Milliseconds a racer busy outside the store is waited for at a choice point. Default
    /// 200.
    pub step_timeout_ms: u64,
    /// A racer whose held step repeats the read-only shape of its last this many released
    /// steps is polling and yields to the racers holding steps
    /// ([`crate::interpose::conduct::POLL_REPEATS`], the default 2); 0 turns it off.
    pub poll_repeats: usize,
    /// Milliseconds a racer's sessions are still conducted after its last answer
    /// ([`crate::interpose::conduct::AFTER_ANSWER`], the default 50): what a service sends
    /// after its response (an answer stored late) is scheduled, and faults reach it.
    pub after_answer_ms: u64,
}

impl Default for ScheduleSpec {
    fn default() -> Self {
        ScheduleSpec {
            mode: ExploreMode::Auto,
            preemptions: 2,
            limit: 500,
            runs: 50,
            depth: 2,
            seed: 1,
            step_timeout_ms: 200,
            poll_repeats: crate::interpose::conduct::POLL_REPEATS,
            after_answer_ms: u64::try_from(crate::interpose::conduct::AFTER_ANSWER.as_millis())
                .unwrap_or(50),
        }
    }
}

/// Where a `[[fault]]` cuts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Cut {
    /// The step is never forwarded: the connection is closed on both sides instead.
    Before,
    /// The step is forwarded and completed by the server; the client's connection is closed
    /// without its reply (a lost acknowledgement).
    After,
}

impl Cut {
    /// `before` or `after`.
    pub fn name(self) -> &'static str {
        match self {
            Cut::Before => "before",
            Cut::After => "after",
        }
    }

    /// The interposer's action for it.
    pub fn action(self) -> crate::interpose::Action {
        match self {
            Cut::Before => crate::interpose::Action::CutBefore,
            Cut::After => crate::interpose::Action::CutAfter,
        }
    }
}

/// Which step of its racer a `[[fault]]` cuts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultAt {
    /// The n-th step (from 1) of the racer's first attempt (`step = n`).
    Step(usize),
    /// The first step of its first attempt whose statement starts with these words
    /// (`match = "COMMIT"`; [`crate::interpose::steps::step_matches`]).
    Match(String),
    /// The first step of its first attempt of this shape
    /// ([`crate::interpose::steps::step_shape`]): not written in a file; a sweep aims a run
    /// at a statement its numbered runs missed.
    Shape(String),
    /// Every step in turn, one run per step, until a step number never comes (`each = true`).
    Each,
}

/// What a `[[fault]]` does at its step (`kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// `kind = "cut"` (the default): the racer's store connection is closed at the step.
    Cut,
    /// `kind = "kill"`: the runner-started service serving the racer is frozen (`SIGSTOP`) at
    /// the step, the step is cut (before: never forwarded; after: completed at the server,
    /// the reply never delivered), the service is killed with `SIGKILL`, started again with
    /// the same command, port and environment, and the racers' retries go on once it answers
    /// its ready path: a crash of the process mid-request.
    Kill,
    /// `kind = "pause"` with `hold_ms`: the step is held at the proxy for that long while the
    /// other racers go on (their steps scheduled as usual), then forwarded: a request slowed
    /// past a lock's or lease's TTL, a GC pause, a stalled network.
    Pause {
        /// Milliseconds the step is held.
        hold_ms: u64,
    },
}

impl FaultKind {
    /// `cut` or `kill`.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Cut => "cut",
            FaultKind::Kill => "kill",
            FaultKind::Pause { .. } => "pause",
        }
    }
}

/// One `[[fault]]`: a cut (or a kill of the racer's service) at one step of one racer's first
/// attempt (its request before its first answer), made at the interposer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultSpec {
    /// The racer (index into [`TargetScenario::racers`]).
    pub racer: usize,
    /// Which step.
    pub at: FaultAt,
    /// Only this store's steps count (`None`: every interposed store's).
    pub store: Option<crate::interpose::StoreKind>,
    /// Cut, or kill the service.
    pub kind: FaultKind,
    /// Before or after the server (`cut =`, or `when =` for a kill).
    pub cut: Cut,
    /// `file:line` of the entry.
    pub origin: String,
}

impl FaultSpec {
    /// The fault in words: `cut after r-1's step matching "COMMIT"`; `at` replaces an
    /// `each = true` sweep's step (the step this run cuts).
    pub fn describe(&self, scenario: &TargetScenario, at: &FaultAt) -> String {
        let racer = scenario
            .racers
            .get(self.racer)
            .map_or("?", |r| r.name.as_str());
        let step = match at {
            FaultAt::Step(k) => format!("step {k}"),
            FaultAt::Match(w) => format!("step matching {w:?}"),
            FaultAt::Shape(shape) => format!(
                "step shaped {:?}",
                crate::interpose::hub::clip_to(shape, 80)
            ),
            FaultAt::Each => "every step in turn".into(),
        };
        let store = self
            .store
            .map(|s| format!(" ({} steps only)", s.name()))
            .unwrap_or_default();
        match self.kind {
            FaultKind::Cut => format!("cut {} {racer}'s {step}{store}", self.cut.name()),
            FaultKind::Kill => format!(
                "kill {racer}'s service {} {racer}'s {step}{store}",
                self.cut.name()
            ),
            FaultKind::Pause { hold_ms } => {
                format!("pause {racer}'s {step}{store} for {hold_ms} ms")
            }
        }
    }
}

/// The body every request (or one racer's) sends.
#[derive(Debug, Clone, PartialEq)]
pub enum BodyTemplate {
    /// No body.
    Empty,
    /// A JSON template (string values are templates), sent as `application/json`.
    Json(serde_json::Value),
    /// Raw text (a template) with its content type.
    Raw {
        /// The text.
        text: String,
        /// The `Content-Type` sent.
        content_type: String,
    },
}

/// The request every racer sends, as templates.
#[derive(Debug, Clone)]
pub struct RequestTemplate {
    /// HTTP method, upper case.
    pub method: String,
    /// Path (and query) template, starting with `/`.
    pub path: String,
    /// Header carrying the idempotency key.
    pub key_header: String,
    /// Template of the key sent; `{key}` is the racer's logical key.
    pub key: String,
    /// Extra headers (templates), in file order.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: BodyTemplate,
}

/// A scope: a tenant, user or API key with its own headers.
#[derive(Debug, Clone)]
pub struct Scope {
    /// Name racers refer to.
    pub name: String,
    /// What `{scope}` expands to (a template, default the name).
    pub value: String,
    /// Headers this scope's requests carry (templates).
    pub headers: Vec<(String, String)>,
}

/// A service the runner starts and stops.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ServiceSpec {
    /// Name racers refer to with `via`.
    pub name: String,
    /// Program and arguments. Placeholders: `{ticketflow}` (this binary), `{port}` (a free
    /// loopback port), `{database_url}` (the target database's URL), `{redis_url}`; `${NAME}`
    /// is the runner's environment, expanded at load (an unset one is a load error).
    pub command: Vec<String>,
    /// Environment variables set for the service, on top of the runner's own (values take
    /// the same placeholders and `${NAME}` as `command`).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Path polled with GET until it answers 2xx.
    #[serde(default = "default_ready_path")]
    pub ready_path: String,
    /// Milliseconds the service may take to become ready.
    #[serde(default = "default_ready_timeout_ms")]
    pub ready_timeout_ms: u64,
}

/// Retry phase: which first answers are re-sent with the same key, and how often.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetrySpec {
    /// Attempts per racer in all (1 = no retry).
    pub attempts: u32,
    /// Milliseconds before the first retry; doubles each time.
    pub backoff_ms: u64,
    /// Cap on one backoff, milliseconds.
    pub max_backoff_ms: u64,
    /// Transport errors (refused, reset, timeout) are retried.
    pub transport_errors: bool,
}

/// How replays are recognised and judged.
#[derive(Debug, Clone)]
pub struct ReplaySpec {
    /// A rule classifies replays; `false`: a replay looks like a create, so the check is one id
    /// per intent among all 2xx answers.
    pub marked: bool,
    /// A replay must equal the creator's answer (status and JSON body).
    pub same_answer: bool,
    /// JSON pointers ignored by `same_answer` (timestamps, request ids).
    pub ignore: Vec<String>,
}

/// A named count query and the placeholders it binds, in order.
#[derive(Debug, Clone)]
pub struct CountQuery {
    /// Its name in `[target.count]` and expectations.
    pub name: String,
    /// The SQL as written.
    pub sql: String,
    /// The SQL with each placeholder replaced by `$1`, `$2`, …
    pub bound_sql: String,
    /// The placeholder behind each parameter.
    pub params: Vec<&'static str>,
    /// `file:line` of the query in its scenario file, for setup errors.
    pub origin: String,
    /// A count kept in Redis (`{ redis = ["SCARD", "orders:{key}"] }` or
    /// `{ redis = "GET effects:{key}" }`): the command's name (upper case, from
    /// [`target::READ_ONLY_COUNT_COMMANDS`]) and its argument templates, run on
    /// `[target] redis_url`; `sql` then holds the command as written and `bound_sql` is empty.
    /// `None`: an SQL count.
    pub redis: Option<Vec<String>>,
}

/// The `[target]` table, validated.
#[derive(Debug, Clone)]
pub struct Target {
    /// Base URLs of services already running.
    pub base_urls: Vec<String>,
    /// Services the runner starts.
    pub services: Vec<ServiceSpec>,
    /// The target database (env variables expanded); `None` with services: a scratch one.
    pub database_url: Option<String>,
    /// The Redis the services use (`{redis_url}` in their commands; with the interposer, the
    /// interposer's URL in front of it), env variables expanded.
    pub redis_url: Option<String>,
    /// The control address of a running `ticketflow interpose` (loopback `IP:PORT`) that the
    /// service of `base_urls` reaches its stores through; only with
    /// [`BarrierKind::Interposer`], `base_urls` and `database_url`.
    pub interposer: Option<std::net::SocketAddr>,
    /// The control token file of that `ticketflow interpose` (`[target]
    /// interposer_token_file`, env variables expanded, relative to the scenario file's
    /// folder); `None`: the file `TICKETFLOW_INTERPOSE_TOKEN_FILE` names. Only with
    /// `interposer`.
    pub interposer_token_file: Option<std::path::PathBuf>,
    /// The target is `ticketflow serve`: our migrations are applied to the scratch database.
    pub own_service: bool,
    /// SQL run on the scratch database after the migrations, before the services start (a
    /// negative control's schema change). Never run on a database the scenario names.
    pub setup_sql: Vec<String>,
    /// The request.
    pub request: RequestTemplate,
    /// Scopes (empty: a service without tenants).
    pub scopes: Vec<Scope>,
    /// The preset whose rules follow the scenario's own.
    pub preset: Preset,
    /// Every rule, in order (the scenario's, then the preset's).
    pub rules: Vec<Rule>,
    /// Where the id is.
    pub id: IdSource,
    /// Replays.
    pub replay: ReplaySpec,
    /// Retry phase.
    pub retry: RetrySpec,
    /// Extra statuses retried (besides in-progress).
    pub retry_statuses: Vec<u16>,
    /// Milliseconds one request may take (it waits at the barrier first).
    pub request_timeout_ms: u64,
    /// Count queries, in file order.
    pub counts: Vec<CountQuery>,
    /// Milliseconds one SQL count query may run (`count_timeout_ms`, default
    /// [`DEFAULT_COUNT_TIMEOUT_MS`], 1 to [`MAX_COUNT_TIMEOUT_MS`]): its `SET LOCAL
    /// statement_timeout` inside the `READ ONLY` transaction it runs in; a count cancelled at
    /// it (SQLSTATE 57014) is a count not read.
    pub count_timeout_ms: u64,
    /// The service's own TTL for a key's "in progress" lock, milliseconds, as the scenario
    /// states it (`lock_ttl_ms`): after each wave a key still answered "in progress" is
    /// retried until answered or this much (plus [`super::check::TTL_MARGIN_MS`]) has passed.
    pub lock_ttl_ms: Option<u64>,
    /// `state_across_keys = true`: the service keeps state that requests under different
    /// idempotency keys share outside the database the runner gives it (a counter or a quota in
    /// a shared Redis, a file, a third service), so two runs at once, each under its own
    /// `{run}`, could see each other. Schedules of an interposed scenario then run one at a
    /// time, whatever `--parallel` asks. Default `false`.
    pub state_across_keys: bool,
}

impl Target {
    /// Endpoint names racers may use in `via`: service names, then base URLs.
    pub fn endpoints(&self) -> Vec<String> {
        self.services
            .iter()
            .map(|s| s.name.clone())
            .chain(self.base_urls.iter().cloned())
            .collect()
    }
}

/// One racer (a `count` is expanded).
#[derive(Debug, Clone)]
pub struct TargetRacer {
    /// Unique name.
    pub name: String,
    /// The name in the file.
    pub group: String,
    /// 1-based index in the scenario (`{n}`).
    pub n: usize,
    /// Its scope's name, if the target has scopes.
    pub scope: Option<String>,
    /// Logical key (`{key}` in the key template).
    pub key: String,
    /// Its own body, replacing the request's.
    pub body: Option<BodyTemplate>,
    /// Pinned endpoint.
    pub via: Option<String>,
    /// Wave (1-based); waves run in order.
    pub wave: u32,
    /// The final outcome(s) it must end with, if given.
    pub expect: BTreeSet<AnswerKind>,
}

/// An expected count: a query's value with given bindings.
#[derive(Debug, Clone)]
pub struct CountExpectation {
    /// Scope name bound to `{scope}` (its value is bound).
    pub scope: Option<String>,
    /// Logical key bound to `{key}` (the wire key is bound).
    pub key: Option<String>,
    /// Query name → expected value.
    pub values: BTreeMap<String, i64>,
}

/// A validated black-box scenario.
#[derive(Debug, Clone)]
pub struct TargetScenario {
    /// The file.
    pub file: PathBuf,
    /// Short name.
    pub name: String,
    /// What it shows.
    pub description: String,
    /// The barrier.
    pub barrier: TargetBarrier,
    /// The target.
    pub target: Target,
    /// Racers, expanded, in file order.
    pub racers: Vec<TargetRacer>,
    /// Count expectations.
    pub counts: Vec<CountExpectation>,
    /// How an interposed wave runs (`[schedule]`); `Some` exactly for
    /// [`BarrierKind::Interposer`].
    pub schedule: Option<ScheduleSpec>,
    /// Cuts at a step (`[[fault]]`), interposed scenarios only.
    pub faults: Vec<FaultSpec>,
    /// `[expect] model = true`: the racers are judged as one history against the idempotency
    /// model (docs/PROTOCOL.md §11) instead of per-racer outcomes and hand-written counts.
    pub model: Option<ModelExpect>,
}

/// How a scenario judged by the idempotency model counts effects.
///
/// The racers are the history: waves in order, a wave of two or more racers is a concurrent
/// group, a racer whose `expect` holds `rejected` sends an invalid body (refused, changing
/// nothing), and racers whose bodies are one canonical JSON are one intent. Every
/// `[target.count]` query is read once per binding the racers give its placeholders, and its
/// value must equal the model's effects under the (scope, key)s of that binding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelExpect {
    /// Milliseconds waited after the last answer before the counts are read a second time, so
    /// an effect written after the answer is seen ([`DEFAULT_SETTLE_MS`]; 0 reads once).
    pub settle_ms: u64,
    /// Waves after which the runner also waits `settle_ms` and recounts before the next wave.
    pub settle_after: Vec<u32>,
}

/// `[expect] settle_ms` when a model-judged file gives none: 1 s, far longer than a service
/// takes to write an effect it defers past its answer (an outbox row written by a background
/// task), short enough to pay once per history.
pub const DEFAULT_SETTLE_MS: u64 = 1_000;

/// The largest `[expect] settle_ms`: 60 s.
pub const MAX_SETTLE_MS: u64 = 60_000;

impl TargetScenario {
    /// The waves, in order, each with its racers' indices.
    pub fn waves(&self) -> Vec<(u32, Vec<usize>)> {
        let mut waves: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for (i, r) in self.racers.iter().enumerate() {
            waves.entry(r.wave).or_default().push(i);
        }
        waves.into_iter().collect()
    }

    /// The body a racer sends (its own, or the request's).
    pub(crate) fn body_of<'a>(&'a self, racer: &'a TargetRacer) -> &'a BodyTemplate {
        racer.body.as_ref().unwrap_or(&self.target.request.body)
    }
}

// ---------------------------------------------------------------- raw file shapes

/// Default wire key: fresh per run, so a rerun never meets an old key.
pub(crate) const DEFAULT_KEY_TEMPLATE: &str = "tfv-{run}-{key}";

/// `[target] request_timeout_ms` when the file gives none: 10 s, the default barrier timeout,
/// so a target that accepts connections and never answers is reported within the barrier
/// timeout plus one request timeout (a timeout is not retried).
pub(crate) const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 10_000;

/// `[target] count_timeout_ms` when the file gives none: 10 s per SQL count query.
pub const DEFAULT_COUNT_TIMEOUT_MS: u64 = 10_000;

/// The largest `[target] count_timeout_ms`: 5 minutes. A count that needs longer is not a
/// count of one run's rows.
pub const MAX_COUNT_TIMEOUT_MS: u64 = 300_000;

// ---------------------------------------------------------------- loading

/// Whether TOML text is a black-box scenario (it has a top-level `[target]` table).
pub fn is_target_file(text: &str) -> bool {
    toml::from_str::<toml::Table>(text)
        .map(|t| t.contains_key("target"))
        .unwrap_or(false)
}

/// The process environment's `name`, for `${NAME}` in a scenario file: a value found is a
/// secret from then on, masked as `${NAME}` in everything the tool writes
/// ([`crate::contain::register_secret`]).
pub fn secret_env(name: &str) -> Option<String> {
    let value = std::env::var(name).ok();
    if let Some(v) = &value {
        crate::contain::register_secret(name, v);
    }
    value
}
