//! Property suites (proptest), run programmatically so `verify` and the tests share them:
//!
//! - [`fingerprint`]: canonical-JSON properties and agreement with a second, independently
//!   written canonicalizer;
//! - [`sequential`]: generated sequences of create / get / update against the
//!   [`ticketflow_core::model::Model`], then invariants read back by SQL;
//! - [`concurrent`]: generated batches run by 2-8 threads, each on its own connection, checked
//!   for linearizability against the model; a failure is shrunk and its history printed.
//!
//! Each suite takes a [`SuiteConfig`] (case count from `PROPTEST_CASES` or the suite's
//! default; a seed, random unless given) and returns a [`SuiteResult`] with the verdict, the
//! cases run, the seed and, on failure, the shrunk counterexample. Failures of the real
//! protocol persist under `proptest-regressions/` and are replayed first on later runs.

pub mod concurrent;
pub mod fingerprint;
pub mod sequential;

use std::path::PathBuf;
use ticketflow_core::store::url::PgServer;

use proptest::test_runner::{
    Config, FailurePersistence, FileFailurePersistence, RngAlgorithm, TestRng, TestRunner,
};
use serde::Serialize;

use crate::scratch::{ScratchDb, ScratchError};
use crate::verdict::Verdict;
use ticketflow_core::domain::TicketRequest;
use ticketflow_core::store::{Backend, Store};
use ticketflow_core::variants::Implementation;

/// Why one generated case of a suite failed; its `Display` is the proptest failure's reason
/// (the suite's FAIL reason in REPORT.md).
#[derive(Debug, thiserror::Error)]
pub(crate) enum CheckFailure {
    /// The harness could not open or read the suite's database.
    #[error(transparent)]
    Scratch(#[from] ScratchError),
    /// JSON the harness builds itself could not be written or read back.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// Step `step` of a generated sequence (`op`, printed) disagreed with the model.
    #[error("step {step} {op}: {what}")]
    Step {
        /// The step's index in the sequence, from 0.
        step: usize,
        /// The operation, as `{:?}` prints it.
        op: String,
        /// What disagreed.
        what: String,
    },
    /// A batch's history has no order consistent with the model and the final rows.
    #[error("not linearizable:\n{history}\nfinal rows: {rows}")]
    NotLinearizable {
        /// The history, described.
        history: String,
        /// The final rows, pretty-printed.
        rows: String,
    },
    /// The system under test broke a property or an invariant (what was seen).
    #[error("{0}")]
    Violated(String),
}

/// Where a suite runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SuiteBackend {
    /// A fresh SQLite file (default settings).
    Sqlite,
    /// A scratch database on this PostgreSQL server, READ COMMITTED.
    Postgres {
        /// The server.
        server: PgServer,
    },
}

impl SuiteBackend {
    /// Where a suite on `backend` runs (PostgreSQL: on the server `pg`); `None` for the
    /// memory store, which the suites do not run on.
    pub fn on(backend: Backend, pg: &PgServer) -> Option<SuiteBackend> {
        match backend {
            Backend::Sqlite => Some(SuiteBackend::Sqlite),
            Backend::Postgres => Some(SuiteBackend::Postgres { server: pg.clone() }),
            Backend::Memory => None,
        }
    }

    /// The backend it runs on.
    pub fn backend(&self) -> Backend {
        match self {
            SuiteBackend::Sqlite => Backend::Sqlite,
            SuiteBackend::Postgres { .. } => Backend::Postgres,
        }
    }

    /// The suite's database, shared by all its cases (each case uses tenants of its own).
    ///
    /// Will return `Err` if it cannot be created (on PostgreSQL: an unreachable server).
    pub fn scratch(&self, label: &str) -> Result<ScratchDb, ScratchError> {
        match self {
            SuiteBackend::Sqlite => ScratchDb::sqlite(),
            SuiteBackend::Postgres { server } => ScratchDb::postgres(server, label),
        }
    }

    /// The database of a run of `suite` (`props_<suite>`), or the suite's PENDING result
    /// with the reason when it cannot be created.
    pub(crate) fn suite_db(
        &self,
        suite: &'static str,
        implementation: Implementation,
        config: &SuiteConfig,
    ) -> Result<ScratchDb, Box<SuiteResult>> {
        self.scratch(&format!("props_{suite}")).map_err(|e| {
            Box::new(SuiteResult::pending(
                suite,
                Some(self.backend()),
                implementation,
                config,
                e.to_string(),
            ))
        })
    }
}

/// How many cases, which seed, and whether failures persist.
#[derive(Debug, Clone)]
pub struct SuiteConfig {
    /// Generated cases to run.
    pub cases: u32,
    /// Seed of the generator (the run is reproducible with the same seed and cases).
    pub seed: u64,
    /// File for failure persistence (`proptest-regressions/<suite>.txt`), or `None`.
    pub regressions: Option<PathBuf>,
    /// Cap on failing shrink steps after the first failure (unbounded when `None`). A gate
    /// that only needs "does it fail" sets a small one. Enforced by `SuiteConfig::fused`,
    /// not by proptest's own cap, which prints "Aborting shrinking" on stderr at every
    /// verbosity when it is hit.
    pub max_shrink_iters: Option<u32>,
}

