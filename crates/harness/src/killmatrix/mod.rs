//! The kill matrix: every gate of the harness run against each wrong implementation (docs/PROTOCOL.md §8)
//! ([`ticketflow_core::variants`]) on each backend. A variant must be **killed** (some gate FAILs on
//! it) on every backend where a gate applies; a survivor makes `verify` fail. The real
//! protocol runs through the same gates as a control and must survive every one of them, and
//! so do the other create protocols (`on-conflict`, `single-statement`), whose own wrong
//! variants (`on-conflict-ignores-loss`, `single-statement-skips-reread`) must be killed like
//! the others. A variant that no gate can tell from its protocol on a backend
//! ([`Variant::not_applicable_on`]) is not applicable there.
//!
//! Gates: the shipped scenarios (SQLite WAL/lazy, PostgreSQL READ COMMITTED); the sequential
//! and concurrent property suites; a fault (the client dies right after its first commit,
//! then the rows are checked for half states); and the loom models (read from
//! `reports/loom.json`, written by `scripts/loom.sh`); and, for the wrong uses of the lease
//! ([`Variant::LEASE`]) with the real protocols as controls, the `lease` gate: the shipped
//! `[lease]` scenarios whose event kills a variant (`expire`, `two-tokens`, `flush`), Redis in
//! the loop, every one run so the report names each scenario that killed it. The lease
//! variants run only that gate (without Redis they are not what they claim to be); the other
//! variants do not run it (they take no lease).
//!
//! Two interposed gates race a served implementation (`ticketflow serve --protocol P` or
//! `--variant V`) with the interposed scenarios of `scenarios/interposed/`
//! ([`load_interposed`]), the interposer in front of PostgreSQL (and Redis where the file names
//! `redis_url`, then pointed at the `--lease` Redis): `explore` runs each file's own schedule
//! (a bounded exploration), `first-point` the same file with every racer held at its first
//! store command and then run free ([`FIRST_POINT_RUNS`] runs). They run against the real
//! protocols (controls: every file, both gates must survive) and the variants exploration is
//! for ([`Variant::EXPLORED`]: the files of their store). `explore` must kill each of those
//! variants; `first-point` is informative: its kills are recorded and shown, but a variant's
//! verdict does not rest on them ([`INFORMATIVE_GATES`]), and [`KillMatrix::first_point_missed`]
//! names the variants exploration killed and the first point did not.

mod check_gate;

pub use check_gate::{
    interposed_starter_scenarios, load_check_file, starter_scenarios, CHECK_GATE_FILE,
    CHECK_GATE_HISTORIES, CHECK_GATE_SEED,
};

use crate::argv::{implementation_args, PROGRAM};
use std::path::Path;
use ticketflow_core::store::url::PgServer;

use serde::Serialize;

use crate::blackbox::TargetScenario;
use crate::jobs::{run_ordered, Pool, Weighed};
use crate::props::{self, SuiteBackend, SuiteConfig};
use crate::scenario::format::{LeaseEvent, Scenario};
use crate::scenario::lease::LeaseRunOptions;
use crate::scenario::observed::{Hook, HookPoint, ObservedStore};
use crate::scenario::runner::{run_postgres, run_sqlite, PgOptions, SqliteOptions};
use crate::scenario::worker::{Reply, WorkerConfig, WorkerError, WorkerProcess};
use crate::scenario::{LockMode, ScenarioRun};
use crate::scratch::{ScratchDb, ScratchError};
use crate::shortage::Shortage;
use crate::verdict::Verdict;
use ticketflow_core::store::postgres::IsolationLevel;
use ticketflow_core::store::{Backend, Dump, Store};
use ticketflow_core::variants::{Implementation, Variant};
use ticketflow_core::{DbErrorKind, StoreError};

/// What one gate did to one implementation on one backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", content = "detail", rename_all = "kebab-case")]
pub enum GateOutcome {
    /// The gate failed on it; the first failing check's message.
    Killed(String),
    /// The gate passed.
    Survived,
    /// The gate does not apply (why).
    NotApplicable(String),
    /// The gate could not run (why).
    Pending(String),
}

/// One cell of the matrix.
#[derive(Debug, Clone, Serialize)]
pub struct KillCell {
    /// What was tested.
    pub implementation: Implementation,
    /// `scenarios`, `sequential`, `concurrent`, `fault`, `lease`, `explore`, `first-point`,
    /// `loom`.
    pub gate: &'static str,
    /// `sqlite`, `postgres` or `memory` (the loom gate).
    pub backend: Backend,
    /// The result.
    pub outcome: GateOutcome,
    /// The cell's own duration, in milliseconds (0 for a cell that ran nothing: not
    /// applicable, or the loom verdict read from `reports/loom.json`). Not part of any
    /// verdict.
    pub took_ms: f64,
}

/// The kill matrix's verdict for one implementation on one backend ([`KillMatrix::rows`]).
#[derive(Debug, Clone, Serialize)]
pub struct KillRow {
    /// What was tested.
    pub implementation: Implementation,
    /// `sqlite`, `postgres` or `memory` (the loom gate).
    pub backend: Backend,
    /// PASS (variant killed, or control intact), FAIL, or PENDING.
    pub verdict: Verdict,
    /// Which gates killed it, or what went wrong.
    pub detail: String,
}

/// The whole matrix.
#[derive(Debug, Clone, Default, Serialize)]
pub struct KillMatrix {
    /// Every cell, by implementation, gate, backend.
    pub cells: Vec<KillCell>,
}

