//! How many racers this machine and server can hold, checked before a run creates anything.
//!
//! A racer holds resources for the whole race: a PostgreSQL session (every racer is waiting
//! at the barrier at once), and in this process file descriptors (a SQLite connection's
//! database and journal files, a PostgreSQL client's socket and runtime, a worker process's
//! pipes, an HTTP connection). A run that asks for more than there is fails late and confusingly ("unable to
//! open database file", "too many clients"); [`check_sessions`] and [`check_files`] refuse it
//! first with a [`CapacityError`] that names the count, the limit and where the limit comes
//! from. [`MAX_RACERS`](super::format::MAX_RACERS) bounds what a scenario file may ask for at all.
//!
//! The figures are a snapshot: other processes may open connections or files in between.

use postgres::Client;

use super::format::{RacerKind, Scenario};
use ticketflow_core::error::StoreError;
use ticketflow_core::store::postgres::classify;
use ticketflow_core::store::Backend;

/// PostgreSQL sessions a library run opens besides its racers' while they are connected: the
/// setup session (later the monitor) and the controller. The admin session that creates the
/// scratch database is open when [`check_sessions`] counts the sessions in use.
pub const RUNNER_SESSIONS: i64 = 2;

/// File descriptors kept free for what a run opens besides its racers: the setup, controller
/// and monitor connections, SQLite's shared-memory file, temporary files, a report.
pub const FD_MARGIN: u64 = 32;

/// The PostgreSQL sessions a run of `scenario` holds at most: its racers, the runner's own
/// ([`RUNNER_SESSIONS`]) and the admin session that creates and
/// drops the scratch database.
pub fn scenario_sessions(scenario: &Scenario) -> u64 {
    let runner = RUNNER_SESSIONS.unsigned_abs();
    scenario.racers.len() as u64 + runner + 1
}

/// Why a run with this many racers is refused before it starts.
#[derive(Debug, thiserror::Error)]
pub enum CapacityError {
    /// The PostgreSQL server has fewer free connection slots than the run needs.
    #[error(
        "{racers} racers need {needed} PostgreSQL sessions ({racers} + {runner} of the runner's \
         own), but the server has {available} free: max_connections {max_connections} \
         − {reserved} reserved for superusers − {in_use} in use (pg_settings, \
         pg_stat_activity); lower the racer count or raise max_connections"
    )]
    Sessions {
        /// Racers asked for.
        racers: usize,
        /// Sessions the run needs.
        needed: i64,
        /// The runner's own sessions among them ([`RUNNER_SESSIONS`]).
        runner: i64,
        /// Free slots: `max_connections − reserved − in_use`.
        available: i64,
        /// The server's `max_connections`.
        max_connections: i64,
        /// Slots this role cannot use (`superuser_reserved_connections`, and
        /// `reserved_connections` where the server has it; 0 for a superuser).
        reserved: i64,
        /// Client sessions connected now, this process's own included.
        in_use: i64,
    },
    /// This process may open fewer files than the run needs.
    #[error(
        "{racers} racers need about {needed} file descriptors ({per_racer} each + {margin} for \
         the runner), but this process has {available} free: RLIMIT_NOFILE {limit} (the soft \
         limit, `ulimit -n`) − {open} open; lower the racer count or raise the limit"
    )]
    FileDescriptors {
        /// Racers asked for.
        racers: usize,
        /// Descriptors one racer holds.
        per_racer: u64,
        /// Descriptors kept for the runner ([`FD_MARGIN`]).
        margin: u64,
        /// Descriptors the run needs.
        needed: u64,
        /// Free descriptors: `limit − open`.
        available: u64,
        /// The soft `RLIMIT_NOFILE`.
        limit: u64,
        /// Descriptors open now.
        open: u64,
    },
    /// The server's connection limit or sessions could not be read.
    #[error("cannot read PostgreSQL's connection limit: {0}")]
    Probe(#[source] StoreError),
}

/// File descriptors one racer holds in this process while it races (measured: the lowest
/// `ulimit -n` a run passes with, for 40 and 80 racers): a SQLite connection's database file
/// and its WAL or rollback journal, 2; a PostgreSQL thread racer's socket and its client's own
/// I/O runtime (epoll and wake-up descriptors), 5; a worker process's stdin and stdout pipes
/// (its session is the worker's), 2 ([`Backend::Memory`]: none).
pub(crate) fn fds_per_racer(backend: Backend, racers_as: RacerKind) -> u64 {
    match (backend, racers_as) {
        (Backend::Sqlite, _) => 2,
        (Backend::Postgres, RacerKind::Threads) => 5,
        (Backend::Postgres, RacerKind::Processes) => 2,
        (Backend::Memory, _) => 0,
    }
}

