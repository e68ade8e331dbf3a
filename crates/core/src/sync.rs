//! The synchronization types shared state is built on: loom's under `cfg(ticketflow_loom)`,
//! std's otherwise, as tokio does with `cfg(loom)`.
//!
//! Code that loom should model (today [`crate::store::memory`]) takes its `Arc`, `Mutex` and
//! `Condvar` from here and nowhere else, so one source runs both in ordinary tests and under
//! the model checker (`scripts/loom.sh`). The cfg is our own: `--cfg loom` would also reach
//! tokio inside the `postgres` crate and break its build.
//!
//! Under loom these types work only inside a `loom::model` closure.

#[cfg(ticketflow_loom)]
pub(crate) use loom::sync::{Arc, Condvar, Mutex, MutexGuard};

#[cfg(not(ticketflow_loom))]
pub(crate) use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// `true` when loom runs this build. Loom replays every execution's scheduling choices, so
/// control flow must never depend on the wall clock there: a timeout that fires in one replay
/// and not in another breaks the model (waits are then untimed).
pub(crate) const MODEL_CHECKED: bool = cfg!(ticketflow_loom);

/// Locks `mutex`, ignoring poisoning: a panic elsewhere must not hide the state from the
/// checks that run after it (std only; loom never poisons).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Waits on `condvar`, ignoring poisoning like [`lock`].
pub(crate) fn wait<'a, T>(condvar: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    condvar
        .wait(guard)
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Waits on `condvar` for at most `timeout` (loom does not model the timeout: there it is a
/// plain [`wait`]).
pub(crate) fn wait_timeout<'a, T>(
    condvar: &Condvar,
    guard: MutexGuard<'a, T>,
    timeout: std::time::Duration,
) -> MutexGuard<'a, T> {
    match condvar.wait_timeout(guard, timeout) {
        Ok((guard, _)) => guard,
        Err(poisoned) => poisoned.into_inner().0,
    }
}
