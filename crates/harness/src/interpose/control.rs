//! The control protocol a runner conducts a long-lived interposer over (the one
//! `ticketflow interpose` starts for a service its user runs: docker compose, an IDE, any
//! process that reaches its stores over loopback; [`super::standalone`]), its server
//! ([`ControlServer`]) and its client ([`ControlClient`], [`RemoteHub`]) (docs/INTERPOSER.md,
//! "Your own running service"). Outside a run traffic passes through untouched, as with the
//! runner's own interposers.
//!
//! # The control protocol
//!
//! Line-delimited JSON over TCP: each request is one JSON object on one line, answered by one
//! JSON object on one line, `{"ok":true,…}` or `{"ok":false,"error":"…"}`. A client's first
//! line must be `{"op":"auth","token":T}` with the server's control token (`super::token`),
//! within [`AUTH_TIMEOUT`]; a missing or wrong token is refused (`{"ok":false,"error":"refused:
//! …"}`, a warning naming the peer's address, never a token, then the connection is closed),
//! and a refused client never becomes the controller. The server then sends a greeting: the
//! `hello` answer to the controlling client, or a refusal while another client controls it.
//! `store` is `"postgres"` or `"redis"`; each request does what the [`Hub`] method of the
//! same name does.
//!
//! | request | answer |
//! |---|---|
//! | `{"op":"auth","token":T}` (first line only) | the greeting, or a refusal |
//! | `{"op":"hello"}` | `{"ok":true,"protocol":1,"stores":[{"store","listen","upstream","opened"}]}` |
//! | `{"op":"begin","store":S}` | `{"ok":true}` |
//! | `{"op":"end","store":S}` | `{"ok":true}` |
//! | `{"op":"view","store":S}` | `{"ok":true,"version":V,"sessions":[SessionView…]}` |
//! | `{"op":"release","store":S,"session":ID}` | `{"ok":true,"released":true}` |
//! | `{"op":"wait_change","store":S,"version":V,"timeout_ms":T}` | `{"ok":true,"version":V2}` |
//! | `{"op":"bye"}` | `{"ok":true}`, then the server closes the connection |
//!
//! `opened` counts the client connections the store's interposer ever relayed; `timeout_ms`
//! is capped at [`MAX_WAIT_MS`]; a request line is at most [`MAX_REQUEST`] bytes.
//!
//! **Invariant:** one controlling client at a time, and a controller never leaves the service
//! hung: when its connection ends (`bye`, a close, a crash) every run ends at once, so held
//! steps go on. A controller that stops answering without closing is bounded by
//! [`super::Limits::max_hold`].

use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::conduct::HubControl;
use super::hub::{Hub, SessionView, StoreKind};
use super::token::ControlToken;
use super::Interposer;

/// The control protocol's version, sent in every greeting and `hello` answer.
pub const PROTOCOL_VERSION: u32 = 1;

/// Longest a `wait_change` request waits at the server, in milliseconds.
pub const MAX_WAIT_MS: u64 = 10_000;

/// Longest request line the server reads, in bytes; a longer one closes the connection.
pub const MAX_REQUEST: usize = 64 << 10;

/// Longest answer line the client reads, in bytes (a view holds every session's step and its
/// bound parameters).
const MAX_ANSWER: usize = 256 << 20;

/// How long the client waits for an answer beyond the request's own wait.
const ANSWER_SLACK: Duration = Duration::from_secs(5);

/// How long the server waits for a client's first line (its token) before closing it.
pub const AUTH_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest first line (the token) the server reads, in bytes.
const MAX_AUTH_LINE: usize = 1024;

/// Connections open at once (awaiting their token, or controlling); one more is refused.
const MAX_CONNECTIONS: usize = 16;

/// One store of a running interposer, as the `hello` answer describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreInfo {
    /// Which server.
    pub store: StoreKind,
    /// Where the service connects (the interposer's listener).
    pub listen: SocketAddr,
    /// The server it relays to.
    pub upstream: SocketAddr,
    /// Client connections it ever relayed, open or closed.
    pub opened: u64,
}

/// What a running interposer says of itself (greeting and `hello`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Info {
    /// [`PROTOCOL_VERSION`] of the server.
    pub protocol: u32,
    /// Its stores, PostgreSQL first.
    pub stores: Vec<StoreInfo>,
}

