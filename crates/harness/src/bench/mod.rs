//! `ticketflow bench`: what the create protocol costs against the database's own limit.
//!
//! Every row measures one workload twice, back to back, on the same database: **ours** (the
//! real protocol, [`ticketflow_core::protocol::create_ticket`], through the crate's stores) and a
//! **baseline** that sends the same SQL statements with nothing around them:
//!
//! - PostgreSQL throughput rows: `pgbench -n -M prepared` with the custom scripts of
//!   `scripts/bench/` (embedded here, written to a temporary directory) at the same client
//!   count, against the same scratch database ([`pgbench`]);
//! - PostgreSQL hot-key and convergence rows and every SQLite row: a minimal loop of the same
//!   statements on the bare driver (`postgres::Client`, `rusqlite::Connection`) ([`raw`]).
//!
//! Workloads (each for both protocols, [`Protocol::ALL`], unless `--protocol` picks one):
//! - `create`: N clients, each creating tickets under fresh, distinct keys;
//! - `replay`: N clients replaying random keys among [`REPLAY_KEYS`] existing receipts;
//! - `hot-key`: the largest client count, every client retrying one of [`HOT_KEYS`] fresh
//!   keys (the first requests race to create, the rest replay); the baseline is the bare
//!   loop on both backends, since pgbench cannot recover from the loser's unique violation;
//! - `converge`: N racers (2 to 32) send the same create under one key, released together by
//!   an in-process barrier; the time from release until every racer holds the one ticket id.
//!
//! Units: throughput in operations (transactions) per second; latencies in microseconds;
//! convergence in milliseconds. **ratio** is always ours' speed over the baseline's speed:
//! throughput ours / baseline, convergence baseline time / ours' time, so 1.0 means no cost
//! and the target is 0.9 or better on every row. With `runs > 1` every figure is the median
//! over the runs and the ratio is the median of the per-run ratios (each pair measured back
//! to back under the same machine load, the baseline first in odd runs).
//!
//! Only loopback servers are measured: a URL whose host is not `127.0.0.1`, `::1` or
//! `localhost` is refused.
//!
//! With `--interposer`, [`interpose`] adds the interposer's rows: `serve` through it in
//! pass-through against direct, and the time to explore two racers.
//!
//! With `--lease URL`, [`lease`] adds rows for the contended workloads (hot-key, converge):
//! the protocol with and without the Redis lease, in the same run, with lost inserts and
//! transactions counted.

pub mod interpose;
pub mod lease;
pub mod pgbench;
pub mod raw;
pub mod tester;

use std::path::PathBuf;
use std::sync::Barrier;
use std::time::{Duration, Instant};
use ticketflow_core::store::url::PgServer;

use serde::Serialize;

use crate::scratch::{ScratchDb, ScratchError};
use ticketflow_core::domain::TicketRequest;
use ticketflow_core::protocol::{create_ticket, CreateOptions, Protocol};
use ticketflow_core::store::{Backend, Store};

/// Tenant every bench row writes under.
pub const TENANT: &str = "bench";
/// Existing receipts the `replay` workload picks from.
pub const REPLAY_KEYS: usize = 1000;
/// Keys the `hot-key` workload's clients share.
pub const HOT_KEYS: usize = 10;

/// The PostgreSQL server a bench run measures, decided before anything is measured:
/// `Ok(Some(url))` when PostgreSQL is selected and answers; `Ok(None)` when it is not
/// selected, or when it is one of both backends and the built-in default URL does not
/// answer (the caller says it was skipped: `skipped` gets the reason).
///
/// Will return `Err` with the reason when PostgreSQL is the only backend selected, or the
/// URL was given (option or `DATABASE_URL`: a given URL must answer), and it does not answer.
pub fn postgres_for(
    pg: &ticketflow_core::store::url::PgUrl,
    selected: bool,
    only: bool,
    skipped: impl FnOnce(&str),
) -> Result<Option<PgServer>, NoPostgres> {
    if !selected {
        return Ok(None);
    }
    match ticketflow_core::store::url::probe_postgres(&pg.server) {
        Ok(()) => Ok(Some(pg.server.clone())),
        Err(source) if only => Err(NoPostgres::Only(source)),
        Err(source) if pg.is_explicit() => Err(NoPostgres::Given {
            source,
            origin: pg.origin,
        }),
        Err(why) => {
            skipped(&why.to_string());
            Ok(None)
        }
    }
}

/// Why a bench run cannot measure PostgreSQL ([`postgres_for`]).
#[derive(Debug, thiserror::Error)]
pub enum NoPostgres {
    /// PostgreSQL is the only backend selected and does not answer.
    #[error("{0}")]
    Only(ticketflow_core::store::url::ProbeError),
    /// The URL was given (option or `DATABASE_URL`), so it must answer, and it does not.
    #[error("{source} (the URL given by {origin})")]
    Given {
        /// Why it does not answer.
        source: ticketflow_core::store::url::ProbeError,
        /// Where the URL came from.
        origin: ticketflow_core::store::url::UrlOrigin,
    },
}

