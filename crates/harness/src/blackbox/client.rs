//! A small blocking HTTP/1.1 client whose requests can be held back by their last byte.
//!
//! The black-box race harness needs N requests to reach the server *together*. Connecting,
//! writing the request line and headers and most of the body all take time that varies per
//! request; [`Held::prepare`] does all of that up front and keeps exactly one byte back, so
//! the server has every byte but the last and cannot act yet. [`Held::release`] writes that one
//! byte and reads the answer. Release N held requests from N threads behind a barrier and the
//! server sees N complete requests within the time it takes to send N one-byte segments.
//!
//! [`send`] is the ordinary path: the whole request at once.
//!
//! What it speaks: `http://` only (no TLS), one request per connection (`Connection: close`
//! is always sent), request bodies framed by `Content-Length`. Answers are framed by
//! `Content-Length`, `Transfer-Encoding: chunked` (decoded here, trailers ignored) or the end
//! of the connection; `1xx` interim answers (`100 Continue`) are skipped; answers to `HEAD`
//! and `204`/`304` answers have no body. Heads are parsed with `httparse`.
//!
//! Limits: [`MAX_HEADERS`] header lines and [`HEAD_LIMIT`] bytes of head (interim heads
//! included), [`BODY_LIMIT`] bytes of body; past them the answer is refused with
//! [`ClientError::TooLarge`] or [`ClientError::Malformed`].
//!
//! Time: one overall deadline per request, `timeout` after the call that starts it
//! ([`send`] or [`Held::prepare`]); connect, each write and each read are given what is left
//! of it, so no single slow step can stretch the total.

use std::io::{self, Read, Write};
use std::net::{Ipv6Addr, SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Most header lines accepted in one answer head (interim or final).
pub const MAX_HEADERS: usize = 64;
/// Most bytes accepted for the answer head, interim `1xx` heads included: 64 KiB.
pub const HEAD_LIMIT: usize = 64 * 1024;
/// Most bytes accepted for the decoded answer body: 8 MiB.
pub const BODY_LIMIT: usize = 8 * 1024 * 1024;
/// Longest chunk-size line or trailer line accepted in a chunked body, in bytes.
const LINE_LIMIT: usize = 8 * 1024;

/// One request to send.
///
/// `url` is `http://host[:port][/path][?query]`: `host` is a name, an IPv4 literal or a
/// bracketed IPv6 literal (`[::1]`); the port defaults to 80; the path defaults to `/`; a
/// `#fragment` is dropped. `headers` are sent in order after the client's own `Host`,
/// `Content-Length` and `Connection: close`, which the caller may not set (see
/// [`ClientError::Header`]). `body` is sent as is, framed by `Content-Length`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HttpRequest {
    /// The method token, case-sensitive as HTTP says (`GET`, `POST`, …).
    pub method: String,
    /// `http://host[:port][/path][?query]`.
    pub url: String,
    /// Extra header lines as `(name, value)`, sent in this order.
    pub headers: Vec<(String, String)>,
    /// The body bytes; empty for none.
    pub body: Vec<u8>,
}

impl HttpRequest {
    /// A request with no extra headers and no body.
    pub fn new(method: impl Into<String>, url: impl Into<String>) -> Self {
        HttpRequest {
            method: method.into(),
            url: url.into(),
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    /// This request with one more header line appended.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// This request with `body` as its body.
    pub fn with_body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }
}

/// The final answer to a request (interim `1xx` answers are skipped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpAnswer {
    /// The status code, 200–599 in practice (any three-digit code `httparse` accepts).
    pub status: u16,
    /// Header lines in the order received, names spelled as received, values decoded as
    /// UTF-8 lossily.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked when it was chunked; empty for `HEAD`, `204` and `304`.
    pub body: Vec<u8>,
}

impl HttpAnswer {
    /// The value of the first header named `name` (ASCII case-insensitive), if any.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// How many header lines are named `name` (ASCII case-insensitive).
    pub fn header_count(&self, name: &str) -> usize {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .count()
    }

