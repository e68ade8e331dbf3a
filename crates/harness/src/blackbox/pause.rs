//! The `CLIENT PAUSE` barrier (`[barrier] kind = "redis-pause"`) for services whose key store
//! is Redis and which the runner does not put behind the interposer.
//!
//! One wave: the runner's own connection to `[target] redis_url` sends
//! `CLIENT PAUSE <timeout_ms + 1000> WRITE` (Redis 6.2 or later; the Redis documentation of
//! `CLIENT PAUSE`: write commands are postponed, reads are served), the racers' requests are
//! sent, and `CLIENT LIST` is read every [`POLL_INTERVAL`] until exactly as many clients as
//! racers are seen blocked (`flags=b`) on a command that is not a blocking read or pop of their
//! own ([`OWN_BLOCKING`]). Then `CLIENT UNPAUSE` releases them together. What that proves:
//! [`PROVES`](super::format::PROVES). A racer answered while writes are paused, or fewer (or more) blocked writers
//! than racers at `timeout_ms`, is a barrier problem (the run is PENDING with the reason).
//!
//! The pause is server-wide: it holds the writes of EVERY client of that Redis server, not only
//! the racers'. The barrier refuses a server where clients are already blocked before the
//! pause (it could not tell them from the racers); the pause itself expires on the server a
//! second after `timeout_ms` even if the runner dies, and the controller unpauses on drop.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::service::TargetError;

/// How often `CLIENT LIST` is read while the racers gather.
pub const POLL_INTERVAL: Duration = Duration::from_millis(5);

/// How much longer the server-side pause lasts than the gathering, so that it never expires
/// while the runner still counts blocked writers.
pub(crate) const PAUSE_MARGIN: Duration = Duration::from_secs(1);

/// Commands that block a client by themselves (an empty list, a stream with no entry, `WAIT`):
/// a client blocked in one is not counted as a paused writer.
pub const OWN_BLOCKING: [&str; 13] = [
    "blpop",
    "brpop",
    "brpoplpush",
    "blmove",
    "blmpop",
    "bzpopmin",
    "bzpopmax",
    "bzmpop",
    "xread",
    "xreadgroup",
    "wait",
    "waitaof",
    "subscribe",
];

/// Why the pause barrier could not look, pause or unpause (the wave's problem is its `Display`).
#[derive(Debug, thiserror::Error)]
pub(crate) enum PauseError {
    /// A `CLIENT` command failed.
    #[error("{command}: {source}")]
    Command {
        /// The command, as sent.
        command: String,
        /// Redis' error.
        #[source]
        source: redis::RedisError,
    },
    /// Clients were blocked before the pause, so they could not be told from the racers.
    #[error("{}", already_blocked(.0))]
    AlreadyBlocked(Vec<ClientSeen>),
}

impl PauseError {
    /// A failed `command`.
    fn command(command: impl Into<String>, source: redis::RedisError) -> PauseError {
        PauseError::Command {
            command: command.into(),
            source,
        }
    }
}

/// One client as `CLIENT LIST` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClientSeen {
    /// `id=`.
    pub id: i64,
    /// `addr=` (the client's address and port).
    pub addr: String,
    /// `db=`.
    pub db: i64,
    /// `flags=` (`b`: blocked).
    pub flags: String,
    /// `cmd=`: the command it runs (or ran last).
    pub cmd: String,
    /// `qbuf=`: bytes in its query buffer, beyond the command it runs: further commands it
    /// already sent (pipelined behind a blocked write).
    #[serde(default)]
    pub qbuf: usize,
}

impl ClientSeen {
    /// Blocked, on a command that does not block by itself: a write postponed by the pause.
    pub(crate) fn is_paused_writer(&self) -> bool {
        self.flags.contains('b') && !OWN_BLOCKING.contains(&self.cmd.as_str())
    }
}

