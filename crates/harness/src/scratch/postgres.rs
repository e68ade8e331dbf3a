//! The PostgreSQL door: [`ScratchDatabase`], a database of its own on a server, created (a
//! copy of the migrated template, or a recycled spare), recorded in the scratch ledger and
//! dropped on drop and by the interrupt handler.
//!
//! ## The migrated template
//!
//! `CREATE DATABASE` copies `template1` and the first session then applies the migrations:
//! about a dozen statements and two commits, each waiting for a WAL flush. Copying a database
//! that is already migrated (`CREATE DATABASE … TEMPLATE`, PostgreSQL's default `WAL_LOG`
//! strategy on 15) costs one copy and no migration; `STRATEGY FILE_COPY` was measured slower on
//! the development machine (two checkpoints per copy; docs/postgres.md, "Scratch databases").
//!
//! The template is `tf_template_<hash>`, the hash over every PostgreSQL migration's version
//! and checksum ([`template_name`]): a changed migration names a new template, and the copy
//! still carries the `schema_migrations` ledger, which every session checks on connect. It is
//! built once per server under a scratch name (registered with [`crate::cleanup`], so an
//! interrupt drops a half-built one), migrated, then renamed to its final name, which is kept
//! on the server for later runs. Two processes building it at once are harmless: the second
//! rename fails and that process drops its copy.
//!
//! PostgreSQL refuses to copy a database that has sessions; nothing of ours connects to the
//! template once it is renamed. When a copy fails anyway (someone connected to it, or dropped
//! it), [`ScratchDatabase::migrated`] falls back to an empty database, which the first session
//! migrates as before.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use postgres::error::SqlState;
use postgres::{Client, Config};
use ticketflow_core::error::StoreError;
use ticketflow_core::store::postgres::{self as pg, map_err, watch_pg, SessionRole};
use ticketflow_core::store::StoreResult;

use super::cost::{record_create, record_drop};
use super::ledger;
use super::naming::{fresh_name, server_key, template_name};
use super::recycle::{drop_spare, park, take_spare};
use super::server::drop_scratch;

/// A `CREATE DATABASE` or rename that failed, with the admin connection for another try.
type Refused = Box<(StoreError, Client)>;

/// A scratch database: created on a server, dropped (`DROP DATABASE … WITH (FORCE)`) when
/// this value is dropped, also after a failure, and by the [`crate::cleanup`] registry on an
/// interrupt. Its name is `tf_<label>_<random>` (with [`super::SCRATCH_TAG_VAR`] set,
/// `tf_<tag>_<label>_<random>`). The `CREATE` and the registration, and the `DROP` and the
/// unregistration, each run in one [`crate::cleanup::critical`] section, so an interrupt
/// never falls between them. A process killed with SIGKILL cannot clean up; its databases
/// stay in the scratch ledger ([`super::ledger`]), which `ticketflow clean` and the next run
/// sweep.
pub struct ScratchDatabase {
    admin: Arc<Mutex<Client>>,
    name: String,
    config: Config,
    server: Config,
    cleanup: crate::cleanup::Registration,
    /// Renamed and kept ([`ScratchDatabase::keep_as`]): not dropped.
    kept: bool,
    /// A migrated copy: when dropped, [`park`] may keep it for reuse.
    recyclable: bool,
}

impl std::fmt::Debug for ScratchDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScratchDatabase")
            .field("name", &self.name)
            .finish()
    }
}

impl ScratchDatabase {
    /// Creates a scratch database through `admin` (a connection to `server`, any database).
    /// `label` goes into the name (sanitized, at most 32 characters).
    ///
    /// Will return `Err` if `CREATE DATABASE` fails (for example missing privileges). Never
    /// returns once the process was interrupted ([`crate::cleanup::critical`]).
    pub fn create(admin: Client, server: &Config, label: &str) -> StoreResult<Self> {
        Self::create_from(admin, server, label, None).map_err(|r| r.0)
    }