    /// The body as text, invalid UTF-8 replaced by U+FFFD.
    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Why a request got no answer.
///
/// [`ClientError::is_transport`] splits these in two: the connection failed (the request
/// may or may not have reached the server) or the request or answer itself was unacceptable.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The URL cannot be used: not `http://`, no host, a bad port, characters that need
    /// percent-encoding. Nothing was sent.
    #[error("unusable URL {url:?}: {reason}")]
    Url {
        /// The URL as given, password hidden ([`crate::store::url::redact`]).
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The method is not an HTTP token. Nothing was sent.
    #[error("unusable method {method:?}: not an HTTP token")]
    Method {
        /// The method as given.
        method: String,
    },
    /// A caller's header cannot be sent: the client's own (`Host`, `Content-Length`,
    /// `Connection`, `Transfer-Encoding`), a name that is not a token, or a value with CR, LF
    /// or another control character. Nothing was sent.
    #[error("header {name:?} refused: {reason}")]
    Header {
        /// The header name as given.
        name: String,
        /// Why it was refused.
        reason: String,
    },
    /// No connection could be made to any address of the host (refused, unreachable, the
    /// name did not resolve).
    #[error("could not connect to {addr}: {source}")]
    Connect {
        /// `host:port` as taken from the URL.
        addr: String,
        /// The last error seen.
        source: io::Error,
    },
    /// Writing the request failed after the connection was made.
    #[error("writing the request to {addr} failed: {source}")]
    Write {
        /// `host:port` as taken from the URL.
        addr: String,
        /// The error from the socket.
        source: io::Error,
    },
    /// Reading the answer failed (reset, …).
    #[error("reading the answer from {addr} failed: {source}")]
    Read {
        /// `host:port` as taken from the URL.
        addr: String,
        /// The error from the socket.
        source: io::Error,
    },
    /// The overall deadline passed during `what`.
    #[error("{what} timed out after {after_ms} ms")]
    Timeout {
        /// `"connect"`, `"write request"` or `"read answer"`.
        what: &'static str,
        /// Milliseconds since the request was started ([`send`] or [`Held::prepare`]).
        after_ms: u64,
    },
    /// The server closed the connection before the answer was complete.
    #[error("the server closed the connection {during}")]
    Closed {
        /// Where in the answer, e.g. `"before the answer head was complete"`.
        during: &'static str,
    },
    /// The answer is not well-formed HTTP/1.x.
    #[error("malformed answer: {reason}")]
    Malformed {
        /// What is wrong with it.
        reason: String,
    },
    /// The answer is larger than the client accepts.
    #[error("{what} exceeds the limit of {limit} bytes")]
    TooLarge {
        /// `"answer head"`, `"answer body"` or `"chunked trailers"`.
        what: &'static str,
        /// The limit in bytes ([`HEAD_LIMIT`] or [`BODY_LIMIT`]).
        limit: usize,
    },
}

impl ClientError {
    /// True for connection failures: connect, write, read, timeout, closed early. The request
    /// may or may not have reached the server, and a retry (with the same idempotency key)
    /// may be safe. False for a bad URL, method or header (nothing was sent) and for a
    /// malformed or too-large answer (the server answered; retrying would get the same).
    pub fn is_transport(&self) -> bool {
        matches!(
            self,
            ClientError::Connect { .. }
                | ClientError::Write { .. }
                | ClientError::Read { .. }
                | ClientError::Timeout { .. }
                | ClientError::Closed { .. }
        )
    }
}

/// Sends `req` whole and reads the final answer; `timeout` bounds everything from connect
/// to the last body byte.
///
/// # Errors
/// [`ClientError::Url`], [`ClientError::Method`] or [`ClientError::Header`] before anything
/// is sent; transport errors ([`ClientError::is_transport`]) from the connection;
/// [`ClientError::Malformed`] or [`ClientError::TooLarge`] for an unacceptable answer.
pub fn send(req: &HttpRequest, timeout: Duration) -> Result<HttpAnswer, ClientError> {
    let clock = Clock::start(timeout);
    let (target, bytes) = encode(req)?;
    let mut stream = connect(&target, &clock)?;
    write_by(&mut stream, &bytes, &clock, &target.addr)?;
    read_answer(&mut stream, &clock, &target.addr, req.method == "HEAD")
}

/// A request connected and written except for its last byte, waiting for [`Held::release`].
///
/// The server has received (or will receive, as the network delivers it) every byte but the
/// last, so it cannot have a complete request yet: the last body byte when there is a body,
/// else the final `\n` of the head.
#[derive(Debug)]
pub struct Held {
    stream: TcpStream,
    /// The byte(s) not yet sent; one in practice.
    tail: Vec<u8>,
    /// The deadline set by [`Held::prepare`].
    clock: Clock,
    addr: String,
    head: bool,
}

impl Held {
    /// Connects and writes every byte of `req` but the last, then flushes (the socket has
    /// `TCP_NODELAY`, so the bytes leave now). `timeout` is the overall deadline, counted
    /// from this call, for the prepare **and** the later [`Held::release`] with its answer.
    ///
    /// # Errors
    /// As [`send`], minus the answer errors: nothing is read here.
    pub fn prepare(req: &HttpRequest, timeout: Duration) -> Result<Held, ClientError> {
        let clock = Clock::start(timeout);
        let (target, mut bytes) = encode(req)?;
        // The encoding always ends with at least "\r\n\r\n", so there is a last byte.
        let tail = bytes.split_off(bytes.len() - 1);
        let mut stream = connect(&target, &clock)?;
        write_by(&mut stream, &bytes, &clock, &target.addr)?;
        stream.flush().map_err(|source| ClientError::Write {
            addr: target.addr.clone(),
            source,
        })?;
        Ok(Held {
            stream,
            tail,
            clock,
            addr: target.addr,
            head: req.method == "HEAD",
        })
    }

