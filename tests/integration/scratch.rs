//! Scratch databases: copies of the migrated template, recycled while `verify` runs (emptied,
//! never shared between runs), and parallel runs that each see only their own racers.

use postgres::Client;
use ticketflow::verify::{run_all_on, Selection};
use ticketflow_core::store::postgres as pg;
use ticketflow_core::{create_ticket, CreateOptions};
use ticketflow_harness::jobs::Pool;
use ticketflow_harness::scenario::format::Scenario;
use ticketflow_harness::scenario::runner::PgOptions;
use ticketflow_harness::scenario::RunSetting;
use ticketflow_harness::scratch::{recycling, template_name, ScratchDb};
use ticketflow_harness::verdict::Verdict;

use crate::support::{b0, pg_url, repo_path};

/// The tests here that recycle take turns: recycling ends, and spares go, only when the last
/// guard of the process ends.
static RECYCLING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    RECYCLING.lock().unwrap_or_else(|e| e.into_inner())
}

fn admin(url: &str) -> Client {
    pg::connect(&ticketflow_core::store::url::parse_postgres(url).unwrap()).unwrap()
}

/// The oid of the database `name`, if it exists.
fn oid_of(admin: &mut Client, name: &str) -> Option<u32> {
    admin
        .query_opt("SELECT oid FROM pg_database WHERE datname = $1", &[&name])
        .unwrap()
        .map(|r| r.get(0))
}

/// The name of the database with `oid`, if it exists.
fn name_of(admin: &mut Client, oid: u32) -> Option<String> {
    admin
        .query_opt(
            "SELECT datname::text FROM pg_database WHERE oid = $1",
            &[&oid],
        )
        .unwrap()
        .map(|r| r.get(0))
}

fn name(db: &ScratchDb) -> String {
    db.pg().unwrap().name().to_string()
}

#[test]
fn a_scratch_database_is_a_migrated_copy_of_the_template_which_has_no_sessions() {
    let Some(url) = pg_url() else { return };
    let db = ScratchDb::postgres(&crate::support::server(&url), "tpl_copy").unwrap();
    let mut admin = admin(&url);
    assert!(oid_of(&mut admin, &template_name()).is_some());
    // The copy holds the ledger before any session of ours migrated it.
    let mut raw = db.connect_postgres().unwrap();
    let recorded: i64 = raw
        .query_one("SELECT count(*) FROM schema_migrations", &[])
        .unwrap()
        .get(0);
    assert_eq!(
        recorded,
        ticketflow_core::store::migrate::POSTGRES.len() as i64
    );
    let on_template: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1",
            &[&template_name()],
        )
        .unwrap()
        .get(0);
    assert_eq!(
        on_template, 0,
        "a session on the template blocks every copy"
    );
}

/// Writes rows, a function, a schema and a database setting into `db`.
fn dirty(db: &ScratchDb) {
    let mut s = db.open().unwrap();
    create_ticket(s.as_mut(), "A", "k1", &b0(), &CreateOptions::default()).unwrap();
    drop(s);
    db.execute(&format!(
        "CREATE FUNCTION leftover() RETURNS int LANGUAGE sql AS 'SELECT 1'; \
         CREATE SCHEMA extra; CREATE TABLE extra.t (a int); \
         ALTER DATABASE \"{}\" SET statement_timeout = '1s'",
        name(db)
    ))
    .unwrap();
}

/// What `dirty` leaves behind in `db`, as (tickets, functions named leftover, schemas named
/// extra, database settings).
fn leftovers(db: &ScratchDb, admin: &mut Client) -> (i64, i64, i64, i64) {
    let tickets = db.scalar("SELECT count(*) FROM tickets").unwrap();
    let functions = db
        .scalar("SELECT count(*) FROM pg_proc WHERE proname = 'leftover'")
        .unwrap();
    let schemas = db
        .scalar("SELECT count(*) FROM pg_namespace WHERE nspname = 'extra'")
        .unwrap();
    let settings: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_db_role_setting s JOIN pg_database d ON d.oid = s.setdatabase \
             WHERE d.datname = $1",
            &[&name(db)],
        )
        .unwrap()
        .get(0);
    (tickets, functions, schemas, settings)
}

