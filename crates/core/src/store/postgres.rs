//! PostgreSQL store through the synchronous `postgres` crate.
//!
//! [`Store::begin`] issues `BEGIN ISOLATION LEVEL …` (READ COMMITTED by default); every
//! statement of the protocol then runs inside it. Errors are classified by SQLSTATE
//! (`postgres::error::SqlState`), never by message text.

use chrono::{DateTime, Utc};
use postgres::error::SqlState;
use postgres::{Client, Config, Row, Statement};
use uuid::Uuid;

use super::call::StoreCall;
use super::migrate::{self, Migration};
use super::{Backend, Claimed, RowCounts, Store, StoreResult, COUNT_SQL};
use crate::domain::{iso8601, OutboxEvent, Receipt, Ticket, TicketPatch};
use crate::error::{DbErrorKind, StoreError};

/// SQL transaction isolation level (SQL standard; PostgreSQL docs §13.2).
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
#[serde(rename_all = "kebab-case")]
pub enum IsolationLevel {
    // `help = None`: `--help` lists the bare names, as it always has; these docs are for
    // the code's readers.
    /// Each statement sees what was committed before it began. What the savepoint protocol relies on (docs/PROTOCOL.md §7.1).
    #[default]
    #[cfg_attr(feature = "cli", value(help = None::<&str>))]
    ReadCommitted,
    /// One snapshot per transaction.
    #[cfg_attr(feature = "cli", value(help = None::<&str>))]
    RepeatableRead,
    /// Serializable snapshot isolation.
    #[cfg_attr(feature = "cli", value(help = None::<&str>))]
    Serializable,
}

impl IsolationLevel {
    /// The three levels PostgreSQL implements, weakest first.
    pub const ALL: [IsolationLevel; 3] = [
        IsolationLevel::ReadCommitted,
        IsolationLevel::RepeatableRead,
        IsolationLevel::Serializable,
    ];

    /// The SQL spelling, e.g. `READ COMMITTED`.
    pub fn sql(self) -> &'static str {
        match self {
            IsolationLevel::ReadCommitted => "READ COMMITTED",
            IsolationLevel::RepeatableRead => "REPEATABLE READ",
            IsolationLevel::Serializable => "SERIALIZABLE",
        }
    }
}

/// What `BEGIN` asks for: one of the three levels, or nothing, so the session's
/// `default_transaction_isolation` (server, database or role setting) decides. The `--isolation`
/// of `create` and `serve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum IsolationChoice {
    /// `BEGIN ISOLATION LEVEL READ COMMITTED` (the default).
    #[default]
    ReadCommitted,
    /// `BEGIN ISOLATION LEVEL REPEATABLE READ`.
    RepeatableRead,
    /// `BEGIN ISOLATION LEVEL SERIALIZABLE`.
    Serializable,
    /// A plain `BEGIN`: the server's `default_transaction_isolation` decides.
    ServerDefault,
}

impl IsolationChoice {
    /// The level asked for explicitly; `None` for [`IsolationChoice::ServerDefault`].
    pub fn level(self) -> Option<IsolationLevel> {
        match self {
            IsolationChoice::ReadCommitted => Some(IsolationLevel::ReadCommitted),
            IsolationChoice::RepeatableRead => Some(IsolationLevel::RepeatableRead),
            IsolationChoice::Serializable => Some(IsolationLevel::Serializable),
            IsolationChoice::ServerDefault => None,
        }
    }
}

/// Classifies a `postgres` error into a [`StoreError`].
pub fn classify(operation: &'static str, e: postgres::Error) -> StoreError {
    let code = e.code().cloned();
    let kind = match &code {
        Some(c) if *c == SqlState::UNIQUE_VIOLATION => DbErrorKind::UniqueViolation,
        Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE => DbErrorKind::SerializationFailure,
        Some(c) if *c == SqlState::T_R_DEADLOCK_DETECTED => DbErrorKind::Deadlock,
        Some(c) if *c == SqlState::IN_FAILED_SQL_TRANSACTION => DbErrorKind::InFailedTransaction,
        Some(c) if *c == SqlState::LOCK_NOT_AVAILABLE || *c == SqlState::QUERY_CANCELED => {
            DbErrorKind::Timeout
        }
        Some(c)
            if c.code().starts_with("08")
                || *c == SqlState::ADMIN_SHUTDOWN
                || *c == SqlState::CRASH_SHUTDOWN
                || *c == SqlState::CANNOT_CONNECT_NOW =>
        {
            DbErrorKind::Connection
        }
        Some(c) if c.code().starts_with("53") => DbErrorKind::Unavailable,
        Some(c) if *c == SqlState::READ_ONLY_SQL_TRANSACTION => DbErrorKind::ReadOnly,
        Some(c) if c.code().starts_with("23") => DbErrorKind::OtherConstraint,
        Some(_) => DbErrorKind::Other,
        None if e.is_closed() => DbErrorKind::Connection,
        None => DbErrorKind::Connection,
    };
    let message = match e.as_db_error() {
        Some(db) => db.message().to_string(),
        None => {
            // "error connecting to server" alone hides the cause (refused, timed out, …).
            let mut text = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(cause) = source {
                text.push_str(": ");
                text.push_str(&cause.to_string());
                source = cause.source();
            }
            text
        }
    };
    StoreError {
        kind,
        backend: Backend::Postgres,
        operation,
        code: code.map(|c| c.code().to_string()),
        message,
    }
}

/// Classifies a `postgres` error of `operation` ([`classify`]), as a `map_err` argument.
pub fn map_err(operation: &'static str) -> impl Fn(postgres::Error) -> StoreError {
    move |e| classify(operation, e)
}

