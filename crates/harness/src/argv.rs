//! The command lines the harness gives this tool's own binary: `ticketflow serve` for the
//! services of the soak, the bench and the kill matrix, `ticketflow worker` for racers that
//! run as processes, and the `ticketflow scenario run` flags that reproduce one run. Every
//! flag comes from [`ticketflow_core::flags`], which the binary's tests check against its command line.

use ticketflow_core::flags::{self, Flag};
use ticketflow_core::protocol::RetryPolicy;
use ticketflow_core::store::postgres::IsolationLevel;
use ticketflow_core::store::sqlite::{JournalMode, TxMode};
use ticketflow_core::variants::Implementation;

/// The program placeholder of a service command (`[[target.service]] command`), expanded to
/// this binary when the service starts.
pub(crate) const PROGRAM: &str = "{ticketflow}";

/// A `ticketflow serve` command line for a black-box service: listening on
/// `127.0.0.1:{port}` with the database `{database_url}` (the service placeholders), then the
/// options set here, in the order they are set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeArgs(Vec<String>);

impl Default for ServeArgs {
    fn default() -> Self {
        ServeArgs::new()
    }
}

impl ServeArgs {
    /// `{ticketflow} serve --listen 127.0.0.1:{port} --database-url {database_url}`.
    pub fn new() -> ServeArgs {
        let mut args = ServeArgs(vec![PROGRAM.to_string(), "serve".to_string()]);
        args.push(flags::LISTEN, "127.0.0.1:{port}");
        args.push(flags::DATABASE_URL, "{database_url}");
        args
    }

    fn push(&mut self, flag: Flag, value: impl ToString) {
        self.0.extend([flag.arg(), value.to_string()]);
    }

    fn with(mut self, flag: Flag, value: impl ToString) -> ServeArgs {
        self.push(flag, value);
        self
    }

    /// Sessions in the pool.
    pub fn pool_size(self, n: usize) -> ServeArgs {
        self.with(flags::POOL_SIZE, n)
    }

    /// Sessions kept open.
    pub fn min_idle(self, n: usize) -> ServeArgs {
        self.with(flags::MIN_IDLE, n)
    }

    /// How long a request waits for a session, milliseconds.
    pub fn pool_timeout_ms(self, ms: u64) -> ServeArgs {
        self.with(flags::POOL_TIMEOUT_MS, ms)
    }

    /// How long requests may finish on shutdown, milliseconds.
    pub fn shutdown_grace_ms(self, ms: u64) -> ServeArgs {
        self.with(flags::SHUTDOWN_GRACE_MS, ms)
    }

    /// The implementation it serves: `--protocol P` or `--variant V` (without a lease: see
    /// [`implementation_args`]).
    pub fn implementation(mut self, implementation: Implementation) -> ServeArgs {
        self.0.extend(select(implementation));
        self
    }

    /// The command line, program placeholder first.
    pub fn into_vec(self) -> Vec<String> {
        self.0
    }
}

fn select(implementation: Implementation) -> [String; 2] {
    match implementation {
        Implementation::Protocol(p) => [flags::PROTOCOL.arg(), p.name().to_string()],
        Implementation::Variant(v) => [flags::VARIANT.arg(), v.name().to_string()],
    }
}

/// The `ticketflow serve` arguments that select `implementation`: `--protocol P`, or
/// `--variant V` (with `--lease {redis_url}` for a variant whose keys live in Redis).
pub fn implementation_args(implementation: Implementation) -> Vec<String> {
    let mut args = select(implementation).to_vec();
    if let Implementation::Variant(v) = implementation {
        if v.needs_redis() {
            args.extend([flags::LEASE.arg(), "{redis_url}".to_string()]);
        }
    }
    args
}

/// What a `ticketflow worker` racer runs.
#[derive(Debug, Clone)]
pub struct WorkerArgs<'a> {
    /// The PostgreSQL server.
    pub pg_url: &'a str,
    /// The scratch database on it.
    pub dbname: &'a str,
    /// The racer's isolation level.
    pub isolation: IsolationLevel,
    /// The barrier lock mode, as the worker's `--lock` spells it.
    pub lock: &'a str,
    /// The create implementation.
    pub implementation: Implementation,
    /// The retry policy of its creates.
    pub retry: &'a RetryPolicy,
    /// Die (exit without answering) after this many commits: a fault case.
    pub die_after_commits: Option<u32>,
}

