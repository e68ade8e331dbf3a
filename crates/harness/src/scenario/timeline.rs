//! The recorded timeline of a race: every store call a racer made, with its arguments and
//! when it started and finished, plus the controller's barrier events. REPORT.md draws it as
//! a Mermaid sequence diagram (`report::mermaid`) and a failing PostgreSQL race can
//! be exported from it as an isolation-tester spec ([`crate::blackbox::isolation`]).
//!
//! Times are microseconds since the Unix epoch by the system clock, so steps recorded in
//! `ticketflow worker` processes and in the runner's threads can be ordered together (one
//! machine, one clock).

use serde::{Deserialize, Serialize};

use ticketflow_core::store::call::StoreCall;

/// Microseconds since the Unix epoch, now (0 if the clock is before 1970).
pub(crate) fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// One recorded step of a racer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// The step in words with its result, e.g. `find receipt -> none`,
    /// `insert receipt -> unique violation (23505)`.
    pub what: String,
    /// The call and its arguments.
    pub call: StoreCall,
    /// When the call was issued (µs since the Unix epoch).
    pub started_us: u64,
    /// When it returned (µs since the Unix epoch); a blocked call returns late.
    pub finished_us: u64,
}

impl Step {
    /// Whether the step returned an error: its text has ` -> ` followed by something other
    /// than a lookup's `none` / `found` or an ON CONFLICT insert's `inserted` / `taken`.
    pub fn failed(&self) -> bool {
        match self.what.split_once(" -> ") {
            Some((_, result)) => !matches!(result, "none" | "found" | "inserted" | "taken"),
            None => false,
        }
    }
}

/// The controller's side of a PostgreSQL barrier, in µs since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControllerTimes {
    /// When the barrier lock was granted to the controller.
    pub locked_us: u64,
    /// When `pg_locks` first showed every racer waiting (absent when it never did).
    pub all_waiting_us: Option<u64>,
    /// When the controller's COMMIT released the lock.
    pub released_us: u64,
}

/// Milliseconds with two decimals, as the evidence records durations.
pub(crate) fn ms(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 1000.0 * 100.0).round() / 100.0
}
