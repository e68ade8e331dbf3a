//! `ticketflow`: the command line. It parses arguments, calls the library and maps results to
//! documented exit codes; no SQL or protocol logic lives here.
//!
//! Exit codes: 0 success; 1 a FAIL verdict or a database/runtime error; 2 usage error, invalid
//! input or a bad scenario file; 3 PENDING under `--require-postgres`; 4 conflict (HTTP 409);
//! 5 not found (HTTP 404).

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::{Parser, Subcommand, ValueEnum};
use std::time::Duration;

use ticketflow::scenario::format::{LockMode, Scenario};
use ticketflow::scenario::runner::PgOptions;
use ticketflow::scenario::worker::{self, WorkerConfig};
use ticketflow::scenario::RunSetting;
use ticketflow::store::postgres::IsolationLevel;
use ticketflow::store::sqlite::{JournalMode, TxMode};
use ticketflow::store::Backend;
use ticketflow::variants::{Implementation, Variant};
use ticketflow::verify::{self, Selection, EXIT_USAGE};
use ticketflow::{Error, Fingerprint, Outcome, Protocol, RetryPolicy, TicketPatch, TicketRequest};
use uuid::Uuid;

/// Set by the interrupt handler before it drops scratch databases and exits with 130.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Set while `serve` runs: the interrupt handler then asks it to shut down gracefully instead
/// of exiting.
static SERVE_SHUTDOWN: std::sync::OnceLock<std::sync::Arc<tokio::sync::Notify>> =
    std::sync::OnceLock::new();

const EXIT_CONFLICT: u8 = 4;
const EXIT_NOT_FOUND: u8 = 5;

#[derive(Parser)]
#[command(
    name = "ticketflow",
    version,
    about = "Prove idempotent ticket creation under real races"
)]
struct Cli {
    /// Database for create/get/update/prune: a SQLite file path (or sqlite://PATH) or a
    /// postgres:// URL.
    #[arg(
        long,
        global = true,
        env = "DATABASE_URL",
        default_value = "ticketflow.db"
    )]
    database_url: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum BackendArg {
    Sqlite,
    Postgres,
    Both,
}

impl BackendArg {
    fn backends(self) -> Vec<Backend> {
        match self {
            BackendArg::Sqlite => vec![Backend::Sqlite],
            BackendArg::Postgres => vec![Backend::Postgres],
            BackendArg::Both => Backend::ALL.to_vec(),
        }
    }
}

/// `--protocol`: which create protocol runs.
#[derive(Clone, Copy, ValueEnum)]
enum ProtocolArg {
    /// SPEC §4 as written: inserts in a savepoint; a unique violation rolls back to it.
    Savepoint,
    /// Receipt first with INSERT … ON CONFLICT DO NOTHING RETURNING; ticket and event only
    /// if the key was won.
    OnConflict,
}

