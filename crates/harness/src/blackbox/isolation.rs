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
//!   (the same SQL text the store prepares, [`ticketflow_core::store::postgres::call_sql`]);
//! - an `observer` session that counts rows at the end;
//! - one `permutation`: the recorded order in which statements were issued.
//!
//! The isolation tester runs the permutation, noticing on its own when a step blocks on a
//! lock and going on with the next session, so the replay follows the recorded interleaving
//! without any timing. Run it with `isolationtester "dbname=… host=…" < FILE.spec` against an
//! empty database.
//!
//! A failing schedule of a black-box run through the interposer ([`render_schedule`]) is
//! exported too: one session per racer (per racer and server session, when a racer used
//! several), one step per statement the service sent, its parameters inlined as literals, and
//! the permutation in the schedule's order. The service's schema is not known, so `setup`
//! and `teardown` are left as comments: run it against a copy of the service's database.

use std::fmt::Write as _;
use std::path::PathBuf;

use crate::scenario::format::LockMode;
use crate::scenario::racer::ADVISORY_KEY;
use crate::scenario::timeline::Step;
use crate::scenario::{Evidence, RunSetting, ScenarioRun};
use ticketflow_core::store::call::StoreCall;
use ticketflow_core::store::migrate;
use ticketflow_core::store::postgres::{call_sql, IsolationLevel};

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
    /// A black-box run whose schedule has no PostgreSQL step has nothing to export.
    #[error("scenario {scenario}: the schedule has no PostgreSQL step (its store steps were all Redis, or none was taken)")]
    NoPostgresSteps {
        /// Scenario name.
        scenario: String,
    },
    /// A statement or parameter was cut for the evidence, so the step cannot be replayed.
    #[error("scenario {scenario}: step {step}'s {what} was cut at {limit} characters for the evidence and cannot be replayed", limit = crate::interpose::hub::TEXT_LIMIT)]
    Clipped {
        /// Scenario name.
        scenario: String,
        /// The step's place in the schedule, from 1.
        step: usize,
        /// `statement` or `parameter N`.
        what: String,
    },
    /// A statement cannot be written as a step: a placeholder without a parameter, or a brace
    /// outside a string literal (the tester's block ends at the first `}`).
    #[error("scenario {scenario}: step {step} cannot be written as a spec step: {why}")]
    Statement {
        /// Scenario name.
        scenario: String,
        /// The step's place in the schedule, from 1.
        step: usize,
        /// What is wrong.
        #[source]
        why: StatementError,
    },
    /// Writing the file failed, or was refused (a symlink, a foreign file, a name that is
    /// not a plain file name: [`crate::outputs::OutputError`]).
    #[error(transparent)]
    Write(#[from] crate::outputs::OutputError),
}