impl KillMatrix {
    /// One row per implementation and backend that has an applicable gate: a variant PASSes
    /// when some gate killed it, FAILs when it survived every gate that ran, and is PENDING
    /// when none ran; the real protocol (the control) PASSes when no gate killed it.
    pub fn rows(&self) -> Vec<KillRow> {
        let mut out = Vec::new();
        for implementation in implementations() {
            for backend in [Backend::Sqlite, Backend::Postgres, Backend::Memory] {
                let cells: Vec<&KillCell> = self
                    .cells
                    .iter()
                    .filter(|c| c.implementation == implementation && c.backend == backend)
                    .collect();
                let gates = |pred: fn(&GateOutcome) -> bool| -> Vec<&'static str> {
                    cells
                        .iter()
                        .filter(|c| pred(&c.outcome))
                        .map(|c| c.gate)
                        .collect()
                };
                let killed_any = gates(|o| matches!(o, GateOutcome::Killed(_)));
                let survived = gates(|o| matches!(o, GateOutcome::Survived));
                let pending = gates(|o| matches!(o, GateOutcome::Pending(_)));
                if killed_any.is_empty() && survived.is_empty() && pending.is_empty() {
                    continue;
                }
                // A variant's verdict never rests on an informative gate (first-point); a
                // control killed by one is still a broken gate.
                let killed: Vec<&'static str> = killed_any
                    .iter()
                    .copied()
                    .filter(|g| implementation.is_control() || !INFORMATIVE_GATES.contains(g))
                    .collect();
                let explore_survived = matches!(implementation, Implementation::Variant(v) if Variant::EXPLORED.contains(&v))
                    && cells
                        .iter()
                        .any(|c| c.gate == "explore" && c.outcome == GateOutcome::Survived);
                let (verdict, detail) = match implementation {
                    control if control.is_control() && !killed.is_empty() => (
                        Verdict::Fail,
                        killed
                            .iter()
                            .map(|g| {
                                format!(
                                    "the real protocol ({}) was killed by gate {g} on {backend}: the gate is broken",
                                    control.name()
                                )
                            })
                            .collect::<Vec<_>>()
                            .join("; "),
                    ),
                    // A gate that did not run leaves the row open: the verdict and the counts
                    // of the matrix's line agree.
                    control if control.is_control() && !pending.is_empty() => (
                        Verdict::Pending,
                        did_not_run(&pending, &survived, "control survived"),
                    ),
                    control if control.is_control() => (
                        Verdict::Pass,
                        format!("control survived {}", survived.join(", ")),
                    ),
                    Implementation::Variant(v) if explore_survived => (
                        Verdict::Fail,
                        format!("{v} survived the explore gate on {backend}: exploration did not find it"),
                    ),
                    Implementation::Variant(_) if !killed.is_empty() => {
                        (Verdict::Pass, format!("killed by {}", killed.join(", ")))
                    }
                    Implementation::Variant(v) if !survived.is_empty() && pending.is_empty() => (
                        Verdict::Fail,
                        format!("{v} survived every gate on {backend}"),
                    ),
                    _ => (
                        Verdict::Pending,
                        did_not_run(&pending, &survived, "survived"),
                    ),
                };
                out.push(KillRow {
                    implementation,
                    backend,
                    verdict,
                    detail,
                });
            }
        }
        out
    }

    /// The variants the `explore` gate killed and the `first-point` gate ran on and did not
    /// kill (survived): what exploration finds that the first point misses, in this run.
    pub fn first_point_missed(&self) -> Vec<Implementation> {
        let outcome = |i: Implementation, gate: &str| {
            self.cells
                .iter()
                .find(|c| c.implementation == i && c.gate == gate && c.backend == Backend::Postgres)
                .map(|c| &c.outcome)
        };
        Variant::EXPLORED
            .into_iter()
            .map(Implementation::Variant)
            .filter(|&i| {
                matches!(outcome(i, "explore"), Some(GateOutcome::Killed(_)))
                    && matches!(outcome(i, "first-point"), Some(GateOutcome::Survived))
            })
            .collect()
    }

    /// What the matrix holds, in the words the terminal and REPORT.md both use: `N verdicts
    /// (implementation × backend) for I implementations, from C gate runs`. The verdicts are
    /// [`KillMatrix::rows`] (the report's item count); the report's table has one line per
    /// implementation and one column per gate and backend.
    pub fn summary(&self) -> String {
        let implementations = implementations()
            .into_iter()
            .filter(|i| self.cells.iter().any(|c| c.implementation == *i))
            .count();
        format!(
            "{} verdicts (implementation × backend) for {implementations} implementations, from {} gate runs",
            self.rows().len(),
            self.gate_runs()
        )
    }

    /// The gate runs behind the verdicts: the cells whose gate applies (run, or PENDING), as
    /// [`KillMatrix::summary`] and REPORT.md's Timings count them.
    pub fn gate_runs(&self) -> usize {
        self.cells
            .iter()
            .filter(|c| !matches!(c.outcome, GateOutcome::NotApplicable(_)))
            .count()
    }

    /// Problems that make the matrix fail: a variant that survives every applicable gate on a
    /// backend, or the real protocol killed by a gate (a broken gate).
    pub fn problems(&self) -> Vec<String> {
        self.rows()
            .into_iter()
            .filter(|r| r.verdict == Verdict::Fail)
            .map(|r| r.detail)
            .collect()
    }

    /// The verdict over the rows ([`KillMatrix::rows`]): FAIL when there are problems; PENDING
    /// when nothing failed but some row is open (a gate that did not run, and no kill that
    /// decides it); PASS otherwise. The terminal line's verdict and its row counts agree.
    pub fn verdict(&self) -> Verdict {
        Verdict::of_all(self.rows().iter().map(|r| r.verdict))
    }

    /// The verdict over the PostgreSQL rows, and FAIL on any problem (loom rows pending because
    /// `scripts/loom.sh` has not run are shown, but are not a missing server). For exit codes.
    pub fn postgres_verdict(&self) -> Verdict {
        let rows = self.rows();
        let postgres = rows
            .iter()
            .filter(|r| r.backend == Backend::Postgres)
            .map(|r| r.verdict);
        match Verdict::of_all(postgres) {
            _ if rows.iter().any(|r| r.verdict == Verdict::Fail) => Verdict::Fail,
            v => v,
        }
    }
}

