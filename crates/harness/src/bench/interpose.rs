//! `ticketflow bench --interposer`: what the interposer ([`crate::interpose`]) costs.
//!
//! Two kinds of rows, both on a scratch PostgreSQL database of the bench's server:
//!
//! - **pass-through**: requests per second of `ticketflow serve` creating tickets under fresh
//!   keys, with its database sessions going straight to PostgreSQL (**direct**, the baseline),
//!   through a **plain relay** (bytes copied as they come, a thread per direction, nothing
//!   decoded: what any relay's hop costs) and through an interposer outside any run
//!   (**through**), measured back to back in the same run at the same client count, the order
//!   turned every run. The ratio is through / direct (1.0: the proxy costs nothing; the target
//!   is 0.9 or better); the ratio to the plain relay is what the interposer costs beyond the
//!   hop itself. Every side is one `serve` process, started the same way, and HTTP/1.1
//!   keep-alive clients.
//! - **Redis pass-through**: commands per second of one client against Redis, straight
//!   (**direct**), through a plain relay, and through a Redis interposer outside any run
//!   (**through**), measured back to back in the same run, the order turned every run: `GET` of an absent key one at
//!   a time (a round trip each), and pipelined, [`PIPELINE`] `GET`s written at once before
//!   their replies are read (a client library's pipeline). `GET` is a command the interposer
//!   holds as a step during a run (`PING` is housekeeping, never held), so the rows measure
//!   the path a service's own commands take. The ratio is through / direct (target 0.9 or
//!   better); a relay that forwards a pipeline one command per round trip shows here as a
//!   ratio far below 1.
//! - **explore**: the time to explore two racers with one key against our own `serve`
//!   through the interposer (the kill matrix's `scenarios/interposed/two-racers-same-key.toml`),
//!   as `ticketflow scenario run` would: exhaustively with the
//!   `single-statement` protocol and preemption-bounded (*b* = 2) with `savepoint`, and each
//!   with the reduced search (one schedule per class of interleavings) beside it, and the
//!   bounded search again with its schedules on two lanes side by side (`--parallel 2`, each
//!   lane its own scratch database and `serve`), beside the same search on one; the
//!   schedules run, the seconds from the command's start to the verdict (the scratch
//!   database and the services' start included: what a user waits for), the schedules per
//!   second, and the verdict with its coverage line
//!   (both protocols are correct: anything but PASS is a finding, printed, not hidden).
//!   The target is 30 s or less per row on the 2-core machine.
//!
//! - **isolation tester**: PostgreSQL's isolation tester running every permutation of the
//!   two-racer savepoint race's first schedule, exported as a spec ([`super::tester`]), beside
//!   the explore rows of the same race.
//!
//! Figures, not assertions: nothing here fails a test on speed.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use ticketflow_core::store::url::PgServer;

use serde::Serialize;

use super::{median, require_loopback, scratch_err, BenchError};
use crate::blackbox::format::ExploreMode;
use crate::blackbox::format::ServiceSpec;
use crate::blackbox::service::Services;
use crate::interpose::{upstream_of, url_through, Interposer, Limits, StoreKind};
use crate::scratch::ScratchDb;
use ticketflow_core::protocol::Protocol;
use ticketflow_core::variants::Implementation;

/// One pass-through row.
#[derive(Debug, Clone, Serialize)]
pub struct PassThroughRow {
    /// HTTP clients sending at once.
    pub clients: usize,
    /// Requests per second answered 201 with `serve` connected straight to PostgreSQL
    /// (median over the runs).
    pub direct_rps: f64,
    /// The same through a plain relay (bytes copied as they come, a thread
    /// per direction, nothing decoded): what any relay in between costs.
    pub plain_rps: f64,
    /// The same through the interposer (no run active: every message relayed untouched).
    pub through_rps: f64,
    /// Median of the per-run ratios through / direct.
    pub ratio: f64,
    /// Median of the per-run ratios through / plain relay: what the interposer costs beyond
    /// a relay's hop.
    pub ratio_to_plain: f64,
    /// Requests answered with anything but 201, every side, all runs (expected 0).
    pub errors: u64,
}