/// Why a statement cannot be written as a spec step ([`SpecError::Statement`]).
#[derive(Debug, thiserror::Error)]
pub enum StatementError {
    /// A brace outside a standard or escape string literal (the tester's block ends at the
    /// first `}`).
    #[error("a brace inside {0}, which a spec block cannot hold")]
    Brace(&'static str),
    /// A string literal or dollar-quoted string with no end.
    #[error("an unterminated {0}")]
    Unterminated(&'static str),
    /// A `$N` placeholder whose number does not fit in a `usize`.
    #[error("a placeholder number out of range")]
    PlaceholderRange,
    /// A `$N` placeholder with no parameter sent for it.
    #[error("placeholder ${n} has no parameter ({sent} sent)")]
    NoParameter {
        /// The placeholder's number.
        n: usize,
        /// How many parameters were sent.
        sent: usize,
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
/// literals carry none ([`ticketflow_core::store::postgres::quote_literal`] escapes them) and SQL
/// text with a brace is refused by [`render`].
fn block(sql: &str) -> String {
    format!("{{ {}; }}", sql.trim_end_matches(';'))
}

/// The file name an exported run gets: `SCENARIO.ISOLATION.spec`, e.g.
/// `a-same-key-same-body.read-committed.spec`.
pub fn file_name(run: &ScenarioRun) -> String {
    let level = match run.setting {
        RunSetting::Postgres { isolation } => crate::argv::isolation_value(isolation),
        RunSetting::Sqlite { .. } => "sqlite",
    };
    format!("{}.{}.spec", run.scenario, level)
}

/// Renders `run` as an isolation-tester spec.
///
/// Will return `Err` when `run` is not a PostgreSQL run with evidence.
///
/// Long because it writes one spec top to bottom (header, setup, teardown, sessions, observer,
/// permutation), each part from the same run record.
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

/// Writes `run`'s spec into the output folder `out` (created if missing) as [`file_name`],
/// confined to it ([`crate::outputs::confine`]); returns the path.
///
/// Will return `Err` when the run cannot be exported or the file cannot be written
/// ([`SpecError::Write`]: also a symlink or a foreign file in the way).
pub fn export(
    run: &ScenarioRun,
    out: &mut crate::outputs::OutputDir,
) -> Result<PathBuf, SpecError> {
    let text = render(run)?;
    Ok(out.write(&file_name(run), text.as_bytes())?)
}

/// One piece of a statement as [`scan`] reads it.
#[derive(Debug, PartialEq)]
enum Piece {
    /// Text kept as it is (string literals already made brace-free).
    Text(String),
    /// A `$N` placeholder.
    Placeholder(usize),
    /// A `;` between statements.
    End,
}

/// Reads `sql` as PostgreSQL's lexer does for what matters here: string literals (standard,
/// `E'…'` escape strings, dollar-quoted), quoted identifiers, comments, `$N` placeholders and
/// the `;` between statements. A standard or escape string literal holding a brace is
/// rewritten as an escape string with `\x7b`/`\x7d` (the same value), so the text holds no
/// brace inside literals.
///
/// Will return `Err` for a brace anywhere else (a quoted identifier, a dollar-quoted string,
/// a comment, plain SQL) or an unterminated literal.
///
/// Long because it is one lexer loop over the characters: its states (literal, identifier,
/// comment, dollar quote) share the position and the output.
fn scan(sql: &str) -> Result<Vec<Piece>, StatementError> {
    let b: Vec<char> = sql.chars().collect();
    let mut out: Vec<Piece> = Vec::new();
    let mut text = String::new();
    let mut i = 0;
    let brace = |what: &'static str| Err(StatementError::Brace(what));
    while i < b.len() {
        let c = b[i];
        let prev_word = i > 0 && (b[i - 1].is_alphanumeric() || b[i - 1] == '_');
        match c {
            '\'' => {
                // E'…' when the quote follows a lone E.
                let escape = text.ends_with(['E', 'e'])
                    && !text[..text.len() - 1].ends_with(|p: char| p.is_alphanumeric() || p == '_');
                let mut value = String::new();
                let mut j = i + 1;
                loop {
                    match b.get(j) {
                        None => return Err(StatementError::Unterminated("string literal")),
                        Some('\'') if b.get(j + 1) == Some(&'\'') => {
                            value.push_str("''");
                            j += 2;
                        }
                        Some('\'') => break,
                        Some('\\') if escape => {
                            value.push('\\');
                            if let Some(&n) = b.get(j + 1) {
                                value.push(n);
                            }
                            j += 2;
                        }
                        Some(&ch) => {
                            value.push(ch);
                            j += 1;
                        }
                    }
                }
                if !value.contains(['{', '}']) {
                    text.push('\'');
                    text.push_str(&value);
                    text.push('\'');
                } else if escape {
                    text.push('\'');
                    text.push_str(&value.replace('{', "\\x7b").replace('}', "\\x7d"));
                    text.push('\'');
                } else {
                    // A standard literal's value (quotes undoubled) as an escape string.
                    text.push_str(&ticketflow_core::store::postgres::quote_literal(
                        &value.replace("''", "'"),
                    ));
                }
                i = j + 1;
            }
            '"' => {
                let mut j = i + 1;
                while j < b.len() && !(b[j] == '"' && b.get(j + 1) != Some(&'"')) {
                    j += if b[j] == '"' { 2 } else { 1 };
                }
                let ident: String = b[i..(j + 1).min(b.len())].iter().collect();
                if ident.contains(['{', '}']) {
                    return brace("a quoted identifier");
                }
                text.push_str(&ident);
                i = j + 1;
            }
            '-' if b.get(i + 1) == Some(&'-') => {
                let j = b[i..]
                    .iter()
                    .position(|&x| x == '\n')
                    .map_or(b.len(), |p| i + p);
                let comment: String = b[i..j].iter().collect();
                if comment.contains(['{', '}']) {
                    return brace("a comment");
                }
                text.push_str(&comment);
                i = j;
            }
            '/' if b.get(i + 1) == Some(&'*') => {
                let mut depth = 0usize;
                let mut j = i;
                while j < b.len() {
                    if b[j] == '/' && b.get(j + 1) == Some(&'*') {
                        depth += 1;
                        j += 2;
                    } else if b[j] == '*' && b.get(j + 1) == Some(&'/') {
                        depth -= 1;
                        j += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        j += 1;
                    }
                }
                let comment: String = b[i..j.min(b.len())].iter().collect();
                if comment.contains(['{', '}']) {
                    return brace("a comment");
                }
                text.push_str(&comment);
                i = j;
            }
            '$' if !prev_word => {
                let digits: String = b[i + 1..]
                    .iter()
                    .take_while(|d| d.is_ascii_digit())
                    .collect();
                if !digits.is_empty() {
                    if !text.is_empty() {
                        out.push(Piece::Text(std::mem::take(&mut text)));
                    }
                    out.push(Piece::Placeholder(
                        digits
                            .parse()
                            .map_err(|_| StatementError::PlaceholderRange)?,
                    ));
                    i += 1 + digits.chars().count();
                    continue;
                }
                // A dollar quote: $tag$ … $tag$ (the tag may be empty).
                let tag_len = b[i + 1..]
                    .iter()
                    .take_while(|d| d.is_alphanumeric() || **d == '_')
                    .count();
                if b.get(i + 1 + tag_len) != Some(&'$') {
                    text.push(c);
                    i += 1;
                    continue;
                }
                let tag: String = b[i..i + tag_len + 2].iter().collect();
                let rest: String = b[i + tag_len + 2..].iter().collect();
                let Some(close) = rest.find(&tag) else {
                    return Err(StatementError::Unterminated("dollar-quoted string"));
                };
                let quoted = format!("{tag}{}{tag}", &rest[..close]);
                if quoted.contains(['{', '}']) {
                    return brace("a dollar-quoted string");
                }
                i += quoted.chars().count();
                text.push_str(&quoted);
            }
            ';' => {
                if !text.is_empty() {
                    out.push(Piece::Text(std::mem::take(&mut text)));
                }
                out.push(Piece::End);
                i += 1;
            }
            '{' | '}' => return brace("the statement's text"),
            c => {
                text.push(c);
                i += 1;
            }
        }
    }
    if !text.is_empty() {
        out.push(Piece::Text(text));
    }
    Ok(out)
}

/// A parameter as the interposer shows it ([`crate::interpose::Step::params`]) as a SQL
/// literal: `NULL` for a null, a hex bytea literal for a binary-format value shown in hex
/// (`\x…`, marked by a comment: the column's type may need the value converted), else a
/// string literal ([`ticketflow_core::store::postgres::quote_literal`]), whose unknown type PostgreSQL
/// resolves as it would the parameter's.
fn literal(p: &str) -> String {
    if p == "NULL" {
        return "NULL".into();
    }
    if is_binary(p) {
        return format!("'{p}'::bytea /* a binary-format parameter, in hex */");
    }
    ticketflow_core::store::postgres::quote_literal(p)
}

/// Whether a parameter is a binary-format value the interposer showed in hex (`\x0a1b`).
fn is_binary(p: &str) -> bool {
    p.strip_prefix("\\x")
        .is_some_and(|h| !h.is_empty() && h.chars().all(|c| c.is_ascii_hexdigit()))
}

/// `sql` with each `$N` replaced by the literal of its parameter. The parameters of several
/// statements executed in one step come one after the other ([`crate::interpose::Step`]),
/// each statement taking as many as its highest placeholder.
///
/// Will return `Err` for what [`scan`] refuses, or a placeholder without a parameter.
fn inline_params(sql: &str, params: &[String]) -> Result<String, StatementError> {
    let pieces = scan(sql)?;
    // The statements, each with the highest placeholder it uses.
    let mut statements: Vec<(Vec<&Piece>, usize)> = vec![(Vec::new(), 0)];
    for p in &pieces {
        let last = statements.last_mut().expect("one statement at least");
        last.0.push(p);
        match p {
            Piece::Placeholder(n) => last.1 = last.1.max(*n),
            Piece::End => statements.push((Vec::new(), 0)),
            Piece::Text(_) => {}
        }
    }
    let total: usize = statements.iter().map(|(_, m)| m).sum();
    // One statement, or parameters that do not split by statement: all of them for each.
    let split = statements.iter().filter(|(_, m)| *m > 0).count() > 1 && total == params.len();
    let mut out = String::with_capacity(sql.len() + 64);
    let mut base = 0;
    for (pieces, highest) in &statements {
        for p in pieces {
            match p {
                Piece::Text(t) => out.push_str(t),
                Piece::End => out.push(';'),
                Piece::Placeholder(n) => {
                    let at = if split { base + n - 1 } else { n - 1 };
                    match params.get(at) {
                        Some(v) => out.push_str(&literal(v)),
                        None => {
                            return Err(StatementError::NoParameter {
                                n: *n,
                                sent: params.len(),
                            })
                        }
                    }
                }
            }
        }
        if split {
            base += highest;
        }
    }
    Ok(out)
}

/// An isolation-tester spec written for a failing PostgreSQL run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ExportedSpec {
    /// Scenario name.
    pub scenario: String,
    /// The run's setting label (`READ COMMITTED`, …).
    pub setting: String,
    /// Where it was written.
    pub path: PathBuf,
}

/// One tester session of a schedule's spec: its key (wave, racer letter, server session), its
/// name, and its steps as (name, SQL, comment).
type TesterSession = ((u32, char, u64), String, Vec<(String, String, String)>);

/// The file name a failing schedule's spec gets: `SCENARIO.schedule-ID.spec`, `/` in the id
/// (between waves) as `-`, anything but letters, digits, `-`, `_` and `.` in the name as `-`.
pub fn schedule_file_name(scenario: &str, schedule_id: &str) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                    c
                } else {
                    '-'
                }
            })
            .collect()
    };
    format!("{}.schedule-{}.spec", clean(scenario), clean(schedule_id))
}

