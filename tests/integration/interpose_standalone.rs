//! `ticketflow interpose` run as a process in front of a scratch database, with `ticketflow
//! serve` started by the test (as a user starts their own service) and scenarios naming the
//! control address.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ticketflow_harness::blackbox::{RunOptions, TargetScenario};
use ticketflow_harness::interpose::control::{ControlClient, ControlError, Request};
use ticketflow_harness::interpose::token::ControlToken;
use ticketflow_harness::interpose::{url_through, Phase, StoreKind};
use ticketflow_harness::verdict::Verdict;

use crate::support::TestDb;

/// A running `ticketflow interpose`, killed on drop unless it already ended.
struct Interposing {
    child: Child,
    /// The printed `service database_url` (password shown as `***`).
    service_url: String,
    /// The PostgreSQL interposer's listener.
    listen: SocketAddr,
    /// The Redis interposer's listener, when started with `--redis`.
    listen_redis: Option<SocketAddr>,
    /// The printed control address.
    control: SocketAddr,
    /// The printed control token file.
    token_file: Option<std::path::PathBuf>,
}

impl Interposing {
    /// Its control token file, as printed.
    fn token_file(&self) -> &std::path::Path {
        self.token_file
            .as_deref()
            .expect("interpose printed its control token file")
    }

    /// Its control token, read from that file.
    fn token(&self) -> ControlToken {
        ControlToken::read(self.token_file()).unwrap()
    }
}

impl Drop for Interposing {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `ticketflow interpose --postgres upstream ARGS…` and reads what it prints until its
/// `ready:` line.
fn interpose(upstream: &str, args: &[&str]) -> Interposing {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ticketflow"))
        .args(["interpose", "--postgres", upstream])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (mut service_url, mut control, mut redis_url, mut token_file) = (None, None, None, None);
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some(rest) = line.strip_prefix("service database_url: ") {
            service_url = rest.split_whitespace().next().map(str::to_string);
        } else if let Some(rest) = line.strip_prefix("service redis_url: ") {
            redis_url = rest.split_whitespace().next().map(str::to_string);
        } else if let Some(rest) = line.strip_prefix("control: ") {
            control = rest.split_whitespace().next().map(|a| a.parse().unwrap());
        } else if let Some(rest) = line.strip_prefix("control token file: ") {
            token_file = rest.split_whitespace().next().map(std::path::PathBuf::from);
        } else if line.starts_with("ready:") {
            break;
        }
    }
    let service_url = service_url.expect("interpose printed the service's database_url");
    let listen = ticketflow_harness::interpose::upstream_of(&service_url).unwrap();
    Interposing {
        child,
        service_url,
        listen,
        listen_redis: redis_url.map(|u| ticketflow_harness::interpose::upstream_of(&u).unwrap()),
        control: control.expect("interpose printed the control address"),
        token_file,
    }
}

/// `url` with the password `secret` when it has none (the loopback server trusts, so any
/// password connects), to see that the printed URL hides it.
fn with_password(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    match rest.split_once('@') {
        Some((user, host)) if !user.contains(':') => format!("{scheme}://{user}:secret@{host}"),
        Some(_) => url.to_string(),
        None => format!("{scheme}://postgres:secret@{rest}"),
    }
}

/// Two racers, one key, on the running service at `base` whose store goes through the
/// interposer at `control`; counted in the scratch database at `db`.
fn standalone_scenario(base: &str, db: &str, ip: &Interposing, limit: usize) -> TargetScenario {
    standalone_scenario_with(base, db, ip.control, limit, Some(ip.token_file()))
}

/// [`standalone_scenario`] naming the control token file `token_file`, if given.
fn standalone_scenario_with(
    base: &str,
    db: &str,
    control: SocketAddr,
    limit: usize,
    token_file: Option<&std::path::Path>,
) -> TargetScenario {
    let mut text = scenario_text(base, db, control, limit);
    if let Some(t) = token_file {
        text = text.replacen(
            "preset = \"ticketflow\"",
            &format!(
                "preset = \"ticketflow\"\ninterposer_token_file = {:?}",
                t.display().to_string()
            ),
            1,
        );
    }
    TargetScenario::parse(std::path::Path::new("standalone.toml"), &text, &|_| None).unwrap()
}

