//! Black-box targets (`[target]`): the shipped scenarios against `ticketflow serve`, every
//! negative control FAILing on the check it is for, every barrier kind, the retry phase,
//! `--repeat`, and stubs for what our own service never does (in progress forever, integer
//! ids in `Location`, an advisory lock).

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use ticketflow_harness::blackbox::{
    run_repeated, RunOptions, TargetOutcome, TargetRun, TargetScenario,
};
use ticketflow_harness::verdict::Verdict;

use crate::support::{pg_url, repo_path, TestDb};

fn load(rel: &str) -> TargetScenario {
    TargetScenario::load(&repo_path(rel)).unwrap()
}

fn parse(text: &str) -> TargetScenario {
    TargetScenario::parse(Path::new("t.toml"), text, &|_| None).unwrap()
}

fn opts(url: &str, repeat: usize) -> RunOptions {
    RunOptions {
        exe: Some(PathBuf::from(env!("CARGO_BIN_EXE_ticketflow"))),
        repeat,
        ..RunOptions::new(crate::support::server(url))
    }
}

fn run(s: &TargetScenario, url: &str, repeat: usize) -> TargetOutcome {
    run_repeated(s, &opts(url, repeat)).unwrap_or_else(|e| panic!("{}: {e}", s.name))
}

fn only(o: &TargetOutcome) -> &TargetRun {
    assert_eq!(o.runs.len(), 1);
    &o.runs[0]
}

fn check<'r>(run: &'r TargetRun, name: &str) -> &'r ticketflow_harness::verdict::Check {
    run.checks
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no check {name}: {:?}", run.checks))
}

fn failed(run: &TargetRun) -> Vec<&'static str> {
    run.checks
        .iter()
        .filter(|c| !c.passed())
        .map(|c| c.name)
        .collect()
}

/// The table-lock evidence: as many waiters as racers in the wave, each blocked by the
/// controller, none of them the controller.
fn assert_barrier_proven(run: &TargetRun, racers: usize) {
    assert!(check(run, "barrier").passed(), "{:?}", run.reason);
    let wave = &run.evidence.as_ref().unwrap().waves[0];
    let controller = wave.controller_pid.unwrap();
    assert_eq!(wave.waits.len(), racers);
    for w in &wave.waits {
        assert_ne!(w.pid, controller);
        assert!(w.blocked_by.contains(&controller));
        assert!(w.wait_event.starts_with("Lock/"), "{}", w.wait_event);
    }
}

#[test]
fn shipped_black_box_scenarios_pass_against_two_serve_processes() {
    let Some(url) = pg_url() else { return };
    for file in [
        "scenarios/k-http-two-serves-same-body.toml",
        "scenarios/l-http-two-serves-different-bodies.toml",
        "scenarios/m-http-two-serves-rr-and-serializable.toml",
    ] {
        let s = load(file);
        let o = run(&s, &url, 1);
        let r = only(&o);
        assert_eq!(o.verdict, Verdict::Pass, "{file}: {:?}", o.reason);
        assert_barrier_proven(r, s.racers.len());
        let e = r.evidence.as_ref().unwrap();
        assert!(e.scratch);
        assert_eq!(e.services.len(), 2);
        assert_ne!(e.services[0].base_url, e.services[1].base_url);
        assert_eq!(e.isolation.as_deref(), Some("read committed"));
        assert!(r.evidence_line.as_ref().unwrap().contains("seen waiting"));
    }
}

#[test]
fn every_served_negative_control_fails_on_the_check_it_is_for() {
    let Some(url) = pg_url() else { return };
    let cases: [(&str, &[&str], &[&str]); 5] = [
        // The losers answer 500 (25P02): the answers check; the ones using those racers follow.
        (
            "http-abandon-outer-tx",
            &["answers"],
            &["expected outcomes", "one effect per intent"],
        ),
        // The other body is replayed instead of refused.
        (
            "http-key-only",
            &["expected outcomes", "one effect per intent"],
            &[],
        ),
        // Every client sees one id; only the database shows four tickets and events.
        ("http-split-transactions", &["counts"], &[]),
        // Tenant B is answered tenant A's ticket.
        (
            "http-tenant-blind",
            &["one effect per intent", "scope isolation"],
            &[],
        ),
        // No unique key: everyone creates.
        (
            "http-check-then-insert",
            &["one effect per intent", "counts"],
            &[],
        ),
    ];
    for (name, root, follow) in cases {
        let s = load(&format!("scenarios/negative/{name}.toml"));
        let o = run(&s, &url, 1);
        let r = only(&o);
        assert_eq!(o.verdict, Verdict::Fail, "{name}: {:?}", r.checks);
        assert_barrier_proven(r, s.racers.len());
        let mut want: Vec<&str> = root.iter().chain(follow).copied().collect();
        let mut got = failed(r);
        want.sort();
        got.sort();
        assert_eq!(got, want, "{name}: {:?}", r.checks);
        for f in follow {
            assert_eq!(check(r, f).follows_from, Some("answers"), "{name}: {f}");
        }
        for f in root {
            assert_eq!(check(r, f).follows_from, None, "{name}: {f}");
        }
        // A FAIL quotes the distinct answers.
        assert!(!r.answers.is_empty());
    }
}