/// One explore row.
#[derive(Debug, Clone, Serialize)]
pub struct ExploreRow {
    /// `single-statement` or `savepoint`.
    pub protocol: &'static str,
    /// `exhaustive`, `bounded (b = 2)` or `reduced`.
    pub mode: String,
    /// Schedules run.
    pub schedules: usize,
    /// Seconds from the start to the verdict, set-up (scratch database, services) included.
    pub seconds: f64,
    /// Schedules per second.
    pub per_second: f64,
    /// `PASS`, `FAIL` or `PENDING`.
    pub verdict: String,
    /// What was explored, as the verdict states it; or why it did not run.
    pub coverage: String,
}

/// One Redis pass-through row: one client, a shape of traffic.
#[derive(Debug, Clone, Serialize)]
pub struct RedisPassThroughRow {
    /// `GET, one at a time` or `GET, pipelined 100 at a time`.
    pub shape: String,
    /// Commands per second answered straight by Redis (median over the runs).
    pub direct_cps: f64,
    /// The same through a plain relay (bytes copied, nothing decoded).
    pub plain_cps: f64,
    /// The same through the interposer (no run active).
    pub through_cps: f64,
    /// Median of the per-run ratios through / direct.
    pub ratio: f64,
    /// Median of the per-run ratios through / plain relay.
    pub ratio_to_plain: f64,
}

/// `GET`s written at once in the pipelined Redis row.
pub const PIPELINE: usize = 100;

/// Both kinds of rows.
#[derive(Debug, Clone, Serialize)]
pub struct InterposerBench {
    /// Pass-through throughput, one row per client count.
    pub pass_through: Vec<PassThroughRow>,
    /// Redis pass-through, one row per shape of traffic; empty when Redis was not measured.
    pub redis: Vec<RedisPassThroughRow>,
    /// Why the Redis rows are missing (Redis unreachable), if they are.
    pub redis_not_run: Option<String>,
    /// Exploration cost.
    pub explore: Vec<ExploreRow>,
    /// The starter set against two `serve` instances through the interposer, one row per
    /// file (`mode`: the file's name).
    pub starter: Vec<ExploreRow>,
    /// PostgreSQL's isolation tester running every permutation of the two-racer savepoint
    /// race's statements, beside the explore rows of the same race.
    pub tester: super::tester::TesterRow,
}

