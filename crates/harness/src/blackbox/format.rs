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
//! store at one step (docs/INTERPOSER.md, "Faults at a step"):
//!
//! ```toml
//! [[fault]]
//! racer = "client-1"      # a racer's name, or its letter (A = the scenario's first racer)
//! match = "COMMIT"        # or step = 9 (1-based, of its first attempt), or each = true
//! store = "postgres"      # optional: only this store's steps count
//! cut = "after"           # before: never forwarded; after: done, the reply withheld
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use regex::Regex;
use serde::Deserialize;
use toml::Spanned;

use super::client::{self, ClientError, HttpRequest};
use super::rules::{check_pointer, AnswerKind, HeaderTest, IdSource, PointerTest, Preset, Rule};
use super::template::{self, TemplateError};
use crate::scenario::capacity::MAX_RACERS;
use crate::scenario::ScenarioError;
use crate::store::url::redact;

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
                format!("Redis CLIENT PAUSE WRITE: {}", super::pause::PROVES)
            }
        }
    }

    /// Whether the barrier is observed on the target's database.
    pub fn server_side(&self) -> bool {
        !matches!(self, BarrierKind::Http)
    }

    /// Whether the barrier needs the target's PostgreSQL (a lock there, or the interposer in
    /// front of it); the Redis pause and the HTTP-level release do not.
    pub fn needs_database(&self) -> bool {
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
    /// `exhaustive` when the schedules of the first run's steps number at most the limit,
    /// else `bounded`.
    Auto,
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
    /// (`match = "COMMIT"`; [`crate::interpose::conduct::step_matches`]).
    Match(String),
    /// The first step of its first attempt of this shape
    /// ([`crate::interpose::conduct::step_shape`]): not written in a file; a sweep aims a run
    /// at a statement its numbered runs missed.
    Shape(String),
    /// Every step in turn, one run per step, until a step number never comes (`each = true`).
    Each,
}

/// One `[[fault]]`: a cut at one step of one racer's first attempt (its request before its
/// first answer), made at the interposer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultSpec {
    /// The racer (index into [`TargetScenario::racers`]).
    pub racer: usize,
    /// Which step.
    pub at: FaultAt,
    /// Only this store's steps count (`None`: every interposed store's).
    pub store: Option<crate::interpose::StoreKind>,
    /// Before or after the server.
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
        format!("cut {} {racer}'s {step}{store}", self.cut.name())
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
    /// loopback port), `{database_url}` (the target database's URL).
    pub command: Vec<String>,
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
    /// [`super::redis_store::READ_ONLY_COUNT_COMMANDS`]) and its argument templates, run on
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
}

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
    pub fn body_of<'a>(&'a self, racer: &'a TargetRacer) -> &'a BodyTemplate {
        racer.body.as_ref().unwrap_or(&self.target.request.body)
    }
}