const OWN: &str = r#"
name = "own-service"
description = "d"
[barrier]
kind = "table-lock"
table = "idempotency_receipts"
lock = "exclusive"
timeout_ms = 3000
[target]
base_urls = ["BASE"]
database_url = "DB"
preset = "ticketflow"
[target.request]
path = "/v1/tickets"
body = { actor_id = "u1", title = "x", body = "y", priority = "high" }
[[target.scopes]]
name = "A"
value = "A-{run}"
headers = { "X-Tenant-Id" = "{scope}" }
[target.count]
tickets = "SELECT count(*) FROM tickets WHERE tenant_id = {scope}"
[[racers]]
name = "r"
count = 3
scope = "A"
key = "key-1"
[expect]
outcomes = { r = ["created", "replayed"] }
[[expect.counts]]
scope = "A"
tickets = 1
"#;

fn own(base: &str, db: &str) -> TargetScenario {
    parse(&OWN.replace("BASE", base).replace("DB", db))
}

#[test]
fn a_running_service_is_verified_through_its_base_url_and_database() {
    let Some(db) = TestDb::postgres("bb_own") else {
        return;
    };
    let Some(url) = pg_url() else { return };
    let db_url = db.url().unwrap();
    // Three warm sessions and no more: a session opened during the race would wait on the
    // table too (preparing its statements) and be counted.
    let served = crate::serve::serve(&db_url, &["--pool-size", "3", "--min-idle", "3"]);
    let s = own(&served.base, &db_url);
    // Each run is fresh ({run} in the tenant): three runs, no truncation between them.
    let o = run(&s, &url, 3);
    assert_eq!(o.verdict, Verdict::Pass, "{:?}", o.reason);
    assert_eq!((o.passes, o.failures), (3, 0));
    for r in &o.runs {
        assert_barrier_proven(r, 3);
        assert!(!r.evidence.as_ref().unwrap().scratch);
    }
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
    let o = run(&own(&served.base, &db_url), &url, 1);
    let r = only(&o);
    // Nothing was proven either way: not a PASS, and not a FAIL of a service that answered
    // correctly.
    assert_eq!(o.verdict, Verdict::Pending, "{:?}", o.reason);
    assert!(o
        .reason
        .as_deref()
        .unwrap_or("")
        .contains("not run as declared"));
    let barrier = check(r, "barrier");
    assert!(!barrier.passed());
    assert!(
        barrier.detail.contains("1 of 3 requests seen waiting"),
        "{}",
        barrier.detail
    );
    assert!(
        barrier.detail.contains("connection pool"),
        "{}",
        barrier.detail
    );
}

#[test]
fn the_http_level_barrier_needs_repeats_for_a_pass() {
    let Some(db) = TestDb::postgres("bb_http") else {
        return;
    };
    let Some(url) = pg_url() else { return };
    let db_url = db.url().unwrap();
    let served = crate::serve::serve(&db_url, &[]);
    let text = OWN
        .replace("BASE", &served.base)
        .replace("DB", &db_url)
        .replace(
            "kind = \"table-lock\"\ntable = \"idempotency_receipts\"\nlock = \"exclusive\"",
            "kind = \"http\"",
        );
    let s = parse(&text);
    let once = run(&s, &url, 1);
    assert_eq!(once.verdict, Verdict::Pending, "{:?}", once.reason);
    assert!(once.reason.as_ref().unwrap().contains("--repeat"));
    let r = only(&once);
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reason);
    let wave = &r.evidence.as_ref().unwrap().waves[0];
    assert_eq!((wave.barrier.as_str(), wave.held), ("http", Some(3)));
    assert!(!r.evidence.as_ref().unwrap().server_side);
    let thrice = run(&s, &url, 3);
    assert_eq!(thrice.verdict, Verdict::Pass, "{:?}", thrice.reason);
    assert_eq!(thrice.flake_rate, 0.0);
}

// ---------------------------------------------------------------- stubs

/// A request as a stub sees it.
pub(crate) struct StubRequest {
    /// The `Idempotency-Key` header (empty when absent).
    pub key: String,
    /// Every header, names lowercased.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl StubRequest {
    /// The value of header `name` (lowercase), if sent.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A tiny HTTP/1.1 server on a free loopback port: one thread per connection, `answer` gives
/// the raw response for each request. Runs until the test process ends.
pub(crate) fn stub(answer: impl Fn(&StubRequest) -> String + Send + Sync + 'static) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let answer = Arc::new(answer);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let answer = answer.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut headers = Vec::new();
                let mut line = String::new();
                // A connection closed without a request (the runner's reachability probe).
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    return;
                }
                loop {
                    line.clear();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line.trim().is_empty() {
                        break;
                    }
                    if let Some((n, v)) = line.trim().split_once(':') {
                        headers.push((n.trim().to_ascii_lowercase(), v.trim().to_string()));
                    }
                }
                let len: usize = headers
                    .iter()
                    .find(|(n, _)| n == "content-length")
                    .and_then(|(_, v)| v.parse().ok())
                    .unwrap_or(0);
                let mut body = vec![0; len];
                let _ = reader.read_exact(&mut body);
                let key = headers
                    .iter()
                    .find(|(n, _)| n == "idempotency-key")
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default();
                let req = StubRequest { key, headers, body };
                let _ = conn.write_all(answer(&req).as_bytes());
            });
        }
    });
    base
}

