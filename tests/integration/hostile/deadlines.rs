//! A silent PostgreSQL, a stalling proxy, a locked barrier table and a count that never returns: each is reported within its bound, naming what was waited for.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use ticketflow_harness::blackbox::{run_repeated, RunOptions, TargetScenario};
use ticketflow_harness::scenario::racer::ADVISORY_KEY;
use ticketflow_harness::scenario::runner::{run_postgres, PgOptions};
use ticketflow_harness::scenario::Scenario;
use ticketflow_harness::verdict::Verdict;

use crate::support::{pg_url, repo_path, TestDb};

/// A PostgreSQL that accepts TCP connections and never answers. Returns its port; the
/// connections are held until the test process ends.
fn silent_postgres() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming() {
            held.extend(conn.ok());
        }
    });
    port
}

/// A proxy to `upstream` that forwards each connection's startup (up to and including the
/// server's first ReadyForQuery), then forwards nothing more in either direction, keeping both
/// TCP connections open: an application-level stall with a live TCP peer.
fn stalling_proxy(upstream: String) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { continue };
            let Ok(server) = TcpStream::connect(&upstream) else {
                continue;
            };
            let stalled = Arc::new(AtomicBool::new(false));
            // Client to server: forwarded until the stall, swallowed after.
            {
                let (mut from, mut to) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let stalled = stalled.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 8192];
                    while let Ok(n) = from.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        if !stalled.load(Ordering::SeqCst) && to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                });
            }
            // Server to client: whole messages until ReadyForQuery ('Z'), then nothing.
            std::thread::spawn(move || {
                let (mut from, mut to) = (server, client);
                loop {
                    let mut head = [0u8; 5];
                    if from.read_exact(&mut head).is_err() {
                        return;
                    }
                    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
                    let mut body = vec![0u8; len.saturating_sub(4)];
                    if from.read_exact(&mut body).is_err() {
                        return;
                    }
                    let _ = to.write_all(&head);
                    let _ = to.write_all(&body);
                    if head[0] == b'Z' {
                        stalled.store(true, Ordering::SeqCst);
                        break;
                    }
                }
                let mut sink = [0u8; 8192];
                while matches!(from.read(&mut sink), Ok(n) if n > 0) {}
                drop(to);
            });
        }
    });
    port
}

/// Runs `f` on a thread; `None` if it did not return within `limit` (the test then fails
/// instead of hanging).
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).ok()
}

/// One run of the CLI: its exit code (`None`: killed at the limit), stdout then stderr, and
/// how long it took.
struct Ran {
    code: Option<i32>,
    out: String,
    took: Duration,
}

/// Runs the CLI in `dir` with `args` (and `DATABASE_URL` when given; few property cases),
/// killed after `limit` (`code` is then `None`).
fn cli(dir: &Path, args: &[&str], database_url: Option<&str>, limit: Duration) -> Ran {
    let mut env = vec![("PROPTEST_CASES", "4")];
    env.extend(database_url.map(|url| ("DATABASE_URL", url)));
    let ran = super::run_for(dir, args, &env, limit);
    Ran {
        code: ran.code,
        out: format!("{}{}", ran.stdout, ran.stderr),
        took: ran.took,
    }
}

