//! Recycling (only while a [`Recycling`] guard lives; `verify` holds one): `DROP DATABASE`
//! forces a checkpoint on PostgreSQL 15, which costs more than the copy. A dropped migrated
//! scratch database is instead emptied (every schema dropped, `public` made anew, database
//! settings reset), migrated again and renamed to a spare name `tf_<tag>_spare_<random>`
//! ([`park`]); the next [`super::ScratchDatabase::migrated`] renames a spare to its own name
//! instead of copying. A spare stays registered with [`crate::cleanup`] (an interrupt drops
//! it) and the guard drops every spare when it ends. Sessions still connected are terminated first, as
//! `DROP DATABASE … WITH (FORCE)` would; a database whose sessions do not exit or whose reset
//! fails is dropped as before.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use postgres::{Client, Config};
use ticketflow_core::store::postgres as pg;

use super::cost::{record_drop, record_recycle};
use super::ledger;
use super::naming::{server_key, spare_name};
use super::server::{drop_scratch, gone, ServerError};

/// How many [`Recycling`] guards live: while any does, dropped migrated scratch databases
/// are kept for reuse.
static RECYCLERS: AtomicUsize = AtomicUsize::new(0);

fn recycling_on() -> bool {
    RECYCLERS.load(Ordering::SeqCst) > 0
}

/// The spare databases: emptied, migrated, without sessions, registered with cleanup.
static SPARES: Mutex<Vec<Spare>> = Mutex::new(Vec::new());

/// A spare scratch database ([`park`]).
pub(super) struct Spare {
    /// Its name now.
    pub(super) name: String,
    server: String,
    admin: Arc<Mutex<Client>>,
    config: Config,
    /// Its interrupt cleanup, cancelled when it is adopted.
    pub(super) cleanup: crate::cleanup::Registration,
}

/// While this value (or another) lives, dropped migrated scratch databases of this process are
/// kept as spares and reused (module docs); when the last one is dropped, so are the spares.
#[derive(Debug)]
#[must_use = "recycling ends, and the spares are dropped, when this value is dropped"]
pub struct Recycling(());

/// Starts recycling scratch databases ([`Recycling`]).
pub fn recycling() -> Recycling {
    RECYCLERS.fetch_add(1, Ordering::SeqCst);
    Recycling(())
}

impl Drop for Recycling {
    fn drop(&mut self) {
        // Under the spares' lock, so no database is parked between the count and the take.
        let spares: Vec<Spare> = {
            let mut spares = lock_spares();
            if RECYCLERS.fetch_sub(1, Ordering::SeqCst) > 1 {
                return;
            }
            std::mem::take(&mut *spares)
        };
        // Each DROP waits for a checkpoint; at once they share them.
        std::thread::scope(|scope| {
            for spare in spares {
                scope.spawn(move || drop_spare(spare));
            }
        });
    }
}

/// How many spares there are now.
pub fn spares() -> usize {
    lock_spares().len()
}

fn lock_spares() -> std::sync::MutexGuard<'static, Vec<Spare>> {
    SPARES.lock().unwrap_or_else(|e| e.into_inner())
}

/// Takes a spare of `server`, the most recently parked one, while recycling is on.
pub(super) fn take_spare(server: &Config) -> Option<Spare> {
    if !recycling_on() {
        return None;
    }
    let key = server_key(server);
    let mut spares = lock_spares();
    // The most recently parked first: a database dropped just now is the one reused next.
    let i = spares.iter().rposition(|s| s.server == key)?;
    Some(spares.remove(i))
}

/// Drops a spare (`DROP DATABASE … WITH (FORCE)`) and unregisters it, in a critical section.
pub(super) fn drop_spare(spare: Spare) {
    let _section = crate::cleanup::critical();
    drop_now(spare);
}

/// [`drop_spare`] inside a critical section the caller holds.
fn drop_now(spare: Spare) {
    let started = Instant::now();
    if let Err(e) = drop_scratch(&spare.admin, &spare.config, &spare.name) {
        tracing::warn!(database = %spare.name, error = %e, "could not drop a spare scratch database");
    }
    record_drop(started.elapsed());
    spare.cleanup.cancel();
}

