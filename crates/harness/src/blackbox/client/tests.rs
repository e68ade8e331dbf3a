use std::io::{self, Read, Write};
use std::net::{Ipv6Addr, TcpStream};
use std::time::Duration;

use super::answer::read_answer;
use super::answer::Source;
use super::request::{encode, parse_url, Host};
use super::{
    send, ClientError, Clock, Held, HttpAnswer, HttpRequest, BODY_LIMIT, HEAD_LIMIT, MAX_HEADERS,
};
use std::net::TcpListener;
use std::sync::mpsc;
use std::thread::{self, JoinHandle};

const LONG: Duration = Duration::from_secs(10);

/// A listener on 127.0.0.1 and its base URL.
fn listen() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    (listener, url)
}

/// A server that accepts one connection and hands it to `handler`.
fn serve_one<F>(handler: F) -> (String, JoinHandle<()>)
where
    F: FnOnce(TcpStream) + Send + 'static,
{
    let (listener, url) = listen();
    let server = thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        // A safety net so a broken client fails the test instead of hanging it.
        stream.set_read_timeout(Some(LONG)).unwrap();
        handler(stream);
    });
    (url, server)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Reads one request: the head, then `Content-Length` body bytes.
fn read_request(stream: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = find(&got, b"\r\n\r\n") {
            break i + 4;
        }
        let n = stream.read(&mut chunk).unwrap();
        assert!(n > 0, "client closed in the middle of the head");
        got.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&got[..head_end]).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().unwrap());
    while got.len() < head_end + len {
        let n = stream.read(&mut chunk).unwrap();
        assert!(n > 0, "client closed in the middle of the body");
        got.extend_from_slice(&chunk[..n]);
    }
    got
}

/// Waits for the client to close its side (EOF or an error).
fn wait_for_close(stream: &mut TcpStream) {
    let mut chunk = [0u8; 1024];
    while matches!(stream.read(&mut chunk), Ok(n) if n > 0) {}
}

/// A server that reads one request, writes `answer` and closes.
fn answering(answer: &'static [u8]) -> (String, JoinHandle<()>) {
    serve_one(move |mut s| {
        read_request(&mut s);
        s.write_all(answer).unwrap();
    })
}

fn get(url: &str) -> Result<HttpAnswer, ClientError> {
    send(&HttpRequest::new("GET", url), LONG)
}

#[test]
fn content_length_body() {
    let (url, server) =
        answering(b"HTTP/1.1 201 Created\r\nContent-Length: 5\r\nX-A: 1\r\n\r\nhello and more");
    let answer = get(&format!("{url}/x")).unwrap();
    server.join().unwrap();
    assert_eq!(answer.status, 201);
    assert_eq!(answer.body, b"hello");
    assert_eq!(answer.header("x-a"), Some("1"));
}

#[test]
fn chunked_body_is_decoded_and_trailers_ignored() {
    let (url, server) = answering(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n\
          5;ext=1\r\nhello\r\nA \r\n, chunked!\r\n0\r\nX-Trailer: t\r\n\r\n",
    );
    let answer = get(&url).unwrap();
    server.join().unwrap();
    assert_eq!(answer.status, 200);
    assert_eq!(answer.body_text(), "hello, chunked!");
}

/// A source that yields `step` bytes per read, to split every token across reads.
struct Trickle {
    data: Vec<u8>,
    pos: usize,
    step: usize,
}

