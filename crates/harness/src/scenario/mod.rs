//! Race scenarios: the file format ([`format`](mod@format)), the runner ([`runner`]) and the checks
//! that turn a run into a verdict ([`check`]).

pub mod capacity;
pub mod check;
pub mod format;
pub mod lease;
pub mod observed;
pub mod racer;
pub mod runner;
pub mod timeline;
pub mod worker;

use std::collections::BTreeMap;

use serde::Serialize;

pub use format::{LockMode, Racer, RacerKind, Scenario, ScenarioError};
pub use runner::{run_postgres, run_sqlite, PgOptions, SqliteOptions};

use crate::shortage::Shortage;
use crate::verdict::{Check, Verdict};
use ticketflow_core::domain::{CreateReport, DecisionPath, OutcomeKind};
use ticketflow_core::store::postgres::IsolationLevel;
use ticketflow_core::store::sqlite::{JournalMode, SqliteConfig, TxMode};
use ticketflow_core::store::{Backend, RowCounts};

/// The database setting one run used: a cell of the verdict matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(tag = "backend", rename_all = "lowercase")]
pub enum RunSetting {
    /// SQLite journal and transaction mode.
    Sqlite {
        /// Journal mode.
        journal: JournalMode,
        /// Transaction mode.
        tx: TxMode,
    },
    /// PostgreSQL isolation level.
    Postgres {
        /// Isolation level of the racers' transactions.
        isolation: IsolationLevel,
    },
}

impl RunSetting {
    /// The six SQLite settings: {WAL, rollback journal} x {lazy, deferred, immediate}.
    pub fn sqlite_matrix() -> Vec<RunSetting> {
        let mut v = Vec::new();
        for journal in [JournalMode::Wal, JournalMode::Delete] {
            for tx in [TxMode::Lazy, TxMode::Deferred, TxMode::Immediate] {
                v.push(RunSetting::Sqlite { journal, tx });
            }
        }
        v
    }

    /// The backend.
    pub fn backend(self) -> Backend {
        match self {
            RunSetting::Sqlite { .. } => Backend::Sqlite,
            RunSetting::Postgres { .. } => Backend::Postgres,
        }
    }

    /// A short label: `wal, lazy` or `READ COMMITTED`.
    pub fn label(self) -> String {
        match self {
            RunSetting::Sqlite { journal, tx } => SqliteConfig {
                journal,
                tx,
                ..SqliteConfig::default()
            }
            .to_string(),
            RunSetting::Postgres { isolation } => isolation.sql().to_string(),
        }
    }

    /// The `ticketflow scenario run` flags that select this setting.
    pub fn cli_flags(self) -> String {
        match self {
            RunSetting::Sqlite { journal, tx } => crate::argv::sqlite_setting(journal, tx),
            RunSetting::Postgres { isolation } => crate::argv::postgres_setting(isolation),
        }
    }
}

/// What one racer did.
#[derive(Debug, Clone, Serialize)]
pub struct RacerRecord {
    /// Racer name.
    pub name: String,
    /// Tenant.
    pub tenant: String,
    /// Key.
    pub key: String,
    /// Fingerprint hash of its request.
    pub fingerprint: String,
    /// PostgreSQL backend pid (`pg_backend_pid()`), when on PostgreSQL.
    pub backend_pid: Option<i32>,
    /// OS process id of the racer's worker process, when racers run as processes.
    pub os_pid: Option<u32>,
    /// The result, or the error's text.
    pub result: RacerResult,
    /// The store operations it performed, in order, with arguments and times (see
    /// [`observed`] and [`timeline`]). Left out of `report.json` (which would grow by
    /// megabytes), written to `report.steps.json` instead.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<timeline::Step>,
    /// Milliseconds from barrier release to its outcome.
    pub done_after_release_ms: Option<f64>,
}

/// A racer's outcome, or its error's text. The text is a record, not an error to handle: a
/// worker process sends it in its JSON reply ([`worker::Reply`]) and the report keeps it, so it
/// is the message as it was, whatever its cause (the store, the worker, the process).
pub type RacerResult = Result<RacerOutcome, String>;

