//! The PostgreSQL barrier, as PostgreSQL's isolation tester does it: a controller session
//! takes a lock in an open transaction; the racers' statements queue behind it; a monitor
//! session polls `pg_locks` (every [`POLL_INTERVAL`], with a deadline) until exactly the
//! expected number of ungranted requests for that lock wait, each blocked by the controller
//! (`pg_blocking_pids`) with wait event type `Lock`; then the controller commits and every
//! racer proceeds at once.
//!
//! **Invariant:** a release after [`gather`] returned [`Gathered::Reached`] means that many
//! sessions were seen waiting on the lock, blocked by the controller, at one poll.

use std::time::{Duration, Instant};

use postgres::Client;
use serde::Serialize;

use ticketflow_core::error::StoreError;
use ticketflow_core::store::postgres as pg;

/// How often `pg_locks` is polled while racers gather.
pub const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// The lock the controller holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ServerLock {
    /// `LOCK TABLE {table} IN ACCESS EXCLUSIVE | EXCLUSIVE MODE`.
    Table {
        /// Table name, optionally schema-qualified (validated by the caller: letters,
        /// digits, `_`, `.`).
        table: String,
        /// ACCESS EXCLUSIVE (every statement on the table waits) or EXCLUSIVE (reads pass,
        /// writes wait).
        access_exclusive: bool,
    },
    /// `pg_advisory_xact_lock(key)` (the bigint form).
    Advisory {
        /// The key.
        key: i64,
    },
}

impl ServerLock {
    /// The statement the controller runs inside its transaction.
    pub(crate) fn statement(&self) -> String {
        match self {
            ServerLock::Table {
                table,
                access_exclusive,
            } => format!(
                "LOCK TABLE {table} IN {} MODE",
                if *access_exclusive {
                    "ACCESS EXCLUSIVE"
                } else {
                    "EXCLUSIVE"
                }
            ),
            ServerLock::Advisory { key } => format!("SELECT pg_advisory_xact_lock({key})"),
        }
    }

    /// `table orders` or `advisory lock 42`, for reasons.
    pub(crate) fn label(&self) -> String {
        match self {
            ServerLock::Table { table, .. } => format!("table {table}"),
            ServerLock::Advisory { key } => format!("advisory lock {key}"),
        }
    }

    /// The `pg_locks l` condition that recognises a request for this lock. Advisory keys are
    /// split as PostgreSQL stores a bigint key: high 32 bits in `classid`, low in `objid`,
    /// `objsubid` 1.
    fn filter(&self) -> String {
        match self {
            ServerLock::Table { table, .. } => format!(
                "l.locktype = 'relation' AND l.relation = to_regclass('{}')",
                table.replace('\'', "''")
            ),
            ServerLock::Advisory { key } => {
                let bits = *key as u64;
                format!(
                    "l.locktype = 'advisory' AND l.classid::bigint = {} AND l.objid::bigint = {} AND l.objsubid = 1",
                    bits >> 32,
                    bits & 0xffff_ffff
                )
            }
        }
    }
}

/// One ungranted lock request seen by the monitor.
#[derive(Debug, Clone, Serialize)]
pub struct Waiter {
    /// Backend pid.
    pub pid: i32,
    /// `pg_stat_activity.application_name`.
    pub application_name: String,
    /// `wait_event_type/wait_event` (`Lock/relation`, `Lock/advisory`).
    pub wait_event: String,
    /// Lock mode requested.
    pub mode: String,
    /// `pg_blocking_pids(pid)`.
    pub blocked_by: Vec<i32>,
    /// Milliseconds its statement has run, by the server's clock.
    pub waiting_ms: f64,
}

/// Whose lock requests count.
#[derive(Debug, Clone, Copy)]
pub enum Among<'a> {
    /// Only these backend pids (the library runner knows its racers' sessions).
    Pids(&'a [i32]),
    /// Any session but these (a black-box target: the runner cannot know which server session
    /// serves which client; its own controller and monitor are excluded).
    AnyExcept(&'a [i32]),
}

/// The controller session holding the barrier lock in an open transaction.
pub struct Controller {
    client: Client,
    /// The server, for the watchdog.
    peer: ticketflow_core::deadline::Peer,
    /// How long one monitor poll may wait ([`pg::SessionRole::Monitor`]).
    poll_within: Duration,
    pid: i32,
    lock: ServerLock,
    watched: ServerLock,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("pid", &self.pid)
            .field("lock", &self.lock)
            .field("watched", &self.watched)
            .finish()
    }
}

