//! The outputs of `verify`: REPORT.md (for people), `report.json` (a versioned schema,
//! [`json`]) and `report.junit.xml` (for CI systems, [`junit`]), Mermaid diagrams of each
//! PostgreSQL race ([`mermaid`]) and isolation-tester specs of failing PostgreSQL races
//! ([`isolation`]).
//!
//! REPORT.md is diff-friendly: verdict tables hold no timings, seeds, pids, scratch database
//! names or ticket ids (tickets are labelled `T1`, `T2` per run), so two runs with the same
//! results give the same tables. Timings and seeds go to the Environment section at the end.

pub mod isolation;
pub mod json;
pub mod junit;
pub mod mermaid;
pub mod targets;

use std::fmt::Write as _;
use std::path::PathBuf;

use uuid::Uuid;

use crate::domain::{DecisionPath, OutcomeKind};
use crate::faults::FaultReport;
use crate::killmatrix::{GateOutcome, KillMatrix, LoomReport};
use crate::props::SuiteResult;
use crate::scenario::format::{RacerKind, Scenario};
use crate::scenario::timeline::StoreCall;
use crate::scenario::{Evidence, RunSetting, ScenarioRun, Verdict};
use crate::store::postgres::IsolationLevel;
use crate::store::url::{redact, DEFAULT_PG_URL};
use crate::store::Backend;
use crate::verify::VerifyOptions;

/// Facts about the run that go into the report's environment section.
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
    /// The property-suite seed given with `--seed`.
    pub seed: Option<u64>,
    /// The create protocol of the scenario runs and property suites.
    pub protocol: crate::protocol::Protocol,
}

impl Context {
    /// Captures the context of a `verify` run.
    pub fn capture(opts: &VerifyOptions) -> Self {
        Context {
            // Any argument that carries a URL is shown with its password hidden.
            command: std::env::args()
                .enumerate()
                .map(|(i, a)| {
                    if i == 0 {
                        "ticketflow".to_string()
                    } else {
                        redact(&a)
                    }
                })
                .collect::<Vec<_>>()
                .join(" "),
            pg_url: redact(&opts.pg_url),
            custom_pg_url: opts.pg_url != DEFAULT_PG_URL,
            version: env!("CARGO_PKG_VERSION").to_string(),
            git_commit: git_commit(),
            generated_at: crate::domain::iso8601(crate::domain::now_utc()),
            filters: opts.filters.clone(),
            seed: opts.seed,
            protocol: opts.protocol,
        }
    }
}

fn git_commit() -> Option<String> {
    let out = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_string())
}

/// An isolation-tester spec written for a failing PostgreSQL run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ExportedSpec {
    /// Scenario name.
    pub scenario: String,
    /// The run's setting label (`READ COMMITTED`, …).
    pub setting: String,
    /// Where it was written.
    pub path: PathBuf,
}

/// Everything one `verify` run produced, as the outputs render it.
#[derive(Debug, Clone, Copy)]
pub struct ReportInput<'a> {
    /// The scenarios loaded (after `--filter`).
    pub scenarios: &'a [Scenario],
    /// Every scenario run.
    pub runs: &'a [ScenarioRun],
    /// Every black-box scenario, with its repeats.
    pub targets: &'a [crate::target::TargetOutcome],
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
    /// Environment facts.
    pub ctx: &'a Context,
    /// Specs exported for failing PostgreSQL runs.
    pub specs: &'a [ExportedSpec],
    /// Parts `--filter` left out (named; not run, not judged).
    pub not_selected: &'a [String],
}

