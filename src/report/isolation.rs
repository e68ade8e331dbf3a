//! Exports a recorded PostgreSQL race as a spec for PostgreSQL's isolation tester
//! (`src/test/isolation` in the PostgreSQL sources; the `isolationtester` binary ships in
//! Debian's `postgresql-client` under `$(pg_config --pkglibdir)/pgxs/src/test/isolation/`).
//!
//! The spec has:
//! - `setup`: the migrations, the implementation's schema change, the scenario's committed
//!   setup requests (as literal INSERTs);
//! - `teardown`: drops the tables;
//! - a `controller` session that takes and releases the barrier lock;
//! - one session per racer whose steps are the statements it sent, with the values it sent
//!   (the same SQL text the store prepares, [`crate::store::postgres::call_sql`]);
//! - an `observer` session that counts rows at the end;
//! - one `permutation`: the recorded order in which statements were issued.
//!
//! The isolation tester runs the permutation, noticing on its own when a step blocks on a
//! lock and going on with the next session, so the replay follows the recorded interleaving
//! without any timing. Run it with `isolationtester "dbname=… host=…" < FILE.spec` against an
//! empty database.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::scenario::format::LockMode;
use crate::scenario::runner::ADVISORY_KEY;
use crate::scenario::timeline::{Step, StoreCall};
use crate::scenario::{Evidence, RunSetting, ScenarioRun};
use crate::store::migrate;
use crate::store::postgres::{call_sql, IsolationLevel};

/// Why a run cannot be exported.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// Only PostgreSQL runs that ran have a timeline to export.
    #[error("scenario {scenario}: only a PostgreSQL run that ran can be exported ({setting})")]
    NotPostgres {
        /// Scenario name.
        scenario: String,
        /// The run's setting.
        setting: String,
    },
    /// Setup SQL contains a brace, which would end the tester's block early.
    #[error("scenario {scenario}: setup SQL contains a brace, which a spec block cannot hold")]
    Brace {
        /// Scenario name.
        scenario: String,
    },
    /// Writing the file failed.
    #[error("cannot write {path}: {source}")]
    Write {
        /// Target.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// Tables the migrations create, dropped by the spec's teardown.
const TEARDOWN: &str = "DROP TABLE IF EXISTS idempotency_receipts, outbox_events, tickets CASCADE;";

/// An isolation-tester identifier from free text: `[a-z0-9_]`, not starting with a digit.
fn ident(text: &str) -> String {
    let mut s: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, 's');
    }
    s
}

/// A one-line block: `{ SQL; }`. The tester's scanner ends a block at the first `}`, so
/// literals carry none ([`crate::store::postgres::quote_literal`] escapes them) and SQL
/// text with a brace is refused by [`render`].
fn block(sql: &str) -> String {
    format!("{{ {}; }}", sql.trim_end_matches(';'))
}

/// The file name an exported run gets: `SCENARIO.ISOLATION.spec`, e.g.
/// `a-same-key-same-body.read-committed.spec`.
pub fn file_name(run: &ScenarioRun) -> String {
    let level = match run.setting {
        RunSetting::Postgres { isolation } => crate::scenario::worker::isolation_arg(isolation),
        RunSetting::Sqlite { .. } => "sqlite",
    };
    format!("{}.{}.spec", run.scenario, level)
}

