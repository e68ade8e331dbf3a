//! SQLite store through rusqlite, on a file database in WAL mode.
//!
//! Transaction modes ([`TxMode`]):
//! - `lazy` (default; close to Python's `sqlite3` module, docs/PROTOCOL.md §7.4): [`Store::begin`] opens no SQLite
//!   transaction; the receipt lookup runs as its own autocommit read, and the first write
//!   (`SAVEPOINT` or an update) opens `BEGIN IMMEDIATE`, which takes the write lock and waits
//!   for it up to the busy timeout. Two racers can both see "no receipt", and the loser then
//!   meets the winner's committed receipt as a constraint error inside its savepoint:
//!   docs/PROTOCOL.md §4.2 step 7 runs for real.
//! - `deferred`: `BEGIN DEFERRED`; the lookup starts a read transaction, and a racer that
//!   later wants to write while another holds or has used the write lock gets `SQLITE_BUSY`
//!   (rollback journal) or `SQLITE_BUSY_SNAPSHOT` (WAL) at once, without the busy handler,
//!   because waiting could deadlock. The protocol's bounded retry reruns the transaction.
//! - `immediate`: `BEGIN IMMEDIATE`; the write lock is taken before the lookup, so racers
//!   are serialized at `begin` (waiting up to the busy timeout) and the loser replays from
//!   its lookup.
//!
//! Journal modes ([`JournalMode`]): WAL (default) or the rollback journal (`DELETE`).
//!
//! SQLite evidence proves control flow only, not PostgreSQL isolation or lock visibility.

use std::path::Path;
use std::time::Duration;

use chrono::{DateTime, Utc};
use rusqlite::{params, Connection, ErrorCode, OptionalExtension};
use uuid::Uuid;

use super::migrate::{self, Migration};
use super::{Backend, Claimed, RowCounts, Store, StoreResult, COUNT_SQL};
use crate::domain::{iso8601, OutboxEvent, Receipt, Ticket, TicketPatch};
use crate::error::{DbErrorKind, StoreError};

/// Default time a write waits for SQLite's write lock before `SQLITE_BUSY`.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// When the SQLite transaction starts; see the module docs.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Default,
    serde::Serialize,
    serde::Deserialize,
)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum TxMode {
    // `help = None`: `--help` lists the bare names, as it always has; these docs are for
    // the code's readers.
    /// Autocommit lookup, `BEGIN IMMEDIATE` at the first write.
    #[default]
    #[cfg_attr(feature = "cli", value(help = None::<&str>))]
    Lazy,
    /// `BEGIN DEFERRED` at begin.
    #[cfg_attr(feature = "cli", value(help = None::<&str>))]
    Deferred,
    /// `BEGIN IMMEDIATE` at begin.
    #[cfg_attr(feature = "cli", value(help = None::<&str>))]
    Immediate,
}

/// SQLite journal mode.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Default,
    serde::Serialize,
    serde::Deserialize,
)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum JournalMode {
    // `help = None`: `--help` lists the bare names, as it always has; these docs are for
    // the code's readers.
    /// Write-ahead log: readers do not block the writer.
    #[default]
    #[cfg_attr(feature = "cli", value(help = None::<&str>))]
    Wal,
    /// Rollback journal (`DELETE`), SQLite's default.
    #[cfg_attr(feature = "cli", value(help = None::<&str>))]
    Delete,
}

impl JournalMode {
    /// The pragma value, `WAL` or `DELETE`.
    pub fn sql(self) -> &'static str {
        match self {
            JournalMode::Wal => "WAL",
            JournalMode::Delete => "DELETE",
        }
    }
}

/// How a SQLite session is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SqliteConfig {
    /// Journal mode.
    pub journal: JournalMode,
    /// Transaction mode.
    pub tx: TxMode,
    /// How long a write waits for the lock before `SQLITE_BUSY`.
    pub busy_timeout: Duration,
}

impl Default for SqliteConfig {
    /// WAL, lazy transactions, [`DEFAULT_BUSY_TIMEOUT`].
    fn default() -> Self {
        SqliteConfig {
            journal: JournalMode::Wal,
            tx: TxMode::Lazy,
            busy_timeout: DEFAULT_BUSY_TIMEOUT,
        }
    }
}