impl Controller {
    /// Connects with `config` as a [`pg::SessionRole::Controller`] and takes `lock` in a new
    /// transaction, waiting at most `lock_within` for it (`lock_timeout`; the barrier's
    /// timeout).
    ///
    /// Will return `Err` if the connection fails or the lock cannot be taken (no such table,
    /// permission denied; kind [`ticketflow_core::error::DbErrorKind::Timeout`], SQLSTATE 55P03, when
    /// another session held it for `lock_within`: the message names the lock).
    pub(crate) fn lock(
        config: &postgres::Config,
        lock: ServerLock,
        lock_within: Duration,
    ) -> Result<Controller, StoreError> {
        Controller::lock_watching(config, lock.clone(), lock, lock_within)
    }

    /// Takes `lock` but counts requests for `watched`: a negative control holds one table
    /// while the racers are expected on another, to show the barrier check then fails.
    ///
    /// Will return `Err` as [`Controller::lock`] does.
    pub(crate) fn lock_watching(
        config: &postgres::Config,
        lock: ServerLock,
        watched: ServerLock,
        lock_within: Duration,
    ) -> Result<Controller, StoreError> {
        let role = pg::SessionRole::Controller { lock_within };
        let peer = ticketflow_core::deadline::Peer::of(config);
        let mut client = pg::connect_as(config, role)?;
        let pid: i32 = ticketflow_core::store::postgres::watch_pg(
            "controller pid",
            &peer,
            role.hard_deadline_for(config),
            || client.query_one("SELECT pg_backend_pid()", &[]),
        )?
        .get(0);
        ticketflow_core::store::postgres::watch_pg(
            "take the barrier lock",
            &peer,
            role.hard_deadline_for(config),
            || client.batch_execute(&format!("BEGIN; {}", lock.statement())),
        )
        .map_err(|mut e| {
            if e.kind == ticketflow_core::error::DbErrorKind::Timeout {
                e.message = format!(
                    "{} was not granted within {} ms (lock_timeout): another session holds it ({})",
                    lock.label(),
                    lock_within.as_millis(),
                    e.message
                );
            }
            e
        })?;
        Ok(Controller {
            client,
            poll_within: pg::SessionRole::Monitor.hard_deadline_for(config),
            peer,
            pid,
            lock,
            watched,
        })
    }

    /// The controller's backend pid.
    pub(crate) fn pid(&self) -> i32 {
        self.pid
    }

    /// The lock held.
    pub(crate) fn server_lock(&self) -> &ServerLock {
        &self.lock
    }

    /// Ungranted requests for the watched lock in the monitor's database from the sessions `among`
    /// selects, excluding the controller and the monitor. The poll is watched
    /// ([`ticketflow_core::store::postgres::watch_pg`]): a server that does not answer it within the monitor's
    /// deadline has its connections shut down.
    ///
    /// Will return `Err` if the monitor's query fails or is given up on.
    pub(crate) fn waiters(
        &self,
        monitor: &mut Client,
        among: Among,
    ) -> Result<Vec<Waiter>, StoreError> {
        let (pid_filter, pids): (&str, &[i32]) = match among {
            Among::Pids(p) => ("l.pid = ANY($2)", p),
            Among::AnyExcept(p) => ("NOT (l.pid = ANY($2))", p),
        };
        let sql = format!(
            "SELECT a.pid, coalesce(a.application_name, ''), \
                    coalesce(a.wait_event_type, '-') || '/' || coalesce(a.wait_event, '-'), \
                    l.mode, pg_blocking_pids(a.pid), \
                    coalesce(extract(epoch FROM clock_timestamp() - a.query_start) * 1000, 0)::float8 \
             FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE NOT l.granted \
               AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
               AND {} AND {pid_filter} \
               AND l.pid <> $1 AND l.pid <> pg_backend_pid() \
             ORDER BY a.pid",
            self.watched.filter()
        );
        let rows = ticketflow_core::store::postgres::watch_pg(
            "read pg_locks",
            &self.peer,
            self.poll_within,
            || monitor.query(&sql, &[&self.pid, &pids]),
        )?;
        Ok(rows
            .iter()
            .map(|r| Waiter {
                pid: r.get(0),
                application_name: r.get(1),
                wait_event: r.get(2),
                mode: r.get(3),
                blocked_by: r.get(4),
                waiting_ms: r.get(5),
            })
            .collect())
    }

