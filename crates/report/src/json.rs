//! `report.json`: everything REPORT.md shows, for machines, under a versioned schema
//! (`schemas/report.schema.json`, JSON Schema draft 2020-12).
//!
//! Versioning: [`SCHEMA_VERSION`] is bumped when a field is removed or changes meaning;
//! adding a field does not bump it, so readers must ignore fields they do not know.

use serde::Serialize;

use super::{counts, items, Item, ReportInput, Scope};
use ticketflow_harness::blackbox::isolation::ExportedSpec;
use ticketflow_harness::faults::FaultReport;
use ticketflow_harness::killmatrix::{KillCell, KillRow};
use ticketflow_harness::props::SuiteResult;
use ticketflow_harness::scenario::{Evidence, ScenarioRun};
use ticketflow_harness::verdict::Verdict;

/// The `schema_version` this build writes.
pub const SCHEMA_VERSION: u32 = 3;

/// The schema document, as shipped in `schemas/report.schema.json`.
pub const SCHEMA: &str = include_str!("../../../schemas/report.schema.json");

/// The top-level object of `report.json`.
#[derive(Debug, Serialize)]
pub struct ReportJson<'a> {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// `{"name": "ticketflow", "version": "x.y.z"}`.
    pub tool: Tool,
    /// When the run happened (UTC, ISO-8601).
    pub generated_at: &'a str,
    /// The command line, passwords hidden.
    pub command: &'a str,
    /// `git rev-parse HEAD` of the working directory, when known.
    pub git_commit: Option<&'a str>,
    /// What the report covers: `verify`'s whole run, or only the files `scenario run` was
    /// given (then the self-checks it names did not run and their fields are empty or null).
    pub scope: &'a Scope,
    /// Server and library versions.
    pub environment: Environment<'a>,
    /// The process exit code `verify` returned (0, 1 or 3; see docs/CLI.md).
    pub exit_code: i32,
    /// Counts over `items`.
    pub summary: Summary,
    /// The `--filter` patterns (empty: everything selected).
    pub filters: &'a [String],
    /// Parts `--filter` left out; not run, not judged.
    pub not_selected: &'a [String],
    /// The options that narrowed the run (`--filter`, `--backend sqlite`, `--no-kill-matrix`,
    /// …); empty for a full run. A partial report never replaces a full one.
    pub narrowed_by: &'a [String],
    /// Every judged item, PENDING ones included, in report order.
    pub items: Vec<Item>,
    /// Every scenario run in full: checks, racers with their recorded steps, rows, evidence.
    pub scenario_runs: &'a [ScenarioRun],
    /// Every black-box scenario with its repeats: checks, racers with every attempt, counts,
    /// evidence.
    pub targets: &'a [ticketflow_harness::blackbox::TargetOutcome],
    /// Every property suite.
    pub property_suites: &'a [SuiteResult],
    /// Loom models as `reports/loom.json` recorded them; `None` (null) in a report that covers
    /// only given files, which reads no loom report.
    pub loom: Option<Loom<'a>>,
    /// Fault cases, when they ran.
    pub faults: Option<&'a FaultReport>,
    /// The short soak (`ticketflow soak`), when it was selected: settings, figures, faults
    /// and every invariant with its evidence.
    pub soak: Option<&'a ticketflow_harness::soak::SoakReport>,
    /// The kill matrix, when it ran.
    pub kill_matrix: Option<KillMatrixJson<'a>>,
    /// Isolation-tester specs written for failing PostgreSQL runs.
    pub isolation_specs: &'a [ExportedSpec],
}

/// Tool name and version.
#[derive(Debug, Serialize)]
pub struct Tool {
    /// `ticketflow`.
    pub name: &'static str,
    /// Crate version.
    pub version: &'static str,
}

/// Where it ran.
#[derive(Debug, Serialize)]
pub struct Environment<'a> {
    /// PostgreSQL URL, password hidden.
    pub postgres_url: &'a str,
    /// `server_version` of the PostgreSQL server, when a run reached it.
    pub postgres_server: Option<&'a str>,
    /// The bundled SQLite library version.
    pub sqlite: &'static str,
}

/// PASS / FAIL / PENDING counts.
#[derive(Debug, Serialize)]
pub struct Summary {
    /// Items that passed.
    pub pass: usize,
    /// Items that failed.
    pub fail: usize,
    /// Items that did not run.
    pub pending: usize,
    /// All items.
    pub total: usize,
}

/// The loom section.
#[derive(Debug, Serialize)]
pub struct Loom<'a> {
    /// PASS / FAIL / PENDING.
    pub verdict: Verdict,
    /// Why the models cannot be used (missing or stale `reports/loom.json`).
    pub unusable: Option<&'a str>,
    /// When the models ran.
    pub generated_at: Option<&'a str>,
    /// The models as recorded.
    pub models: &'a [serde_json::Value],
}