/// The parts of a [`CreateReport`] the report shows.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct RacerOutcome {
    /// created / replayed / conflict.
    pub kind: OutcomeKind,
    /// Ticket id for created and replayed.
    pub ticket_id: Option<uuid::Uuid>,
    /// How the protocol decided; `None` when a black-box target does not say.
    #[serde(default)]
    pub path: Option<DecisionPath>,
    /// HTTP status.
    pub http_status: u16,
    /// Transactions run (1 = no retry).
    pub attempts: u32,
    /// Why earlier attempts were retried.
    pub retried: Vec<String>,
}

impl RacerOutcome {
    /// The path in words, with retries: `unique violation, winner read`, `receipt lookup after 1 retry`.
    pub fn path_label(&self) -> String {
        match self.attempts {
            0 | 1 => self.path_name(),
            n => format!(
                "{} after {} retr{}",
                self.path_name(),
                n - 1,
                if n == 2 { "y" } else { "ies" }
            ),
        }
    }
}

impl RacerOutcome {
    fn path_name(&self) -> String {
        self.path
            .map(|p| p.to_string())
            .unwrap_or_else(|| "not reported".into())
    }
}

impl From<&CreateReport> for RacerOutcome {
    fn from(r: &CreateReport) -> Self {
        RacerOutcome {
            kind: r.outcome.kind(),
            ticket_id: r.outcome.ticket().map(|t| t.id),
            path: Some(r.path),
            http_status: r.http_status,
            attempts: r.attempts,
            retried: r.retried.clone(),
        }
    }
}

/// A racer seen waiting at the PostgreSQL lock barrier.
#[derive(Debug, Clone, Serialize)]
pub struct LockWait {
    /// Racer name.
    pub racer: String,
    /// Backend pid.
    pub pid: i32,
    /// `pg_stat_activity.wait_event_type` (expected `Lock`).
    pub wait_event_type: Option<String>,
    /// `pg_stat_activity.wait_event` (expected `relation`).
    pub wait_event: Option<String>,
    /// Lock mode requested (`pg_locks.mode`).
    pub mode: String,
    /// `pg_blocking_pids(pid)`: must contain the controller's pid.
    pub blocked_by: Vec<i32>,
    /// Milliseconds from when it was first seen waiting to the release.
    pub waited_ms: f64,
}

/// Backend-specific evidence.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "backend", rename_all = "lowercase")]
pub enum Evidence {
    /// SQLite: the in-process barrier.
    Sqlite {
        /// Racers that passed the barrier after their first receipt lookup saw no receipt.
        observed_no_receipt: usize,
        /// Journal mode in use.
        journal_mode: String,
        /// SQLite library version.
        sqlite_version: String,
    },
    /// PostgreSQL: the lock barrier as seen in `pg_locks`.
    Postgres {
        /// `server_version`.
        server_version: String,
        /// Isolation level of the racers' transactions.
        isolation: String,
        /// The barrier's lock mode.
        lock_mode: LockMode,
        /// Where the lock mode holds the racers.
        window: String,
        /// Threads or processes.
        racers_as: RacerKind,
        /// The scratch database (dropped afterwards).
        database: String,
        /// Controller backend pid holding the lock.
        controller_pid: i32,
        /// The lock statement.
        lock_statement: String,
        /// Every racer seen waiting, as recorded just before the release.
        waits: Vec<LockWait>,
        /// Milliseconds from racer start until all were seen waiting.
        barrier_reached_ms: Option<f64>,
        /// Times `pg_locks` was polled.
        polls: u32,
        /// When the controller locked, saw every racer waiting, and released.
        controller: timeline::ControllerTimes,
        /// SQL run after the migrations (the implementation's schema change and any negative
        /// control's), in order: part of the setup an exported isolation spec needs.
        schema_sql: Vec<String>,
        /// The scenario's setup requests as committed store calls, in order.
        setup_calls: Vec<ticketflow_core::store::call::StoreCall>,
    },
}

