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
    /// PostgreSQL 25006 (read_only_sql_transaction): the server accepts no writes, as a hot
    /// standby or a demoted primary answers (or `default_transaction_read_only` is on).
    ReadOnly,
    /// The server is short of a resource: PostgreSQL class 53 (insufficient resources: disk
    /// full, out of memory, too many connections); SQLite `SQLITE_FULL` / `SQLITE_NOMEM`.
    Unavailable,
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
    pub backend: crate::backend::Backend,
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
    /// `--isolation` was given for a SQLite database, whose transactions are always
    /// serializable (SQLite docs, "Isolation In SQLite").
    #[error(
        "{} applies to PostgreSQL only: SQLite transactions are always serializable",
        crate::flags::ISOLATION
    )]
    IsolationNotApplicable,
    /// The database URL is not one this tool understands (held with any password hidden).
    #[error("unsupported database url {0:?}: expected a file path, sqlite://PATH or postgres://… (not :memory:, which keeps nothing)")]
    BadUrl(String),
    /// Another request claimed this key and has not completed it (HTTP 503, retry with the
    /// same key): only the served variant `claim-never-expires` answers it, since the real
    /// protocol commits a key and its answer together. Nothing was written.
    #[error(
        "a request with idempotency key {idempotency_key:?} is in progress (its claim is held)"
    )]
    KeyInProgress {
        /// The key.
        idempotency_key: String,
    },
}

impl Error {
    /// The HTTP status this error maps to: 422 validation, 404 not found, 503 for a
    /// [`Transient`] failure, 500 otherwise (a bug or a broken invariant).
    pub fn http_status(&self) -> u16 {
        match self {
            Error::Validation(_) => 422,
            Error::NotFound { .. } => 404,
            _ if self.transient().is_some() => 503,
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

    /// `Some` when the database could not complete the request **now** and the same request
    /// may succeed when sent again: a timeout or cancel (SQLSTATE 57014, 55P03), a lost
    /// connection (class 08, 57P01..57P03), a server short of resources (class 53), or
    /// contention still there after the last retry (40001, 40P01, SQLite busy, a winner the
    /// snapshot cannot see). `None` for everything else, which is a bug or a broken invariant
    /// (a 25P02 reaching a caller means a session was reused inside a failed transaction).
    ///
    /// What was written follows from where it failed: the protocol commits once, at the end,
    /// so any failure before `COMMIT`, and a `COMMIT` the server refused, wrote nothing; only a
    /// connection lost during `COMMIT` leaves the outcome unknown (the commit may have
    /// happened).
    pub fn transient(&self) -> Option<Transient> {
        match self {
            Error::Store(e) => {
                let cause = match e.kind {
                    DbErrorKind::Timeout => TransientCause::Timeout,
                    DbErrorKind::Connection => TransientCause::Connection,
                    DbErrorKind::Unavailable => TransientCause::Overloaded,
                    DbErrorKind::ReadOnly => TransientCause::ReadOnly,
                    DbErrorKind::SerializationFailure
                    | DbErrorKind::Deadlock
                    | DbErrorKind::Busy => TransientCause::Contention,
                    _ => return None,
                };
                let written = if e.kind == DbErrorKind::Connection && e.operation == "commit" {
                    Written::Unknown
                } else {
                    Written::Nothing
                };
                Some(Transient { cause, written })
            }
            Error::WinnerNotVisible { .. } => Some(Transient {
                cause: TransientCause::Contention,
                written: Written::Nothing,
            }),
            Error::RetriesExhausted { source, .. } => source.transient(),
            Error::KeyInProgress { .. } => Some(Transient {
                cause: TransientCause::KeyInProgress,
                written: Written::Nothing,
            }),
            _ => None,
        }
    }
}

/// A failure that a retry of the same request may cure (see [`Error::transient`]): HTTP 503
/// with `Retry-After`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transient {
    /// Why the request could not be completed.
    pub cause: TransientCause,
    /// What the caller may assume was written.
    pub written: Written,
}

/// Why a [`Transient`] failure happened, in words a caller can act on (no SQL, no internal
/// step names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TransientCause {
    /// A statement or lock wait timed out, or was cancelled (SQLSTATE 57014, 55P03).
    Timeout,
    /// The database connection was lost or refused (class 08, 57P01..57P03).
    Connection,
    /// The database server is short of a resource (class 53).
    Overloaded,
    /// Concurrent transactions kept conflicting after the last retry (40001, 40P01, busy).
    Contention,
    /// No database session became free within the pool's wait (the service's own limit).
    NoSession,
    /// The request did not finish within the service's request timeout.
    RequestTimeout,
    /// The service holds its maximum of connections, each with a request in flight.
    TooManyConnections,
    /// The database accepts no writes (SQLSTATE 25006: a hot standby, a demoted primary):
    /// the statement was refused, so nothing was written.
    ReadOnly,
    /// Another request holds this key's lease ([`crate::lease`]) past what this request may
    /// wait (its holder may have crashed: the lease ends with its TTL); nothing was written.
    LeaseHeld,
    /// Another request claimed this key and has not completed it; nothing was written.
    KeyInProgress,
}