/// A row's detail when some of its gates did not run: `gates X, Y did not run`, then what the
/// others showed (`; control survived Z`).
fn did_not_run(pending: &[&str], survived: &[&str], survived_words: &str) -> String {
    let mut out = format!("gates {} did not run", pending.join(", "));
    if !survived.is_empty() {
        out += &format!("; {survived_words} {}", survived.join(", "));
    }
    out
}

/// The controls first (the `savepoint`, `on-conflict` and `single-statement` protocols), then
/// every variant of docs/PROTOCOL.md §8 ([`Variant::every`]), then the served-only variants the
/// interposed gates are for ([`Variant::EXPLORED`] not already listed), then those only a
/// sequence shows, for the `check` gate ([`Variant::SEQUENCE`]).
pub fn implementations() -> Vec<Implementation> {
    let every: Vec<Variant> = Variant::every().collect();
    let served = Variant::EXPLORED
        .into_iter()
        .chain(Variant::SEQUENCE)
        .filter(|v| !every.contains(v))
        .collect::<Vec<_>>();
    Implementation::PROTOCOLS
        .into_iter()
        .chain(every.into_iter().map(Implementation::Variant))
        .chain(served.into_iter().map(Implementation::Variant))
        .collect()
}

/// Gates whose kills are shown but never decide a variant's verdict: `first-point` and
/// `starter` (a control killed by one still fails the matrix).
pub const INFORMATIVE_GATES: [&str; 2] = ["first-point", "starter"];

/// Runs of the `first-point` gate per scenario file (each a fresh `{run}`).
pub const FIRST_POINT_RUNS: usize = 3;

/// Where the interposed scenarios live, under the scenario directory.
pub const INTERPOSED_DIR: &str = "interposed";

/// Loads the interposed scenario files (`*.toml`, by name) of `dir` for the `explore` and
/// `first-point` gates; a missing directory is an empty list.
///
/// Will return `Err` with the first file that cannot be read or is not an interposed
/// black-box scenario (`[barrier] kind = "interposer"`).
pub fn load_interposed(dir: &Path) -> Result<Vec<TargetScenario>, InterposedError> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(Vec::new());
    };
    let mut files: Vec<std::path::PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|f| {
            let s = TargetScenario::load(f)?;
            if s.barrier.kind != crate::blackbox::format::BarrierKind::Interposer {
                return Err(InterposedError::NotInterposed { file: f.clone() });
            }
            Ok(s)
        })
        .collect()
}

