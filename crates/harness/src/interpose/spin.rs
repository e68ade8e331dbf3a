//! Busy-polling a relayed socket before a blocking read, outside a run.
//!
//! A relay adds a hop to every round trip: a read and a write each way, and, when a relay
//! thread sleeps in `read`, a wake-up by the scheduler for each crossing. The wake-ups are
//! most of the cost on loopback (tens of microseconds against a few for the system calls), so
//! for a session that is alone on the machine a relay thread that expects bytes soon polls
//! its socket without blocking for a short window ([`Limits::busy_poll`]) before it sleeps:
//! the reply of a query the server is running, or the next command of a client that just got
//! its reply. This is what the kernel's own `SO_BUSY_POLL` does for device queues (which
//! loopback has none of).
//!
//! A thread whose turn it is not waits in `poll(2)` on its socket and on its own
//! `eventfd(2)`, which the other side signals when the turn passes ([`Turns`]): it is woken as its peer starts
//! working (the server on the query just sent, the client on the reply just passed on), so
//! its own wake-up overlaps that work, and it is polling when the bytes come.
//!
//! Busy-polling takes a core, so it is allowed only where it cannot take one from the work:
//! - outside a run (a run's steps are paced by the conductor, not by the relay);
//! - on a machine with at least two cores;
//! - by one thread of the process at a time;
//! - for the side whose turn it is: the server's side while replies are owed, the client's
//!   side while none is;
//! - while the relay's sessions are not busy together: bytes of two sessions within
//!   [`CONTENDED_GAP`] of each other turn it off for [`CONTENDED_HOLD`]; with several clients
//!   at once the cores are the work's, and a spinning thread would only slow it down.
//!
//! [`Limits::busy_poll`]: super::Limits::busy_poll

use std::io::{self, Read as _};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd as _, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::hub::Hub;
use super::Owed;

/// The default [`super::Limits::busy_poll`] window: 300 µs, longer than a loopback round
/// trip of a simple statement (about 130 µs for `pgbench -S` here) and than a driver's turn
/// between two statements of a request.
pub const BUSY_POLL: Duration = Duration::from_micros(300);

/// Bytes of two sessions closer than this (150 µs) mean the relay's sessions are busy
/// together.
pub(crate) const CONTENDED_GAP: Duration = Duration::from_micros(150);

/// How long busy-polling stays off after sessions were seen busy together: 20 ms.
pub(crate) const CONTENDED_HOLD: Duration = Duration::from_millis(20);

/// When a relay thread may busy-poll, and which session it serves.
#[derive(Clone, Copy)]
pub(crate) struct Gate<'a> {
    /// The session's replies owed: whose turn it is.
    pub owed: &'a Owed,
    /// Busy-polling stops when a run begins.
    pub hub: &'a Hub,
    /// The session, as the relay's sessions are told apart (its client socket's descriptor).
    pub session: i32,
    /// `true`: this thread reads the server's replies (its turn while replies are owed);
    /// `false`: it reads the client's commands (its turn while none is).
    pub replies: bool,
    /// The window; zero never polls.
    pub window: Duration,
}

impl<'a> Gate<'a> {
    /// The gates of a session's two sides, the client's commands' and the server's replies',
    /// its replies owed counted in `owed`, relayed for `client` by an interposer of `hub` whose
    /// window is `limits.busy_poll`.
    pub(crate) fn pair(
        owed: &'a Owed,
        hub: &'a Hub,
        client: &TcpStream,
        limits: &super::Limits,
    ) -> (Gate<'a>, Gate<'a>) {
        let side = |replies| Gate {
            owed,
            hub,
            session: client.as_raw_fd(),
            replies,
            window: limits.busy_poll,
        };
        (side(false), side(true))
    }

    /// Whether this side may poll now (outside a run, on its turn).
    fn allows(&self) -> bool {
        !self.window.is_zero() && !self.hub.running() && self.owed.owing() == self.replies
    }
}

/// What the process's relays share: who polls, and when sessions were last busy together.
struct Policy {
    /// Set while a thread polls.
    polling: AtomicBool,
    /// The last read's session (low 16 bits) and time in microseconds since `epoch` (the rest).
    last: AtomicU64,
    /// Microseconds since `epoch` before which no thread polls.
    quiet_until: AtomicU64,
    epoch: Instant,
    cores: usize,
    /// [`CONTENDED_GAP`] and [`CONTENDED_HOLD`], in microseconds.
    gap: u64,
    hold: u64,
}

fn policy() -> &'static Policy {
    static POLICY: OnceLock<Policy> = OnceLock::new();
    POLICY.get_or_init(|| Policy {
        polling: AtomicBool::new(false),
        last: AtomicU64::new(0),
        quiet_until: AtomicU64::new(0),
        epoch: Instant::now(),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        gap: micros(CONTENDED_GAP),
        hold: micros(CONTENDED_HOLD),
    })
}

