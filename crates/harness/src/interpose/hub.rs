//! The state an interposer's sessions share with whoever conducts a run: which session holds a
//! command at the proxy, which one has a command at the server, and the run's switch.
//!
//! During a run a session thread calls [`Hub::hold`] with each step it is about to forward,
//! and the step waits at the proxy until [`Hub::release`] (or the run's end). Outside a run
//! the relays ask the hub whether a run is on and pass commands through without holding them
//! (several at once, without waiting for replies; [`Hub::hold`] called then lets the step go
//! on at once). The server side calls [`Hub::done`] when every reply owed is in. The
//! conductor reads [`Hub::view`] and waits on [`Hub::wait_change`]; every change bumps a
//! version, so nothing is polled but the server's own lock waits.
//!
//! Faults: [`Hub::release_with`] releases a held step with an [`Action`] that the relay
//! carries out: [`Action::CutBefore`] closes the connection instead of forwarding the step (the
//! server never sees it); [`Action::CutAfter`] forwards it, waits for its whole reply, and
//! closes the client's connection without passing the reply on (the server completed the step,
//! the client never learns: a lost acknowledgement). What the server did with a cut step is
//! kept after the session closes ([`Hub::cut_outcome`]).
//!
//! **Invariant:** a session has at most one step outstanding (held or at the server): its
//! thread does not read the next step before the last one's reply is complete.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// Which server an interposer stands in front of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// PostgreSQL, frontend/backend protocol v3.
    Postgres,
    /// Redis, RESP2 or RESP3.
    Redis,
}

impl StoreKind {
    /// `postgres` or `redis`.
    pub fn name(self) -> &'static str {
        match self {
            StoreKind::Postgres => "postgres",
            StoreKind::Redis => "redis",
        }
    }
}

/// One step: a command (PostgreSQL: one simple Query, or the messages up to a Sync with at
/// least one Execute; Redis: one command, or an `EXEC` with the commands it queued).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// The statement text (PostgreSQL: of every statement executed, joined by `; `) or the
    /// command and its arguments (Redis), at most [`TEXT_LIMIT`] characters.
    pub text: String,
    /// Bound parameters (PostgreSQL text-format values; binary ones in hex), in order.
    pub params: Vec<String>,
}

/// Longest statement or command text (and parameter) kept for the evidence, in characters:
/// long enough that the statements of a typical service are kept whole, so an
/// isolation-tester spec can replay them ([`crate::blackbox::isolation`]).
pub const TEXT_LIMIT: usize = 8192;

/// Longest reply kept as a step's result ([`SessionView::last_result`]), in characters.
pub const RESULT_LIMIT: usize = 120;

/// Closed sessions whose last view is kept for [`Hub::session`], at most.
const CLOSED_KEPT: usize = 1024;

/// Where a session's outstanding step is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Nothing outstanding.
    Idle,
    /// A step waits at the proxy for its release.
    Held,
    /// A step was forwarded and its reply is not complete.
    AtServer,
}

/// What a released step does at the proxy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// Forwarded, and its reply passed on (the normal case).
    #[default]
    Forward,
    /// Not forwarded: the connection is closed on both sides instead, so the server never
    /// sees the step (it rolls back the session's open transaction when it sees the close).
    CutBefore,
    /// Forwarded; when the server's reply is complete (PostgreSQL: its `ReadyForQuery`;
    /// Redis: the whole reply) the client's connection is closed without the reply.
    CutAfter,
}

/// What the server did with a cut step, kept after its session closed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "seen")]
pub enum CutOutcome {
    /// Cut before forwarding: the server never saw it.
    NeverForwarded,
    /// Cut after: the server's whole reply came in and was withheld from the client.
    Completed {
        /// The transaction status of its `ReadyForQuery` (`I`, `T`, `E`), PostgreSQL only.
        tx_status: Option<char>,
        /// The server's error, if it refused the step.
        error: Option<String>,
    },
}

