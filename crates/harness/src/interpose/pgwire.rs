//! One client connection relayed to PostgreSQL, frontend/backend protocol v3 (PostgreSQL
//! docs, "Frontend/Backend Protocol", §55.2 message flow and §55.7 message formats).
//!
//! Startup: an `SSLRequest` or `GSSENCRequest` is answered `N` (the relay is loopback, the
//! client goes on in plain text); a `CancelRequest` is forwarded on a fresh connection to the
//! server; the `StartupMessage` and the whole authentication exchange (trust, md5, SCRAM) pass
//! through untouched. The startup packets must come within the startup deadline
//! ([`super::Limits::startup_timeout`]); a length outside 8..=10,000 bytes (PostgreSQL's
//! `MAX_STARTUP_PACKET_LENGTH`) or the deadline passing closes the connection without an
//! answer, and another protocol than 3 is answered `FATAL` `0A000`, as PostgreSQL does, before
//! the server is ever connected.
//!
//! A message over [`super::Limits::max_message`], from either side, is answered to the client
//! with a `FATAL` ErrorResponse (SQLSTATE `54000` program_limit_exceeded) naming the bound, and
//! the connection is closed.
//!
//! After it every frontend message is framed (tag, length) and grouped into steps: a simple
//! `Query` (or a `FunctionCall`) is one step; the extended-query messages (`Parse`, `Bind`,
//! `Describe`, `Execute`, `Close`) are kept until the `Sync`, and the group is one step when it
//! executes something (a group that only parses or describes is forwarded as it is). A
//! `Flush` forwards what is kept at once, unheld. During a run each step is held at the
//! [`Hub`] before it is forwarded; it is complete at the `ReadyForQuery` that answers its
//! `Sync` or `Query`, whose transaction status (`I`, `T`, `E`) the hub records. Before a step
//! is held every earlier reply must be in, so in a run a pipelining client's commands go one
//! at a time.
//!
//! Outside a run the groups pass through: every message is still framed (its 5-byte header)
//! and each `Parse` and `Bind` kept, so that a run beginning mid-stream knows where the next
//! group starts and what it executes; but the groups whole in what the client sent go on in
//! one write, without waiting for replies, and the server's messages of one read go back in
//! one write. A run that begins while replies are owed holds the next step once they are in.
//!
//! A step released with a cut ([`super::Action`]): cut before, the step's messages are never
//! written to the server and the connection is closed on both sides; cut after, the step is
//! forwarded, every reply message up to its `ReadyForQuery` is read from the server and
//! withheld, and only then is the client's connection closed (the server finished the step,
//! a `COMMIT` committed, before the client can see anything).

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Instant;

use super::hub::{clip, Action, Hub, StoreKind};
use super::spin::{self, Gate, Polled};
use super::{Ending, Limits, Owed};

const SSL_REQUEST: u32 = 80_877_103;
const GSSENC_REQUEST: u32 = 80_877_104;
const CANCEL_REQUEST: u32 = 80_877_102;
/// The longest startup packet accepted (PostgreSQL's own limit is 10,000 bytes).
const MAX_STARTUP: usize = 10_000;

/// Reads framed messages from a stream through a buffer.
pub(crate) struct Frames<R> {
    inner: R,
    buf: Vec<u8>,
    start: usize,
    max: usize,
}

impl<R: Read> Frames<R> {
    pub(crate) fn new(inner: R, max: usize) -> Self {
        Frames {
            inner,
            buf: Vec::with_capacity(16 * 1024),
            start: 0,
            max,
        }
    }

    /// Makes at least `n` bytes available from `start`; `false` at a clean end of stream.
    fn fill(&mut self, n: usize) -> io::Result<bool> {
        while self.buf.len() - self.start < n {
            if self.start > 0 {
                self.buf.drain(..self.start);
                self.start = 0;
            }
            let mut chunk = [0u8; 16 * 1024];
            let got = self.inner.read(&mut chunk)?;
            if got == 0 {
                if self.buf.len() == self.start {
                    return Ok(false);
                }
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed inside a message",
                ));
            }
            self.buf.extend_from_slice(&chunk[..got]);
        }
        Ok(true)
    }

    /// Whether a whole tagged message is already buffered.
    fn has_message(&self) -> bool {
        let b = &self.buf[self.start..];
        b.len() >= 5 && {
            let len = u32::from_be_bytes([b[1], b[2], b[3], b[4]]) as usize;
            b.len() > len
        }
    }

    /// Bytes read past the last message returned.
    pub(crate) fn buffered(&self) -> usize {
        self.buf.len().saturating_sub(self.start)
    }

    /// The next tagged message, as its raw bytes (tag, length, body); `None` at end of stream.
    #[cfg(test)]
    pub(crate) fn next_tagged(&mut self) -> io::Result<Option<Vec<u8>>> {
        let mut raw = Vec::new();
        Ok(self.next_into(&mut raw)?.map(|_| raw))
    }

    /// Appends the next tagged message (tag, length, body) to `out`, reading only when it is
    /// not all buffered; returns where it starts in `out`, `None` at end of stream.
    ///
    /// Will return `Err` on the stream's error, an end of stream inside a message, or a
    /// length under 4 or over the bound ([`LengthError`]).
    pub(crate) fn next_into(&mut self, out: &mut Vec<u8>) -> io::Result<Option<usize>> {
        if !self.fill(5)? {
            return Ok(None);
        }
        let b = &self.buf[self.start..];
        let len = u32::from_be_bytes([b[1], b[2], b[3], b[4]]) as usize;
        if !(4..=self.max).contains(&len) {
            return Err(too_big(len, 4, self.max));
        }
        if !self.fill(1 + len)? {
            return Ok(None);
        }
        let at = out.len();
        out.extend_from_slice(&self.buf[self.start..self.start + 1 + len]);
        self.start += 1 + len;
        Ok(Some(at))
    }

    /// The next untagged startup packet (length, body); `None` at end of stream.
    fn next_startup(&mut self) -> io::Result<Option<Vec<u8>>> {
        if !self.fill(4)? {
            return Ok(None);
        }
        let b = &self.buf[self.start..];
        let len = u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
        if !(8..=MAX_STARTUP).contains(&len) {
            return Err(too_big(len, 8, MAX_STARTUP));
        }
        if !self.fill(len)? {
            return Ok(None);
        }
        let raw = self.buf[self.start..self.start + len].to_vec();
        self.start += len;
        Ok(Some(raw))
    }
}