/// Why the interposed scenarios could not be loaded (the interposed gates are then PENDING
/// with the `Display` in their reason).
#[derive(Debug, Clone, thiserror::Error)]
pub enum InterposedError {
    /// A file could not be read or is not a valid black-box scenario.
    #[error(transparent)]
    Load(#[from] crate::scenario::format::ScenarioError),
    /// A valid black-box scenario whose barrier is not the interposer.
    #[error("{}: not an interposed scenario ([barrier] kind = \"interposer\")", file.display())]
    NotInterposed {
        /// The file.
        file: std::path::PathBuf,
    },
}

/// Whether the interposed gates run `implementation`: the real protocols and
/// [`Variant::EXPLORED`].
fn interposed_gates_run(implementation: Implementation) -> bool {
    match implementation {
        Implementation::Protocol(_) => true,
        Implementation::Variant(v) => Variant::EXPLORED.contains(&v),
    }
}

/// `scenario` with `args` appended to every `{ticketflow} serve` service command.
pub fn with_serve_args(scenario: &TargetScenario, args: &[String]) -> TargetScenario {
    let mut s = scenario.clone();
    for service in &mut s.target.services {
        let ours = service.command.first().is_some_and(|c| c == PROGRAM)
            && service.command.get(1).is_some_and(|c| c == "serve");
        if ours {
            service.command.extend(args.iter().cloned());
        }
    }
    s
}

/// The `explore` or `first-point` gate of `implementation`: each interposed scenario of its
/// store (a variant whose keys live in Redis: the files with `redis_url`; other variants: the
/// files without; a control: every file), the service started with [`implementation_args`].
/// Killed names every file that failed (with its first failed check and the schedule);
/// PENDING when one could not run (PostgreSQL or Redis unreachable, a run not set up as
/// declared) and none failed.
pub fn interposed_gate(
    gate: &'static str,
    implementation: Implementation,
    opts: &KillOptions,
) -> GateOutcome {
    let scenarios = match &opts.interposed {
        Ok(s) => s,
        Err(why) => return GateOutcome::Pending(format!("interposed scenarios: {why}")),
    };
    let wants_redis = matches!(implementation, Implementation::Variant(v) if v.needs_redis());
    let mine: Vec<&TargetScenario> = scenarios
        .iter()
        .filter(|s| implementation.is_control() || s.target.redis_url.is_some() == wants_redis)
        .collect();
    if mine.is_empty() {
        return GateOutcome::NotApplicable(format!(
            "no interposed scenario loaded for it (scenarios/{INTERPOSED_DIR}/)"
        ));
    }
    let mut killed = Vec::new();
    let mut pending = Vec::new();
    let args = implementation_args(implementation);
    for s in mine {
        if gate == "first-point" && !s.faults.is_empty() {
            // A fault is struck at a step released on its own; the first point releases every
            // step together, so a file with a fault is the explore gate's alone.
            continue;
        }
        let mut s = with_serve_args(s, &args);
        if s.target.redis_url.is_some() {
            let url = match opts.lease.lease_config() {
                Ok(c) => c.url,
                Err(e) => {
                    pending.push(format!("{}{e}", crate::scenario::lease::REDIS_PENDING));
                    continue;
                }
            };
            if let Err(e) = redis_reachable(&url) {
                pending.push(format!(
                    "{}unreachable at {url}: {e} ({})",
                    crate::scenario::lease::REDIS_PENDING,
                    s.name
                ));
                continue;
            }
            s.target.redis_url = Some(url);
        }
        let run_opts = crate::blackbox::RunOptions {
            exe: opts.worker_exe.clone(),
            explore: (gate == "first-point")
                .then_some(crate::blackbox::format::ExploreMode::FirstPoint),
            repeat: if gate == "first-point" {
                FIRST_POINT_RUNS
            } else {
                1
            },
            ..crate::blackbox::RunOptions::new(opts.pg.clone())
        };
        match crate::blackbox::run_repeated(&s, &run_opts) {
            Err(e) => pending.push(format!("{}: {e}", s.name)),
            // A fault whose step this implementation never sends (the single-statement
            // protocol has no COMMIT: its one statement commits on its own) cut nothing: the
            // file says nothing about it, neither a kill nor a survival. A variant the file is
            // for is still held to the explore gate's kill.
            Ok(o)
                if o.verdict == Verdict::Pending
                    && !s.faults.is_empty()
                    && faults_never_struck(&o) => {}
            Ok(o) => match o.verdict {
                // The file as written serves the protocol: a replay of the schedule needs the
                // implementation's arguments appended, which the reason says.
                Verdict::Fail => killed.push(format!(
                    "{} (serve … {}): {}",
                    s.name,
                    args.join(" "),
                    one_line(&o.reason.unwrap_or_default())
                )),
                Verdict::Pending => {
                    pending.push(format!("{}: {}", s.name, o.reason.unwrap_or_default()))
                }
                Verdict::Pass => {}
            },
        }
    }
    gate_outcome(killed, pending)
}

/// A gate's outcome from what killed it and what could not run: killed when any file failed,
/// else PENDING when any could not run, else survived.
pub(crate) fn gate_outcome(killed: Vec<String>, pending: Vec<String>) -> GateOutcome {
    if !killed.is_empty() {
        GateOutcome::Killed(killed.join("; "))
    } else if !pending.is_empty() {
        GateOutcome::Pending(pending.join("; "))
    } else {
        GateOutcome::Survived
    }
}

/// Whether every run of `o` was conducted as declared but none of its faults struck (the
/// fault's step never came).
fn faults_never_struck(o: &crate::blackbox::TargetOutcome) -> bool {
    !o.runs.is_empty()
        && o.runs.iter().all(|r| {
            r.evidence.as_ref().is_some_and(|e| {
                let faults: Vec<_> = e
                    .waves
                    .iter()
                    .filter_map(|w| w.schedule.as_ref())
                    .flat_map(|s| s.faults.iter())
                    .collect();
                !faults.is_empty() && faults.iter().all(|f| !f.struck())
            })
        })
}

/// Whether Redis at `url` answers a `PING` within a second.
fn redis_reachable(url: &str) -> Result<(), redis::RedisError> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_connection_with_timeout(std::time::Duration::from_secs(1))?;
    redis::cmd("PING").query::<String>(&mut conn).map(|_| ())
}

/// Where the matrix runs and with what.
#[derive(Debug, Clone)]
pub struct KillOptions {
    /// PostgreSQL server, and why it is unusable (then its cells are PENDING).
    pub pg: PgServer,
    /// Reason PostgreSQL cannot be used, if so.
    pub pg_unusable: Option<String>,
    /// Cases for the property gates (`PROPTEST_CASES` overrides).
    pub cases: u32,
    /// Seed for the property gates.
    pub seed: Option<u64>,
    /// `reports/loom.json`.
    pub loom_report: std::path::PathBuf,
    /// The `ticketflow` binary for worker processes (default: the running executable).
    pub worker_exe: Option<std::path::PathBuf>,
    /// Where the `lease` gate finds Redis (`--lease`, or the lease scenarios' default); the
    /// interposed gates' Redis too.
    pub lease: LeaseRunOptions,
    /// The interposed scenarios of the `explore` and `first-point` gates
    /// ([`load_interposed`]), or why they could not be loaded (those gates are then PENDING).
    pub interposed: Result<Vec<TargetScenario>, InterposedError>,
    /// The check file of the `check` gate ([`load_check_file`]), or why it could not be
    /// loaded (the gate is then PENDING).
    pub check_file: Result<crate::check::file::CheckFile, String>,
}

/// Runs every gate against the controls and every variant.
pub fn run(scenarios: &[Scenario], opts: &KillOptions) -> KillMatrix {
    let loom = LoomReport::load(&opts.loom_report);
    run_with_loom(scenarios, opts, &loom)
}

/// As [`run`], with the loom report already loaded.
pub fn run_with_loom(scenarios: &[Scenario], opts: &KillOptions, loom: &LoomReport) -> KillMatrix {
    run_on(scenarios, opts, loom, Pool::SERIAL).0
}

/// The gates a cell of the matrix runs, in the report's order.
const GATES: [&str; 9] = [
    "scenarios",
    "sequential",
    "concurrent",
    "fault",
    "lease",
    "explore",
    "first-point",
    "starter",
    "check",
];

