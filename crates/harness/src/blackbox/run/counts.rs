//! The count queries: bound at set-up, read after the waves (on the target database, or on
//! Redis for Redis counts).

use crate::blackbox::format::request::vars_for;
use crate::blackbox::format::{CountExpectation, TargetScenario};
use crate::blackbox::service::TargetError;
use crate::blackbox::template::{self};
use crate::blackbox::CountSeen;

/// The SQL a count query runs: its value as a `bigint`, each placeholder a text parameter.
pub(super) fn count_sql(q: &crate::blackbox::format::CountQuery) -> String {
    format!("SELECT (({}))::bigint", q.bound_sql)
}

/// Prepares every count query the scenario expects against the target database before
/// anything is sent, so a typo, a missing table or a parameter the SQL cannot take as text is
/// a setup error naming the query's line, not a FAIL after the race. Preparing executes
/// nothing.
///
/// Will return `Err` ([`TargetError::Setup`]) for the first query the server refuses.
pub(super) fn prepare_counts(
    scenario: &TargetScenario,
    monitor: &mut postgres::Client,
) -> Result<(), TargetError> {
    let used: std::collections::BTreeSet<&str> = scenario
        .counts
        .iter()
        .flat_map(|e| e.values.keys().map(String::as_str))
        .collect();
    // A model-judged scenario reads every query.
    let model = scenario.model.is_some();
    for q in scenario
        .target
        .counts
        .iter()
        .filter(|q| (model || used.contains(q.name.as_str())) && q.redis.is_none())
    {
        let types = vec![postgres::types::Type::TEXT; q.params.len()];
        if let Err(e) = monitor.prepare_typed(&count_sql(q), &types) {
            return Err(TargetError::Setup(format!(
                "{}: count query {:?} cannot run on the target database: {}{}",
                q.origin,
                q.name,
                e.as_db_error()
                    .map(|d| d.message().to_string())
                    .unwrap_or_else(|| e.to_string()),
                e.code()
                    .map(|c| format!(" (SQLSTATE {})", c.code()))
                    .unwrap_or_default()
            )));
        }
    }
    Ok(())
}

/// Runs one SQL count (`sql`, from [`count_sql`], with its text parameters) in a transaction of
/// its own started `READ ONLY` (`START TRANSACTION READ ONLY`, then `SET LOCAL
/// statement_timeout` = `timeout_ms`), and rolls it back: a count that writes, directly or
/// through a function it calls, is refused by PostgreSQL (SQLSTATE 25006
/// `read_only_sql_transaction`) and changes nothing; one still running after `timeout_ms` is
/// cancelled (SQLSTATE 57014). NULL counts as 0.
///
/// `READ ONLY` does not stop a function whose effect lies outside the transaction
/// (`pg_terminate_backend`, `pg_cancel_backend`, `dblink`, `pg_sleep` up to the timeout):
/// only the privileges of the URL's role do.
///
/// Will return `Err` with the server's error, or a connection error.
pub(super) fn read_count(
    client: &mut postgres::Client,
    sql: &str,
    params: &[&(dyn postgres::types::ToSql + Sync)],
    timeout_ms: u64,
) -> Result<i64, postgres::Error> {
    let mut tx = client.build_transaction().read_only(true).start()?;
    tx.batch_execute(&format!("SET LOCAL statement_timeout = {timeout_ms}"))?;
    let value = tx
        .query_one(sql, params)?
        .get::<_, Option<i64>>(0)
        .unwrap_or(0);
    tx.rollback()?;
    Ok(value)
}

/// A count's error in words: the server's message and SQLSTATE, and for a write refused by
/// the read-only transaction (25006) or a cancel at the count's timeout (57014), why.
pub(super) fn count_error(err: &postgres::Error, t: &crate::blackbox::format::Target) -> String {
    let Some(d) = err.as_db_error() else {
        return err.to_string();
    };
    let code = d.code();
    let why = if *code == postgres::error::SqlState::READ_ONLY_SQL_TRANSACTION {
        " — count queries run in a READ ONLY transaction and must not write, not even through a function they call"
            .to_string()
    } else if *code == postgres::error::SqlState::QUERY_CANCELED {
        format!(
            " — a count query may run count_timeout_ms = {} ms",
            t.count_timeout_ms
        )
    } else {
        String::new()
    };
    format!("{} (SQLSTATE {}){why}", d.message(), code.code())
}

/// Runs each count of `expectations` with its bindings: SQL on the target database (`monitor`), each in
/// its own read-only transaction with its timeout ([`read_count`]); Redis counts on the
/// runner's direct connection to `redis_url` (`redis`).
pub(super) fn count_rows(
    scenario: &TargetScenario,
    expectations: &[CountExpectation],
    mut monitor: Option<&mut postgres::Client>,
    mut redis: Option<&mut redis::Connection>,
    run_id: &str,
) -> Vec<CountSeen> {
    let t = &scenario.target;
    let mut out = Vec::new();
    for e in expectations {
        // Bind {scope} and {key} as the racers sent them.
        let racer = scenario.racers.iter().find(|r| {
            e.key.as_ref().map_or(true, |k| &r.key == k)
                && e.scope
                    .as_ref()
                    .map_or(true, |s| r.scope.as_ref() == Some(s))
        });
        let vars = match racer {
            Some(r) => vars_for(scenario, r, run_id),
            None => [("run", run_id.to_string())].into(),
        };
        for (name, expected) in &e.values {
            let q = t
                .counts
                .iter()
                .find(|q| &q.name == name)
                .expect("validated at load");
            if let Some(words) = &q.redis {
                let bound: Vec<String> = words.iter().map(|w| template::expand(w, &vars)).collect();
                let counted = match redis.as_deref_mut() {
                    Some(conn) => crate::blackbox::redis_store::run_count(conn, &bound),
                    None => Err(crate::blackbox::redis_store::CountError::NoConnection),
                }
                .map_err(|err| format!("count {name:?} failed: {err}"));
                out.push(CountSeen {
                    name: name.clone(),
                    scope: e.scope.clone(),
                    key: e.key.clone(),
                    expected: *expected,
                    counted,
                });
                continue;
            }
            let Some(monitor) = monitor.as_deref_mut() else {
                out.push(CountSeen {
                    name: name.clone(),
                    scope: e.scope.clone(),
                    key: e.key.clone(),
                    expected: *expected,
                    counted: Err(format!("count {name:?} failed: no database connection")),
                });
                continue;
            };
            let params: Vec<String> = q
                .params
                .iter()
                .map(|p| vars.get(p).cloned().unwrap_or_default())
                .collect();
            let refs: Vec<&(dyn postgres::types::ToSql + Sync)> = params
                .iter()
                .map(|p| p as &(dyn postgres::types::ToSql + Sync))
                .collect();
            let counted = read_count(monitor, &count_sql(q), &refs, t.count_timeout_ms)
                .map_err(|err| format!("count {name:?} failed: {}", count_error(&err, t)));
            out.push(CountSeen {
                name: name.clone(),
                scope: e.scope.clone(),
                key: e.key.clone(),
                expected: *expected,
                counted,
            });
        }
    }
    out
}
