//! What one `verify` run ran and found, as every output renders it: [`ReportInput`] (the
//! runs, suites, models, faults and kill matrix), the [`Context`] `verify` captured, the
//! judged [`Item`]s shared by `report.json` and JUnit, and [`TicketLabels`].
//!
//! Nothing here renders text or runs anything; `verify` fills these types in.

use uuid::Uuid;

use ticketflow_core::store::call::StoreCall;
use ticketflow_harness::blackbox::isolation::ExportedSpec;
use ticketflow_harness::faults::FaultReport;
use ticketflow_harness::killmatrix::{KillMatrix, LoomReport};
use ticketflow_harness::props::SuiteResult;
use ticketflow_harness::scenario::format::Scenario;
use ticketflow_harness::scenario::ScenarioRun;
use ticketflow_harness::verdict::Verdict;

/// Facts about the run that go into the report's environment section; `verify` captures
/// them (`crate::verify`), the renderers only read them.
#[derive(Debug, Clone)]
pub struct Context {
    /// The command line that produced the report.
    pub command: String,
    /// PostgreSQL URL with any password hidden.
    pub pg_url: String,
    /// Whether that URL is not the default, so reproduce commands must name it.
    pub custom_pg_url: bool,
    /// `ticketflow` version.
    pub version: String,
    /// `git rev-parse HEAD` of the working directory, when it is a git checkout.
    pub git_commit: Option<String>,
    /// When the run happened (UTC, ISO-8601).
    pub generated_at: String,
    /// The `--filter` patterns (empty: everything selected).
    pub filters: Vec<String>,
    /// The options that narrowed the run (`crate::verify::narrowed_by`; empty: a full run),
    /// `--filter` among them.
    pub narrowed_by: Vec<String>,
    /// The property-suite seed given with `--seed`.
    pub seed: Option<u64>,
    /// The create protocol of the scenario runs and property suites.
    pub protocol: ticketflow_core::protocol::Protocol,
    /// Where the run's time went, by phase (empty when `verify` did not time it).
    pub timings: Timings,
}

/// Where a `verify` run's time went: its phases in the order they ran, and the runs at once.
#[derive(Debug, Clone, Default)]
pub struct Timings {
    /// Independent runs at once (`--jobs`).
    pub jobs: usize,
    /// From the first phase's start to the last one's end, in milliseconds.
    pub wall_ms: f64,
    /// One row per phase that ran.
    pub phases: Vec<PhaseTiming>,
}

/// One phase of a `verify` run ([`Timings`]).
#[derive(Debug, Clone)]
pub struct PhaseTiming {
    /// Its name (`scenario runs`, `kill matrix`, …).
    pub phase: &'static str,
    /// Independent items it ran (scenario runs, suites, matrix cells, …).
    pub items: usize,
    /// Wall time, in milliseconds.
    pub wall_ms: f64,
    /// The items' own durations summed, in milliseconds: more than the wall time when items
    /// ran at once.
    pub summed_ms: f64,
    /// The PostgreSQL scratch databases it created and dropped, and what that took (summed
    /// over the items).
    pub scratch: ticketflow_harness::scratch::ScratchCost,
    /// The phases it ran beside, when it ran at the same time as them (the soak); its
    /// scratch cost is then counted in theirs.
    pub beside: Option<String>,
}

/// The parts of `verify` that check the tool itself rather than a user's scenarios, as a
/// report that covers only given files names them ([`Scope::Files`]).
pub const SELF_CHECKS: [&str; 5] = [
    "property suites",
    "loom models",
    "fault cases",
    "soak",
    "kill matrix",
];

/// What a report covers. Serialised into `report.json` as `{"kind": "verify"}` or
/// `{"kind": "files", "files": [...], "not_part_of_this_report": [...]}`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Scope {
    /// `ticketflow verify`: a scenario directory and the tool's own self-checks.
    #[default]
    Verify,
    /// `ticketflow scenario run --report`: only these files (as given on the command line,
    /// a directory standing for its `*.toml` files); none of [`SELF_CHECKS`] ran.
    Files(Vec<String>),
}

impl serde::Serialize for Scope {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        match self {
            Scope::Verify => {
                let mut m = serializer.serialize_map(Some(1))?;
                m.serialize_entry("kind", "verify")?;
                m.end()
            }
            Scope::Files(files) => {
                let mut m = serializer.serialize_map(Some(3))?;
                m.serialize_entry("kind", "files")?;
                m.serialize_entry("files", files)?;
                m.serialize_entry("not_part_of_this_report", &SELF_CHECKS)?;
                m.end()
            }
        }
    }
}

