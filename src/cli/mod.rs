//! The binary's own modules, not part of the library: the arguments and the summary lines
//! printed on stdout.

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