/// What a session of the tool is for; decides its server-side timeouts. Every session the tool
/// opens is built by [`connect_as`] (or [`session_config`]) for one role, and every one gets:
///
/// - a deadline for the TCP connect **and** the startup handshake together: the URL's
///   `connect_timeout` if it gives one, else [`crate::deadline::CONNECT_DEADLINE`] (10 s);
/// - TCP keepalive (first probe after 5 s idle, every 2 s, 3 probes) and `tcp_user_timeout`
///   10 s, so a dead peer is noticed in about 10 s (values the URL sets win);
/// - the role's `statement_timeout`, `lock_timeout` and `idle_in_transaction_session_timeout`
///   (PostgreSQL GUCs, in milliseconds) as startup `-c` options, placed before the URL's own
///   `options`, so a setting the URL's `options` names wins (`0` there turns one off).
///
/// | role | statement_timeout | lock_timeout | idle_in_transaction |
/// |---|---|---|---|
/// | `Admin` (scratch databases, capacity, migrations; [`connect`], so also `create`, `get`, `update`, `prune`) | 60 s | 30 s | 60 s |
/// | `Monitor` (setup, `pg_locks` polls, counts, ground truth) | 10 s | 5 s | 60 s |
/// | `Racer` (a racer's protocol session, `worker`) | 120 s | 120 s | 120 s |
/// | `Controller { lock_within }` (barrier lock holder) | `lock_within` + 10 s | `lock_within` | 2 × `lock_within` + 30 s |
/// | `Command` (`bench`'s sessions) | 120 s | 30 s | 60 s |
/// | `Serve` (`serve`'s pool) | not set | not set | 60 s |
///
/// `Serve` leaves statement and lock timeouts to the database and role settings
/// (`ALTER DATABASE … SET statement_timeout`), as for any service: a startup option would
/// override them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionRole {
    /// Creates and drops scratch databases, checks capacity, migrates.
    Admin,
    /// Runs setup, polls `pg_locks`, reads counts and ground truth.
    Monitor,
    /// A racer's session: its statements may queue behind a barrier.
    Racer,
    /// Holds the barrier lock; must take it within `lock_within` (the barrier's timeout).
    Controller {
        /// The barrier's timeout: the longest the controller waits for its lock.
        lock_within: std::time::Duration,
    },
    /// A measuring session of `bench` on the user's database.
    Command,
    /// A pooled session of `serve`.
    Serve,
}

impl SessionRole {
    /// (`statement_timeout`, `lock_timeout`, `idle_in_transaction_session_timeout`) in
    /// milliseconds; `None` leaves the server's setting.
    pub fn timeouts_ms(self) -> [Option<u64>; 3] {
        const S: u64 = 1000;
        match self {
            SessionRole::Admin => [Some(60 * S), Some(30 * S), Some(60 * S)],
            SessionRole::Monitor => [Some(10 * S), Some(5 * S), Some(60 * S)],
            SessionRole::Racer => [Some(120 * S), Some(120 * S), Some(120 * S)],
            SessionRole::Controller { lock_within } => {
                let ms = (lock_within.as_millis() as u64).max(1);
                [Some(ms + 10 * S), Some(ms), Some(2 * ms + 30 * S)]
            }
            SessionRole::Command => [Some(120 * S), Some(30 * S), Some(60 * S)],
            SessionRole::Serve => [None, None, Some(60 * S)],
        }
    }

    /// How long the watchdog lets one watched call of this role wait before it shuts the
    /// connections to the server down ([`crate::deadline::watch`]): the role's statement
    /// timeout plus 5 s, so the server's own timeout answers first when the server is alive.
    pub fn hard_deadline(self) -> std::time::Duration {
        let ms = self.timeouts_ms()[0].unwrap_or(120_000);
        std::time::Duration::from_millis(ms + 5_000)
    }

    /// [`SessionRole::hard_deadline`] for a session made from `config`: a
    /// `statement_timeout` in the URL's `options` (`-c statement_timeout=N`, milliseconds, or
    /// with a unit `ms`, `s`, `min`) replaces the role's.
    pub fn hard_deadline_for(self, config: &Config) -> std::time::Duration {
        match config.get_options().and_then(url_statement_timeout_ms) {
            Some(ms) if ms > 0 => std::time::Duration::from_millis(ms + 5_000),
            _ => self.hard_deadline(),
        }
    }
}

/// The `statement_timeout` an `options` string sets, in milliseconds.
fn url_statement_timeout_ms(options: &str) -> Option<u64> {
    let at = options.rfind("statement_timeout")?;
    let value = options[at + "statement_timeout".len()..]
        .trim_start_matches([' ', '='])
        .split(' ')
        .next()?
        .trim_matches('\'');
    let digits: String = value.chars().take_while(char::is_ascii_digit).collect();
    let n: u64 = digits.parse().ok()?;
    Some(match value[digits.len()..].trim() {
        "" | "ms" => n,
        "s" => n * 1000,
        "min" => n * 60_000,
        _ => return None,
    })
}

/// `config` with the settings of `role` (see [`SessionRole`]); what the URL sets wins.
pub fn session_config(config: &Config, role: SessionRole) -> Config {
    use std::time::Duration;
    let mut c = config.clone();
    if c.get_keepalives_idle() == Duration::from_secs(2 * 60 * 60) {
        c.keepalives_idle(Duration::from_secs(5));
    }
    if c.get_keepalives_interval().is_none() {
        c.keepalives_interval(Duration::from_secs(2));
    }
    if c.get_keepalives_retries().is_none() {
        c.keepalives_retries(3);
    }
    if c.get_tcp_user_timeout().is_none() {
        c.tcp_user_timeout(Duration::from_secs(10));
    }
    let theirs = c.get_options().unwrap_or("").to_string();
    let names = [
        "statement_timeout",
        "lock_timeout",
        "idle_in_transaction_session_timeout",
    ];
    let mut options: Vec<String> = names
        .iter()
        .zip(role.timeouts_ms())
        .filter(|(name, _)| !theirs.contains(*name))
        .filter_map(|(name, ms)| ms.map(|ms| format!("-c {name}={ms}")))
        .collect();
    if !theirs.is_empty() {
        options.push(theirs);
    }
    if !options.is_empty() {
        c.options(&options.join(" "));
    }
    c
}

/// Connects as a [`SessionRole::Admin`] session: [`connect_as`].
///
/// Will return `Err` as [`connect_as`] does.
pub fn connect(config: &Config) -> StoreResult<Client> {
    connect_as(config, SessionRole::Admin)
}