/// The gates that race a served implementation through the interposer.
const INTERPOSED_GATES: [&str; 2] = ["explore", "first-point"];

/// The gates that send requests to a served implementation on PostgreSQL only.
const SERVED_GATES: [&str; 4] = ["explore", "first-point", "starter", "check"];

/// One cell of [`run_on`]: a gate of an implementation on a backend, or its loom cell.
struct CellJob<'a> {
    implementation: Implementation,
    backend: Backend,
    gate: &'static str,
    scenarios: &'a [Scenario],
    pending: Option<&'a str>,
}

impl CellJob<'_> {
    /// Whether it runs anything on PostgreSQL.
    fn on_postgres(&self) -> bool {
        self.backend == Backend::Postgres && self.pending.is_none() && self.gate != "loom"
    }
}

impl Weighed for CellJob<'_> {
    /// On PostgreSQL: the largest scenario of a scenario or lease gate, a property gate's
    /// threads, a fault case's few sessions ([`crate::scenario::capacity::scenario_sessions`]).
    fn sessions(&self) -> u64 {
        // The lease gate runs alone on either backend: its scenarios share one Redis
        // database, which one of them flushes, and the same lease keys.
        let runs_lease_gate = self.gate == "lease"
            && self.pending.is_none()
            && self.backend != Backend::Memory
            && (self.implementation.is_control()
                || matches!(self.implementation, Implementation::Variant(v) if v.is_lease()));
        if runs_lease_gate {
            return u64::MAX;
        }
        if !self.on_postgres() {
            return 0;
        }
        match self.gate {
            // The interposer's monitor session, the service's pool of two, the scratch
            // database's set-up and count sessions.
            "explore" | "first-point" => 6,
            // Two services' pools of four, the set-up and count sessions.
            "check" | "starter" => 12,
            "scenarios" | "lease" => self
                .scenarios
                .iter()
                .map(crate::scenario::capacity::scenario_sessions)
                .max()
                .unwrap_or(0),
            "concurrent" => 12,
            _ => 4,
        }
    }
}

/// As [`run_with_loom`], with cells at once within `pool` ([`crate::jobs`]): every cell has
/// its own scratch databases. The cells stay in the serial order; also returns their summed
/// duration.
pub fn run_on(
    scenarios: &[Scenario],
    opts: &KillOptions,
    loom: &LoomReport,
    pool: Pool,
) -> (KillMatrix, std::time::Duration) {
    let mut jobs = Vec::new();
    for implementation in implementations() {
        for backend in Backend::ALL {
            let pending = match backend {
                Backend::Postgres => opts.pg_unusable.as_deref(),
                _ => None,
            };
            for gate in GATES {
                // The interposer stands in front of PostgreSQL, and `check` serves on it: no
                // SQLite column for those gates.
                if SERVED_GATES.contains(&gate) && backend != Backend::Postgres {
                    continue;
                }
                jobs.push(CellJob {
                    implementation,
                    backend,
                    gate,
                    scenarios,
                    pending,
                });
            }
        }
        jobs.push(CellJob {
            implementation,
            backend: Backend::Memory,
            gate: "loom",
            scenarios,
            pending: None,
        });
    }
    let ran = run_ordered(&jobs, pool, &|job| cell(job, opts, loom), &mut |_| {});
    (KillMatrix { cells: ran.results }, ran.busy)
}

/// One cell of the matrix, as [`run_on`] runs each: `gate` (one of the gate names of the
/// report's columns, or `loom`) on `backend` against `implementation`, over `scenarios`.
pub fn run_cell(
    implementation: Implementation,
    backend: Backend,
    gate: &'static str,
    scenarios: &[Scenario],
    opts: &KillOptions,
    loom: &LoomReport,
) -> KillCell {
    let pending = match backend {
        Backend::Postgres => opts.pg_unusable.as_deref(),
        _ => None,
    };
    let job = CellJob {
        implementation,
        backend,
        gate,
        scenarios,
        pending,
    };
    cell(&job, opts, loom)
}