impl SuiteConfig {
    /// `cases` from `PROPTEST_CASES` when set, else `default_cases`; `seed` as given or random;
    /// failures persisted under `proptest-regressions/<suite>.txt` for the real protocol.
    pub fn new(suite: &str, default_cases: u32, seed: Option<u64>, persist: bool) -> Self {
        let cases = std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default_cases);
        SuiteConfig {
            cases,
            seed: seed.unwrap_or_else(rand::random),
            regressions: persist
                .then(|| PathBuf::from(format!("proptest-regressions/{suite}.txt"))),
            max_shrink_iters: None,
        }
    }

    pub(crate) fn runner(&self) -> TestRunner {
        let persistence: Option<Box<dyn FailurePersistence>> = self.regressions.as_ref().map(|p| {
            // proptest wants a 'static path; one small leak per suite run.
            let path: &'static str = Box::leak(p.display().to_string().into_boxed_str());
            Box::new(FileFailurePersistence::Direct(path)) as Box<dyn FailurePersistence>
        });
        let defaults = Config::default();
        let config = Config {
            cases: self.cases,
            failure_persistence: persistence,
            // Never proptest's cap (its message cannot be silenced): `fused` bounds shrinking.
            // Not `u32::MAX`: proptest reads that as "automatic", 4 × cases (96 for 24), and a
            // fused run's passing shrink steps count towards it.
            max_shrink_iters: u32::MAX - 1,
            max_shrink_time: 0,
            ..defaults
        };
        let mut seed = [0u8; 32];
        seed[..8].copy_from_slice(&self.seed.to_le_bytes());
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed))
    }
}

impl SuiteConfig {
    /// `test` with shrinking bounded by [`SuiteConfig::max_shrink_iters`]: after the first
    /// failing case and that many failing shrink steps, every further case passes without
    /// running, so proptest's shrinker stops on its own (it cannot simplify a passing case)
    /// and reports the smallest failure seen, with nothing printed. Unbounded when `None`.
    pub(crate) fn fused<T>(
        &self,
        test: impl Fn(T) -> Result<(), proptest::test_runner::TestCaseError>,
    ) -> impl Fn(T) -> Result<(), proptest::test_runner::TestCaseError> {
        let limit = self.max_shrink_iters.map(|n| n.saturating_add(1));
        let failures = std::sync::atomic::AtomicU32::new(0);
        move |value| {
            use std::sync::atomic::Ordering;
            if limit.is_some_and(|l| failures.load(Ordering::Relaxed) >= l) {
                return Ok(());
            }
            let result = test(value);
            if result.is_err() {
                failures.fetch_add(1, Ordering::Relaxed);
            }
            result
        }
    }
}

/// The result of one suite on one backend with one implementation.
#[derive(Debug, Clone, Serialize)]
pub struct SuiteResult {
    /// `fingerprint`, `sequential` or `concurrent`.
    pub suite: &'static str,
    /// The backend, or `None` for backend-free suites (serialized as `none`).
    #[serde(serialize_with = "backend_or_none")]
    pub backend: Option<Backend>,
    /// What was tested.
    pub implementation: Implementation,
    /// PASS, FAIL, or PENDING (did not run, with the reason).
    pub verdict: Verdict,
    /// Cases configured.
    pub cases: u32,
    /// Generator seed.
    pub seed: u64,
    /// Why it failed or did not run.
    pub reason: Option<String>,
    /// The shrunk counterexample, printed.
    pub counterexample: Option<String>,
}

fn backend_or_none<S: serde::Serializer>(b: &Option<Backend>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(b.map_or("none", Backend::name))
}

impl SuiteResult {
    /// `sqlite`, `postgres`, or `none` for backend-free suites.
    pub fn backend_name(&self) -> &'static str {
        self.backend.map_or("none", Backend::name)
    }

    pub(crate) fn from_run<T: std::fmt::Debug>(
        suite: &'static str,
        backend: Option<Backend>,
        implementation: Implementation,
        config: &SuiteConfig,
        result: std::result::Result<(), proptest::test_runner::TestError<T>>,
    ) -> Self {
        let (verdict, reason, counterexample) = match result {
            Ok(()) => (Verdict::Pass, None, None),
            Err(proptest::test_runner::TestError::Fail(why, value)) => (
                Verdict::Fail,
                Some(why.to_string()),
                Some(format!("{value:#?}")),
            ),
            Err(proptest::test_runner::TestError::Abort(why)) => {
                (Verdict::Fail, Some(format!("aborted: {why}")), None)
            }
        };
        // A case the server could not host (no free connection) proves nothing either way.
        let seen = reason.clone().unwrap_or_default();
        let (verdict, reason) = crate::shortage::judged(verdict, reason, [seen.as_str()]);
        SuiteResult {
            suite,
            backend,
            implementation,
            verdict,
            cases: config.cases,
            seed: config.seed,
            reason,
            counterexample,
        }
    }

    /// A suite that did not run: PENDING with `reason`, no cases counted.
    pub fn pending(
        suite: &'static str,
        backend: Option<Backend>,
        implementation: Implementation,
        config: &SuiteConfig,
        reason: String,
    ) -> Self {
        SuiteResult {
            suite,
            backend,
            implementation,
            verdict: Verdict::Pending,
            cases: config.cases,
            seed: config.seed,
            reason: Some(reason),
            counterexample: None,
        }
    }
}