impl ProtocolArg {
    fn protocol(self) -> Protocol {
        match self {
            ProtocolArg::Savepoint => Protocol::Savepoint,
            ProtocolArg::OnConflict => Protocol::OnConflict,
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Print the canonical text and SHA-256 fingerprint of a request read as JSON on stdin
    /// ({"actor_id","title","body","priority"}).
    Fingerprint,
    /// Create a ticket idempotently; the request is JSON on stdin (or --file). Prints the outcome.
    Create {
        /// Tenant id.
        #[arg(long)]
        tenant: String,
        /// Idempotency-Key.
        #[arg(long)]
        key: String,
        /// Read the request from this file instead of stdin.
        #[arg(long)]
        file: Option<PathBuf>,
        /// Use one of SPEC §6's wrong implementations instead of the real protocol (to see
        /// what it gets wrong): key-only, noncanonical-fingerprint, check-then-insert,
        /// abandon-outer-tx, split-transactions.
        #[arg(long, value_parser = parse_variant)]
        variant: Option<Variant>,
        /// The create protocol (ignored with --variant).
        #[arg(long, value_enum, default_value = "savepoint")]
        protocol: ProtocolArg,
    },
    /// Print a ticket of a tenant.
    Get {
        /// Tenant id.
        #[arg(long)]
        tenant: String,
        /// Ticket id.
        #[arg(long)]
        id: Uuid,
    },
    /// Change title, body and/or priority of a ticket; writes a ticket.updated event.
    Update {
        /// Tenant id.
        #[arg(long)]
        tenant: String,
        /// Ticket id.
        #[arg(long)]
        id: Uuid,
        /// New title.
        #[arg(long)]
        title: Option<String>,
        /// New body.
        #[arg(long)]
        body: Option<String>,
        /// New priority (low, normal, high, urgent).
        #[arg(long)]
        priority: Option<String>,
    },
    /// Delete idempotency receipts older than a duration (tickets and events stay; a pruned
    /// key creates a new ticket when reused).
    Prune {
        /// Age, e.g. `30d`, `12h`, `90min` (humantime syntax).
        #[arg(long, value_parser = humantime::parse_duration)]
        older_than: Duration,
    },
    /// Run every scenario on SQLite and PostgreSQL and write REPORT.md (the main job).
    Verify {
        /// Directory of scenario files.
        #[arg(long, default_value = "scenarios")]
        scenarios: PathBuf,
        /// PostgreSQL server (default: DATABASE_URL if it is postgres://, else
        /// postgres://postgres@127.0.0.1:5432/postgres).
        #[arg(long)]
        pg_url: Option<String>,
        /// Exit 3 if any PostgreSQL scenario is PENDING (server unreachable).
        #[arg(long)]
        require_postgres: bool,
        /// Where to write REPORT.md; report.json, report.junit.xml and isolation-specs/ (for
        /// failing PostgreSQL races) go into the same directory.
        #[arg(long, default_value = "REPORT.md")]
        report: PathBuf,
        #[command(flatten)]
        matrix: MatrixArgs,
        #[command(flatten)]
        retry: RetryArgs,
        /// Seed of the property suites (printed in REPORT.md; random when absent). Case counts
        /// follow PROPTEST_CASES.
        #[arg(long)]
        seed: Option<u64>,
        /// The create protocol of the scenario matrix and property suites; both protocols
        /// run the kill matrix and the fault cases as controls either way.
        #[arg(long, value_enum, default_value = "savepoint")]
        protocol: ProtocolArg,
        /// Skip the kill matrix (the gates run against the five wrong implementations).
        #[arg(long)]
        no_kill_matrix: bool,
        /// Run only the parts whose name contains PATTERN (repeatable): scenario names,
        /// property:fingerprint, property:sequential, property:concurrent, kill-matrix,
        /// faults. What is left out is listed in the report as not selected.
        #[arg(long, value_name = "PATTERN")]
        filter: Vec<String>,
        /// Also restart the local PostgreSQL cluster (pg_ctlcluster) during a run of creates,
        /// to prove in-flight creates commit fully or not at all. Cuts every other session on
        /// that server.
        #[arg(long)]
        restart_postgres: bool,
        /// Run each black-box scenario N times (each with a fresh {run}); any failing repeat
        /// FAILs it. An HTTP-level barrier needs at least 3 passing repeats for a PASS.
        #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        repeat: u32,
    },
    /// Serve the protocol over HTTP (POST /v1/tickets, GET and PATCH /v1/tickets/{id},
    /// GET /healthz) on --database-url. Prints `listening on http://ADDR` when ready; stops
    /// gracefully on Ctrl-C or SIGTERM.
    Serve {
        /// Address to listen on; port 0 picks a free port (the printed line names it).
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
        /// Serve one of SPEC §6's wrong implementations instead of the protocol (a negative
        /// control for black-box scenarios): key-only, noncanonical-fingerprint,
        /// check-then-insert, abandon-outer-tx, split-transactions.
        #[arg(long, value_parser = parse_variant)]
        variant: Option<Variant>,
        /// Most database sessions held at once; each request in flight holds one.
        #[arg(long, default_value_t = 16)]
        pool_size: u32,
        /// Sessions opened at startup and kept open (at most --pool-size); 0 opens them on
        /// demand. Equal to --pool-size, the service never opens a session while it runs.
        #[arg(long, default_value_t = 0)]
        min_idle: u32,
        /// Milliseconds a request waits for a free session before a 503.
        #[arg(long, default_value_t = 10_000)]
        pool_timeout_ms: u64,
        /// After Ctrl-C or SIGTERM, milliseconds requests in flight may take before the
        /// service stops anyway (a second signal stops it at once).
        #[arg(long, default_value_t = 5_000)]
        shutdown_grace_ms: u64,
    },
    /// Measure the create protocols against the same SQL run bare (pgbench for PostgreSQL, a
    /// rusqlite loop for SQLite): throughput at each client count, replays, a hot key, p50/p99,
    /// and convergence time after a barrier release. Prints a Markdown table; ratio = ours'
    /// speed / the baseline's. Loopback PostgreSQL only.
    Bench {
        /// Backends to measure.
        #[arg(long, value_enum, default_value = "both")]
        backend: BackendArg,
        /// PostgreSQL server (as for verify); must be on loopback.
        #[arg(long)]
        pg_url: Option<String>,
        /// Protocol(s) to measure (default: both).
        #[arg(long, value_enum)]
        protocol: Option<ProtocolArg>,
        /// Workloads to run: create, replay, hot-key, converge (default: all).
        #[arg(long, value_delimiter = ',', value_parser = parse_workload)]
        workloads: Vec<ticketflow::bench::Workload>,
        /// Client counts of the create and replay rows (the largest also runs hot-key).
        #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
        clients: Vec<usize>,
        /// Racer counts of the convergence rows.
        #[arg(long, value_delimiter = ',', default_value = "2,4,8,16,32")]
        racers: Vec<usize>,
        /// How long each side of a throughput row runs (pgbench: whole seconds, or 20
        /// transactions per client under 1 s).
        #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
        duration: Duration,
        /// Barrier releases per convergence row and side.
        #[arg(long, default_value_t = 21)]
        converge_reps: usize,
        /// Whole runs; every figure is the median over them.
        #[arg(long, default_value_t = 1)]
        runs: usize,
        /// Tiny runs (150 ms per side, 2 releases): every row, meaningless figures.
        #[arg(long)]
        quick: bool,
        /// Also write the rows as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
        /// The pgbench binary.
        #[arg(long, default_value = "pgbench")]
        pgbench: PathBuf,
    },
    /// Scenario files.
    Scenario {
        #[command(subcommand)]
        command: ScenarioCommand,
    },
    /// Black-box targets: your own service.
    Target {
        #[command(subcommand)]
        command: TargetCommand,
    },
    /// Run one racer per process for `racers_as = "processes"` scenarios: JSON lines on
    /// stdin/stdout (started by the scenario runner, not by hand).
    Worker {
        /// PostgreSQL server URL.
        #[arg(long)]
        pg_url: String,
        /// Database on that server.
        #[arg(long)]
        dbname: String,
        /// Isolation level.
        #[arg(long, value_enum, default_value = "read-committed")]
        isolation: IsolationArg,
        /// The barrier's lock mode.
        #[arg(long, value_enum, default_value = "access-exclusive")]
        lock: LockArg,
        /// Transactions per create, at least 1.
        #[arg(long, default_value_t = 10)]
        max_attempts: u32,
        /// Backoff cap of the first retry, microseconds.
        #[arg(long, default_value_t = 2000)]
        base_backoff_us: u64,
        /// Backoff cap of any retry, microseconds.
        #[arg(long, default_value_t = 100_000)]
        max_backoff_us: u64,
        /// `protocol`, `on-conflict` or a wrong variant's name.
        #[arg(long, default_value = "protocol", value_parser = parse_implementation)]
        implementation: Implementation,
        /// `on-conflict` turns `--implementation protocol` into the on-conflict protocol.
        #[arg(long, value_enum, default_value = "savepoint")]
        protocol: ProtocolArg,
        /// Exit (code 137, no reply) right after this many commits: a fault injection.
        #[arg(long)]
        die_after_commits: Option<u32>,
    },
}

fn parse_implementation(s: &str) -> Result<Implementation, String> {
    Implementation::parse(s).ok_or_else(|| {
        format!(
            "expected protocol, on-conflict or one of {}",
            Variant::every()
                .chain(Variant::SERVED_ONLY)
                .map(|v| v.name())
                .collect::<Vec<_>>()
                .join(", ")
        )
    })
}

fn parse_workload(s: &str) -> Result<ticketflow::bench::Workload, String> {
    ticketflow::bench::Workload::parse(s)
        .ok_or_else(|| "expected create, replay, hot-key or converge".to_string())
}

fn parse_variant(s: &str) -> Result<Variant, String> {
    Variant::parse(s).ok_or_else(|| {
        format!(
            "expected one of {}",
            Variant::every()
                .chain(Variant::SERVED_ONLY)
                .map(|v| v.name())
                .collect::<Vec<_>>()
                .join(", ")
        )
    })
}

#[derive(Subcommand)]
enum TargetCommand {
    /// Write a commented starter set of five black-box scenarios for your service: same body
    /// from N clients, two bodies one key, two scopes one key, a retry after the answer, a
    /// retry after a rejected attempt. Then: ticketflow scenario run DIR/*.toml
    Init {
        /// Base URL of a running instance (repeatable: one per instance).
        #[arg(long = "url", required = true, value_name = "URL")]
        urls: Vec<String>,
        /// The service's (test) database, for a table-lock barrier and count queries. `${VAR}`
        /// is written as is and read from the environment at run time. (Not the global
        /// --database-url / DATABASE_URL, which is never written into scenario files.)
        #[arg(long, value_name = "URL")]
        target_database_url: Option<String>,
        /// The table to lock as the barrier (its idempotency-key table, or the table the
        /// create writes). Without it: an HTTP-level barrier (keys in Redis or memory).
        #[arg(long, requires = "target_database_url")]
        table: Option<String>,
        /// Method of the create request.
        #[arg(long, default_value = "POST")]
        method: String,
        /// Path of the create request.
        #[arg(long, default_value = "/")]
        path: String,
        /// The JSON body of the create request (string values may use {run}, {racer}, {n}).
        #[arg(long, default_value = r#"{"name":"example {run}","quantity":1}"#)]
        body: String,
        /// A JSON body the service rejects before doing anything, for the retry-after-rejected
        /// scenario. Under the ietf preset 422 means "key reused with another payload": if your
        /// service answers validation errors with 422, add a rule for it.
        #[arg(long, default_value = "{}")]
        invalid_body: String,
        /// Header carrying the scope (tenant or user id); without it each scope gets its own
        /// `Authorization: Bearer ${API_TOKEN_A}`.
        #[arg(long)]
        scope_header: Option<String>,
        /// Header carrying the idempotency key.
        #[arg(long, default_value = "Idempotency-Key")]
        key_header: String,
        /// Response rule preset: ietf, stripe, ticketflow or none.
        #[arg(long, default_value = "ietf", value_parser = parse_preset)]
        preset: ticketflow::target::rules::Preset,
        /// A count query `NAME=SQL` expected to be 1 per intent (repeatable); `{scope}`,
        /// `{key}` and `{run}` are bound as parameters.
        #[arg(long = "count", value_name = "NAME=SQL")]
        counts: Vec<String>,
        /// Clients in the same-body race.
        #[arg(long, default_value_t = 4)]
        clients: usize,
        /// Directory to write into (created if missing).
        #[arg(long, default_value = "scenarios/my-service")]
        out: PathBuf,
        /// Overwrite existing files.
        #[arg(long)]
        force: bool,
    },
}

fn parse_preset(s: &str) -> Result<ticketflow::target::rules::Preset, String> {
    use ticketflow::target::rules::Preset;
    [
        Preset::Ietf,
        Preset::Stripe,
        Preset::Ticketflow,
        Preset::None,
    ]
    .into_iter()
    .find(|p| p.name() == s)
    .ok_or_else(|| "expected ietf, stripe, ticketflow or none".into())
}

#[derive(Subcommand)]
enum ScenarioCommand {
    /// Run the given scenario files and print their verdicts.
    Run {
        /// Scenario files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// PostgreSQL server (as for verify).
        #[arg(long)]
        pg_url: Option<String>,
        #[command(flatten)]
        matrix: MatrixArgs,
        /// Print every run as JSON (one object per line) instead of a summary.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        retry: RetryArgs,
        /// Run `protocol` (default) or one of SPEC §6's wrong implementations, to watch a
        /// scenario catch it.
        #[arg(long, default_value = "protocol", value_parser = parse_implementation)]
        implementation: Implementation,
        /// Write each PostgreSQL run's recorded race into this directory as a PostgreSQL
        /// isolation-tester spec (`SCENARIO.ISOLATION.spec`), replayable with
        /// `isolationtester "dbname=EMPTY_DB" < FILE`.
        #[arg(long, value_name = "DIR")]
        export_isolation_spec: Option<PathBuf>,
        /// Run each black-box scenario N times (each with a fresh {run}); any failing repeat
        /// FAILs it. An HTTP-level barrier needs at least 3 passing repeats for a PASS.
        #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        repeat: u32,
        /// Black-box scenarios: override every barrier's timeout (milliseconds).
        #[arg(long, value_name = "MS")]
        barrier_timeout_ms: Option<u64>,
    },
}

/// The racers' retry policy (transient failures: 40001, 40P01, SQLite busy, invisible winner).
#[derive(clap::Args)]
struct RetryArgs {
    /// Transactions per create, at least 1.
    #[arg(long, default_value_t = 10)]
    max_attempts: u32,
    /// Backoff cap of the first retry in milliseconds (doubles per retry; full jitter).
    #[arg(long, default_value_t = 2)]
    base_backoff_ms: u64,
    /// Backoff cap of any retry in milliseconds.
    #[arg(long, default_value_t = 100)]
    max_backoff_ms: u64,
    /// Run each create once, without retry (same as --max-attempts 1): shows what the
    /// lesson's protocol does without it; expect FAILs at REPEATABLE READ and above.
    #[arg(long)]
    no_retry: bool,
}

impl RetryArgs {
    fn policy(&self) -> RetryPolicy {
        if self.no_retry {
            return RetryPolicy::NONE;
        }
        RetryPolicy {
            max_attempts: self.max_attempts.max(1),
            base_backoff: Duration::from_millis(self.base_backoff_ms),
            max_backoff: Duration::from_millis(self.max_backoff_ms),
        }
    }
}

/// Which cells of the verdict matrix to run.
#[derive(clap::Args)]
struct MatrixArgs {
    /// Which backends to run.
    #[arg(long, value_enum, default_value = "both")]
    backend: BackendArg,
    /// PostgreSQL isolation levels (repeatable; default: every level the scenario allows).
    #[arg(long, value_enum)]
    isolation: Vec<IsolationArg>,
    /// SQLite journal modes (repeatable; default both).
    #[arg(long, value_enum)]
    sqlite_journal: Vec<JournalArg>,
    /// SQLite transaction modes (repeatable; default all three).
    #[arg(long, value_enum)]
    sqlite_tx: Vec<TxArg>,
}

#[derive(Clone, Copy, ValueEnum)]
enum IsolationArg {
    ReadCommitted,
    RepeatableRead,
    Serializable,
}

impl From<IsolationArg> for IsolationLevel {
    fn from(a: IsolationArg) -> Self {
        match a {
            IsolationArg::ReadCommitted => IsolationLevel::ReadCommitted,
            IsolationArg::RepeatableRead => IsolationLevel::RepeatableRead,
            IsolationArg::Serializable => IsolationLevel::Serializable,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum JournalArg {
    Wal,
    Delete,
}

#[derive(Clone, Copy, ValueEnum)]
enum TxArg {
    Lazy,
    Deferred,
    Immediate,
}

#[derive(Clone, Copy, ValueEnum)]
enum LockArg {
    AccessExclusive,
    Exclusive,
    Advisory,
}

impl MatrixArgs {
    fn selection(&self) -> Selection {
        let journals: Vec<JournalMode> = if self.sqlite_journal.is_empty() {
            vec![JournalMode::Wal, JournalMode::Delete]
        } else {
            self.sqlite_journal
                .iter()
                .map(|j| match j {
                    JournalArg::Wal => JournalMode::Wal,
                    JournalArg::Delete => JournalMode::Delete,
                })
                .collect()
        };
        let txs: Vec<TxMode> = if self.sqlite_tx.is_empty() {
            vec![TxMode::Lazy, TxMode::Deferred, TxMode::Immediate]
        } else {
            self.sqlite_tx
                .iter()
                .map(|t| match t {
                    TxArg::Lazy => TxMode::Lazy,
                    TxArg::Deferred => TxMode::Deferred,
                    TxArg::Immediate => TxMode::Immediate,
                })
                .collect()
        };
        let mut sqlite = Vec::new();
        for journal in &journals {
            for tx in &txs {
                sqlite.push(RunSetting::Sqlite {
                    journal: *journal,
                    tx: *tx,
                });
            }
        }
        Selection {
            backends: self.backend.backends(),
            isolation: self.isolation.iter().map(|i| (*i).into()).collect(),
            sqlite,
        }
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(ticketflow::logging::filter(
            std::env::var("TICKETFLOW_LOG").ok().as_deref(),
        ))
        .with_writer(std::io::stderr)
        .init();
    // On Ctrl-C or SIGTERM, drop the scratch databases of runs in progress before exiting.
    let _ = ctrlc::set_handler(|| {
        if let Some(shutdown) = SERVE_SHUTDOWN.get() {
            // `serve` stops accepting, finishes requests in flight and returns 0; a second
            // signal does not wait.
            static SIGNALLED: AtomicBool = AtomicBool::new(false);
            if SIGNALLED.swap(true, Ordering::SeqCst) {
                std::process::exit(130);
            }
            shutdown.notify_one();
            return;
        }
        INTERRUPTED.store(true, Ordering::SeqCst);
        // Services a black-box scenario started go first: they use the scratch databases.
        ticketflow::target::service::stop_active_services();
        let dropped = ticketflow::store::postgres::drop_active_scratch_databases();
        if !dropped.is_empty() {
            eprintln!(
                "ticketflow: interrupted; dropped scratch databases {}",
                dropped.join(", ")
            );
        }
        std::process::exit(130);
    });
    let cli = Cli::parse();
    let code = match run(cli) {
        Ok(code) => code,
        Err((code, message)) => {
            if !INTERRUPTED.load(Ordering::SeqCst) {
                eprintln!("ticketflow: {message}");
            }
            code
        }
    };
    // Dropping the scratch databases makes an interrupted run fail and return here; the
    // handler is about to exit with 130, so do not race it with another exit code.
    while INTERRUPTED.load(Ordering::SeqCst) {
        std::thread::park_timeout(std::time::Duration::from_millis(100));
    }
    ExitCode::from(code)
}

type CliResult = Result<u8, (u8, String)>;

fn usage(message: impl std::fmt::Display) -> (u8, String) {
    (EXIT_USAGE as u8, message.to_string())
}

fn read_request(file: Option<&PathBuf>) -> Result<TicketRequest, (u8, String)> {
    let mut bytes = Vec::new();
    match file {
        Some(path) => {
            bytes = std::fs::read(path)
                .map_err(|e| usage(format!("cannot read {}: {e}", path.display())))?
        }
        None => {
            std::io::stdin()
                .read_to_end(&mut bytes)
                .map_err(|e| usage(format!("cannot read stdin: {e}")))?;
        }
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        usage(format!(
            "request is not valid UTF-8 (byte {})",
            e.utf8_error().valid_up_to()
        ))
    })?;
    let shape =
        "request must be a JSON object with exactly actor_id, title, body, priority (strings)";
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| usage(format!("{shape}: {e}")))?;
    if !value.is_object() {
        return Err(usage(format!("{shape}, not a JSON {}", json_kind(&value))));
    }
    serde_json::from_value(value).map_err(|e| usage(format!("{shape}: {e}")))
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "boolean",
        serde_json::Value::Number(_) => "number",
        serde_json::Value::String(_) => "string",
        serde_json::Value::Array(_) => "array",
        serde_json::Value::Object(_) => "object",
    }
}

fn print_json(value: &impl serde::Serialize) {
    use std::io::Write as _;
    let text = serde_json::to_string_pretty(value).expect("outcome types serialize");
    // A closed pipe (`… | head`) is the reader's choice, not an error worth a panic.
    let _ = writeln!(std::io::stdout(), "{text}");
}

fn error_exit(e: Error) -> (u8, String) {
    let code = match &e {
        Error::Validation(_) | Error::BadUrl(_) => EXIT_USAGE as u8,
        Error::NotFound { .. } => EXIT_NOT_FOUND,
        _ => 1,
    };
    (code, e.to_string())
}

fn run(cli: Cli) -> CliResult {
    match cli.command {
        Command::Fingerprint => {
            let request = read_request(None)?;
            let fp = Fingerprint::of(&request);
            print_json(&serde_json::json!({"canonical": fp.canonical, "sha256": fp.hash}));
            Ok(0)
        }
        Command::Create {
            tenant,
            key,
            file,
            variant,
            protocol,
        } => {
            let request = read_request(file.as_ref())?;
            let mut store = ticketflow::store::open(&cli.database_url).map_err(error_exit)?;
            let implementation = variant.map_or(
                Implementation::of_protocol(protocol.protocol()),
                Implementation::Variant,
            );
            let report = implementation
                .create(store.as_mut(), &tenant, &key, &request)
                .map_err(error_exit)?;
            print_json(&report);
            Ok(match report.outcome {
                Outcome::Conflict { .. } => EXIT_CONFLICT,
                _ => 0,
            })
        }
        Command::Get { tenant, id } => {
            let mut store = ticketflow::store::open(&cli.database_url).map_err(error_exit)?;
            let ticket = ticketflow::get_ticket(store.as_mut(), &tenant, id).map_err(error_exit)?;
            print_json(&ticket);
            Ok(0)
        }
        Command::Update {
            tenant,
            id,
            title,
            body,
            priority,
        } => {
            let patch = TicketPatch {
                title,
                body,
                priority,
            };
            let mut store = ticketflow::store::open(&cli.database_url).map_err(error_exit)?;
            let ticket = ticketflow::update_ticket(store.as_mut(), &tenant, id, &patch)
                .map_err(error_exit)?;
            print_json(&ticket);
            Ok(0)
        }
        Command::Prune { older_than } => {
            let pruned = ticketflow::store::prune_receipts(&cli.database_url, older_than)
                .map_err(error_exit)?;
            print_json(&serde_json::json!({
                "pruned_receipts": pruned,
                "older_than": humantime::format_duration(older_than).to_string(),
            }));
            Ok(0)
        }
        Command::Verify {
            scenarios,
            pg_url,
            require_postgres,
            report,
            matrix,
            retry,
            seed,
            no_kill_matrix,
            filter,
            restart_postgres,
            protocol,
            repeat,
        } => {
            use std::io::IsTerminal as _;
            let opts = verify::VerifyOptions {
                repeat: repeat as usize,
                filters: filter,
                progress: std::io::stderr().is_terminal() && std::env::var_os("CI").is_none(),
                restart_postgres,
                seed,
                kill_matrix: !no_kill_matrix,
                retry: retry.policy(),
                scenarios,
                pg_url: ticketflow::store::url::resolve_pg_url(
                    pg_url.as_deref(),
                    database_url_env().as_deref(),
                ),
                selection: matrix.selection(),
                report,
                require_postgres,
                protocol: protocol.protocol(),
            };
            let outcome = verify::verify(&opts).map_err(|e| match e {
                // The runs happened; only the report could not be written.
                verify::VerifyError::Write { .. } => (1, e.to_string()),
                other => usage(other),
            })?;
            outcome.runs.iter().for_each(print_summary);
            outcome.targets.iter().for_each(print_target_summary);
            if let Some(f) = &outcome.faults {
                println!(
                    "{:<8} faults and bad input: {} faults injected, {} inputs tried",
                    f.verdict().to_string(),
                    f.faults_injected,
                    f.inputs_tried
                );
            }
            if !outcome.not_selected.is_empty() {
                println!(
                    "-        not selected by --filter: {} part(s) (listed in the report)",
                    outcome.not_selected.len()
                );
            }
            if outcome.kill.is_none() && no_kill_matrix {
                println!("PENDING  kill matrix: skipped (--no-kill-matrix)");
            }
            if let Some(k) = &outcome.kill {
                let problems = k.problems();
                println!(
                    "{:<8} kill matrix: {} cells{}",
                    k.verdict().to_string(),
                    k.cells.len(),
                    if problems.is_empty() {
                        String::new()
                    } else {
                        format!(" — {}", problems.join("; "))
                    }
                );
            }
            for s in &outcome.suites {
                println!(
                    "{:<8} {:<9} {:<26} property suite {} ({} cases, seed {}){}",
                    s.verdict.to_string(),
                    s.backend_name(),
                    s.implementation.name(),
                    s.suite,
                    s.cases,
                    s.seed,
                    s.reason
                        .as_ref()
                        .map(|x| format!(" — {x}"))
                        .unwrap_or_default()
                );
            }
            for spec in &outcome.specs {
                println!(
                    "FAIL     {} [{}]: race exported to {}",
                    spec.scenario,
                    spec.setting,
                    spec.path.display()
                );
            }
            let (md, json, junit) = verify::output_paths(&opts.report);
            println!(
                "report written to {}, {}, {}",
                md.display(),
                json.display(),
                junit.display()
            );
            Ok(outcome.exit_code as u8)
        }
        Command::Scenario {
            command:
                ScenarioCommand::Run {
                    files,
                    pg_url,
                    matrix,
                    json,
                    retry,
                    implementation,
                    export_isolation_spec,
                    repeat,
                    barrier_timeout_ms,
                },
        } => {
            let mut scenarios = Vec::new();
            let mut targets = Vec::new();
            for f in &files {
                let text = std::fs::read_to_string(f)
                    .map_err(|e| usage(format!("{}: cannot read scenario: {e}", f.display())))?;
                if ticketflow::target::is_target_file(&text) {
                    targets.push(
                        ticketflow::target::TargetScenario::parse(f, &text, &|n| {
                            std::env::var(n).ok()
                        })
                        .map_err(usage)?,
                    );
                } else {
                    scenarios.extend(Scenario::parse(f, &text).map_err(usage)?);
                }
            }
            if !targets.is_empty() && !matrix.isolation.is_empty() {
                return Err(usage(
                    "--isolation does not apply to a black-box scenario: the target's own \
                     sessions choose their isolation level (the run records its \
                     default_transaction_isolation); set it on the target's database or service",
                ));
            }
            let selection = matrix.selection();
            let url = ticketflow::store::url::resolve_pg_url(
                pg_url.as_deref(),
                database_url_env().as_deref(),
            );
            let wants_pg = scenarios.iter().any(|s| {
                selection
                    .settings(s)
                    .iter()
                    .any(|x| x.backend() == Backend::Postgres)
            });
            let unusable = if wants_pg {
                ticketflow::store::url::probe_postgres(&url)
                    .err()
                    .map(|e| e.to_string())
            } else {
                None
            };
            let retry = retry.policy();
            let mut base = PgOptions::new(url);
            base.implementation = implementation;
            let runs = verify::run_all(&scenarios, &selection, &base, &retry, unusable.as_deref());
            let target_opts = ticketflow::target::RunOptions {
                repeat: repeat as usize,
                barrier_timeout: barrier_timeout_ms.map(Duration::from_millis),
                ..ticketflow::target::RunOptions::new(base.url.clone())
            };
            let mut outcomes = Vec::new();
            for t in &targets {
                // Nothing raced: the scenario or its target is not usable as given.
                let outcome = ticketflow::target::run_repeated(t, &target_opts)
                    .map_err(|e| usage(format!("{}: {e}", t.file.display())))?;
                outcomes.push(outcome);
            }
            if let Some(dir) = &export_isolation_spec {
                for r in runs.iter().filter(|r| r.evidence.is_some()) {
                    if r.backend == Backend::Postgres {
                        let path = ticketflow::report::isolation::export(r, dir)
                            .map_err(|e| (1, e.to_string()))?;
                        eprintln!("isolation spec written to {}", path.display());
                    }
                }
            }
            for r in &runs {
                if json {
                    println!("{}", serde_json::to_string(r).expect("runs serialize"));
                } else {
                    print_summary(r);
                }
            }
            for t in &outcomes {
                if json {
                    println!("{}", serde_json::to_string(t).expect("outcomes serialize"));
                } else {
                    print_target_summary(t);
                }
            }
            Ok(verify::exit_code(
                runs.iter()
                    .map(|r| r.verdict)
                    .chain(outcomes.iter().map(|t| t.verdict)),
                false,
            ) as u8)
        }
        Command::Target {
            command:
                TargetCommand::Init {
                    urls,
                    target_database_url,
                    table,
                    method,
                    path,
                    body,
                    invalid_body,
                    scope_header,
                    key_header,
                    preset,
                    counts,
                    clients,
                    out,
                    force,
                },
        } => {
            let json = |what: &str, text: &str| {
                serde_json::from_str::<serde_json::Value>(text)
                    .map_err(|e| usage(format!("{what} is not JSON: {e}")))
            };
            let counts = counts
                .iter()
                .map(|c| {
                    c.split_once('=')
                        .map(|(n, q)| (n.trim().to_string(), q.trim().to_string()))
                        .ok_or_else(|| usage(format!("--count {c:?}: expected NAME=SQL")))
                })
                .collect::<Result<Vec<_>, _>>()?;
            if target_database_url.is_none() && !counts.is_empty() {
                return Err(usage(
                    "--count needs --target-database-url (the queries run there)",
                ));
            }
            let opts = ticketflow::target::init::InitOptions {
                urls,
                database_url: target_database_url,
                table,
                method,
                path,
                body: json("--body", &body)?,
                invalid_body: json("--invalid-body", &invalid_body)?,
                scope_header,
                key_header,
                preset,
                counts,
                clients,
            };
            let written = opts.write(&out, force).map_err(|e| match e {
                ticketflow::target::init::InitError::Write { .. } => (1, e.to_string()),
                other => usage(other),
            })?;
            for p in &written {
                println!("wrote {}", p.display());
            }
            println!(
                "next: ticketflow scenario run {}/*.toml   (adapt the bodies, rules and counts first; every file says how)",
                out.display()
            );
            Ok(0)
        }
        Command::Serve {
            listen,
            variant,
            pool_size,
            min_idle,
            pool_timeout_ms,
            shutdown_grace_ms,
        } => {
            let config = ticketflow::serve::ServeConfig {
                listen,
                database_url: cli.database_url.clone(),
                implementation: variant.map_or(Implementation::Protocol, Implementation::Variant),
                pool_size,
                min_idle,
                pool_timeout: Duration::from_millis(pool_timeout_ms),
                shutdown_grace: Duration::from_millis(shutdown_grace_ms),
            };
            let notify = std::sync::Arc::new(tokio::sync::Notify::new());
            let _ = SERVE_SHUTDOWN.set(notify.clone());
            ticketflow::serve::serve_blocking(
                &config,
                |addr| {
                    use std::io::Write as _;
                    let mut out = std::io::stdout();
                    let _ = writeln!(out, "listening on http://{addr}");
                    let _ = out.flush();
                },
                async move { notify.notified().await },
            )
            .map_err(|e| {
                let code = match &e {
                    ticketflow::serve::ServeError::Database { source, .. }
                        if matches!(**source, Error::BadUrl(_)) =>
                    {
                        EXIT_USAGE as u8
                    }
                    _ => 1,
                };
                (code, e.to_string())
            })?;
            Ok(0)
        }
        Command::Bench {
            backend,
            pg_url,
            protocol,
            workloads,
            clients,
            racers,
            duration,
            converge_reps,
            runs,
            quick,
            json,
            pgbench,
        } => {
            let backends = backend.backends();
            let url = ticketflow::store::url::resolve_pg_url(
                pg_url.as_deref(),
                database_url_env().as_deref(),
            );
            let pg_url = if backends.contains(&Backend::Postgres) {
                match ticketflow::store::url::probe_postgres(&url).map_err(|e| e.to_string()) {
                    Ok(()) => Some(url),
                    Err(why) if matches!(backend, BackendArg::Postgres) => return Err((1, why)),
                    Err(why) => {
                        eprintln!("bench: PostgreSQL skipped: {why}");
                        None
                    }
                }
            } else {
                None
            };
            let mut opts = ticketflow::bench::BenchOptions::standard(pg_url);
            opts.sqlite = backends.contains(&Backend::Sqlite);
            opts.protocols = match protocol {
                Some(p) => vec![p.protocol()],
                None => Protocol::ALL.to_vec(),
            };
            if !workloads.is_empty() {
                opts.workloads = workloads;
            }
            opts.clients = clients;
            opts.racers = racers;
            opts.duration = duration;
            opts.converge_reps = converge_reps;
            opts.runs = runs;
            opts.pgbench = pgbench;
            if quick {
                opts = opts.quick();
            }
            let rows = ticketflow::bench::run(&opts, |run, r| {
                eprintln!(
                    "bench: run {} {} {} {} x{}: ours {:.1}, baseline {:.1}, ratio {:.2}",
                    run + 1,
                    r.backend,
                    r.protocol,
                    r.workload.name(),
                    r.clients,
                    r.ours.value,
                    r.baseline.value,
                    r.ratio
                )
            })
            .map_err(|e| (1, e.to_string()))?;
            print!("{}", ticketflow::bench::markdown(&rows));
            if let Some(path) = json {
                let text = serde_json::to_string_pretty(&rows).expect("rows serialize");
                std::fs::write(&path, text)
                    .map_err(|e| (1, format!("cannot write {}: {e}", path.display())))?;
            }
            Ok(0)
        }
        Command::Worker {
            pg_url,
            dbname,
            isolation,
            lock,
            max_attempts,
            base_backoff_us,
            max_backoff_us,
            implementation,
            protocol,
            die_after_commits,
        } => {
            let implementation = match (implementation, protocol) {
                (Implementation::Protocol, ProtocolArg::OnConflict) => Implementation::OnConflict,
                (other, _) => other,
            };
            let config = WorkerConfig {
                implementation,
                die_after_commits,
                pg_url,
                dbname,
                isolation: isolation.into(),
                lock: match lock {
                    LockArg::AccessExclusive => LockMode::AccessExclusive,
                    LockArg::Exclusive => LockMode::Exclusive,
                    LockArg::Advisory => LockMode::Advisory,
                },
                retry: RetryPolicy {
                    max_attempts: max_attempts.max(1),
                    base_backoff: Duration::from_micros(base_backoff_us),
                    max_backoff: Duration::from_micros(max_backoff_us),
                },
            };
            let stdin = std::io::stdin();
            worker::serve(&config, stdin.lock(), std::io::stdout().lock())
                .map_err(|e| (1, e.to_string()))?;
            Ok(0)
        }
    }
}

/// One line per run: verdict, backend, scenario and the reason when not PASS.
fn print_summary(r: &ticketflow::scenario::ScenarioRun) {
    println!(
        "{:<8} {:<9} {:<26} {}{}",
        r.verdict.to_string(),
        r.backend.name(),
        r.setting.label(),
        r.scenario,
        r.reason
            .as_ref()
            .map(|x| format!(" — {x}"))
            .unwrap_or_default()
    );
}

/// A black-box scenario's verdict: one line, then for a FAIL the distinct answers and the
/// checks that failed (follow-on failures in one line).
fn print_target_summary(t: &ticketflow::target::TargetOutcome) {
    print!("{}", ticketflow::target::check::summary_text(t));
}

/// `DATABASE_URL` as set in the environment (clap's default for --database-url is not a
/// PostgreSQL location, so verify reads the variable itself).
fn database_url_env() -> Option<String> {
    std::env::var("DATABASE_URL").ok()
}
