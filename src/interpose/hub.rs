//! The state an interposer's sessions share with whoever conducts a run: which session holds a
//! command at the proxy, which one has a command at the server, and the run's switch.
//!
//! A session thread calls [`Hub::hold`] with each step it is about to forward: outside a run
//! the step goes on at once; inside a run it waits at the proxy until [`Hub::release`] (or the
//! run's end). The server side calls [`Hub::done`] when the step's reply is complete. The
//! conductor reads [`Hub::view`] and waits on [`Hub::wait_change`]; every change bumps a
//! version, so nothing is polled but the server's own lock waits.
//!
//! **Invariant:** a session has at most one step outstanding (held or at the server): its
//! thread does not read the next step before the last one's reply is complete.

use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// Which server an interposer stands in front of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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

/// Longest statement or command text kept for the evidence, in characters.
pub const TEXT_LIMIT: usize = 400;

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
}

/// A session's entry.
#[derive(Debug)]
struct Session {
    view: SessionView,
    since: Instant,
    granted: bool,
}

#[derive(Debug, Default)]
struct State {
    active: bool,
    version: u64,
    next_id: u64,
    sessions: BTreeMap<u64, Session>,
}

/// The shared state of one interposer ([`super::Interposer::hub`]).
#[derive(Debug, Default)]
pub struct Hub {
    state: Mutex<State>,
    changed: Condvar,
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
                },
                since: Instant::now(),
                granted: false,
            },
        );
        self.bump(&mut s);
        id
    }

    /// Records the PostgreSQL backend process of session `id`.
    pub fn set_backend_pid(&self, id: u64, pid: i32) {
        let mut s = self.lock();
        if let Some(x) = s.sessions.get_mut(&id) {
            x.view.backend_pid = Some(pid);
        }
        self.bump(&mut s);
    }

    /// Session `id` is about to forward `step`. Outside a run it goes on at once; inside one it
    /// waits at the proxy until released or the run ends, or `max_hold` passes (a bound for a
    /// conductor that stopped conducting; the step then goes on).
    pub fn hold(&self, id: u64, step: Step, max_hold: Duration) {
        let mut s = self.lock();
        let active = s.active;
        if let Some(x) = s.sessions.get_mut(&id) {
            x.view.step = step;
            x.view.phase = if active { Phase::Held } else { Phase::AtServer };
            x.since = Instant::now();
            x.granted = false;
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
        if let Some(x) = s.sessions.get_mut(&id) {
            x.view.phase = Phase::AtServer;
            x.since = Instant::now();
            x.granted = false;
        }
        self.bump(&mut s);
    }

    /// Session `id`'s outstanding step has its whole reply: `tx_status` from ReadyForQuery
    /// (PostgreSQL), `error` when the server refused it.
    pub fn done(&self, id: u64, tx_status: Option<char>, error: Option<String>) {
        let mut s = self.lock();
        if let Some(x) = s.sessions.get_mut(&id) {
            if x.view.phase == Phase::Held {
                // Replies to messages forwarded unheld; the held step is not touched.
                return;
            }
            if x.view.phase == Phase::AtServer {
                x.view.completed += 1;
            }
            x.view.phase = Phase::Idle;
            x.since = Instant::now();
            if tx_status.is_some() {
                x.view.tx_status = tx_status;
            }
            x.view.last_error = error;
        }
        self.bump(&mut s);
    }

    /// How many client connections were ever registered ([`Hub::open`]), open or closed.
    pub fn opened(&self) -> u64 {
        self.lock().next_id
    }

    /// Session `id`'s connection ended.
    pub fn close(&self, id: u64) {
        let mut s = self.lock();
        s.sessions.remove(&id);
        self.bump(&mut s);
    }

    /// Starts a run: from now every step is held until released. Counts restart from 0.
    pub fn begin(&self) {
        let mut s = self.lock();
        s.active = true;
        for x in s.sessions.values_mut() {
            x.view.completed = 0;
        }
        self.bump(&mut s);
    }

    /// Ends a run: every held step goes on, and later ones are not held.
    pub fn end(&self) {
        let mut s = self.lock();
        s.active = false;
        self.bump(&mut s);
    }

    /// Releases session `id`'s held step; `false` when it holds none.
    pub fn release(&self, id: u64) -> bool {
        let mut s = self.lock();
        let ok = match s.sessions.get_mut(&id) {
            Some(x) if x.view.phase == Phase::Held => {
                x.granted = true;
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
pub fn clip(text: &str) -> String {
    match text.char_indices().nth(TEXT_LIMIT) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_is_held_only_inside_a_run_and_goes_on_when_released() {
        let hub = std::sync::Arc::new(Hub::default());
        let id = hub.open(StoreKind::Redis);
        hub.hold(id, Step::default(), Duration::from_secs(5));
        assert_eq!(hub.view().1[0].phase, Phase::AtServer);
        hub.done(id, None, None);
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

    #[test]
    fn clip_keeps_short_text_and_marks_a_cut() {
        assert_eq!(clip("SELECT 1"), "SELECT 1");
        let long = "x".repeat(TEXT_LIMIT + 5);
        assert!(clip(&long).ends_with('…'));
        assert_eq!(clip(&long).chars().count(), TEXT_LIMIT + 1);
    }
}
