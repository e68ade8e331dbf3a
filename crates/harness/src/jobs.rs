//! Independent runs at once: a bounded pool that keeps results, and their reporting, in input
//! order.
//!
//! `verify`'s scenario runs, property suites and kill-matrix cells do not depend on each
//! other: each has its own scratch database, its own barrier and its own racers. Most of
//! their time is spent waiting on PostgreSQL (a `CREATE DATABASE`, a commit's WAL flush, a
//! barrier poll), so a few at once fill the machine's cores. [`run_ordered`] runs at most
//! [`Pool::jobs`] of them at once, and within a PostgreSQL session [`Budget`]: each item
//! declares the sessions it opens ([`Weighed::sessions`]) and waits until they fit beside the
//! items running, so a run's own capacity check ([`crate::scenario::capacity`]) sees the
//! same free slots it would see alone. An item that needs the whole budget or more runs alone.
//!
//! Items start in input order; `done` sees each result in input order as soon as it and every
//! item before it have finished, so what is printed and reported is the order of a serial run.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The default number of runs at once: twice the machine's cores, at least 2 and at most 4
/// (the work is mostly waiting on the database server; on 2 cores 4 at once took half the
/// time of 2, docs/postgres.md).
pub fn default_jobs() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get() * 2)
        .unwrap_or(2)
        .clamp(2, 4)
}

/// PostgreSQL sessions kept out of the [`Budget`] for everything else on the server (other
/// clients, the probe, `verify`'s own admin sessions).
pub const SESSION_MARGIN: u64 = 8;

/// A budget no PostgreSQL server can be short of: PostgreSQL's own ceiling on
/// `max_connections` (`MAX_BACKENDS`, 2^18 - 1). It stands for "unbounded" where the server's
/// free slots are not known, yet stays finite, so an item that asks for the whole budget
/// ([`u64::MAX`], "run alone") is clamped to it and what the items hold always sums without
/// overflow.
pub const UNBOUNDED_SESSIONS: u64 = 262_143;

/// How many items run at once, and the PostgreSQL sessions they may hold together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool {
    /// Items at once (at least 1; 1 is a serial run).
    pub jobs: usize,
    /// Sessions the running items may hold together.
    pub sessions: u64,
}

impl Pool {
    /// One item at a time, whatever it needs: the serial run.
    pub const SERIAL: Pool = Pool {
        jobs: 1,
        sessions: u64::MAX,
    };

    /// `jobs` at once within `sessions` sessions.
    pub fn new(jobs: usize, sessions: u64) -> Pool {
        Pool {
            jobs: jobs.max(1),
            sessions,
        }
    }
}

/// What an item of [`run_ordered`] declares before it starts.
pub trait Weighed {
    /// PostgreSQL sessions it holds at most while it runs (0: none).
    fn sessions(&self) -> u64;
}

/// A counting semaphore over PostgreSQL sessions.
#[derive(Debug)]
pub struct Budget {
    total: u64,
    used: Mutex<u64>,
    freed: Condvar,
}

/// Sessions taken from a [`Budget`]; given back when dropped.
#[derive(Debug)]
#[must_use = "the sessions are given back when this value is dropped"]
pub(crate) struct Taken<'a> {
    budget: &'a Budget,
    sessions: u64,
}

impl Budget {
    /// A budget of `total` sessions.
    pub(crate) fn new(total: u64) -> Budget {
        Budget {
            total,
            used: Mutex::new(0),
            freed: Condvar::new(),
        }
    }

