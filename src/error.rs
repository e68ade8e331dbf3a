//! Typed errors. A backend-neutral [`DbErrorKind`] classifies backend-specific codes
//! (PostgreSQL SQLSTATE, SQLite extended result codes) so callers ask "is this a unique
//! violation?" instead of parsing messages.

use thiserror::Error;
use uuid::Uuid;

/// A request that fails validation: maps to HTTP 422. Nothing was written.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ValidationError {
    /// A required field is the empty string.
    #[error("{field} must not be empty")]
    Empty {
        /// Field name.
        field: &'static str,
    },
    /// A field is over its limit.
    #[error("{field} is {actual} {unit}, over the limit of {limit}")]
    TooLong {
        /// Field name.
        field: &'static str,
        /// The limit.
        limit: usize,
        /// `bytes` or `characters`.
        unit: &'static str,
        /// The size seen.
        actual: usize,
    },
    /// A field contains U+0000, which PostgreSQL text cannot store.
    #[error("{field} contains a NUL character at byte {offset}")]
    NulCharacter {
        /// Field name.
        field: &'static str,
        /// Byte offset of the first NUL.
        offset: usize,
    },
    /// Priority is not one of low, normal, high, urgent.
    #[error("unknown priority {value:?}: expected low, normal, high or urgent")]
    UnknownPriority {
        /// The value given (first 32 characters).
        value: String,
    },
    /// An update that changes nothing.
    #[error("update must set at least one of title, body, priority")]
    EmptyPatch,
}

/// Backend-neutral classification of a database error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DbErrorKind {
    /// PostgreSQL 23505; SQLite `SQLITE_CONSTRAINT_PRIMARYKEY` / `SQLITE_CONSTRAINT_UNIQUE`.
    UniqueViolation,
    /// PostgreSQL 40001.
    SerializationFailure,
    /// PostgreSQL 40P01.
    Deadlock,
    /// SQLite `SQLITE_BUSY` / `SQLITE_LOCKED` (including `SQLITE_BUSY_SNAPSHOT`).
    Busy,
    /// PostgreSQL 25P02: the transaction is aborted and ignores commands until rollback.
    InFailedTransaction,
    /// PostgreSQL 55P03 (lock_not_available) or 57014 (query_canceled, e.g. a timeout).
    Timeout,
    /// The connection is gone or could not be made (PostgreSQL class 08, 57P01..57P03).
    Connection,
    /// Any other constraint violation (foreign key, not null, check).
    OtherConstraint,
    /// Anything else.
    Other,
}

/// An error from a store operation, with its classification and context.
#[derive(Debug, Error)]
#[error("{backend} {operation}: {message}{}", code.as_ref().map(|c| format!(" (code {c})")).unwrap_or_default())]
pub struct StoreError {
    /// Classification; ask this, not the message.
    pub kind: DbErrorKind,
    /// The store that failed.
    pub backend: crate::store::Backend,
    /// What the store was doing, e.g. `insert receipt`.
    pub operation: &'static str,
    /// SQLSTATE for PostgreSQL, the extended result code for SQLite.
    pub code: Option<String>,
    /// The driver's message.
    pub message: String,
}

impl StoreError {
    /// `true` for a unique violation.
    pub fn is_unique_violation(&self) -> bool {
        self.kind == DbErrorKind::UniqueViolation
    }
}

/// Errors of the repository operations.
#[derive(Debug, Error)]
pub enum Error {
    /// Bad input (HTTP 422). Nothing was written.
    #[error("invalid request: {0}")]
    Validation(#[from] ValidationError),
    /// A database error; the transaction was rolled back.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// No ticket with that id in that tenant (HTTP 404). Another tenant's ticket is reported
    /// the same way, so existence never leaks across tenants.
    #[error("ticket {ticket_id} not found")]
    NotFound {
        /// The id asked for.
        ticket_id: Uuid,
    },
    /// A receipt names a ticket that cannot be read: the database broke an invariant
    /// (the receipt's foreign key should make this impossible).
    #[error("receipt for key {idempotency_key:?} points at missing ticket {ticket_id}")]
    DanglingReceipt {
        /// The key.
        idempotency_key: String,
        /// The missing ticket.
        ticket_id: Uuid,
    },
    /// The unique violation on the receipt was raised but no committed receipt could be read
    /// afterwards (for example a wrong isolation level hides the winner).
    #[error("receipt insert for key {idempotency_key:?} hit a unique violation but no winner is visible")]
    WinnerNotVisible {
        /// The key.
        idempotency_key: String,
    },
    /// Every attempt allowed by the retry policy failed with a transient error.
    #[error("gave up after {attempts} attempts: {source}")]
    RetriesExhausted {
        /// Attempts made.
        attempts: u32,
        /// The last attempt's error.
        #[source]
        source: Box<Error>,
    },
    /// A migration failed.
    #[error("migration {version} ({name}) failed: {source}")]
    Migration {
        /// Migration number.
        version: i64,
        /// Migration name.
        name: String,
        /// The cause.
        #[source]
        source: StoreError,
    },
    /// The database URL is not one this tool understands.
    #[error("unsupported database url {0:?}: expected a file path, sqlite://PATH or postgres://… (not :memory:, which keeps nothing)")]
    BadUrl(String),
}

impl Error {
    /// The HTTP status this error maps to: 422 validation, 404 not found, 500 otherwise.
    pub fn http_status(&self) -> u16 {
        match self {
            Error::Validation(_) => 422,
            Error::NotFound { .. } => 404,
            _ => 500,
        }
    }

    /// The database error kind, if this is a store error.
    pub fn db_kind(&self) -> Option<DbErrorKind> {
        match self {
            Error::Store(e) => Some(e.kind),
            Error::RetriesExhausted { source, .. } => source.db_kind(),
            Error::Migration { source, .. } => Some(source.kind),
            _ => None,
        }
    }
}

/// Result alias for repository operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;
