//! Throwaway databases: one type for every run that needs a database of its own and must not
//! leave it behind (property suites, faults, the kill matrix, the bench, the tests).
//!
//! A [`ScratchDb`] is either a SQLite file in a new [`ScratchDir`] (both removed on drop and
//! by the interrupt handler) or a PostgreSQL [`ScratchDatabase`] (`tf_<label>_<random>`,
//! dropped on drop and by the interrupt handler). Both are migrated when created. It opens sessions (as
//! `Box<dyn Store>` or typed), runs direct SQL on connections of its own (the harness's ground
//! truth: counts, dumps, fault injection), and gives its URL.

use std::path::{Path, PathBuf};

use postgres::{Client, Config};

use crate::cleanup::Registration;

use super::postgres::{self as pg, IsolationLevel, PgStore, ScratchDatabase};
use super::sqlite::{self as lite, SqliteConfig, SqliteStore};
use super::url::{parse_postgres, url_with_db, NotAUrl};
use super::{Backend, Dump, RowCounts, Store};
use crate::error::StoreError;

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
            move || std::fs::remove_dir_all(&path).is_ok(),
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
    /// A scratch database on `backend`: SQLite, or PostgreSQL on the server at `pg_url` (used
    /// only then) with `label` in its name.
    ///
    /// Will return `Err` as [`ScratchDb::sqlite`] and [`ScratchDb::postgres`] do, and for
    /// [`Backend::Memory`].
    pub fn create(backend: Backend, pg_url: &str, label: &str) -> Result<Self, ScratchError> {
        match backend {
            Backend::Sqlite => ScratchDb::sqlite(),
            Backend::Postgres => ScratchDb::postgres(pg_url, label),
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

    /// A migrated scratch database `tf_<label>_<random>` on the PostgreSQL server at
    /// `server_url` (any database on it).
    ///
    /// Will return `Err` if the URL does not parse, the server cannot be reached
    /// ([`ScratchError::Unreachable`]), `CREATE DATABASE` fails or the migrations fail.
    pub fn postgres(server_url: &str, label: &str) -> Result<Self, ScratchError> {
        let server = parse_postgres(server_url)?;
        let admin = pg::connect(&server).map_err(ScratchError::Unreachable)?;
        let scratch = ScratchDatabase::create(admin, &server, label)?;
        // Migrate once, before any session of the caller's connects.
        drop(PgStore::connect(
            scratch.config(),
            IsolationLevel::ReadCommitted,
        )?);
        Ok(ScratchDb {
            kind: Kind::Postgres {
                scratch: Box::new(scratch),
                server_url: server_url.to_string(),
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
    /// (user, password, host and query kept; see [`crate::store::url::redact`] before
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
            Kind::Postgres { scratch, .. } => Ok(pg::connect(scratch.config())?),
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
            Kind::Postgres { scratch, .. } => pg::connect(scratch.config())?
                .batch_execute(sql)
                .map_err(|e| pg::classify("execute", e).into()),
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
            Kind::Postgres { scratch, .. } => pg::connect(scratch.config())?
                .query_one(sql, &[])
                .and_then(|row| row.try_get(0))
                .map_err(|e| pg::classify("scalar", e).into()),
        }
    }

    /// Row counts of a tenant, by direct SQL on a new connection.
    ///
    /// Will return `Err` for a database error.
    pub fn row_counts(&self, tenant_id: &str) -> Result<RowCounts, ScratchError> {
        Ok(match &self.kind {
            Kind::Sqlite { path, .. } => SqliteStore::open(path)?.row_counts(tenant_id)?,
            Kind::Postgres { scratch, .. } => {
                pg::row_counts(&mut pg::connect(scratch.config())?, tenant_id)?
            }
        })
    }

    /// Every row of the tenants whose id starts with `prefix`, by direct SQL on a new
    /// connection.
    ///
    /// Will return `Err` for a database error.
    pub fn dump(&self, prefix: &str) -> Result<Dump, ScratchError> {
        Ok(match &self.kind {
            Kind::Sqlite { path, .. } => SqliteStore::open(path)?.dump(prefix)?,
            Kind::Postgres { scratch, .. } => {
                pg::dump(&mut pg::connect(scratch.config())?, prefix)?
            }
        })
    }
}

/// A bare rusqlite connection: none of the store's pragmas, so direct SQL sees the file as
/// any SQLite client would.
fn raw_sqlite(path: &Path) -> Result<rusqlite::Connection, StoreError> {
    rusqlite::Connection::open(path).map_err(|e| lite::classify("open", e))
}
