//! TicketFlow Verify's harness: what runs, judges and records races, suites, faults and
//! benchmarks, on the core's stores and against any service over HTTP.
//!
//! - [`argv`]: the command lines the harness starts its own binary with;
//! - [`barrier`]: the barriers that hold racers until every one is in flight (in-process, and
//!   the PostgreSQL lock barrier with `pg_locks` evidence);
//! - [`scenario`]: library race scenario files and their runner;
//! - [`load`]: the one loader of scenario files (library and black-box) for every command;
//! - [`blackbox`]: black-box scenarios (a `[target]` table): racers are HTTP clients of any
//!   service, judged by its answers and by counts on its own database or Redis; its failing
//!   schedules as diagrams and isolation-tester specs;
//! - [`check`]: histories nobody wrote, generated from a seed, judged against the
//!   idempotency model and shrunk when they fail (the parts; the runner that sends them is to come);
//! - [`interpose`]: the loopback proxy in front of a target's PostgreSQL or Redis that holds,
//!   orders and releases the service's own commands, and the schedules explored through it;
//! - [`props`]: property suites against the reference model;
//! - [`faults`]: faults and bad input, counted for the report;
//! - [`killmatrix`]: every gate against every wrong implementation;
//! - [`soak`]: two `serve` processes under mixed traffic and scheduled faults;
//! - [`mod@bench`]: the protocols' cost against bare SQL;
//! - [`verdict`]: the one verdict and the one check every part is judged by; [`shortage`]:
//!   an environment that cannot host a run (PENDING, never FAIL);
//! - [`scratch`], [`cleanup`]: throwaway databases (one door per backend) and their ledger,
//!   and what an interrupt must undo;
//! - [`jobs`], [`child`], [`contain`], [`outputs`]: the bounded pool runs go through, every
//!   child process, text the tool does not own, and the folders it writes.
//!
//! The harness starts `ticketflow serve` as a process and never links it.

// Items used only inside this crate are `pub(crate)`; this lint keeps them so (a `pub` item
// that no other crate can reach is a warning, and CI denies warnings).
#![warn(unreachable_pub)]

pub mod argv;
pub mod barrier;
pub mod bench;
pub mod blackbox;
pub mod check;
pub mod child;
pub mod cleanup;
pub mod contain;
pub mod faults;
pub mod interpose;
pub mod jobs;
pub mod killmatrix;
pub mod load;
pub mod oracle;
pub mod outputs;
pub mod props;
pub mod scenario;
pub mod scratch;
pub mod shortage;
pub mod soak;
pub mod verdict;