impl Read for Trickle {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let n = self.step.min(out.len()).min(self.data.len() - self.pos);
        out[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

impl Source for Trickle {
    fn bound_read(&mut self, _: Duration) -> io::Result<()> {
        Ok(())
    }
}

fn answer_from(data: &[u8], step: usize, head: bool) -> Result<HttpAnswer, ClientError> {
    let clock = Clock::start(LONG);
    let src = Trickle {
        data: data.to_vec(),
        pos: 0,
        step,
    };
    read_answer(src, &clock, "test", head)
}

#[test]
fn chunked_decoder_survives_one_byte_reads() {
    let wire = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n\
                 transfer-encoding: gzip, Chunked\r\n\r\n\
                 3\r\nabc\r\n1;a=b;c\r\nd\r\n10\r\n0123456789abcdef\r\n0\r\nT: 1\r\nU: 2\r\n\r\n";
    for step in [1, 2, 3, 7, 4096] {
        let answer = answer_from(wire, step, false).unwrap();
        assert_eq!(answer.body_text(), "abcd0123456789abcdef", "step {step}");
    }
}

#[test]
fn chunked_errors() {
    let bad_size = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhi\r\n0\r\n\r\n";
    assert!(matches!(
        answer_from(bad_size, 5, false),
        Err(ClientError::Malformed { .. })
    ));
    let no_crlf = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhiX\r\n0\r\n\r\n";
    assert!(matches!(
        answer_from(no_crlf, 5, false),
        Err(ClientError::Malformed { .. })
    ));
    let cut = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhi";
    let err = answer_from(cut, 5, false).unwrap_err();
    assert!(matches!(err, ClientError::Closed { .. }), "{err}");
    assert!(err.is_transport());
    let huge = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n800001\r\n";
    assert!(matches!(
        answer_from(huge, 5, false),
        Err(ClientError::TooLarge {
            limit: BODY_LIMIT,
            ..
        })
    ));
}

#[test]
fn content_length_edge_cases() {
    let agree = b"HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\ncontent-length: 2\r\n\r\nok";
    assert_eq!(answer_from(agree, 3, false).unwrap().body, b"ok");
    let conflict = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok!";
    assert!(matches!(
        answer_from(conflict, 3, false),
        Err(ClientError::Malformed { .. })
    ));
    let junk = b"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nok";
    assert!(matches!(
        answer_from(junk, 3, false),
        Err(ClientError::Malformed { .. })
    ));
    let short = b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nok";
    assert!(matches!(
        answer_from(short, 3, false),
        Err(ClientError::Closed { .. })
    ));
    let cut_head = b"HTTP/1.1 200 OK\r\nContent-Len";
    assert!(matches!(
        answer_from(cut_head, 3, false),
        Err(ClientError::Closed { .. })
    ));
}

#[test]
fn body_until_eof() {
    let (url, server) = answering(b"HTTP/1.0 200 OK\r\nX-B: 2\r\n\r\nall of it\r\nuntil close");
    let answer = get(&url).unwrap();
    server.join().unwrap();
    assert_eq!(answer.body_text(), "all of it\r\nuntil close");
}

#[test]
fn interim_100_continue_is_skipped() {
    let (url, server) = answering(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\nX-I: 1\r\n\r\n\
          HTTP/1.1 202 Accepted\r\nContent-Length: 2\r\n\r\nok",
    );
    let answer = send(
        &HttpRequest::new("POST", format!("{url}/p")).with_body("x"),
        LONG,
    )
    .unwrap();
    server.join().unwrap();
    assert_eq!(answer.status, 202);
    assert_eq!(answer.body, b"ok");
    assert_eq!(answer.header("x-i"), None);
}

#[test]
fn header_lookup_is_case_insensitive_and_counts_repeats() {
    let (url, server) = answering(
        b"HTTP/1.1 200 OK\r\nSet-Cookie: a=1\r\nX-Mixed-Case: v\r\nset-cookie: b=2\r\n\
          SET-COOKIE: c=3\r\nContent-Length: 0\r\n\r\n",
    );
    let answer = get(&url).unwrap();
    server.join().unwrap();
    assert_eq!(answer.header("x-mixed-case"), Some("v"));
    assert_eq!(answer.header("X-MIXED-CASE"), Some("v"));
    assert_eq!(answer.header("set-cookie"), Some("a=1"));
    assert_eq!(answer.header_count("Set-Cookie"), 3);
    assert_eq!(answer.header_count("x-absent"), 0);
    assert_eq!(answer.header("x-absent"), None);
    // Names are kept as received.
    assert!(answer.headers.iter().any(|(n, _)| n == "SET-COOKIE"));
    assert!(answer.body.is_empty());
}

#[test]
fn no_body_for_head_204_and_304_even_with_the_connection_open() {
    for (method, wire) in [
        (
            "HEAD",
            &b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n"[..],
        ),
        ("GET", b"HTTP/1.1 204 No Content\r\n\r\n"),
        (
            "GET",
            b"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n",
        ),
    ] {
        let (url, server) = serve_one(move |mut s| {
            read_request(&mut s);
            s.write_all(wire).unwrap();
            // Keep the connection open: the client must not wait for a body or EOF.
            wait_for_close(&mut s);
        });
        let answer = send(&HttpRequest::new(method, &url), LONG).unwrap();
        assert!(answer.body.is_empty(), "{method} {}", answer.status);
        drop(answer);
        server.join().unwrap();
    }
}

#[test]
fn connection_refused_is_a_transport_error() {
    let (listener, url) = listen();
    drop(listener);
    let err = get(&url).unwrap_err();
    assert!(matches!(err, ClientError::Connect { .. }), "{err}");
    assert!(err.is_transport());
}

#[test]
fn a_server_that_never_answers_times_out() {
    let (url, server) = serve_one(|mut s| {
        read_request(&mut s);
        wait_for_close(&mut s);
    });
    let err = send(&HttpRequest::new("GET", &url), Duration::from_millis(300)).unwrap_err();
    assert!(
        matches!(
            err,
            ClientError::Timeout {
                what: "read answer",
                after_ms
            } if after_ms >= 300
        ),
        "{err}"
    );
    assert!(err.is_transport());
    server.join().unwrap();
}

#[test]
fn malformed_status_line() {
    for wire in [
        &b"HTTP/1.1 abc OK\r\n\r\n"[..],
        b"SMTP ready\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nBad Header\r\n\r\n",
    ] {
        let (url, server) = serve_one(move |mut s| {
            read_request(&mut s);
            s.write_all(wire).unwrap();
            wait_for_close(&mut s);
        });
        let err = get(&url).unwrap_err();
        assert!(matches!(err, ClientError::Malformed { .. }), "{err}");
        assert!(!err.is_transport());
        server.join().unwrap();
    }
}

#[test]
fn too_many_headers_or_too_large_head() {
    let mut many = b"HTTP/1.1 200 OK\r\n".to_vec();
    for i in 0..=MAX_HEADERS {
        many.extend_from_slice(format!("H{i}: v\r\n").as_bytes());
    }
    many.extend_from_slice(b"\r\n");
    assert!(matches!(
        answer_from(&many, 4096, false),
        Err(ClientError::Malformed { .. })
    ));
    let mut big = b"HTTP/1.1 200 OK\r\nX-Big: ".to_vec();
    big.resize(HEAD_LIMIT + 10, b'a');
    assert!(matches!(
        answer_from(&big, 4096, false),
        Err(ClientError::TooLarge {
            what: "answer head",
            ..
        })
    ));
}

#[test]
fn body_over_the_limit_is_too_large() {
    // Declared too large: refused before reading it.
    let (url, server) = serve_one(|mut s| {
        read_request(&mut s);
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
            BODY_LIMIT + 1
        );
        s.write_all(head.as_bytes()).unwrap();
        wait_for_close(&mut s);
    });
    let err = get(&url).unwrap_err();
    assert!(
        matches!(
            err,
            ClientError::TooLarge {
                limit: BODY_LIMIT,
                ..
            }
        ),
        "{err}"
    );
    assert!(!err.is_transport());
    server.join().unwrap();

    // Streamed until EOF past the limit: refused once it passes it.
    let (url, server) = serve_one(|mut s| {
        read_request(&mut s);
        s.write_all(b"HTTP/1.1 200 OK\r\n\r\n").unwrap();
        let block = vec![b'z'; 64 * 1024];
        let mut sent = 0;
        while sent <= BODY_LIMIT {
            // The client hangs up once it has seen too much; stop there.
            if s.write_all(&block).is_err() {
                return;
            }
            sent += block.len();
        }
    });
    let err = get(&url).unwrap_err();
    assert!(
        matches!(
            err,
            ClientError::TooLarge {
                limit: BODY_LIMIT,
                ..
            }
        ),
        "{err}"
    );
    server.join().unwrap();
}

#[test]
fn https_and_other_bad_urls_are_rejected() {
    let err = get("https://example.com/x").unwrap_err();
    match &err {
        ClientError::Url { url, reason } => {
            assert_eq!(url, "https://example.com/x");
            assert!(reason.contains("https"), "{reason}");
        }
        other => panic!("{other}"),
    }
    assert!(err.to_string().contains("https://example.com/x"));
    assert!(!err.is_transport());
    for bad in [
        "example.com/x",
        "ftp://example.com/",
        "http:///path",
        "http://host:/",
        "http://host:0/",
        "http://host:99999/",
        "http://host:8a/",
        "http://[::1/",
        "http://[nope]:80/",
        "http://::1/",
        "http://user@host/",
        "http://host/a b",
        "http://host/\r\nX: y",
    ] {
        assert!(
            matches!(parse_url(bad), Err(ClientError::Url { .. })),
            "{bad} was accepted"
        );
    }
}

#[test]
fn url_parts() {
    let t = parse_url("http://example.com").unwrap();
    assert_eq!(t.host, Host::Name("example.com".into()));
    assert_eq!((t.port, t.host_header.as_str()), (80, "example.com"));
    assert_eq!(t.request_target, "/");
    let t = parse_url("HTTP://127.0.0.1:8080?a=1#frag").unwrap();
    assert_eq!(
        (t.port, t.host_header.as_str(), t.request_target.as_str()),
        (8080, "127.0.0.1:8080", "/?a=1")
    );
    let t = parse_url("http://[::1]:9000/v1/tickets?x=y").unwrap();
    assert_eq!(t.host, Host::V6(Ipv6Addr::LOCALHOST));
    assert_eq!(t.host_header, "[::1]:9000");
    assert_eq!(t.request_target, "/v1/tickets?x=y");
    let t = parse_url("http://[::1]/").unwrap();
    assert_eq!((t.port, t.host_header.as_str()), (80, "[::1]"));
}

#[test]
fn own_headers_bad_headers_and_bad_methods_are_refused() {
    for name in [
        "Host",
        "content-length",
        "CONNECTION",
        "Transfer-Encoding",
        "Bad Name",
        "",
    ] {
        let req = HttpRequest::new("GET", "http://127.0.0.1:1/").with_header(name, "x");
        let err = send(&req, LONG).unwrap_err();
        assert!(
            matches!(&err, ClientError::Header { name: n, .. } if n == name),
            "{name}: {err}"
        );
        assert!(!err.is_transport());
    }
    let req = HttpRequest::new("GET", "http://127.0.0.1:1/").with_header("X-A", "a\r\nB: c");
    assert!(matches!(send(&req, LONG), Err(ClientError::Header { .. })));
    for method in ["", "GE T", "GET\r\n"] {
        let req = HttpRequest::new(method, "http://127.0.0.1:1/");
        assert!(matches!(send(&req, LONG), Err(ClientError::Method { .. })));
    }
}

#[test]
fn request_bytes_are_well_formed() {
    let (tx, rx) = mpsc::channel();
    let (url, server) = serve_one(move |mut s| {
        tx.send(read_request(&mut s)).unwrap();
        s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            .unwrap();
    });
    let port = url.rsplit(':').next().unwrap().to_string();
    let req = HttpRequest::new("POST", format!("{url}/v1/tickets?dry=1#frag"))
        .with_header("Idempotency-Key", "k-1")
        .with_header("X-Tenant-Id", "t1")
        .with_body(&b"{\"a\":1}"[..]);
    assert_eq!(send(&req, LONG).unwrap().status, 200);
    server.join().unwrap();
    let got = String::from_utf8(rx.recv().unwrap()).unwrap();
    assert_eq!(
        got,
        format!(
            "POST /v1/tickets?dry=1 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
             Content-Length: 7\r\nConnection: close\r\nIdempotency-Key: k-1\r\n\
             X-Tenant-Id: t1\r\n\r\n{{\"a\":1}}"
        )
    );
}

#[test]
fn content_length_is_sent_for_empty_post_bodies_and_not_for_empty_gets() {
    let (_, post) = encode(&HttpRequest::new("POST", "http://h/")).unwrap();
    assert_eq!(
        post,
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    let (_, get) = encode(&HttpRequest::new("GET", "http://h/")).unwrap();
    assert_eq!(
        get,
        b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
    );
    let (_, delete) = encode(&HttpRequest::new("DELETE", "http://h/").with_body("x")).unwrap();
    assert!(find(&delete, b"Content-Length: 1\r\n").is_some());
}

/// A server for held requests: per connection, reads `total - 1` bytes, reports them and
/// whether more bytes were already waiting, then reads the last byte and answers with
/// the request line's path as the body.
fn held_server(
    listener: TcpListener,
    connections: usize,
    total: usize,
    seen: mpsc::Sender<(Vec<u8>, bool)>,
) -> JoinHandle<()> {
    thread::spawn(move || {
        let mut handlers = Vec::new();
        for _ in 0..connections {
            let (mut s, _) = listener.accept().unwrap();
            s.set_read_timeout(Some(LONG)).unwrap();
            let seen = seen.clone();
            handlers.push(thread::spawn(move || {
                let mut got = Vec::new();
                let mut chunk = [0u8; 4096];
                while got.len() < total - 1 {
                    let n = s.read(&mut chunk).unwrap();
                    assert!(n > 0, "client closed early");
                    got.extend_from_slice(&chunk[..n]);
                }
                s.set_nonblocking(true).unwrap();
                let more = match s.peek(&mut [0u8; 1]) {
                    Ok(n) => n > 0,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => false,
                    Err(e) => panic!("{e}"),
                };
                s.set_nonblocking(false).unwrap();
                seen.send((got.clone(), more)).unwrap();
                while got.len() < total {
                    let n = s.read(&mut chunk).unwrap();
                    assert!(n > 0, "client closed before the last byte");
                    got.extend_from_slice(&chunk[..n]);
                }
                assert_eq!(got.len(), total, "more bytes than the request");
                let line = String::from_utf8_lossy(&got);
                let path = line.split(' ').nth(1).unwrap().to_string();
                let answer = format!(
                    "HTTP/1.1 201 Created\r\nContent-Length: {}\r\n\r\n{path}",
                    path.len()
                );
                s.write_all(answer.as_bytes()).unwrap();
            }));
        }
        for h in handlers {
            h.join().unwrap();
        }
    })
}

#[test]
fn held_request_keeps_its_last_body_byte_until_release() {
    let (listener, url) = listen();
    let req = HttpRequest::new("POST", format!("{url}/held"))
        .with_header("Idempotency-Key", "k")
        .with_body(&b"{\"title\":\"t\"}"[..]);
    let (_, full) = encode(&req).unwrap();
    let (tx, rx) = mpsc::channel();
    let server = held_server(listener, 1, full.len(), tx);

    let held = Held::prepare(&req, LONG).unwrap();
    let (seen, more) = rx.recv_timeout(LONG).unwrap();
    assert_eq!(seen.len(), full.len() - 1);
    assert_eq!(seen, full[..full.len() - 1]);
    assert!(!more, "the server could already read the last byte");
    assert!(seen.ends_with(b"\"t\""), "the closing brace is held back");

    let answer = held.release().unwrap();
    assert_eq!((answer.status, answer.body_text().as_str()), (201, "/held"));
    server.join().unwrap();
}

#[test]
fn held_request_without_body_keeps_the_final_newline_of_the_head() {
    let (listener, url) = listen();
    let req = HttpRequest::new("GET", format!("{url}/g"));
    let (_, full) = encode(&req).unwrap();
    let (tx, rx) = mpsc::channel();
    let server = held_server(listener, 1, full.len(), tx);

    let held = Held::prepare(&req, LONG).unwrap();
    let (seen, more) = rx.recv_timeout(LONG).unwrap();
    assert!(!more);
    assert!(
        seen.ends_with(b"\r\n\r"),
        "{:?}",
        String::from_utf8_lossy(&seen)
    );
    let answer = held.release().unwrap();
    assert_eq!(answer.body_text(), "/g");
    server.join().unwrap();
}

#[test]
fn two_held_requests_released_back_to_back_both_get_answers() {
    let (listener, url) = listen();
    let a = HttpRequest::new("POST", format!("{url}/a")).with_body("same body");
    let b = HttpRequest::new("POST", format!("{url}/b")).with_body("same body");
    let total = encode(&a).unwrap().1.len();
    assert_eq!(total, encode(&b).unwrap().1.len());
    let (tx, rx) = mpsc::channel();
    let server = held_server(listener, 2, total, tx);

    let held_a = Held::prepare(&a, LONG).unwrap();
    let held_b = Held::prepare(&b, LONG).unwrap();
    for _ in 0..2 {
        let (seen, more) = rx.recv_timeout(LONG).unwrap();
        assert_eq!(seen.len(), total - 1);
        assert!(!more);
    }
    let answer_a = held_a.release().unwrap();
    let answer_b = held_b.release().unwrap();
    assert_eq!(answer_a.body_text(), "/a");
    assert_eq!(answer_b.body_text(), "/b");
    server.join().unwrap();
}