impl Info {
    /// The entry for `store`, if the interposer stands in front of one.
    pub fn store(&self, store: StoreKind) -> Option<&StoreInfo> {
        self.stores.iter().find(|s| s.store == store)
    }
}

/// A request of the control protocol (one JSON line, tagged by `op`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// What the interposer stands in front of.
    Hello,
    /// Starts a run on `store`.
    Begin {
        /// The store.
        store: StoreKind,
    },
    /// Ends the run on `store`.
    End {
        /// The store.
        store: StoreKind,
    },
    /// Every open session of `store`, with the version.
    View {
        /// The store.
        store: StoreKind,
    },
    /// Releases `session`'s held step with `action` (default: forward it).
    Release {
        /// The store.
        store: StoreKind,
        /// The session's number.
        session: u64,
        /// Forward it, or cut the connection before or after the server
        /// ([`crate::interpose::hub::Action`]).
        #[serde(default)]
        action: crate::interpose::hub::Action,
    },
    /// One session's view, open or closed since the run began (`view`: null when unknown),
    /// whether its connection is still `open`, and what the server did with its cut step
    /// (`cut`: null when none is known).
    Session {
        /// The store.
        store: StoreKind,
        /// The session's number.
        session: u64,
    },
    /// Waits until `store`'s version differs from `version`, at most `timeout_ms`.
    WaitChange {
        /// The store.
        store: StoreKind,
        /// The version seen.
        version: u64,
        /// Milliseconds to wait at most (capped at [`MAX_WAIT_MS`]).
        timeout_ms: u64,
    },
    /// The controller leaves: runs end, the connection closes.
    Bye,
}

/// What broke one exchange of [`ControlClient::call`]: it becomes the reason the connection
/// is lost ([`ControlError::Lost`]).
#[derive(Debug, thiserror::Error)]
enum Exchange {
    /// The request could not be written as JSON.
    #[error("{0}")]
    Encode(serde_json::Error),
    /// Writing the request or reading the answer failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The interposer closed the connection before answering.
    #[error("the interposer closed the connection")]
    Closed,
    /// The answer is not JSON.
    #[error("an answer that is not JSON: {0}")]
    NotJson(serde_json::Error),
}

/// Why a control connection could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// Nothing accepted a connection at the control address.
    #[error(
        "nothing answers at the interposer control address {addr}: {source} (start `ticketflow interpose` and name the control address it printed)"
    )]
    Connect {
        /// The control address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Another client controls the interposer.
    #[error("the interposer at {addr} refused this controller: {reason}")]
    Refused {
        /// The control address.
        addr: SocketAddr,
        /// The server's words.
        reason: String,
    },
    /// The connection broke, or an answer was not the protocol's.
    #[error("the control connection to the interposer at {addr} was lost: {reason}")]
    Lost {
        /// The control address.
        addr: SocketAddr,
        /// What went wrong.
        reason: String,
    },
    /// The server refused one request (`{"ok":false}`).
    #[error("the interposer at {addr} answered: {message}")]
    Remote {
        /// The control address.
        addr: SocketAddr,
        /// The server's error.
        message: String,
    },
}

/// Reads one `\n`-terminated line of at most `limit` bytes (without the `\n`); `None` at the
/// end of the stream.
///
/// Will return `Err` for an I/O error, a line longer than `limit`, a stream that ends inside a
/// line, or a line that is not UTF-8.
fn read_line(r: &mut impl BufRead, limit: usize) -> std::io::Result<Option<String>> {
    use std::io::{Error, ErrorKind};
    let mut buf = Vec::new();
    loop {
        let available = r.fill_buf()?;
        if available.is_empty() {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err(Error::new(
                    ErrorKind::UnexpectedEof,
                    "the stream ended inside a line",
                ))
            };
        }
        let (chunk, found) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (&available[..i], Some(i + 1)),
            None => (available, None),
        };
        buf.extend_from_slice(chunk);
        let used = found.unwrap_or(chunk.len());
        r.consume(used);
        if buf.len() > limit {
            return Err(Error::new(
                ErrorKind::InvalidData,
                format!("a line longer than {limit} bytes"),
            ));
        }
        if found.is_some() {
            return String::from_utf8(buf)
                .map(Some)
                .map_err(|e| Error::new(ErrorKind::InvalidData, e));
        }
    }
}