/// What a bench run measures.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Measure SQLite.
    pub sqlite: bool,
    /// Measure PostgreSQL on this server (on loopback), if `Some`.
    pub pg: Option<PgServer>,
    /// Protocols to measure.
    pub protocols: Vec<Protocol>,
    /// Workloads to run (default: all four).
    pub workloads: Vec<Workload>,
    /// Client counts of the `create` and `replay` rows; the largest one runs `hot-key`.
    pub clients: Vec<usize>,
    /// Racer counts of the `converge` rows.
    pub racers: Vec<usize>,
    /// How long one side of one throughput row runs.
    pub duration: Duration,
    /// Barrier releases per `converge` row and side (the median is reported).
    pub converge_reps: usize,
    /// Whole runs; figures are medians over them.
    pub runs: usize,
    /// The `pgbench` binary.
    pub pgbench: PathBuf,
}

impl BenchOptions {
    /// The full default set: both backends (PostgreSQL on `pg`), both protocols, clients
    /// 1, 2, 4, 8, racers 2 to 32, 1 s per side, 21 releases per convergence row, one run.
    pub fn standard(pg: Option<PgServer>) -> Self {
        BenchOptions {
            sqlite: true,
            pg,
            protocols: Protocol::ALL.to_vec(),
            workloads: Workload::ALL.to_vec(),
            clients: vec![1, 2, 4, 8],
            racers: vec![2, 4, 8, 16, 32],
            duration: Duration::from_secs(1),
            converge_reps: 21,
            runs: 1,
            pgbench: PathBuf::from("pgbench"),
        }
    }

    /// Every row, but tiny: 150 ms per side (pgbench: 20 transactions per client), 2
    /// releases per convergence row. For smoke tests; the figures mean little.
    pub fn quick(mut self) -> Self {
        self.duration = Duration::from_millis(150);
        self.converge_reps = 2;
        self
    }
}

/// A workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    // `help = None`: `--help` lists the bare names, as it always has; these docs are for
    // the code's readers.
    /// Fresh distinct keys.
    #[cfg_attr(feature = "cli", value(help = None::<&str>))]
    Create,
    /// Existing receipts.
    #[cfg_attr(feature = "cli", value(help = None::<&str>))]
    Replay,
    /// Every client on [`HOT_KEYS`] keys.
    #[cfg_attr(feature = "cli", value(help = None::<&str>))]
    HotKey,
    /// Racers released together on one key.
    #[cfg_attr(feature = "cli", value(help = None::<&str>))]
    Converge,
}

impl Workload {
    /// The four, in table order.
    pub const ALL: [Workload; 4] = [
        Workload::Create,
        Workload::Replay,
        Workload::HotKey,
        Workload::Converge,
    ];

    /// Parses a name as [`Workload::name`] writes it; `None` for anything else.
    pub fn parse(name: &str) -> Option<Workload> {
        Workload::ALL.into_iter().find(|w| w.name() == name)
    }

    /// `create`, `replay`, `hot-key`, `converge`.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Create => "create",
            Workload::Replay => "replay",
            Workload::HotKey => "hot-key",
            Workload::Converge => "converge",
        }
    }
}

/// One side of a row.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Measure {
    /// Operations per second (throughput rows), or milliseconds from barrier release to
    /// convergence (converge rows; median over the releases).
    pub value: f64,
    /// Median latency of one operation in microseconds (converge rows: of one release).
    pub p50_us: f64,
    /// 99th-percentile latency in microseconds (converge rows: the slowest release).
    pub p99_us: f64,
    /// Operations completed.
    pub ops: u64,
}

/// One row of the table.
#[derive(Debug, Clone, Serialize)]
pub struct BenchRow {
    /// The backend measured.
    pub backend: Backend,
    /// The protocol measured.
    pub protocol: Protocol,
    /// The workload.
    pub workload: Workload,
    /// Clients (racers for `converge`).
    pub clients: usize,
    /// The protocol through the crate.
    pub ours: Measure,
    /// The same statements, bare.
    pub baseline: Measure,
    /// `pgbench`, `postgres loop` or `rusqlite loop`.
    pub baseline_tool: &'static str,
    /// Ours' speed over the baseline's (module docs).
    pub ratio: f64,
}

impl BenchRow {
    fn new(
        backend: Backend,
        protocol: Protocol,
        workload: Workload,
        clients: usize,
        ours: Measure,
        baseline: Measure,
        baseline_tool: &'static str,
    ) -> Self {
        let ratio = match workload {
            Workload::Converge => baseline.value / ours.value,
            _ => ours.value / baseline.value,
        };
        BenchRow {
            backend,
            protocol,
            workload,
            clients,
            ours,
            baseline,
            baseline_tool,
            ratio,
        }
    }

