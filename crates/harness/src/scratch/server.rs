//! A scratch database's statements on its server that its owner and the recycling share: the
//! drop, and waiting for its sessions to exit.

use std::sync::Mutex;
use std::time::Instant;

use postgres::{Client, Config};
use ticketflow_core::store::postgres::{connect_as, watch_pg, SessionRole};

use super::ledger;

/// How long [`gone`] waits for the sessions of a database to exit.
const SESSIONS_GONE_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);
/// Between two looks of [`gone`] at `pg_stat_activity`.
const SESSIONS_POLL: std::time::Duration = std::time::Duration::from_millis(1);

/// Waits until no session is connected to `name` (closed or terminated sessions take a moment
/// to exit), polling every [`SESSIONS_POLL`]; `Err` after [`SESSIONS_GONE_WITHIN`].
pub(super) fn gone(admin: &mut Client, name: &str) -> Result<(), String> {
    let deadline = Instant::now() + SESSIONS_GONE_WITHIN;
    loop {
        let left: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1",
                &[&name],
            )
            .map_err(|e| e.to_string())?
            .get(0);
        if left == 0 {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("{left} session(s) still connected"));
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
) -> Result<(), String> {
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
    let mut fresh = connect_as(server, SessionRole::Admin).map_err(|e| e.to_string())?;
    watch_pg("drop scratch database", &peer, hard, || {
        fresh.batch_execute(&sql)
    })
    .map_err(|e| e.to_string())?;
    ledger::forget(&mut fresh, name);
    Ok(())
}
