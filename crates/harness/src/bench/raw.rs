//! The bare baseline: the statements of each create protocol and of a replay, in the order
//! the protocol sends them, on the bare driver (`postgres::Client` with the same prepared
//! statements, `rusqlite::Connection` with the same cached statements and pragmas), with no
//! fingerprint, validation, JSON building, store trait or retry around them. The statements
//! are the stores' own SQL constants ([`ticketflow_core::store::postgres`], [`ticketflow_core::store::sqlite`]);
//! the payload JSON and fingerprint are constants.

use std::path::Path;

use postgres::{Client, Statement};
use rusqlite::{params, Connection, OptionalExtension};
use uuid::Uuid;

use super::{BenchError, TENANT};
use ticketflow_core::domain::{iso8601, now_utc};
use ticketflow_core::protocol::{Protocol, CREATE_SAVEPOINT};
use ticketflow_core::store::postgres as pg;
use ticketflow_core::store::sqlite::{self as lite, DEFAULT_BUSY_TIMEOUT};

/// A constant fingerprint (64 hex digits) for the baseline's receipts.
const HASH: &str = "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881";
/// A constant `ticket.created` payload of the size the protocol writes.
pub(crate) const PAYLOAD: &str = r#"{"event_id":"00000000-0000-4000-8000-000000000000","occurred_at":"2026-11-29T22:00:00.000000+00:00","payload":{"event_type":"ticket.created","priority":"high","status":"open","title":"Printer jammed"},"tenant_id":"bench","ticket_id":"00000000-0000-4000-8000-000000000000","trace_context":{},"version":1}"#;

/// One operation of a bare throughput row.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    /// Create under a fresh key: the client's n-th.
    Fresh(u64),
    /// Create under this key (taken after its first create: then the replay path runs).
    Key(String),
    /// Replay this existing key.
    Replay(String),
}

/// A bare session.
pub(crate) enum RawSession {
    /// PostgreSQL with the protocol's statements prepared.
    Postgres {
        /// The connection.
        client: Box<Client>,
        /// find receipt, find ticket, insert ticket, insert outbox, insert receipt, claim,
        /// claim and create, find receipt and ticket.
        st: Box<[Statement; 8]>,
    },
    /// SQLite in WAL mode with the store's pragmas.
    Sqlite {
        /// The connection.
        conn: Box<Connection>,
    },
}

fn pg_err(context: &'static str) -> impl Fn(postgres::Error) -> BenchError {
    move |e| BenchError::Store {
        context: context.into(),
        source: Box::new(ticketflow_core::store::postgres::classify(context, e).into()),
    }
}

fn lite_err(context: &'static str) -> impl Fn(rusqlite::Error) -> BenchError {
    move |e| BenchError::Store {
        context: context.into(),
        source: Box::new(ticketflow_core::store::sqlite::classify(context, e).into()),
    }
}

fn is_unique_violation(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _)
        if f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY)
}

impl RawSession {
    /// Connects to an already migrated PostgreSQL database and prepares the statements.
    ///
    /// Will return `Err` if the server is unreachable or a statement does not prepare.
    pub(crate) fn postgres(config: &postgres::Config) -> Result<Self, BenchError> {
        let mut client =
            pg::connect_as(config, pg::SessionRole::Command).map_err(|e| BenchError::Store {
                context: "connect".into(),
                source: Box::new(e.into()),
            })?;
        let mut st = Vec::new();
        for sql in [
            pg::FIND_RECEIPT_SQL,
            pg::FIND_TICKET_SQL,
            pg::INSERT_TICKET_SQL,
            pg::INSERT_OUTBOX_SQL,
            pg::INSERT_RECEIPT_SQL,
            pg::INSERT_RECEIPT_IF_ABSENT_SQL,
            pg::CLAIM_AND_CREATE_SQL,
            pg::FIND_RECEIPT_AND_TICKET_SQL,
        ] {
            st.push(client.prepare(sql).map_err(pg_err("prepare"))?);
        }
        let st: [Statement; 8] = st.try_into().expect("eight statements");
        Ok(RawSession::Postgres {
            client: Box::new(client),
            st: Box::new(st),
        })
    }

