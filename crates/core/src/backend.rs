//! Which database: the one name stores, their errors, scenario runs and scratch databases
//! share ([`crate::store`] re-exports it). Depends on nothing else in the crate.

/// Which database a store, a scenario run or a scratch database is on. Serialized and shown
/// as `sqlite`, `postgres` or `memory`.
///
/// [`Backend::Memory`] is the in-memory store the loom models run on ([`crate::store::memory`]): stores and
/// their errors report it, but it is no SQL database, so it is not in [`Backend::ALL`] (the
/// backends scenarios and suites run on), cannot be named in a scenario file and is not a
/// command-line value.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Deserialize, serde::Serialize,
)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// SQLite file database, in-process barrier.
    Sqlite,
    /// PostgreSQL, lock barrier observed in `pg_locks`.
    Postgres,
    /// The in-memory store with PostgreSQL READ COMMITTED semantics (loom models).
    #[serde(skip_deserializing)]
    #[cfg_attr(feature = "cli", value(skip))]
    Memory,
}

impl Backend {
    /// The SQL backends, in report order: what scenarios, suites and faults run on.
    pub const ALL: [Backend; 2] = [Backend::Sqlite, Backend::Postgres];

    /// `sqlite`, `postgres` or `memory`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
            Backend::Memory => "memory",
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