/// Connects without TLS (the harness targets loopback servers) as a session for `role`
/// ([`SessionRole`]): the connect and startup handshake end within the URL's
/// `connect_timeout` or 10 s.
///
/// Will return `Err` (kind `Connection`) if the server cannot be reached, refuses the login,
/// or does not finish the handshake in time (the message names `HOST:PORT`).
pub fn connect_as(config: &Config, role: SessionRole) -> StoreResult<Client> {
    let session = session_config(config, role);
    let peer = crate::deadline::Peer::of(config);
    let within = config
        .get_connect_timeout()
        .copied()
        .unwrap_or(crate::deadline::CONNECT_DEADLINE);
    match crate::deadline::connect_within(&session, &peer, within) {
        Ok(result) => result.map_err(|e| {
            let mut err = classify("connect", e);
            if !err.message.contains(peer.label()) {
                err.message = format!("{} (PostgreSQL at {peer})", err.message);
            }
            err
        }),
        Err(gave_up) => Err(StoreError {
            kind: DbErrorKind::Connection,
            backend: Backend::Postgres,
            operation: "connect",
            code: None,
            message: gave_up.to_string(),
        }),
    }
}

struct Statements {
    find_receipt: Statement,
    insert_ticket: Statement,
    insert_outbox: Statement,
    insert_receipt: Statement,
    insert_receipt_if_absent: Statement,
    find_ticket: Statement,
    update_ticket: Statement,
    /// The `single-statement` protocol's two statements. Prepared at connect like the others
    /// (not at first use): a racer held by a table-lock barrier must wait at Bind, just before
    /// its statement's snapshot, not in a Parse one round trip earlier, or a slow loser's
    /// snapshot sees the winner's commit and the race's forced path turns on timing.
    claim_and_create: Statement,
    find_receipt_and_ticket: Statement,
}

/// Receipt lookup: `$1` tenant, `$2` key.
pub const FIND_RECEIPT_SQL: &str =
    "SELECT tenant_id, idempotency_key, payload_hash, ticket_id, created_at \
     FROM idempotency_receipts WHERE tenant_id = $1 AND idempotency_key = $2";
/// Ticket insert: `$1..$10` in [`Ticket`] field order.
pub const INSERT_TICKET_SQL: &str = concat!(
    "INSERT INTO tickets (",
    ticket_columns!(),
    ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
);
/// Outbox insert: `$1..$6` in [`OutboxEvent`] field order.
pub const INSERT_OUTBOX_SQL: &str =
    "INSERT INTO outbox_events (id, aggregate_id, tenant_id, event_type, payload_json, occurred_at) \
     VALUES ($1, $2, $3, $4, $5, $6)";
/// Receipt insert: `$1..$5` in [`Receipt`] field order.
pub const INSERT_RECEIPT_SQL: &str =
    "INSERT INTO idempotency_receipts (tenant_id, idempotency_key, payload_hash, ticket_id, created_at) \
     VALUES ($1, $2, $3, $4, $5)";
/// Receipt insert that yields to an existing receipt: `$1..$5` as [`INSERT_RECEIPT_SQL`];
/// returns one row when it inserted, none when the key was taken.
pub const INSERT_RECEIPT_IF_ABSENT_SQL: &str =
    "INSERT INTO idempotency_receipts (tenant_id, idempotency_key, payload_hash, ticket_id, created_at) \
     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (tenant_id, idempotency_key) DO NOTHING RETURNING 1";
/// Ticket read: `$1` tenant, `$2` id.
pub const FIND_TICKET_SQL: &str = concat!(
    "SELECT ",
    ticket_columns!(),
    " FROM tickets WHERE tenant_id = $1 AND id = $2"
);
/// The `single-statement` protocol's statement (docs/PROTOCOL.md §5.1): receipt `$1..$5` in
/// [`Receipt`] field order, ticket `$6..$15` in [`Ticket`] field order, event `$16..$21` in
/// [`OutboxEvent`] field order. The receipt's `ON CONFLICT DO NOTHING` claims the key; the
/// ticket and event CTEs insert only from its `RETURNING` row, so only when the key was won
/// (a data-modifying CTE runs to completion whether or not the query reads it). Always
/// returns one row: `won` (1 or 0), then the receipt columns and the ticket columns of the
/// receipt this statement's snapshot sees for the key (all NULL when none; the claim's own
/// row is not visible to the statement, so NULL when won). The receipt's foreign key is
/// checked at commit, the outbox row's at the end of the statement.
pub const CLAIM_AND_CREATE_SQL: &str = concat!(
    "WITH claim AS (",
    "INSERT INTO idempotency_receipts (tenant_id, idempotency_key, payload_hash, ticket_id, created_at) ",
    "VALUES ($1, $2, $3, $4, $5) ON CONFLICT (tenant_id, idempotency_key) DO NOTHING RETURNING 1), ",
    "new_ticket AS (INSERT INTO tickets (",
    ticket_columns!(),
    ") SELECT $6, $7, $8, $9, $10, $11, $12, $13, $14, $15 FROM claim), ",
    "new_event AS (INSERT INTO outbox_events (id, aggregate_id, tenant_id, event_type, payload_json, occurred_at) ",
    "SELECT $16, $17, $18, $19, $20, $21 FROM claim) ",
    "SELECT (SELECT count(*) FROM claim) AS won, ",
    "r.tenant_id, r.idempotency_key, r.payload_hash, r.ticket_id, r.created_at, ",
    "t.id, t.tenant_id, t.actor_id, t.title, t.body, t.priority, t.status, t.version, t.created_at, t.updated_at ",
    "FROM (VALUES (1)) AS one (x) ",
    "LEFT JOIN idempotency_receipts r ON r.tenant_id = $1 AND r.idempotency_key = $2 ",
    "LEFT JOIN tickets t ON t.tenant_id = r.tenant_id AND t.id = r.ticket_id"
);
/// The receipt for (`$1` tenant, `$2` key) and its ticket (NULL columns when missing), in
/// one statement: receipt columns then ticket columns, as [`CLAIM_AND_CREATE_SQL`] without
/// `won`.
pub const FIND_RECEIPT_AND_TICKET_SQL: &str = concat!(
    "SELECT r.tenant_id, r.idempotency_key, r.payload_hash, r.ticket_id, r.created_at, ",
    "t.id, t.tenant_id, t.actor_id, t.title, t.body, t.priority, t.status, t.version, t.created_at, t.updated_at ",
    "FROM idempotency_receipts r LEFT JOIN tickets t ON t.tenant_id = r.tenant_id AND t.id = r.ticket_id \
     WHERE r.tenant_id = $1 AND r.idempotency_key = $2"
);
/// Ticket update: `$1` tenant, `$2` id, `$3..$5` title/body/priority (NULL keeps), `$6` time.
pub const UPDATE_TICKET_SQL: &str = concat!(
    "UPDATE tickets SET title = coalesce($3, title), body = coalesce($4, body), \
     priority = coalesce($5, priority), version = version + 1, updated_at = $6 \
     WHERE tenant_id = $1 AND id = $2 RETURNING ",
    ticket_columns!()
);

