//! One client connection relayed to Redis, RESP2 and RESP3 (the Redis serialization protocol
//! specification, redis.io/docs/reference/protocol-spec).
//!
//! Commands arrive as arrays of bulk strings or as inline commands (a line of words). During
//! a run each is one step, held at the [`Hub`] before it is forwarded (once every earlier
//! reply is in) and complete when its reply is in. Outside a run they pass through: each
//! command is framed ([`frame_command`]: where it ends and its name, nothing copied) and the
//! commands whole in one read go on in one write, without waiting for replies; the replies
//! of one read go back in one write. The names keep the state a run needs if it begins
//! mid-stream (a transaction open, a subscription, `QUIT`). A
//! transaction is one step: `MULTI` and the commands it queues are forwarded as they come
//! (the server only queues them), and the `EXEC` that runs them all is the step, its text
//! naming the queued commands. A script (`EVAL`, `EVALSHA`, `FCALL`) is one command, hence one
//! step. Connection housekeeping (`HELLO`, `AUTH`, `SELECT`, `CLIENT`, `PING`, …) and
//! `WATCH` are forwarded unheld. Replies are framed for every RESP3 type; push messages
//! (`>`) answer no command and are not counted.
//!
//! Pub/sub: after `SUBSCRIBE` (and its `P`/`S` and `UNSUBSCRIBE` forms) or `MONITOR` the server
//! sends replies that answer no command one to one (RESP2: a `*3` confirmation per channel,
//! then `message`/`pmessage`/`smessage` arrays as they are published; RESP3: the
//! confirmations themselves are push frames), so from that command on the connection's
//! replies are not counted and its commands pass unheld and unscheduled for the rest of the
//! connection (after a `RESET` too). `CLIENT REPLY OFF` and `CLIENT REPLY SKIP` (the server
//! then leaves commands unanswered) do the same. `QUIT` is forwarded and the server's `+OK`
//! relayed before the close.
//!
//! Bounds: the client's first whole command must come within
//! [`super::Limits::startup_timeout`] (the server is connected only then); a command or reply
//! over [`super::Limits::max_message`] is answered `-ERR` naming the bound, a malformed
//! command `-ERR Protocol error: …`, and the connection is closed.
//!
//! A step released with a cut ([`super::Action`]): cut before, the command (or the `EXEC`) is
//! never written and the connection is closed on both sides (Redis discards a transaction
//! whose connection closes before its `EXEC`); cut after, the command is forwarded, its whole
//! reply is read and withheld, and then the client's connection is closed.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use super::hub::{Action, Hub, StoreKind};
use super::spin::{Gate, Polled};
use super::{Ending, Limits, Owed};

/// Commands forwarded unheld: they set up the connection or only watch.
const HOUSEKEEPING: &[&str] = &[
    "HELLO",
    "AUTH",
    "SELECT",
    "CLIENT",
    "PING",
    "ECHO",
    "QUIT",
    "RESET",
    "READONLY",
    "READWRITE",
    "COMMAND",
    "INFO",
    "WATCH",
    "UNWATCH",
    "MULTI",
    "DISCARD",
];

/// Nesting deeper than this in a reply is refused.
const MAX_DEPTH: usize = 64;

/// The end of the CRLF-terminated line starting at `at` (index of its `\r`), if buffered.
fn line_end(b: &[u8], at: usize) -> Option<usize> {
    b.get(at..)?
        .windows(2)
        .position(|w| w == b"\r\n")
        .map(|i| at + i)
}