/// Empties every schema of the database `config` points at (then [`park`] migrates it again).
/// Its commits do not wait for the WAL flush (`synchronous_commit = off`, this session only):
/// only a server crash could lose them, and spares are throwaway databases of this process.
const RESET_SQL: &str = "SET client_min_messages = warning; SET synchronous_commit = off; \
    DO $$ DECLARE s text; BEGIN \
      FOR s IN SELECT nspname FROM pg_namespace \
               WHERE nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema' LOOP \
        EXECUTE format('DROP SCHEMA %I CASCADE', s); \
      END LOOP; \
    END $$; \
    CREATE SCHEMA public AUTHORIZATION pg_database_owner; \
    GRANT USAGE ON SCHEMA public TO PUBLIC";

/// Keeps the scratch database `name` (reached with `config`, on `server`, through `admin`) as
/// a spare when recycling is on: no other session on it, reset ([`RESET_SQL`], `ALTER
/// DATABASE … RESET ALL`), migrated, renamed to a spare name and registered with cleanup.
/// Called by a [`super::ScratchDatabase`]'s drop inside its critical section; `true` when kept (the
/// caller unregisters its own cleanup), `false` when the caller must drop it.
pub(crate) fn park(
    admin: &Arc<Mutex<Client>>,
    server: &Config,
    config: &Config,
    name: &str,
) -> bool {
    if !recycling_on() {
        return false;
    }
    let started = Instant::now();
    let spare = match reset_and_rename(admin, config, name) {
        Ok(spare) => spare,
        Err(why) => {
            tracing::debug!(database = %name, %why, "not recycled; dropping it");
            return false;
        }
    };
    let (to_drop, on, through) = (spare.clone(), server.clone(), Arc::clone(admin));
    let cleanup = crate::cleanup::register(
        crate::cleanup::Kind::ScratchDatabase,
        spare.clone(),
        move || drop_scratch(&through, &on, &to_drop).is_ok(),
    );
    let spare = Spare {
        name: spare,
        server: server_key(server),
        admin: Arc::clone(admin),
        config: server.clone(),
        cleanup,
    };
    record_recycle(started.elapsed());
    let mut spares = lock_spares();
    if recycling_on() {
        spares.push(spare);
    } else {
        // Recycling ended while this one was reset: nobody will take it.
        drop(spares);
        drop_now(spare);
    }
    true
}

/// [`park`]'s work: the spare's new name, or why it cannot be kept.
fn reset_and_rename(
    admin: &Mutex<Client>,
    config: &Config,
    name: &str,
) -> Result<String, ServerError> {
    let mut admin = admin.try_lock().map_err(|_| ServerError::AdminBusy)?;
    // The admin session's own catalog changes (reset, rename) need not wait for the WAL flush:
    // they concern throwaway databases only.
    admin.batch_execute("SET synchronous_commit = off")?;
    // Sessions still connected end, as `DROP DATABASE … WITH (FORCE)` would end them.
    admin.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = $1 AND pid <> pg_backend_pid()",
        &[&name],
    )?;
    gone(&mut admin, name)?;
    {
        let mut client = pg::connect_as(config, pg::SessionRole::Admin)?;
        client.batch_execute(RESET_SQL)?;
        pg::migrate_client(&mut client)?;
        client.close()?;
    }
    let settings: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_db_role_setting s JOIN pg_database d \
             ON d.oid = s.setdatabase WHERE d.datname = $1",
            &[&name],
        )?
        .get(0);
    if settings > 0 {
        admin.batch_execute(&format!("ALTER DATABASE \"{name}\" RESET ALL"))?;
    }
    // The RENAME would wait for an exiting session in steps of 100 ms; polling is quicker.
    gone(&mut admin, name)?;
    let spare = spare_name();
    // The new name's ledger row first, the old one's after: one of them always names it.
    ledger::record(&mut admin, &spare);
    if let Err(e) = admin.batch_execute(&format!("ALTER DATABASE \"{name}\" RENAME TO \"{spare}\""))
    {
        ledger::forget(&mut admin, &spare);
        return Err(e.into());
    }
    ledger::forget(&mut admin, name);
    Ok(spare)
}
