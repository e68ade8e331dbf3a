//! Kills at a step (`[[fault]] kind = "kill"`, docs/INTERPOSER.md "Faults at a step"): the
//! real `serve` killed after each of a racer's store commands converges once restarted;
//! `serve --variant claim-never-expires` leaves its key in progress for ever when killed
//! between its two commits and passes every file without a kill; a Redis lock without expiry
//! left by a killed Python service fails `after the kill`, one with a TTL the file states
//! passes; a service that exits on its own when its store connection is cut is named with its
//! status and stderr; `env` and `${NAME}` reach the service's process; a request paused at
//! the proxy past a Redis lock's TTL is one effect on `serve` and two on `serve --variant
//! redis-lock-expires`, which passes the same file without the pause; a cut the store client
//! absorbs by resending on a new connection is stated and not counted as fault coverage; a
//! receipt cut after the answer (the conductor keeps a racer's sessions after its answer)
//! converges on `serve` and makes `serve --variant answer-stored-after-response` create again;
//! a service whose requests share one Redis connection is PENDING with the connection named.

use ticketflow_harness::blackbox::{
    run_repeated, summary, RunOptions, TargetOutcome, TargetScenario,
};
use ticketflow_harness::verdict::Verdict;

/// Redis db of these tests (their keys start with `tfv-ttl:` and are deleted after).
const REDIS_DB: &str = "redis://127.0.0.1:6379/12";

fn run(s: &TargetScenario, url: &str) -> TargetOutcome {
    let opts = RunOptions {
        exe: Some(std::path::PathBuf::from(env!("CARGO_BIN_EXE_ticketflow"))),
        ..RunOptions::new(crate::support::server(url))
    };
    run_repeated(s, &opts).unwrap()
}

fn show(o: &TargetOutcome) -> String {
    format!(
        "{:?} {:?}\n{}",
        o.reason,
        o.coverage,
        summary::summary_text(o)
    )
}

fn failed(r: &ticketflow_harness::blackbox::TargetRun) -> Vec<&'static str> {
    r.checks
        .iter()
        .filter(|c| !c.passed())
        .map(|c| c.name)
        .collect()
}

