//! Connections of `ticketflow serve`: our own accept loop over hyper's HTTP/1.1 connection, so
//! the service bounds what slow, idle or too many clients can hold ([`Limits`]).
//!
//! - **Header-read timeout**: once the first byte of a request head arrived, the whole head
//!   must arrive within it (a slowloris client is closed).
//! - **Idle timeout**: a connection with no request in flight and no byte moving is closed
//!   after it (a keep-alive connection nobody uses, or a socket that never sends).
//! - **Request timeout**: a request whose answer is not ready in time gets a 503
//!   (`…:temporarily-unavailable`, `cause: request-timeout`); for a POST or PATCH whose body
//!   had fully arrived the work may still finish, so `written` is `unknown` and a create is
//!   retried with the same key; when the body had not (a client that stalls mid-body), no work
//!   began and `written` is `nothing`.
//! - **Maximum connections**: at the limit, a new connection first takes the place of the
//!   connection idle the longest, else of the one whose request head has been arriving the
//!   longest; only when every connection has a request in flight is the newcomer answered
//!   503 and closed. An idle or slow flood therefore never locks out a client that sends its
//!   request promptly. The limit is also capped by the process's file descriptors (see
//!   [`fd_budget`]).
//!
//! **Invariant:** a connection holds one permit of the connection semaphore for its whole
//! life, so after shutdown the accept loop knows every connection ended when it gets every
//! permit back.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::response::IntoResponse;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify, Semaphore};

use super::{Problem, Route};
use ticketflow_core::error::{Transient, TransientCause, Written};

/// The server's limits on connections and requests; each has a `serve` flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections held at once (`--max-connections`, default 1024, capped by
    /// [`fd_budget`]).
    pub max_connections: usize,
    /// From a request head's first byte to its last (`--header-read-timeout-ms`, default 10 s).
    pub header_read_timeout: Duration,
    /// A connection with no request in flight and no byte moving is closed after this
    /// (`--idle-timeout-ms`, default 60 s).
    pub idle_timeout: Duration,
    /// From a request's head to its answer (`--request-timeout-ms`, default 30 s).
    pub request_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 1024,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            request_timeout: Duration::from_secs(30),
        }
    }
}

impl Limits {
    /// The default `max_connections`: 1024, or what [`fd_budget`] allows when that is less
    /// (at least 1).
    pub fn default_max_connections(pool_size: u32) -> usize {
        let budget = fd_budget(pool_size).unwrap_or(1024).max(1);
        budget.min(Limits::default().max_connections as u64) as usize
    }
}

/// Descriptors kept back from connections: stdio, the listener, the runtime's own, log and
/// database files, a margin.
const FD_RESERVE: u64 = 64;

/// How many connections this process can hold: the soft `RLIMIT_NOFILE` (first raised to the
/// hard limit, as most servers do at start-up) less the database sessions (`pool_size`) and a
/// reserve for everything else. `None` when the limit cannot be read.
pub fn fd_budget(pool_size: u32) -> Option<u64> {
    let soft = ticketflow_core::os::raise_nofile()?;
    Some(soft.saturating_sub(u64::from(pool_size) + FD_RESERVE))
}

/// Milliseconds since the first call in this process: the clock of [`Activity`].
fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

/// No request head is arriving (`head_started_ms`).
const NONE: u64 = 0;

/// What one connection is doing, shared by its I/O wrapper, its request wrapper and its
/// watchdog.
#[derive(Debug)]
struct Activity {
    id: u64,
    /// Requests of this connection being answered (0 or 1 for HTTP/1.1).
    in_flight: AtomicUsize,
    /// When a byte was last read or written.
    last_activity_ms: AtomicU64,
    /// When the first byte of the request head now arriving was read; [`NONE`] otherwise.
    head_started_ms: AtomicU64,
    /// Chosen to make room for a newcomer; closing.
    evicted: AtomicBool,
    close: Notify,
}

