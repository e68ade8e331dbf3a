//! Scenario files: TOML, one race per file, unknown fields rejected. Parse and validation
//! errors name the file and line.
//!
//! ```toml
//! name = "same-key-same-body"
//! description = "two racers, same tenant, key and body"
//!
//! [[setup]]                       # committed before the race (optional)
//! tenant = "A"
//! key = "key-0"
//! request = { actor_id = "u1", title = "x", body = "y", priority = "high" }
//!
//! [barrier]
//! timeout_ms = 10000              # how long racers may take to reach the barrier
//! lock = "access-exclusive"       # PostgreSQL: access-exclusive | exclusive | advisory
//!
//! [[racers]]
//! name = "api-a"                  # `count = N` expands to api-a-1 .. api-a-N
//! tenant = "A"
//! key = "key-1"
//! request = { actor_id = "u1", title = "x", body = "y", priority = "high" }
//!
//! [expect]                        # required, even if empty: a file cut short lacks it
//! created = 1                     # racers whose outcome is `created`
//! outcomes = { api-a = ["created", "replayed"] }
//! same_ticket = [["api-a", "api-b"]]
//! rows = [{ tenant = "A", tickets = 1, receipts = 1, created_events = 1 }]
//! ```
//!
//! A scenario with Redis in the loop adds a `[lease]` table (see [`LeaseEvent`] and
//! [`crate::scenario::lease`]): two racers with one tenant and key, the first the holder,
//! the second the request that comes while the holder is paused.
//!
//! ```toml
//! [lease]
//! event = "expire"                # expire | two-tokens | flush | restart | redis-down
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

use ticketflow_core::domain::{OutcomeKind, TicketRequest};
use ticketflow_core::store::postgres::IsolationLevel;
use ticketflow_core::store::Backend;

/// The most racers a scenario file may expand to (after `count` and `scale`), whatever the
/// machine: a bound on what loading a file may allocate, far above what any backend holds.
pub const MAX_RACERS: usize = 100_000;

/// Longest scenario name, in characters.
pub(crate) const NAME_LIMIT: usize = 100;

/// Checks a scenario's `name`: a slug of ASCII letters, digits, `-`, `_` and `.`, not empty,
/// at most [`NAME_LIMIT`] characters, not `.` or `..`. Report and isolation-spec file names are
/// derived from it, so a name is never a path (no separator, no parent).
///
/// Will return `Err` with the reason when it is not such a slug.
pub(crate) fn check_scenario_name(name: &str) -> Result<(), NameError> {
    if name.trim().is_empty() {
        return Err(NameError::Empty);
    }
    if name.chars().count() > NAME_LIMIT {
        return Err(NameError::TooLong);
    }
    if name == "." || name == ".." {
        return Err(NameError::Path(name.to_string()));
    }
    match name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        Some(c) => Err(NameError::Char {
            name: name.to_string(),
            c,
        }),
        None => Ok(()),
    }
}

/// Why a scenario's `name` is not a slug ([`check_scenario_name`]); the `Display` is the message
/// of the file's [`ScenarioError`].
#[derive(Debug, thiserror::Error)]
pub(crate) enum NameError {
    /// The name is empty or blank.
    #[error("scenario name is empty")]
    Empty,
    /// The name is over [`NAME_LIMIT`] characters.
    #[error("scenario name is longer than {NAME_LIMIT} characters")]
    TooLong,
    /// The name is `.` or `..`.
    #[error("scenario name {0:?} is a path, not a name")]
    Path(String),
    /// The name holds a character other than letters, digits, `-`, `_` and `.`.
    #[error(
        "scenario name {name:?}: {c:?} is not allowed (letters, digits, '-', '_' and '.' only: file names are made from it)"
    )]
    Char {
        /// The name.
        name: String,
        /// The first character not allowed.
        c: char,
    },
}