/// Reads `CLIENT LIST`'s text: one client a line, `name=value` fields separated by spaces.
/// Lines without an `id=` are skipped.
pub(crate) fn parse_client_list(text: &str) -> Vec<ClientSeen> {
    text.lines()
        .filter_map(|line| {
            let field = |name: &str| {
                line.split(' ')
                    .find_map(|f| f.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
            };
            Some(ClientSeen {
                id: field("id")?.parse().ok()?,
                addr: field("addr").unwrap_or_default().to_string(),
                db: field("db").and_then(|d| d.parse().ok()).unwrap_or(0),
                flags: field("flags").unwrap_or_default().to_string(),
                cmd: field("cmd").unwrap_or_default().to_string(),
                qbuf: field("qbuf").and_then(|q| q.parse().ok()).unwrap_or(0),
            })
        })
        .collect()
}

/// The runner's connection that pauses and unpauses the writes of one Redis server.
pub(crate) struct PauseController {
    conn: redis::Connection,
    own_id: i64,
    paused: bool,
    /// The statement of the last pause (`CLIENT PAUSE 11000 WRITE`).
    pub statement: Option<String>,
}

impl PauseController {
    /// Connects to `url` and checks that the server can pause writes only (Redis 6.2 or later)
    /// and that no client is blocked there now.
    ///
    /// Will return `Err` ([`TargetError::Setup`]) when Redis does not answer, is older than
    /// 6.2, or has blocked clients already (a shared server: they could not be told from the
    /// racers).
    pub(crate) fn connect(url: &str) -> Result<PauseController, TargetError> {
        let mut conn = super::redis_store::connect(url, "the redis-pause barrier")?;
        let setup = |m: String| TargetError::Setup(format!("barrier redis-pause: {m}"));
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query(&mut conn)
            .map_err(|e| setup(format!("INFO server: {e}")))?;
        let version = info
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .unwrap_or("")
            .trim()
            .to_string();
        let parts: Vec<u32> = version.split('.').map(|p| p.parse().unwrap_or(0)).collect();
        let (major, minor) = (
            parts.first().copied().unwrap_or(0),
            parts.get(1).copied().unwrap_or(0),
        );
        if (major, minor) < (6, 2) {
            return Err(setup(format!(
                "Redis {version:?} cannot pause writes only (CLIENT PAUSE … WRITE needs 6.2 or later)"
            )));
        }
        let own_id: i64 = redis::cmd("CLIENT")
            .arg("ID")
            .query(&mut conn)
            .map_err(|e| setup(format!("CLIENT ID: {e}")))?;
        let mut c = PauseController {
            conn,
            own_id,
            paused: false,
            statement: None,
        };
        let blocked = c.blocked().map_err(|e| setup(e.to_string()))?;
        if !blocked.is_empty() {
            return Err(setup(already_blocked(&blocked)));
        }
        Ok(c)
    }

    /// Every other client that is blocked now.
    ///
    /// Will return `Err` ([`PauseError::Command`]) when `CLIENT LIST` fails.
    pub(crate) fn blocked(&mut self) -> Result<Vec<ClientSeen>, PauseError> {
        let text: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query(&mut self.conn)
            .map_err(|e| PauseError::command("CLIENT LIST", e))?;
        Ok(parse_client_list(&text)
            .into_iter()
            .filter(|c| c.id != self.own_id && c.flags.contains('b'))
            .collect())
    }

    /// Pauses every client's writes for `timeout` plus [`PAUSE_MARGIN`], after checking that
    /// no client is blocked already.
    ///
    /// Will return `Err` (nothing paused) when clients are blocked already or Redis refuses.
    pub(crate) fn pause(&mut self, timeout: Duration) -> Result<(), PauseError> {
        let blocked = self.blocked()?;
        if !blocked.is_empty() {
            return Err(PauseError::AlreadyBlocked(blocked));
        }
        let ms = u64::try_from((timeout + PAUSE_MARGIN).as_millis()).unwrap_or(u64::MAX);
        redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(ms)
            .arg("WRITE")
            .query::<()>(&mut self.conn)
            .map_err(|e| PauseError::command(format!("CLIENT PAUSE {ms} WRITE"), e))?;
        self.paused = true;
        self.statement = Some(format!("CLIENT PAUSE {ms} WRITE"));
        Ok(())
    }

    /// Releases the pause.
    ///
    /// Will return `Err` ([`PauseError::Command`]) when Redis refuses (the pause still ends
    /// at its timeout).
    pub(crate) fn unpause(&mut self) -> Result<(), PauseError> {
        self.paused = false;
        redis::cmd("CLIENT")
            .arg("UNPAUSE")
            .query::<()>(&mut self.conn)
            .map_err(|e| PauseError::command("CLIENT UNPAUSE", e))
    }

    /// Polls until exactly `n` paused writers are seen, `early` names a racer answered while
    /// paused (its reason), or `timeout` passes; then unpauses. The racers' requests must be
    /// on their way when this is called.
    pub(crate) fn gather_and_release(
        &mut self,
        n: usize,
        timeout: Duration,
        early: &dyn Fn() -> Option<String>,
    ) -> Gathered {
        let started = Instant::now();
        let until = started + timeout;
        let mut polls = 0u32;
        let mut last: Vec<ClientSeen> = Vec::new();
        let problem = loop {
            match self.blocked() {
                Ok(b) => {
                    polls += 1;
                    last = b.into_iter().filter(ClientSeen::is_paused_writer).collect();
                    if last.len() == n {
                        break None;
                    }
                }
                Err(e) => break Some(e.to_string()),
            }
            if let Some(reason) = early() {
                break Some(reason);
            }
            if Instant::now() >= until {
                break Some(format!(
                    "{} of {n} requests seen blocked on a write in Redis within {} ms{}: the others \
                     did not write to Redis (a read-only path, a key store elsewhere) or are queued \
                     before it (a pool smaller than the racers, a worker limit, an in-process lock){}",
                    last.len(),
                    timeout.as_millis(),
                    if last.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", commands(&last))
                    },
                    if last.len() > n {
                        "; more blocked writers than racers: another client writes to this Redis server".to_string()
                    } else {
                        shared_connection(&last).unwrap_or_default()
                    }
                ));
            }
            // An observed-condition poll with a deadline: CLIENT LIST has no change
            // notification.
            std::thread::sleep(POLL_INTERVAL.min(until.saturating_duration_since(Instant::now())));
        };
        let reached_ms = started.elapsed().as_secs_f64() * 1000.0;
        let unpaused = self.unpause();
        let problem = match (problem, unpaused) {
            (Some(p), _) => Some(p),
            (None, Err(e)) => Some(format!("{e} (the pause ends at its timeout)")),
            (None, Ok(())) => None,
        };
        Gathered {
            blocked: last,
            polls,
            reached_ms,
            problem,
        }
    }
}