/// Where a connection stands, for the timeouts and the choice of whom to evict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// No request in flight, no head arriving, since this instant (ms).
    Idle(u64),
    /// A request head has been arriving since this instant (ms).
    ReadingHead(u64),
    /// A request is being answered.
    Busy,
}

impl Activity {
    fn new(id: u64) -> Self {
        Activity {
            id,
            in_flight: AtomicUsize::new(0),
            last_activity_ms: AtomicU64::new(now_ms()),
            head_started_ms: AtomicU64::new(NONE),
            evicted: AtomicBool::new(false),
            close: Notify::new(),
        }
    }

    fn phase(&self) -> Phase {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return Phase::Busy;
        }
        match self.head_started_ms.load(Ordering::Acquire) {
            NONE => Phase::Idle(self.last_activity_ms.load(Ordering::Acquire)),
            since => Phase::ReadingHead(since),
        }
    }

    fn on_read(&self) {
        let now = now_ms();
        self.last_activity_ms.store(now, Ordering::Release);
        if self.in_flight.load(Ordering::Acquire) == 0 {
            let _ = self.head_started_ms.compare_exchange(
                NONE,
                now,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
    }

    fn on_write(&self) {
        self.last_activity_ms.store(now_ms(), Ordering::Release);
    }

    /// Which timeout, if any, this connection has run past at `now`.
    fn expired(&self, limits: &Limits, now: u64) -> Option<&'static str> {
        let past =
            |since: u64, limit: Duration| now.saturating_sub(since) > limit.as_millis() as u64;
        match self.phase() {
            Phase::Idle(since) if past(since, limits.idle_timeout) => Some("idle timeout"),
            Phase::ReadingHead(since) if past(since, limits.header_read_timeout) => {
                Some("header-read timeout")
            }
            _ => None,
        }
    }
}

/// Counts a request in flight while it lives.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn start(activity: &Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::AcqRel);
        activity.head_started_ms.store(NONE, Ordering::Release);
        InFlight(Arc::clone(activity))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.last_activity_ms.store(now_ms(), Ordering::Release);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A socket that reports every byte moved to its [`Activity`].
struct Tracked {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.on_read();
        }
        polled
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.on_write();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The live connections, for eviction.
#[derive(Default)]
struct Registry {
    next_id: AtomicU64,
    live: Mutex<HashMap<u64, Arc<Activity>>>,
}

impl Registry {
    fn add(&self) -> Arc<Activity> {
        let activity = Arc::new(Activity::new(self.next_id.fetch_add(1, Ordering::Relaxed)));
        self.lock().insert(activity.id, Arc::clone(&activity));
        activity
    }