/// Runs the interposer rows against the PostgreSQL server `pg` (loopback only),
/// starting `exe serve` for every side: `clients` client counts, each side for `duration`,
/// `runs` times (medians); then the Redis rows against `redis` (a loopback Redis that does not
/// answer leaves them out, with the reason). `progress` hears a line per measured side.
///
/// Will return `Err` if the server is not on loopback, the scratch database cannot be made,
/// an interposer cannot listen, or a `serve` does not start.
pub fn run(
    pg: &PgServer,
    redis: SocketAddr,
    exe: &Path,
    clients: &[usize],
    duration: Duration,
    runs: usize,
    mut progress: impl FnMut(&str),
) -> Result<InterposerBench, BenchError> {
    require_loopback(pg)?;
    let db = ScratchDb::postgres(pg, "bench-interpose")
        .map_err(scratch_err("create the scratch database"))?;
    let direct_url = db
        .url()
        .map_err(scratch_err("the scratch database's URL"))?;
    let upstream = upstream_of(&direct_url).map_err(|e| BenchError::Pgbench(e.to_string()))?;
    let interposer =
        Interposer::start(StoreKind::Postgres, upstream, Limits::default()).map_err(|source| {
            BenchError::Io {
                context: "start the interposer".into(),
                source,
            }
        })?;
    let through_url = url_through(&direct_url, interposer.addr())
        .ok_or_else(|| BenchError::Pgbench("the scratch database URL has no scheme".into()))?;
    let plain = PlainRelay::start(upstream).map_err(|source| BenchError::Io {
        context: "start the plain relay".into(),
        source,
    })?;
    let plain_url = url_through(&direct_url, plain.addr)
        .ok_or_else(|| BenchError::Pgbench("the scratch database URL has no scheme".into()))?;
    let exe = exe.to_string_lossy().into_owned();
    let max_clients = clients.iter().copied().max().unwrap_or(1) as u32;
    let direct = start_serve(&exe, &direct_url, max_clients)?;
    let plain_serve = start_serve(&exe, &plain_url, max_clients)?;
    let through = start_serve(&exe, &through_url, max_clients)?;
    let mut pass_through = Vec::new();
    for &n in clients {
        let mut errors = 0;
        let sides = |side: Side| match side {
            Side::Direct => &direct,
            Side::Plain => &plain_serve,
            Side::Through => &through,
        };
        let Ok(f) = back_to_back::<std::convert::Infallible>(runs, |run, side| {
            let (rps, errs) = load(&sides(side).records[0].base_url, n, duration, run);
            errors += errs;
            progress(&format!(
                "run {} interposer pass-through x{n}: {side} {rps:.1} req/s",
                run + 1
            ));
            Ok(rps)
        });
        pass_through.push(PassThroughRow {
            clients: n,
            direct_rps: f.direct,
            plain_rps: f.plain,
            through_rps: f.through,
            ratio: f.ratio,
            ratio_to_plain: f.ratio_to_plain,
            errors,
        });
    }
    drop((direct, plain_serve, through, interposer, plain));
    let (redis, redis_not_run) = match redis_pass_through(redis, duration, runs, &mut progress) {
        Ok(rows) => (rows, None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    let mut explore = Vec::new();
    for (protocol, mode, lanes) in [
        (Protocol::SingleStatement, ExploreMode::Exhaustive, 1),
        (Protocol::SingleStatement, ExploreMode::Reduced, 1),
        (Protocol::Savepoint, ExploreMode::Bounded, 1),
        (Protocol::Savepoint, ExploreMode::Bounded, EXPLORE_LANES),
        (Protocol::Savepoint, ExploreMode::Reduced, 1),
    ] {
        let row = explore_row(pg, &exe, protocol, mode, lanes);
        progress(&format!(
            "interposer explore {protocol} {}: {} schedules in {:.1} s: {}",
            row.mode, row.schedules, row.seconds, row.verdict
        ));
        explore.push(row);
    }
    let starter = starter_rows(pg, &exe, &mut progress);
    let tester = super::tester::tester_row(pg, &exe, EXPLORE_FILE);
    progress(&format!(
        "isolation tester, {}: {} permutation(s) of {} steps in {:.1} s{}",
        tester.race,
        tester.permutations,
        tester.steps,
        tester.seconds,
        tester
            .not_run
            .as_deref()
            .map_or(String::new(), |w| format!(" ({w})"))
    ));
    Ok(InterposerBench {
        pass_through,
        redis,
        redis_not_run,
        explore,
        starter,
        tester,
    })
}

/// The Redis pass-through rows ([`RedisPassThroughRow`]) against the Redis at `redis`
/// (loopback only): one client, each shape direct and through an interposer for `duration`,
/// `runs` times, the order swapped every other run.
///
/// Will return `Err` if `redis` is not on loopback, does not answer `GET`, or the interposer
/// cannot listen.
pub fn redis_pass_through(
    redis: SocketAddr,
    duration: Duration,
    runs: usize,
    progress: &mut impl FnMut(&str),
) -> Result<Vec<RedisPassThroughRow>, BenchError> {
    if !redis.ip().is_loopback() {
        return Err(BenchError::NotLoopback(redis.to_string()));
    }
    let io = |context: &str| {
        let context = context.to_string();
        move |source| BenchError::Io { context, source }
    };
    gets(redis, 1, Duration::ZERO).map_err(io(&format!("Redis at {redis}")))?;
    let interposer = Interposer::start(StoreKind::Redis, redis, Limits::default())
        .map_err(io("start the Redis interposer"))?;
    let plain = PlainRelay::start(redis).map_err(io("start the plain relay"))?;
    let mut rows = Vec::new();
    for (shape, batch) in [
        ("GET, one at a time".to_string(), 1),
        (format!("GET, pipelined {PIPELINE} at a time"), PIPELINE),
    ] {
        let f = back_to_back(runs, |run, side| {
            let addr = match side {
                Side::Direct => redis,
                Side::Plain => plain.addr,
                Side::Through => interposer.addr(),
            };
            let cps = gets(addr, batch, duration).map_err(io(&format!("Redis {side}, {shape}")))?;
            progress(&format!(
                "run {} interposer Redis pass-through, {shape}: {side} {cps:.0} commands/s",
                run + 1
            ));
            Ok(cps)
        })?;
        rows.push(RedisPassThroughRow {
            shape,
            direct_cps: f.direct,
            plain_cps: f.plain,
            through_cps: f.through,
            ratio: f.ratio,
            ratio_to_plain: f.ratio_to_plain,
        });
    }
    Ok(rows)
}

/// A side of a pass-through figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    /// Straight to the server.
    Direct,
    /// Through a [`PlainRelay`].
    Plain,
    /// Through the interposer, outside any run.
    Through,
}

impl std::fmt::Display for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Side::Direct => "direct",
            Side::Plain => "plain relay",
            Side::Through => "through",
        })
    }
}