// ---------------------------------------------------------------- raw file shapes

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    name: String,
    description: String,
    #[serde(default)]
    barrier: Option<Spanned<RawBarrier>>,
    #[serde(default)]
    schedule: Option<Spanned<RawSchedule>>,
    target: Spanned<RawTarget>,
    #[serde(default)]
    racers: Vec<Spanned<RawRacer>>,
    #[serde(default)]
    expect: RawExpect,
    #[serde(default)]
    fault: Vec<Spanned<RawFault>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFault {
    racer: String,
    step: Option<usize>,
    #[serde(rename = "match")]
    words: Option<String>,
    #[serde(default)]
    each: bool,
    store: Option<String>,
    cut: Option<Cut>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBarrier {
    kind: Option<String>,
    table: Option<String>,
    lock: Option<String>,
    advisory_key: Option<i64>,
    timeout_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSchedule {
    mode: Option<ExploreMode>,
    preemptions: Option<u32>,
    limit: Option<usize>,
    runs: Option<usize>,
    depth: Option<u32>,
    seed: Option<u64>,
    step_timeout_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTarget {
    #[serde(default)]
    base_urls: Vec<String>,
    #[serde(default)]
    service: Vec<ServiceSpec>,
    database_url: Option<String>,
    redis_url: Option<String>,
    interposer: Option<String>,
    #[serde(default)]
    own_service: bool,
    #[serde(default)]
    setup_sql: Vec<String>,
    preset: Option<Preset>,
    request_timeout_ms: Option<u64>,
    request: Option<Spanned<RawRequest>>,
    #[serde(default)]
    scopes: Vec<Spanned<RawScope>>,
    #[serde(default)]
    rules: Vec<Spanned<RawRule>>,
    id: Option<Spanned<RawId>>,
    #[serde(default)]
    replay: Option<Spanned<RawReplay>>,
    #[serde(default)]
    retry: Option<Spanned<RawRetry>>,
    #[serde(default)]
    count: BTreeMap<String, Spanned<toml::Value>>,
    count_timeout_ms: Option<u64>,
    lock_ttl_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRequest {
    method: Option<String>,
    path: Option<String>,
    key_header: Option<String>,
    key: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    body: Option<toml::Value>,
    raw: Option<String>,
    content_type: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScope {
    name: String,
    value: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    status: Option<toml::Value>,
    header: Option<String>,
    header_value: Option<String>,
    header_regex: Option<String>,
    pointer: Option<String>,
    equals: Option<toml::Value>,
    body_regex: Option<String>,
    outcome: AnswerKind,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawId {
    pointer: Option<String>,
    header: Option<String>,
    regex: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReplay {
    marked: Option<bool>,
    #[serde(default)]
    same_answer: bool,
    #[serde(default)]
    ignore: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRetry {
    attempts: Option<u32>,
    backoff_ms: Option<u64>,
    max_backoff_ms: Option<u64>,
    #[serde(default)]
    statuses: Vec<u16>,
    transport_errors: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRacer {
    name: String,
    count: Option<usize>,
    scope: Option<String>,
    key: Option<String>,
    body: Option<toml::Value>,
    raw: Option<String>,
    via: Option<String>,
    wave: Option<u32>,
    expect: Option<RawKinds>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum RawKinds {
    One(AnswerKind),
    Many(Vec<AnswerKind>),
}

impl RawKinds {
    fn set(&self) -> BTreeSet<AnswerKind> {
        match self {
            RawKinds::One(k) => [*k].into(),
            RawKinds::Many(v) => v.iter().copied().collect(),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExpect {
    #[serde(default)]
    outcomes: BTreeMap<String, Spanned<RawKinds>>,
    #[serde(default)]
    counts: Vec<Spanned<RawCounts>>,
}

#[derive(Debug, Deserialize)]
struct RawCounts {
    scope: Option<String>,
    key: Option<String>,
    #[serde(flatten)]
    values: BTreeMap<String, toml::Value>,
}

fn default_ready_path() -> String {
    "/healthz".into()
}
fn default_ready_timeout_ms() -> u64 {
    20_000
}

/// Racer names in the file → the expanded racers' names.
type Groups = BTreeMap<String, Vec<String>>;

/// The base URL requests are checked against at load, before the real endpoints are known.
const SAMPLE_BASE_URL: &str = "http://127.0.0.1:1";

/// `text` with every per-request placeholder filled by a plain sample value, for the load
/// checks of what the expanded text will be.
fn sample(text: &str) -> String {
    let vars: template::Vars = template::PLACEHOLDERS
        .iter()
        .map(|p| (*p, "x".to_string()))
        .collect();
    template::expand(text, &vars)
}

/// Default wire key: fresh per run, so a rerun never meets an old key.
pub const DEFAULT_KEY_TEMPLATE: &str = "tfv-{run}-{key}";

/// `[target] request_timeout_ms` when the file gives none: 10 s, the default barrier timeout,
/// so a target that accepts connections and never answers is reported within the barrier
/// timeout plus one request timeout (a timeout is not retried).
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 10_000;

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

impl TargetScenario {
    /// Reads and validates a black-box scenario file, expanding `${ENV}` from the process
    /// environment ([`secret_env`]: every value found is masked in all the tool writes).
    ///
    /// Will return `Err` naming the file and line for unreadable files, TOML errors, unknown
    /// fields, unset environment variables, bad templates, JSON pointers or regexes, a rule
    /// set that classifies nothing as created, and racers or expectations that do not fit.
    pub fn load(path: &Path) -> Result<TargetScenario, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(|e| ScenarioError {
            file: path.to_path_buf(),
            line: None,
            message: format!("cannot read scenario: {e}"),
        })?;
        TargetScenario::parse(path, &text, &secret_env)
    }

    /// Parses scenario text; `env` looks up `${NAME}`.
    ///
    /// Will return `Err` as [`TargetScenario::load`] does.
    pub fn parse(
        path: &Path,
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<TargetScenario, ScenarioError> {
        let p = Parser { path, text, env };
        let raw: RawFile = toml::from_str(text)
            .map_err(|e| p.err(e.span().map(|s| s.start), e.message().to_string()))?;
        p.build(raw)
    }
}

struct Parser<'a> {
    path: &'a Path,
    text: &'a str,
    env: &'a dyn Fn(&str) -> Option<String>,
}

impl Parser<'_> {
    fn err(&self, offset: Option<usize>, message: String) -> ScenarioError {
        ScenarioError {
            file: self.path.to_path_buf(),
            line: offset.map(|o| self.text[..o.min(self.text.len())].matches('\n').count() + 1),
            message,
        }
    }

    /// An error at `at`, or, for an unset variable, at the line that names it.
    fn template_err(&self, at: usize, what: &str, e: TemplateError) -> ScenarioError {
        let offset = match &e {
            TemplateError::UnsetVariable(n) => self.text.find(&format!("${{{n}}}")).unwrap_or(at),
            _ => at,
        };
        self.err(Some(offset), format!("{what}: {e}"))
    }

    fn env(&self, at: usize, what: &str, s: &str) -> Result<String, ScenarioError> {
        template::expand_env(s, self.env).map_err(|e| self.template_err(at, what, e))
    }

    /// Env-expanded and validated template.
    fn template(&self, at: usize, what: &str, s: &str) -> Result<String, ScenarioError> {
        let s = self.env(at, what, s)?;
        template::validate(&s).map_err(|e| self.template_err(at, what, e))?;
        Ok(s)
    }

    fn headers(
        &self,
        at: usize,
        what: &str,
        raw: &BTreeMap<String, String>,
    ) -> Result<Vec<(String, String)>, ScenarioError> {
        raw.iter()
            .map(|(n, v)| {
                let valid_name = !n.is_empty()
                    && n.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
                if !valid_name {
                    return Err(self.err(Some(at), format!("{what}: invalid header name {n:?}")));
                }
                let v = self.template(at, what, v)?;
                self.sendable(
                    at,
                    what,
                    &HttpRequest::new("POST", SAMPLE_BASE_URL).with_header(n, sample(&v)),
                )?;
                Ok((n.clone(), v))
            })
            .collect()
    }

    /// Refuses at load what the HTTP client would refuse before sending (a control character
    /// in a header value, a header the client sets itself, a path or URL it cannot use),
    /// naming `what` and the line. The error never quotes a header's value, nor a URL other
    /// than a base URL (password hidden): a path may hold an `${ENV}` secret.
    fn sendable(&self, at: usize, what: &str, req: &HttpRequest) -> Result<(), ScenarioError> {
        client::check(req).map_err(|e| {
            let why = match e {
                ClientError::Url { url, reason } if what == "base_urls" => {
                    format!("URL {:?} cannot be used: {reason}", redact(&url))
                }
                ClientError::Url { reason, .. } => format!("the URL cannot be used: {reason}"),
                other => other.to_string(),
            };
            self.err(Some(at), format!("{what}: {why}"))
        })
    }

    fn regex(&self, at: usize, what: &str, s: &str) -> Result<Regex, ScenarioError> {
        Regex::new(s).map_err(|e| self.err(Some(at), format!("{what}: invalid regex {s:?}: {e}")))
    }

    fn pointer(&self, at: usize, what: &str, s: &str) -> Result<String, ScenarioError> {
        check_pointer(s).map_err(|e| self.err(Some(at), format!("{what}: {e}")))?;
        Ok(s.to_string())
    }

    fn body(
        &self,
        at: usize,
        what: &str,
        body: Option<&toml::Value>,
        raw: Option<&String>,
        content_type: Option<&String>,
    ) -> Result<Option<BodyTemplate>, ScenarioError> {
        match (body, raw) {
            (Some(_), Some(_)) => Err(self.err(
                Some(at),
                format!("{what}: give either body (JSON) or raw (text), not both"),
            )),
            (Some(v), None) => {
                let json = toml_to_json(v);
                let json = template::expand_env_json(&json, self.env)
                    .map_err(|e| self.template_err(at, what, e))?;
                template::validate_json(&json).map_err(|e| self.template_err(at, what, e))?;
                Ok(Some(BodyTemplate::Json(json)))
            }
            (None, Some(text)) => {
                let text = self.template(at, what, text)?;
                let content_type = content_type
                    .cloned()
                    .unwrap_or_else(|| "text/plain; charset=utf-8".into());
                // A raw body declared as JSON must be JSON once its placeholders are filled.
                if content_type.to_ascii_lowercase().contains("json") {
                    let sample: template::Vars = template::PLACEHOLDERS
                        .iter()
                        .map(|p| (*p, "x".to_string()))
                        .collect();
                    if let Err(e) =
                        serde_json::from_str::<serde_json::Value>(&template::expand(&text, &sample))
                    {
                        return Err(self.err(
                            Some(at),
                            format!("{what}: raw body with content type {content_type} is not JSON: {e}"),
                        ));
                    }
                }
                Ok(Some(BodyTemplate::Raw { text, content_type }))
            }
            (None, None) => Ok(None),
        }
    }

    fn build(&self, raw: RawFile) -> Result<TargetScenario, ScenarioError> {
        let target_at = raw.target.span().start;
        let target = self.target(raw.target.into_inner(), target_at)?;
        let barrier = self.barrier(raw.barrier, &target)?;
        let schedule = self.schedule(raw.schedule, &barrier, &target)?;
        let (racers, groups) = self.racers(&raw.racers, &target)?;
        if racers.is_empty() {
            return Err(self.err(None, "scenario has no racers ([[racers]])".into()));
        }
        for (name, kinds) in &raw.expect.outcomes {
            let members = groups.get(name).ok_or_else(|| {
                self.err(
                    Some(kinds.span().start),
                    format!("expectation names unknown racer {name:?}"),
                )
            })?;
            if kinds.get_ref().set().is_empty() || members.is_empty() {
                return Err(self.err(
                    Some(kinds.span().start),
                    format!("no allowed outcome for {name:?}"),
                ));
            }
        }
        let mut racers = racers;
        for r in &mut racers {
            let by_name = raw.expect.outcomes.get(&r.name);
            let by_group = raw.expect.outcomes.get(&r.group);
            if let Some(k) = by_name.or(by_group) {
                r.expect.extend(k.get_ref().set());
            }
        }
        crate::scenario::format::check_scenario_name(&raw.name).map_err(|m| self.err(None, m))?;
        let counts = self.count_expectations(&raw.expect.counts, &target, &racers)?;
        let faults = self.faults(&raw.fault, &barrier, schedule.as_ref(), &target, &racers)?;
        let scenario = TargetScenario {
            file: self.path.to_path_buf(),
            name: raw.name,
            description: raw.description,
            barrier,
            target,
            racers,
            counts,
            schedule,
            faults,
        };
        // Every racer's request with its own key, scope and name filled in, as the run builds
        // it: a value that makes it unsendable is a load error at the racer's line.
        for r in &scenario.racers {
            let at = raw
                .racers
                .iter()
                .find(|x| x.get_ref().name == r.group)
                .map_or(target_at, |x| x.span().start);
            let built =
                super::run::build_request(&scenario, r, SAMPLE_BASE_URL, super::run::SAMPLE_RUN_ID);
            self.sendable(at, &format!("racer {:?}'s request", r.name), &built)?;
        }
        Ok(scenario)
    }

    /// `[[fault]]`: with the interposer barrier and a mode that releases steps one at a time;
    /// one per racer; the racer by name (a group of one) or letter; exactly one of `step`
    /// (from 1), `match` (words) and `each`, and `each` only in a lone fault; `store` one the
    /// run interposes; `cut` given.
    fn faults(
        &self,
        raw: &[Spanned<RawFault>],
        barrier: &TargetBarrier,
        schedule: Option<&ScheduleSpec>,
        target: &Target,
        racers: &[TargetRacer],
    ) -> Result<Vec<FaultSpec>, ScenarioError> {
        use crate::interpose::StoreKind;
        let mut out: Vec<FaultSpec> = Vec::new();
        for f in raw {
            let at = f.span().start;
            let f = f.get_ref();
            let e = |m: String| self.err(Some(at), m);
            if barrier.kind != BarrierKind::Interposer {
                return Err(e(
                    "[[fault]] goes with [barrier] kind = \"interposer\": the cut is made at the interposer".into(),
                ));
            }
            if schedule.is_some_and(|s| s.mode == ExploreMode::FirstPoint) {
                return Err(e(
                    "[[fault]] needs the steps released one at a time: [schedule] mode first-point runs them free".into(),
                ));
            }
            let racer = racer_index(racers, &f.racer).map_err(e)?;
            if out.iter().any(|o| o.racer == racer) {
                return Err(e(format!(
                    "racer {:?} has a [[fault]] already: one per racer",
                    racers[racer].name
                )));
            }
            let fault_at = match (f.step, &f.words, f.each) {
                (Some(0), None, false) => {
                    return Err(e("fault step counts from 1".into()));
                }
                (Some(k), None, false) => FaultAt::Step(k),
                (None, Some(w), false) if !w.trim().is_empty() => FaultAt::Match(w.clone()),
                (None, Some(_), false) => return Err(e("fault match is empty".into())),
                (None, None, true) => FaultAt::Each,
                _ => return Err(e(
                    "a [[fault]] needs exactly one of step = N, match = \"WORDS\" or each = true"
                        .into(),
                )),
            };
            let store = match f.store.as_deref() {
                None => None,
                Some("postgres") => Some(StoreKind::Postgres),
                Some("redis") if target.redis_url.is_some() => Some(StoreKind::Redis),
                Some("redis") => {
                    return Err(e(
                        "fault store = \"redis\" needs [target] redis_url (the Redis the interposer stands in front of)".into(),
                    ))
                }
                Some(other) => {
                    return Err(e(format!(
                        "fault store {other:?}: expected postgres or redis"
                    )))
                }
            };
            let Some(cut) = f.cut else {
                return Err(e(
                    "a [[fault]] needs cut = \"before\" (never forwarded) or \"after\" (done, the reply withheld)".into(),
                ));
            };
            out.push(FaultSpec {
                racer,
                at: fault_at,
                store,
                cut,
                origin: format!(
                    "{}:{}",
                    self.path.display(),
                    self.text[..at.min(self.text.len())].matches('\n').count() + 1
                ),
            });
        }
        if out.len() > 1 && out.iter().any(|f| f.at == FaultAt::Each) {
            return Err(self.err(
                raw.first().map(|f| f.span().start),
                "each = true sweeps one fault's steps: give it as the only [[fault]]".into(),
            ));
        }
        Ok(out)
    }

    /// `[schedule]`: only with the interposer barrier, which needs services the runner starts
    /// (their URLs are the interposer's); an exploring mode needs count queries that bind
    /// `{key}` or `{run}` (the schedules share one database).
    fn schedule(
        &self,
        raw: Option<Spanned<RawSchedule>>,
        barrier: &TargetBarrier,
        target: &Target,
    ) -> Result<Option<ScheduleSpec>, ScenarioError> {
        let interposed = barrier.kind == BarrierKind::Interposer;
        let at = raw.as_ref().map(|r| r.span().start);
        if !interposed && target.interposer.is_some() {
            return Err(self.err(
                at,
                "[target] interposer goes with [barrier] kind = \"interposer\"".into(),
            ));
        }
        if !interposed {
            if raw.is_some() {
                return Err(self.err(
                    at,
                    "[schedule] goes with [barrier] kind = \"interposer\"".into(),
                ));
            }
            return Ok(None);
        }
        if target.services.is_empty() && target.interposer.is_none() {
            return Err(self.err(
                at,
                "barrier kind interposer needs [[target.service]] (the runner starts the services with {database_url} and {redis_url} pointing at its interposer) or [target] interposer (the control address of a running `ticketflow interpose` your service reaches its stores through)".into(),
            ));
        }
        let d = ScheduleSpec::default();
        let spec = match raw {
            None => d,
            Some(r) => {
                let r = r.into_inner();
                ScheduleSpec {
                    mode: r.mode.unwrap_or(d.mode),
                    preemptions: r.preemptions.unwrap_or(d.preemptions),
                    limit: r.limit.unwrap_or(d.limit),
                    runs: r.runs.unwrap_or(d.runs),
                    depth: r.depth.unwrap_or(d.depth),
                    seed: r.seed.unwrap_or(d.seed),
                    step_timeout_ms: r.step_timeout_ms.unwrap_or(d.step_timeout_ms),
                }
            }
        };
        if spec.limit == 0 || spec.runs == 0 || spec.depth == 0 || spec.step_timeout_ms == 0 {
            return Err(self.err(
                at,
                "[schedule] limit, runs, depth and step_timeout_ms must be at least 1".into(),
            ));
        }
        // A scope counts as fresh per run when every scope's value uses {run}.
        let fresh_scopes =
            !target.scopes.is_empty() && target.scopes.iter().all(|sc| sc.value.contains("{run}"));
        if let Some(q) = target.counts.iter().find(|q| {
            !q.params
                .iter()
                .any(|p| *p == "key" || *p == "run" || (*p == "scope" && fresh_scopes))
        }) {
            return Err(self.err(
                at,
                format!(
                    "count {:?} binds neither {{key}}, {{run}} nor a {{scope}} whose value uses {{run}}: the schedules of an interposed scenario share one database, so it would count earlier schedules' rows",
                    q.name
                ),
            ));
        }
        Ok(Some(spec))
    }

    /// Long because it validates the `[target]` table's fields one after another, each refused
    /// with its own message at the file's line; the checks share only the parser.
    fn target(&self, t: RawTarget, at: usize) -> Result<Target, ScenarioError> {
        if t.service.is_empty() == t.base_urls.is_empty() {
            return Err(self.err(
                Some(at),
                "[target] needs either [[target.service]] entries or base_urls, not both".into(),
            ));
        }
        let base_urls = self.base_urls(&t.base_urls, at)?;
        for s in &t.service {
            if s.command.is_empty() {
                return Err(self.err(
                    Some(at),
                    format!("service {:?} has an empty command", s.name),
                ));
            }
        }
        let database_url = t
            .database_url
            .as_deref()
            .map(|u| self.env(at, "database_url", u))
            .transpose()?;
        if let Some(u) = &database_url {
            check_database_url(u).map_err(|m| self.err(Some(at), m))?;
        }
        if t.own_service && t.service.is_empty() {
            return Err(self.err(
                Some(at),
                "own_service = true needs [[target.service]] (our migrations go to the scratch database)".into(),
            ));
        }
        if !t.setup_sql.is_empty() && (t.service.is_empty() || database_url.is_some()) {
            return Err(self.err(
                Some(at),
                "setup_sql runs only on the runner's scratch database ([[target.service]] without database_url)".into(),
            ));
        }
        let preset = t.preset.unwrap_or(if t.own_service {
            Preset::Ticketflow
        } else {
            Preset::Ietf
        });
        let request = self.request(t.request)?;
        let scopes = self.scopes(&t.scopes)?;
        let mut rules = Vec::new();
        for r in &t.rules {
            rules.push(self.rule(r)?);
        }
        rules.extend(preset.rules());
        if !rules.iter().any(|r| r.outcome == AnswerKind::Created) {
            return Err(self.err(
                Some(at),
                format!(
                    "no rule classifies an answer as created (preset {}, {} rule(s) of the scenario's own)",
                    preset.name(),
                    t.rules.len()
                ),
            ));
        }
        let id = self.id_source(t.id.as_ref())?;
        let any_replayed_rule = rules.iter().any(|r| r.outcome == AnswerKind::Replayed);
        let replay = self.replay(t.replay.as_ref(), any_replayed_rule)?;
        let (retry, retry_statuses) = self.retry(t.retry.as_ref())?;
        let redis_url = t
            .redis_url
            .as_deref()
            .map(|u| self.env(at, "redis_url", u))
            .transpose()?;
        if let Some(u) = &redis_url {
            if !u.starts_with("redis://") {
                return Err(self.err(
                    Some(at),
                    format!(
                        "redis_url {:?} must be a redis:// URL",
                        crate::store::url::redact(u)
                    ),
                ));
            }
        }
        let counts = self.count_queries(&t.count, redis_url.as_deref())?;
        let interposer = t
            .interposer
            .as_deref()
            .map(|u| self.env(at, "interposer", u))
            .transpose()?
            .map(|u| match u.parse::<std::net::SocketAddr>() {
                Ok(a) if a.ip().is_loopback() => Ok(a),
                _ => Err(self.err(
                    Some(at),
                    format!(
                        "interposer {u:?} must be a loopback IP:PORT: the control address `ticketflow interpose` printed"
                    ),
                )),
            })
            .transpose()?;
        if interposer.is_some() && (!t.service.is_empty() || database_url.is_none()) {
            return Err(self.err(
                Some(at),
                "interposer (a running `ticketflow interpose`) goes with base_urls (your running service) and database_url (the direct URL of the database it uses); [[target.service]] gets the runner's own interposer".into(),
            ));
        }
        let target = Target {
            base_urls,
            services: t.service,
            database_url,
            redis_url,
            interposer,
            own_service: t.own_service,
            setup_sql: t.setup_sql,
            request,
            scopes,
            preset,
            rules,
            id,
            replay,
            retry,
            retry_statuses,
            request_timeout_ms: t.request_timeout_ms.unwrap_or(DEFAULT_REQUEST_TIMEOUT_MS),
            counts,
            count_timeout_ms: t.count_timeout_ms.unwrap_or(DEFAULT_COUNT_TIMEOUT_MS),
            lock_ttl_ms: t.lock_ttl_ms,
        };
        if target.lock_ttl_ms == Some(0) {
            return Err(self.err(Some(at), "lock_ttl_ms must be at least 1".into()));
        }
        if !(1..=MAX_COUNT_TIMEOUT_MS).contains(&target.count_timeout_ms) {
            return Err(self.err(
                Some(at),
                format!(
                    "count_timeout_ms must be 1 to {MAX_COUNT_TIMEOUT_MS} (milliseconds), not {}",
                    target.count_timeout_ms
                ),
            ));
        }
        let mut seen = BTreeSet::new();
        for e in target.endpoints() {
            if !seen.insert(e.clone()) {
                return Err(self.err(Some(at), format!("endpoint {e:?} is named twice")));
            }
        }
        if target.counts.iter().any(|q| q.redis.is_none())
            && target.database_url.is_none()
            && target.services.is_empty()
        {
            return Err(self.err(
                Some(at),
                "[target.count] needs database_url (the target's database)".into(),
            ));
        }
        Ok(target)
    }

    /// `base_urls`, env-expanded, each `http://`, without a trailing `/`.
    fn base_urls(&self, base_urls: &[String], at: usize) -> Result<Vec<String>, ScenarioError> {
        let mut out = Vec::new();
        for u in base_urls {
            let u = self.env(at, "base_urls", u)?;
            // Shown with any password hidden, and masked as every secret is when printed.
            let shown = crate::store::url::redact(&u);
            if !u.starts_with("http://") {
                return Err(self.err(
                    Some(at),
                    format!("base URL {shown:?} must start with http:// (https is not supported)"),
                ));
            }
            let authority = u["http://".len()..]
                .split(['/', '?', '#'])
                .next()
                .unwrap_or("");
            if authority.contains('@') {
                return Err(self.err(
                    Some(at),
                    format!(
                        "base URL {shown:?} has user information, which is never sent: give \
                         credentials in a header (Authorization = \"Bearer ${{TOKEN}}\")"
                    ),
                ));
            }
            self.sendable(at, "base_urls", &HttpRequest::new("GET", &u))?;
            out.push(u.trim_end_matches('/').to_string());
        }
        Ok(out)
    }

    /// `[[target.scopes]]`: unique non-empty names, templated values and headers.
    fn scopes(&self, raw: &[Spanned<RawScope>]) -> Result<Vec<Scope>, ScenarioError> {
        let mut scopes = Vec::new();
        for s in raw {
            let at = s.span().start;
            let s = s.get_ref();
            if scopes.iter().any(|x: &Scope| x.name == s.name) || s.name.is_empty() {
                return Err(self.err(
                    Some(at),
                    format!("scope name {:?} is empty or given twice", s.name),
                ));
            }
            scopes.push(Scope {
                name: s.name.clone(),
                value: self.template(at, "scope value", s.value.as_deref().unwrap_or(&s.name))?,
                headers: self.headers(at, "scope headers", &s.headers)?,
            });
        }
        Ok(scopes)
    }

    /// `[target.id]`: where a created ticket's id is read (default: the body's `/id`).
    fn id_source(&self, raw: Option<&Spanned<RawId>>) -> Result<IdSource, ScenarioError> {
        Ok(match raw {
            None => IdSource::Pointer("/id".into()),
            Some(id) => {
                let at = id.span().start;
                let id = id.get_ref();
                match (&id.pointer, &id.header) {
                    (Some(p), None) if id.regex.is_none() => {
                        IdSource::Pointer(self.pointer(at, "[target.id]", p)?)
                    }
                    (None, Some(h)) => IdSource::Header {
                        name: h.clone(),
                        regex: match &id.regex {
                            Some(re) => {
                                let re = self.regex(at, "[target.id] regex", re)?;
                                if re.captures_len() != 2 {
                                    return Err(self.err(
                                        Some(at),
                                        "[target.id] regex needs exactly one capture group".into(),
                                    ));
                                }
                                Some(re)
                            }
                            None => None,
                        },
                    },
                    _ => {
                        return Err(self.err(
                            Some(at),
                            "[target.id] needs either pointer or header (with an optional regex)"
                                .into(),
                        ))
                    }
                }
            }
        })
    }

    /// `[target.replay]`; `any_replayed_rule`: some rule classifies an answer as replayed.
    fn replay(
        &self,
        raw: Option<&Spanned<RawReplay>>,
        any_replayed_rule: bool,
    ) -> Result<ReplaySpec, ScenarioError> {
        Ok(match raw {
            None => ReplaySpec {
                marked: any_replayed_rule,
                same_answer: false,
                ignore: Vec::new(),
            },
            Some(r) => {
                let at = r.span().start;
                let r = r.get_ref();
                if r.marked == Some(true) && !any_replayed_rule {
                    return Err(self.err(
                        Some(at),
                        "replay.marked = true but no rule classifies an answer as replayed".into(),
                    ));
                }
                ReplaySpec {
                    marked: r.marked.unwrap_or(any_replayed_rule),
                    same_answer: r.same_answer,
                    ignore: r
                        .ignore
                        .iter()
                        .map(|p| self.pointer(at, "replay.ignore", p))
                        .collect::<Result<_, _>>()?,
                }
            }
        })
    }

    /// `[target.retry]` and the statuses it retries (default: 10 attempts, 25 ms doubling to
    /// 1000 ms, transport errors retried).
    fn retry(
        &self,
        raw: Option<&Spanned<RawRetry>>,
    ) -> Result<(RetrySpec, Vec<u16>), ScenarioError> {
        Ok(match raw {
            None => (
                RetrySpec {
                    attempts: 10,
                    backoff_ms: 25,
                    max_backoff_ms: 1000,
                    transport_errors: true,
                },
                Vec::new(),
            ),
            Some(r) => {
                let at = r.span().start;
                let r = r.get_ref();
                let attempts = r.attempts.unwrap_or(10);
                if attempts == 0 {
                    return Err(self.err(Some(at), "retry.attempts must be at least 1".into()));
                }
                if let Some(s) = r.statuses.iter().find(|s| !(100..=599).contains(*s)) {
                    return Err(self.err(
                        Some(at),
                        format!("retry.statuses: {s} is not an HTTP status"),
                    ));
                }
                (
                    RetrySpec {
                        attempts,
                        backoff_ms: r.backoff_ms.unwrap_or(25),
                        max_backoff_ms: r.max_backoff_ms.unwrap_or(1000),
                        transport_errors: r.transport_errors.unwrap_or(true),
                    },
                    r.statuses.clone(),
                )
            }
        })
    }

    /// `[target.count]`: each query env-expanded and validated, with `{scope}`, `{key}` and
    /// `{run}` bound as parameters. A string is SQL; a table `{ redis = … }` is a Redis count
    /// (a command as an array of words, or one string split at whitespace), which needs
    /// `redis_url`.
    ///
    /// Long because SQL and Redis counts are validated side by side, query by query, each
    /// refused with its own message.
    fn count_queries(
        &self,
        raw: &BTreeMap<String, Spanned<toml::Value>>,
        redis_url: Option<&str>,
    ) -> Result<Vec<CountQuery>, ScenarioError> {
        let mut counts = Vec::new();
        for (name, value) in raw {
            let at = value.span().start;
            let origin = format!(
                "{}:{}",
                self.path.display(),
                self.text[..at.min(self.text.len())].matches('\n').count() + 1
            );
            let only_bound = |params: &[&str]| -> Result<(), ScenarioError> {
                if params.iter().any(|p| matches!(*p, "racer" | "n")) {
                    return Err(self.err(
                        Some(at),
                        format!(
                            "count query {name:?}: only {{scope}}, {{key}} and {{run}} can be bound"
                        ),
                    ));
                }
                Ok(())
            };
            match value.get_ref() {
                toml::Value::String(sql) => {
                    let sql = self.env(at, "count query", sql)?;
                    template::validate(&sql)
                        .map_err(|e| self.template_err(at, "count query", e))?;
                    let (bound_sql, params) = bind_placeholders(&sql);
                    only_bound(&params)?;
                    counts.push(CountQuery {
                        name: name.clone(),
                        sql,
                        bound_sql,
                        params,
                        origin,
                        redis: None,
                    });
                }
                toml::Value::Table(t) => {
                    let what = format!("count {name:?}");
                    if let Some(k) = t.keys().find(|k| k.as_str() != "redis") {
                        return Err(self.err(
                            Some(at),
                            format!("{what}: unknown field {k:?} (a table count takes redis = [\"COMMAND\", \"arg\", …])"),
                        ));
                    }
                    let words: Vec<String> = match t.get("redis") {
                        Some(toml::Value::Array(a)) => a
                            .iter()
                            .map(|w| match w {
                                toml::Value::String(s) => Ok(s.clone()),
                                toml::Value::Integer(i) => Ok(i.to_string()),
                                _ => Err(self.err(
                                    Some(at),
                                    format!("{what}: each word of a Redis command is a string or an integer"),
                                )),
                            })
                            .collect::<Result<_, _>>()?,
                        Some(toml::Value::String(s)) => {
                            s.split_whitespace().map(str::to_string).collect()
                        }
                        _ => {
                            return Err(self.err(
                                Some(at),
                                format!("{what}: redis = [\"COMMAND\", \"arg\", …] or \"COMMAND arg …\""),
                            ))
                        }
                    };
                    let mut expanded = Vec::with_capacity(words.len());
                    for w in &words {
                        let w = self.env(at, &what, w)?;
                        template::validate(&w).map_err(|e| self.template_err(at, &what, e))?;
                        expanded.push(w);
                    }
                    let words = super::redis_store::check_count_command(&expanded)
                        .map_err(|m| self.err(Some(at), format!("{what}: {m}")))?;
                    if redis_url.is_none() {
                        return Err(self.err(
                            Some(at),
                            format!("{what} is a Redis count: it needs [target] redis_url (the Redis it counts in)"),
                        ));
                    }
                    let params = placeholders_in(&words);
                    only_bound(&params)?;
                    counts.push(CountQuery {
                        name: name.clone(),
                        sql: words.join(" "),
                        bound_sql: String::new(),
                        params,
                        origin,
                        redis: Some(words),
                    });
                }
                _ => {
                    return Err(self.err(
                        Some(at),
                        format!("count {name:?}: expected SQL text or a table {{ redis = [\"COMMAND\", \"arg\", …] }}"),
                    ))
                }
            }
        }
        Ok(counts)
    }

    fn request(&self, r: Option<Spanned<RawRequest>>) -> Result<RequestTemplate, ScenarioError> {
        let Some(r) = r else {
            return Err(self.err(
                None,
                "[target.request] is missing (method, path, body)".into(),
            ));
        };
        let at = r.span().start;
        let r = r.into_inner();
        let method = r
            .method
            .unwrap_or_else(|| "POST".into())
            .to_ascii_uppercase();
        if method.is_empty() || !method.bytes().all(|b| b.is_ascii_alphabetic()) {
            return Err(self.err(
                Some(at),
                format!("request method {method:?} is not a token"),
            ));
        }
        let path = self.template(at, "request path", r.path.as_deref().unwrap_or("/"))?;
        if !path.starts_with('/') {
            return Err(self.err(Some(at), format!("request path {path:?} must start with /")));
        }
        self.sendable(
            at,
            "request path",
            &HttpRequest::new(&method, format!("{SAMPLE_BASE_URL}{}", sample(&path))),
        )?;
        if r.content_type.is_some() && r.raw.is_none() {
            return Err(self.err(
                Some(at),
                "content_type goes with raw (a JSON body is application/json)".into(),
            ));
        }
        let body = self
            .body(
                at,
                "request body",
                r.body.as_ref(),
                r.raw.as_ref(),
                r.content_type.as_ref(),
            )?
            .unwrap_or(BodyTemplate::Empty);
        let key_header = r.key_header.unwrap_or_else(|| "Idempotency-Key".into());
        self.sendable(
            at,
            "request key_header",
            &HttpRequest::new(&method, SAMPLE_BASE_URL).with_header(&key_header, "k"),
        )?;
        Ok(RequestTemplate {
            method,
            path,
            key_header,
            key: self.template(
                at,
                "request key",
                r.key.as_deref().unwrap_or(DEFAULT_KEY_TEMPLATE),
            )?,
            headers: self.headers(at, "request headers", &r.headers)?,
            body,
        })
    }

    fn rule(&self, r: &Spanned<RawRule>) -> Result<Rule, ScenarioError> {
        let at = r.span().start;
        let r = r.get_ref();
        let status = r
            .status
            .as_ref()
            .map(super::rules::StatusMatch::parse)
            .transpose()
            .map_err(|e| self.err(Some(at), e.to_string()))?;
        let header = match (&r.header, &r.header_value, &r.header_regex) {
            (None, None, None) => None,
            (None, _, _) => {
                return Err(self.err(Some(at), "header_value/header_regex need header".into()))
            }
            (Some(_), Some(_), Some(_)) => {
                return Err(self.err(
                    Some(at),
                    "give header_value or header_regex, not both".into(),
                ))
            }
            (Some(h), Some(v), None) => Some((h.clone(), HeaderTest::Equals(v.clone()))),
            (Some(h), None, Some(re)) => Some((
                h.clone(),
                HeaderTest::Matches(self.regex(at, "header_regex", re)?),
            )),
            (Some(h), None, None) => Some((h.clone(), HeaderTest::Present)),
        };
        let pointer = match (&r.pointer, &r.equals) {
            (None, None) => None,
            (None, Some(_)) => return Err(self.err(Some(at), "equals needs pointer".into())),
            (Some(p), eq) => Some((
                self.pointer(at, "rule pointer", p)?,
                match eq {
                    None => PointerTest::Present,
                    Some(v) => PointerTest::Equals(toml_to_json(v)),
                },
            )),
        };
        let body_regex = r
            .body_regex
            .as_deref()
            .map(|re| self.regex(at, "body_regex", re))
            .transpose()?;
        if r.outcome == AnswerKind::Timeout {
            return Err(self.err(
                Some(at),
                "a rule cannot give outcome \"timeout\": it is what the runner records when no answer came within the request timeout".into(),
            ));
        }
        Ok(Rule {
            status,
            header,
            pointer,
            body_regex,
            outcome: r.outcome,
            origin: format!(
                "{}:{}",
                self.path.display(),
                self.text[..at].matches('\n').count() + 1
            ),
        })
    }

    /// Long because it validates the `[barrier]` table field by field against the target (each
    /// barrier kind needs its own fields), each refused with its own message.
    fn barrier(
        &self,
        b: Option<Spanned<RawBarrier>>,
        target: &Target,
    ) -> Result<TargetBarrier, ScenarioError> {
        let Some(b) = b else {
            return Err(self.err(
                None,
                "[barrier] is missing: kind = \"table-lock\" (with table), \"advisory\" (with advisory_key) or \"http\"".into(),
            ));
        };
        let at = b.span().start;
        let b = b.into_inner();
        let kind = match b.kind.as_deref() {
            Some("table-lock") | None => {
                let Some(table) = b.table else {
                    return Err(self.err(Some(at), "barrier kind table-lock needs table".into()));
                };
                let valid = !table.is_empty()
                    && table
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
                if !valid {
                    return Err(self.err(
                        Some(at),
                        format!("barrier table {table:?} must be a plain (optionally schema-qualified) name"),
                    ));
                }
                let access_exclusive = match b.lock.as_deref() {
                    None | Some("access-exclusive") => true,
                    Some("exclusive") => false,
                    Some(other) => {
                        return Err(self.err(
                            Some(at),
                            format!(
                                "barrier lock {other:?}: expected access-exclusive or exclusive"
                            ),
                        ))
                    }
                };
                if b.advisory_key.is_some() {
                    return Err(self.err(
                        Some(at),
                        "advisory_key goes with kind = \"advisory\"".into(),
                    ));
                }
                BarrierKind::TableLock {
                    table,
                    access_exclusive,
                }
            }
            Some("advisory") => {
                let Some(key) = b.advisory_key else {
                    return Err(
                        self.err(Some(at), "barrier kind advisory needs advisory_key".into())
                    );
                };
                if b.table.is_some() || b.lock.is_some() {
                    return Err(self.err(
                        Some(at),
                        "table and lock go with kind = \"table-lock\"".into(),
                    ));
                }
                BarrierKind::Advisory { key }
            }
            Some("http") => {
                if b.table.is_some() || b.lock.is_some() || b.advisory_key.is_some() {
                    return Err(self.err(
                        Some(at),
                        "kind = \"http\" takes no table, lock or advisory_key".into(),
                    ));
                }
                BarrierKind::Http
            }
            Some("interposer") => {
                if b.table.is_some() || b.lock.is_some() || b.advisory_key.is_some() {
                    return Err(self.err(
                        Some(at),
                        "kind = \"interposer\" takes no table, lock or advisory_key".into(),
                    ));
                }
                BarrierKind::Interposer
            }
            Some("redis-pause") => {
                if b.table.is_some() || b.lock.is_some() || b.advisory_key.is_some() {
                    return Err(self.err(
                        Some(at),
                        "kind = \"redis-pause\" takes no table, lock or advisory_key".into(),
                    ));
                }
                if target.redis_url.is_none() {
                    return Err(self.err(
                        Some(at),
                        "barrier kind redis-pause needs [target] redis_url (the Redis whose writes it pauses)".into(),
                    ));
                }
                BarrierKind::RedisPause
            }
            Some(other) => {
                return Err(self.err(
                    Some(at),
                    format!(
                        "barrier kind {other:?}: expected table-lock, advisory, http, interposer or redis-pause"
                    ),
                ))
            }
        };
        if kind.needs_database() && target.database_url.is_none() && target.services.is_empty() {
            return Err(self.err(
                Some(at),
                format!("barrier kind {} needs [target] database_url", kind.name()),
            ));
        }
        let timeout_ms = b.timeout_ms.unwrap_or(10_000);
        if timeout_ms == 0 {
            return Err(self.err(Some(at), "barrier timeout_ms must be at least 1".into()));
        }
        Ok(TargetBarrier { kind, timeout_ms })
    }

    /// Long because it validates every `[[racers]]` entry's fields one after another, each
    /// refused with its own message at the entry's line, and expands `count`.
    fn racers(
        &self,
        raw: &[Spanned<RawRacer>],
        target: &Target,
    ) -> Result<(Vec<TargetRacer>, Groups), ScenarioError> {
        let endpoints = target.endpoints();
        let mut racers: Vec<TargetRacer> = Vec::new();
        let mut seen: BTreeSet<String> = BTreeSet::new();
        let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for r in raw {
            let at = r.span().start;
            let r = r.get_ref();
            if r.name.is_empty() || groups.contains_key(&r.name) {
                return Err(self.err(
                    Some(at),
                    format!("racer name {:?} is empty or given twice", r.name),
                ));
            }
            let scope = match (&r.scope, target.scopes.is_empty()) {
                (Some(s), false) if target.scopes.iter().any(|x| &x.name == s) => Some(s.clone()),
                (Some(s), false) => {
                    return Err(self.err(
                        Some(at),
                        format!("racer {:?}: no scope {s:?} in [[target.scopes]]", r.name),
                    ))
                }
                (Some(_), true) => {
                    return Err(self.err(
                        Some(at),
                        format!(
                            "racer {:?} names a scope but the target has no [[target.scopes]]",
                            r.name
                        ),
                    ))
                }
                (None, false) => {
                    return Err(self.err(
                        Some(at),
                        format!(
                            "racer {:?} needs a scope (the target has [[target.scopes]])",
                            r.name
                        ),
                    ))
                }
                (None, true) => None,
            };
            let via = r
                .via
                .as_deref()
                .map(|v| {
                    self.env(at, "via", v)
                        .map(|v| v.trim_end_matches('/').to_string())
                })
                .transpose()?;
            if let Some(v) = &via {
                if !endpoints.contains(v) {
                    return Err(self.err(Some(at), format!("racer {:?} goes via {v:?}, which is not a service or base URL of the target", r.name)));
                }
            }
            let key = r.key.clone().unwrap_or_else(|| "k1".into());
            if key.contains(['{', '}']) {
                return Err(self.err(Some(at), format!("racer {:?}: key is a logical name; placeholders belong in [target.request] key", r.name)));
            }
            let body = self.body(at, "racer body", r.body.as_ref(), r.raw.as_ref(), None)?;
            // A racer's raw text keeps the request's content type.
            let body = match (body, &target.request.body) {
                (Some(BodyTemplate::Raw { text, .. }), BodyTemplate::Raw { content_type, .. }) => {
                    Some(BodyTemplate::Raw {
                        text,
                        content_type: content_type.clone(),
                    })
                }
                (b, _) => b,
            };
            let wave = r.wave.unwrap_or(1);
            if wave == 0 {
                return Err(self.err(Some(at), "wave must be at least 1".into()));
            }
            let n = match r.count {
                Some(0) => return Err(self.err(Some(at), "count must be at least 1".into())),
                Some(n) if n > MAX_RACERS.saturating_sub(racers.len()) => {
                    return Err(self.err(
                        Some(at),
                        format!(
                            "more than {MAX_RACERS} racers (count, over all [[racers]]); a run \
                             is also refused when this process cannot open a connection each"
                        ),
                    ))
                }
                Some(n) => n,
                None => 1,
            };
            let names: Vec<String> = if r.count.is_none() {
                vec![r.name.clone()]
            } else {
                (1..=n).map(|i| format!("{}-{i}", r.name)).collect()
            };
            for name in &names {
                if !seen.insert(name.clone()) {
                    return Err(self.err(Some(at), format!("duplicate racer name {name:?}")));
                }
                racers.push(TargetRacer {
                    name: name.clone(),
                    group: r.name.clone(),
                    n: racers.len() + 1,
                    scope: scope.clone(),
                    key: key.clone(),
                    body: body.clone(),
                    via: via.clone(),
                    wave,
                    expect: r.expect.as_ref().map(RawKinds::set).unwrap_or_default(),
                });
            }
            groups.insert(r.name.clone(), names.clone());
            for name in names {
                groups.entry(name.clone()).or_insert_with(|| vec![name]);
            }
        }
        Ok((racers, groups))
    }

    fn count_expectations(
        &self,
        raw: &[Spanned<RawCounts>],
        target: &Target,
        racers: &[TargetRacer],
    ) -> Result<Vec<CountExpectation>, ScenarioError> {
        let mut out = Vec::new();
        for c in raw {
            let at = c.span().start;
            let c = c.get_ref();
            if let Some(s) = &c.scope {
                if !target.scopes.iter().any(|x| &x.name == s) {
                    return Err(self.err(Some(at), format!("expect.counts: no scope {s:?}")));
                }
            }
            if let Some(k) = &c.key {
                if !racers.iter().any(|r| &r.key == k) {
                    return Err(
                        self.err(Some(at), format!("expect.counts: no racer uses key {k:?}"))
                    );
                }
            }
            let mut values = BTreeMap::new();
            for (name, v) in &c.values {
                let Some(q) = target.counts.iter().find(|q| &q.name == name) else {
                    return Err(self.err(
                        Some(at),
                        format!("expect.counts: {name:?} is not a query of [target.count]"),
                    ));
                };
                let toml::Value::Integer(v) = v else {
                    return Err(self.err(
                        Some(at),
                        format!("expect.counts: {name} must be an integer"),
                    ));
                };
                for (p, given) in [("scope", c.scope.is_some()), ("key", c.key.is_some())] {
                    if q.params.contains(&p) && !given {
                        return Err(self.err(
                            Some(at),
                            format!("expect.counts: query {name:?} uses {{{p}}}; give {p} = …"),
                        ));
                    }
                }
                values.insert(name.clone(), *v);
            }
            if values.is_empty() {
                return Err(self.err(Some(at), "expect.counts entry names no query".into()));
            }
            out.push(CountExpectation {
                scope: c.scope.clone(),
                key: c.key.clone(),
                values,
            });
        }
        Ok(out)
    }
}

/// The racer a `[[fault]]` names: an expanded racer's name, a group of one, or a letter (`A`
/// = the scenario's first racer, in file order).
///
/// Will return `Err` with the message for a name that is no racer, a group of several, or a
/// letter past the last racer.
fn racer_index(racers: &[TargetRacer], name: &str) -> Result<usize, String> {
    if let Some(i) = racers.iter().position(|r| r.name == name) {
        return Ok(i);
    }
    let group: Vec<&str> = racers
        .iter()
        .filter(|r| r.group == name)
        .map(|r| r.name.as_str())
        .collect();
    if group.len() > 1 {
        return Err(format!(
            "fault racer {name:?} is a group of {} racers: name one of them ({})",
            group.len(),
            group.join(", ")
        ));
    }
    let mut chars = name.chars();
    if let (Some(c @ 'A'..='Z'), None) = (chars.next(), chars.next()) {
        let i = (c as u8 - b'A') as usize;
        if i < racers.len() {
            return Ok(i);
        }
    }
    Err(format!(
        "fault racer {name:?} is neither a racer's name nor a letter of one (A to {})",
        (b'A' + u8::try_from(racers.len().clamp(1, 26) - 1).unwrap_or(25)) as char
    ))
}

/// Checks a target's `database_url` before anything runs: a `postgres://` or `postgresql://`
/// URL (libpq's URI form, PostgreSQL docs §34.1.1.2) that parses. SQLAlchemy's
/// `postgresql+DRIVER://` form (what Python settings often hold) is refused with the URL to
/// use instead. Passwords never appear in the message.
///
/// Will return `Err` with the message for any other URL.
pub fn check_database_url(url: &str) -> Result<(), String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(format!(
            "database_url {}: expected postgres://USER@HOST:PORT/DATABASE",
            redact(url)
        ));
    };
    let lower = scheme.to_ascii_lowercase();
    if let Some((base, driver)) = lower.split_once('+') {
        if base == "postgres" || base == "postgresql" {
            return Err(format!(
                "database_url {}: the +{driver} driver suffix is SQLAlchemy's, not a PostgreSQL URL; use {}",
                redact(url),
                redact(&format!("postgresql://{rest}"))
            ));
        }
    }
    if lower != "postgres" && lower != "postgresql" {
        return Err(format!(
            "database_url {}: the scheme must be postgres:// or postgresql:// (the target's PostgreSQL database)",
            redact(url)
        ));
    }
    let config = crate::store::url::parse_postgres(url)
        .map_err(|e| format!("database_url {}: {e}", redact(url)))?;
    if !crate::store::url::names_a_host(&config) {
        return Err(format!(
            "database_url {}: names no host: expected postgres://USER@HOST:PORT/DATABASE",
            redact(url)
        ));
    }
    Ok(())
}

/// Replaces each `{scope}`, `{key}`, `{run}` (or other placeholder) in SQL by `$1`, `$2`, …
/// and returns the placeholder behind each parameter. A placeholder used twice is one
/// parameter. Values are bound as text, never spliced into the SQL.
pub fn bind_placeholders(sql: &str) -> (String, Vec<&'static str>) {
    let mut params: Vec<&'static str> = Vec::new();
    let mut out = sql.to_string();
    for p in template::PLACEHOLDERS {
        let token = format!("{{{p}}}");
        if out.contains(&token) {
            params.push(p);
            out = out.replace(&token, &format!("${}::text", params.len()));
        }
    }
    (out, params)
}

/// The per-request placeholders the templates `words` use, in [`template::PLACEHOLDERS`]
/// order (`{{` and `}}` are literal braces, not placeholders).
pub fn placeholders_in(words: &[String]) -> Vec<&'static str> {
    template::PLACEHOLDERS
        .into_iter()
        .filter(|p| {
            // Expanding with only `p` set to a marker shows whether `p` is used.
            let vars: template::Vars = [(*p, "\u{0}".to_string())].into();
            words
                .iter()
                .any(|w| template::expand(w, &vars).contains('\u{0}'))
        })
        .collect()
}

/// A TOML value as JSON (datetimes as their string form).
pub fn toml_to_json(v: &toml::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        toml::Value::String(s) => Value::String(s.clone()),
        toml::Value::Integer(i) => Value::from(*i),
        toml::Value::Float(f) => Value::from(*f),
        toml::Value::Boolean(b) => Value::Bool(*b),
        toml::Value::Datetime(d) => Value::String(d.to_string()),
        toml::Value::Array(a) => Value::Array(a.iter().map(toml_to_json).collect()),
        toml::Value::Table(t) => Value::Object(
            t.iter()
                .map(|(k, v)| (k.clone(), toml_to_json(v)))
                .collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: &str = r#"
name = "t"
description = "d"
[barrier]
kind = "table-lock"
table = "orders"
[target]
base_urls = ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
database_url = "${DB}"
[target.request]
path = "/orders"
headers = { Authorization = "Bearer ${TOKEN}" }
body = { item = "book", note = "{run}-{racer}" }
[[target.rules]]
status = 409
body_regex = "in progress"
outcome = "in-progress"
[target.count]
orders = "SELECT count(*) FROM orders WHERE key = {key}"
[[racers]]
name = "c"
count = 2
key = "k1"
[[expect.counts]]
key = "k1"
orders = 1
"#;

    fn env(n: &str) -> Option<String> {
        match n {
            "DB" => Some("postgres://u@h/d".into()),
            "TOKEN" => Some("s3cret".into()),
            _ => None,
        }
    }

    fn parse(text: &str) -> Result<TargetScenario, ScenarioError> {
        TargetScenario::parse(Path::new("t.toml"), text, &env)
    }

    #[test]
    fn a_full_target_loads_with_its_defaults() {
        let s = parse(OK).unwrap();
        assert_eq!(s.target.database_url.as_deref(), Some("postgres://u@h/d"));
        assert_eq!(s.target.request.headers[0].1, "Bearer s3cret");
        assert_eq!(s.target.request.key, DEFAULT_KEY_TEMPLATE);
        assert_eq!(s.target.preset, Preset::Ietf);
        // The scenario's rule comes before the preset's.
        assert_eq!(s.target.rules[0].outcome, AnswerKind::InProgress);
        assert!(s.target.rules[0].origin.starts_with("t.toml:"));
        assert!(s.target.replay.marked);
        assert_eq!(s.racers.len(), 2);
        assert_eq!(s.counts[0].values["orders"], 1);
        assert_eq!(
            s.target.counts[0].bound_sql,
            "SELECT count(*) FROM orders WHERE key = $1::text"
        );
        assert_eq!(s.target.counts[0].params, ["key"]);
    }

    /// Every bad input is an error with the line it is on.
    #[test]
    fn bad_input_names_the_line() {
        let cases = [
            ("unset variable", "${TOKEN}", "${NOPE}", "NOPE"),
            (
                "malformed pointer",
                "[[racers]]",
                "[target.id]\npointer = \"id\"\n[[racers]]",
                "RFC 6901",
            ),
            (
                "bad regex",
                "\"in progress\"",
                "\"(unclosed\"",
                "invalid regex",
            ),
            (
                "unknown placeholder",
                "{run}-{racer}",
                "{bogus}",
                "unknown placeholder",
            ),
            (
                "unknown field",
                "kind = \"table-lock\"",
                "kind = \"table-lock\"\nbogus = 1",
                "unknown field",
            ),
            ("bad status", "status = 409", "status = \"9xx\"", "status"),
            ("unknown count", "orders = 1", "order = 1", "not a query"),
            (
                "count needs its key",
                "key = \"k1\"\norders = 1",
                "orders = 1",
                "give key",
            ),
            (
                "https",
                "http://127.0.0.1:8002",
                "https://127.0.0.1:8002",
                "http://",
            ),
            (
                "unknown via",
                "count = 2",
                "count = 2\nvia = \"api-z\"",
                "not a service",
            ),
            (
                "scope without scopes",
                "count = 2",
                "count = 2\nscope = \"A\"",
                "no [[target.scopes]]",
            ),
            (
                "barrier kind",
                "kind = \"table-lock\"",
                "kind = \"telepathy\"",
                "expected table-lock",
            ),
            (
                "odd table",
                "table = \"orders\"",
                "table = \"orders; DROP TABLE x\"",
                "plain",
            ),
        ];
        for (what, from, to, needle) in cases {
            let text = OK.replacen(from, to, 1);
            assert_ne!(text, OK, "{what}: nothing replaced");
            let e = parse(&text).unwrap_err();
            assert!(e.line.is_some(), "{what}: {e}");
            assert!(e.to_string().contains(needle), "{what}: {e}");
        }
    }

    #[test]
    fn a_raw_json_body_that_is_not_json_is_refused_and_text_is_not_checked() {
        let raw = |ct: &str| {
            OK.replace(
                "body = { item = \"book\", note = \"{run}-{racer}\" }",
                &format!("raw = '{{{{\"item\": \"{{run}}\",'\ncontent_type = \"{ct}\""),
            )
        };
        let e = parse(&raw("application/json")).unwrap_err();
        assert!(e.message.contains("not JSON") && e.line.is_some(), "{e}");
        assert!(parse(&raw("text/plain")).is_ok());
    }

    #[test]
    fn a_rule_set_that_classifies_nothing_as_created_is_refused() {
        let text = OK.replace("[target.request]", "preset = \"none\"\n[target.request]");
        let e = parse(&text).unwrap_err();
        assert!(e.message.contains("created"), "{e}");
        assert!(e.line.is_some());
    }

    /// `OK` with a Redis count `effects` (written as `count`) expected for key k1, and
    /// `redis_url` when `with_url`.
    fn with_redis_count(count: &str, with_url: bool) -> String {
        let text = OK
            .replacen(
                "[target.count]\n",
                &format!("[target.count]\neffects = {count}\n"),
                1,
            )
            .replacen("orders = 1\n", "orders = 1\neffects = 1\n", 1);
        if with_url {
            text.replacen(
                "[target.request]",
                "redis_url = \"redis://127.0.0.1:6379/11\"\n[target.request]",
                1,
            )
        } else {
            text
        }
    }

    #[test]
    fn a_redis_count_is_a_read_only_command_with_bound_placeholders() {
        for written in [
            r#"{ redis = ["scard", "orders:{key}"] }"#,
            r#"{ redis = "SCARD orders:{key}" }"#,
        ] {
            let s = parse(&with_redis_count(written, true)).unwrap();
            let q = s
                .target
                .counts
                .iter()
                .find(|q| q.name == "effects")
                .unwrap();
            assert_eq!(
                q.redis.as_deref(),
                Some(&["SCARD".to_string(), "orders:{key}".to_string()][..]),
                "{written}"
            );
            assert_eq!(q.params, ["key"]);
            assert_eq!(s.counts[0].values["effects"], 1);
        }
    }

    #[test]
    fn a_redis_count_is_refused_without_redis_url_or_with_a_command_that_writes() {
        let cases = [
            (
                r#"{ redis = "GET effects:{key}" }"#,
                false,
                "needs [target] redis_url",
            ),
            (
                r#"{ redis = "INCR effects:{key}" }"#,
                true,
                "not a read-only count command",
            ),
            (
                r#"{ redis = ["DEL", "effects:{key}"] }"#,
                true,
                "not a read-only count command",
            ),
            (r#"{ redis = "" }"#, true, "empty"),
            (
                r#"{ redis = "GET e:{racer}" }"#,
                true,
                "only {scope}, {key} and {run}",
            ),
            (r#"{ sql = "SELECT 1" }"#, true, "unknown field"),
            ("3", true, "expected SQL text or a table"),
        ];
        for (written, with_url, needle) in cases {
            let e = parse(&with_redis_count(written, with_url)).unwrap_err();
            assert!(e.line.is_some(), "{written}: {e}");
            assert!(e.to_string().contains(needle), "{written}: {e}");
        }
    }

    #[test]
    fn the_redis_pause_barrier_needs_redis_url_and_no_database() {
        let pause = |url: bool| {
            let text = OK
                .replacen(
                    "kind = \"table-lock\"\ntable = \"orders\"",
                    "kind = \"redis-pause\"",
                    1,
                )
                .replacen("database_url = \"${DB}\"\n", "", 1)
                .replacen(
                    "[target.count]\norders = \"SELECT count(*) FROM orders WHERE key = {key}\"\n",
                    "[target.count]\norders = { redis = \"GET orders:{key}\" }\n",
                    1,
                );
            if url {
                text.replacen(
                    "[target.request]",
                    "redis_url = \"redis://127.0.0.1:6379/11\"\n[target.request]",
                    1,
                )
            } else {
                text
            }
        };
        let s = parse(&pause(true)).unwrap();
        assert_eq!(s.barrier.kind, BarrierKind::RedisPause);
        assert!(!s.barrier.kind.needs_database());
        assert!(s.barrier.kind.describe().contains("reads were not held"));
        let e = parse(&pause(false)).unwrap_err();
        assert!(e.line.is_some(), "{e}");
        assert!(e.to_string().contains("needs [target] redis_url"), "{e}");
    }

    const INTERPOSED: &str = r#"
name = "t"
description = "d"
[barrier]
kind = "interposer"
[target]
own_service = true
lock_ttl_ms = 2000
[target.request]
path = "/v1/tickets"
body = { title = "x" }
[[target.service]]
name = "api"
command = ["{ticketflow}", "serve", "--database-url", "{database_url}"]
[[racers]]
name = "r"
count = 2
[[fault]]
racer = "r-2"
match = "COMMIT"
cut = "after"
"#;

    #[test]
    fn a_fault_names_its_racer_step_and_cut_and_bad_ones_name_their_line() {
        let s = parse(INTERPOSED).unwrap();
        assert_eq!(s.target.lock_ttl_ms, Some(2000));
        assert_eq!(s.faults.len(), 1);
        let f = &s.faults[0];
        assert_eq!((f.racer, f.cut, f.store), (1, Cut::After, None));
        assert_eq!(f.at, FaultAt::Match("COMMIT".into()));
        assert_eq!(
            f.describe(&s, &f.at),
            "cut after r-2's step matching \"COMMIT\""
        );
        // A letter names the scenario's racer in file order.
        let by_letter = parse(&INTERPOSED.replace("racer = \"r-2\"", "racer = \"A\"")).unwrap();
        assert_eq!(by_letter.faults[0].racer, 0);
        let cases = [
            (
                "no such racer",
                "racer = \"r-2\"",
                "racer = \"zed\"",
                "neither a racer",
            ),
            (
                "a letter past the racers",
                "racer = \"r-2\"",
                "racer = \"C\"",
                "A to B",
            ),
            (
                "a group of two",
                "racer = \"r-2\"",
                "racer = \"r\"",
                "group of 2",
            ),
            (
                "step and match",
                "match = \"COMMIT\"",
                "match = \"COMMIT\"\nstep = 2",
                "exactly one of",
            ),
            ("neither", "match = \"COMMIT\"\n", "", "exactly one of"),
            ("step 0", "match = \"COMMIT\"", "step = 0", "from 1"),
            (
                "empty match",
                "match = \"COMMIT\"",
                "match = \" \"",
                "empty",
            ),
            ("no cut", "cut = \"after\"", "", "needs cut"),
            (
                "a bad cut",
                "cut = \"after\"",
                "cut = \"during\"",
                "unknown variant",
            ),
            (
                "redis without redis_url",
                "cut = \"after\"",
                "cut = \"after\"\nstore = \"redis\"",
                "redis_url",
            ),
            (
                "an unknown store",
                "cut = \"after\"",
                "cut = \"after\"\nstore = \"mysql\"",
                "expected postgres or redis",
            ),
            (
                "two on one racer",
                "cut = \"after\"\n",
                "cut = \"after\"\n[[fault]]\nracer = \"B\"\nstep = 1\ncut = \"before\"\n",
                "one per racer",
            ),
            (
                "each with another",
                "cut = \"after\"\n",
                "cut = \"after\"\n[[fault]]\nracer = \"A\"\neach = true\ncut = \"before\"\n",
                "only [[fault]]",
            ),
            (
                "first point",
                "kind = \"interposer\"",
                "kind = \"interposer\"\n[schedule]\nmode = \"first-point\"",
                "one at a time",
            ),
            (
                "a zero TTL",
                "lock_ttl_ms = 2000",
                "lock_ttl_ms = 0",
                "at least 1",
            ),
        ];
        for (what, from, to, needle) in cases {
            let text = INTERPOSED.replacen(from, to, 1);
            assert_ne!(text, INTERPOSED, "{what}: nothing replaced");
            let e = parse(&text).unwrap_err();
            assert!(e.line.is_some(), "{what}: {e}");
            assert!(e.to_string().contains(needle), "{what}: {e}");
        }
        // Faults are cut at the interposer: with another barrier they are refused.
        let e = parse(&OK.replace(
            "[[racers]]",
            "[[fault]]\nracer = \"A\"\nstep = 1\ncut = \"before\"\n[[racers]]",
        ))
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("goes with [barrier] kind = \"interposer\""),
            "{e}"
        );
        assert!(e.line.is_some());
    }

    #[test]
    fn a_black_box_scenario_name_is_a_slug_checked_at_load() {
        let first = OK.lines().find(|l| l.starts_with("name = ")).unwrap();
        for bad in ["../../../../x", "", "two words"] {
            let e = parse(&OK.replacen(first, &format!("name = {bad:?}"), 1)).unwrap_err();
            assert!(e.message.contains("scenario name"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn target_files_are_told_from_library_scenarios() {
        assert!(is_target_file(OK));
        assert!(!is_target_file("name = \"x\"\n[[racers]]\nname = \"r\"\n"));
    }

    #[test]
    fn a_running_interposer_is_named_by_a_loopback_control_address_with_base_urls_and_database_url()
    {
        let interposed = OK
            .replace(
                "kind = \"table-lock\"\ntable = \"orders\"",
                "kind = \"interposer\"",
            )
            .replace(
                "database_url = \"${DB}\"",
                "database_url = \"${DB}\"\ninterposer = \"127.0.0.1:7000\"",
            );
        let s = parse(&interposed).unwrap();
        assert_eq!(s.target.interposer, Some("127.0.0.1:7000".parse().unwrap()));
        assert!(s.schedule.is_some());
        let cases = [
            (
                "off loopback",
                "127.0.0.1:7000",
                "10.0.0.1:7000",
                "loopback IP:PORT",
            ),
            ("no port", "127.0.0.1:7000", "127.0.0.1", "loopback IP:PORT"),
            (
                "without database_url",
                "database_url = \"${DB}\"\n",
                "",
                "goes with base_urls",
            ),
            (
                "another barrier",
                "kind = \"interposer\"",
                "kind = \"http\"",
                "goes with [barrier] kind",
            ),
        ];
        for (what, from, to, expected) in cases {
            assert!(interposed.contains(from), "{what}");
            let e = parse(&interposed.replacen(from, to, 1))
                .unwrap_err()
                .to_string();
            assert!(e.contains(expected), "{what}: {e}");
        }
        // Without it, the interposer barrier still needs services the runner starts.
        let e = parse(&interposed.replace("interposer = \"127.0.0.1:7000\"\n", ""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("[target] interposer"), "{e}");
    }
}