/// A message length the relay does not take.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LengthError {
    /// Over the bound ([`Limits::max_message`], or PostgreSQL's 10,000 bytes for a startup
    /// packet).
    #[error("message of {len} bytes is over the interposer's bound of {}", super::bound_text(*.max))]
    TooBig {
        /// The message's length field, bytes.
        len: usize,
        /// The bound, bytes.
        max: usize,
    },
    /// Under the smallest a message can be (4, or 8 for a startup packet).
    #[error("invalid message length {len}")]
    TooSmall {
        /// The message's length field, bytes.
        len: usize,
    },
}

fn too_big(len: usize, min: usize, max: usize) -> io::Error {
    let e = if len < min {
        LengthError::TooSmall { len }
    } else {
        LengthError::TooBig { len, max }
    };
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// The length error inside `e`, if that is what it is.
fn length_error(e: &io::Error) -> Option<&LengthError> {
    e.get_ref().and_then(|x| x.downcast_ref::<LengthError>())
}

/// An `ErrorResponse` of severity `FATAL` (PostgreSQL docs §55.7, §55.8 fields `S`, `V`,
/// `C`, `M`) with SQLSTATE `code`.
fn fatal(code: &str, message: &str) -> Vec<u8> {
    let mut body = Vec::new();
    for (field, value) in [
        (b'S', "FATAL"),
        (b'V', "FATAL"),
        (b'C', code),
        (b'M', message),
    ] {
        body.push(field);
        body.extend_from_slice(value.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut msg = vec![b'E'];
    msg.extend_from_slice(
        &u32::try_from(body.len() + 4)
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    msg.extend_from_slice(&body);
    msg
}

/// The client's stream during startup: reads time out at one deadline for the whole startup
/// ([`Limits::startup_timeout`]), not per read, so a client that sends a byte at a time gets
/// no more time; `until` `None` after it, when reads may busy-poll through `gate`
/// ([`super::spin`]).
pub(crate) struct Deadlined<'a> {
    stream: TcpStream,
    until: Option<Instant>,
    gate: Option<Gate<'a>>,
}

impl Deadlined<'_> {
    /// Ends the deadline: reads wait as long as the client takes.
    fn started(&mut self) -> io::Result<()> {
        self.until = None;
        self.stream.set_read_timeout(None)
    }
}

impl Read for Deadlined<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Some(until) = self.until else {
            return spin::read(&self.stream, buf, self.gate.as_ref());
        };
        let passed = || io::Error::new(io::ErrorKind::TimedOut, "startup deadline passed");
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(passed());
        }
        self.stream.set_read_timeout(Some(left))?;
        self.stream.read(buf).map_err(|e| {
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) {
                passed()
            } else {
                e
            }
        })
    }
}

/// A NUL-terminated string at `*at` in `b`, advancing `*at` past the NUL.
fn cstr(b: &[u8], at: &mut usize) -> String {
    let rest = b.get(*at..).unwrap_or(&[]);
    let end = rest.iter().position(|&c| c == 0).unwrap_or(rest.len());
    let s = String::from_utf8_lossy(&rest[..end]).into_owned();
    *at += end + 1;
    s
}

fn be16(b: &[u8], at: &mut usize) -> Option<i16> {
    let v = b.get(*at..*at + 2)?;
    *at += 2;
    Some(i16::from_be_bytes([v[0], v[1]]))
}

fn be32(b: &[u8], at: &mut usize) -> Option<i32> {
    let v = b.get(*at..*at + 4)?;
    *at += 4;
    Some(i32::from_be_bytes([v[0], v[1], v[2], v[3]]))
}

/// The parameter types of a session's prepared statements, by statement name: from each
/// `Parse` (the types the client gave) and, for a statement the client described, from the
/// server's `ParameterDescription` (the types the server inferred), so binary-format values
/// can be shown as text. Shared by the session's two directions: the client cannot send a
/// `Bind` that depends on a description before it has read it, and the server's messages are
/// read (and recorded) before they are passed on.
#[derive(Default)]
struct ParamTypes {
    /// Statement name → parameter type OIDs (0: unspecified).
    by_statement: std::sync::Mutex<HashMap<String, Vec<u32>>>,
    /// Statements described (`Describe` of kind `S`) whose `ParameterDescription` is due, in
    /// order, each with the number of its Sync group (Syncs, Queries and FunctionCalls
    /// forwarded before it): a Describe the server skipped after an error in its group is
    /// dropped once a later group answers.
    described: std::sync::Mutex<std::collections::VecDeque<(u64, String)>>,
    /// Sync groups forwarded (each answered by one ReadyForQuery).
    groups: std::sync::Mutex<u64>,
}