    /// Writes the held-back byte, then reads the final answer, within the deadline set by
    /// [`Held::prepare`].
    ///
    /// # Errors
    /// Transport errors ([`ClientError::is_transport`]), [`ClientError::Malformed`],
    /// [`ClientError::TooLarge`].
    pub fn release(mut self) -> Result<HttpAnswer, ClientError> {
        write_by(&mut self.stream, &self.tail, &self.clock, &self.addr)?;
        read_answer(&mut self.stream, &self.clock, &self.addr, self.head)
    }
}

/// The overall deadline of one request.
#[derive(Debug, Clone, Copy)]
struct Clock {
    started: Instant,
    deadline: Instant,
}

impl Clock {
    fn start(timeout: Duration) -> Self {
        let started = Instant::now();
        Clock {
            started,
            deadline: started + timeout,
        }
    }

    /// What is left of the deadline, or the timeout error for `what` when nothing is.
    fn remaining(&self, what: &'static str) -> Result<Duration, ClientError> {
        match self.deadline.checked_duration_since(Instant::now()) {
            Some(left) if !left.is_zero() => Ok(left),
            _ => Err(self.timeout(what)),
        }
    }

    fn timeout(&self, what: &'static str) -> ClientError {
        ClientError::Timeout {
            what,
            after_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
        }
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Where to connect and what to put in the request line and `Host`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    /// A name to resolve, or an IP literal.
    host: Host,
    port: u16,
    /// `host:port` for error messages (IPv6 in brackets).
    addr: String,
    /// The `Host` header value: the host as written, `:port` unless it is 80.
    host_header: String,
    /// Path and query, at least `/`.
    request_target: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Host {
    Name(String),
    V6(Ipv6Addr),
}

fn parse_url(url: &str) -> Result<Target, ClientError> {
    let bad = |reason: &str| ClientError::Url {
        url: crate::store::url::redact(url),
        reason: reason.to_string(),
    };
    if url.bytes().any(|b| b <= b' ' || b >= 0x7f) {
        return Err(bad(
            "contains a space, a control or a non-ASCII character (percent-encode it)",
        ));
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(bad("no scheme; expected http://host[:port][/path][?query]"));
    };
    if scheme.eq_ignore_ascii_case("https") {
        return Err(bad(
            "https is not supported: this client speaks plain HTTP/1.1",
        ));
    }
    if !scheme.eq_ignore_ascii_case("http") {
        return Err(bad("only http:// URLs are supported"));
    }
    let rest = rest.split('#').next().unwrap_or("");
    let split = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(split);
    if authority.contains('@') {
        return Err(bad("user info (user@host) is not supported"));
    }
    let (host, shown, port) = if let Some(after) = authority.strip_prefix('[') {
        let Some((literal, after)) = after.split_once(']') else {
            return Err(bad("unclosed '[' around an IPv6 literal"));
        };
        let ip: Ipv6Addr = literal
            .parse()
            .map_err(|_| bad("not an IPv6 address inside [...]"))?;
        let port = match after {
            "" => None,
            _ => match after.strip_prefix(':') {
                Some(port) => Some(port),
                None => return Err(bad("unexpected text after ']'")),
            },
        };
        (Host::V6(ip), format!("[{literal}]"), port)
    } else {
        let (name, port) = match authority.split_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (authority, None),
        };
        if name.is_empty() {
            return Err(bad("no host"));
        }
        if !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
        {
            return Err(bad(
                "the host is not a name or an IPv4 literal (IPv6 literals go in brackets)",
            ));
        }
        (Host::Name(name.to_string()), name.to_string(), port)
    };
    let port = match port {
        None => 80,
        Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => match p.parse() {
            Ok(0) | Err(_) => return Err(bad("the port is not in 1..=65535")),
            Ok(port) => port,
        },
        Some(_) => return Err(bad("the port is not a number")),
    };
    let request_target = if tail.is_empty() {
        "/".to_string()
    } else if tail.starts_with('?') {
        format!("/{tail}")
    } else {
        tail.to_string()
    };
    let addr = format!("{shown}:{port}");
    let host_header = if port == 80 { shown } else { addr.clone() };
    Ok(Target {
        host,
        port,
        addr,
        host_header,
        request_target,
    })
}

/// RFC 9110 `tchar`.
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// The header names the client writes itself (or whose meaning would contradict its framing).
const OWN_HEADERS: [&str; 4] = ["host", "content-length", "connection", "transfer-encoding"];

/// Checks that `req` can be sent as given, without sending anything: its URL, method and
/// headers pass the checks [`send`] makes before it connects.
///
/// # Errors
/// [`ClientError::Url`], [`ClientError::Method`] or [`ClientError::Header`], as [`send`]
/// would return them.
pub fn check(req: &HttpRequest) -> Result<(), ClientError> {
    encode(req).map(drop)
}

/// The target and the exact bytes of the request.
fn encode(req: &HttpRequest) -> Result<(Target, Vec<u8>), ClientError> {
    let target = parse_url(&req.url)?;
    if !is_token(&req.method) {
        return Err(ClientError::Method {
            method: req.method.clone(),
        });
    }
    for (name, value) in &req.headers {
        let refuse = |reason: &str| ClientError::Header {
            name: name.clone(),
            reason: reason.to_string(),
        };
        if OWN_HEADERS.iter().any(|own| name.eq_ignore_ascii_case(own)) {
            return Err(refuse(
                "the client sets Host, Content-Length and Connection itself and frames the body \
                 by Content-Length (no Transfer-Encoding)",
            ));
        }
        if !is_token(name) {
            return Err(refuse("the name is not an HTTP token"));
        }
        if value.bytes().any(|b| (b < b' ' && b != b'\t') || b == 0x7f) {
            return Err(refuse(
                "the value holds CR, LF or another control character",
            ));
        }
    }
    let mut head = format!(
        "{} {} HTTP/1.1\r\nHost: {}\r\n",
        req.method, target.request_target, target.host_header
    );
    if !req.body.is_empty() || matches!(req.method.as_str(), "POST" | "PUT" | "PATCH") {
        head.push_str(&format!("Content-Length: {}\r\n", req.body.len()));
    }
    head.push_str("Connection: close\r\n");
    for (name, value) in &req.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(&req.body);
    Ok((target, bytes))
}

/// Connects to the first address of the target that accepts, with `TCP_NODELAY` set.
fn connect(target: &Target, clock: &Clock) -> Result<TcpStream, ClientError> {
    let failed = |source: io::Error| ClientError::Connect {
        addr: target.addr.clone(),
        source,
    };
    let addrs: Vec<SocketAddr> = match &target.host {
        Host::V6(ip) => vec![SocketAddr::from((*ip, target.port))],
        Host::Name(name) => (name.as_str(), target.port)
            .to_socket_addrs()
            .map_err(failed)?
            .collect(),
    };
    let mut last = io::Error::new(io::ErrorKind::NotFound, "the host resolved to no address");
    for addr in addrs {
        let wait = clock.remaining("connect")?;
        match TcpStream::connect_timeout(&addr, wait) {
            Ok(stream) => {
                stream.set_nodelay(true).map_err(failed)?;
                return Ok(stream);
            }
            Err(e) => last = e,
        }
    }
    if is_timeout(&last) {
        return Err(clock.timeout("connect"));
    }
    Err(failed(last))
}

/// Writes all of `bytes`, each write given what is left of the deadline.
fn write_by(
    stream: &mut TcpStream,
    mut bytes: &[u8],
    clock: &Clock,
    addr: &str,
) -> Result<(), ClientError> {
    let failed = |source: io::Error| ClientError::Write {
        addr: addr.to_string(),
        source,
    };
    while !bytes.is_empty() {
        let wait = clock.remaining("write request")?;
        stream.set_write_timeout(Some(wait)).map_err(failed)?;
        match stream.write(bytes) {
            Ok(0) => return Err(failed(io::ErrorKind::WriteZero.into())),
            Ok(n) => bytes = &bytes[n..],
            // As in `Conn::fill`: the deadline check at the top of the loop ends it.
            Err(e) if e.kind() == io::ErrorKind::Interrupted || is_timeout(&e) => {}
            Err(e) => return Err(failed(e)),
        }
    }
    Ok(())
}

/// A byte source whose next read can be bounded in time.
trait Source: Read {
    /// Bounds the next read to `wait` (non-zero).
    fn bound_read(&mut self, wait: Duration) -> io::Result<()>;
}

impl Source for &mut TcpStream {
    fn bound_read(&mut self, wait: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(wait))
    }
}

/// Buffered reading of one answer under the deadline.
struct Conn<'a, S: Source> {
    src: S,
    buf: Vec<u8>,
    /// Bytes of `buf` before `pos` are consumed.
    pos: usize,
    clock: &'a Clock,
    addr: &'a str,
}