/// The result of running one scenario on one backend.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioRun {
    /// Scenario name.
    pub scenario: String,
    /// Scenario file.
    pub file: String,
    /// Backend.
    pub backend: Backend,
    /// The matrix cell: SQLite modes or PostgreSQL isolation level.
    pub setting: RunSetting,
    /// Racers in the scenario.
    pub racer_count: usize,
    /// PASS / FAIL / PENDING.
    pub verdict: Verdict,
    /// Why, when not PASS.
    pub reason: Option<String>,
    /// The checks, in order.
    #[serde(serialize_with = "crate::verdict::json::held")]
    pub checks: Vec<Check>,
    /// Racers.
    pub racers: Vec<RacerRecord>,
    /// Rows per tenant after the race.
    pub rows: BTreeMap<String, RowCounts>,
    /// Backend evidence (absent when PENDING before it ran).
    pub evidence: Option<Evidence>,
    /// Milliseconds from barrier release until every racer was done.
    pub release_to_done_ms: Option<f64>,
    /// Redis in the loop: the tokens, every lease operation and what the runner did to the
    /// lease (`None` for a scenario without `[lease]`, or when it did not run).
    pub lease: Option<lease::LeaseEvidence>,
}

impl ScenarioRun {
    /// A run that happened, its verdict from `checks` ([`check::verdict_of`]); `evidence`:
    /// the backend's evidence and the lease driver's (each run has one or the other).
    pub(crate) fn judged(
        scenario: &Scenario,
        setting: RunSetting,
        checks: Vec<Check>,
        racers: Vec<RacerRecord>,
        rows: BTreeMap<String, RowCounts>,
        evidence: (Option<Evidence>, Option<lease::LeaseEvidence>),
        release_to_done_ms: Option<f64>,
    ) -> Self {
        let (mut verdict, mut reason) = check::verdict_of(&checks);
        // A racer the environment could not host (no free connection, no descriptor) leaves
        // the race incomplete: its failed checks judge the machine, not the implementation.
        let errors = racers.iter().filter_map(|r| r.result.as_ref().err());
        if verdict == Verdict::Fail {
            if let Some((shortage, text)) = Shortage::first_in(errors.map(String::as_str)) {
                let racer = racers
                    .iter()
                    .find(|r| r.result.as_ref().err().map(String::as_str) == Some(text))
                    .map_or("", |r| r.name.as_str());
                verdict = Verdict::Pending;
                reason = Some(format!(
                    "{} (the checks that failed, {}, are not a verdict)",
                    shortage.reason(&format!("racer {racer}: {text}")),
                    checks
                        .iter()
                        .filter(|c| !c.passed())
                        .map(|c| c.name)
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
        ScenarioRun {
            scenario: scenario.name.clone(),
            file: scenario.file.display().to_string(),
            backend: setting.backend(),
            setting,
            racer_count: scenario.racers.len(),
            verdict,
            reason,
            checks,
            racers,
            rows,
            evidence: evidence.0,
            release_to_done_ms,
            lease: evidence.1,
        }
    }

    /// A run that could not happen.
    pub fn pending(scenario: &Scenario, setting: RunSetting, reason: String) -> Self {
        ScenarioRun {
            scenario: scenario.name.clone(),
            file: scenario.file.display().to_string(),
            backend: setting.backend(),
            setting,
            racer_count: scenario.racers.len(),
            verdict: Verdict::Pending,
            reason: Some(reason),
            checks: Vec::new(),
            racers: Vec::new(),
            rows: BTreeMap::new(),
            evidence: None,
            release_to_done_ms: None,
            lease: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Verdict::{self, Fail, Pass, Pending};

    #[test]
    fn a_whole_fails_on_any_failure_then_is_pending_on_anything_not_run() {
        assert_eq!(Verdict::of_all([]), Pass);
        assert_eq!(Verdict::of_all([Pass, Pass]), Pass);
        assert_eq!(Verdict::of_all([Pass, Pending]), Pending);
        assert_eq!(Verdict::of_all([Pending, Fail, Pass]), Fail);
        assert_eq!(Verdict::of_all([Fail, Pending]), Fail);
    }
}
