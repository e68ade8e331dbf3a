use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use crate::support::{counts, TestDb};

pub const B0: &str = r#"{"actor_id":"u1","title":"x","body":"y","priority":"high"}"#;

/// A `ticketflow serve` child process, killed when dropped.
pub struct Served {
    pub child: Child,
    pub base: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `ticketflow serve` on a free loopback port; returns once it printed its address
/// (it prints only after the pool is open and the socket listens).
pub fn serve(database_url: &str, extra: &[&str]) -> Served {
    serve_with(database_url, extra, &[], Stdio::inherit())
}

/// As [`serve`], with environment variables and a choice of stderr.
pub fn serve_with(
    database_url: &str,
    extra: &[&str],
    envs: &[(&str, &str)],
    stderr: Stdio,
) -> Served {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ticketflow"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            database_url,
        ])
        .args(extra)
        .env_remove("DATABASE_URL")
        .env_remove("TICKETFLOW_AUTH_TOKENS")
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let base = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("serve printed {line:?}"))
        .to_string();
    Served { child, base }
}

/// Status, headers of interest and body of one request (4xx/5xx included).
pub struct Reply {
    pub status: u16,
    pub content_type: String,
    pub location: Option<String>,
    pub replayed: Option<String>,
    pub retry_after: Option<String>,
    pub json: serde_json::Value,
}

pub fn call(method: &str, url: &str, headers: &[(&str, &str)], body: Option<&str>) -> Reply {
    let mut req = ureq::request(method, url);
    for (k, v) in headers {
        req = req.set(k, v);
    }
    let result = match body {
        Some(b) => req.set("Content-Type", "application/json").send_string(b),
        None => req.call(),
    };
    let resp = match result {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{method} {url}: {e}"),
    };
    Reply {
        status: resp.status(),
        content_type: resp.content_type().to_string(),
        location: resp.header("Location").map(str::to_string),
        replayed: resp.header("Idempotent-Replayed").map(str::to_string),
        retry_after: resp.header("Retry-After").map(str::to_string),
        json: resp
            .into_string()
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(serde_json::Value::Null),
    }
}

fn post(base: &str, tenant: Option<&str>, key: Option<&str>, body: &str) -> Reply {
    let mut h = Vec::new();
    if let Some(t) = tenant {
        h.push(("X-Tenant-Id", t));
    }
    if let Some(k) = key {
        h.push(("Idempotency-Key", k));
    }
    call("POST", &format!("{base}/v1/tickets"), &h, Some(body))
}