/// Everything one `verify` run produced, as the outputs render it.
#[derive(Debug, Clone, Copy)]
pub struct ReportInput<'a> {
    /// The scenarios loaded (after `--filter`).
    pub scenarios: &'a [Scenario],
    /// Every scenario run.
    pub runs: &'a [ScenarioRun],
    /// Every black-box scenario, with its repeats.
    pub targets: &'a [ticketflow_harness::blackbox::TargetOutcome],
    /// Black-box scenarios' names and descriptions.
    pub target_descriptions: &'a [(String, String)],
    /// Every property suite.
    pub suites: &'a [SuiteResult],
    /// The kill matrix, when it ran.
    pub kill: Option<&'a KillMatrix>,
    /// The loom models' report.
    pub loom: &'a LoomReport,
    /// Faults and bad input, when they ran.
    pub faults: Option<&'a FaultReport>,
    /// The short soak, when it was selected.
    pub soak: Option<&'a ticketflow_harness::soak::SoakReport>,
    /// Environment facts.
    pub ctx: &'a Context,
    /// Specs exported for failing PostgreSQL runs.
    pub specs: &'a [ExportedSpec],
    /// Parts `--filter` left out (named; not run, not judged).
    pub not_selected: &'a [String],
}

/// One judged item: a scenario run, a property suite, a loom model, a fault case, the soak or a
/// kill matrix row. The unit of `report.json`'s `items` and of a JUnit test case.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Item {
    /// `scenario`, `target`, `property`, `loom`, `fault`, `soak` or `kill-matrix`.
    pub kind: &'static str,
    /// Groups items for JUnit test suites, e.g. `scenarios.postgres`.
    pub group: String,
    /// Unique within its group, e.g. `a-same-key-same-body [READ COMMITTED]`.
    pub name: String,
    /// PASS / FAIL / PENDING.
    pub verdict: Verdict,
    /// Why, when not PASS (and for kill-matrix rows, what killed the variant).
    pub reason: Option<String>,
    /// Seconds it took, when measured (JUnit `time`); never shown in REPORT.md tables.
    pub seconds: Option<f64>,
}

/// Every judged item of a run, in report order.
pub fn items(input: &ReportInput<'_>) -> Vec<Item> {
    let mut out = Vec::new();
    for r in input.runs {
        out.push(Item {
            kind: "scenario",
            group: format!("scenarios.{}", r.backend.name()),
            name: format!("{} [{}]", r.scenario, r.setting.label()),
            verdict: r.verdict,
            reason: r.reason.clone(),
            seconds: r.release_to_done_ms.map(|m| m / 1000.0),
        });
    }
    for t in input.targets {
        out.push(Item {
            kind: "target",
            group: "targets".into(),
            name: t.scenario.clone(),
            verdict: t.verdict,
            reason: t.reason.clone(),
            seconds: None,
        });
    }
    for s in input.suites {
        out.push(Item {
            kind: "property",
            group: "property".into(),
            name: format!("{} ({})", s.suite, s.backend_name()),
            verdict: s.verdict,
            reason: s.reason.clone(),
            seconds: None,
        });
    }
    out.extend(loom_items(input.loom));
    if let Some(f) = input.faults {
        for c in &f.cases {
            out.push(Item {
                kind: "fault",
                group: "faults".into(),
                name: format!("{} ({})", c.name, c.backend),
                verdict: c.verdict,
                reason: (c.verdict != Verdict::Pass).then(|| c.detail.clone()),
                seconds: None,
            });
        }
        for (name, why) in &f.not_run {
            out.push(Item {
                kind: "fault",
                group: "faults".into(),
                name: (*name).to_string(),
                verdict: Verdict::Pending,
                reason: Some(why.clone()),
                seconds: None,
            });
        }
    }
    if let Some(s) = input.soak {
        out.push(Item {
            kind: "soak",
            group: "soak".into(),
            name: "soak".into(),
            verdict: s.verdict,
            reason: s.reason.clone(),
            seconds: Some(s.duration_s),
        });
    }
    if let Some(k) = input.kill {
        for row in k.rows() {
            out.push(Item {
                kind: "kill-matrix",
                group: "kill-matrix".into(),
                name: format!("{} ({})", row.implementation.name(), row.backend),
                verdict: row.verdict,
                reason: Some(row.detail),
                seconds: None,
            });
        }
    }
    out
}

