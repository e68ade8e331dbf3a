//! Pass-through keeps pipelining: outside a run the interposer forwards a client's pipelined
//! commands without waiting for each reply, in about as many upstream reads as the client
//! made writes. Each fake server here answers nothing until it has read the whole batch, which
//! deadlocks a relay that forwards one command per round trip (every wait has a deadline, so
//! such a relay fails the test instead of hanging it). A run that begins while a pipeline's
//! replies are owed holds the next command only once they are all in, and the step's result
//! is its own reply.

use std::io::{ErrorKind, Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ticketflow_harness::interpose::{upstream_of, Interposer, Limits, Phase, StoreKind};

/// Commands in each pipeline.
const N: usize = 100;

/// How long a fake server waits for the whole batch, and a client for every reply.
const DEADLINE: Duration = Duration::from_secs(10);

/// What a fake server saw of the batch.
#[derive(Debug)]
struct Seen {
    /// Reads it took to receive the whole batch.
    reads: usize,
    /// Bytes it had when it stopped.
    bytes: usize,
    /// Whether the whole batch came before the deadline.
    whole: bool,
}

/// A fake server on loopback for one connection: `greet` runs first (a startup exchange),
/// then it reads until `whole(bytes)` says the batch is in or [`DEADLINE`] passes, counting
/// its reads; only then does it write `answer(bytes)` in one write.
fn fake_server(
    greet: impl FnOnce(&mut TcpStream) + Send + 'static,
    whole: impl Fn(&[u8]) -> bool + Send + 'static,
    answer: impl FnOnce(&[u8]) -> Vec<u8> + Send + 'static,
) -> (SocketAddr, JoinHandle<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let handle = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        greet(&mut s);
        let until = Instant::now() + DEADLINE;
        let mut got = Vec::new();
        let mut reads = 0;
        while !whole(&got) {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            s.set_read_timeout(Some(left)).unwrap();
            let mut buf = [0u8; 64 * 1024];
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    reads += 1;
                    got.extend_from_slice(&buf[..n]);
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break,
                Err(e) => panic!("fake server: {e}"),
            }
        }
        let seen = Seen {
            reads,
            bytes: got.len(),
            whole: whole(&got),
        };
        if seen.whole {
            s.write_all(&answer(&got)).unwrap();
            // Keeps the connection open until the client is done, so the interposer relays
            // every reply before it sees the server close.
            let _ = s.set_read_timeout(Some(DEADLINE));
            let _ = s.read(&mut [0u8; 1]);
        }
        seen
    });
    (addr, handle)
}

/// Reads exactly `n` bytes from `s` within [`DEADLINE`]; what came when it passed otherwise.
fn read_n(s: &mut TcpStream, n: usize) -> Result<Vec<u8>, Vec<u8>> {
    let until = Instant::now() + DEADLINE;
    let mut out = Vec::new();
    while out.len() < n {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(out);
        }
        s.set_read_timeout(Some(left)).unwrap();
        let mut buf = vec![0u8; n - out.len()];
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return Err(out),
            Ok(k) => out.extend_from_slice(&buf[..k]),
        }
    }
    Ok(out)
}

/// The bytes already in `s`'s receive queue, read without waiting.
fn waiting(s: &mut TcpStream) -> Vec<u8> {
    s.set_nonblocking(true).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 64 * 1024];
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    s.set_nonblocking(false).unwrap();
    out
}

fn get(key: &str) -> Vec<u8> {
    format!("*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\n", key.len()).into_bytes()
}

/// The keys of the `GET`s in `b`, in order (the commands [`get`] writes).
fn keys_of(b: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(b)
        .split("*2\r\n$3\r\nGET\r\n")
        .skip(1)
        .filter_map(|c| c.split("\r\n").nth(1).map(str::to_string))
        .collect()
}

fn bulk(v: &str) -> String {
    format!("${}\r\n{v}\r\n", v.len())
}

