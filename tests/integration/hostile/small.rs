//! Serve's small ones: a read-only database is 503 with nothing written, a body that times out wrote nothing, serve binds its port before migrating.

use std::io::{Read as _, Write as _};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::serve::{call, serve, B0};
use crate::support::{counts, pg_url, TestDb};

/// A database that refuses writes (SQLSTATE 25006 read_only_sql_transaction, what a demoted
/// primary or a hot standby answers) is 503 with `written: nothing` and `Retry-After`, not 500;
/// once writable again the same key creates.
#[test]
fn a_read_only_database_is_503_with_nothing_written() {
    let Some(db) = TestDb::postgres("hostile_readonly_db") else {
        return;
    };
    let name = db.0.pg().unwrap().name().to_string();
    db.execute(&format!(
        "ALTER DATABASE \"{name}\" SET default_transaction_read_only = on"
    ));
    let s = serve(&db.url().unwrap(), &["--pool-size", "1"]);
    let r = call(
        "POST",
        &format!("{}/v1/tickets", s.base),
        &[("X-Tenant-Id", "A"), ("Idempotency-Key", "k")],
        Some(B0),
    );
    assert_eq!(r.status, 503, "{}", r.json);
    assert_eq!(r.json["written"], "nothing", "{}", r.json);
    assert_eq!(r.json["cause"], "read-only", "{}", r.json);
    assert_eq!(r.retry_after.as_deref(), Some("1"));
    assert!(
        !r.json.to_string().contains("INSERT") && r.json["error_id"].is_null(),
        "{}",
        r.json
    );
    drop(s);
    // A new session starts read-only too: made writable first (its own statement, outside
    // the read-only transaction), then the database is set back to normal.
    let mut c = db.pg_config().unwrap().connect(postgres::NoTls).unwrap();
    c.batch_execute("SET default_transaction_read_only = off")
        .unwrap();
    c.batch_execute(&format!(
        "ALTER DATABASE \"{name}\" SET default_transaction_read_only = off"
    ))
    .unwrap();
    assert_eq!(db.counts("A"), counts(0, 0, 0));
}

/// A request whose body stops arriving is answered at the request timeout with
/// `written: nothing`: the body never arrived, so no work began.
#[test]
fn a_body_that_times_out_says_nothing_was_written() {
    let Some(db) = TestDb::postgres("hostile_body_timeout") else {
        return;
    };
    let s = serve(
        &db.url().unwrap(),
        &["--pool-size", "1", "--request-timeout-ms", "1000"],
    );
    let addr = s.base.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let head = format!(
        "POST /v1/tickets HTTP/1.1\r\nHost: {addr}\r\nX-Tenant-Id: A\r\nIdempotency-Key: k\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        B0.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(&B0.as_bytes()[..10]).unwrap();
    // The rest of the body never comes: the service answers at its request timeout.
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                reply.extend_from_slice(&buf[..n]);
                if reply.windows(4).any(|w| w == b"\r\n\r\n") && reply.ends_with(b"}") {
                    break;
                }
            }
            Err(e) => panic!(
                "no answer: {e} (so far {:?})",
                String::from_utf8_lossy(&reply)
            ),
        }
    }
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.starts_with("HTTP/1.1 503"), "{reply}");
    assert!(reply.contains(r#""written":"nothing""#), "{reply}");
    assert!(reply.contains(r#""cause":"request-timeout""#), "{reply}");
    assert_eq!(db.counts("A"), counts(0, 0, 0));
}

/// A database of the test's own, created empty (never migrated), dropped when done.
struct EmptyDb {
    admin: postgres::Client,
    name: String,
    url: String,
}

impl EmptyDb {
    fn new(server: &str) -> Self {
        let name = format!("tf_hostile_bind_{}", uuid::Uuid::new_v4().simple());
        let mut admin = postgres::Client::connect(server, postgres::NoTls).unwrap();
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .unwrap();
        let (base, query) = match server.split_once('?') {
            Some((b, q)) => (b, format!("?{q}")),
            None => (server, String::new()),
        };
        let (authority, _) = base.rsplit_once('/').unwrap();
        let url = format!("{authority}/{name}{query}");
        EmptyDb { admin, name, url }
    }

    fn tables(&self) -> i64 {
        let mut c = postgres::Client::connect(&self.url, postgres::NoTls).unwrap();
        c.query_one(
            "SELECT count(*) FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')",
            &[],
        )
        .unwrap()
        .get(0)
    }
}

impl Drop for EmptyDb {
    fn drop(&mut self) {
        let _ = self.admin.batch_execute(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        ));
    }
}

/// `serve` on a port already in use fails (exit 1, naming the address) before it touches the
/// database: a fresh database it was pointed at still has no tables.
#[test]
fn serve_on_a_port_in_use_fails_before_migrating() {
    let Some(server) = pg_url() else { return };
    let db = EmptyDb::new(&server);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_ticketflow"))
        .args(["serve", "--listen", &addr, "--database-url", &db.url])
        .env_remove("DATABASE_URL")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&addr), "{stderr}");
    assert_eq!(
        db.tables(),
        0,
        "serve migrated before it found the port taken"
    );
}