    /// Takes `sessions` (at most the whole budget: more waits until nothing else holds any),
    /// waiting until they fit. Never overflows, whatever the budget and the sessions asked
    /// (both may be [`u64::MAX`]).
    pub(crate) fn take(&self, sessions: u64) -> Taken<'_> {
        let sessions = sessions.min(self.total);
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        // What is free, not what would be held: `used + sessions` overflows when an item that
        // holds the whole of a `u64::MAX` budget meets another that asks for it.
        while self.total.saturating_sub(*used) < sessions {
            used = self.freed.wait(used).unwrap_or_else(|e| e.into_inner());
        }
        *used += sessions;
        Taken {
            budget: self,
            sessions,
        }
    }

    /// Sessions held now.
    #[cfg(test)]
    pub(crate) fn used(&self) -> u64 {
        *self.used.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        let mut used = self.budget.used.lock().unwrap_or_else(|e| e.into_inner());
        *used -= self.sessions;
        self.budget.freed.notify_all();
    }
}

/// What [`run_ordered`] returns: the results in input order and the time the items took,
/// summed (with several at once, more than the wall time).
#[derive(Debug)]
pub struct Ran<R> {
    /// One result per item, in input order.
    pub results: Vec<R>,
    /// The items' own durations, summed.
    pub busy: Duration,
}

