//! Property suites (proptest), run programmatically so `verify` and the tests share them:
//!
//! - [`fingerprint`]: canonical-JSON properties and agreement with a second, independently
//!   written canonicalizer;
//! - [`sequential`]: generated sequences of create / get / update against the
//!   [`crate::model::Model`], then invariants read back by SQL;
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

use proptest::test_runner::{
    Config, FailurePersistence, FileFailurePersistence, RngAlgorithm, TestRng, TestRunner,
};
use serde::Serialize;

use crate::domain::TicketRequest;
use crate::scenario::Verdict;
use crate::store::postgres::{self as pg, IsolationLevel, PgStore, ScratchDatabase};
use crate::store::sqlite::SqliteStore;
use crate::store::{Dump, Store};
pub use crate::variants::Implementation;

/// Where a suite runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SuiteBackend {
    /// A fresh SQLite file (default settings).
    Sqlite,
    /// A scratch database on this PostgreSQL server, READ COMMITTED.
    Postgres {
        /// Server URL.
        url: String,
    },
}

impl SuiteBackend {
    /// `sqlite` or `postgres`.
    pub fn name(&self) -> &'static str {
        match self {
            SuiteBackend::Sqlite => "sqlite",
            SuiteBackend::Postgres { .. } => "postgres",
        }
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
    /// Cap on shrinking steps after a failure (proptest's default when `None`). A gate that
    /// only needs "does it fail" sets a small one.
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
            max_shrink_iters: self.max_shrink_iters.unwrap_or(defaults.max_shrink_iters),
            ..defaults
        };
        let mut seed = [0u8; 32];
        seed[..8].copy_from_slice(&self.seed.to_le_bytes());
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed))
    }
}

/// The result of one suite on one backend with one implementation.
#[derive(Debug, Clone, Serialize)]
pub struct SuiteResult {
    /// `fingerprint`, `sequential` or `concurrent`.
    pub suite: &'static str,
    /// `sqlite`, `postgres`, or `none` for backend-free suites.
    pub backend: &'static str,
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

impl SuiteResult {
    pub(crate) fn from_run<T: std::fmt::Debug>(
        suite: &'static str,
        backend: &'static str,
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

    pub(crate) fn pending(
        suite: &'static str,
        backend: &'static str,
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

/// A database for a suite run, shared by all its cases (each case uses tenants of its own).
pub(crate) enum SuiteDb {
    Sqlite {
        _dir: tempfile::TempDir,
        path: PathBuf,
    },
    Postgres {
        scratch: Box<ScratchDatabase>,
    },
}

impl SuiteDb {
    pub(crate) fn create(backend: &SuiteBackend, label: &str) -> std::result::Result<Self, String> {
        match backend {
            SuiteBackend::Sqlite => {
                let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
                let path = dir.path().join("props.db");
                drop(SqliteStore::open(&path).map_err(|e| e.to_string())?);
                Ok(SuiteDb::Sqlite { _dir: dir, path })
            }
            SuiteBackend::Postgres { url } => {
                let config = pg::parse_url(url).map_err(|e| e.to_string())?;
                let admin =
                    pg::connect(&config).map_err(|e| format!("PostgreSQL unreachable: {e}"))?;
                let scratch =
                    ScratchDatabase::create(admin, &config, label).map_err(|e| e.to_string())?;
                drop(
                    PgStore::connect(scratch.config(), IsolationLevel::ReadCommitted)
                        .map_err(|e| e.to_string())?,
                );
                Ok(SuiteDb::Postgres {
                    scratch: Box::new(scratch),
                })
            }
        }
    }

    /// A new session.
    pub(crate) fn open(&self) -> std::result::Result<Box<dyn Store + Send>, String> {
        match self {
            SuiteDb::Sqlite { path, .. } => SqliteStore::open(path)
                .map(|s| Box::new(s) as Box<dyn Store + Send>)
                .map_err(|e| e.to_string()),
            SuiteDb::Postgres { scratch } => {
                PgStore::connect(scratch.config(), IsolationLevel::ReadCommitted)
                    .map(|s| Box::new(s) as Box<dyn Store + Send>)
                    .map_err(|e| e.to_string())
            }
        }
    }

    /// Runs SQL statements on a fresh connection (fault injection).
    pub(crate) fn execute(&self, sql: &str) -> std::result::Result<(), String> {
        match self {
            SuiteDb::Sqlite { path, .. } => SqliteStore::open(path)
                .and_then(|s| s.execute_batch(sql))
                .map_err(|e| e.to_string()),
            SuiteDb::Postgres { scratch } => pg::connect(scratch.config())
                .and_then(|mut c| c.batch_execute(sql).map_err(|e| pg::classify("execute", e)))
                .map_err(|e| e.to_string()),
        }
    }

    /// Every row of tenants starting with `prefix`.
    pub(crate) fn dump(&self, prefix: &str) -> std::result::Result<Dump, String> {
        match self {
            SuiteDb::Sqlite { path, .. } => SqliteStore::open(path)
                .and_then(|s| s.dump(prefix))
                .map_err(|e| e.to_string()),
            SuiteDb::Postgres { scratch } => pg::connect(scratch.config())
                .and_then(|mut c| pg::dump(&mut c, prefix))
                .map_err(|e| e.to_string()),
        }
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