fn write_line(w: &mut impl Write, v: &Value) -> std::io::Result<()> {
    let mut text = v.to_string();
    text.push('\n');
    w.write_all(text.as_bytes())?;
    w.flush()
}

// ---------------------------------------------------------------- server

/// One store a [`ControlServer`] exposes.
pub(crate) struct Endpoint {
    /// Which server.
    pub store: StoreKind,
    /// The interposer's listener.
    pub listen: SocketAddr,
    /// The server it relays to.
    pub upstream: SocketAddr,
    /// Its hub.
    pub hub: Arc<Hub>,
}

impl Endpoint {
    /// The endpoint of a running interposer.
    pub(crate) fn of(ip: &Interposer) -> Self {
        Endpoint {
            store: ip.store(),
            listen: ip.addr(),
            upstream: ip.upstream(),
            hub: ip.hub().clone(),
        }
    }
}

struct Shared {
    endpoints: Vec<Endpoint>,
    stop: AtomicBool,
    /// What a client must send first.
    token: ControlToken,
    /// The controlling client (one that sent the token): its address and a clone of its
    /// socket.
    controller: Mutex<Option<(SocketAddr, TcpStream)>>,
    /// Every open connection by number, awaiting its token or controlling (a clone, shut on
    /// stop).
    conns: Mutex<Vec<(u64, TcpStream)>>,
    /// The connections' threads, joined on stop.
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// Locks `m`, through a poisoned lock (the data stays consistent: every writer replaces whole
/// values).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn controller(&self) -> MutexGuard<'_, Option<(SocketAddr, TcpStream)>> {
        lock(&self.controller)
    }

    fn info(&self) -> Info {
        Info {
            protocol: PROTOCOL_VERSION,
            stores: self
                .endpoints
                .iter()
                .map(|e| StoreInfo {
                    store: e.store,
                    listen: e.listen,
                    upstream: e.upstream,
                    opened: e.hub.opened(),
                })
                .collect(),
        }
    }

    fn hello(&self) -> Value {
        let mut v = serde_json::to_value(self.info()).unwrap_or(Value::Null);
        if let Value::Object(m) = &mut v {
            m.insert("ok".into(), Value::Bool(true));
        }
        v
    }

    /// Ends every run and frees the controller slot, if `peer` holds it. Both under the
    /// slot's lock, so a next controller's run can never be ended by this one leaving.
    fn leave(&self, peer: SocketAddr) {
        let mut slot = self.controller();
        if slot.as_ref().is_some_and(|(p, _)| *p == peer) {
            self.end_all();
            *slot = None;
        }
    }

    fn end_all(&self) {
        for e in &self.endpoints {
            e.hub.end();
        }
    }

    /// The answer to one request line, and whether the controller said `bye`.
    fn answer(&self, line: &str) -> (Value, bool) {
        let request: Request = match serde_json::from_str(line) {
            Ok(r) => r,
            Err(e) => {
                return (
                    json!({"ok": false, "error": format!("bad request: {e}")}),
                    false,
                )
            }
        };
        let hub = |store: StoreKind| -> Result<&Hub, Value> {
            self.endpoints
                .iter()
                .find(|e| e.store == store)
                .map(|e| &*e.hub)
                .ok_or_else(|| {
                    let here: Vec<&str> = self.endpoints.iter().map(|e| e.store.name()).collect();
                    json!({"ok": false, "error": format!(
                        "no {} interposer here (stores: {})",
                        store.name(),
                        here.join(", ")
                    )})
                })
        };
        let answer = match request {
            Request::Hello => Ok(self.hello()),
            Request::Bye => return (json!({"ok": true}), true),
            Request::Begin { store } => hub(store).map(|h| {
                h.begin();
                json!({"ok": true})
            }),
            Request::End { store } => hub(store).map(|h| {
                h.end();
                json!({"ok": true})
            }),
            Request::View { store } => hub(store).map(|h| {
                let (version, sessions) = h.view();
                json!({"ok": true, "version": version, "sessions": sessions})
            }),
            Request::Release {
                store,
                session,
                action,
            } => {
                hub(store).map(|h| json!({"ok": true, "released": h.release_with(session, action)}))
            }
            Request::Session { store, session } => hub(store).map(|h| {
                json!({
                    "ok": true,
                    "view": h.session(session),
                    "open": h.is_open(session),
                    "cut": h.cut_outcome(session),
                })
            }),
            Request::WaitChange {
                store,
                version,
                timeout_ms,
            } => hub(store).map(|h| {
                let deadline = Instant::now() + Duration::from_millis(timeout_ms.min(MAX_WAIT_MS));
                json!({"ok": true, "version": h.wait_change(version, deadline)})
            }),
        };
        (answer.unwrap_or_else(|e| e), false)
    }
}

