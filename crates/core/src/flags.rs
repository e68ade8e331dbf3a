//! The flags of the `ticketflow` command line that the library names: in a message that tells
//! the user what to give (`pass --force to overwrite`), in a command it prints to reproduce a
//! run, and in the command lines the harness starts its own binary with (`ticketflow serve`,
//! `ticketflow worker`).
//!
//! The command line itself is defined in the `ticketflow` binary; no library crate depends on
//! it. This table is the one place below it where a flag is spelled, and the binary's tests
//! check every entry of [`ALL`] against its own definitions (each listed subcommand has that
//! long flag), so a renamed flag fails a test rather than a user.

use std::fmt;

/// One long flag of the `ticketflow` command line. Displays as `--` and its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flag {
    /// Its name, without the leading `--`.
    pub name: &'static str,
    /// The subcommands the library names it for, as typed (`"verify"`, `"scenario run"`).
    pub commands: &'static [&'static str],
}

impl Flag {
    /// `--` and its name, as an argument of a command line.
    pub fn arg(self) -> String {
        self.to_string()
    }
}

impl fmt::Display for Flag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "--{}", self.name)
    }
}

macro_rules! flags {
    ($($(#[$doc:meta])* $id:ident = $name:literal in [$($cmd:literal),+ $(,)?];)+) => {
        $(
            $(#[$doc])*
            pub const $id: Flag = Flag { name: $name, commands: &[$($cmd),+] };
        )+
        /// Every flag of this table, for the binary's test.
        pub const ALL: &[Flag] = &[$($id),+];
    };
}

flags! {
    /// The PostgreSQL isolation level of a command's sessions, or of a worker's racer.
    ISOLATION = "isolation" in ["create", "worker", "scenario run"];
    /// The Redis of the lease (`serve`), or of the lease rows (`bench`).
    LEASE = "lease" in ["serve", "bench"];
    /// A wrong implementation `serve` runs instead of a protocol.
    VARIANT = "variant" in ["serve"];
    /// The create protocol `serve` runs.
    PROTOCOL = "protocol" in ["serve"];
    /// `serve`'s bearer tokens.
    AUTH_TOKENS = "auth-tokens" in ["serve"];
    /// `serve`'s connection limit.
    MAX_CONNECTIONS = "max-connections" in ["serve"];
    /// `serve`'s listen address.
    LISTEN = "listen" in ["serve"];
    /// `serve`'s database.
    DATABASE_URL = "database-url" in ["serve"];
    /// `serve`'s pool size.
    POOL_SIZE = "pool-size" in ["serve"];
    /// How long `serve` waits for a pooled session, milliseconds.
    POOL_TIMEOUT_MS = "pool-timeout-ms" in ["serve"];
    /// How long `serve` lets requests finish on shutdown, milliseconds.
    SHUTDOWN_GRACE_MS = "shutdown-grace-ms" in ["serve"];
    /// The sessions `serve` keeps open.
    MIN_IDLE = "min-idle" in ["serve"];
    /// The PostgreSQL server.
    PG_URL = "pg-url" in ["worker", "scenario run", "bench"];
    /// A worker's database on that server.
    DBNAME = "dbname" in ["worker"];
    /// A worker's barrier lock mode.
    LOCK = "lock" in ["worker"];
    /// The implementation a worker or a reproduced run races.
    IMPLEMENTATION = "implementation" in ["worker", "scenario run"];
    /// A worker that dies after this many commits (a fault case).
    DIE_AFTER_COMMITS = "die-after-commits" in ["worker"];
    /// Transactions per create.
    MAX_ATTEMPTS = "max-attempts" in ["worker"];
    /// A worker's first backoff cap, microseconds.
    BASE_BACKOFF_US = "base-backoff-us" in ["worker"];
    /// A worker's backoff cap, microseconds.
    MAX_BACKOFF_US = "max-backoff-us" in ["worker"];
    /// Replace files ticketflow did not write.
    FORCE = "force" in ["verify", "scenario run", "target init"];
    /// Where the report goes.
    REPORT = "report" in ["verify", "scenario run"];
    /// A service a starter set is written for.
    URL = "url" in ["target init"];
    /// How schedules are explored.
    EXPLORE = "explore" in ["scenario run"];
    /// One schedule, to reproduce it.
    SCHEDULE = "schedule" in ["scenario run"];
    /// Runs of each black-box scenario.
    REPEAT = "repeat" in ["scenario run"];
    /// Where isolation-tester specs go without a report.
    EXPORT_ISOLATION_SPEC = "export-isolation-spec" in ["scenario run"];
    /// The scenario directory.
    SCENARIOS = "scenarios" in ["verify"];
    /// The backends a run uses.
    BACKEND = "backend" in ["verify", "scenario run"];
    /// SQLite journal modes.
    SQLITE_JOURNAL = "sqlite-journal" in ["verify", "scenario run"];
    /// SQLite transaction modes.
    SQLITE_TX = "sqlite-tx" in ["verify", "scenario run"];
    /// The property suites' seed.
    SEED = "seed" in ["verify"];
    /// The scenarios a run selects.
    FILTER = "filter" in ["verify"];
    /// A run that restarts the local PostgreSQL cluster (a fault case).
    RESTART_POSTGRES = "restart-postgres" in ["verify"];
    /// A run without the kill matrix.
    NO_KILL_MATRIX = "no-kill-matrix" in ["verify"];
    /// The interposer's PostgreSQL upstream.
    POSTGRES = "postgres" in ["interpose"];
    /// The interposer's Redis upstream.
    REDIS = "redis" in ["interpose"];
    /// Where the interposer listens for the service's PostgreSQL sessions.
    LISTEN_POSTGRES = "listen-postgres" in ["interpose"];
    /// Where the interposer listens for the service's Redis connections.
    LISTEN_REDIS = "listen-redis" in ["interpose"];
    /// The interposer's control address.
    CONTROL = "control" in ["interpose"];
    /// Where the interposer writes its control token.
    CONTROL_TOKEN_FILE = "control-token-file" in ["interpose"];
    /// An interposer upstream off this host, relayed in plain text.
    ALLOW_REMOTE_UPSTREAM = "allow-remote-upstream" in ["interpose"];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flag_displays_with_its_dashes_and_every_one_is_listed_once() {
        assert_eq!(FORCE.to_string(), "--force");
        assert_eq!(PG_URL.arg(), "--pg-url");
        let mut names: Vec<&str> = ALL.iter().map(|f| f.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ALL.len(), "a flag is listed twice");
    }
}