/// The text of [`standalone_scenario`].
fn scenario_text(base: &str, db: &str, control: SocketAddr, limit: usize) -> String {
    format!(
        r#"
name = "standalone-serve"
description = "two racers, one key, on a running service behind ticketflow interpose"

[barrier]
kind = "interposer"
timeout_ms = 2000

[schedule]
mode = "bounded"
limit = {limit}
preemptions = 1

[target]
base_urls = ["{base}"]
database_url = "{db}"
interposer = "{control}"
preset = "ticketflow"

[target.request]
method = "POST"
path = "/v1/tickets"
body = {{ actor_id = "u1", title = "Printer jammed", body = "Floor 3 printer shows E-42", priority = "high" }}

[[target.scopes]]
name = "A"
value = "A-{{run}}"
headers = {{ "X-Tenant-Id" = "{{scope}}" }}

[target.count]
tickets = "SELECT count(*) FROM tickets WHERE tenant_id = {{scope}}"
receipts = "SELECT count(*) FROM idempotency_receipts WHERE tenant_id = {{scope}}"

[[racers]]
name = "r"
count = 2
scope = "A"
key = "key-1"

[expect]
outcomes = {{ r = ["created", "replayed"] }}

[[expect.counts]]
scope = "A"
tickets = 1
receipts = 1
"#
    )
}

fn run(s: &TargetScenario, pg: &str) -> ticketflow_harness::blackbox::TargetOutcome {
    ticketflow_harness::blackbox::run_repeated(s, &RunOptions::new(crate::support::server(pg)))
        .unwrap()
}

#[test]
fn through_a_running_interposer_the_real_serve_passes_and_split_transactions_fails() {
    let Some(pg) = crate::support::pg_url() else {
        return;
    };
    let db = TestDb::postgres("ip_standalone").unwrap();
    let url = db.url().unwrap();
    let ip = interpose(&url, &[]);
    let pool = ["--pool-size", "2", "--min-idle", "2"];
    let served = crate::serve::serve(&ip.service_url, &pool);
    let o = run(&standalone_scenario(&served.base, &url, &ip, 40), &pg);
    let text = ticketflow_harness::blackbox::summary::summary_text(&o);
    assert_eq!(o.verdict, Verdict::Pass, "{:?}\n{text}", o.reason);
    let coverage = o.coverage.clone().unwrap_or_default();
    assert!(
        o.runs.len() > 1 && coverage.contains("2 racers") && coverage.contains("search complete"),
        "{coverage}"
    );
    // Every run was conducted through the control protocol: both racers held at their first
    // command, then stepped.
    for r in &o.runs {
        let w = &r.evidence.as_ref().unwrap().waves[0];
        let s = w.schedule.as_ref().unwrap();
        assert!(s.steps.len() >= 4, "{s:?}");
        assert_eq!(w.problem, None);
    }
    drop(served);
    // The same interposer, a wrong service: the next controller is accepted and the defect
    // is found.
    let wrong = crate::serve::serve(
        &ip.service_url,
        &[&pool[..], &["--variant", "split-transactions"]].concat(),
    );
    let o = run(&standalone_scenario(&wrong.base, &url, &ip, 60), &pg);
    assert_eq!(
        o.verdict,
        Verdict::Fail,
        "{:?}\n{}",
        o.coverage,
        ticketflow_harness::blackbox::summary::summary_text(&o)
    );
    let reason = o.reason.clone().unwrap_or_default();
    assert!(reason.contains("--schedule"), "{reason}");
}

