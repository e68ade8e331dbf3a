//! The command line's arguments (clap derive): one `…Args` struct per subcommand, the library's
//! own enums as values (`clap::ValueEnum`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use ticketflow_core::store::postgres::IsolationChoice;

use clap::{Parser, Subcommand};

use ticketflow::verify::{BackendChoice, Selection};
use ticketflow_core::store::postgres::IsolationLevel;
use ticketflow_core::store::sqlite::{JournalMode, TxMode};
use ticketflow_core::variants::{Implementation, Variant};
use ticketflow_core::{Protocol, RetryPolicy};
use ticketflow_harness::bench::Workload;
use ticketflow_harness::blackbox::rules::Preset;
use ticketflow_harness::scenario::format::LockMode;
use ticketflow_harness::scenario::RunSetting;
use ticketflow_harness::soak::FaultKind;
use uuid::Uuid;

#[derive(Parser)]
#[command(
    name = "ticketflow",
    version,
    about = "Prove idempotent ticket creation under real races"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Print the canonical text and SHA-256 fingerprint of a request read as JSON on stdin
    /// ({"actor_id","title","body","priority"}).
    Fingerprint,
    /// Create a ticket idempotently; the request is JSON on stdin (or --file). Prints the outcome.
    Create(CreateArgs),
    /// Print a ticket of a tenant.
    Get(GetArgs),
    /// Change title, body and/or priority of a ticket; writes a ticket.updated event.
    Update(UpdateArgs),
    /// Delete idempotency receipts older than a duration (tickets and events stay; a pruned
    /// key creates a new ticket when reused).
    Prune(PruneArgs),
    /// Run every scenario on SQLite and PostgreSQL and write REPORT.md (the main job).
    Verify(VerifyArgs),
    /// Serve the protocol over HTTP (POST /v1/tickets, GET and PATCH /v1/tickets/{id},
    /// GET /healthz) on --database-url. Prints `listening on http://ADDR` when ready; stops
    /// gracefully on Ctrl-C or SIGTERM.
    Serve(ServeArgs),
    /// Stand between your own running service and its PostgreSQL (and Redis): prints the URLs
    /// the service should use and the control address a scenario names
    /// ([target] interposer), then serves until Ctrl-C or SIGTERM. Traffic passes through
    /// untouched outside a run. Loopback only (docs/INTERPOSER.md).
    Interpose(InterposeArgs),
    /// Measure the create protocols against the same SQL run bare (pgbench for PostgreSQL, a
    /// rusqlite loop for SQLite): throughput at each client count, replays, a hot key, p50/p99,
    /// and convergence time after a barrier release. Prints a Markdown table; ratio = ours'
    /// speed / the baseline's. Loopback PostgreSQL only.
    Bench(BenchArgs),
    /// Soak: two `serve` processes on a scratch PostgreSQL database under mixed traffic
    /// (new keys, retries, contested keys, conflicts, GETs; several tenants) for a fixed
    /// duration while faults are injected on a schedule, then the rows are checked by SQL
    /// against every answer. Exit 0 PASS, 1 FAIL, 3 PENDING (PostgreSQL unreachable or a
    /// requested fault not injected). Loopback PostgreSQL only.
    Soak(SoakArgs),
    /// Scenario files.
    Scenario {
        #[command(subcommand)]
        command: ScenarioCommand,
    },
    /// Check your service against the idempotency model over generated histories (a check
    /// file: a black-box [target] and a [check] table): sequential requests and concurrent
    /// groups over scopes × keys × bodies, effects recounted after a settle time, a failure
    /// shrunk to a minimal history written as a scenario file that replays it. Exit 0 PASS,
    /// 1 FAIL, 2 a bad file or a target that cannot be set up, 3 PENDING (docs/check.md).
    Check(CheckArgs),
    /// Black-box targets: your own service.
    Target {
        #[command(subcommand)]
        command: TargetCommand,
    },
    /// Run one racer per process for `racers_as = "processes"` scenarios: JSON lines on
    /// stdin/stdout (started by the scenario runner, not by hand).
    Worker(WorkerArgs),
    /// Drop the scratch databases of runs that were killed (SIGKILL, a crash): those in the
    /// scratch ledger (table ticketflow_scratch_ledger in the database of --pg-url) whose
    /// owning process is gone. Prints one line per database; never drops a database that is
    /// not in the ledger, nor one whose owner runs or is on another host. Exit 0, 1 when the
    /// server cannot be reached or a drop fails.
    Clean(CleanArgs),
}