/// A value rendered as a PostgreSQL literal by [`call_sql`].
enum Lit<'a> {
    Text(&'a str),
    Uuid(Uuid),
    Time(DateTime<Utc>),
    Int(i64),
    OptText(Option<&'a str>),
}

impl Lit<'_> {
    fn render(&self) -> String {
        match self {
            Lit::Text(t) | Lit::OptText(Some(t)) => quote_literal(t),
            Lit::OptText(None) => "NULL".into(),
            Lit::Uuid(u) => format!("'{u}'"),
            Lit::Time(t) => format!("'{}'", t.format("%Y-%m-%dT%H:%M:%S%.6fZ")),
            Lit::Int(i) => i.to_string(),
        }
    }
}

/// `text` as a SQL string literal. Plain text becomes a standard literal (single quotes,
/// embedded quotes doubled; `standard_conforming_strings = on`, the default since 9.1). Text
/// with a backslash or a brace becomes an escape string `E'…'` with `\\`, `\x7b`, `\x7d`,
/// so the literal holds no brace: an isolation-tester spec block ends at the first `}`.
pub fn quote_literal(text: &str) -> String {
    if !text.contains(['\\', '{', '}']) {
        return format!("'{}'", text.replace('\'', "''"));
    }
    let mut out = String::from("E'");
    for c in text.chars() {
        match c {
            '\'' => out.push_str("''"),
            '\\' => out.push_str("\\\\"),
            '{' => out.push_str("\\x7b"),
            '}' => out.push_str("\\x7d"),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// Replaces `$N` placeholders in `sql` with the rendered `params[N-1]`.
fn bind(sql: &str, params: &[Lit<'_>]) -> String {
    let mut out = String::with_capacity(sql.len() + 64);
    let mut chars = sql.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c != '$' {
            out.push(c);
            continue;
        }
        let mut end = i + 1;
        while let Some((j, d)) = chars.peek().copied() {
            if d.is_ascii_digit() {
                end = j + 1;
                chars.next();
            } else {
                break;
            }
        }
        match sql[i + 1..end].parse::<usize>() {
            Ok(n) if (1..=params.len()).contains(&n) => out.push_str(&params[n - 1].render()),
            _ => out.push_str(&sql[i..end]),
        }
    }
    out
}

/// A ticket's columns as literals, in [`INSERT_TICKET_SQL`]'s parameter order.
fn ticket_lits(t: &Ticket) -> [Lit<'_>; 10] {
    [
        Lit::Uuid(t.id),
        Lit::Text(&t.tenant_id),
        Lit::Text(&t.actor_id),
        Lit::Text(&t.title),
        Lit::Text(&t.body),
        Lit::Text(&t.priority),
        Lit::Text(&t.status),
        Lit::Int(t.version),
        Lit::Time(t.created_at),
        Lit::Time(t.updated_at),
    ]
}

/// An outbox row's columns as literals, in [`INSERT_OUTBOX_SQL`]'s parameter order.
fn event_lits(e: &OutboxEvent) -> [Lit<'_>; 6] {
    [
        Lit::Uuid(e.id),
        Lit::Uuid(e.aggregate_id),
        Lit::Text(&e.tenant_id),
        Lit::Text(&e.event_type),
        Lit::Text(&e.payload_json),
        Lit::Time(e.occurred_at),
    ]
}

/// A receipt's columns as literals, in [`INSERT_RECEIPT_SQL`]'s parameter order.
fn receipt_lits(r: &Receipt) -> [Lit<'_>; 5] {
    [
        Lit::Text(&r.tenant_id),
        Lit::Text(&r.idempotency_key),
        Lit::Text(&r.payload_hash),
        Lit::Uuid(r.ticket_id),
        Lit::Time(r.created_at),
    ]
}

/// The SQL this store sends for `call`, with the arguments as literals: what an exported
/// isolation-tester spec replays. `isolation` is the level `BEGIN` uses. The barrier step
/// renders as `advisory_sql` (or a comment when the lock mode needs no racer-side wait).
pub fn call_sql(call: &StoreCall, isolation: IsolationLevel, advisory_sql: Option<&str>) -> String {
    match call {
        StoreCall::Begin => format!("BEGIN ISOLATION LEVEL {}", isolation.sql()),
        StoreCall::Savepoint { name } => format!("SAVEPOINT {name}"),
        StoreCall::RollbackToSavepoint { name } => format!("ROLLBACK TO SAVEPOINT {name}"),
        StoreCall::ReleaseSavepoint { name } => format!("RELEASE SAVEPOINT {name}"),
        StoreCall::Commit => "COMMIT".into(),
        StoreCall::Rollback => "ROLLBACK".into(),
        StoreCall::FindReceipt { tenant_id, key } => {
            bind(FIND_RECEIPT_SQL, &[Lit::Text(tenant_id), Lit::Text(key)])
        }
        StoreCall::InsertTicket { ticket: t } => bind(INSERT_TICKET_SQL, &ticket_lits(t)),
        StoreCall::InsertOutbox { event: e } => bind(INSERT_OUTBOX_SQL, &event_lits(e)),
        StoreCall::InsertReceiptIfAbsent { receipt: r } => {
            bind(INSERT_RECEIPT_IF_ABSENT_SQL, &receipt_lits(r))
        }
        StoreCall::InsertReceipt { receipt: r } => bind(INSERT_RECEIPT_SQL, &receipt_lits(r)),
        StoreCall::FindTicket { tenant_id, id } => {
            bind(FIND_TICKET_SQL, &[Lit::Text(tenant_id), Lit::Uuid(*id)])
        }
        StoreCall::FindReceiptAndTicket { tenant_id, key } => bind(
            FIND_RECEIPT_AND_TICKET_SQL,
            &[Lit::Text(tenant_id), Lit::Text(key)],
        ),
        StoreCall::ClaimAndCreate {
            ticket: t,
            event: e,
            receipt: r,
        } => {
            let mut lits: Vec<Lit<'_>> = receipt_lits(r).into();
            lits.extend(ticket_lits(t));
            lits.extend(event_lits(e));
            bind(CLAIM_AND_CREATE_SQL, &lits)
        }
        StoreCall::UpdateTicket {
            tenant_id,
            id,
            patch,
            now,
        } => bind(
            UPDATE_TICKET_SQL,
            &[
                Lit::Text(tenant_id),
                Lit::Uuid(*id),
                Lit::OptText(patch.title.as_deref()),
                Lit::OptText(patch.body.as_deref()),
                Lit::OptText(patch.priority.as_deref()),
                Lit::Time(*now),
            ],
        ),
        StoreCall::Barrier => advisory_sql
            .map(str::to_string)
            .unwrap_or_else(|| "SELECT 'barrier: no racer-side wait in this lock mode'".into()),
    }
}

/// A PostgreSQL session.
pub struct PgStore {
    client: Client,
    statements: Statements,
    isolation: IsolationLevel,
    backend_pid: i32,
    /// A `ROLLBACK` failed: the session may still be inside a transaction (aborted or not)
    /// and must not be used again (see [`PgStore::is_broken`]).
    rollback_failed: bool,
    /// `false`: `begin` sends a plain `BEGIN` and the session's default level applies
    /// ([`IsolationChoice::ServerDefault`]); `isolation` then records that default.
    explicit_isolation: bool,
    /// The session's default level has been set to `isolation` (`SET SESSION
    /// CHARACTERISTICS`), so a statement outside `BEGIN` runs at it: done once, before the
    /// first [`Store::claim_and_create`].
    session_isolation_set: bool,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("backend_pid", &self.backend_pid)
            .field("isolation", &self.isolation)
            .finish()
    }
}

impl PgStore {
    /// Connects as a [`SessionRole::Racer`], applies pending migrations and prepares the
    /// protocol's statements.
    ///
    /// Will return `Err` if the server is unreachable or a migration fails.
    pub fn connect(config: &Config, isolation: IsolationLevel) -> StoreResult<Self> {
        Self::connect_as(config, isolation, SessionRole::Racer)
    }

    /// As [`PgStore::connect`], as a session for `role` ([`SessionRole`]).
    ///
    /// Will return `Err` as [`PgStore::connect`] does.
    pub fn connect_as(
        config: &Config,
        isolation: IsolationLevel,
        role: SessionRole,
    ) -> StoreResult<Self> {
        let mut client = connect_as(config, role)?;
        migrate_client(&mut client)?;
        Self::from_client(client, isolation)
    }

    /// Wraps an already migrated connection.
    pub fn from_client(mut client: Client, isolation: IsolationLevel) -> StoreResult<Self> {
        let prep = |c: &mut Client, sql: &str| c.prepare(sql).map_err(map_err("prepare"));
        let statements = Statements {
            find_receipt: prep(&mut client, FIND_RECEIPT_SQL)?,
            insert_ticket: prep(&mut client, INSERT_TICKET_SQL)?,
            insert_outbox: prep(&mut client, INSERT_OUTBOX_SQL)?,
            insert_receipt: prep(&mut client, INSERT_RECEIPT_SQL)?,
            insert_receipt_if_absent: prep(&mut client, INSERT_RECEIPT_IF_ABSENT_SQL)?,
            find_ticket: prep(&mut client, FIND_TICKET_SQL)?,
            update_ticket: prep(&mut client, UPDATE_TICKET_SQL)?,
            claim_and_create: prep(&mut client, CLAIM_AND_CREATE_SQL)?,
            find_receipt_and_ticket: prep(&mut client, FIND_RECEIPT_AND_TICKET_SQL)?,
        };
        let backend_pid: i32 = client
            .query_one("SELECT pg_backend_pid()", &[])
            .map_err(map_err("read backend pid"))?
            .get(0);
        Ok(PgStore {
            client,
            statements,
            isolation,
            backend_pid,
            rollback_failed: false,
            explicit_isolation: true,
            session_isolation_set: false,
        })
    }

    /// Wraps an already migrated connection whose transactions use `choice`: an explicit
    /// level, or (for [`IsolationChoice::ServerDefault`]) a plain `BEGIN` under the session's
    /// `default_transaction_isolation`, which is read once and reported by
    /// [`PgStore::isolation`] (`read uncommitted` behaves as, and is reported as, READ
    /// COMMITTED in PostgreSQL).
    ///
    /// Will return `Err` if preparing the statements or reading the default fails.
    pub fn from_client_choice(mut client: Client, choice: IsolationChoice) -> StoreResult<Self> {
        let Some(level) = choice.level() else {
            let default: String = client
                .query_one("SHOW default_transaction_isolation", &[])
                .map_err(map_err("read default isolation"))?
                .get(0);
            let level = match default.as_str() {
                "serializable" => IsolationLevel::Serializable,
                "repeatable read" => IsolationLevel::RepeatableRead,
                _ => IsolationLevel::ReadCommitted,
            };
            let mut store = Self::from_client(client, level)?;
            store.explicit_isolation = false;
            return Ok(store);
        };
        Self::from_client(client, level)
    }

    /// `true` when this session must be discarded rather than reused: the connection is
    /// closed, or a `ROLLBACK` failed (for example cancelled by `statement_timeout`, SQLSTATE
    /// 57014), so the session may still sit in a transaction, aborted ones answering every
    /// later command with SQLSTATE 25P02. A pool asks this when a session comes back.
    pub fn is_broken(&self) -> bool {
        self.rollback_failed || self.client.is_closed()
    }

    /// Checks, with one round trip, that the session is idle **outside** a transaction:
    /// `statement_timestamp()` equals `transaction_timestamp()` only during the first command
    /// of a transaction (PostgreSQL docs §9.9.5), so the check's own statement is the first of
    /// an implicit transaction exactly when no transaction was open. Inside an aborted
    /// transaction the statement fails with SQLSTATE 25P02. A pool runs this before it hands
    /// a session out.
    ///
    /// Will return `Err` (kind [`DbErrorKind::InFailedTransaction`] inside an open or aborted
    /// transaction, `Connection` when the session is gone) when the session must not be used.
    pub fn check_idle(&mut self) -> StoreResult<()> {
        if self.rollback_failed {
            return Err(StoreError {
                kind: DbErrorKind::InFailedTransaction,
                backend: Backend::Postgres,
                operation: "check session",
                code: None,
                message: "an earlier ROLLBACK failed; the session may still be in a transaction"
                    .into(),
            });
        }
        let messages = self
            .client
            .simple_query("SELECT statement_timestamp() = transaction_timestamp()")
            .map_err(map_err("check session"))?;
        let first_command = messages.iter().any(|m| match m {
            postgres::SimpleQueryMessage::Row(row) => row.get(0) == Some("t"),
            _ => false,
        });
        if first_command {
            Ok(())
        } else {
            Err(StoreError {
                kind: DbErrorKind::InFailedTransaction,
                backend: Backend::Postgres,
                operation: "check session",
                code: None,
                message: "the session is inside an open transaction".into(),
            })
        }
    }

    /// The server process id of this session (`pg_backend_pid()`), as seen in `pg_locks`.
    pub fn backend_pid(&self) -> i32 {
        self.backend_pid
    }

    /// The isolation level `begin` uses.
    pub fn isolation(&self) -> IsolationLevel {
        self.isolation
    }

    /// The underlying client, for harness queries.
    pub fn client(&mut self) -> &mut Client {
        &mut self.client
    }

    /// Deletes receipts created before `cutoff` (see [`super::prune_receipts`]).
    pub fn prune_receipts(&mut self, cutoff: DateTime<Utc>) -> StoreResult<u64> {
        self.client
            .execute(&super::PRUNE_SQL.replace("{p}", "$1"), &[&cutoff])
            .map_err(map_err("prune receipts"))
    }

    /// Counts a tenant's tickets, receipts and `ticket.created` events.
    pub fn row_counts(&mut self, tenant_id: &str) -> StoreResult<RowCounts> {
        row_counts(&mut self.client, tenant_id)
    }
}

/// Receipts stored for (tenant, key) as (payload hash, ticket id), read by direct SQL.
pub fn receipts_for(
    client: &mut Client,
    tenant_id: &str,
    key: &str,
) -> StoreResult<Vec<(String, Uuid)>> {
    Ok(client
        .query(
            "SELECT payload_hash, ticket_id FROM idempotency_receipts \
             WHERE tenant_id = $1 AND idempotency_key = $2 ORDER BY created_at",
            &[&tenant_id, &key],
        )
        .map_err(map_err("read receipts"))?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect())
}

/// Every row of the tenants whose id starts with `prefix` (see [`super::Dump`]).
pub fn dump(client: &mut Client, prefix: &str) -> StoreResult<super::Dump> {
    let p = super::like_prefix(prefix);
    let q = |i: usize| super::DUMP_SQL[i].replace("{p}", "$1");
    let e = map_err("dump");
    let rows = |client: &mut Client, i: usize| client.query(&q(i), &[&p]).map_err(&e);
    Ok(super::Dump {
        tickets: rows(client, 0)?
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
            .collect(),
        events: rows(client, 1)?
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
            .collect(),
        receipts: rows(client, 2)?.iter().map(receipt_from_row).collect(),
        dangling_receipts: rows(client, 3)?[0].get(0),
    })
}

/// Counts a tenant's tickets, receipts and `ticket.created` events on any connection.
pub fn row_counts(client: &mut Client, tenant_id: &str) -> StoreResult<RowCounts> {
    let mut n = [0i64; 3];
    for (slot, sql) in n.iter_mut().zip(COUNT_SQL) {
        *slot = client
            .query_one(&sql.replace("{p}", "$1"), &[&tenant_id])
            .map_err(map_err("count rows"))?
            .get(0);
    }
    Ok(RowCounts {
        tickets: n[0],
        receipts: n[1],
        created_events: n[2],
    })
}

/// Applies pending migrations under a transaction-scoped advisory lock, so concurrent
/// processes migrating one database serialize. Returns the versions applied now.
///
/// Will return `Err` if a statement fails or a recorded checksum differs from the file's.
pub fn migrate_client(client: &mut Client) -> StoreResult<Vec<i64>> {
    if migrated_already(client)? {
        return Ok(Vec::new());
    }
    let mut applied = Vec::new();
    for m in migrate::POSTGRES {
        if apply_one(client, m)? {
            applied.push(m.version);
        }
    }
    Ok(applied)
}

/// Whether the ledger already records every migration with the file's checksum: two reads,
/// no lock and no DDL, so a session on a migrated database (every one after the first)
/// connects in two round trips instead of six per migration. Anything else (no ledger, a
/// migration missing, a checksum that differs) is `false`, and [`apply_one`] decides under
/// the lock, drift errors included. Only committed ledger rows are seen, and a migration's
/// row commits with its DDL.
///
/// Will return `Err` if a read fails.
fn migrated_already(client: &mut Client) -> StoreResult<bool> {
    use postgres::SimpleQueryMessage;
    // Simple queries: one round trip each, where a parameterless `query` takes two.
    let rows = |client: &mut Client, sql: &str, op: &'static str| -> StoreResult<Vec<_>> {
        Ok(client
            .simple_query(sql)
            .map_err(map_err(op))?
            .into_iter()
            .filter_map(|m| match m {
                SimpleQueryMessage::Row(r) => Some(r),
                _ => None,
            })
            .collect())
    };
    let ledger = rows(
        client,
        "SELECT to_regclass('schema_migrations') IS NOT NULL",
        "migrate: find ledger",
    )?;
    if ledger.first().and_then(|r| r.get(0)) != Some("t") {
        return Ok(false);
    }
    let recorded: std::collections::HashMap<String, String> = rows(
        client,
        "SELECT version, checksum FROM schema_migrations",
        "migrate: read ledger",
    )?
    .iter()
    .filter_map(|r| Some((r.get(0)?.to_string(), r.get(1)?.to_string())))
    .collect();
    Ok(migrate::POSTGRES
        .iter()
        .all(|m| recorded.get(&m.version.to_string()) == Some(&m.checksum())))
}

fn apply_one(client: &mut Client, m: &Migration) -> StoreResult<bool> {
    let mut tx = client.transaction().map_err(map_err("migrate: begin"))?;
    // IF NOT EXISTS would otherwise send a NOTICE on every connect.
    tx.batch_execute("SET LOCAL client_min_messages = warning")
        .map_err(map_err("migrate: quiet"))?;
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtext('ticketflow.migrate'))",
        &[],
    )
    .map_err(map_err("migrate: lock"))?;
    tx.batch_execute(migrate::LEDGER_DDL)
        .map_err(map_err("migrate: ledger"))?;
    let recorded: Option<String> = tx
        .query_opt(
            "SELECT checksum FROM schema_migrations WHERE version = $1",
            &[&m.version],
        )
        .map_err(map_err("migrate: read ledger"))?
        .map(|r| r.get(0));
    match recorded {
        Some(sum) if sum == m.checksum() => Ok(false),
        Some(sum) => Err(StoreError {
            kind: DbErrorKind::Other,
            backend: Backend::Postgres,
            operation: "migrate: checksum",
            code: None,
            message: migrate::drift_message(m, &sum),
        }),
        None => {
            tx.batch_execute(m.sql).map_err(map_err("migrate: apply"))?;
            tx.execute(
                "INSERT INTO schema_migrations (version, name, checksum, applied_at) VALUES ($1, $2, $3, $4)",
                &[&m.version, &m.name, &m.checksum(), &iso8601(crate::domain::now_utc())],
            )
            .map_err(map_err("migrate: record"))?;
            tx.commit().map_err(map_err("migrate: commit"))?;
            Ok(true)
        }
    }
}

