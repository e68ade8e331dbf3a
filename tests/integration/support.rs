use std::path::{Path, PathBuf};

use ticketflow::store::scratch::ScratchDb;
use ticketflow::store::url::{probe_postgres, resolve_pg_url};
use ticketflow::store::{Backend, RowCounts, Store};
use ticketflow::TicketRequest;

/// The PostgreSQL URL tests use, or `None` (after printing why) when no server answers
/// outside CI. Under `CI` an absent server is a test failure, never a skip.
pub fn pg_url() -> Option<String> {
    let url = resolve_pg_url(None, std::env::var("DATABASE_URL").ok().as_deref());
    match probe_postgres(&url) {
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

/// A migrated store under test ([`ScratchDb`]) whose helpers panic instead of returning
/// errors.
pub struct TestDb(pub ScratchDb);

impl TestDb {
    pub fn sqlite() -> Self {
        TestDb(ScratchDb::sqlite().unwrap())
    }

    pub fn postgres(label: &str) -> Option<Self> {
        let url = pg_url()?;
        Some(TestDb(ScratchDb::postgres(&url, label).unwrap()))
    }

    /// Every backend available here: SQLite always, PostgreSQL when reachable.
    pub fn all(label: &str) -> Vec<TestDb> {
        let mut v = vec![TestDb::sqlite()];
        v.extend(TestDb::postgres(label));
        v
    }

    pub fn backend(&self) -> Backend {
        self.0.backend()
    }

    /// `sqlite` or `postgres`, for assertion messages.
    pub fn name(&self) -> &'static str {
        self.0.backend().name()
    }

    /// A new session (connection) to this database.
    pub fn open(&self) -> Box<dyn Store + Send> {
        self.0.open().unwrap()
    }

    /// Row counts of a tenant, by direct SQL on a fresh session.
    pub fn counts(&self, tenant: &str) -> RowCounts {
        self.0.row_counts(tenant).unwrap()
    }

    /// Runs SQL statements (set-up and fault injection).
    pub fn execute(&self, sql: &str) {
        self.0.execute(sql).unwrap()
    }

    /// Runs SQL returning one i64.
    pub fn scalar(&self, sql: &str) -> i64 {
        self.0.scalar(sql).unwrap()
    }

    /// The connection config of this database (PostgreSQL only).
    pub fn pg_config(&self) -> Option<&postgres::Config> {
        self.0.pg_config()
    }

    /// The SQLite file (SQLite only).
    pub fn sqlite_path(&self) -> Option<&Path> {
        self.0.sqlite_path()
    }

    /// A postgres:// URL for this database (PostgreSQL only).
    pub fn url(&self) -> Option<String> {
        self.0.pg().map(|_| self.0.url().unwrap())
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
