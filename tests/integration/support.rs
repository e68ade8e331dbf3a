use std::path::PathBuf;

use ticketflow::store::postgres::{self as pg, IsolationLevel, PgStore, ScratchDatabase};
use ticketflow::store::sqlite::SqliteStore;
use ticketflow::store::{RowCounts, Store};
use ticketflow::TicketRequest;

/// The PostgreSQL URL tests use, or `None` (after printing why) when no server answers
/// outside CI. Under `CI` an absent server is a test failure, never a skip.
pub fn pg_url() -> Option<String> {
    let url =
        ticketflow::verify::resolve_pg_url(None, std::env::var("DATABASE_URL").ok().as_deref());
    match ticketflow::verify::probe_postgres(&url) {
        Ok(()) => Some(url),
        Err(reason) if std::env::var_os("CI").is_some() => {
            panic!("CI is set and PostgreSQL is required: {reason}")
        }
        Err(reason) => {
            eprintln!("skipping PostgreSQL test: {reason}");
            None
        }
    }
}

/// A PostgreSQL URL where no server listens (port 1), failing fast: for PENDING paths.
pub const UNREACHABLE_PG: &str = "postgres://postgres@127.0.0.1:1/postgres?connect_timeout=2";

/// A store under test plus what keeps its database alive.
pub enum TestDb {
    Sqlite {
        _dir: tempfile::TempDir,
        path: PathBuf,
    },
    Postgres {
        scratch: Box<ScratchDatabase>,
    },
}

impl TestDb {
    pub fn sqlite() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("test.db");
        TestDb::Sqlite { _dir: dir, path }
    }

    pub fn postgres(label: &str) -> Option<Self> {
        let url = pg_url()?;
        let config = pg::parse_url(&url).unwrap();
        let admin = pg::connect(&config).unwrap();
        let scratch = ScratchDatabase::create(admin, &config, label).unwrap();
        Some(TestDb::Postgres {
            scratch: Box::new(scratch),
        })
    }

    /// Every backend available here: SQLite always, PostgreSQL when reachable.
    pub fn all(label: &str) -> Vec<TestDb> {
        let mut v = vec![TestDb::sqlite()];
        v.extend(TestDb::postgres(label));
        v
    }

    pub fn name(&self) -> &'static str {
        match self {
            TestDb::Sqlite { .. } => "sqlite",
            TestDb::Postgres { .. } => "postgres",
        }
    }

    /// A new session (connection) to this database.
    pub fn open(&self) -> Box<dyn Store + Send> {
        match self {
            TestDb::Sqlite { path, .. } => Box::new(SqliteStore::open(path).unwrap()),
            TestDb::Postgres { scratch } => {
                Box::new(PgStore::connect(scratch.config(), IsolationLevel::ReadCommitted).unwrap())
            }
        }
    }

    /// Row counts of a tenant, by direct SQL on a fresh session.
    pub fn counts(&self, tenant: &str) -> RowCounts {
        match self {
            TestDb::Sqlite { path, .. } => {
                SqliteStore::open(path).unwrap().row_counts(tenant).unwrap()
            }
            TestDb::Postgres { scratch } => {
                let mut c = pg::connect(scratch.config()).unwrap();
                pg::row_counts(&mut c, tenant).unwrap()
            }
        }
    }

    /// Runs SQL statements (set-up and fault injection).
    pub fn execute(&self, sql: &str) {
        match self {
            TestDb::Sqlite { path, .. } => rusqlite::Connection::open(path)
                .unwrap()
                .execute_batch(sql)
                .unwrap(),
            TestDb::Postgres { scratch } => pg::connect(scratch.config())
                .unwrap()
                .batch_execute(sql)
                .unwrap(),
        }
    }

    /// Runs SQL returning one i64.
    pub fn scalar(&self, sql: &str) -> i64 {
        match self {
            TestDb::Sqlite { path, .. } => rusqlite::Connection::open(path)
                .unwrap()
                .query_row(sql, [], |r| r.get(0))
                .unwrap(),
            TestDb::Postgres { scratch } => pg::connect(scratch.config())
                .unwrap()
                .query_one(sql, &[])
                .unwrap()
                .get(0),
        }
    }
}

pub fn counts(t: i64, r: i64, e: i64) -> RowCounts {
    RowCounts {
        tickets: t,
        receipts: r,
        created_events: e,
    }
}

/// B0 of the field reports: actor u1, title "x", body "y", priority high.
pub fn b0() -> TicketRequest {
    TicketRequest {
        actor_id: "u1".into(),
        title: "x".into(),
        body: "y".into(),
        priority: "high".into(),
    }
}

pub fn repo_path(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// `base` (a postgres:// URL) pointed at database `dbname`, keeping user, host and query
/// (the black-box runner's own [`ticketflow::target::service::url_with_db`]).
pub fn url_with_db(base: &str, dbname: &str) -> String {
    ticketflow::target::service::url_with_db(base, dbname).expect("a postgres:// URL")
}

impl TestDb {
    /// The connection config of this database (PostgreSQL only).
    pub fn pg_config(&self) -> Option<&postgres::Config> {
        match self {
            TestDb::Postgres { scratch } => Some(scratch.config()),
            TestDb::Sqlite { .. } => None,
        }
    }

    /// A postgres:// URL for this database (PostgreSQL only).
    pub fn url(&self) -> Option<String> {
        match self {
            TestDb::Postgres { scratch } => Some(url_with_db(&pg_url()?, scratch.name())),
            TestDb::Sqlite { .. } => None,
        }
    }
}
