//! REPORT.md: a summary, FAIL then PENDING first, the limits, the verdict matrices, then one section per
//! part (suites, loom, faults, soak, kill matrix, Redis lease, paths, scenarios, black-box runs) and the
//! Environment last. Each large section has its own file.
//!
//! Diff-friendly: verdict tables hold no timings, seeds, pids, scratch database names or
//! ticket ids (tickets are labelled `T1`, `T2` per run), so two runs with the same results give
//! the same tables. Timings and seeds go to the Environment section at the end.

mod environment;
mod faults;
mod kill_matrix;
mod lease;
mod loom;
mod matrix;
mod paths;
mod runs;
mod soak;
mod suites;
pub mod targets;

use std::fmt::Write as _;

use super::model::{items, Item, ReportInput, Scope, SELF_CHECKS};
use ticketflow_harness::blackbox::isolation::ExportedSpec;

use ticketflow_harness::verdict::Verdict;

/// Escapes text for a Markdown table cell.
pub(super) fn md(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

/// The GitHub heading anchor of `name` (lowercase; spaces become `-`; other punctuation but
/// `-` and `_` dropped).
pub(super) fn anchor(name: &str) -> String {
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

/// What the evidence cannot prove, one bullet each; `true` marks a bullet about verify's own
/// self-checks ([`crate::SELF_CHECKS`]), left out of a report of given files.
const LIMITS: [(&str, bool); 6] = [
    (
        "**SQLite runs prove control flow only** (docs/PROTOCOL.md §7.4): racers on separate \
connections to one file meet at an in-process barrier and SQLite's single writer serializes the \
rest. They say nothing about PostgreSQL isolation levels, row or relation locks, or what another \
session can see.",
        false,
    ),
    (
        "**PostgreSQL runs** prove the races that were run, at the isolation levels shown, on this server \
version, with the barrier lock mode shown: other windows (say, a racer paused between its ticket \
and outbox inserts) are covered only where a scenario, fault case or loom model names them.",
        false,
    ),
    (
        "**Property suites** sample generated histories (the case counts shown); they do not enumerate \
every history. **Loom models** enumerate interleavings of 2–3 threads within a preemption bound \
over an in-memory model of READ COMMITTED, not PostgreSQL itself.",
        true,
    ),
    (
        "**Black-box runs** judge a service only through its answers and the count queries the \
scenario gives: a table-lock or advisory barrier proves the requests were waiting inside its \
database at the release (counted, not attributed: the runner cannot tell which session serves \
which client); an HTTP-level barrier proves only that the requests left together, so its PASS \
needs repeats. They say nothing about what the service writes that no count query reads.",
        false,
    ),
    (
        "**Nothing here proves the network path** between a client and a service (timeouts, retries by \
proxies), clock skew between hosts, or replication lag to a standby that serves reads.",
        false,
    ),
    (
        "Anything PENDING above did not run and proves nothing.",
        false,
    ),
];

/// How the evidence was gathered, one bullet each; `true` marks a self-check's bullet, as in
/// [`LIMITS`].
const PROVES: [(&str, bool); 6] = [
    (
        "**PostgreSQL**: every racer has its own connection and backend pid (threads, or `ticketflow \
worker` processes); a controller session takes the barrier lock and the runner sees every racer \
waiting on it in `pg_locks` (blocked by the controller per `pg_blocking_pids`) before it releases \
the lock; rows are counted by direct SQL in a scratch database created and dropped for the run. \
The lock mode decides the race window: `access-exclusive` holds racers at the receipt lookup, \
`exclusive` at the receipt INSERT after the ticket and outbox inserts (every loser meets the \
unique violation), `advisory` right after the lookup. Each scenario shows its race as a sequence \
diagram drawn from the recorded statements.",
        false,
    ),
    (
        "Under REPEATABLE READ and SERIALIZABLE a loser's snapshot may not see the winner (23505 with no \
visible winner, or 40001): the repository retries the whole transaction, bounded; retries are \
counted in the paths table.",
        false,
    ),
    (
        "Property suites compare generated histories with a reference model, sequentially (invariants \
read back by SQL) and concurrently (linearizability), on both backends.",
        true,
    ),
    (
        "Loom models come from `reports/loom.json` (written by `scripts/loom.sh`) and are PENDING when it \
is missing or stale.",
        true,
    ),
    (
        "Faults: crashes inside the transaction, a client dying after COMMIT, a terminated backend, a \
lock timeout and (only with `--restart-postgres`) a server restart, each followed by a retry that \
must converge. A statement_timeout is not injected separately: it cancels the same way as the lock \
timeout (SQLSTATE class 57/55) and is classified as a timeout.",
        true,
    ),
    (
        "The kill matrix runs every gate against the wrong implementations (docs/PROTOCOL.md §8's five, one \
for each other create protocol, two wrong uses of the lease, and the served ones the interposer and \
`check` are for) and the three real protocols as controls: each gate is shown to catch the fault it is for.",
        true,
    ),
];

/// The folder, relative to REPORT.md, of the detail files [`render_details`] writes.
pub const DETAILS_DIR: &str = "reports/details";
/// The detail file of the paths every racer took.
pub const PATHS_FILE: &str = "paths.md";
/// The detail file of the black-box scenarios.
pub const BLACK_BOX_FILE: &str = "black-box.md";
/// The detail file of what killed each variant.
pub const KILL_MATRIX_FILE: &str = "kill-matrix.md";
/// The detail file of each run's timings.
pub const TIMINGS_FILE: &str = "timings.md";

/// The detail file of scenario `name`: `scenario-<name>.md`, the name reduced to ASCII
/// letters, digits, `-` and `_`.
pub fn scenario_file(name: &str) -> String {
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("scenario-{safe}.md")
}

/// The detail files REPORT.md links to, as (file name in [`DETAILS_DIR`], Markdown): one per
/// scenario (its description, race diagram and every run's evidence: reproduce command, lock
/// waits, racers, rows, checks), the paths the racers took, what killed each variant, and
/// the black-box scenarios with every attempt. REPORT.md keeps the verdicts and one
/// evidence line per run, so it is read in a minute.
pub fn render_details(input: &ReportInput<'_>) -> Vec<(String, String)> {
    let mut files = Vec::new();
    for s in input.scenarios {
        let mut text = String::new();
        runs::render_scenario(&mut text, s, input.runs, input.ctx);
        files.push((scenario_file(&s.name), text));
    }
    let mut text = String::new();
    paths::render_paths(&mut text, input.runs);
    files.push((PATHS_FILE.to_string(), text));
    let mut text = String::new();
    environment::render_run_timings(&mut text, input.runs);
    if let Some(k) = input.kill {
        environment::render_kill_timings(&mut text, k);
    }
    files.push((TIMINGS_FILE.to_string(), text));
    if let Some(k) = input.kill {
        let mut text = String::new();
        kill_matrix::render_kill_details(&mut text, k);
        files.push((KILL_MATRIX_FILE.to_string(), text));
    }
    if !input.targets.is_empty() {
        let mut text = String::new();
        targets::render_details(&mut text, input.targets, input.target_descriptions);
        files.push((BLACK_BOX_FILE.to_string(), text));
    }
    // As REPORT.md: secrets masked, control characters escaped, in every file.
    files
        .into_iter()
        .map(|(name, text)| (name, ticketflow_harness::contain::document(&text)))
        .collect()
}

/// The bullets of `bullets` as Markdown list items, the self-checks' ones only when
/// `self_checks`.
fn bullets(bullets: &[(&str, bool)], self_checks: bool) -> String {
    bullets
        .iter()
        .filter(|(_, own)| self_checks || !own)
        .map(|(text, _)| format!("- {text}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Renders REPORT.md of a `verify` run ([`Scope::Verify`]).
pub fn render(input: &ReportInput<'_>) -> String {
    render_scoped(input, &Scope::Verify)
}

/// Renders REPORT.md of a report covering `scope`. With [`Scope::Files`] the report says it
/// covers only those files and leaves out every section of verify's self-checks
/// ([`SELF_CHECKS`]: suites, loom, faults, soak, kill matrix), which did not run and are
/// neither PASS nor PENDING there; each black-box run's `{run}` id is listed.
pub fn render_scoped(input: &ReportInput<'_>, scope: &Scope) -> String {
    let all = items(input);
    let verify = *scope == Scope::Verify;
    let mut out = String::new();
    match scope {
        Scope::Verify => render_summary(&mut out, input, &all),
        Scope::Files(files) => render_files_summary(&mut out, input, &all, files),
    }
    render_failures(&mut out, &all);
    render_pending(&mut out, input, &all, verify);
    let _ = writeln!(
        &mut out,
        "## What this cannot prove\n\n{}\n",
        bullets(&LIMITS, verify)
    );
    let _ = writeln!(
        &mut out,
        "## How the evidence was gathered\n\n{}\n",
        bullets(&PROVES, verify)
    );
    render_specs(&mut out, input.specs);

    // A report of given files shows a backend's matrix only when one of its runs is there.
    let has =
        |b: ticketflow_core::store::Backend| verify || input.runs.iter().any(|r| r.backend == b);
    if has(ticketflow_core::store::Backend::Postgres) {
        matrix::render_pg_matrix(&mut out, input.scenarios, input.runs);
    }
    targets::render_verdicts(&mut out, input.targets);
    if !verify {
        targets::render_run_ids(&mut out, input.targets);
    }
    if has(ticketflow_core::store::Backend::Sqlite) {
        matrix::render_sqlite_matrix(&mut out, input.scenarios, input.runs);
    }
    if verify {
        suites::render_suites(&mut out, input.suites);
        loom::render_loom(&mut out, input.loom);
        if let Some(f) = input.faults {
            faults::render_faults(&mut out, f);
        }
        if let Some(s) = input.soak {
            soak::render_soak(&mut out, s);
        }
        if let Some(k) = input.kill {
            kill_matrix::render_kill_matrix(&mut out, k);
        }
    }
    lease::render_lease(&mut out, input.scenarios, input.runs, input.kill);
    runs::render_run_index(&mut out, input.scenarios, input.runs);
    if !input.targets.is_empty() {
        let _ = writeln!(
            out,
            "Black-box scenarios in detail (checks, every attempt of every client): [{BLACK_BOX_FILE}]({DETAILS_DIR}/{BLACK_BOX_FILE}).\n"
        );
    }
    environment::render_environment(
        &mut out,
        input.scenarios,
        input.runs,
        input.suites,
        input.loom,
        input.ctx,
    );
    if let Some(s) = input.soak {
        soak::render_soak_figures(&mut out, s);
    }
    // Secrets masked and control characters escaped in the whole document, whatever part
    // quoted them.
    ticketflow_harness::contain::document(&out)
}

/// The title, the counts over `all` and the verdicts of loom, faults and the kill matrix.
fn render_summary(out: &mut String, input: &ReportInput<'_>, all: &[Item]) {
    let ReportInput {
        scenarios,
        runs,
        targets,
        suites,
        kill,
        loom,
        faults,
        soak,
        ctx,
        ..
    } = *input;
    let totals = super::model::Totals::of(input);
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
        "**{totals}** over {} items: {} scenario runs ({} \
         scenarios), {} black-box scenarios, {} property suites, {} loom models, {}, {} soak, {} kill-matrix verdicts{}.\n",
        all.len() + totals.not_selected,
        runs.len(),
        scenarios.len(),
        targets.len(),
        suites.len(),
        kinds("loom"),
        faults.map_or_else(
            || format!("{} fault cases", kinds("fault")),
            |f| f.tally().to_string()
        ),
        kinds("soak"),
        kinds("kill-matrix"),
        match totals.not_selected {
            0 => String::new(),
            n => format!(", {n} parts not selected"),
        },
    );
    let _ = writeln!(
        out,
        "Loom models: **{}** ({}). Faults and bad input: **{}**. Soak: **{}**. Kill matrix: **{}**.\n",
        loom.verdict(),
        match (&loom.unusable, &loom.generated_at) {
            (None, Some(at)) => format!(
                "not run by `verify`: read from `reports/loom.json`, written by `scripts/loom.sh` at {at} for these sources"
            ),
            _ => "not run by `verify`: `scripts/loom.sh` writes `reports/loom.json`, unusable here (see below)".into(),
        },
        faults
            .map(|f| f.verdict().to_string())
            .unwrap_or_else(|| "PENDING (not selected)".into()),
        soak.map(|s| s.verdict.to_string())
            .unwrap_or_else(|| "PENDING (not selected)".into()),
        kill.map(|k| k.verdict().to_string())
            .unwrap_or_else(|| "PENDING (not run)".into())
    );
    if !ctx.filters.is_empty() {
        let filter = ticketflow_core::flags::FILTER;
        let _ = writeln!(
            out,
            "**Partial run**: `{filter} {}` selected a subset; what it left out is listed below \
             and proves nothing.\n",
            ctx.filters.join(&format!(" {filter} "))
        );
    }
    let others: Vec<&String> = ctx
        .narrowed_by
        .iter()
        .filter(|o| **o != ticketflow_core::flags::FILTER.arg())
        .collect();
    if !others.is_empty() {
        let _ = writeln!(
            out,
            "**Partial run**: narrowed by {}: it checked less than a full run, or with other \
             settings than the shipped ones. A partial report never replaces the full one \
             (`ticketflow-report/partial/`; `--update-report` refuses it).\n",
            others
                .iter()
                .map(|o| format!("`{o}`"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
}

/// The title and counts of a report that covers only `files` (`scenario run --report`): what
/// it covers, that verify's self-checks are not part of it, and the totals over `all`.
fn render_files_summary(out: &mut String, input: &ReportInput<'_>, all: &[Item], files: &[String]) {
    let totals = super::model::Totals::of(input);
    let _ = writeln!(out, "# TicketFlow Verify report: scenario files\n");
    let _ = writeln!(
        out,
        "Generated by `ticketflow scenario run --report`; do not edit by hand. Re-run it to \
         refresh. Machine-readable: `report.json` (schema `schemas/report.schema.json`) and \
         `report.junit.xml` beside this file.\n"
    );
    let _ = writeln!(
        out,
        "**This report covers only the files given**: {}. The tool's own self-checks ({}) are \
         not part of it: they did not run here and it claims nothing about them (`ticketflow \
         verify` runs them).\n",
        files
            .iter()
            .map(|f| format!("`{}`", md(f)))
            .collect::<Vec<_>>()
            .join(", "),
        SELF_CHECKS.join(", ")
    );
    let _ = writeln!(
        out,
        "**{totals}** over {} items: {} scenario runs ({} scenarios), {} black-box scenarios.\n",
        all.len(),
        input.runs.len(),
        input.scenarios.len(),
        input.targets.len(),
    );
}

/// "FAIL": every failed item with its reason, at the top, so that a FAIL is never only a cell
/// in a table further down.
fn render_failures(out: &mut String, all: &[Item]) {
    let failed: Vec<&Item> = all.iter().filter(|i| i.verdict == Verdict::Fail).collect();
    if failed.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "## FAIL
"
    );
    for i in failed {
        let _ = writeln!(
            out,
            "- {} `{}`: {}",
            i.kind,
            i.name,
            md(i.reason.as_deref().unwrap_or("no reason recorded").trim())
        );
    }
    out.push('\n');
}

/// "PENDING: did not run": every PENDING item, a skipped kill matrix (only in a `verify`
/// report, `verify`), what `--filter` left out.
fn render_pending(out: &mut String, input: &ReportInput<'_>, all: &[Item], verify: bool) {
    let ReportInput {
        kill, not_selected, ..
    } = *input;
    // A report of given files runs no kill matrix: its absence is not a skip.
    let kill_skipped = verify && kill.is_none();
    let pending_items: Vec<&Item> = all
        .iter()
        .filter(|i| i.verdict == Verdict::Pending)
        .collect();
    if !pending_items.is_empty() || kill_skipped || !not_selected.is_empty() {
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
        if kill_skipped && !not_selected.iter().any(|n| n == "kill-matrix") {
            let _ = writeln!(
                out,
                "- kill matrix: skipped with {}",
                ticketflow_core::flags::NO_KILL_MATRIX
            );
        }
        if !not_selected.is_empty() {
            let _ = writeln!(
                out,
                "- not selected by {}: {}",
                ticketflow_core::flags::FILTER,
                not_selected.join(", ")
            );
        }
        out.push('\n');
    }
}

/// The isolation-tester specs exported for failing PostgreSQL races, when there are any.
fn render_specs(out: &mut String, specs: &[ExportedSpec]) {
    if !specs.is_empty() {
        let _ = writeln!(out, "## Failing PostgreSQL races, exported\n");
        let _ = writeln!(
            out,
            "Each failing PostgreSQL run was exported as a PostgreSQL isolation-tester spec that \
             replays its recorded interleaving: `isolationtester \"dbname=EMPTY_DB\" < FILE`. \
             A failing schedule of a black-box scenario (setting `schedule ID`) replays the \
             statements its service sent, without the service's schema: run it against a copy of \
             the service's database.\n"
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
}