#[test]
fn a_redis_pipeline_is_forwarded_whole_outside_a_run_without_waiting_for_replies() {
    let keys: Vec<String> = (0..N).map(|i| format!("k{i}")).collect();
    let batch: Vec<u8> = keys.iter().flat_map(|k| get(k)).collect();
    let whole = batch.len();
    // The fake answers each GET with its key, so the order of the replies shows.
    let (addr, server) = fake_server(
        |_| {},
        move |b| b.len() >= whole,
        |b| {
            keys_of(b)
                .iter()
                .map(|k| bulk(k))
                .collect::<String>()
                .into_bytes()
        },
    );
    let ip = Interposer::start(StoreKind::Redis, addr, Limits::default()).unwrap();
    let mut client = TcpStream::connect(ip.addr()).unwrap();
    client.write_all(&batch).unwrap();
    let expected: String = keys.iter().map(|k| bulk(k)).collect();
    let got = read_n(&mut client, expected.len());
    drop(client);
    let seen = server.join().unwrap();
    assert!(
        seen.whole,
        "only {} bytes of the {N} pipelined GETs reached the server in {DEADLINE:?}: the \
         interposer waited for a reply before forwarding the next command ({seen:?})",
        seen.bytes
    );
    assert_eq!(
        got.map(|b| String::from_utf8_lossy(&b).into_owned()),
        Ok(expected),
        "every reply, in order"
    );
    // One client write: about one read upstream (a direct client's server reads it in one).
    assert!(seen.reads <= 3, "{N} GETs in one write took {seen:?}");
}

/// An interposer in front of the local Redis, if it answers.
fn redis_interposer() -> Option<Interposer> {
    if !crate::interpose::redis_up() {
        return None;
    }
    let upstream = upstream_of("redis://127.0.0.1:6379/").unwrap();
    Some(Interposer::start(StoreKind::Redis, upstream, Limits::default()).unwrap())
}

#[test]
fn a_real_redis_answers_a_pipeline_through_the_interposer_in_order() {
    let Some(ip) = redis_interposer() else {
        return;
    };
    let prefix = format!("tfv-pass-{}", std::process::id());
    let mut client = TcpStream::connect(ip.addr()).unwrap();
    // SELECT 9, then SET each key to its own name, then GET them all: one write each time.
    let mut batch = b"*2\r\n$6\r\nSELECT\r\n$1\r\n9\r\n".to_vec();
    for i in 0..N {
        let k = format!("{prefix}-{i}");
        batch.extend_from_slice(format!("*3\r\n$3\r\nSET\r\n{}{}", bulk(&k), bulk(&k)).as_bytes());
    }
    client.write_all(&batch).unwrap();
    let oks = "+OK\r\n".repeat(N + 1);
    assert_eq!(read_n(&mut client, oks.len()), Ok(oks.into_bytes()));
    let keys: Vec<String> = (0..N).map(|i| format!("{prefix}-{i}")).collect();
    client
        .write_all(&keys.iter().flat_map(|k| get(k)).collect::<Vec<u8>>())
        .unwrap();
    let expected: String = keys.iter().map(|k| bulk(k)).collect();
    let got = read_n(&mut client, expected.len()).map(|b| String::from_utf8_lossy(&b).into_owned());
    let mut del = format!("*{}\r\n$3\r\nDEL\r\n", N + 1);
    keys.iter().for_each(|k| del.push_str(&bulk(k)));
    client.write_all(del.as_bytes()).unwrap();
    assert_eq!(
        read_n(&mut client, format!(":{N}\r\n").len()),
        Ok(format!(":{N}\r\n").into_bytes())
    );
    assert_eq!(got, Ok(expected));
}

/// A PostgreSQL message: `tag`, its length, `body`.
fn message(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![tag];
    m.extend_from_slice(&u32::try_from(body.len() + 4).unwrap().to_be_bytes());
    m.extend_from_slice(body);
    m
}

/// The tags of the whole messages at the start of `b`.
fn tags(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut at = 0;
    while b.len() >= at + 5 {
        let len = u32::from_be_bytes([b[at + 1], b[at + 2], b[at + 3], b[at + 4]]) as usize;
        if b.len() < at + 1 + len {
            break;
        }
        out.push(b[at]);
        at += 1 + len;
    }
    out
}

