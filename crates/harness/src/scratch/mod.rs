//! Throwaway databases: one type for every run that needs a database of its own and must not
//! leave it behind (property suites, faults, the kill matrix, the bench, the tests).
//!
//! A [`ScratchDb`] is either a SQLite file in a new [`ScratchDir`] (both removed on drop and
//! by the interrupt handler) or a PostgreSQL [`ScratchDatabase`] (`tf_<label>_<random>`,
//! dropped on drop and by the interrupt handler). Both are migrated when created. It opens sessions (as
//! `Box<dyn Store>` or typed), runs direct SQL on connections of its own (the harness's ground
//! truth: counts, dumps, fault injection), and gives its URL.

//!
//! ## The migrated template, and recycling
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
//! **Recycling** (only while a [`Recycling`] guard lives; `verify` holds one): `DROP DATABASE`
//! forces a checkpoint on PostgreSQL 15, which costs more than the copy. A dropped migrated
//! scratch database is instead emptied (every schema dropped, `public` made anew, database
//! settings reset), migrated again and renamed to a spare name `tf_<tag>_spare_<random>`
//! (`park`); the next [`create_migrated`] renames a spare to its own name instead of copying.
//! A spare stays registered with [`crate::cleanup`] (an interrupt drops it) and the guard drops
//! every spare when it ends. Sessions still connected are terminated first, as `DROP DATABASE
//! … WITH (FORCE)` would; a database whose sessions do not exit or whose reset fails is
//! dropped as before.
//!
//! PostgreSQL refuses to copy a database that has sessions; nothing of ours connects to the
//! template once it is renamed. When a copy fails anyway (someone connected to it, or dropped
//! it), [`create_migrated`] falls back to an empty database, which the first session
//! migrates as before.
pub mod ledger;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use std::time::Instant;

use postgres::error::SqlState;
use postgres::{Client, Config};

use crate::cleanup::Registration;

use ticketflow_core::error::StoreError;
use ticketflow_core::store::migrate::{self, Migration};
use ticketflow_core::store::postgres::{
    self as pg, connect_as, map_err, watch_pg, IsolationLevel, PgStore, SessionRole,
};
use ticketflow_core::store::sqlite::{self as lite, SqliteConfig, SqliteStore};
use ticketflow_core::store::url::{url_with_db, NotAUrl, PgServer};
use ticketflow_core::store::{Backend, Dump, RowCounts, Store, StoreResult};
use uuid::Uuid;

/// What this process's PostgreSQL scratch databases cost so far: how many `CREATE DATABASE`
/// and `DROP DATABASE` statements of [`ScratchDatabase`]s ran, and the time they took in all
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
    /// (`verify`'s recycling, [`Recycling`]).
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
pub(crate) fn record_create(took: Duration) {
    CREATES.fetch_add(1, Ordering::Relaxed);
    CREATE_US.fetch_add(micros(took), Ordering::Relaxed);
}

/// Counts one `DROP DATABASE` that took `took`.
pub(crate) fn record_drop(took: Duration) {
    DROPS.fetch_add(1, Ordering::Relaxed);
    DROP_US.fetch_add(micros(took), Ordering::Relaxed);
}

/// Counts one scratch database emptied and kept for reuse, which took `took`.
pub(crate) fn record_recycle(took: Duration) {
    RECYCLED.fetch_add(1, Ordering::Relaxed);
    RECYCLE_US.fetch_add(micros(took), Ordering::Relaxed);
}