/// The medians of a pass-through figure over its runs.
struct Figures {
    direct: f64,
    plain: f64,
    through: f64,
    /// Of the per-run ratios through / direct.
    ratio: f64,
    /// Of the per-run ratios through / plain relay.
    ratio_to_plain: f64,
}

/// A pass-through figure measured `runs` times (at least once), each run every [`Side`] back
/// to back, the order turned by one every run: the medians of each side's figures and of the
/// per-run ratios. `measure(run, side)` gives one figure.
///
/// Will return `Err` as soon as `measure` does.
fn back_to_back<E>(
    runs: usize,
    mut measure: impl FnMut(usize, Side) -> Result<f64, E>,
) -> Result<Figures, E> {
    let mut got: [Vec<f64>; 3] = Default::default();
    let (mut ratios, mut to_plain) = (vec![], vec![]);
    for run in 0..runs.max(1) {
        let mut sides = [Side::Direct, Side::Plain, Side::Through];
        sides.rotate_left(run % 3);
        let mut figure = [0.0f64; 3];
        for side in sides {
            figure[side as usize] = measure(run, side)?;
        }
        for (all, f) in got.iter_mut().zip(figure) {
            all.push(f);
        }
        ratios.push(figure[2] / figure[0]);
        to_plain.push(figure[2] / figure[1]);
    }
    let [direct, plain, through] = got;
    Ok(Figures {
        direct: median(direct),
        plain: median(plain),
        through: median(through),
        ratio: median(ratios),
        ratio_to_plain: median(to_plain),
    })
}

/// A plain TCP relay to `upstream` on a loopback port: per connection, a thread per
/// direction copying bytes as they come (no decoding, Nagle off), the baseline a relay's hop
/// costs. Stops accepting when dropped; its connections end with their peers.
struct PlainRelay {
    addr: SocketAddr,
    stop: std::sync::Arc<AtomicBool>,
}

impl PlainRelay {
    /// Listens on `127.0.0.1:0`.
    ///
    /// Will return `Err` if it cannot listen.
    fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stopped.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(client) = conn else { continue };
                let Ok(server) = std::net::TcpStream::connect(upstream) else {
                    continue;
                };
                let _ = (client.set_nodelay(true), server.set_nodelay(true));
                let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
                    continue;
                };
                let copy = |mut from: std::net::TcpStream, mut to: std::net::TcpStream| {
                    move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Write);
                    }
                };
                std::thread::spawn(copy(client, server));
                std::thread::spawn(copy(s2, c2));
            }
        });
        Ok(PlainRelay { addr, stop })
    }
}

impl Drop for PlainRelay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accept loop so it sees the flag.
        let _ = std::net::TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
    }
}

/// The key the Redis rows read: never written, so every `GET` is answered nil (`$-1`).
const ABSENT_KEY: &str = "tfv-bench-interposer-absent";

