//! Schema migrations: numbered SQL files under `crates/core/migrations/{postgres,sqlite}/`,
//! embedded at build time, applied in order inside one transaction each and recorded in
//! `schema_migrations (version, name, checksum, applied_at)`.
//!
//! **Invariant:** applying migrations is idempotent; a recorded migration whose file changed
//! since (checksum mismatch) is an error, never silently re-applied.

/// One embedded migration.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// The `NNNN` prefix of the file name.
    pub version: i64,
    /// The rest of the file name, without `.sql`.
    pub name: &'static str,
    /// The SQL text.
    pub sql: &'static str,
}

impl Migration {
    /// SHA-256 hex of the SQL text, recorded to detect an edited migration.
    pub fn checksum(&self) -> String {
        crate::fingerprint::sha256_hex(self.sql.as_bytes())
    }
}

/// PostgreSQL migrations, in order.
pub const POSTGRES: &[Migration] = &[
    Migration {
        version: 1,
        name: "init",
        sql: include_str!("../../migrations/postgres/0001_init.sql"),
    },
    Migration {
        version: 2,
        name: "receipt_fkey_deferred",
        sql: include_str!("../../migrations/postgres/0002_receipt_fkey_deferred.sql"),
    },
];

/// SQLite migrations, in order.
pub const SQLITE: &[Migration] = &[
    Migration {
        version: 1,
        name: "init",
        sql: include_str!("../../migrations/sqlite/0001_init.sql"),
    },
    Migration {
        version: 2,
        name: "receipt_fkey_deferred",
        sql: include_str!("../../migrations/sqlite/0002_receipt_fkey_deferred.sql"),
    },
];

/// The table that records applied migrations (same DDL on both backends).
pub(crate) const LEDGER_DDL: &str = "CREATE TABLE IF NOT EXISTS schema_migrations (\
    version BIGINT PRIMARY KEY, name TEXT NOT NULL, checksum TEXT NOT NULL, applied_at TEXT NOT NULL)";

/// Error text for a recorded migration whose file changed.
pub(crate) fn drift_message(m: &Migration, recorded: &str) -> String {
    format!(
        "migration {:04}_{} was applied with checksum {recorded} but the file now has {}",
        m.version,
        m.name,
        m.checksum()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_contiguous_from_one() {
        for list in [POSTGRES, SQLITE] {
            for (i, m) in list.iter().enumerate() {
                assert_eq!(m.version, i as i64 + 1);
            }
        }
        assert_eq!(POSTGRES.len(), SQLITE.len());
    }
}
