//! Logs never contain a request body. The capture runs in a child process (this test binary
//! re-run on this one test) with a global subscriber, so no other test's tracing state can
//! hide events; the negative control shows the same capture does find the body without the
//! PostgreSQL client cap.

use std::process::Command;

use crate::support::{b0, TestDb};

const CHILD: &str = "TICKETFLOW_LOG_TEST_CHILD";
const MARKER: &str = "BODY-MARKER-3c9d secret";

/// In the child: install a global subscriber writing to stderr with the requested filter,
/// then run one PostgreSQL create with a marked body.
fn child(mode: &str) {
    let filter = match mode {
        "capped" => ticketflow::logging::filter(Some("trace")),
        _ => tracing_subscriber::EnvFilter::new("trace"),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let Some(db) = TestDb::postgres("logs") else {
        return;
    };
    let mut request = b0();
    request.body = MARKER.into();
    let mut s = db.open();
    ticketflow_core::create_ticket(
        s.as_mut(),
        "A",
        "key-1",
        &request,
        &ticketflow_core::CreateOptions::default(),
    )
    .unwrap();
}

/// Runs this test in a child process in `mode` and returns its stderr.
fn logged(mode: &str) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "logs::trace_logs_of_a_create_never_contain_the_body_and_the_check_can_fail",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, mode)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "child failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn trace_logs_of_a_create_never_contain_the_body_and_the_check_can_fail() {
    if let Ok(mode) = std::env::var(CHILD) {
        return child(&mode);
    }
    if crate::support::pg_url().is_none() {
        return;
    }
    let capped = logged("capped");
    assert!(
        capped.contains("ticketflow_core::protocol"),
        "expected our own trace events:\n{capped}"
    );
    assert!(
        !capped.contains("BODY-MARKER"),
        "body in capped logs:\n{capped}"
    );
    // Negative control: the same capture without the cap sees the client log the body.
    let uncapped = logged("uncapped");
    assert!(
        uncapped.contains("BODY-MARKER"),
        "the check cannot fail:\n{uncapped}"
    );
}