impl<S: Source> Conn<'_, S> {
    fn available(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    fn consume(&mut self, n: usize) {
        self.pos += n;
    }

    /// Reads more bytes into the buffer; `Ok(0)` at the end of the stream.
    fn fill(&mut self) -> Result<usize, ClientError> {
        if self.pos > 0 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        let mut chunk = [0u8; 16 * 1024];
        loop {
            let wait = self.clock.remaining("read answer")?;
            self.src
                .bound_read(wait)
                .map_err(|source| ClientError::Read {
                    addr: self.addr.to_string(),
                    source,
                })?;
            match self.src.read(&mut chunk) {
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    return Ok(n);
                }
                // A timed-out read goes round again: `remaining` ends it once the deadline
                // has really passed (a socket timeout may fire a little early).
                Err(e) if e.kind() == io::ErrorKind::Interrupted || is_timeout(&e) => {}
                Err(source) => {
                    return Err(ClientError::Read {
                        addr: self.addr.to_string(),
                        source,
                    })
                }
            }
        }
    }

    /// One line without its `\r\n` (or bare `\n`); at most `max` bytes before the terminator.
    fn read_line(&mut self, max: usize, during: &'static str) -> Result<Vec<u8>, ClientError> {
        loop {
            let avail = self.available();
            if let Some(end) = avail.iter().position(|&b| b == b'\n') {
                let mut line = avail[..end].to_vec();
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                self.consume(end + 1);
                if line.len() > max {
                    break;
                }
                return Ok(line);
            }
            if avail.len() > max + 1 {
                break;
            }
            if self.fill()? == 0 {
                return Err(ClientError::Closed { during });
            }
        }
        Err(ClientError::Malformed {
            reason: format!("a line {during} is longer than {max} bytes"),
        })
    }

    /// Appends exactly `n` more bytes to `out`.
    fn read_exact_to(
        &mut self,
        mut n: usize,
        out: &mut Vec<u8>,
        during: &'static str,
    ) -> Result<(), ClientError> {
        while n > 0 {
            if self.available().is_empty() && self.fill()? == 0 {
                return Err(ClientError::Closed { during });
            }
            let take = n.min(self.available().len());
            out.extend_from_slice(&self.available()[..take]);
            self.consume(take);
            n -= take;
        }
        Ok(())
    }

    /// Everything up to the end of the stream, at most [`BODY_LIMIT`] bytes.
    fn read_to_end(&mut self) -> Result<Vec<u8>, ClientError> {
        let mut body = Vec::new();
        loop {
            body.extend_from_slice(self.available());
            self.consume(self.available().len());
            if body.len() > BODY_LIMIT {
                return Err(ClientError::TooLarge {
                    what: "answer body",
                    limit: BODY_LIMIT,
                });
            }
            if self.fill()? == 0 {
                return Ok(body);
            }
        }
    }

    /// The final answer's status and headers, interim `1xx` answers skipped.
    fn read_head(&mut self) -> Result<(u16, Vec<(String, String)>), ClientError> {
        let mut head_bytes = 0usize;
        loop {
            let parsed = {
                let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
                let mut response = httparse::Response::new(&mut slots);
                match response.parse(self.available()) {
                    Ok(httparse::Status::Complete(len)) => {
                        let status = response.code.unwrap_or_default();
                        let headers = response
                            .headers
                            .iter()
                            .map(|h| {
                                (
                                    h.name.to_string(),
                                    String::from_utf8_lossy(h.value).into_owned(),
                                )
                            })
                            .collect::<Vec<_>>();
                        Some((len, status, headers))
                    }
                    Ok(httparse::Status::Partial) => None,
                    Err(e) => {
                        let first_line = self
                            .available()
                            .split(|&b| b == b'\n')
                            .next()
                            .unwrap_or_default();
                        let shown: String = String::from_utf8_lossy(first_line)
                            .trim_end()
                            .chars()
                            .take(120)
                            .collect();
                        return Err(ClientError::Malformed {
                            reason: format!("answer head: {e} (first line {shown:?})"),
                        });
                    }
                }
            };
            match parsed {
                Some((len, status, headers)) => {
                    head_bytes += len;
                    if head_bytes > HEAD_LIMIT {
                        break;
                    }
                    self.consume(len);
                    match status {
                        101 => {
                            return Err(ClientError::Malformed {
                                reason: "101 Switching Protocols, but no upgrade was asked for"
                                    .to_string(),
                            })
                        }
                        100..=199 => continue,
                        _ => return Ok((status, headers)),
                    }
                }
                None => {
                    if head_bytes + self.available().len() > HEAD_LIMIT {
                        break;
                    }
                    if self.fill()? == 0 {
                        return Err(ClientError::Closed {
                            during: "before the answer head was complete",
                        });
                    }
                }
            }
        }
        Err(ClientError::TooLarge {
            what: "answer head",
            limit: HEAD_LIMIT,
        })
    }

    /// A chunked body, decoded; chunk extensions and trailers are read and ignored.
    fn read_chunked(&mut self) -> Result<Vec<u8>, ClientError> {
        let mut body = Vec::new();
        loop {
            let line = self.read_line(LINE_LIMIT, "in a chunk-size line")?;
            let size = line.split(|&b| b == b';').next().unwrap_or_default();
            let size = std::str::from_utf8(size)
                .unwrap_or("")
                .trim_end_matches([' ', '\t']);
            let malformed = || ClientError::Malformed {
                reason: format!("bad chunk-size line {:?}", String::from_utf8_lossy(&line)),
            };
            if size.is_empty() || !size.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(malformed());
            }
            let size = u64::from_str_radix(size, 16).map_err(|_| malformed())?;
            if size == 0 {
                let mut trailers = 0usize;
                loop {
                    let line = self.read_line(LINE_LIMIT, "in the chunked trailers")?;
                    if line.is_empty() {
                        return Ok(body);
                    }
                    trailers += line.len();
                    if trailers > HEAD_LIMIT {
                        return Err(ClientError::TooLarge {
                            what: "chunked trailers",
                            limit: HEAD_LIMIT,
                        });
                    }
                }
            }
            if size > (BODY_LIMIT - body.len()) as u64 {
                return Err(ClientError::TooLarge {
                    what: "answer body",
                    limit: BODY_LIMIT,
                });
            }
            self.read_exact_to(size as usize, &mut body, "inside a chunk")?;
            if !self.read_line(0, "after a chunk")?.is_empty() {
                return Err(ClientError::Malformed {
                    reason: "chunk data not followed by CRLF".to_string(),
                });
            }
        }
    }
}

