use std::path::{Path, PathBuf};

use ticketflow_core::store::url::{probe_postgres, resolve_pg_url, PgServer};
use ticketflow_core::store::{Backend, RowCounts, Store};
use ticketflow_core::TicketRequest;
use ticketflow_harness::scratch::ScratchDb;

/// The PostgreSQL URL tests use, or `None` (after printing why) when no server answers
/// outside CI. Under `CI` an absent server is a test failure, never a skip.
pub fn pg_url() -> Option<String> {
    let url = resolve_pg_url(None, std::env::var("DATABASE_URL").ok().as_deref());
    let probed = PgServer::parse(&url)
        .map_err(|e| e.to_string())
        .and_then(|server| probe_postgres(&server).map_err(|e| e.to_string()));
    match probed {
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

/// `url` parsed, as the runners' options carry it; a test's URL always parses.
pub fn server(url: &str) -> PgServer {
    PgServer::parse(url).expect("a test's PostgreSQL URL parses")
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
        Some(TestDb(ScratchDb::postgres(&server(&url), label).unwrap()))
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

/// The database of one behaviour-test case: the in-memory store or a SQL backend.
pub enum CaseDb {
    /// `store::memory` (PostgreSQL READ COMMITTED semantics, no SQL). Not built under the
    /// loom cfg, where its types work only inside a model.
    #[cfg_attr(feature = "loom", allow(dead_code))]
    Memory(ticketflow_core::store::memory::MemoryDb),
    /// SQLite or PostgreSQL.
    Sql(TestDb),
}

/// One cell of [`for_each_store_and_protocol`]: a fresh database on one backend and one real
/// create protocol.
pub struct Case {
    /// The database under test.
    pub db: CaseDb,
    /// The protocol every [`Case::create`] runs.
    pub protocol: ticketflow_core::Protocol,
}

impl Case {
    /// `memory`, `sqlite` or `postgres`.
    pub fn backend(&self) -> &'static str {
        match &self.db {
            CaseDb::Memory(_) => "memory",
            CaseDb::Sql(db) => db.name(),
        }
    }

    /// `backend/protocol`, for assertion messages.
    pub fn name(&self) -> String {
        format!("{}/{}", self.backend(), self.protocol)
    }

    /// A new session (connection) to this database.
    pub fn open(&self) -> Box<dyn Store + Send> {
        match &self.db {
            CaseDb::Memory(db) => Box::new(db.session("test")),
            CaseDb::Sql(db) => db.open(),
        }
    }

    /// The SQL database, `None` for the memory store.
    pub fn sql(&self) -> Option<&TestDb> {
        match &self.db {
            CaseDb::Memory(_) => None,
            CaseDb::Sql(db) => Some(db),
        }
    }

    /// Committed row counts of a tenant (direct SQL on a fresh session for SQL backends).
    pub fn counts(&self, tenant: &str) -> RowCounts {
        match &self.db {
            CaseDb::Memory(db) => db.row_counts(tenant),
            CaseDb::Sql(db) => db.counts(tenant),
        }
    }

    /// Committed outbox rows of any tenant with this event type.
    pub fn events(&self, event_type: &str) -> i64 {
        match &self.db {
            CaseDb::Memory(db) => db
                .committed()
                .outbox
                .iter()
                .filter(|e| e.event_type == event_type)
                .count() as i64,
            CaseDb::Sql(db) => db.scalar(&format!(
                "SELECT count(*) FROM outbox_events WHERE event_type = '{event_type}'"
            )),
        }
    }

    /// The create options of this case: its protocol, the default retry policy.
    pub fn options(&self) -> ticketflow_core::CreateOptions {
        ticketflow_core::CreateOptions::new(self.protocol)
    }

    /// A create with this case's protocol and the default retry policy.
    pub fn create(
        &self,
        store: &mut dyn Store,
        tenant: &str,
        key: &str,
        request: &TicketRequest,
    ) -> ticketflow_core::Result<ticketflow_core::CreateReport> {
        ticketflow_core::create_ticket(store, tenant, key, request, &self.options())
    }

    /// How a loser of the receipt race learns of the winner under this protocol.
    pub fn loser_path(&self) -> ticketflow_core::DecisionPath {
        match self.protocol {
            ticketflow_core::Protocol::Savepoint => {
                ticketflow_core::DecisionPath::AfterUniqueViolation
            }
            ticketflow_core::Protocol::OnConflict => {
                ticketflow_core::DecisionPath::AfterInsertConflict
            }
            // Its one statement is its lookup: a winner committed before it is met there (the
            // in-flight winner's path is tested in protocol.rs).
            ticketflow_core::Protocol::SingleStatement => ticketflow_core::DecisionPath::FromLookup,
        }
    }
}

/// Runs `body` once per backend (the memory store, SQLite, PostgreSQL when reachable) and
/// real protocol ([`ticketflow_core::Protocol::ALL`]), each on a fresh database. Every cell runs
/// even after one fails; then the test fails naming each failing `backend/protocol` and its
/// panic message.
pub fn for_each_store_and_protocol(label: &str, body: impl Fn(&Case)) {
    let mut failures = Vec::new();
    for protocol in ticketflow_core::Protocol::ALL {
        // Under the loom cfg the memory store's types are loom's and work only in a model.
        #[cfg(not(feature = "loom"))]
        let memory = Some(CaseDb::Memory(
            ticketflow_core::store::memory::MemoryDb::new(),
        ));
        #[cfg(feature = "loom")]
        let memory = None;
        let sql = TestDb::all(&format!("{label}_{protocol}"));
        for db in memory.into_iter().chain(sql.into_iter().map(CaseDb::Sql)) {
            let case = Case { db, protocol };
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&case)));
            if let Err(panic) = outcome {
                let message = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("(a non-text panic)");
                failures.push(format!("{}: {message}", case.name()));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{label} failed on {} of the backend/protocol cells:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// A create through the `savepoint` protocol with the default retry policy.
pub fn create<S: ticketflow_core::store::Store + ?Sized>(
    s: &mut S,
    tenant: &str,
    key: &str,
    request: &ticketflow_core::TicketRequest,
) -> Result<ticketflow_core::CreateReport, ticketflow_core::Error> {
    ticketflow_core::create_ticket(
        s,
        tenant,
        key,
        request,
        &ticketflow_core::CreateOptions::default(),
    )
}

/// Whether Redis answers at `url` within 2 s. Absent: a printed reason and `false` locally;
/// a panic when `CI` is set (Redis is required there).
pub fn redis_up_at(url: &str) -> bool {
    let ok = redis::Client::open(url)
        .and_then(|c| c.get_connection_with_timeout(std::time::Duration::from_secs(2)))
        .is_ok();
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set and Redis is required"
        );
        eprintln!("skipping Redis test: no server at {url}");
    }
    ok
}

/// The schedule id an interposed run followed (`AABAB`); panics on a run without one.
pub fn schedule_of(run: &ticketflow_harness::blackbox::TargetRun) -> String {
    run.evidence
        .as_ref()
        .and_then(|e| e.schedule_id.clone())
        .expect("an interposed run has a schedule id")
}