impl ParamTypes {
    fn parsed(&self, name: &str, body: &[u8], at: usize) {
        let mut at = at;
        let n = be16(body, &mut at)
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(0);
        let oids: Vec<u32> = (0..n)
            .map_while(|_| be32(body, &mut at).map(|v| v as u32))
            .collect();
        lock(&self.by_statement).insert(name.to_string(), oids);
    }

    fn describing(&self, name: &str) {
        // Group 1 is the first one the client sends: the ReadyForQuery that ends the startup
        // answers no group of its own, so counting ReadyForQuery messages gives the group
        // being answered.
        let group = *lock(&self.groups) + 1;
        lock(&self.described).push_back((group, name.to_string()));
    }

    /// A Sync, Query or FunctionCall was forwarded: later messages are in the next group.
    fn group_sent(&self) {
        *lock(&self.groups) += 1;
    }

    /// A `ParameterDescription` body, in Sync group `group` (ReadyForQuery messages seen
    /// before it): the types of the first statement described in that group.
    fn description(&self, body: &[u8], group: u64) {
        let name = {
            let mut d = lock(&self.described);
            while d.front().is_some_and(|(g, _)| *g < group) {
                d.pop_front();
            }
            match d.front() {
                Some((g, _)) if *g == group => d.pop_front().map(|(_, n)| n),
                _ => None,
            }
        };
        let Some(name) = name else {
            return;
        };
        let mut at = 0;
        let n = be16(body, &mut at)
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(0);
        let oids: Vec<u32> = (0..n)
            .map_while(|_| be32(body, &mut at).map(|v| v as u32))
            .collect();
        lock(&self.by_statement).insert(name, oids);
    }