/// Every command meets a PostgreSQL that accepts TCP and never answers: each ends within about
/// 10 s with its documented exit code and a message naming the host and port.
#[test]
fn a_silent_postgres_is_reported_by_every_command_within_its_bound() {
    let port = silent_postgres();
    let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    let host = format!("127.0.0.1:{port}");
    let limit = Duration::from_secs(40);
    let dir = tempfile::tempdir().unwrap();
    let scen = dir.path().join("scenarios");
    std::fs::create_dir(&scen).unwrap();
    std::fs::copy(
        repo_path("scenarios/a-same-key-same-body.toml"),
        scen.join("a.toml"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("b.json"),
        r#"{"actor_id":"u1","title":"x","body":"y","priority":"high"}"#,
    )
    .unwrap();
    let a = repo_path("scenarios/a-same-key-same-body.toml");
    let a = a.to_string_lossy().to_string();
    // (command, args, DATABASE_URL, expected exit code)
    let cases: Vec<(&str, Vec<String>, Option<String>, i32)> = vec![
        (
            "verify",
            vec!["verify", "--no-kill-matrix", "--pg-url", &url]
                .into_iter()
                .map(String::from)
                .collect(),
            None,
            3,
        ),
        (
            "scenario run",
            vec![
                "scenario",
                "run",
                &a,
                "--backend",
                "postgres",
                "--pg-url",
                &url,
            ]
            .into_iter()
            .map(String::from)
            .collect(),
            None,
            3,
        ),
        (
            "create",
            vec!["create", "--tenant", "A", "--key", "k1", "--file", "b.json"]
                .into_iter()
                .map(String::from)
                .collect(),
            Some(url.clone()),
            1,
        ),
        (
            "bench",
            vec![
                "bench",
                "--quick",
                "--backend",
                "postgres",
                "--pg-url",
                &url,
            ]
            .into_iter()
            .map(String::from)
            .collect(),
            None,
            1,
        ),
        (
            "soak",
            vec!["soak", "--duration", "5s", "--pg-url", &url]
                .into_iter()
                .map(String::from)
                .collect(),
            None,
            3,
        ),
    ];
    let workdir: PathBuf = dir.path().to_path_buf();
    let handles: Vec<_> = cases
        .into_iter()
        .map(|(name, args, db, code)| {
            let workdir = workdir.clone();
            std::thread::spawn(move || {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                (name, code, cli(&workdir, &args, db.as_deref(), limit))
            })
        })
        .collect();
    // `serve` fails at start: it never serves with a database that does not answer.
    let serve = {
        let workdir = workdir.clone();
        let url = url.clone();
        std::thread::spawn(move || {
            cli(
                &workdir,
                &["serve", "--listen", "127.0.0.1:0"],
                Some(&url),
                limit,
            )
        })
    };
    let mut problems = Vec::new();
    for h in handles {
        let (name, code, ran) = h.join().unwrap();
        if ran.code.is_none() {
            problems.push(format!(
                "{name}: still waiting after {limit:?}:\n{}",
                ran.out
            ));
            continue;
        }
        if ran.code != Some(code) {
            problems.push(format!(
                "{name}: exit {:?}, expected {code}:\n{}",
                ran.code, ran.out
            ));
        }
        if !ran.out.contains(&host) {
            problems.push(format!("{name}: no mention of {host}:\n{}", ran.out));
        }
        if ran.took > Duration::from_secs(25) {
            problems.push(format!("{name}: took {:?}", ran.took));
        }
    }
    let served = serve.join().unwrap();
    match served.code {
        None => problems.push(format!(
            "serve: still waiting after {limit:?}:\n{}",
            served.out
        )),
        Some(0) => problems.push(format!("serve: exit 0:\n{}", served.out)),
        Some(_) if !served.out.contains(&host) => {
            problems.push(format!("serve: no mention of {host}:\n{}", served.out))
        }
        Some(_) => {}
    }
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}

/// A proxy that forwards each session's startup and then nothing: the run ends PENDING with a
/// reason naming the server and what was waited for, within the session's statement timeout
/// (from the URL's `options`) plus the watchdog's 5 s margin.
#[test]
fn a_stall_after_startup_ends_the_run_pending_with_the_reason() {
    let Some(url) = pg_url() else { return };
    let config: postgres::Config = url.parse().unwrap();
    let upstream = match config.get_hosts().first() {
        Some(postgres::config::Host::Tcp(h)) => {
            format!(
                "{h}:{}",
                config.get_ports().first().copied().unwrap_or(5432)
            )
        }
        _ => return,
    };
    let user = config.get_user().unwrap_or("postgres").to_string();
    let port = stalling_proxy(upstream);
    let proxied = format!(
        "postgres://{user}@127.0.0.1:{port}/postgres?options=-c%20statement_timeout%3D1000"
    );
    let scenario = Scenario::load(&repo_path("scenarios/a-same-key-same-body.toml"))
        .unwrap()
        .remove(0);
    let started = Instant::now();
    let run = within(Duration::from_secs(40), move || {
        run_postgres(&scenario, &PgOptions::new(crate::support::server(&proxied)))
    })
    .expect("the stalled run ended");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(20), "took {took:?}");
    assert_ne!(run.verdict, Verdict::Pass, "{:?}", run.reason);
    let reason = run.reason.unwrap_or_default();
    assert!(
        reason.contains(&format!("127.0.0.1:{port}")) && reason.contains("no answer"),
        "{reason}"
    );
}

