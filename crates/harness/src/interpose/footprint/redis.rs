//! Redis commands: the key positions of the commands a service sends, and what a step of
//! one or more commands touches.

use super::{Footprint, StoreKind};

/// Where a command's keys are.
enum Keys {
    /// The first argument.
    First,
    /// The first two arguments.
    FirstTwo,
    /// Every argument.
    All,
    /// Every argument but the last (a blocking pop's timeout).
    AllButLast,
    /// Every other argument from the first (`MSET k v k v`).
    Pairs,
    /// `numkeys` at the second argument, then that many keys (scripts and functions).
    Declared,
}

/// The command table: name → (writes, where its keys are).
fn redis_command(name: &str) -> Option<(bool, Keys)> {
    use Keys::*;
    Some(match name {
        "GET" | "TTL" | "PTTL" | "TYPE" | "STRLEN" | "GETRANGE" | "SUBSTR" | "HGET" | "HMGET"
        | "HGETALL" | "HEXISTS" | "HLEN" | "HKEYS" | "HVALS" | "HSTRLEN" | "LRANGE" | "LLEN"
        | "LINDEX" | "LPOS" | "SMEMBERS" | "SISMEMBER" | "SMISMEMBER" | "SCARD" | "SRANDMEMBER"
        | "ZRANGE" | "ZRANGEBYSCORE" | "ZREVRANGE" | "ZSCORE" | "ZCARD" | "ZRANK" | "ZREVRANK"
        | "ZCOUNT" | "ZMSCORE" | "XRANGE" | "XREVRANGE" | "XLEN" | "EXPIRETIME" | "PEXPIRETIME"
        | "DUMP" | "GETBIT" | "BITCOUNT" => (false, First),
        "MGET" | "EXISTS" | "WATCH" | "SINTER" | "SUNION" | "SDIFF" | "PFCOUNT" => (false, All),
        "EVAL_RO" | "EVALSHA_RO" | "FCALL_RO" => (false, Declared),
        "SET" | "SETNX" | "SETEX" | "PSETEX" | "GETSET" | "GETDEL" | "GETEX" | "EXPIRE"
        | "PEXPIRE" | "EXPIREAT" | "PEXPIREAT" | "PERSIST" | "INCR" | "INCRBY" | "INCRBYFLOAT"
        | "DECR" | "DECRBY" | "APPEND" | "SETRANGE" | "HSET" | "HSETNX" | "HMSET" | "HDEL"
        | "HINCRBY" | "HINCRBYFLOAT" | "LPUSH" | "RPUSH" | "LPUSHX" | "RPUSHX" | "LPOP"
        | "RPOP" | "LREM" | "LSET" | "LTRIM" | "LINSERT" | "SADD" | "SREM" | "SPOP" | "ZADD"
        | "ZREM" | "ZINCRBY" | "ZPOPMIN" | "ZPOPMAX" | "XADD" | "XDEL" | "XTRIM" | "XACK"
        | "RESTORE" | "SETBIT" | "PFADD" => (true, First),
        "RENAME" | "RENAMENX" | "COPY" | "SMOVE" | "LMOVE" | "RPOPLPUSH" => (true, FirstTwo),
        "DEL" | "UNLINK" | "SINTERSTORE" | "SUNIONSTORE" | "SDIFFSTORE" | "TOUCH" => (true, All),
        "BLPOP" | "BRPOP" => (true, AllButLast),
        "MSET" | "MSETNX" => (true, Pairs),
        "EVAL" | "EVALSHA" | "FCALL" => (true, Declared),
        _ => return None,
    })
}

/// Commands that touch nothing another connection can see.
const REDIS_LOCAL: &[&str] = &[
    "PING",
    "ECHO",
    "SELECT",
    "HELLO",
    "AUTH",
    "CLIENT",
    "READONLY",
    "READWRITE",
    "RESET",
    "QUIT",
    "COMMAND",
    "INFO",
    "UNWATCH",
    "TIME",
];

/// The words of a Redis step's text as the relay writes them: space-separated, a word with a
/// space (or empty) in Rust's debug quoting.
fn redis_words(command: &str) -> Vec<String> {
    let b: Vec<char> = command.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == ' ' {
            i += 1;
            continue;
        }
        let mut w = String::new();
        if b[i] == '"' {
            w.push('"');
            i += 1;
            while i < b.len() {
                w.push(b[i]);
                if b[i] == '\\' && i + 1 < b.len() {
                    w.push(b[i + 1]);
                    i += 2;
                    continue;
                }
                i += 1;
                if w.ends_with('"') {
                    break;
                }
            }
        } else {
            while i < b.len() && b[i] != ' ' {
                w.push(b[i]);
                i += 1;
            }
        }
        out.push(w);
    }
    out
}

pub(super) fn redis_footprint(text: &str) -> Footprint {
    let store = StoreKind::Redis;
    let mut out = Footprint::empty(store);
    let mut block = false;
    for command in redis_commands(text) {
        let words = redis_words(command);
        let Some(name) = words.first().map(|w| w.to_uppercase()) else {
            continue;
        };
        let args = &words[1..];
        match name.as_str() {
            "MULTI" | "EXEC" | "DISCARD" => {
                block = true;
                continue;
            }
            n if REDIS_LOCAL.contains(&n) => continue,
            _ => {}
        }
        let Some((writes, at)) = redis_command(&name) else {
            return Footprint::everything(store);
        };
        let keys: Vec<String> = match at {
            Keys::First => args.iter().take(1).cloned().collect(),
            Keys::FirstTwo => args.iter().take(2).cloned().collect(),
            Keys::All => args.to_vec(),
            Keys::AllButLast => args[..args.len().saturating_sub(1)].to_vec(),
            Keys::Pairs => args.iter().step_by(2).cloned().collect(),
            Keys::Declared => {
                let Some(n) = args.get(1).and_then(|n| n.parse::<usize>().ok()) else {
                    return Footprint::everything(store);
                };
                if args.len() < 2 + n {
                    return Footprint::everything(store);
                }
                args[2..2 + n].to_vec()
            }
        };
        if keys.is_empty() {
            return Footprint::everything(store);
        }
        if writes {
            out.writes.extend(keys);
        } else {
            out.reads.extend(keys);
        }
    }
    // A MULTI … EXEC block is one step, its commands run at once: it writes their keys. A
    // transaction command alone (never a step of the relay's) is not classified.
    if block {
        if out.reads.is_empty() && out.writes.is_empty() {
            return Footprint::everything(store);
        }
        let reads = std::mem::take(&mut out.reads);
        out.writes.extend(reads);
        // `WATCH` passes the relay unheld, so the keys an `EXEC` depends on are not seen: the
        // block reads any key (a write anywhere may abort it).
        out.reads.insert("*".into());
    }
    out
}

/// The commands of a Redis step's text: split at `; ` outside the quoted words the relay
/// writes (a value holding `; ` stays one word).
fn redis_commands(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    let bytes = text.as_bytes();
    for (i, &c) in bytes.iter().enumerate() {
        if quoted {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => quoted = false,
                _ => {}
            }
        } else if c == b'"' && (i == 0 || bytes[i - 1] == b' ') {
            quoted = true;
        } else if c == b';' && bytes.get(i + 1) == Some(&b' ') {
            out.push(&text[start..i]);
            start = i + 2;
        }
    }
    out.push(&text[start..]);
    out
}