    /// [`ScratchDatabase::create`] as a copy of the database `template` (`CREATE DATABASE …
    /// TEMPLATE`; `None`: the server's default, `template1`). The time it takes is added to
    /// [`super::scratch_cost`].
    ///
    /// Will return `Err` with the admin connection, for another try, if `CREATE DATABASE`
    /// fails (missing privileges, a template with sessions, a missing template). Never
    /// returns once the process was interrupted ([`crate::cleanup::critical`]).
    fn create_from(
        mut admin: Client,
        server: &Config,
        label: &str,
        template: Option<&str>,
    ) -> Result<Self, Refused> {
        let name = fresh_name(label);
        let copy_of = template
            .map(|t| format!(" TEMPLATE \"{t}\""))
            .unwrap_or_default();
        // An interrupt now waits until the database is created and its cleanup registered.
        let _section = crate::cleanup::critical();
        let started = std::time::Instant::now();
        // In the ledger before it exists: a SIGKILL from now on leaves a row naming it.
        ledger::record(&mut admin, &name);
        let peer = ticketflow_core::deadline::Peer::of(server);
        let created = watch_pg(
            "create scratch database",
            &peer,
            SessionRole::Admin.hard_deadline_for(server),
            || admin.batch_execute(&format!("CREATE DATABASE \"{name}\"{copy_of}")),
        );
        if let Err(e) = created {
            ledger::forget(&mut admin, &name);
            return Err(Box::new((e, admin)));
        }
        record_create(started.elapsed());
        Ok(Self::registered(admin, server, name, template.is_some()))
    }

    /// The value for the database `name` that now exists on `server`, its interrupt cleanup
    /// (a drop through `admin`, else a new connection) registered. Called inside the critical
    /// section that made it.
    fn registered(admin: Client, server: &Config, name: String, recyclable: bool) -> Self {
        let admin = Arc::new(Mutex::new(admin));
        let (to_drop, on, through) = (name.clone(), server.clone(), Arc::clone(&admin));
        let cleanup = crate::cleanup::register(
            crate::cleanup::Kind::ScratchDatabase,
            name.clone(),
            move || drop_scratch(&through, &on, &to_drop).is_ok(),
        );
        let mut config = server.clone();
        config.dbname(&name);
        ScratchDatabase {
            admin,
            name,
            config,
            server: server.clone(),
            cleanup,
            kept: false,
            recyclable,
        }
    }

    /// A scratch database named as [`ScratchDatabase::create`] names one, made by renaming the
    /// existing database `spare` (migrated and without sessions; the recycling's
    /// spares). The caller unregisters the spare's own cleanup on success.
    ///
    /// Will return `Err` with the admin connection if `ALTER DATABASE … RENAME` fails. Never
    /// returns once the process was interrupted.
    fn adopt(
        mut admin: Client,
        server: &Config,
        label: &str,
        spare: &str,
    ) -> Result<Self, Refused> {
        let name = fresh_name(label);
        let _section = crate::cleanup::critical();
        // The new name's ledger row first, the old one's after: one of them always names it.
        ledger::record(&mut admin, &name);
        // A catalog change of a throwaway database: its commit need not wait for the WAL flush.
        if let Err(e) = admin.batch_execute(&format!(
            "SET synchronous_commit = off; ALTER DATABASE \"{spare}\" RENAME TO \"{name}\""
        )) {
            ledger::forget(&mut admin, &name);
            return Err(Box::new((
                map_err("rename spare scratch database")(e),
                admin,
            )));
        }
        ledger::forget(&mut admin, spare);
        Ok(Self::registered(admin, server, name, true))
    }