#[derive(clap::Args)]
pub struct CheckArgs {
    /// The check file.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// PostgreSQL server for the scratch database of a file whose services need one
    /// (default: DATABASE_URL if it is postgres://, else postgres://postgres@127.0.0.1:5432/postgres).
    #[arg(long, value_name = "URL")]
    pub pg_url: Option<String>,
    /// Seed of the histories (default: [check] seed, else random; printed, so a run can be
    /// reproduced).
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// Send at most N histories (default: [check] histories, else 40).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub histories: Option<u32>,
    /// Start no new history after SECONDS (default: [check] budget_s, else 120).
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    pub budget: Option<u64>,
    /// Re-runs spent shrinking a failure (default: [check] shrink_runs, else 150).
    #[arg(long, value_name = "N")]
    pub shrink_runs: Option<usize>,
    /// Replays of the minimal failing history, for its flake rate (default: [check] replays,
    /// else 20).
    #[arg(long, value_name = "N")]
    pub replays: Option<usize>,
    /// Where the minimal failing history's scenario file is written (default
    /// ticketflow-check/NAME-seedSEED.toml).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Print one JSON line per history as it is judged (verdict, reason, steps, {run} id),
    /// then the outcome as a last JSON line.
    #[arg(long)]
    pub json: bool,
    /// Also write REPORT.md, report.json and report.junit.xml of the check to PATH (a *.md
    /// path; the others go beside it).
    #[arg(long, value_name = "PATH")]
    pub report: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct CleanArgs {
    /// PostgreSQL server, postgres://USER@HOST:PORT/DATABASE, its database holding the ledger
    /// (default: DATABASE_URL if it is postgres://, else
    /// postgres://postgres@127.0.0.1:5432/postgres). A URL that cannot be parsed is a usage
    /// error (exit 2).
    #[arg(long, value_name = "URL")]
    pub pg_url: Option<String>,
    /// Only list what would be dropped.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Subcommand)]
pub enum TargetCommand {
    /// Write a commented starter set of five black-box scenarios for your service: same body
    /// from N clients, two bodies one key, two scopes one key, a retry after the answer, a
    /// retry after a rejected attempt. Then: ticketflow scenario run DIR/*.toml
    Init(InitArgs),
}

#[derive(Subcommand)]
pub enum ScenarioCommand {
    /// Run the given scenario files and print their verdicts.
    Run(RunArgs),
}

/// The lease options of `scenario run` and `verify`: where the `[lease]` scenarios (and the
/// kill matrix's lease gate) find Redis.
#[derive(clap::Args, Debug, Clone)]
pub struct LeaseScenarioArgs {
    /// Redis for the scenarios with Redis in the loop (`[lease]`), at redis://HOST:PORT/DB
    /// [default: redis://127.0.0.1:6379/14]. The flush and restart scenarios run FLUSHDB on
    /// that database (refused on db 0). Other scenarios run without a lease (a lease in front
    /// would hold racers away from their barrier).
    #[arg(long, value_name = "URL")]
    pub lease: Option<String>,
    /// Lease time to live in milliseconds (above 0) in those scenarios.
    #[arg(long, value_name = "MS", default_value_t = 2_000)]
    pub lease_ttl_ms: u64,
    /// A scenario that needs Redis and cannot reach it makes the exit non-zero (3) instead of
    /// only being PENDING.
    #[arg(long)]
    pub require_redis: bool,
}

/// `--database-url`, for the commands that open the ticket database (create, get, update,
/// prune, serve). Resolved by `main`: the option, else `DATABASE_URL`, else `ticketflow.db`.
#[derive(clap::Args)]
pub struct DatabaseArg {
    /// The ticket database: a SQLite file path (or sqlite://PATH) or
    /// postgres://USER@HOST:PORT/DATABASE [env: DATABASE_URL] [default: ticketflow.db in the
    /// working directory]. A given URL that cannot be parsed is a usage error (exit 2).
    #[arg(long, value_name = "URL")]
    pub database_url: Option<String>,
}

#[derive(clap::Args)]
pub struct CreateArgs {
    #[command(flatten)]
    pub db: DatabaseArg,
    /// Tenant id.
    #[arg(long)]
    pub tenant: String,
    /// Idempotency-Key.
    #[arg(long)]
    pub key: String,
    /// Read the request from this file instead of stdin.
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// Use one of the wrong implementations (docs/PROTOCOL.md §8) instead of the real protocol (to see
    /// what it gets wrong): key-only, noncanonical-fingerprint, check-then-insert, abandon-outer-tx, split-transactions, on-conflict-ignores-loss, single-statement-skips-reread, lease-unsafe-release, lease-as-arbiter.
    #[arg(long, value_parser = parse_variant)]
    pub variant: Option<Variant>,
    /// The create protocol (ignored with --variant).
    #[arg(long, value_enum, default_value = "savepoint")]
    pub protocol: Protocol,
    #[command(flatten)]
    pub lease: LeaseArgs,
    #[command(flatten)]
    pub isolation: IsolationArg,
}

#[derive(clap::Args)]
pub struct GetArgs {
    #[command(flatten)]
    pub db: DatabaseArg,
    /// Tenant id.
    #[arg(long)]
    pub tenant: String,
    /// Ticket id.
    #[arg(long)]
    pub id: Uuid,
}

#[derive(clap::Args)]
pub struct UpdateArgs {
    #[command(flatten)]
    pub db: DatabaseArg,
    /// Tenant id.
    #[arg(long)]
    pub tenant: String,
    /// Ticket id.
    #[arg(long)]
    pub id: Uuid,
    /// New title.
    #[arg(long)]
    pub title: Option<String>,
    /// New body.
    #[arg(long)]
    pub body: Option<String>,
    /// New priority (low, normal, high, urgent).
    #[arg(long)]
    pub priority: Option<String>,
}

#[derive(clap::Args)]
pub struct PruneArgs {
    #[command(flatten)]
    pub db: DatabaseArg,
    /// Age, e.g. `30d`, `12h`, `90min` (humantime syntax).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub older_than: Duration,
}

#[derive(clap::Args)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub lease: LeaseScenarioArgs,
    /// Directory of scenario files.
    #[arg(long, default_value = ticketflow::verify::DEFAULT_SCENARIOS)]
    pub scenarios: PathBuf,
    /// PostgreSQL server, postgres://USER@HOST:PORT/DATABASE (default: DATABASE_URL if it is
    /// postgres://, else postgres://postgres@127.0.0.1:5432/postgres). A URL given here or in
    /// DATABASE_URL must parse (else exit 2) and answer (else exit 3, as with
    /// --require-postgres); only the default may leave the PostgreSQL runs PENDING.
    #[arg(long, value_name = "URL")]
    pub pg_url: Option<String>,
    /// Exit 3 if any PostgreSQL scenario is PENDING (server unreachable), also with the
    /// default URL.
    #[arg(long)]
    pub require_postgres: bool,
    /// Where to write REPORT.md; report.json, report.junit.xml, reports/details/ and
    /// isolation-specs/ (for failing PostgreSQL races) go into the same directory. Default:
    /// ticketflow-report/REPORT.md (ticketflow-report/partial/ for a narrowed run: --filter,
    /// --no-kill-matrix, --backend, --isolation, --sqlite-*, --protocol, retry options).
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Refresh the tracked evidence: write REPORT.md (and reports/details/) in the working
    /// directory. Only from a full run: refused with --report or an option that narrows the
    /// run (--filter, --no-kill-matrix, --backend, --isolation, --sqlite-*, --protocol, retry
    /// options).
    #[arg(long)]
    pub update_report: bool,
    /// Replace report files that ticketflow did not write (not listed in their folder's
    /// .ticketflow-manifest.json). Without it such a file is refused (exit 2) before anything
    /// runs. Nothing is ever written or removed through a symlink.
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub matrix: MatrixArgs,
    #[command(flatten)]
    pub retry: RetryArgs,
    /// Seed of the property suites (printed in REPORT.md; random when absent). Case counts
    /// follow PROPTEST_CASES.
    #[arg(long)]
    pub seed: Option<u64>,
    /// The create protocol of the scenario matrix and property suites; every protocol
    /// runs the kill matrix and the fault cases as a control either way.
    #[arg(long, value_enum, default_value = "savepoint")]
    pub protocol: Protocol,
    /// Skip the kill matrix (every gate run against every wrong implementation, with the real protocols as controls).
    #[arg(long)]
    pub no_kill_matrix: bool,
    /// Run only the parts whose name contains PATTERN (repeatable): scenario names,
    /// property:fingerprint, property:sequential, property:concurrent, kill-matrix,
    /// faults, soak. What is left out is listed in the report as not selected.
    #[arg(long, value_name = "PATTERN")]
    pub filter: Vec<String>,
    /// Also restart the local PostgreSQL cluster (pg_ctlcluster) during a run of creates,
    /// to prove in-flight creates commit fully or not at all. Cuts every other session on
    /// that server.
    #[arg(long)]
    pub restart_postgres: bool,
    /// Run each black-box scenario N times (each with a fresh {run}); any failing repeat
    /// FAILs it. An HTTP-level barrier needs at least 3 passing repeats for a PASS.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub repeat: u32,
    /// Independent runs at once (scenario runs, property suites, kill-matrix cells), each in
    /// its own scratch database; output and report keep the serial order. Default: twice the
    /// machine's cores, between 2 and 4. 1 runs everything one after another.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub jobs: Option<u32>,
}

#[derive(clap::Args)]
pub struct InterposeArgs {
    /// The PostgreSQL your service uses, postgres://USER[:PASSWORD]@HOST:PORT/DATABASE: the
    /// interposer relays to its host and port; the printed URL is this one through it. The
    /// interposer needs no password: leave it out, or give the URL in the environment
    /// (TICKETFLOW_INTERPOSE_POSTGRES) rather than on the command line, where other local
    /// users can read it. An sslmode=require, verify-ca or verify-full URL is refused (the
    /// relay is plain text).
    #[arg(
        long,
        value_name = "URL",
        env = "TICKETFLOW_INTERPOSE_POSTGRES",
        hide_env_values = true
    )]
    pub postgres: String,
    /// The Redis your service uses, redis://HOST:PORT[/DB], if it uses one (or in
    /// TICKETFLOW_INTERPOSE_REDIS).
    #[arg(
        long,
        value_name = "URL",
        env = "TICKETFLOW_INTERPOSE_REDIS",
        hide_env_values = true
    )]
    pub redis: Option<String>,
    /// Relay to a PostgreSQL or Redis off this host. The relay is plain text: the service's
    /// statements, parameters and password exchange cross the network unencrypted. Without
    /// it a non-loopback upstream is a usage error.
    #[arg(long)]
    pub allow_remote_upstream: bool,
    /// Where to write the control token, a new file (an existing one is refused) of mode
    /// 0600, removed when the interposer stops. Only holders of this file can control the
    /// interposer. Default: a new file in $XDG_RUNTIME_DIR, else the temporary folder; the
    /// path is printed.
    #[arg(long, value_name = "PATH")]
    pub control_token_file: Option<PathBuf>,
    /// Where the PostgreSQL interposer listens (loopback); port 0 picks a free port.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    pub listen_postgres: SocketAddr,
    /// Where the Redis interposer listens (loopback); port 0 picks a free port.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    pub listen_redis: SocketAddr,
    /// The control address a scenario names in [target] interposer (loopback); port 0 picks
    /// a free port.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    pub control: SocketAddr,
    /// Outside a run, how long a relay thread that expects bytes soon polls its socket before
    /// it sleeps, in microseconds, when a core is to spare (one thread at a time, never while
    /// several sessions are busy together); 0 never polls (docs/INTERPOSER.md).
    #[arg(long, value_name = "MICROSECONDS", default_value_t = 300)]
    pub busy_poll_us: u64,
}

