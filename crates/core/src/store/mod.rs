//! The storage trait the protocol is written against, and its implementations.
//!
//! A [`Store`] is one database session. The protocol drives its transaction explicitly
//! (`begin`, savepoints, `commit`/`rollback`) so the same protocol code runs on every backend;
//! each backend documents what `begin` means for it. [`memory`] is the in-memory store with
//! PostgreSQL's READ COMMITTED semantics that the loom models check the protocol on.

/// The ticket columns in [`Ticket`] field order, one SQL list for both SQL stores' statements.
macro_rules! ticket_columns {
    () => {
        "id, tenant_id, actor_id, title, body, priority, status, version, created_at, updated_at"
    };
}

pub mod call;
pub mod leases;
pub mod memory;
pub mod migrate;
pub mod postgres;
pub mod sqlite;
pub mod url;

use uuid::Uuid;

use self::url::DatabaseUrl;
pub use crate::backend::Backend;
use crate::domain::{OutboxEvent, Receipt, Ticket, TicketPatch};
use crate::error::StoreError;

/// Result of a store operation.
pub type StoreResult<T> = Result<T, StoreError>;

/// One database session with the operations the idempotency protocol needs (docs/PROTOCOL.md §4).
///
/// **Invariant:** every statement that reads or writes tickets, receipts or outbox rows is
/// scoped by `tenant_id`.
pub trait Store {
    /// The database this session is on.
    fn backend(&self) -> Backend;
    /// Starts a transaction. Will return `Err` if one is already open or the session is gone.
    fn begin(&mut self) -> StoreResult<()>;
    /// `SAVEPOINT name`.
    fn savepoint(&mut self, name: &str) -> StoreResult<()>;
    /// `ROLLBACK TO SAVEPOINT name`: undoes the savepoint's work, keeps the outer transaction.
    fn rollback_to_savepoint(&mut self, name: &str) -> StoreResult<()>;
    /// `RELEASE SAVEPOINT name`.
    fn release_savepoint(&mut self, name: &str) -> StoreResult<()>;
    /// Commits the open transaction.
    fn commit(&mut self) -> StoreResult<()>;
    /// Rolls the open transaction back; a no-op when none is open.
    fn rollback(&mut self) -> StoreResult<()>;
    /// The receipt for (tenant, key), if one is visible to this session.
    fn find_receipt(&mut self, tenant_id: &str, key: &str) -> StoreResult<Option<Receipt>>;
    /// Inserts a ticket row.
    fn insert_ticket(&mut self, ticket: &Ticket) -> StoreResult<()>;
    /// Inserts an outbox row.
    fn insert_outbox(&mut self, event: &OutboxEvent) -> StoreResult<()>;
    /// Inserts a receipt. Will return `Err` with [`crate::DbErrorKind::UniqueViolation`] when
    /// (tenant, key) is taken, waiting first (PostgreSQL) for an in-flight holder to finish.
    fn insert_receipt(&mut self, receipt: &Receipt) -> StoreResult<()>;
    /// `INSERT … ON CONFLICT DO NOTHING RETURNING` on the receipt (the `on-conflict`
    /// protocol): inserts it unless (tenant, key) is taken and returns whether it did. An
    /// in-flight holder of the key is waited for first (PostgreSQL, memory); under READ
    /// COMMITTED a holder that committed makes this return `false` without an error and
    /// without failing the transaction; one that rolled back lets the insert through. Under
    /// REPEATABLE READ / SERIALIZABLE a winner the snapshot cannot see is SQLSTATE 40001.
    /// The receipt's foreign key to its ticket is checked at commit (migration 0002), so the
    /// ticket may be inserted after the receipt in the same transaction.
    ///
    /// Will return `Err` for a database error (never for the conflict itself).
    fn insert_receipt_if_absent(&mut self, receipt: &Receipt) -> StoreResult<bool>;
    /// The `single-statement` protocol's one statement (docs/PROTOCOL.md §5.1), a transaction
    /// of its own: call it outside `begin` … `commit`. It claims (`receipt.tenant_id`,
    /// `receipt.idempotency_key`) with the receipt's `INSERT … ON CONFLICT DO NOTHING` and, only
    /// if the key was won, inserts `ticket` and `event`; all three commit together. When the
    /// key is taken it answers the receipt its snapshot sees and the ticket that receipt
    /// points at ([`Claimed::Met`]), or [`Claimed::TakenUnseen`] when the holder committed
    /// after the statement's snapshot was taken (PostgreSQL READ COMMITTED: the insert waited
    /// for an in-flight holder; the caller reads the winner with a new statement). Under
    /// REPEATABLE READ / SERIALIZABLE that case is SQLSTATE 40001 instead.
    ///
    /// PostgreSQL sends one statement (data-modifying CTEs) in one round trip; SQLite, which
    /// has no data-modifying CTEs, runs the claim and the inserts in one write transaction
    /// (never `TakenUnseen`: a writer there always sees the latest commit), after the protocol's
    /// [`Store::find_before_claim`].
    ///
    /// Will return `Err` for a database error; nothing is then written.
    fn claim_and_create(
        &mut self,
        ticket: &Ticket,
        event: &OutboxEvent,
        receipt: &Receipt,
    ) -> StoreResult<Claimed>;
    /// The `single-statement` protocol's read before its statement, where a read costs no
    /// round trip and takes no lock the statement needs (SQLite: a replay is then this one
    /// read, without the write lock and without building the rows a create would insert): the
    /// receipt for (tenant, key) with its ticket, as [`Store::find_receipt_and_ticket`]. The
    /// default reads nothing and answers `None`: where the statement itself reads (PostgreSQL,
    /// memory), a create stays one round trip.
    ///
    /// Will return `Err` for a database error.
    fn find_before_claim(
        &mut self,
        tenant_id: &str,
        key: &str,
    ) -> StoreResult<Option<(Receipt, Option<Ticket>)>> {
        let _ = (tenant_id, key);
        Ok(None)
    }
    /// The receipt for (tenant, key) and the ticket it points at (`None`: a dangling
    /// receipt), read by one statement (the `single-statement` protocol's second statement,
    /// after [`Claimed::TakenUnseen`]). `None` when no receipt is visible.
    fn find_receipt_and_ticket(
        &mut self,
        tenant_id: &str,
        key: &str,
    ) -> StoreResult<Option<(Receipt, Option<Ticket>)>>;
    /// The ticket with this id in this tenant; another tenant's ticket is `None`.
    fn find_ticket(&mut self, tenant_id: &str, id: Uuid) -> StoreResult<Option<Ticket>>;
    /// Applies `patch`, bumps `version`, sets `updated_at = now`; returns the new row, or
    /// `None` when no ticket with this id exists in this tenant.
    fn update_ticket(
        &mut self,
        tenant_id: &str,
        id: Uuid,
        patch: &TicketPatch,
        now: chrono::DateTime<chrono::Utc>,
    ) -> StoreResult<Option<Ticket>>;
}