/// Columns tenant_id, idempotency_key, payload_hash, ticket_id, created_at.
fn receipt_from_row(r: &Row) -> Receipt {
    receipt_at(r, 0)
}

fn receipt_at(r: &Row, at: usize) -> Receipt {
    Receipt {
        tenant_id: r.get(at),
        idempotency_key: r.get(at + 1),
        payload_hash: r.get(at + 2),
        ticket_id: r.get(at + 3),
        created_at: r.get(at + 4),
    }
}

/// A receipt and its ticket from a joined row whose receipt columns start at `at` (NULL
/// receipt columns: no receipt; NULL ticket columns: a dangling receipt).
fn joined_at(r: &Row, at: usize) -> Option<(Receipt, Option<Ticket>)> {
    // A NULL tenant: the LEFT JOIN found no receipt.
    r.get::<_, Option<String>>(at)?;
    let receipt = receipt_at(r, at);
    let ticket = r
        .get::<_, Option<Uuid>>(at + 5)
        .map(|_| ticket_at(r, at + 5));
    Some((receipt, ticket))
}

fn ticket_from_row(r: &Row) -> Ticket {
    ticket_at(r, 0)
}

fn ticket_at(r: &Row, at: usize) -> Ticket {
    Ticket {
        id: r.get(at),
        tenant_id: r.get(at + 1),
        actor_id: r.get(at + 2),
        title: r.get(at + 3),
        body: r.get(at + 4),
        priority: r.get(at + 5),
        status: r.get(at + 6),
        version: r.get(at + 7),
        created_at: r.get(at + 8),
        updated_at: r.get(at + 9),
    }
}

