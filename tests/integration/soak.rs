//! `ticketflow soak`: a short fault-free soak on the protocol PASSes; the same soak against a
//! served wrong implementation FAILs on the invariant that implementation breaks; faults
//! planted in the database after the traffic fail the SQL checks; an unreachable server is
//! PENDING, never PASS.

use std::path::PathBuf;
use std::time::Duration;

use ticketflow_core::variants::{Implementation, Variant};
use ticketflow_harness::soak::{self, FaultKind, Soak, SoakOptions, SoakReport};
use ticketflow_harness::verdict::Verdict;

use crate::support::{pg_url, UNREACHABLE_PG};

fn options(url: &str, seconds: u64, faults: &[FaultKind]) -> SoakOptions {
    let mut o = SoakOptions::new(crate::support::server(url));
    o.duration = Duration::from_secs(seconds);
    o.connections = 6;
    o.tenants = 3;
    o.seed = 7;
    o.faults = faults.to_vec();
    o.exe = Some(PathBuf::from(env!("CARGO_BIN_EXE_ticketflow")));
    o
}

fn failed(r: &SoakReport) -> Vec<&'static str> {
    r.invariants
        .iter()
        .filter(|i| i.verdict == Verdict::Fail)
        .map(|i| i.name)
        .collect()
}

#[test]
fn a_short_fault_free_soak_on_the_protocol_passes() {
    let Some(url) = pg_url() else { return };
    let r = soak::run(&options(&url, 2, &[]));
    assert_eq!(r.verdict, Verdict::Pass, "{}", r.text());
    assert_eq!(r.invariants.len(), soak::INVARIANTS.len());
    assert!(r.figures.requests > 0 && r.figures.answers.contains_key("409"));
    assert!(r.figures.answers.contains_key("200"), "{}", r.text());
    // report.json's `soak` member has the shape the schema documents.
    let schema: serde_json::Value = serde_json::from_str(ticketflow_report::json::SCHEMA).unwrap();
    let soak_schema = serde_json::json!({
        "$schema": schema["$schema"],
        "$defs": schema["$defs"],
        "oneOf": schema["properties"]["soak"]["oneOf"],
    });
    let v = jsonschema::validator_for(&soak_schema).unwrap();
    let doc = serde_json::to_value(&r).unwrap();
    assert!(
        crate::report::schema_errors(&v, &doc).is_empty(),
        "{:?}",
        crate::report::schema_errors(&v, &doc)
    );
    let mut broken = doc.clone();
    broken["figures"]["requests"] = serde_json::json!("many");
    assert!(!crate::report::schema_errors(&v, &broken).is_empty());
}

#[test]
fn kills_and_terminated_sessions_converge_on_the_protocol() {
    let Some(url) = pg_url() else { return };
    let r = soak::run(&options(
        &url,
        4,
        &[FaultKind::KillService, FaultKind::TerminateBackends],
    ));
    assert_eq!(r.verdict, Verdict::Pass, "{}", r.text());
    assert!(r
        .faults_injected
        .get("kill-service")
        .is_some_and(|n| *n >= 1));
    // The faults were felt: some attempt met a dead service or a cut session.
    assert!(r.figures.retries > 0, "{}", r.text());
}

/// Every fault kind converges with no 500 and no stuck session. It failed before sessions
/// were reset and a statement timeout answered 503, when `serve` answered 500 to a statement
/// timeout (57014, then 25P02).
#[test]
fn every_default_fault_kind_converges_on_the_protocol() {
    let Some(url) = pg_url() else { return };
    let r = soak::run(&options(&url, 6, &FaultKind::DEFAULT));
    assert_eq!(r.verdict, Verdict::Pass, "{}", r.text());
}

/// Each served wrong implementation FAILs the invariant it breaks. A race on a contested key
/// is chance, so a variant caught only by races gets up to three soaks.
#[test]
fn served_wrong_implementations_fail_the_invariant_each_breaks() {
    let Some(url) = pg_url() else { return };
    let cases: [(Variant, &[&str]); 5] = [
        (Variant::CheckThenInsert, &["one id per key"]),
        (
            Variant::SplitTransactions,
            &["tickets = receipts = created events per tenant"],
        ),
        (Variant::KeyOnly, &["conflicts answered 409"]),
        (Variant::AbandonOuterTx, &["no 500 or unexpected answers"]),
        (
            Variant::TenantBlind,
            &[
                "every 201 id exists in its tenant",
                "GETs answer their tenant",
            ],
        ),
    ];
    for (variant, expected) in cases {
        let mut opts = options(&url, 2, &[]);
        opts.implementation = Implementation::Variant(variant);
        let mut last = None;
        for _ in 0..3 {
            let r = soak::run(&opts);
            let caught = expected.iter().all(|e| failed(&r).contains(e));
            last = Some(r);
            if caught {
                break;
            }
        }
        let r = last.expect("ran");
        assert_eq!(r.verdict, Verdict::Fail, "{variant}: {}", r.text());
        for e in expected {
            assert!(
                failed(&r).contains(e),
                "{variant} did not fail {e:?}: {}",
                r.text()
            );
        }
        // The checks the variant does not break are not blamed for it.
        assert!(
            !failed(&r).contains(&"no session left in a transaction"),
            "{variant}: {}",
            r.text()
        );
    }
}