/// A scenario file's bytes as text.
///
/// Will return `Err` naming the line and the byte offset (from 0) of the first byte that is
/// not UTF-8: scenario files are UTF-8 text (TOML 1.0).
pub fn utf8_text(path: &Path, bytes: Vec<u8>) -> Result<String, ScenarioError> {
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let line = e.as_bytes()[..at].iter().filter(|&&b| b == b'\n').count() + 1;
        ScenarioError {
            file: path.to_path_buf(),
            line: Some(line),
            message: format!(
                "not UTF-8: byte {at} (counting from 0) starts no valid UTF-8 character; a scenario file is UTF-8 text (TOML)"
            ),
        }
    })
}

/// A scenario file that cannot be used, with where the problem is.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}{}: {message}", file.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct ScenarioError {
    /// The file.
    pub file: PathBuf,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// What is wrong.
    pub message: String,
}

/// A request committed before the race.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetupRequest {
    /// Tenant id.
    pub tenant: String,
    /// Idempotency key.
    pub key: String,
    /// The request.
    pub request: TicketRequest,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRacer {
    name: Spanned<String>,
    tenant: String,
    key: String,
    request: TicketRequest,
    count: Option<Spanned<usize>>,
}

/// One racer: a create request sent on its own connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Racer {
    /// Unique name (expanded with `-N` when the file says `count`).
    pub name: String,
    /// The name in the file (the group name when `count` expanded it).
    pub group: String,
    /// Tenant id.
    pub tenant: String,
    /// Idempotency key.
    pub key: String,
    /// The request.
    pub request: TicketRequest,
}

/// Where the PostgreSQL barrier holds the racers, and so which race window it opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize, serde::Serialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum LockMode {
    // `help = None`: `--help` lists the bare names, as it always has; these docs are for
    // the code's readers.
    /// `LOCK TABLE idempotency_receipts IN ACCESS EXCLUSIVE MODE`: racers wait at their first
    /// receipt lookup; after the release each decides from a fresh read.
    #[default]
    #[cfg_attr(feature = "cli", value(help = None::<&str>))]
    AccessExclusive,
    /// `LOCK TABLE idempotency_receipts IN EXCLUSIVE MODE`: the lookup (ACCESS SHARE) passes,
    /// racers insert ticket and outbox row and wait at the receipt INSERT (ROW EXCLUSIVE), so
    /// every loser meets the unique violation (docs/PROTOCOL.md §4.2 step 7) on every run.
    #[cfg_attr(feature = "cli", value(help = None::<&str>))]
    Exclusive,
    /// The controller holds a transaction-level advisory lock; each racer's session asks for
    /// it in shared mode right after its receipt lookup, so all racers have seen "no receipt"
    /// before any inserts (the after-lookup barrier, on the server).
    #[cfg_attr(feature = "cli", value(help = None::<&str>))]
    Advisory,
}

impl LockMode {
    /// Kebab-case name, as in scenario files.
    pub fn name(self) -> &'static str {
        match self {
            LockMode::AccessExclusive => "access-exclusive",
            LockMode::Exclusive => "exclusive",
            LockMode::Advisory => "advisory",
        }
    }

    /// The race window this mode opens, in words, for the report.
    pub fn window(self) -> &'static str {
        match self {
            LockMode::AccessExclusive => "held at the first receipt lookup",
            LockMode::Exclusive => {
                "held at the receipt INSERT, after the ticket and outbox inserts"
            }
            LockMode::Advisory => "held after the receipt lookup, before the savepoint",
        }
    }
}

/// What the runner does to the lease in the middle of a race with Redis in the loop
/// ([`crate::scenario::lease`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LeaseEvent {
    /// The holder is paused after its lookup; the runner makes its lease expire (`PEXPIRE`,
    /// then waits until the key is gone); the second request takes the lease and finishes;
    /// then the holder goes on.
    Expire,
    /// As `expire`, but the second request is paused too, after its lookup, while the old
    /// holder finishes and releases: the old holder's release must leave the new holder's
    /// lease in place.
    TwoTokens,
    /// The holder is paused; the runner runs `FLUSHDB` on the lease database (never db 0);
    /// the second request takes the lease and finishes.
    Flush,
    /// A Redis restart without persistence, simulated: `FLUSHDB` and `CLIENT KILL` of the
    /// holder's connection (Redis is shared: a real restart would cut off other users).
    Restart,
    /// Redis is unreachable (a loopback port where nothing listens): both racers go through
    /// without a lease, counted as "no lease". Needs no Redis.
    RedisDown,
}

