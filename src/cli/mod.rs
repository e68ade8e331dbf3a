//! The binary's own modules, not part of the library: the arguments and the summary lines
//! printed on stdout.

/// `println!` for the command's output on stdout: when the reader is gone (a closed pipe) the
/// process ends as SIGPIPE would, cleaning up first (`ticketflow_harness::cleanup::say`),
/// instead of panicking or running on with nobody reading.
macro_rules! outln {
    () => {
        ticketflow_harness::cleanup::say("")
    };
    ($($arg:tt)*) => {
        ticketflow_harness::cleanup::say(&format!($($arg)*))
    };
}

/// `eprintln!` that never panics: a closed stderr loses the line, the run goes on.
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

pub mod args;
pub mod check;
pub mod commands;
pub mod print;

/// Where the services a run starts keep their stdout and stderr when a report is written:
/// `service-logs/` in the report's folder, a folder per scenario in it
/// (`ticketflow_harness::blackbox::RunOptions::service_logs`).
pub fn service_logs_beside(report: &std::path::Path) -> std::path::PathBuf {
    report
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or_else(|| std::path::Path::new("."))
        .join("service-logs")
}
