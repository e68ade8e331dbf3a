//! TicketFlow Verify's core: what an idempotent create is, and the stores it runs on.
//!
//! A client that retries "create ticket" with the same Idempotency-Key must get exactly one
//! ticket, one receipt and one `ticket.created` outbox event, and a different body under the
//! same key must be a conflict (HTTP 409). This crate holds the rules and nothing that runs
//! or judges races (that is `ticketflow-harness`); it never depends on clap (except under its
//! `cli` feature), axum, hyper, tower, proptest, indicatif, quick-xml or ureq, and owns no
//! process plumbing (signal handlers, temporary files, throwaway databases: the harness's
//! `cleanup` and `scratch`).
//!
//! - [`fingerprint`] and [`canonical`]: the canonical request fingerprint and the one JSON
//!   escaper (docs/PROTOCOL.md §2);
//! - [`domain`]: tickets, receipts, outbox events, outcomes, validation; [`error`] and
//!   [`backend`]: typed errors and which database said so;
//! - [`protocol`]: create / get / update written once over the [`store::Store`] trait;
//! - [`model`]: the pure reference model;
//! - [`store`]: the SQLite and PostgreSQL implementations and their migrations, the lease
//!   table, and the in-memory store the loom models run on;
//! - [`lease`]: the Redis lease in front of the receipt (docs/PROTOCOL.md §10);
//! - [`variants`]: the wrong implementations of docs/PROTOCOL.md §8, for negative controls;
//! - [`wire`]: the HTTP contract (headers, problem types) shared by `serve` and its clients;
//! - [`deadline`]: deadlines on PostgreSQL calls;
//! - [`flags`]: the command-line flags the library names in its messages and child command
//!   lines, checked against the binary's own definitions by its tests.

pub mod backend;
pub mod canonical;
pub mod deadline;
pub mod domain;
pub mod error;
pub mod fault_variants;
pub mod fingerprint;
pub mod flags;
pub mod lease;
pub mod model;
pub mod os;
pub mod protocol;
pub mod redis_keys;
pub mod sequence_variants;
pub mod store;
/// std ↔ loom synchronization types (`cfg(ticketflow_loom)`), for the in-memory store.
mod sync;
pub mod variants;
pub mod wire;

pub use domain::{
    CreateReport, DecisionPath, Outcome, OutcomeKind, Ticket, TicketPatch, TicketRequest,
};
pub use error::{DbErrorKind, Error, Result, StoreError, ValidationError};
pub use fingerprint::Fingerprint;
pub use protocol::{
    create_ticket, get_ticket, update_ticket, CreateOptions, Protocol, RetryPolicy,
};
