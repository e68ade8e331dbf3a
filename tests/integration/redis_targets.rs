//! Black-box targets whose effects live in Redis: Redis counts, the fair conductor, the
//! `CLIENT PAUSE` barrier. The services are `redis_effect_stub.py` (correct, or applying its
//! effect twice behind one id) and `redis_lock_stub.py` (check, then lock: a known defect).
//! Counts and exploration use db 11 of the shared Redis; the pause barrier pauses a whole
//! server, so its tests start a Redis server of their own.

use std::time::{Duration, Instant};

use ticketflow_harness::blackbox::check::REDIS_EFFECTS_NOT_COUNTED;
use ticketflow_harness::blackbox::summary::summary_text;
use ticketflow_harness::blackbox::{run_repeated, RunOptions, TargetOutcome, TargetScenario};
use ticketflow_harness::verdict::Verdict;

const SHARED_REDIS: &str = "redis://127.0.0.1:6379/11";

fn redis_up(url: &str) -> bool {
    crate::support::redis_up_at(url)
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
        ..RunOptions::new(crate::support::server(pg))
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
    let counts = if counted {
        "[[expect.counts]]\nkey = \"k1\"\neffects = 1\n"
    } else {
        ""
    };
    let expect = format!("[expect]\noutcomes = {{ r = [\"created\", \"replayed\"] }}\n\n{counts}");
    parse(
        "redis-effects.toml",
        &effect_stub_text(
            mode,
            barrier,
            redis_url,
            extra_target,
            extra_racers,
            &expect,
        ),
    )
}

/// The text of [`effect_stub`]'s file, with `expect` (the `[expect]` table) at its end.
fn effect_stub_text(
    mode: &str,
    barrier: &str,
    redis_url: &str,
    extra_target: &str,
    extra_racers: &str,
    expect: &str,
) -> String {
    let script = crate::support::repo_path("tests/integration/redis_effect_stub.py");
    format!(
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

{expect}
"#,
        script = script.display()
    )
}

/// A scenario judged by the model (as `ticketflow check` judges its histories) reads the
/// Redis count it declares: the service that acts twice fails on it, the correct one passes.
#[test]
fn a_model_judged_scenario_reads_its_redis_counts() {
    let Some(pg) = crate::support::pg_url() else {
        return;
    };
    if !redis_up(SHARED_REDIS) {
        return;
    }
    let file = |mode| {
        let text = effect_stub_text(
            mode,
            "kind = \"http\"",
            SHARED_REDIS,
            "",
            "",
            "[expect]\nmodel = true\nsettle_ms = 0\n",
        );
        parse("redis-model.toml", &text)
    };
    let o = run(&file("correct"), &pg, 3);
    assert_eq!(o.verdict, Verdict::Pass, "{}", summary_text(&o));
    let o = run(&file("double"), &pg, 1);
    clean(SHARED_REDIS);
    assert_eq!(o.verdict, Verdict::Fail, "{}", summary_text(&o));
    assert!(
        o.reason.as_deref().unwrap_or_default().contains("effects"),
        "{}",
        summary_text(&o)
    );
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
        .filter(|c| !c.passed())
        .map(|c| c.name)
        .collect();
    assert_eq!(failed, ["counts"], "{}", summary_text(&o));
}

/// `s` served by the known-wrong `redis_lock_stub.py` (check, then lock) instead, without
/// counts (its keys are its own).
fn with_lock_stub(s: &TargetScenario) -> TargetScenario {
    let script = crate::support::repo_path("tests/integration/redis_lock_stub.py");
    let mut wrong = s.clone();
    wrong.target.services[0].command = vec![
        "python3".into(),
        script.display().to_string(),
        "{port}".into(),
        "{redis_url}".into(),
    ];
    wrong.target.counts.clear();
    wrong.counts.clear();
    wrong
}

/// `[barrier]` and `[schedule]` of an exhaustive interposed exploration with a short client
/// backoff: each "in progress" answer is retried after 5 ms, up to 6 attempts.
const EXHAUSTIVE_WITH_SHORT_BACKOFF: &str =
    "kind = \"interposer\"\ntimeout_ms = 5000\n\n[schedule]\nmode = \"exhaustive\"\nlimit = 400";
const SHORT_BACKOFF: &str = "[target.retry]\nattempts = 6\nbackoff_ms = 5";

