//! The interposer's bounds answered as the servers answer them: a connection that does not
//! start within the startup deadline is closed (idle sockets cannot lock a client out), an
//! invalid startup packet is closed at once without reaching the server, a connection over the
//! cap gets PostgreSQL's 53300 or Redis' `-ERR max number of clients reached`, a message over
//! the bound gets an error naming the bound; Redis pub/sub (RESP2 and RESP3) and `QUIT` are
//! relayed as the server sends them.

use std::io::{BufRead as _, BufReader, ErrorKind, Read as _, Write as _};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use ticketflow_harness::interpose::{upstream_of, url_through, Interposer, Limits, StoreKind};

const REDIS: &str = "redis://127.0.0.1:6379/";

/// An interposer with `limits` in front of the tests' PostgreSQL server, and the URL of its
/// `postgres` database through it.
fn pg(limits: Limits) -> Option<(Interposer, String)> {
    let url = crate::support::pg_url()?;
    let ip = Interposer::start(StoreKind::Postgres, upstream_of(&url).unwrap(), limits).unwrap();
    let through = url_through(&url, ip.addr()).unwrap();
    Some((ip, through))
}

/// An interposer with `limits` in front of the tests' Redis server.
fn redis(limits: Limits) -> Option<Interposer> {
    if !crate::interpose::redis_up() {
        return None;
    }
    Some(Interposer::start(StoreKind::Redis, upstream_of(REDIS).unwrap(), limits).unwrap())
}

/// Everything the peer sends until it closes (`Ok`), or what came before `within` passed
/// (`Err`).
fn read_to_close(s: &mut TcpStream, within: Duration) -> Result<Vec<u8>, Vec<u8>> {
    let deadline = Instant::now() + within;
    let mut out = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(out);
        }
        s.set_read_timeout(Some(left)).unwrap();
        let mut buf = [0u8; 4096];
        match s.read(&mut buf) {
            Ok(0) => return Ok(out),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return Ok(out),
            Err(_) => return Err(out),
        }
    }
}

fn startup_packet(len: u32, code: u32) -> Vec<u8> {
    let mut p = len.to_be_bytes().to_vec();
    p.extend_from_slice(&code.to_be_bytes());
    p
}