impl WorkerArgs<'_> {
    /// The arguments after the program: `worker --pg-url … --max-backoff-us N`.
    pub fn to_vec(&self) -> Vec<String> {
        let mut args = vec!["worker".to_string()];
        let mut push = |flag: Flag, value: String| args.extend([flag.arg(), value]);
        push(flags::PG_URL, self.pg_url.to_string());
        push(flags::DBNAME, self.dbname.to_string());
        push(
            flags::ISOLATION,
            isolation_value(self.isolation).to_string(),
        );
        push(flags::LOCK, self.lock.to_string());
        push(
            flags::IMPLEMENTATION,
            self.implementation.name().to_string(),
        );
        if let Some(n) = self.die_after_commits {
            push(flags::DIE_AFTER_COMMITS, n.to_string());
        }
        push(flags::MAX_ATTEMPTS, self.retry.max_attempts.to_string());
        push(
            flags::BASE_BACKOFF_US,
            self.retry.base_backoff.as_micros().to_string(),
        );
        push(
            flags::MAX_BACKOFF_US,
            self.retry.max_backoff.as_micros().to_string(),
        );
        args
    }
}

/// An isolation level as `--isolation` takes it: `read-committed`, `repeatable-read`,
/// `serializable`.
pub(crate) fn isolation_value(level: IsolationLevel) -> &'static str {
    match level {
        IsolationLevel::ReadCommitted => "read-committed",
        IsolationLevel::RepeatableRead => "repeatable-read",
        IsolationLevel::Serializable => "serializable",
    }
}

/// The `ticketflow scenario run` flags that select one SQLite setting.
pub(crate) fn sqlite_setting(journal: JournalMode, tx: TxMode) -> String {
    format!(
        "{} sqlite {} {} {} {}",
        flags::BACKEND,
        flags::SQLITE_JOURNAL,
        match journal {
            JournalMode::Wal => "wal",
            JournalMode::Delete => "delete",
        },
        flags::SQLITE_TX,
        match tx {
            TxMode::Lazy => "lazy",
            TxMode::Deferred => "deferred",
            TxMode::Immediate => "immediate",
        }
    )
}

/// The `ticketflow scenario run` flags that select one PostgreSQL isolation level.
pub(crate) fn postgres_setting(isolation: IsolationLevel) -> String {
    format!(
        "{} postgres {} {}",
        flags::BACKEND,
        flags::ISOLATION,
        isolation_value(isolation)
    )
}

/// The command that replays schedule `id` of the scenario file `file`.
pub fn reproduce_schedule(file: &std::path::Path, id: &str) -> String {
    format!(
        "ticketflow scenario run {} {} {id}",
        file.display(),
        flags::SCHEDULE
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use ticketflow_core::variants::Variant;

    #[test]
    fn a_serve_command_line_is_the_program_the_subcommand_then_the_options_in_order() {
        let args = ServeArgs::new()
            .pool_size(4)
            .min_idle(4)
            .implementation(Implementation::Variant(Variant::RedisCheckThenLock))
            .into_vec();
        let lease = implementation_args(Implementation::Variant(Variant::RedisCheckThenLock));
        assert_eq!(
            args.join(" "),
            "{ticketflow} serve --listen 127.0.0.1:{port} --database-url {database_url} \
             --pool-size 4 --min-idle 4 --variant redis-check-then-lock"
        );
        assert_eq!(
            lease.join(" "),
            "--variant redis-check-then-lock --lease {redis_url}"
        );
    }

    #[test]
    fn a_worker_command_line_names_every_setting_and_a_death_only_when_asked() {
        let retry = RetryPolicy::default();
        let mut w = WorkerArgs {
            pg_url: "postgres://h/d",
            dbname: "d",
            isolation: IsolationLevel::Serializable,
            lock: "advisory",
            implementation: Implementation::default(),
            retry: &retry,
            die_after_commits: None,
        };
        let line = w.to_vec().join(" ");
        assert!(line.starts_with("worker --pg-url postgres://h/d --dbname d --isolation serializable --lock advisory --implementation "), "{line}");
        assert!(!line.contains("--die-after-commits"), "{line}");
        w.die_after_commits = Some(1);
        assert!(w.to_vec().join(" ").contains("--die-after-commits 1"));
    }
}
