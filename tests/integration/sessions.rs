//! Sessions never stay poisoned: a session left inside a transaction — aborted
//! (SQLSTATE 25P02) after a failed ROLLBACK, or merely open — is either repaired by the next
//! create's failed BEGIN or refused by the pool's check before it serves a request.

use r2d2::ManageConnection;
use ticketflow_core::store::postgres::IsolationLevel;
use ticketflow_core::{create_ticket, CreateOptions, DbErrorKind};
use ticketflow_serve::{Session, SessionManager};

use crate::support::{b0, TestDb};

/// The state a failed ROLLBACK leaves behind: inside a transaction that an error aborted.
const ABORT: &str = "BEGIN; SELECT 1/0";

#[test]
fn a_session_left_in_an_aborted_transaction_serves_the_next_create() {
    let Some(db) = TestDb::postgres("poisoned") else {
        return;
    };
    let mut store = db.0.open_postgres(IsolationLevel::ReadCommitted).unwrap();
    assert!(store.client().batch_execute(ABORT).is_err());
    let options = CreateOptions::default();
    // The first create meets the aborted transaction at BEGIN (25P02) and fails; it must
    // end that transaction, or every later request on this session fails the same way.
    let first = create_ticket(&mut store, "A", "k1", &b0(), &options).unwrap_err();
    assert_eq!(
        first.db_kind(),
        Some(DbErrorKind::InFailedTransaction),
        "{first}"
    );
    for key in ["k1", "k2"] {
        let report = create_ticket(&mut store, "A", key, &b0(), &options)
            .unwrap_or_else(|e| panic!("the session stayed poisoned: {e}"));
        assert_eq!(report.outcome.kind().to_string(), "created");
    }
    assert_eq!(db.counts("A").tickets, 2);
}

/// Puts the pooled session into `sql`'s state (errors ignored: an aborting statement fails).
fn put_into(session: &mut Session, sql: &str) {
    match session {
        Session::Postgres(s) => {
            let _ = s.client().batch_execute(sql);
        }
        Session::Sqlite(s) => {
            let _ = s.execute_batch(sql);
        }
    }
}

#[test]
fn the_pool_check_refuses_a_session_inside_a_transaction() {
    for db in TestDb::all("pool_check") {
        let url = db
            .url()
            .unwrap_or_else(|| db.sqlite_path().unwrap().display().to_string());
        let url = ticketflow_core::store::url::DatabaseUrl::parse(&url).unwrap();
        let manager = SessionManager::new(&url).unwrap();
        let mut session = manager.connect().unwrap();
        let name = db.name();
        assert!(manager.is_valid(&mut session).is_ok(), "{name}: idle");
        assert!(!manager.has_broken(&mut session), "{name}: idle");
        put_into(&mut session, "BEGIN");
        assert!(
            manager.is_valid(&mut session).is_err(),
            "{name}: an open transaction passed the check"
        );
        // SQLite knows without a round trip; PostgreSQL's is caught by the check above.
        if name == "sqlite" {
            assert!(manager.has_broken(&mut session), "{name}: open transaction");
        }
        put_into(&mut session, "ROLLBACK");
        assert!(
            manager.is_valid(&mut session).is_ok(),
            "{name}: after ROLLBACK"
        );
        if name == "postgres" {
            put_into(&mut session, ABORT);
            let e = manager.is_valid(&mut session).unwrap_err();
            assert_eq!(e.kind, DbErrorKind::InFailedTransaction, "{e}");
            put_into(&mut session, "ROLLBACK");
            assert!(manager.is_valid(&mut session).is_ok());
        }
    }
}

/// The level a transaction of `store` runs at, as PostgreSQL reports it.
fn level_in_transaction(store: &mut ticketflow_core::store::postgres::PgStore) -> String {
    use ticketflow_core::store::Store as _;
    store.begin().unwrap();
    let level: String = store
        .client()
        .query_one("SHOW transaction_isolation", &[])
        .unwrap()
        .get(0);
    store.rollback().unwrap();
    level
}

#[test]
fn isolation_is_a_choice_and_server_default_follows_the_server() {
    use ticketflow_core::store::postgres::{connect, IsolationChoice, PgStore};
    let Some(db) = TestDb::postgres("isolation_choice") else {
        return;
    };
    let name = db.0.pg().unwrap().name().to_string();
    db.execute(&format!(
        "ALTER DATABASE \"{name}\" SET default_transaction_isolation = 'serializable'"
    ));
    let config = db.pg_config().unwrap();
    for (choice, want) in [
        (IsolationChoice::ReadCommitted, "read committed"),
        (IsolationChoice::RepeatableRead, "repeatable read"),
        (IsolationChoice::Serializable, "serializable"),
        (IsolationChoice::ServerDefault, "serializable"),
    ] {
        let mut store = PgStore::from_client_choice(connect(config).unwrap(), choice).unwrap();
        assert_eq!(level_in_transaction(&mut store), want, "{choice:?}");
        if choice == IsolationChoice::ServerDefault {
            assert_eq!(store.isolation(), IsolationLevel::Serializable);
        }
    }
}