/// What [`Store::claim_and_create`] found (docs/PROTOCOL.md §5.1).
#[derive(Debug, Clone, PartialEq, Eq)]
// Returned once per statement and matched at once: boxing `Met` would add two allocations to
// every replay, the path the protocol exists to make cheap.
#[allow(clippy::large_enum_variant)]
pub enum Claimed {
    /// The key was free: the receipt, ticket and event were inserted and committed.
    Won,
    /// A receipt visible to the statement held the key: it and the ticket it points at
    /// (`None` if that ticket is missing, a dangling receipt). Nothing was written.
    Met {
        /// The receipt that holds the key.
        receipt: Receipt,
        /// Its ticket, as it is now.
        ticket: Option<Ticket>,
    },
    /// The key was taken by a transaction that committed after this statement's snapshot
    /// was taken (it waited for that holder): nothing was written and nothing can be read
    /// by this statement; a new statement sees the winner.
    TakenUnseen,
}

/// Rows of one tenant, counted by direct SQL: the harness's ground truth.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct RowCounts {
    /// Rows in `tickets`.
    pub tickets: i64,
    /// Rows in `idempotency_receipts`.
    pub receipts: i64,
    /// Rows in `outbox_events` with `event_type = 'ticket.created'`.
    pub created_events: i64,
}

impl std::fmt::Display for RowCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}/{}",
            self.tickets, self.receipts, self.created_events
        )
    }
}

/// Every row of the tenants whose id starts with a prefix, read by direct SQL, for invariant
/// checks of the property suites.
#[derive(Debug, Clone, Default)]
pub struct Dump {
    /// (id, tenant, version, body) of each ticket.
    pub tickets: Vec<(Uuid, String, i64, String)>,
    /// (aggregate id, tenant, event type, payload JSON) of each outbox row.
    pub events: Vec<(Uuid, String, String, String)>,
    /// Every receipt.
    pub receipts: Vec<crate::domain::Receipt>,
    /// Receipts whose ticket is missing or belongs to another tenant, counted by a SQL join.
    pub dangling_receipts: i64,
}