impl std::fmt::Display for SqliteConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let journal = match self.journal {
            JournalMode::Wal => "wal",
            JournalMode::Delete => "rollback journal",
        };
        let tx = match self.tx {
            TxMode::Lazy => "lazy",
            TxMode::Deferred => "deferred",
            TxMode::Immediate => "immediate",
        };
        write!(f, "{journal}, {tx}")
    }
}

/// A SQLite session.
pub struct SqliteStore {
    conn: Connection,
    tx_mode: TxMode,
    in_tx: bool,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.conn.path())
            .field("in_tx", &self.in_tx)
            .finish()
    }
}

fn map_err(operation: &'static str) -> impl Fn(rusqlite::Error) -> StoreError {
    move |e| classify(operation, e)
}

/// Classifies a rusqlite error into a [`StoreError`].
pub fn classify(operation: &'static str, e: rusqlite::Error) -> StoreError {
    let (kind, code) = match &e {
        rusqlite::Error::SqliteFailure(f, _) => {
            let kind = match f.code {
                ErrorCode::ConstraintViolation => match f.extended_code {
                    rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
                    | rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE => DbErrorKind::UniqueViolation,
                    _ => DbErrorKind::OtherConstraint,
                },
                ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => DbErrorKind::Busy,
                ErrorCode::CannotOpen => DbErrorKind::Connection,
                ErrorCode::DiskFull | ErrorCode::OutOfMemory => DbErrorKind::Unavailable,
                _ => DbErrorKind::Other,
            };
            (kind, Some(f.extended_code.to_string()))
        }
        _ => (DbErrorKind::Other, None),
    };
    StoreError {
        kind,
        backend: Backend::Sqlite,
        operation,
        code,
        message: e.to_string(),
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the database file, sets WAL mode, foreign keys and the busy
    /// timeout, and applies pending migrations.
    ///
    /// Will return `Err` if the file cannot be opened or a migration fails.
    pub fn open(path: &Path) -> StoreResult<Self> {
        Self::open_with(path, &SqliteConfig::default())
    }

    /// As [`SqliteStore::open`] with explicit journal mode, transaction mode and busy timeout.
    pub fn open_with(path: &Path, config: &SqliteConfig) -> StoreResult<Self> {
        let conn = Connection::open(path).map_err(map_err("open"))?;
        conn.busy_timeout(config.busy_timeout)
            .map_err(map_err("set busy timeout"))?;
        // journal_mode returns a row, so it is queried rather than executed.
        let _mode: String = conn
            .query_row(
                &format!("PRAGMA journal_mode = {}", config.journal.sql()),
                [],
                |r| r.get(0),
            )
            .map_err(map_err("set journal mode"))?;
        conn.execute_batch("PRAGMA foreign_keys = ON; PRAGMA synchronous = NORMAL;")
            .map_err(map_err("set pragmas"))?;
        let mut store = SqliteStore {
            conn,
            tx_mode: config.tx,
            in_tx: false,
        };
        store.migrate()?;
        Ok(store)
    }

    /// Applies pending migrations, each in its own `BEGIN IMMEDIATE` transaction. Returns the
    /// versions applied now (empty when up to date). Will return `Err` on a checksum drift.
    pub fn migrate(&mut self) -> StoreResult<Vec<i64>> {
        let mut applied = Vec::new();
        for m in migrate::SQLITE {
            if self.apply_one(m)? {
                applied.push(m.version);
            }
        }
        Ok(applied)
    }

    fn apply_one(&mut self, m: &Migration) -> StoreResult<bool> {
        let conn = &self.conn;
        conn.execute_batch("BEGIN IMMEDIATE")
            .map_err(map_err("migrate: begin"))?;
        let result = (|| {
            conn.execute_batch(migrate::LEDGER_DDL)
                .map_err(map_err("migrate: ledger"))?;
            let recorded: Option<String> = conn
                .query_row(
                    "SELECT checksum FROM schema_migrations WHERE version = ?1",
                    [m.version],
                    |r| r.get(0),
                )
                .optional()
                .map_err(map_err("migrate: read ledger"))?;
            match recorded {
                Some(sum) if sum == m.checksum() => Ok(false),
                Some(sum) => Err(StoreError {
                    kind: DbErrorKind::Other,
                    backend: Backend::Sqlite,
                    operation: "migrate: checksum",
                    code: None,
                    message: migrate::drift_message(m, &sum),
                }),
                None => {
                    conn.execute_batch(m.sql)
                        .map_err(map_err("migrate: apply"))?;
                    conn.execute(
                        "INSERT INTO schema_migrations (version, name, checksum, applied_at) VALUES (?1, ?2, ?3, ?4)",
                        params![m.version, m.name, m.checksum(), iso8601(crate::domain::now_utc())],
                    )
                    .map_err(map_err("migrate: record"))?;
                    Ok(true)
                }
            }
        })();
        match result {
            Ok(v) => {
                conn.execute_batch("COMMIT")
                    .map_err(map_err("migrate: commit"))?;
                Ok(v)
            }
            Err(e) => {
                let _ = conn.execute_batch("ROLLBACK");
                Err(e)
            }
        }
    }

    /// Deletes receipts created before `cutoff` (see [`super::prune_receipts`]).
    pub fn prune_receipts(&self, cutoff: DateTime<Utc>) -> StoreResult<u64> {
        self.conn
            .execute(&super::PRUNE_SQL.replace("{p}", "?1"), [iso8601(cutoff)])
            .map(|n| n as u64)
            .map_err(map_err("prune receipts"))
    }

    /// Counts a tenant's tickets, receipts and `ticket.created` events.
    pub fn row_counts(&self, tenant_id: &str) -> StoreResult<RowCounts> {
        let mut n = [0i64; 3];
        for (slot, sql) in n.iter_mut().zip(COUNT_SQL) {
            *slot = self
                .conn
                .query_row(&sql.replace("{p}", "?1"), [tenant_id], |r| r.get(0))
                .map_err(map_err("count rows"))?;
        }
        Ok(RowCounts {
            tickets: n[0],
            receipts: n[1],
            created_events: n[2],
        })
    }

    /// Receipts stored for (tenant, key) as (payload hash, ticket id), read by direct SQL.
    pub fn receipts_for(&self, tenant_id: &str, key: &str) -> StoreResult<Vec<(String, Uuid)>> {
        let mut st = self
            .conn
            .prepare(
                "SELECT payload_hash, ticket_id FROM idempotency_receipts \
                 WHERE tenant_id = ?1 AND idempotency_key = ?2 ORDER BY created_at",
            )
            .map_err(map_err("read receipts"))?;
        let rows = st
            .query_map(params![tenant_id, key], |r| {
                Ok((r.get::<_, String>(0)?, parse_uuid(&r.get::<_, String>(1)?)?))
            })
            .map_err(map_err("read receipts"))?;
        rows.collect::<Result<_, _>>()
            .map_err(map_err("read receipts"))
    }

    /// Every row of the tenants whose id starts with `prefix` (see [`super::Dump`]).
    pub fn dump(&self, prefix: &str) -> StoreResult<super::Dump> {
        let p = super::like_prefix(prefix);
        let q = |i: usize| super::DUMP_SQL[i].replace("{p}", "?1");
        let e = map_err("dump");
        let mut dump = super::Dump {
            tickets: query_all(&self.conn, &q(0), &p, id_row).map_err(&e)?,
            events: query_all(&self.conn, &q(1), &p, id_row).map_err(&e)?,
            receipts: query_all(&self.conn, &q(2), &p, receipt_from_row).map_err(&e)?,
            ..super::Dump::default()
        };
        dump.dangling_receipts = self.conn.query_row(&q(3), [&p], |r| r.get(0)).map_err(&e)?;
        Ok(dump)
    }

    /// `true` when a transaction is open on this connection, by our bookkeeping or by
    /// SQLite's own (`sqlite3_get_autocommit` is 0 inside a transaction). A pool refuses to
    /// hand out such a session.
    pub fn in_transaction(&self) -> bool {
        self.in_tx || !self.conn.is_autocommit()
    }

    /// The journal mode in use (`wal` unless the file system refused it).
    pub fn journal_mode(&self) -> StoreResult<String> {
        self.conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .map_err(map_err("read journal mode"))
    }

    /// Runs raw SQL (several statements allowed). For test set-up and fault injection only.
    pub fn execute_batch(&self, sql: &str) -> StoreResult<()> {
        self.conn
            .execute_batch(sql)
            .map_err(map_err("execute batch"))
    }

    fn ensure_write_tx(&mut self) -> StoreResult<()> {
        if !self.in_tx {
            self.conn
                .execute_batch("BEGIN IMMEDIATE")
                .map_err(map_err("begin immediate"))?;
            self.in_tx = true;
        }
        Ok(())
    }
}

/// Receipt lookup: `?1` tenant, `?2` key.
pub const FIND_RECEIPT_SQL: &str =
    "SELECT tenant_id, idempotency_key, payload_hash, ticket_id, created_at \
     FROM idempotency_receipts WHERE tenant_id = ?1 AND idempotency_key = ?2";
/// Ticket insert: `?1..?10` in [`Ticket`] field order.
pub const INSERT_TICKET_SQL: &str = concat!(
    "INSERT INTO tickets (",
    ticket_columns!(),
    ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"
);
/// Outbox insert: `?1..?6` in [`OutboxEvent`] field order.
pub const INSERT_OUTBOX_SQL: &str =
    "INSERT INTO outbox_events (id, aggregate_id, tenant_id, event_type, payload_json, occurred_at) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6)";
/// Receipt insert: `?1..?5` in [`Receipt`] field order.
pub const INSERT_RECEIPT_SQL: &str =
    "INSERT INTO idempotency_receipts (tenant_id, idempotency_key, payload_hash, ticket_id, created_at) \
     VALUES (?1, ?2, ?3, ?4, ?5)";
/// Receipt insert that yields to an existing receipt: `?1..?5` as [`INSERT_RECEIPT_SQL`];
/// returns one row when it inserted, none when the key was taken.
pub const INSERT_RECEIPT_IF_ABSENT_SQL: &str =
    "INSERT INTO idempotency_receipts (tenant_id, idempotency_key, payload_hash, ticket_id, created_at) \
     VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (tenant_id, idempotency_key) DO NOTHING RETURNING 1";
/// Ticket read: `?1` tenant, `?2` id.
pub const FIND_TICKET_SQL: &str = concat!(
    "SELECT ",
    ticket_columns!(),
    " FROM tickets WHERE tenant_id = ?1 AND id = ?2"
);
/// The receipt for (`?1` tenant, `?2` key) and its ticket (NULL columns when missing), in one
/// statement: receipt columns, then ticket columns (the `single-statement` protocol's read).
pub const FIND_RECEIPT_AND_TICKET_SQL: &str = concat!(
    "SELECT r.tenant_id, r.idempotency_key, r.payload_hash, r.ticket_id, r.created_at, ",
    "t.id, t.tenant_id, t.actor_id, t.title, t.body, t.priority, t.status, t.version, t.created_at, t.updated_at ",
    "FROM idempotency_receipts r LEFT JOIN tickets t ON t.tenant_id = r.tenant_id AND t.id = r.ticket_id \
     WHERE r.tenant_id = ?1 AND r.idempotency_key = ?2"
);
/// Ticket update: `?1` tenant, `?2` id, `?3..?5` title/body/priority (NULL keeps), `?6` time.
pub const UPDATE_TICKET_SQL: &str = concat!(
    "UPDATE tickets SET title = coalesce(?3, title), body = coalesce(?4, body), \
     priority = coalesce(?5, priority), version = version + 1, updated_at = ?6 \
     WHERE tenant_id = ?1 AND id = ?2 RETURNING ",
    ticket_columns!()
);

fn parse_time(s: &str) -> rusqlite::Result<DateTime<Utc>> {
    crate::domain::parse_iso8601(s).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, Box::new(e))
    })
}