/// File descriptors one black-box racer holds in this process while it races: its HTTP
/// connection.
pub(crate) const FDS_PER_HTTP_RACER: u64 = 1;

/// The process's file-descriptor limit and use, as the kernel reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdUse {
    /// The soft `RLIMIT_NOFILE` (`None`: unlimited).
    pub limit: Option<u64>,
    /// Descriptors open now.
    pub open: u64,
}

impl FdUse {
    /// This process's, from `/proc/self/limits` and `/proc/self/fd`; `None` where they cannot
    /// be read (not Linux): then nothing is checked.
    pub fn now() -> Option<FdUse> {
        let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
        let limit = soft_nofile(&limits)?;
        // The directory handle itself is one of the entries.
        let open = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
        Some(FdUse {
            limit,
            open: open.saturating_sub(1),
        })
    }
}

/// The soft limit on the `Max open files` line of a `/proc/<pid>/limits` text: `Some(None)`
/// for `unlimited`, `None` when the line is missing or unreadable.
fn soft_nofile(limits: &str) -> Option<Option<u64>> {
    let rest = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))?;
    match rest.split_whitespace().next()? {
        "unlimited" => Some(None),
        n => n.parse().ok().map(Some),
    }
}

/// Refuses `racers` racers holding `per_racer` descriptors each when `fds` leaves too few
/// free (keeping [`FD_MARGIN`]).
///
/// Will return `Err` ([`CapacityError::FileDescriptors`]) when they do not fit.
pub fn files_fit(racers: usize, per_racer: u64, fds: FdUse) -> Result<(), CapacityError> {
    let Some(limit) = fds.limit else {
        return Ok(());
    };
    let needed = (racers as u64)
        .saturating_mul(per_racer)
        .saturating_add(FD_MARGIN);
    let available = limit.saturating_sub(fds.open);
    if needed <= available {
        return Ok(());
    }
    Err(CapacityError::FileDescriptors {
        racers,
        per_racer,
        margin: FD_MARGIN,
        needed,
        available,
        limit,
        open: fds.open,
    })
}

/// [`files_fit`] with this process's limit and use now ([`FdUse::now`]); where they cannot be
/// read, nothing is refused.
///
/// Will return `Err` ([`CapacityError::FileDescriptors`]) when the racers do not fit.
pub fn check_files(racers: usize, per_racer: u64) -> Result<(), CapacityError> {
    match FdUse::now() {
        Some(fds) => files_fit(racers, per_racer, fds),
        None => Ok(()),
    }
}

/// A PostgreSQL server's connection slots, as [`check_sessions`] reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slots {
    /// `max_connections`.
    pub max_connections: i64,
    /// Slots the current role cannot use.
    pub reserved: i64,
    /// Client sessions connected now.
    pub in_use: i64,
}

/// Refuses `racers` racers (and [`RUNNER_SESSIONS`]) when `slots` leaves too few free.
///
/// Will return `Err` ([`CapacityError::Sessions`]) when they do not fit.
pub(crate) fn sessions_fit(racers: usize, slots: Slots) -> Result<(), CapacityError> {
    let needed = i64::try_from(racers)
        .unwrap_or(i64::MAX)
        .saturating_add(RUNNER_SESSIONS);
    let available = slots.max_connections - slots.reserved - slots.in_use;
    if needed <= available {
        return Ok(());
    }
    Err(CapacityError::Sessions {
        racers,
        needed,
        runner: RUNNER_SESSIONS,
        available,
        max_connections: slots.max_connections,
        reserved: slots.reserved,
        in_use: slots.in_use,
    })
}

