//! The scratch ledger: which process owns each PostgreSQL scratch database, so that the
//! databases of a process that died without cleaning up (`SIGKILL`, a power cut) are found and
//! dropped later, by `ticketflow clean` or at the start of the next `verify`, `scenario run`
//! or `soak`.
//!
//! The ledger is the table [`TABLE`] in the database the admin session connects to (the
//! database the PostgreSQL URL names, `postgres` by default), created when absent:
//!
//! | column | type | what |
//! | --- | --- | --- |
//! | `database` | `text` primary key | the scratch database's name |
//! | `owner_pid` | `integer` | the owning process's id |
//! | `owner_host` | `text` | its host name (`/proc/sys/kernel/hostname`) |
//! | `owner_boot` | `text` | the kernel boot it ran in (`/proc/sys/kernel/random/boot_id`) |
//! | `owner_pidns` | `text` | its PID namespace (`/proc/self/ns/pid`) |
//! | `owner_start` | `bigint` | its start time, clock ticks after boot (`/proc/PID/stat` field 22) |
//! | `created_at` | `timestamptz` | when the row was written |
//!
//! A row is written before `CREATE DATABASE` and deleted after `DROP DATABASE`; a rename
//! writes the new name's row before and deletes the old one after, so at every instant each
//! scratch database of a live process has a row. Those writes commit without waiting for the
//! WAL flush (`synchronous_commit = off`, in their own transaction): a row written before a
//! `CREATE DATABASE` is on disk once that statement is, and a lost delete leaves only a row
//! whose database is gone, which a sweep removes.
//!
//! [`sweep`] judges each row's owner: on this host, in this boot and PID namespace, the owner
//! is alive when its pid runs and has the recorded start time (a reused pid has another);
//! a row from an earlier boot of this host has a dead owner; a row from another host or PID
//! namespace is never judged. Only rows of dead owners are acted on, and only databases named
//! in the ledger, whose names start with `tf_`, are ever dropped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use postgres::error::SqlState;
use postgres::Client;

use ticketflow_core::error::StoreError;

/// The ledger table's name, in the admin session's database.
pub const TABLE: &str = "ticketflow_scratch_ledger";

const CREATE_SQL: &str = "CREATE TABLE IF NOT EXISTS ticketflow_scratch_ledger (\
    database text PRIMARY KEY, \
    owner_pid integer NOT NULL, \
    owner_host text NOT NULL, \
    owner_boot text NOT NULL, \
    owner_pidns text NOT NULL, \
    owner_start bigint NOT NULL, \
    created_at timestamptz NOT NULL DEFAULT now())";

/// Only databases with this prefix are dropped by a sweep, whatever a ledger row says.
const SCRATCH_PREFIX: &str = "tf_";

/// A process, as the ledger identifies it across pid reuse and reboots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// Process id.
    pub pid: i32,
    /// Host name.
    pub host: String,
    /// The kernel's boot id.
    pub boot: String,
    /// The PID namespace (`pid:[INODE]`).
    pub pidns: String,
    /// Start time in clock ticks after boot.
    pub start: i64,
}

impl Owner {
    /// This process (read once).
    pub(crate) fn this_process() -> &'static Owner {
        static ME: OnceLock<Owner> = OnceLock::new();
        ME.get_or_init(|| {
            let pid = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
            Owner {
                pid,
                host: read_trimmed("/proc/sys/kernel/hostname"),
                boot: read_trimmed("/proc/sys/kernel/random/boot_id"),
                pidns: std::fs::read_link("/proc/self/ns/pid")
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
                start: start_time(pid).unwrap_or(0),
            }
        })
    }
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The start time of process `pid` (`/proc/PID/stat` field 22, clock ticks after boot), or
/// `None` when it does not run (no such process, or a zombie).
fn start_time(pid: i32) -> Option<i64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (the state); field 22 is fields[19].
    if matches!(fields.first(), Some(&"Z") | Some(&"X") | None) {
        return None;
    }
    fields.get(19)?.parse().ok()
}

/// What a sweep makes of a ledger row's owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OwnerState {
    /// It runs: its databases are in use.
    Alive,
    /// It is gone (why): its databases are orphans.
    Gone(String),
    /// It cannot be judged from here (why): another host or PID namespace.
    Unknown(String),
}