    /// Opens an already migrated SQLite file with the store's pragmas (WAL, foreign keys,
    /// `synchronous = NORMAL`, the default busy timeout).
    ///
    /// Will return `Err` if the file cannot be opened.
    pub(crate) fn sqlite(path: &Path) -> Result<Self, BenchError> {
        let conn = Connection::open(path).map_err(lite_err("open"))?;
        conn.busy_timeout(DEFAULT_BUSY_TIMEOUT)
            .map_err(lite_err("busy timeout"))?;
        let _: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(lite_err("journal mode"))?;
        conn.execute_batch("PRAGMA foreign_keys = ON; PRAGMA synchronous = NORMAL;")
            .map_err(lite_err("pragmas"))?;
        Ok(RawSession::Sqlite {
            conn: Box::new(conn),
        })
    }

    /// Creates (or, when the key is taken, replays) the ticket for `key` with `protocol`'s
    /// statements; returns the ticket id.
    ///
    /// Will return `Err` for any database error (nothing is retried).
    pub(crate) fn create(&mut self, protocol: Protocol, key: &str) -> Result<String, BenchError> {
        match self {
            RawSession::Postgres { client, st } => pg_create(client, st, protocol, key),
            RawSession::Sqlite { conn } => lite_create(conn, protocol, key),
        }
    }

    /// Replays an existing key as `protocol` does: the receipt, then its ticket (the
    /// `single-statement` protocol: its one statement on PostgreSQL, the joined read on
    /// SQLite).
    ///
    /// Will return `Err` for a database error or a missing receipt.
    pub(crate) fn replay(&mut self, protocol: Protocol, key: &str) -> Result<(), BenchError> {
        match self {
            RawSession::Postgres { client, st } if protocol == Protocol::SingleStatement => {
                pg_single(client, st, key).map(drop)
            }
            RawSession::Sqlite { conn } if protocol == Protocol::SingleStatement => {
                lite_read_joined(conn, key)?
                    .ok_or_else(|| BenchError::NotConverged(format!("no receipt for {key}")))
                    .map(drop)
            }
            RawSession::Postgres { client, st } => {
                client
                    .batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED")
                    .map_err(pg_err("begin"))?;
                pg_read_winner(client, st, key)?;
                client.batch_execute("COMMIT").map_err(pg_err("commit"))?;
                Ok(())
            }
            RawSession::Sqlite { conn } => lite_read_winner(conn, key).map(drop),
        }
    }
}

fn pg_read_winner(
    client: &mut Client,
    st: &[Statement; 8],
    key: &str,
) -> Result<String, BenchError> {
    let row = client
        .query_opt(&st[0], &[&TENANT, &key])
        .map_err(pg_err("find receipt"))?
        .ok_or_else(|| BenchError::NotConverged(format!("no receipt for {key}")))?;
    let ticket_id: Uuid = row.get(3);
    client
        .query_opt(&st[1], &[&TENANT, &ticket_id])
        .map_err(pg_err("find ticket"))?;
    Ok(ticket_id.to_string())
}

/// The `single-statement` protocol's statement (its own transaction), and the second
/// statement when the key was taken by an in-flight winner; returns the ticket id.
fn pg_single(client: &mut Client, st: &[Statement; 8], key: &str) -> Result<String, BenchError> {
    let (id, event_id, now) = (Uuid::new_v4(), Uuid::new_v4(), now_utc());
    let row = client
        .query_one(
            &st[6],
            &[
                &TENANT,
                &key,
                &HASH,
                &id,
                &now,
                &id,
                &TENANT,
                &"u1",
                &"Printer jammed",
                &"Floor 3 printer shows E-42",
                &"high",
                &"open",
                &1i64,
                &now,
                &now,
                &event_id,
                &id,
                &TENANT,
                &"ticket.created",
                &PAYLOAD,
                &now,
            ],
        )
        .map_err(pg_err("claim and create"))?;
    if row.get::<_, i64>(0) == 1 {
        return Ok(id.to_string());
    }
    if let Some(met) = row.get::<_, Option<Uuid>>(4) {
        return Ok(met.to_string());
    }
    let row = client
        .query_opt(&st[7], &[&TENANT, &key])
        .map_err(pg_err("find receipt and ticket"))?
        .ok_or_else(|| BenchError::NotConverged(format!("no receipt for {key}")))?;
    Ok(row.get::<_, Uuid>(3).to_string())
}

