//! The interposer: a loopback TCP proxy in front of a PostgreSQL or Redis server that the
//! service under test connects to instead, so that a run can hold, order and release the
//! service's own commands (docs/INTERPOSER.md).
//!
//! - [`hub`]: what the sessions share with the conductor (held, at the server, idle);
//! - `pgwire`: the PostgreSQL v3 relay and its steps;
//! - `resp`: the Redis RESP2/RESP3 relay and its steps;
//! - [`conduct`]: one wave conducted step by step: quiescence, choice, evidence;
//! - [`explore`]: the schedules (exhaustive, preemption-bounded, PCT, first point) and their ids;
//! - [`reduce`]: the reduced search (partial-order reduction, sleep sets, symmetry) over the
//!   dependency relation of [`footprint`];
//! - [`control`]: the control protocol a runner conducts a long-lived interposer over;
//! - [`standalone`]: `ticketflow interpose`, that long-lived interposer for services started by
//!   their user;
//! - [`token`]: the control token a controller sends first, and its file;
//! - `spin`: busy-polling a socket before a blocking read, outside a run.
//!
//! Outside a run ([`hub::Hub::begin`] … [`hub::Hub::end`]) traffic passes through untouched:
//! each message is only framed (PostgreSQL's 5-byte header; where a RESP command or reply
//! ends), and what one read brings goes on in one write without waiting for replies, so a
//! pipeline reaches the server as one; the replies of one read go back in one write. The
//! replies still owed are counted, so when a run begins the next command is held as a step
//! once they are all in. A relay thread that expects bytes soon busy-polls its socket for a
//! short window before it sleeps, where a core is to spare (`spin`). During a run each
//! session's commands are decoded and held one step at a time.
//!
//! Bounded, each bound answered as the server answers its own:
//! - the startup ([`Limits::startup_timeout`], default [`STARTUP_TIMEOUT`] = 10 s; PostgreSQL's
//!   `authentication_timeout` is 60 s): a connection that has not sent its startup packet
//!   (PostgreSQL) or first whole command (Redis) by then is closed, as PostgreSQL closes it,
//!   without an answer; an invalid PostgreSQL startup packet is closed at once (a length
//!   outside 8..=10,000 without an answer, another protocol than 3 with PostgreSQL's `FATAL`
//!   `0A000`);
//! - connections ([`Limits::max_connections`]): one over is refused with PostgreSQL's `FATAL`
//!   `53300` after its startup packet, or Redis' `-ERR max number of clients reached`;
//! - message size ([`Limits::max_message`], default 64 MiB): a larger message, either way, is
//!   answered with an error naming the bound (PostgreSQL `FATAL` `54000`, Redis `-ERR`) and the
//!   connection closed;
//! - how long a step may be held ([`Limits::max_hold`]).
//!
//! A client that ends its side (end of stream, `Terminate`, `QUIT`) still gets what the server
//! sends until the server closes (`QUIT`'s `+OK`). A Redis connection that subscribes (or
//! runs `MONITOR`) gets replies that answer no command; from then its replies are not counted
//! and its commands pass unheld.

pub mod conduct;
pub mod control;
pub mod explore;
pub mod footprint;
pub mod groups;
pub mod hub;
mod pgwire;
pub mod reduce;
mod resp;
mod spin;
pub mod standalone;
pub mod steps;
pub mod token;

use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use hub::{Action, CutOutcome, Hub, Phase, SessionView, Step, StoreKind};
pub use spin::BUSY_POLL;

/// Replies still owed to a relayed client: one `ReadyForQuery` per `Sync` or `Query`
/// forwarded (PostgreSQL), one reply per command (Redis), counted in pass-through too, so a
/// run that begins knows when the session is settled. Also the one door through which both
/// directions write to the client, so that an error the interposer answers itself lands
/// between whole server messages.
#[derive(Default)]
pub(crate) struct Owed {
    count: Mutex<u64>,
    paid: Condvar,
    /// Set when the server side is gone ([`Owed::cancel`]).
    gone: Mutex<bool>,
    ended: Condvar,
    /// Set when the connection's replies are no longer counted ([`Owed::forgo`]).
    forgone: AtomicBool,
    /// Serialises writes to the client.
    writing: Mutex<()>,
    /// Set when the client's side has ended ([`session`]).
    front_ended: Mutex<bool>,
    front_cv: Condvar,
    /// Wakes a side waiting for its turn ([`spin`]).
    turns: spin::Turns,
}

