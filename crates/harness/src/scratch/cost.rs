//! What this process's PostgreSQL scratch databases cost: counters of creates, drops and
//! recycles and their time, for the report's timings.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// What this process's PostgreSQL scratch databases cost so far: how many `CREATE DATABASE`
/// and `DROP DATABASE` statements of [`super::ScratchDatabase`]s ran, and the time they took in all
/// (summed over threads, so it may exceed the wall time). The report's timings show it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ScratchCost {
    /// Scratch databases created.
    pub creates: u64,
    /// Their `CREATE DATABASE` statements, in all, in microseconds.
    pub create_us: u64,
    /// Scratch databases dropped by their owner (not by the interrupt handler).
    pub drops: u64,
    /// Their `DROP DATABASE` statements, in all, in microseconds.
    pub drop_us: u64,
    /// Scratch databases emptied, migrated again and kept for a later run instead of dropped
    /// (`verify`'s recycling, [`super::Recycling`]).
    pub recycled: u64,
    /// That emptying and migrating, in all, in microseconds.
    pub recycle_us: u64,
}

impl ScratchCost {
    /// The cost between `earlier` and this snapshot (counters only grow).
    pub fn since(self, earlier: ScratchCost) -> ScratchCost {
        ScratchCost {
            creates: self.creates.saturating_sub(earlier.creates),
            create_us: self.create_us.saturating_sub(earlier.create_us),
            drops: self.drops.saturating_sub(earlier.drops),
            drop_us: self.drop_us.saturating_sub(earlier.drop_us),
            recycled: self.recycled.saturating_sub(earlier.recycled),
            recycle_us: self.recycle_us.saturating_sub(earlier.recycle_us),
        }
    }
}

static CREATES: AtomicU64 = AtomicU64::new(0);
static CREATE_US: AtomicU64 = AtomicU64::new(0);
static DROPS: AtomicU64 = AtomicU64::new(0);
static DROP_US: AtomicU64 = AtomicU64::new(0);
static RECYCLED: AtomicU64 = AtomicU64::new(0);
static RECYCLE_US: AtomicU64 = AtomicU64::new(0);

/// This process's scratch-database cost so far ([`ScratchCost`]).
pub fn scratch_cost() -> ScratchCost {
    ScratchCost {
        creates: CREATES.load(Ordering::Relaxed),
        create_us: CREATE_US.load(Ordering::Relaxed),
        drops: DROPS.load(Ordering::Relaxed),
        drop_us: DROP_US.load(Ordering::Relaxed),
        recycled: RECYCLED.load(Ordering::Relaxed),
        recycle_us: RECYCLE_US.load(Ordering::Relaxed),
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Counts one `CREATE DATABASE` that took `took`.
pub(super) fn record_create(took: Duration) {
    CREATES.fetch_add(1, Ordering::Relaxed);
    CREATE_US.fetch_add(micros(took), Ordering::Relaxed);
}

/// Counts one `DROP DATABASE` that took `took`.
pub(super) fn record_drop(took: Duration) {
    DROPS.fetch_add(1, Ordering::Relaxed);
    DROP_US.fetch_add(micros(took), Ordering::Relaxed);
}

/// Counts one scratch database emptied and kept for reuse, which took `took`.
pub(super) fn record_recycle(took: Duration) {
    RECYCLED.fetch_add(1, Ordering::Relaxed);
    RECYCLE_US.fetch_add(micros(took), Ordering::Relaxed);
}
