//! TicketFlow Verify: idempotent ticket creation and the harness that proves it.
//!
//! A client that retries "create ticket" with the same Idempotency-Key must get exactly one
//! ticket, one receipt and one `ticket.created` outbox event, and a different body under the
//! same key must be a conflict (HTTP 409).
//!
//! This package is the top of the workspace: the `ticketflow` command line, [`verify`] (run
//! everything, decide the exit code) and [`exit`] (every exit code of the process). The layers
//! below are crates of their own, re-exported here under their module names so one path
//! (`ticketflow::store::…`) serves tests and tools:
//!
//! - `ticketflow-core`: [`fingerprint`], [`canonical`], [`domain`], [`error`], [`backend`],
//!   [`protocol`], [`model`], [`store`], [`lease`], [`variants`], [`wire`], [`deadline`],
//!   [`flags`];
//! - `ticketflow-serve`: [`serve`], `ticketflow serve`, the protocol over HTTP;
//! - `ticketflow-harness`: [`barrier`], [`scenario`], [`blackbox`], [`load`], [`interpose`],
//!   [`props`], [`faults`], [`killmatrix`], [`soak`], [`mod@bench`], [`verdict`], [`jobs`],
//!   [`child`], [`cleanup`], [`argv`], [`contain`], [`outputs`] (and `scratch`, reached as
//!   `ticketflow_harness::scratch`);
//! - `ticketflow-report`: [`report`], REPORT.md, report.json and JUnit.

pub mod exit;
pub mod logging;
pub mod verify;

pub use ticketflow_core::{
    backend, canonical, deadline, domain, error, fingerprint, flags, lease, model, protocol, store,
    variants, wire,
};
pub use ticketflow_harness::{
    argv, barrier, bench, blackbox, child, cleanup, contain, faults, interpose, jobs, killmatrix,
    load, outputs, props, scenario, soak, verdict,
};
pub use ticketflow_report as report;
pub use ticketflow_serve as serve;

pub use ticketflow_core::{
    create_ticket, get_ticket, update_ticket, CreateOptions, CreateReport, DbErrorKind,
    DecisionPath, Error, Fingerprint, Outcome, OutcomeKind, Protocol, Result, RetryPolicy,
    StoreError, Ticket, TicketPatch, TicketRequest, ValidationError,
};