/// Why a scratch database could not be created or used.
#[derive(Debug, thiserror::Error)]
pub enum ScratchError {
    /// The temporary directory for a SQLite file could not be created.
    #[error("create a temporary directory: {0}")]
    TempDir(#[source] std::io::Error),
    /// The PostgreSQL server did not answer (or refused the login).
    #[error("PostgreSQL unreachable: {0}")]
    Unreachable(#[source] StoreError),
    /// A database operation failed: the URL, `CREATE DATABASE`, a migration, a session, SQL.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A typed session of one backend was asked of a database on another.
    #[error("the scratch database is on {have}, not {want}")]
    WrongBackend {
        /// The backend asked for.
        want: Backend,
        /// The backend the database is on.
        have: Backend,
    },
    /// There are no scratch databases on this backend (the memory store).
    #[error("no scratch database on {0}")]
    Unsupported(Backend),
    /// The server URL cannot be pointed at the scratch database.
    #[error(transparent)]
    Url(#[from] NotAUrl),
}

/// A new temporary directory, removed when dropped and by the interrupt handler
/// ([`crate::cleanup`]; `tempfile`'s own removal runs only on drop, which an exiting process
/// skips): for a scratch SQLite file, scripts, logs.
pub struct ScratchDir {
    dir: Option<tempfile::TempDir>,
    cleanup: Registration,
}

impl std::fmt::Debug for ScratchDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScratchDir")
            .field("path", &self.path())
            .finish()
    }
}

impl ScratchDir {
    /// Creates it in the system's temporary directory (`TMPDIR`). Never returns once the
    /// process was interrupted ([`crate::cleanup::critical`]).
    ///
    /// Will return `Err` if the directory cannot be created.
    pub fn new() -> std::io::Result<Self> {
        let _section = crate::cleanup::critical();
        let dir = tempfile::tempdir()?;
        let path = dir.path().to_path_buf();
        let cleanup = crate::cleanup::register(
            crate::cleanup::Kind::ScratchDirectory,
            path.display().to_string(),
            move || remove_dir_settled(&path),
        );
        Ok(ScratchDir {
            dir: Some(dir),
            cleanup,
        })
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        self.dir.as_ref().map_or(Path::new(""), |d| d.path())
    }
}

/// Removes `path` and everything in it for the interrupt handler, retrying briefly (at most
/// about 100 ms): a racer thread still running may create a file (an SQLite `-wal` or
/// `-journal`) between the listing and the final `rmdir`; once the directory is gone, none
/// can be created in it. `true` when it is gone.
fn remove_dir_settled(path: &Path) -> bool {
    for _ in 0..50 {
        match std::fs::remove_dir_all(path) {
            Ok(()) => return true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return true,
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(2)),
        }
    }
    !path.exists()
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        // Removed first, unregistered after, in one section (as a scratch database).
        let _section = crate::cleanup::critical();
        drop(self.dir.take());
        self.cleanup.cancel();
    }
}

/// A throwaway database, migrated, removed when dropped (module docs).
pub struct ScratchDb {
    kind: Kind,
}

enum Kind {
    Sqlite {
        // Removed with the file when the value is dropped.
        _dir: ScratchDir,
        path: PathBuf,
    },
    Postgres {
        scratch: Box<ScratchDatabase>,
        server_url: String,
    },
}

impl std::fmt::Debug for ScratchDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Sqlite { path, .. } => f.debug_struct("ScratchDb").field("sqlite", path).finish(),
            Kind::Postgres { scratch, .. } => f
                .debug_struct("ScratchDb")
                .field("postgres", &scratch.name())
                .finish(),
        }
    }
}

impl ScratchDb {
    /// A scratch database on `backend`: SQLite, or PostgreSQL on the server `pg` (used only
    /// then) with `label` in its name.
    ///
    /// Will return `Err` as [`ScratchDb::sqlite`] and [`ScratchDb::postgres`] do, and for
    /// [`Backend::Memory`].
    pub fn create(backend: Backend, pg: &PgServer, label: &str) -> Result<Self, ScratchError> {
        match backend {
            Backend::Sqlite => ScratchDb::sqlite(),
            Backend::Postgres => ScratchDb::postgres(pg, label),
            Backend::Memory => Err(ScratchError::Unsupported(backend)),
        }
    }

    /// A migrated SQLite file (`scratch.db`) in a new temporary directory.
    ///
    /// Will return `Err` if the directory cannot be created or the migrations fail.
    pub fn sqlite() -> Result<Self, ScratchError> {
        let dir = ScratchDir::new().map_err(ScratchError::TempDir)?;
        let path = dir.path().join("scratch.db");
        drop(SqliteStore::open(&path)?);
        Ok(ScratchDb {
            kind: Kind::Sqlite { _dir: dir, path },
        })
    }