#[test]
fn traffic_passes_through_with_no_run_and_a_second_controller_is_refused() {
    let Some(db) = TestDb::postgres("ip_standalone_pass") else {
        return;
    };
    let upstream = with_password(&db.url().unwrap());
    let ip = interpose(&upstream, &[]);
    assert!(
        !ip.service_url.contains("secret") && ip.service_url.contains(":***@"),
        "{}",
        ip.service_url
    );
    let through = url_through(&upstream, ip.listen).unwrap();
    let mut c = postgres::Client::connect(&through, postgres::NoTls).unwrap();
    c.batch_execute("CREATE TABLE t (k text PRIMARY KEY)")
        .unwrap();
    c.execute("INSERT INTO t VALUES ($1)", &[&"a"]).unwrap();
    let first = ControlClient::connect(ip.control, &ip.token(), Duration::from_secs(5)).unwrap();
    let pg = first.greeting().store(StoreKind::Postgres).unwrap().clone();
    assert_eq!(pg.listen, ip.listen);
    assert_eq!(pg.opened, 1, "{pg:?}");
    match ControlClient::connect(ip.control, &ip.token(), Duration::from_secs(5)) {
        Err(e @ ControlError::Refused { .. }) => {
            assert!(
                e.to_string().contains("one controlling client at a time"),
                "{e}"
            )
        }
        other => panic!("a second controller was not refused: {:?}", other.err()),
    }
    // A controller connected but no run: still untouched.
    let n: i64 = c.query_one("SELECT count(*) FROM t", &[]).unwrap().get(0);
    assert_eq!(n, 1);
    // In a run the next statement is held until released; then it completes.
    first
        .call(&Request::Begin {
            store: StoreKind::Postgres,
        })
        .unwrap();
    let client = std::sync::Arc::new(first);
    let hub = client.hubs().remove(0);
    let held = std::thread::scope(|sc| {
        let t = sc.spawn(move || c.execute("INSERT INTO t VALUES ($1)", &[&"b"]).map(|_| ()));
        let deadline = Instant::now() + Duration::from_secs(10);
        let id = loop {
            use ticketflow_harness::interpose::conduct::HubControl as _;
            let (v, views) = hub.view();
            if let Some(s) = views.iter().find(|s| s.phase == Phase::Held) {
                break s.id;
            }
            assert!(Instant::now() < deadline, "never held: {views:?}");
            hub.wait_change(v, Instant::now() + Duration::from_millis(200));
        };
        use ticketflow_harness::interpose::conduct::HubControl as _;
        assert!(hub.release(id));
        t.join().unwrap()
    });
    held.unwrap();
    assert_eq!(db.scalar("SELECT count(*) FROM t"), 2);
}

#[test]
fn the_interposer_stops_on_sigterm_and_leaves_no_listener() {
    let Some(db) = TestDb::postgres("ip_standalone_stop") else {
        return;
    };
    let mut ip = interpose(&db.url().unwrap(), &["--redis", "redis://127.0.0.1:6379/9"]);
    let listeners = [ip.listen, ip.listen_redis.unwrap(), ip.control];
    // Listening before the signal: the check below can fail.
    for addr in listeners {
        TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
    }
    let pid = i32::try_from(ip.child.id()).unwrap();
    // SAFETY: kill(2) on our own child's pid with a valid signal number.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = ip.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "still running after SIGTERM");
        std::thread::yield_now();
    };
    assert_eq!(status.code(), Some(0), "{status:?}");
    for addr in listeners {
        assert!(
            TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_err(),
            "{addr} still accepts"
        );
    }
}

#[test]
fn a_non_loopback_listen_address_is_refused_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let out = crate::cli::run_cli_in(
        dir.path(),
        &[
            "interpose",
            "--postgres",
            "postgres://postgres@127.0.0.1:5432/postgres",
            "--listen-postgres",
            "0.0.0.0:0",
        ],
        b"",
    );
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr.contains("--listen-postgres") && out.stderr.contains("loopback only"),
        "{}",
        out.stderr
    );
}

/// `scenario run` on the standalone scenario naming `control` and the control token file
/// `token_file` (`None`: a file with a token of no interposer): exit code and stderr.
fn scenario_run(
    db: &str,
    control: SocketAddr,
    token_file: Option<&std::path::Path>,
) -> crate::cli::Output {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("standalone.toml");
    let stray = dir.path().join("stray.token");
    let token_file = token_file.unwrap_or_else(|| {
        ControlToken::generate().write_new(&stray).unwrap();
        &stray
    });
    let text = scenario_text("http://127.0.0.1:9", db, control, 5).replacen(
        "preset = \"ticketflow\"",
        &format!(
            "preset = \"ticketflow\"\ninterposer_token_file = {:?}",
            token_file.display().to_string()
        ),
        1,
    );
    std::fs::write(&file, text).unwrap();
    crate::cli::run_cli_env(
        dir.path(),
        &["scenario", "run", file.to_str().unwrap()],
        b"",
        Some(db),
    )
}