/// The single `Content-Length` value of `headers` (repeats must agree), if any.
fn content_length(headers: &[(String, String)]) -> Result<Option<u64>, ClientError> {
    let mut found = None;
    for (_, value) in headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("content-length"))
    {
        for part in value.split(',') {
            let part = part.trim();
            let n = if !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) {
                part.parse::<u64>().ok()
            } else {
                None
            };
            let Some(n) = n else {
                return Err(ClientError::Malformed {
                    reason: format!("bad Content-Length {value:?}"),
                });
            };
            if found.is_some_and(|f| f != n) {
                return Err(ClientError::Malformed {
                    reason: "conflicting Content-Length values".to_string(),
                });
            }
            found = Some(n);
        }
    }
    Ok(found)
}

/// Reads the final answer from `src`. `head_request`: the request was `HEAD` (no body).
fn read_answer<S: Source>(
    src: S,
    clock: &Clock,
    addr: &str,
    head_request: bool,
) -> Result<HttpAnswer, ClientError> {
    let mut conn = Conn {
        src,
        buf: Vec::new(),
        pos: 0,
        clock,
        addr,
    };
    let (status, headers) = conn.read_head()?;
    let body = if head_request || status == 204 || status == 304 {
        Vec::new()
    } else {
        let codings: Vec<String> = headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("transfer-encoding"))
            .flat_map(|(_, v)| v.split(','))
            .map(|c| c.trim().to_ascii_lowercase())
            .filter(|c| !c.is_empty())
            .collect();
        if let Some(last) = codings.last() {
            // RFC 9112 §6.3: Transfer-Encoding overrides Content-Length; a response whose
            // final coding is not chunked runs until the connection closes.
            if last == "chunked" {
                conn.read_chunked()?
            } else {
                conn.read_to_end()?
            }
        } else if let Some(len) = content_length(&headers)? {
            if len > BODY_LIMIT as u64 {
                return Err(ClientError::TooLarge {
                    what: "answer body",
                    limit: BODY_LIMIT,
                });
            }
            let mut body = Vec::with_capacity(len as usize);
            conn.read_exact_to(
                len as usize,
                &mut body,
                "before the whole Content-Length body arrived",
            )?;
            body
        } else {
            conn.read_to_end()?
        }
    };
    Ok(HttpAnswer {
        status,
        headers,
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
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
        let bad_size =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhi\r\n0\r\n\r\n";
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
}
