//! Black-box targets whose effects live in Redis: Redis counts, the fair conductor, the
//! `CLIENT PAUSE` barrier. The services are `redis_effect_stub.py` (correct, or applying its
//! effect twice behind one id) and `redis_lock_stub.py` (check, then lock: a known defect).
//! Counts and exploration use db 11 of the shared Redis; the pause barrier pauses a whole
//! server, so its tests start a Redis server of their own.

use std::time::{Duration, Instant};

use ticketflow::scenario::Verdict;
use ticketflow::target::check::{summary_text, REDIS_EFFECTS_NOT_COUNTED};
use ticketflow::target::{run_repeated, RunOptions, TargetOutcome, TargetScenario};

const SHARED_REDIS: &str = "redis://127.0.0.1:6379/11";

fn redis_up(url: &str) -> bool {
    let ok = redis::Client::open(url)
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
        .is_ok();
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set and Redis is required"
        );
        eprintln!("skipping Redis test: no server at {url}");
    }
    ok
}

/// Deletes the stubs' keys (`tfv-fx:*`, `tfv-stub:*`) from the Redis at `url`.
fn clean(url: &str) {
    let Ok(mut c) = redis::Client::open(url).and_then(|c| c.get_connection()) else {
        return;
    };
    for pattern in ["tfv-fx:*", "tfv-stub:*"] {
        let keys: Vec<String> = redis::cmd("KEYS").arg(pattern).query(&mut c).unwrap();
        if !keys.is_empty() {
            let _: () = redis::cmd("DEL").arg(&keys).query(&mut c).unwrap();
        }
    }
}

fn parse(name: &str, text: &str) -> TargetScenario {
    TargetScenario::parse(std::path::Path::new(name), text, &|_| None).unwrap()
}

fn run(s: &TargetScenario, pg: &str, repeat: usize) -> TargetOutcome {
    let opts = RunOptions {
        exe: Some(std::path::PathBuf::from(env!("CARGO_BIN_EXE_ticketflow"))),
        repeat,
        ..RunOptions::new(pg)
    };
    run_repeated(s, &opts).unwrap()
}

/// Two racers, one key, against `redis_effect_stub.py MODE`, with the given barrier table,
/// extra `[target]` lines and extra racer lines; the Redis count `effects` is expected to be 1
/// when `counted`.
fn effect_stub(
    mode: &str,
    barrier: &str,
    redis_url: &str,
    counted: bool,
    extra_target: &str,
    extra_racers: &str,
) -> TargetScenario {
    let script = crate::support::repo_path("tests/integration/redis_effect_stub.py");
    let expect = if counted {
        "[[expect.counts]]\nkey = \"k1\"\neffects = 1\n"
    } else {
        ""
    };
    parse(
        "redis-effects.toml",
        &format!(
            r#"
name = "redis-effects-{mode}"
description = "keys and effects in Redis only"

[barrier]
{barrier}

[target]
redis_url = "{redis_url}"
{extra_target}

[target.request]
method = "POST"
path = "/orders"
body = {{ sku = "a-1", quantity = 1 }}

[target.count]
effects = {{ redis = ["GET", "tfv-fx:effects:{{key}}"] }}

[[target.service]]
name = "shop"
command = ["python3", "{script}", "{{port}}", "{{redis_url}}", "{mode}"]

[[racers]]
name = "r"
count = 2
key = "k1"
{extra_racers}

[expect]
outcomes = {{ r = ["created", "replayed"] }}

{expect}
"#,
            script = script.display()
        ),
    )
}

#[test]
fn an_effect_applied_twice_in_redis_fails_only_on_the_redis_count() {
    let Some(pg) = crate::support::pg_url() else {
        return;
    };
    if !redis_up(SHARED_REDIS) {
        return;
    }
    let http = "kind = \"http\"";
    // The correct service, counted: PASS, and the evidence line shows the Redis count.
    let o = run(
        &effect_stub("correct", http, SHARED_REDIS, true, "", ""),
        &pg,
        3,
    );
    assert_eq!(o.verdict, Verdict::Pass, "{}", summary_text(&o));
    let line = o.runs[0].evidence_line.clone().unwrap();
    assert!(line.contains("effects[key=k1] = 1"), "{line}");
    assert!(!line.contains(REDIS_EFFECTS_NOT_COUNTED), "{line}");
    // The service that acts twice behind one id, not counted: every answer is right, so it
    // PASSes, and the PASS says the Redis effects were not counted.
    let o = run(
        &effect_stub("double", http, SHARED_REDIS, false, "", ""),
        &pg,
        3,
    );
    assert_eq!(o.verdict, Verdict::Pass, "{}", summary_text(&o));
    let line = o.runs[0].evidence_line.clone().unwrap();
    assert!(line.contains(REDIS_EFFECTS_NOT_COUNTED), "{line}");
    // The same service, counted in Redis: FAIL on the count, and on nothing else.
    let o = run(
        &effect_stub("double", http, SHARED_REDIS, true, "", ""),
        &pg,
        1,
    );
    clean(SHARED_REDIS);
    assert_eq!(o.verdict, Verdict::Fail, "{}", summary_text(&o));
    let reason = o.reason.clone().unwrap();
    assert!(
        reason.starts_with("counts: effects[key=k1]: expected 1, counted 2"),
        "{reason}"
    );
    let failed: Vec<&str> = o.runs[0]
        .checks
        .iter()
        .filter(|c| !c.passed)
        .map(|c| c.name)
        .collect();
    assert_eq!(failed, ["counts"], "{}", summary_text(&o));
}