    fn of(&self, statement: &str) -> Vec<u32> {
        lock(&self.by_statement)
            .get(statement)
            .cloned()
            .unwrap_or_default()
    }
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A binary-format value of type `oid` as PostgreSQL's text output would show it, for the
/// types whose binary form is fixed (PostgreSQL's `*send` functions: bool, int2, int4, int8,
/// oid, float4, float8, uuid, date, timestamp, timestamptz, jsonb); `None` for any other type
/// or a value of the wrong length.
fn binary_as_text(oid: u32, v: &[u8]) -> Option<String> {
    // Microseconds (timestamps) and days (dates) count from 2000-01-01.
    let epoch = chrono::NaiveDate::from_ymd_opt(2000, 1, 1)?;
    Some(match (oid, v.len()) {
        (16, 1) => (if v[0] != 0 { "true" } else { "false" }).to_string(),
        (21, 2) => i16::from_be_bytes(v.try_into().ok()?).to_string(),
        (23, 4) => i32::from_be_bytes(v.try_into().ok()?).to_string(),
        (26, 4) => u32::from_be_bytes(v.try_into().ok()?).to_string(),
        (20, 8) => i64::from_be_bytes(v.try_into().ok()?).to_string(),
        (700, 4) => f32::from_be_bytes(v.try_into().ok()?).to_string(),
        (701, 8) => f64::from_be_bytes(v.try_into().ok()?).to_string(),
        (2950, 16) => uuid::Uuid::from_slice(v).ok()?.to_string(),
        (1082, 4) => {
            let days = i32::from_be_bytes(v.try_into().ok()?);
            epoch
                .checked_add_signed(chrono::Duration::days(i64::from(days)))?
                .to_string()
        }
        (1114 | 1184, 8) => {
            let us = i64::from_be_bytes(v.try_into().ok()?);
            let t = epoch.and_hms_opt(0, 0, 0)? + chrono::Duration::microseconds(us);
            let text = t.format("%Y-%m-%d %H:%M:%S%.6f").to_string();
            if oid == 1184 {
                format!("{text}+00")
            } else {
                text
            }
        }
        (3802, n) if n >= 1 && v[0] == 1 => String::from_utf8(v[1..].to_vec()).ok()?,
        _ => return None,
    })
}

/// A `Bind` body: `(portal, statement, parameters rendered)`; `None` when malformed.
#[cfg(test)]
fn parse_bind(body: &[u8]) -> Option<(String, String, Vec<String>)> {
    parse_bind_typed(body, &|_| Vec::new())
}

/// [`parse_bind`] with the statement's parameter types (`types_of(statement)`), so a
/// binary-format value of a type [`binary_as_text`] knows is shown as its text.
fn parse_bind_typed(
    body: &[u8],
    types_of: &dyn Fn(&str) -> Vec<u32>,
) -> Option<(String, String, Vec<String>)> {
    let mut at = 0;
    let portal = cstr(body, &mut at);
    let statement = cstr(body, &mut at);
    let nfmt = usize::try_from(be16(body, &mut at)?).ok()?;
    let mut formats = Vec::with_capacity(nfmt);
    for _ in 0..nfmt {
        formats.push(be16(body, &mut at)?);
    }
    let nparams = usize::try_from(be16(body, &mut at)?).ok()?;
    let types = types_of(&statement);
    let mut params = Vec::with_capacity(nparams);
    for i in 0..nparams {
        let len = be32(body, &mut at)?;
        let binary = match formats.len() {
            0 => false,
            1 => formats[0] == 1,
            _ => formats.get(i).copied() == Some(1),
        };
        if len < 0 {
            params.push("NULL".to_string());
            continue;
        }
        let v = body.get(at..at + usize::try_from(len).ok()?)?;
        at += v.len();
        // Binary values that are printable text (a text or varchar sent in binary format)
        // are shown as text; anything else in hex.
        let printable = |s: &str| !s.is_empty() && !s.chars().any(char::is_control);
        let typed = types
            .get(i)
            .filter(|_| binary)
            .and_then(|&oid| binary_as_text(oid, v));
        params.push(match (binary, std::str::from_utf8(v)) {
            _ if typed.is_some() => clip(&typed.unwrap_or_default()),
            (false, Ok(s)) => clip(s),
            (true, Ok(s)) if printable(s) => clip(s),
            // At most 64 bytes, marked when cut (a cut value cannot be replayed).
            _ => format!(
                "\\x{}{}",
                v.iter()
                    .take(64)
                    .map(|b| format!("{b:02x}"))
                    .collect::<String>(),
                if v.len() > 64 { "…" } else { "" }
            ),
        });
    }
    Some((portal, statement, params))
}

/// The SQLSTATE and message of an `ErrorResponse` body: `"23505 duplicate key …"`.
fn parse_error(body: &[u8]) -> String {
    let (mut code, mut message) = (String::new(), String::new());
    let mut at = 0;
    while let Some(&field) = body.get(at) {
        if field == 0 {
            break;
        }
        at += 1;
        let v = cstr(body, &mut at);
        match field {
            b'C' => code = v,
            b'M' => message = v,
            _ => {}
        }
    }
    clip(&format!("{code} {message}"))
}

/// What a client's startup came to.
enum Startup {
    /// A `StartupMessage` of protocol 3 (any minor version: the server negotiates it).
    Message(Vec<u8>),
    /// A `CancelRequest`.
    Cancel(Vec<u8>),
    /// Nothing to relay: the client closed, or was answered and closed.
    Closed,
}

/// Reads a client's startup packets within its deadline: `SSLRequest` and `GSSENCRequest` are
/// answered `N`; a packet of another protocol than 3 is answered as PostgreSQL answers it
/// (`FATAL` `0A000` unsupported frontend protocol) and closed. A length outside 8..=10,000
/// (PostgreSQL's `MAX_STARTUP_PACKET_LENGTH`) and the deadline passing close the connection
/// without an answer, as PostgreSQL closes it (it only logs them).
fn startup(from_client: &mut Frames<Deadlined>, to_client: &TcpStream, limits: &Limits) -> Startup {
    loop {
        let packet = match from_client.next_startup() {
            Ok(Some(p)) => p,
            Ok(None) => return Startup::Closed,
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                tracing::warn!(
                    timeout_ms = limits.startup_timeout.as_millis() as u64,
                    "interposer: no PostgreSQL startup packet within the deadline; closed"
                );
                return Startup::Closed;
            }
            Err(e) => {
                tracing::warn!(error = %e, "interposer: invalid PostgreSQL startup packet; closed");
                return Startup::Closed;
            }
        };
        let code = u32::from_be_bytes([packet[4], packet[5], packet[6], packet[7]]);
        match code {
            SSL_REQUEST | GSSENC_REQUEST => {
                let mut c = to_client;
                if c.write_all(b"N").is_err() {
                    return Startup::Closed;
                }
            }
            CANCEL_REQUEST => return Startup::Cancel(packet),
            _ if code >> 16 == 3 => return Startup::Message(packet),
            _ => {
                let message = format!(
                    "unsupported frontend protocol {}.{}: the interposer relays protocol 3",
                    code >> 16,
                    code & 0xffff
                );
                tracing::warn!("interposer: {message}; closed");
                super::farewell(to_client, &fatal("0A000", &message));
                return Startup::Closed;
            }
        }
    }
}

/// Forwards a `CancelRequest` on a fresh connection to the server.
///
/// Will return `Err` when the server cannot be reached.
fn forward_cancel(packet: &[u8], upstream: SocketAddr, limits: &Limits) -> io::Result<()> {
    let mut s = TcpStream::connect_timeout(&upstream, limits.connect_timeout)?;
    s.write_all(packet)?;
    let _ = s.shutdown(Shutdown::Write);
    // The server closes a cancel connection once it has read it; bounded, so a server that
    // does not never keeps the client's connection open.
    let _ = s.set_read_timeout(Some(limits.connect_timeout));
    let _ = s.read(&mut [0u8; 1]);
    Ok(())
}

/// A connection over [`Limits::max_connections`]: its startup is read as PostgreSQL reads it
/// (a cancel is still forwarded), then it is answered `FATAL` `53300` too_many_connections,
/// after the packet as PostgreSQL answers, so every client reads it as the server's refusal
/// (libpq: "sorry, too many clients already …").
pub(crate) fn refuse(client: &TcpStream, upstream: SocketAddr, limits: &Limits) {
    let Ok(stream) = client.try_clone() else {
        return;
    };
    let deadlined = Deadlined {
        stream,
        until: Some(Instant::now() + limits.startup_timeout),
        gate: None,
    };
    let mut from_client = Frames::new(deadlined, MAX_STARTUP);
    match startup(&mut from_client, client, limits) {
        Startup::Message(_) => {
            let message = format!(
                "sorry, too many clients already: the interposer's cap of {} connections is reached",
                limits.max_connections
            );
            super::farewell(client, &fatal("53300", &message));
        }
        Startup::Cancel(packet) => {
            let _ = forward_cancel(&packet, upstream, limits);
        }
        Startup::Closed => {}
    }
    let _ = client.shutdown(Shutdown::Both);
}