fn pg_create(
    client: &mut Client,
    st: &[Statement; 8],
    protocol: Protocol,
    key: &str,
) -> Result<String, BenchError> {
    if protocol == Protocol::SingleStatement {
        return pg_single(client, st, key);
    }
    client
        .batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED")
        .map_err(pg_err("begin"))?;
    if let Some(row) = client
        .query_opt(&st[0], &[&TENANT, &key])
        .map_err(pg_err("find receipt"))?
    {
        let ticket_id: Uuid = row.get(3);
        client
            .query_opt(&st[1], &[&TENANT, &ticket_id])
            .map_err(pg_err("find ticket"))?;
        client.batch_execute("COMMIT").map_err(pg_err("commit"))?;
        return Ok(ticket_id.to_string());
    }
    let (id, event_id, now) = (Uuid::new_v4(), Uuid::new_v4(), now_utc());
    let version = 1i64;
    let ticket: [&(dyn postgres::types::ToSql + Sync); 10] = [
        &id,
        &TENANT,
        &"u1",
        &"Printer jammed",
        &"Floor 3 printer shows E-42",
        &"high",
        &"open",
        &version,
        &now,
        &now,
    ];
    let event: [&(dyn postgres::types::ToSql + Sync); 6] =
        [&event_id, &id, &TENANT, &"ticket.created", &PAYLOAD, &now];
    let receipt: [&(dyn postgres::types::ToSql + Sync); 5] = [&TENANT, &key, &HASH, &id, &now];
    let winner = match protocol {
        Protocol::Savepoint => {
            client
                .batch_execute(&format!("SAVEPOINT {CREATE_SAVEPOINT}"))
                .map_err(pg_err("savepoint"))?;
            client
                .execute(&st[2], &ticket)
                .map_err(pg_err("insert ticket"))?;
            client
                .execute(&st[3], &event)
                .map_err(pg_err("insert outbox"))?;
            match client.execute(&st[4], &receipt) {
                Ok(_) => {
                    client
                        .batch_execute(&format!("RELEASE SAVEPOINT {CREATE_SAVEPOINT}"))
                        .map_err(pg_err("release"))?;
                    None
                }
                Err(e) if e.code() == Some(&postgres::error::SqlState::UNIQUE_VIOLATION) => {
                    client
                        .batch_execute(&format!("ROLLBACK TO SAVEPOINT {CREATE_SAVEPOINT}"))
                        .map_err(pg_err("rollback to savepoint"))?;
                    Some(pg_read_winner(client, st, key)?)
                }
                Err(e) => return Err(pg_err("insert receipt")(e)),
            }
        }
        Protocol::SingleStatement => unreachable!("sent by pg_single"),
        Protocol::OnConflict => {
            if client
                .query_opt(&st[5], &receipt)
                .map_err(pg_err("claim receipt"))?
                .is_some()
            {
                client
                    .execute(&st[2], &ticket)
                    .map_err(pg_err("insert ticket"))?;
                client
                    .execute(&st[3], &event)
                    .map_err(pg_err("insert outbox"))?;
                None
            } else {
                Some(pg_read_winner(client, st, key)?)
            }
        }
    };
    client.batch_execute("COMMIT").map_err(pg_err("commit"))?;
    Ok(winner.unwrap_or_else(|| id.to_string()))
}

/// Fetches every column of a ticket row as a raw SQLite value (no parsing into domain types):
/// what the database hands over, without the crate's decoding.
fn every_column(r: &rusqlite::Row<'_>) -> rusqlite::Result<()> {
    for i in 0..10 {
        let _: rusqlite::types::Value = r.get(i)?;
    }
    Ok(())
}

fn lite_read_winner(conn: &Connection, key: &str) -> Result<String, BenchError> {
    let ticket_id: String = conn
        .prepare_cached(lite::FIND_RECEIPT_SQL)
        .and_then(|mut s| s.query_row(params![TENANT, key], |r| r.get(3)))
        .map_err(lite_err("find receipt"))?;
    conn.prepare_cached(lite::FIND_TICKET_SQL)
        .and_then(|mut s| {
            s.query_row(params![TENANT, ticket_id], every_column)
                .optional()
        })
        .map_err(lite_err("find ticket"))?;
    Ok(ticket_id)
}

/// The receipt's ticket id for `key`, read with its ticket in one statement (every column
/// fetched, none decoded), or `None`.
fn lite_read_joined(conn: &Connection, key: &str) -> Result<Option<String>, BenchError> {
    conn.prepare_cached(lite::FIND_RECEIPT_AND_TICKET_SQL)
        .and_then(|mut s| {
            s.query_row(params![TENANT, key], |r| {
                for i in 0..15 {
                    let _: rusqlite::types::Value = r.get(i)?;
                }
                r.get::<_, String>(3)
            })
            .optional()
        })
        .map_err(lite_err("find receipt and ticket"))
}