impl LeaseEvent {
    /// Kebab-case name, as in scenario files.
    pub fn name(self) -> &'static str {
        match self {
            LeaseEvent::Expire => "expire",
            LeaseEvent::TwoTokens => "two-tokens",
            LeaseEvent::Flush => "flush",
            LeaseEvent::Restart => "restart",
            LeaseEvent::RedisDown => "redis-down",
        }
    }

    /// Whether the scenario needs a reachable Redis (PENDING without one).
    pub fn needs_redis(self) -> bool {
        self != LeaseEvent::RedisDown
    }

    /// Whether the runner empties the lease database (refused on db 0).
    pub fn flushes(self) -> bool {
        matches!(self, LeaseEvent::Flush | LeaseEvent::Restart)
    }
}

/// The `[lease]` table of a scenario with Redis in the loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseSpec {
    /// What happens to the lease mid-race.
    pub event: LeaseEvent,
}

/// How racers are run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RacerKind {
    /// One thread per racer, each with its own connection.
    #[default]
    Threads,
    /// One `ticketflow worker` OS process per racer (PostgreSQL only), like two API
    /// processes, `api-a` and `api-b` (docs/PROTOCOL.md §1).
    Processes,
}

/// The barrier's settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BarrierSpec {
    /// Milliseconds racers may take to reach the barrier before the scenario FAILs with
    /// "racers never reached the barrier". Default 10000.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Where PostgreSQL racers are held (SQLite always uses its in-process barrier).
    #[serde(default)]
    pub lock: LockMode,
}

fn default_timeout_ms() -> u64 {
    10_000
}

impl Default for BarrierSpec {
    fn default() -> Self {
        BarrierSpec {
            timeout_ms: default_timeout_ms(),
            lock: LockMode::default(),
        }
    }
}

/// One outcome or a list of allowed outcomes.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum RawOutcomes {
    One(OutcomeKind),
    Many(Vec<OutcomeKind>),
}

/// Expected rows of one tenant after the race.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RowExpectation {
    /// Tickets.
    pub tickets: i64,
    /// Receipts.
    pub receipts: i64,
    /// `ticket.created` outbox rows.
    pub created_events: i64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRows {
    tenant: String,
    tickets: i64,
    receipts: i64,
    created_events: i64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExpect {
    created: Option<usize>,
    replayed: Option<usize>,
    conflict: Option<usize>,
    #[serde(default)]
    outcomes: BTreeMap<String, Spanned<RawOutcomes>>,
    #[serde(default)]
    same_ticket: Vec<Vec<Spanned<String>>>,
    #[serde(default)]
    distinct_tickets: Vec<Vec<Spanned<String>>>,
    #[serde(default)]
    rows: Vec<RawRows>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    name: String,
    description: String,
    backends: Option<Vec<Backend>>,
    isolation: Option<Vec<IsolationLevel>>,
    #[serde(default)]
    racers_as: RacerKind,
    scale: Option<Spanned<Vec<usize>>>,
    #[serde(default)]
    setup: Vec<Spanned<SetupRequest>>,
    #[serde(default)]
    barrier: BarrierSpec,
    #[serde(default)]
    racers: Vec<RawRacer>,
    /// Required: a file cut short inside `[[racers]]` (between two whole racers) parses, and
    /// only the missing `[expect]` shows it.
    expect: Option<RawExpect>,
    lease: Option<Spanned<LeaseSpec>>,
}

/// What a scenario without `[expect]` would expect: nothing (it is refused before use).
static NO_EXPECTATIONS: RawExpect = RawExpect {
    created: None,
    replayed: None,
    conflict: None,
    outcomes: BTreeMap::new(),
    same_ticket: Vec::new(),
    distinct_tickets: Vec::new(),
    rows: Vec::new(),
};

impl RawScenario {
    /// Its `[expect]` table.
    fn expect(&self) -> &RawExpect {
        self.expect.as_ref().unwrap_or(&NO_EXPECTATIONS)
    }
}

/// What must hold after the race. Racer names here are already expanded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Expectations {
    /// Exactly this many racers created (when set).
    pub created: Option<usize>,
    /// Exactly this many replayed (when set).
    pub replayed: Option<usize>,
    /// Exactly this many conflicted (when set).
    pub conflict: Option<usize>,
    /// Allowed outcomes per racer.
    pub outcomes: BTreeMap<String, BTreeSet<OutcomeKind>>,
    /// Groups of racers that must all hold one and the same ticket id.
    pub same_ticket: Vec<Vec<String>>,
    /// Groups of racers whose ticket ids must all differ.
    pub distinct_tickets: Vec<Vec<String>>,
    /// Expected row counts per tenant.
    pub rows: BTreeMap<String, RowExpectation>,
}

