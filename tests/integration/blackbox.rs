use std::path::Path;

use ticketflow::scenario::format::Scenario;
use ticketflow::scenario::runner::run_postgres;
use ticketflow::scenario::{Evidence, ScenarioRun, Verdict};
use ticketflow::store::postgres::IsolationLevel;

use crate::scenarios::pg_opts;
use crate::support::{pg_url, repo_path, TestDb};

fn load(rel: &str) -> Scenario {
    Scenario::load(&repo_path(rel)).unwrap().remove(0)
}

fn check<'r>(run: &'r ScenarioRun, name: &str) -> &'r ticketflow::scenario::CheckResult {
    run.checks
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no check {name}: {:?}", run.checks))
}

/// The barrier evidence: as many waiters on the receipts table as racers, each blocked by
/// the controller, none of them the controller.
fn assert_barrier_proven(run: &ScenarioRun, racers: usize) {
    assert!(check(run, "barrier").passed, "{:?}", run.reason);
    let Some(Evidence::Http {
        waits,
        controller_pid,
        ..
    }) = &run.evidence
    else {
        panic!("no black-box evidence: {:?}", run.evidence)
    };
    assert_eq!(waits.len(), racers);
    for w in waits {
        assert_ne!(w.pid, *controller_pid);
        assert!(w.blocked_by.contains(controller_pid));
        assert_eq!(w.wait_event, "Lock/relation");
    }
}

#[test]
fn shipped_black_box_scenarios_pass_against_two_serve_processes() {
    let Some(url) = pg_url() else { return };
    for file in [
        "scenarios/k-http-two-serves-same-body.toml",
        "scenarios/l-http-two-serves-different-bodies.toml",
    ] {
        let s = load(file);
        let run = run_postgres(&s, &pg_opts(&url, IsolationLevel::ReadCommitted));
        assert_eq!(run.verdict, Verdict::Pass, "{file}: {:?}", run.reason);
        assert_eq!(run.setting.label(), "target: http (2 endpoints)");
        assert_barrier_proven(&run, s.racers.len());
        let Some(Evidence::Http {
            services, scratch, ..
        }) = &run.evidence
        else {
            unreachable!()
        };
        assert!(scratch);
        assert_eq!(services.len(), 2);
        assert_ne!(services[0].os_pid, services[1].os_pid);
        assert_ne!(services[0].base_url, services[1].base_url);
        if s.barrier.lock == ticketflow::scenario::LockMode::Exclusive {
            // Warm sessions: every request was held at its receipt INSERT, so every loser
            // replayed after the unique violation (our service's diagnostic header says so).
            for r in &run.racers {
                let o = r.result.as_ref().unwrap();
                if o.kind == ticketflow::OutcomeKind::Replayed {
                    assert_eq!(
                        o.path,
                        Some(ticketflow::DecisionPath::AfterUniqueViolation),
                        "{}",
                        r.name
                    );
                }
            }
        }
    }
}

#[test]
fn a_served_wrong_implementation_fails_the_black_box_checks() {
    let Some(url) = pg_url() else { return };
    let opts = pg_opts(&url, IsolationLevel::ReadCommitted);
    // abandon-outer-tx: every loser meets 25P02 and answers 500.
    let s = load("scenarios/negative/http-abandon-outer-tx.toml");
    let run = run_postgres(&s, &opts);
    assert_eq!(run.verdict, Verdict::Fail, "{:?}", run.checks);
    assert_barrier_proven(&run, s.racers.len());
    for name in ["racer errors", "outcome counts", "same ticket"] {
        assert!(!check(&run, name).passed, "{name} should fail");
    }
    assert!(check(&run, "racer errors").detail.contains("HTTP 500"));
    // key-only: the other body is replayed instead of 409.
    let s = load("scenarios/negative/http-key-only.toml");
    let run = run_postgres(&s, &opts);
    assert_eq!(run.verdict, Verdict::Fail, "{:?}", run.checks);
    assert_barrier_proven(&run, s.racers.len());
    for name in ["outcomes", "outcome counts", "convergence"] {
        assert!(!check(&run, name).passed, "{name} should fail");
    }
    // The row counts alone cannot tell: one ticket per tenant either way.
    assert!(check(&run, "rows").passed);
    // split-transactions: every client sees one id; only the rows counted in the database
    // (a ticket and an event per racer) give it away.
    let s = load("scenarios/negative/http-split-transactions.toml");
    let run = run_postgres(&s, &opts);
    assert_eq!(run.verdict, Verdict::Fail, "{:?}", run.checks);
    assert_barrier_proven(&run, s.racers.len());
    let failed: Vec<&str> = run
        .checks
        .iter()
        .filter(|c| !c.passed)
        .map(|c| c.name)
        .collect();
    assert_eq!(failed, ["rows"]);
    assert_eq!(run.rows["A"], crate::support::counts(4, 1, 4));
}