/// Relays one client connection to the server at `upstream` until either side closes.
///
/// Will return `Err` on an I/O error of either side or a message outside the limits; the
/// connection is then closed (the client sees its server connection drop, after an
/// ErrorResponse naming the bound for a message over [`Limits::max_message`]).
pub(crate) fn relay(
    client: TcpStream,
    upstream: SocketAddr,
    hub: &Arc<Hub>,
    limits: &Limits,
) -> io::Result<()> {
    let owed = Owed::default();
    let deadlined = Deadlined {
        stream: client.try_clone()?,
        until: Some(Instant::now() + limits.startup_timeout),
        gate: None,
    };
    let mut from_client = Frames::new(deadlined, limits.max_message);
    let to_client = client;
    // Startup: answer encryption requests "no", forward a cancel, then the startup message.
    let server = match startup(&mut from_client, &to_client, limits) {
        Startup::Closed => return Ok(()),
        Startup::Cancel(packet) => {
            // Returning ends the relay, and the caller closes the client's connection: the
            // client (libpq, pgx, pgjdbc) waits for that close to finish its cancel.
            return forward_cancel(&packet, upstream, limits);
        }
        Startup::Message(packet) => {
            let mut s = TcpStream::connect_timeout(&upstream, limits.connect_timeout)?;
            s.set_nodelay(true)?;
            s.write_all(&packet)?;
            s
        }
    };
    from_client.inner.started()?;
    let (commands, replies) = Gate::pair(&owed, hub, &to_client, limits);
    from_client.inner.gate = Some(commands);
    let max = limits.max_message;
    let types = ParamTypes::default();
    let types = &types;
    let front = &to_client;
    super::session(
        hub,
        StoreKind::Postgres,
        (&to_client, &server),
        &owed,
        limits.connect_timeout,
        |id, owed, server, client| {
            let server = Polled {
                stream: server,
                gate: Some(replies),
            };
            backend_to_client(server, client, hub, id, owed, max, types)
        },
        |id, owed| {
            let r = frontend_to_server(&mut from_client, &server, hub, id, owed, limits, types);
            if let Err(e) = &r {
                if refuse_message(e, front, owed, "client") {
                    super::linger_closed(front);
                }
            }
            r
        },
    )
}

/// When `e` is a message length the relay does not take, answers the client `FATAL` (SQLSTATE
/// `54000` program_limit_exceeded over the bound, `08P01` protocol_violation under 4 bytes)
/// and logs it; `from` says whose message it was (`client`, `server`). Returns whether it was.
fn refuse_message(e: &io::Error, client: &TcpStream, owed: &Owed, from: &str) -> bool {
    let Some(length) = length_error(e) else {
        return false;
    };
    let code = match length {
        LengthError::TooBig { .. } => "54000",
        LengthError::TooSmall { .. } => "08P01",
    };
    let message = format!("{from} {length}; connection closed");
    tracing::warn!("interposer: PostgreSQL {message}");
    let _ = owed.send(client, &fatal(code, &message));
    true
}

/// The most `CommandComplete` tags kept for one `ReadyForQuery`: 32, more than a step's
/// result shows ([`super::hub::RESULT_LIMIT`] characters). A pipeline of a million statements
/// and one Sync would otherwise keep a million tags until its Sync.
const MAX_TAGS: usize = 32;

/// Keeps `tag` among `tags`, up to [`MAX_TAGS`]; past that one `…` stands for the rest.
fn keep_tag(tags: &mut Vec<String>, tag: String) {
    match tags.len() {
        n if n < MAX_TAGS => tags.push(tag),
        MAX_TAGS => tags.push("…".into()),
        _ => {}
    }
}

/// A `ReadyForQuery` passed on to the client's buffer and not yet paid: its transaction
/// status, the error and the `CommandComplete` tags of the replies it ends.
type Ready = (Option<char>, Option<String>, Vec<String>);

