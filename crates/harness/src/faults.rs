//! Faults and bad input, run by `verify` on each backend and summarized in REPORT.md with
//! counts: faults injected, inputs tried, rows lost (acknowledged creates missing afterwards)
//! and half states (tickets without their event or receipt, receipts without their ticket).
//! Every fault is followed by a retry that must converge on one ticket.
//!
//! A PostgreSQL restart during a run ([`restart_case`]) cuts every other session on the server,
//! so it runs only when asked for (`verify --restart-postgres`, as CI does).

use std::sync::mpsc;
use ticketflow_core::store::url::PgServer;

use serde::Serialize;

use crate::killmatrix::half_states;
use crate::props::request_pool;
use crate::scenario::observed::{Hook, HookPoint, ObservedStore};
use crate::scratch::{ScratchDb, ScratchError};
use crate::verdict::Verdict;
use ticketflow_core::domain::{OutcomeKind, TicketRequest};
use ticketflow_core::error::{DbErrorKind, Error, StoreError};
use ticketflow_core::protocol::{create_ticket, CreateOptions, Protocol};
use ticketflow_core::store::postgres::{IsolationLevel, PgStore};
use ticketflow_core::store::{Backend, Store};
use ticketflow_core::CreateReport;

/// What a fault case does ([`FaultCase::kind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CaseKind {
    /// It injects a fault (a crash, a failing insert, a lost client or backend, a lock
    /// timeout, a server restart), then retries the request, which must converge. Also the
    /// PENDING stand-in for every case of a backend that could not be used.
    Fault,
    /// It sends bad inputs, each of which must be refused as a validation error.
    BadInput,
}

/// One fault or bad-input case on one backend.
#[derive(Debug, Clone, Serialize)]
pub struct FaultCase {
    /// What was done.
    pub name: &'static str,
    /// Whether it injects a fault or tries bad inputs.
    pub kind: CaseKind,
    /// The backend it ran on.
    pub backend: Backend,
    /// PASS, FAIL, or PENDING (with the reason in `detail`).
    pub verdict: Verdict,
    /// What was seen.
    pub detail: String,
    /// Rows acknowledged to the client but missing afterwards.
    pub rows_lost: usize,
    /// Half states found afterwards.
    pub half_states: usize,
}