    fn same_cell(&self, other: &BenchRow) -> bool {
        self.backend == other.backend
            && self.protocol == other.protocol
            && self.workload == other.workload
            && self.clients == other.clients
    }
}

/// Why a bench could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A database operation failed.
    #[error("{context}: {source}")]
    Store {
        /// What was being done.
        context: String,
        /// The cause.
        #[source]
        source: Box<ticketflow_core::Error>,
    },
    /// The bench's scratch database could not be created or opened.
    #[error("{context}: {source}")]
    Scratch {
        /// What was being done.
        context: String,
        /// The cause.
        #[source]
        source: ScratchError,
    },
    /// pgbench could not run or its output was not understood.
    #[error("pgbench: {0}")]
    Pgbench(String),
    /// The racers of a convergence row did not converge on one ticket.
    #[error("{0}")]
    NotConverged(String),
    /// The server is not on this machine.
    #[error("refusing to benchmark a server that is not on loopback: {0}")]
    NotLoopback(String),
    /// `--lease` names a Redis that does not answer: the lease rows cannot be measured.
    #[error(
        "{} {url}: Redis unreachable ({source}); the lease rows need it, nothing was measured",
        ticketflow_core::flags::LEASE
    )]
    LeaseUnreachable {
        /// The lease URL.
        url: String,
        /// The Redis error.
        #[source]
        source: ticketflow_core::lease::LeaseError,
    },
    /// A file could not be written.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

fn store_err<E: Into<ticketflow_core::Error>>(
    context: impl Into<String>,
) -> impl FnOnce(E) -> BenchError {
    let context = context.into();
    move |e| BenchError::Store {
        context,
        source: Box::new(e.into()),
    }
}

/// The request every bench create sends (the same as the baseline scripts' values).
pub(crate) fn bench_request() -> TicketRequest {
    TicketRequest {
        actor_id: "u1".into(),
        title: "Printer jammed".into(),
        body: "Floor 3 printer shows E-42".into(),
        priority: "high".into(),
    }
}

/// A unique prefix for one measurement's keys.
fn tag(label: &str) -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("{label}{}-", &id[..8])
}

fn scratch_err(context: &'static str) -> impl FnOnce(ScratchError) -> BenchError {
    move |source| BenchError::Scratch {
        context: context.into(),
        source,
    }
}

/// A session of ours (the protocol through the crate's store) on the bench's database.
fn open(db: &ScratchDb) -> Result<Box<dyn Store + Send>, BenchError> {
    db.open().map_err(scratch_err("open a session"))
}

/// A bare session of the baseline on the bench's database.
fn open_raw(db: &ScratchDb) -> Result<raw::RawSession, BenchError> {
    match (db.pg_config(), db.sqlite_path()) {
        (Some(config), _) => raw::RawSession::postgres(config),
        (None, Some(path)) => raw::RawSession::sqlite(path),
        (None, None) => Err(BenchError::Scratch {
            context: "open a bare session".into(),
            source: ScratchError::Unsupported(db.backend()),
        }),
    }
}

/// Checks that `server` is on this machine.
pub(crate) fn require_loopback(server: &PgServer) -> Result<(), BenchError> {
    let config = server.config();
    let local = config.get_hosts().iter().all(|h| match h {
        postgres::config::Host::Tcp(name) => {
            matches!(name.as_str(), "127.0.0.1" | "::1" | "localhost")
        }
        #[cfg(unix)]
        postgres::config::Host::Unix(_) => true,
    });
    if local && !config.get_hosts().is_empty() {
        Ok(())
    } else {
        Err(BenchError::NotLoopback(server.url().to_string()))
    }
}