pub(crate) fn response(status: &str, headers: &[(&str, &str)], body: &str) -> String {
    let mut out = format!(
        "HTTP/1.1 {status}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (n, v) in headers {
        out += &format!("{n}: {v}\r\n");
    }
    out + "\r\n" + body
}

const STUB: &str = r#"
name = "stub"
description = "d"
[barrier]
kind = "http"
timeout_ms = 5000
[target]
base_urls = ["BASE"]
preset = "ietf"
[target.request]
path = "/payments"
body = { amount = 100, currency = "EUR" }
[target.retry]
attempts = 4
backoff_ms = 1
max_backoff_ms = 2
[[racers]]
name = "client"
count = 2
key = "k1"
"#;

#[test]
fn a_target_in_progress_forever_fails_when_the_retry_phase_gives_up() {
    let base = stub(|_| response("409 Conflict", &[], r#"{"error":"request in progress"}"#));
    let s = parse(&STUB.replace("BASE", &base));
    let r = ticketflow_harness::blackbox::run_target(&s, &opts("postgres://unused", 1)).unwrap();
    assert_eq!(r.verdict, Verdict::Fail);
    let answers = check(&r, "answers");
    assert!(!answers.passed());
    assert!(
        answers
            .detail
            .contains("still in progress after 4 attempt(s)"),
        "{}",
        answers.detail
    );
    assert!(r.racers.iter().all(|x| x.attempts.len() == 4));
    // The failure is one group of identical answers, quoted.
    assert_eq!(r.answers.len(), 1);
    assert_eq!(r.answers[0].count, 2);
    assert!(r.answers[0].summary.contains("409"));
}

#[test]
fn in_progress_answers_are_retried_until_the_final_answer() {
    // Per key: the first request creates (integer id in Location only), every later request
    // gets 409 in progress twice, then the stored answer replayed.
    let seen = Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::<
        String,
        usize,
    >::new()));
    let base = stub(move |req| {
        let mut seen = seen.lock().unwrap();
        let n = seen.entry(req.key.clone()).or_default();
        *n += 1;
        match *n {
            1 => response("201 Created", &[("Location", "/payments/42")], "{}"),
            2 | 3 => response("409 Conflict", &[], "in progress"),
            _ => response(
                "201 Created",
                &[
                    ("Location", "/payments/42"),
                    ("Idempotent-Replayed", "true"),
                ],
                "{}",
            ),
        }
    });
    let text = STUB.replace("BASE", &base).replace(
        "[target.retry]",
        "[target.id]\nheader = \"Location\"\nregex = '/payments/(\\d+)$'\n[target.retry]",
    );
    let s = parse(&text);
    let r = ticketflow_harness::blackbox::run_target(&s, &opts("postgres://unused", 1)).unwrap();
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.checks);
    let retried = r.racers.iter().find(|x| x.attempts.len() > 1).unwrap();
    assert_eq!(retried.attempts.len(), 3);
    assert_eq!(
        retried.attempts[0].kind,
        ticketflow_harness::blackbox::AnswerKind::InProgress
    );
    assert_eq!(retried.id(), Some("42"));
    assert!(r.evidence_line.as_ref().unwrap().contains("after retries"));
}