#[test]
fn a_control_address_where_nothing_listens_or_no_session_is_seen_is_a_setup_error() {
    let Some(db) = TestDb::postgres("ip_standalone_setup") else {
        return;
    };
    let url = db.url().unwrap();
    let nothing: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let out = scenario_run(&url, nothing, None);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("nothing answers at the interposer control address 127.0.0.1:1"),
        "{}",
        out.stderr
    );
    // An interposer nothing ever connected through.
    let idle = interpose(&url, &[]);
    let out = scenario_run(&url, idle.control, Some(idle.token_file()));
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("no session of the service is behind the interposer"),
        "{}",
        out.stderr
    );
    // An interposer in front of another server than database_url names.
    let elsewhere = interpose("postgres://postgres@127.0.0.1:1/postgres", &[]);
    let out = scenario_run(&url, elsewhere.control, Some(elsewhere.token_file()));
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr.contains("relays PostgreSQL to 127.0.0.1:1"),
        "{}",
        out.stderr
    );
}

/// Connects to `control` as a bare socket, sends `first` (one line, when given) and reads the
/// server's first answer line; then whether the server closed the connection after it.
fn first_answer(control: SocketAddr, first: Option<&str>) -> (String, bool) {
    use std::io::{Read, Write};
    let mut s = TcpStream::connect(control).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    if let Some(line) = first {
        s.write_all(format!("{line}\n").as_bytes()).unwrap();
    }
    let mut reader = BufReader::new(s.try_clone().unwrap());
    let mut answer = String::new();
    reader.read_line(&mut answer).unwrap();
    let mut rest = Vec::new();
    let closed = reader.read_to_end(&mut rest).is_ok() && rest.is_empty();
    drop(s);
    (answer, closed)
}

#[test]
fn a_squatter_without_the_token_is_refused_and_the_runner_still_conducts() {
    let Some(pg) = crate::support::pg_url() else {
        return;
    };
    let db = TestDb::postgres("ip_standalone_squat").unwrap();
    let url = db.url().unwrap();
    let ip = interpose(&url, &[]);
    // A local process that connects first and asks, without the token: refused, closed, and
    // shown nothing of the interposer.
    let (answer, closed) = first_answer(ip.control, Some(r#"{"op":"hello"}"#));
    assert!(
        answer.contains(r#""ok":false"#) && answer.contains("token") && !answer.contains("stores"),
        "{answer}"
    );
    assert!(closed, "the squatter's connection stayed open");
    let token_file = ip.token_file().to_path_buf();
    // Another connects and says nothing while the runner conducts: it is not the controller.
    let silent = TcpStream::connect(ip.control).unwrap();
    let served = crate::serve::serve(&ip.service_url, &["--pool-size", "2", "--min-idle", "2"]);
    // A limit above the search's end: a search stopped at its limit is PENDING, not PASS.
    let s = standalone_scenario_with(&served.base, &url, ip.control, 40, Some(&token_file));
    let o = run(&s, &pg);
    let text = ticketflow_harness::blackbox::summary::summary_text(&o);
    assert_eq!(o.verdict, Verdict::Pass, "{:?}\n{text}", o.reason);
    for r in &o.runs {
        let w = &r.evidence.as_ref().unwrap().waves[0];
        assert!(w.schedule.as_ref().unwrap().steps.len() >= 4);
        assert_eq!(w.problem, None);
    }
    drop(silent);
}

#[test]
fn a_wrong_token_is_refused_and_the_token_file_is_the_owners_alone() {
    use std::os::unix::fs::PermissionsExt;
    let Some(db) = TestDb::postgres("ip_standalone_token") else {
        return;
    };
    let ip = interpose(&db.url().unwrap(), &[]);
    let path = ip
        .token_file
        .clone()
        .expect("interpose printed its control token file");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{} has mode {mode:o}", path.display());
    let token = std::fs::read_to_string(&path).unwrap().trim().to_string();
    assert_eq!(token.len(), 64, "{token}");
    let wrong: String = token
        .chars()
        .map(|c| if c == '0' { '1' } else { '0' })
        .collect();
    let (answer, closed) = first_answer(
        ip.control,
        Some(&format!(r#"{{"op":"auth","token":"{wrong}"}}"#)),
    );
    assert!(
        answer.contains(r#""ok":false"#) && answer.contains("token") && !answer.contains(&wrong),
        "{answer}"
    );
    assert!(closed, "a client with a wrong token stayed connected");
    // The right one is greeted.
    let (answer, _) = first_answer(
        ip.control,
        Some(&format!(r#"{{"op":"auth","token":"{token}"}}"#)),
    );
    assert!(
        answer.contains(r#""ok":true"#) && answer.contains("stores"),
        "{answer}"
    );
}