impl Policy {
    fn micros(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    /// Notes bytes read for `session`; bytes of another session just before mean the
    /// sessions are busy together.
    fn note(&self, session: i32) {
        let now = self.micros();
        let tag = u64::from(session as u16);
        let before = self.last.swap((now << 16) | tag, Ordering::AcqRel);
        let (then, other) = (before >> 16, before & 0xffff);
        if before != 0 && other != tag && now.saturating_sub(then) < self.gap {
            self.quiet_until
                .fetch_max(now + self.hold, Ordering::AcqRel);
        }
    }

    /// Whether polling is open at all: a machine of two cores or more whose relay sessions
    /// are not busy together.
    fn open(&self) -> bool {
        self.cores >= 2 && self.micros() >= self.quiet_until.load(Ordering::Acquire)
    }

    /// Takes the one polling slot, if polling is open.
    fn take(&self) -> bool {
        self.open() && !self.polling.swap(true, Ordering::AcqRel)
    }

    fn give_back(&self) {
        self.polling.store(false, Ordering::Release);
    }
}

fn micros(d: Duration) -> u64 {
    d.as_micros() as u64
}

/// A socket whose reads busy-poll through `gate` ([`read`]).
pub(crate) struct Polled<'a> {
    /// The socket.
    pub stream: TcpStream,
    /// When it may poll; `None`: never.
    pub gate: Option<Gate<'a>>,
}

impl std::io::Read for Polled<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        read(&self.stream, buf, self.gate.as_ref())
    }
}

/// The two sides' wake-ups when the turn passes: the server's side's when a reply becomes
/// owed, the client's side's when none is any more. Each side has its own `eventfd(2)`, made
/// the first time it waits, signalled only while it waits (one shared by both would be
/// drained by the side that just passed the turn, as it waits in turn, and the wake lost).
#[derive(Default)]
pub(crate) struct Turns {
    replies: Parker,
    commands: Parker,
}

impl Turns {
    /// The turn passed to the side that reads replies (`true`) or commands (`false`).
    pub(crate) fn pass(&self, replies: bool) {
        self.side(replies).wake();
    }

    /// Wakes both sides (the session is ending).
    pub(crate) fn wake_all(&self) {
        self.replies.wake();
        self.commands.wake();
    }

    fn side(&self, replies: bool) -> &Parker {
        if replies {
            &self.replies
        } else {
            &self.commands
        }
    }