/// Judges `row` against `me` (module docs).
fn judge(row: &Owner, me: &Owner) -> OwnerState {
    if me.host.is_empty() || me.boot.is_empty() {
        return OwnerState::Unknown("this system has no /proc to check owners".into());
    }
    if row.host != me.host {
        return OwnerState::Unknown(format!("owned by host {:?}", row.host));
    }
    if row.boot != me.boot {
        return OwnerState::Gone("this host has rebooted since".into());
    }
    if row.pidns != me.pidns {
        return OwnerState::Unknown("owned by another PID namespace of this host".into());
    }
    match start_time(row.pid) {
        Some(start) if start == row.start => OwnerState::Alive,
        Some(_) => OwnerState::Gone(format!("pid {} is another process now", row.pid)),
        None => OwnerState::Gone(format!("pid {} has exited", row.pid)),
    }
}

/// Whether recording was already refused once (warned about once).
static WARNED: AtomicBool = AtomicBool::new(false);

/// Writes (or takes over) the row of `database`, owned by this process, through `admin`,
/// creating the ledger when absent. A ledger that cannot be written is warned about once and
/// otherwise ignored: the database is still created, dropped and cleaned up on an interrupt,
/// only a later sweep will not know it.
pub(crate) fn record(admin: &mut Client, database: &str) {
    let attempt = |admin: &mut Client| -> Result<(), postgres::Error> {
        let me = Owner::this_process();
        let mut tx = admin.transaction()?;
        tx.batch_execute("SET LOCAL synchronous_commit = off")?;
        tx.execute(
            "INSERT INTO ticketflow_scratch_ledger \
             (database, owner_pid, owner_host, owner_boot, owner_pidns, owner_start) \
             VALUES ($1, $2, $3, $4, $5, $6) \
             ON CONFLICT (database) DO UPDATE SET owner_pid = EXCLUDED.owner_pid, \
             owner_host = EXCLUDED.owner_host, owner_boot = EXCLUDED.owner_boot, \
             owner_pidns = EXCLUDED.owner_pidns, owner_start = EXCLUDED.owner_start, \
             created_at = now()",
            &[&database, &me.pid, &me.host, &me.boot, &me.pidns, &me.start],
        )?;
        tx.commit()
    };
    let mut result = attempt(admin);
    if matches!(&result, Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE)) {
        result = create(admin).and_then(|()| attempt(admin));
    }
    if let Err(e) = result {
        if !WARNED.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                error = %e,
                "cannot write the scratch ledger {TABLE}; a scratch database left by a killed \
                 run will not be found by `ticketflow clean`"
            );
        }
    }
}

/// Creates the ledger when absent. Two sessions creating it at once: the loser's
/// unique-violation on the catalog (SQLSTATE 23505) or duplicate-table (42P07) is no error.
fn create(admin: &mut Client) -> Result<(), postgres::Error> {
    match admin.batch_execute(CREATE_SQL) {
        Err(e)
            if e.code() == Some(&SqlState::UNIQUE_VIOLATION)
                || e.code() == Some(&SqlState::DUPLICATE_TABLE) =>
        {
            Ok(())
        }
        other => other,
    }
}

/// Deletes the row of `database` through `admin`; a missing ledger or row is no error, and a
/// failure is only logged (the row then names a database that is gone, which a sweep removes).
pub(crate) fn forget(admin: &mut Client, database: &str) {
    let attempt = |admin: &mut Client| -> Result<(), postgres::Error> {
        let mut tx = admin.transaction()?;
        tx.batch_execute("SET LOCAL synchronous_commit = off")?;
        tx.execute(
            "DELETE FROM ticketflow_scratch_ledger WHERE database = $1",
            &[&database],
        )?;
        tx.commit()
    };
    match attempt(admin) {
        Ok(()) => {}
        Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => {}
        Err(e) => tracing::debug!(%database, error = %e, "cannot delete a scratch ledger row"),
    }
}

/// A ledger row a sweep acted on, or would act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphan {
    /// The scratch database.
    pub database: String,
    /// Its owner as recorded.
    pub owner: Owner,
    /// Why the owner counts as gone.
    pub why: String,
}

impl std::fmt::Display for Orphan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (owner pid {} on {}: {})",
            self.database, self.owner.pid, self.owner.host, self.why
        )
    }
}

/// What a [`sweep`] found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sweep {
    /// Databases of dead owners: dropped, or (a dry run) to be dropped.
    pub dropped: Vec<Orphan>,
    /// Rows of dead owners whose database no longer exists: deleted (a dry run: counted).
    pub stale_rows: usize,
    /// Databases whose owner runs: left alone.
    pub live: usize,
    /// Databases left alone because their owner cannot be judged here, or whose name is not
    /// a scratch name (`tf_…`), with why.
    pub unjudged: Vec<(String, String)>,
    /// Another sweep held the ledger's lock: nothing was done.
    pub busy: bool,
}

/// The lock a sweep holds (`pg_try_advisory_lock`), so two at once do not both claim a drop.
const SWEEP_LOCK: i64 = 0x7466_5f6c_6564_6765; // "tf_ledge"