impl Drop for PauseController {
    fn drop(&mut self) {
        if self.paused {
            // Best effort: the server ends the pause at its timeout anyway.
            let _ = self.unpause();
        }
    }
}

/// What one wave's gathering saw.
#[derive(Debug, Clone)]
pub(crate) struct Gathered {
    /// The paused writers seen at the last poll (every racer's, when reached).
    pub blocked: Vec<ClientSeen>,
    /// `CLIENT LIST` reads.
    pub polls: u32,
    /// Milliseconds from the pause until the release.
    pub reached_ms: f64,
    /// Why the barrier was not proven, if it was not.
    pub problem: Option<String>,
}

/// `cmd=` of each client, with its count: `set ×2, incr`.
pub fn commands(clients: &[ClientSeen]) -> String {
    let mut by: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    for c in clients {
        *by.entry(c.cmd.as_str()).or_default() += 1;
    }
    by.iter()
        .map(|(c, k)| {
            if *k > 1 {
                format!("{c} ×{k}")
            } else {
                c.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn already_blocked(blocked: &[ClientSeen]) -> String {
    format!(
        "refused: {} client(s) of this Redis server are blocked before the pause ({}; {}): the \
         server is shared with clients the barrier cannot tell from the racers, and CLIENT PAUSE \
         would hold every client's writes",
        blocked.len(),
        commands(blocked),
        blocked
            .iter()
            .map(|c| c.addr.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// When a blocked writer has further commands queued behind its write (`qbuf` above 0): the
/// sign of several requests sharing one connection, in words, with the remedy.
fn shared_connection(blocked: &[ClientSeen]) -> Option<String> {
    let queued: Vec<String> = blocked
        .iter()
        .filter(|c| c.qbuf > 0)
        .map(|c| format!("client id={} ({}) has {} byte(s)", c.id, c.addr, c.qbuf))
        .collect();
    (!queued.is_empty()).then(|| {
        format!(
            "; {} of further commands queued behind its blocked write: the service sends several requests' commands over one Redis connection (a shared client), so one blocked connection holds them all and the others cannot be seen blocked. Give each request its own connection for the test (a pool), or race it with [barrier] kind = \"http\"",
            queued.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_list_lines_give_the_blocked_writers_and_not_the_blocking_reads() {
        let text = "id=4 addr=127.0.0.1:54248 laddr=127.0.0.1:6391 fd=8 name= age=0 idle=0 flags=b db=3 sub=0 cmd=set user=default\n\
                    id=5 addr=127.0.0.1:54250 laddr=127.0.0.1:6391 fd=9 name= age=0 idle=0 flags=b db=0 cmd=blpop user=default\n\
                    id=6 addr=127.0.0.1:54266 laddr=127.0.0.1:6391 fd=10 name= age=0 idle=0 flags=N db=0 cmd=client|list user=default\n";
        let all = parse_client_list(text);
        assert_eq!(all.len(), 3);
        assert_eq!(all[0].db, 3);
        assert_eq!(all[0].cmd, "set");
        let writers: Vec<_> = all.iter().filter(|c| c.is_paused_writer()).collect();
        assert_eq!(writers.len(), 1);
        assert_eq!(writers[0].id, 4);
        assert_eq!(commands(&all), "blpop, client|list, set");
        assert_eq!(shared_connection(&all), None);
    }

    #[test]
    fn a_blocked_writer_with_commands_queued_behind_it_names_a_shared_connection() {
        let text = "id=9 addr=127.0.0.1:40001 fd=8 name= flags=b db=5 multi=-1 qbuf=48 qbuf-free=0 cmd=set user=default\n";
        let all = parse_client_list(text);
        assert_eq!(all[0].qbuf, 48);
        let hint = shared_connection(&all).expect("a queue behind a blocked write");
        assert!(
            hint.contains("client id=9 (127.0.0.1:40001) has 48 byte(s)"),
            "{hint}"
        );
        assert!(hint.contains("one Redis connection"), "{hint}");
    }
}
