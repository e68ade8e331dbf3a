//! Checking a service against the idempotency model over generated histories
//! (docs/PROTOCOL.md §11, docs/check.md).
//!
//! Hand-written scenarios cover the sequences their authors thought of. Here a history is
//! generated from a seed over a small pool of scopes × keys × bodies ([`generate`]), sent to
//! the service as a black-box scenario whose waves are the history's steps ([`run`]), judged
//! against the model of the whole history ([`crate::oracle::model`]), and a failing history is
//! shrunk to a minimal one that still fails ([`shrink`]) and written as a scenario file that
//! replays it ([`replay`]).
//!
//! Order inside the folder, bottom to top: `generate` and `bodies`, then `file` (the check
//! file), then `run` (a history sent and judged), then `shrink` (re-runs histories) and
//! `replay` (the minimal history written).

pub mod bodies;
pub mod file;
pub mod generate;
pub mod replay;
pub mod run;
pub mod shrink;

#[cfg(test)]
mod tests;