/// One client sending `batch` `GET`s of [`ABSENT_KEY`] at a time to `addr` and reading their
/// nil replies, for `duration` (at least one batch): commands per second.
///
/// Will return `Err` if the connection fails or a reply is not nil.
fn gets(addr: SocketAddr, batch: usize, duration: Duration) -> std::io::Result<f64> {
    use std::io::{Read as _, Write as _};
    const NIL: &[u8] = b"$-1\r\n";
    let get = format!(
        "*2\r\n$3\r\nGET\r\n${}\r\n{ABSENT_KEY}\r\n",
        ABSENT_KEY.len()
    );
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let commands = get.as_bytes().repeat(batch);
    let mut replies = vec![0u8; NIL.len() * batch];
    let started = Instant::now();
    let mut sent = 0usize;
    loop {
        stream.write_all(&commands)?;
        stream.read_exact(&mut replies)?;
        if replies.chunks(NIL.len()).any(|r| r != NIL) {
            return Err(std::io::Error::other(format!(
                "a GET of an absent key was not answered nil: {:?}",
                String::from_utf8_lossy(&replies[..replies.len().min(64)])
            )));
        }
        sent += batch;
        // The clock is the measurement's own deadline, not a synchronisation.
        if started.elapsed() >= duration {
            break;
        }
    }
    Ok(sent as f64 / started.elapsed().as_secs_f64())
}

fn start_serve(exe: &str, database_url: &str, pool: u32) -> Result<Services, BenchError> {
    let pool = pool.max(2) as usize;
    let spec = ServiceSpec {
        name: "serve".into(),
        command: crate::argv::ServeArgs::new()
            .pool_size(pool)
            .min_idle(pool)
            .into_vec(),
        ready_path: "/healthz".into(),
        ready_timeout_ms: 20_000,
        env: Default::default(),
    };
    Services::start(std::slice::from_ref(&spec), exe, database_url, None).map_err(|e| {
        BenchError::Io {
            context: "start serve".into(),
            source: std::io::Error::other(e.to_string()),
        }
    })
}

/// `clients` keep-alive HTTP clients creating tickets under fresh keys at `base_url` for
/// `duration`: (201s per second, other answers).
fn load(base_url: &str, clients: usize, duration: Duration, run: usize) -> (f64, u64) {
    let ok = AtomicU64::new(0);
    let bad = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let url = format!("{base_url}/v1/tickets");
    let tenant = format!("bench-{}-{run}", uuid::Uuid::new_v4().simple());
    let body = r#"{"actor_id":"u1","title":"Printer jammed","body":"Floor 3 printer shows E-42","priority":"high"}"#;
    let started = Instant::now();
    std::thread::scope(|sc| {
        for c in 0..clients {
            let (ok, bad, stop, url, tenant) = (&ok, &bad, &stop, &url, &tenant);
            sc.spawn(move || {
                let agent = ureq::AgentBuilder::new()
                    .timeout(Duration::from_secs(10))
                    .build();
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let r = agent
                        .post(url)
                        .set("Idempotency-Key", &format!("k-{c}-{i}"))
                        .set("X-Tenant-Id", tenant)
                        .set("Content-Type", "application/json")
                        .send_string(body);
                    match r {
                        Ok(resp) if resp.status() == 201 => ok.fetch_add(1, Ordering::Relaxed),
                        _ => bad.fetch_add(1, Ordering::Relaxed),
                    };
                }
            });
        }
        // The clock is the measurement's own deadline, not a synchronisation.
        std::thread::sleep(duration);
        stop.store(true, Ordering::Relaxed);
    });
    let secs = started.elapsed().as_secs_f64();
    (
        ok.load(Ordering::Relaxed) as f64 / secs,
        bad.load(Ordering::Relaxed),
    )
}

/// The kill matrix's two-racer file (`scenarios/interposed/two-racers-same-key.toml`: one key
/// and body, one `serve`, every effect counted), built into the binary so `bench` runs from
/// any folder; its serve command gets `--protocol P` as the kill matrix gives it.
const EXPLORE_FILE: &str =
    include_str!("../../../../scenarios/interposed/two-racers-same-key.toml");