/// The control server of a long-lived interposer: accepts one controlling client at a time on
/// its loopback address, one that sent the control token first, and answers the control
/// protocol (module docs). Stopped on drop: the
/// controller's connection is closed and every run ends.
pub struct ControlServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl ControlServer {
    /// Listens on `listen` (port 0: a free one) and serves `endpoints`. The caller checks that
    /// `listen` is a loopback address.
    ///
    /// Will return `Err` when `listen` cannot be bound.
    pub(crate) fn start(
        listen: SocketAddr,
        endpoints: Vec<Endpoint>,
        token: ControlToken,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(listen)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            endpoints,
            stop: AtomicBool::new(false),
            token,
            controller: Mutex::new(None),
            conns: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
        });
        let accept = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("interpose-control".into())
                .spawn(move || control_accept(listener, shared))?
        };
        Ok(ControlServer {
            addr,
            shared,
            accept: Some(accept),
        })
    }

    /// The control address.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // The accept loop sees `stop` at the next connection: this one. It starts no thread
        // after.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        for (_, s) in lock(&self.shared.conns).iter() {
            let _ = s.shutdown(Shutdown::Both);
        }
        // A controller waiting in `wait_change` wakes at the version this bumps.
        self.shared.end_all();
        let threads = std::mem::take(&mut *lock(&self.shared.threads));
        for t in threads {
            let _ = t.join();
        }
    }
}

/// Writes `error` as a refusal to `conn` and closes it.
fn refuse(mut conn: &TcpStream, error: &str) {
    let _ = write_line(&mut conn, &json!({"ok": false, "error": error}));
    let _ = conn.shutdown(Shutdown::Both);
}

fn control_accept(listener: TcpListener, shared: Arc<Shared>) {
    let mut number = 0u64;
    for conn in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(conn) = conn else { continue };
        let _ = conn.set_nodelay(true);
        let _ = conn.set_write_timeout(Some(Duration::from_secs(5)));
        let Ok(peer) = conn.peer_addr() else { continue };
        lock(&shared.threads).retain(|t| !t.is_finished());
        {
            let mut conns = lock(&shared.conns);
            if conns.len() >= MAX_CONNECTIONS {
                tracing::warn!(%peer, "interposer control connection refused: too many open");
                refuse(
                    &conn,
                    "refused: too many connections to this interposer's control",
                );
                continue;
            }
            let Ok(clone) = conn.try_clone() else {
                continue;
            };
            number += 1;
            conns.push((number, clone));
        }
        let (s, id) = (shared.clone(), number);
        let spawned = std::thread::Builder::new()
            .name("interpose-control".into())
            .spawn(move || {
                serve_connection(&conn, &s, peer);
                lock(&s.conns).retain(|(n, _)| *n != id);
            });
        match spawned {
            Ok(t) => lock(&shared.threads).push(t),
            Err(_) => {
                tracing::warn!("interposer could not start a control connection thread");
                lock(&shared.conns).retain(|(n, _)| *n != id);
            }
        }
    }
}

/// Why a client's first line is not the control token, in words for the log (never the
/// token itself).
fn authenticate(shared: &Shared, first: std::io::Result<Option<String>>) -> Result<(), String> {
    let line = match first {
        Ok(Some(line)) => line,
        Ok(None) => return Err("closed before sending a token".into()),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            return Err(format!("no token within {AUTH_TIMEOUT:?}"))
        }
        Err(e) => return Err(format!("an unreadable first line ({e})")),
    };
    let v: Value = serde_json::from_str(&line).map_err(|_| "a first line that is not JSON")?;
    if v.get("op").and_then(Value::as_str) != Some("auth") {
        return Err("a first request that is not auth".into());
    }
    match v.get("token").and_then(Value::as_str) {
        Some(t) if shared.token.matches(t) => Ok(()),
        Some(_) => Err("a wrong token".into()),
        None => Err("an auth request without a token".into()),
    }
}