impl Owed {
    pub(crate) fn add(&self) {
        if self.accounting() {
            let mut c = self.count.lock().unwrap_or_else(|p| p.into_inner());
            *c += 1;
            let first = *c == 1;
            drop(c);
            if first {
                self.turns.pass(true);
            }
        }
    }

    /// The wake-ups of the session's two sides when the turn passes ([`spin`]).
    pub(crate) fn turns(&self) -> &spin::Turns {
        &self.turns
    }

    /// Stops counting replies for good: the server sends this connection replies that answer
    /// no command (Redis pub/sub messages, `MONITOR` lines). Call it with nothing owed
    /// ([`Owed::wait_settled`] first), so every reply read after it is one of those.
    pub(crate) fn forgo(&self) {
        self.forgone.store(true, Ordering::SeqCst);
    }

    /// Whether a reply is owed: the server's turn (a command sent, its reply not yet passed
    /// on), not the client's.
    pub(crate) fn owing(&self) -> bool {
        *self.count.lock().unwrap_or_else(|p| p.into_inner()) > 0
    }

    /// Whether replies are counted ([`Owed::forgo`] not called).
    pub(crate) fn accounting(&self) -> bool {
        !self.forgone.load(Ordering::SeqCst)
    }

    /// Writes `bytes` to the client, never in the middle of another write of the session.
    ///
    /// Will return `Err` when the client's socket does.
    pub(crate) fn send(&self, client: &TcpStream, bytes: &[u8]) -> std::io::Result<()> {
        let _one = self.writing.lock().unwrap_or_else(|p| p.into_inner());
        let mut c = client;
        std::io::Write::write_all(&mut c, bytes)
    }

