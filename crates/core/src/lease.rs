//! A short Redis lease per (tenant, key) in front of the receipt (docs/PROTOCOL.md §10): it may
//! **reduce** contention — racers that find the lease held wait for the holder's receipt
//! instead of all inserting and losing on the unique violation — but it never decides
//! anything. The receipt's unique constraint stays the arbiter: Redis data can expire, be
//! flushed or lost in a failover, and a holder paused past the TTL still runs its
//! transaction beside the next holder.
//!
//! The flow of one create with a lease ([`create_with_lease`]):
//! 1. `SET lease:{tenant}:{key} TOKEN NX PX TTL` with a fresh token (UUID v4).
//! 2. Acquired: run the create transaction, then release with a compare-and-delete (a Lua
//!    script that deletes the key only while it still holds **this** token, so an old
//!    holder never deletes a newer holder's lease).
//! 3. Held by another request: wait, bounded by `wait` (default: the TTL), polling with
//!    doubling pauses (1 ms up to 20 ms) until the receipt is visible, or the lease is gone;
//!    then run the normal protocol — the receipt decides (replay, conflict, or create if the
//!    holder failed). `serve` takes the lease or waits for it ([`admit`]) **before** it checks
//!    a database session out of its pool, so a waiting request holds no session, and bounds
//!    the wait by its request timeout as well.
//! 4. Redis unreachable, slow (connect, read and write timeouts of [`REDIS_TIMEOUT`]) or
//!    erroring: proceed without the lease, counted as "no lease" and logged without bodies.
//!    The lease never causes a failed request.
//!
//! A lease key holds only the tenant and the idempotency key (`:` and `%` percent-encoded so
//! the two parts cannot run together); a token is a random UUID. Neither ever contains a
//! request body.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::domain::CreateReport;
use crate::error::Result;
pub use crate::store::leases::{
    lease_key, LeaseConfig, LeaseConfigError, LeaseError, LeaseManager, Leases, MemoryLeases,
    PooledLeases, RedisLeases, CHECK_TIMEOUT, DEFAULT_TTL, MAX_TTL, REDIS_TIMEOUT, RELEASE_SCRIPT,
};
use crate::store::Store;

/// What the lease did for one create.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "lease")]
pub enum LeaseOutcome {
    /// This request took the lease and ran the transaction under it.
    Held {
        /// The compare-and-delete removed our token (`false`: it had expired or been
        /// flushed, and maybe another request holds the key now).
        released: bool,
    },
    /// Another request held the lease; this one waited, then ran the normal protocol.
    Waited {
        /// How long it waited, milliseconds.
        waited_ms: u64,
        /// The receipt became visible while waiting (the normal protocol then replays or
        /// conflicts without inserting).
        receipt_seen: bool,
    },
    /// No lease: Redis was unreachable, slow or erroring; the receipt alone decided.
    NoLease {
        /// The Redis error, without keys or bodies.
        reason: String,
    },
}

/// Counters of a process's leases, for `serve`'s log and the benches.
#[derive(Debug, Default)]
pub struct LeaseStats {
    held: AtomicU64,
    waited: AtomicU64,
    no_lease: AtomicU64,
    release_missed: AtomicU64,
}

/// A snapshot of [`LeaseStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct LeaseCounts {
    /// Creates that ran under their own lease.
    pub held: u64,
    /// Creates that found the lease held and waited.
    pub waited: u64,
    /// Creates that ran without a lease because Redis failed.
    pub no_lease: u64,
    /// Held leases whose compare-and-delete found another token or none.
    pub release_missed: u64,
}