/// Another session holds the barrier's advisory lock in the scratch database: the controller
/// gives up within the barrier's timeout and the run is PENDING naming the lock.
#[test]
fn a_held_barrier_lock_is_pending_within_the_barrier_timeout() {
    let Some(url) = pg_url() else { return };
    let name = format!("lockheld{}", std::process::id());
    let text = format!(
        "name = \"{name}\"\ndescription = \"d\"\n[barrier]\nlock = \"advisory\"\ntimeout_ms = 1500\n\
         [[racers]]\nname = \"r\"\ncount = 2\ntenant = \"A\"\nkey = \"k\"\n\
         request = {{ actor_id = \"u1\", title = \"x\", body = \"y\", priority = \"high\" }}\n\
         [expect]\ncreated = 1\n"
    );
    let scenario = Scenario::parse(Path::new("held.toml"), &text)
        .unwrap()
        .remove(0);
    // The setup session sleeps a second after migrating: time for the holder below to find
    // the scratch database and take the lock before the controller asks for it.
    let mut opts = PgOptions::new(crate::support::server(&url));
    opts.after_migrate_sql = vec!["SELECT pg_sleep(1)".into()];
    let holder_url = url.clone();
    let prefix = format!("%{name}%");
    let holder = std::thread::spawn(move || {
        let mut admin = postgres::Client::connect(&holder_url, postgres::NoTls).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let found: Option<String> = admin
                .query_opt(
                    "SELECT datname FROM pg_database WHERE datname LIKE $1 LIMIT 1",
                    &[&prefix],
                )
                .unwrap()
                .map(|r| r.get(0));
            if let Some(db) = found {
                let mut c: postgres::Config = holder_url.parse().unwrap();
                c.dbname(&db);
                if let Ok(mut s) = c.connect(postgres::NoTls) {
                    s.execute("SELECT pg_advisory_lock($1)", &[&ADVISORY_KEY])
                        .unwrap();
                    return Some(s);
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    });
    let started = Instant::now();
    let run = within(Duration::from_secs(40), move || {
        run_postgres(&scenario, &opts)
    })
    .expect("the run ended while another session held the barrier lock");
    let took = started.elapsed();
    let held = holder.join().unwrap();
    assert!(
        held.is_some(),
        "the holder never found the scratch database"
    );
    assert_eq!(run.verdict, Verdict::Pending, "{:?}", run.reason);
    let reason = run.reason.unwrap_or_default();
    assert!(
        reason.contains(&format!("advisory lock {ADVISORY_KEY}"))
            && reason.contains("lock_timeout"),
        "{reason}"
    );
    assert!(took < Duration::from_secs(15), "took {took:?}");
    drop(held);
}

const NEVER_COUNTS: &str = r#"
name = "never-counts"
description = "d"
[barrier]
kind = "http"
timeout_ms = 2000
[target]
base_urls = ["BASE"]
database_url = "DB"
preset = "ietf"
[target.request]
path = "/payments"
body = { amount = 100, currency = "EUR" }
[target.count]
slow = "SELECT count(*) FROM pg_sleep(3600)"
[[racers]]
name = "client"
count = 2
key = "k1"
[[expect.counts]]
key = "k1"
slow = 1
"#;

/// A count query that never returns ends, bounded by the count session's statement timeout,
/// as an unread count with the server's reason: the run is not PASS and does not hang.
#[test]
fn a_count_that_never_returns_is_bounded_and_unread() {
    let Some(db) = TestDb::postgres("never_counts") else {
        return;
    };
    let Some(url) = pg_url() else { return };
    let base =
        crate::blackbox::stub(|_| crate::blackbox::response("201 Created", &[], r#"{"id":1}"#));
    let text = NEVER_COUNTS
        .replace("BASE", &base)
        .replace("DB", &db.url().unwrap());
    let scenario = TargetScenario::parse(Path::new("never.toml"), &text, &|_| None).unwrap();
    let opts = RunOptions {
        exe: Some(PathBuf::from(env!("CARGO_BIN_EXE_ticketflow"))),
        repeat: 1,
        ..RunOptions::new(crate::support::server(&url))
    };
    let started = Instant::now();
    let outcome = within(Duration::from_secs(40), move || {
        run_repeated(&scenario, &opts)
    })
    .expect("the run ended although its count never returns")
    .unwrap();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(25), "took {took:?}");
    assert_ne!(outcome.verdict, Verdict::Pass, "{:?}", outcome.reason);
    let run = &outcome.runs[0];
    let unread = run
        .checks
        .iter()
        .find(|c| c.name == "counts read")
        .unwrap_or_else(|| panic!("no counts read check: {:?}", run.checks));
    let text = format!("{unread:?}");
    assert!(text.contains("statement timeout"), "{text}");
}