/// What the conductor sees of one session.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionView {
    /// The session's number in this interposer (from 1, in connection order).
    pub id: u64,
    /// Its server.
    pub store: StoreKind,
    /// The server process serving it (PostgreSQL's BackendKeyData).
    pub backend_pid: Option<i32>,
    /// The transaction status of its last ReadyForQuery (`I`, `T`, `E`), PostgreSQL only.
    pub tx_status: Option<char>,
    /// Where its outstanding step is.
    pub phase: Phase,
    /// The outstanding step (held or at the server), or the last one.
    pub step: Step,
    /// Microseconds its outstanding step has been in its phase.
    pub phase_us: u64,
    /// Steps completed since the run began.
    pub completed: u64,
    /// The server's error of its last step (SQLSTATE and message, or Redis' error line).
    pub last_error: Option<String>,
    /// What the server answered to its last step, at most [`RESULT_LIMIT`] characters:
    /// PostgreSQL's CommandComplete tags (`INSERT 0 1`, `SELECT 1`; several joined by `; `),
    /// Redis' reply in one line (`+OK`, `nil`, `:1`, `"value"`, `*2`, `-ERR …`).
    pub last_result: Option<String>,
    /// Bytes the client has already sent behind its outstanding step (in the relay's buffer
    /// and the socket's receive queue): a next command waiting on the same connection, as a
    /// client that sends several requests' commands over one connection makes.
    #[serde(default)]
    pub queued: usize,
}

impl SessionView {
    /// The result of its last completed step in one line, as the evidence shows it: the
    /// error, else the reply ([`SessionView::last_result`]), else `ok`; with PostgreSQL's
    /// transaction status after it (`INSERT 0 1 (T)`, `23505 duplicate key … (E)`).
    pub fn result_text(&self) -> String {
        let reply = match (&self.last_error, &self.last_result) {
            // Redis' own error line is the reply itself (`-ERR …`).
            (Some(_), Some(r)) if self.store == StoreKind::Redis => r.clone(),
            (Some(e), _) => e.clone(),
            (None, Some(r)) if !r.is_empty() => r.clone(),
            _ => "ok".to_string(),
        };
        match self.tx_status {
            Some(s) if self.store == StoreKind::Postgres => format!("{reply} ({s})"),
            _ => reply,
        }
    }
}

/// A session's entry.
#[derive(Debug)]
struct Session {
    view: SessionView,
    since: Instant,
    granted: bool,
    /// What the outstanding step does once released (set by [`Hub::release_with`]).
    action: Action,
    /// The client's socket (a duplicate), to read how many bytes wait in its receive queue.
    client: Option<std::net::TcpStream>,
    /// Bytes the relay had read past the outstanding step when it was held.
    buffered: usize,
}

#[derive(Debug, Default)]
struct State {
    active: bool,
    version: u64,
    next_id: u64,
    sessions: BTreeMap<u64, Session>,
    /// The last view of sessions that closed since the run began (a reply delivered just
    /// before its connection closed is still read from here), at most [`CLOSED_KEPT`].
    closed: BTreeMap<u64, SessionView>,
    /// Cut steps by session, kept after the session closed; cleared when a run begins.
    cuts: BTreeMap<u64, CutOutcome>,
}

/// The shared state of one interposer ([`super::Interposer::hub`]).
#[derive(Debug, Default)]
pub struct Hub {
    state: Mutex<State>,
    changed: Condvar,
    /// Whether a run is on, as the state says: read by the relays at every message without
    /// the lock, to tell pass-through from a run.
    running: AtomicBool,
}

impl Hub {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bump(&self, s: &mut State) {
        s.version += 1;
        self.changed.notify_all();
    }

    /// Registers a new client connection; returns its session number.
    pub fn open(&self, store: StoreKind) -> u64 {
        let mut s = self.lock();
        s.next_id += 1;
        let id = s.next_id;
        s.sessions.insert(
            id,
            Session {
                view: SessionView {
                    id,
                    store,
                    backend_pid: None,
                    tx_status: None,
                    phase: Phase::Idle,
                    step: Step::default(),
                    phase_us: 0,
                    completed: 0,
                    last_error: None,
                    last_result: None,
                    queued: 0,
                },
                since: Instant::now(),
                granted: false,
                action: Action::Forward,
                client: None,
                buffered: 0,
            },
        );
        self.bump(&mut s);
        id
    }