/// The server's messages to the client, watched for BackendKeyData, CommandComplete (its tags
/// are the step's result: `INSERT 0 1`), EmptyQueryResponse, ErrorResponse and ReadyForQuery.
/// The messages one read brings go on in one write (a pipeline's replies stay together, at
/// most 64 KiB a write); each `ReadyForQuery` among them is paid after that write, so a step
/// counts as complete once the client has its reply.
fn backend_to_client(
    server: Polled<'_>,
    client: TcpStream,
    hub: &Hub,
    id: u64,
    owed: &Owed,
    max: usize,
    types: &ParamTypes,
) -> io::Result<()> {
    let mut frames = Frames::new(server, max);
    let mut out: Vec<u8> = Vec::with_capacity(16 * 1024);
    let mut due: Vec<Ready> = Vec::new();
    let mut error: Option<String> = None;
    let mut tags: Vec<String> = Vec::new();
    // ReadyForQuery messages seen: the startup's, then one per Sync group.
    let mut ready_seen: u64 = 0;
    let pay = |(status, error, tags): Ready| {
        owed.pay(|| hub.done(id, status, error, Some(tags.join("; "))));
    };
    let send = |out: &mut Vec<u8>, due: &mut Vec<Ready>| -> io::Result<()> {
        owed.send(&client, out)?;
        out.clear();
        due.drain(..).for_each(pay);
        Ok(())
    };
    loop {
        if !frames.has_message() {
            // Everything read so far goes on before the next read waits.
            send(&mut out, &mut due)?;
        }
        let at = match frames.next_into(&mut out) {
            Ok(Some(at)) => at,
            Ok(None) => {
                send(&mut out, &mut due)?;
                return Ok(());
            }
            Err(e) => {
                // What came whole before it goes on; then the client is told why the
                // connection ends.
                if length_error(&e).is_some()
                    && send(&mut out, &mut due).is_ok()
                    && refuse_message(&e, &client, owed, "server")
                {
                    owed.wait_front(Instant::now() + super::ERROR_GRACE);
                }
                return Err(e);
            }
        };
        let (tag, body) = (out[at], &out[at + 5..]);
        let status = body.first().map(|&b| b as char);
        match tag {
            b'K' => {
                let mut at = 0;
                if let Some(pid) = be32(body, &mut at) {
                    hub.set_backend_pid(id, pid);
                }
            }
            b'E' => error = Some(parse_error(body)),
            b'C' => keep_tag(&mut tags, cstr(body, &mut 0)),
            b't' => types.description(body, ready_seen),
            b'I' => keep_tag(&mut tags, "EMPTY QUERY".into()),
            _ => {}
        }
        if hub.withholds_reply(id) {
            // A cut after the server: nothing of this step's reply reaches the client (what
            // came before it goes on). At its ReadyForQuery the server has finished the step;
            // the client's connection is closed first, then the step counts as complete, so
            // the conductor never sees it complete while the client could still get the
            // reply.
            out.truncate(at);
            send(&mut out, &mut due)?;
            if tag == b'Z' {
                let _ = client.shutdown(Shutdown::Both);
                pay((status, error.take(), std::mem::take(&mut tags)));
                return Ok(());
            }
            continue;
        }
        if tag == b'Z' {
            ready_seen += 1;
            due.push((status, error.take(), std::mem::take(&mut tags)));
        }
        if out.len() >= 64 * 1024 {
            send(&mut out, &mut due)?;
        }
    }
}

/// The most of a group (Parse, Bind, Execute … up to its Sync) the relay keeps outside a run
/// before it forwards it unfinished: 1 MiB.
const GROUP_KEPT: usize = 1 << 20;

/// A `Bind` as the relay keeps it: the statement's text and parameter types when it was
/// bound, and its raw body, decoded ([`parse_bind_typed`]) only when an `Execute` of it is in
/// a step.
struct Bound {
    text: Arc<str>,
    types: Vec<u32>,
    body: Vec<u8>,
}

impl Bound {
    /// Its statement's text and its parameters shown as text.
    fn shown(&self) -> (String, Vec<String>) {
        let params = parse_bind_typed(&self.body, &|_| self.types.clone())
            .map(|(_, _, params)| params)
            .unwrap_or_default();
        (self.text.to_string(), params)
    }
}