    /// Waits until `stream` is readable or the turn may have passed to the side that reads
    /// replies (`replies`) or commands; `mine` says whether it has, asked once more after the
    /// side is marked waiting, so a pass is never missed.
    fn park(&self, replies: bool, stream: &TcpStream, mine: impl Fn() -> bool) -> Parked {
        let side = self.side(replies);
        let Some(efd) = side.fd() else {
            return Parked::Unsupported;
        };
        side.parked.store(true, Ordering::SeqCst);
        if mine() {
            side.parked.store(false, Ordering::SeqCst);
            return Parked::Turn;
        }
        let mut fds = [
            libc::pollfd {
                fd: stream.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: efd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a valid array of two pollfd for the call's duration.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        side.parked.store(false, Ordering::SeqCst);
        if fds[1].revents != 0 {
            let mut drained = [0u8; 8];
            // SAFETY: reads at most 8 bytes into a valid buffer from this side's eventfd
            // (non-blocking: a counter already read gives EAGAIN, ignored).
            let _ =
                unsafe { libc::read(efd.as_raw_fd(), drained.as_mut_ptr().cast(), drained.len()) };
        }
        if rc < 0 {
            return if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                Parked::Turn
            } else {
                Parked::Unsupported
            };
        }
        if fds[0].revents != 0 {
            Parked::Readable
        } else {
            Parked::Turn
        }
    }
}

/// One side's wait for its turn (its `eventfd`, and whether it waits), and how its polls
/// have fared.
#[derive(Default)]
struct Parker {
    fd: OnceLock<Option<OwnedFd>>,
    parked: AtomicBool,
    /// Windows in a row that ended with nothing read (at most [`MAX_MISSES`]).
    misses: AtomicU32,
    /// Reads still to go without polling: after `m` misses in a row, `2^m - 1` of them.
    skip: AtomicU32,
}

/// Misses in a row after which a side polls only once in `2^MAX_MISSES` reads: 6 (one in 64).
const MAX_MISSES: u32 = 6;

impl Parker {
    fn fd(&self) -> Option<&OwnedFd> {
        self.fd
            .get_or_init(|| {
                // SAFETY: plain system call; a descriptor it returns is owned from here on.
                let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
                // SAFETY: `fd` is a new descriptor nothing else owns.
                (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
            })
            .as_ref()
    }

    fn wake(&self) {
        if self.parked.load(Ordering::SeqCst) {
            if let Some(Some(fd)) = self.fd.get() {
                let one = 1u64.to_ne_bytes();
                // SAFETY: writes 8 bytes from a valid buffer to this side's eventfd; a full
                // counter (EAGAIN) still leaves it readable, which is all a wake needs.
                let _ = unsafe { libc::write(fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
            }
        }
    }

    /// Whether this read goes without polling (a side whose bytes keep coming later than the
    /// window backs off); counts the read.
    fn skips(&self) -> bool {
        self.skip
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |k| k.checked_sub(1))
            .is_ok()
    }

    /// A window ended: with bytes (`hit`) or without.
    fn polled(&self, hit: bool) {
        if hit {
            self.misses.store(0, Ordering::Release);
            return;
        }
        let m = (self.misses.load(Ordering::Acquire) + 1).min(MAX_MISSES);
        self.misses.store(m, Ordering::Release);
        self.skip.store((1 << m) - 1, Ordering::Release);
    }
}

/// How a [`Turns::park`] ended.
enum Parked {
    /// The socket has bytes, its end or an error: a read does not block.
    Readable,
    /// The turn may have passed: look again.
    Turn,
    /// No `eventfd` could be made (or `poll` failed): read as usual.
    Unsupported,
}

/// Reads from `stream` into `buf` as [`std::io::Read::read`] does, busy-polling first when
/// `gate` allows, and waiting for its turn when it is not this side's ([`Gate`]; the module
/// doc says when).
///
/// Will return `Err` when the socket does.
pub(crate) fn read(
    stream: &TcpStream,
    buf: &mut [u8],
    gate: Option<&Gate<'_>>,
) -> io::Result<usize> {
    let policy = policy();
    let Some(g) = gate else {
        let mut s = stream;
        return s.read(buf);
    };
    // One polling window per read: a side that polled and found nothing then waits for bytes
    // only (its turn does not pass until it reads). A side whose windows keep ending empty
    // polls ever more rarely (a client that sends a command every few milliseconds).
    let side = g.owed.turns().side(g.replies);
    let mut polled = side.skips();
    loop {
        if !polled && g.allows() {
            polled = true;
            if policy.take() {
                let got = poll(stream, buf, g);
                policy.give_back();
                side.polled(got.is_some());
                if let Some(r) = got {
                    if matches!(r, Ok(n) if n > 0) {
                        policy.note(g.session);
                    }
                    return r;
                }
            }
        }
        // Wait for bytes, or (not polled yet, and polling is possible at all) for the turn.
        let waits = !polled && !g.window.is_zero() && !g.hub.running() && policy.open();
        if !waits {
            break;
        }
        match g.owed.turns().park(g.replies, stream, || g.allows()) {
            Parked::Readable | Parked::Unsupported => break,
            Parked::Turn => {}
        }
    }
    let mut s = stream;
    let r = s.read(buf);
    if matches!(r, Ok(n) if n > 0) {
        policy.note(g.session);
    }
    r
}

/// Polls `stream` without blocking until bytes (or its end, or an error) come, the window
/// passes or the gate closes: `None` when nothing came.
fn poll(stream: &TcpStream, buf: &mut [u8], gate: &Gate<'_>) -> Option<io::Result<usize>> {
    let start = Instant::now();
    loop {
        match try_read(stream, buf) {
            Ok(Some(n)) => return Some(Ok(n)),
            Ok(None) => {}
            Err(e) => return Some(Err(e)),
        }
        if start.elapsed() >= gate.window || !gate.allows() {
            return None;
        }
        std::hint::spin_loop();
    }
}

/// One read that does not block (`recv` with `MSG_DONTWAIT`, POSIX.1-2008 / Linux): `None`
/// when nothing is there yet.
fn try_read(stream: &TcpStream, buf: &mut [u8]) -> io::Result<Option<usize>> {
    // SAFETY: `buf` is a valid, writable buffer of `buf.len()` bytes for the call's duration,
    // and the descriptor is the open socket `stream` owns.
    let n = unsafe {
        libc::recv(
            stream.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
        )
    };
    if n >= 0 {
        return Ok(Some(n as usize));
    }
    let e = io::Error::last_os_error();
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
        _ => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;
    use std::net::TcpListener;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    #[test]
    fn a_read_that_does_not_block_says_nothing_came_then_reads_what_came() {
        let (mut a, b) = pair();
        let mut buf = [0u8; 8];
        assert!(try_read(&b, &mut buf).unwrap().is_none());
        a.write_all(b"hi").unwrap();
        // Blocking read: what was written is there (no timing assumed).
        let n = read(&b, &mut buf, None).unwrap();
        assert_eq!(&buf[..n], b"hi");
        drop(a);
        assert_eq!(read(&b, &mut buf, None).unwrap(), 0);
    }

    #[test]
    fn polling_returns_bytes_sent_while_it_polls_and_the_end_of_stream() {
        let (mut a, b) = pair();
        let hub = Hub::default();
        let owed = Owed::default();
        owed.add();
        let gate = Gate {
            owed: &owed,
            hub: &hub,
            session: 7,
            replies: true,
            window: Duration::from_secs(5),
        };
        assert!(gate.allows());
        let writer = std::thread::spawn(move || {
            a.write_all(b"reply").unwrap();
            a
        });
        let mut buf = [0u8; 16];
        let mut got = Vec::new();
        while got.len() < 5 {
            let n = read(&b, &mut buf, Some(&gate)).unwrap();
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, b"reply");
        drop(writer.join().unwrap());
        assert_eq!(read(&b, &mut buf, Some(&gate)).unwrap(), 0);
    }

    /// Runs `f` on a thread and gives its result, or fails the test after `secs` (a side that
    /// is never woken would otherwise hang the test run).
    fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(secs))
            .expect("the side waiting for its turn was never woken")
    }

