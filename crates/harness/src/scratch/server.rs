//! A scratch database's statements on its server that its owner and the recycling share: the
//! drop, and waiting for its sessions to exit.

use std::sync::Mutex;
use std::time::Instant;

use postgres::{Client, Config};
use ticketflow_core::store::postgres::{connect_as, watch_pg, SessionRole};

use super::ledger;

/// Why a scratch database's statement on its server failed: the drop, the wait for its
/// sessions, or the reset of a spare; the message is the cause's own.
#[derive(Debug, thiserror::Error)]
pub(super) enum ServerError {
    /// The admin session is in use by another thread (a spare is not waited for).
    #[error("admin session busy")]
    AdminBusy,
    /// Sessions were still connected to the database when the wait ended.
    #[error("{0} session(s) still connected")]
    SessionsLeft(i64),
    /// A statement of the admin session failed.
    #[error(transparent)]
    Query(#[from] postgres::Error),
    /// A new session could not connect, or a watched statement or migration failed.
    #[error(transparent)]
    Store(#[from] ticketflow_core::StoreError),
}

/// How long [`gone`] waits for the sessions of a database to exit.
const SESSIONS_GONE_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);
/// Between two looks of [`gone`] at `pg_stat_activity`.
const SESSIONS_POLL: std::time::Duration = std::time::Duration::from_millis(1);

/// Waits until no session is connected to `name` (closed or terminated sessions take a moment
/// to exit), polling every [`SESSIONS_POLL`]; `Err` after [`SESSIONS_GONE_WITHIN`].
pub(super) fn gone(admin: &mut Client, name: &str) -> Result<(), ServerError> {
    let deadline = Instant::now() + SESSIONS_GONE_WITHIN;
    loop {
        let left: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1",
                &[&name],
            )?
            .get(0);
        if left == 0 {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(ServerError::SessionsLeft(left));
        }
        std::thread::sleep(SESSIONS_POLL);
    }
}

/// Drops `name` (`DROP DATABASE … WITH (FORCE)` ends the sessions still using it) through
/// `admin`, or through a new connection to `server` when `admin` is busy or gone (a server
/// restart): a [`super::ScratchDatabase`]'s own drop, and its interrupt cleanup. The admin session
/// comes first because a server at `max_connections` takes no new one. Its row in the
/// scratch ledger ([`super::ledger`]) is deleted after the drop.
///
/// Will return `Err` with the reason if it could not be dropped.
pub(super) fn drop_scratch(
    admin: &Mutex<Client>,
    server: &Config,
    name: &str,
) -> Result<(), ServerError> {
    let sql = format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)");
    let peer = ticketflow_core::deadline::Peer::of(server);
    let hard = SessionRole::Admin.hard_deadline_for(server);
    // `try_lock`: the interrupt handler must not wait for a thread stuck in a statement.
    if let Ok(mut admin) = admin.try_lock() {
        if ticketflow_core::deadline::watch("drop scratch database", &peer, hard, || {
            admin.batch_execute(&sql)
        })
        .0
        .is_ok()
        {
            ledger::forget(&mut admin, name);
            return Ok(());
        }
    }
    let mut fresh = connect_as(server, SessionRole::Admin)?;
    watch_pg("drop scratch database", &peer, hard, || {
        fresh.batch_execute(&sql)
    })?;
    ledger::forget(&mut fresh, name);
    Ok(())
}