/// The client's messages to the server, grouped into steps held at the hub.
///
/// Every message is framed (5 header bytes) and kept until its group ends (a `Query`,
/// `FunctionCall` or `Sync`; a `Flush`, `Terminate`, password or COPY message goes on by
/// itself). What a run needs when it begins is kept outside a run too: each `Parse`'s
/// statement, and each `Bind` raw. During a run a group that executes something is a step,
/// held at the hub once every earlier reply is in ([`Owed::hold_next`]) and forwarded once
/// released; a group that does not waits for every earlier reply and goes on unheld. Outside
/// a run every group passes through: the groups whole in what the client sent go on in one
/// write, without waiting for replies (a pipeline stays a pipeline).
// Long on purpose: one match over protocol v3's frontend message tags, each arm a few lines.
fn frontend_to_server(
    frames: &mut Frames<Deadlined<'_>>,
    server: &TcpStream,
    hub: &Hub,
    id: u64,
    owed: &Owed,
    limits: &Limits,
    types: &ParamTypes,
) -> io::Result<Ending> {
    let mut statements: HashMap<String, Arc<str>> = HashMap::new();
    let mut portals: HashMap<String, Arc<Bound>> = HashMap::new();
    let mut executed: Vec<Arc<Bound>> = Vec::new();
    // Read from the client and not yet written: `pending[..decided]` goes on at the next
    // write, the rest is the group being read (kept until it ends).
    let mut pending: Vec<u8> = Vec::with_capacity(16 * 1024);
    let mut decided = 0;
    // Syncs counted since the last command (Execute or Query): a server in copy-in mode
    // ignores them (protocol v3, "COPY Operations": it ignores Flush and Sync until CopyDone
    // or CopyFail), so when copy data follows they are forgiven. libpq's PQsendQueryParams
    // and the Rust `postgres` crates send Bind, Execute, Sync, then the data and a Sync.
    let mut syncs_since_command: u64 = 0;
    let write = |pending: &mut Vec<u8>, decided: &mut usize| -> io::Result<()> {
        if *decided > 0 {
            let mut s = server;
            s.write_all(&pending[..*decided])?;
            pending.drain(..*decided);
            *decided = 0;
        }
        Ok(())
    };
    loop {
        if pending.len() - decided > GROUP_KEPT && !hub.running() {
            // A pipeline that sends no Sync for a long while (a driver's pipeline mode):
            // outside a run what is kept of its group goes on, so the relay keeps at most
            // about this much of it, and its Executes can no longer be held.
            decided = pending.len();
            executed.clear();
            write(&mut pending, &mut decided)?;
        }
        if !frames.has_message() {
            // What is decided goes on before the next read waits.
            write(&mut pending, &mut decided)?;
        }
        let Some(at) = frames.next_into(&mut pending)? else {
            write(&mut pending, &mut decided)?;
            return Ok(Ending::Drain);
        };
        let (tag, body) = (pending[at], &pending[at + 5..]);
        // A group ending here that is a step (in a run): its text and parameters.
        let mut step: Option<(String, Vec<String>)> = None;
        match tag {
            b'Q' | b'F' => {
                syncs_since_command = 0;
                if hub.running() {
                    let text = if tag == b'Q' {
                        cstr(body, &mut 0)
                    } else {
                        "function call".to_string()
                    };
                    step = Some((text, Vec::new()));
                }
            }
            b'P' => {
                let mut at = 0;
                let name = cstr(body, &mut at);
                let query = cstr(body, &mut at);
                types.parsed(&name, body, at);
                statements.insert(name, query.into());
                continue;
            }
            b'B' => {
                let mut at = 0;
                let portal = cstr(body, &mut at);
                let statement = cstr(body, &mut at);
                let bound = Bound {
                    text: statements
                        .get(&statement)
                        .cloned()
                        .unwrap_or_else(|| "".into()),
                    types: types.of(&statement),
                    body: body.to_vec(),
                };
                portals.insert(portal, Arc::new(bound));
                continue;
            }
            b'E' => {
                syncs_since_command = 0;
                let portal = cstr(body, &mut 0);
                executed.push(portals.get(&portal).cloned().unwrap_or_else(|| {
                    Arc::new(Bound {
                        text: "".into(),
                        types: Vec::new(),
                        body: Vec::new(),
                    })
                }));
                continue;
            }
            b'D' | b'C' => {
                // A statement described: the server's ParameterDescription names its types.
                if tag == b'D' && body.first() == Some(&b'S') {
                    types.describing(&cstr(body, &mut 1));
                }
                continue;
            }
            b'S' => {
                if hub.running() {
                    if executed.is_empty() {
                        // Unheld, after every earlier reply, so a step's result is its own.
                        write(&mut pending, &mut decided)?;
                        owed.settle_in_run(hub, id);
                    } else {
                        let shown: Vec<(String, Vec<String>)> =
                            executed.iter().map(|b| b.shown()).collect();
                        let text = shown
                            .iter()
                            .map(|(t, _)| t.as_str())
                            .collect::<Vec<_>>()
                            .join("; ");
                        let params = shown.into_iter().flat_map(|(_, p)| p).collect();
                        step = Some((text, params));
                    }
                }
                executed.clear();
            }
            b'H' => {
                // A Flush asks for the replies so far: what is kept goes on now, unheld.
                decided = pending.len();
                write(&mut pending, &mut decided)?;
                executed.clear();
                continue;
            }
            b'X' => {
                decided = pending.len();
                write(&mut pending, &mut decided)?;
                return Ok(Ending::Drain);
            }
            b'd' | b'c' | b'f' => {
                // Copy data, CopyDone, CopyFail: the server is in copy-in mode since the last
                // command, and the Syncs sent after that command get no ReadyForQuery.
                owed.forgive(std::mem::take(&mut syncs_since_command));
                decided = pending.len();
                continue;
            }
            _ => {
                // Password and SASL messages: forwarded as they come.
                decided = pending.len();
                continue;
            }
        }
        // A group ends here (Query, FunctionCall, Sync).
        let in_run = step.is_some() || hub.running();
        if let Some((text, params)) = step {
            // Everything before the group goes on first; the group itself was kept whole,
            // so a cut before leaves the server none of it.
            write(&mut pending, &mut decided)?;
            let behind = frames.buffered();
            if owed.hold_next(hub, id, (&text, params), limits.max_hold, behind)
                == Action::CutBefore
            {
                // Closes both sides (`super::session`); the server never sees the step.
                return Ok(Ending::Abrupt);
            }
        }
        owed.add();
        if tag == b'S' {
            syncs_since_command += 1;
        }
        types.group_sent();
        decided = pending.len();
        if in_run {
            // In a run a group goes on as soon as it may, as it did one at a time.
            write(&mut pending, &mut decided)?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_parameters_are_read_in_text_and_binary_and_null() {
        let mut b = Vec::new();
        b.extend_from_slice(b"p1\0s1\0");
        b.extend_from_slice(&2i16.to_be_bytes());
        b.extend_from_slice(&0i16.to_be_bytes());
        b.extend_from_slice(&1i16.to_be_bytes());
        b.extend_from_slice(&3i16.to_be_bytes());
        b.extend_from_slice(&3i32.to_be_bytes());
        b.extend_from_slice(b"abc");
        b.extend_from_slice(&2i32.to_be_bytes());
        b.extend_from_slice(&[0x01, 0xff]);
        b.extend_from_slice(&(-1i32).to_be_bytes());
        let (portal, statement, params) = parse_bind(&b).unwrap();
        assert_eq!((portal.as_str(), statement.as_str()), ("p1", "s1"));
        // Two format codes for three parameters: the third has none (text).
        assert_eq!(params, ["abc", "\\x01ff", "NULL"]);
        assert!(parse_bind(&b[..b.len() - 3]).is_none(), "cut short");
    }

    #[test]
    fn binary_values_of_known_types_are_shown_as_their_text() {
        assert_eq!(binary_as_text(20, &1i64.to_be_bytes()).unwrap(), "1");
        assert_eq!(binary_as_text(23, &(-7i32).to_be_bytes()).unwrap(), "-7");
        assert_eq!(binary_as_text(16, &[1]).unwrap(), "true");
        let id = uuid::Uuid::from_u128(0x004b3a8d_445a_48f9_bf4a_ec0eed4d3e0b);
        assert_eq!(
            binary_as_text(2950, id.as_bytes()).unwrap(),
            "004b3a8d-445a-48f9-bf4a-ec0eed4d3e0b"
        );
        // 2026-12-03 12:52:20.777668 UTC, in microseconds since 2000-01-01.
        let us: i64 = 849_617_540_777_668;
        assert_eq!(
            binary_as_text(1184, &us.to_be_bytes()).unwrap(),
            "2026-12-03 12:52:20.777668+00"
        );
        assert_eq!(
            binary_as_text(1082, &1i32.to_be_bytes()).unwrap(),
            "2000-01-02"
        );
        assert_eq!(binary_as_text(3802, b"\x01{}").unwrap(), "{}");
        // Unknown types and wrong lengths stay undecoded.
        assert_eq!(binary_as_text(17, &[1, 2]), None);
        assert_eq!(binary_as_text(23, &[1, 2]), None);
        // Through a Bind: types from the statement, the value shown as text.
        let mut b = Vec::new();
        b.extend_from_slice(b"\0s1\0");
        b.extend_from_slice(&1i16.to_be_bytes());
        b.extend_from_slice(&1i16.to_be_bytes());
        b.extend_from_slice(&1i16.to_be_bytes());
        b.extend_from_slice(&8i32.to_be_bytes());
        b.extend_from_slice(&42i64.to_be_bytes());
        let (_, _, params) =
            parse_bind_typed(&b, &|s| if s == "s1" { vec![20] } else { vec![] }).unwrap();
        assert_eq!(params, ["42"]);
        let (_, _, params) = parse_bind(&b).unwrap();
        assert_eq!(params, ["\\x000000000000002a"]);
    }

    #[test]
    fn a_description_is_matched_to_its_statement_even_after_a_skipped_describe() {
        let t = ParamTypes::default();
        let desc = |oids: &[u32]| {
            let mut b = (oids.len() as i16).to_be_bytes().to_vec();
            oids.iter()
                .for_each(|o| b.extend_from_slice(&o.to_be_bytes()));
            b
        };
        // Group 1 describes s1 and s2, but its Parse of s1 failed: the server skips both.
        t.describing("s1");
        t.describing("s2");
        t.group_sent();
        // Group 2 describes s3; its description comes after the startup's and group 1's
        // ReadyForQuery.
        t.describing("s3");
        t.group_sent();
        t.description(&desc(&[20]), 2);
        assert_eq!(t.of("s3"), [20]);
        assert!(t.of("s1").is_empty() && t.of("s2").is_empty());
        // In one group, descriptions come in the order of the Describes.
        t.describing("a");
        t.describing("b");
        t.group_sent();
        t.description(&desc(&[23]), 3);
        t.description(&desc(&[2950]), 3);
        assert_eq!((t.of("a"), t.of("b")), (vec![23], vec![2950]));
        // A description nothing waits for changes nothing.
        t.description(&desc(&[16]), 3);
        assert_eq!(t.of("a"), [23]);
    }

    #[test]
    fn an_error_response_gives_its_sqlstate_and_message() {
        let body = b"SERROR\0C23505\0Mduplicate key value\0\0";
        assert_eq!(parse_error(body), "23505 duplicate key value");
        // The interposer's own: framed as the server frames one.
        let own = fatal("54000", "over the bound");
        let len = u32::from_be_bytes([own[1], own[2], own[3], own[4]]) as usize;
        assert_eq!((own[0], len + 1), (b'E', own.len()));
        assert_eq!(parse_error(&own[5..]), "54000 over the bound");
        let e = too_big(70 << 20, 4, 64 << 20);
        assert_eq!(
            e.to_string(),
            "message of 73400320 bytes is over the interposer's bound of 67108864 bytes (64 MiB)"
        );
        assert!(matches!(
            length_error(&too_big(2, 4, 64)),
            Some(LengthError::TooSmall { len: 2 })
        ));
    }

    #[test]
    fn a_reply_keeps_at_most_its_first_tags_and_marks_the_rest() {
        let mut tags = Vec::new();
        for i in 0..1000 {
            keep_tag(&mut tags, format!("INSERT 0 {i}"));
        }
        assert_eq!(tags.len(), MAX_TAGS + 1);
        assert_eq!(tags[0], "INSERT 0 0");
        assert_eq!(tags[MAX_TAGS], "…");
    }

    #[test]
    fn frames_refuse_a_length_outside_the_limit() {
        let mut raw = vec![b'Q'];
        raw.extend_from_slice(&(1_000_000u32).to_be_bytes());
        let mut f = Frames::new(&raw[..], 1000);
        assert_eq!(
            f.next_tagged().unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
        let mut ok = vec![b'S'];
        ok.extend_from_slice(&4u32.to_be_bytes());
        let mut f = Frames::new(&ok[..], 1000);
        assert_eq!(f.next_tagged().unwrap().unwrap(), ok);
        assert!(f.next_tagged().unwrap().is_none());
    }
}