/// A parsed and validated scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// The file it came from.
    pub file: PathBuf,
    /// Short name (used in reports and scratch database names).
    pub name: String,
    /// What it shows.
    pub description: String,
    /// Backends it runs on (default both).
    pub backends: Vec<Backend>,
    /// PostgreSQL isolation levels it runs at (default all three).
    pub isolation: Vec<IsolationLevel>,
    /// Threads or processes.
    pub racers_as: RacerKind,
    /// The multiplier applied to every racer's `count` for this variant (1 without `scale`).
    pub scale: usize,
    /// Whether the file had `scale` (a racer-count sweep; the report times each variant).
    pub scaled: bool,
    /// Requests committed before the race.
    pub setup: Vec<SetupRequest>,
    /// Barrier settings.
    pub barrier: BarrierSpec,
    /// Racers, expanded.
    pub racers: Vec<Racer>,
    /// Expectations.
    pub expect: Expectations,
    /// Redis in the loop: what the runner does to the lease ([`crate::scenario::lease`]).
    pub lease: Option<LeaseSpec>,
}

impl Scenario {
    /// Reads and validates a scenario file.
    ///
    /// Will return `Err` naming the file (and line, where known) for unreadable files, TOML
    /// syntax errors, unknown fields, no racers, duplicate racer names or an expectation that
    /// names an unknown racer. A file with `scale = [..]` gives one scenario per factor,
    /// named `<name>-n<racers>`.
    pub fn load(path: &Path) -> Result<Vec<Scenario>, ScenarioError> {
        let bytes = std::fs::read(path).map_err(|e| ScenarioError {
            file: path.to_path_buf(),
            line: None,
            message: format!("cannot read: {e}"),
        })?;
        Scenario::parse(path, &utf8_text(path, bytes)?)
    }

    /// Parses scenario text; `path` is only used in errors and reports.
    pub fn parse(path: &Path, text: &str) -> Result<Vec<Scenario>, ScenarioError> {
        let err = |offset: Option<usize>, message: String| ScenarioError {
            file: path.to_path_buf(),
            line: offset.map(|o| line_of(text, o)),
            message,
        };
        let raw: RawScenario = toml::from_str(text)
            .map_err(|e| err(e.span().map(|s| s.start), e.message().to_string()))?;
        if raw.racers_as == RacerKind::Processes
            && raw.backends.as_deref() != Some(&[Backend::Postgres][..])
        {
            return Err(err(
                None,
                "racers_as = \"processes\" needs backends = [\"postgres\"]".into(),
            ));
        }
        match &raw.scale {
            None => Ok(vec![build(path, text, &raw, 1, false)?]),
            Some(factors) if factors.get_ref().is_empty() || factors.get_ref().contains(&0) => {
                Err(err(
                    Some(factors.span().start),
                    "scale must list factors of at least 1".into(),
                ))
            }
            Some(factors) => factors
                .get_ref()
                .iter()
                .map(|f| build(path, text, &raw, *f, true))
                .collect(),
        }
    }
}