/// The kill-matrix section.
#[derive(Debug, Serialize)]
pub struct KillMatrixJson<'a> {
    /// PASS / FAIL / PENDING.
    pub verdict: Verdict,
    /// One row per implementation and backend.
    pub rows: Vec<KillRow>,
    /// Every gate × implementation × backend cell.
    pub cells: &'a [KillCell],
}

/// `verify`'s scope, for [`build`] and [`render`].
static VERIFY: Scope = Scope::Verify;

/// Builds `report.json`'s value for a `verify` run ([`Scope::Verify`]).
pub fn build<'a>(input: &ReportInput<'a>, exit_code: i32) -> ReportJson<'a> {
    build_scoped(input, exit_code, &VERIFY)
}

/// Builds `report.json`'s value for a report covering `scope`; with [`Scope::Files`] its
/// `loom` is null.
pub fn build_scoped<'a>(
    input: &ReportInput<'a>,
    exit_code: i32,
    scope: &'a Scope,
) -> ReportJson<'a> {
    let all = items(input);
    let (pass, fail, pending) = counts(&all);
    let ctx = input.ctx;
    ReportJson {
        schema_version: SCHEMA_VERSION,
        tool: Tool {
            name: "ticketflow",
            version: env!("CARGO_PKG_VERSION"),
        },
        generated_at: &ctx.generated_at,
        command: &ctx.command,
        git_commit: ctx.git_commit.as_deref(),
        scope,
        environment: Environment {
            postgres_url: &ctx.pg_url,
            postgres_server: input.runs.iter().find_map(|r| match &r.evidence {
                Some(Evidence::Postgres { server_version, .. }) => Some(server_version.as_str()),
                _ => None,
            }),
            sqlite: rusqlite::version(),
        },
        exit_code,
        summary: Summary {
            pass,
            fail,
            pending,
            total: all.len(),
        },
        filters: &ctx.filters,
        narrowed_by: &ctx.narrowed_by,
        not_selected: input.not_selected,
        items: all,
        scenario_runs: input.runs,
        targets: input.targets,
        property_suites: input.suites,
        loom: (*scope == Scope::Verify).then(|| Loom {
            verdict: input.loom.verdict(),
            unusable: input.loom.unusable.as_deref(),
            generated_at: input.loom.generated_at.as_deref(),
            models: &input.loom.raw,
        }),
        faults: input.faults,
        soak: input.soak,
        kill_matrix: input.kill.map(|k| KillMatrixJson {
            verdict: k.verdict(),
            rows: k.rows(),
            cells: &k.cells,
        }),
        isolation_specs: input.specs,
    }
}

/// `report.json`'s text: compact (one line, trailing newline), the scenario runs without their
/// racers' recorded steps, which [`render_steps`] writes to `report.steps.json`.
pub fn render(input: &ReportInput<'_>, exit_code: i32) -> String {
    render_scoped(input, exit_code, &VERIFY)
}

/// [`render`] for a report covering `scope` ([`build_scoped`]).
pub fn render_scoped(input: &ReportInput<'_>, exit_code: i32, scope: &Scope) -> String {
    let runs: Vec<ScenarioRun> = input
        .runs
        .iter()
        .map(|r| {
            let mut r = r.clone();
            r.racers.iter_mut().for_each(|racer| racer.steps.clear());
            r
        })
        .collect();
    let input = ReportInput {
        runs: &runs,
        ..*input
    };
    let text = serde_json::to_string(&build_scoped(&input, exit_code, scope))
        .expect("report values serialize");
    // Secrets masked in every string, bidi and C1 characters as JSON escapes.
    let mut text = ticketflow_harness::contain::json(&text);
    text.push('\n');
    text
}

/// One racer's recorded steps in `report.steps.json`.
#[derive(Debug, Serialize)]
pub struct RacerSteps<'a> {
    /// The scenario.
    pub scenario: &'a str,
    /// The run's setting label, e.g. `read-committed`.
    pub setting: String,
    /// The racer's name.
    pub racer: &'a str,
    /// Its store operations, in order, with arguments and times.
    pub steps: &'a [ticketflow_harness::scenario::timeline::Step],
}

/// `report.steps.json`: every racer's recorded steps, run by run (compact, one line).
pub fn render_steps(input: &ReportInput<'_>) -> String {
    let steps: Vec<RacerSteps<'_>> = input
        .runs
        .iter()
        .flat_map(|r| {
            r.racers.iter().map(|racer| RacerSteps {
                scenario: &r.scenario,
                setting: r.setting.label(),
                racer: &racer.name,
                steps: &racer.steps,
            })
        })
        .collect();
    let text = serde_json::to_string(&steps).expect("steps serialize");
    let mut text = ticketflow_harness::contain::json(&text);
    text.push('\n');
    text
}