    /// A migrated scratch database `tf_<label>_<random>` on the PostgreSQL server `server`
    /// (its URL names any database on it), a copy of the migrated template
    /// ([`create_migrated`]).
    ///
    /// Will return `Err` if the server cannot be reached ([`ScratchError::Unreachable`]),
    /// `CREATE DATABASE` fails or the migrations fail.
    pub fn postgres(server: &PgServer, label: &str) -> Result<Self, ScratchError> {
        let admin = pg::connect_as(server.config(), pg::SessionRole::Admin)
            .map_err(ScratchError::Unreachable)?;
        let scratch = create_migrated(admin, server.config(), label)?;
        // Migrate once, before any session of the caller's connects.
        drop(PgStore::connect(
            scratch.config(),
            IsolationLevel::ReadCommitted,
        )?);
        Ok(ScratchDb {
            kind: Kind::Postgres {
                scratch: Box::new(scratch),
                server_url: server.url().to_string(),
            },
        })
    }

    /// The backend it is on.
    pub fn backend(&self) -> Backend {
        match self.kind {
            Kind::Sqlite { .. } => Backend::Sqlite,
            Kind::Postgres { .. } => Backend::Postgres,
        }
    }

    /// Its URL: the SQLite file's path, or the server URL pointed at the scratch database
    /// (user, password, host and query kept; see [`ticketflow_core::store::url::redact`] before
    /// printing it).
    ///
    /// Will return `Err` when the PostgreSQL server was given as a key=value string.
    pub fn url(&self) -> Result<String, ScratchError> {
        match &self.kind {
            Kind::Sqlite { path, .. } => Ok(path.display().to_string()),
            Kind::Postgres {
                scratch,
                server_url,
            } => Ok(url_with_db(server_url, scratch.name())?),
        }
    }

    /// The SQLite file, on SQLite.
    pub fn sqlite_path(&self) -> Option<&Path> {
        match &self.kind {
            Kind::Sqlite { path, .. } => Some(path),
            Kind::Postgres { .. } => None,
        }
    }

    /// The PostgreSQL scratch database (its name and connection config), on PostgreSQL.
    pub fn pg(&self) -> Option<&ScratchDatabase> {
        match &self.kind {
            Kind::Postgres { scratch, .. } => Some(scratch),
            Kind::Sqlite { .. } => None,
        }
    }

    /// The connection config of the PostgreSQL scratch database, on PostgreSQL.
    pub fn pg_config(&self) -> Option<&Config> {
        self.pg().map(ScratchDatabase::config)
    }

    /// A new session with the default settings: SQLite [`SqliteConfig::default`], PostgreSQL
    /// READ COMMITTED.
    ///
    /// Will return `Err` if the database cannot be opened or reached.
    pub fn open(&self) -> Result<Box<dyn Store + Send>, ScratchError> {
        Ok(match &self.kind {
            Kind::Sqlite { path, .. } => Box::new(SqliteStore::open(path)?),
            Kind::Postgres { scratch, .. } => Box::new(PgStore::connect(
                scratch.config(),
                IsolationLevel::ReadCommitted,
            )?),
        })
    }

    /// A new SQLite session with `config`.
    ///
    /// Will return `Err` on PostgreSQL ([`ScratchError::WrongBackend`]) or if the file cannot
    /// be opened.
    pub fn open_sqlite(&self, config: &SqliteConfig) -> Result<SqliteStore, ScratchError> {
        match &self.kind {
            Kind::Sqlite { path, .. } => Ok(SqliteStore::open_with(path, config)?),
            Kind::Postgres { .. } => Err(self.wrong(Backend::Sqlite)),
        }
    }

    /// A new PostgreSQL session at `isolation`.
    ///
    /// Will return `Err` on SQLite ([`ScratchError::WrongBackend`]) or if the server cannot be
    /// reached.
    pub fn open_postgres(&self, isolation: IsolationLevel) -> Result<PgStore, ScratchError> {
        match &self.kind {
            Kind::Postgres { scratch, .. } => Ok(PgStore::connect(scratch.config(), isolation)?),
            Kind::Sqlite { .. } => Err(self.wrong(Backend::Postgres)),
        }
    }

    /// A new bare PostgreSQL connection (no session settings, no prepared statements).
    ///
    /// Will return `Err` on SQLite ([`ScratchError::WrongBackend`]) or if the server cannot be
    /// reached.
    pub fn connect_postgres(&self) -> Result<Client, ScratchError> {
        match &self.kind {
            Kind::Postgres { scratch, .. } => {
                Ok(pg::connect_as(scratch.config(), pg::SessionRole::Admin)?)
            }
            Kind::Sqlite { .. } => Err(self.wrong(Backend::Postgres)),
        }
    }