/// Runs the bench: every row for every selected backend and protocol, `runs` times; returns
/// one row per cell with medians (module docs). `progress` is called with each row of each
/// run as it is measured.
///
/// Will return `Err` if a database cannot be created or opened, pgbench fails, or a
/// convergence row does not converge.
pub fn run(
    opts: &BenchOptions,
    mut progress: impl FnMut(usize, &BenchRow),
) -> Result<Vec<BenchRow>, BenchError> {
    if let Some(pg) = &opts.pg {
        require_loopback(pg)?;
    }
    let mut all: Vec<Vec<BenchRow>> = Vec::new();
    for run_no in 0..opts.runs.max(1) {
        let mut rows = Vec::new();
        if opts.sqlite {
            let target = ScratchDb::sqlite().map_err(scratch_err("create the SQLite database"))?;
            run_target(&target, opts, run_no % 2 == 1, &mut rows, |r| {
                progress(run_no, r)
            })?;
        }
        if let Some(pg) = &opts.pg {
            // Migrated once, before any client connects.
            let target = ScratchDb::postgres(pg, "bench")
                .map_err(scratch_err("create the scratch database"))?;
            run_target(&target, opts, run_no % 2 == 1, &mut rows, |r| {
                progress(run_no, r)
            })?;
        }
        all.push(rows);
    }
    Ok(medians(&all))
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn median_measure(ms: &[Measure]) -> Measure {
    Measure {
        value: median(ms.iter().map(|m| m.value).collect()),
        p50_us: median(ms.iter().map(|m| m.p50_us).collect()),
        p99_us: median(ms.iter().map(|m| m.p99_us).collect()),
        ops: ms.iter().map(|m| m.ops).sum(),
    }
}

/// One row per cell: median ours, median baseline, median of the per-run ratios.
fn medians(runs: &[Vec<BenchRow>]) -> Vec<BenchRow> {
    let Some(first) = runs.first() else {
        return Vec::new();
    };
    first
        .iter()
        .map(|cell| {
            let same: Vec<&BenchRow> = runs
                .iter()
                .flat_map(|r| r.iter().filter(|x| x.same_cell(cell)))
                .collect();
            let ours: Vec<Measure> = same.iter().map(|r| r.ours).collect();
            let base: Vec<Measure> = same.iter().map(|r| r.baseline).collect();
            BenchRow {
                ours: median_measure(&ours),
                baseline: median_measure(&base),
                ratio: median(same.iter().map(|r| r.ratio).collect()),
                ..cell.clone()
            }
        })
        .collect()
}

/// Measures both sides of a row, the baseline first when `baseline_first` (odd runs), so an
/// order effect (a warmer cache, a checkpoint, another process's burst) does not always
/// favour the same side.
fn pair(
    baseline_first: bool,
    ours: impl FnOnce() -> Result<Measure, BenchError>,
    baseline: impl FnOnce() -> Result<Measure, BenchError>,
) -> Result<(Measure, Measure), BenchError> {
    if baseline_first {
        let b = baseline()?;
        Ok((ours()?, b))
    } else {
        let o = ours()?;
        Ok((o, baseline()?))
    }
}

fn run_target(
    target: &ScratchDb,
    opts: &BenchOptions,
    baseline_first: bool,
    rows: &mut Vec<BenchRow>,
    mut progress: impl FnMut(&BenchRow),
) -> Result<(), BenchError> {
    let backend = target.backend();
    let max_clients = opts.clients.iter().copied().max().unwrap_or(1);
    let tool = match target.pg() {
        None => "rusqlite loop",
        Some(_) => "pgbench",
    };
    // Receipts for the replay rows, created once through the real protocol.
    let replay_tag = tag("r");
    let wants = |w: Workload| opts.workloads.contains(&w);
    if wants(Workload::Replay) {
        create_replay_keys(target, &replay_tag)?;
    }
    let scripts = match target.pg() {
        Some(_) => Some(pgbench::Scripts::write()?),
        None => None,
    };
    let cx = TargetCx {
        target,
        opts,
        baseline_first,
        scripts: &scripts,
        replay_tag: &replay_tag,
        tool,
        max_clients,
        backend,
    };
    for &protocol in &opts.protocols {
        protocol_rows(&cx, protocol, rows, &mut progress)?;
    }
    Ok(())
}

/// [`REPLAY_KEYS`] receipts tagged `replay_tag`, created once through the real protocol.
fn create_replay_keys(target: &ScratchDb, replay_tag: &str) -> Result<(), BenchError> {
    let mut s = open(target)?;
    for i in 0..REPLAY_KEYS {
        create_ticket(
            s.as_mut(),
            TENANT,
            &format!("{replay_tag}{i}"),
            &bench_request(),
            &CreateOptions::new(Protocol::Savepoint),
        )
        .map_err(store_err("create the replay keys"))?;
    }
    Ok(())
}

/// What every row of one target shares.
#[derive(Clone, Copy)]
struct TargetCx<'a> {
    target: &'a ScratchDb,
    opts: &'a BenchOptions,
    baseline_first: bool,
    scripts: &'a Option<pgbench::Scripts>,
    replay_tag: &'a str,
    tool: &'static str,
    max_clients: usize,
    backend: Backend,
}

/// The rows of one protocol on one target, in workload order (create, replay, hot key,
/// converge), each pushed to `rows` and shown to `progress`.
fn protocol_rows(
    cx: &TargetCx<'_>,
    protocol: Protocol,
    rows: &mut Vec<BenchRow>,
    mut progress: impl FnMut(&BenchRow),
) -> Result<(), BenchError> {
    throughput_rows(cx, protocol, rows, &mut progress)?;
    contention_rows(cx, protocol, rows, &mut progress)
}

