//! Barriers that hold racers until every one of them is in flight.
//!
//! - [`Barrier`] (this module): a one-shot barrier with a deadline, for racers in one process
//!   (the SQLite runner, and the HTTP-level release of black-box targets).
//! - [`server`]: the PostgreSQL barrier: a controller session holds a lock, a monitor session
//!   polls `pg_locks` until the expected requests wait behind it, then the controller releases.
//!   Used by the library runner and the black-box runner.
//!
//! `std::sync::Barrier` waits forever: if one racer fails before it arrives, the others hang.
//! This barrier returns [`BarrierError::TimedOut`] at the deadline and can be broken by
//! [`Barrier::abandon`] (a racer that failed early calls it), so a broken run ends as a
//! FAIL with a reason instead of a hung test.

pub mod server;

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Why a wait did not end with every party arriving.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BarrierError {
    /// The deadline passed with `arrived` of `parties` present.
    #[error("barrier timed out: {arrived} of {parties} racers arrived")]
    TimedOut {
        /// How many had arrived.
        arrived: usize,
        /// How many were expected.
        parties: usize,
    },
    /// A party called [`Barrier::abandon`].
    #[error("barrier abandoned by a racer that failed before arriving")]
    Abandoned,
}

#[derive(Debug, Default)]
struct State {
    arrived: usize,
    abandoned: bool,
}

/// A barrier for `parties` threads, used once.
#[derive(Debug)]
pub struct Barrier {
    parties: usize,
    state: Mutex<State>,
    all_here: Condvar,
}

impl Barrier {
    /// A barrier that opens when `parties` threads have called [`Barrier::wait`].
    pub fn new(parties: usize) -> Self {
        Barrier {
            parties,
            state: Mutex::new(State::default()),
            all_here: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking racer must not turn every other wait into a panic.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Arrives and waits until all parties have arrived, at most `timeout`.
    /// Returns this caller's arrival index (0-based).
    ///
    /// Will return `Err` if the timeout passes first or the barrier was abandoned.
    pub fn wait(&self, timeout: Duration) -> Result<usize, BarrierError> {
        let deadline = Instant::now() + timeout;
        let mut state = self.lock();
        if state.abandoned {
            return Err(BarrierError::Abandoned);
        }
        let index = state.arrived;
        state.arrived += 1;
        if state.arrived >= self.parties {
            self.all_here.notify_all();
            return Ok(index);
        }
        loop {
            if state.abandoned {
                return Err(BarrierError::Abandoned);
            }
            if state.arrived >= self.parties {
                return Ok(index);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(BarrierError::TimedOut {
                    arrived: state.arrived,
                    parties: self.parties,
                });
            }
            state = self
                .all_here
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Breaks the barrier: every current and future waiter gets [`BarrierError::Abandoned`]
    /// unless all parties had already arrived.
    pub fn abandon(&self) {
        let mut state = self.lock();
        if state.arrived < self.parties {
            state.abandoned = true;
        }
        self.all_here.notify_all();
    }

    /// How many parties have arrived so far.
    pub fn arrived(&self) -> usize {
        self.lock().arrived
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_when_all_arrive() {
        let barrier = Barrier::new(3);
        let mut indices: Vec<usize> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..3)
                .map(|_| s.spawn(|| barrier.wait(Duration::from_secs(10)).unwrap()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        indices.sort();
        assert_eq!(indices, vec![0, 1, 2]);
    }

    #[test]
    fn times_out_when_a_party_never_comes() {
        let barrier = Barrier::new(2);
        assert_eq!(
            barrier.wait(Duration::from_millis(20)),
            Err(BarrierError::TimedOut {
                arrived: 1,
                parties: 2
            })
        );
    }

    #[test]
    fn abandon_releases_waiters_with_an_error() {
        let barrier = Barrier::new(2);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| barrier.wait(Duration::from_secs(30)));
            // Abandon only once the waiter has arrived, observed through the barrier itself.
            while barrier.arrived() == 0 {
                std::thread::yield_now();
            }
            barrier.abandon();
            assert_eq!(waiter.join().unwrap(), Err(BarrierError::Abandoned));
        });
    }
}