#[derive(clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub db: DatabaseArg,
    /// Address to listen on; port 0 picks a free port (the printed line names it).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Serve one of the wrong implementations (docs/PROTOCOL.md §8) instead of the protocol (a negative
    /// control for black-box scenarios): key-only, noncanonical-fingerprint, check-then-insert, abandon-outer-tx, split-transactions, on-conflict-ignores-loss, single-statement-skips-reread, lease-unsafe-release, lease-as-arbiter, tenant-blind, answer-in-second-transaction, redis-check-then-lock (its keys in the Redis of --lease), lost-ack-creates-again, claim-never-expires, redis-lock-expires (its keys in the Redis of --lease, locked for --lease-ttl-ms), answer-stored-after-response, and the sequence variants replay-rerendered, cache-without-scope, fingerprint-on-race-path-only, refused-overwrites-fingerprint, late-outbox-after-replay, replay-newest, key-hash-collision.
    #[arg(long, value_parser = parse_variant)]
    pub variant: Option<Variant>,
    /// The create protocol served (ignored with --variant).
    #[arg(long, value_enum, default_value = "savepoint")]
    pub protocol: Protocol,
    /// Most database sessions held at once; each request in flight holds one.
    #[arg(long, default_value_t = 16)]
    pub pool_size: u32,
    /// Sessions opened at startup and kept open (at most --pool-size); 0 opens them on
    /// demand. Equal to --pool-size, the service never opens a session while it runs.
    #[arg(long, default_value_t = 0)]
    pub min_idle: u32,
    /// Milliseconds a request waits for a free session before a 503.
    #[arg(long, default_value_t = 10_000)]
    pub pool_timeout_ms: u64,
    /// After Ctrl-C or SIGTERM, milliseconds requests in flight may take before the
    /// service stops anyway (a second signal stops it at once).
    #[arg(long, default_value_t = 5_000)]
    pub shutdown_grace_ms: u64,
    /// Connections held at once [default: 1024, or fewer when the file-descriptor limit
    /// allows fewer]. At the limit a new connection replaces the longest-idle one, else the
    /// slowest request head; with every connection busy it gets 503.
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Milliseconds from a request head's first byte to its last before the connection is
    /// closed (slow clients).
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    pub header_read_timeout_ms: u64,
    /// Milliseconds a connection with no request in flight and no byte moving stays open.
    #[arg(long, value_name = "MS", default_value_t = 60_000)]
    pub idle_timeout_ms: u64,
    /// Milliseconds from a request's head to its answer; later is a 503 (retry with the same
    /// Idempotency-Key).
    #[arg(long, value_name = "MS", default_value_t = 30_000)]
    pub request_timeout_ms: u64,
    /// Authentication: a file of `TOKEN TENANT` lines (or the same lines in
    /// TICKETFLOW_AUTH_TOKENS). Every ticket route then needs `Authorization: Bearer TOKEN`,
    /// the token decides the tenant and X-Tenant-Id is refused. Without it any caller may
    /// claim any tenant: for local tests only.
    #[arg(long, value_name = "FILE")]
    pub auth_tokens: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub lease: LeaseArgs,
    #[command(flatten)]
    pub isolation: IsolationArg,
}