const OWN: &str = r#"
name = "own-service"
description = "d"
[barrier]
timeout_ms = 1500
[target]
base_urls = ["BASE"]
database_url = "DB"
receipts_table = "idempotency_receipts"
[target.count]
tickets = "SELECT count(*) FROM tickets WHERE tenant_id = $1"
receipts = "SELECT count(*) FROM idempotency_receipts WHERE tenant_id = $1"
created_events = "SELECT count(*) FROM outbox_events WHERE tenant_id = $1 AND event_type = 'ticket.created'"
[[racers]]
name = "r"
count = 3
tenant = "A"
key = "key-1"
request = { actor_id = "u1", title = "x", body = "y", priority = "high" }
[expect]
created = 1
replayed = 2
same_ticket = [["r"]]
rows = [{ tenant = "A", tickets = 1, receipts = 1, created_events = 1 }]
"#;

fn own(base: &str, db: &str) -> Scenario {
    Scenario::parse(
        Path::new("own.toml"),
        &OWN.replace("BASE", base).replace("DB", db),
    )
    .unwrap()
    .remove(0)
}

#[test]
fn a_running_service_is_verified_through_its_base_url_and_database() {
    let Some(db) = TestDb::postgres("bb_own") else {
        return;
    };
    let Some(url) = pg_url() else { return };
    let db_url = db.url().unwrap();
    let served = crate::serve::serve(&db_url, &[]);
    let run = run_postgres(
        &own(&served.base, &db_url),
        &pg_opts(&url, IsolationLevel::ReadCommitted),
    );
    assert_eq!(run.verdict, Verdict::Pass, "{:?}", run.reason);
    assert_barrier_proven(&run, 3);
    let Some(Evidence::Http {
        scratch, services, ..
    }) = &run.evidence
    else {
        unreachable!()
    };
    assert!(!scratch && services.is_empty());
}

#[test]
fn requests_queued_in_the_service_are_not_a_proven_barrier() {
    // A pool of one session: the second and third requests wait inside the service, not on
    // the receipts table, so the runner cannot see them there and must not PASS.
    let Some(db) = TestDb::postgres("bb_queued") else {
        return;
    };
    let Some(url) = pg_url() else { return };
    let db_url = db.url().unwrap();
    let served = crate::serve::serve(&db_url, &["--pool-size", "1"]);
    let run = run_postgres(
        &own(&served.base, &db_url),
        &pg_opts(&url, IsolationLevel::ReadCommitted),
    );
    assert_eq!(run.verdict, Verdict::Fail);
    let barrier = check(&run, "barrier");
    assert!(!barrier.passed);
    assert!(
        barrier.detail.contains("1 of 3 requests seen waiting"),
        "{}",
        barrier.detail
    );
}

#[test]
fn black_box_scenarios_are_pending_without_postgres() {
    let s = load("scenarios/k-http-two-serves-same-body.toml");
    let run = run_postgres(
        &s,
        &pg_opts(
            crate::support::UNREACHABLE_PG,
            IsolationLevel::ReadCommitted,
        ),
    );
    assert_eq!(run.verdict, Verdict::Pending, "{:?}", run.reason);
}

#[test]
fn bad_targets_are_rejected_at_load_with_a_line() {
    let base = OWN
        .replace("BASE", "http://127.0.0.1:1")
        .replace("DB", "postgres://x/y");
    for (change, from, to) in [
        ("advisory barrier", "timeout_ms = 1500", "lock = \"advisory\""),
        ("no database_url", "database_url = \"postgres://x/y\"\n", ""),
        ("odd table", "\"idempotency_receipts\"", "\"receipts; DROP TABLE x\""),
        ("unknown via", "count = 3", "count = 3\nvia = \"api-z\""),
        ("setup", "[target]", "[[setup]]\ntenant = \"A\"\nkey = \"k\"\nrequest = { actor_id = \"u1\", title = \"x\", body = \"y\", priority = \"high\" }\n[target]"),
    ] {
        let text = base.replace(from, to);
        assert_ne!(text, base, "{change}: no change made");
        let e = Scenario::parse(Path::new("t.toml"), &text).unwrap_err();
        assert!(e.line.is_some(), "{change}: {e}");
    }
}

#[test]
fn the_readme_template_and_the_negative_controls_parse_and_verify_skips_the_negatives() {
    let template = load("scenarios/examples/your-service.toml");
    assert_eq!(template.target.as_ref().unwrap().base_urls.len(), 2);
    for file in [
        "scenarios/negative/http-abandon-outer-tx.toml",
        "scenarios/negative/http-key-only.toml",
        "scenarios/negative/http-split-transactions.toml",
    ] {
        assert!(load(file).target.is_some());
    }
    // `verify` loads only scenarios/*.toml: the negatives (which must FAIL) and the template
    // (which names services that are not running) stay out.
    let shipped = ticketflow::scenario::format::load_dir(&repo_path("scenarios")).unwrap();
    assert!(shipped
        .iter()
        .all(|s| !s.name.starts_with("negative-") && s.name != template.name));
    assert_eq!(shipped.iter().filter(|s| s.target.is_some()).count(), 2);
}