/// The rows of one workload of `protocol`, when it is selected: one per count of `counts`
/// (clients or racers), each side measured by `ours` and `baseline` in `cx`'s order, pushed to
/// `rows` and shown to `progress`. The one setup of every workload's rows.
#[allow(clippy::too_many_arguments)]
fn workload_rows(
    cx: &TargetCx<'_>,
    protocol: Protocol,
    workload: Workload,
    counts: &[usize],
    tool: &'static str,
    rows: &mut Vec<BenchRow>,
    progress: &mut impl FnMut(&BenchRow),
    ours: impl Fn(usize) -> Result<Measure, BenchError>,
    baseline: impl Fn(usize) -> Result<Measure, BenchError>,
) -> Result<(), BenchError> {
    if !cx.opts.workloads.contains(&workload) {
        return Ok(());
    }
    for &n in counts {
        let (ours, baseline) = pair(cx.baseline_first, || ours(n), || baseline(n))?;
        let row = BenchRow::new(cx.backend, protocol, workload, n, ours, baseline, tool);
        progress(&row);
        rows.push(row);
    }
    Ok(())
}

/// The create and replay rows (one per client count) of `protocol`.
fn throughput_rows(
    cx: &TargetCx<'_>,
    protocol: Protocol,
    rows: &mut Vec<BenchRow>,
    mut progress: impl FnMut(&BenchRow),
) -> Result<(), BenchError> {
    let TargetCx {
        target,
        opts,
        scripts,
        replay_tag,
        tool,
        ..
    } = *cx;
    workload_rows(
        cx,
        protocol,
        Workload::Create,
        &opts.clients,
        tool,
        rows,
        &mut progress,
        |clients| {
            ours_throughput(target, protocol, clients, opts.duration, |_, i| {
                Key::Fresh(i)
            })
        },
        |clients| match (target.pg(), &scripts) {
            (Some(scratch), Some(scripts)) => pgbench::run(
                opts,
                scratch,
                &scripts.create(protocol),
                clients,
                &[("tag", tag("b").as_str())],
            ),
            _ => raw_throughput(target, protocol, clients, opts.duration, |_, i| {
                raw::Op::Fresh(i)
            }),
        },
    )?;
    let rt = replay_tag;
    workload_rows(
        cx,
        protocol,
        Workload::Replay,
        &opts.clients,
        tool,
        rows,
        &mut progress,
        |clients| {
            ours_throughput(target, protocol, clients, opts.duration, |r, _| {
                Key::Existing(format!("{rt}{}", r % REPLAY_KEYS as u64))
            })
        },
        |clients| {
            replay_baseline(
                target,
                scripts,
                opts,
                protocol,
                clients,
                replay_tag,
                REPLAY_KEYS,
            )
        },
    )
}

/// The hot-key row and the converge rows (one per racer count) of `protocol`.
fn contention_rows(
    cx: &TargetCx<'_>,
    protocol: Protocol,
    rows: &mut Vec<BenchRow>,
    mut progress: impl FnMut(&BenchRow),
) -> Result<(), BenchError> {
    let TargetCx {
        target,
        opts,
        max_clients,
        ..
    } = *cx;
    let ht = tag("h");
    // The baseline starts on fresh keys too, so both sides race for the first creates;
    // pgbench cannot recover from the loser's unique violation, so the bare loop runs it.
    let hot_base = tag("hb");
    workload_rows(
        cx,
        protocol,
        Workload::HotKey,
        &[max_clients],
        bare_tool(target),
        rows,
        &mut progress,
        |clients| {
            ours_throughput(target, protocol, clients, opts.duration, |r, _| {
                Key::Existing(format!("{ht}{}", r % HOT_KEYS as u64))
            })
        },
        |clients| {
            raw_throughput(target, protocol, clients, opts.duration, |r, _| {
                raw::Op::Key(format!("{hot_base}{}", r % HOT_KEYS as u64))
            })
        },
    )?;
    workload_rows(
        cx,
        protocol,
        Workload::Converge,
        &opts.racers,
        bare_tool(target),
        rows,
        &mut progress,
        |racers| converge(target, protocol, racers, opts.converge_reps, false),
        |racers| converge(target, protocol, racers, opts.converge_reps, true),
    )
}

fn bare_tool(target: &ScratchDb) -> &'static str {
    match target.pg() {
        None => "rusqlite loop",
        Some(_) => "postgres loop",
    }
}

fn replay_baseline(
    target: &ScratchDb,
    scripts: &Option<pgbench::Scripts>,
    opts: &BenchOptions,
    protocol: Protocol,
    clients: usize,
    key_tag: &str,
    nkeys: usize,
) -> Result<Measure, BenchError> {
    match (target.pg(), scripts) {
        (Some(scratch), Some(scripts)) => pgbench::run(
            opts,
            scratch,
            &scripts.replay(protocol),
            clients,
            &[("tag", key_tag), ("nkeys", &nkeys.to_string())],
        ),
        _ => {
            let t = key_tag.to_string();
            raw_throughput(target, protocol, clients, opts.duration, move |r, _| {
                raw::Op::Replay(format!("{t}{}", r % nkeys as u64))
            })
        }
    }
}