    /// Records the PostgreSQL backend process of session `id`.
    pub(crate) fn set_backend_pid(&self, id: u64, pid: i32) {
        let mut s = self.lock();
        if let Some(x) = s.sessions.get_mut(&id) {
            x.view.backend_pid = Some(pid);
        }
        self.bump(&mut s);
    }

    /// Session `id` is about to forward `step`. Outside a run it goes on at once; inside one it
    /// waits at the proxy until released or the run ends, or `max_hold` passes (a bound for a
    /// conductor that stopped conducting; the step then goes on). Returns what the relay must
    /// do with the step: [`Action::Forward`] unless it was released with a cut
    /// ([`Hub::release_with`]).
    pub fn hold(&self, id: u64, step: Step, max_hold: Duration, buffered: usize) -> Action {
        let mut s = self.lock();
        let active = s.active;
        if let Some(x) = s.sessions.get_mut(&id) {
            x.buffered = buffered;
            x.view.step = step;
            x.view.phase = if active { Phase::Held } else { Phase::AtServer };
            x.since = Instant::now();
            x.granted = false;
            x.action = Action::Forward;
        }
        self.bump(&mut s);
        let deadline = Instant::now() + max_hold;
        loop {
            let go = match s.sessions.get(&id) {
                Some(x) => x.view.phase != Phase::Held || x.granted || !s.active,
                None => true,
            };
            let now = Instant::now();
            if go || now >= deadline {
                break;
            }
            s = self
                .changed
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        let mut action = Action::Forward;
        if let Some(x) = s.sessions.get_mut(&id) {
            x.view.phase = Phase::AtServer;
            x.since = Instant::now();
            x.granted = false;
            action = x.action;
        }
        if action == Action::CutBefore {
            s.cuts.insert(id, CutOutcome::NeverForwarded);
        }
        self.bump(&mut s);
        action
    }

    /// Whether the reply to session `id`'s outstanding step is to be withheld from the client
    /// ([`Action::CutAfter`]). The relay asks before it passes any reply bytes on.
    pub(crate) fn withholds_reply(&self, id: u64) -> bool {
        self.lock()
            .sessions
            .get(&id)
            .is_some_and(|x| x.view.phase == Phase::AtServer && x.action == Action::CutAfter)
    }

    /// What the server did with session `id`'s cut step, if one of its steps was cut in this
    /// run; kept after the session closed.
    pub fn cut_outcome(&self, id: u64) -> Option<CutOutcome> {
        self.lock().cuts.get(&id).cloned()
    }

    /// Session `id`'s outstanding step has its whole reply: `tx_status` from ReadyForQuery
    /// (PostgreSQL), `error` when the server refused it, `result` what it answered (clipped
    /// to [`RESULT_LIMIT`]; see [`SessionView::last_result`]). With no step at the server, the
    /// reply answers messages forwarded unheld: only `tx_status` is kept, and the last step's
    /// result stays.
    pub fn done(
        &self,
        id: u64,
        tx_status: Option<char>,
        error: Option<String>,
        result: Option<String>,
    ) {
        let mut s = self.lock();
        let mut cut = None;
        if let Some(x) = s.sessions.get_mut(&id) {
            if x.view.phase == Phase::Held {
                // Replies to messages forwarded unheld; the held step is not touched.
                return;
            }
            // Replies to messages forwarded unheld (a statement prepared after the step, a
            // `PING`) answer no step: they move the transaction status on but leave the last
            // step's result, so a check reads `SELECT 0`, not an empty result.
            let step = x.view.phase == Phase::AtServer;
            if step {
                x.view.completed += 1;
                if x.action == Action::CutAfter {
                    x.action = Action::Forward;
                    cut = Some(CutOutcome::Completed {
                        tx_status,
                        error: error.clone(),
                    });
                }
            }
            x.view.phase = Phase::Idle;
            x.since = Instant::now();
            if tx_status.is_some() {
                x.view.tx_status = tx_status;
            }
            if step {
                x.view.last_error = error;
                x.view.last_result = result.map(|r| clip_to(&r, RESULT_LIMIT));
            }
        }
        if let Some(c) = cut {
            s.cuts.insert(id, c);
        }
        self.bump(&mut s);
    }

    /// How many client connections were ever registered ([`Hub::open`]), open or closed.
    pub fn opened(&self) -> u64 {
        self.lock().next_id
    }

    /// Session `id`'s connection ended. Its last view stays readable by [`Hub::session`]
    /// until the next run begins.
    pub fn close(&self, id: u64) {
        let mut s = self.lock();
        if let Some(x) = s.sessions.remove(&id) {
            if s.closed.len() >= CLOSED_KEPT {
                s.closed.pop_first();
            }
            s.closed.insert(id, x.view);
        }
        self.bump(&mut s);
    }

    /// Keeps a duplicate of session `id`'s client socket, so that its views can tell how many
    /// bytes the client sent behind its outstanding step ([`SessionView::queued`]). Dropped
    /// when the session closes.
    pub(crate) fn watch_client(&self, id: u64, client: std::net::TcpStream) {
        if let Some(x) = self.lock().sessions.get_mut(&id) {
            x.client = Some(client);
        }
    }

    /// Whether session `id` is open.
    pub fn is_open(&self, id: u64) -> bool {
        self.lock().sessions.contains_key(&id)
    }

    /// Session `id`'s view: open, or closed since the run began (its last view, so the
    /// result of a reply delivered just before the connection closed is not lost). `None`
    /// for a session never opened or closed before the run.
    pub fn session(&self, id: u64) -> Option<SessionView> {
        let s = self.lock();
        match s.sessions.get(&id) {
            Some(x) => {
                let mut v = x.view.clone();
                v.phase_us = u64::try_from(x.since.elapsed().as_micros()).unwrap_or(u64::MAX);
                Some(v)
            }
            None => s.closed.get(&id).cloned(),
        }
    }

    /// Whether a run is on ([`Hub::begin`] … [`Hub::end`]). A relay asks before each command
    /// it is about to forward: outside a run it passes the command through without a step.
    pub(crate) fn running(&self) -> bool {
        self.running.load(Ordering::SeqCst)
    }

    /// Starts a run: from now every step is held until released. Counts restart from 0.
    pub fn begin(&self) {
        let mut s = self.lock();
        s.active = true;
        self.running.store(true, Ordering::SeqCst);
        s.closed.clear();
        s.cuts.clear();
        for x in s.sessions.values_mut() {
            x.view.completed = 0;
        }
        self.bump(&mut s);
    }

    /// Ends a run: every held step goes on, and later ones are not held.
    pub fn end(&self) {
        let mut s = self.lock();
        s.active = false;
        self.running.store(false, Ordering::SeqCst);
        self.bump(&mut s);
    }

    /// Releases session `id`'s held step; `false` when it holds none.
    pub fn release(&self, id: u64) -> bool {
        self.release_with(id, Action::Forward)
    }

    /// Releases session `id`'s held step with `action`: forwarded as usual, or cut before or
    /// after the server ([`Action`]); `false` when it holds none.
    pub fn release_with(&self, id: u64, action: Action) -> bool {
        let mut s = self.lock();
        let ok = match s.sessions.get_mut(&id) {
            Some(x) if x.view.phase == Phase::Held => {
                x.granted = true;
                x.action = action;
                true
            }
            _ => false,
        };
        self.bump(&mut s);
        ok
    }

    /// Every open session, by number, with the current version.
    pub fn view(&self) -> (u64, Vec<SessionView>) {
        let s = self.lock();
        let views = s
            .sessions
            .values()
            .map(|x| {
                let mut v = x.view.clone();
                v.phase_us = u64::try_from(x.since.elapsed().as_micros()).unwrap_or(u64::MAX);
                if matches!(v.phase, Phase::Held | Phase::AtServer) {
                    v.queued = x.buffered + x.client.as_ref().map_or(0, receive_queue);
                }
                v
            })
            .collect();
        (s.version, views)
    }

    /// Waits until the version differs from `seen` or `deadline` passes; returns the version.
    pub fn wait_change(&self, seen: u64, deadline: Instant) -> u64 {
        let mut s = self.lock();
        loop {
            let now = Instant::now();
            if s.version != seen || now >= deadline {
                return s.version;
            }
            s = self
                .changed
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// `text` cut to [`TEXT_LIMIT`] characters, with `…` when cut.
pub(crate) fn clip(text: &str) -> String {
    clip_to(text, TEXT_LIMIT)
}

/// `text` cut to `limit` characters, with `…` when cut.
pub(crate) fn clip_to(text: &str, limit: usize) -> String {
    match text.char_indices().nth(limit) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_string(),
    }
}

/// Whether `text` is the output of [`clip`] that was cut (so it no longer holds the whole
/// statement or parameter).
pub(crate) fn was_clipped(text: &str) -> bool {
    text.ends_with('…') && text.chars().count() == TEXT_LIMIT + 1
}

/// Bytes waiting in `stream`'s receive queue (`FIONREAD`), 0 when it cannot be read.
fn receive_queue(stream: &std::net::TcpStream) -> usize {
    use std::os::fd::AsRawFd as _;
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int through the pointer, which points at `n`; the fd is
    // the open socket `stream` owns for the duration of the call.
    let rc = unsafe { libc::ioctl(stream.as_raw_fd(), libc::FIONREAD, &mut n) };
    if rc == 0 {
        usize::try_from(n).unwrap_or(0)
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_is_held_only_inside_a_run_and_goes_on_when_released() {
        let hub = std::sync::Arc::new(Hub::default());
        let id = hub.open(StoreKind::Redis);
        hub.hold(id, Step::default(), Duration::from_secs(5), 0);
        assert_eq!(hub.view().1[0].phase, Phase::AtServer);
        hub.done(id, None, None, None);
        hub.begin();
        std::thread::scope(|sc| {
            let h = hub.clone();
            let t = sc.spawn(move || {
                h.hold(
                    id,
                    Step {
                        text: "SET k v".into(),
                        params: vec![],
                    },
                    Duration::from_secs(30),
                    0,
                )
            });
            let mut seen = 0;
            while hub.view().1[0].phase != Phase::Held {
                seen = hub.wait_change(seen, Instant::now() + Duration::from_secs(5));
            }
            assert!(hub.release(id));
            t.join().unwrap();
        });
        assert_eq!(hub.view().1[0].phase, Phase::AtServer);
        assert!(!hub.release(id), "nothing is held any more");
    }

    /// Holds one step of session `id` on a thread, releases it with `action`; returns what
    /// the relay was told.
    fn released_with(hub: &std::sync::Arc<Hub>, id: u64, action: Action) -> Action {
        std::thread::scope(|sc| {
            let h = hub.clone();
            let t = sc.spawn(move || h.hold(id, Step::default(), Duration::from_secs(30), 0));
            let mut seen = 0;
            while hub.view().1.iter().all(|v| v.phase != Phase::Held) {
                seen = hub.wait_change(seen, Instant::now() + Duration::from_secs(5));
            }
            assert!(hub.release_with(id, action));
            t.join().unwrap()
        })
    }

    #[test]
    fn a_cut_is_told_to_the_relay_and_its_outcome_outlives_the_session() {
        let hub = std::sync::Arc::new(Hub::default());
        hub.begin();
        let before = hub.open(StoreKind::Postgres);
        assert_eq!(
            released_with(&hub, before, Action::CutBefore),
            Action::CutBefore
        );
        hub.close(before);
        assert_eq!(hub.cut_outcome(before), Some(CutOutcome::NeverForwarded));

        let after = hub.open(StoreKind::Postgres);
        assert_eq!(
            released_with(&hub, after, Action::CutAfter),
            Action::CutAfter
        );
        assert!(hub.withholds_reply(after));
        assert_eq!(hub.cut_outcome(after), None, "its reply is not in yet");
        hub.done(after, Some('I'), None, None);
        assert!(
            !hub.withholds_reply(after),
            "only the cut step's reply is withheld"
        );
        hub.close(after);
        assert_eq!(
            hub.cut_outcome(after),
            Some(CutOutcome::Completed {
                tx_status: Some('I'),
                error: None
            })
        );

        // A plain release forwards; the next run forgets the cuts.
        let plain = hub.open(StoreKind::Redis);
        assert_eq!(released_with(&hub, plain, Action::Forward), Action::Forward);
        assert!(!hub.withholds_reply(plain));
        hub.begin();
        assert_eq!(hub.cut_outcome(before), None);
    }

    #[test]
    fn a_reply_delivered_just_before_the_connection_closed_keeps_its_result() {
        let hub = Hub::default();
        hub.begin();
        let id = hub.open(StoreKind::Redis);
        hub.hold(id, Step::default(), Duration::ZERO, 0);
        hub.done(id, None, None, Some("nil".into()));
        hub.close(id);
        let v = hub
            .session(id)
            .expect("a closed session's last view is kept");
        assert_eq!((v.completed, v.result_text().as_str()), (1, "nil"));
        assert!(hub.view().1.is_empty(), "closed sessions are not conducted");
        // A new run forgets them.
        hub.begin();
        assert!(hub.session(id).is_none());
    }

    #[test]
    fn a_result_reads_the_reply_the_error_and_the_transaction_status() {
        let hub = Hub::default();
        // Each result answers a step (outside a run a step goes to the server at once).
        let step = |id| hub.hold(id, Step::default(), Duration::ZERO, 0);
        let pg = hub.open(StoreKind::Postgres);
        step(pg);
        hub.done(pg, Some('T'), None, Some("INSERT 0 1".into()));
        assert_eq!(hub.session(pg).unwrap().result_text(), "INSERT 0 1 (T)");
        step(pg);
        hub.done(
            pg,
            Some('E'),
            Some("23505 duplicate key".into()),
            Some(String::new()),
        );
        assert_eq!(
            hub.session(pg).unwrap().result_text(),
            "23505 duplicate key (E)"
        );
        let r = hub.open(StoreKind::Redis);
        step(r);
        hub.done(r, None, Some("ERR no".into()), Some("-ERR no".into()));
        assert_eq!(hub.session(r).unwrap().result_text(), "-ERR no");
        step(r);
        hub.done(r, None, None, Some("x".repeat(RESULT_LIMIT + 9)));
        assert_eq!(
            hub.session(r).unwrap().result_text().chars().count(),
            RESULT_LIMIT + 1
        );
        step(r);
        hub.done(r, None, None, None);
        assert_eq!(hub.session(r).unwrap().result_text(), "ok");
    }

    #[test]
    fn a_step_keeps_its_command_tags_when_unheld_messages_are_answered_after_it() {
        // A check-then-insert's check: its SELECT found no row. The service then prepares
        // its next statement (Parse/Describe/Sync, unheld): that ReadyForQuery has no
        // CommandComplete, and the check must still read `SELECT 0`, not `ok`.
        let hub = Hub::default();
        hub.begin();
        let pg = hub.open(StoreKind::Postgres);
        hub.hold(pg, Step::default(), Duration::ZERO, 0);
        hub.done(pg, Some('T'), None, Some("SELECT 0".into()));
        hub.done(pg, Some('T'), None, Some(String::new()));
        let v = hub.session(pg).unwrap();
        assert_eq!((v.completed, v.result_text().as_str()), (1, "SELECT 0 (T)"));
        // A batch of several statements up to one Sync: every tag.
        hub.hold(pg, Step::default(), Duration::ZERO, 0);
        hub.done(pg, Some('I'), None, Some("INSERT 0 1; COMMIT".into()));
        hub.done(pg, Some('I'), None, None);
        assert_eq!(
            hub.session(pg).unwrap().result_text(),
            "INSERT 0 1; COMMIT (I)"
        );
        // An unheld reply still moves the transaction status on.
        hub.done(pg, Some('T'), None, None);
        assert_eq!(hub.session(pg).unwrap().tx_status, Some('T'));
        // Redis: a PING answered after a step leaves the step's reply.
        let r = hub.open(StoreKind::Redis);
        hub.hold(r, Step::default(), Duration::ZERO, 0);
        hub.done(r, None, None, Some("nil".into()));
        hub.done(r, None, None, Some("+PONG".into()));
        assert_eq!(hub.session(r).unwrap().result_text(), "nil");
    }

    #[test]
    fn clip_keeps_short_text_and_marks_a_cut() {
        assert_eq!(clip("SELECT 1"), "SELECT 1");
        let long = "x".repeat(TEXT_LIMIT + 5);
        assert!(clip(&long).ends_with('…'));
        assert_eq!(clip(&long).chars().count(), TEXT_LIMIT + 1);
        assert!(was_clipped(&clip(&long)) && !was_clipped("SELECT 1…"));
    }
}