    fn wrong(&self, want: Backend) -> ScratchError {
        ScratchError::WrongBackend {
            want,
            have: self.backend(),
        }
    }

    /// Runs SQL statements (set-up, fault injection) on a new bare connection.
    ///
    /// Will return `Err` for a database error.
    pub fn execute(&self, sql: &str) -> Result<(), ScratchError> {
        match &self.kind {
            Kind::Sqlite { path, .. } => raw_sqlite(path)?
                .execute_batch(sql)
                .map_err(|e| lite::classify("execute", e).into()),
            Kind::Postgres { scratch, .. } => {
                pg::connect_as(scratch.config(), pg::SessionRole::Admin)?
                    .batch_execute(sql)
                    .map_err(|e| pg::classify("execute", e).into())
            }
        }
    }

    /// Runs a query returning one `i64` (a count) on a new bare connection.
    ///
    /// Will return `Err` for a database error or a query that returns no row.
    pub fn scalar(&self, sql: &str) -> Result<i64, ScratchError> {
        match &self.kind {
            Kind::Sqlite { path, .. } => raw_sqlite(path)?
                .query_row(sql, [], |r| r.get(0))
                .map_err(|e| lite::classify("scalar", e).into()),
            Kind::Postgres { scratch, .. } => {
                pg::connect_as(scratch.config(), pg::SessionRole::Admin)?
                    .query_one(sql, &[])
                    .and_then(|row| row.try_get(0))
                    .map_err(|e| pg::classify("scalar", e).into())
            }
        }
    }

    /// Row counts of a tenant, by direct SQL on a new connection.
    ///
    /// Will return `Err` for a database error.
    pub fn row_counts(&self, tenant_id: &str) -> Result<RowCounts, ScratchError> {
        Ok(match &self.kind {
            Kind::Sqlite { path, .. } => SqliteStore::open(path)?.row_counts(tenant_id)?,
            Kind::Postgres { scratch, .. } => pg::row_counts(
                &mut pg::connect_as(scratch.config(), pg::SessionRole::Monitor)?,
                tenant_id,
            )?,
        })
    }

    /// Every row of the tenants whose id starts with `prefix`, by direct SQL on a new
    /// connection.
    ///
    /// Will return `Err` for a database error.
    pub fn dump(&self, prefix: &str) -> Result<Dump, ScratchError> {
        Ok(match &self.kind {
            Kind::Sqlite { path, .. } => SqliteStore::open(path)?.dump(prefix)?,
            Kind::Postgres { scratch, .. } => pg::dump(
                &mut pg::connect_as(scratch.config(), pg::SessionRole::Monitor)?,
                prefix,
            )?,
        })
    }
}

/// A bare rusqlite connection: none of the store's pragmas, so direct SQL sees the file as
/// any SQLite client would.
fn raw_sqlite(path: &Path) -> Result<rusqlite::Connection, StoreError> {
    rusqlite::Connection::open(path).map_err(|e| lite::classify("open", e))
}

/// The prefix of every template's name: `tf_template_<hash>`.
pub const TEMPLATE_PREFIX: &str = "tf_template_";

/// The template's name for this build's PostgreSQL migrations ([`migrate::POSTGRES`]):
/// [`template_name_for`] them.
pub fn template_name() -> String {
    template_name_for(migrate::POSTGRES)
}

/// The template's name for `migrations`: [`TEMPLATE_PREFIX`] and the first 16 hex digits of
/// the SHA-256 of each migration's `version:checksum` line (32 bytes, within PostgreSQL's 63).
pub fn template_name_for(migrations: &[Migration]) -> String {
    let lines: String = migrations
        .iter()
        .map(|m| format!("{}:{}\n", m.version, m.checksum()))
        .collect();
    let hash = ticketflow_core::fingerprint::sha256_hex(lines.as_bytes());
    format!("{TEMPLATE_PREFIX}{}", &hash[..16])
}

/// The servers whose template this process has checked or built (key: [`server_key`]).
/// Holding the lock while building makes the threads of one process build it once.
static READY: Mutex<Option<HashMap<String, String>>> = Mutex::new(None);