/// Long because it validates a library scenario's tables one after another (racers, barrier,
/// lease, expectations), each refused with its own message at the file's line.
fn build(
    path: &Path,
    text: &str,
    raw: &RawScenario,
    scale: usize,
    suffix: bool,
) -> Result<Scenario, ScenarioError> {
    {
        let err = |offset: Option<usize>, message: String| ScenarioError {
            file: path.to_path_buf(),
            line: offset.map(|o| line_of(text, o)),
            message,
        };
        check_scenario_name(&raw.name).map_err(|m| err(None, m.to_string()))?;
        if raw.racers.is_empty() {
            return Err(err(None, "scenario has no racers ([[racers]])".into()));
        }
        if raw.expect.is_none() {
            return Err(err(
                Some(text.len()),
                "scenario has no [expect] table: a race that expects nothing proves nothing \
                 (if it ends here, the file may have been cut short inside [[racers]])"
                    .into(),
            ));
        }
        if raw.barrier.timeout_ms == 0 {
            return Err(err(None, "barrier timeout_ms must be at least 1".into()));
        }
        validate_requests(raw, &err)?;
        let (racers, groups) = expand_racers(raw, scale, &err)?;
        if let Some(lease) = &raw.lease {
            let same = racers.len() == 2
                && racers[0].tenant == racers[1].tenant
                && racers[0].key == racers[1].key;
            if !same || raw.racers_as != RacerKind::Threads {
                return Err(err(
                    Some(lease.span().start),
                    "a [lease] scenario has exactly two thread racers (the holder, then the \
                     second request) with one tenant and key"
                        .into(),
                ));
            }
        }
        // A name in an expectation is a racer, or a `count` group meaning all its members.
        let expand = |name: &Spanned<String>| -> Result<Vec<String>, ScenarioError> {
            if let Some(members) = groups.get(name.get_ref()) {
                return Ok(members.clone());
            }
            if racers.iter().any(|r| &r.name == name.get_ref()) {
                return Ok(vec![name.get_ref().clone()]);
            }
            Err(err(
                Some(name.span().start),
                format!("expectation names unknown racer {:?}", name.get_ref()),
            ))
        };
        let expand_groups =
            |list: &[Vec<Spanned<String>>]| -> Result<Vec<Vec<String>>, ScenarioError> {
                list.iter()
                    .map(|g| {
                        let mut out = Vec::new();
                        for n in g {
                            out.extend(expand(n)?);
                        }
                        Ok(out)
                    })
                    .collect()
            };

        let outcomes = outcome_expectations(raw, &expand, &err)?;
        let rows = row_expectations(raw, &err)?;
        let backends = match &raw.backends {
            Some(b) if b.is_empty() => return Err(err(None, "backends is empty".into())),
            Some(b) => b.clone(),
            None => Backend::ALL.to_vec(),
        };
        let isolation = match &raw.isolation {
            Some(i) if i.is_empty() => return Err(err(None, "isolation is empty".into())),
            Some(i) => i.clone(),
            None => IsolationLevel::ALL.to_vec(),
        };
        let name = if suffix {
            format!("{}-n{}", raw.name, racers.len())
        } else {
            raw.name.clone()
        };
        Ok(Scenario {
            file: path.to_path_buf(),
            name,
            description: raw.description.clone(),
            backends,
            isolation,
            racers_as: raw.racers_as,
            scale,
            scaled: suffix,
            setup: raw.setup.iter().map(|s| s.get_ref().clone()).collect(),
            barrier: raw.barrier.clone(),
            expect: Expectations {
                created: raw.expect().created,
                replayed: raw.expect().replayed,
                conflict: raw.expect().conflict,
                outcomes,
                same_ticket: expand_groups(&raw.expect().same_ticket)?,
                distinct_tickets: expand_groups(&raw.expect().distinct_tickets)?,
                rows,
            },
            racers,
            lease: raw.lease.as_ref().map(|l| *l.get_ref()),
        })
    }
}

/// Builds a [`ScenarioError`] at a byte offset of the file (its line), or for the whole file.
type ErrAt<'a> = dyn Fn(Option<usize>, String) -> ScenarioError + 'a;

