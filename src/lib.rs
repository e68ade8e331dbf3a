//! TicketFlow Verify: idempotent ticket creation and the harness that proves it.
//!
//! A client that retries "create ticket" with the same Idempotency-Key must get exactly one
//! ticket, one receipt and one `ticket.created` outbox event, and a different body under the
//! same key must be a conflict (HTTP 409).
//!
//! This package is the top of the workspace: the `ticketflow` command line, [`verify`] (run
//! everything, decide the exit code), [`exit`] (every exit code of the process) and [`logging`].
//! The layers below are crates of their own, and code above them names each item by the crate
//! that owns it:
//!
//! - `ticketflow_core`: the fingerprint, domain, protocol, model, stores, lease, wrong
//!   implementations and the HTTP contract (what a service author embeds);
//! - `ticketflow_serve`: `ticketflow serve`, the protocol over HTTP;
//! - `ticketflow_harness`: barriers, scenarios, black-box runs, the interposer, property suites,
//!   faults, the kill matrix, soak, bench, scratch databases and the interrupt cleanup;
//! - `ticketflow_report`: REPORT.md, report.json and JUnit.

pub mod exit;
pub mod logging;
pub mod verify;
