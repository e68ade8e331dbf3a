//! [`StoreCall`]: one call on a [`super::Store`] with its arguments, as recorded by the
//! scenario runner's observed store and re-issued as SQL by [`super::postgres::call_sql`].

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::domain::{OutboxEvent, Receipt, Ticket, TicketPatch};

/// One call a racer made on its [`crate::store::Store`], with its arguments: enough to
/// re-issue the same statement with the same values.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum StoreCall {
    /// `BEGIN` (at the store's isolation level).
    Begin,
    /// `SAVEPOINT name`.
    Savepoint {
        /// Savepoint name.
        name: String,
    },
    /// `ROLLBACK TO SAVEPOINT name`.
    RollbackToSavepoint {
        /// Savepoint name.
        name: String,
    },
    /// `RELEASE SAVEPOINT name`.
    ReleaseSavepoint {
        /// Savepoint name.
        name: String,
    },
    /// `COMMIT`.
    Commit,
    /// `ROLLBACK`.
    Rollback,
    /// Receipt lookup by (tenant, key).
    FindReceipt {
        /// Tenant id.
        tenant_id: String,
        /// Idempotency key.
        key: String,
    },
    /// Ticket insert.
    InsertTicket {
        /// The row.
        ticket: Ticket,
    },
    /// Outbox insert.
    InsertOutbox {
        /// The row.
        event: OutboxEvent,
    },
    /// Receipt insert.
    InsertReceipt {
        /// The row.
        receipt: Receipt,
    },
    /// Receipt insert that does nothing when the key is taken (`ON CONFLICT DO NOTHING`).
    InsertReceiptIfAbsent {
        /// The row.
        receipt: Receipt,
    },
    /// Ticket read by (tenant, id).
    FindTicket {
        /// Tenant id.
        tenant_id: String,
        /// Ticket id.
        id: Uuid,
    },
    /// Ticket update.
    UpdateTicket {
        /// Tenant id.
        tenant_id: String,
        /// Ticket id.
        id: Uuid,
        /// Changed fields.
        patch: TicketPatch,
        /// The update time written.
        now: DateTime<Utc>,
    },
    /// The `single-statement` protocol's statement: claim the key and, if won, insert the
    /// ticket and its event (a transaction of its own).
    ClaimAndCreate {
        /// The ticket row.
        ticket: Box<Ticket>,
        /// Its `ticket.created` event.
        event: Box<OutboxEvent>,
        /// The receipt that claims the key.
        receipt: Box<Receipt>,
    },
    /// The receipt for (tenant, key) with its ticket, in one statement.
    FindReceiptAndTicket {
        /// Tenant id.
        tenant_id: String,
        /// Idempotency key.
        key: String,
    },
    /// The harness's barrier wait inside the racer (the advisory lock on PostgreSQL, the
    /// in-process barrier on SQLite).
    Barrier,
}