    /// Commits the controller's transaction: every waiter proceeds.
    ///
    /// Will return `Err` if the COMMIT fails (the connection is closed either way, which
    /// releases the lock too).
    pub(crate) fn release(mut self) -> Result<(), StoreError> {
        self.client
            .batch_execute("COMMIT")
            .map_err(|e| pg::classify("release the barrier lock", e))
    }
}

/// How a [`gather`] ended.
#[derive(Debug, Clone)]
pub enum Gathered {
    /// Exactly the expected number waited, each blocked by the controller with a `Lock` wait
    /// event.
    Reached {
        /// The waiters at that poll.
        waiters: Vec<Waiter>,
        /// When that poll returned.
        at: Instant,
        /// Polls made.
        polls: u32,
    },
    /// It did not happen; the reason says what was seen last.
    Problem {
        /// Why, in words.
        reason: String,
        /// The waiters at the last successful poll.
        waiters: Vec<Waiter>,
        /// Polls made.
        polls: u32,
    },
}

/// Polls until exactly `want()` requests from `among` wait on the controller's lock, blocked by
/// the controller, or until `deadline`, more than `want()` waiters, a failed poll, or `stop`
/// returning a reason (a racer finished before it was seen waiting). `why_short(seen)` words
/// the reason when fewer than `want` were seen at the deadline.
pub fn gather(
    controller: &Controller,
    monitor: &mut Client,
    among: Among,
    want: &dyn Fn() -> usize,
    deadline: Instant,
    stop: &dyn Fn() -> Option<String>,
    why_short: &dyn Fn(usize) -> String,
) -> Gathered {
    let mut polls = 0u32;
    let mut last: Vec<Waiter> = Vec::new();
    loop {
        polls += 1;
        // Read before the poll: a racer answered meanwhile can only lower it, never make a
        // poll that counted it as waiting look complete.
        let want = want();
        match controller.waiters(monitor, among) {
            Ok(rows) => {
                // pg_locks and pg_stat_activity are not one atomic snapshot: a backend can be
                // queued on the lock a moment before its wait event says so. Count it only
                // once both agree.
                let settled = rows.iter().all(|w| {
                    w.blocked_by.contains(&controller.pid) && w.wait_event.starts_with("Lock/")
                });
                last = rows;
                if last.len() > want {
                    return Gathered::Problem {
                        reason: format!(
                            "{} lock requests wait on {} for {want} racers: something else waits there too, so they cannot be attributed to the racers",
                            last.len(),
                            controller.watched.label()
                        ),
                        waiters: last,
                        polls,
                    };
                }
                if last.len() == want && settled {
                    return Gathered::Reached {
                        waiters: last,
                        at: Instant::now(),
                        polls,
                    };
                }
            }
            Err(e) => {
                return Gathered::Problem {
                    reason: format!("cannot read pg_locks: {e}"),
                    waiters: last,
                    polls,
                }
            }
        }
        if let Some(reason) = stop() {
            return Gathered::Problem {
                reason,
                waiters: last,
                polls,
            };
        }
        if Instant::now() >= deadline {
            return Gathered::Problem {
                reason: why_short(last.len()),
                waiters: last,
                polls,
            };
        }
        // Polling, as PostgreSQL's isolation tester does: the condition is observed on the
        // server; this only paces the queries.
        std::thread::sleep(POLL_INTERVAL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_and_filters_name_the_lock() {
        let t = ServerLock::Table {
            table: "public.orders".into(),
            access_exclusive: false,
        };
        assert_eq!(t.statement(), "LOCK TABLE public.orders IN EXCLUSIVE MODE");
        assert!(t.filter().contains("to_regclass('public.orders')"));
        let a = ServerLock::Advisory {
            key: (7i64 << 32) | 9,
        };
        assert_eq!(
            a.statement(),
            format!("SELECT pg_advisory_xact_lock({})", (7i64 << 32) | 9)
        );
        assert!(a
            .filter()
            .contains("classid::bigint = 7 AND l.objid::bigint = 9"));
        let negative = ServerLock::Advisory { key: -1 };
        assert!(negative
            .filter()
            .contains("classid::bigint = 4294967295 AND l.objid::bigint = 4294967295"));
    }
}