#[test]
fn retries_after_in_progress_cannot_starve_a_held_racer_and_the_known_defect_still_fails() {
    let Some(pg) = crate::support::pg_url() else {
        return;
    };
    if !redis_up(SHARED_REDIS) {
        return;
    }
    // A correct service (lock, look again, act once): every schedule the fair conductor runs
    // ends with one effect, the retrier replaying, although its retries are new steps.
    let s = effect_stub(
        "correct",
        EXHAUSTIVE_WITH_SHORT_BACKOFF,
        SHARED_REDIS,
        true,
        SHORT_BACKOFF,
        "",
    );
    let o = run(&s, &pg, 1);
    clean(SHARED_REDIS);
    assert_eq!(o.verdict, Verdict::Pass, "{}", summary_text(&o));
    let coverage = o.coverage.clone().unwrap();
    assert!(o.runs.len() > 1, "{coverage}");
    // Retries after "in progress" were seen as yields. (Whether a yielding racer is also left
    // out at a later point depends on timing: a racer resting in its backoff is not waited for,
    // so the holder often finishes before the retry arrives.)
    let yields: usize = o
        .runs
        .iter()
        .flat_map(|r| r.evidence.iter().flat_map(|e| e.waves.iter()))
        .filter_map(|w| w.schedule.as_ref())
        .map(|s| s.yields)
        .sum();
    assert!(
        yields > 0,
        "no schedule had a retrier yield after an in-progress answer: {coverage}"
    );
    assert!(
        coverage.contains("leaves out the steps of retries"),
        "{coverage}"
    );
    eprintln!("fair exploration: {coverage}");
    // The known-wrong service (check, then lock; the lock deleted after the answer is stored)
    // with the same retries: still found.
    let o = run(&with_lock_stub(&s), &pg, 1);
    clean(SHARED_REDIS);
    assert_eq!(o.verdict, Verdict::Fail, "{}", summary_text(&o));
    assert!(
        o.reason.clone().unwrap().contains("one effect per intent"),
        "{:?}",
        o.reason
    );
}

/// A Redis server of this test's own on a free loopback port (CLIENT PAUSE holds every client
/// of a server, so the shared one is not paused); stopped on drop.
struct OwnRedis {
    child: std::process::Child,
    url: String,
}