/// Runs `work` on every item, at most `pool.jobs` at once and within `pool.sessions`; calls
/// `done` with each result in input order as soon as it and all before it are done.
///
/// A panic in `work` is propagated once the other items have finished.
pub fn run_ordered<T, R>(
    items: &[T],
    pool: Pool,
    work: &(dyn Fn(&T) -> R + Sync),
    done: &mut dyn FnMut(&R),
) -> Ran<R>
where
    T: Weighed + Sync,
    R: Send,
{
    let budget = Budget::new(pool.sessions);
    let next = AtomicUsize::new(0);
    let mut slots: Vec<Option<R>> = items.iter().map(|_| None).collect();
    let mut busy = Duration::ZERO;
    let workers = pool.jobs.min(items.len());
    std::thread::scope(|scope| {
        let (tx, rx) = mpsc::channel::<(usize, R, Duration)>();
        for _ in 0..workers {
            let (tx, next, budget) = (tx.clone(), &next, &budget);
            scope.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(item) = items.get(i) else { break };
                let _taken = budget.take(item.sessions());
                let started = Instant::now();
                let r = work(item);
                if tx.send((i, r, started.elapsed())).is_err() {
                    break;
                }
            });
        }
        drop(tx);
        let mut reported = 0;
        for (i, r, took) in rx {
            busy += took;
            slots[i] = Some(r);
            while let Some(Some(r)) = slots.get(reported) {
                done(r);
                reported += 1;
            }
        }
    });
    Ran {
        results: slots.into_iter().flatten().collect(),
        busy,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;

    struct Item {
        id: usize,
        sessions: u64,
    }

    impl Weighed for Item {
        fn sessions(&self) -> u64 {
            self.sessions
        }
    }

    fn items(sessions: &[u64]) -> Vec<Item> {
        sessions
            .iter()
            .enumerate()
            .map(|(id, &sessions)| Item { id, sessions })
            .collect()
    }

    #[test]
    fn results_and_reports_come_in_input_order_whatever_finishes_first() {
        // Item 0 waits until item 1 has finished: with two at once, 1 finishes first.
        let (tx, rx) = mpsc::channel::<()>();
        let rx = Mutex::new(rx);
        let tx = Mutex::new(tx);
        let list = items(&[0, 0, 0, 0]);
        let mut seen = Vec::new();
        let ran = run_ordered(
            &list,
            Pool::new(2, 10),
            &|it: &Item| {
                match it.id {
                    0 => rx.lock().unwrap().recv().unwrap(),
                    1 => tx.lock().unwrap().send(()).unwrap(),
                    _ => {}
                }
                it.id * 10
            },
            &mut |r| seen.push(*r),
        );
        assert_eq!(ran.results, vec![0, 10, 20, 30]);
        assert_eq!(seen, vec![0, 10, 20, 30]);
    }

    #[test]
    fn items_run_at_once_up_to_jobs() {
        // Three items meet at a barrier of three: they can only pass it if all run at once.
        let barrier = Barrier::new(3);
        let list = items(&[1, 1, 1]);
        let ran = run_ordered(
            &list,
            Pool::new(3, 10),
            &|_: &Item| barrier.wait().is_leader(),
            &mut |_| {},
        );
        assert_eq!(ran.results.iter().filter(|l| **l).count(), 1);
    }

    #[test]
    fn the_session_budget_is_never_exceeded_and_a_serial_pool_runs_one_at_a_time() {
        for (pool, bound) in [(Pool::new(4, 10), 10), (Pool::SERIAL, 1)] {
            let running = Mutex::new((0u64, 0u64, 0usize, 0usize));
            let list = items(&[6, 3, 4, 7, 2, 30, 5]);
            run_ordered(
                &list,
                pool,
                &|it: &Item| {
                    {
                        let mut r = running.lock().unwrap();
                        r.0 += it.sessions.min(pool.sessions);
                        r.1 = r.1.max(r.0);
                        r.2 += 1;
                        r.3 = r.3.max(r.2);
                    }
                    std::thread::yield_now();
                    let mut r = running.lock().unwrap();
                    r.0 -= it.sessions.min(pool.sessions);
                    r.2 -= 1;
                },
                &mut |_| {},
            );
            let r = running.lock().unwrap();
            if pool == Pool::SERIAL {
                assert_eq!(r.3, bound as usize, "items at once");
            } else {
                assert!(r.1 <= bound, "sessions at once {} > {bound}", r.1);
            }
        }
    }

    #[test]
    fn the_budget_check_can_fail_without_the_budget() {
        // Negative control of the test above: with a budget as large as the items' sum,
        // four items of 6 sessions at once do exceed 10.
        let barrier = Barrier::new(4);
        let running = Mutex::new((0u64, 0u64));
        let list = items(&[6, 6, 6, 6]);
        run_ordered(
            &list,
            Pool::new(4, 24),
            &|it: &Item| {
                {
                    let mut r = running.lock().unwrap();
                    r.0 += it.sessions;
                    r.1 = r.1.max(r.0);
                }
                barrier.wait();
            },
            &mut |_| {},
        );
        assert!(running.lock().unwrap().1 > 10);
    }

    #[test]
    fn an_item_larger_than_the_budget_runs_alone() {
        let budget = Budget::new(10);
        let small = budget.take(3);
        assert_eq!(budget.used(), 3);
        drop(small);
        let all = budget.take(50);
        assert_eq!(budget.used(), 10);
        drop(all);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn items_that_ask_for_all_of_an_unbounded_budget_run_alone_without_overflow() {
        // Whole-budget items (u64::MAX) beside others, in a u64::MAX budget: adding what one
        // holds to what the next asks for overflowed.
        // (items holding sessions, whole-budget items among them, one ran beside another)
        let running = Mutex::new((0usize, 0usize, false));
        let list = items(&[u64::MAX, 3, u64::MAX, u64::MAX, 5, 0]);
        let ran = run_ordered(
            &list,
            Pool::new(3, u64::MAX),
            &|it: &Item| {
                let (holds, whole) = (it.sessions > 0, it.sessions == u64::MAX);
                {
                    let mut r = running.lock().unwrap();
                    if holds && (r.1 > 0 || (whole && r.0 > 0)) {
                        r.2 = true;
                    }
                    r.0 += usize::from(holds);
                    r.1 += usize::from(whole);
                }
                std::thread::yield_now();
                let mut r = running.lock().unwrap();
                r.0 -= usize::from(holds);
                r.1 -= usize::from(whole);
                it.id
            },
            &mut |_| {},
        );
        assert_eq!(ran.results, vec![0, 1, 2, 3, 4, 5]);
        assert!(
            !running.lock().unwrap().2,
            "a whole-budget item ran beside another"
        );
        let budget = Budget::new(u64::MAX);
        let all = budget.take(u64::MAX);
        assert_eq!(budget.used(), u64::MAX);
        drop(all);
        assert_eq!(budget.used(), 0);
    }
}