/// One judged item: a scenario run, a property suite, a loom model, a fault case or a kill
/// matrix row. The unit of `report.json`'s `items` and of a JUnit test case.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Item {
    /// `scenario`, `property`, `loom`, `fault` or `kill-matrix`.
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
    match &input.loom.unusable {
        Some(why) => out.push(Item {
            kind: "loom",
            group: "loom".into(),
            name: "loom models".into(),
            verdict: Verdict::Pending,
            reason: Some(why.clone()),
            seconds: None,
        }),
        None => {
            for m in &input.loom.raw {
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

fn cell(runs: &[ScenarioRun], scenario: &str, setting: RunSetting) -> String {
    runs.iter()
        .find(|r| r.scenario == scenario && r.setting == setting)
        .map(|r| format!("**{}**", r.verdict))
        .unwrap_or_else(|| "—".into())
}

/// Escapes text for a Markdown table cell.
fn md(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

/// Counts of the paths racers took in one run: created, replay from lookup, replay after a
/// unique violation, conflict, errors, and retried transactions.
fn paths(r: &ScenarioRun) -> String {
    let mut created = 0;
    let mut lookup = 0;
    let mut after_uv = 0;
    let mut conflict = 0;
    let mut errors = 0;
    let mut retries = 0;
    for rc in &r.racers {
        match &rc.result {
            Ok(o) => {
                retries += o.attempts.saturating_sub(1);
                match (o.kind, o.path) {
                    (OutcomeKind::Created, _) => created += 1,
                    (OutcomeKind::Conflict, _) => conflict += 1,
                    (
                        OutcomeKind::Replayed,
                        Some(
                            DecisionPath::AfterUniqueViolation | DecisionPath::AfterInsertConflict,
                        ),
                    ) => after_uv += 1,
                    (OutcomeKind::Replayed, _) => lookup += 1,
                }
            }
            Err(_) => errors += 1,
        }
    }
    format!("{created} | {lookup} | {after_uv} | {conflict} | {errors} | {retries}")
}

const LIMITS: &str = "\
- **SQLite runs prove control flow only** (the lesson's own caveat): racers on separate \
connections to one file meet at an in-process barrier and SQLite's single writer serializes the \
rest. They say nothing about PostgreSQL isolation levels, row or relation locks, or what another \
session can see.
- **PostgreSQL runs** prove the races that were run, at the isolation levels shown, on this server \
version, with the barrier lock mode shown: other windows (say, a racer paused between its ticket \
and outbox inserts) are covered only where a scenario, fault case or loom model names them.
- **Property suites** sample generated histories (the case counts shown); they do not enumerate \
every history. **Loom models** enumerate interleavings of 2–3 threads within a preemption bound \
over an in-memory model of READ COMMITTED, not PostgreSQL itself.
- **Black-box runs** judge a service only through its answers and the count queries the \
scenario gives: a table-lock or advisory barrier proves the requests were waiting inside its \
database at the release (counted, not attributed: the runner cannot tell which session serves \
which client); an HTTP-level barrier proves only that the requests left together, so its PASS \
needs repeats. They say nothing about what the service writes that no count query reads.
- **Nothing here proves the network path** between a client and a service (timeouts, retries by \
proxies), clock skew between hosts, or replication lag to a standby that serves reads.
- Anything PENDING above did not run and proves nothing.";

const PROVES: &str = "\
- **PostgreSQL**: every racer has its own connection and backend pid (threads, or `ticketflow \
worker` processes); a controller session takes the barrier lock and the runner sees every racer \
waiting on it in `pg_locks` (blocked by the controller per `pg_blocking_pids`) before it releases \
the lock; rows are counted by direct SQL in a scratch database created and dropped for the run. \
The lock mode decides the race window: `access-exclusive` holds racers at the receipt lookup, \
`exclusive` at the receipt INSERT after the ticket and outbox inserts (every loser meets the \
unique violation), `advisory` right after the lookup. Each scenario shows its race as a sequence \
diagram drawn from the recorded statements.
- Under REPEATABLE READ and SERIALIZABLE a loser's snapshot may not see the winner (23505 with no \
visible winner, or 40001): the repository retries the whole transaction, bounded; retries are \
counted in the paths table.
- Property suites compare generated histories with a reference model, sequentially (invariants \
read back by SQL) and concurrently (linearizability), on both backends.
- Loom models come from `reports/loom.json` (written by `scripts/loom.sh`) and are PENDING when it \
is missing or stale.
- Faults: crashes inside the transaction, a client dying after COMMIT, a terminated backend, a \
lock timeout and (only with `--restart-postgres`) a server restart, each followed by a retry that \
must converge. A statement_timeout is not injected separately: it cancels the same way as the lock \
timeout (SQLSTATE class 57/55) and is classified as a timeout.
- The kill matrix runs every gate against the wrong implementations (SPEC §6's five and one for \
the on-conflict protocol) and both real protocols as controls: each gate is shown to catch the \
fault it is for.";

/// Renders REPORT.md.
pub fn render(input: &ReportInput<'_>) -> String {
    let ReportInput {
        scenarios,
        runs,
        targets,
        target_descriptions,
        suites,
        kill,
        loom,
        faults,
        ctx,
        specs,
        not_selected,
    } = *input;
    let all = items(input);
    let (pass, fail, pending) = counts(&all);
    let mut out = String::new();
    let _ = writeln!(out, "# TicketFlow Verify report\n");
    let _ = writeln!(
        out,
        "Generated by `ticketflow verify`; do not edit by hand. Re-run it to refresh. \
         Machine-readable: `report.json` (schema `schemas/report.schema.json`) and \
         `report.junit.xml` beside this file.\n"
    );
    let kinds = |k: &str| all.iter().filter(|i| i.kind == k).count();
    let _ = writeln!(
        out,
        "**{pass} PASS, {fail} FAIL, {pending} PENDING** over {} items: {} scenario runs ({} \
         scenarios), {} black-box scenarios, {} property suites, {} loom models, {} fault cases, {} kill-matrix rows.\n",
        all.len(),
        runs.len(),
        scenarios.len(),
        targets.len(),
        suites.len(),
        kinds("loom"),
        kinds("fault"),
        kinds("kill-matrix"),
    );
    let _ = writeln!(
        out,
        "Loom models: **{}**. Faults and bad input: **{}**. Kill matrix: **{}**.\n",
        loom.verdict(),
        faults
            .map(|f| f.verdict().to_string())
            .unwrap_or_else(|| "PENDING (not selected)".into()),
        kill.map(|k| k.verdict().to_string())
            .unwrap_or_else(|| "PENDING (not run)".into())
    );
    if !ctx.filters.is_empty() {
        let _ = writeln!(
            out,
            "**Partial run**: `--filter {}` selected a subset; what it left out is listed below \
             and proves nothing.\n",
            ctx.filters.join(" --filter ")
        );
    }

    let pending_items: Vec<&Item> = all
        .iter()
        .filter(|i| i.verdict == Verdict::Pending)
        .collect();
    if !pending_items.is_empty() || kill.is_none() || !not_selected.is_empty() {
        let _ = writeln!(out, "## PENDING: did not run\n");
        for i in &pending_items {
            let _ = writeln!(
                out,
                "- {} `{}`: {}",
                i.kind,
                i.name,
                md(i.reason.as_deref().unwrap_or("no reason recorded"))
            );
        }
        if kill.is_none() && !not_selected.iter().any(|n| n == "kill-matrix") {
            let _ = writeln!(out, "- kill matrix: skipped with --no-kill-matrix");
        }
        if !not_selected.is_empty() {
            let _ = writeln!(
                out,
                "- not selected by --filter: {}",
                not_selected.join(", ")
            );
        }
        out.push('\n');
    }

    let _ = writeln!(out, "## What this cannot prove\n\n{LIMITS}\n");
    let _ = writeln!(out, "## How the evidence was gathered\n\n{PROVES}\n");

    if !specs.is_empty() {
        let _ = writeln!(out, "## Failing PostgreSQL races, exported\n");
        let _ = writeln!(
            out,
            "Each failing PostgreSQL run was exported as a PostgreSQL isolation-tester spec that \
             replays its recorded interleaving: `isolationtester \"dbname=EMPTY_DB\" < FILE`.\n"
        );
        for s in specs {
            let _ = writeln!(
                out,
                "- `{}` ({}): `{}`",
                s.scenario,
                s.setting,
                s.path.display()
            );
        }
        out.push('\n');
    }

    render_pg_matrix(&mut out, scenarios, runs);
    targets::render_verdicts(&mut out, targets);
    render_sqlite_matrix(&mut out, scenarios, runs);
    render_suites(&mut out, suites);
    render_loom(&mut out, loom);
    if let Some(f) = faults {
        render_faults(&mut out, f);
    }
    if let Some(k) = kill {
        render_kill_matrix(&mut out, k);
    }
    render_paths(&mut out, runs);

    let _ = writeln!(out, "## Scenarios\n");
    for s in scenarios {
        let _ = writeln!(out, "### {}\n", s.name);
        let _ = writeln!(out, "{}\n", s.description.trim());
        let _ = writeln!(
            out,
            "File: `{}`. Racers: {}.\n",
            s.file.display(),
            s.racers.len()
        );
        let mine: Vec<&ScenarioRun> = runs.iter().filter(|r| r.scenario == s.name).collect();
        // The race at READ COMMITTED (the lesson's level), drawn where a reader sees it.
        let shown: Option<&ScenarioRun> = mine.iter().copied().find(|r| {
            r.setting
                == RunSetting::Postgres {
                    isolation: IsolationLevel::ReadCommitted,
                }
        });
        if let Some(d) = shown.and_then(|r| mermaid::sequence_diagram(r, &TicketLabels::for_run(r)))
        {
            let _ = writeln!(out, "The race on PostgreSQL at READ COMMITTED:\n\n{d}");
        }
        for r in mine {
            render_run(
                &mut out,
                s,
                r,
                ctx,
                shown.is_some_and(|x| std::ptr::eq(x, r)),
            );
        }
    }

    targets::render_details(&mut out, targets, target_descriptions);

    render_environment(&mut out, scenarios, runs, suites, loom, ctx);
    out
}

fn render_pg_matrix(out: &mut String, scenarios: &[Scenario], runs: &[ScenarioRun]) {
    let _ = writeln!(out, "## Verdicts: PostgreSQL, by isolation level\n");
    let _ = writeln!(
        out,
        "| scenario | racers | barrier lock (where racers are held) | READ COMMITTED | REPEATABLE READ | SERIALIZABLE |\n|---|---|---|---|---|---|"
    );
    for s in scenarios
        .iter()
        .filter(|s| s.backends.contains(&Backend::Postgres))
    {
        let mut row = format!(
            "| [{}](#{}) | {} {} | {}: {} |",
            s.name,
            anchor(&s.name),
            s.racers.len(),
            match s.racers_as {
                RacerKind::Threads => "threads",
                RacerKind::Processes => "processes",
            },
            s.barrier.lock.name(),
            s.barrier.lock.window()
        );
        for isolation in IsolationLevel::ALL {
            let _ = write!(
                row,
                " {} |",
                cell(runs, &s.name, RunSetting::Postgres { isolation })
            );
        }
        let _ = writeln!(out, "{row}");
    }
    out.push('\n');
}

fn render_sqlite_matrix(out: &mut String, scenarios: &[Scenario], runs: &[ScenarioRun]) {
    let sqlite = RunSetting::sqlite_matrix();
    let _ = writeln!(
        out,
        "## Verdicts: SQLite, by journal and transaction mode (control flow only)\n"
    );
    let mut header = "| scenario |".to_string();
    let mut rule = "|---|".to_string();
    for setting in &sqlite {
        let _ = write!(header, " {} |", setting.label());
        rule.push_str("---|");
    }
    let _ = writeln!(out, "{header}\n{rule}");
    for s in scenarios
        .iter()
        .filter(|s| s.backends.contains(&Backend::Sqlite))
    {
        let mut row = format!("| [{}](#{}) |", s.name, anchor(&s.name));
        for setting in &sqlite {
            let _ = write!(row, " {} |", cell(runs, &s.name, *setting));
        }
        let _ = writeln!(out, "{row}");
    }
    out.push('\n');
}

fn render_paths(out: &mut String, runs: &[ScenarioRun]) {
    let _ = writeln!(out, "## Paths the racers took\n");
    let _ = writeln!(
        out,
        "Per run: racers that created; replayed from the first receipt lookup; replayed after the \
         receipt INSERT lost the key (a unique violation, SPEC §4 step 4, or with the on-conflict \
         protocol an `ON CONFLICT DO NOTHING` that inserted nothing); got a conflict; failed; and \
         transactions retried (serialization failure 40001, deadlock 40P01, SQLite busy, or a \
         winner invisible to a REPEATABLE READ snapshot). Which racer takes which path depends on \
         scheduling, so these counts can differ between runs that pass alike.\n"
    );
    let _ = writeln!(
        out,
        "| scenario | setting | created | replay (lookup) | replay (after the receipt INSERT lost) | conflict | errors | retries |\n|---|---|---|---|---|---|---|---|"
    );
    for r in runs.iter().filter(|r| r.verdict != Verdict::Pending) {
        let _ = writeln!(
            out,
            "| {} | {} | {} |",
            r.scenario,
            r.setting.label(),
            paths(r)
        );
    }
    out.push('\n');
}

fn fmt_ms(v: Option<f64>) -> String {
    v.map(|m| m.to_string()).unwrap_or_else(|| "—".into())
}

fn render_environment(
    out: &mut String,
    scenarios: &[Scenario],
    runs: &[ScenarioRun],
    suites: &[SuiteResult],
    loom: &LoomReport,
    ctx: &Context,
) {
    let _ = writeln!(out, "## Environment\n");
    let _ = writeln!(out, "- command: `{}`", ctx.command);
    let _ = writeln!(out, "- ticketflow {}", ctx.version);
    let _ = writeln!(
        out,
        "- create protocol of the scenario runs and property suites: `{}`",
        ctx.protocol.name()
    );
    if let Some(c) = &ctx.git_commit {
        let _ = writeln!(out, "- git commit {c}");
    }
    let _ = writeln!(out, "- PostgreSQL URL: `{}`", ctx.pg_url);
    if let Some(v) = runs.iter().find_map(|r| match &r.evidence {
        Some(Evidence::Postgres { server_version, .. }) => Some(server_version),
        _ => None,
    }) {
        let _ = writeln!(out, "- PostgreSQL server {v}");
    }
    let _ = writeln!(out, "- SQLite {}", rusqlite::version());
    let _ = writeln!(out, "- generated at {}", ctx.generated_at);
    if let Some(at) = &loom.generated_at {
        let _ = writeln!(out, "- loom models ran at {at}");
    }
    out.push('\n');

    if !suites.is_empty() {
        let _ = writeln!(
            out,
            "Property-suite seeds (replay with `ticketflow verify --seed SEED` and the same \
             `PROPTEST_CASES`; {}):\n",
            match ctx.seed {
                Some(s) => format!("this run used `--seed {s}`"),
                None => "each suite drew its own".into(),
            }
        );
        for s in suites {
            let _ = writeln!(out, "- {} ({}): {}", s.suite, s.backend_name(), s.seed);
        }
        out.push('\n');
    }

    let _ = writeln!(
        out,
        "### Timings\n\nThey vary from run to run and are not part of any verdict.\n"
    );
    let _ = writeln!(
        out,
        "| scenario | setting | racers | all racers seen waiting after (ms) | release → all done (ms) |\n|---|---|---|---|---|"
    );
    for r in runs.iter().filter(|r| r.verdict != Verdict::Pending) {
        let reached = match &r.evidence {
            Some(Evidence::Postgres {
                barrier_reached_ms, ..
            }) => *barrier_reached_ms,
            _ => None,
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            r.scenario,
            r.setting.label(),
            r.racer_count,
            fmt_ms(reached),
            fmt_ms(r.release_to_done_ms)
        );
    }
    out.push('\n');
    let scaled: Vec<&Scenario> = scenarios.iter().filter(|s| s.scaled).collect();
    if !scaled.is_empty() {
        let _ = writeln!(
            out,
            "Scale sweeps (scenarios generated by `scale`): release → all done in the table above, \
             by racer count.\n"
        );
    }
    if loom.unusable.is_none() && !loom.raw.is_empty() {
        let _ = writeln!(
            out,
            "| loom model | implementation | wall (ms) |\n|---|---|---|"
        );
        for m in &loom.raw {
            let _ = writeln!(
                out,
                "| {} | {} | {} |",
                m["name"].as_str().unwrap_or("?"),
                m["implementation"].as_str().unwrap_or("?"),
                m["wall_ms"]
            );
        }
        out.push('\n');
    }
}

fn render_faults(out: &mut String, f: &FaultReport) {
    let _ = writeln!(out, "## Faults and bad input\n");
    let lost: usize = f.cases.iter().map(|c| c.rows_lost).sum();
    let half: usize = f.cases.iter().map(|c| c.half_states).sum();
    let _ = writeln!(
        out,
        "Verdict: **{}**. Faults injected: **{}**. Inputs tried: **{}**. Rows lost: **{lost}**. \
         Half states: **{half}**. After every fault the same request is retried through a fresh \
         session and must converge on one ticket.\n",
        f.verdict(),
        f.faults_injected,
        f.inputs_tried
    );
    for (name, why) in &f.not_run {
        let _ = writeln!(out, "- **PENDING** {name}: {why}.");
    }
    if !f.not_run.is_empty() {
        out.push('\n');
    }
    let _ = writeln!(out, "| case | backend | verdict | rows lost | half states | detail |\n|---|---|---|---|---|---|");
    for c in &f.cases {
        let _ = writeln!(
            out,
            "| {} | {} | **{}** | {} | {} | {} |",
            c.name,
            c.backend,
            c.verdict,
            c.rows_lost,
            c.half_states,
            md(&c.detail)
        );
    }
    out.push('\n');
}

fn render_loom(out: &mut String, loom: &LoomReport) {
    let _ = writeln!(out, "## Model checking (loom)\n");
    if let Some(why) = &loom.unusable {
        let _ = writeln!(out, "**PENDING**: {why}.\n");
        return;
    }
    let _ = writeln!(
        out,
        "The real `create_ticket` code over the in-memory READ COMMITTED store, every interleaving \
         within the preemption bound, from `reports/loom.json` (`scripts/loom.sh` reruns it). \
         Verdict: **{}**.\n",
        loom.verdict()
    );
    let _ = writeln!(
        out,
        "| model | implementation | threads | preemption bound | interleavings | expected | result |\n|---|---|---|---|---|---|---|"
    );
    for m in &loom.raw {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | **{}** |",
            m["name"].as_str().unwrap_or("?"),
            m["implementation"].as_str().unwrap_or("?"),
            m["threads"],
            m["preemption_bound"],
            m["interleavings"],
            m["expected"].as_str().unwrap_or("?"),
            m["result"].as_str().unwrap_or("?"),
        );
    }
    out.push('\n');
    let findings: Vec<String> = loom
        .raw
        .iter()
        .filter_map(|m| {
            m["finding"].as_str().map(|f| {
                format!(
                    "- `{}` × {}: {}",
                    m["implementation"].as_str().unwrap_or("?"),
                    m["name"].as_str().unwrap_or("?"),
                    md(f)
                )
            })
        })
        .collect();
    if !findings.is_empty() {
        let _ = writeln!(
            out,
            "<details><summary>Failing interleavings found in the wrong implementations</summary>\n\n{}\n\n</details>\n",
            findings.join("\n")
        );
    }
}

fn render_kill_matrix(out: &mut String, k: &KillMatrix) {
    let _ = writeln!(
        out,
        "## Kill matrix: the harness against the wrong implementations\n"
    );
    let _ = writeln!(
        out,
        "Every gate runs against each wrong implementation (`src/variants.rs`: SPEC §6's five and \
         `on-conflict-ignores-loss`) and, as controls, against both real create protocols \
         (`protocol`, with a savepoint, and `on-conflict`). A variant must be **killed** on every \
         backend where a gate applies; a control must survive every gate. Verdict: **{}**.\n",
        k.verdict()
    );
    let columns: Vec<(&str, Backend)> = {
        let mut v = Vec::new();
        for c in &k.cells {
            if !v.contains(&(c.gate, c.backend)) {
                v.push((c.gate, c.backend));
            }
        }
        v
    };
    let mut header = "| implementation |".to_string();
    let mut rule = "|---|".to_string();
    for (gate, backend) in &columns {
        let _ = write!(header, " {gate} ({backend}) |");
        rule.push_str("---|");
    }
    let _ = writeln!(out, "{header}\n{rule}");
    for implementation in crate::killmatrix::implementations() {
        let mut row = format!("| {} |", implementation.name());
        for (gate, backend) in &columns {
            let cell = k.cells.iter().find(|c| {
                c.implementation == implementation && c.gate == *gate && c.backend == *backend
            });
            let text = match cell.map(|c| &c.outcome) {
                Some(GateOutcome::Killed(_)) => "**killed**",
                Some(GateOutcome::Survived) => "survived",
                Some(GateOutcome::NotApplicable(_)) => "n/a",
                Some(GateOutcome::Pending(_)) => "PENDING",
                None => "—",
            };
            let _ = write!(row, " {text} |");
        }
        let _ = writeln!(out, "{row}");
    }
    out.push('\n');
    for p in k.problems() {
        let _ = writeln!(out, "- **FAIL**: {p}");
    }
    let _ = writeln!(
        out,
        "<details><summary>What killed each variant (first failing check per gate)</summary>\n"
    );
    for c in &k.cells {
        let detail = match &c.outcome {
            GateOutcome::Killed(d) => format!("killed — {}", md(d)),
            GateOutcome::Pending(d) => format!("PENDING — {}", md(d)),
            GateOutcome::NotApplicable(d) => format!("n/a — {}", md(d)),
            GateOutcome::Survived => continue,
        };
        let _ = writeln!(
            out,
            "- `{}` × {} ({}): {detail}",
            c.implementation.name(),
            c.gate,
            c.backend
        );
    }
    let _ = writeln!(out, "\n</details>\n");
}

fn render_suites(out: &mut String, suites: &[SuiteResult]) {
    if suites.is_empty() {
        return;
    }
    let _ = writeln!(out, "## Property suites (proptest)\n");
    let _ = writeln!(
        out,
        "Generated inputs against the reference model (`src/model.rs`); replay a run with \
         `ticketflow verify --seed SEED` (seeds are listed under Environment) and the same \
         `PROPTEST_CASES`. Failures of the real protocol persist in `proptest-regressions/` and \
         are replayed first.\n"
    );
    let _ = writeln!(
        out,
        "| suite | backend | implementation | verdict | cases |\n|---|---|---|---|---|"
    );
    for s in suites {
        let _ = writeln!(
            out,
            "| {} | {} | {} | **{}** | {} |",
            s.suite,
            s.backend_name(),
            s.implementation.name(),
            s.verdict,
            s.cases,
        );
    }
    out.push('\n');
    for s in suites.iter().filter(|s| s.verdict == Verdict::Fail) {
        let _ = writeln!(
            out,
            "<details><summary>{} on {}: FAIL</summary>\n\n```text\n{}\n{}\n```\n</details>\n",
            s.suite,
            s.backend_name(),
            s.reason.as_deref().unwrap_or(""),
            s.counterexample.as_deref().unwrap_or("")
        );
    }
}

fn anchor(name: &str) -> String {
    name.chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '-' || c == '_' {
                Some(c.to_ascii_lowercase())
            } else if c == ' ' {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

fn render_run(out: &mut String, s: &Scenario, r: &ScenarioRun, ctx: &Context, drawn_above: bool) {
    let tickets = TicketLabels::for_run(r);
    let _ = writeln!(
        out,
        "<details><summary>{} ({}) — <b>{}</b></summary>\n",
        r.backend.name(),
        r.setting.label(),
        r.verdict
    );
    if let Some(reason) = &r.reason {
        let _ = writeln!(out, "Reason: {}\n", md(reason));
    }
    let server = match r.setting {
        RunSetting::Postgres { .. } if ctx.custom_pg_url => format!(" --pg-url '{}'", ctx.pg_url),
        _ => String::new(),
    };
    let protocol = match ctx.protocol {
        crate::protocol::Protocol::Savepoint => "",
        crate::protocol::Protocol::OnConflict => " --implementation on-conflict",
    };
    let _ = writeln!(
        out,
        "Reproduce: `ticketflow scenario run {} {}{server}{protocol}`\n",
        s.file.display(),
        r.setting.cli_flags()
    );
    match &r.evidence {
        Some(Evidence::Postgres {
            server_version,
            isolation,
            lock_mode,
            window,
            racers_as,
            lock_statement,
            waits,
            controller_pid,
            ..
        }) => {
            let _ = writeln!(
                out,
                "PostgreSQL {server_version}, isolation {isolation}, racers as {}, in a scratch \
                 database created and dropped for the run. The controller held `{lock_statement}` \
                 ({}: {window}); `pg_locks` showed {} of {} racers waiting before the release.\n",
                match racers_as {
                    RacerKind::Threads => "threads",
                    RacerKind::Processes => "separate processes",
                },
                lock_mode.name(),
                waits.len(),
                r.racer_count,
            );
            if !waits.is_empty() {
                let _ = writeln!(
                    out,
                    "| racer | wait event | lock mode requested | blocked by |\n|---|---|---|---|"
                );
                for w in waits {
                    let others: Vec<String> = w
                        .blocked_by
                        .iter()
                        .filter(|p| *p != controller_pid)
                        .map(|p| format!("pid {p}"))
                        .collect();
                    let by = match (w.blocked_by.contains(controller_pid), others.is_empty()) {
                        (true, true) => "the controller".to_string(),
                        (true, false) => format!("the controller, {}", others.join(", ")),
                        (false, _) => others.join(", "),
                    };
                    let _ = writeln!(
                        out,
                        "| {} | {}/{} | {} | {} |",
                        w.racer,
                        w.wait_event_type.as_deref().unwrap_or("-"),
                        w.wait_event.as_deref().unwrap_or("-"),
                        w.mode,
                        by
                    );
                }
                out.push('\n');
            }
            if !drawn_above {
                if let Some(d) = mermaid::sequence_diagram(r, &tickets) {
                    let _ = writeln!(out, "{d}");
                }
            }
        }
        Some(Evidence::Sqlite {
            observed_no_receipt,
            journal_mode,
            sqlite_version,
        }) => {
            let _ = writeln!(
                out,
                "SQLite {sqlite_version}, journal mode {journal_mode}; {observed_no_receipt} racer(s) saw no receipt at the barrier. Control flow only.\n"
            );
        }
        None => {}
    }
    if !r.racers.is_empty() {
        let _ = writeln!(
            out,
            "| racer | tenant / key | outcome | path | ticket | HTTP |\n|---|---|---|---|---|---|"
        );
        for rc in &r.racers {
            let (outcome, path, ticket, http) = match &rc.result {
                Ok(o) => (
                    o.kind.to_string(),
                    o.path_label(),
                    o.ticket_id
                        .map(|t| tickets.label(t))
                        .unwrap_or_else(|| "-".into()),
                    o.http_status.to_string(),
                ),
                Err(e) => (
                    format!("error: {}", md(e)),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                ),
            };
            let _ = writeln!(
                out,
                "| {} | {} / {} | {} | {} | {} | {} |",
                rc.name,
                md(&rc.tenant),
                md(&rc.key),
                outcome,
                path,
                ticket,
                http,
            );
        }
        out.push('\n');
    }
    if !r.rows.is_empty() {
        let rows: Vec<String> = r.rows.iter().map(|(t, c)| format!("{t}: {c}")).collect();
        let _ = writeln!(
            out,
            "Rows (tickets/receipts/created events) by direct SQL: {}.\n",
            rows.join(", ")
        );
    }
    if !r.checks.is_empty() {
        let _ = writeln!(out, "| check | result | detail |\n|---|---|---|");
        for c in &r.checks {
            let _ = writeln!(
                out,
                "| {} | {} | {} |",
                c.name,
                if c.passed { "ok" } else { "**FAILED**" },
                md(&c.detail)
            );
        }
        out.push('\n');
    }
    let _ = writeln!(out, "</details>\n");
}
