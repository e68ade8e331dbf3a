//! Deadlines for waits on a PostgreSQL server that the synchronous `postgres` client cannot
//! bound by itself.
//!
//! - [`connect_within`] runs the TCP connect **and** the startup handshake (authentication,
//!   parameter status, `ReadyForQuery`) on a helper thread and gives up after a deadline; the
//!   client's own `connect_timeout` bounds the TCP connect only. The socket of a connect given
//!   up on is shut down, so the helper thread ends too.
//! - [`watch`] registers a call with a process-wide watchdog thread. After [`WARN_AFTER`] the
//!   watchdog prints one line on stderr naming what is waited for
//!   (`waiting 10 s for PostgreSQL at HOST:PORT: WHAT`); at the call's hard deadline it shuts
//!   down (`shutdown(2)`, `SHUT_RDWR`) this process's TCP sockets connected to that server, so
//!   the blocked call returns a connection error. A server that answers nothing within a hard
//!   deadline (which is always longer than the session's own server-side `statement_timeout`) is
//!   treated as gone for the whole process: the sync client does not expose its socket, so a
//!   single connection cannot be singled out.
//!
//! A keepalive and `tcp_user_timeout` catch a dead peer (no ACK); these deadlines catch a peer
//! whose TCP stays up but that forwards nothing (a stalled proxy, a frozen server).
//!
//! Linux only for the socket shutdown (`/proc/self/fd`); elsewhere the deadlines still end the
//! wait of the caller of [`connect_within`], and [`watch`] only prints.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::sync::mpsc;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use postgres::config::Host;

/// How long any wait may last before a line on stderr says what is waited for.
pub const WARN_AFTER: Duration = Duration::from_secs(10);

/// The deadline for TCP connect plus startup handshake when the URL gives no
/// `connect_timeout`.
pub const CONNECT_DEADLINE: Duration = Duration::from_secs(10);

/// The server a session talks to: `HOST:PORT` for messages, and its socket addresses (empty
/// for a Unix-domain socket, whose connections are then never shut down).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    label: String,
    addrs: Vec<SocketAddr>,
}

impl Peer {
    /// The first host and port of `config` (the harness's URLs name one server). An IP literal
    /// or `localhost` is taken as is; another name is resolved now (as the connect would).
    pub fn of(config: &postgres::Config) -> Peer {
        let port = config.get_ports().first().copied().unwrap_or(5432);
        if let Some(ip) = config.get_hostaddrs().first() {
            return Peer::tcp(&ip.to_string(), port);
        }
        match config.get_hosts().first() {
            Some(Host::Tcp(h)) => Peer::tcp(h, port),
            #[cfg(unix)]
            Some(Host::Unix(path)) => Peer {
                label: format!("{}/.s.PGSQL.{port}", path.display()),
                addrs: Vec::new(),
            },
            None => Peer::tcp("localhost", port),
        }
    }

    fn tcp(host: &str, port: u16) -> Peer {
        let addrs = match host.trim_matches(['[', ']']).parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) if host == "localhost" => vec![
                SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port),
                SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), port),
            ],
            Err(_) => (host, port)
                .to_socket_addrs()
                .map(Iterator::collect)
                .unwrap_or_default(),
        };
        let label = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        Peer { label, addrs }
    }

    /// `HOST:PORT` (or the socket path), for messages.
    pub fn label(&self) -> &str {
        &self.label
    }
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label)
    }
}

/// A wait given up at its deadline.
#[derive(Debug, Clone, thiserror::Error)]
#[error("no answer from PostgreSQL at {peer} within {} s ({what})", secs(*.within))]
pub struct GaveUp {
    /// The server.
    pub peer: String,
    /// What was waited for.
    pub what: String,
    /// The deadline that passed.
    pub within: Duration,
}

/// A duration in seconds for messages: whole seconds, or one decimal below 10 s.
fn secs(d: Duration) -> String {
    if d.as_millis() % 1000 == 0 || d >= Duration::from_secs(10) {
        format!("{}", d.as_secs())
    } else {
        format!("{:.1}", d.as_secs_f64())
    }
}

/// Connects with `config` (no TLS), giving up after `within` for the TCP connect and the startup
/// handshake together. Returns the client, or the driver's error, or [`GaveUp`] naming
/// `peer`; a connect given up on has its socket shut down. While the connect waits longer
/// than [`WARN_AFTER`] the watchdog says so.
///
/// Will return `Err` as described; never blocks longer than `within` (plus thread start).
pub fn connect_within(
    config: &postgres::Config,
    peer: &Peer,
    within: Duration,
) -> Result<Result<postgres::Client, postgres::Error>, GaveUp> {
    let before = sockets_to(&peer.addrs);
    let (tx, rx) = mpsc::channel();
    let cfg = config.clone();
    let spawned = std::thread::Builder::new()
        .name("pg-connect".into())
        .spawn(move || {
            let _ = tx.send(cfg.connect(postgres::NoTls));
        });
    if spawned.is_err() {
        // No thread to spare: connect here, bounded by the watchdog instead.
        return match watch_result("connect and startup", peer, within, || {
            config.connect(postgres::NoTls)
        }) {
            Ok(out) => Ok(out),
            Err(gave_up) => Err(gave_up),
        };
    }
    let waiting = Registration::new("connect and startup", peer, None, true);
    let answer = rx.recv_timeout(within);
    drop(waiting);
    match answer {
        Ok(result) => Ok(result),
        Err(_) => {
            // Ours: the sockets to the server that were not there before the connect.
            for (fd, local) in sockets_to(&peer.addrs) {
                if !before.contains(&(fd, local)) {
                    shut(fd);
                }
            }
            Err(GaveUp {
                peer: peer.label.clone(),
                what: "TCP connect and startup handshake".into(),
                within,
            })
        }
    }
}

