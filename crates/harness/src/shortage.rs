//! An environment that cannot host a run: what it lacked, read from the error a run met, and
//! what to free. Such a run says nothing about the implementation or the service under test,
//! so every part judges it PENDING with this cause, never FAIL (and the kill matrix neither
//! "killed" nor "survived").
//!
//! Recognised, from the text of an error as the harness records it (a racer's error is kept
//! as text, and a worker process sends it as text):
//! - PostgreSQL SQLSTATE class 53, insufficient resources (PostgreSQL documentation, Appendix
//!   A): `53300` too_many_connections (the server's `max_connections`, or a role's or
//!   database's `CONNECTION LIMIT`), `53400` configuration_limit_exceeded, `53100` disk_full,
//!   `53200` out_of_memory. The harness writes a store error's SQLSTATE as `(code 53300)`.
//! - Operating-system errors, as Rust writes them (`(os error N)`, Linux numbering from
//!   `errno.h`): `EMFILE` 24 and `ENFILE` 23 (no free file descriptors), `EADDRINUSE` 98 (a
//!   port in use), `EADDRNOTAVAIL` 99 (no free local port), `ENOSPC` 28 (no space left).
//!
//! Anything else is not a shortage: a run that failed for another reason stays FAIL.

use std::fmt;

use crate::verdict::Verdict;

/// What the environment lacked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shortage {
    /// PostgreSQL refused a session: SQLSTATE 53300 (too_many_connections).
    Connections,
    /// PostgreSQL hit a configured limit: SQLSTATE 53400 (configuration_limit_exceeded, such
    /// as `max_locks_per_transaction` or `max_prepared_transactions`).
    ServerLimit,
    /// PostgreSQL ran out of disk or memory: SQLSTATE 53100 or 53200 (or another class-53
    /// code).
    ServerResources,
    /// This process or the system has no free file descriptor (`EMFILE`, `ENFILE`).
    FileDescriptors,
    /// A port the run needs is taken by another process (`EADDRINUSE`), or no local port is
    /// free (`EADDRNOTAVAIL`).
    Port,
    /// The local disk is full (`ENOSPC`).
    Disk,
    /// The barrier lock is held by a session outside the run (seen as the controller's lock
    /// timeout).
    BarrierLock,
}

impl Shortage {
    /// The shortage an error's text names, if any (see the module documentation for what is
    /// recognised and how).
    pub fn in_text(text: &str) -> Option<Shortage> {
        if let Some(code) = sqlstate_in(text) {
            return match code {
                "53300" => Some(Shortage::Connections),
                "53400" => Some(Shortage::ServerLimit),
                c if c.starts_with("53") => Some(Shortage::ServerResources),
                _ => None,
            };
        }
        match os_error_in(text)? {
            23 | 24 => Some(Shortage::FileDescriptors),
            98 | 99 => Some(Shortage::Port),
            28 => Some(Shortage::Disk),
            _ => None,
        }
    }

    /// The first shortage named by any of `texts`, with the text that named it.
    pub fn first_in<'a>(texts: impl IntoIterator<Item = &'a str>) -> Option<(Shortage, &'a str)> {
        texts
            .into_iter()
            .find_map(|t| Shortage::in_text(t).map(|s| (s, t)))
    }

    /// What to free, in words.
    pub fn remedy(self) -> &'static str {
        match self {
            Shortage::Connections => {
                "free PostgreSQL connections (other clients hold them: see pg_stat_activity) or \
                 raise max_connections, or the role's or database's CONNECTION LIMIT"
            }
            Shortage::ServerLimit => {
                "raise the PostgreSQL setting the error names, or run fewer racers at once"
            }
            Shortage::ServerResources => "free disk or memory on the PostgreSQL server",
            Shortage::FileDescriptors => {
                "close files or connections held by other programs, or raise the limit \
                 (`ulimit -n`)"
            }
            Shortage::Port => "stop the process holding the port, or choose another port",
            Shortage::Disk => "free disk space",
            Shortage::BarrierLock => {
                "end the session outside the run that holds the lock (pg_locks, \
                 pg_stat_activity)"
            }
        }
    }

    /// The reason of a run this shortage kept from being judged: `cause` (the error as met),
    /// then what to free.
    pub fn reason(self, cause: &str) -> String {
        format!("{self}: {cause}; {}", self.remedy())
    }
}