/// One control connection: its token, then, if no other client controls the interposer, the
/// requests until it leaves.
fn serve_connection(conn: &TcpStream, shared: &Shared, peer: SocketAddr) {
    let Ok(read) = conn.try_clone() else { return };
    let mut reader = BufReader::new(read);
    let _ = conn.set_read_timeout(Some(AUTH_TIMEOUT));
    let first = read_line(&mut reader, MAX_AUTH_LINE);
    if shared.stop.load(Ordering::SeqCst) {
        return;
    }
    if let Err(why) = authenticate(shared, first) {
        tracing::warn!(%peer, reason = %why, "interposer control connection refused: no valid control token");
        refuse(
            conn,
            "refused: this interposer's control needs its token first ({\"op\":\"auth\",\"token\":…}, from the control token file `ticketflow interpose` printed)",
        );
        return;
    }
    let _ = conn.set_read_timeout(None);
    {
        let mut slot = shared.controller();
        if let Some((current, _)) = slot.as_ref() {
            tracing::info!(%peer, %current, "second interposer controller refused");
            refuse(conn, &format!(
                "refused: another controller ({current}) is connected to this interposer; one controlling client at a time"
            ));
            return;
        }
        let Ok(clone) = conn.try_clone() else { return };
        *slot = Some((peer, clone));
    }
    tracing::info!(%peer, "interposer controller connected");
    if let Err(e) = serve_controller(conn, reader, shared, peer) {
        tracing::debug!(error = %e, "interposer controller connection ended");
    }
    // Whatever ended the connection, the service's held steps go on.
    shared.leave(peer);
    let _ = conn.shutdown(Shutdown::Both);
    tracing::info!(%peer, "interposer controller left; runs ended");
}