/// Runs one cell of the matrix.
fn cell(job: &CellJob<'_>, opts: &KillOptions, loom: &LoomReport) -> KillCell {
    let CellJob {
        implementation,
        backend,
        gate,
        scenarios,
        pending,
    } = *job;
    if gate == "loom" {
        return KillCell {
            implementation,
            gate: "loom",
            backend: Backend::Memory,
            took_ms: 0.0,
            outcome: match implementation {
                // Judged by the lease gate; a stale or missing loom report is no missing run
                // for it (its loom models, if any, count once the report is fresh).
                Implementation::Variant(v) if v.is_lease() && loom.unusable.is_some() => {
                    GateOutcome::NotApplicable(
                        "a lease variant is judged with Redis in the loop (gate lease)".into(),
                    )
                }
                Implementation::Variant(v) if Variant::SEQUENCE.contains(&v) => {
                    GateOutcome::NotApplicable(
                        "a variant only a sequence of requests shows is judged by generated histories (gate check)".into(),
                    )
                }
                Implementation::Variant(v) if served_only(v) => GateOutcome::NotApplicable(
                    "a served-only variant is judged through the interposer (gate explore)".into(),
                ),
                _ => loom.outcome(implementation),
            },
        };
    }
    let started = std::time::Instant::now();
    let lease_variant = matches!(implementation, Implementation::Variant(v) if v.is_lease());
    let not_applicable = match implementation {
        Implementation::Variant(v) => v.not_applicable_on(backend),
        Implementation::Protocol(_) => None,
    };
    let interposed = INTERPOSED_GATES.contains(&gate);
    let served = matches!(implementation, Implementation::Variant(v) if served_only(v));
    let sequence =
        matches!(implementation, Implementation::Variant(v) if Variant::SEQUENCE.contains(&v));
    let outcome = match pending {
        _ if backend == Backend::Memory => memory_not_applicable(),
        _ if not_applicable.is_some() => {
            GateOutcome::NotApplicable(not_applicable.unwrap_or_default().into())
        }
        _ if (gate == "check" || gate == "starter")
            && !check_gate::check_gate_runs(implementation) =>
        {
            GateOutcome::NotApplicable(
                "the check gate runs the served protocols and the variants only a sequence shows"
                    .into(),
            )
        }
        _ if sequence && gate != "check" && gate != "starter" => GateOutcome::NotApplicable(
            "a variant only a sequence of requests shows is judged by generated histories (gate check)"
                .into(),
        ),
        _ if interposed && !interposed_gates_run(implementation) => GateOutcome::NotApplicable(
            "the interposed gates race the served protocols and the variants exploration is for"
                .into(),
        ),
        _ if interposed && backend != Backend::Postgres => GateOutcome::NotApplicable(
            "the interposer stands in front of PostgreSQL (and Redis), not SQLite".into(),
        ),
        _ if !interposed && gate != "check" && gate != "starter" && served => {
            GateOutcome::NotApplicable(
                "a served-only variant is judged through the interposer (gate explore)".into(),
            )
        }
        _ if gate == "lease" && !lease_variant && !implementation.is_control() => {
            GateOutcome::NotApplicable("this variant takes no lease".into())
        }
        _ if gate != "lease" && lease_variant => GateOutcome::NotApplicable(
            "a lease variant is judged with Redis in the loop (gate lease)".into(),
        ),
        Some(reason) => GateOutcome::Pending(reason.to_string()),
        None => match gate {
            "scenarios" => scenario_gate(scenarios, backend, implementation, opts),
            "lease" => lease_gate(scenarios, backend, implementation, opts),
            "sequential" | "concurrent" => suite_gate(gate, backend, implementation, opts),
            "explore" | "first-point" => interposed_gate(gate, implementation, opts),
            "check" => check_gate::check_gate(implementation, opts),
            "starter" => check_gate::starter_gate(implementation, opts),
            _ => fault_gate(backend, implementation, opts),
        },
    };
    // A gate the environment could not host (no free connection, descriptor or port) neither
    // killed nor spared the implementation.
    let outcome = match outcome {
        GateOutcome::Killed(why) => match Shortage::in_text(&why) {
            Some(short) => GateOutcome::Pending(short.reason(&why)),
            None => GateOutcome::Killed(why),
        },
        other => other,
    };
    let took_ms = started.elapsed().as_secs_f64() * 1000.0;
    tracing::info!(
        implementation = implementation.name(),
        gate,
        backend = backend.name(),
        ms = took_ms.round() as u64,
        ?outcome,
        "kill matrix cell"
    );
    KillCell {
        implementation,
        gate,
        backend,
        outcome,
        took_ms,
    }
}

/// Whether `v` is served only ([`Variant::SERVED_ONLY`]): the library gates cannot run it.
fn served_only(v: Variant) -> bool {
    Variant::SERVED_ONLY.contains(&v)
}

/// One scenario of a gate on `backend` with `implementation` (PostgreSQL at READ COMMITTED,
/// process racers through `opts.worker_exe`, `[lease]` scenarios on `opts.lease`); `None` on
/// the memory store, which runs no scenario file.
fn gate_run(
    s: &Scenario,
    backend: Backend,
    implementation: Implementation,
    opts: &KillOptions,
) -> Option<ScenarioRun> {
    match backend {
        Backend::Sqlite => Some(run_sqlite(
            s,
            &SqliteOptions {
                implementation,
                lease: opts.lease.clone(),
                ..SqliteOptions::default()
            },
        )),
        Backend::Postgres => {
            let mut o = PgOptions::new(opts.pg.clone());
            o.isolation = IsolationLevel::ReadCommitted;
            o.implementation = implementation;
            o.worker_exe = opts.worker_exe.clone();
            o.lease = opts.lease.clone();
            Some(run_postgres(s, &o))
        }
        Backend::Memory => None,
    }
}

/// Why a FAILed gate run killed its implementation: the scenario and its first failed check
/// (or the run's reason).
fn kill_reason(s: &Scenario, run: ScenarioRun) -> String {
    let first = run
        .checks
        .iter()
        .find(|c| !c.passed())
        .map(|c| format!("{}: {}", c.name, c.detail))
        .or(run.reason)
        .unwrap_or_default();
    format!("{}: {}", s.name, one_line(&first))
}

fn scenario_gate(
    scenarios: &[Scenario],
    backend: Backend,
    implementation: Implementation,
    opts: &KillOptions,
) -> GateOutcome {
    // Black-box scenarios race a served implementation; their negative control is
    // `serve --variant` (scenarios/negative/), not this gate.
    // `[lease]` scenarios are the lease gate's.
    for s in scenarios
        .iter()
        .filter(|s| s.backends.contains(&backend) && s.lease.is_none())
    {
        let Some(run) = gate_run(s, backend, implementation, opts) else {
            return memory_not_applicable();
        };
        match run.verdict {
            Verdict::Fail => return GateOutcome::Killed(kill_reason(s, run)),
            Verdict::Pending => {
                return GateOutcome::Pending(run.reason.unwrap_or_default());
            }
            Verdict::Pass => {}
        }
    }
    GateOutcome::Survived
}