impl LeaseStats {
    /// Counts one outcome.
    pub fn record(&self, outcome: &LeaseOutcome) {
        let counter = match outcome {
            LeaseOutcome::Held { released: true } => &self.held,
            LeaseOutcome::Held { released: false } => {
                self.release_missed.fetch_add(1, Ordering::Relaxed);
                &self.held
            }
            LeaseOutcome::Waited { .. } => &self.waited,
            LeaseOutcome::NoLease { .. } => &self.no_lease,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The counts so far.
    pub fn counts(&self) -> LeaseCounts {
        LeaseCounts {
            held: self.held.load(Ordering::Relaxed),
            waited: self.waited.load(Ordering::Relaxed),
            no_lease: self.no_lease.load(Ordering::Relaxed),
            release_missed: self.release_missed.load(Ordering::Relaxed),
        }
    }
}

/// How a release is done: the safe compare-and-delete, or (the `lease-unsafe-release` wrong
/// variant) a plain `DEL`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Release {
    /// [`Leases::release`].
    #[default]
    CompareAndDelete,
    /// [`Leases::delete`]: an old holder may delete a newer holder's lease.
    PlainDelete,
}

/// Runs `create` for (tenant, key) behind a lease (see the module docs): acquire, or wait
/// bounded by `config.wait` for the receipt, or go on without a lease when `leases` fails
/// (or is `None`: Redis could not be reached at all). `create` runs exactly once, and its
/// result is returned as is: the lease never turns a create into an error.
///
/// Will return `Err` only as `create` does (or, while waiting, for a database error of the
/// receipt lookup).
#[allow(clippy::too_many_arguments)]
pub fn create_with_lease<S: Store + ?Sized>(
    mut leases: Option<&mut dyn Leases>,
    config: &LeaseConfig,
    release: Release,
    store: &mut S,
    tenant: &str,
    key: &str,
    create: impl FnOnce(&mut S) -> Result<CreateReport>,
) -> (Result<CreateReport>, LeaseOutcome) {
    let lease = lease_key(tenant, key);
    let admission = admit(
        leases.as_mut().map(|l| &mut **l as &mut dyn Leases),
        config,
        config.wait,
        &lease,
        &mut || matches!(store.find_receipt(tenant, key), Ok(Some(_))),
    );
    let result = create(store);
    let outcome = admission.finish(leases, &lease, release);
    (result, outcome)
}

/// What a request got from the lease before its create runs ([`admit`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// This request holds the lease under `token`; [`Admission::finish`] releases it.
    Held {
        /// The token this request set.
        token: String,
    },
    /// Another request held the lease; this one waited.
    Waited {
        /// How long it waited, milliseconds.
        waited_ms: u64,
        /// The receipt became visible while waiting.
        receipt_seen: bool,
        /// The wait ran out with the lease still held (neither the receipt nor the lease's
        /// end was seen).
        timed_out: bool,
    },
    /// No lease: Redis was unreachable, slow or erroring.
    NoLease {
        /// The Redis error, without keys or bodies.
        reason: String,
    },
}

impl Admission {
    /// Ends the lease part of a create whose transaction ran: releases a held lease (with
    /// `release`) and says what the lease did. A release that fails is logged and reported as
    /// not released (the lease then expires with its TTL).
    pub fn finish(
        self,
        leases: Option<&mut dyn Leases>,
        lease: &str,
        release: Release,
    ) -> LeaseOutcome {
        match self {
            Admission::Held { token } => {
                let released = match leases {
                    None => Ok(false),
                    Some(leases) => match release {
                        Release::CompareAndDelete => leases.release(lease, &token),
                        Release::PlainDelete => leases.delete(lease),
                    },
                };
                let released = released.unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "lease release failed; it expires with its TTL");
                    false
                });
                LeaseOutcome::Held { released }
            }
            Admission::Waited {
                waited_ms,
                receipt_seen,
                ..
            } => LeaseOutcome::Waited {
                waited_ms,
                receipt_seen,
            },
            Admission::NoLease { reason } => LeaseOutcome::NoLease { reason },
        }
    }
}

/// The lease part of a create before its transaction, touching no database session of its
/// own: `SET lease NX PX ttl` with a fresh token; when another request holds the lease, wait at
/// most `wait` (polling with pauses doubling from 1 ms to 20 ms) until `receipt_visible`
/// answers `true` or the lease is gone. `receipt_visible` is the only database access, and
/// the caller decides what it uses (`serve` borrows an idle pooled session only for the
/// lookup, and skips it when none is idle). A Redis failure, or `leases` being `None`, is
/// [`Admission::NoLease`].
pub fn admit(
    leases: Option<&mut dyn Leases>,
    config: &LeaseConfig,
    wait: Duration,
    lease: &str,
    receipt_visible: &mut dyn FnMut() -> bool,
) -> Admission {
    let Some(leases) = leases else {
        return Admission::NoLease {
            reason: "redis connect: unreachable".into(),
        };
    };
    let token = uuid::Uuid::new_v4().to_string();
    match leases.acquire(lease, &token, config.ttl) {
        Ok(true) => Admission::Held { token },
        Ok(false) => wait_for_receipt(leases, lease, wait, receipt_visible),
        Err(e) => {
            tracing::warn!(error = %e, "no lease: going on without it (the receipt decides)");
            Admission::NoLease {
                reason: e.to_string(),
            }
        }
    }
}

/// Polls, with pauses doubling from 1 ms to 20 ms and for at most `wait`, until the receipt
/// is visible or the lease is gone. A Redis error ends the wait early.
fn wait_for_receipt(
    leases: &mut dyn Leases,
    lease: &str,
    wait: Duration,
    receipt_visible: &mut dyn FnMut() -> bool,
) -> Admission {
    let started = Instant::now();
    let mut pause = Duration::from_millis(1);
    let (receipt_seen, timed_out) = loop {
        if receipt_visible() {
            break (true, false);
        }
        if !matches!(leases.holder(lease), Ok(Some(_))) {
            break (false, false);
        }
        let left = wait.saturating_sub(started.elapsed());
        if left.is_zero() {
            break (false, true);
        }
        leases.pause(pause.min(left));
        pause = (pause * 2).min(Duration::from_millis(20));
    };
    Admission::Waited {
        waited_ms: started.elapsed().as_millis() as u64,
        receipt_seen,
        timed_out,
    }
}

