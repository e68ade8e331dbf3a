//! The outputs of `verify`: REPORT.md (for people, [`render`]), `report.json` (a versioned
//! schema, [`json`]) and `report.junit.xml` (for CI systems, [`junit`]), and a Mermaid diagram
//! of each PostgreSQL race ([`mermaid`]). The isolation-tester specs of failing races and
//! schedules, and a failing schedule's diagram, are made where the run is judged
//! (`ticketflow_harness::blackbox::isolation` and `::diagram`); this crate renders what they
//! wrote.
//!
//! [`model`] is what was run and found ([`ReportInput`], with the [`Context`] that `verify`
//! captures); the renderers only read it. REPORT.md is diff-friendly: verdict tables hold no
//! timings, seeds, pids, scratch database names or ticket ids (tickets are labelled `T1`, `T2`
//! per run), so two runs with the same results give the same tables. Timings and seeds go to
//! the Environment section at the end.

pub mod check;
pub mod json;
pub mod junit;
pub mod markdown;
pub mod mermaid;
pub mod model;

pub use markdown::render;
pub use model::{
    counts, items, loom_items, Context, Item, PhaseTiming, ReportInput, Scope, TicketLabels,
    Timings, Totals, SELF_CHECKS,
};