/// What identifies a server here: hosts, ports and user.
fn server_key(server: &Config) -> String {
    format!(
        "{:?}|{:?}|{:?}",
        server.get_hosts(),
        server.get_ports(),
        server.get_user()
    )
}

/// The migrated template on the server `server`, built if it is not there yet; `admin` is a
/// connection to that server (any database). Checked once per server and process.
///
/// Will return `Err` if the server cannot be queried, or building the template fails
/// (`CREATE DATABASE`, a migration, the rename).
pub fn ensure_template(admin: &mut Client, server: &Config) -> StoreResult<String> {
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

/// Forgets the template of `server`, so the next [`ensure_template`] looks for it again (after a copy
/// found it missing).
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

/// A migrated scratch database with `label` in its name (as [`ScratchDatabase::create`]),
/// copied from the template ([`ensure_template`]); an empty one, which the first session migrates,
/// when the template cannot be made or copied.
///
/// Will return `Err` if the server cannot be reached or `CREATE DATABASE` of the empty
/// database fails. Never returns once the process was interrupted.
pub fn create_migrated(
    mut admin: Client,
    server: &Config,
    label: &str,
) -> StoreResult<ScratchDatabase> {
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

/// How many [`Recycling`] guards live: while any does, dropped migrated scratch databases
/// are kept for reuse.
static RECYCLERS: AtomicUsize = AtomicUsize::new(0);

fn recycling_on() -> bool {
    RECYCLERS.load(Ordering::SeqCst) > 0
}

/// The spare databases: emptied, migrated, without sessions, registered with cleanup.
static SPARES: Mutex<Vec<Spare>> = Mutex::new(Vec::new());

/// A spare scratch database ([`park`]).
struct Spare {
    name: String,
    server: String,
    admin: Arc<Mutex<Client>>,
    config: Config,
    cleanup: crate::cleanup::Registration,
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
fn take_spare(server: &Config) -> Option<Spare> {
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
fn drop_spare(spare: Spare) {
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
/// Called by a [`ScratchDatabase`]'s drop inside its critical section; `true` when kept (the
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
fn reset_and_rename(admin: &Mutex<Client>, config: &Config, name: &str) -> Result<String, String> {
    let mut admin = admin
        .try_lock()
        .map_err(|_| "admin session busy".to_string())?;
    // The admin session's own catalog changes (reset, rename) need not wait for the WAL flush:
    // they concern throwaway databases only.
    admin
        .batch_execute("SET synchronous_commit = off")
        .map_err(|e| e.to_string())?;
    // Sessions still connected end, as `DROP DATABASE … WITH (FORCE)` would end them.
    admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = $1 AND pid <> pg_backend_pid()",
            &[&name],
        )
        .map_err(|e| e.to_string())?;
    gone(&mut admin, name)?;
    {
        let mut client =
            pg::connect_as(config, pg::SessionRole::Admin).map_err(|e| e.to_string())?;
        client.batch_execute(RESET_SQL).map_err(|e| e.to_string())?;
        pg::migrate_client(&mut client).map_err(|e| e.to_string())?;
        client.close().map_err(|e| e.to_string())?;
    }
    let settings: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_db_role_setting s JOIN pg_database d \
             ON d.oid = s.setdatabase WHERE d.datname = $1",
            &[&name],
        )
        .map_err(|e| e.to_string())?
        .get(0);
    if settings > 0 {
        admin
            .batch_execute(&format!("ALTER DATABASE \"{name}\" RESET ALL"))
            .map_err(|e| e.to_string())?;
    }
    // The RENAME would wait for an exiting session in steps of 100 ms; polling is quicker.
    gone(&mut admin, name)?;
    let spare = spare_name();
    // The new name's ledger row first, the old one's after: one of them always names it.
    self::ledger::record(&mut admin, &spare);
    if let Err(e) = admin.batch_execute(&format!("ALTER DATABASE \"{name}\" RENAME TO \"{spare}\""))
    {
        self::ledger::forget(&mut admin, &spare);
        return Err(e.to_string());
    }
    self::ledger::forget(&mut admin, name);
    Ok(spare)
}

/// How long [`gone`] waits for the sessions of a database to exit.
const SESSIONS_GONE_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);
/// Between two looks of [`gone`] at `pg_stat_activity`.
const SESSIONS_POLL: std::time::Duration = std::time::Duration::from_millis(1);

/// Waits until no session is connected to `name` (closed or terminated sessions take a moment
/// to exit), polling every [`SESSIONS_POLL`]; `Err` after [`SESSIONS_GONE_WITHIN`].
fn gone(admin: &mut Client, name: &str) -> Result<(), String> {
    let deadline = Instant::now() + SESSIONS_GONE_WITHIN;
    loop {
        let left: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1",
                &[&name],
            )
            .map_err(|e| e.to_string())?
            .get(0);
        if left == 0 {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("{left} session(s) still connected"));
        }
        std::thread::sleep(SESSIONS_POLL);
    }
}