/// Drops the scratch databases in the ledger of `admin`'s database whose owner is gone
/// (`DROP DATABASE … WITH (FORCE)`) and deletes their rows; with `dry_run`, only says which.
/// A database not in the ledger, or whose name does not start with `tf_`, is never dropped;
/// a row of a live owner, or of an owner on another host, is left as is. No ledger: nothing
/// to do. `each` is called with every database dropped (or, with `dry_run`, to be dropped)
/// as soon as it is, so a caller can say so while a slow drop (a checkpoint) follows; the
/// same ones are in [`Sweep::dropped`].
///
/// Will return `Err` if the ledger cannot be read, or a `DROP DATABASE` fails (the drops
/// before it stand).
pub fn sweep(
    admin: &mut Client,
    dry_run: bool,
    mut each: impl FnMut(&Orphan),
) -> Result<Sweep, StoreError> {
    let sql = |what: &'static str| move |e| ticketflow_core::store::postgres::classify(what, e);
    let mut report = Sweep::default();
    let exists: bool = admin
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&TABLE])
        .map_err(sql("find the scratch ledger"))?
        .get(0);
    if !exists {
        return Ok(report);
    }
    if !dry_run {
        let locked: bool = admin
            .query_one("SELECT pg_try_advisory_lock($1)", &[&SWEEP_LOCK])
            .map_err(sql("lock the scratch ledger"))?
            .get(0);
        if !locked {
            report.busy = true;
            return Ok(report);
        }
    }
    let result = sweep_locked(admin, dry_run, &mut report, &mut each);
    if !dry_run {
        let _ = admin.execute("SELECT pg_advisory_unlock($1)", &[&SWEEP_LOCK]);
    }
    result.map(|()| report)
}

fn sweep_locked(
    admin: &mut Client,
    dry_run: bool,
    report: &mut Sweep,
    each: &mut dyn FnMut(&Orphan),
) -> Result<(), StoreError> {
    let sql = |what: &'static str| move |e| ticketflow_core::store::postgres::classify(what, e);
    let rows = admin
        .query(
            "SELECT l.database, l.owner_pid, l.owner_host, l.owner_boot, l.owner_pidns, \
             l.owner_start, EXISTS (SELECT 1 FROM pg_database d WHERE d.datname = l.database) \
             FROM ticketflow_scratch_ledger l ORDER BY l.created_at, l.database",
            &[],
        )
        .map_err(sql("read the scratch ledger"))?;
    let me = Owner::this_process();
    for row in rows {
        let database: String = row.get(0);
        let owner = Owner {
            pid: row.get(1),
            host: row.get(2),
            boot: row.get(3),
            pidns: row.get(4),
            start: row.get(5),
        };
        let present: bool = row.get(6);
        let why = match judge(&owner, me) {
            OwnerState::Alive => {
                report.live += 1;
                continue;
            }
            OwnerState::Unknown(why) => {
                report.unjudged.push((database, why));
                continue;
            }
            OwnerState::Gone(why) => why,
        };
        if !present {
            report.stale_rows += 1;
            if !dry_run {
                forget(admin, &database);
            }
            continue;
        }
        if !database.starts_with(SCRATCH_PREFIX) {
            report
                .unjudged
                .push((database, format!("not a scratch name ({SCRATCH_PREFIX}…)")));
            continue;
        }
        if !dry_run {
            let quoted = database.replace('"', "\"\"");
            admin
                .batch_execute(&format!(
                    "DROP DATABASE IF EXISTS \"{quoted}\" WITH (FORCE)"
                ))
                .map_err(sql("drop an orphaned scratch database"))?;
            forget(admin, &database);
        }
        let orphan = Orphan {
            database,
            owner,
            why,
        };
        each(&orphan);
        report.dropped.push(orphan);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_changed_start_time_or_boot_is_gone() {
        let me = Owner::this_process().clone();
        if me.host.is_empty() {
            return; // no /proc here
        }
        assert_eq!(judge(&me, &me), OwnerState::Alive);
        let reused = Owner {
            start: me.start + 1,
            ..me.clone()
        };
        assert!(matches!(judge(&reused, &me), OwnerState::Gone(_)));
        let rebooted = Owner {
            boot: "another".into(),
            ..me.clone()
        };
        assert!(matches!(judge(&rebooted, &me), OwnerState::Gone(_)));
        let elsewhere = Owner {
            host: format!("{}-other", me.host),
            ..me.clone()
        };
        assert!(matches!(judge(&elsewhere, &me), OwnerState::Unknown(_)));
        let exited = Owner {
            pid: i32::MAX,
            ..me.clone()
        };
        assert!(matches!(judge(&exited, &me), OwnerState::Gone(_)));
    }
}