/// Each `[[racers]]` name with the racer names it stands for (`name-1`, … with a `count`).
type RacerGroups = BTreeMap<String, Vec<String>>;

/// The racer names an expectation's name stands for: a racer, or a `count` group's members.
type Expand<'a> = dyn Fn(&Spanned<String>) -> Result<Vec<String>, ScenarioError> + 'a;

/// Refuses a setup or racer request the protocol would reject: a mistake in the file, not a
/// race result.
fn validate_requests(raw: &RawScenario, err: &ErrAt<'_>) -> Result<(), ScenarioError> {
    for setup in &raw.setup {
        let s = setup.get_ref();
        ticketflow_core::domain::validate_create(&s.tenant, &s.key, &s.request).map_err(|e| {
            err(
                Some(setup.span().start),
                format!("invalid setup request: {e}"),
            )
        })?;
    }
    for r in &raw.racers {
        ticketflow_core::domain::validate_create(&r.tenant, &r.key, &r.request).map_err(|e| {
            err(
                Some(r.name.span().start),
                format!("invalid request for racer {:?}: {e}", r.name.get_ref()),
            )
        })?;
    }
    Ok(())
}

/// The racers of `raw`, each `count` (times `scale`) expanded to `name-1`, `name-2`, …, and the
/// groups: each `[[racers]]` name with the racer names it stands for.
fn expand_racers(
    raw: &RawScenario,
    scale: usize,
    err: &ErrAt<'_>,
) -> Result<(Vec<Racer>, RacerGroups), ScenarioError> {
    let mut racers = Vec::new();
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in &raw.racers {
        let base = r.name.get_ref().clone();
        if base.is_empty() {
            return Err(err(Some(r.name.span().start), "racer name is empty".into()));
        }
        let names: Vec<String> = match &r.count {
            Some(n) if *n.get_ref() == 0 => {
                return Err(err(Some(n.span().start), "count must be at least 1".into()))
            }
            None if scale == 1 => vec![base.clone()],
            count => {
                let at = count
                    .as_ref()
                    .map_or(r.name.span().start, |c| c.span().start);
                let n = count
                    .as_ref()
                    .map_or(1, |c| *c.get_ref())
                    .checked_mul(scale)
                    .filter(|n| *n <= MAX_RACERS - racers.len())
                    .ok_or_else(|| too_many_racers(err, at))?;
                (1..=n).map(|i| format!("{base}-{i}")).collect()
            }
        };
        if racers.len() + names.len() > MAX_RACERS {
            return Err(too_many_racers(err, r.name.span().start));
        }
        if groups.contains_key(&base) {
            return Err(err(
                Some(r.name.span().start),
                format!("duplicate racer name {base:?}"),
            ));
        }
        for name in &names {
            if !seen.insert(name.clone()) {
                return Err(err(
                    Some(r.name.span().start),
                    format!("duplicate racer name {name:?}"),
                ));
            }
            racers.push(Racer {
                name: name.clone(),
                group: base.clone(),
                tenant: r.tenant.clone(),
                key: r.key.clone(),
                request: r.request.clone(),
            });
        }
        groups.insert(base, names);
    }
    Ok((racers, groups))
}

/// More racers than a scenario may have ([`MAX_RACERS`]), at `at`.
fn too_many_racers(err: &ErrAt<'_>, at: usize) -> ScenarioError {
    err(
        Some(at),
        format!(
            "more than {MAX_RACERS} racers (count × scale, over all [[racers]]); a run is \
             also refused when the backend cannot hold its racers"
        ),
    )
}

/// `[expect.outcomes]` by racer: each name (a racer or a group, through `expand`) with its
/// allowed outcomes, none empty.
fn outcome_expectations(
    raw: &RawScenario,
    expand: &Expand<'_>,
    err: &ErrAt<'_>,
) -> Result<BTreeMap<String, BTreeSet<OutcomeKind>>, ScenarioError> {
    let mut outcomes = BTreeMap::new();
    for (name, allowed) in &raw.expect().outcomes {
        let spanned = Spanned::new(allowed.span(), name.clone());
        let set: BTreeSet<OutcomeKind> = match allowed.get_ref() {
            RawOutcomes::One(k) => [*k].into(),
            RawOutcomes::Many(ks) => ks.iter().copied().collect(),
        };
        if set.is_empty() {
            return Err(err(
                Some(allowed.span().start),
                format!("no allowed outcome for {name:?}"),
            ));
        }
        for racer in expand(&spanned)? {
            outcomes.insert(racer, set.clone());
        }
    }
    Ok(outcomes)
}