/// Renders `run` as an isolation-tester spec.
///
/// Will return `Err` when `run` is not a PostgreSQL run with evidence.
pub fn render(run: &ScenarioRun) -> Result<String, SpecError> {
    let (
        RunSetting::Postgres { isolation },
        Some(Evidence::Postgres {
            lock_mode,
            lock_statement,
            controller,
            schema_sql,
            setup_calls,
            ..
        }),
    ) = (run.setting, &run.evidence)
    else {
        return Err(SpecError::NotPostgres {
            scenario: run.scenario.clone(),
            setting: run.setting.label(),
        });
    };
    let advisory = format!("SELECT pg_advisory_xact_lock_shared({ADVISORY_KEY})");
    let advisory = matches!(lock_mode, LockMode::Advisory).then_some(advisory.as_str());
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Exported by ticketflow {} from scenario `{}` ({}), verdict {}.",
        env!("CARGO_PKG_VERSION"),
        run.scenario,
        run.setting.label(),
        run.verdict
    );
    if let Some(reason) = &run.reason {
        let _ = writeln!(out, "# Reason: {}", reason.replace('\n', " "));
    }
    let _ = writeln!(
        out,
        "# Replays the recorded order in which the racers issued their statements.\n\
         # Run: isolationtester \"host=127.0.0.1 user=postgres dbname=EMPTY_DB\" < {}\n",
        file_name(run)
    );
    let plain = migrate::POSTGRES
        .iter()
        .map(|m| m.sql)
        .chain(schema_sql.iter().map(String::as_str))
        .chain(std::iter::once(lock_statement.as_str()));
    if plain.into_iter().any(|sql| sql.contains(['{', '}'])) {
        return Err(SpecError::Brace {
            scenario: run.scenario.clone(),
        });
    }
    for m in migrate::POSTGRES {
        let _ = writeln!(out, "setup\n{{\n{}\n}}", m.sql.trim());
    }
    for sql in schema_sql {
        let _ = writeln!(out, "setup\n{{\n{}\n}}", sql.trim());
    }
    if !setup_calls.is_empty() {
        let stmts: Vec<String> = setup_calls
            .iter()
            .map(|c| format!("{};", call_sql(c, IsolationLevel::ReadCommitted, None)))
            .collect();
        let _ = writeln!(out, "setup\n{{\n{}\n}}", stmts.join("\n"));
    }
    let _ = writeln!(out, "teardown {{ {TEARDOWN} }}\n");

    let _ = writeln!(out, "session controller");
    let _ = writeln!(
        out,
        "step c_lock {}",
        block(&format!("BEGIN; {lock_statement}"))
    );
    let _ = writeln!(out, "step c_release {}\n", block("COMMIT"));

    let keys = permutation_keys(run, controller.released_us);
    let mut order: Vec<(u64, u16, String)> = vec![
        (controller.locked_us, 0, "c_lock".into()),
        (controller.released_us, 1, "c_release".into()),
    ];
    for (i, r) in run.racers.iter().enumerate() {
        let session = format!("r{}_{}", i + 1, ident(&r.name));
        let _ = writeln!(out, "session {session}");
        for (j, step) in r.steps.iter().enumerate() {
            let name = step_name(&session, j, step);
            let sql = call_sql(&step.call, isolation, advisory);
            let _ = writeln!(out, "step {name} {}", block(&sql));
            let (t, rank) = keys[i][j];
            order.push((t, rank, name));
        }
        // A racer that died mid-transaction leaves it open; end it so teardown can run.
        let _ = writeln!(out, "teardown {{ ROLLBACK; }}\n");
    }
    let _ = writeln!(out, "session observer");
    let _ = writeln!(
        out,
        "step counts {}\n",
        block(
            "SELECT t.tenant_id, count(DISTINCT t.id) AS tickets, \
             (SELECT count(*) FROM idempotency_receipts r WHERE r.tenant_id = t.tenant_id) AS receipts, \
             (SELECT count(*) FROM outbox_events o WHERE o.tenant_id = t.tenant_id AND o.event_type = 'ticket.created') AS created_events \
             FROM tickets t GROUP BY t.tenant_id ORDER BY t.tenant_id"
        )
    );
    // Stable sort: equal keys keep racer order.
    order.sort_by_key(|(t, rank, _)| (*t, *rank));
    let mut steps: Vec<String> = order.into_iter().map(|(_, _, n)| n).collect();
    steps.push("counts".into());
    let _ = writeln!(out, "permutation {}", steps.join(" "));
    Ok(out)
}

/// Whether a call releases locks other sessions may wait for.
fn releases_locks(call: &StoreCall) -> bool {
    matches!(
        call,
        StoreCall::Commit | StoreCall::Rollback | StoreCall::RollbackToSavepoint { .. }
    )
}

/// Whether a call can wait for another session's lock: statements that touch rows or take
/// the barrier's lock; transaction control never waits here.
fn can_wait(call: &StoreCall) -> bool {
    !matches!(
        call,
        StoreCall::Begin
            | StoreCall::Savepoint { .. }
            | StoreCall::ReleaseSavepoint { .. }
            | StoreCall::RollbackToSavepoint { .. }
            | StoreCall::Commit
            | StoreCall::Rollback
    )
}

/// Whether a call only reads (or waits on a shared lock): several such calls released at once
/// cannot change each other's outcome.
fn reads_only(call: &StoreCall) -> bool {
    matches!(
        call,
        StoreCall::FindReceipt { .. }
            | StoreCall::FindReceiptAndTicket { .. }
            | StoreCall::FindTicket { .. }
            | StoreCall::Barrier
    )
}