#[derive(clap::Args)]
pub struct SoakArgs {
    /// PostgreSQL server, postgres://USER@HOST:PORT/DATABASE (default: DATABASE_URL if it is
    /// postgres://, else postgres://postgres@127.0.0.1:5432/postgres); must be on loopback.
    /// A given URL that cannot be parsed is a usage error (exit 2).
    #[arg(long, value_name = "URL")]
    pub pg_url: Option<String>,
    /// How long the traffic runs (humantime: `30s`, `2min`), 1 s to 10 min. The faults stop
    /// for the last quarter (at least 1 s).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub duration: Duration,
    /// Client connections (threads, one request in flight each), 1 to 64.
    #[arg(long, default_value_t = 8)]
    pub connections: usize,
    /// Tenants the traffic is spread over, 1 to 100.
    #[arg(long, default_value_t = 3)]
    pub tenants: usize,
    /// Seed of the traffic (connection i uses SEED + i).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Fault kinds, comma-separated, injected in this order: kill-service,
    /// terminate-backends, statement-timeout, restart-postgres (restarts the local cluster,
    /// cutting every session on it: only when asked), or `none` alone.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "kill-service,terminate-backends,statement-timeout",
        value_parser = parse_fault
    )]
    pub faults: Vec<Option<FaultKind>>,
    /// The short statement_timeout of the statement-timeout fault, milliseconds (1 to 1000).
    #[arg(long, default_value_t = 1)]
    pub statement_timeout_ms: u64,
    /// How long the statement-timeout fault keeps it set, milliseconds (at most a quarter
    /// of --duration; default 500, or a quarter of --duration when shorter).
    #[arg(long)]
    pub statement_timeout_hold_ms: Option<u64>,
    /// Serve one of the wrong implementations (docs/PROTOCOL.md §8) instead of the protocol: a
    /// negative control the soak must FAIL.
    #[arg(long, value_parser = parse_variant)]
    pub variant: Option<Variant>,
    /// The create protocol the services run (ignored with --variant).
    #[arg(long, value_enum, default_value = "savepoint")]
    pub protocol: Protocol,
    /// Print the report as JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `--faults`: a fault kind's name, or `none` (no faults).
fn parse_fault(s: &str) -> Result<Option<FaultKind>, BadValue> {
    use clap::ValueEnum as _;
    if s == "none" {
        return Ok(None);
    }
    FaultKind::from_str(s, false)
        .map(Some)
        .map_err(|_| BadValue::Fault(s.to_string()))
}