    fn remove(&self, id: u64) {
        self.lock().remove(&id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Activity>>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Asks one connection to close to make room: the one idle the longest, else the one
    /// whose request head has been arriving the longest. `false` when every connection has
    /// a request in flight (or is already closing).
    fn evict_one(&self) -> bool {
        let live = self.lock();
        let candidates = live
            .values()
            .filter(|a| !a.evicted.load(Ordering::Acquire))
            .map(|a| (a.phase(), a));
        let oldest_idle = candidates
            .clone()
            .filter_map(|(p, a)| match p {
                Phase::Idle(since) => Some((since, a)),
                _ => None,
            })
            .min_by_key(|(since, _)| *since);
        let oldest_head = || {
            candidates
                .filter_map(|(p, a)| match p {
                    Phase::ReadingHead(since) => Some((since, a)),
                    _ => None,
                })
                .min_by_key(|(since, _)| *since)
        };
        match oldest_idle.or_else(oldest_head) {
            Some((_, victim)) => {
                victim.evicted.store(true, Ordering::Release);
                victim.close.notify_one();
                true
            }
            None => false,
        }
    }
}

/// The route a request is for, from its method, for a request timeout's advice.
fn route_of(method: &hyper::Method) -> Route {
    match *method {
        hyper::Method::POST => Route::Create,
        hyper::Method::PATCH => Route::Update,
        _ => Route::Read,
    }
}

/// Answers one request through `router`, or a 503 when it takes longer than
/// `request_timeout`.
async fn answer(
    router: Router,
    request: hyper::Request<Incoming>,
    request_timeout: Duration,
    activity: Arc<Activity>,
) -> Result<axum::response::Response, Infallible> {
    let _in_flight = InFlight::start(&activity);
    let route = route_of(request.method());
    let arrived = Arc::new(AtomicBool::new(hyper::body::Body::is_end_stream(
        request.body(),
    )));
    let request = request.map(|body| {
        axum::body::Body::new(Watched {
            inner: body,
            arrived: Arc::clone(&arrived),
        })
    });
    let call = tower::ServiceExt::oneshot(router, request);
    match tokio::time::timeout(request_timeout, call).await {
        Ok(Ok(response)) => Ok(response),
        Ok(Err(never)) => match never {},
        Err(_) => {
            tracing::warn!(
                timeout_ms = request_timeout.as_millis() as u64,
                "request timed out; answered 503"
            );
            // No work starts before the whole body is read: a body still arriving means
            // nothing was written.
            let written = match route {
                Route::Create | Route::Update if arrived.load(Ordering::Acquire) => {
                    Written::Unknown
                }
                _ => Written::Nothing,
            };
            let cause = TransientCause::RequestTimeout;
            Ok(Problem::transient(Transient { cause, written }, route).into_response())
        }
    }
}

/// A request body that records when its last byte has arrived (the end of the stream was
/// seen), so a request timeout can tell "the body never arrived" from "the work may have run".
struct Watched {
    inner: Incoming,
    arrived: Arc<AtomicBool>,
}

impl hyper::body::Body for Watched {
    type Data = axum::body::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        let ended = matches!(polled, Poll::Ready(None)) || self.inner.is_end_stream();
        if ended && !matches!(polled, Poll::Ready(Some(Err(_)))) {
            self.arrived.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// How often a connection's watchdog looks at its timeouts: an eighth of the shorter one,
/// between 5 ms and 1 s.
fn tick(limits: &Limits) -> Duration {
    (limits.header_read_timeout.min(limits.idle_timeout) / 8)
        .clamp(Duration::from_millis(5), Duration::from_secs(1))
}

async fn run_connection(
    stream: TcpStream,
    router: Router,
    limits: Limits,
    activity: Arc<Activity>,
    mut shutdown: watch::Receiver<bool>,
) {
    let io = TokioIo::new(Tracked {
        inner: stream,
        activity: Arc::clone(&activity),
    });
    let service = {
        let activity = Arc::clone(&activity);
        hyper::service::service_fn(move |request| {
            answer(
                router.clone(),
                request,
                limits.request_timeout,
                Arc::clone(&activity),
            )
        })
    };
    let connection = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .serve_connection(io, service);
    tokio::pin!(connection);
    let mut watchdog = tokio::time::interval(tick(&limits));
    watchdog.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut draining = *shutdown.borrow();
    if draining {
        connection.as_mut().graceful_shutdown();
    }
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            () = activity.close.notified() => {
                tracing::debug!(connection = activity.id, "closed to make room for a new connection");
                return;
            }
            _ = watchdog.tick() => {
                if let Some(why) = activity.expired(&limits, now_ms()) {
                    tracing::debug!(connection = activity.id, reason = why, "connection closed");
                    return;
                }
            }
            changed = shutdown.changed(), if !draining => {
                draining = true;
                if changed.is_err() || *shutdown.borrow() {
                    connection.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// The answer to a connection over the limit when no connection can make room: 503 with
/// `Retry-After`, then close.
async fn refuse(mut stream: TcpStream) {
    let problem = Problem::transient(
        Transient {
            cause: TransientCause::TooManyConnections,
            written: Written::Nothing,
        },
        Route::Read,
    );
    let body = serde_json::to_string(&problem).expect("problems serialize");
    let reply = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: {}\r\nretry-after: {}\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n{body}",
        super::PROBLEM_JSON,
        super::RETRY_AFTER_SECS,
        body.len()
    );
    let write = async {
        stream.write_all(reply.as_bytes()).await?;
        stream.shutdown().await
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), write).await;
}

/// Accept errors that concern one connection only (the peer gave up): go on at once.
fn is_peer_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// Accepts and serves connections under `limits` until `shutdown` turns `true`, then lets
/// every connection finish its request in flight (graceful shutdown) and returns once all
/// have closed.
pub(super) async fn serve_connections(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    mut shutdown: watch::Receiver<bool>,
) {
    let max = limits.max_connections.max(1);
    let permits = Arc::new(Semaphore::new(max));
    let registry = Arc::new(Registry::default());
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.wait_for(|stopping| *stopping) => break,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(e) if is_peer_error(&e) => continue,
            Err(e) => {
                // Out of file descriptors (EMFILE) or similar: back off, do not spin.
                tracing::warn!(error = %e, "accept failed; retrying in 50 ms");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let permit = match Arc::clone(&permits).try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) if registry.evict_one() => {
                let freed = Arc::clone(&permits).acquire_owned();
                tokio::time::timeout(Duration::from_secs(1), freed)
                    .await
                    .ok()
                    .and_then(Result::ok)
            }
            Err(_) => None,
        };
        let Some(permit) = permit else {
            tracing::warn!(
                max_connections = max,
                "connection limit reached with every connection busy; answered 503"
            );
            tokio::spawn(refuse(stream));
            continue;
        };
        let activity = registry.add();
        let (router, registry, shutdown) =
            (router.clone(), Arc::clone(&registry), shutdown.clone());
        tokio::spawn(async move {
            let id = activity.id;
            run_connection(stream, router, limits, activity, shutdown).await;
            registry.remove(id);
            drop(permit);
        });
    }
    drop(listener);
    // Every connection holds a permit until it ends: all back means all ended.
    let _ = permits.acquire_many(max as u32).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(header_ms: u64, idle_ms: u64) -> Limits {
        Limits {
            header_read_timeout: Duration::from_millis(header_ms),
            idle_timeout: Duration::from_millis(idle_ms),
            ..Limits::default()
        }
    }

    #[test]
    fn idle_and_head_timeouts_follow_the_phase() {
        let a = Activity::new(1);
        let l = limits(100, 1_000);
        let t0 = a.last_activity_ms.load(Ordering::Acquire);
        assert_eq!(a.expired(&l, t0 + 500), None);
        assert_eq!(a.expired(&l, t0 + 1_001), Some("idle timeout"));
        a.head_started_ms.store(t0, Ordering::Release);
        assert_eq!(a.expired(&l, t0 + 101), Some("header-read timeout"));
        let a = Arc::new(a);
        let busy = InFlight::start(&a);
        assert_eq!(a.phase(), Phase::Busy);
        assert_eq!(
            a.expired(&l, t0 + 1_000_000),
            None,
            "a busy connection never expires"
        );
        drop(busy);
        assert!(matches!(a.phase(), Phase::Idle(_)));
    }

    #[test]
    fn eviction_prefers_the_longest_idle_then_the_slowest_head_never_a_busy_one() {
        let r = Registry::default();
        let (busy, head, idle_new, idle_old) = (r.add(), r.add(), r.add(), r.add());
        let _b = InFlight::start(&busy);
        head.head_started_ms.store(1, Ordering::Release);
        idle_old.last_activity_ms.store(2, Ordering::Release);
        idle_new.last_activity_ms.store(5, Ordering::Release);
        assert!(r.evict_one());
        assert!(idle_old.evicted.load(Ordering::Acquire));
        assert!(r.evict_one());
        assert!(idle_new.evicted.load(Ordering::Acquire));
        assert!(r.evict_one());
        assert!(head.evicted.load(Ordering::Acquire));
        assert!(!r.evict_one(), "only a busy connection is left");
        assert!(!busy.evicted.load(Ordering::Acquire));
    }
}