/// Why a RESP message cannot be framed: malformed, or over the size or depth allowed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RespError {
    /// A length or count that is not a decimal number.
    #[error("not a number: {0:?}")]
    NotNumber(String),
    /// An inline command with no end within `max` bytes.
    #[error("inline command longer than {max} bytes")]
    InlineTooLong {
        /// The limit.
        max: usize,
    },
    /// A negative word count.
    #[error("command of {0} words")]
    Words(i64),
    /// A word of an array command that is not a bulk string.
    #[error("a command word is not a bulk string")]
    NotBulk,
    /// A negative length of a command word.
    #[error("negative length")]
    NegativeLength,
    /// A command word over `max` bytes.
    #[error("command word longer than {max} bytes")]
    WordTooLong {
        /// The limit.
        max: usize,
    },
    /// A command over `max` bytes.
    #[error("command longer than {max} bytes")]
    CommandTooLong {
        /// The limit.
        max: usize,
    },
    /// A reply nested deeper than [`MAX_DEPTH`].
    #[error("reply nested deeper than {MAX_DEPTH}")]
    TooDeep,
    /// A reply line with no end within `max` bytes.
    #[error("reply line longer than {max} bytes")]
    LineTooLong {
        /// The limit.
        max: usize,
    },
    /// A length that does not fit this machine's sizes.
    #[error("length")]
    Length,
    /// A bulk value over `max` bytes.
    #[error("bulk of {n} bytes is over {max}")]
    BulkTooLong {
        /// Its length.
        n: usize,
        /// The limit.
        max: usize,
    },
    /// A reply type byte RESP does not have.
    #[error("unknown reply type {0:?}")]
    UnknownType(char),
}

impl RespError {
    /// The bound, bytes, when the error is a size over [`super::Limits::max_message`].
    fn over_bound(&self) -> Option<usize> {
        match self {
            RespError::InlineTooLong { max }
            | RespError::WordTooLong { max }
            | RespError::CommandTooLong { max }
            | RespError::LineTooLong { max }
            | RespError::BulkTooLong { max, .. } => Some(*max),
            _ => None,
        }
    }
}

fn number(b: &[u8], from: usize, to: usize) -> Result<i64, RespError> {
    std::str::from_utf8(&b[from..to])
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| RespError::NotNumber(String::from_utf8_lossy(&b[from..to]).into_owned()))
}

/// A framed command: the bytes it takes, and its words.
pub(crate) type Framed = (usize, Vec<Vec<u8>>);

/// A command at the start of `b`: `(bytes it takes, its words)`; `None` when not all of it is
/// buffered yet.
///
/// Will return `Err` for a malformed command or one longer than `max` bytes.
pub(crate) fn parse_command(b: &[u8], max: usize) -> Result<Option<Framed>, RespError> {
    let mut words = Vec::new();
    let len = walk_command(b, max, |w| words.push(b[w].to_vec()))?;
    Ok(len.map(|len| (len, words)))
}

/// A command at the start of `b`, framed without copying a byte: `(bytes it takes, where its
/// first word is in b)`, the range empty for a command of no words; `None` when not all of it
/// is buffered yet. What pass-through needs: where the command ends and its name.
///
/// Will return `Err` as [`parse_command`] does.
pub(crate) fn frame_command(
    b: &[u8],
    max: usize,
) -> Result<Option<(usize, Range<usize>)>, RespError> {
    let mut first = None;
    let len = walk_command(b, max, |w| {
        first.get_or_insert(w);
    })?;
    Ok(len.map(|len| (len, first.unwrap_or(0..0))))
}