impl OwnRedis {
    fn start() -> Option<OwnRedis> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .ok()?
            .local_addr()
            .ok()?
            .port();
        let child = match std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                assert!(
                    std::env::var_os("CI").is_none(),
                    "CI is set and redis-server is required: {e}"
                );
                eprintln!("skipping CLIENT PAUSE test: cannot start redis-server: {e}");
                return None;
            }
        };
        let own = OwnRedis {
            child,
            url: format!("redis://127.0.0.1:{port}/0"),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let up = redis::Client::open(own.url.as_str())
                .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                .is_ok();
            if up {
                return Some(own);
            }
            // An observed-condition poll with a deadline: the server has no readiness signal.
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server on port {port} did not answer PING within 10 s");
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const PAUSE: &str = "kind = \"redis-pause\"\ntimeout_ms = 3000";

#[test]
fn the_pause_barrier_releases_with_every_racer_blocked_on_its_first_write() {
    let Some(pg) = crate::support::pg_url() else {
        return;
    };
    let Some(own) = OwnRedis::start() else {
        return;
    };
    let mut s = effect_stub("correct", PAUSE, &own.url, true, "", "");
    s.racers
        .push(ticketflow_harness::blackbox::format::TargetRacer {
            name: "r3".into(),
            n: 3,
            ..s.racers[1].clone()
        });
    let o = run(&s, &pg, 1);
    assert_eq!(o.verdict, Verdict::Pass, "{}", summary_text(&o));
    let run = &o.runs[0];
    let wave = &run.evidence.as_ref().unwrap().waves[0];
    assert_eq!(wave.barrier, "redis-pause");
    let blocked = wave.blocked_writers.clone().unwrap();
    assert_eq!(blocked.len(), 3, "{blocked:?}");
    // Each racer's first write is its SET NX of the lock; its GET before it was not held.
    assert!(blocked.iter().all(|c| c.cmd == "set"), "{blocked:?}");
    assert!(
        wave.lock_statement
            .as_deref()
            .is_some_and(|l| l.starts_with("CLIENT PAUSE") && l.ends_with("WRITE")),
        "{:?}",
        wave.lock_statement
    );
    let line = run.evidence_line.clone().unwrap();
    assert!(
        line.contains("3 requests seen blocked on a write in Redis (set ×3)")
            && line.contains(ticketflow_harness::blackbox::format::PROVES)
            && line.contains("effects[key=k1] = 1"),
        "{line}"
    );
}

#[test]
fn a_racer_that_never_writes_to_redis_leaves_the_pause_barrier_pending() {
    let Some(pg) = crate::support::pg_url() else {
        return;
    };
    let Some(own) = OwnRedis::start() else {
        return;
    };
    // Racer v sends no sku: the service refuses it before any Redis command, so it is answered
    // while the writes are paused and is never seen blocked.
    let s = effect_stub(
        "correct",
        PAUSE,
        &own.url,
        true,
        "",
        "\n[[racers]]\nname = \"v\"\nkey = \"k1\"\nbody = { quantity = 1 }\nexpect = [\"conflict\", \"rejected\"]\n",
    );
    let o = run(&s, &pg, 1);
    assert_eq!(o.verdict, Verdict::Pending, "{}", summary_text(&o));
    let reason = o.reason.clone().unwrap();
    assert!(
        reason.contains("v's request was answered (422")
            && reason.contains("while Redis writes were paused"),
        "{reason}"
    );
}

#[test]
fn fewer_blocked_writers_than_racers_at_the_timeout_leave_the_pause_barrier_pending() {
    let Some(pg) = crate::support::pg_url() else {
        return;
    };
    let Some(own) = OwnRedis::start() else {
        return;
    };
    // Racer late (its own key) reaches Redis 2.5 s after the pause began, past the barrier's 800 ms:
    // two writers of three are blocked at the deadline.
    let s = effect_stub(
        "correct",
        "kind = \"redis-pause\"\ntimeout_ms = 800",
        &own.url,
        true,
        "",
        "\n[[racers]]\nname = \"late\"\nkey = \"k2\"\nbody = { sku = \"a-1\", quantity = 1, stall_ms = 2500 }\n",
    );
    let o = run(&s, &pg, 1);
    assert_eq!(o.verdict, Verdict::Pending, "{}", summary_text(&o));
    let reason = o.reason.clone().unwrap();
    assert!(
        reason.contains("2 of 3 requests seen blocked on a write in Redis within 800 ms (set ×2)"),
        "{reason}"
    );
}

#[test]
fn the_pause_barrier_refuses_a_server_with_clients_blocked_before_the_pause() {
    let Some(pg) = crate::support::pg_url() else {
        return;
    };
    let Some(own) = OwnRedis::start() else {
        return;
    };
    // Another client of the server waits in BLPOP (blocked before any pause).
    let url = own.url.clone();
    let waiter = std::thread::spawn(move || {
        let mut c = redis::Client::open(url.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        let _: Option<(String, String)> = redis::cmd("BLPOP")
            .arg("tfv-fx:wake")
            .arg(20)
            .query(&mut c)
            .unwrap();
    });
    let mut watch = redis::Client::open(own.url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut watch).unwrap();
        if list.contains("cmd=blpop") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "BLPOP never seen blocked: {list}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let s = effect_stub("correct", PAUSE, &own.url, false, "", "");
    let opts = RunOptions {
        exe: Some(std::path::PathBuf::from(env!("CARGO_BIN_EXE_ticketflow"))),
        ..RunOptions::new(crate::support::server(pg.as_str()))
    };
    let e = run_repeated(&s, &opts).unwrap_err().to_string();
    let _: i64 = redis::cmd("RPUSH")
        .arg("tfv-fx:wake")
        .arg("go")
        .query(&mut watch)
        .unwrap();
    waiter.join().unwrap();
    assert!(
        e.contains("refused") && e.contains("blocked before the pause") && e.contains("blpop"),
        "{e}"
    );
}

/// A correct Redis-lock service (lock, look again, act once) whose loser answers "in
/// progress" and is retried after the runner's 25 ms backoff: the reduced search completes
/// (the racer resting in its backoff is not waited for), and its PASS says over how many
/// classes. The known-wrong stub (check, then lock) under the same search still fails.
#[test]
fn a_correct_redis_lock_service_with_retried_losers_completes_its_reduced_search() {
    let Some(pg) = crate::support::pg_url() else {
        return;
    };
    if !redis_up(SHARED_REDIS) {
        return;
    }
    let barrier =
        "kind = \"interposer\"\ntimeout_ms = 5000\n\n[schedule]\nmode = \"reduced\"\nlimit = 300";
    let backoff = "[target.retry]\nattempts = 10\nbackoff_ms = 25";
    let s = effect_stub("correct", barrier, SHARED_REDIS, true, backoff, "");
    let started = std::time::Instant::now();
    let o = run(&s, &pg, 1);
    clean(SHARED_REDIS);
    assert_eq!(o.verdict, Verdict::Pass, "{}", summary_text(&o));
    let coverage = o.coverage.clone().unwrap();
    assert!(coverage.contains("complete over"), "{coverage}");
    eprintln!(
        "reduced search of a correct Redis-lock service in {:.1} s: {coverage}",
        started.elapsed().as_secs_f64()
    );
    let o = run(&with_lock_stub(&s), &pg, 1);
    clean(SHARED_REDIS);
    assert_eq!(o.verdict, Verdict::Fail, "{}", summary_text(&o));
}
