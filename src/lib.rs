//! TicketFlow Verify: idempotent ticket creation and the harness that proves it.
//!
//! A client that retries "create ticket" with the same Idempotency-Key must get exactly one
//! ticket, one receipt and one `ticket.created` outbox event, and a different body under the
//! same key must be a conflict (HTTP 409). This crate holds:
//!
//! - [`fingerprint`]: the canonical request fingerprint (docs/PROTOCOL.md §2);
//! - [`domain`]: tickets, receipts, outbox events, outcomes, validation;
//! - [`exit`]: every exit code of the `ticketflow` process;
//! - [`protocol`]: create / get / update written once over the [`store::Store`] trait;
//! - [`model`]: the pure reference model; [`props`]: property suites against it;
//! - [`store`]: the SQLite and PostgreSQL implementations and their migrations, and the
//!   in-memory store the loom models run on;
//! - [`barrier`]: the in-process barrier used by the SQLite race runner;
//! - [`scenario`]: race scenario files and their runner (PostgreSQL lock barrier with
//!   `pg_locks` evidence, SQLite in-process barrier);
//! - [`variants`]: the wrong implementations of docs/PROTOCOL.md §8 (the five numbered ones,
//!   those of the other protocols and of the lease, and the served-only ones), for negative
//!   controls;
//! - [`killmatrix`]: every gate against every wrong implementation;
//! - [`faults`]: faults and bad input, counted for the report;
//! - [`serve`]: `ticketflow serve`, the protocol over HTTP (axum), for black-box scenarios;
//! - [`blackbox`]: black-box scenarios (a `[target]` table): racers are HTTP clients of any
//!   service, judged by its answers and by counts on its own database or Redis;
//! - [`soak`]: `ticketflow soak`, two `serve` processes under mixed traffic and scheduled
//!   faults, checked by SQL afterwards;
//! - [`report`]: renders REPORT.md;
//! - [`outputs`]: the folders the tool writes into: a manifest of what it wrote, removal of
//!   listed files only, nothing through a symlink, derived file names confined;
//! - [`verify`]: the `verify` command: run everything, decide the exit code;
//! - [`jobs`]: the bounded pool `verify` runs independent runs in, in input order;
//! - [`mod@bench`]: the `bench` command: the protocols' cost against bare SQL (pgbench, bare
//!   driver loops);
//! - [`interpose`]: the loopback proxy in front of a target's PostgreSQL or Redis that holds,
//!   orders and releases the service's own commands, and the schedules explored through it;
//! - [`cleanup`]: what an interrupt must undo (scratch databases, child services) and the
//!   Ctrl-C / SIGTERM handler that undoes it;
//! - [`contain`]: what every writer passes text it does not own through: `${ENV}` secrets
//!   masked, control characters escaped, a target's text as inert Markdown code;
//! - [`child`]: every child process the tool starts, started so that it dies with the tool
//!   (SIGKILL included);
//! - [`ledger`]: the scratch ledger, which owner each PostgreSQL scratch database has, and the
//!   sweep (`ticketflow clean`, the start of a run) that drops those of dead owners.

#![warn(missing_docs)]

pub mod backend;
pub mod barrier;
pub mod bench;
pub mod blackbox;
pub mod canonical;
pub mod child;
pub mod cleanup;
pub mod contain;
pub mod deadline;
pub mod domain;
pub mod error;
pub mod exit;
pub mod faults;
pub mod fingerprint;
pub mod interpose;
pub mod jobs;
pub mod killmatrix;
pub mod lease;
pub mod ledger;
pub mod logging;
pub mod model;
pub mod outputs;
pub mod props;
pub mod protocol;
pub mod report;
pub mod scenario;
pub mod serve;
pub mod soak;
pub mod store;
/// std ↔ loom synchronization types (`cfg(ticketflow_loom)`), for the in-memory store.
mod sync;
pub mod variants;
pub mod verify;
pub mod wire;

pub use domain::{
    CreateReport, DecisionPath, Outcome, OutcomeKind, Ticket, TicketPatch, TicketRequest,
};
pub use error::{DbErrorKind, Error, Result, StoreError, ValidationError};
pub use fingerprint::Fingerprint;
pub use protocol::{
    create_ticket, get_ticket, update_ticket, CreateOptions, Protocol, RetryPolicy,
};