/// Frames the command at the start of `b`, calling `word` with where each of its words is in
/// `b`, in order (for a command not all buffered, perhaps only some); returns the bytes it
/// takes, `None` when not all of it is buffered yet.
fn walk_command(
    b: &[u8],
    max: usize,
    mut word: impl FnMut(Range<usize>),
) -> Result<Option<usize>, RespError> {
    if b.is_empty() {
        return Ok(None);
    }
    if b[0] != b'*' {
        // Inline: one line of words separated by spaces.
        let Some(end) = b.iter().position(|&c| c == b'\n') else {
            return if b.len() > max {
                Err(RespError::InlineTooLong { max })
            } else {
                Ok(None)
            };
        };
        let line = if end > 0 && b[end - 1] == b'\r' {
            end - 1
        } else {
            end
        };
        let mut at = 0;
        while at < line {
            let stop = b[at..line]
                .iter()
                .position(|&c| c == b' ')
                .map_or(line, |i| at + i);
            if stop > at {
                word(at..stop);
            }
            at = stop + 1;
        }
        return Ok(Some(end + 1));
    }
    let Some(end) = line_end(b, 1) else {
        return Ok(None);
    };
    let n = number(b, 1, end)?;
    let n = usize::try_from(n).map_err(|_| RespError::Words(n))?;
    let mut at = end + 2;
    for _ in 0..n {
        if at >= b.len() {
            return Ok(None);
        }
        if b[at] != b'$' {
            return Err(RespError::NotBulk);
        }
        let Some(e) = line_end(b, at + 1) else {
            return Ok(None);
        };
        let len = usize::try_from(number(b, at + 1, e)?).map_err(|_| RespError::NegativeLength)?;
        if len > max {
            return Err(RespError::WordTooLong { max });
        }
        let start = e + 2;
        if b.len() < start + len + 2 {
            if start + len > max {
                return Err(RespError::CommandTooLong { max });
            }
            return Ok(None);
        }
        word(start..start + len);
        at = start + len + 2;
    }
    Ok(Some(at))
}

/// What one framed reply is (the relay itself frames with [`reply_len`] and reads a reply
/// with [`read_reply`] only when it is a step's result).
#[cfg(test)]
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Reply {
    /// Bytes it takes.
    pub len: usize,
    /// An error reply (`-` or `!`), with its text.
    pub error: Option<String>,
    /// A push message (`>`): it answers no command.
    pub push: bool,
    /// The reply in one line for the evidence ([`shown`]): `+OK`, `nil`, `:1`, `"value"`,
    /// `*2`, `-ERR …`.
    pub shown: String,
}

/// Longest bulk value shown in a result, in characters.
const SHOWN_BULK: usize = 60;

/// The whole reply `b` (one framed value) in one line: its first line as sent (`+OK`, `:1`,
/// `-ERR …`, `*2`), except that a null (`$-1`, `*-1`, RESP3 `_`) is `nil` and a bulk string
/// shows its value, quoted and clipped (`"v1"`), so `SET NX` that lost (`nil`) does not look
/// like one that won (`+OK`).
fn shown(b: &[u8]) -> String {
    let end = line_end(b, 0).unwrap_or(b.len());
    let line = String::from_utf8_lossy(&b[..end]).into_owned();
    match (b.first(), line.as_str()) {
        (_, "$-1" | "*-1" | "_") => "nil".to_string(),
        (Some(&kind @ (b'$' | b'=' | b'!')), _) => {
            let start = (end + 2).min(b.len());
            let stop = b.len().saturating_sub(2).max(start);
            let value = String::from_utf8_lossy(&b[start..stop]);
            let value = super::hub::clip_to(&value, SHOWN_BULK);
            if kind == b'!' {
                // A RESP3 bulk error: shown as an error line is.
                format!("-{value}")
            } else {
                format!("{value:?}")
            }
        }
        _ => line,
    }
}

/// A reply at the start of `b`; `None` when not all of it is buffered yet.
///
/// Will return `Err` for a malformed reply, nesting deeper than [`MAX_DEPTH`] or a bulk
/// longer than `max` bytes.
#[cfg(test)]
pub(crate) fn parse_reply(b: &[u8], max: usize) -> Result<Option<Reply>, RespError> {
    let Some(len) = reply_len(b, max)? else {
        return Ok(None);
    };
    let (error, shown) = read_reply(&b[..len]);
    Ok(Some(Reply {
        len,
        error,
        push: b[0] == b'>',
        shown,
    }))
}

/// The bytes the reply at the start of `b` takes, framed without reading it; `None` when not
/// all of it is buffered yet.
///
/// Will return `Err` as [`parse_reply`] does.
pub(crate) fn reply_len(b: &[u8], max: usize) -> Result<Option<usize>, RespError> {
    if b.is_empty() {
        return Ok(None);
    }
    value_len(b, 0, max, 0)
}