/// A fake PostgreSQL server's startup: reads the startup packet, answers AuthenticationOk and
/// ReadyForQuery.
fn pg_greet(s: &mut TcpStream) {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();
    let mut rest = vec![0u8; u32::from_be_bytes(len) as usize - 4];
    s.read_exact(&mut rest).unwrap();
    let mut hello = message(b'R', &0i32.to_be_bytes());
    hello.extend_from_slice(&message(b'Z', b"I"));
    s.write_all(&hello).unwrap();
}

/// A client through the interposer at `addr`, started (its ReadyForQuery read).
fn pg_client(addr: SocketAddr) -> TcpStream {
    let mut body = 0x0003_0000u32.to_be_bytes().to_vec();
    body.extend_from_slice(b"user\0postgres\0database\0postgres\0\0");
    let mut startup = u32::try_from(body.len() + 4)
        .unwrap()
        .to_be_bytes()
        .to_vec();
    startup.extend_from_slice(&body);
    let mut c = TcpStream::connect(addr).unwrap();
    c.write_all(&startup).unwrap();
    let hello = read_n(&mut c, 9 + 6).expect("the fake server's hello");
    assert_eq!(tags(&hello), b"RZ");
    c
}

/// Runs `batch` (client messages in one write) through an interposer to a fake server that
/// answers only once it has `syncs` messages tagged `end` (`Q` or `S`), each answered by
/// `reply(i)` and a ReadyForQuery; returns what the fake saw and whether the client got every
/// reply in order.
fn pg_pipeline(batch: Vec<u8>, end: u8, groups: usize) -> (Seen, Result<Vec<u8>, Vec<u8>>) {
    let tag = move |i: usize| format!("SELECT {i}\0");
    let answer_all = move |b: &[u8]| -> Vec<u8> {
        let ends = tags(b).iter().filter(|&&t| t == end).count();
        (0..ends)
            .flat_map(|i| {
                let mut r = message(b'C', tag(i).as_bytes());
                r.extend_from_slice(&message(b'Z', b"I"));
                r
            })
            .collect()
    };
    let expected: Vec<u8> = answer_all(&batch);
    let (addr, server) = fake_server(
        pg_greet,
        move |b| tags(b).iter().filter(|&&t| t == end).count() == groups,
        answer_all,
    );
    let ip = Interposer::start(StoreKind::Postgres, addr, Limits::default()).unwrap();
    let mut client = pg_client(ip.addr());
    client.write_all(&batch).unwrap();
    let got = read_n(&mut client, expected.len()).map(|b| {
        assert_eq!(b, expected, "every reply, in order");
        b
    });
    drop(client);
    (server.join().unwrap(), got)
}

#[test]
fn postgres_queries_in_one_write_are_forwarded_whole_outside_a_run() {
    let batch: Vec<u8> = (0..N)
        .flat_map(|i| message(b'Q', format!("SELECT {i}\0").as_bytes()))
        .collect();
    let (seen, got) = pg_pipeline(batch, b'Q', N);
    assert!(
        seen.whole,
        "{N} Query messages in one write did not all reach the server in {DEADLINE:?}: the \
         interposer waited for a ReadyForQuery before forwarding the next ({seen:?})"
    );
    assert!(
        got.is_ok(),
        "the client got {} bytes",
        got.unwrap_err().len()
    );
    assert!(seen.reads <= 3, "{N} Queries in one write took {seen:?}");
}