impl Store for PgStore {
    fn backend(&self) -> Backend {
        Backend::Postgres
    }

    fn begin(&mut self) -> StoreResult<()> {
        if !self.explicit_isolation {
            return self.client.batch_execute("BEGIN").map_err(map_err("begin"));
        }
        let sql = format!("BEGIN ISOLATION LEVEL {}", self.isolation.sql());
        self.client.batch_execute(&sql).map_err(map_err("begin"))
    }

    fn savepoint(&mut self, name: &str) -> StoreResult<()> {
        self.client
            .batch_execute(&format!("SAVEPOINT {name}"))
            .map_err(map_err("savepoint"))
    }

    fn rollback_to_savepoint(&mut self, name: &str) -> StoreResult<()> {
        self.client
            .batch_execute(&format!("ROLLBACK TO SAVEPOINT {name}"))
            .map_err(map_err("rollback to savepoint"))
    }

    fn release_savepoint(&mut self, name: &str) -> StoreResult<()> {
        self.client
            .batch_execute(&format!("RELEASE SAVEPOINT {name}"))
            .map_err(map_err("release savepoint"))
    }

    fn commit(&mut self) -> StoreResult<()> {
        self.client
            .batch_execute("COMMIT")
            .map_err(map_err("commit"))
    }

    fn rollback(&mut self) -> StoreResult<()> {
        // ROLLBACK outside a transaction only warns, so this is safe to call on any path. A
        // ROLLBACK that fails (cancelled, timed out) may leave the session in its transaction:
        // the session is then marked broken, so a pool discards it instead of reusing it.
        self.client.batch_execute("ROLLBACK").map_err(|e| {
            self.rollback_failed = true;
            classify("rollback", e)
        })
    }