/// Renders the PostgreSQL steps of an interposed black-box run (a failing schedule) as an
/// isolation-tester spec: a comment header (scenario, schedule, verdict, reason; `setup` and
/// `teardown` as comments, the service's schema being unknown); one `session` per racer (per
/// racer and server session when a racer used several), named by its letter and name
/// (`a_r_1`); one `step` per statement it sent, named by the session, its place and the
/// statement's first word (`a_r_1_02_insert`), `BEGIN` and `COMMIT` included, with the
/// parameters inlined as literals and the store's answer in a comment; Redis steps as
/// comments; one `permutation` of every step in the schedule's order.
///
/// Will return `Err` ([`SpecError::NoPostgresSteps`]) when the run took no PostgreSQL step,
/// ([`SpecError::Clipped`]) when a statement or parameter was cut for the evidence, or
/// ([`SpecError::Statement`]) when a statement cannot be a spec step. `${NAME}` secrets are
/// masked ([`crate::contain::mask`]).
pub fn render_schedule(run: &crate::blackbox::TargetRun) -> Result<String, SpecError> {
    use crate::interpose::StoreKind;
    let steps = super::diagram::scheduled_steps(run);
    let scenario = run.scenario.clone();
    let pg: Vec<_> = steps
        .iter()
        .filter(|s| s.step.store == StoreKind::Postgres)
        .collect();
    if pg.is_empty() {
        return Err(SpecError::NoPostgresSteps { scenario });
    }
    let (sessions, permutation, binary) = tester_sessions(&pg, scenario)?;
    let mut out = schedule_header(run, &steps, binary);
    out.push('\n');
    for (_, session, list) in &sessions {
        let _ = writeln!(out, "session {session}");
        for (name, sql, note) in list {
            let _ = writeln!(out, "# {}", comment(note));
            if sql.contains('\n') {
                let _ = writeln!(
                    out,
                    "step {name}\n{{\n{}\n}}",
                    sql.trim_end().trim_end_matches(';')
                );
            } else {
                let _ = writeln!(out, "step {name} {}", block(sql));
            }
        }
        out.push('\n');
    }
    let _ = writeln!(out, "permutation {}", permutation.join(" "));
    // A statement may carry a scenario's secret (a token the service stored): masked, as in
    // every other file the tool writes.
    Ok(crate::contain::mask(&out).into_owned())
}