impl fmt::Display for Shortage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Shortage::Connections => {
                "the environment could not host the run (no free PostgreSQL connection)"
            }
            Shortage::ServerLimit => {
                "the environment could not host the run (a PostgreSQL configuration limit)"
            }
            Shortage::ServerResources => {
                "the environment could not host the run (PostgreSQL out of disk or memory)"
            }
            Shortage::FileDescriptors => {
                "the environment could not host the run (no free file descriptor)"
            }
            Shortage::Port => "the environment could not host the run (a port in use)",
            Shortage::Disk => "the environment could not host the run (no disk space)",
            Shortage::BarrierLock => {
                "the environment could not host the run (the barrier lock is held outside the run)"
            }
        })
    }
}

/// A part's `verdict` and `reason` as judged, unless the verdict is FAIL and one of `seen`
/// (the errors the run met, as text) names a [`Shortage`]: then PENDING, with the shortage,
/// what to free, and the FAIL's own reason kept as "not a verdict" (a run the environment
/// could not host is incomplete, so what it showed proves nothing either way).
pub fn judged<'a>(
    verdict: Verdict,
    reason: Option<String>,
    seen: impl IntoIterator<Item = &'a str>,
) -> (Verdict, Option<String>) {
    if verdict != Verdict::Fail {
        return (verdict, reason);
    }
    match Shortage::first_in(seen) {
        Some((shortage, text)) => (
            Verdict::Pending,
            Some(format!(
                "{} (the FAIL it led to is not a verdict: {})",
                shortage.reason(text),
                reason.as_deref().unwrap_or("no reason given")
            )),
        ),
        None => (verdict, reason),
    }
}

/// The SQLSTATE in a `(code XXXXX)` suffix, as the core's store errors write it.
fn sqlstate_in(text: &str) -> Option<&str> {
    text.match_indices("(code ").find_map(|(i, m)| {
        let code = text.get(i + m.len()..i + m.len() + 5)?;
        let closed = text[i + m.len() + 5..].starts_with(')');
        (closed && code.bytes().all(|b| b.is_ascii_alphanumeric())).then_some(code)
    })
}

/// The number in an `(os error N)` suffix, as Rust's `std::io::Error` writes it.
fn os_error_in(text: &str) -> Option<i32> {
    text.match_indices("(os error ").find_map(|(i, m)| {
        let rest = &text[i + m.len()..];
        let end = rest.find(')')?;
        rest[..end].parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_53_and_resource_os_errors_are_shortages() {
        let t =
            "postgres connect: too many connections for role \"x\" (PostgreSQL at h) (code 53300)";
        assert_eq!(Shortage::in_text(t), Some(Shortage::Connections));
        assert_eq!(
            Shortage::in_text("lock: out of shared memory (code 53200)"),
            Some(Shortage::ServerResources)
        );
        assert_eq!(
            Shortage::in_text("x (code 53400)"),
            Some(Shortage::ServerLimit)
        );
        assert_eq!(
            Shortage::in_text("open: Too many open files (os error 24)"),
            Some(Shortage::FileDescriptors)
        );
        assert_eq!(
            Shortage::in_text("bind: Address already in use (os error 98)"),
            Some(Shortage::Port)
        );
    }

    #[test]
    fn other_errors_are_not_shortages() {
        for t in [
            "duplicate key value violates unique constraint (code 23505)",
            "could not serialize access (code 40001)",
            "Connection refused (os error 111)",
            "two tickets for one key",
            "(code 533",
            "(os error x)",
        ] {
            assert_eq!(Shortage::in_text(t), None, "{t}");
        }
    }

    #[test]
    fn only_a_fail_that_met_a_shortage_becomes_pending() {
        let why = Some("outcomes: api-b errored".to_string());
        let met = ["api-b: too many clients (code 53300)"];
        let (v, r) = judged(Verdict::Fail, why.clone(), met);
        assert_eq!(v, Verdict::Pending);
        let r = r.unwrap();
        assert!(
            r.contains("53300") && r.contains("outcomes: api-b errored"),
            "{r}"
        );
        assert_eq!(judged(Verdict::Pass, None, met), (Verdict::Pass, None));
        let other = ["api-b: (code 23505)"];
        assert_eq!(
            judged(Verdict::Fail, why.clone(), other),
            (Verdict::Fail, why)
        );
    }

    #[test]
    fn the_reason_names_the_cause_and_what_to_free() {
        let r = Shortage::Connections.reason("racer api-b: too many clients (code 53300)");
        assert!(r.starts_with("the environment could not host the run"));
        assert!(r.contains("api-b") && r.contains("max_connections"), "{r}");
    }
}