/// The key of one operation of a throughput row.
enum Key {
    /// A fresh key: the client's n-th operation.
    Fresh(u64),
    /// This key.
    Existing(String),
}

/// Latencies to a [`Measure`]: throughput over `elapsed`, exact percentiles.
fn measure(mut latencies_us: Vec<u32>, elapsed: Duration) -> Measure {
    latencies_us.sort_unstable();
    let pct = |p: f64| -> f64 {
        if latencies_us.is_empty() {
            return f64::NAN;
        }
        let i = ((latencies_us.len() as f64 - 1.0) * p).round() as usize;
        f64::from(latencies_us[i])
    };
    Measure {
        value: latencies_us.len() as f64 / elapsed.as_secs_f64(),
        p50_us: pct(0.50),
        p99_us: pct(0.99),
        ops: latencies_us.len() as u64,
    }
}

/// Runs `op` on `clients` threads (each with a session from `open`) until `duration` has
/// passed; `key(random, n)` picks the key of each client's n-th operation.
fn throughput<S: Send>(
    clients: usize,
    duration: Duration,
    mut open: impl FnMut() -> Result<S, BenchError>,
    op: impl Fn(&mut S, u64, u64) -> Result<(), BenchError> + Sync,
) -> Result<Measure, BenchError> {
    let sessions: Vec<S> = (0..clients).map(|_| open()).collect::<Result<_, _>>()?;
    let barrier = Barrier::new(clients);
    let start = std::sync::OnceLock::new();
    let results: Vec<Result<Vec<u32>, BenchError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = sessions
            .into_iter()
            .map(|mut s| {
                let (barrier, op, start) = (&barrier, &op, &start);
                scope.spawn(move || {
                    let mut lat = Vec::with_capacity(4096);
                    barrier.wait();
                    let t0 = *start.get_or_init(Instant::now);
                    let deadline = t0 + duration;
                    let mut n = 0u64;
                    loop {
                        let now = Instant::now();
                        if now >= deadline {
                            break;
                        }
                        op(&mut s, rand::random::<u64>(), n)?;
                        lat.push(now.elapsed().as_micros().min(u32::MAX as u128) as u32);
                        n += 1;
                    }
                    Ok(lat)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench client panicked"))
            .collect()
    });
    let elapsed = start
        .get()
        .map(|t: &Instant| t.elapsed())
        .unwrap_or(duration);
    let mut all = Vec::new();
    for r in results {
        all.extend(r?);
    }
    Ok(measure(all, elapsed.max(duration)))
}

fn ours_throughput(
    target: &ScratchDb,
    protocol: Protocol,
    clients: usize,
    duration: Duration,
    key: impl Fn(u64, u64) -> Key + Sync,
) -> Result<Measure, BenchError> {
    let fresh = tag("o");
    let request = bench_request();
    throughput(
        clients,
        duration,
        || Ok((open(target)?, uuid::Uuid::new_v4().simple().to_string())),
        |(s, client), random, n| {
            let k = match key(random, n) {
                Key::Fresh(i) => format!("{fresh}{}-{i}", &client[..8]),
                Key::Existing(k) => k,
            };
            create_ticket(
                s.as_mut(),
                TENANT,
                &k,
                &request,
                &CreateOptions::new(protocol),
            )
            .map(drop)
            .map_err(store_err("create"))
        },
    )
}

fn raw_throughput(
    target: &ScratchDb,
    protocol: Protocol,
    clients: usize,
    duration: Duration,
    op: impl Fn(u64, u64) -> raw::Op + Sync,
) -> Result<Measure, BenchError> {
    let fresh = tag("b");
    throughput(
        clients,
        duration,
        || Ok((open_raw(target)?, uuid::Uuid::new_v4().simple().to_string())),
        |(s, client), random, n| match op(random, n) {
            raw::Op::Fresh(i) => {
                s.create(protocol, &format!("{fresh}{}-{i}", &client[..8]))?;
                Ok(())
            }
            raw::Op::Key(k) => s.create(protocol, &k).map(drop),
            raw::Op::Replay(k) => s.replay(protocol, &k),
        },
    )
}

/// `reps` barrier releases of `racers` sessions creating one key (fresh per release); the
/// median time from release to the last racer's answer. Checks that every racer answered
/// with the same ticket id.
fn converge(
    target: &ScratchDb,
    protocol: Protocol,
    racers: usize,
    reps: usize,
    bare: bool,
) -> Result<Measure, BenchError> {
    enum Session {
        Ours(Box<dyn Store + Send>),
        Bare(raw::RawSession),
    }
    let mut sessions: Vec<Session> = (0..racers)
        .map(|_| {
            Ok(if bare {
                Session::Bare(open_raw(target)?)
            } else {
                Session::Ours(open(target)?)
            })
        })
        .collect::<Result<_, BenchError>>()?;
    let request = bench_request();
    converge_rounds(
        &mut sessions,
        reps,
        if bare { "cb" } else { "co" },
        |s, key| match s {
            Session::Ours(store) => create_ticket(
                store.as_mut(),
                TENANT,
                key,
                &request,
                &CreateOptions::new(protocol),
            )
            .map_err(store_err("converge create"))
            .map(|r| r.outcome.ticket().map(|t| t.id.to_string())),
            Session::Bare(raw) => raw.create(protocol, key).map(Some),
        },
        || {
            format!(
                "{racers} racers on {} ({protocol}, bare: {bare})",
                target.backend()
            )
        },
    )
}

/// The racer loop of every convergence row: `reps` (at least 1) barrier releases of one racer
/// per session of `sessions`, each racer calling `create` with the release's fresh key (tagged
/// `key_tag`); the median time from release to the last answer ([`convergence_measure`]).
///
/// Will return `Err` with a racer's own error, or ([`BenchError::NotConverged`], `what`
/// naming the row) when the racers of a release did not all answer the same ticket id.
fn converge_rounds<S: Send, T: Ord + std::fmt::Debug + Send>(
    sessions: &mut [S],
    reps: usize,
    key_tag: &str,
    create: impl Fn(&mut S, &str) -> Result<Option<T>, BenchError> + Sync,
    what: impl Fn() -> String,
) -> Result<Measure, BenchError> {
    let racers = sessions.len();
    let mut times_ms = Vec::new();
    for _ in 0..reps.max(1) {
        let key = format!("{}0", tag(key_tag));
        let barrier = Barrier::new(racers + 1);
        let (released, answers) = std::thread::scope(|scope| {
            let handles: Vec<_> = sessions
                .iter_mut()
                .map(|s| {
                    let (barrier, key, create) = (&barrier, &key, &create);
                    scope.spawn(move || {
                        barrier.wait();
                        let go = Instant::now();
                        let id = create(s, key);
                        (id, go, Instant::now())
                    })
                })
                .collect();
            barrier.wait();
            released_and_answers(
                handles
                    .into_iter()
                    .map(|h| h.join().expect("racer panicked")),
            )
        });
        let ms = convergence_ms(released, answers)?
            .map_err(|ids| BenchError::NotConverged(format!("{} answered {ids:?}", what())))?;
        times_ms.push(ms);
    }
    Ok(convergence_measure(racers, &times_ms))
}

/// The release instant of a convergence round and the racers' answers, from each racer's
/// `(answer, when it left the barrier, when it answered)`: the release is the earliest racer
/// out of the barrier, not when the releasing thread was next scheduled (that can come after
/// every racer has answered, which measured 0 ms).
pub(crate) fn released_and_answers<T>(
    racers: impl Iterator<Item = (T, Instant, Instant)>,
) -> (Instant, Vec<(T, Instant)>) {
    let mut released: Option<Instant> = None;
    let answers = racers
        .map(|(answer, go, done)| {
            released = Some(released.map_or(go, |r| r.min(go)));
            (answer, done)
        })
        .collect();
    (released.unwrap_or_else(Instant::now), answers)
}

/// One release of a convergence row: milliseconds from `released` to the last answer when
/// every racer answered the same ticket id, else `Err` with the ids seen (`None`: a racer
/// answered without a ticket). A racer's own error is returned as is.
fn convergence_ms<T: Ord>(
    released: Instant,
    answers: Vec<(Result<Option<T>, BenchError>, Instant)>,
) -> Result<Result<f64, Diverged<T>>, BenchError> {
    let mut ids = std::collections::BTreeSet::new();
    let mut last = released;
    for (id, at) in answers {
        ids.insert(id?);
        last = last.max(at);
    }
    if ids.len() != 1 || ids.contains(&None) {
        return Ok(Err(Diverged(ids)));
    }
    Ok(Ok(last.duration_since(released).as_secs_f64() * 1000.0))
}

/// The ticket ids the racers of one release answered when they were not all one (`None`: a
/// racer answered without a ticket).
struct Diverged<T>(std::collections::BTreeSet<Option<T>>);

impl<T: std::fmt::Debug> std::fmt::Debug for Diverged<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// A convergence row's figures from its releases' times (ms): the median, and the worst as
/// p99 (the releases are few).
fn convergence_measure(racers: usize, times_ms: &[f64]) -> Measure {
    let max = times_ms.iter().copied().fold(0.0, f64::max);
    Measure {
        value: median(times_ms.to_vec()),
        p50_us: median(times_ms.to_vec()) * 1000.0,
        p99_us: max * 1000.0,
        ops: (racers * times_ms.len()) as u64,
    }
}

/// The rows as a Markdown table: backend, protocol, workload, clients, ours, baseline,
/// ratio, p50/p99 of each side, the baseline's tool. Ratios under 0.9 are marked `**`.
pub fn markdown(rows: &[BenchRow]) -> String {
    let mut out = String::from(
        "| backend | protocol | workload | clients | ours | baseline | ratio | ours p50 / p99 (µs) | baseline p50 / p99 (µs) | baseline tool |\n\
         |---|---|---|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for r in rows {
        let unit = match r.workload {
            Workload::Converge => "ms",
            _ => "/s",
        };
        let fmt = |m: &Measure| match r.workload {
            Workload::Converge => format!("{:.2} {unit}", m.value),
            _ => format!("{:.0} {unit}", m.value),
        };
        let ratio = if r.ratio < 0.9 {
            format!("**{:.2}**", r.ratio)
        } else {
            format!("{:.2}", r.ratio)
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {:.0} / {:.0} | {:.0} / {:.0} | {} |\n",
            r.backend,
            r.protocol,
            r.workload.name(),
            r.clients,
            fmt(&r.ours),
            fmt(&r.baseline),
            ratio,
            r.ours.p50_us,
            r.ours.p99_us,
            r.baseline.p50_us,
            r.baseline.p99_us,
            r.baseline_tool
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// PostgreSQL is skipped only when it is one of both backends at the built-in default
    /// URL; selected alone, or at a given URL, a server that does not answer is an error.
    #[test]
    fn postgres_is_skipped_only_at_the_default_url_beside_sqlite() {
        use ticketflow_core::store::url::{PgUrl, UrlOrigin};
        let at = |origin| PgUrl {
            server: PgServer::parse("postgres://postgres@127.0.0.1:1/postgres?connect_timeout=2")
                .unwrap(),
            origin,
        };
        let mut said = String::new();
        assert!(matches!(
            postgres_for(&at(UrlOrigin::Default), false, false, |_| unreachable!()),
            Ok(None)
        ));
        assert!(matches!(
            postgres_for(&at(UrlOrigin::Default), true, false, |w| said =
                w.to_string()),
            Ok(None)
        ));
        assert!(!said.is_empty());
        assert!(postgres_for(&at(UrlOrigin::Default), true, true, |_| unreachable!()).is_err());
        let given = postgres_for(
            &at(UrlOrigin::Flag("--pg-url")),
            true,
            false,
            |_| unreachable!(),
        )
        .unwrap_err()
        .to_string();
        assert!(given.contains("(the URL given by --pg-url)"), "{given}");
    }

    #[test]
    fn a_round_is_timed_from_the_first_racer_out_of_the_barrier() {
        use std::time::Duration;
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        // The releasing thread may run again only after every racer answered: the round
        // still measures from the earliest racer's release to the last answer: 3 ms, not 0.
        let (released, answers) =
            released_and_answers([(1, at(1), at(3)), (1, at(0), at(2))].into_iter());
        assert_eq!(released, t0);
        let ms = convergence_ms::<i32>(
            released,
            answers
                .into_iter()
                .map(|(id, done)| (Ok(Some(id)), done))
                .collect(),
        )
        .unwrap()
        .unwrap();
        assert!((ms - 3.0).abs() < 1e-9, "{ms}");
    }

    #[test]
    fn percentiles_and_medians() {
        let m = measure((1..=100).collect(), Duration::from_secs(2));
        assert_eq!(m.value, 50.0);
        assert_eq!(m.p50_us, 51.0);
        assert_eq!(m.p99_us, 99.0);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
    }

    #[test]
    fn ratio_is_a_speed_ratio_for_every_workload() {
        let m = |value| Measure {
            value,
            ..Measure::default()
        };
        let r = |w| {
            BenchRow::new(
                Backend::Sqlite,
                Protocol::Savepoint,
                w,
                1,
                m(90.0),
                m(100.0),
                "x",
            )
        };
        assert!((r(Workload::Create).ratio - 0.9).abs() < 1e-9);
        // 90 ms against 100 ms: ours is faster.
        assert!(r(Workload::Converge).ratio > 1.0);
    }

    #[test]
    fn only_loopback_servers_are_benchmarked() {
        let at = |url: &str| require_loopback(&PgServer::parse(url).unwrap());
        assert!(at("postgres://postgres@127.0.0.1:5432/postgres").is_ok());
        assert!(at("postgres://postgres@localhost/postgres").is_ok());
        assert!(matches!(
            at("postgres://postgres@db.example.com/postgres"),
            Err(BenchError::NotLoopback(_))
        ));
    }
}