/// One whole framed reply `b` as a step's result: its error (an error reply's text, `-` or
/// `!`) and the reply in one line ([`shown`]).
fn read_reply(b: &[u8]) -> (Option<String>, String) {
    let error = match b.first() {
        Some(b'-') => {
            Some(String::from_utf8_lossy(&b[1..b.len().saturating_sub(2).max(1)]).into_owned())
        }
        Some(b'!') => Some("bulk error".to_string()),
        _ => None,
    };
    (error, shown(b))
}

/// The end (exclusive) of the value at `at`.
fn value_len(b: &[u8], at: usize, max: usize, depth: usize) -> Result<Option<usize>, RespError> {
    if depth > MAX_DEPTH {
        return Err(RespError::TooDeep);
    }
    let Some(&kind) = b.get(at) else {
        return Ok(None);
    };
    let Some(end) = line_end(b, at + 1) else {
        return if b.len() - at > max {
            Err(RespError::LineTooLong { max })
        } else {
            Ok(None)
        };
    };
    let after = end + 2;
    match kind {
        b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => Ok(Some(after)),
        b'$' | b'!' | b'=' => {
            let n = number(b, at + 1, end)?;
            if n < 0 {
                return Ok(Some(after));
            }
            let n = usize::try_from(n).map_err(|_| RespError::Length)?;
            if n > max {
                return Err(RespError::BulkTooLong { n, max });
            }
            Ok((b.len() >= after + n + 2).then_some(after + n + 2))
        }
        b'*' | b'~' | b'>' | b'%' | b'|' => {
            let n = number(b, at + 1, end)?;
            if n < 0 {
                return Ok(Some(after));
            }
            let n = usize::try_from(n).map_err(|_| RespError::Length)?;
            let items = if matches!(kind, b'%' | b'|') {
                2 * n
            } else {
                n
            };
            let mut pos = after;
            for _ in 0..items {
                match value_len(b, pos, max, depth + 1)? {
                    Some(p) => pos = p,
                    None => return Ok(None),
                }
            }
            if kind == b'|' {
                // An attribute only annotates the value that follows it.
                return value_len(b, pos, max, depth + 1);
            }
            Ok(Some(pos))
        }
        other => Err(RespError::UnknownType(other as char)),
    }
}

