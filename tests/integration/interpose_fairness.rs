//! Fair to services that poll: a duplicate that polls the store (`GET` every 5 ms) for the
//! first request's record, explored with one preemption, PASSes in 20 invocations of 12
//! schedules each; with the poll rule off (`[schedule] poll_repeats = 0`) the same service
//! gets a false FAIL, the conductor releasing the poller's reads while the request it waits
//! for sits at the proxy until the poller gives up.

use ticketflow_harness::blackbox::{run_repeated, summary, RunOptions, TargetScenario};
use ticketflow_harness::verdict::Verdict;

/// Redis db of these tests; each key names its run (`{key}` is fresh per run).
const REDIS_DB: &str = "redis://127.0.0.1:6379/12";

fn poll_scenario(poll_repeats: Option<usize>) -> TargetScenario {
    let script = crate::support::repo_path("tests/integration/poll_stub.py");
    let repeats = poll_repeats
        .map(|n| format!("poll_repeats = {n}"))
        .unwrap_or_default();
    let text = format!(
        r#"
name = "poll-stub"
description = "two clients, one key; the duplicate polls the store for the first one's record"

[barrier]
kind = "interposer"
timeout_ms = 5000

[schedule]
mode = "bounded"
preemptions = 1
limit = 40
{repeats}

[target]
redis_url = "{REDIS_DB}"
request_timeout_ms = 2000

[target.retry]
attempts = 1

[target.replay]
same_answer = true

[target.request]
method = "POST"
path = "/orders"
body = {{ sku = "a-1", quantity = 1 }}

[target.count]
orders = {{ redis = ["GET", "tfv-poll:orders:{{key}}"] }}

[[target.service]]
name = "shop"
command = ["python3", "{script}", "{{port}}", "{{redis_url}}"]

[[racers]]
name = "r"
count = 2
key = "k1"

[[expect.counts]]
key = "k1"
orders = 1
"#,
        script = script.display()
    );
    TargetScenario::parse(std::path::Path::new("poll-stub.toml"), &text, &|_| None)
        .unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn clean(outcome: &ticketflow_harness::blackbox::TargetOutcome) {
    let mut c = redis::Client::open(REDIS_DB)
        .unwrap()
        .get_connection()
        .unwrap();
    for e in outcome.runs.iter().filter_map(|r| r.evidence.as_ref()) {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("tfv-poll:*{}*", e.run_id))
            .query(&mut c)
            .unwrap();
        if !keys.is_empty() {
            let _: () = redis::cmd("DEL").arg(&keys).query(&mut c).unwrap();
        }
    }
}

#[test]
fn polling_duplicates_get_no_false_fail_and_do_without_the_poll_rule() {
    let Some(url) = crate::support::pg_url() else {
        return;
    };
    if !crate::support::redis_up_at(REDIS_DB) {
        return;
    }
    let opts = RunOptions {
        exe: Some(std::path::PathBuf::from(env!("CARGO_BIN_EXE_ticketflow"))),
        ..RunOptions::new(crate::support::server(&url))
    };
    let fair = poll_scenario(None);
    let mut yielded = 0;
    for invocation in 1..=20 {
        let o = run_repeated(&fair, &opts).unwrap();
        clean(&o);
        assert_eq!(
            o.verdict,
            Verdict::Pass,
            "invocation {invocation}: {}",
            summary::summary_text(&o)
        );
        yielded += o
            .runs
            .iter()
            .filter_map(|r| r.evidence.as_ref())
            .flat_map(|e| e.waves.iter())
            .filter_map(|w| w.schedule.as_ref())
            .map(|s| s.polls_yielded)
            .sum::<usize>();
    }
    assert!(
        yielded > 0,
        "the poller never yielded: the rule was not what passed it"
    );
    // The negative control: without the rule, a schedule that keeps choosing the poller runs
    // it out of time while the first request sits at the proxy.
    let o = run_repeated(&poll_scenario(Some(0)), &opts).unwrap();
    clean(&o);
    assert_eq!(o.verdict, Verdict::Fail, "{}", summary::summary_text(&o));
}