/// POSTs with exactly the given header lines (repeats kept, which an HTTP client library
/// would merge) and returns the status code.
fn raw_post_status(base: &str, headers: &[&str], body: &str) -> u16 {
    use std::io::{Read as _, Write as _};
    let addr = base.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    let mut req = format!("POST /v1/tickets HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for h in headers {
        req.push_str(h);
        req.push_str("\r\n");
    }
    // A Content-Type among `headers` (or an explicit absence, "Content-Type:" alone) wins.
    if !headers
        .iter()
        .any(|h| h.to_ascii_lowercase().starts_with("content-type:"))
    {
        req.push_str("Content-Type: application/json\r\n");
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(req.as_bytes()).unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    reply
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {reply:?}"))
}

fn assert_problem(r: &Reply, status: u16) {
    assert_eq!(r.status, status, "{}", r.json);
    assert_eq!(r.content_type, "application/problem+json");
    assert_eq!(r.json["status"], status);
    assert!(
        r.json["type"].is_string() && r.json["title"].is_string() && r.json["detail"].is_string()
    );
}

#[test]
fn create_replays_and_conflicts_over_http_with_problem_details() {
    let Some(db) = TestDb::postgres("serve_http") else {
        return;
    };
    let s = serve(&db.url().unwrap(), &[]);
    let created = post(&s.base, Some("A"), Some("key-1"), B0);
    assert_eq!(created.status, 201);
    assert_eq!(created.content_type, "application/json");
    assert_eq!(created.replayed, None);
    let id = created.json["id"].as_str().unwrap().to_string();
    assert_eq!(
        created.location.as_deref(),
        Some(format!("/v1/tickets/{id}").as_str())
    );
    assert_eq!(created.json["version"], 1);

    // The same body with its keys in another order is the same intent.
    let reordered = r#"{"priority":"high","body":"y","title":"x","actor_id":"u1"}"#;
    let replay = post(&s.base, Some("A"), Some("key-1"), reordered);
    assert_eq!(replay.status, 201);
    assert_eq!(replay.replayed.as_deref(), Some("true"));
    assert_eq!(replay.json["id"], id.as_str());

    let conflict = post(
        &s.base,
        Some("A"),
        Some("key-1"),
        &B0.replace("\"y\"", "\"z\""),
    );
    assert_problem(&conflict, 409);
    assert_eq!(conflict.json["idempotency_key"], "key-1");
    // The caller's own fingerprint, never the stored one (a digest of another request).
    assert_eq!(
        conflict.json["request_hash"].as_str().map(str::len),
        Some(64)
    );
    assert!(
        conflict.json.get("stored_hash").is_none(),
        "{}",
        conflict.json
    );

    // Another tenant with the same key: its own ticket.
    let other = post(&s.base, Some("B"), Some("key-1"), B0);
    assert_eq!((other.status, other.replayed.as_deref()), (201, None));
    assert_ne!(other.json["id"], id.as_str());

    // Requests that cannot be read: 400; read but invalid: 422. Nothing written by either.
    assert_problem(&post(&s.base, Some("A"), None, B0), 400);
    assert_problem(&post(&s.base, Some("A"), Some(""), B0), 400);
    assert_problem(&post(&s.base, None, Some("key-2"), B0), 400);
    assert_problem(&post(&s.base, Some("A"), Some("key-2"), "{not json"), 400);
    assert_problem(&post(&s.base, Some("A"), Some("key-2"), "[1]"), 400);
    assert_problem(
        &post(
            &s.base,
            Some("A"),
            Some("key-2"),
            &B0.replace("}", r#","extra":"x"}"#),
        ),
        400,
    );
    assert_problem(
        &post(
            &s.base,
            Some("A"),
            Some("key-2"),
            &B0.replace("high", "HIGH"),
        ),
        422,
    );
    assert_problem(&post(&s.base, Some("A"), Some(&"k".repeat(256)), B0), 422);
    // Two tenants or two keys in one request are ambiguous: 400, not "the first one".
    for (h1, h2) in [
        ("X-Tenant-Id: A", "X-Tenant-Id: B"),
        ("Idempotency-Key: key-2", "Idempotency-Key: key-3"),
    ] {
        let other = if h1.starts_with("X-") {
            "Idempotency-Key: key-2"
        } else {
            "X-Tenant-Id: A"
        };
        let status = raw_post_status(&s.base, &[h1, h2, other], B0);
        assert_eq!(status, 400, "{h1} + {h2}");
    }
    assert_eq!(db.counts("A"), counts(1, 1, 1));
    assert_eq!(db.counts("B"), counts(1, 1, 1));
    // The key that only met bad requests is not poisoned.
    assert_eq!(post(&s.base, Some("A"), Some("key-2"), B0).status, 201);
}

#[test]
fn get_and_patch_are_scoped_by_tenant() {
    let Some(db) = TestDb::postgres("serve_tenancy") else {
        return;
    };
    let s = serve(&db.url().unwrap(), &[]);
    let id = post(&s.base, Some("A"), Some("key-1"), B0).json["id"]
        .as_str()
        .unwrap()
        .to_string();
    let url = format!("{}/v1/tickets/{id}", s.base);
    let got = call("GET", &url, &[("X-Tenant-Id", "A")], None);
    assert_eq!(
        (got.status, got.json["id"].as_str()),
        (200, Some(id.as_str()))
    );
    assert_problem(&call("GET", &url, &[("X-Tenant-Id", "B")], None), 404);
    assert_problem(&call("GET", &url, &[], None), 400);
    assert_problem(
        &call(
            "GET",
            &format!("{}/v1/tickets/not-a-uuid", s.base),
            &[("X-Tenant-Id", "A")],
            None,
        ),
        400,
    );
    let patch = r#"{"priority":"urgent"}"#;
    assert_problem(
        &call("PATCH", &url, &[("X-Tenant-Id", "B")], Some(patch)),
        404,
    );
    let patched = call("PATCH", &url, &[("X-Tenant-Id", "A")], Some(patch));
    assert_eq!(patched.status, 200);
    assert_eq!(
        (
            patched.json["version"].as_i64(),
            patched.json["priority"].as_str()
        ),
        (Some(2), Some("urgent"))
    );
    assert_problem(
        &call("PATCH", &url, &[("X-Tenant-Id", "A")], Some("{}")),
        422,
    );
    // B's failed PATCH changed nothing: version 2, one ticket.updated event.
    assert_eq!(
        db.scalar("SELECT count(*) FROM outbox_events WHERE event_type = 'ticket.updated'"),
        1
    );
    // A replay shows the ticket as it is now.
    let replay = post(&s.base, Some("A"), Some("key-1"), B0);
    assert_eq!(
        (replay.status, replay.json["version"].as_i64()),
        (201, Some(2))
    );
}

#[test]
fn serves_a_sqlite_file_too() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("serve.db").display());
    let s = serve(&url, &[]);
    let a = post(&s.base, Some("A"), Some("key-1"), B0);
    let b = post(&s.base, Some("A"), Some("key-1"), B0);
    assert_eq!(
        (a.status, b.status, b.replayed.as_deref()),
        (201, 201, Some("true"))
    );
    assert_eq!(a.json["id"], b.json["id"]);
    assert_problem(
        &post(
            &s.base,
            Some("A"),
            Some("key-1"),
            &B0.replace("\"y\"", "\"q\""),
        ),
        409,
    );
}