/// The position of every racer step in the permutation, as `(time µs, rank)`; ties keep
/// controller events (rank 0, 1) before racer steps (rank 2 and up).
///
/// A step that was blocked (in flight while another session released locks) is placed right
/// before the release that let it through, after everything the holder did first, so the
/// tester sees it wait for that release; the session's next step goes after the release.
/// Every other step is placed where it returned, which is the order the server executed it:
/// two statements in flight at once are ordered by who got through first. Writes held by the
/// barrier are the exception: released together, the server may let either through first, so
/// only the one that returned first is issued before the release and the others right after
/// it, in the order they returned, so the replay has the recorded winner.
fn permutation_keys(run: &ScenarioRun, released_us: u64) -> Vec<Vec<(u64, u16)>> {
    // `s` may have waited for a release issued at `from` that returned at `to` (the server
    // releases the locks somewhere inside that interval): `s` was issued before the release
    // returned and returned after it was issued.
    let overlaps =
        |s: &Step, from: u64, to: u64| s.started_us < to.max(from + 1) && from <= s.finished_us;
    let at_barrier = |s: &Step| s.started_us < released_us && s.finished_us >= released_us;
    // Writes held by the barrier, by the time they returned.
    let mut held_writes: Vec<(u64, usize, usize)> = Vec::new();
    for (i, r) in run.racers.iter().enumerate() {
        for (j, s) in r.steps.iter().enumerate() {
            if at_barrier(s) && !reads_only(&s.call) {
                held_writes.push((s.finished_us, i, j));
            }
        }
    }
    held_writes.sort();
    let mut keys: Vec<Vec<(u64, u16)>> = run
        .racers
        .iter()
        .enumerate()
        .map(|(i, r)| {
            r.steps
                .iter()
                .enumerate()
                .map(
                    |(j, s)| match held_writes.iter().position(|w| (w.1, w.2) == (i, j)) {
                        Some(0) => (s.started_us, 2),
                        // Right after the release, in the order they returned.
                        Some(k) => (released_us, 2 + u16::try_from(k).unwrap_or(u16::MAX - 2)),
                        // Where it returned; a blocked step is moved by the passes below.
                        None => (s.finished_us, 2),
                    },
                )
                .collect()
        })
        .collect();
    // A session's next step must come after the release that unblocked its previous one (a
    // client sees a COMMIT return after the server has already woken the waiters, so return
    // times alone can put a waiter's next step first), and after its own previous step.
    // Repeat until no key moves (each pass reads the keys the previous one left), bounded.
    for _ in 0..64 {
        let before = keys.clone();
        let release_keys: Vec<((u64, u16), usize, u64, u64)> =
            std::iter::once(((released_us, 1), usize::MAX, released_us, released_us))
                .chain(run.racers.iter().enumerate().flat_map(|(i, r)| {
                    let keys = &keys;
                    r.steps
                        .iter()
                        .enumerate()
                        .filter(|(_, s)| releases_locks(&s.call))
                        .map(move |(j, s)| (keys[i][j], i, s.started_us, s.finished_us))
                }))
                .collect();
        for (i, r) in run.racers.iter().enumerate() {
            let mut floor = (0u64, 0u16);
            for (j, s) in r.steps.iter().enumerate() {
                let held = held_writes.iter().any(|w| (w.1, w.2) == (i, j));
                // The release that let a blocked step through is one of those in flight while
                // it waited; the step goes right before the last of them (after everything
                // the holder did first; if that was not the one it waited for, the replay
                // meets the holder's committed row instead of waiting for it, with the same
                // result), and the session's next step right after it.
                let unblocked_by = release_keys
                    .iter()
                    .filter(|(_, who, from, to)| {
                        can_wait(&s.call) && *who != i && overlaps(s, *from, *to)
                    })
                    .map(|(k, ..)| *k)
                    .max();
                if let (Some(k), false) = (unblocked_by, held) {
                    keys[i][j] = (k.0.saturating_sub(1), 2);
                }
                if keys[i][j] <= floor {
                    keys[i][j] = (floor.0 + 1, 2);
                }
                floor = keys[i][j];
                if let Some(k) = unblocked_by {
                    if k >= floor {
                        floor = (k.0 + 1, 2);
                    }
                }
            }
        }
        if keys == before {
            break;
        }
    }
    keys
}

fn step_name(session: &str, index: usize, step: &Step) -> String {
    let op = step.what.split(" -> ").next().unwrap_or("step");
    format!("{session}_{:02}_{}", index + 1, ident(op))
}

/// Writes `run`'s spec into `dir` (created if missing) as [`file_name`]; returns the path.
///
/// Will return `Err` when the run cannot be exported or the file cannot be written.
pub fn export(run: &ScenarioRun, dir: &Path) -> Result<PathBuf, SpecError> {
    let text = render(run)?;
    let path = dir.join(file_name(run));
    std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&path, text))
        .map_err(|source| SpecError::Write {
            path: path.clone(),
            source,
        })?;
    Ok(path)
}
