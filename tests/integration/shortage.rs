//! A server that cannot give a run the sessions it needs makes that run PENDING with the cause
//! and what to free, never FAIL, in `scenario run`, `verify` and the kill matrix; with the
//! sessions freed the same runs PASS again.
//!
//! "Fewer sessions than the run needs" is a role's `CONNECTION LIMIT`: PostgreSQL refuses a
//! session over it with SQLSTATE 53300, as it refuses one over `max_connections`, and unlike
//! filling the whole server it does not starve the other tests running beside this one. The
//! runs' own free-slot check counts the server's slots, so it lets these runs start, and the
//! refusal meets them halfway, as it meets a run on a server other clients fill.

use std::process::{Command, Output};

use ticketflow_core::store::Backend;
use ticketflow_core::variants::{Implementation, Variant};
use ticketflow_harness::killmatrix::{self, GateOutcome, KillOptions, LoomReport};
use ticketflow_harness::scenario::format::Scenario;

use crate::support::{pg_url, repo_path};

/// A login role of its own (CREATEDB, not a superuser, so its connection limit holds),
/// dropped with its databases when the test ends.
struct LimitedRole {
    admin: String,
    name: String,
}

impl LimitedRole {
    fn new(admin: &str, label: &str, limit: i32) -> LimitedRole {
        let role = LimitedRole {
            admin: admin.to_string(),
            name: format!("tf_short_{label}_{}", std::process::id()),
        };
        role.psql(&format!(
            "DROP ROLE IF EXISTS {0}; CREATE ROLE {0} LOGIN CREATEDB CONNECTION LIMIT {limit}",
            role.name
        ));
        role
    }

    fn limit(&self, limit: i32) {
        self.psql(&format!(
            "ALTER ROLE {} CONNECTION LIMIT {limit}",
            self.name
        ));
    }

    /// The admin URL with this role as its user.
    fn url(&self) -> String {
        let config = ticketflow_core::store::url::parse_postgres(&self.admin).unwrap();
        let host = match config.get_hosts().first() {
            Some(postgres::config::Host::Tcp(h)) => h.clone(),
            _ => "127.0.0.1".into(),
        };
        let port = config.get_ports().first().copied().unwrap_or(5432);
        format!("postgres://{}@{host}:{port}/postgres", self.name)
    }

    fn psql(&self, sql: &str) {
        let config = ticketflow_core::store::url::parse_postgres(&self.admin).unwrap();
        let mut c = ticketflow_core::store::postgres::connect(&config).unwrap();
        c.batch_execute(sql).unwrap();
    }
}

impl Drop for LimitedRole {
    fn drop(&mut self) {
        let config = ticketflow_core::store::url::parse_postgres(&self.admin).unwrap();
        if let Ok(mut c) = ticketflow_core::store::postgres::connect(&config) {
            // Its scratch databases are dropped by the runs; any left behind go with it.
            let _ = c.batch_execute(&format!(
                "DROP OWNED BY {0} CASCADE; DROP ROLE IF EXISTS {0}",
                self.name
            ));
        }
    }
}

fn ticketflow(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ticketflow"))
        .args(args)
        .current_dir(repo_path(""))
        .env_remove("DATABASE_URL")
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The eight-racer scenario needs ten sessions (eight racers, setup and controller) beside
/// its admin session; five leave it short once the racers connect.
const SHORT: i32 = 5;

#[test]
fn scenario_run_and_verify_are_pending_on_a_server_short_of_sessions_and_pass_when_freed() {
    let Some(admin) = pg_url() else { return };
    let role = LimitedRole::new(&admin, "cli", SHORT);
    let url = role.url();
    let file = repo_path("scenarios/e-eight-racers-same-body.toml");
    let run = |role_url: &str| {
        ticketflow(&[
            "scenario",
            "run",
            file.to_str().unwrap(),
            "--backend",
            "postgres",
            "--isolation",
            "read-committed",
            "--pg-url",
            role_url,
        ])
    };
    let short = run(&url);
    let out = text(&short);
    assert_eq!(short.status.code(), Some(3), "PENDING, exit 3:\n{out}");
    assert!(!out.contains("FAIL"), "never FAIL:\n{out}");
    for part in [
        "PENDING",
        "could not host the run",
        "53300",
        "CONNECTION LIMIT",
    ] {
        assert!(out.contains(part), "{part:?} missing:\n{out}");
    }
    let report = tempfile::tempdir().unwrap();
    let report_md = report.path().join("REPORT.md");
    let verify = |role_url: &str| {
        ticketflow(&[
            "verify",
            "--backend",
            "postgres",
            "--isolation",
            "read-committed",
            "--pg-url",
            role_url,
            "--filter",
            "e-eight-racers",
            "--no-kill-matrix",
            "--require-postgres",
            "--report",
            report_md.to_str().unwrap(),
        ])
    };
    let short = verify(&url);
    let out = text(&short);
    assert_eq!(short.status.code(), Some(3), "PENDING, exit 3:\n{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("PENDING") && l.contains("53300")),
        "{out}"
    );
    assert!(
        !out.lines().any(|l| l.starts_with("FAIL")),
        "never FAIL:\n{out}"
    );
    let md = std::fs::read_to_string(&report_md).unwrap();
    assert!(
        md.contains("## PENDING: did not run") && !md.contains("## FAIL"),
        "{md}"
    );

    // Freed: the same runs pass.
    role.limit(-1);
    let freed = run(&url);
    assert_eq!(freed.status.code(), Some(0), "{}", text(&freed));
    let freed = verify(&url);
    assert_eq!(freed.status.code(), Some(0), "{}", text(&freed));
}

fn kill_options(url: &str) -> KillOptions {
    KillOptions {
        pg: crate::support::server(url),
        pg_unusable: None,
        cases: 4,
        seed: Some(1),
        loom_report: repo_path("reports/loom.json"),
        worker_exe: Some(env!("CARGO_BIN_EXE_ticketflow").into()),
        lease: Default::default(),
        interposed: Ok(Vec::new()),
        check_file: Err("not loaded in this test".into()),
    }
}

#[test]
fn a_kill_matrix_cell_short_of_sessions_is_pending_never_killed_or_survived() {
    let Some(admin) = pg_url() else { return };
    let role = LimitedRole::new(&admin, "kill", SHORT);
    let scenarios = Scenario::load(&repo_path("scenarios/e-eight-racers-same-body.toml")).unwrap();
    let loom = LoomReport::load(&repo_path("reports/loom.json"));
    let opts = kill_options(&role.url());
    let cell = |implementation| {
        killmatrix::run_cell(
            implementation,
            Backend::Postgres,
            "scenarios",
            &scenarios,
            &opts,
            &loom,
        )
        .outcome
    };
    let control = Implementation::PROTOCOLS[0];
    let variant = Implementation::Variant(Variant::CheckThenInsert);
    for implementation in [control, variant] {
        match cell(implementation) {
            GateOutcome::Pending(why) => assert!(
                why.contains("53300") && why.contains("could not host the run"),
                "{}: {why}",
                implementation.name()
            ),
            other => panic!("{}: {other:?}", implementation.name()),
        }
    }
    // Freed: the control survives and the variant is killed.
    role.limit(-1);
    assert_eq!(cell(control), GateOutcome::Survived);
    assert!(
        matches!(cell(variant), GateOutcome::Killed(_)),
        "check-then-insert"
    );
}