/// The tester sessions of a schedule's PostgreSQL steps `pg` (one per wave, racer and server
/// session, in order of first step), the permutation of their step names, and how many
/// parameters were in binary format.
///
/// Will return `Err` as [`render_schedule`] says.
fn tester_sessions(
    pg: &[&super::diagram::ScheduledStep<'_>],
    scenario: String,
) -> Result<(Vec<TesterSession>, Vec<String>, usize), SpecError> {
    use crate::interpose::hub::was_clipped;
    let mut sessions: Vec<TesterSession> = Vec::new();
    let many = |wave: u32, letter: char| {
        pg.iter()
            .filter(|s| s.wave == wave && s.letter == letter)
            .map(|s| s.step.session)
            .collect::<std::collections::BTreeSet<_>>()
            .len()
            > 1
    };
    let mut permutation: Vec<String> = Vec::new();
    let mut binary = 0;
    for s in pg {
        let key = (s.wave, s.letter, s.step.session);
        if !sessions.iter().any(|(k, ..)| *k == key) {
            let mut name = format!("{}", s.letter.to_ascii_lowercase());
            if s.many_waves {
                name = format!("w{}{name}", s.wave);
            }
            if s.letter.is_ascii_lowercase() {
                // Racers 27 to 52 (`a` … `z` in the id) must not meet racers 1 to 26.
                name.push('2');
            }
            name = format!("{name}_{}", ident(s.name));
            if many(s.wave, s.letter) {
                name = format!("{name}_s{}", s.step.session);
            }
            sessions.push((key, name, Vec::new()));
        }
        let (_, session, list) = sessions
            .iter_mut()
            .find(|(k, ..)| *k == key)
            .expect("added above");
        if was_clipped(&s.step.text) {
            return Err(SpecError::Clipped {
                scenario,
                step: s.number,
                what: "statement".into(),
            });
        }
        if let Some(n) = s
            .step
            .params
            .iter()
            .position(|p| was_clipped(p) || (p.starts_with("\\x") && p.ends_with('…')))
        {
            return Err(SpecError::Clipped {
                scenario,
                step: s.number,
                what: format!("parameter {}", n + 1),
            });
        }
        binary += s.step.params.iter().filter(|p| is_binary(p)).count();
        let sql =
            inline_params(&s.step.text, &s.step.params).map_err(|why| SpecError::Statement {
                scenario: scenario.clone(),
                step: s.number,
                why,
            })?;
        let verb = s.step.text.split_whitespace().next().unwrap_or("step");
        let verb: String = ident(verb).chars().take(16).collect();
        let name = format!("{session}_{:02}_{verb}", list.len() + 1);
        let note = format!(
            "schedule step {} ({}: {}); the store answered {}{}{}",
            s.number,
            s.letter,
            s.name,
            s.step.result,
            if s.step.blocked {
                "; it waited for a lock"
            } else {
                ""
            },
            if s.step.quiescent {
                ""
            } else {
                "; taken without quiescence"
            }
        );
        permutation.push(name.clone());
        list.push((name, sql, note));
    }

    Ok((sessions, permutation, binary))
}

/// The comment header of a schedule's spec: what it was exported from, how to run it, the
/// binary parameters and the schedule's Redis steps.
fn schedule_header(
    run: &crate::blackbox::TargetRun,
    steps: &[super::diagram::ScheduledStep<'_>],
    binary: usize,
) -> String {
    use crate::interpose::StoreKind;
    let mut out = String::new();
    let id = run
        .evidence
        .as_ref()
        .and_then(|e| e.schedule_id.as_deref())
        .unwrap_or("?");
    let _ = writeln!(
        out,
        "# Exported by ticketflow {} from black-box scenario `{}` ({}), schedule {id}, verdict {}.",
        env!("CARGO_PKG_VERSION"),
        run.scenario,
        run.file,
        run.verdict
    );
    if let Some(reason) = &run.reason {
        let _ = writeln!(out, "# Reason: {}", comment(reason));
    }
    let _ = writeln!(
        out,
        "# The statements the service sent to PostgreSQL through the interposer, one step each, in\n\
         # the order the schedule released them, their parameters inlined as literals.\n\
         # The service's schema is not known here, so setup and teardown are left as comments: run\n\
         # it against a copy of the service's database (its migrations applied, no rows of this run):\n\
         #   isolationtester \"host=127.0.0.1 user=postgres dbname=COPY_OF_THE_SERVICE_DB\" < {}\n\
         # setup {{ ... the service's schema ... }}\n\
         # teardown {{ ... }}",
        schedule_file_name(&run.scenario, id)
    );
    if binary > 0 {
        let _ = writeln!(
            out,
            "# {binary} parameter(s) were sent in binary format and are inlined as hex bytea literals:\n\
             # convert them to their column's type before running it."
        );
    }
    let redis: Vec<String> = steps
        .iter()
        .filter(|s| s.step.store == StoreKind::Redis)
        .map(|s| {
            format!(
                "#   {}. {}: {} → {}",
                s.number,
                s.letter,
                comment(&crate::blackbox::excerpt(&s.step.text, 100)),
                comment(&s.step.result)
            )
        })
        .collect();
    if !redis.is_empty() {
        let _ = writeln!(
            out,
            "# Redis steps of the schedule, not part of this spec:\n{}",
            redis.join("\n")
        );
    }
    out
}

/// `text` on one line, for a `#` comment.
fn comment(text: &str) -> String {
    text.replace(['\n', '\r'], " ")
}

/// Writes the spec of `outcome`'s failing schedule, when it has one, into the output folder
/// `out` (created if missing) as [`schedule_file_name`] and records the path in it; returns
/// what was written.
///
/// Will return `Err` ([`SpecError::Write`]) when the file cannot be written (or is refused:
/// a symlink, a foreign file); the reason is also recorded as the schedule's missing spec.
pub fn export_schedule(
    outcome: &mut crate::blackbox::TargetOutcome,
    out: &mut crate::outputs::OutputDir,
) -> Result<Option<ExportedSpec>, SpecError> {
    let Some(f) = outcome.failing_schedule.as_mut() else {
        return Ok(None);
    };
    let Some(text) = &f.isolation_spec else {
        return Ok(None);
    };
    match out.write(
        &schedule_file_name(&outcome.scenario, &f.schedule_id),
        text.as_bytes(),
    ) {
        Ok(path) => {
            f.isolation_spec_path = Some(path.clone());
            Ok(Some(ExportedSpec {
                scenario: outcome.scenario.clone(),
                setting: format!("schedule {}", f.schedule_id),
                path,
            }))
        }
        Err(source) => {
            let err = SpecError::Write(source);
            f.isolation_spec_missing = Some(err.to_string());
            Err(err)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(p: &[&str]) -> Vec<String> {
        p.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parameters_are_inlined_as_literals_and_placeholders_in_literals_are_left() {
        let sql = "INSERT INTO t (k, v, n) VALUES ($1, $2, $3) -- not $4\nRETURNING '$1', \"$2\"";
        assert_eq!(
            inline_params(sql, &params(&["it's", "NULL", "10"])).unwrap(),
            "INSERT INTO t (k, v, n) VALUES ('it''s', NULL, '10') -- not $4\nRETURNING '$1', \"$2\""
        );
        // $10 is not $1 followed by 0; a dollar-quoted body is left alone.
        let ten: Vec<String> = (1..=10).map(|i| format!("v{i}")).collect();
        assert_eq!(
            inline_params("SELECT $10, $1, $x$ $1 $x$", &ten).unwrap(),
            "SELECT 'v10', 'v1', $x$ $1 $x$"
        );
        // Binary values in hex are bytea literals, marked.
        assert_eq!(
            inline_params("SELECT $1", &params(&["\\x00ff"])).unwrap(),
            "SELECT '\\x00ff'::bytea /* a binary-format parameter, in hex */"
        );
        assert!(inline_params("SELECT $2", &params(&["a"]))
            .unwrap_err()
            .to_string()
            .contains("$2 has no parameter"));
    }

    #[test]
    fn the_parameters_of_several_statements_in_one_step_are_split_by_statement() {
        assert_eq!(
            inline_params(
                "SELECT $1; UPDATE t SET a = $1, b = $2",
                &params(&["x", "y", "z"])
            )
            .unwrap(),
            "SELECT 'x'; UPDATE t SET a = 'y', b = 'z'"
        );
    }

    #[test]
    fn braces_leave_no_trace_in_a_step_block_or_the_statement_is_refused() {
        // A literal with braces (a JSON body) becomes an escape string without them.
        let got = inline_params("SELECT '{\"a\": 1}'::jsonb, $1", &params(&["{}"])).unwrap();
        assert!(!got.contains(['{', '}']), "{got}");
        assert_eq!(got, "SELECT E'\\x7b\"a\": 1\\x7d'::jsonb, E'\\x7b\\x7d'");
        let got = inline_params("SELECT E'{\\'}'", &[]).unwrap();
        assert!(!got.contains(['{', '}']), "{got}");
        // Anywhere else a brace cannot be rewritten without changing the statement.
        for sql in [
            "SELECT $q${}$q$",
            "SELECT 1 /* { */",
            "SELECT \"a{\"",
            "SELECT {",
        ] {
            assert!(inline_params(sql, &[]).is_err(), "{sql}");
        }
        assert!(inline_params("SELECT 'open", &[]).is_err());
    }

    #[test]
    fn a_schedule_file_name_keeps_only_safe_characters() {
        assert_eq!(
            schedule_file_name("k two/racers", "AAB/BA"),
            "k-two-racers.schedule-AAB-BA.spec"
        );
    }
}