    fn find_receipt(&mut self, tenant_id: &str, key: &str) -> StoreResult<Option<Receipt>> {
        let row = self
            .client
            .query_opt(&self.statements.find_receipt, &[&tenant_id, &key])
            .map_err(map_err("find receipt"))?;
        Ok(row.as_ref().map(receipt_from_row))
    }

    fn insert_ticket(&mut self, t: &Ticket) -> StoreResult<()> {
        self.client
            .execute(
                &self.statements.insert_ticket,
                &[
                    &t.id,
                    &t.tenant_id,
                    &t.actor_id,
                    &t.title,
                    &t.body,
                    &t.priority,
                    &t.status,
                    &t.version,
                    &t.created_at,
                    &t.updated_at,
                ],
            )
            .map(drop)
            .map_err(map_err("insert ticket"))
    }

    fn insert_outbox(&mut self, e: &OutboxEvent) -> StoreResult<()> {
        self.client
            .execute(
                &self.statements.insert_outbox,
                &[
                    &e.id,
                    &e.aggregate_id,
                    &e.tenant_id,
                    &e.event_type,
                    &e.payload_json,
                    &e.occurred_at,
                ],
            )
            .map(drop)
            .map_err(map_err("insert outbox event"))
    }

    fn insert_receipt(&mut self, r: &Receipt) -> StoreResult<()> {
        self.client
            .execute(
                &self.statements.insert_receipt,
                &[
                    &r.tenant_id,
                    &r.idempotency_key,
                    &r.payload_hash,
                    &r.ticket_id,
                    &r.created_at,
                ],
            )
            .map(drop)
            .map_err(map_err("insert receipt"))
    }