/// Limit on the schedules of an explore row: above both rows' counts, so each search runs to
/// its end.
const EXPLORE_LIMIT: usize = 5000;

/// The check file the starter rows are written from (two `serve` instances, two scopes).
const STARTER_CHECK_FILE: &str = include_str!("../../../../scenarios/check/serve.toml");

/// The starter set `target init --interposer` writes for [`STARTER_CHECK_FILE`]'s target
/// (four clients in the same-body race), each file run as `scenario run` would (`auto`: the
/// reduced search, on as many lanes as cores), to its end: one row per file.
fn starter_rows(pg: &PgServer, exe: &str, progress: &mut impl FnMut(&str)) -> Vec<ExploreRow> {
    let row = |mode: String| ExploreRow {
        protocol: "savepoint",
        mode,
        schedules: 0,
        seconds: 0.0,
        per_second: 0.0,
        verdict: "PENDING".into(),
        coverage: String::new(),
    };
    let files = crate::check::file::CheckFile::parse(
        Path::new("scenarios/check/serve.toml"),
        STARTER_CHECK_FILE,
        &|_| None,
    )
    .map_err(|e| e.to_string())
    .and_then(|f| crate::killmatrix::interposed_starter_scenarios(&f));
    let files = match files {
        Ok(f) => f,
        Err(why) => {
            return vec![ExploreRow {
                coverage: why,
                ..row("starter set".into())
            }]
        }
    };
    // As `scenario run` runs them: on as many lanes as cores.
    let lanes = std::thread::available_parallelism().map_or(1, |n| n.get());
    let opts = crate::blackbox::RunOptions {
        exe: Some(exe.into()),
        parallel: lanes,
        ..crate::blackbox::RunOptions::new(pg.clone())
    };
    let mut out = Vec::new();
    for mut scenario in files {
        if let Some(spec) = scenario.schedule.as_mut() {
            spec.limit = EXPLORE_LIMIT;
        }
        let started = Instant::now();
        let r = match crate::blackbox::run_repeated(&scenario, &opts) {
            Err(e) => ExploreRow {
                coverage: e.to_string(),
                ..row(scenario.name.clone())
            },
            Ok(o) => {
                let seconds = started.elapsed().as_secs_f64();
                ExploreRow {
                    schedules: o.runs.len(),
                    seconds,
                    per_second: o.runs.len() as f64 / seconds.max(1e-9),
                    verdict: o.verdict.to_string(),
                    coverage: o.coverage.clone().unwrap_or_default(),
                    ..row(scenario.name.clone())
                }
            }
        };
        progress(&format!(
            "interposer starter {}: {} schedules in {:.1} s: {}",
            r.mode, r.schedules, r.seconds, r.verdict
        ));
        out.push(r);
    }
    out
}

/// Lanes of the explore row run side by side (`--parallel`), beside the same search on one.
const EXPLORE_LANES: usize = 2;

