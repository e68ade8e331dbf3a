//! Logs never contain a request body, checked in-process with a capturing subscriber; the
//! negative control shows the same capture does find the body without the client cap.

use std::io::Write;
use std::sync::{Arc, Mutex};

use tracing_subscriber::EnvFilter;

use crate::support::{b0, TestDb};

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Runs a PostgreSQL create with a marked body under `filter` and returns what was logged.
fn logged_during_create(db: &TestDb, filter: EnvFilter, key: &str) -> String {
    // The PostgreSQL client logs through the `log` crate; forward it to tracing (once).
    let _ = tracing_log::LogTracer::init();
    let capture = Capture::default();
    let writer = capture.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(move || writer.clone())
        .finish();
    let mut request = b0();
    request.body = "BODY-MARKER-3c9d secret".into();
    tracing::subscriber::with_default(subscriber, || {
        let mut s = db.open();
        ticketflow::create_ticket(s.as_mut(), "A", key, &request).unwrap();
    });
    let bytes = capture.0.lock().unwrap().clone();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[test]
fn trace_logs_of_a_create_never_contain_the_body_and_the_check_can_fail() {
    let Some(db) = TestDb::postgres("logs") else {
        return;
    };
    let capped = logged_during_create(&db, ticketflow::logging::filter(Some("trace")), "key-1");
    assert!(
        capped.contains("ticketflow::protocol"),
        "expected our own trace events:\n{capped}"
    );
    assert!(
        !capped.contains("BODY-MARKER"),
        "body in capped logs:\n{capped}"
    );
    // Negative control: the same capture without the cap sees the client log the body.
    let uncapped = logged_during_create(&db, EnvFilter::new("trace"), "key-2");
    assert!(
        uncapped.contains("BODY-MARKER"),
        "the check cannot fail:\n{uncapped}"
    );
}