/// The dump queries; `{p}` is the tenant-prefix `LIKE` parameter.
pub(crate) const DUMP_SQL: [&str; 4] = [
    "SELECT id, tenant_id, version, body FROM tickets WHERE tenant_id LIKE {p} ORDER BY created_at, id",
    "SELECT aggregate_id, tenant_id, event_type, payload_json FROM outbox_events WHERE tenant_id LIKE {p} ORDER BY occurred_at, id",
    "SELECT tenant_id, idempotency_key, payload_hash, ticket_id, created_at FROM idempotency_receipts WHERE tenant_id LIKE {p}",
    "SELECT count(*) FROM idempotency_receipts r LEFT JOIN tickets t ON t.id = r.ticket_id \
     WHERE r.tenant_id LIKE {p} AND (t.id IS NULL OR t.tenant_id <> r.tenant_id)",
];

/// A `LIKE` pattern matching tenants that start with `prefix` (which must not contain `%`,
/// `_` or `\\`).
pub(crate) fn like_prefix(prefix: &str) -> String {
    format!("{prefix}%")
}

/// SQL for counting a tenant's rows; `$1`/`?1` is the tenant. Shared by both backends.
pub(crate) const COUNT_SQL: [&str; 3] = [
    "SELECT count(*) FROM tickets WHERE tenant_id = {p}",
    "SELECT count(*) FROM idempotency_receipts WHERE tenant_id = {p}",
    "SELECT count(*) FROM outbox_events WHERE tenant_id = {p} AND event_type = 'ticket.created'",
];

/// Opens a store for a `--database-url` (PostgreSQL at READ COMMITTED, or a SQLite file),
/// applying pending migrations.
///
/// Will return `Err` for an unreachable server, a file that cannot be opened or a failed
/// migration.
pub fn open(url: &DatabaseUrl) -> Result<Box<dyn Store>, crate::Error> {
    open_with(url, None)
}

/// As [`open`], with PostgreSQL transactions at `isolation` (`None`: READ COMMITTED). SQLite
/// transactions are always serializable, so an `isolation` with a SQLite URL is refused.
///
/// Will return `Err` as [`open`] does, or [`crate::Error::IsolationNotApplicable`].
pub fn open_with(
    url: &DatabaseUrl,
    isolation: Option<postgres::IsolationChoice>,
) -> Result<Box<dyn Store>, crate::Error> {
    match url {
        DatabaseUrl::Postgres(server) => {
            let mut client = postgres::connect(server.config())?;
            postgres::migrate_client(&mut client)?;
            Ok(Box::new(postgres::PgStore::from_client_choice(
                client,
                isolation.unwrap_or_default(),
            )?))
        }
        DatabaseUrl::Sqlite(_) if isolation.is_some() => Err(crate::Error::IsolationNotApplicable),
        DatabaseUrl::Sqlite(path) => Ok(Box::new(sqlite::SqliteStore::open(path)?)),
    }
}

/// Receipt retention: deletes receipts created before `now - older_than`, in every tenant, and
/// returns how many. Tickets and outbox events stay. A key whose receipt was pruned is free
/// again: reusing it creates a new ticket (the README states this policy).
///
/// Will return `Err` for a database error.
pub fn prune_receipts(
    url: &DatabaseUrl,
    older_than: std::time::Duration,
) -> Result<u64, crate::Error> {
    let cutoff = crate::domain::now_utc()
        - chrono::Duration::from_std(older_than).unwrap_or(chrono::Duration::MAX);
    match url {
        DatabaseUrl::Postgres(server) => {
            let mut store = postgres::PgStore::connect(
                server.config(),
                postgres::IsolationLevel::ReadCommitted,
            )?;
            Ok(store.prune_receipts(cutoff)?)
        }
        DatabaseUrl::Sqlite(path) => Ok(sqlite::SqliteStore::open(path)?.prune_receipts(cutoff)?),
    }
}

/// The retention statement, tenant-agnostic by design; `{p}` is the cutoff parameter.
pub(crate) const PRUNE_SQL: &str = "DELETE FROM idempotency_receipts WHERE created_at < {p}";