/// What the server behind `admin` has: `max_connections`, the slots reserved from this role
/// (`superuser_reserved_connections`, and `reserved_connections` on PostgreSQL 16 and later
/// unless the role is a direct member of `pg_use_reserved_connections`; none for a
/// superuser), and the client sessions connected.
const SLOTS_SQL: &str = "SELECT current_setting('max_connections')::bigint, \
     CASE WHEN r.rolsuper THEN 0 ELSE \
       current_setting('superuser_reserved_connections')::bigint \
       + CASE WHEN EXISTS (SELECT 1 FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid \
                           WHERE g.rolname = 'pg_use_reserved_connections' AND m.member = r.oid) \
              THEN 0 \
              ELSE coalesce(current_setting('reserved_connections', true)::bigint, 0) END \
     END, \
     (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend') \
     FROM pg_roles r WHERE r.rolname = current_user";

/// Reads the slots of the server behind `admin` ([`Slots`]).
///
/// Will return `Err` ([`CapacityError::Probe`]) if the query fails.
pub fn slots(admin: &mut Client) -> Result<Slots, CapacityError> {
    let row = admin
        .query_one(SLOTS_SQL, &[])
        .map_err(|e| CapacityError::Probe(classify("read connection slots", e)))?;
    Ok(Slots {
        max_connections: row.get(0),
        reserved: row.get(1),
        in_use: row.get(2),
    })
}

/// Refuses `racers` racers when the server behind `admin` has too few free connection slots
/// for them and the runner's own sessions.
///
/// Will return `Err` ([`CapacityError::Sessions`]) when they do not fit, or
/// ([`CapacityError::Probe`]) when the slots cannot be read.
pub fn check_sessions(admin: &mut Client, racers: usize) -> Result<(), CapacityError> {
    sessions_fit(racers, slots(admin)?)
}

/// Refuses `scenario` on `backend` when its racers do not fit: this process's file
/// descriptors ([`check_files`]), and on PostgreSQL, when `admin` is given, the server's free
/// connection slots ([`check_sessions`]).
///
/// Will return `Err` as those do.
pub fn check_scenario(
    scenario: &Scenario,
    backend: Backend,
    admin: Option<&mut Client>,
) -> Result<(), CapacityError> {
    let racers = scenario.racers.len();
    check_files(racers, fds_per_racer(backend, scenario.racers_as))?;
    match (backend, admin) {
        (Backend::Postgres, Some(admin)) => check_sessions(admin, racers),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: &str =
        "Limit                     Soft Limit           Hard Limit           Units     \n\
Max cpu time              unlimited            unlimited            seconds   \n\
Max open files            1024                 524288               files     \n";

    #[test]
    fn the_soft_limit_is_read_from_proc_limits() {
        assert_eq!(soft_nofile(LIMITS), Some(Some(1024)));
        let unlimited = LIMITS.replace("1024 ", "unlimited ");
        assert_eq!(soft_nofile(&unlimited), Some(None));
        assert_eq!(soft_nofile("Max cpu time unlimited"), None);
        assert_eq!(soft_nofile("Max open files lots files"), None);
    }

    #[test]
    fn racers_that_do_not_fit_the_descriptors_left_are_refused_naming_the_figures() {
        let fds = FdUse {
            limit: Some(1024),
            open: 24,
        };
        assert!(files_fit(484, 2, fds).is_ok(), "968 + 32 = 1000 fit");
        let err = files_fit(10_000, 2, fds).unwrap_err();
        assert!(matches!(
            err,
            CapacityError::FileDescriptors {
                racers: 10_000,
                needed: 20_032,
                available: 1000,
                limit: 1024,
                open: 24,
                ..
            }
        ));
        let text = err.to_string();
        assert!(text.contains("10000 racers") && text.contains("RLIMIT_NOFILE 1024"));
        let unlimited = FdUse {
            limit: None,
            open: 24,
        };
        assert!(files_fit(usize::MAX, 2, unlimited).is_ok());
        assert!(files_fit(usize::MAX, 2, fds).is_err(), "no overflow");
    }

    #[test]
    fn racers_that_do_not_fit_the_free_connection_slots_are_refused_naming_the_figures() {
        let slots = Slots {
            max_connections: 100,
            reserved: 3,
            in_use: 5,
        };
        assert!(sessions_fit(90, slots).is_ok(), "90 + 2 = 92 of 92 free");
        let err = sessions_fit(91, slots).unwrap_err();
        assert!(matches!(
            err,
            CapacityError::Sessions {
                racers: 91,
                needed: 93,
                available: 92,
                max_connections: 100,
                ..
            }
        ));
        assert!(err.to_string().contains("max_connections 100"));
        assert!(sessions_fit(usize::MAX, slots).is_err(), "no overflow");
    }
}
