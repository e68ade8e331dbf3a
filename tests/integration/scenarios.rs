use ticketflow::scenario::format::{load_dir, Backend};
use ticketflow::scenario::runner::{run_postgres, run_sqlite, PgOptions, SqliteOptions};
use ticketflow::scenario::{Evidence, Verdict};

use crate::support::{pg_url, repo_path};

#[test]
fn shipped_scenarios_pass_on_sqlite() {
    let scenarios = load_dir(&repo_path("scenarios")).unwrap();
    assert!(scenarios.len() >= 5);
    for s in &scenarios {
        let run = run_sqlite(s, &SqliteOptions::default());
        assert_eq!(run.verdict, Verdict::Pass, "{}: {:?}", s.name, run.reason);
        assert!(matches!(run.evidence, Some(Evidence::Sqlite { .. })));
    }
}

#[test]
fn shipped_scenarios_pass_on_postgres_with_lock_evidence() {
    let Some(url) = pg_url() else { return };
    let scenarios = load_dir(&repo_path("scenarios")).unwrap();
    for s in scenarios
        .iter()
        .filter(|s| s.backends.contains(&Backend::Postgres))
    {
        let run = run_postgres(s, &PgOptions::new(url.clone()));
        assert_eq!(run.verdict, Verdict::Pass, "{}: {:?}", s.name, run.reason);
        let Some(Evidence::Postgres {
            waits,
            controller_pid,
            ..
        }) = &run.evidence
        else {
            panic!("{}: no PostgreSQL evidence", s.name)
        };
        // Every racer pid was seen waiting on the receipts relation, blocked by the controller.
        assert_eq!(waits.len(), s.racers.len(), "{}", s.name);
        for w in waits {
            assert_eq!(w.wait_event_type.as_deref(), Some("Lock"));
            assert_eq!(w.wait_event.as_deref(), Some("relation"));
            assert!(w.blocked_by.contains(controller_pid));
        }
        let pids: Vec<_> = run.racers.iter().map(|r| r.backend_pid.unwrap()).collect();
        for w in waits {
            assert!(pids.contains(&w.pid));
        }
    }
}

#[test]
fn unreachable_postgres_is_pending_never_pass() {
    let scenarios = load_dir(&repo_path("scenarios")).unwrap();
    // Port 1 on loopback: nothing listens there.
    let run = run_postgres(
        &scenarios[0],
        &PgOptions::new("postgres://postgres@127.0.0.1:1/postgres?connect_timeout=2"),
    );
    assert_eq!(run.verdict, Verdict::Pending);
    assert!(run.reason.unwrap().contains("unreachable"));
}