fn parse_uuid(s: &str) -> rusqlite::Result<Uuid> {
    Uuid::parse_str(s).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, Box::new(e))
    })
}

/// Column `i` as text borrowed from the row, passed to `f` (no copy into a `String`). A
/// column that is not valid UTF-8 text takes `r.get::<String>`'s path, so errors are the
/// same as reading it as a `String`.
fn with_text<T>(
    r: &rusqlite::Row<'_>,
    i: usize,
    f: impl FnOnce(&str) -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    if let Ok(rusqlite::types::ValueRef::Text(bytes)) = r.get_ref(i) {
        if let Ok(text) = std::str::from_utf8(bytes) {
            return f(text);
        }
    }
    f(&r.get::<_, String>(i)?)
}

/// Every row of `sql` with one text parameter, mapped by `f`.
fn query_all<T>(
    conn: &Connection,
    sql: &str,
    param: &str,
    f: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> rusqlite::Result<Vec<T>> {
    let mut st = conn.prepare(sql)?;
    let rows = st.query_map([param], f)?;
    rows.collect()
}

/// Columns tenant_id, idempotency_key, payload_hash, ticket_id, created_at.
fn receipt_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Receipt> {
    receipt_with(r, r.get(0)?, r.get(1)?)
}

/// A receipt row whose tenant and key the caller already holds: a row found by
/// [`FIND_RECEIPT_SQL`] has exactly the bound values in those columns (`=` under the columns'
/// BINARY collation is byte equality), so they are not copied out of the row again.
fn receipt_with(
    r: &rusqlite::Row<'_>,
    tenant_id: String,
    idempotency_key: String,
) -> rusqlite::Result<Receipt> {
    Ok(Receipt {
        tenant_id,
        idempotency_key,
        payload_hash: r.get(2)?,
        ticket_id: with_text(r, 3, parse_uuid)?,
        created_at: with_text(r, 4, parse_time)?,
    })
}

/// A dump row: a UUID, then three columns of the types the caller wants.
fn id_row<B: rusqlite::types::FromSql, C: rusqlite::types::FromSql, D: rusqlite::types::FromSql>(
    r: &rusqlite::Row<'_>,
) -> rusqlite::Result<(Uuid, B, C, D)> {
    Ok((
        parse_uuid(&r.get::<_, String>(0)?)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
    ))
}

fn ticket_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Ticket> {
    ticket_with(r, 0, with_text(r, 0, parse_uuid)?, r.get(1)?)
}

/// A ticket row whose id and tenant the caller already holds: a row found by
/// [`FIND_TICKET_SQL`] has exactly the bound values in those columns (the id bound as
/// lower-case hyphenated text, which parses back to the same UUID), so they are not decoded
/// from the row again. The ticket's columns start at `at` (0, or 5 in a joined receipt row).
fn ticket_with(
    r: &rusqlite::Row<'_>,
    at: usize,
    id: Uuid,
    tenant_id: String,
) -> rusqlite::Result<Ticket> {
    Ok(Ticket {
        id,
        tenant_id,
        actor_id: r.get(at + 2)?,
        title: r.get(at + 3)?,
        body: r.get(at + 4)?,
        priority: r.get(at + 5)?,
        status: r.get(at + 6)?,
        version: r.get(at + 7)?,
        created_at: with_text(r, at + 8, parse_time)?,
        updated_at: with_text(r, at + 9, parse_time)?,
    })
}

/// A receipt (columns 0..5) and its ticket (columns 5..15, all NULL for a dangling receipt)
/// from a [`FIND_RECEIPT_AND_TICKET_SQL`] row found for (`tenant_id`, `key`). As in
/// [`receipt_with`] the bound tenant and key are not copied out of the row again, and the
/// joined ticket's id and tenant are the receipt's (the join's condition).
fn receipt_and_ticket(
    r: &rusqlite::Row<'_>,
    tenant_id: &str,
    key: &str,
) -> rusqlite::Result<(Receipt, Option<Ticket>)> {
    let receipt = receipt_with(r, tenant_id.to_owned(), key.to_owned())?;
    let ticket = match r.get_ref(5)? {
        rusqlite::types::ValueRef::Null => None,
        _ => Some(ticket_with(
            r,
            5,
            receipt.ticket_id,
            receipt.tenant_id.clone(),
        )?),
    };
    Ok((receipt, ticket))
}

impl SqliteStore {
    /// The write half of [`Store::claim_and_create`], inside the transaction `begin` opened:
    /// claim, then the ticket and event, or read the holder (the write lock is held, so
    /// the holder is committed and visible).
    fn claim_in_write_tx(
        &mut self,
        t: &Ticket,
        e: &OutboxEvent,
        r: &Receipt,
    ) -> StoreResult<Claimed> {
        if self.insert_receipt_if_absent(r)? {
            self.insert_ticket(t)?;
            self.insert_outbox(e)?;
            return Ok(Claimed::Won);
        }
        match self.find_receipt_and_ticket(&r.tenant_id, &r.idempotency_key)? {
            Some((receipt, ticket)) => Ok(Claimed::Met { receipt, ticket }),
            None => Err(StoreError {
                kind: DbErrorKind::Other,
                backend: Backend::Sqlite,
                operation: "claim and create",
                code: None,
                message: "the receipt key is taken but no receipt is visible".into(),
            }),
        }
    }
}

impl Store for SqliteStore {
    fn backend(&self) -> Backend {
        Backend::Sqlite
    }

    fn begin(&mut self) -> StoreResult<()> {
        if self.in_tx {
            return Err(StoreError {
                kind: DbErrorKind::Other,
                backend: Backend::Sqlite,
                operation: "begin",
                code: None,
                message: "a transaction is already open".into(),
            });
        }
        let sql = match self.tx_mode {
            // Lazy: the write lock is taken at the first write (module docs).
            TxMode::Lazy => return Ok(()),
            TxMode::Deferred => "BEGIN DEFERRED",
            TxMode::Immediate => "BEGIN IMMEDIATE",
        };
        self.conn.execute_batch(sql).map_err(map_err("begin"))?;
        self.in_tx = true;
        Ok(())
    }

    fn savepoint(&mut self, name: &str) -> StoreResult<()> {
        self.ensure_write_tx()?;
        self.conn
            .execute_batch(&format!("SAVEPOINT {name}"))
            .map_err(map_err("savepoint"))
    }

    fn rollback_to_savepoint(&mut self, name: &str) -> StoreResult<()> {
        self.conn
            .execute_batch(&format!("ROLLBACK TO SAVEPOINT {name}"))
            .map_err(map_err("rollback to savepoint"))
    }

    fn release_savepoint(&mut self, name: &str) -> StoreResult<()> {
        self.conn
            .execute_batch(&format!("RELEASE SAVEPOINT {name}"))
            .map_err(map_err("release savepoint"))
    }

    fn commit(&mut self) -> StoreResult<()> {
        if self.in_tx {
            self.conn
                .execute_batch("COMMIT")
                .map_err(map_err("commit"))?;
            self.in_tx = false;
        }
        Ok(())
    }

    fn rollback(&mut self) -> StoreResult<()> {
        if self.in_tx {
            self.in_tx = false;
            // After some errors SQLite has already rolled back; then this is a no-op.
            if self.conn.is_autocommit() {
                return Ok(());
            }
            self.conn
                .execute_batch("ROLLBACK")
                .map_err(map_err("rollback"))?;
        }
        Ok(())
    }

    fn find_receipt(&mut self, tenant_id: &str, key: &str) -> StoreResult<Option<Receipt>> {
        self.conn
            .prepare_cached(FIND_RECEIPT_SQL)
            .and_then(|mut st| {
                st.query_row(params![tenant_id, key], |r| {
                    receipt_with(r, tenant_id.to_owned(), key.to_owned())
                })
                .optional()
            })
            .map_err(map_err("find receipt"))
    }

    fn insert_ticket(&mut self, t: &Ticket) -> StoreResult<()> {
        self.ensure_write_tx()?;
        self.conn
            .prepare_cached(INSERT_TICKET_SQL)
            .and_then(|mut st| {
                st.execute(params![
                    t.id.to_string(),
                    t.tenant_id,
                    t.actor_id,
                    t.title,
                    t.body,
                    t.priority,
                    t.status,
                    t.version,
                    iso8601(t.created_at),
                    iso8601(t.updated_at)
                ])
            })
            .map(drop)
            .map_err(map_err("insert ticket"))
    }

    fn insert_outbox(&mut self, e: &OutboxEvent) -> StoreResult<()> {
        self.ensure_write_tx()?;
        self.conn
            .prepare_cached(INSERT_OUTBOX_SQL)
            .and_then(|mut st| {
                st.execute(params![
                    e.id.to_string(),
                    e.aggregate_id.to_string(),
                    e.tenant_id,
                    e.event_type,
                    e.payload_json,
                    iso8601(e.occurred_at)
                ])
            })
            .map(drop)
            .map_err(map_err("insert outbox event"))
    }

    fn insert_receipt(&mut self, r: &Receipt) -> StoreResult<()> {
        self.ensure_write_tx()?;
        self.conn
            .prepare_cached(INSERT_RECEIPT_SQL)
            .and_then(|mut st| {
                st.execute(params![
                    r.tenant_id,
                    r.idempotency_key,
                    r.payload_hash,
                    r.ticket_id.to_string(),
                    iso8601(r.created_at)
                ])
            })
            .map(drop)
            .map_err(map_err("insert receipt"))
    }

    fn insert_receipt_if_absent(&mut self, r: &Receipt) -> StoreResult<bool> {
        self.ensure_write_tx()?;
        // The write lock is held from here on, so "taken" means committed by another
        // session before ours, or inserted by this transaction.
        self.conn
            .prepare_cached(INSERT_RECEIPT_IF_ABSENT_SQL)
            .and_then(|mut st| {
                st.query_row(
                    params![
                        r.tenant_id,
                        r.idempotency_key,
                        r.payload_hash,
                        r.ticket_id.to_string(),
                        iso8601(r.created_at)
                    ],
                    |_| Ok(()),
                )
                .optional()
            })
            .map(|row| row.is_some())
            .map_err(map_err("insert receipt on conflict do nothing"))
    }

    fn find_ticket(&mut self, tenant_id: &str, id: Uuid) -> StoreResult<Option<Ticket>> {
        self.conn
            .prepare_cached(FIND_TICKET_SQL)
            .and_then(|mut st| {
                let mut buf = Uuid::encode_buffer();
                let id_text: &str = id.hyphenated().encode_lower(&mut buf);
                st.query_row(params![tenant_id, id_text], |r| {
                    ticket_with(r, 0, id, tenant_id.to_owned())
                })
                .optional()
            })
            .map_err(map_err("find ticket"))
    }

    fn claim_and_create(
        &mut self,
        t: &Ticket,
        e: &OutboxEvent,
        r: &Receipt,
    ) -> StoreResult<Claimed> {
        if self.in_tx {
            return Err(StoreError {
                kind: DbErrorKind::Other,
                backend: Backend::Sqlite,
                operation: "claim and create",
                code: None,
                message: "runs as a transaction of its own; a transaction is already open".into(),
            });
        }
        self.begin()?;
        match self.claim_in_write_tx(t, e, r) {
            Ok(claimed) => match self.commit() {
                Ok(()) => Ok(claimed),
                Err(err) => {
                    let _ = self.rollback();
                    Err(err)
                }
            },
            Err(err) => {
                let _ = self.rollback();
                Err(err)
            }
        }
    }

    fn find_before_claim(
        &mut self,
        tenant_id: &str,
        key: &str,
    ) -> StoreResult<Option<(Receipt, Option<Ticket>)>> {
        // A replay reads without the write lock: one statement, no transaction.
        self.find_receipt_and_ticket(tenant_id, key)
    }

    fn find_receipt_and_ticket(
        &mut self,
        tenant_id: &str,
        key: &str,
    ) -> StoreResult<Option<(Receipt, Option<Ticket>)>> {
        self.conn
            .prepare_cached(FIND_RECEIPT_AND_TICKET_SQL)
            .and_then(|mut st| {
                st.query_row(params![tenant_id, key], |r| {
                    receipt_and_ticket(r, tenant_id, key)
                })
                .optional()
            })
            .map_err(map_err("find receipt and ticket"))
    }

    fn update_ticket(
        &mut self,
        tenant_id: &str,
        id: Uuid,
        patch: &TicketPatch,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<Ticket>> {
        self.ensure_write_tx()?;
        self.conn
            .prepare_cached(UPDATE_TICKET_SQL)
            .and_then(|mut st| {
                st.query_row(
                    params![
                        tenant_id,
                        id.to_string(),
                        patch.title,
                        patch.body,
                        patch.priority,
                        iso8601(now)
                    ],
                    ticket_from_row,
                )
                .optional()
            })
            .map_err(map_err("update ticket"))
    }
}