#[test]
fn unmarked_replays_are_judged_by_one_id_and_a_second_id_fails() {
    // The stub creates a new integer id for every request: unmarked replays with two ids
    // are two effects.
    let next = Arc::new(AtomicUsize::new(1));
    let base = stub(move |_| {
        let id = next.fetch_add(1, Ordering::SeqCst);
        response("200 OK", &[], &format!(r#"{{"data":{{"id":{id}}}}}"#))
    });
    let text = STUB.replace("BASE", &base).replace(
        "[target.retry]",
        "[target.id]\npointer = \"/data/id\"\n[target.replay]\nmarked = false\n[target.retry]",
    );
    let r = ticketflow_harness::blackbox::run_target(&parse(&text), &opts("postgres://unused", 1))
        .unwrap();
    assert_eq!(r.verdict, Verdict::Fail);
    let effect = check(&r, "one effect per intent");
    assert!(
        effect.detail.contains("2 different ids"),
        "{}",
        effect.detail
    );
}

/// Two racers under one key whose raw bodies differ as given, against a stub that answers
/// every request with one id (unmarked replays).
fn one_id_for(first: &str, second: &str) -> TargetRun {
    let base = stub(|_| response("200 OK", &[], r#"{"data":{"id":7}}"#));
    // Raw bodies are templates: `{{`/`}}` are literal braces.
    let (first, second) = (
        first.replace('{', "{{").replace('}', "}}"),
        second.replace('{', "{{").replace('}', "}}"),
    );
    let racers = format!(
        "[[racers]]\nname = \"a\"\nkey = \"k1\"\nraw = '{first}'\n\
         [[racers]]\nname = \"b\"\nkey = \"k1\"\nraw = '{second}'\n"
    );
    let text = STUB
        .replace("BASE", &base)
        .replace(
            "[target.retry]",
            "[target.id]\npointer = \"/data/id\"\n[target.replay]\nmarked = false\n[target.retry]",
        )
        .replace(
            "[[racers]]\nname = \"client\"\ncount = 2\nkey = \"k1\"\n",
            &racers,
        );
    ticketflow_harness::blackbox::run_target(&parse(&text), &opts("postgres://unused", 1)).unwrap()
}

#[test]
fn a_body_with_its_members_reordered_or_respaced_is_the_same_intent() {
    let plain = r#"{"amount":100,"currency":"EUR"}"#;
    // The same members in another order and with spaces: one intent, so one id is right.
    let r = one_id_for(plain, r#"{ "currency": "EUR",  "amount": 100 }"#);
    let effect = check(&r, "one effect per intent");
    assert!(effect.passed(), "{}", effect.detail);
    assert_ne!(r.racers[0].body_sha256, r.racers[1].body_sha256);
    // Control: another amount is another intent, and answering it with the key's id fails.
    let r = one_id_for(plain, r#"{"amount":101,"currency":"EUR"}"#);
    assert_eq!(r.verdict, Verdict::Fail);
    assert!(!check(&r, "one effect per intent").passed());
}

#[test]
fn a_replay_that_differs_names_the_members_that_differ_and_ignore_takes_them_out() {
    let run_with = |ignore: &str| {
        let n = Arc::new(AtomicUsize::new(1));
        let base = stub(move |_| {
            let at = n.fetch_add(1, Ordering::SeqCst);
            response(
                "200 OK",
                &[],
                &format!(r#"{{"data":{{"id":7}},"at":{at}}}"#),
            )
        });
        let text = STUB.replace("BASE", &base).replace(
            "[target.retry]",
            &format!(
                "[target.id]\npointer = \"/data/id\"\n[target.replay]\nmarked = false\n\
                 same_answer = true\nignore = [{ignore}]\n[target.retry]"
            ),
        );
        ticketflow_harness::blackbox::run_target(&parse(&text), &opts("postgres://unused", 1))
            .unwrap()
    };
    let r = run_with("");
    let same = check(&r, "same answer");
    assert!(!same.passed());
    assert!(
        same.detail.contains("the bodies differ at /at"),
        "{}",
        same.detail
    );
    let r = run_with("\"/at\"");
    assert!(
        check(&r, "same answer").passed(),
        "{}",
        check(&r, "same answer").detail
    );
}

#[test]
fn the_advisory_barrier_sees_requests_waiting_on_the_services_advisory_lock() {
    // A stub service that, per request, takes pg_advisory_xact_lock(77) in its own database
    // session before answering: the runner's controller holds that lock, so every request is
    // seen waiting on it.
    let Some(db) = TestDb::postgres("bb_advisory") else {
        return;
    };
    let Some(url) = pg_url() else { return };
    let db_url = db.url().unwrap();
    let next = Arc::new(AtomicUsize::new(1));
    let stub_db = db_url.clone();
    let base = stub(move |_| {
        let mut client = postgres::Client::connect(&stub_db, postgres::NoTls).unwrap();
        let mut tx = client.transaction().unwrap();
        tx.execute("SELECT pg_advisory_xact_lock(77)", &[]).unwrap();
        tx.commit().unwrap();
        let id = next.fetch_add(1, Ordering::SeqCst);
        if id == 1 {
            response("201 Created", &[], r#"{"id":1}"#)
        } else {
            response(
                "201 Created",
                &[("Idempotent-Replayed", "true")],
                r#"{"id":1}"#,
            )
        }
    });
    let text = STUB
        .replace("BASE", &base)
        .replace("kind = \"http\"", "kind = \"advisory\"\nadvisory_key = 77")
        .replace(
            "[target]\n",
            &format!("[target]\ndatabase_url = \"{db_url}\"\n"),
        );
    let r = ticketflow_harness::blackbox::run_target(&parse(&text), &opts(&url, 1)).unwrap();
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.checks);
    let wave = &r.evidence.as_ref().unwrap().waves[0];
    assert_eq!(wave.waits.len(), 2);
    assert!(wave.waits.iter().all(|w| w.wait_event == "Lock/advisory"));
}

#[test]
fn an_unreachable_endpoint_is_a_setup_error_and_nothing_is_raced() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let s = parse(&STUB.replace("BASE", &base));
    let e = run_repeated(&s, &opts("postgres://unused", 1)).unwrap_err();
    assert!(e.to_string().contains(&base), "{e}");
}

#[test]
fn verify_loads_the_shipped_targets_but_not_the_negatives_or_the_template() {
    let loaded = ticketflow_harness::load::load_all(&repo_path("scenarios")).unwrap();
    let names: Vec<&str> = loaded.targets.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "k-http-two-serves-same-body",
            "l-http-two-serves-different-bodies",
            "m-http-two-serves-rr-and-serializable"
        ]
    );
    for entry in std::fs::read_dir(repo_path("scenarios/negative")).unwrap() {
        let s = TargetScenario::load(&entry.unwrap().path()).unwrap();
        assert!(s.name.starts_with("negative-"));
    }
}

#[test]
fn target_runs_render_into_a_schema_valid_report_json_junit_and_a_stable_report() {
    let base = stub(|_| response("409 Conflict", &[], r#"{"error":"request in progress"}"#));
    let s = parse(&STUB.replace("BASE", &base));
    let outcome = || run_repeated(&s, &opts("postgres://unused", 1)).unwrap();
    let (first, second) = (outcome(), outcome());
    let loom = ticketflow_harness::killmatrix::LoomReport::default();
    let ctx = crate::report::test_ctx("ticketflow verify");
    let descriptions = [(s.name.clone(), s.description.clone())];
    let input = |t: &TargetOutcome| {
        let input = ticketflow_report::ReportInput {
            scenarios: &[],
            runs: &[],
            targets: std::slice::from_ref(t),
            target_descriptions: &descriptions,
            suites: &[],
            kill: None,
            loom: &loom,
            faults: None,
            soak: None,
            ctx: &ctx,
            specs: &[],
            not_selected: &[],
        };
        (
            ticketflow_report::json::render(&input, 1),
            ticketflow_report::render(&input),
            ticketflow_report::junit::render(&input),
        )
    };
    let (json, md1, xml) = input(&first);
    let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
    let v = crate::report::schema_validator();
    assert_eq!(crate::report::schema_errors(&v, &doc), Vec::<String>::new());
    assert_eq!(doc["targets"][0]["verdict"], "FAIL");
    // Negative control: an unknown answer kind is refused.
    let mut bad = doc.clone();
    bad["targets"][0]["runs"][0]["racers"][0]["attempts"][0]["kind"] = "maybe".into();
    assert!(!crate::report::schema_errors(&v, &bad).is_empty());
    crate::report::junit_shape(&xml).unwrap();
    assert!(xml.contains("<failure "), "{xml}");
    // Another run ({run}, times, ports aside) renders the same REPORT.md above Environment.
    let (_, md2, _) = input(&second);
    let above = |md: &str| {
        md.split("## Environment")
            .next()
            .unwrap()
            .replace(&base, "BASE")
    };
    assert_eq!(above(&md1), above(&md2));
    assert!(
        md1.contains("still in progress after 4 attempt(s)"),
        "{md1}"
    );
}

/// The arguments that wrote `scenarios/examples/orders/` (docs/your-service.md).
const ORDERS_INIT: [&str; 22] = [
    "target",
    "init",
    "--url",
    "http://127.0.0.1:8001",
    "--url",
    "http://127.0.0.1:8002",
    "--target-database-url",
    "${TARGET_DATABASE_URL}",
    "--table",
    "idempotency_keys",
    "--path",
    "/orders",
    "--body",
    r#"{"item":"book","quantity":1}"#,
    "--invalid-body",
    r#"{"item":"","quantity":0}"#,
    "--scope-header",
    "X-User-Id",
    "--count",
    "orders=SELECT count(*) FROM orders WHERE idempotency_key = {key}",
    "--out",
    "out",
];

#[test]
fn the_starter_example_in_the_readme_is_what_target_init_writes() {
    let dir = tempfile::tempdir().unwrap();
    let out = crate::cli::run_cli_in(dir.path(), &ORDERS_INIT, b"");
    assert_eq!(out.code, 0, "{}", out.stderr);
    for entry in std::fs::read_dir(repo_path("scenarios/examples/orders")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap();
        let written = std::fs::read_to_string(dir.path().join("out").join(name)).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            written,
            "{} is stale: rerun `ticketflow {}`",
            path.display(),
            ORDERS_INIT.join(" ")
        );
    }
    // A second init into the same directory refuses to overwrite.
    let again = crate::cli::run_cli_in(dir.path(), &ORDERS_INIT, b"");
    assert_eq!(again.code, 2, "{}", again.stderr);
}

#[test]
fn the_cli_refuses_isolation_and_unreachable_targets_with_exit_2() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("t.toml");
    std::fs::write(&file, STUB.replace("BASE", &base)).unwrap();
    let f = file.to_str().unwrap();
    let iso = crate::cli::run_cli_in(
        dir.path(),
        &["scenario", "run", f, "--isolation", "serializable"],
        b"",
    );
    assert_eq!(iso.code, 2, "{}", iso.stderr);
    assert!(iso.stderr.contains("--isolation"), "{}", iso.stderr);
    let down = crate::cli::run_cli_in(dir.path(), &["scenario", "run", f], b"");
    assert_eq!(down.code, 2, "{}", down.stderr);
    assert!(down.stderr.contains(&base), "{}", down.stderr);
    // A bad file names its line.
    std::fs::write(
        &file,
        STUB.replace("BASE", &base)
            .replace("[[racers]]", "[target.id]\npointer = \"id\"\n[[racers]]"),
    )
    .unwrap();
    let bad = crate::cli::run_cli_in(dir.path(), &["scenario", "run", f], b"");
    assert_eq!(bad.code, 2);
    assert!(bad.stderr.contains("t.toml:"), "{}", bad.stderr);
}

#[test]
fn a_target_that_dies_mid_race_is_a_fail_with_the_transport_error() {
    // The stub reads each request and closes the connection without an answer, as a process
    // killed mid-request does: every attempt is a transport error, retried, then reported.
    let base = stub(|_| String::new());
    let s = parse(&STUB.replace("BASE", &base));
    let r = ticketflow_harness::blackbox::run_target(&s, &opts("postgres://unused", 1)).unwrap();
    assert_eq!(r.verdict, Verdict::Fail);
    let answers = check(&r, "answers");
    assert!(!answers.passed());
    assert!(
        answers.detail.contains("transport error"),
        "{}",
        answers.detail
    );
    assert!(r.racers.iter().all(|x| x.attempts.len() == 4));
}

#[test]
fn in_progress_answers_before_the_release_count_as_seen_not_as_a_broken_barrier() {
    // Like libraries with an in-memory or Redis lock: the first request claims the key and
    // waits on the (locked) orders table; the others are answered 409 in progress at once,
    // before the release. They saw the concurrent request, so the barrier holds with one
    // waiter; after the release they retry and are replayed.
    let Some(db) = TestDb::postgres("bb_inprogress") else {
        return;
    };
    let Some(url) = pg_url() else { return };
    let db_url = db.url().unwrap();
    let mut c = postgres::Client::connect(&db_url, postgres::NoTls).unwrap();
    c.batch_execute("CREATE TABLE orders (id serial PRIMARY KEY, key text NOT NULL)")
        .unwrap();
    let state = Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::<
        String,
        Option<i32>,
    >::new()));
    let stub_db = db_url.clone();
    let base = stub(move |req| {
        {
            let mut s = state.lock().unwrap();
            match s.get(&req.key) {
                Some(Some(id)) => {
                    return response(
                        "201 Created",
                        &[("Idempotent-Replayed", "true")],
                        &format!(r#"{{"id":{id}}}"#),
                    )
                }
                Some(None) => return response("409 Conflict", &[], "in progress"),
                None => {
                    s.insert(req.key.clone(), None);
                }
            }
        }
        let mut client = postgres::Client::connect(&stub_db, postgres::NoTls).unwrap();
        let id: i32 = client
            .query_one(
                "INSERT INTO orders (key) VALUES ($1) RETURNING id",
                &[&req.key],
            )
            .unwrap()
            .get(0);
        state.lock().unwrap().insert(req.key.clone(), Some(id));
        response("201 Created", &[], &format!(r#"{{"id":{id}}}"#))
    });
    let text = STUB
        .replace("BASE", &base)
        .replace(
            "kind = \"http\"",
            "kind = \"table-lock\"\ntable = \"orders\"\nlock = \"exclusive\"",
        )
        .replace(
            "[target]\n",
            &format!("[target]\ndatabase_url = \"{db_url}\"\n"),
        )
        .replace("count = 2", "count = 3")
        .replace(
            "backoff_ms = 1\nmax_backoff_ms = 2",
            "backoff_ms = 20\nmax_backoff_ms = 200",
        )
        .replace("attempts = 4", "attempts = 20");
    let r = ticketflow_harness::blackbox::run_target(&parse(&text), &opts(&url, 1)).unwrap();
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.checks);
    let wave = &r.evidence.as_ref().unwrap().waves[0];
    assert_eq!(wave.waits.len(), 1, "{wave:?}");
    let retried: Vec<_> = r.racers.iter().filter(|x| x.attempts.len() > 1).collect();
    assert_eq!(retried.len(), 2);
    assert!(retried
        .iter()
        .all(|x| x.attempts[0].kind == ticketflow_harness::blackbox::AnswerKind::InProgress));
}

#[test]
fn target_init_refuses_a_body_that_names_a_member_twice() {
    for (flag, body) in [
        ("--body", r#"{"item":"book","item":"pen"}"#),
        ("--invalid-body", r#"{"a":{"b":1,"\u0062":2}}"#),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let args: Vec<&str> = ORDERS_INIT
            .chunks(2)
            .flat_map(|pair| match pair {
                [f, _] if *f == flag => vec![flag, body],
                other => other.to_vec(),
            })
            .collect();
        let out = crate::cli::run_cli_in(dir.path(), &args, b"");
        assert_eq!(out.code, 2, "{flag}: {}", out.stderr);
        assert!(out.stderr.contains("duplicate member"), "{}", out.stderr);
        assert!(
            !dir.path().join("out").exists(),
            "files written for a refused body"
        );
    }
}

/// A target that accepts connections, reads nothing and never answers; its base URL. The
/// accepted connections are kept open until the test process ends.
fn silent_target() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming().flatten() {
            held.push(conn);
        }
    });
    base
}

#[test]
fn a_target_that_never_answers_times_out_once_per_racer_and_is_not_retried() {
    let base = silent_target();
    let text = STUB
        .replace("BASE", &base)
        .replace(
            "preset = \"ietf\"",
            "preset = \"ietf\"\nrequest_timeout_ms = 300",
        )
        .replace("attempts = 4", "attempts = 10");
    let r = ticketflow_harness::blackbox::run_target(&parse(&text), &opts("postgres://unused", 1))
        .unwrap();
    assert_eq!(r.verdict, Verdict::Fail, "{:?}", r.reason);
    for racer in &r.racers {
        assert_eq!(
            racer.attempts.len(),
            1,
            "{}: a timeout was retried",
            racer.name
        );
        assert_eq!(
            racer.kind(),
            ticketflow_harness::blackbox::AnswerKind::Timeout
        );
    }
    let answers = check(&r, "answers");
    assert!(
        answers.detail.contains("no answer within 300 ms"),
        "{}",
        answers.detail
    );
    assert!(
        !answers.detail.contains("transport error"),
        "{}",
        answers.detail
    );
}

#[test]
fn a_silent_target_behind_a_table_lock_is_pending_and_never_said_to_have_answered() {
    let Some(db) = TestDb::postgres("bb_silent") else {
        return;
    };
    let Some(url) = pg_url() else { return };
    let db_url = db.url().unwrap();
    let mut c = postgres::Client::connect(&db_url, postgres::NoTls).unwrap();
    c.batch_execute("CREATE TABLE orders (id serial PRIMARY KEY)")
        .unwrap();
    let base = silent_target();
    let text = STUB
        .replace("BASE", &base)
        .replace(
            "kind = \"http\"\ntimeout_ms = 5000",
            "kind = \"table-lock\"\ntable = \"orders\"\nlock = \"exclusive\"\ntimeout_ms = 1500",
        )
        .replace(
            "[target]\n",
            &format!("[target]\ndatabase_url = \"{db_url}\"\nrequest_timeout_ms = 500\n"),
        )
        + "\n[[racers]]\nname = \"later\"\nwave = 2\nkey = \"k1\"\n";
    let r = ticketflow_harness::blackbox::run_target(&parse(&text), &opts(&url, 1)).unwrap();
    assert_eq!(r.verdict, Verdict::Pending, "{:?}", r.checks);
    let reason = r.reason.unwrap();
    assert!(reason.contains("not run as declared"), "{reason}");
    assert!(!reason.contains("was answered"), "{reason}");
    // The wave after a barrier that was not reached is not sent.
    let later = r.racers.iter().find(|x| x.name == "later").unwrap();
    assert!(
        later
            .last()
            .answer
            .as_ref()
            .unwrap_err()
            .starts_with("not sent"),
        "{:?}",
        later.attempts
    );
    assert!(r.racers.iter().all(|x| x.attempts.len() == 1));
}

/// The headings of `verify`'s self-check sections in REPORT.md, and its lines about a kill
/// matrix or loom report that did not run: none belongs in a report of given files.
const SELF_CHECK_MARKS: [&str; 8] = [
    "## Property suites",
    "## Model checking (loom)",
    "## Faults and bad input",
    "## Soak",
    "## Kill matrix",
    "Loom models: **",
    "Kill matrix: **",
    "--no-kill-matrix",
];

#[test]
fn scenario_run_report_covers_only_the_given_files_and_names_each_run_id() {
    let base = stub(|_| response("409 Conflict", &[], r#"{"error":"request in progress"}"#));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("stub.toml"), STUB.replace("BASE", &base)).unwrap();
    // The report's directory does not exist yet: --report creates it.
    let report = dir.path().join("out/nested/REPORT.md");
    assert!(!report.parent().unwrap().exists());
    let out = crate::cli::run_cli_in(
        dir.path(),
        &[
            "scenario",
            "run",
            "stub.toml",
            "--report",
            "out/nested/REPORT.md",
        ],
        b"",
    );
    // The verdict decides the exit code, as without --report: the stub is in progress forever.
    assert_eq!(out.code, 1, "{}\n{}", out.stdout, out.stderr);
    let plain = crate::cli::run_cli_in(dir.path(), &["scenario", "run", "stub.toml"], b"");
    assert_eq!(plain.code, out.code, "{}", plain.stderr);

    let nested = report.parent().unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(nested.join("report.json")).unwrap())
            .unwrap();
    let v = crate::report::schema_validator();
    assert_eq!(
        crate::report::schema_errors(&v, &json),
        Vec::<String>::new()
    );
    assert_eq!(json["exit_code"], 1);
    assert_eq!(json["scope"]["kind"], "files");
    assert_eq!(json["scope"]["files"], serde_json::json!(["stub.toml"]));
    assert!(json["loom"].is_null(), "{}", json["loom"]);
    assert!(json["kill_matrix"].is_null() && json["faults"].is_null());
    assert_eq!(json["property_suites"], serde_json::json!([]));
    let kinds: Vec<&str> = json["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["target"]);
    let run_id = json["targets"][0]["runs"][0]["evidence"]["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(!run_id.is_empty());

    let md = std::fs::read_to_string(&report).unwrap();
    assert!(md.contains("covers only the files given"), "{md}");
    assert!(md.contains("| stub | 1 | **FAIL** |"), "{md}");
    assert!(md.contains(&format!("`{run_id}`")), "{md}");
    for mark in SELF_CHECK_MARKS {
        assert!(
            !md.contains(mark),
            "{mark:?} in a report of given files:\n{md}"
        );
    }
    let xml = std::fs::read_to_string(nested.join("report.junit.xml")).unwrap();
    crate::report::junit_shape(&xml).unwrap();
    assert!(xml.contains("ticketflow scenario run"), "{xml}");
    assert!(xml.contains("<failure ") && !xml.contains("loom"), "{xml}");
    assert!(nested.join("reports/details/black-box.md").exists());

    // The text output names the same run id: one per run, so each run's differs.
    assert!(
        out.stdout.contains(&format!("{{run}} = {run_id}")),
        "{}",
        out.stdout
    );
    assert!(
        plain.stdout.contains("{run} = ") && !plain.stdout.contains(&run_id),
        "{}",
        plain.stdout
    );
}

#[test]
fn scenario_run_report_keeps_the_exit_code_refuses_a_non_md_path_and_exits_1_unwritten() {
    // Each key is created once, then replayed: nothing fails; one run of an HTTP-level
    // barrier is PENDING, which exits 0 at the default PostgreSQL URL, as without --report.
    let seen = Arc::new(std::sync::Mutex::new(
        std::collections::BTreeSet::<String>::new(),
    ));
    let base = stub(move |req| {
        if seen.lock().unwrap().insert(req.key.clone()) {
            response("201 Created", &[], r#"{"id":1}"#)
        } else {
            response(
                "201 Created",
                &[("Idempotent-Replayed", "true")],
                r#"{"id":1}"#,
            )
        }
    });
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("stub.toml"), STUB.replace("BASE", &base)).unwrap();
    let bad = crate::cli::run_cli_in(
        dir.path(),
        &["scenario", "run", "stub.toml", "--report", "out/report.txt"],
        b"",
    );
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    assert!(bad.stderr.contains("*.md"), "{}", bad.stderr);
    assert!(
        !dir.path().join("out").exists(),
        "nothing runs or is written"
    );
    let out = crate::cli::run_cli_in(
        dir.path(),
        &[
            "scenario",
            "run",
            "stub.toml",
            "--report",
            "REPORT.md",
            "--repeat",
            "3",
        ],
        b"",
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("report.json")).unwrap())
            .unwrap();
    let v = crate::report::schema_validator();
    assert_eq!(
        crate::report::schema_errors(&v, &json),
        Vec::<String>::new()
    );
    assert_eq!(json["exit_code"], 0);
    assert_ne!(
        json["targets"][0]["verdict"], "FAIL",
        "{}",
        json["targets"][0]
    );
    let run = &json["targets"][0]["runs"][0];
    let (verdict, run_id) = (
        run["verdict"].as_str().unwrap(),
        run["evidence"]["run_id"].as_str().unwrap(),
    );
    let md = std::fs::read_to_string(dir.path().join("REPORT.md")).unwrap();
    assert!(
        md.contains(&format!("| stub | 1 | **{verdict}** | `{run_id}` |")),
        "{md}"
    );
    assert!(!md.contains("## Verdicts: PostgreSQL") && !md.contains("## Verdicts: SQLite"));
    // A report that cannot be written (its directory is a file) is exit 1, after the runs.
    std::fs::write(dir.path().join("blocker"), "").unwrap();
    let unwritable = crate::cli::run_cli_in(
        dir.path(),
        &[
            "scenario",
            "run",
            "stub.toml",
            "--report",
            "blocker/REPORT.md",
        ],
        b"",
    );
    assert_eq!(unwritable.code, 1, "{}", unwritable.stderr);
    assert!(
        unwritable.stderr.contains("blocker"),
        "{}",
        unwritable.stderr
    );
    assert!(
        unwritable.stdout.contains("{run} = "),
        "{}",
        unwritable.stdout
    );
    // A PENDING item is listed, but no kill matrix or loom report is said to be missing.
    for mark in SELF_CHECK_MARKS {
        assert!(
            !md.contains(mark),
            "{mark:?} in a report of given files:\n{md}"
        );
    }
}