#[test]
fn postgres_extended_query_batches_in_one_write_are_forwarded_whole_outside_a_run() {
    // Parse/Bind/Execute/Sync, N times over (a driver's pipeline mode).
    let mut batch = Vec::new();
    for i in 0..N {
        batch.extend_from_slice(&message(b'P', format!("\0SELECT {i}\0\0\0").as_bytes()));
        batch.extend_from_slice(&message(b'B', b"\0\0\0\0\0\0\0\0"));
        batch.extend_from_slice(&message(b'E', b"\0\0\0\0\0"));
        batch.extend_from_slice(&message(b'S', b""));
    }
    let (seen, got) = pg_pipeline(batch, b'S', N);
    assert!(
        seen.whole,
        "{N} Parse/Bind/Execute/Sync groups in one write did not all reach the server in \
         {DEADLINE:?} ({seen:?})"
    );
    assert!(
        got.is_ok(),
        "the client got {} bytes",
        got.unwrap_err().len()
    );
    assert!(seen.reads <= 3, "{N} groups in one write took {seen:?}");
}

/// What [`held_after_the_pipeline`] sends and expects of one protocol.
struct Transition {
    store: StoreKind,
    /// The fake server's startup exchange.
    greet: fn(&mut TcpStream),
    /// The client's startup exchange.
    start: fn(&mut TcpStream),
    /// The fake server's replies to the commands numbered `range` of `sent`.
    answer: fn(&[u8], std::ops::Range<usize>) -> Vec<u8>,
    /// The pipeline's [`N`] commands, and the command after it.
    pipeline: Vec<u8>,
    next: Vec<u8>,
    /// The next command's step text, and its result as the evidence shows it.
    text: &'static str,
    result: &'static str,
}

/// A pipeline passes through; a run begins while its replies are still owed (the fake server
/// answers only when told); the command sent next is held as a step only once every reply of
/// the pipeline is in (the client has them all), reaches the server only when released, and
/// gets its own reply as its result.
fn held_after_the_pipeline(t: Transition) {
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (got_tx, got_rx) = std::sync::mpsc::channel::<usize>();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let sent = [t.pipeline.clone(), t.next.clone()].concat();
    let (answer, greet, first) = (t.answer, t.greet, t.pipeline.len());
    let total = sent.len();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        greet(&mut s);
        s.set_read_timeout(Some(DEADLINE)).unwrap();
        let mut got = Vec::new();
        // The pipeline's commands, then the command after it: each answered when told.
        for (bytes, commands) in [(first, 0..N), (total, N..N + 1)] {
            while got.len() < bytes {
                let mut buf = [0u8; 64 * 1024];
                match s.read(&mut buf) {
                    Ok(k) if k > 0 => got.extend_from_slice(&buf[..k]),
                    _ => return,
                }
            }
            got_tx.send(commands.end).unwrap();
            if go_rx.recv_timeout(DEADLINE).is_err() {
                return;
            }
            s.write_all(&answer(&got, commands)).unwrap();
        }
        let _ = s.read(&mut [0u8; 1]);
    });
    let ip = Interposer::start(t.store, addr, Limits::default()).unwrap();
    let hub = ip.hub().clone();
    let mut client = TcpStream::connect(ip.addr()).unwrap();
    (t.start)(&mut client);
    client.write_all(&t.pipeline).unwrap();
    assert_eq!(
        got_rx.recv_timeout(DEADLINE),
        Ok(N),
        "the pipeline passed through before any reply"
    );
    hub.begin();
    client.write_all(&t.next).unwrap();
    go_tx.send(()).unwrap();
    let until = Instant::now() + DEADLINE;
    let held = loop {
        let (version, views) = hub.view();
        if let Some(v) = views.into_iter().find(|v| v.phase == Phase::Held) {
            break v;
        }
        assert!(Instant::now() < until, "the next command was never held");
        hub.wait_change(version, until);
    };
    assert_eq!(held.step.text, t.text);
    // Held only once every reply of the pipeline was passed on: they are all in the client's
    // socket already (read without waiting).
    let replies = (t.answer)(&sent, 0..N);
    assert!(
        waiting(&mut client) == replies,
        "the step was held before the pipeline's replies were in"
    );
    assert!(
        got_rx.try_recv().is_err(),
        "the held command reached the server before its release"
    );
    assert!(hub.release(held.id));
    assert_eq!(
        got_rx.recv_timeout(DEADLINE),
        Ok(N + 1),
        "released, it goes on"
    );
    go_tx.send(()).unwrap();
    let own = (t.answer)(&sent, N..N + 1);
    assert_eq!(read_n(&mut client, own.len()), Ok(own));
    let v = loop {
        let (version, _) = hub.view();
        let v = hub.session(held.id).unwrap();
        if v.completed == 1 && v.phase == Phase::Idle {
            break v;
        }
        assert!(Instant::now() < until, "the step never completed: {v:?}");
        hub.wait_change(version, until);
    };
    assert_eq!(
        v.result_text(),
        t.result,
        "the step's result is its own reply"
    );
    hub.end();
    drop(client);
    server.join().unwrap();
}