/// Drops `name` (`DROP DATABASE … WITH (FORCE)` ends the sessions still using it) through
/// `admin`, or through a new connection to `server` when `admin` is busy or gone (a server
/// restart): a [`ScratchDatabase`]'s own drop, and its interrupt cleanup. The admin session
/// comes first because a server at `max_connections` takes no new one. Its row in the
/// scratch ledger ([`self::ledger`]) is deleted after the drop.
///
/// Will return `Err` with the reason if it could not be dropped.
pub(crate) fn drop_scratch(
    admin: &Mutex<Client>,
    server: &Config,
    name: &str,
) -> Result<(), String> {
    let sql = format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)");
    let peer = ticketflow_core::deadline::Peer::of(server);
    let hard = SessionRole::Admin.hard_deadline_for(server);
    // `try_lock`: the interrupt handler must not wait for a thread stuck in a statement.
    if let Ok(mut admin) = admin.try_lock() {
        if ticketflow_core::deadline::watch("drop scratch database", &peer, hard, || {
            admin.batch_execute(&sql)
        })
        .0
        .is_ok()
        {
            self::ledger::forget(&mut admin, name);
            return Ok(());
        }
    }
    let mut fresh = connect_as(server, SessionRole::Admin).map_err(|e| e.to_string())?;
    watch_pg("drop scratch database", &peer, hard, || {
        fresh.batch_execute(&sql)
    })
    .map_err(|e| e.to_string())?;
    self::ledger::forget(&mut fresh, name);
    Ok(())
}

/// The environment variable whose value (sanitized, at most 12 characters) goes into every
/// scratch database's name right after `tf_`: `tf_<tag>_<label>_<random>`. Tests set it to
/// tell their databases from those of other processes on the same server.
pub const SCRATCH_TAG_VAR: &str = "TICKETFLOW_SCRATCH_TAG";

/// Lowercase ASCII letters and digits of `text`, anything else as `_`, at most `max` of them.
fn slug(text: &str, max: usize) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .take(max)
        .collect()
}

/// A spare scratch database's name (this module): as a scratch database labelled
/// `spare`.
fn spare_name() -> String {
    scratch_name(
        std::env::var(SCRATCH_TAG_VAR).ok().as_deref(),
        "spare",
        &Uuid::new_v4().simple().to_string()[..10],
    )
}

/// A scratch database's name: `tf_<label>_<random>`, or `tf_<tag>_<label>_<random>` with a
/// non-empty `tag` ([`SCRATCH_TAG_VAR`]). At most 3 + 13 + 33 + 10 = 59 bytes, within
/// PostgreSQL's 63.
fn scratch_name(tag: Option<&str>, label: &str, random: &str) -> String {
    let label = slug(label, 32);
    match tag.map(|t| slug(t, 12)).filter(|t| !t.is_empty()) {
        Some(tag) => format!("tf_{tag}_{label}_{random}"),
        None => format!("tf_{label}_{random}"),
    }
}

/// A `CREATE DATABASE` or rename that failed, with the admin connection for another try.
pub type Refused = Box<(StoreError, Client)>;