/// Why a fault case did not pass. Every variant is a FAIL with its `Display` as the reason,
/// except [`FaultError::CannotRun`], which only [`restart_case`] raises and reports as PENDING.
///
/// [`FaultError::Scratch`] and [`FaultError::Session`] say the harness could not do its job
/// (open a session, run its own SQL, read the rows back); they are FAIL too, as before. The
/// other variants are findings about the system under test.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FaultError {
    /// The scratch database could not be opened, changed or read.
    #[error(transparent)]
    Scratch(#[from] ScratchError),
    /// A statement of the harness's own on a PostgreSQL session failed.
    #[error(transparent)]
    Session(#[from] postgres::Error),
    /// The restart case cannot run here (PENDING, never PASS).
    #[error(transparent)]
    CannotRun(#[from] CannotRun),
    /// The create went through although the fault should have stopped it (the text says how).
    #[error("{0}")]
    FaultIgnored(&'static str),
    /// The client's retry after the fault failed.
    #[error("retry failed: {0}")]
    RetryFailed(#[source] Box<Error>),
    /// The client's retry had another outcome than the case expects.
    #[error("retry gave {got}, expected {want}")]
    RetryOutcome {
        /// What the retry gave.
        got: OutcomeKind,
        /// What the case expects.
        want: OutcomeKind,
    },
    /// Not exactly one ticket after the retry.
    #[error("{0} tickets after the retry")]
    TicketsAfterRetry(usize),
    /// Rows were written although the faulted create failed.
    #[error("rows left behind: {tickets}/{receipts}/{events}")]
    RowsLeftBehind {
        /// Tickets found.
        tickets: usize,
        /// Receipts found.
        receipts: usize,
        /// Outbox events found.
        events: usize,
    },
    /// The create that committed before the client died left no ticket.
    #[error("the commit was lost")]
    CommitLost,
    /// The retry replayed another ticket than the one the lost reply was about.
    #[error("the retry replayed {replayed}, the commit made {committed}")]
    ReplayedAnother {
        /// The ticket the retry replayed.
        replayed: uuid::Uuid,
        /// The ticket the commit made.
        committed: uuid::Uuid,
    },
    /// The racer whose backend was terminated did not get a connection error (what it got).
    #[error("the terminated racer got {0:?}")]
    TerminatedRacer(Box<ticketflow_core::Result<CreateReport>>),
    /// The create blocked by `lock_timeout` failed with another error than a typed timeout.
    #[error("expected a typed timeout (55P03), got {0}")]
    NotATimeout(#[source] Box<Error>),
    /// A bad input was not rejected as a validation error.
    #[error("{key:?}: expected a validation error, got {got:?}")]
    NotRejected {
        /// The idempotency key of the bad input.
        key: String,
        /// What the create returned.
        got: Box<ticketflow_core::Result<CreateReport>>,
    },
    /// A racer of the restart case was still not through after the deadline.
    #[error("racer {racer} gave up on {key} after 60 s")]
    RacerGaveUp {
        /// The racer's index.
        racer: usize,
        /// The key it was creating.
        key: String,
    },
    /// A racer of the restart case got another error than a lost connection.
    #[error("racer {racer} {key}: {source}")]
    Racer {
        /// The racer's index.
        racer: usize,
        /// The key it was creating.
        key: String,
        /// The error.
        #[source]
        source: Box<Error>,
    },
    /// Several racers of the restart case failed (joined with `; `).
    #[error("{}", join(.0))]
    Racers(Vec<FaultError>),
    /// No racer lost its session to the restart.
    #[error("the restart cut no racer's session: nothing was proven")]
    NothingCut,
    /// Keys, tickets and receipts do not match one to one after the restart.
    #[error("{tickets} tickets and {receipts} receipts for {keys} keys")]
    RowCounts {
        /// Tickets found.
        tickets: usize,
        /// Receipts found.
        receipts: usize,
        /// Keys acknowledged.
        keys: usize,
    },
}

fn join(errors: &[FaultError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Why [`restart_case`] cannot run here (its PENDING reason).
#[derive(Debug, thiserror::Error)]
pub(crate) enum CannotRun {
    /// The server is not a local Debian cluster.
    #[error("needs a local Debian cluster (pg_ctlcluster) to restart")]
    NotLocal,
    /// The scratch database could not be created.
    #[error(transparent)]
    Scratch(ScratchError),
    /// The scratch database is not on PostgreSQL.
    #[error("not a PostgreSQL database")]
    NotPostgres,
    /// `pg_ctlcluster … restart` exited with an error (its stderr, trimmed).
    #[error("pg_ctlcluster restart failed: {0}")]
    RestartFailed(String),
    /// `pg_ctlcluster` could not be started.
    #[error("cannot run pg_ctlcluster: {0}")]
    NoPgCtlcluster(#[source] std::io::Error),
}

/// Every case on every backend.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FaultReport {
    /// The cases.
    pub cases: Vec<FaultCase>,
    /// Faults injected: the fault cases that injected their fault and read the outcome back (a
    /// case that stopped on an error is not counted here; [`FaultTally::inject`] counts it
    /// among the cases that ran).
    pub faults_injected: usize,
    /// Bad inputs tried.
    pub inputs_tried: usize,
    /// Cases left out by choice, with the reason (shown as PENDING; they do not change the
    /// exit code).
    pub not_run: Vec<(&'static str, String)>,
}

/// The fault cases of a [`FaultReport`] counted one way for the terminal, REPORT.md's headline,
/// its faults section and its Timings table ([`FaultReport::tally`]). Displayed as
/// `29 fault cases (28 ran: 22 inject a fault, 6 try 66 bad inputs; 1 PENDING: NAME)`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct FaultTally {
    /// Every case, run or not: the report's fault items (one verdict each).
    pub cases: usize,
    /// Cases that ran (PASS or FAIL).
    pub ran: usize,
    /// Of `ran`, the cases that inject a fault ([`CaseKind::Fault`]).
    pub inject: usize,
    /// Of `ran`, the cases that try bad inputs ([`CaseKind::BadInput`]).
    pub bad_input_cases: usize,
    /// The bad inputs those cases tried ([`FaultReport::inputs_tried`]).
    pub inputs_tried: usize,
    /// The cases that did not run (PENDING), by name (`NAME (backend)` for a backend's case).
    pub pending: Vec<String>,
}

impl std::fmt::Display for FaultTally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} fault cases ({} ran: {} inject a fault, {} try {} bad inputs",
            self.cases, self.ran, self.inject, self.bad_input_cases, self.inputs_tried
        )?;
        if !self.pending.is_empty() {
            write!(
                f,
                "; {} PENDING: {}",
                self.pending.len(),
                self.pending.join(", ")
            )?;
        }
        f.write_str(")")
    }
}

impl FaultReport {
    /// The cases counted: every case, those that ran by what they do, those that did not.
    pub fn tally(&self) -> FaultTally {
        let ran: Vec<&FaultCase> = self
            .cases
            .iter()
            .filter(|c| c.verdict != Verdict::Pending)
            .collect();
        let pending = self
            .cases
            .iter()
            .filter(|c| c.verdict == Verdict::Pending)
            .map(|c| format!("{} ({})", c.name, c.backend))
            .chain(self.not_run.iter().map(|(name, _)| (*name).to_string()))
            .collect();
        FaultTally {
            cases: self.cases.len() + self.not_run.len(),
            ran: ran.len(),
            inject: ran.iter().filter(|c| c.kind == CaseKind::Fault).count(),
            bad_input_cases: ran.iter().filter(|c| c.kind == CaseKind::BadInput).count(),
            inputs_tried: self.inputs_tried,
            pending,
        }
    }

    /// FAIL if any case failed, PENDING if any did not run, else PASS.
    pub fn verdict(&self) -> Verdict {
        Verdict::of_all(self.cases.iter().map(|c| c.verdict))
    }

    /// As [`FaultReport::verdict`], but PENDING only for PostgreSQL cases (for exit codes
    /// under `--require-postgres`).
    pub fn postgres_verdict(&self) -> Verdict {
        let pg_pending = self
            .cases
            .iter()
            .any(|c| c.verdict == Verdict::Pending && c.backend == Backend::Postgres);
        match self.verdict() {
            Verdict::Pending if !pg_pending => Verdict::Pass,
            v => v,
        }
    }
}

/// The error an injected fault raises inside a session on `backend`.
fn fault(backend: Backend, message: &str) -> StoreError {
    StoreError {
        kind: DbErrorKind::Other,
        backend,
        operation: "fault",
        code: None,
        message: message.into(),
    }
}

type Session = Box<dyn Store + Send>;

/// Runs the fault and bad-input cases on each backend; PostgreSQL cases are PENDING with
/// `pg_unusable` when it is `Some`. With `restart_postgres`, also [`restart_case`], which
/// restarts the local server (every other session on it is cut).
pub fn run(pg: &PgServer, pg_unusable: Option<&str>, restart_postgres: bool) -> FaultReport {
    let mut report = FaultReport::default();
    match (restart_postgres, pg_unusable) {
        (true, None) => {
            let case = restart_case(pg);
            if case.verdict != Verdict::Pending {
                report.faults_injected += 1;
            }
            report.cases.push(case);
        }
        (true, Some(_)) => {}
        (false, _) => report.not_run.push((
            "PostgreSQL restarts during a run",
            format!(
                "not requested: run `verify {}` to include it (it restarts the local PostgreSQL \
                 cluster, cutting every session on it)",
                ticketflow_core::flags::RESTART_POSTGRES
            ),
        )),
    }
    run_cases(&mut report, Protocol::Savepoint, pg, pg_unusable);
    report
}

/// The fault and bad-input cases (not the restart) with the `protocol` doing every create,
/// the client's retry included. Case names of the `on-conflict` protocol end in
/// `[on-conflict]`. `verify` runs this for the second protocol after [`run`].
pub fn run_protocol(protocol: Protocol, pg: &PgServer, pg_unusable: Option<&str>) -> FaultReport {
    let mut report = FaultReport::default();
    run_cases(&mut report, protocol, pg, pg_unusable);
    report
}

impl FaultReport {
    /// Appends another report's cases and counts (the second protocol's run).
    pub fn absorb(&mut self, other: FaultReport) {
        self.cases.extend(other.cases);
        self.faults_injected += other.faults_injected;
        self.inputs_tried += other.inputs_tried;
        self.not_run.extend(other.not_run);
    }
}

/// One case: its name under each protocol (in [`Protocol::ALL`] order), whether it injects a
/// fault, and the function.
type CaseRow = ([&'static str; 3], bool, CaseFn);

fn run_cases(report: &mut FaultReport, p: Protocol, pg: &PgServer, pg_unusable: Option<&str>) {
    for backend in Backend::ALL {
        if let (Backend::Postgres, Some(why)) = (backend, pg_unusable) {
            report.cases.push(FaultCase {
                name: "all cases",
                kind: CaseKind::Fault,
                backend,
                verdict: Verdict::Pending,
                detail: why.to_string(),
                rows_lost: 0,
                half_states: 0,
            });
            continue;
        }
        let nth = Protocol::ALL.iter().position(|&q| q == p).unwrap_or(0);
        for (names, is_fault, f) in CASES {
            run_case(report, backend, names[nth], is_fault, f, p, pg);
        }
    }
}

/// Runs case `f` (named `case`, a fault when `is_fault`) on a fresh scratch database on
/// `backend` and appends its row and counts to `report` (nothing when it does not apply).
fn run_case(
    report: &mut FaultReport,
    backend: Backend,
    case: &'static str,
    is_fault: bool,
    f: CaseFn,
    p: Protocol,
    pg: &PgServer,
) {
    let kind = if is_fault {
        CaseKind::Fault
    } else {
        CaseKind::BadInput
    };
    let db = match ScratchDb::create(backend, pg, "faults") {
        Ok(db) => db,
        Err(e) => {
            report.cases.push(FaultCase {
                name: case,
                kind,
                backend,
                verdict: Verdict::Pending,
                detail: e.to_string(),
                rows_lost: 0,
                half_states: 0,
            });
            return;
        }
    };
    let mut c = FaultCase {
        name: case,
        kind,
        backend,
        verdict: Verdict::Pass,
        detail: String::new(),
        rows_lost: 0,
        half_states: 0,
    };
    match f(&db, p) {
        // Not applicable on this backend: nothing ran, so nothing is listed.
        Ok(Outcome::NotApplicable) => return,
        Ok(Outcome::Ran {
            detail,
            acknowledged,
            inputs,
        }) => {
            report.inputs_tried += inputs;
            if is_fault {
                report.faults_injected += 1;
            }
            c.detail = detail;
            match db.dump("") {
                Ok(dump) => {
                    c.half_states = half_states(&dump).len();
                    c.rows_lost = acknowledged
                        .iter()
                        .filter(|id| !dump.tickets.iter().any(|t| t.0 == **id))
                        .count();
                }
                Err(e) => {
                    c.verdict = Verdict::Fail;
                    c.detail = format!("cannot read the rows back: {e}");
                }
            }
            if c.half_states > 0 || c.rows_lost > 0 {
                c.verdict = Verdict::Fail;
            }
        }
        Err(e) => {
            c.verdict = Verdict::Fail;
            c.detail = e.to_string();
        }
    }
    // A case the environment could not host (no free connection) proves nothing either way.
    if c.verdict == Verdict::Fail {
        if let Some(short) = crate::shortage::Shortage::in_text(&c.detail) {
            c.verdict = Verdict::Pending;
            c.detail = short.reason(&c.detail);
        }
    }
    report.cases.push(c);
}

/// The cases, in the order they run and are listed: the name for each protocol (in
/// [`Protocol::ALL`] order), whether it injects a fault, and the case.
const CASES: [CaseRow; 6] = [
    (
        [
            "crash after the ticket insert",
            "crash after the ticket insert [on-conflict]",
            "crash after the ticket insert [single-statement]",
        ],
        true,
        crash_after_ticket,
    ),
    (
        [
            "outbox insert fails",
            "outbox insert fails [on-conflict]",
            "outbox insert fails [single-statement]",
        ],
        true,
        failing_outbox,
    ),
    (
        [
            "client dies after COMMIT, before the reply",
            "client dies after COMMIT, before the reply [on-conflict]",
            "client dies after COMMIT, before the reply [single-statement]",
        ],
        true,
        died_after_commit,
    ),
    (
        [
            "backend terminated before COMMIT",
            "backend terminated before COMMIT [on-conflict]",
            "backend terminated before COMMIT [single-statement]",
        ],
        true,
        terminated_backend,
    ),
    (
        [
            "lock_timeout while waiting at the barrier",
            "lock_timeout while waiting at the barrier [on-conflict]",
            "lock_timeout while waiting at the barrier [single-statement]",
        ],
        true,
        lock_timeout,
    ),
    (
        [
            "validation: every bad input",
            "validation: every bad input [on-conflict]",
            "validation: every bad input [single-statement]",
        ],
        false,
        bad_inputs,
    ),
];

enum Outcome {
    Ran {
        detail: String,
        /// Ticket ids the client was told about.
        acknowledged: Vec<uuid::Uuid>,
        inputs: usize,
    },
    /// The case does not apply to this backend (PostgreSQL-only faults on SQLite).
    NotApplicable,
}

type CaseFn = fn(&ScratchDb, Protocol) -> Result<Outcome, FaultError>;

/// A create through protocol `p` with the default retry policy.
fn create<S: Store + ?Sized>(
    p: Protocol,
    store: &mut S,
    tenant: &str,
    key: &str,
    request: &TicketRequest,
) -> ticketflow_core::Result<ticketflow_core::CreateReport> {
    create_ticket(store, tenant, key, request, &CreateOptions::new(p))
}

fn b0() -> TicketRequest {
    request_pool()[0].clone()
}

/// After the fault, the same request through a fresh session must create or replay exactly
/// one ticket; returns its id.
fn retry_converges(
    db: &ScratchDb,
    p: Protocol,
    want: OutcomeKind,
) -> Result<uuid::Uuid, FaultError> {
    let mut s = db.open()?;
    let r = create(p, s.as_mut(), "A", "key-1", &b0())
        .map_err(|e| FaultError::RetryFailed(Box::new(e)))?;
    if r.outcome.kind() != want {
        return Err(FaultError::RetryOutcome {
            got: r.outcome.kind(),
            want,
        });
    }
    let tickets = db.dump("")?.tickets.len();
    if tickets != 1 {
        return Err(FaultError::TicketsAfterRetry(tickets));
    }
    Ok(r.outcome.ticket().map(|t| t.id).unwrap_or_default())
}

fn expect_nothing(db: &ScratchDb) -> Result<(), FaultError> {
    let d = db.dump("")?;
    if d.tickets.is_empty() && d.receipts.is_empty() && d.events.is_empty() {
        Ok(())
    } else {
        Err(FaultError::RowsLeftBehind {
            tickets: d.tickets.len(),
            receipts: d.receipts.len(),
            events: d.events.len(),
        })
    }
}

fn crash_after_ticket(db: &ScratchDb, p: Protocol) -> Result<Outcome, FaultError> {
    // One statement inserts the ticket, its event and the receipt: there is no point between
    // them to crash at (a failure inside the statement is the "outbox insert fails" case).
    if p == Protocol::SingleStatement {
        return Ok(Outcome::NotApplicable);
    }
    let mut s: Session = db.open()?;
    let boom: Hook<'_, dyn Store + Send> =
        Box::new(|s| Err(fault(s.backend(), "crash after the ticket insert")));
    let mut o = ObservedStore::new(s.as_mut(), vec![(HookPoint::AfterTicketInsert, boom)]);
    if create(p, &mut o, "A", "key-1", &b0()).is_ok() {
        return Err(FaultError::FaultIgnored(
            "the create succeeded despite the crash",
        ));
    }
    expect_nothing(db)?;
    let id = retry_converges(db, p, OutcomeKind::Created)?;
    Ok(Outcome::Ran {
        detail: "0/0/0 after the crash; the retry created".into(),
        acknowledged: vec![id],
        inputs: 0,
    })
}

fn failing_outbox(db: &ScratchDb, p: Protocol) -> Result<Outcome, FaultError> {
    let (break_it, mend_it) = failing_insert_trigger(db.backend(), "outbox_events");
    db.execute(&break_it)?;
    let mut s = db.open()?;
    if create(p, s.as_mut(), "A", "key-1", &b0()).is_ok() {
        return Err(FaultError::FaultIgnored(
            "the create succeeded without its outbox row",
        ));
    }
    expect_nothing(db)?;
    db.execute(&mend_it)?;
    let id = retry_converges(db, p, OutcomeKind::Created)?;
    Ok(Outcome::Ran {
        detail: "0/0/0 while the outbox failed; the retry created".into(),
        acknowledged: vec![id],
        inputs: 0,
    })
}

/// SQL that makes every insert into `table` fail (a trigger raising an error), and the SQL
/// that mends it, in SQLite's dialect on [`Backend::Sqlite`], else PostgreSQL's. Fault
/// injection only.
pub fn failing_insert_trigger(backend: Backend, table: &str) -> (String, String) {
    let name = format!("{table}_down");
    match backend {
        Backend::Sqlite => (
            format!(
                "CREATE TRIGGER {name} BEFORE INSERT ON {table} BEGIN SELECT RAISE(ABORT, '{table} down'); END;"
            ),
            format!("DROP TRIGGER {name};"),
        ),
        _ => (
            format!(
                "CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION '{table} down'; END $$; \
                 CREATE TRIGGER {name} BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION {name}();"
            ),
            format!("DROP TRIGGER {name} ON {table}; DROP FUNCTION {name}();"),
        ),
    }
}

fn died_after_commit(db: &ScratchDb, p: Protocol) -> Result<Outcome, FaultError> {
    let mut s = db.open()?;
    let died: Hook<'_, dyn Store + Send> =
        Box::new(|s| Err(fault(s.backend(), "client died before reading the reply")));
    let mut o = ObservedStore::new(s.as_mut(), vec![(HookPoint::AfterCommit(1), died)]);
    if create(p, &mut o, "A", "key-1", &b0()).is_ok() {
        return Err(FaultError::FaultIgnored(
            "the client read a reply it should have lost",
        ));
    }
    drop(o);
    let committed = db
        .dump("")?
        .tickets
        .first()
        .map(|t| t.0)
        .ok_or(FaultError::CommitLost)?;
    let id = retry_converges(db, p, OutcomeKind::Replayed)?;
    if id != committed {
        return Err(FaultError::ReplayedAnother {
            replayed: id,
            committed,
        });
    }
    Ok(Outcome::Ran {
        detail: "the retry replayed the committed ticket's id".into(),
        acknowledged: vec![id],
        inputs: 0,
    })
}

fn terminated_backend(db: &ScratchDb, p: Protocol) -> Result<Outcome, FaultError> {
    if db.backend() != Backend::Postgres {
        return Ok(Outcome::NotApplicable);
    }
    let mut racer = db.open_postgres(IsolationLevel::ReadCommitted)?;
    let pid = racer.backend_pid();
    let (paused_tx, paused_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let result = std::thread::scope(|scope| {
        let r = scope.spawn(move || {
            let pause: Hook<'_, PgStore> = Box::new(move |_| {
                let _ = paused_tx.send(());
                let _ = go_rx.recv();
                Ok(())
            });
            let mut o = ObservedStore::new(&mut racer, vec![(HookPoint::BeforeWriteCommit, pause)]);
            create(p, &mut o, "A", "key-1", &b0())
        });
        let _ = paused_rx.recv();
        let killed = db.execute(&format!("SELECT pg_terminate_backend({pid})"));
        let _ = go_tx.send(());
        killed.map(|()| r.join().expect("racer thread panicked"))
    })?;
    match result {
        Err(e) if e.db_kind() == Some(DbErrorKind::Connection) => {}
        other => return Err(FaultError::TerminatedRacer(Box::new(other))),
    }
    expect_nothing(db)?;
    let id = retry_converges(db, p, OutcomeKind::Created)?;
    Ok(Outcome::Ran {
        detail: "the uncommitted rows vanished; the retry created".into(),
        acknowledged: vec![id],
        inputs: 0,
    })
}

fn lock_timeout(db: &ScratchDb, p: Protocol) -> Result<Outcome, FaultError> {
    if db.backend() != Backend::Postgres {
        return Ok(Outcome::NotApplicable);
    }
    let mut racer = db.open_postgres(IsolationLevel::ReadCommitted)?;
    racer.client().batch_execute("SET lock_timeout = '100ms'")?;
    let mut controller = db.connect_postgres()?;
    controller.batch_execute("BEGIN; LOCK TABLE idempotency_receipts IN ACCESS EXCLUSIVE MODE")?;
    let err = match create(p, &mut racer, "A", "key-1", &b0()) {
        Err(e) => e,
        Ok(_) => {
            return Err(FaultError::FaultIgnored(
                "the create went through a held barrier",
            ))
        }
    };
    controller.batch_execute("COMMIT")?;
    if err.db_kind() != Some(DbErrorKind::Timeout) {
        return Err(FaultError::NotATimeout(Box::new(err)));
    }
    expect_nothing(db)?;
    let id = retry_converges(db, p, OutcomeKind::Created)?;
    Ok(Outcome::Ran {
        detail: "typed 55P03, nothing written; the retry created".into(),
        acknowledged: vec![id],
        inputs: 0,
    })
}

fn bad_inputs(db: &ScratchDb, p: Protocol) -> Result<Outcome, FaultError> {
    let mut cases: Vec<(String, TicketRequest)> = vec![
        (String::new(), b0()),
        ("k".repeat(256), b0()),
        ("key\0-1".into(), b0()),
    ];
    let edits: [fn(&mut TicketRequest); 8] = [
        |r| r.priority = "bogus".into(),
        |r| r.title = "t".repeat(201),
        |r| r.body = "b".repeat(1024 * 1024),
        |r| r.actor_id.push('\0'),
        |r| r.title.push('\0'),
        |r| r.body.push('\0'),
        |r| r.priority.push('\0'),
        |r| r.actor_id.clear(),
    ];
    for edit in edits {
        let mut r = b0();
        edit(&mut r);
        cases.push(("key-1".into(), r));
    }
    let mut s = db.open()?;
    for (key, request) in &cases {
        match create(p, s.as_mut(), "A", key, request) {
            Err(Error::Validation(_)) => {}
            other => {
                return Err(FaultError::NotRejected {
                    key: key.clone(),
                    got: Box::new(other),
                })
            }
        }
    }
    expect_nothing(db)?;
    let id = retry_converges(db, p, OutcomeKind::Created)?;
    Ok(Outcome::Ran {
        detail: format!(
            "{} inputs rejected with typed errors, nothing written; the key then created",
            cases.len()
        ),
        acknowledged: vec![id],
        inputs: cases.len(),
    })
}

/// Creates each racer thread in [`restart_case`] makes after the restart has completed (it
/// keeps creating from the start, so it is mid-create when the server goes down).
const CREATES_AFTER_RESTART: usize = 20;
/// Racer threads in [`restart_case`].
const RESTART_RACERS: usize = 4;

/// PostgreSQL restarts during a run (`pg_ctlcluster … restart`, a local cluster only): racer
/// threads keep creating; a create that fails on the lost connection reconnects and retries
/// the same request (same key), as a client would. Afterwards every acknowledged ticket exists,
/// each key has exactly one receipt and ticket, and no half state is left: every in-flight
/// create committed fully or not at all. PENDING (never PASS) when the server is not a local
/// cluster this process can restart, or does not come back.
pub fn restart_case(pg: &PgServer) -> FaultCase {
    let mut case = FaultCase {
        name: "PostgreSQL restarts during a run",
        kind: CaseKind::Fault,
        backend: Backend::Postgres,
        verdict: Verdict::Pending,
        detail: String::new(),
        rows_lost: 0,
        half_states: 0,
    };
    match restart_run(pg) {
        Err(FaultError::CannotRun(why)) => case.detail = why.to_string(),
        Err(e) => match crate::shortage::Shortage::in_text(&e.to_string()) {
            Some(short) => case.detail = short.reason(&e.to_string()),
            None => {
                case.verdict = Verdict::Fail;
                case.detail = e.to_string();
            }
        },
        Ok(Converged { lost, half }) => {
            case.rows_lost = lost;
            case.half_states = half;
            case.verdict = if lost == 0 && half == 0 {
                Verdict::Pass
            } else {
                Verdict::Fail
            };
            case.detail = format!(
                "creates by {RESTART_RACERS} racers across a restart (a racer that loses its \
                 session reconnects and retries); one ticket and receipt per key"
            );
        }
    }
    case
}

/// The restart case's counts once every racer is through.
struct Converged {
    /// Acknowledged tickets missing afterwards.
    lost: usize,
    /// Half states found afterwards.
    half: usize,
}

/// What the racers of [`race_across_restart`] hand back.
struct RestartRace {
    /// Ticket ids acknowledged to the racers.
    acks: Vec<uuid::Uuid>,
    /// Racers that failed.
    errors: Vec<FaultError>,
    /// Sessions lost (and reopened) by all racers.
    reconnects: usize,
    /// How `pg_ctlcluster … restart` went.
    restart: std::io::Result<std::process::Output>,
}

/// `Err(FaultError::CannotRun(_))` when the case cannot run (PENDING); any other `Err` when it
/// ran and broke.
fn restart_run(pg: &PgServer) -> Result<Converged, FaultError> {
    let version = local_cluster(pg)?;
    let db = ScratchDb::postgres(pg, "restart").map_err(CannotRun::Scratch)?;
    let Some(scratch_config) = db.pg_config().cloned() else {
        return Err(CannotRun::NotPostgres.into());
    };
    let RestartRace {
        acks,
        errors,
        reconnects,
        restart,
    } = race_across_restart(&scratch_config, &version);
    match restart {
        Ok(out) if out.status.success() => {}
        Ok(out) => {
            return Err(CannotRun::RestartFailed(
                String::from_utf8_lossy(&out.stderr).trim().to_string(),
            )
            .into())
        }
        Err(e) => return Err(CannotRun::NoPgCtlcluster(e).into()),
    }
    if !errors.is_empty() {
        return Err(FaultError::Racers(errors));
    }
    if reconnects == 0 {
        return Err(FaultError::NothingCut);
    }
    let dump = db.dump("")?;
    let keys = acks.len();
    let lost = acks
        .iter()
        .filter(|id| !dump.tickets.iter().any(|t| t.0 == **id))
        .count();
    let half = half_states(&dump).len();
    if dump.tickets.len() != keys || dump.receipts.len() != keys {
        return Err(FaultError::RowCounts {
            tickets: dump.tickets.len(),
            receipts: dump.receipts.len(),
            keys,
        });
    }
    // How many creates fit around the restart varies run to run; it is logged, not put into
    // the report's table.
    tracing::info!(creates = keys, reconnects, "restart case converged");
    Ok(Converged { lost, half })
}

/// Restarts the local Debian cluster serving `pg` (`pg_ctlcluster … restart`), as the
/// restart case does; every session on that server is cut. Also used by `ticketflow soak`.
///
/// Will return `Err` ([`CannotRun`]) when the server is not a local cluster, `pg_ctlcluster`
/// cannot be run, or the restart fails (its stderr).
pub(crate) fn restart_local_cluster(pg: &PgServer) -> Result<(), CannotRun> {
    let version = local_cluster(pg)?;
    // Not started through crate::child: a restart cut short by this process's death would
    // leave the server down; pg_ctlcluster ends by itself once the server is up again.
    let out = std::process::Command::new("pg_ctlcluster")
        .args(["--skip-systemctl-redirect", &version, "main", "restart"])
        .output()
        .map_err(CannotRun::NoPgCtlcluster)?;
    if out.status.success() {
        Ok(())
    } else {
        Err(CannotRun::RestartFailed(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ))
    }
}

/// The version of the local Debian cluster serving `pg` (the newest under
/// `/etc/postgresql`): the gate of every PostgreSQL restart.
///
/// Will return `Err` if the URL names a remote host, or there is no cluster.
pub(crate) fn local_cluster(pg: &PgServer) -> Result<String, CannotRun> {
    let config = pg.config();
    let local = config.get_hosts().iter().all(|h| match h {
        postgres::config::Host::Tcp(name) => name == "127.0.0.1" || name == "localhost",
        #[cfg(unix)]
        postgres::config::Host::Unix(_) => true,
    });
    let cluster = std::fs::read_dir("/etc/postgresql")
        .ok()
        .and_then(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name()).max())
        .map(|v| v.to_string_lossy().to_string());
    match (local, cluster) {
        (true, Some(version)) => Ok(version),
        _ => Err(CannotRun::NotLocal),
    }
}

/// Runs [`RESTART_RACERS`] racers on the scratch database at `config`, restarts cluster
/// `version` once they are well under way, and joins them.
fn race_across_restart(config: &postgres::Config, version: &str) -> RestartRace {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    let done = AtomicUsize::new(0);
    let restarted = AtomicBool::new(false);
    let deadline = Instant::now() + Duration::from_secs(60);
    std::thread::scope(|scope| {
        let racers: Vec<_> = (0..RESTART_RACERS)
            .map(|t| {
                let (done, restarted) = (&done, &restarted);
                scope.spawn(move || restart_racer(t, config, done, restarted, deadline))
            })
            .collect();
        // Restart once every racer is well under way.
        while done.load(Ordering::Relaxed) < RESTART_RACERS * 10 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        // Not through crate::child, as in restart_local_cluster.
        let restart = std::process::Command::new("pg_ctlcluster")
            .args(["--skip-systemctl-redirect", version, "main", "restart"])
            .output();
        restarted.store(true, Ordering::SeqCst);
        let mut race = RestartRace {
            acks: Vec::new(),
            errors: Vec::new(),
            reconnects: 0,
            restart,
        };
        for r in racers {
            match r.join().expect("racer thread panicked") {
                Ok((a, n)) => {
                    race.acks.extend(a);
                    race.reconnects += n;
                }
                Err(e) => race.errors.push(e),
            }
        }
        race
    })
}

/// Racer `t` of the restart case: creates `key-{t}-{i}` one after the other until
/// [`CREATES_AFTER_RESTART`] creates after `restarted` is set; a create that fails on the lost
/// connection reconnects and retries the same key. Returns the acknowledged ids and the
/// sessions lost.
///
/// Will return `Err` on any other error, or when a key is not through by `deadline`.
fn restart_racer(
    t: usize,
    config: &postgres::Config,
    done: &std::sync::atomic::AtomicUsize,
    restarted: &std::sync::atomic::AtomicBool,
    deadline: std::time::Instant,
) -> Result<(Vec<uuid::Uuid>, usize), FaultError> {
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};

    // Sessions are opened from a shared config: the scratch handle itself stays with the case.
    let open = |c: &postgres::Config| PgStore::connect(c, IsolationLevel::ReadCommitted).ok();
    let mut acks = Vec::new();
    let mut reconnects = 0usize;
    let mut session = open(config);
    let mut stop_at = None;
    for i in 0.. {
        if stop_at.is_none() && restarted.load(Ordering::SeqCst) {
            stop_at = Some(i + CREATES_AFTER_RESTART);
        }
        if stop_at == Some(i) {
            break;
        }
        let key = format!("key-{t}-{i}");
        loop {
            if Instant::now() > deadline {
                return Err(FaultError::RacerGaveUp { racer: t, key });
            }
            let Some(s) = session.as_mut() else {
                // The server is still coming back: poll until it accepts.
                std::thread::sleep(Duration::from_millis(50));
                session = open(config);
                continue;
            };
            match create_ticket(s, "A", &key, &b0(), &CreateOptions::default()) {
                Ok(r) => {
                    acks.push(r.outcome.ticket().map(|t| t.id).unwrap_or_default());
                    done.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                Err(e) if e.db_kind() == Some(DbErrorKind::Connection) => {
                    reconnects += 1;
                    session = None;
                }
                Err(source) => {
                    return Err(FaultError::Racer {
                        racer: t,
                        key,
                        source: Box::new(source),
                    })
                }
            }
        }
    }
    Ok((acks, reconnects))
}