/// The lease events whose scenarios make the `lease` gate.
pub const LEASE_GATE_EVENTS: [LeaseEvent; 3] =
    [LeaseEvent::Expire, LeaseEvent::TwoTokens, LeaseEvent::Flush];

/// The `lease` gate: every `[lease]` scenario of [`LEASE_GATE_EVENTS`] on `backend` (SQLite
/// WAL/lazy, PostgreSQL READ COMMITTED), Redis in the loop. Killed names every scenario that
/// failed; PENDING when one could not run (Redis unreachable) and none failed.
pub fn lease_gate(
    scenarios: &[Scenario],
    backend: Backend,
    implementation: Implementation,
    opts: &KillOptions,
) -> GateOutcome {
    let mut killed = Vec::new();
    let mut pending = Vec::new();
    let mut ran = 0;
    for s in scenarios.iter().filter(|s| {
        s.backends.contains(&backend)
            && s.lease
                .is_some_and(|l| LEASE_GATE_EVENTS.contains(&l.event))
    }) {
        ran += 1;
        let Some(run) = gate_run(s, backend, implementation, opts) else {
            return memory_not_applicable();
        };
        match run.verdict {
            Verdict::Fail => killed.push(kill_reason(s, run)),
            Verdict::Pending => pending.push(run.reason.unwrap_or_default()),
            Verdict::Pass => {}
        }
    }
    if !killed.is_empty() {
        GateOutcome::Killed(killed.join("; "))
    } else if let Some(why) = pending.into_iter().next() {
        GateOutcome::Pending(why)
    } else if ran == 0 {
        GateOutcome::NotApplicable("no [lease] scenario loaded".into())
    } else {
        GateOutcome::Survived
    }
}

fn suite_gate(
    suite: &'static str,
    backend: Backend,
    implementation: Implementation,
    opts: &KillOptions,
) -> GateOutcome {
    let Some(target) = SuiteBackend::on(backend, &opts.pg) else {
        return memory_not_applicable();
    };
    let mut config = SuiteConfig::new(suite, opts.cases, opts.seed, false);
    // A gate needs "does it fail", not the smallest example: keep shrinking short.
    config.max_shrink_iters = Some(8);
    let r = match suite {
        "sequential" => props::sequential::run(&target, implementation, &config),
        _ => props::concurrent::run(&target, implementation, &config),
    };
    match r.verdict {
        Verdict::Pass => GateOutcome::Survived,
        Verdict::Pending => GateOutcome::Pending(r.reason.unwrap_or_default()),
        // The whole reason on one line: its first line alone ends at "not linearizable:".
        Verdict::Fail => GateOutcome::Killed(format!(
            "seed {}: {}",
            r.seed,
            one_line(&r.reason.unwrap_or_default())
        )),
    }
}

/// `text`'s lines joined by `; `, blank ones dropped: a multi-line reason in one table cell.
pub(crate) fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// The memory store is no SQL database: only the loom gate runs on it.
fn memory_not_applicable() -> GateOutcome {
    GateOutcome::NotApplicable("the memory store is checked by the loom gate only".into())
}

/// Half states in a dump: tickets without exactly one `ticket.created` event or without a
/// receipt, receipts without their ticket.
pub fn half_states(dump: &Dump) -> Vec<String> {
    let mut out = Vec::new();
    for (id, tenant, _, _) in &dump.tickets {
        let created = dump
            .events
            .iter()
            .filter(|(a, _, t, _)| a == id && t == "ticket.created")
            .count();
        let receipts = dump.receipts.iter().filter(|r| r.ticket_id == *id).count();
        if created != 1 || receipts != 1 {
            out.push(format!(
                "ticket {} of {tenant} has {created} created events and {receipts} receipts",
                &id.simple().to_string()[..8]
            ));
        }
    }
    if dump.dangling_receipts > 0 {
        out.push(format!(
            "{} receipts without their ticket",
            dump.dangling_receipts
        ));
    }
    out
}

/// The client dies right after its first commit (a worker process exits on PostgreSQL; the
/// session is abandoned in-process on SQLite); then the rows must hold no half state, and a
/// retry through the real protocol must converge on one ticket.
pub fn fault_gate(
    backend: Backend,
    implementation: Implementation,
    opts: &KillOptions,
) -> GateOutcome {
    match fault_run(backend, implementation, opts) {
        Ok(problems) if problems.is_empty() => GateOutcome::Survived,
        Ok(problems) => GateOutcome::Killed(format!(
            "after the client died between transactions: {}",
            problems.join("; ")
        )),
        Err(e) => GateOutcome::Pending(e.to_string()),
    }
}

