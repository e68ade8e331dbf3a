//! Throwaway databases: one door per backend, for every run that needs a database of its own
//! and must not leave it behind (scenario runs, black-box targets, property suites, faults, the
//! kill matrix, soak, the bench, the tests).
//!
//! - [`ScratchDatabase`]: the PostgreSQL door: `tf_<label>_<random>` on a server, a copy of
//!   the migrated template or a recycled spare ([`ScratchDatabase::migrated`]), recorded in the
//!   [`ledger`], dropped on drop and by the interrupt handler ([`crate::cleanup`]);
//! - [`ScratchSqlite`]: the SQLite door: a file in a new [`ScratchDir`], removed with it on
//!   drop and by the interrupt handler; the first session opened on it migrates it;
//! - [`ScratchDb`]: either door behind one type, migrated when created. It opens sessions (as
//!   `Box<dyn Store>` or typed), runs direct SQL on connections of its own (the harness's
//!   ground truth: counts, dumps, fault injection), and gives its URL.
//!
//! [`recycling`] keeps used PostgreSQL scratch databases for reuse while `verify` runs, and
//! [`scratch_cost`] counts what they cost.

mod cost;
mod dir;
pub mod ledger;
mod naming;
mod postgres;
mod recycle;
mod server;
mod sqlite;

use std::path::Path;

use ::postgres::{Client, Config};
use ticketflow_core::error::StoreError;
use ticketflow_core::store::postgres::{self as pg, IsolationLevel, PgStore};
use ticketflow_core::store::sqlite::{self as lite, SqliteConfig, SqliteStore};
use ticketflow_core::store::url::{url_with_db, NotAUrl, PgServer};
use ticketflow_core::store::{Backend, Dump, RowCounts, Store};

pub use cost::{scratch_cost, ScratchCost};
pub use dir::ScratchDir;
pub use naming::{template_name, template_name_for, SCRATCH_TAG_VAR, TEMPLATE_PREFIX};
pub use postgres::ScratchDatabase;
pub use recycle::{recycling, spares, Recycling};
pub use sqlite::ScratchSqlite;

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

/// A throwaway database, migrated, removed when dropped (module docs).
pub struct ScratchDb {
    kind: Kind,
}

enum Kind {
    Sqlite(ScratchSqlite),
    Postgres {
        scratch: Box<ScratchDatabase>,
        server_url: String,
    },
}

impl std::fmt::Debug for ScratchDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Sqlite(file) => f
                .debug_struct("ScratchDb")
                .field("sqlite", &file.path())
                .finish(),
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

    /// A migrated SQLite file (`scratch.db`) in a new temporary directory ([`ScratchSqlite`]).
    ///
    /// Will return `Err` if the directory cannot be created or the migrations fail.
    pub fn sqlite() -> Result<Self, ScratchError> {
        let file = ScratchSqlite::new("scratch.db").map_err(ScratchError::TempDir)?;
        drop(file.open_with(&SqliteConfig::default())?);
        Ok(ScratchDb {
            kind: Kind::Sqlite(file),
        })
    }

    /// A migrated scratch database `tf_<label>_<random>` on the PostgreSQL server `server`
    /// (its URL names any database on it), a copy of the migrated template
    /// ([`ScratchDatabase::migrated`]).
    ///
    /// Will return `Err` if the server cannot be reached ([`ScratchError::Unreachable`]),
    /// `CREATE DATABASE` fails or the migrations fail.
    pub fn postgres(server: &PgServer, label: &str) -> Result<Self, ScratchError> {
        let admin = pg::connect_as(server.config(), pg::SessionRole::Admin)
            .map_err(ScratchError::Unreachable)?;
        let scratch = ScratchDatabase::migrated(admin, server.config(), label)?;
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
            Kind::Sqlite(_) => Backend::Sqlite,
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
            Kind::Sqlite(file) => Ok(file.path().display().to_string()),
            Kind::Postgres {
                scratch,
                server_url,
            } => Ok(url_with_db(server_url, scratch.name())?),
        }
    }

    /// The SQLite file, on SQLite.
    pub fn sqlite_path(&self) -> Option<&Path> {
        match &self.kind {
            Kind::Sqlite(file) => Some(file.path()),
            Kind::Postgres { .. } => None,
        }
    }

    /// The PostgreSQL scratch database (its name and connection config), on PostgreSQL.
    pub fn pg(&self) -> Option<&ScratchDatabase> {
        match &self.kind {
            Kind::Postgres { scratch, .. } => Some(scratch),
            Kind::Sqlite(_) => None,
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
            Kind::Sqlite(file) => Box::new(file.open_with(&SqliteConfig::default())?),
            Kind::Postgres { scratch, .. } => Box::new(PgStore::connect(
                scratch.config(),
                IsolationLevel::ReadCommitted,
            )?),
        })
    }

    /// A new PostgreSQL session at `isolation`.
    ///
    /// Will return `Err` on SQLite ([`ScratchError::WrongBackend`]) or if the server cannot be
    /// reached.
    pub fn open_postgres(&self, isolation: IsolationLevel) -> Result<PgStore, ScratchError> {
        match &self.kind {
            Kind::Postgres { scratch, .. } => Ok(PgStore::connect(scratch.config(), isolation)?),
            Kind::Sqlite(_) => Err(self.wrong(Backend::Postgres)),
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
            Kind::Sqlite(_) => Err(self.wrong(Backend::Postgres)),
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
            Kind::Sqlite(file) => raw_sqlite(file.path())?
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
            Kind::Sqlite(file) => raw_sqlite(file.path())?
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
            Kind::Sqlite(file) => SqliteStore::open(file.path())?.row_counts(tenant_id)?,
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
            Kind::Sqlite(file) => SqliteStore::open(file.path())?.dump(prefix)?,
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