impl TransientCause {
    /// A short phrase for a problem detail, e.g. `the database statement timed out`.
    pub fn describe(self) -> &'static str {
        match self {
            TransientCause::Timeout => "a database statement timed out or was cancelled",
            TransientCause::Connection => "the database connection was lost",
            TransientCause::Overloaded => "the database server is short of resources",
            TransientCause::Contention => {
                "concurrent requests kept conflicting after the last retry"
            }
            TransientCause::NoSession => "no database session became free in time",
            TransientCause::RequestTimeout => "the request did not finish in time",
            TransientCause::TooManyConnections => {
                "the service holds its maximum of connections, all busy"
            }
            TransientCause::ReadOnly => {
                "the database accepts no writes (read-only: a standby or a demoted primary)"
            }
            TransientCause::LeaseHeld => {
                "another request holds this key's lease (it ends when that request finishes or \
                 with the lease's TTL)"
            }
            TransientCause::KeyInProgress => {
                "another request with this key is in progress; retry with the same key"
            }
        }
    }
}

/// What a caller may assume was written when a request failed transiently.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Written {
    /// Nothing: the transaction never committed.
    Nothing,
    /// Unknown: the failure came during or after `COMMIT` (or the request timed out while
    /// it ran), so the write may have happened.
    Unknown,
}

/// Result alias for repository operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    fn store(kind: DbErrorKind, operation: &'static str) -> Error {
        Error::Store(StoreError {
            kind,
            backend: crate::backend::Backend::Postgres,
            operation,
            code: None,
            message: "m".into(),
        })
    }

    #[test]
    fn retryable_database_failures_are_503_and_say_what_was_written() {
        let cases = [
            (
                DbErrorKind::Timeout,
                "find receipt",
                TransientCause::Timeout,
            ),
            (
                DbErrorKind::Connection,
                "insert ticket",
                TransientCause::Connection,
            ),
            (
                DbErrorKind::Unavailable,
                "connect",
                TransientCause::Overloaded,
            ),
            (
                DbErrorKind::SerializationFailure,
                "commit",
                TransientCause::Contention,
            ),
            (
                DbErrorKind::Deadlock,
                "insert receipt",
                TransientCause::Contention,
            ),
            (DbErrorKind::Busy, "begin", TransientCause::Contention),
            (
                DbErrorKind::ReadOnly,
                "insert receipt",
                TransientCause::ReadOnly,
            ),
        ];
        for (kind, operation, cause) in cases {
            let e = store(kind, operation);
            let want = Transient {
                cause,
                written: Written::Nothing,
            };
            assert_eq!(e.transient(), Some(want), "{kind:?}");
            assert_eq!(e.http_status(), 503, "{kind:?}");
            let exhausted = Error::RetriesExhausted {
                attempts: 10,
                source: Box::new(e),
            };
            assert_eq!(exhausted.transient(), Some(want), "{kind:?} after retries");
        }
        // Only a connection lost during COMMIT leaves the outcome unknown.
        let lost_at_commit = store(DbErrorKind::Connection, "commit");
        assert_eq!(
            lost_at_commit.transient().map(|t| t.written),
            Some(Written::Unknown)
        );
        let invisible = Error::WinnerNotVisible {
            idempotency_key: "k".into(),
        };
        assert_eq!(invisible.http_status(), 503);
    }

    #[test]
    fn bugs_and_broken_invariants_stay_500() {
        for kind in [
            DbErrorKind::InFailedTransaction,
            DbErrorKind::UniqueViolation,
            DbErrorKind::OtherConstraint,
            DbErrorKind::Other,
        ] {
            let e = store(kind, "insert ticket");
            assert_eq!((e.transient(), e.http_status()), (None, 500), "{kind:?}");
        }
        let dangling = Error::DanglingReceipt {
            idempotency_key: "k".into(),
            ticket_id: Uuid::nil(),
        };
        assert_eq!(dangling.http_status(), 500);
        assert_eq!(
            Error::NotFound {
                ticket_id: Uuid::nil()
            }
            .http_status(),
            404
        );
    }
}