/// A suite's sessions, kept open from one case to the next: a new PostgreSQL session costs a
/// process fork, authentication and a cold catalog cache, many times a case's own work.
/// Cases stay apart by their tenants ([`case_prefix`]), not their sessions. A session goes
/// back only from a case that saw no error (every create then ended its transaction); any
/// other is closed, so no aborted or half-open transaction reaches the next case.
pub(crate) struct Sessions<'a> {
    db: &'a ScratchDb,
    idle: std::sync::Mutex<Vec<Box<dyn Store + Send>>>,
}

impl<'a> Sessions<'a> {
    /// No session open yet on `db`.
    pub(crate) fn on(db: &'a ScratchDb) -> Self {
        Sessions {
            db,
            idle: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// An idle session, or a new one.
    ///
    /// Will return `Err` if a new one cannot be opened.
    pub(crate) fn take(&self) -> Result<Box<dyn Store + Send>, ScratchError> {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match idle {
            Some(store) => Ok(store),
            None => self.db.open(),
        }
    }

    /// `n` sessions ([`Sessions::take`]).
    ///
    /// Will return `Err` if one cannot be opened (those taken are closed).
    pub(crate) fn take_n(&self, n: usize) -> Result<Vec<Box<dyn Store + Send>>, ScratchError> {
        (0..n).map(|_| self.take()).collect()
    }

    /// Keeps `stores` for the next case: call it only when the case saw no error.
    pub(crate) fn give_back(&self, stores: impl IntoIterator<Item = Box<dyn Store + Send>>) {
        self.idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(stores);
    }
}

/// A fresh tenant prefix per case, so cases sharing one database never see each other.
pub(crate) fn case_prefix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("c{}x", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The request pool: a base request and its near-duplicates — one character changed, a
/// trailing space, another Unicode normalization of the same text (NFC vs NFD), two fields
/// swapped, another actor, another priority — plus one full of characters that need escaping.
pub fn request_pool() -> Vec<TicketRequest> {
    let r = |actor: &str, title: &str, body: &str, priority: &str| TicketRequest {
        actor_id: actor.into(),
        title: title.into(),
        body: body.into(),
        priority: priority.into(),
    };
    vec![
        r("u1", "x", "caf\u{e9}", "high"),
        r("u1", "x", "cafe\u{301}", "high"),
        r("u1", "x", "caf\u{e9} ", "high"),
        r("u1", "x", "caf\u{e8}", "high"),
        r("u1", "caf\u{e9}", "x", "high"),
        r("u2", "x", "caf\u{e9}", "high"),
        r("u1", "x", "caf\u{e9}", "low"),
        r("u1", "x\"y", "a\\b\n\u{1f600}\u{7f}", "urgent"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::test_runner::{TestCaseError, TestError};
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A property that fails for every vector longer than 2, run with `cap`: how many failing
    /// evaluations there were and the reported counterexample's length.
    fn shrink(cap: Option<u32>) -> (u32, usize) {
        let mut config = SuiteConfig::new("t", 64, Some(7), false);
        config.cases = 64;
        config.max_shrink_iters = cap;
        let failing = AtomicU32::new(0);
        let result = config.runner().run(
            &proptest::collection::vec(0u8..=255, 0..40),
            config.fused(|v: Vec<u8>| {
                if v.len() > 2 {
                    failing.fetch_add(1, Ordering::Relaxed);
                    return Err(TestCaseError::fail("too long"));
                }
                Ok(())
            }),
        );
        match result {
            Err(TestError::Fail(_, v)) => (failing.load(Ordering::Relaxed), v.len()),
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    #[test]
    fn a_shrink_cap_is_kept_by_the_fuse_and_never_by_proptest() {
        // Proptest's own cap would print "Aborting shrinking" on stderr: it is never reached.
        // (Its effective value: `u32::MAX` would mean 4 × cases, which fused runs reached.)
        let config = SuiteConfig::new("t", 1, Some(1), false);
        assert_eq!(config.runner().config().max_shrink_iters(), u32::MAX - 1);
        // Capped: the first failure and at most 3 failing shrink steps.
        let (failures, _) = shrink(Some(3));
        assert!((1..=4).contains(&failures), "{failures}");
        // Uncapped: shrinks to the smallest failing length.
        let (failures, len) = shrink(None);
        assert!(failures > 4, "{failures}");
        assert_eq!(len, 3);
    }
}