/// The explore row of `protocol` under `mode`, its schedules on `lanes` lanes.
fn explore_row(
    pg: &PgServer,
    exe: &str,
    protocol: Protocol,
    mode: ExploreMode,
    lanes: usize,
) -> ExploreRow {
    let mut label = match mode {
        ExploreMode::Bounded => "bounded (b = 2)".to_string(),
        other => other.name().to_string(),
    };
    if lanes > 1 {
        label.push_str(&format!(", {lanes} lanes side by side"));
    }
    let failed = |why: String| ExploreRow {
        protocol: protocol.name(),
        mode: label.clone(),
        schedules: 0,
        seconds: 0.0,
        per_second: 0.0,
        verdict: "PENDING".into(),
        coverage: why,
    };
    let parsed = crate::blackbox::TargetScenario::parse(
        Path::new("scenarios/interposed/two-racers-same-key.toml"),
        EXPLORE_FILE,
        &|_| None,
    );
    let mut scenario = match parsed {
        Ok(s) => crate::killmatrix::with_serve_args(
            &s,
            &crate::argv::implementation_args(Implementation::Protocol(protocol)),
        ),
        Err(e) => return failed(e.to_string()),
    };
    if let Some(spec) = scenario.schedule.as_mut() {
        spec.mode = mode;
        spec.preemptions = 2;
        spec.limit = EXPLORE_LIMIT;
    }
    let opts = crate::blackbox::RunOptions {
        exe: Some(exe.into()),
        parallel: lanes,
        ..crate::blackbox::RunOptions::new(pg.clone())
    };
    let started = Instant::now();
    let outcome = match crate::blackbox::run_repeated(&scenario, &opts) {
        Ok(o) => o,
        Err(e) => return failed(e.to_string()),
    };
    // Set-up included (scratch database, services started once): what a user waits for.
    let seconds = started.elapsed().as_secs_f64();
    let schedules = outcome.runs.len();
    ExploreRow {
        protocol: protocol.name(),
        mode: label,
        schedules,
        seconds,
        per_second: if seconds > 0.0 {
            schedules as f64 / seconds
        } else {
            0.0
        },
        verdict: outcome.verdict.to_string(),
        coverage: outcome
            .coverage
            .clone()
            .or(outcome.reason.clone())
            .unwrap_or_default(),
    }
}

/// The rows as two Markdown tables.
pub fn markdown(b: &InterposerBench) -> String {
    let mut s = String::from(
        "| interposer pass-through | clients | direct req/s | plain relay req/s | through req/s | ratio | ratio to plain relay | errors |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in &b.pass_through {
        s.push_str(&format!(
            "| serve, fresh keys | {} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} | {} |\n",
            r.clients,
            r.direct_rps,
            r.plain_rps,
            r.through_rps,
            r.ratio,
            r.ratio_to_plain,
            r.errors
        ));
    }
    s.push_str(
        "\n| interposer Redis pass-through (1 client) | direct commands/s | plain relay commands/s | through commands/s | ratio | ratio to plain relay |\n\
         |---|---:|---:|---:|---:|---:|\n",
    );
    for r in &b.redis {
        s.push_str(&format!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} |\n",
            r.shape, r.direct_cps, r.plain_cps, r.through_cps, r.ratio, r.ratio_to_plain
        ));
    }
    if let Some(why) = &b.redis_not_run {
        s.push_str(&format!(
            "| not run: {} | | | | | |\n",
            why.replace('|', "/")
        ));
    }
    s.push_str(
        "\n| interposer explore | mode | schedules | seconds | schedules/s | verdict |\n\
         |---|---|---:|---:|---:|---|\n",
    );
    for r in &b.explore {
        s.push_str(&format!(
            "| two racers, {} | {} | {} | {:.1} | {:.1} | {} |\n",
            r.protocol, r.mode, r.schedules, r.seconds, r.per_second, r.verdict
        ));
    }
    for r in &b.starter {
        s.push_str(&format!(
            "| starter file {}, two serves | {} | {} | {:.1} | {:.1} | {} |\n",
            r.mode, "auto, lanes from the cores", r.schedules, r.seconds, r.per_second, r.verdict
        ));
    }
    let t = &b.tester;
    s.push_str(
        "\n| isolation tester, every permutation | steps | permutations | seconds | permutations/s |\n\
         |---|---:|---:|---:|---:|\n",
    );
    match &t.not_run {
        None => s.push_str(&format!(
            "| {} | {} | {} | {:.1} | {:.1} |\n",
            t.race, t.steps, t.permutations, t.seconds, t.per_second
        )),
        Some(why) => s.push_str(&format!(
            "| {}: not run ({}) | {} | {} | | |\n",
            t.race,
            why.replace('|', "/"),
            t.steps,
            t.permutations
        )),
    }
    for r in &b.explore {
        s.push_str(&format!("\n{} {}: {}\n", r.protocol, r.mode, r.coverage));
    }
    for r in &b.starter {
        s.push_str(&format!("\nstarter {}: {}\n", r.mode, r.coverage));
    }
    s
}