/// A shipped interposed file with `args` appended to its service command.
fn shipped(file: &str, args: &[&str]) -> TargetScenario {
    let path = crate::support::repo_path(&format!("scenarios/interposed/{file}"));
    let text = std::fs::read_to_string(&path).unwrap();
    let extra: String = args.iter().map(|a| format!(", \"{a}\"")).collect();
    let text = text.replacen(
        "\"{database_url}\"]",
        &format!("\"{{database_url}}\"{extra}]"),
        1,
    );
    TargetScenario::parse(&path, &text, &|_| None).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

#[test]
fn serve_killed_after_each_step_converges_and_claim_never_expires_is_left_in_progress() {
    let Some(url) = crate::support::pg_url() else {
        return;
    };
    let o = run(&shipped("two-racers-kill-each-step.toml", &[]), &url);
    assert_eq!(o.verdict, Verdict::Pass, "{}", show(&o));
    // One run per step of the first racer's first attempt, each a kill and a restart.
    assert!(o.runs.len() >= 8, "{}", show(&o));
    for r in &o.runs {
        let fault = r.checks.iter().find(|c| c.name == "fault").unwrap();
        assert!(
            fault.detail.contains("SIGKILL to service api")
                && fault.detail.contains("started again as pid"),
            "{}",
            fault.detail
        );
        let after = r
            .checks
            .iter()
            .find(|c| c.name == "after the kill")
            .unwrap();
        assert!(after.passed(), "{}", after.detail);
    }

    let o = run(
        &shipped(
            "two-racers-kill-each-step.toml",
            &["--variant", "claim-never-expires"],
        ),
        &url,
    );
    assert_eq!(o.verdict, Verdict::Fail, "{}", show(&o));
    let reason = o.reason.clone().unwrap_or_default();
    assert!(
        reason.contains("after the kill: key stuck in progress for"),
        "{reason}"
    );
    // The kill between the claim's COMMIT and the completion: the claim outlives its owner.
    let failing = o.runs.iter().find(|r| r.verdict == Verdict::Fail).unwrap();
    assert!(
        failed(failing).contains(&"after the kill"),
        "{:?}",
        failed(failing)
    );
    let fault = failing.checks.iter().find(|c| c.name == "fault").unwrap();
    assert!(fault.detail.contains("(COMMIT)"), "{}", fault.detail);
}

/// One client of the Python stub whose lock lives in Redis (`ttl_ms` 0: no expiry), its
/// service killed right after the server took the lock; `extra` is appended to the
/// `[[target.service]]` table.
fn stub_scenario(ttl_ms: u64, stated_ttl_ms: Option<u64>, fault: &str, extra: &str) -> String {
    let stated = stated_ttl_ms
        .map(|t| format!("lock_ttl_ms = {t}"))
        .unwrap_or_default();
    format!(
        r#"
name = "kill-stub"
description = "a Python service with its lock in Redis, killed or cut at a step"

[barrier]
kind = "interposer"
timeout_ms = 5000

[target]
redis_url = "{REDIS_DB}"
{stated}

[target.retry]
attempts = 3
backoff_ms = 1

[target.request]
method = "POST"
path = "/orders"
body = {{ sku = "a-1", quantity = 1 }}

[[target.service]]
name = "shop"
command = ["python3", "${{STUB}}", "{{port}}", "{{redis_url}}", "{ttl_ms}"]
{extra}

[[racers]]
name = "r"
key = "k1"

{fault}
"#
    )
}

fn stub_env(name: &str) -> Option<String> {
    (name == "STUB").then(|| {
        crate::support::repo_path("tests/integration/ttl_lock_stub.py")
            .display()
            .to_string()
    })
}

fn parse_stub(text: &str) -> TargetScenario {
    TargetScenario::parse(std::path::Path::new("kill-stub.toml"), text, &stub_env)
        .unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// Deletes the stub's keys of `outcomes`' runs (each key names its run's `{run}`), so that
/// tests running at once never delete each other's.
fn clean_stub_keys(outcomes: &[&TargetOutcome]) {
    let mut c = redis::Client::open(REDIS_DB)
        .unwrap()
        .get_connection()
        .unwrap();
    for run in outcomes
        .iter()
        .flat_map(|o| o.runs.iter())
        .filter_map(|r| r.evidence.as_ref())
    {
        let pattern = format!("tfv-ttl:*{}*", run.run_id);
        let keys: Vec<String> = redis::cmd("KEYS").arg(&pattern).query(&mut c).unwrap();
        if !keys.is_empty() {
            let _: () = redis::cmd("DEL").arg(&keys).query(&mut c).unwrap();
        }
    }
}

const KILL_AFTER_LOCK: &str =
    "[[fault]]\nkind = \"kill\"\nracer = \"r\"\nmatch = \"SET\"\nstore = \"redis\"\nwhen = \"after\"\n";

#[test]
fn a_lock_a_killed_service_leaves_without_expiry_is_stuck_and_one_with_its_ttl_passes() {
    let Some(url) = crate::support::pg_url() else {
        return;
    };
    if !crate::support::redis_up_at(REDIS_DB) {
        return;
    }
    let stuck = run(
        &parse_stub(&stub_scenario(0, None, KILL_AFTER_LOCK, "")),
        &url,
    );
    let expiring = run(
        &parse_stub(&stub_scenario(700, Some(700), KILL_AFTER_LOCK, "")),
        &url,
    );
    clean_stub_keys(&[&stuck, &expiring]);
    assert_eq!(stuck.verdict, Verdict::Fail, "{}", show(&stuck));
    let reason = stuck.reason.clone().unwrap_or_default();
    assert!(
        reason.contains("after the kill: key stuck in progress for")
            && reason.contains("declares no lock_ttl_ms"),
        "{reason}"
    );
    assert_eq!(expiring.verdict, Verdict::Pass, "{}", show(&expiring));
    let r = &expiring.runs[0];
    let after = r
        .checks
        .iter()
        .find(|c| c.name == "after the kill")
        .unwrap();
    assert!(
        after.detail.contains("SIGKILL to service shop"),
        "{}",
        after.detail
    );
    let fault = r.checks.iter().find(|c| c.name == "fault").unwrap();
    assert!(fault.detail.contains("SET"), "{}", fault.detail);
}

#[test]
fn a_service_that_exits_on_a_cut_connection_is_named_with_its_status_and_stderr() {
    let Some(url) = crate::support::pg_url() else {
        return;
    };
    if !crate::support::redis_up_at(REDIS_DB) {
        return;
    }
    let cut = "[[fault]]\nracer = \"r\"\nmatch = \"INCR\"\nstore = \"redis\"\ncut = \"before\"\n";
    // `env` tells the stub to exit on a store error; without it the stub answers 503.
    let exits = stub_scenario(1000, None, cut, "env = { TTL_STUB_ON_ERROR = \"exit\" }");
    let o = run(&parse_stub(&exits), &url);
    let answers = run(&parse_stub(&stub_scenario(1000, None, cut, "")), &url);
    clean_stub_keys(&[&o, &answers]);
    assert_eq!(o.verdict, Verdict::Fail, "{}", show(&o));
    let reason = o.reason.clone().unwrap_or_default();
    assert!(
        reason.contains("services up")
            && reason.contains("exited with exit status 3")
            && reason.contains("fatal: unhandled store error")
            && reason.contains("INCR"),
        "{reason}"
    );
    // The same stub without the env var answers 503 and the retry proceeds: no exit.
    let up = answers.runs[0]
        .checks
        .iter()
        .find(|c| c.name == "services up")
        .unwrap();
    assert!(up.passed(), "{}\n{}", up.detail, show(&answers));
}

#[test]
fn a_service_command_with_an_unset_variable_is_a_load_error_at_its_line() {
    let text =
        stub_scenario(0, None, KILL_AFTER_LOCK, "").replace("${STUB}", "${TFV_NOT_SET_ANYWHERE}");
    let e = TargetScenario::parse(std::path::Path::new("kill-stub.toml"), &text, &stub_env)
        .expect_err("an unset variable in a service command is refused");
    let line = text
        .lines()
        .position(|l| l.contains("TFV_NOT_SET_ANYWHERE"))
        .unwrap()
        + 1;
    let shown = e.to_string();
    assert!(
        shown.contains(&format!("kill-stub.toml:{line}")) && shown.contains("TFV_NOT_SET_ANYWHERE"),
        "{shown}"
    );
    // A kill needs a service the runner starts: refused for base_urls.
    let text = r#"
name = "kill-by-hand"
description = "a kill of a service started by hand"
[barrier]
kind = "interposer"
[target]
base_urls = ["http://127.0.0.1:9"]
database_url = "postgres://postgres@127.0.0.1:5432/postgres"
interposer = "127.0.0.1:7000"
[target.request]
method = "POST"
path = "/orders"
[[racers]]
name = "r"
key = "k1"
[[fault]]
kind = "kill"
racer = "r"
step = 1
when = "before"
"#;
    let e = TargetScenario::parse(std::path::Path::new("by-hand.toml"), text, &|_| None)
        .expect_err("a kill of a service started by hand is refused");
    assert!(e.to_string().contains("started by hand"), "{e}");
}

#[test]
fn a_request_paused_past_the_lock_ttl_is_one_effect_on_serve_and_two_on_redis_lock_expires() {
    let Some(url) = crate::support::pg_url() else {
        return;
    };
    if !crate::support::redis_up_at("redis://127.0.0.1:6379/9") {
        return;
    }
    let o = run(&shipped("two-racers-pause-past-lock-ttl.toml", &[]), &url);
    assert_eq!(o.verdict, Verdict::Pass, "{}", show(&o));
    let fault = o.runs[0].checks.iter().find(|c| c.name == "fault").unwrap();
    assert!(
        fault
            .detail
            .contains("held at the proxy for 1500 ms while the other racers went on"),
        "{}",
        fault.detail
    );
    let o = run(
        &shipped(
            "two-racers-pause-past-lock-ttl.toml",
            &["--variant", "redis-lock-expires", "--lease", "{redis_url}"],
        ),
        &url,
    );
    assert_eq!(o.verdict, Verdict::Fail, "{}", show(&o));
    let failing = o.runs.iter().find(|r| r.verdict == Verdict::Fail).unwrap();
    let failed = failed(failing);
    assert!(
        failed.contains(&"one effect per intent") && failed.contains(&"counts"),
        "{failed:?}\n{}",
        show(&o)
    );
    // Without the pause the same variant is serialized by its lock: the explored file passes.
    let o = run(
        &shipped(
            "two-racers-same-key-redis.toml",
            &["--variant", "redis-lock-expires", "--lease", "{redis_url}"],
        ),
        &url,
    );
    assert_eq!(o.verdict, Verdict::Pass, "{}", show(&o));
}

#[test]
fn a_cut_the_store_client_absorbs_by_resending_is_stated_and_not_counted_as_coverage() {
    let Some(url) = crate::support::pg_url() else {
        return;
    };
    if !crate::support::redis_up_at(REDIS_DB) {
        return;
    }
    let cut = "[[fault]]\nracer = \"r\"\nmatch = \"INCR\"\nstore = \"redis\"\ncut = \"before\"\n";
    // `resend`: the stub sends a command whose connection was lost again on a new one.
    let resends = stub_scenario(1000, None, cut, "env = { TTL_STUB_ON_ERROR = \"resend\" }");
    let o = run(&parse_stub(&resends), &url);
    // Without it the cut reaches the request: answered 503, then retried.
    let felt = run(&parse_stub(&stub_scenario(1000, None, cut, "")), &url);
    clean_stub_keys(&[&o, &felt]);
    assert_eq!(o.verdict, Verdict::Pass, "{}", show(&o));
    let fault = o.runs[0].checks.iter().find(|c| c.name == "fault").unwrap();
    assert!(
        fault
            .detail
            .contains("absorbed below the service: r's first attempt was answered created"),
        "{}",
        fault.detail
    );
    let coverage = o.coverage.clone().unwrap_or_default();
    assert!(
        coverage.contains("1 of 1 run(s) cut a step the request never felt"),
        "{coverage}"
    );
    let fault = felt.runs[0]
        .checks
        .iter()
        .find(|c| c.name == "fault")
        .unwrap();
    assert!(!fault.detail.contains("absorbed"), "{}", fault.detail);
    assert!(!felt
        .coverage
        .clone()
        .unwrap_or_default()
        .contains("never felt"));
}

#[test]
fn a_receipt_cut_after_the_answer_converges_on_serve_and_answer_stored_after_response_creates_again(
) {
    let Some(url) = crate::support::pg_url() else {
        return;
    };
    let file = "cut-after-the-answer.toml";
    let o = run(&shipped(file, &[]), &url);
    assert_eq!(o.verdict, Verdict::Pass, "{}", show(&o));
    let o = run(
        &shipped(file, &["--variant", "answer-stored-after-response"]),
        &url,
    );
    assert_eq!(o.verdict, Verdict::Fail, "{}", show(&o));
    let r = &o.runs[0];
    assert!(failed(r).contains(&"counts"), "{:?}", failed(r));
    // The cut struck after the first client's answer: the conductor kept its sessions.
    let fault = r.checks.iter().find(|c| c.name == "fault").unwrap();
    assert!(
        fault.detail.contains("idempotency_receipts"),
        "{}",
        fault.detail
    );
    let after: usize = r
        .evidence
        .iter()
        .flat_map(|e| e.waves.iter())
        .filter_map(|w| w.schedule.as_ref())
        .map(|s| s.after_answer)
        .sum();
    assert!(after > 0, "no step was conducted after the answer");
    // Without the cut the same variant stores its receipt and the second client replays.
    let o = run(
        &shipped(
            "two-racers-same-key.toml",
            &["--variant", "answer-stored-after-response"],
        ),
        &url,
    );
    assert_eq!(o.verdict, Verdict::Pass, "{}", show(&o));
}

/// A stub scenario with two racers of two keys in place of its one racer, a short barrier
/// timeout and one schedule per order of the two.
fn two_keys(text: &str) -> String {
    text.replace(
        "timeout_ms = 5000",
        "timeout_ms = 1500\n\n[schedule]\nmode = \"bounded\"\npreemptions = 0",
    )
    .replace(
        "[[racers]]\nname = \"r\"\nkey = \"k1\"",
        "[[racers]]\nname = \"a\"\nkey = \"k1\"\n\n[[racers]]\nname = \"b\"\nkey = \"k2\"",
    )
}

#[test]
fn a_service_sharing_one_store_connection_is_pending_with_the_connection_named() {
    let Some(url) = crate::support::pg_url() else {
        return;
    };
    if !crate::support::redis_up_at(REDIS_DB) {
        return;
    }
    // Two racers (two keys) of a stub whose requests share one pipelined Redis connection.
    let text = two_keys(&stub_scenario(
        1000,
        None,
        "",
        "env = { TTL_STUB_SHARED = \"1\" }",
    ));
    let o = run(&parse_stub(&text), &url);
    clean_stub_keys(&[&o]);
    assert_eq!(o.verdict, Verdict::Pending, "{}", show(&o));
    let reason = o.reason.clone().unwrap_or_default();
    assert!(
        reason.contains("of a next command waiting behind its held step")
            && reason.contains("one store connection (a shared client)"),
        "{reason}"
    );
    // The same stub with a connection per request thread is raced as declared.
    let own = two_keys(&stub_scenario(1000, None, "", ""));
    let o = run(&parse_stub(&own), &url);
    clean_stub_keys(&[&o]);
    assert_eq!(o.verdict, Verdict::Pass, "{}", show(&o));
}
