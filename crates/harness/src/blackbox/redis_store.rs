//! Redis for black-box scenarios: count queries whose effects live in Redis, and the
//! runner's own direct connection to the scenario's `[target] redis_url`.
//!
//! A Redis count is a command from a read-only allow-list ([`READ_ONLY_COUNT_COMMANDS`](super::format::target::READ_ONLY_COUNT_COMMANDS))
//! whose arguments are templates bound as the SQL counts' placeholders are (`{scope}`,
//! `{key}`, `{run}`; each argument is sent as one RESP bulk string, so a bound value is never
//! parsed as a command). Its reply is the count: an integer, a bulk or simple string that
//! parses as a decimal integer, or nil (0). Any other reply is an error the counts check
//! reports. The command runs on a connection of the runner's own, straight to `redis_url`:
//! never through the interposer, so counting is not a step of any schedule.

use std::time::Duration;

use super::service::TargetError;
use ticketflow_core::store::url::redact;

/// How long the runner waits for Redis to connect or answer one command.
pub(crate) const REDIS_TIMEOUT: Duration = Duration::from_secs(2);

/// A direct connection to `url` (a `redis://` URL, its path the database number) with
/// [`REDIS_TIMEOUT`] on connect, reads and writes; `what` says what it is for.
///
/// Will return `Err` ([`TargetError::Setup`]) when the URL does not parse or Redis does not
/// answer `PING` in time.
pub(crate) fn connect(url: &str, what: &str) -> Result<redis::Connection, TargetError> {
    let fail = |e: redis::RedisError| {
        TargetError::Setup(format!("Redis at {} ({what}): {e}", redact(url)))
    };
    let client = redis::Client::open(url).map_err(fail)?;
    let mut conn = client
        .get_connection_with_timeout(REDIS_TIMEOUT)
        .map_err(fail)?;
    conn.set_read_timeout(Some(REDIS_TIMEOUT)).map_err(fail)?;
    conn.set_write_timeout(Some(REDIS_TIMEOUT)).map_err(fail)?;
    redis::cmd("PING")
        .query::<String>(&mut conn)
        .map_err(fail)?;
    Ok(conn)
}

/// Runs one count command (`words`: the name, then the bound arguments) and reads its reply
/// as a count.
///
/// Will return `Err` when Redis answers an error or a reply that is not a count
/// ([`reply_count`]).
pub(crate) fn run_count(conn: &mut redis::Connection, words: &[String]) -> Result<i64, CountError> {
    let Some((name, args)) = words.split_first() else {
        return Err(CountError::Empty);
    };
    let mut cmd = redis::cmd(name);
    for a in args {
        cmd.arg(a.as_bytes());
    }
    let value: redis::Value = cmd.query(conn).map_err(|source| CountError::Redis {
        name: name.clone(),
        source,
    })?;
    reply_count(&value).map_err(|source| CountError::Reply {
        name: name.clone(),
        source,
    })
}

/// Why a Redis count has no value (the count's failure says it).
#[derive(Debug, thiserror::Error)]
pub(crate) enum CountError {
    /// No command name.
    #[error("the Redis command is empty")]
    Empty,
    /// The runner has no connection to the target's `redis_url`.
    #[error("no connection to redis_url")]
    NoConnection,
    /// Redis answered an error or did not answer.
    #[error("Redis {name}: {source}")]
    Redis {
        /// The command's name.
        name: String,
        /// Redis' error.
        #[source]
        source: redis::RedisError,
    },
    /// The reply is not a count.
    #[error("Redis {name}: {source}")]
    Reply {
        /// The command's name.
        name: String,
        /// Why the reply is not a count.
        #[source]
        source: ReplyError,
    },
}

/// Why a Redis reply is not a count ([`reply_count`]).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReplyError {
    /// Text that is not a decimal `i64`.
    #[error("the reply {0:?} is not an integer")]
    NotInteger(String),
    /// A bulk string that is not UTF-8 (its length in bytes).
    #[error("the reply ({0} bytes) is not text, so not an integer")]
    NotText(usize),
    /// An error reply.
    #[error("error reply: {0:?}")]
    ErrorReply(redis::ServerError),
    /// A reply of another type (an array, a float, …).
    #[error("the reply {0:?} is not an integer")]
    Other(redis::Value),
}

/// A reply as a count: an integer; a bulk, simple or verbatim string that parses as a decimal
/// `i64` (what `GET` of an `INCR`ed key answers); nil is 0; a RESP3 boolean is 0 or 1.
///
/// Will return `Err` for any other reply (an array, a float, text that is not an integer).
pub(crate) fn reply_count(value: &redis::Value) -> Result<i64, ReplyError> {
    use redis::Value;
    let text = |s: &str| {
        s.trim()
            .parse::<i64>()
            .map_err(|_| ReplyError::NotInteger(s.to_string()))
    };
    match value {
        Value::Nil => Ok(0),
        Value::Int(i) => Ok(*i),
        Value::Boolean(b) => Ok(i64::from(*b)),
        Value::BulkString(b) => match std::str::from_utf8(b) {
            Ok(s) => text(s),
            Err(_) => Err(ReplyError::NotText(b.len())),
        },
        Value::SimpleString(s) => text(s),
        Value::VerbatimString { text: s, .. } => text(s),
        Value::ServerError(e) => Err(ReplyError::ErrorReply(e.clone())),
        other => Err(ReplyError::Other(other.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_is_a_count_when_it_is_an_integer_a_number_as_text_or_nil() {
        use redis::Value;
        assert_eq!(reply_count(&Value::Int(3)).unwrap(), 3);
        assert_eq!(reply_count(&Value::Nil).unwrap(), 0);
        assert_eq!(reply_count(&Value::BulkString(b"2".to_vec())).unwrap(), 2);
        assert_eq!(reply_count(&Value::SimpleString("7".into())).unwrap(), 7);
        assert!(reply_count(&Value::BulkString(b"{\"id\":1}".to_vec())).is_err());
        assert!(reply_count(&Value::BulkString(b"1.5".to_vec())).is_err());
        assert!(reply_count(&Value::Array(vec![Value::Int(1)])).is_err());
    }
}