    #[test]
    fn a_side_waiting_for_its_turn_is_woken_when_the_turn_passes() {
        let (_a, b) = pair();
        let owed = std::sync::Arc::new(Owed::default());
        let parked = {
            let owed = owed.clone();
            std::thread::spawn(move || {
                // The replies' side, with nothing owed: not its turn, and no bytes come; only
                // the wake can end this wait (`mine` never says yes).
                matches!(owed.turns().park(true, &b, || false), Parked::Turn)
            })
        };
        while !owed.turns().side(true).parked.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        // A command sent: the turn passes to the replies' side.
        owed.add();
        let woke = within(10, move || parked.join().unwrap());
        assert!(woke);
    }

    #[test]
    fn a_side_waiting_for_its_turn_still_reads_bytes_that_come_out_of_turn() {
        let (mut a, b) = pair();
        let owed = std::sync::Arc::new(Owed::default());
        owed.add();
        let parked = {
            let owed = owed.clone();
            std::thread::spawn(move || {
                // The commands' side while a reply is owed: a pipelining client sends anyway.
                matches!(
                    owed.turns().park(false, &b, || !owed.owing()),
                    Parked::Readable
                )
            })
        };
        a.write_all(b"PING\r\n").unwrap();
        assert!(within(10, move || parked.join().unwrap()));
    }

    #[test]
    fn a_side_whose_windows_end_empty_polls_ever_more_rarely_and_again_after_a_hit() {
        let p = Parker::default();
        assert!(!p.skips(), "a new side polls");
        p.polled(false);
        assert!(
            p.skips() && !p.skips(),
            "one miss: the next read skips, then it polls"
        );
        p.polled(false);
        assert_eq!(
            (0..4).filter(|_| p.skips()).count(),
            3,
            "two misses: three reads skip"
        );
        for _ in 0..10 {
            p.polled(false);
        }
        assert_eq!(
            (0..100).filter(|_| p.skips()).count(),
            (1 << MAX_MISSES) - 1,
            "misses stop doubling at the cap"
        );
        p.polled(true);
        p.polled(false);
        assert!(p.skips() && !p.skips(), "a hit starts the count over");
    }

    #[test]
    fn the_gate_opens_only_on_its_side_s_turn_and_outside_a_run() {
        let hub = Hub::default();
        let owed = Owed::default();
        let gate = |replies| Gate {
            owed: &owed,
            hub: &hub,
            session: 1,
            replies,
            window: BUSY_POLL,
        };
        assert!(gate(false).allows() && !gate(true).allows());
        owed.add();
        assert!(gate(true).allows() && !gate(false).allows());
        hub.begin();
        assert!(!gate(true).allows());
        hub.end();
        let off = Gate {
            window: Duration::ZERO,
            ..gate(true)
        };
        assert!(!off.allows());
    }

    /// A policy whose gap and hold are an hour, so no test timing can fall outside them.
    fn hour_policy(cores: usize) -> Policy {
        Policy {
            polling: AtomicBool::new(false),
            last: AtomicU64::new(0),
            quiet_until: AtomicU64::new(0),
            epoch: Instant::now(),
            cores,
            gap: 3_600_000_000,
            hold: 3_600_000_000,
        }
    }

    #[test]
    fn two_sessions_busy_together_turn_polling_off_for_a_while() {
        let p = hour_policy(2);
        p.note(3);
        p.note(3);
        assert!(p.take(), "one session alone may poll");
        assert!(!p.take(), "one thread polls at a time");
        p.give_back();
        p.note(4);
        assert!(!p.take(), "sessions busy together do not poll");
        assert!(!hour_policy(1).take(), "one core: never");
    }
}