#[test]
fn a_served_variant_answers_in_the_same_shape() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("variant.db").display());
    let s = serve(&url, &["--variant", "key-only"]);
    let a = post(&s.base, Some("A"), Some("key-1"), B0);
    // key-only replays a different body: wrong, but shaped exactly like a real replay.
    let b = post(
        &s.base,
        Some("A"),
        Some("key-1"),
        &B0.replace("\"y\"", "\"z\""),
    );
    assert_eq!(
        (a.status, b.status, b.replayed.as_deref()),
        (201, 201, Some("true"))
    );
    assert_eq!(a.json["id"], b.json["id"]);
    assert!(b.location.is_some());
}

#[test]
fn sigterm_stops_the_service_with_exit_code_zero() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("term.db").display());
    let mut s = serve(&url, &[]);
    assert_eq!(post(&s.base, Some("A"), Some("key-1"), B0).status, 201);
    let pid = s.child.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(killed.success());
    let status = s.child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{status:?}");
}

#[test]
fn a_bad_database_url_is_a_usage_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_ticketflow"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            "mysql://x",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_body_not_declared_as_json_is_415_and_writes_nothing() {
    let Some(db) = TestDb::postgres("serve_media_type") else {
        return;
    };
    let s = serve(&db.url().unwrap(), &[]);
    let key = |k: &str| format!("Idempotency-Key: {k}");
    for (content_type, want) in [
        ("Content-Type: text/plain", 415),
        ("Content-Type: application/x-www-form-urlencoded", 415),
        ("Content-Type:", 415),
        ("Content-Type: application/json; charset=utf-8", 201),
        ("Content-Type: application/vnd.tickets+json", 201),
    ] {
        let k = key(&format!("media-{want}-{}", content_type.len()));
        let got = raw_post_status(&s.base, &["X-Tenant-Id: A", &k, content_type], B0);
        assert_eq!(got, want, "{content_type}");
    }
    // No Content-Type header at all.
    let (head, body) = ("X-Tenant-Id: A", B0);
    let mut stream = std::net::TcpStream::connect(s.base.trim_start_matches("http://")).unwrap();
    {
        use std::io::Write as _;
        write!(
            stream,
            "POST /v1/tickets HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{head}\r\n\
             Idempotency-Key: media-none\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
    }
    let mut reply = String::new();
    std::io::Read::read_to_string(&mut stream, &mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 415"), "{reply}");
    // Nothing was written: the refused keys then create (201, not a replay), and only the two
    // accepted bodies and these two creates exist.
    let created = post(&s.base, Some("A"), Some("media-none"), B0);
    assert_eq!((created.status, created.replayed), (201, None));
    assert_eq!(db.counts("A"), counts(3, 3, 3));
    // PATCH is held to the same rule.
    let id = created.json["id"].as_str().unwrap();
    let req = ureq::request("PATCH", &format!("{}/v1/tickets/{id}", s.base))
        .set("X-Tenant-Id", "A")
        .set("Content-Type", "text/plain");
    let status = match req.send_string(r#"{"priority":"urgent"}"#) {
        Ok(r) => r.status(),
        Err(ureq::Error::Status(code, _)) => code,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(status, 415);
}

#[test]
fn a_body_naming_a_member_twice_is_refused_and_writes_nothing() {
    let Some(db) = TestDb::postgres("serve_duplicate_member") else {
        return;
    };
    let s = serve(&db.url().unwrap(), &[]);
    let twice = r#"{"actor_id":"u1","title":"x","title":"z","body":"y","priority":"high"}"#;
    let refused = post(&s.base, Some("A"), Some("key-1"), twice);
    assert_problem(&refused, 400);
    assert!(
        refused.json["detail"]
            .as_str()
            .unwrap()
            .contains("duplicate member \"title\""),
        "{}",
        refused.json
    );
    assert_eq!(db.counts("A"), counts(0, 0, 0));
}

/// Words of internal steps, SQL and driver messages that a problem detail must not carry.
const INTERNALS: [&str; 8] = [
    "insert",
    "select",
    "receipt",
    "outbox",
    "canceling",
    "postgres",
    "sqlstate",
    "code 5",
];

fn assert_no_internals(r: &Reply) {
    let detail = r.json["detail"].as_str().unwrap().to_ascii_lowercase();
    for word in INTERNALS {
        assert!(
            !detail.contains(word),
            "detail quotes internals ({word}): {detail}"
        );
    }
}

#[test]
fn a_statement_timeout_is_503_with_retry_after_and_the_key_stays_usable() {
    let Some(db) = TestDb::postgres("serve_timeout") else {
        return;
    };
    let name = db.0.pg().unwrap().name().to_string();
    db.execute(&format!(
        "ALTER DATABASE \"{name}\" SET statement_timeout = '300ms'"
    ));
    // One session, opened at start-up: the request meets the lock in the protocol itself.
    let s = serve(&db.url().unwrap(), &["--pool-size", "1", "--min-idle", "1"]);
    let mut holder = db.pg_config().unwrap().connect(postgres::NoTls).unwrap();
    holder
        .batch_execute("BEGIN; LOCK TABLE idempotency_receipts IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    let timed_out = post(&s.base, Some("A"), Some("key-1"), B0);
    assert_problem(&timed_out, 503);
    assert_eq!(
        timed_out.json["type"],
        "tag:ticketflow,2026:problem:temporarily-unavailable"
    );
    assert_eq!(timed_out.json["written"], "nothing");
    assert_eq!(timed_out.retry_after.as_deref(), Some("1"));
    let detail = timed_out.json["detail"].as_str().unwrap();
    assert!(
        detail.contains("retry with the same Idempotency-Key"),
        "{detail}"
    );
    assert_no_internals(&timed_out);
    holder.batch_execute("COMMIT").unwrap();

    // Nothing was written, and the one pooled session is not stuck: the retry creates.
    let retried = post(&s.base, Some("A"), Some("key-1"), B0);
    assert_eq!((retried.status, retried.replayed.as_deref()), (201, None));
    let again = post(&s.base, Some("A"), Some("key-1"), B0);
    assert_eq!(again.replayed.as_deref(), Some("true"));
    assert_eq!(db.counts("A"), counts(1, 1, 1));
}

#[test]
fn a_broken_invariant_is_500_with_an_error_id_and_no_internals() {
    let Some(db) = TestDb::postgres("serve_internal") else {
        return;
    };
    let s = serve(&db.url().unwrap(), &[]);
    assert_eq!(post(&s.base, Some("A"), Some("key-1"), B0).status, 201);
    // A receipt whose ticket is gone (foreign keys bypassed): a replay cannot be answered.
    db.execute("SET session_replication_role = replica; DELETE FROM tickets");
    let broken = post(&s.base, Some("A"), Some("key-1"), B0);
    assert_problem(&broken, 500);
    assert_eq!(
        broken.json["type"],
        "tag:ticketflow,2026:problem:internal-error"
    );
    let id = broken.json["error_id"].as_str().unwrap();
    assert!(uuid::Uuid::parse_str(id).is_ok(), "{id}");
    assert!(broken.json["detail"].as_str().unwrap().contains("error_id"));
    assert_eq!(broken.retry_after, None);
    assert_no_internals(&broken);
}

/// Reads until the server closes the connection; `true` when it did within `within` (the
/// bound is a failure detector, not a synchronisation: a closing server answers at once).
fn closed_by_server(stream: &mut std::net::TcpStream, within: std::time::Duration) -> bool {
    use std::io::Read as _;
    stream.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

fn connect(base: &str) -> std::net::TcpStream {
    std::net::TcpStream::connect(base.trim_start_matches("http://")).unwrap()
}

#[test]
fn slow_heads_and_idle_connections_are_closed_by_their_timeouts() {
    let db = TestDb::sqlite();
    let path = db.sqlite_path().unwrap().display().to_string();
    let s = serve(
        &path,
        &[
            "--header-read-timeout-ms",
            "200",
            "--idle-timeout-ms",
            "300",
        ],
    );
    let within = std::time::Duration::from_secs(10);
    let mut idle = connect(&s.base);
    let mut slow = connect(&s.base);
    use std::io::Write as _;
    slow.write_all(b"POST /v1/tickets HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    assert!(
        closed_by_server(&mut slow, within),
        "a slow head was kept open"
    );
    assert!(
        closed_by_server(&mut idle, within),
        "an idle connection was kept open"
    );
    // A keep-alive connection is idle between requests too.
    let agent = ureq::AgentBuilder::new().build();
    let r = agent
        .post(&format!("{}/v1/tickets", s.base))
        .set("X-Tenant-Id", "A")
        .set("Idempotency-Key", "k")
        .set("Content-Type", "application/json")
        .send_string(B0)
        .unwrap();
    assert_eq!(r.status(), 201);
}

#[test]
fn an_idle_flood_past_the_descriptor_limit_does_not_lock_out_a_prompt_client() {
    let db = TestDb::sqlite();
    let path = db.sqlite_path().unwrap().display().to_string();
    // 160 descriptors: before connection limits, 150 idle sockets exhausted them and the
    // service stopped accepting; now the default limit fits the budget and a newcomer
    // replaces the longest-idle connection.
    let exe = env!("CARGO_BIN_EXE_ticketflow");
    let script =
        format!("ulimit -n 160 && exec '{exe}' serve --listen 127.0.0.1:0 --database-url '{path}'");
    let mut child = Command::new("sh")
        .args(["-c", &script])
        .env_remove("DATABASE_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let s = Served {
        child,
        base: line
            .trim()
            .strip_prefix("listening on ")
            .unwrap()
            .to_string(),
    };
    let flood: Vec<_> = (0..150).map(|_| connect(&s.base)).collect();
    let agent = ureq::AgentBuilder::new()
        .timeout(std::time::Duration::from_secs(10))
        .build();
    let r = agent
        .post(&format!("{}/v1/tickets", s.base))
        .set("X-Tenant-Id", "A")
        .set("Idempotency-Key", "k")
        .set("Content-Type", "application/json")
        .send_string(B0);
    assert_eq!(
        r.map(|r| r.status()).ok(),
        Some(201),
        "the prompt client was locked out"
    );
    drop(flood);
}

/// Waits (bounded) until `n` sessions of the database wait on a lock: the requests are in
/// flight. Polls pg_stat_activity, as the barrier does with pg_locks.
fn wait_for_lock_waiters(admin: &mut postgres::Client, db: &str, n: i64) {
    for _ in 0..1000 {
        let waiting: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock'",
                &[&db],
            )
            .unwrap()
            .get(0);
        if waiting >= n {
            return;
        }
        std::thread::yield_now();
        std::thread::park_timeout(std::time::Duration::from_millis(10));
    }
    panic!("{n} requests never waited on the lock");
}

#[test]
fn a_request_past_its_timeout_is_503_and_a_full_house_of_busy_connections_refuses_more() {
    let Some(db) = TestDb::postgres("serve_limits") else {
        return;
    };
    let name = db.0.pg().unwrap().name().to_string();
    let s = serve(
        &db.url().unwrap(),
        &[
            "--pool-size",
            "2",
            "--min-idle",
            "2",
            "--max-connections",
            "2",
            "--request-timeout-ms",
            "2000",
        ],
    );
    let mut holder = db.pg_config().unwrap().connect(postgres::NoTls).unwrap();
    holder
        .batch_execute("BEGIN; LOCK TABLE idempotency_receipts IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    let racers: Vec<_> = ["k1", "k2"]
        .into_iter()
        .map(|key| {
            let base = s.base.clone();
            std::thread::spawn(move || post(&base, Some("A"), Some(key), B0))
        })
        .collect();
    let mut admin = db.pg_config().unwrap().connect(postgres::NoTls).unwrap();
    wait_for_lock_waiters(&mut admin, &name, 2);
    // Both connections are busy: a third is answered 503 at once, not queued.
    use std::io::{Read as _, Write as _};
    let mut third = connect(&s.base);
    third
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut reply = String::new();
    third.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 503"), "{reply}");
    assert!(
        reply.to_ascii_lowercase().contains("retry-after: 1"),
        "{reply}"
    );
    assert!(reply.contains("too-many-connections"), "{reply}");
    // The held requests pass their timeout: 503, outcome unknown (the work goes on).
    for racer in racers {
        let r = racer.join().unwrap();
        assert_problem(&r, 503);
        assert_eq!(r.json["cause"], "request-timeout");
        assert_eq!(r.json["written"], "unknown");
    }
    holder.batch_execute("COMMIT").unwrap();
    // Retried with the same keys: each key holds one ticket, whatever the first try did.
    for key in ["k1", "k2"] {
        let r = post(&s.base, Some("A"), Some(key), B0);
        assert_eq!(r.status, 201, "{}", r.json);
    }
    assert_eq!(db.counts("A"), counts(2, 2, 2));
}

const TOKEN_A: &str = "tok-A-0123456789abcdefghij";
const TOKEN_B: &str = "tok-B-0123456789abcdefghij";

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

#[test]
fn with_auth_tokens_the_token_decides_the_tenant_and_the_header_is_refused() {
    let db = TestDb::sqlite();
    let path = db.sqlite_path().unwrap().display().to_string();
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("# who is who\n{TOKEN_A} A\n{TOKEN_B} B\n")).unwrap();
    let s = serve(&path, &["--auth-tokens", tokens.to_str().unwrap()]);
    let url = format!("{}/v1/tickets", s.base);
    let key = ("Idempotency-Key", "k1");

    let anonymous = call("POST", &url, &[key, ("X-Tenant-Id", "A")], Some(B0));
    assert_problem(&anonymous, 401);
    assert_eq!(
        anonymous.json["type"],
        "tag:ticketflow,2026:problem:unauthenticated"
    );
    let auth_a = bearer(TOKEN_A);
    let claimed = call(
        "POST",
        &url,
        &[key, ("Authorization", &auth_a), ("X-Tenant-Id", "B")],
        Some(B0),
    );
    assert_problem(&claimed, 400);
    let wrong = bearer("tok-X-0123456789abcdefghij");
    assert_problem(
        &call("POST", &url, &[key, ("Authorization", &wrong)], Some(B0)),
        401,
    );
    assert_eq!(db.counts("A"), counts(0, 0, 0));

    let created = call("POST", &url, &[key, ("Authorization", &auth_a)], Some(B0));
    assert_eq!(created.status, 201, "{}", created.json);
    assert_eq!(created.json["tenant_id"], "A");
    let id = created.json["id"].as_str().unwrap();
    let ticket = format!("{url}/{id}");
    assert_eq!(
        call("GET", &ticket, &[("Authorization", &auth_a)], None).status,
        200
    );
    // B's token sees B's tenant only; the same key there is B's own ticket.
    let auth_b = bearer(TOKEN_B);
    assert_eq!(
        call("GET", &ticket, &[("Authorization", &auth_b)], None).status,
        404
    );
    assert_problem(&call("GET", &ticket, &[], None), 401);
    let b = call("POST", &url, &[key, ("Authorization", &auth_b)], Some(B0));
    assert_eq!((b.status, b.replayed.as_deref()), (201, None));
    assert_eq!(
        (db.counts("A"), db.counts("B")),
        (counts(1, 1, 1), counts(1, 1, 1))
    );
    // The readiness probe stays open.
    assert_eq!(
        call("GET", &format!("{}/healthz", s.base), &[], None).status,
        200
    );
}

#[test]
fn a_bad_or_doubled_token_table_is_a_usage_error() {
    let db = TestDb::sqlite();
    let path = db.sqlite_path().unwrap().display().to_string();
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("{TOKEN_A} A\n")).unwrap();
    let run = |args: &[&str], env: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_ticketflow"));
        c.args(["serve", "--listen", "127.0.0.1:0", "--database-url", &path])
            .args(args)
            .env_remove("TICKETFLOW_AUTH_TOKENS");
        if let Some(v) = env {
            c.env("TICKETFLOW_AUTH_TOKENS", v);
        }
        let out = c.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let both = run(
        &["--auth-tokens", tokens.to_str().unwrap()],
        Some(&format!("{TOKEN_B} B")),
    );
    assert_eq!(both.0, Some(2), "{}", both.1);
    let empty = run(&[], Some(""));
    assert_eq!(
        empty.0,
        Some(2),
        "an empty token variable started the open mode: {}",
        empty.1
    );
    let short = run(&[], Some("short A"));
    assert_eq!(short.0, Some(2), "{}", short.1);
    assert!(
        short.1.contains("TICKETFLOW_AUTH_TOKENS line 1"),
        "{}",
        short.1
    );
    let missing = run(&["--auth-tokens", "/nonexistent/tokens"], None);
    assert_eq!(missing.0, Some(2), "{}", missing.1);
}

#[test]
fn a_crafted_tenant_cannot_forge_a_log_field() {
    let db = TestDb::sqlite();
    let path = db.sqlite_path().unwrap().display().to_string();
    let mut s = serve_with(
        &path,
        &[],
        &[("TICKETFLOW_LOG", "ticketflow=info")],
        Stdio::piped(),
    );
    let forged = "A outcome=conflict path=forged";
    let r = post(&s.base, Some(forged), Some("k1"), B0);
    assert_eq!(r.status, 201);
    let _ = s.child.kill();
    let mut logs = String::new();
    use std::io::Read as _;
    s.child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut logs)
        .unwrap();
    let line = logs
        .lines()
        .find(|l| l.contains("POST /v1/tickets"))
        .unwrap_or_else(|| panic!("no request line in {logs}"));
    assert!(
        line.contains(r#"tenant="A outcome=conflict path=forged""#),
        "{line}"
    );
}

#[test]
fn isolation_flags_are_checked_and_sqlite_refuses_them() {
    let db = TestDb::sqlite();
    let path = db.sqlite_path().unwrap().display().to_string();
    let exe = env!("CARGO_BIN_EXE_ticketflow");
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), B0).unwrap();
    let body = file.path().to_str().unwrap().to_string();
    let code = |args: &[&str]| {
        Command::new(exe)
            .args(args)
            .env_remove("DATABASE_URL")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    for args in [
        vec![
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            &path,
            "--isolation",
            "serializable",
        ],
        vec![
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            &path,
            "--isolation",
            "bogus",
        ],
        vec![
            "create",
            "--database-url",
            &path,
            "--tenant",
            "A",
            "--key",
            "k",
            "--file",
            &body,
            "--isolation",
            "repeatable-read",
        ],
    ] {
        let out = code(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("isolation"), "{args:?}: {stderr}");
    }
    let Some(pg) = TestDb::postgres("serve_isolation") else {
        return;
    };
    // Our own service at each level: the same race outcome (losers retry at RR/SER).
    for level in [
        "read-committed",
        "repeatable-read",
        "serializable",
        "server-default",
    ] {
        let s = serve(&pg.url().unwrap(), &["--isolation", level]);
        let r = post(&s.base, Some(level), Some("k"), B0);
        assert_eq!(r.status, 201, "{level}: {}", r.json);
        let again = post(&s.base, Some(level), Some("k"), B0);
        assert_eq!(again.replayed.as_deref(), Some("true"), "{level}");
    }
}