/// `[[expect.rows]]` by tenant, each tenant at most once.
fn row_expectations(
    raw: &RawScenario,
    err: &ErrAt<'_>,
) -> Result<BTreeMap<String, RowExpectation>, ScenarioError> {
    let mut rows = BTreeMap::new();
    for r in &raw.expect().rows {
        if rows
            .insert(
                r.tenant.clone(),
                RowExpectation {
                    tickets: r.tickets,
                    receipts: r.receipts,
                    created_events: r.created_events,
                },
            )
            .is_some()
        {
            return Err(err(
                None,
                format!("rows for tenant {:?} given twice", r.tenant),
            ));
        }
    }
    Ok(rows)
}

/// 1-based line number of a byte offset.
fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scenario_name_is_a_slug_never_a_path() {
        for good in ["a-same-key", "x_1.v2", "K", &"n".repeat(NAME_LIMIT)] {
            assert!(check_scenario_name(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "   ",
            ".",
            "..",
            "../../../../x",
            "a/b",
            "a\\b",
            "with space",
            "tab\tname",
            "é",
            "x\u{1b}[2J",
            &"n".repeat(NAME_LIMIT + 1),
        ] {
            assert!(check_scenario_name(bad).is_err(), "{bad:?}");
        }
        // At load, with the file and the reason.
        let e = parse(&OK.replacen("name = \"t\"", "name = \"../../x\"", 1)).unwrap_err();
        assert!(e.message.contains("not allowed"), "{e}");
    }

    const OK: &str = r#"
name = "t"
description = "d"
[[racers]]
name = "r"
count = 3
tenant = "A"
key = "k"
request = { actor_id = "u1", title = "x", body = "y", priority = "high" }
[expect]
created = 1
outcomes = { r = ["created", "replayed"] }
same_ticket = [["r"]]
rows = [{ tenant = "A", tickets = 1, receipts = 1, created_events = 1 }]
"#;

    fn parse(text: &str) -> Result<Scenario, ScenarioError> {
        Scenario::parse(Path::new("s.toml"), text).map(|mut v| v.remove(0))
    }

    #[test]
    fn scale_multiplies_every_count_and_names_the_variants() {
        let all = Scenario::parse(Path::new("s.toml"), &format!("scale = [1, 4]\n{OK}")).unwrap();
        let sizes: Vec<_> = all
            .iter()
            .map(|s| (s.name.as_str(), s.racers.len()))
            .collect();
        assert_eq!(sizes, [("t-n3", 3), ("t-n12", 12)]);
        assert_eq!(all[1].expect.same_ticket[0].len(), 12);
    }

    #[test]
    fn a_lease_scenario_needs_two_thread_racers_on_one_key_and_a_known_event() {
        let racer = |name: &str, key: &str| {
            format!(
                "[[racers]]\nname = \"{name}\"\ntenant = \"A\"\nkey = \"{key}\"\n\
                 request = {{ actor_id = \"u\", title = \"t\", body = \"b\", priority = \"low\" }}\n"
            )
        };
        let file = |event: &str, racers: &str| {
            format!(
                "name = \"x\"\ndescription = \"d\"\n[lease]\nevent = \"{event}\"\n{racers}[expect]\n"
            )
        };
        let two = format!("{}{}", racer("holder", "k"), racer("second", "k"));
        let ok = Scenario::parse(Path::new("s.toml"), &file("flush", &two)).unwrap();
        assert_eq!(ok[0].lease.map(|l| l.event), Some(LeaseEvent::Flush));
        let other_key = format!("{}{}", racer("holder", "k"), racer("second", "j"));
        let three = format!("{two}{}", racer("third", "k"));
        for (text, what) in [
            (file("expire", &other_key), "two keys"),
            (file("expire", &three), "three racers"),
        ] {
            let e = Scenario::parse(Path::new("s.toml"), &text).unwrap_err();
            assert!(
                e.message.contains("exactly two thread racers"),
                "{what}: {e}"
            );
            assert_eq!(e.line, Some(3), "{what}: {e}");
        }
        let e = Scenario::parse(Path::new("s.toml"), &file("reboot", &two)).unwrap_err();
        assert!(e.message.contains("unknown variant"), "{e}");
    }

    #[test]
    fn a_racer_count_beyond_the_bound_is_refused_at_its_line_without_expanding_it() {
        // The overflow first: without the bound it panics at once instead of allocating.
        for (text, what) in [
            (
                format!(
                    "scale = [4]\n{}",
                    OK.replace("count = 3", "count = 4611686018427387904")
                ),
                "count × scale overflowing",
            ),
            (
                OK.replace("count = 3", &format!("count = {}", MAX_RACERS + 1)),
                "one over the bound",
            ),
            (
                OK.replace("count = 3", "count = 1000000000000"),
                "a huge count",
            ),
        ] {
            let e = Scenario::parse(Path::new("s.toml"), &text).unwrap_err();
            assert!(e.message.contains("more than 100000 racers"), "{what}: {e}");
            assert!(e.line.is_some(), "{what}: {e}");
        }
        let at_bound = OK.replace("count = 3", &format!("count = {MAX_RACERS}"));
        assert_eq!(parse(&at_bound).unwrap().racers.len(), MAX_RACERS);
    }

    #[test]
    fn count_expands_racers_and_groups() {
        let s = parse(OK).unwrap();
        let names: Vec<_> = s.racers.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["r-1", "r-2", "r-3"]);
        assert_eq!(s.expect.same_ticket, vec![vec!["r-1", "r-2", "r-3"]]);
        assert_eq!(s.expect.outcomes.len(), 3);
        assert_eq!(s.backends, Backend::ALL.to_vec());
    }

    #[test]
    fn unknown_field_is_an_error_with_a_line() {
        let e = parse(&OK.replace("created = 1", "created = 1\nbogus = 2")).unwrap_err();
        assert_eq!(e.line, Some(12));
        assert!(e.to_string().starts_with("s.toml:12:"), "{e}");
    }

    #[test]
    fn unknown_racer_in_expectation_is_an_error_with_a_line() {
        let e =
            parse(&OK.replace("same_ticket = [[\"r\"]]", "same_ticket = [[\"q\"]]")).unwrap_err();
        assert_eq!(e.line, Some(13), "{e}");
    }

    #[test]
    fn no_racers_and_duplicates_are_errors() {
        let none = "name = \"t\"\ndescription = \"d\"\n[expect]\n";
        assert!(parse(none).unwrap_err().message.contains("no racers"));
        let dup = OK.replace("[expect]", "[[racers]]\nname = \"r\"\ntenant = \"A\"\nkey = \"k\"\nrequest = { actor_id = \"u1\", title = \"x\", body = \"y\", priority = \"high\" }\n[expect]");
        assert!(parse(&dup).unwrap_err().message.contains("duplicate"));
    }

    #[test]
    fn an_invalid_request_is_rejected_at_load_with_its_line() {
        let e = parse(&OK.replace("priority = \"high\"", "priority = \"HIGH\"")).unwrap_err();
        assert_eq!(e.line, Some(5), "{e}");
        assert!(e.message.contains("priority"), "{e}");
    }

    #[test]
    fn a_file_cut_short_before_its_expect_table_is_an_error_at_its_end() {
        let cut = &OK[..OK.find("[expect]").unwrap()];
        let e = parse(cut).unwrap_err();
        assert!(e.message.contains("no [expect] table"), "{e}");
        assert_eq!(e.line, Some(cut.lines().count() + 1), "{e}");
    }

    #[test]
    fn syntax_error_names_the_line() {
        let e = parse("name = \"t\"\ndescription = \n").unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
    }
}