impl LeaseOutcome {
    /// `held`, `waited` or `no-lease`: the `ticketflow-lease` header of `serve`.
    pub fn name(&self) -> &'static str {
        match self {
            LeaseOutcome::Held { .. } => "held",
            LeaseOutcome::Waited { .. } => "waited",
            LeaseOutcome::NoLease { .. } => "no-lease",
        }
    }
}

/// Connects for one request: `None` (counted as no lease by [`create_with_lease`]) when Redis
/// cannot be reached.
pub fn connect_or_none(config: &LeaseConfig) -> Option<RedisLeases> {
    RedisLeases::connect(config)
        .map_err(|e| tracing::warn!(error = %e, "no lease: redis unreachable"))
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_ttls_are_checked() {
        let ttl = Duration::from_millis(100);
        assert!(LeaseConfig::new("redis://127.0.0.1:6379/0", ttl).is_ok());
        for bad in [
            "http://127.0.0.1:6379/0",
            "redis://127.0.0.1:6379",
            "redis://127.0.0.1/0",
            "redis://:6379/0",
            "redis://127.0.0.1:0/0",
            "redis://127.0.0.1:99999/0",
            "redis://127.0.0.1:6379/x",
            "redis://u:p@127.0.0.1:6379/0",
        ] {
            let e = LeaseConfig::new(bad, ttl).unwrap_err();
            assert!(matches!(e, LeaseConfigError::BadUrl { .. }), "{bad}: {e}");
        }
        assert_eq!(
            LeaseConfig::new("redis://127.0.0.1:6379/0", Duration::ZERO),
            Err(LeaseConfigError::ZeroTtl)
        );
        assert!(LeaseConfig::new("redis://127.0.0.1:6379/0", MAX_TTL).is_ok());
        for too_long in [
            MAX_TTL + Duration::from_millis(1),
            Duration::from_millis(999_999_999),
            Duration::from_millis(u64::MAX),
        ] {
            let e = LeaseConfig::new("redis://127.0.0.1:6379/0", too_long).unwrap_err();
            assert!(matches!(e, LeaseConfigError::TtlTooLong { .. }), "{e}");
        }
        let e = LeaseConfig::new("redis://u:s3kr1t@127.0.0.1:6379/0", ttl).unwrap_err();
        assert!(!e.to_string().contains("s3kr1t"), "{e}");
    }

    #[test]
    fn a_wait_that_runs_out_says_so_and_a_waiter_looks_only_through_its_callback() {
        let mut m = MemoryLeases::default();
        let config = LeaseConfig::new("redis://127.0.0.1:6379/0", MAX_TTL).unwrap();
        assert!(m.acquire("k", "crashed", MAX_TTL).unwrap());
        let mut looked = 0;
        let admission = admit(
            Some(&mut m),
            &config,
            Duration::from_millis(5),
            "k",
            &mut || {
                looked += 1;
                false
            },
        );
        assert!(
            matches!(
                admission,
                Admission::Waited {
                    receipt_seen: false,
                    timed_out: true,
                    ..
                }
            ),
            "{admission:?}"
        );
        assert!(looked >= 2, "the receipt was looked at {looked} times");
        let admission = admit(Some(&mut m), &config, MAX_TTL, "k", &mut || true);
        assert!(
            matches!(
                admission,
                Admission::Waited {
                    receipt_seen: true,
                    timed_out: false,
                    ..
                }
            ),
            "{admission:?}"
        );
        let held = admit(Some(&mut m), &config, MAX_TTL, "other", &mut || false);
        let Admission::Held { token } = held.clone() else {
            panic!("{held:?}")
        };
        assert_eq!(m.holder("other").unwrap(), Some(token));
        assert_eq!(
            held.finish(Some(&mut m), "other", Release::CompareAndDelete),
            LeaseOutcome::Held { released: true }
        );
        assert_eq!(m.holder("other").unwrap(), None);
    }

    #[test]
    fn lease_keys_keep_tenant_and_key_apart_and_hold_nothing_else() {
        assert_eq!(lease_key("A", "k-1"), "lease:A:k-1");
        assert_ne!(lease_key("a:b", "c"), lease_key("a", "b:c"));
        assert_eq!(lease_key("a:b", "c%"), "lease:a%3Ab:c%25");
    }

    #[test]
    fn memory_leases_expire_and_only_their_token_releases_them() {
        let mut m = MemoryLeases::default();
        let ttl = Duration::from_millis(10);
        assert!(m.acquire("k", "t1", ttl).unwrap());
        assert!(!m.acquire("k", "t2", ttl).unwrap());
        m.advance(Duration::from_millis(11));
        assert!(
            m.acquire("k", "t2", ttl).unwrap(),
            "expired, so t2 takes it"
        );
        assert!(
            !m.release("k", "t1").unwrap(),
            "t1 must not release t2's lease"
        );
        assert_eq!(m.holder("k").unwrap().as_deref(), Some("t2"));
        assert!(
            m.delete("k").unwrap(),
            "a plain DEL removes whoever holds it"
        );
        assert!(m.acquire("k", "t3", ttl).unwrap());
        m.flush();
        assert_eq!(m.holder("k").unwrap(), None);
    }
}
