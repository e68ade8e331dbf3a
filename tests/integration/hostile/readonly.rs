//! The target's database is only read: count queries in a read-only transaction with their own timeout; setup SQL only in a transaction on the scratch database.