    /// The door every runner takes: a migrated scratch database with `label` in its name (as
    /// [`ScratchDatabase::create`]) through `admin` (a connection to `server`, any database).
    /// It is a spare renamed, while recycling is on ([`super::recycling`]), or else a copy of
    /// the migrated template, built on the server first if it is not there (module docs); an
    /// empty one, which the first session migrates, when the template cannot be made or copied.
    ///
    /// Will return `Err` if the server cannot be reached or `CREATE DATABASE` of the empty
    /// database fails. Never returns once the process was interrupted.
    pub fn migrated(mut admin: Client, server: &Config, label: &str) -> StoreResult<Self> {
        if let Some(spare) = take_spare(server) {
            match ScratchDatabase::adopt(admin, server, label, &spare.name) {
                Ok(db) => {
                    spare.cleanup.cancel();
                    return Ok(db);
                }
                Err(refused) => {
                    let (e, a) = *refused;
                    tracing::warn!(spare = %spare.name, error = %e, "cannot reuse a spare scratch database");
                    admin = a;
                    drop_spare(spare);
                }
            }
        }
        let template = match ensure_template(&mut admin, server) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "no template database; creating an empty scratch database");
                return ScratchDatabase::create(admin, server, label);
            }
        };
        match ScratchDatabase::create_from(admin, server, label, Some(&template)) {
            Ok(db) => Ok(db),
            Err(refused) => {
                let (e, admin) = *refused;
                tracing::warn!(template = %template, error = %e, "cannot copy the template; creating an empty scratch database");
                if e.code.as_deref() == Some(SqlState::INVALID_CATALOG_NAME.code()) {
                    forget(server);
                }
                ScratchDatabase::create(admin, server, label)
            }
        }
    }

    /// Renames the database to `new_name` and keeps it on the server: it is no longer dropped,
    /// by this value or an interrupt (how this module keeps the migrated template it built).
    /// Every session to it must be closed. On failure it is dropped as usual.
    ///
    /// Will return `Err` if `ALTER DATABASE … RENAME` fails (`new_name` exists: SQLSTATE
    /// 42P04).
    pub(crate) fn keep_as(mut self, new_name: &str) -> StoreResult<()> {
        let _section = crate::cleanup::critical();
        let mut admin = self.admin.lock().unwrap_or_else(|e| e.into_inner());
        let renamed = admin
            .batch_execute(&format!(
                "ALTER DATABASE \"{}\" RENAME TO \"{new_name}\"",
                self.name
            ))
            .map_err(map_err("rename scratch database"));
        if renamed.is_ok() {
            // Kept on purpose: no longer a scratch database of this process.
            ledger::forget(&mut admin, &self.name);
        }
        drop(admin);
        if renamed.is_ok() {
            self.kept = true;
            self.cleanup.cancel();
        }
        renamed
    }

    /// The database name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Connection config pointing at the scratch database.
    pub fn config(&self) -> &Config {
        &self.config
    }
}

impl Drop for ScratchDatabase {
    fn drop(&mut self) {
        // Drop first, unregister after: an interrupt in between finds the cleanup still
        // registered (and waits for this section to end before running it). Once the process
        // was interrupted this never returns, and the handler drops the database.
        if self.kept {
            return;
        }
        let _section = crate::cleanup::critical();
        // Emptied and kept for the next run instead, when `verify` recycles.
        if self.recyclable && park(&self.admin, &self.server, &self.config, &self.name) {
            self.cleanup.cancel();
            return;
        }
        let started = std::time::Instant::now();
        if let Err(e) = drop_scratch(&self.admin, &self.server, &self.name) {
            tracing::warn!(database = %self.name, error = %e, "could not drop scratch database");
        }
        record_drop(started.elapsed());
        self.cleanup.cancel();
    }
}

/// The servers whose template this process has checked or built (key: [`server_key`]).
/// Holding the lock while building makes the threads of one process build it once.
static READY: Mutex<Option<HashMap<String, String>>> = Mutex::new(None);

/// The migrated template on the server `server`, built if it is not there yet; `admin` is a
/// connection to that server (any database). Checked once per server and process.
///
/// Will return `Err` if the server cannot be queried, or building the template fails
/// (`CREATE DATABASE`, a migration, the rename).
fn ensure_template(admin: &mut Client, server: &Config) -> StoreResult<String> {
    let key = server_key(server);
    let mut ready = READY.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(name) = ready.as_ref().and_then(|m| m.get(&key)) {
        return Ok(name.clone());
    }
    let name = template_name();
    let exists = admin
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name])
        .map_err(|e| pg::classify("find template database", e))?
        .is_some();
    if !exists {
        build(server, &name)?;
    }
    ready
        .get_or_insert_with(HashMap::new)
        .insert(key, name.clone());
    Ok(name)
}

/// Forgets the template of `server`, so the next [`ensure_template`] looks for it again
/// (after a copy found it missing).
fn forget(server: &Config) {
    let mut ready = READY.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(m) = ready.as_mut() {
        m.remove(&server_key(server));
    }
}

/// Builds the template: a scratch database, migrated, its session closed, renamed to `name`.
/// Another process's rename first is no error (its template is the same).
fn build(server: &Config, name: &str) -> StoreResult<()> {
    let build = ScratchDatabase::create(
        pg::connect_as(server, pg::SessionRole::Admin)?,
        server,
        "template",
    )?;
    {
        let mut client = pg::connect_as(build.config(), pg::SessionRole::Admin)?;
        pg::migrate_client(&mut client)?;
    }
    match build.keep_as(name) {
        Ok(()) => Ok(()),
        // Another process renamed its copy first; ours was dropped.
        Err(e) if e.code.as_deref() == Some(SqlState::DUPLICATE_DATABASE.code()) => Ok(()),
        Err(e) => Err(e),
    }
}