    /// Waits until the server side is gone or `until` passes.
    fn wait_gone(&self, until: Instant) {
        let mut g = self.gone.lock().unwrap_or_else(|p| p.into_inner());
        while !*g {
            let now = Instant::now();
            if now >= until {
                return;
            }
            g = self
                .ended
                .wait_timeout(g, until - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// One paid; when none is owed any more, `settled` runs before any waiter in
    /// [`Owed::wait_settled`] goes on (so a step's completion is recorded before the next
    /// step can be held).
    pub(crate) fn pay(&self, settled: impl FnOnce()) {
        let mut c = self.count.lock().unwrap_or_else(|p| p.into_inner());
        *c = c.saturating_sub(1);
        if *c == 0 {
            settled();
            drop(c);
            // Only a settled session wakes [`Owed::wait_settled`]: a wake is a system call,
            // and a pipeline's replies are paid one by one.
            self.settled();
        }
    }

    /// Nothing is owed any more: wakes the waits for that and passes the turn to the client's
    /// side.
    fn settled(&self) {
        self.paid.notify_all();
        self.turns.pass(false);
    }

    /// The next step of session `id` (during a run; outside one a relay forwards without
    /// calling this): waits until every earlier reply is in (or the run ends: then it goes on
    /// unheld), then holds `text` (clipped) and `params` at the hub until released (at once
    /// outside a run). The caller then counts the step's reply owed and forwards it, unless
    /// the returned action is [`Action::CutBefore`] (then it closes the connection without
    /// forwarding).
    /// `buffered`: bytes the relay has read past this step (a next command already sent).
    pub(crate) fn hold_next(
        &self,
        hub: &Hub,
        id: u64,
        step: (&str, Vec<String>),
        max_hold: Duration,
        buffered: usize,
    ) -> Action {
        if !self.settle_in_run(hub, id) {
            // The run ended while replies were still owed: the step goes on unheld, as
            // outside a run.
            return Action::Forward;
        }
        let (text, params) = step;
        hub.hold(
            id,
            Step {
                text: hub::clip(text),
                params,
            },
            max_hold,
            buffered,
        )
    }

    /// Waits until every reply owed is in ([`Owed::wait_settled`]), or until `hub`'s run has
    /// ended: `false` then. A count of replies owed that the server will never pay (a client
    /// protocol the relay miscounts) would otherwise hold the session's next command for ever
    /// once a run began; so the wait looks at the run every [`SETTLE_CHECK`] and says so in
    /// the log once it has waited [`SETTLE_WARN`].
    pub(crate) fn settle_in_run(&self, hub: &Hub, id: u64) -> bool {
        let started = Instant::now();
        let mut warned = false;
        let mut c = self.count.lock().unwrap_or_else(|p| p.into_inner());
        while *c > 0 {
            if !hub.running() {
                return false;
            }
            if !warned && started.elapsed() >= SETTLE_WARN {
                warned = true;
                tracing::warn!(
                    session = id,
                    owed = *c,
                    "interposer: a session's next command waits for replies the server has not sent; it is held only once they come, or goes on unheld when the run ends"
                );
            }
            c = self
                .paid
                .wait_timeout(c, SETTLE_CHECK)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }

    /// Forgets `n` replies owed that the server will not send (Syncs it ignores in copy-in
    /// mode); a session left owing none is settled.
    pub(crate) fn forgive(&self, n: u64) {
        let mut c = self.count.lock().unwrap_or_else(|p| p.into_inner());
        if *c == 0 || n == 0 {
            return;
        }
        *c = c.saturating_sub(n);
        if *c == 0 {
            drop(c);
            self.settled();
        }
    }

    pub(crate) fn wait_settled(&self) {
        let mut c = self.count.lock().unwrap_or_else(|p| p.into_inner());
        while *c > 0 {
            c = self.paid.wait(c).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Waits until the client's side has ended or `until` passes: the server's side, after an
    /// error it answered the client itself, gives the client [`ERROR_GRACE`] to close first.
    pub(crate) fn wait_front(&self, until: Instant) {
        let mut g = self.front_ended.lock().unwrap_or_else(|p| p.into_inner());
        while !*g {
            let now = Instant::now();
            if now >= until {
                return;
            }
            g = self
                .front_cv
                .wait_timeout(g, until - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn front_done(&self) {
        *self.front_ended.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.front_cv.notify_all();
    }

    /// Wakes a waiter for good (the server side is gone).
    pub(crate) fn cancel(&self) {
        *self.count.lock().unwrap_or_else(|p| p.into_inner()) = 0;
        *self.gone.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.ended.notify_all();
        self.paid.notify_all();
        self.turns.wake_all();
    }
}

/// How often a step's wait for earlier replies during a run looks whether the run has ended
/// ([`Owed::hold_next`]): 50 ms.
const SETTLE_CHECK: Duration = Duration::from_millis(50);

/// How long a step waits for earlier replies during a run before the log says so: 1 s.
const SETTLE_WARN: Duration = Duration::from_secs(1);

/// How the client's side of a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// The client is done (end of its stream, PostgreSQL's `Terminate`, Redis' `QUIT`): the
    /// server gets the end of the stream, and what it still sends (`QUIT`'s `+OK`) reaches
    /// the client until the server closes, bounded by [`Limits::connect_timeout`].
    Drain,
    /// Closed on both sides at once (a step cut before the server saw it).
    Abrupt,
}

/// How long a client is given to close first after an error the interposer answers itself
/// (a refusal, a message over the bound): 1 s. A client that reads the error and the close in
/// one go may report only the close (Rust's synchronous `postgres` client does), so the
/// interposer closes only once the client has closed or this has passed.
pub(crate) const ERROR_GRACE: Duration = Duration::from_secs(1);

/// Answers `bytes` (an error the interposer sends itself) and closes after
/// [`linger_closed`].
pub(crate) fn farewell(client: &TcpStream, bytes: &[u8]) {
    let mut c = client;
    let _ = std::io::Write::write_all(&mut c, bytes);
    linger_closed(client);
}

/// Reads and drops what the client still sends until it closes or [`ERROR_GRACE`] passes,
/// then closes: the client reads what it was sent before it sees the close, and the close
/// does not reset the connection over unread bytes.
pub(crate) fn linger_closed(client: &TcpStream) {
    let until = Instant::now() + ERROR_GRACE;
    let mut buf = [0u8; 16 * 1024];
    let mut c = client;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || c.set_read_timeout(Some(left)).is_err() {
            break;
        }
        match std::io::Read::read(&mut c, &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    let _ = client.shutdown(Shutdown::Both);
}

/// A bound in bytes as the interposer's errors say it: `4096 bytes`, `67108864 bytes (64 MiB)`.
pub(crate) fn bound_text(max: usize) -> String {
    if max >= 1 << 20 && max % (1 << 20) == 0 {
        format!("{max} bytes ({} MiB)", max >> 20)
    } else {
        format!("{max} bytes")
    }
}

/// Runs one relayed session between `ends` (the client's socket, the server's) registered at
/// `hub`, its replies owed counted in `owed` (fresh, made by the caller so its readers can
/// poll on it: [`spin`]): `back` (the server's bytes to the client, given clones of both
/// sockets) on a thread of its own, `front` (the client's to the server) on this one. When
/// the back ends, or the front ends [`Ending::Abrupt`] or with an error, both sockets are
/// shut so the other ends too, and a step waiting for replies stops waiting; when the front
/// ends [`Ending::Drain`], the server's replies still reach the client until the server
/// closes or `drain` passes. The session is then closed at the hub.
///
/// Will return `Err` with the first side's I/O error.
fn session(
    hub: &Hub,
    store: StoreKind,
    (client, server): (&TcpStream, &TcpStream),
    owed: &Owed,
    drain: Duration,
    back: impl FnOnce(u64, &Owed, TcpStream, TcpStream) -> std::io::Result<()> + Send,
    front: impl FnOnce(u64, &Owed) -> std::io::Result<Ending>,
) -> std::io::Result<()> {
    let id = hub.open(store);
    if let Ok(watch) = client.try_clone() {
        hub.watch_client(id, watch);
    }
    let result = std::thread::scope(|sc| {
        let (server_r, client_w) = (server.try_clone()?, client.try_clone()?);
        let closer = client.try_clone()?;
        let back = sc.spawn(move || {
            let r = back(id, owed, server_r, client_w);
            owed.cancel();
            let _ = closer.shutdown(Shutdown::Both);
            r
        });
        let r = front(id, owed);
        owed.front_done();
        if matches!(r, Ok(Ending::Drain)) {
            let _ = server.shutdown(Shutdown::Write);
            owed.wait_gone(Instant::now() + drain);
        }
        let _ = server.shutdown(Shutdown::Both);
        let _ = client.shutdown(Shutdown::Both);
        let b = back.join().unwrap_or(Ok(()));
        r.map(|_| ()).and(b)
    });
    hub.close(id);
    result
}

/// An interposer's bounds.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Client connections open at once. One more is refused as the server refuses one over
    /// its own cap: PostgreSQL's `FATAL` ErrorResponse `53300` (too_many_connections) after
    /// its startup packet, Redis' `-ERR max number of clients reached`. Default 256.
    pub max_connections: usize,
    /// Largest message (PostgreSQL, either direction) or command and reply bulk (Redis),
    /// bytes. A larger one is answered with an error naming the bound (PostgreSQL: `FATAL`
    /// `54000` program_limit_exceeded; Redis: `-ERR`) and the connection is closed. Default
    /// 64 MiB.
    pub max_message: usize,
    /// Longest a step is held before it goes on by itself (a conductor that stopped). Default
    /// 120 s.
    pub max_hold: Duration,
    /// Connecting to the server. Default 5 s.
    pub connect_timeout: Duration,
    /// How long a new client connection may take to send its startup packet (PostgreSQL)
    /// or its first whole command (Redis); one that has not is closed. Default
    /// [`STARTUP_TIMEOUT`].
    pub startup_timeout: Duration,
    /// How long a relay thread outside a run polls its socket without blocking before it
    /// sleeps in `read`, when it expects bytes soon and the machine has a core to spare
    /// (docs/INTERPOSER.md, "Outside a run", says when). Zero never polls. Default
    /// [`BUSY_POLL`] (300 µs).
    pub busy_poll: Duration,
}

/// The default [`Limits::startup_timeout`]: 10 s. PostgreSQL's own `authentication_timeout`
/// is 60 s; ours is shorter because every connection that has not started holds one of
/// [`Limits::max_connections`] slots and a thread.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 256,
            max_message: 64 << 20,
            max_hold: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(5),
            startup_timeout: STARTUP_TIMEOUT,
            busy_poll: spin::BUSY_POLL,
        }
    }
}

/// A running interposer; stopped (listener and every relayed connection closed) on drop.
pub struct Interposer {
    store: StoreKind,
    addr: SocketAddr,
    upstream: SocketAddr,
    hub: Arc<Hub>,
    stop: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<(u64, TcpStream)>>>,
    accept: Option<JoinHandle<()>>,
}

impl Interposer {
    /// Listens on a free loopback port and relays each connection to `upstream`.
    ///
    /// Will return `Err` when no loopback port can be bound.
    pub fn start(store: StoreKind, upstream: SocketAddr, limits: Limits) -> std::io::Result<Self> {
        Self::start_on(
            SocketAddr::from(([127, 0, 0, 1], 0)),
            store,
            upstream,
            limits,
        )
    }

    /// Listens on `listen` (port 0: a free one) and relays each connection to `upstream`.
    /// The caller checks that `listen` is a loopback address.
    ///
    /// Will return `Err` when `listen` cannot be bound (in use, not an address of this host).
    pub(crate) fn start_on(
        listen: SocketAddr,
        store: StoreKind,
        upstream: SocketAddr,
        limits: Limits,
    ) -> std::io::Result<Self> {
        // Each relayed session holds about nine descriptors: the soft limit is raised to the
        // hard one first, as servers do, so [`Limits::max_connections`] is reachable.
        let _ = ticketflow_core::os::raise_nofile();
        let listener = TcpListener::bind(listen)?;
        let addr = listener.local_addr()?;
        let hub = Arc::new(Hub::default());
        let stop = Arc::new(AtomicBool::new(false));
        let open: Arc<Mutex<Vec<(u64, TcpStream)>>> = Arc::default();
        let accept = {
            let (hub, stop, open) = (hub.clone(), stop.clone(), open.clone());
            std::thread::Builder::new()
                .name(format!("interpose-{}", store.name()))
                .spawn(move || accept_loop(listener, store, upstream, hub, stop, open, limits))?
        };
        Ok(Interposer {
            store,
            addr,
            upstream,
            hub,
            stop,
            open,
            accept: Some(accept),
        })
    }

    /// The address the service connects to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server it relays to.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// Its server kind.
    pub fn store(&self) -> StoreKind {
        self.store
    }

    /// The shared state a conductor reads and drives.
    pub fn hub(&self) -> &Arc<Hub> {
        &self.hub
    }
}

impl Drop for Interposer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.hub.end();
        // Wakes the accept loop.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        for (_, s) in self
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            let _ = s.shutdown(Shutdown::Both);
        }
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// The first wait after a failed accept: 5 ms.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);

/// The longest wait between failed accepts: 1 s.
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

fn accept_loop(
    listener: TcpListener,
    store: StoreKind,
    upstream: SocketAddr,
    hub: Arc<Hub>,
    stop: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<(u64, TcpStream)>>>,
    limits: Limits,
) {
    let live = Arc::new(AtomicUsize::new(0));
    let refusing = Arc::new(AtomicUsize::new(0));
    let mut next: u64 = 0;
    let mut backoff = Duration::ZERO;
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let conn = match conn {
            Ok(conn) => {
                backoff = Duration::ZERO;
                conn
            }
            Err(e) => {
                // Out of descriptors (EMFILE, ENFILE) or memory: the connection stays queued
                // and the next accept fails at once, so the loop backs off, 5 ms doubling to
                // 1 s (as Go's net/http server does), instead of spinning a core.
                if backoff.is_zero() {
                    tracing::warn!(error = %e, "interposer cannot accept a connection; backing off");
                }
                backoff = (backoff * 2).clamp(ACCEPT_BACKOFF_MIN, ACCEPT_BACKOFF_MAX);
                std::thread::sleep(backoff);
                continue;
            }
        };
        if live.load(Ordering::SeqCst) >= limits.max_connections {
            refuse(conn, store, upstream, &limits, &refusing);
            continue;
        }
        let _ = conn.set_nodelay(true);
        next += 1;
        let id = next;
        if let Ok(c) = conn.try_clone() {
            open.lock().unwrap_or_else(|p| p.into_inner()).push((id, c));
        }
        live.fetch_add(1, Ordering::SeqCst);
        let (hub, limits, live, open) = (hub.clone(), limits.clone(), live.clone(), open.clone());
        let spawned = std::thread::Builder::new()
            .name("interpose-conn".into())
            .spawn(move || {
                let r = match store {
                    StoreKind::Postgres => pgwire::relay(conn, upstream, &hub, &limits),
                    StoreKind::Redis => resp::relay(conn, upstream, &hub, &limits),
                };
                match r {
                    // Out of descriptors: the client sees its connection close unanswered, so
                    // the log says why.
                    Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                        tracing::warn!(error = %e, "interposer closed a connection: out of file descriptors");
                    }
                    Err(e) => tracing::debug!(error = %e, "interposed connection ended"),
                    Ok(()) => {}
                }
                // The relay is over: the client sees its connection close now, whatever other
                // handle of the socket is left (a client that waits for the server to close,
                // as libpq does after a CancelRequest, would otherwise wait for ever).
                let mut list = open.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(at) = list.iter().position(|(i, _)| *i == id) {
                    let (_, s) = list.swap_remove(at);
                    let _ = s.shutdown(Shutdown::Both);
                }
                drop(list);
                live.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            tracing::warn!("interposer could not start a connection thread");
        }
    }
}

/// A connection over [`Limits::max_connections`], refused as the server refuses one over its
/// own cap: PostgreSQL's `FATAL 53300` after the startup packet, Redis' `-ERR max number of
/// clients reached` at once. The refusals under way are bounded by the same cap; one more is
/// closed without an answer.
fn refuse(
    conn: TcpStream,
    store: StoreKind,
    upstream: SocketAddr,
    limits: &Limits,
    refusing: &Arc<AtomicUsize>,
) {
    let max = limits.max_connections;
    tracing::warn!(
        max,
        store = store.name(),
        "interposer connection cap reached; refused a connection"
    );
    if refusing.fetch_add(1, Ordering::SeqCst) >= max {
        refusing.fetch_sub(1, Ordering::SeqCst);
        let _ = conn.shutdown(Shutdown::Both);
        return;
    }
    let (limits, refusing) = (limits.clone(), refusing.clone());
    let spawned = std::thread::Builder::new()
        .name("interpose-refuse".into())
        .spawn(move || {
            match store {
                StoreKind::Postgres => pgwire::refuse(&conn, upstream, &limits),
                StoreKind::Redis => resp::refuse(&conn),
            }
            refusing.fetch_sub(1, Ordering::SeqCst);
        });
    if spawned.is_err() {
        tracing::warn!("interposer could not start a refusal thread");
    }
}

/// `url` with its host and port replaced by `addr` (a `postgres://` or `redis://` URL), so a
/// service configured with it connects to the interposer; the rest (user, password,
/// database, query) is kept, but for a PostgreSQL URL's `sslmode`, which becomes `disable`.
///
/// Will return `None` for a URL without `://`.
pub fn url_through(url: &str, addr: SocketAddr) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let userinfo = authority.rsplit_once('@').map(|(u, _)| u);
    // The interposer answers SSLRequest "no" and relays plain text on loopback: a PostgreSQL
    // URL through it says `sslmode=disable` (a `require` could never connect, and a client
    // whose default is `require`, as Go's lib/pq, would fail without it).
    let tail = if scheme.starts_with("postgres") {
        plain_text(tail)
    } else {
        tail.to_string()
    };
    Some(match userinfo {
        Some(u) => format!("{scheme}://{u}@{addr}{tail}"),
        None => format!("{scheme}://{addr}{tail}"),
    })
}

/// A PostgreSQL URL's path and query with any `sslmode` replaced by `sslmode=disable`.
fn plain_text(tail: &str) -> String {
    let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
    let mut params: Vec<&str> = query
        .split('&')
        .filter(|p| !p.is_empty() && !p.starts_with("sslmode="))
        .collect();
    params.push("sslmode=disable");
    format!("{path}?{}", params.join("&"))
}

/// The server address of a `postgres://` or `redis://` URL: host (default `localhost`) and
/// port (default 5432 or 6379), resolved.
///
/// Will return `Err` when the URL has no scheme, names a Unix socket, or its host does not
/// resolve.
pub fn upstream_of(url: &str) -> Result<SocketAddr, UpstreamError> {
    use std::net::ToSocketAddrs as _;
    let (scheme, rest) = url.split_once("://").ok_or(UpstreamError::NotUrl)?;
    let (host, port) = if scheme.starts_with("redis") {
        // redis://[user:password@]host[:port][/db]
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let authority = &rest[..end];
        let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        match hostport
            .rsplit_once(':')
            .map(|(h, p)| (h, p.parse::<u16>()))
        {
            Some((h, Ok(port))) => (h.to_string(), port),
            _ => (hostport.to_string(), 6379),
        }
    } else {
        // The project's one PostgreSQL URL parser, so `?host=` and defaults read as they do
        // everywhere else.
        use postgres::config::Host;
        let config = ticketflow_core::store::url::parse_postgres(url)?;
        let host = match config.get_hosts().first() {
            Some(Host::Tcp(h)) => h.clone(),
            Some(Host::Unix(p)) => return Err(UpstreamError::UnixSocket(p.clone())),
            None => String::new(),
        };
        (host, config.get_ports().first().copied().unwrap_or(5432))
    };
    let host = if host.is_empty() {
        "localhost".to_string()
    } else {
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .to_string()
    };
    (host.as_str(), port)
        .to_socket_addrs()
        .map_err(|source| UpstreamError::Resolve {
            host: host.clone(),
            port,
            source,
        })?
        .next()
        .ok_or(UpstreamError::NoAddress { host, port })
}

/// Why [`upstream_of`] cannot name the server of a URL.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// No `scheme://`.
    #[error("not a URL (no ://)")]
    NotUrl,
    /// A PostgreSQL URL that does not parse.
    #[error(transparent)]
    Postgres(#[from] ticketflow_core::StoreError),
    /// A PostgreSQL URL whose host is a Unix socket: only TCP can be interposed.
    #[error("a Unix socket ({}) cannot be interposed: give a TCP host", .0.display())]
    UnixSocket(std::path::PathBuf),
    /// The host does not resolve.
    #[error("{host}:{port}: {source}")]
    Resolve {
        /// The host.
        host: String,
        /// The port.
        port: u16,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The host resolves to no address.
    #[error("{host}:{port} resolves to no address")]
    NoAddress {
        /// The host.
        host: String,
        /// The port.
        port: u16,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_through_the_interposer_keeps_user_database_and_query() {
        let addr: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        assert_eq!(
            url_through("postgres://u:p@db.example:5432/shop?sslmode=disable", addr).unwrap(),
            "postgres://u:p@127.0.0.1:4000/shop?sslmode=disable"
        );
        assert_eq!(
            url_through("redis://127.0.0.1:6379/3", addr).unwrap(),
            "redis://127.0.0.1:4000/3"
        );
        assert_eq!(
            url_through("redis://h", addr).unwrap(),
            "redis://127.0.0.1:4000"
        );
        assert!(url_through("nonsense", addr).is_none());
        // Plain text through the interposer: any sslmode becomes disable.
        assert_eq!(
            url_through("postgres://u@h:5432/shop", addr).unwrap(),
            "postgres://u@127.0.0.1:4000/shop?sslmode=disable"
        );
        assert_eq!(
            url_through(
                "postgresql://u@h/shop?sslmode=require&application_name=x",
                addr
            )
            .unwrap(),
            "postgresql://u@127.0.0.1:4000/shop?application_name=x&sslmode=disable"
        );
    }

    #[test]
    fn the_upstream_of_a_url_defaults_its_port_by_scheme() {
        assert_eq!(
            upstream_of("postgres://postgres@127.0.0.1/x")
                .unwrap()
                .port(),
            5432
        );
        assert_eq!(upstream_of("redis://127.0.0.1/2").unwrap().port(), 6379);
        assert_eq!(
            upstream_of("postgresql://u:p@127.0.0.1:6000/x")
                .unwrap()
                .port(),
            6000
        );
        assert!(upstream_of("no-scheme").is_err());
    }
}
