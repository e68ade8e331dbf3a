//! Checking a service against the idempotency model over generated histories
//! (docs/PROTOCOL.md §11).
//!
//! Hand-written scenarios cover the sequences their authors thought of. Here a history is
//! generated from a seed over a small pool of scopes × keys × bodies ([`history`]), the answers a
//! service gave are judged against the model of the whole history ([`model`]), and a failing
//! history is shrunk to a minimal one that still fails ([`shrink`]).
//!
//! The three parts are pure: they know nothing about HTTP, barriers or databases. A runner
//! sends each step's requests (a concurrent group through a barrier), classifies each answer
//! into a [`model::Answer`], and hands the history and its answers to [`model::judge`]; the
//! shrinker calls back into that runner for each candidate.
//!
//! Order inside the folder, bottom to top: `history`, then `model` (judges a history), then
//! `shrink` (re-runs histories).

pub mod history;
pub mod model;
pub mod shrink;

#[cfg(test)]
mod tests;