#[test]
fn a_run_that_begins_behind_a_redis_pipeline_holds_the_next_command_once_its_replies_are_in() {
    held_after_the_pipeline(Transition {
        store: StoreKind::Redis,
        greet: |_| {},
        start: |_| {},
        answer: |sent, range| {
            let keys = keys_of(sent);
            keys[range]
                .iter()
                .map(|k| bulk(k))
                .collect::<String>()
                .into_bytes()
        },
        pipeline: (0..N).flat_map(|i| get(&format!("k{i}"))).collect(),
        next: get("held"),
        text: "GET held",
        result: "\"held\"",
    });
}

#[test]
fn a_run_that_begins_behind_postgres_queries_holds_the_next_once_their_replies_are_in() {
    held_after_the_pipeline(Transition {
        store: StoreKind::Postgres,
        greet: pg_greet,
        start: |c| {
            let mut body = 0x0003_0000u32.to_be_bytes().to_vec();
            body.extend_from_slice(b"user\0postgres\0\0");
            let mut startup = u32::try_from(body.len() + 4)
                .unwrap()
                .to_be_bytes()
                .to_vec();
            startup.extend_from_slice(&body);
            c.write_all(&startup).unwrap();
            read_n(c, 9 + 6).expect("the fake server's hello");
        },
        answer: |_, range| {
            range
                .flat_map(|i| {
                    let mut r = message(b'C', format!("SELECT {i}\0").as_bytes());
                    r.extend_from_slice(&message(b'Z', b"I"));
                    r
                })
                .collect()
        },
        pipeline: (0..N)
            .flat_map(|i| message(b'Q', format!("SELECT {i}\0").as_bytes()))
            .collect(),
        next: message(b'Q', b"SELECT 'held'\0"),
        text: "SELECT 'held'",
        result: "SELECT 100 (I)",
    });
}

/// A pipeline that sends no Sync for megabytes (psycopg 3's pipeline mode with many inserts)
/// is not kept whole in the relay's memory until its Sync: outside a run, past a bound, what
/// is kept goes on.
#[test]
fn a_long_group_without_a_sync_goes_on_before_its_sync_outside_a_run() {
    const ENOUGH: usize = 2 << 20;
    let mut bind = b"\0\0".to_vec();
    bind.extend_from_slice(&0i16.to_be_bytes());
    bind.extend_from_slice(&1i16.to_be_bytes());
    bind.extend_from_slice(&1024i32.to_be_bytes());
    bind.extend_from_slice(&[b'x'; 1024]);
    bind.extend_from_slice(&0i16.to_be_bytes());
    let mut batch = message(b'P', b"\0INSERT INTO t VALUES ($1)\0\0\0");
    while batch.len() < 3 << 20 {
        batch.extend_from_slice(&message(b'B', &bind));
        batch.extend_from_slice(&message(b'E', b"\0\0\0\0\0"));
    }
    let (addr, server) = fake_server(pg_greet, |b| b.len() >= ENOUGH, |_| Vec::new());
    let ip = Interposer::start(StoreKind::Postgres, addr, Limits::default()).unwrap();
    let mut client = pg_client(ip.addr());
    // The fake server stops reading at 2 MiB: the rest of the write may fail, as it may.
    let writer = std::thread::spawn(move || {
        let _ = client.write_all(&batch);
        client
    });
    let seen = server.join().unwrap();
    drop(writer.join().unwrap());
    assert!(
        seen.whole,
        "3 MiB of Bind/Execute without a Sync: only {} bytes reached the server in {DEADLINE:?}",
        seen.bytes
    );
}