/// Runs `f`, a call on a session with `peer`, under the watchdog: a line on stderr after
/// [`WARN_AFTER`], and at `hard` this process's sockets to `peer` are shut down so the call
/// returns (an error). Returns what `f` returned, or [`GaveUp`] if the deadline passed and `f`
/// failed.
///
/// Will return `Err` as described.
pub fn watch_result<T, E>(
    what: &str,
    peer: &Peer,
    hard: Duration,
    f: impl FnOnce() -> Result<T, E>,
) -> Result<Result<T, E>, GaveUp> {
    match watch(what, peer, hard, f) {
        (Err(_), Some(gave_up)) => Err(gave_up),
        (out, _) => Ok(out),
    }
}

/// [`watch_result`] for any call: returns what `f` returned (after a shutdown at `hard`, that
/// is typically the client's connection error) and, if the deadline passed, why.
pub fn watch<T>(
    what: &str,
    peer: &Peer,
    hard: Duration,
    f: impl FnOnce() -> T,
) -> (T, Option<GaveUp>) {
    watch_inner(what, peer, hard, true, f)
}

/// As [`watch`] but without the stderr line after [`WARN_AFTER`]: a safety net around a whole
/// run, whose own waits print their lines (a long healthy run is not a wait).
pub fn watch_quietly<T>(
    what: &str,
    peer: &Peer,
    hard: Duration,
    f: impl FnOnce() -> T,
) -> (T, Option<GaveUp>) {
    watch_inner(what, peer, hard, false, f)
}

fn watch_inner<T>(
    what: &str,
    peer: &Peer,
    hard: Duration,
    warn: bool,
    f: impl FnOnce() -> T,
) -> (T, Option<GaveUp>) {
    let registration = Registration::new(what, peer, Some(hard), warn);
    let out = f();
    let gave_up = registration.finish().then(|| GaveUp {
        peer: peer.label.clone(),
        what: what.to_string(),
        within: hard,
    });
    (out, gave_up)
}

struct Waiting {
    id: u64,
    what: String,
    peer: Peer,
    since: Instant,
    warned: bool,
    hard_at: Option<Instant>,
    fired: bool,
}

struct Watchdog {
    list: Mutex<(u64, Vec<Waiting>)>,
    wake: Condvar,
}

fn watchdog() -> &'static Watchdog {
    static DOG: OnceLock<&'static Watchdog> = OnceLock::new();
    DOG.get_or_init(|| {
        let dog: &'static Watchdog = Box::leak(Box::new(Watchdog {
            list: Mutex::new((0, Vec::new())),
            wake: Condvar::new(),
        }));
        let _ = std::thread::Builder::new()
            .name("pg-watchdog".into())
            .spawn(move || run_watchdog(dog));
        dog
    })
}