/// A scratch database: created on a server, dropped (`DROP DATABASE … WITH (FORCE)`) when
/// this value is dropped, also after a failure, and by the [`crate::cleanup`] registry on an
/// interrupt. Its name is `tf_<label>_<random>` (with [`SCRATCH_TAG_VAR`] set,
/// `tf_<tag>_<label>_<random>`). The `CREATE` and the registration, and the `DROP` and the
/// unregistration, each run in one [`crate::cleanup::critical`] section, so an interrupt
/// never falls between them. A process killed with SIGKILL cannot clean up; its databases
/// stay in the scratch ledger ([`self::ledger`]), which `ticketflow clean` and the next run
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
    /// [`scratch_cost`].
    ///
    /// Will return `Err` with the admin connection, for another try, if `CREATE DATABASE`
    /// fails (missing privileges, a template with sessions, a missing template). Never
    /// returns once the process was interrupted ([`crate::cleanup::critical`]).
    pub fn create_from(
        mut admin: Client,
        server: &Config,
        label: &str,
        template: Option<&str>,
    ) -> Result<Self, Refused> {
        let name = scratch_name(
            std::env::var(SCRATCH_TAG_VAR).ok().as_deref(),
            label,
            &Uuid::new_v4().simple().to_string()[..10],
        );
        let copy_of = template
            .map(|t| format!(" TEMPLATE \"{t}\""))
            .unwrap_or_default();
        // An interrupt now waits until the database is created and its cleanup registered.
        let _section = crate::cleanup::critical();
        let started = std::time::Instant::now();
        // In the ledger before it exists: a SIGKILL from now on leaves a row naming it.
        self::ledger::record(&mut admin, &name);
        let peer = ticketflow_core::deadline::Peer::of(server);
        let created = watch_pg(
            "create scratch database",
            &peer,
            SessionRole::Admin.hard_deadline_for(server),
            || admin.batch_execute(&format!("CREATE DATABASE \"{name}\"{copy_of}")),
        );
        if let Err(e) = created {
            self::ledger::forget(&mut admin, &name);
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
    /// existing database `spare` (migrated and without sessions; this module's
    /// spares). The caller unregisters the spare's own cleanup on success.
    ///
    /// Will return `Err` with the admin connection if `ALTER DATABASE … RENAME` fails. Never
    /// returns once the process was interrupted.
    pub(crate) fn adopt(
        mut admin: Client,
        server: &Config,
        label: &str,
        spare: &str,
    ) -> Result<Self, Refused> {
        let name = scratch_name(
            std::env::var(SCRATCH_TAG_VAR).ok().as_deref(),
            label,
            &Uuid::new_v4().simple().to_string()[..10],
        );
        let _section = crate::cleanup::critical();
        // The new name's ledger row first, the old one's after: one of them always names it.
        self::ledger::record(&mut admin, &name);
        // A catalog change of a throwaway database: its commit need not wait for the WAL flush.
        if let Err(e) = admin.batch_execute(&format!(
            "SET synchronous_commit = off; ALTER DATABASE \"{spare}\" RENAME TO \"{name}\""
        )) {
            self::ledger::forget(&mut admin, &name);
            return Err(Box::new((
                map_err("rename spare scratch database")(e),
                admin,
            )));
        }
        self::ledger::forget(&mut admin, spare);
        Ok(Self::registered(admin, server, name, true))
    }

    /// Renames the database to `new_name` and keeps it on the server: it is no longer dropped,
    /// by this value or an interrupt (how this module keeps the migrated template it built).
    /// Every session to it must be closed. On failure it is dropped as usual.
    ///
    /// Will return `Err` if `ALTER DATABASE … RENAME` fails (`new_name` exists: SQLSTATE
    /// 42P04).
    pub fn keep_as(mut self, new_name: &str) -> StoreResult<()> {
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
            self::ledger::forget(&mut admin, &self.name);
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

#[cfg(test)]
mod template_tests {
    use super::*;

    #[test]
    fn the_template_name_fits_a_database_name_and_changes_with_the_migrations() {
        let name = template_name();
        assert!(name.starts_with(TEMPLATE_PREFIX));
        assert_eq!(name.len(), TEMPLATE_PREFIX.len() + 16);
        assert!(name.len() <= 63);
        assert_eq!(name, template_name());
        let mut edited = migrate::POSTGRES.to_vec();
        edited[0].sql = "CREATE TABLE edited (id int)";
        assert_ne!(template_name_for(&edited), name);
        assert_ne!(template_name_for(&migrate::POSTGRES[..1]), name);
    }
}