#[test]
fn a_recycled_scratch_database_is_the_same_database_emptied_and_spares_go_when_recycling_ends() {
    let Some(url) = pg_url() else { return };
    let mut admin = admin(&url);
    let _turn = turn();
    let guard = recycling();
    // Other tests of this process may take the spare first; a few tries make one of ours.
    let mut reused = None;
    for _ in 0..5 {
        let a = ScratchDb::postgres(&crate::support::server(&url), "recycle_a").unwrap();
        let a_oid = oid_of(&mut admin, &name(&a)).unwrap();
        dirty(&a);
        // Control: before the recycle, the leftovers are seen.
        assert_eq!(leftovers(&a, &mut admin), (1, 1, 1, 1));
        drop(a);
        let b = ScratchDb::postgres(&crate::support::server(&url), "recycle_b").unwrap();
        if oid_of(&mut admin, &name(&b)) == Some(a_oid) {
            reused = Some((b, a_oid));
            break;
        }
    }
    let (b, oid) = reused.expect("no dropped scratch database was reused");
    assert!(name(&b).contains("recycle_b"), "{}", name(&b));
    assert_eq!(leftovers(&b, &mut admin), (0, 0, 0, 0), "{}", name(&b));
    // Migrated as a copy is: the protocol runs on it.
    let mut s = b.open().unwrap();
    create_ticket(s.as_mut(), "A", "k1", &b0(), &CreateOptions::default()).unwrap();
    drop(s);
    drop(b);
    // Parked again as a spare under a spare name, then dropped with recycling.
    let spare = name_of(&mut admin, oid);
    if let Some(spare) = &spare {
        assert!(spare.contains("_spare_"), "{spare}");
    }
    drop(guard);
    assert_eq!(
        name_of(&mut admin, oid),
        None,
        "the spare outlived recycling"
    );
}

#[test]
fn a_session_left_on_a_recycled_scratch_database_is_ended_as_drop_force_would() {
    let Some(url) = pg_url() else { return };
    let mut admin = admin(&url);
    let _turn = turn();
    let _guard = recycling();
    let c = ScratchDb::postgres(&crate::support::server(&url), "recycle_busy").unwrap();
    let oid = oid_of(&mut admin, &name(&c)).unwrap();
    let mut lingering = c.connect_postgres().unwrap();
    drop(c);
    // Ended, and its database no longer under the run's name.
    assert!(lingering.simple_query("SELECT 1").is_err());
    if let Some(now) = name_of(&mut admin, oid) {
        assert!(
            now.contains("_spare_") || !now.contains("recycle_busy"),
            "{now}"
        );
    }
}

fn scenario(file: &str) -> Scenario {
    Scenario::load(&repo_path(&format!("scenarios/{file}")))
        .unwrap()
        .remove(0)
}

#[test]
fn parallel_runs_each_hold_only_their_own_racers_at_their_own_barrier() {
    let Some(url) = pg_url() else { return };
    let _turn = turn();
    let _guard = recycling();
    // The table lock and the advisory key, four runs at once on each: a barrier that
    // counted another run's racers, or took its lock, fails its run.
    let scenarios = vec![
        scenario("a-same-key-same-body.toml"),
        scenario("e-eight-racers-same-body.toml"),
        scenario("g-advisory-after-lookup.toml"),
        scenario("c-same-key-different-bodies.toml"),
    ];
    let selection = Selection {
        backends: vec![ticketflow_core::store::Backend::Postgres],
        ..Selection::default()
    };
    let base = PgOptions::new(crate::support::server(&url));
    let mut order = Vec::new();
    let ran = run_all_on(
        &scenarios,
        &selection,
        &base,
        &ticketflow_core::RetryPolicy::default(),
        None,
        Pool::new(4, 80),
        &mut |r| order.push((r.scenario.clone(), r.setting)),
    );
    let expected: Vec<(String, RunSetting)> = scenarios
        .iter()
        .flat_map(|s| {
            selection
                .settings(s)
                .into_iter()
                .map(|setting| (s.name.clone(), setting))
        })
        .collect();
    assert_eq!(order, expected, "reported in the serial order");
    let mut databases = std::collections::HashSet::new();
    for run in &ran.results {
        assert_eq!(
            run.verdict,
            Verdict::Pass,
            "{} {}: {:?}",
            run.scenario,
            run.setting.label(),
            run.checks
                .iter()
                .filter(|c| !c.passed())
                .collect::<Vec<_>>()
        );
        if let Some(ticketflow_harness::scenario::Evidence::Postgres { database, .. }) =
            &run.evidence
        {
            assert!(databases.insert(database.clone()), "{database} shared");
        }
    }
    assert_eq!(databases.len(), ran.results.len());
}