fn run_watchdog(dog: &'static Watchdog) {
    let mut guard = dog.list.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        for w in guard.1.iter_mut() {
            let warn_at = w.since + WARN_AFTER;
            if !w.warned {
                if now >= warn_at {
                    w.warned = true;
                    eprintln!(
                        "waiting {} s for PostgreSQL at {}: {}",
                        now.duration_since(w.since).as_secs(),
                        w.peer,
                        w.what
                    );
                } else {
                    next = Some(next.map_or(warn_at, |n| n.min(warn_at)));
                }
            }
            if let Some(hard_at) = w.hard_at.filter(|_| !w.fired) {
                if now >= hard_at {
                    w.fired = true;
                    eprintln!(
                        "no answer from PostgreSQL at {} within {} s ({}): shutting down this process's connections to it",
                        w.peer,
                        secs(hard_at.duration_since(w.since)),
                        w.what
                    );
                    for (fd, _) in sockets_to(&w.peer.addrs) {
                        shut(fd);
                    }
                } else {
                    next = Some(next.map_or(hard_at, |n| n.min(hard_at)));
                }
            }
        }
        let sleep = next
            .map(|n| n.saturating_duration_since(now))
            .unwrap_or(Duration::from_secs(3600));
        guard = dog
            .wake
            .wait_timeout(guard, sleep.max(Duration::from_millis(1)))
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

/// A wait registered with the watchdog; unregistered on drop.
struct Registration {
    id: u64,
}

impl Registration {
    fn new(what: &str, peer: &Peer, hard: Option<Duration>, warn: bool) -> Registration {
        let dog = watchdog();
        let mut list = dog.list.lock().unwrap_or_else(|p| p.into_inner());
        list.0 += 1;
        let id = list.0;
        let since = Instant::now();
        list.1.push(Waiting {
            id,
            what: what.to_string(),
            peer: peer.clone(),
            since,
            warned: !warn,
            hard_at: hard.map(|h| since + h),
            fired: false,
        });
        dog.wake.notify_all();
        Registration { id }
    }

    /// Unregisters; `true` if the watchdog shut the connections down meanwhile.
    fn finish(self) -> bool {
        let fired = remove(self.id);
        std::mem::forget(self);
        fired
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        remove(self.id);
    }
}

fn remove(id: u64) -> bool {
    let dog = watchdog();
    let mut list = dog.list.lock().unwrap_or_else(|p| p.into_inner());
    match list.1.iter().position(|w| w.id == id) {
        Some(i) => list.1.swap_remove(i).fired,
        None => false,
    }
}

/// This process's TCP sockets whose peer is one of `addrs`, as (descriptor, local address).
#[cfg(target_os = "linux")]
fn sockets_to(addrs: &[SocketAddr]) -> Vec<(i32, SocketAddr)> {
    if addrs.is_empty() {
        return Vec::new();
    }
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue;
        };
        if !target.to_string_lossy().starts_with("socket:") {
            continue;
        }
        let (Some(peer), Some(local)) = (peer_addr(fd, true), peer_addr(fd, false)) else {
            continue;
        };
        if addrs.contains(&peer) {
            out.push((fd, local));
        }
    }
    out
}

#[cfg(not(target_os = "linux"))]
fn sockets_to(_addrs: &[SocketAddr]) -> Vec<(i32, SocketAddr)> {
    Vec::new()
}

/// `getpeername` (`peer`) or `getsockname` of `fd` as an IP socket address.
#[cfg(target_os = "linux")]
fn peer_addr(fd: i32, peer: bool) -> Option<SocketAddr> {
    // SAFETY: `storage` is a zeroed sockaddr_storage, large enough for any address; `len`
    // holds its size; the calls only write within it.
    unsafe {
        let mut storage: libc::sockaddr_storage = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        let ptr = &mut storage as *mut libc::sockaddr_storage as *mut libc::sockaddr;
        let rc = if peer {
            libc::getpeername(fd, ptr, &mut len)
        } else {
            libc::getsockname(fd, ptr, &mut len)
        };
        if rc != 0 {
            return None;
        }
        match storage.ss_family as i32 {
            libc::AF_INET => {
                let a = &*(ptr as *const libc::sockaddr_in);
                Some(SocketAddr::new(
                    IpAddr::V4(Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr))),
                    u16::from_be(a.sin_port),
                ))
            }
            libc::AF_INET6 => {
                let a = &*(ptr as *const libc::sockaddr_in6);
                Some(SocketAddr::new(
                    IpAddr::V6(Ipv6Addr::from(a.sin6_addr.s6_addr)),
                    u16::from_be(a.sin6_port),
                ))
            }
            _ => None,
        }
    }
}

fn shut(fd: i32) {
    // SAFETY: shutdown(2) on a descriptor number; at worst EBADF/ENOTSOCK if it was closed
    // meanwhile. The descriptor itself stays open (its owner closes it).
    #[cfg(unix)]
    unsafe {
        libc::shutdown(fd, libc::SHUT_RDWR);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::TcpListener;

    #[test]
    fn a_silent_server_is_given_up_on_and_its_socket_shut() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let config: postgres::Config = format!("postgres://u@127.0.0.1:{port}/d").parse().unwrap();
        let peer = Peer::of(&config);
        assert_eq!(peer.label(), format!("127.0.0.1:{port}"));
        let started = Instant::now();
        let out = connect_within(&config, &peer, Duration::from_millis(500));
        let e = out.err().expect("a silent server is given up on");
        assert!(started.elapsed() < Duration::from_secs(3));
        assert!(e.to_string().contains(&format!("127.0.0.1:{port}")), "{e}");
        // The server side sees the connection closed: the connect's socket was shut down.
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => continue,
                Err(e) => panic!("the given-up connect's socket stayed open: {e}"),
            }
        }
    }

    #[test]
    fn a_watched_call_past_its_deadline_fails_naming_the_server() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let peer = Peer::tcp("127.0.0.1", addr.port());
        let mut client = std::net::TcpStream::connect(addr).unwrap();
        let _server_side = listener.accept().unwrap();
        let started = Instant::now();
        let out = watch_result("read", &peer, Duration::from_millis(300), || {
            let mut buf = [0u8; 16];
            client.read(&mut buf).and_then(|n| match n {
                0 => Err(std::io::Error::other("closed")),
                n => Ok(n),
            })
        });
        let e = out.expect_err("the read was given up on");
        assert!(started.elapsed() < Duration::from_secs(3));
        assert!(e.to_string().contains(peer.label()), "{e}");
    }
}