/// The SQL checks and the session check each FAIL on a fault planted after the traffic: a
/// ticket answered 201 deleted with its receipt and event, a lone event deleted, and a
/// session left in an aborted transaction.
#[test]
fn planted_faults_fail_the_database_and_session_checks() {
    let Some(url) = pg_url() else { return };
    let mut soak = Soak::start(&options(&url, 1, &[])).unwrap();
    let traffic = soak.drive();
    let db = soak.database();
    let (t0, t1) = (soak.tenants()[0].clone(), soak.tenants()[1].clone());
    // A whole create vanishes: the counts stay equal, the answers do not.
    db.execute(&format!(
        "CREATE TEMP TABLE gone AS SELECT ticket_id FROM idempotency_receipts \
         WHERE tenant_id = '{t0}' LIMIT 1; \
         DELETE FROM idempotency_receipts WHERE tenant_id = '{t0}' AND ticket_id IN (SELECT ticket_id FROM gone); \
         DELETE FROM outbox_events WHERE tenant_id = '{t0}' AND aggregate_id IN (SELECT ticket_id FROM gone); \
         DELETE FROM tickets WHERE tenant_id = '{t0}' AND id IN (SELECT ticket_id FROM gone);"
    ))
    .unwrap();
    // A half state: one ticket.created event less in another tenant.
    db.execute(&format!(
        "DELETE FROM outbox_events WHERE id = (SELECT id FROM outbox_events \
         WHERE tenant_id = '{t1}' AND event_type = 'ticket.created' LIMIT 1)"
    ))
    .unwrap();
    let mut stuck = db.connect_postgres().unwrap();
    stuck.batch_execute("BEGIN").unwrap();
    assert!(stuck.batch_execute("SELECT 1/0").is_err());
    let r = soak.finish(&traffic);
    assert_eq!(r.verdict, Verdict::Fail, "{}", r.text());
    for name in [
        "tickets = receipts = created events per tenant",
        "every 201 id exists in its tenant",
        "one id per key",
        "no session left in a transaction",
    ] {
        assert!(
            failed(&r).contains(&name),
            "{name} did not fail: {}",
            r.text()
        );
    }
    let sessions = r.invariant("no session left in a transaction").unwrap();
    assert!(
        sessions.detail.contains("idle in transaction (aborted)"),
        "{}",
        sessions.detail
    );
    drop(stuck);
}

#[test]
fn an_unreachable_server_is_pending_never_pass() {
    let r = soak::run(&options(UNREACHABLE_PG, 1, &FaultKind::DEFAULT));
    assert_eq!(r.verdict, Verdict::Pending, "{}", r.text());
    assert!(r
        .invariants
        .iter()
        .all(|i| i.verdict == Verdict::Pending && i.detail.contains("unreachable")));
}

/// Ctrl-C / SIGTERM during a soak stops both services and drops the scratch database (the
/// `cleanup` registry), exit 143 (128 + SIGTERM).
#[test]
fn an_interrupted_soak_stops_its_services_and_drops_its_database() {
    use std::process::{Command, Stdio};
    let Some(url) = pg_url() else { return };
    let config = ticketflow_core::store::url::parse_postgres(&url).unwrap();
    let mut admin = ticketflow_core::store::postgres::connect(&config).unwrap();
    let before: Vec<String> = admin
        .query(
            "SELECT datname FROM pg_database WHERE datname LIKE 'tf_soak_%'",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let child = Command::new(env!("CARGO_BIN_EXE_ticketflow"))
        .args([
            "soak",
            "--duration",
            "30s",
            "--connections",
            "2",
            "--pg-url",
            &url,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until both services answer: their pids are the soak's children.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let (name, services) = loop {
        let dbs: Vec<String> = admin
            .query(
                "SELECT datname FROM pg_database WHERE datname LIKE 'tf_soak_%'",
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| r.get::<_, String>(0))
            .filter(|d| !before.contains(d))
            .collect();
        let kids = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", child.id()))
            .unwrap_or_default();
        let kids: Vec<String> = kids.split_whitespace().map(str::to_string).collect();
        let sessions: i64 = match dbs.first() {
            Some(d) => admin
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = $1",
                    &[d],
                )
                .unwrap()
                .get(0),
            None => 0,
        };
        if let (Some(d), true, true) = (dbs.first(), kids.len() >= 2, sessions > 0) {
            break (d.clone(), kids);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the soak never got going"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(143), "SIGTERM: 128 + 15\n{stderr}");
    // Other tests soak at the same time, so the database this process made is the one its
    // handler names (the wait above only needed some soak to be under way).
    let _ = name;
    let name = regex::Regex::new(r"tf_soak_[0-9a-z_]+")
        .unwrap()
        .find(&stderr)
        .unwrap_or_else(|| panic!("the handler names what it dropped: {stderr}"))
        .as_str()
        .to_string();
    let left: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_database WHERE datname = $1",
            &[&name],
        )
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "{name} was left behind");
    // The services got SIGTERM and stop within their shutdown grace (500 ms).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while services
        .iter()
        .any(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists())
    {
        assert!(
            std::time::Instant::now() < deadline,
            "a service outlived the soak: {services:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