/// The fault kinds' names, for [`BadValue::Fault`].
fn fault_names() -> String {
    use clap::ValueEnum as _;
    FaultKind::value_variants()
        .iter()
        .map(|k| k.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A value of an option that this module parses itself, which it cannot read; each carries
/// the value given, and says what was expected (clap prints it after the option and value).
#[derive(Debug, thiserror::Error)]
enum BadValue {
    /// `--faults`: not `none` nor a fault kind.
    #[error("expected none or one of {}", fault_names())]
    Fault(String),
    /// `--implementation`: not a protocol nor a wrong variant.
    #[error(
        "expected protocol, on-conflict, single-statement or one of {}",
        variant_names()
    )]
    Implementation(String),
    /// `--variant`: not a wrong variant.
    #[error("expected one of {}", variant_names())]
    Variant(String),
    /// `--explore`: not an exploration mode.
    #[error("{0:?}: expected auto, reduced, exhaustive, bounded, pct or first-point")]
    Explore(String),
}

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Backends to measure.
    #[arg(long, value_enum, default_value = "both")]
    pub backend: BackendChoice,
    /// PostgreSQL server (as for verify); must be on loopback. A URL given here or in
    /// DATABASE_URL must parse (else exit 2) and answer (else exit 1); only the default
    /// URL is skipped with a note when it does not answer under --backend both.
    #[arg(long, value_name = "URL")]
    pub pg_url: Option<String>,
    /// Protocol(s) to measure (default: all three).
    #[arg(long, value_enum)]
    pub protocol: Option<Protocol>,
    /// Workloads to run: create, replay, hot-key, converge (default: all).
    #[arg(long, value_enum, value_delimiter = ',', hide_possible_values = true)]
    pub workloads: Vec<Workload>,
    /// Client counts of the create and replay rows (the largest also runs hot-key).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    pub clients: Vec<usize>,
    /// Racer counts of the convergence rows.
    #[arg(long, value_delimiter = ',', default_value = "2,4,8,16,32")]
    pub racers: Vec<usize>,
    /// How long each side of a throughput row runs (pgbench: whole seconds, or 20
    /// transactions per client under 1 s).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    pub duration: Duration,
    /// Barrier releases per convergence row and side.
    #[arg(long, default_value_t = 21)]
    pub converge_reps: usize,
    /// Whole runs; every figure is the median over them.
    #[arg(long, default_value_t = 1)]
    pub runs: usize,
    /// Tiny runs (150 ms per side, 2 releases): every row, meaningless figures.
    #[arg(long)]
    pub quick: bool,
    /// Also write the rows as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Also measure the hot-key and converge rows with and without a Redis lease at
    /// redis://HOST:PORT/DB (docs/PROTOCOL.md §10): a second table of ratios; Redis must
    /// answer.
    #[arg(long, value_name = "URL")]
    pub lease: Option<String>,
    /// Lease time to live in milliseconds (above 0) for --lease.
    #[arg(long, value_name = "MS", default_value_t = 2_000)]
    pub lease_ttl_ms: u64,
    /// Also write the lease rows as JSON to this file (with --lease).
    #[arg(long, value_name = "PATH")]
    pub lease_json: Option<PathBuf>,
    /// The pgbench binary.
    #[arg(long, default_value = "pgbench")]
    pub pgbench: PathBuf,
    /// Also measure the interposer (PostgreSQL required): `serve` through it in pass-through
    /// against direct at each --clients count; Redis through it against direct (one client,
    /// GET one at a time and pipelined 100 at a time, on the Redis --lease names, else
    /// redis://127.0.0.1:6379); the time to explore two racers (exhaustive with
    /// single-statement, bounded b = 2 with savepoint, and the reduced search beside each);
    /// and the time to explore each file of the starter set (`target init --interposer`)
    /// against two `serve` instances. Three more tables.
    #[arg(long)]
    pub interposer: bool,
    /// Also write the interposer rows as JSON to this file (with --interposer).
    #[arg(long, value_name = "PATH")]
    pub interposer_json: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct WorkerArgs {
    /// PostgreSQL server, postgres://USER@HOST:PORT/DATABASE (a usage error otherwise).
    #[arg(long, value_name = "URL")]
    pub pg_url: String,
    /// Database on that server.
    #[arg(long)]
    pub dbname: String,
    /// Isolation level.
    #[arg(long, value_enum, default_value = "read-committed")]
    pub isolation: IsolationLevel,
    /// The barrier's lock mode.
    #[arg(long, value_enum, default_value = "access-exclusive")]
    pub lock: LockMode,
    /// Transactions per create, at least 1.
    #[arg(long, default_value_t = 10)]
    pub max_attempts: u32,
    /// Backoff cap of the first retry, microseconds.
    #[arg(long, default_value_t = 2000)]
    pub base_backoff_us: u64,
    /// Backoff cap of any retry, microseconds.
    #[arg(long, default_value_t = 100_000)]
    pub max_backoff_us: u64,
    /// `protocol`, `on-conflict`, `single-statement` or a wrong variant's name.
    #[arg(long, default_value = "protocol", value_parser = parse_implementation)]
    pub implementation: Implementation,
    /// Exit (code 137, no reply) right after this many commits: a fault injection.
    #[arg(long)]
    pub die_after_commits: Option<u32>,
}

#[derive(clap::Args)]
pub struct InitArgs {
    /// Base URL of a running instance (repeatable: one per instance).
    #[arg(long = "url", required = true, value_name = "URL")]
    pub urls: Vec<String>,
    /// The service's (test) database, for a table-lock barrier and count queries. `${VAR}`
    /// is written as is and read from the environment at run time. (Not DATABASE_URL, which
    /// is never written into scenario files.)
    #[arg(long, value_name = "URL")]
    pub target_database_url: Option<String>,
    /// The table to lock as the barrier (its idempotency-key table, or the table the
    /// create writes). Without it: an HTTP-level barrier (keys in Redis or memory).
    #[arg(long, requires = "target_database_url")]
    pub table: Option<String>,
    /// Method of the create request.
    #[arg(long, default_value = "POST")]
    pub method: String,
    /// Path of the create request.
    #[arg(long, default_value = "/")]
    pub path: String,
    /// The JSON body of the create request, with placeholders in its string values; its help
    /// text is [`body_help`]'s.
    #[arg(long, help = body_help(), default_value = r#"{"name":"example {run}","quantity":1}"#)]
    pub body: String,
    /// A JSON body the service rejects before doing anything, for the retry-after-rejected
    /// scenario. Under the ietf preset 422 means "key reused with another payload": if your
    /// service answers validation errors with 422, add a rule for it.
    #[arg(long, default_value = "{}")]
    pub invalid_body: String,
    /// Header carrying the scope (tenant or user id); without it each scope gets its own
    /// `Authorization: Bearer ${API_TOKEN_A}` and its value (what {scope} binds in the counts)
    /// is `${API_SCOPE_A}`, the tenant or user the service derives from that token.
    #[arg(long)]
    pub scope_header: Option<String>,
    /// The control address of a running `ticketflow interpose` in front of the service's
    /// database (loopback IP:PORT): the files race through it ([barrier] kind = "interposer",
    /// [target] interposer), and the command that starts it is printed. Needs
    /// --target-database-url (the database's direct URL).
    #[arg(long)]
    pub interposer: Option<String>,
    /// Header carrying the idempotency key.
    #[arg(long, default_value = "Idempotency-Key")]
    pub key_header: String,
    /// Response rule preset: ietf, stripe, ticketflow or none.
    #[arg(long, value_enum, default_value = "ietf", hide_possible_values = true)]
    pub preset: Preset,
    /// A count query `NAME=SQL` expected to be 1 per intent (repeatable); `{scope}`,
    /// `{key}` and `{run}` are bound as parameters.
    #[arg(long = "count", value_name = "NAME=SQL")]
    pub counts: Vec<String>,
    /// Clients in the same-body race.
    #[arg(long, default_value_t = 4)]
    pub clients: usize,
    /// The service does not mark its replays (no `Idempotent-Replayed` header or other marker;
    /// a replay has the create's status): the files set `[target.replay] marked = false` and
    /// expect `created` where a replay comes back, judged by one id per intent.
    #[arg(long)]
    pub unmarked_replays: bool,
    /// Directory to write into (created if missing).
    #[arg(long, default_value = "scenarios/my-service")]
    pub out: PathBuf,
    /// Overwrite existing files.
    #[arg(long)]
    pub force: bool,
}