#[test]
fn idle_connections_past_the_startup_deadline_do_not_lock_a_client_out() {
    let limits = Limits {
        startup_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    assert_eq!(Limits::default().startup_timeout, Duration::from_secs(10));
    let Some((ip, url)) = pg(limits) else {
        return;
    };
    // More idle sockets than the cap (256): none sends a byte.
    let idle: Vec<TcpStream> = (0..300)
        .map(|_| TcpStream::connect(ip.addr()).unwrap())
        .collect();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(10);
    let answer = loop {
        let tried = postgres::Client::connect(&url, postgres::NoTls)
            .and_then(|mut c| c.query_one("SELECT 1", &[]).map(|r| r.get::<_, i32>(0)));
        match tried {
            Ok(n) => break Ok(n),
            Err(e) if Instant::now() >= deadline => break Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    assert_eq!(
        answer.map_err(|e| e.to_string()),
        Ok(1),
        "a client got in within 10 s of 300 idle sockets"
    );
    drop(idle);
}

#[test]
fn an_invalid_startup_packet_is_closed_at_once_without_reaching_the_server() {
    // A fake server that only counts the connections the interposer makes to it.
    let fake = TcpListener::bind("127.0.0.1:0").unwrap();
    fake.set_nonblocking(true).unwrap();
    let ip = Interposer::start(
        StoreKind::Postgres,
        fake.local_addr().unwrap(),
        Limits {
            startup_timeout: Duration::from_millis(300),
            ..Limits::default()
        },
    )
    .unwrap();
    let send = |bytes: &[u8]| {
        let mut c = TcpStream::connect(ip.addr()).unwrap();
        c.write_all(bytes).unwrap();
        let started = Instant::now();
        let got = read_to_close(&mut c, Duration::from_secs(3));
        (got, started.elapsed())
    };
    // Protocol 2.0: PostgreSQL answers FATAL 0A000 and closes.
    let (got, _) = send(&startup_packet(8, 0x0002_0000));
    let got = got.expect("closed at once");
    let text = String::from_utf8_lossy(&got);
    assert!(
        got.first() == Some(&b'E') && text.contains("C0A000") && text.contains("protocol 2.0"),
        "{text:?}"
    );
    // Garbage (an HTTP request: its "length" is over 10,000), a length under 8, one over
    // 10,000: closed at once and silently, as PostgreSQL closes them.
    for bad in [
        b"GET / HTTP/1.1\r\n\r\n".to_vec(),
        startup_packet(5, 0x0003_0000),
        startup_packet(10_001, 0x0003_0000),
    ] {
        let (got, took) = send(&bad);
        assert_eq!(got, Ok(Vec::new()), "{bad:?}");
        assert!(took < Duration::from_secs(1), "{bad:?}: {took:?}");
    }
    // Half a length, then nothing: closed at the startup deadline.
    let (got, took) = send(&[0, 0, 0]);
    assert_eq!(got, Ok(Vec::new()));
    assert!(took >= Duration::from_millis(250), "{took:?}");
    // None of them reached the server.
    assert_eq!(
        fake.accept().map(|_| ()).map_err(|e| e.kind()),
        Err(ErrorKind::WouldBlock),
        "an invalid startup packet reached the server"
    );
}

#[test]
fn a_connection_over_the_cap_gets_the_servers_refusal() {
    if let Some((ip, url)) = pg(Limits {
        max_connections: 2,
        ..Limits::default()
    }) {
        let held: Vec<postgres::Client> = (0..2)
            .map(|_| postgres::Client::connect(&url, postgres::NoTls).unwrap())
            .collect();
        let e = postgres::Client::connect(&url, postgres::NoTls)
            .map(|_| ())
            .expect_err("a third connection over a cap of 2");
        assert_eq!(
            e.code(),
            Some(&postgres::error::SqlState::TOO_MANY_CONNECTIONS),
            "{e}"
        );
        let message = e.as_db_error().map(|d| d.message().to_string());
        let message = message.unwrap_or_default();
        assert!(
            message.contains("too many clients") && message.contains('2'),
            "{message}"
        );
        drop(held);
        drop(ip);
    }
    let Some(ip) = redis(Limits {
        max_connections: 1,
        ..Limits::default()
    }) else {
        return;
    };
    let mut first = TcpStream::connect(ip.addr()).unwrap();
    first.write_all(b"PING\r\n").unwrap();
    let mut r = BufReader::new(first.try_clone().unwrap());
    assert_eq!(line(&mut r), "+PONG");
    let mut second = TcpStream::connect(ip.addr()).unwrap();
    second.write_all(b"PING\r\n").unwrap();
    assert_eq!(
        read_to_close(&mut second, Duration::from_secs(3))
            .map(|b| String::from_utf8_lossy(&b).into_owned()),
        Ok("-ERR max number of clients reached\r\n".to_string())
    );
}

#[test]
fn a_message_over_the_bound_gets_an_error_naming_it() {
    assert_eq!(Limits::default().max_message, 64 << 20);
    let small = || Limits {
        max_message: 4096,
        ..Limits::default()
    };
    if let Some((_ip, url)) = pg(small()) {
        // From the client: a query over the bound.
        let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        let e = c
            .batch_execute(&format!("SELECT '{}'", "x".repeat(8192)))
            .expect_err("a query over 4096 bytes");
        assert_eq!(
            e.code(),
            Some(&postgres::error::SqlState::PROGRAM_LIMIT_EXCEEDED),
            "{e}"
        );
        let message = e.as_db_error().map(|d| d.message().to_string());
        assert!(message.unwrap_or_default().contains("4096 bytes"), "{e}");
        // From the server: a row over the bound.
        let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        let e = c
            .batch_execute("SELECT repeat('x', 8192)")
            .expect_err("a row over 4096 bytes");
        assert_eq!(
            e.code(),
            Some(&postgres::error::SqlState::PROGRAM_LIMIT_EXCEEDED),
            "{e}"
        );
    }
    let Some(ip) = redis(small()) else {
        return;
    };
    let key = "tf:interpose-bounds:big";
    let mut c = TcpStream::connect(ip.addr()).unwrap();
    let value = "x".repeat(8192);
    c.write_all(
        format!(
            "*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n$8192\r\n{value}\r\n",
            key.len()
        )
        .as_bytes(),
    )
    .unwrap();
    let got = read_to_close(&mut c, Duration::from_secs(3))
        .map(|b| String::from_utf8_lossy(&b).into_owned());
    assert!(
        got.as_ref()
            .is_ok_and(|t| t.starts_with("-ERR") && t.contains("4096 bytes")),
        "{got:?}"
    );
    // From the server: a reply over the bound.
    let mut direct = redis::Client::open(REDIS)
        .unwrap()
        .get_connection()
        .unwrap();
    redis::cmd("SET")
        .arg(key)
        .arg(&value)
        .query::<()>(&mut direct)
        .unwrap();
    let mut c = TcpStream::connect(ip.addr()).unwrap();
    c.write_all(format!("GET {key}\r\n").as_bytes()).unwrap();
    let got = read_to_close(&mut c, Duration::from_secs(3))
        .map(|b| String::from_utf8_lossy(&b).into_owned());
    redis::cmd("DEL").arg(key).query::<()>(&mut direct).unwrap();
    assert!(
        got.as_ref()
            .is_ok_and(|t| t.starts_with("-ERR") && t.contains("4096 bytes")),
        "{got:?}"
    );
}

/// A RESP value as the test reads it.
#[derive(Debug, PartialEq)]
enum V {
    /// `+`, `-`, `:`, `_`, `,`, `#`, `(` lines with their type byte.
    Line(char, String),
    /// `$`, `=`, `!` (a null as `None`).
    Bulk(Option<String>),
    /// `*`, `~`, `>`, `%` (a map's keys and values in turn), with the type byte.
    Agg(char, Vec<V>),
}

fn line(r: &mut BufReader<TcpStream>) -> String {
    let mut l = String::new();
    r.read_line(&mut l)
        .expect("a reply line before the read timeout");
    assert!(l.ends_with("\r\n"), "closed inside a reply: {l:?}");
    l.truncate(l.len() - 2);
    l
}

fn reply(r: &mut BufReader<TcpStream>) -> V {
    let l = line(r);
    let (kind, rest) = l.split_at(1);
    let kind = kind.chars().next().unwrap_or('?');
    match kind {
        '$' | '=' | '!' => {
            let n: i64 = rest.parse().unwrap();
            if n < 0 {
                return V::Bulk(None);
            }
            let mut b = vec![0u8; n as usize + 2];
            r.read_exact(&mut b).unwrap();
            b.truncate(n as usize);
            V::Bulk(Some(String::from_utf8_lossy(&b).into_owned()))
        }
        '*' | '~' | '>' | '%' => {
            let n: i64 = rest.parse().unwrap();
            let n = if kind == '%' { 2 * n } else { n };
            V::Agg(kind, (0..n.max(0)).map(|_| reply(r)).collect())
        }
        _ => V::Line(kind, rest.to_string()),
    }
}

/// A pub/sub message or confirmation: `>` (RESP3) or `*` (RESP2) of bulk words and a count.
fn pubsub(kind: char, words: &[&str], count: Option<i64>) -> V {
    let mut items: Vec<V> = words.iter().map(|w| V::Bulk(Some(w.to_string()))).collect();
    if let Some(n) = count {
        items.push(V::Line(':', n.to_string()));
    }
    V::Agg(kind, items)
}

fn resp_client(ip: &Interposer) -> (TcpStream, BufReader<TcpStream>) {
    let s = TcpStream::connect(ip.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let r = BufReader::new(s.try_clone().unwrap());
    (s, r)
}

#[test]
fn redis_pub_sub_and_quit_are_relayed_as_the_server_sends_them() {
    let Some(ip) = redis(Limits::default()) else {
        return;
    };
    let mut direct = redis::Client::open(REDIS)
        .unwrap()
        .get_connection()
        .unwrap();
    // RESP3, during a run: the confirmations are push frames and are the replies; pub/sub
    // traffic is never held.
    ip.hub().begin();
    let (mut s, mut r) = resp_client(&ip);
    s.write_all(b"HELLO 3\r\n").unwrap();
    assert!(matches!(reply(&mut r), V::Agg('%', _)));
    s.write_all(b"SUBSCRIBE tf-ib-a\r\n").unwrap();
    assert_eq!(
        reply(&mut r),
        pubsub('>', &["subscribe", "tf-ib-a"], Some(1))
    );
    s.write_all(b"SUBSCRIBE tf-ib-b\r\n").unwrap();
    assert_eq!(
        reply(&mut r),
        pubsub('>', &["subscribe", "tf-ib-b"], Some(2))
    );
    let n: i64 = redis::cmd("PUBLISH")
        .arg("tf-ib-a")
        .arg("hello")
        .query(&mut direct)
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(
        reply(&mut r),
        pubsub('>', &["message", "tf-ib-a", "hello"], None)
    );
    // Another relayed connection is not stalled behind it.
    let (mut o, mut or) = resp_client(&ip);
    o.write_all(b"PING\r\n").unwrap();
    assert_eq!(reply(&mut or), V::Line('+', "PONG".into()));
    // A RESET leaves subscribe mode; a command after it is answered.
    s.write_all(b"RESET\r\nPING\r\n").unwrap();
    assert_eq!(reply(&mut r), V::Line('+', "RESET".into()));
    assert_eq!(reply(&mut r), V::Line('+', "PONG".into()));
    ip.hub().end();
    // RESP2: one confirmation per channel, then the way out and a plain command.
    let (mut t, mut tr) = resp_client(&ip);
    t.write_all(b"SUBSCRIBE tf-ib-x tf-ib-y tf-ib-z\r\n")
        .unwrap();
    for (i, ch) in ["tf-ib-x", "tf-ib-y", "tf-ib-z"].iter().enumerate() {
        assert_eq!(
            reply(&mut tr),
            pubsub('*', &["subscribe", ch], Some(i as i64 + 1))
        );
    }
    t.write_all(b"UNSUBSCRIBE\r\n").unwrap();
    let mut left: Vec<V> = (0..3).map(|_| reply(&mut tr)).collect();
    assert!(
        left.iter()
            .all(|v| matches!(v, V::Agg('*', w) if w.first() == Some(&V::Bulk(Some("unsubscribe".into()))))),
        "{left:?}"
    );
    assert_eq!(
        left.pop().and_then(|v| match v {
            V::Agg(_, mut w) => w.pop(),
            _ => None,
        }),
        Some(V::Line(':', "0".into()))
    );
    t.write_all(b"GET tf:interpose-bounds:none\r\n").unwrap();
    assert_eq!(reply(&mut tr), V::Bulk(None));
    // QUIT's +OK reaches the client before the close, every time, also when the client
    // half-closes right after it.
    let mut got = Vec::new();
    for _ in 0..20 {
        let mut q = TcpStream::connect(ip.addr()).unwrap();
        q.write_all(b"QUIT\r\n").unwrap();
        let _ = q.shutdown(Shutdown::Write);
        got.push(read_to_close(&mut q, Duration::from_secs(5)));
    }
    let ok = got
        .iter()
        .filter(|g| g.as_deref() == Ok(b"+OK\r\n"))
        .count();
    assert_eq!(ok, 20, "{got:?}");
}