/// Waits (bounded by [`DEADLINE`]) until a session of `hub` holds a step; its id.
fn held_session(hub: &ticketflow_harness::interpose::Hub) -> Option<u64> {
    let until = Instant::now() + DEADLINE;
    loop {
        let (version, views) = hub.view();
        if let Some(v) = views.into_iter().find(|v| v.phase == Phase::Held) {
            return Some(v.id);
        }
        if Instant::now() >= until {
            return None;
        }
        hub.wait_change(version, until);
    }
}

/// A `COPY … FROM STDIN` sent as the Rust `postgres` crate (and libpq's PQsendQueryParams)
/// sends it, Bind, Execute, Sync, then the data and another Sync: the server ignores the first
/// Sync in copy-in mode and answers one ReadyForQuery. The relay must not count a reply owed
/// for it, or the session's next command, in a run, would wait for ever for it.
#[test]
fn a_copy_in_with_the_extended_protocol_leaves_no_reply_owed_and_a_run_holds_the_next_command() {
    let Some(db) = crate::support::TestDb::postgres("ip_copy_in") else {
        return;
    };
    let url = db.url().unwrap();
    db.execute("CREATE TABLE copied (n int)");
    let ip = Interposer::start(
        StoreKind::Postgres,
        upstream_of(&url).unwrap(),
        Limits::default(),
    )
    .unwrap();
    let through = ticketflow_harness::interpose::url_through(&url, ip.addr()).unwrap();
    let mut client = postgres::Client::connect(&through, postgres::NoTls).unwrap();
    let mut w = client.copy_in("COPY copied FROM STDIN").unwrap();
    w.write_all(b"1\n2\n3\n").unwrap();
    assert_eq!(w.finish().unwrap(), 3);
    let hub = ip.hub().clone();
    hub.begin();
    let query = std::thread::spawn(move || {
        let n: i64 = client
            .query_one("SELECT count(*) FROM copied", &[])
            .unwrap()
            .get(0);
        n
    });
    let held = held_session(&hub);
    // Whatever happened, the run ends so the client's query goes on and the thread ends.
    if let Some(id) = held {
        hub.release(id);
    }
    hub.end();
    assert_eq!(query.join().unwrap(), 3);
    assert!(
        held.is_some(),
        "the query after the COPY was never held: a reply was still counted owed"
    );
}

/// `CLIENT REPLY SKIP` leaves the next command unanswered: the relay stops counting the
/// connection's replies (as for a subscriber), so a command in a run is not kept waiting for
/// a reply that never comes.
#[test]
fn a_redis_client_that_skips_a_reply_is_not_kept_waiting_in_a_run() {
    let Some(ip) = redis_interposer() else {
        return;
    };
    let key = format!("tfv-skip-{}", std::process::id());
    let mut client = TcpStream::connect(ip.addr()).unwrap();
    let cmd = |words: &[&str]| {
        let mut b = format!("*{}\r\n", words.len());
        words.iter().for_each(|w| b.push_str(&bulk(w)));
        b.into_bytes()
    };
    client
        .write_all(&[cmd(&["SELECT", "9"]), cmd(&["CLIENT", "REPLY", "SKIP"])].concat())
        .unwrap();
    client.write_all(&cmd(&["SET", &key, "v"])).unwrap();
    assert_eq!(read_n(&mut client, 5), Ok(b"+OK\r\n".to_vec()), "SELECT's");
    let hub = ip.hub().clone();
    hub.begin();
    client.write_all(&cmd(&["GET", &key])).unwrap();
    let got = read_n(&mut client, bulk("v").len());
    hub.end();
    client.write_all(&cmd(&["DEL", &key])).unwrap();
    let _ = read_n(&mut client, 4);
    assert_eq!(
        got,
        Ok(bulk("v").into_bytes()),
        "the GET after a skipped reply was kept waiting in the run"
    );
}
