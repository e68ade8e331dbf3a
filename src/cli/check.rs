//! `ticketflow check FILE`: loads the check file, runs the histories, prints the outcome (or
//! one JSON object) and writes the report when asked. Exit 0 PASS, 1 FAIL, 2 a bad file or a
//! target that cannot be set up as written, 3 PENDING.

use std::io::Write as _;
use std::path::Path;

use super::args::CheckArgs;
use super::commands::{failure, pg_url, sweep_orphans, usage, CliResult, Failure};
use ticketflow::exit::Exit;
use ticketflow_harness::blackbox::run::RunOptions;
use ticketflow_harness::blackbox::service::TargetError;
use ticketflow_harness::check::file::CheckFile;
use ticketflow_harness::check::run::{check as run_check, CheckOptions, HistoryLine};
use ticketflow_harness::outputs::OutputDir;
use ticketflow_harness::verdict::Verdict;

/// `ticketflow check`.
pub fn check(args: CheckArgs) -> CliResult {
    let file = CheckFile::load(&args.file).map_err(usage)?;
    let pg = pg_url(args.pg_url.as_deref())?;
    let mut outputs = match &args.report {
        Some(report) => Some(open_report(report)?),
        None => None,
    };
    sweep_orphans(&pg.server);
    let mut run = RunOptions::new(pg.server.clone());
    run.on_wait = Some(|line| errln!("… {}", ticketflow_harness::contain::terminal(line)));
    run.service_logs = args.report.as_deref().map(super::service_logs_beside);
    let opts = CheckOptions {
        run,
        seed: args.seed,
        histories: args.histories.map(|n| n as usize),
        budget_s: args.budget,
        out: args.out.clone(),
        shrink_runs: args.shrink_runs,
        replays: args.replays,
        on_history: Some(if args.json { json_history } else { progress }),
    };
    let outcome = match run_check(&file, &opts) {
        Ok(o) => o,
        Err(e @ (TargetError::Unreachable { .. } | TargetError::Capacity(_))) => {
            outln!("PENDING check {}: {e}", args.file.display());
            return Ok(Exit::Pending.byte());
        }
        Err(e @ (TargetError::Setup(_) | TargetError::Url(_))) => return Err(usage(e)),
        Err(e) => return Err(failure(Exit::Fail.byte(), e)),
    };
    if args.json {
        let text = serde_json::to_string(&outcome).expect("outcome types serialize");
        outln!("{}", ticketflow_harness::contain::json(&text));
    } else {
        let mut out = std::io::stdout().lock();
        for line in ticketflow_report::check::summary_lines(&outcome) {
            let _ = writeln!(out, "{}", ticketflow_harness::contain::terminal(&line));
        }
    }
    if let (Some(report), Some(dir)) = (&args.report, outputs.take()) {
        let written = write_report(report, dir, &outcome)?;
        errln!("report written to {}", written.join(", "));
    }
    Ok(match outcome.verdict {
        Verdict::Pass => Exit::Pass.byte(),
        Verdict::Fail => Exit::Fail.byte(),
        Verdict::Pending => Exit::Pending.byte(),
    })
}

/// A history's line of progress on stderr.
fn progress(h: &HistoryLine) {
    errln!(
        "… history {}: {} ({} steps){}",
        h.number,
        h.verdict,
        h.steps.len(),
        ticketflow_harness::contain::terminal(
            &h.reason
                .as_ref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        )
    );
}

/// A history as one JSON line on stdout (`--json`; the outcome follows as the last line).
fn json_history(h: &HistoryLine) {
    let text = serde_json::to_string(h).expect("history lines serialize");
    outln!("{}", ticketflow_harness::contain::json(&text));
}

/// The report's folder, refused before anything runs when it is not a `*.md` path or would
/// replace a file ticketflow did not write there.
fn open_report(report: &Path) -> Result<OutputDir, Failure> {
    if report.extension().and_then(|e| e.to_str()) != Some("md") {
        return Err(usage(format!(
            "--report {}: give a REPORT.md path (*.md); report.json and report.junit.xml go beside it",
            report.display()
        )));
    }
    let dir = match report.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    OutputDir::open(dir, "", false, false).map_err(usage)
}

fn write_report(
    report: &Path,
    mut dir: OutputDir,
    outcome: &ticketflow_harness::check::run::CheckOutcome,
) -> Result<Vec<String>, Failure> {
    let name = report
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("REPORT.md");
    let json = serde_json::to_string_pretty(outcome).expect("outcome types serialize");
    let fail = |e: ticketflow_harness::outputs::OutputError| failure(Exit::Fail.byte(), e);
    let written = [
        dir.write(
            name,
            ticketflow_harness::contain::mask(&ticketflow_report::check::markdown(outcome))
                .as_bytes(),
        )
        .map_err(fail)?,
        dir.write(
            "report.json",
            ticketflow_harness::contain::mask(&json).as_bytes(),
        )
        .map_err(fail)?,
        dir.write(
            "report.junit.xml",
            ticketflow_report::check::junit(outcome).as_bytes(),
        )
        .map_err(fail)?,
    ];
    dir.finish().map_err(fail)?;
    Ok(written.iter().map(|p| p.display().to_string()).collect())
}