/// Why the fault gate could not run (the gate is PENDING with the `Display` as its reason).
#[derive(Debug, thiserror::Error)]
pub(crate) enum FaultGateError {
    /// The scratch database could not be created, opened or read.
    #[error(transparent)]
    Scratch(#[from] ScratchError),
    /// The `ticketflow worker` process could not be started.
    #[error(transparent)]
    Worker(#[from] WorkerError),
    /// The worker told to die after its first commit answered instead, so the fault was not
    /// injected.
    #[error("the worker answered instead of dying: {0:?}")]
    Answered(Box<Reply>),
}

/// Kills a client between its transactions (right after its first commit), then retries the
/// same create through the real protocol. Returns the problems found (half states, a failed
/// retry, not one ticket); none when the implementation survived.
fn fault_run(
    backend: Backend,
    implementation: Implementation,
    opts: &KillOptions,
) -> Result<Vec<String>, FaultGateError> {
    let db = ScratchDb::create(backend, &opts.pg, "kill_fault")?;
    let request = props::request_pool()[0].clone();
    match db.pg() {
        Some(scratch) => {
            let config = WorkerConfig {
                pg_url: opts.pg.url().to_string(),
                dbname: scratch.name().to_string(),
                isolation: IsolationLevel::ReadCommitted,
                lock: LockMode::AccessExclusive,
                implementation,
                die_after_commits: Some(1),
                retry: ticketflow_core::RetryPolicy::default(),
            };
            let mut worker = WorkerProcess::spawn(opts.worker_exe.as_deref(), &config)?;
            // The worker exits right after its first commit: no reply comes back.
            if let Ok(reply) = worker.create("A", "key-1", &request) {
                return Err(FaultGateError::Answered(Box::new(reply)));
            }
            worker.finish();
        }
        None => {
            let mut store = db.open()?;
            let died: Hook<'_, dyn Store + Send> = Box::new(|s| {
                Err(StoreError {
                    kind: DbErrorKind::Connection,
                    backend: s.backend(),
                    operation: "fault",
                    code: None,
                    message: "client died after its first commit".into(),
                })
            });
            let mut observed =
                ObservedStore::new(store.as_mut(), vec![(HookPoint::AfterCommit(1), died)]);
            let _ = implementation.create(
                &mut observed,
                "A",
                "key-1",
                &request,
                &ticketflow_core::RetryPolicy::default(),
            );
        }
    }
    let mut problems = half_states(&db.dump("")?);
    // The client's retry, through the real protocol, must converge on one ticket.
    let mut store = db.open()?;
    match ticketflow_core::protocol::create_ticket(
        store.as_mut(),
        "A",
        "key-1",
        &request,
        &ticketflow_core::protocol::CreateOptions::default(),
    ) {
        Ok(_) => {}
        Err(e) => problems.push(format!("the retry failed: {e}")),
    }
    let after = db.dump("")?;
    if after.tickets.len() != 1 {
        problems.push(format!("{} tickets after the retry", after.tickets.len()));
    }
    Ok(problems)
}

/// `reports/loom.json` as written by `scripts/loom.sh`.
#[derive(Debug, Clone, Default)]
pub struct LoomReport {
    /// Why it cannot be used, if so.
    pub unusable: Option<String>,
    /// (implementation, expected, result, model name) per model.
    pub models: Vec<(String, String, String, String)>,
    /// The models as written, for the report (threads, bounds, interleavings, wall time).
    pub raw: Vec<serde_json::Value>,
    /// When the models ran (`generated_at`).
    pub generated_at: Option<String>,
}

/// Files whose content decides the loom models' results, hashed in this order; the same list
/// as `sources=(…)` in `scripts/loom.sh` (a test keeps them equal).
pub const LOOM_SOURCES: [&str; 8] = [
    "crates/core/src/protocol.rs",
    "crates/core/src/variants.rs",
    "crates/core/src/sequence_variants.rs",
    "crates/core/src/store/memory.rs",
    "crates/core/src/store/mod.rs",
    "crates/core/src/lease.rs",
    "crates/core/src/store/leases.rs",
    "tests/loom/main.rs",
];

impl LoomReport {
    /// Loads the report; stale (sources changed since) or missing makes it unusable.
    pub fn load(path: &Path) -> LoomReport {
        let unusable = |why: String| LoomReport {
            unusable: Some(why),
            ..LoomReport::default()
        };
        let Ok(text) = std::fs::read_to_string(path) else {
            return unusable(format!("{} not found: run scripts/loom.sh", path.display()));
        };
        let Ok(json) = serde_json::from_str::<serde_json::Value>(&text) else {
            return unusable(format!("{} is not JSON", path.display()));
        };
        let root = path
            .parent()
            .and_then(Path::parent)
            .unwrap_or(Path::new("."));
        let mut bytes = Vec::new();
        for f in LOOM_SOURCES {
            match std::fs::read(root.join(f)) {
                Ok(b) => bytes.extend(b),
                Err(_) => return unusable(format!("{f} not found next to {}", path.display())),
            }
        }
        let current = ticketflow_core::fingerprint::sha256_hex(&bytes);
        if json["source_sha256"].as_str() != Some(current.as_str()) {
            return unusable("stale: the sources changed since scripts/loom.sh last ran".into());
        }
        let list = json["models"].as_array().cloned().unwrap_or_default();
        let field = |m: &serde_json::Value, k: &str| m[k].as_str().unwrap_or("").to_string();
        LoomReport {
            unusable: None,
            models: list
                .iter()
                .map(|m| {
                    (
                        field(m, "implementation"),
                        field(m, "expected"),
                        field(m, "result"),
                        field(m, "name"),
                    )
                })
                .collect(),
            generated_at: json["generated_at"].as_str().map(str::to_string),
            raw: list,
        }
    }

    /// Every model ran with the result it was expected to have.
    pub fn verdict(&self) -> Verdict {
        if self.unusable.is_some() {
            Verdict::Pending
        } else if self.models.iter().any(|m| m.1 != m.2) || self.models.is_empty() {
            Verdict::Fail
        } else {
            Verdict::Pass
        }
    }

    fn outcome(&self, implementation: Implementation) -> GateOutcome {
        let name = implementation.name();
        let mine: Vec<_> = self.models.iter().filter(|m| m.0 == name).collect();
        if let Some(why) = &self.unusable {
            return GateOutcome::Pending(why.clone());
        }
        if mine.is_empty() {
            return GateOutcome::NotApplicable("no loom model for this implementation".into());
        }
        match mine.iter().find(|m| m.2 == "fail") {
            Some(m) => {
                GateOutcome::Killed(format!("loom model {} found a failing interleaving", m.3))
            }
            None => GateOutcome::Survived,
        }
    }
}

#[cfg(test)]
mod tests;