fn serve_controller(
    conn: &TcpStream,
    mut reader: BufReader<TcpStream>,
    shared: &Shared,
    peer: SocketAddr,
) -> std::io::Result<()> {
    let mut writer = conn.try_clone()?;
    write_line(&mut writer, &shared.hello())?;
    while let Some(line) = read_line(&mut reader, MAX_REQUEST)? {
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        if line.trim().is_empty() {
            continue;
        }
        let (answer, bye) = shared.answer(&line);
        if bye {
            // Runs end and the slot is free before the answer: a client that says `bye` and
            // connects again at once is accepted.
            shared.leave(peer);
        }
        write_line(&mut writer, &answer)?;
        if bye {
            break;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- client

struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

/// The controlling client of a running interposer: one connection, one request at a time.
/// Says `bye` on drop, so the server's runs end and the next controller is accepted at once.
pub struct ControlClient {
    addr: SocketAddr,
    greeting: Info,
    conn: Mutex<Option<Conn>>,
    lost: Mutex<Option<String>>,
}

impl ControlClient {
    /// Connects to the control address `addr` within `timeout`, sends `token` and reads the
    /// greeting.
    ///
    /// Will return `Err` when nothing accepts the connection ([`ControlError::Connect`]), the
    /// token is refused or another client controls the interposer ([`ControlError::Refused`]),
    /// or the greeting is not the protocol's ([`ControlError::Lost`]).
    pub fn connect(
        addr: SocketAddr,
        token: &ControlToken,
        timeout: Duration,
    ) -> Result<Self, ControlError> {
        let mut stream = TcpStream::connect_timeout(&addr, timeout)
            .map_err(|source| ControlError::Connect { addr, source })?;
        let lost = |reason: String| ControlError::Lost { addr, reason };
        let _ = stream.set_nodelay(true);
        stream
            .set_read_timeout(Some(Duration::from_millis(MAX_WAIT_MS) + ANSWER_SLACK))
            .and_then(|()| stream.set_write_timeout(Some(ANSWER_SLACK)))
            .map_err(|e| lost(e.to_string()))?;
        write_line(&mut stream, &json!({"op": "auth", "token": token.expose()}))
            .map_err(|e| lost(e.to_string()))?;
        let mut reader = BufReader::new(stream.try_clone().map_err(|e| lost(e.to_string()))?);
        let line = read_line(&mut reader, MAX_ANSWER)
            .map_err(|e| lost(e.to_string()))?
            .ok_or_else(|| lost("closed before its greeting".into()))?;
        let v: Value = serde_json::from_str(&line).map_err(|e| {
            lost(format!(
                "a greeting that is not JSON ({e}): not an interposer"
            ))
        })?;
        if v.get("ok") != Some(&Value::Bool(true)) {
            let reason = v
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or("no reason given")
                .to_string();
            return Err(ControlError::Refused { addr, reason });
        }
        let greeting: Info = serde_json::from_value(v)
            .map_err(|e| lost(format!("a greeting of another shape ({e})")))?;
        Ok(ControlClient {
            addr,
            greeting,
            conn: Mutex::new(Some(Conn {
                reader,
                writer: stream,
            })),
            lost: Mutex::new(None),
        })
    }

    /// The control address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// What the interposer said of itself when this client connected.
    pub fn greeting(&self) -> &Info {
        &self.greeting
    }

    /// Why the connection was lost, if it was.
    pub fn lost(&self) -> Option<String> {
        self.lost.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Sends `request` and reads its answer.
    ///
    /// Will return `Err` when the connection was lost before or breaks now
    /// ([`ControlError::Lost`], remembered: later calls fail at once), or the server refused
    /// the request ([`ControlError::Remote`]).
    pub fn call(&self, request: &Request) -> Result<Value, ControlError> {
        let mut guard = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let Some(conn) = guard.as_mut() else {
            return Err(ControlError::Lost {
                addr: self.addr,
                reason: self.lost().unwrap_or_else(|| "closed".into()),
            });
        };
        let exchanged = (|| -> Result<Value, Exchange> {
            let line = serde_json::to_value(request).map_err(Exchange::Encode)?;
            write_line(&mut conn.writer, &line)?;
            let answer = read_line(&mut conn.reader, MAX_ANSWER)?.ok_or(Exchange::Closed)?;
            serde_json::from_str(&answer).map_err(Exchange::NotJson)
        })()
        .map_err(|e| e.to_string());
        match exchanged {
            Ok(v) if v.get("ok") == Some(&Value::Bool(true)) => Ok(v),
            Ok(v) => Err(ControlError::Remote {
                addr: self.addr,
                message: v
                    .get("error")
                    .and_then(Value::as_str)
                    .unwrap_or("no reason given")
                    .to_string(),
            }),
            Err(reason) => {
                let _ = conn.writer.shutdown(Shutdown::Both);
                *guard = None;
                *self.lost.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason.clone());
                Err(ControlError::Lost {
                    addr: self.addr,
                    reason,
                })
            }
        }
    }

    /// `hello` again: the interposer's stores and their connection counts now.
    ///
    /// Will return `Err` as [`ControlClient::call`] does, or [`ControlError::Lost`] for an
    /// answer of another shape.
    #[cfg(test)]
    pub(crate) fn hello(&self) -> Result<Info, ControlError> {
        let v = self.call(&Request::Hello)?;
        serde_json::from_value(v).map_err(|e| ControlError::Lost {
            addr: self.addr,
            reason: format!("a hello answer of another shape ({e})"),
        })
    }

    /// One [`RemoteHub`] per store of the interposer, PostgreSQL first.
    pub fn hubs(self: &Arc<Self>) -> Vec<RemoteHub> {
        self.greeting
            .stores
            .iter()
            .map(|s| RemoteHub {
                client: self.clone(),
                store: s.store,
            })
            .collect()
    }
}

impl Drop for ControlClient {
    fn drop(&mut self) {
        if self.lost().is_none() {
            let _ = self.call(&Request::Bye);
        }
    }
}

/// One store of a remote interposer, conducted over its [`ControlClient`]. A request that
/// fails leaves the hub [`HubControl::lost`]: its view is empty from then on, so no racer is
/// seen held and the wave ends as a problem, never as evidence.
pub struct RemoteHub {
    client: Arc<ControlClient>,
    store: StoreKind,
}

impl RemoteHub {
    /// Its store.
    pub fn store(&self) -> StoreKind {
        self.store
    }

    /// The answer to a `session` request for session `id`; `None` when the request failed.
    fn session_answer(&self, id: u64) -> Option<Value> {
        self.client
            .call(&Request::Session {
                store: self.store,
                session: id,
            })
            .ok()
    }
}

impl HubControl for RemoteHub {
    fn begin(&self) {
        let _ = self.client.call(&Request::Begin { store: self.store });
    }

    fn end(&self) {
        let _ = self.client.call(&Request::End { store: self.store });
    }

    fn view(&self) -> (u64, Vec<SessionView>) {
        #[derive(Deserialize)]
        struct Viewed {
            version: u64,
            sessions: Vec<SessionView>,
        }
        match self.client.call(&Request::View { store: self.store }) {
            Ok(v) => match serde_json::from_value::<Viewed>(v) {
                Ok(x) => (x.version, x.sessions),
                Err(e) => {
                    *self.client.lost.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(format!("a view of another shape ({e})"));
                    (0, Vec::new())
                }
            },
            Err(_) => (0, Vec::new()),
        }
    }

    fn release(&self, id: u64) -> bool {
        self.release_with(id, crate::interpose::hub::Action::Forward)
    }

    fn release_with(&self, id: u64, action: crate::interpose::hub::Action) -> bool {
        self.client
            .call(&Request::Release {
                store: self.store,
                session: id,
                action,
            })
            .ok()
            .and_then(|v| v.get("released").and_then(Value::as_bool))
            .unwrap_or(false)
    }

    fn cut_outcome(&self, id: u64) -> Option<crate::interpose::hub::CutOutcome> {
        let v = self.session_answer(id)?;
        serde_json::from_value(v.get("cut")?.clone()).ok()
    }

    fn session(&self, id: u64) -> Option<SessionView> {
        let v = self.session_answer(id)?;
        serde_json::from_value(v.get("view")?.clone()).ok()
    }

    fn is_open(&self, id: u64) -> bool {
        self.session_answer(id)
            .and_then(|v| v.get("open").and_then(Value::as_bool))
            .unwrap_or(false)
    }

    fn wait_change(&self, seen: u64, deadline: Instant) -> u64 {
        if self.client.lost().is_some() {
            // Nothing will change any more: wait out the caller's short deadline rather than
            // let its loop spin on a dead connection until the wave's own deadline.
            std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
            return seen;
        }
        let timeout_ms = u64::try_from(
            deadline
                .saturating_duration_since(Instant::now())
                .as_millis(),
        )
        .unwrap_or(MAX_WAIT_MS);
        self.client
            .call(&Request::WaitChange {
                store: self.store,
                version: seen,
                timeout_ms,
            })
            .ok()
            .and_then(|v| v.get("version").and_then(Value::as_u64))
            .unwrap_or(seen)
    }

    fn lost(&self) -> Option<String> {
        self.client.lost().map(|reason| {
            format!(
                "the control connection to the interposer at {} was lost during the wave ({reason}): the service's steps were no longer held",
                self.client.addr
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_one_json_object_tagged_by_op() {
        let r = Request::WaitChange {
            store: StoreKind::Postgres,
            version: 7,
            timeout_ms: 20,
        };
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(
            text,
            r#"{"op":"wait_change","store":"postgres","version":7,"timeout_ms":20}"#
        );
        assert_eq!(serde_json::from_str::<Request>(&text).unwrap(), r);
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"op":"hello"}"#).unwrap(),
            Request::Hello
        );
    }

    #[test]
    fn a_line_longer_than_its_bound_is_refused() {
        let mut r = std::io::Cursor::new(b"abc\ndefgh\nij".to_vec());
        assert_eq!(read_line(&mut r, 4).unwrap().as_deref(), Some("abc"));
        assert!(read_line(&mut r, 4).is_err());
        let mut r = std::io::Cursor::new(b"ab\n".to_vec());
        assert_eq!(read_line(&mut r, 4).unwrap().as_deref(), Some("ab"));
        assert_eq!(read_line(&mut r, 4).unwrap(), None);
    }

    /// The one token of these tests' servers.
    fn token() -> ControlToken {
        static TOKEN: std::sync::OnceLock<ControlToken> = std::sync::OnceLock::new();
        TOKEN.get_or_init(ControlToken::generate).clone()
    }

    /// A control server over a hub with one open session, and a client of it.
    fn served() -> (ControlServer, Arc<Hub>, u64) {
        let hub = Arc::new(Hub::default());
        let id = hub.open(StoreKind::Postgres);
        let server = ControlServer::start(
            SocketAddr::from(([127, 0, 0, 1], 0)),
            vec![Endpoint {
                store: StoreKind::Postgres,
                listen: SocketAddr::from(([127, 0, 0, 1], 1)),
                upstream: SocketAddr::from(([127, 0, 0, 1], 5432)),
                hub: hub.clone(),
            }],
            token(),
        )
        .unwrap();
        (server, hub, id)
    }

    #[test]
    fn a_remote_hub_holds_and_releases_a_step_as_the_local_one_does() {
        let (server, hub, id) = served();
        let client = Arc::new(
            ControlClient::connect(server.addr(), &token(), Duration::from_secs(2)).unwrap(),
        );
        assert_eq!(client.greeting().stores[0].opened, 1);
        let remote = client.hubs().pop().unwrap();
        remote.begin();
        std::thread::scope(|sc| {
            let h = hub.clone();
            let t = sc.spawn(move || h.hold(id, Step::default(), Duration::from_secs(30), 0));
            let mut seen = 0;
            let until = Instant::now() + Duration::from_secs(10);
            while remote.view().1[0].phase != super::super::Phase::Held {
                assert!(Instant::now() < until, "never held");
                seen = remote.wait_change(seen, Instant::now() + Duration::from_millis(200));
            }
            assert!(remote.release(id));
            t.join().unwrap();
        });
        assert!(!remote.release(id), "nothing is held any more");
        remote.end();
        assert_eq!(remote.lost(), None);
    }

    use super::super::Step;

    #[test]
    fn a_second_controller_is_refused_and_the_first_vanishing_ends_the_run() {
        let (server, hub, id) = served();
        // The first controller is a bare socket, so it can vanish without saying `bye`.
        let mut first = TcpStream::connect(server.addr()).unwrap();
        write_line(
            &mut first,
            &json!({"op": "auth", "token": token().expose()}),
        )
        .unwrap();
        let mut reader = BufReader::new(first.try_clone().unwrap());
        let greeting = read_line(&mut reader, MAX_ANSWER).unwrap().unwrap();
        assert!(greeting.contains("\"ok\":true"), "{greeting}");
        match ControlClient::connect(server.addr(), &token(), Duration::from_secs(2)) {
            Err(ControlError::Refused { reason, .. }) => {
                assert!(
                    reason.contains("one controlling client at a time"),
                    "{reason}"
                )
            }
            other => panic!("a second controller was not refused: {:?}", other.err()),
        }
        write_line(&mut first, &json!({"op": "begin", "store": "postgres"})).unwrap();
        assert!(read_line(&mut reader, MAX_ANSWER)
            .unwrap()
            .unwrap()
            .contains("\"ok\":true"));
        let held_for = std::thread::scope(|sc| {
            let h = hub.clone();
            let t = sc.spawn(move || {
                let at = Instant::now();
                h.hold(id, Step::default(), Duration::from_secs(60), 0);
                at.elapsed()
            });
            let mut seen = 0;
            while hub.view().1[0].phase != super::super::Phase::Held {
                seen = hub.wait_change(seen, Instant::now() + Duration::from_secs(5));
            }
            // The controller goes away mid-run without releasing: the held step goes on.
            drop((first, reader));
            t.join().unwrap()
        });
        assert!(held_for < Duration::from_secs(30), "held {held_for:?}");
        // And the next controller is accepted.
        let next = ControlClient::connect(server.addr(), &token(), Duration::from_secs(2)).unwrap();
        assert!(next.hello().is_ok());
        drop(next);
        // One that said `bye` frees the slot before its answer: the next is accepted at once.
        assert!(ControlClient::connect(server.addr(), &token(), Duration::from_secs(2)).is_ok());
    }
}
