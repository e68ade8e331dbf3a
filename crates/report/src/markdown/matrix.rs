//! The verdict matrices: PostgreSQL by isolation level, SQLite by journal and transaction mode.

use std::fmt::Write as _;

use super::{scenario_file, DETAILS_DIR};
use ticketflow_core::store::postgres::IsolationLevel;
use ticketflow_core::store::Backend;
use ticketflow_harness::scenario::format::{RacerKind, Scenario};
use ticketflow_harness::scenario::{RunSetting, ScenarioRun};

fn cell(runs: &[ScenarioRun], scenario: &str, setting: RunSetting) -> String {
    runs.iter()
        .find(|r| r.scenario == scenario && r.setting == setting)
        .map(|r| format!("**{}**", r.verdict))
        .unwrap_or_else(|| "—".into())
}

pub(super) fn render_pg_matrix(out: &mut String, scenarios: &[Scenario], runs: &[ScenarioRun]) {
    let _ = writeln!(out, "## Verdicts: PostgreSQL, by isolation level\n");
    let _ = writeln!(
        out,
        "| scenario | racers | barrier lock (where racers are held) | READ COMMITTED | REPEATABLE READ | SERIALIZABLE |\n|---|---|---|---|---|---|"
    );
    for s in scenarios
        .iter()
        .filter(|s| s.backends.contains(&Backend::Postgres))
    {
        let held = match s.lease {
            Some(l) => format!(
                "Redis lease, {}: the runner holds the holder after its receipt lookup (no lock)",
                l.event.name()
            ),
            None => format!("{}: {}", s.barrier.lock.name(), s.barrier.lock.window()),
        };
        let mut row = format!(
            "| [{}]({DETAILS_DIR}/{}) | {} {} | {held} |",
            s.name,
            scenario_file(&s.name),
            s.racers.len(),
            match s.racers_as {
                RacerKind::Threads => "threads",
                RacerKind::Processes => "processes",
            },
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

pub(super) fn render_sqlite_matrix(out: &mut String, scenarios: &[Scenario], runs: &[ScenarioRun]) {
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
        // The scenario's racers, checks and evidence are in its detail file.
        let mut row = format!("| [{}]({DETAILS_DIR}/{}) |", s.name, scenario_file(&s.name));
        for setting in &sqlite {
            let _ = write!(row, " {} |", cell(runs, &s.name, *setting));
        }
        let _ = writeln!(out, "{row}");
    }
    out.push('\n');
}