#[derive(clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub lease: LeaseScenarioArgs,
    /// Scenario files; a directory stands for the *.toml files directly in it.
    #[arg(required = true, value_name = "FILE|DIR")]
    pub files: Vec<PathBuf>,
    /// PostgreSQL server, postgres://USER@HOST:PORT/DATABASE (default: DATABASE_URL if it is
    /// postgres://, else postgres://postgres@127.0.0.1:5432/postgres). A URL given here or in
    /// DATABASE_URL must parse (else exit 2) and answer (else exit 3, as with
    /// --require-postgres); only the default may leave the PostgreSQL runs PENDING.
    #[arg(long, value_name = "URL")]
    pub pg_url: Option<String>,
    /// Exit 3 if any PostgreSQL run is PENDING (server unreachable), also with the default URL.
    #[arg(long)]
    pub require_postgres: bool,
    #[command(flatten)]
    pub matrix: MatrixArgs,
    /// Print every run as JSON (one object per line) instead of a summary.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub retry: RetryArgs,
    /// Run `protocol` (default) or one of the wrong implementations (docs/PROTOCOL.md §8), to watch a
    /// scenario catch it.
    #[arg(long, default_value = "protocol", value_parser = parse_implementation)]
    pub implementation: Implementation,
    /// Write each PostgreSQL run's recorded race into this directory as a PostgreSQL
    /// isolation-tester spec (`SCENARIO.ISOLATION.spec`), replayable with
    /// `isolationtester "dbname=EMPTY_DB" < FILE`.
    #[arg(long, value_name = "DIR")]
    pub export_isolation_spec: Option<PathBuf>,
    /// Run each black-box scenario N times (each with a fresh {run}); any failing repeat
    /// FAILs it. An HTTP-level barrier needs at least 3 passing repeats for a PASS.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub repeat: u32,
    /// Black-box scenarios: override every barrier's timeout (milliseconds).
    #[arg(long, value_name = "MS")]
    pub barrier_timeout_ms: Option<u64>,
    /// Interposed scenarios ([barrier] kind = "interposer"): override the [schedule] mode:
    /// auto, reduced, exhaustive, bounded, pct or first-point.
    #[arg(long, value_name = "MODE", value_parser = parse_explore)]
    pub explore: Option<ticketflow_harness::blackbox::format::ExploreMode>,
    /// Interposed scenarios: run only this schedule id (as a FAIL prints it, e.g. AABAB), to
    /// replay a failing schedule.
    #[arg(long, value_name = "ID")]
    pub schedule: Option<String>,
    /// Interposed scenarios: explore on after a failing schedule.
    #[arg(long)]
    pub keep_going: bool,
    /// Interposed scenarios: run up to N schedules side by side, each on a set-up of its own
    /// (scratch database, services, interposers): the reduced, exhaustive, bounded and pct
    /// searches (a --schedule replay and a fault sweep run one at a time). Default: the cores
    /// this process may use. A scenario with
    /// [target] database_url or interposer, a service the runner does not start, or
    /// state_across_keys = true runs one at a time, and says so.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub parallel: Option<u32>,
    /// Also write a report of exactly these files (library runs and black-box outcomes, each
    /// black-box run with its {run} id) to PATH, a REPORT.md path (*.md); report.json,
    /// report.junit.xml, report.steps.json and reports/details/ go beside it, and its
    /// directory is created if missing. Written whatever the verdict; the exit code is the
    /// same as without it (1 if the report cannot be written). Unlike `verify --scenarios
    /// DIR`, it runs and claims none of verify's self-checks (property suites, loom, faults,
    /// soak, kill matrix).
    #[arg(long, value_name = "PATH")]
    pub report: Option<PathBuf>,
    /// Replace files of --report (and specs in --export-isolation-spec) that ticketflow did not
    /// write (not listed in their folder's .ticketflow-manifest.json). Without it such a file
    /// is refused (exit 2, or exit 1 for a spec named only after the run). Nothing is ever
    /// written or removed through a symlink.
    #[arg(long)]
    pub force: bool,
}

/// The racers' retry policy (transient failures: 40001, 40P01, SQLite busy, invisible winner).
#[derive(clap::Args)]
pub struct RetryArgs {
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
    /// savepoint protocol does without it (docs/PROTOCOL.md §7); expect FAILs at REPEATABLE READ and above.
    #[arg(long)]
    no_retry: bool,
}