    fn insert_receipt_if_absent(&mut self, r: &Receipt) -> StoreResult<bool> {
        self.client
            .query_opt(
                &self.statements.insert_receipt_if_absent,
                &[
                    &r.tenant_id,
                    &r.idempotency_key,
                    &r.payload_hash,
                    &r.ticket_id,
                    &r.created_at,
                ],
            )
            .map(|row| row.is_some())
            .map_err(map_err("insert receipt on conflict do nothing"))
    }

    fn find_ticket(&mut self, tenant_id: &str, id: Uuid) -> StoreResult<Option<Ticket>> {
        let row = self
            .client
            .query_opt(&self.statements.find_ticket, &[&tenant_id, &id])
            .map_err(map_err("find ticket"))?;
        Ok(row.as_ref().map(ticket_from_row))
    }

    fn update_ticket(
        &mut self,
        tenant_id: &str,
        id: Uuid,
        patch: &TicketPatch,
        now: DateTime<Utc>,
    ) -> StoreResult<Option<Ticket>> {
        let row = self
            .client
            .query_opt(
                &self.statements.update_ticket,
                &[
                    &tenant_id,
                    &id,
                    &patch.title,
                    &patch.body,
                    &patch.priority,
                    &now,
                ],
            )
            .map_err(map_err("update ticket"))?;
        Ok(row.as_ref().map(ticket_from_row))
    }

    fn claim_and_create(
        &mut self,
        t: &Ticket,
        e: &OutboxEvent,
        r: &Receipt,
    ) -> StoreResult<Claimed> {
        // The statement runs outside BEGIN, so at the session's default level: make that
        // the level asked for, once (a plain `BEGIN` store keeps the server's default).
        if self.explicit_isolation && !self.session_isolation_set {
            let sql = format!(
                "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL {}",
                self.isolation.sql()
            );
            self.client
                .batch_execute(&sql)
                .map_err(map_err("set session isolation"))?;
            self.session_isolation_set = true;
        }
        let row = self
            .client
            .query_one(
                &self.statements.claim_and_create,
                &[
                    &r.tenant_id,
                    &r.idempotency_key,
                    &r.payload_hash,
                    &r.ticket_id,
                    &r.created_at,
                    &t.id,
                    &t.tenant_id,
                    &t.actor_id,
                    &t.title,
                    &t.body,
                    &t.priority,
                    &t.status,
                    &t.version,
                    &t.created_at,
                    &t.updated_at,
                    &e.id,
                    &e.aggregate_id,
                    &e.tenant_id,
                    &e.event_type,
                    &e.payload_json,
                    &e.occurred_at,
                ],
            )
            .map_err(map_err("claim and create"))?;
        let won: i64 = row.get(0);
        Ok(match (won, joined_at(&row, 1)) {
            (1, _) => Claimed::Won,
            (_, Some((receipt, ticket))) => Claimed::Met { receipt, ticket },
            (_, None) => Claimed::TakenUnseen,
        })
    }

    fn find_receipt_and_ticket(
        &mut self,
        tenant_id: &str,
        key: &str,
    ) -> StoreResult<Option<(Receipt, Option<Ticket>)>> {
        let row = self
            .client
            .query_opt(
                &self.statements.find_receipt_and_ticket,
                &[&tenant_id, &key],
            )
            .map_err(map_err("find receipt and ticket"))?;
        Ok(row.as_ref().and_then(|r| joined_at(r, 0)))
    }
}

/// [`crate::deadline::watch_result`] for a `postgres` call, with its error classified as
/// [`classify`] does; a deadline that passed is a
/// [`crate::error::DbErrorKind::Connection`] error whose message names the server, the
/// deadline and `what`.
///
/// Will return `Err` as described.
pub fn watch_pg<T>(
    what: &'static str,
    peer: &crate::deadline::Peer,
    hard: std::time::Duration,
    f: impl FnOnce() -> Result<T, postgres::Error>,
) -> Result<T, crate::error::StoreError> {
    match crate::deadline::watch_result(what, peer, hard, f) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(classify(what, e)),
        Err(g) => Err(crate::error::StoreError {
            kind: crate::error::DbErrorKind::Connection,
            backend: Backend::Postgres,
            operation: what,
            code: None,
            message: g.to_string(),
        }),
    }
}