/// The words of a command as text for the evidence.
fn words_text(words: &[Vec<u8>]) -> String {
    words
        .iter()
        .map(|w| match std::str::from_utf8(w) {
            Ok(s) if !s.contains(' ') && !s.is_empty() => s.to_string(),
            Ok(s) => format!("{s:?}"),
            Err(_) => format!("<{} bytes>", w.len()),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Commands after which the server sends replies that answer no command: pub/sub messages
/// and confirmations (one per channel), `MONITOR`'s lines.
const UNSOLICITED: &[&str] = &[
    "SUBSCRIBE",
    "PSUBSCRIBE",
    "SSUBSCRIBE",
    "UNSUBSCRIBE",
    "PUNSUBSCRIBE",
    "SUNSUBSCRIBE",
    "MONITOR",
];

/// Whether `command` (its text, or its name) is one of [`UNSOLICITED`].
fn unsolicited(command: &str) -> bool {
    unsolicited_name(command.split(' ').next().unwrap_or_default().as_bytes())
}

/// Whether the command name `name` is one of [`UNSOLICITED`].
fn unsolicited_name(name: &[u8]) -> bool {
    UNSOLICITED.iter().any(|u| is(name, u))
}

/// A connection over [`Limits::max_connections`]: answered at once as Redis answers one over
/// its `maxclients` (`-ERR max number of clients reached`), then closed.
pub(crate) fn refuse(client: &TcpStream) {
    super::farewell(client, b"-ERR max number of clients reached\r\n");
}

/// The client's first whole command, read within [`Limits::startup_timeout`] before the
/// server is connected; `None` (the connection is to be closed) when the client closed, the
/// deadline passed or the command was refused ([`refuse_command`]).
///
/// Will return `Err` on an I/O error of the client's socket.
fn first_command(client: &TcpStream, limits: &Limits) -> io::Result<Option<Vec<u8>>> {
    let until = Instant::now() + limits.startup_timeout;
    let mut buf = Vec::new();
    let mut c = client;
    loop {
        match parse_command(&buf, limits.max_message) {
            Ok(Some(_)) => break,
            Ok(None) => {}
            Err(e) => {
                refuse_command(&e, client, None);
                return Ok(None);
            }
        }
        let left = until.saturating_duration_since(Instant::now());
        let timed_out = || {
            tracing::warn!(
                timeout_ms = limits.startup_timeout.as_millis() as u64,
                "interposer: no Redis command within the startup deadline; closed"
            );
            Ok(None)
        };
        if left.is_zero() {
            return timed_out();
        }
        c.set_read_timeout(Some(left))?;
        let mut chunk = [0u8; 16 * 1024];
        match c.read(&mut chunk) {
            Ok(0) => return Ok(None),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return timed_out();
            }
            Err(e) => return Err(e),
        }
    }
    c.set_read_timeout(None)?;
    Ok(Some(buf))
}

/// Answers a command the relay cannot take with Redis' own kind of error and closes: over the
/// bound, `-ERR` naming it; malformed, `-ERR Protocol error: …` as Redis says it. `owed`, when
/// the session has begun, keeps the answer between whole replies.
fn refuse_command(e: &RespError, client: &TcpStream, owed: Option<&Owed>) {
    let line = match e.over_bound() {
        Some(max) => format!(
            "-ERR command over the interposer's bound of {}; connection closed\r\n",
            super::bound_text(max)
        ),
        None => format!("-ERR Protocol error: {e}\r\n"),
    };
    tracing::warn!("interposer: Redis {}", line.trim_end());
    match owed {
        Some(owed) => {
            let _ = owed.send(client, line.as_bytes());
            super::linger_closed(client);
        }
        None => super::farewell(client, line.as_bytes()),
    }
}

/// Relays one client connection to the Redis server at `upstream` until either side closes.
/// The server is connected once the client's first command is in ([`first_command`]).
///
/// Will return `Err` on an I/O error of either side or a malformed or oversized message.
pub(crate) fn relay(
    client: TcpStream,
    upstream: SocketAddr,
    hub: &Arc<Hub>,
    limits: &Limits,
) -> io::Result<()> {
    let Some(first) = first_command(&client, limits)? else {
        return Ok(());
    };
    let server = TcpStream::connect_timeout(&upstream, limits.connect_timeout)?;
    server.set_nodelay(true)?;
    let max = limits.max_message;
    let owed = Owed::default();
    let (commands, replies) = Gate::pair(&owed, hub, &client, limits);
    let front = Polled {
        stream: client.try_clone()?,
        gate: Some(commands),
    };
    super::session(
        hub,
        StoreKind::Redis,
        (&client, &server),
        &owed,
        limits.connect_timeout,
        |id, owed, server, client| {
            let server = Polled {
                stream: server,
                gate: Some(replies),
            };
            replies_to_client(server, client, hub, id, owed, max)
        },
        |id, owed| commands_to_server(front, first, &server, hub, id, owed, limits),
    )
}

/// Whether `command` (one whole command) is `CLIENT REPLY OFF` or `CLIENT REPLY SKIP`
/// (case-insensitive), after which the server leaves commands unanswered.
fn replies_off(command: &[u8], max: usize) -> bool {
    let Ok(Some((_, words))) = parse_command(command, max) else {
        return false;
    };
    matches!(words.as_slice(), [_, reply, mode]
        if reply.eq_ignore_ascii_case(b"REPLY")
            && (mode.eq_ignore_ascii_case(b"OFF") || mode.eq_ignore_ascii_case(b"SKIP")))
}

fn invalid(e: RespError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// Reads more of `r` into `buf`; `false` at end of stream.
fn read_more(r: &mut impl Read, buf: &mut Vec<u8>) -> io::Result<bool> {
    let mut chunk = [0u8; 16 * 1024];
    let n = r.read(&mut chunk)?;
    buf.extend_from_slice(&chunk[..n]);
    Ok(n > 0)
}

/// The server's replies to the client, each paid to the command it answers: push frames
/// (`>`) answer none, and once the connection's replies are forgone ([`Owed::forgo`]: it
/// subscribed or ran `MONITOR`) none is paid. What one read brings is framed and passed on
/// in one write (a pipeline's replies stay together), and only then paid, so a step counts as
/// complete once the client has its reply.
fn replies_to_client(
    mut server: Polled<'_>,
    client: TcpStream,
    hub: &Hub,
    id: u64,
    owed: &Owed,
    max: usize,
) -> io::Result<()> {
    let mut buf = Vec::new();
    // Where the replies passed on but not yet paid are in `buf`.
    let mut due: Vec<Range<usize>> = Vec::new();
    let pay = |reply: &[u8]| {
        owed.pay(|| {
            let (error, shown) = read_reply(reply);
            hub.done(id, None, error, Some(shown));
        });
    };
    loop {
        if !read_more(&mut server, &mut buf)? {
            owed.send(&client, &buf)?;
            return Ok(());
        }
        let mut at = 0;
        loop {
            let len = match reply_len(&buf[at..], max) {
                Ok(Some(len)) => len,
                Ok(None) => break,
                Err(e) => {
                    // What came whole before it goes on; then the client is told why.
                    owed.send(&client, &buf[..at])?;
                    due.drain(..).for_each(|r| pay(&buf[r]));
                    if let Some(max) = e.over_bound() {
                        let line = format!(
                            "-ERR reply over the interposer's bound of {}; connection closed\r\n",
                            super::bound_text(max)
                        );
                        tracing::warn!("interposer: Redis {}", line.trim_end());
                        if owed.send(&client, line.as_bytes()).is_ok() {
                            owed.wait_front(Instant::now() + super::ERROR_GRACE);
                        }
                    }
                    return Err(invalid(e));
                }
            };
            let reply = at..at + len;
            let answers = buf[at] != b'>' && owed.accounting();
            if answers && hub.withholds_reply(id) {
                // A cut after the server: its whole reply is in and is withheld (what came
                // before it goes on); the client's connection is closed before the step
                // counts as complete.
                owed.send(&client, &buf[..at])?;
                due.drain(..).for_each(|r| pay(&buf[r]));
                let _ = client.shutdown(Shutdown::Both);
                pay(&buf[reply]);
                return Ok(());
            }
            at += len;
            if answers {
                due.push(reply);
            }
        }
        owed.send(&client, &buf[..at])?;
        due.drain(..).for_each(|r| pay(&buf[r]));
        buf.drain(..at);
    }
}

/// Whether the command name `name` is `upper` (an upper-case name), in any case.
fn is(name: &[u8], upper: &str) -> bool {
    name.eq_ignore_ascii_case(upper.as_bytes())
}

/// The client's commands to the server. During a run each is held at the hub as a step
/// unless it is housekeeping, and forwarded once released. Outside a run every command whole
/// in what the client sent passes through: the commands of one read go on in one write,
/// without waiting for replies (a pipeline stays a pipeline); only their names are read, to
/// keep the transaction, subscription and `QUIT` state a run needs when it begins. A command
/// is held only once every earlier reply is in ([`Owed::hold_next`]). Once the connection
/// subscribes (or runs `MONITOR`), the server sends it replies that answer no command (RESP2:
/// a confirmation per channel, then messages; RESP3: push frames), so its replies are
/// forgone ([`Owed::forgo`]) and its commands pass unheld for the rest of the connection.
// Long on purpose: one pass over the commands of a read, whose forwarded bytes (`sent..at`)
// every branch moves on.
fn commands_to_server(
    mut client: Polled<'_>,
    mut buf: Vec<u8>,
    mut server: &TcpStream,
    hub: &Hub,
    id: u64,
    owed: &Owed,
    limits: &Limits,
) -> io::Result<Ending> {
    let mut queued: Option<Vec<String>> = None;
    loop {
        // `buf[sent..at]`: commands decided on and not written yet.
        let (mut at, mut sent) = (0, 0);
        loop {
            let start = at;
            let (len, name) = match frame_command(&buf[at..], limits.max_message) {
                Ok(Some((len, name))) => (len, (start + name.start)..(start + name.end)),
                Ok(None) => break,
                Err(e) => {
                    server.write_all(&buf[sent..start])?;
                    refuse_command(&e, &client.stream, Some(owed));
                    return Err(invalid(e));
                }
            };
            at += len;
            let name = &buf[name];
            if name.is_empty() {
                // No words: the server ignores it and answers nothing.
                continue;
            }
            if !owed.accounting() {
                if is(name, "QUIT") {
                    server.write_all(&buf[sent..at])?;
                    return Ok(Ending::Drain);
                }
                continue;
            }
            // A transaction that subscribes subscribes at its EXEC. `CLIENT REPLY OFF` and
            // `SKIP` turn replies off (SKIP: its own and the next command's), so from then on
            // replies no longer answer commands one to one either.
            let subscribing = unsolicited_name(name)
                || (is(name, "EXEC") && queued.iter().flatten().any(|c| unsolicited(c)))
                || (is(name, "CLIENT") && replies_off(&buf[start..at], limits.max_message));
            if subscribing {
                // Every earlier reply is paid first, so each reply read after this is one the
                // server sends for the subscription.
                server.write_all(&buf[sent..start])?;
                sent = start;
                owed.wait_settled();
                owed.forgo();
                queued = None;
                continue;
            }
            let running = hub.running();
            let text = || {
                parse_command(&buf[start..at], limits.max_message)
                    .ok()
                    .flatten()
                    .map(|(_, words)| words_text(&words))
                    .unwrap_or_default()
            };
            let held = if is(name, "MULTI") {
                queued = Some(vec!["MULTI".into()]);
                None
            } else if is(name, "DISCARD") {
                queued = None;
                None
            } else if is(name, "EXEC") {
                queued.take().filter(|_| running).map(|mut q| {
                    q.push("EXEC".into());
                    q.join("; ")
                })
            } else if let Some(q) = queued.as_mut() {
                // Kept outside a run too: a run that begins before the EXEC holds it with
                // the commands it runs.
                q.push(text());
                None
            } else if !running || HOUSEKEEPING.iter().any(|h| is(name, h)) {
                None
            } else {
                Some(text())
            };
            if let Some(text) = held {
                server.write_all(&buf[sent..start])?;
                sent = start;
                let behind = buf.len() - at;
                if owed.hold_next(hub, id, (&text, Vec::new()), limits.max_hold, behind)
                    == Action::CutBefore
                {
                    // Closes both sides (`super::session`); the server never sees the
                    // command.
                    return Ok(Ending::Abrupt);
                }
            }
            owed.add();
            if running || is(name, "QUIT") {
                // In a run a command goes on as soon as it may, as it did one at a time.
                server.write_all(&buf[sent..at])?;
                sent = at;
            }
            if is(name, "QUIT") {
                // Its `+OK` still reaches the client: the server closes after it.
                return Ok(Ending::Drain);
            }
        }
        server.write_all(&buf[sent..at])?;
        buf.drain(..at);
        if !read_more(&mut client, &mut buf)? {
            return Ok(Ending::Drain);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_framed_as_arrays_or_inline_and_wait_for_their_last_byte() {
        let cmd = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\nv1\r\n";
        let (len, words) = parse_command(cmd, 1024).unwrap().unwrap();
        assert_eq!(len, cmd.len());
        assert_eq!(words, [b"SET".to_vec(), b"k".to_vec(), b"v1".to_vec()]);
        for cut in 1..cmd.len() {
            assert_eq!(parse_command(&cmd[..cut], 1024).unwrap(), None, "cut {cut}");
        }
        let (len, words) = parse_command(b"PING  hi\r\nGET", 1024).unwrap().unwrap();
        assert_eq!((len, words.len()), (10, 2));
        assert!(parse_command(b"*1\r\n:1\r\n", 1024).is_err());
        assert!(parse_command(b"*1\r\n$99999\r\n", 1024).is_err());
    }

    #[test]
    fn subscribing_commands_are_known_by_name_and_size_errors_by_their_bound() {
        assert!(unsolicited("SUBSCRIBE") && unsolicited("psubscribe a*"));
        assert!(unsolicited("SUnsubscribe") && unsolicited("MONITOR"));
        assert!(!unsolicited("PUBLISH a b") && !unsolicited("SUBSCRIBED"));
        let cmd = |words: &[&str]| {
            let mut b = format!("*{}\r\n", words.len());
            for w in words {
                b.push_str(&format!("${}\r\n{w}\r\n", w.len()));
            }
            b.into_bytes()
        };
        assert!(replies_off(&cmd(&["CLIENT", "REPLY", "OFF"]), 1024));
        assert!(replies_off(&cmd(&["client", "reply", "skip"]), 1024));
        assert!(!replies_off(&cmd(&["CLIENT", "REPLY", "ON"]), 1024));
        assert!(!replies_off(&cmd(&["CLIENT", "SETNAME", "x"]), 1024));
        let big = parse_command(b"*1\r\n$99999\r\n", 1024).unwrap_err();
        assert_eq!(big.over_bound(), Some(1024));
        let bad = parse_command(b"*1\r\n:1\r\n", 1024).unwrap_err();
        assert_eq!(bad.over_bound(), None);
    }

    #[test]
    fn replies_of_every_resp3_type_are_framed() {
        for r in [
            &b"+OK\r\n"[..],
            b"-ERR no\r\n",
            b":12\r\n",
            b"$3\r\nabc\r\n",
            b"$-1\r\n",
            b"*2\r\n$1\r\na\r\n:1\r\n",
            b"*-1\r\n",
            b"_\r\n",
            b",1.5\r\n",
            b"#t\r\n",
            b"(123\r\n",
            b"=7\r\ntxt:abc\r\n",
            b"!3\r\nbad\r\n",
            b"%1\r\n+k\r\n*1\r\n:1\r\n",
            b"~1\r\n+a\r\n",
            b">2\r\n+message\r\n+x\r\n",
            b"|1\r\n+ttl\r\n:3\r\n+OK\r\n",
        ] {
            let got = parse_reply(r, 1024).unwrap().unwrap();
            assert_eq!(got.len, r.len(), "{:?}", String::from_utf8_lossy(r));
            for cut in 1..r.len() {
                assert_eq!(parse_reply(&r[..cut], 1024).unwrap(), None);
            }
        }
        assert_eq!(
            parse_reply(b"-ERR no\r\n", 64)
                .unwrap()
                .unwrap()
                .error
                .as_deref(),
            Some("ERR no")
        );
        assert!(parse_reply(b">1\r\n+x\r\n", 64).unwrap().unwrap().push);
        let shown = |r: &[u8]| parse_reply(r, 1024).unwrap().unwrap().shown;
        assert_eq!(shown(b"+OK\r\n"), "+OK");
        assert_eq!(shown(b"$-1\r\n"), "nil", "SET NX that lost");
        assert_eq!(shown(b"_\r\n"), "nil");
        assert_eq!(shown(b"*-1\r\n"), "nil");
        assert_eq!(shown(b":1\r\n"), ":1");
        assert_eq!(shown(b"-ERR no\r\n"), "-ERR no");
        assert_eq!(shown(b"$3\r\nabc\r\n"), "\"abc\"");
        assert_eq!(shown(b"$0\r\n\r\n"), "\"\"");
        assert_eq!(shown(b"*2\r\n$1\r\na\r\n:1\r\n"), "*2");
        let long = format!("$100\r\n{}\r\n", "x".repeat(100));
        assert!(shown(long.as_bytes()).ends_with("…\""));
        assert!(parse_reply(b"?x\r\n", 64).is_err());
        let deep = "*1\r\n".repeat(MAX_DEPTH + 2) + ":1\r\n";
        assert!(parse_reply(deep.as_bytes(), 1 << 20).is_err());
    }
}