impl RetryArgs {
    pub fn policy(&self) -> RetryPolicy {
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
pub struct MatrixArgs {
    /// Which backends to run.
    #[arg(long, value_enum, default_value = "both")]
    pub backend: BackendChoice,
    /// PostgreSQL isolation levels (repeatable; default: every level the scenario allows).
    #[arg(long, value_enum)]
    pub isolation: Vec<IsolationLevel>,
    /// SQLite journal modes (repeatable; default both).
    #[arg(long, value_enum)]
    pub sqlite_journal: Vec<JournalMode>,
    /// SQLite transaction modes (repeatable; default all three).
    #[arg(long, value_enum)]
    pub sqlite_tx: Vec<TxMode>,
}

impl MatrixArgs {
    /// The matrix cells these flags select (an empty list means every value).
    pub fn selection(&self) -> Selection {
        let journals = match self.sqlite_journal.as_slice() {
            [] => vec![JournalMode::Wal, JournalMode::Delete],
            given => given.to_vec(),
        };
        let txs = match self.sqlite_tx.as_slice() {
            [] => vec![TxMode::Lazy, TxMode::Deferred, TxMode::Immediate],
            given => given.to_vec(),
        };
        let sqlite = journals
            .iter()
            .flat_map(|&journal| {
                txs.iter()
                    .map(move |&tx| RunSetting::Sqlite { journal, tx })
            })
            .collect();
        Selection {
            backends: self.backend.backends(),
            isolation: self.isolation.clone(),
            sqlite,
        }
    }
}

/// `--implementation`: `protocol`, `on-conflict`, `single-statement` or a wrong variant's name.
fn parse_implementation(s: &str) -> Result<Implementation, BadValue> {
    Implementation::parse(s).ok_or_else(|| BadValue::Implementation(s.to_string()))
}

/// `--variant`: a wrong variant's name.
fn parse_variant(s: &str) -> Result<Variant, BadValue> {
    Variant::parse(s).ok_or_else(|| BadValue::Variant(s.to_string()))
}

fn variant_names() -> String {
    Variant::every()
        .chain(Variant::SERVED_ONLY)
        .map(|v| v.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// `target init --body`'s help: "The JSON body of the create request (string values may use
/// {run}, {racer}, {n})", its placeholders as literals.
///
/// Clap reads `{n}` in a help text as a line break, with no escape, so a plain doc comment
/// printed "…may use {run}, {racer}, " and a line starting with ")". Each placeholder's name
/// is styled as a literal instead: the style's escape code between `{` and `n` keeps clap
/// from seeing the token, and where colours are off the code is stripped as it is written,
/// leaving `{n}` as typed.
fn body_help() -> clap::builder::StyledStr {
    use std::fmt::Write as _;
    let literal = clap::builder::styling::Style::new().bold();
    let mut help = clap::builder::StyledStr::new();
    help.push_str("The JSON body of the create request (string values may use ");
    for (i, name) in ["run", "racer", "n"].into_iter().enumerate() {
        if i > 0 {
            help.push_str(", ");
        }
        // Writing to a String-backed StyledStr cannot fail.
        let _ = write!(help, "{{{literal}{name}{literal:#}}}");
    }
    help.push_str(")");
    help
}

/// `--lease URL --lease-ttl-ms MS`, shared by the commands that create.
#[derive(clap::Args)]
pub struct LeaseArgs {
    /// A short Redis lease per (tenant, key) in front of the receipt (docs/PROTOCOL.md §10),
    /// at redis://HOST:PORT/DB. It may cut contention, never replaces the receipt; Redis
    /// unreachable or slow: the create goes on without it.
    #[arg(long, value_name = "URL")]
    pub lease: Option<String>,
    /// Lease time to live in milliseconds (above 0); a request that finds the lease held
    /// waits at most this long for the receipt.
    #[arg(long, value_name = "MS", default_value_t = 2_000)]
    pub lease_ttl_ms: u64,
}

/// `--isolation LEVEL`, shared by `create` and `serve`.
#[derive(clap::Args)]
pub struct IsolationArg {
    /// PostgreSQL isolation level of each transaction (docs/PROTOCOL.md §7): read-committed
    /// [default], repeatable-read, serializable, or server-default (a plain BEGIN: the
    /// server's default_transaction_isolation decides). Not for SQLite (always serializable).
    #[arg(long, value_enum, value_name = "LEVEL")]
    pub isolation: Option<IsolationChoice>,
}

/// `--explore MODE`.
fn parse_explore(s: &str) -> Result<ticketflow_harness::blackbox::format::ExploreMode, BadValue> {
    ticketflow_harness::blackbox::format::ExploreMode::parse(s)
        .ok_or_else(|| BadValue::Explore(s.to_string()))
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    /// Every `about` and argument help of `cmd` and its subcommands, with the name of the
    /// command it belongs to, as clap holds them before rendering (styles as escape codes).
    fn help_texts(cmd: &clap::Command, path: &str, out: &mut Vec<(String, String)>) {
        let path = format!("{path} {}", cmd.get_name());
        for text in [cmd.get_about(), cmd.get_long_about()]
            .into_iter()
            .flatten()
        {
            out.push((path.clone(), text.ansi().to_string()));
        }
        for arg in cmd.get_arguments() {
            for text in [arg.get_help(), arg.get_long_help()].into_iter().flatten() {
                out.push((
                    format!("{path} --{}", arg.get_id()),
                    text.ansi().to_string(),
                ));
            }
        }
        for sub in cmd.get_subcommands() {
            help_texts(sub, &path, out);
        }
    }

    /// The subcommand at `path` (`"scenario run"`), if the command line has it.
    fn subcommand(path: &str) -> Option<clap::Command> {
        let mut cmd = Cli::command();
        for name in path.split(' ') {
            cmd = cmd.find_subcommand(name)?.clone();
        }
        Some(cmd)
    }

    #[test]
    fn every_flag_the_library_names_is_a_flag_of_each_subcommand_it_names_it_for() {
        let missing: Vec<String> = ticketflow_core::flags::ALL
            .iter()
            .flat_map(|flag| flag.commands.iter().map(move |c| (flag, *c)))
            .filter(|(flag, path)| {
                !subcommand(path)
                    .is_some_and(|cmd| cmd.get_arguments().any(|a| a.get_long() == Some(flag.name)))
            })
            .map(|(flag, path)| format!("ticketflow {path} {flag}"))
            .collect();
        assert!(missing.is_empty(), "not on the command line: {missing:?}");
    }

    #[test]
    fn the_flag_check_catches_a_flag_the_command_line_does_not_have() {
        let verify = subcommand("verify").unwrap();
        assert!(verify
            .get_arguments()
            .any(|a| a.get_long() == Some("force")));
        assert!(!verify
            .get_arguments()
            .any(|a| a.get_long() == Some("no-such-flag")));
        assert!(subcommand("scenario nope").is_none());
    }

    /// `args` with the service placeholders filled in, parsed as this binary's command line.
    fn parses(args: &[String]) -> Result<super::Cli, clap::Error> {
        let filled = args.iter().map(|a| {
            a.replace("{ticketflow}", "ticketflow")
                .replace("{port}", "8080")
                .replace("{database_url}", "postgres://postgres@127.0.0.1:5432/x")
                .replace("{redis_url}", "redis://127.0.0.1:6379/15")
        });
        <super::Cli as clap::Parser>::try_parse_from(filled)
    }

    #[test]
    fn every_command_line_the_harness_starts_this_binary_with_parses() {
        use ticketflow_core::variants::{Implementation, Variant};
        use ticketflow_harness::argv::{implementation_args, ServeArgs, WorkerArgs};
        let serve = ServeArgs::new()
            .pool_size(4)
            .min_idle(2)
            .pool_timeout_ms(2000)
            .shutdown_grace_ms(500)
            .implementation(Implementation::Variant(Variant::KeyOnly))
            .into_vec();
        parses(&serve).unwrap();
        for implementation in [
            Implementation::Variant(Variant::RedisCheckThenLock),
            Implementation::Protocol(ticketflow_core::Protocol::OnConflict),
        ] {
            let mut line = ServeArgs::new().into_vec();
            line.extend(implementation_args(implementation));
            parses(&line).unwrap();
        }
        let retry = ticketflow_core::RetryPolicy::default();
        let mut worker = vec!["ticketflow".to_string()];
        worker.extend(
            WorkerArgs {
                pg_url: "postgres://postgres@127.0.0.1:5432/x",
                dbname: "x",
                isolation: ticketflow_core::store::postgres::IsolationLevel::RepeatableRead,
                lock: ticketflow_harness::scenario::format::LockMode::Advisory.name(),
                implementation: Implementation::default(),
                retry: &retry,
                die_after_commits: Some(2),
            }
            .to_vec(),
        );
        parses(&worker).unwrap();
        // Control: a flag the command line does not have is refused.
        worker.push(format!("{}no-such-flag", "--"));
        assert!(parses(&worker).is_err());
    }

    #[test]
    fn every_command_a_report_prints_to_reproduce_a_run_parses() {
        use ticketflow_core::store::postgres::IsolationLevel;
        use ticketflow_harness::scenario::RunSetting;
        let words = |line: &str| {
            line.split_whitespace()
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        let mut settings = RunSetting::sqlite_matrix();
        settings.extend(IsolationLevel::ALL.map(|isolation| RunSetting::Postgres { isolation }));
        for setting in settings {
            let line = format!("ticketflow scenario run a.toml {}", setting.cli_flags());
            parses(&words(&line)).unwrap_or_else(|e| panic!("{line}: {e}"));
        }
        let replay =
            ticketflow_harness::argv::reproduce_schedule(std::path::Path::new("a.toml"), "s3-1.2");
        parses(&words(&replay)).unwrap_or_else(|e| panic!("{replay}: {e}"));
    }

    /// Every long flag of `cmd` and its subcommands.
    fn long_flags(cmd: &clap::Command, out: &mut std::collections::BTreeSet<String>) {
        out.extend(
            cmd.get_arguments()
                .filter_map(|a| a.get_long().map(str::to_string)),
        );
        for sub in cmd.get_subcommands() {
            long_flags(sub, out);
        }
    }

    /// Flags of other programs the sources name: clap's own, and the tools the harness runs.
    const OTHER_PROGRAMS: &[(&str, &str)] = &[
        ("help", "clap"),
        ("version", "clap"),
        ("skip-systemctl-redirect", "pg_ctlcluster"),
        ("log-prefix", "pgbench"),
        ("pkglibdir", "pg_config"),
        ("cfg", "rustc"),
        ("x", "Mermaid (a failed message's arrow)"),
        ("data-binary", "curl (a minimal failing history's requests)"),
    ];

    /// The flag names in `text` (after `--`, not inside a longer word or another flag), with
    /// their line numbers; a name followed by `*` (`--sqlite-*`) ends in `*`.
    fn flag_tokens(text: &str) -> Vec<(usize, String)> {
        let mut found = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let bytes = line.as_bytes();
            let mut i = 0;
            while let Some(at) = line[i..].find("--") {
                let start = i + at;
                let before = start.checked_sub(1).map(|b| bytes[b]);
                let name: String = line[start + 2..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
                    .collect();
                let standalone =
                    !before.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
                let wildcard = line[start + 2 + name.len()..].starts_with('*');
                if standalone && name.starts_with(|c: char| c.is_ascii_lowercase()) {
                    let name = match wildcard {
                        true => format!("{name}*"),
                        false => name.trim_end_matches('-').to_string(),
                    };
                    found.push((n + 1, name));
                }
                i = start + 2;
            }
        }
        found
    }

    fn rust_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// The library crates spell flags in messages, reproduce commands and docs; a renamed or
    /// removed flag must not live on there.
    #[test]
    fn every_flag_named_in_the_sources_is_a_flag_of_the_command_line_or_of_a_named_tool() {
        let mut known = std::collections::BTreeSet::new();
        long_flags(&Cli::command(), &mut known);
        known.extend(OTHER_PROGRAMS.iter().map(|(f, _)| f.to_string()));
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files = Vec::new();
        rust_files(&root.join("crates"), &mut files);
        rust_files(&root.join("src"), &mut files);
        assert!(files.len() > 100, "only {} files", files.len());
        let mut unknown = Vec::new();
        let mut seen = 0;
        for file in &files {
            let text = std::fs::read_to_string(file).unwrap();
            for (line, name) in flag_tokens(&text) {
                seen += 1;
                let is_known = match name.strip_suffix('*') {
                    Some(prefix) => known.iter().any(|k| k.starts_with(prefix)),
                    None => known.contains(&name),
                };
                if !is_known {
                    unknown.push(format!("{}:{line}: --{name}", file.display()));
                }
            }
        }
        assert!(seen > 100, "only {seen} flags named");
        assert!(
            unknown.is_empty(),
            "not a flag of any command: {unknown:#?}"
        );
    }

    #[test]
    fn the_source_scan_finds_a_flag_in_text_and_code_but_not_inside_a_word() {
        // Built at run time, so this file does not name a flag that does not exist.
        let text = format!(
            "/// give `--force` or --pg-url=URL\nlet a = b--c; \"x {dashes}no-such-flag\"; // ---\n\
             --x- {dashes}sqlite-*",
            dashes = "--"
        );
        let found = flag_tokens(&text);
        let names: Vec<&str> = found.iter().map(|(_, n)| n.as_str()).collect();
        assert_eq!(names, ["force", "pg-url", "no-such-flag", "x", "sqlite-*"]);
        assert_eq!(found[2].0, 2);
    }

    #[test]
    fn no_help_text_holds_the_token_clap_renders_as_a_line_break() {
        let mut texts = Vec::new();
        help_texts(&Cli::command(), "", &mut texts);
        assert!(texts.len() > 100, "only {} help texts found", texts.len());
        let eaten: Vec<_> = texts.iter().filter(|(_, t)| t.contains("{n}")).collect();
        assert!(
            eaten.is_empty(),
            "{{n}} would print as a line break in {eaten:?}"
        );
    }
}
