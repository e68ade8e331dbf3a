//! Faults at a step, cut at the interposer (docs/INTERPOSER.md, "Faults at a step"): a cut
//! after the server (the lost acknowledgement) and a cut before forwarding against the real
//! `serve` converge on one effect; `serve --variant lost-ack-creates-again` fails on the cut
//! after its COMMIT and passes without it; the `key TTL` check fails on a key left in progress
//! and passes when the lock expires; a fault whose step never comes is PENDING; a Python
//! service whose PostgreSQL client cancels a lost session and waits for the cancel's
//! connection to close (as pgx and libpq do) passes a cut after its COMMIT, and times out
//! when that close never comes.

use ticketflow_harness::blackbox::{
    run_repeated, summary, RunOptions, TargetOutcome, TargetScenario,
};
use ticketflow_harness::verdict::Verdict;

/// Redis db of these tests (their keys start with `tfv-ttl:` and are deleted after).
const REDIS_DB: &str = "redis://127.0.0.1:6379/11";

fn redis_up() -> bool {
    crate::support::redis_up_at(REDIS_DB)
}

fn parse(name: &str, text: &str) -> TargetScenario {
    TargetScenario::parse(std::path::Path::new(name), text, &|_| None)
        .unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn run(s: &TargetScenario, url: &str) -> TargetOutcome {
    let opts = RunOptions {
        exe: Some(std::path::PathBuf::from(env!("CARGO_BIN_EXE_ticketflow"))),
        ..RunOptions::new(crate::support::server(url))
    };
    run_repeated(s, &opts).unwrap()
}

/// `racers` clients with one key and body against one `ticketflow serve` (with `variant`, if
/// any) through the interposer, the `[[fault]]` text appended; counts of tickets, events and
/// receipts in the run's tenant.
fn serve_scenario(variant: Option<&str>, racers: usize, fault: &str) -> TargetScenario {
    serve_scenario_limit(variant, racers, fault, 4)
}

/// [`serve_scenario`] with `[schedule] limit` (the most runs, an `each` sweep's too).
fn serve_scenario_limit(
    variant: Option<&str>,
    racers: usize,
    fault: &str,
    limit: usize,
) -> TargetScenario {
    let variant = variant
        .map(|v| format!(r#", "--variant", "{v}""#))
        .unwrap_or_default();
    let text = format!(
        r#"
name = "faults-serve"
description = "clients with one key and body, a store connection cut at a step"

[barrier]
kind = "interposer"
timeout_ms = 5000

[schedule]
mode = "bounded"
preemptions = 0
limit = {limit}

[target]
own_service = true

[target.request]
method = "POST"
path = "/v1/tickets"
body = {{ actor_id = "u1", title = "Printer jammed", body = "Floor 3 printer shows E-42", priority = "high" }}

[target.retry]
attempts = 6
backoff_ms = 5
max_backoff_ms = 100

[target.replay]
same_answer = true
ignore = ["/updated_at"]

[[target.scopes]]
name = "T"
value = "T-{{run}}"
headers = {{ "X-Tenant-Id" = "{{scope}}" }}

[target.count]
tickets = "SELECT count(*) FROM tickets WHERE tenant_id = {{scope}}"
events = "SELECT count(*) FROM outbox_events WHERE tenant_id = {{scope}} AND event_type = 'ticket.created'"
receipts = "SELECT count(*) FROM idempotency_receipts WHERE tenant_id = {{scope}}"

[[target.service]]
name = "api"
command = ["{{ticketflow}}", "serve", "--pool-size", "{pool}", "--min-idle", "{pool}", "--listen", "127.0.0.1:{{port}}", "--database-url", "{{database_url}}"{variant}]

[[racers]]
name = "r"
count = {racers}
scope = "T"
key = "key-1"

[expect]
outcomes = {{ r = ["created", "replayed"] }}

[[expect.counts]]
scope = "T"
tickets = 1
events = 1
receipts = 1
{fault}
"#,
        pool = racers + 1,
    );
    parse("faults-serve.toml", &text)
}

fn show(o: &TargetOutcome) -> String {
    format!(
        "{:?} {:?}\n{}",
        o.reason,
        o.coverage,
        summary::summary_text(o)
    )
}

/// The fault check of a run: it passed, and its detail.
fn fault_check(r: &ticketflow_harness::blackbox::TargetRun) -> (bool, String) {
    let c = r
        .checks
        .iter()
        .find(|c| c.name == "fault")
        .expect("a scenario with a fault has the fault check");
    (c.passed(), c.detail.clone())
}

#[test]
fn a_lost_acknowledgement_at_commit_is_retried_to_one_effect_on_serve() {
    let Some(url) = crate::support::pg_url() else {
        return;
    };
    let s = serve_scenario(
        None,
        2,
        "[[fault]]\nracer = \"A\"\nmatch = \"COMMIT\"\ncut = \"after\"\n",
    );
    let o = run(&s, &url);
    assert_eq!(o.verdict, Verdict::Pass, "{}", show(&o));
    for r in &o.runs {
        let (passed, detail) = fault_check(r);
        assert!(passed, "{detail}");
        // The server committed (status idle) before the client's connection was cut.
        assert!(
            detail.contains("cut after the server completed it (transaction status I)"),
            "{detail}"
        );
        // The racer saw the cut (a 5xx or a reset) and its retry with the key was answered.
        let a = &r.racers[0];
        assert!(a.attempts.len() >= 2, "{:?}", a.attempts);
        assert!(
            a.attempts[0]
                .answer
                .as_ref()
                .map_or(true, |x| x.status >= 500),
            "{:?}",
            a.attempts[0]
        );
    }
}

#[test]
fn a_cut_before_forwarding_converges_on_serve() {
    let Some(url) = crate::support::pg_url() else {
        return;
    };
    let s = serve_scenario(
        None,
        2,
        "[[fault]]\nracer = \"r-1\"\nmatch = \"COMMIT\"\ncut = \"before\"\n",
    );
    let o = run(&s, &url);
    assert_eq!(o.verdict, Verdict::Pass, "{}", show(&o));
    let (passed, detail) = fault_check(&o.runs[0]);
    assert!(
        passed && detail.contains("the server never saw the step"),
        "{detail}"
    );
    assert!(o.runs[0].racers[0].attempts.len() >= 2);
}

#[test]
fn lost_ack_creates_again_fails_on_the_cut_after_its_commit_and_passes_without_it() {
    let Some(url) = crate::support::pg_url() else {
        return;
    };
    let cut = "[[fault]]\nracer = \"A\"\nmatch = \"COMMIT\"\ncut = \"after\"\n";
    let o = run(
        &serve_scenario(Some("lost-ack-creates-again"), 2, cut),
        &url,
    );
    assert_eq!(o.verdict, Verdict::Fail, "{}", show(&o));
    let failing = o.runs.iter().find(|r| r.verdict == Verdict::Fail).unwrap();
    let failed: Vec<&str> = failing
        .checks
        .iter()
        .filter(|c| !c.passed())
        .map(|c| c.name)
        .collect();
    // A second ticket and event behind the key, and the retry answered with a second id.
    assert!(failed.contains(&"counts"), "{failed:?}\n{}", show(&o));
    assert!(
        failed.contains(&"one effect per intent") || failed.contains(&"same answer"),
        "{failed:?}"
    );
    assert!(fault_check(failing).0, "the fault struck");
    // The control: the same variant without the fault is the protocol.
    let o = run(&serve_scenario(Some("lost-ack-creates-again"), 2, ""), &url);
    assert_eq!(o.verdict, Verdict::Pass, "{}", show(&o));
    // And the cut before its COMMIT (nothing committed) converges too: only the lost
    // acknowledgement finds it.
    let before = "[[fault]]\nracer = \"A\"\nmatch = \"COMMIT\"\ncut = \"before\"\n";
    let o = run(
        &serve_scenario(Some("lost-ack-creates-again"), 1, before),
        &url,
    );
    assert_eq!(o.verdict, Verdict::Pass, "{}", show(&o));
}

#[test]
fn a_fault_whose_step_never_comes_is_pending_never_pass() {
    let Some(url) = crate::support::pg_url() else {
        return;
    };
    for fault in [
        "[[fault]]\nracer = \"A\"\nstep = 99\ncut = \"after\"\n",
        "[[fault]]\nracer = \"A\"\nmatch = \"TRUNCATE\"\ncut = \"before\"\n",
    ] {
        let o = run(&serve_scenario(None, 1, fault), &url);
        assert_eq!(o.verdict, Verdict::Pending, "{}", show(&o));
        let reason = o.reason.clone().unwrap_or_default();
        assert!(reason.contains("never came"), "{reason}");
        assert_eq!(
            o.runs.len(),
            1,
            "the exploration stops at a run that was not as declared"
        );
    }
}

#[test]
fn cutting_after_each_step_in_turn_converges_on_serve_and_finds_the_lost_ack_variant_at_commit() {
    let Some(url) = crate::support::pg_url() else {
        return;
    };
    let each = "[[fault]]\nracer = \"A\"\neach = true\ncut = \"after\"\n";
    let o = run(&serve_scenario_limit(None, 1, each, 30), &url);
    assert_eq!(o.verdict, Verdict::Pass, "{}", show(&o));
    let coverage = o.coverage.clone().unwrap();
    // check_idle, BEGIN, lookup, savepoint, three inserts, release, COMMIT at least.
    assert!(o.runs.len() >= 8, "{coverage}");
    assert!(coverage.contains("never came"), "{coverage}");
    let texts: Vec<String> = o.runs.iter().map(|r| fault_check(r).1).collect();
    assert!(texts.iter().any(|t| t.contains("(COMMIT)")), "{texts:?}");

    let o = run(
        &serve_scenario_limit(Some("lost-ack-creates-again"), 1, each, 30),
        &url,
    );
    assert_eq!(o.verdict, Verdict::Fail, "{}", show(&o));
    let failing = o.runs.iter().find(|r| r.verdict == Verdict::Fail).unwrap();
    let (_, detail) = fault_check(failing);
    assert!(detail.contains("(COMMIT)"), "{detail}");
    assert!(
        o.reason
            .clone()
            .unwrap()
            .contains("with cut after r-1's step"),
        "{:?}",
        o.reason
    );
}

/// One client of the Python stub whose lock lives in Redis (`ttl_ms` 0: a lock without
/// expiry), its connection cut before the INCR that follows taking the lock; the scenario
/// states the service's lock TTL.
fn ttl_scenario(ttl_ms: u64, stated_ttl_ms: u64) -> TargetScenario {
    let script = crate::support::repo_path("tests/integration/ttl_lock_stub.py");
    let text = format!(
        r#"
name = "ttl-lock-stub"
description = "a lock left behind by a request that lost its store connection"

[barrier]
kind = "interposer"
timeout_ms = 5000

[target]
redis_url = "{REDIS_DB}"
lock_ttl_ms = {stated_ttl_ms}

[target.retry]
attempts = 3
backoff_ms = 1

[target.request]
method = "POST"
path = "/orders"
body = {{ sku = "a-1", quantity = 1 }}

[[target.service]]
name = "shop"
command = ["python3", "{script}", "{{port}}", "{{redis_url}}", "{ttl_ms}"]

[[racers]]
name = "r"
key = "k1"

[[fault]]
racer = "r"
match = "INCR"
store = "redis"
cut = "before"
"#,
        script = script.display()
    );
    parse("ttl-stub.toml", &text)
}

fn clean_ttl_keys() {
    let mut c = redis::Client::open(REDIS_DB)
        .unwrap()
        .get_connection()
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg("tfv-ttl:*").query(&mut c).unwrap();
    if !keys.is_empty() {
        let _: () = redis::cmd("DEL").arg(&keys).query(&mut c).unwrap();
    }
}

#[test]
fn a_key_left_in_progress_past_its_ttl_fails_and_one_whose_lock_expires_passes() {
    let Some(url) = crate::support::pg_url() else {
        return;
    };
    if !redis_up() {
        return;
    }
    // The lock never expires: the key answers in progress for good.
    let stuck = run(&ttl_scenario(0, 800), &url);
    // The lock expires after its TTL: the retry after it creates.
    let expiring = run(&ttl_scenario(800, 800), &url);
    clean_ttl_keys();
    assert_eq!(stuck.verdict, Verdict::Fail, "{}", show(&stuck));
    let reason = stuck.reason.clone().unwrap_or_default();
    assert!(
        reason.contains("failed: key TTL: key left in progress past its TTL"),
        "{reason}"
    );
    assert_eq!(expiring.verdict, Verdict::Pass, "{}", show(&expiring));
    let r = &expiring.runs[0];
    let ttl = r.checks.iter().find(|c| c.name == "key TTL").unwrap();
    assert!(ttl.detail.contains("answered created"), "{}", ttl.detail);
    let waits = &r.evidence.as_ref().unwrap().ttl_waits;
    assert!(waits.len() == 1 && waits[0].answered, "{waits:?}");
    let (passed, detail) = fault_check(r);
    assert!(passed && detail.contains("INCR"), "{detail}");
}

/// Two clients of the Python stub whose PostgreSQL client cancels a lost session as pgx does
/// (tests/integration/pg_cancel_stub.py) on the scratch database `db`, with one key and body,
/// the first racer's connection cut after its COMMIT; `env` is the service's `env` table.
fn pg_cancel_scenario(db: &str, env: &str) -> TargetScenario {
    let script = crate::support::repo_path("tests/integration/pg_cancel_stub.py");
    let text = format!(
        r#"
name = "pg-cancel-stub"
description = "a service that cancels a lost session and waits for the cancel's close, its COMMIT's acknowledgement lost"

[barrier]
kind = "interposer"
timeout_ms = 5000

[schedule]
mode = "bounded"
preemptions = 0
limit = 4

[target]
database_url = "{db}"
preset = "none"
request_timeout_ms = 4000

[[target.rules]]
status = 201
header = "Idempotent-Replayed"
header_value = "true"
outcome = "replayed"

[[target.rules]]
status = 201
outcome = "created"

[[target.rules]]
status = 422
outcome = "conflict"

[target.request]
method = "POST"
path = "/orders"
body = {{ item = "book", quantity = 1 }}

[target.replay]
same_answer = true

[target.retry]
attempts = 3
backoff_ms = 5
statuses = [503]

[target.count]
orders = "SELECT count(*) FROM pgx_orders WHERE idempotency_key = {{key}}"
receipts = "SELECT count(*) FROM pgx_receipts WHERE key = {{key}}"

[[target.service]]
name = "shop"
command = ["python3", "{script}", "{{port}}", "{{database_url}}"]
{env}

[[racers]]
name = "r"
count = 2
key = "k1"

[expect]
outcomes = {{ r = ["created", "replayed"] }}

[[expect.counts]]
key = "k1"
orders = 1
receipts = 1

[[fault]]
racer = "A"
match = "COMMIT"
cut = "after"
"#,
        script = script.display()
    );
    parse("pg-cancel-stub.toml", &text)
}

#[test]
fn a_driver_that_cancels_a_lost_session_and_waits_for_the_close_passes_a_cut_after_commit() {
    let Some(db) = crate::support::TestDb::postgres("pg_cancel_stub") else {
        return;
    };
    let url = db.url().unwrap();
    let o = run(&pg_cancel_scenario(&url, ""), &url);
    assert_eq!(o.verdict, Verdict::Pass, "{}", show(&o));
    // Both orders of the two racers, the cut racer first to create or second to replay.
    assert!(o.runs.len() >= 2, "{}", show(&o));
    for r in &o.runs {
        let (passed, detail) = fault_check(r);
        // The server committed before the cut; the stub's cancel was closed by the
        // interposer, and its retry on a new session read the committed receipt: the request
        // never saw the cut, which the check states.
        assert!(
            passed
                && detail
                    .contains("(COMMIT) cut after the server completed it (transaction status I)")
                && detail.contains(ticketflow_harness::blackbox::check::ABSORBED),
            "{detail}"
        );
        let ids: Vec<Option<&String>> = r
            .racers
            .iter()
            .map(|x| x.attempts.last().and_then(|a| a.id.as_ref()))
            .collect();
        assert!(
            ids[0].is_some() && ids.iter().all(|i| *i == ids[0]),
            "{ids:?}"
        );
    }

    // The old hang: the cancel goes to a listener that never closes the connection, so the
    // cut racer's request waits out the stub's 15 s cancel wait and gets no answer in time.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let env = format!(
        "env = {{ PG_STUB_CANCEL_ADDR = \"{}\" }}",
        silent.local_addr().unwrap()
    );
    let o = run(&pg_cancel_scenario(&url, &env), &url);
    drop(silent);
    assert_ne!(o.verdict, Verdict::Pass, "{}", show(&o));
    let reason = o.reason.clone().unwrap_or_default();
    assert!(
        reason.contains("no answer within 4000 ms")
            && reason.contains("the service never reached its store again"),
        "{reason}\n{}",
        show(&o)
    );
}
