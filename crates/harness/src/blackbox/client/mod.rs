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

mod answer;
mod request;
#[cfg(test)]
mod tests;

use answer::read_answer;
use request::{connect, encode, write_by};
use std::io::{self, Write};
use std::net::TcpStream;
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
    pub(crate) fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// This request with `body` as its body.
    pub(crate) fn with_body(mut self, body: impl Into<Vec<u8>>) -> Self {
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
    #[cfg(test)]
    pub(crate) fn header_count(&self, name: &str) -> usize {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .count()
    }

    /// The body as text, invalid UTF-8 replaced by U+FFFD.
    pub(crate) fn body_text(&self) -> String {
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
        /// The URL as given, password hidden ([`ticketflow_core::store::url::redact`]).
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

/// Checks that `req` can be sent as given, without sending anything: its URL, method and
/// headers pass the checks [`send`] makes before it connects.
///
/// # Errors
/// [`ClientError::Url`], [`ClientError::Method`] or [`ClientError::Header`], as [`send`]
/// would return them.
pub fn check(req: &HttpRequest) -> Result<(), ClientError> {
    encode(req).map(drop)
}