/// Long because it is the SQLite store's create written out statement by statement for each
/// protocol, so the bench runs the same SQL bare.
fn lite_create(conn: &Connection, protocol: Protocol, key: &str) -> Result<String, BenchError> {
    if protocol == Protocol::SingleStatement {
        // The joined read first, without the write lock, as the store does.
        if let Some(ticket_id) = lite_read_joined(conn, key)? {
            return Ok(ticket_id);
        }
    }
    // Lazy mode, as the store's default: the lookup is its own read.
    let found: Option<String> = if protocol == Protocol::SingleStatement {
        None
    } else {
        conn.prepare_cached(lite::FIND_RECEIPT_SQL)
            .and_then(|mut s| s.query_row(params![TENANT, key], |r| r.get(3)).optional())
            .map_err(lite_err("find receipt"))?
    };
    if let Some(ticket_id) = found {
        conn.prepare_cached(lite::FIND_TICKET_SQL)
            .and_then(|mut s| {
                s.query_row(params![TENANT, ticket_id], every_column)
                    .optional()
            })
            .map_err(lite_err("find ticket"))?;
        return Ok(ticket_id);
    }
    let (id, event_id, now) = (
        Uuid::new_v4().to_string(),
        Uuid::new_v4().to_string(),
        iso8601(now_utc()),
    );
    let insert_ticket = |conn: &Connection| {
        conn.prepare_cached(lite::INSERT_TICKET_SQL)
            .and_then(|mut s| {
                s.execute(params![
                    id,
                    TENANT,
                    "u1",
                    "Printer jammed",
                    "Floor 3 printer shows E-42",
                    "high",
                    "open",
                    1i64,
                    now,
                    now
                ])
            })
            .map_err(lite_err("insert ticket"))
    };
    let insert_outbox = |conn: &Connection| {
        conn.prepare_cached(lite::INSERT_OUTBOX_SQL)
            .and_then(|mut s| {
                s.execute(params![
                    event_id,
                    id,
                    TENANT,
                    "ticket.created",
                    PAYLOAD,
                    now
                ])
            })
            .map_err(lite_err("insert outbox"))
    };
    conn.execute_batch("BEGIN IMMEDIATE")
        .map_err(lite_err("begin immediate"))?;
    let result = (|| -> Result<Option<String>, BenchError> {
        match protocol {
            Protocol::Savepoint => {
                conn.execute_batch(&format!("SAVEPOINT {CREATE_SAVEPOINT}"))
                    .map_err(lite_err("savepoint"))?;
                insert_ticket(conn)?;
                insert_outbox(conn)?;
                let r = conn
                    .prepare_cached(lite::INSERT_RECEIPT_SQL)
                    .and_then(|mut s| s.execute(params![TENANT, key, HASH, id, now]));
                match r {
                    Ok(_) => {
                        conn.execute_batch(&format!("RELEASE SAVEPOINT {CREATE_SAVEPOINT}"))
                            .map_err(lite_err("release"))?;
                        Ok(None)
                    }
                    Err(e) if is_unique_violation(&e) => {
                        conn.execute_batch(&format!("ROLLBACK TO SAVEPOINT {CREATE_SAVEPOINT}"))
                            .map_err(lite_err("rollback to savepoint"))?;
                        Ok(Some(lite_read_winner(conn, key)?))
                    }
                    Err(e) => Err(lite_err("insert receipt")(e)),
                }
            }
            Protocol::OnConflict | Protocol::SingleStatement => {
                let claimed = conn
                    .prepare_cached(lite::INSERT_RECEIPT_IF_ABSENT_SQL)
                    .and_then(|mut s| {
                        s.query_row(params![TENANT, key, HASH, id, now], |_| Ok(()))
                            .optional()
                    })
                    .map_err(lite_err("claim receipt"))?;
                if claimed.is_some() {
                    insert_ticket(conn)?;
                    insert_outbox(conn)?;
                    Ok(None)
                } else if protocol == Protocol::SingleStatement {
                    Ok(lite_read_joined(conn, key)?)
                } else {
                    Ok(Some(lite_read_winner(conn, key)?))
                }
            }
        }
    })();
    match result {
        Ok(winner) => {
            conn.execute_batch("COMMIT").map_err(lite_err("commit"))?;
            Ok(winner.unwrap_or(id))
        }
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sqlite_statements_are_the_postgres_ones_with_sqlite_placeholders() {
        // The baseline sends the same statements on both backends; only `$N` becomes `?N`.
        for (sqlite, postgres) in [
            (lite::FIND_RECEIPT_SQL, pg::FIND_RECEIPT_SQL),
            (lite::FIND_TICKET_SQL, pg::FIND_TICKET_SQL),
            (lite::INSERT_TICKET_SQL, pg::INSERT_TICKET_SQL),
            (lite::INSERT_OUTBOX_SQL, pg::INSERT_OUTBOX_SQL),
            (lite::INSERT_RECEIPT_SQL, pg::INSERT_RECEIPT_SQL),
            (
                lite::INSERT_RECEIPT_IF_ABSENT_SQL,
                pg::INSERT_RECEIPT_IF_ABSENT_SQL,
            ),
            (lite::UPDATE_TICKET_SQL, pg::UPDATE_TICKET_SQL),
        ] {
            assert_eq!(sqlite, postgres.replace('$', "?"));
        }
    }

    /// A statement's table, columns, filtered columns and conflict clause, without its
    /// parameters (`$N` in the stores, psql variables in the pgbench scripts).
    fn shape(sql: &str) -> String {
        let head = sql.split([';']).next().unwrap_or(sql);
        let head = head.split(" VALUES ").next().unwrap_or(head);
        let head = head.split(" WHERE ").next().unwrap_or(head);
        let filtered: Vec<&str> = sql
            .split(" WHERE ")
            .nth(1)
            .map(|w| {
                w.split(" AND ")
                    .map(|c| c.split(" = ").next().unwrap_or(c))
                    .collect()
            })
            .unwrap_or_default();
        let claims =
            sql.contains(" ON CONFLICT (tenant_id, idempotency_key) DO NOTHING RETURNING 1");
        format!("{head} | {filtered:?} | {claims}")
    }

    #[test]
    fn the_single_statement_scripts_are_the_stores_statement() {
        // `TICKETFLOW_BLESS=1` rewrites the committed scripts from the store's statement.
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/bench");
        for (file, committed, replay) in [
            (
                "pg-create-single-statement.sql",
                super::super::pgbench::CREATE_SINGLE_STATEMENT_SQL,
                false,
            ),
            (
                "pg-replay-single-statement.sql",
                super::super::pgbench::REPLAY_SINGLE_STATEMENT_SQL,
                true,
            ),
        ] {
            let generated = super::super::pgbench::single_statement_script(replay);
            if std::env::var_os("TICKETFLOW_BLESS").is_some() {
                std::fs::write(dir.join(file), &generated).unwrap();
                continue;
            }
            assert_eq!(
                committed, generated,
                "{file} is stale: TICKETFLOW_BLESS=1 rewrites it"
            );
            assert!(
                !generated.contains('$'),
                "{file}: a parameter was not replaced"
            );
        }
    }

    #[test]
    fn the_pgbench_scripts_send_the_stores_statements_in_order() {
        let scripts = [
            (
                include_str!("../../../../scripts/bench/pg-create-savepoint.sql"),
                vec![
                    pg::FIND_RECEIPT_SQL,
                    pg::INSERT_TICKET_SQL,
                    pg::INSERT_OUTBOX_SQL,
                    pg::INSERT_RECEIPT_SQL,
                ],
            ),
            (
                include_str!("../../../../scripts/bench/pg-create-on-conflict.sql"),
                vec![
                    pg::FIND_RECEIPT_SQL,
                    pg::INSERT_RECEIPT_IF_ABSENT_SQL,
                    pg::INSERT_TICKET_SQL,
                    pg::INSERT_OUTBOX_SQL,
                ],
            ),
            (
                include_str!("../../../../scripts/bench/pg-replay.sql"),
                vec![pg::FIND_RECEIPT_SQL, pg::FIND_TICKET_SQL],
            ),
        ];
        for (script, statements) in scripts {
            let sent: Vec<String> = script
                .lines()
                .filter(|l| l.starts_with("SELECT") || l.starts_with("INSERT"))
                .map(shape)
                .collect();
            let ours: Vec<String> = statements.into_iter().map(shape).collect();
            assert_eq!(sent, ours);
        }
    }
}