/// The loom models' items: one per model read from the loom report, or one PENDING item when
/// the report cannot be used. `verify` reads them, it does not run them.
pub fn loom_items(loom: &LoomReport) -> Vec<Item> {
    let mut out = Vec::new();
    match &loom.unusable {
        Some(why) => out.push(Item {
            kind: "loom",
            group: "loom".into(),
            name: "loom models".into(),
            verdict: Verdict::Pending,
            reason: Some(why.clone()),
            seconds: None,
        }),
        None => {
            for m in &loom.raw {
                let expected = m["expected"].as_str().unwrap_or("?");
                let result = m["result"].as_str().unwrap_or("?");
                out.push(Item {
                    kind: "loom",
                    group: "loom".into(),
                    name: format!(
                        "{} × {}",
                        m["name"].as_str().unwrap_or("?"),
                        m["implementation"].as_str().unwrap_or("?")
                    ),
                    verdict: if expected == result {
                        Verdict::Pass
                    } else {
                        Verdict::Fail
                    },
                    reason: (expected != result)
                        .then(|| format!("expected {expected}, got {result}")),
                    seconds: m["wall_ms"].as_f64().map(|ms| ms / 1000.0),
                });
            }
        }
    }
    out
}

/// The totals of a run, the same in REPORT.md's headline and on the terminal's last line:
/// PASS / FAIL / PENDING over every judged item ([`items`]), plus the parts `--filter` left
/// out, which did not run and so count as PENDING too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct Totals {
    /// Items that passed.
    pub pass: usize,
    /// Items that failed.
    pub fail: usize,
    /// Items that did not run or could not decide, including `not_selected`.
    pub pending: usize,
    /// Of `pending`, the parts `--filter` left out.
    pub not_selected: usize,
}

impl Totals {
    /// The totals of `input`.
    pub fn of(input: &ReportInput<'_>) -> Self {
        let (pass, fail, pending) = counts(&items(input));
        let not_selected = input.not_selected.len();
        Totals {
            pass,
            fail,
            pending: pending + not_selected,
            not_selected,
        }
    }
}

impl std::fmt::Display for Totals {
    /// `12 PASS, 0 FAIL, 3 PENDING` and, for a partial run, `(2 not selected by --filter)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} PASS, {} FAIL, {} PENDING",
            self.pass, self.fail, self.pending
        )?;
        if self.not_selected > 0 {
            write!(
                f,
                " ({} not selected by {})",
                self.not_selected,
                ticketflow_core::flags::FILTER
            )?;
        }
        Ok(())
    }
}

/// PASS / FAIL / PENDING counts over `items`.
pub fn counts(items: &[Item]) -> (usize, usize, usize) {
    let n = |v: Verdict| items.iter().filter(|i| i.verdict == v).count();
    (n(Verdict::Pass), n(Verdict::Fail), n(Verdict::Pending))
}

/// Stable short names for the ticket ids of one run: `T1`, `T2`, … in order of first
/// appearance (racer outcomes in racer order, then inserted tickets), so tables and
/// diagrams do not change with the random ids. Full ids are in `report.json`.
#[derive(Debug, Clone, Default)]
pub struct TicketLabels(Vec<Uuid>);

impl TicketLabels {
    /// Labels for `run`.
    pub fn for_run(run: &ScenarioRun) -> Self {
        let mut ids: Vec<Uuid> = Vec::new();
        let mut add = |id: Uuid| {
            if !ids.contains(&id) {
                ids.push(id);
            }
        };
        for r in &run.racers {
            if let Ok(Some(id)) = r.result.as_ref().map(|o| o.ticket_id) {
                add(id);
            }
        }
        for r in &run.racers {
            for s in &r.steps {
                match &s.call {
                    StoreCall::InsertTicket { ticket } => add(ticket.id),
                    StoreCall::InsertReceiptIfAbsent { receipt } => add(receipt.ticket_id),
                    StoreCall::ClaimAndCreate { receipt, .. } => add(receipt.ticket_id),
                    _ => {}
                }
            }
        }
        TicketLabels(ids)
    }

    /// `T<n>` for a known id, else its first 8 hex digits.
    pub fn label(&self, id: Uuid) -> String {
        match self.0.iter().position(|x| *x == id) {
            Some(i) => format!("T{}", i + 1),
            None => id.to_string()[..8].to_string(),
        }
    }
}
