use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use ticketflow_harness::interpose::conduct::{Conductor, Plan, Racers, Start};
use ticketflow_harness::interpose::explore::{parse_schedule_id, schedule_id, Prefix, Search};
use ticketflow_harness::interpose::{upstream_of, url_through, Interposer, Limits, StoreKind};

use crate::support::TestDb;

const REDIS: &str = "redis://127.0.0.1:6379/";

pub(crate) fn redis_up() -> bool {
    crate::support::redis_up_at(REDIS)
}

/// An interposer in front of Redis, and the URL of its db 9 through it.
fn redis_through() -> (Interposer, String) {
    let ip = Interposer::start(
        StoreKind::Redis,
        upstream_of(REDIS).unwrap(),
        Limits::default(),
    )
    .unwrap();
    let url = format!("{}9", url_through(REDIS, ip.addr()).unwrap());
    (ip, url)
}

/// The scratch database behind a PostgreSQL interposer, and the interposer.
fn pg_through(label: &str) -> Option<(TestDb, Interposer, String)> {
    let db = TestDb::postgres(label)?;
    let url = db.url().unwrap();
    let ip = Interposer::start(
        StoreKind::Postgres,
        upstream_of(&url).unwrap(),
        Limits::default(),
    )
    .unwrap();
    let through = url_through(&url, ip.addr()).unwrap();
    Some((db, ip, through))
}

#[test]
fn postgres_traffic_passes_through_untouched_outside_a_run() {
    let Some((_db, ip, url)) = pg_through("ip_pass") else {
        return;
    };
    let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    c.batch_execute("CREATE TABLE t (k text PRIMARY KEY, n int)")
        .unwrap();
    // Extended query with parameters, a transaction, an error and the session after it.
    let mut tx = c.transaction().unwrap();
    tx.execute("INSERT INTO t VALUES ($1, $2)", &[&"a", &1i32])
        .unwrap();
    tx.commit().unwrap();
    let e = c
        .execute("INSERT INTO t VALUES ($1, $2)", &[&"a", &2i32])
        .unwrap_err();
    assert_eq!(e.code(), Some(&postgres::error::SqlState::UNIQUE_VIOLATION));
    let n: i32 = c
        .query_one("SELECT n FROM t WHERE k = $1", &[&"a"])
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    // Every session's backend is known (BackendKeyData), and a cancel request sent to the
    // interposer reaches the server.
    let (_v, views) = ip.hub().view();
    assert!(views.iter().all(|v| v.backend_pid.is_some()), "{views:?}");
    let mut other = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let token = other.cancel_token();
    let sleeper = std::thread::spawn(move || {
        let start = Instant::now();
        let r = other.batch_execute("SELECT pg_sleep(30)");
        (r.err().and_then(|e| e.code().cloned()), start.elapsed())
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let active: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(30)' AND state = 'active'",
                &[],
            )
            .unwrap()
            .get(0);
        if active == 1 || Instant::now() > deadline {
            break;
        }
    }
    token.cancel_query(postgres::NoTls).unwrap();
    let (code, took) = sleeper.join().unwrap();
    assert_eq!(code, Some(postgres::error::SqlState::QUERY_CANCELED));
    assert!(took < Duration::from_secs(20));
}

#[test]
fn redis_traffic_passes_through_with_pipelines_transactions_and_scripts() {
    if !redis_up() {
        return;
    }
    let (_ip, url) = redis_through();
    let mut c = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let key = format!("tfv-ip-{}", std::process::id());
    let (a, b): (String, Option<String>) = redis::pipe()
        .set(&key, "v1")
        .ignore()
        .get(&key)
        .get(format!("{key}-none"))
        .query(&mut c)
        .unwrap();
    assert_eq!((a.as_str(), b), ("v1", None));
    let (n,): (i64,) = redis::pipe()
        .atomic()
        .incr(format!("{key}-n"), 2)
        .query(&mut c)
        .unwrap();
    assert_eq!(n, 2);
    let s: String = redis::Script::new("return redis.call('GET', KEYS[1])")
        .key(&key)
        .invoke(&mut c)
        .unwrap();
    assert_eq!(s, "v1");
    let _: () = redis::cmd("DEL")
        .arg(&key)
        .arg(format!("{key}-n"))
        .query(&mut c)
        .unwrap();
}

/// Racers that each run `work` on their own thread once let go.
struct Threads {
    go: Mutex<Vec<bool>>,
    cv: Condvar,
    answered: Vec<AtomicBool>,
}

impl Threads {
    fn new(n: usize) -> Self {
        Threads {
            go: Mutex::new(vec![false; n]),
            cv: Condvar::new(),
            answered: (0..n).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    fn wait_go(&self, i: usize) {
        let mut g = self.go.lock().unwrap();
        while !g[i] {
            g = self.cv.wait(g).unwrap();
        }
    }
}

impl Racers for Threads {
    fn count(&self) -> usize {
        self.answered.len()
    }
    fn go(&self, i: usize) {
        self.go.lock().unwrap()[i] = true;
        self.cv.notify_all();
    }
    fn answered(&self, i: usize) -> bool {
        self.answered[i].load(Ordering::SeqCst)
    }
    fn finished(&self, i: usize) -> bool {
        self.answered(i)
    }
}

/// One run of two racers doing `check-then-insert` (`unique`: with the constraint, the loser
/// meets 23505 and inserts nothing), conducted with the chooser; returns the rows for the key
/// and the schedule.
fn race_once(
    url: &str,
    admin: &mut postgres::Client,
    ip: &Interposer,
    key: &str,
    chooser: &mut Prefix,
) -> (i64, ticketflow_harness::interpose::conduct::WaveSchedule) {
    let racers = Threads::new(2);
    let conns: Vec<postgres::Client> = (0..2)
        .map(|_| postgres::Client::connect(url, postgres::NoTls).unwrap())
        .collect();
    let schedule = std::thread::scope(|sc| {
        for (i, mut c) in conns.into_iter().enumerate() {
            let racers = &racers;
            sc.spawn(move || {
                racers.wait_go(i);
                let r = (|| -> Result<(), postgres::Error> {
                    let mut tx = c.transaction()?;
                    let n: i64 = tx
                        .query_one("SELECT count(*) FROM t WHERE k = $1", &[&key])?
                        .get(0);
                    if n == 0 {
                        tx.execute("INSERT INTO t VALUES ($1)", &[&key])?;
                    }
                    tx.commit()
                })();
                let _ = r;
                racers.answered[i].store(true, Ordering::SeqCst);
            });
        }
        let mut conductor = Conductor {
            hubs: vec![ip.hub()],
            monitor: Some(admin),
            step_timeout: Duration::from_millis(500),
            start_timeout: Duration::from_secs(10),
            deadline: Instant::now() + Duration::from_secs(60),
            crash: None,
            poll_repeats: ticketflow_harness::interpose::conduct::POLL_REPEATS,
            lone: false,
            after_answer: ticketflow_harness::interpose::conduct::AFTER_ANSWER,
        };
        conductor.run(
            &racers,
            Plan::Steps {
                chooser,
                first_index: 0,
            },
        )
    });
    let rows: i64 = admin
        .query_one("SELECT count(*) FROM t WHERE k = $1", &[&key])
        .unwrap()
        .get(0);
    (rows, schedule)
}

/// Explores every schedule of the two racers; returns `(schedules run, ids with two rows)`.
fn explore(label: &str, unique: bool) -> Option<(usize, Vec<String>, Vec<usize>)> {
    let (db, ip, url) = pg_through(label)?;
    db.execute(if unique {
        "CREATE TABLE t (k text UNIQUE)"
    } else {
        "CREATE TABLE t (k text)"
    });
    let mut admin = postgres::Client::connect(&db.url().unwrap(), postgres::NoTls).unwrap();
    let mut search = Search::new(None);
    let (mut ran, mut failing, mut steps) = (0, Vec::new(), Vec::new());
    while let Some(prefix) = search.next_prefix() {
        ran += 1;
        assert!(ran <= 200, "the search does not end");
        let mut chooser = Prefix {
            choices: prefix,
            divergences: 0,
        };
        let key = format!("k{ran}");
        let (rows, sched) = race_once(&url, &mut admin, &ip, &key, &mut chooser);
        assert_eq!(sched.problem, None);
        assert!(sched
            .start
            .iter()
            .all(|s| matches!(s, Some(Start::Held { .. }))));
        steps.push(sched.steps.len());
        if rows > 1 {
            failing.push(schedule_id(&sched.points, &[sched.points.len()]));
        }
        search.record(chooser.choices.len(), &sched.points);
    }
    Some((ran, failing, steps))
}

#[test]
fn exhaustive_exploration_finds_check_then_insert_every_time_and_the_constraint_passes() {
    let Some((ran, failing, steps)) = explore("ip_cti", false) else {
        return;
    };
    // BEGIN, SELECT, INSERT, COMMIT per racer; a racer whose SELECT saw the other's committed
    // row branches and inserts nothing (3 steps). The search follows the branch: fewer than
    // the C(8, 4) = 70 interleavings of two full racers, never a schedule twice.
    assert!(steps.iter().all(|&s| s == 7 || s == 8), "{steps:?}");
    assert!(steps.contains(&7) && steps.contains(&8));
    assert!(ran > 10 && ran <= 70, "{ran}");
    // Both SELECTs before either COMMIT: both insert.
    assert!(!failing.is_empty());
    assert!(
        failing.iter().any(|id| id.starts_with("AABB")),
        "{failing:?}"
    );
    assert!(!failing.contains(&"AAAABBBB".to_string()));
    // A failing schedule replays to the same order and the same duplicate.
    let Some((db, ip, url)) = pg_through("ip_cti_replay") else {
        return;
    };
    db.execute("CREATE TABLE t (k text)");
    let mut admin = postgres::Client::connect(&db.url().unwrap(), postgres::NoTls).unwrap();
    for (i, id) in failing.iter().take(3).enumerate() {
        let mut chooser = Prefix {
            choices: parse_schedule_id(id).unwrap(),
            divergences: 0,
        };
        let (rows, sched) = race_once(&url, &mut admin, &ip, &format!("r{i}"), &mut chooser);
        assert_eq!(rows, 2, "{id}");
        assert_eq!(schedule_id(&sched.points, &[sched.points.len()]), *id);
        assert_eq!(chooser.divergences, 0);
    }

    // The negative control: with the constraint no schedule makes two rows (a loser whose
    // INSERT waits for the winner is seen blocked, so its racer is not enabled meanwhile).
    let Some((ran, failing, _)) = explore("ip_unique", true) else {
        return;
    };
    assert!(failing.is_empty(), "{failing:?}");
    assert!(ran > 1);
}

#[test]
fn a_pipelining_client_is_stepped_one_command_at_a_time() {
    if !redis_up() {
        return;
    }
    let (ip, url) = redis_through();
    let key = format!("tfv-ip-pipe-{}", std::process::id());
    let steps = AtomicUsize::new(0);
    let racers = Threads::new(1);
    let mut conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let sched = std::thread::scope(|sc| {
        let (racers, key) = (&racers, &key);
        sc.spawn(move || {
            racers.wait_go(0);
            let _: (String, String) = redis::pipe()
                .set(key, "1")
                .ignore()
                .set(format!("{key}-b"), "2")
                .ignore()
                .get(key)
                .get(format!("{key}-b"))
                .query(&mut conn)
                .unwrap();
            racers.answered[0].store(true, Ordering::SeqCst);
        });
        let mut chooser = Prefix::default();
        let mut conductor = Conductor {
            hubs: vec![ip.hub()],
            monitor: None,
            step_timeout: Duration::from_secs(5),
            start_timeout: Duration::from_secs(10),
            deadline: Instant::now() + Duration::from_secs(30),
            crash: None,
            poll_repeats: ticketflow_harness::interpose::conduct::POLL_REPEATS,
            lone: false,
            after_answer: ticketflow_harness::interpose::conduct::AFTER_ANSWER,
        };
        let s = conductor.run(
            racers,
            Plan::Steps {
                chooser: &mut chooser,
                first_index: 0,
            },
        );
        steps.store(s.steps.len(), Ordering::SeqCst);
        s
    });
    let texts: Vec<&str> = sched.steps.iter().map(|s| s.text.as_str()).collect();
    assert_eq!(
        texts,
        [
            format!("SET {key} 1"),
            format!("SET {key}-b 2"),
            format!("GET {key}"),
            format!("GET {key}-b")
        ]
    );
    assert!(sched.steps.iter().all(|s| s.quiescent));
    let mut c = redis::Client::open(format!("{REDIS}9").as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = redis::cmd("DEL")
        .arg(&key)
        .arg(format!("{key}-b"))
        .query(&mut c)
        .unwrap();
}

/// Scenario k's shape through the interposer: two racers on one `ticketflow serve` (with
/// `variant`, if any), the schedule mode and limit given.
pub(crate) fn interposed_serve(
    variant: Option<&str>,
    mode: &str,
    limit: usize,
) -> ticketflow_harness::blackbox::TargetScenario {
    interposed_serve_with(variant, mode, limit, 2)
}

/// [`interposed_serve`] with `serve --pool-size pool --min-idle pool`.
fn interposed_serve_with(
    variant: Option<&str>,
    mode: &str,
    limit: usize,
    pool: usize,
) -> ticketflow_harness::blackbox::TargetScenario {
    ticketflow_harness::blackbox::TargetScenario::parse(
        std::path::Path::new("interposed.toml"),
        &interposed_serve_text(variant, mode, limit, pool),
        &|_| None,
    )
    .unwrap()
}

/// The scenario file of [`interposed_serve_with`].
pub(crate) fn interposed_serve_text(
    variant: Option<&str>,
    mode: &str,
    limit: usize,
    pool: usize,
) -> String {
    let variant = variant
        .map(|v| format!(r#", "--variant", "{v}""#))
        .unwrap_or_default();
    format!(
        r#"
name = "interposed-serve"
description = "two racers, one key, through the interposer"

[barrier]
kind = "interposer"
timeout_ms = 2000

[schedule]
mode = "{mode}"
limit = {limit}
preemptions = 1

[target]
own_service = true

[target.request]
method = "POST"
path = "/v1/tickets"
body = {{ actor_id = "u1", title = "Printer jammed", body = "Floor 3 printer shows E-42", priority = "high" }}

[[target.scopes]]
name = "A"
value = "A-{{run}}"
headers = {{ "X-Tenant-Id" = "{{scope}}" }}

[target.count]
tickets = "SELECT count(*) FROM tickets WHERE tenant_id = {{scope}}"
receipts = "SELECT count(*) FROM idempotency_receipts WHERE tenant_id = {{scope}}"

[[target.service]]
name = "api"
command = ["{{ticketflow}}", "serve", "--pool-size", "{pool}", "--min-idle", "{pool}", "--listen", "127.0.0.1:{{port}}", "--database-url", "{{database_url}}"{variant}]

[[racers]]
name = "r"
count = 2
scope = "A"
key = "key-1"

[expect]
outcomes = {{ r = ["created", "replayed"] }}

[[expect.counts]]
scope = "A"
tickets = 1
receipts = 1
"#
    )
}

pub(crate) fn run_interposed(
    s: &ticketflow_harness::blackbox::TargetScenario,
    url: &str,
    schedule: Option<String>,
) -> ticketflow_harness::blackbox::TargetOutcome {
    let opts = ticketflow_harness::blackbox::RunOptions {
        exe: Some(std::path::PathBuf::from(env!("CARGO_BIN_EXE_ticketflow"))),
        schedule,
        ..ticketflow_harness::blackbox::RunOptions::new(crate::support::server(url))
    };
    ticketflow_harness::blackbox::run_repeated(s, &opts).unwrap()
}

#[test]
fn a_served_protocol_passes_a_bounded_exploration_that_states_its_coverage() {
    let Some(url) = crate::support::pg_url() else {
        return;
    };
    let o = run_interposed(&interposed_serve(None, "bounded", 40), &url, None);
    assert_eq!(
        o.verdict,
        ticketflow_harness::verdict::Verdict::Pass,
        "{:?}\n{}",
        o.reason,
        ticketflow_harness::blackbox::summary::summary_text(&o)
    );
    let coverage = o.coverage.clone().unwrap();
    assert!(
        coverage.contains("2 racers")
            && coverage.contains("run (bounded")
            && coverage.contains("search complete"),
        "{coverage}"
    );
    assert!(o.runs.len() > 1, "{coverage}");
    // Every run was conducted: both racers held at their first command, steps taken.
    for r in &o.runs {
        let w = &r.evidence.as_ref().unwrap().waves[0];
        let s = w.schedule.as_ref().unwrap();
        assert!(s.steps.len() >= 4, "{s:?}");
        assert_eq!(w.problem, None);
    }
}

/// A search that reaches its limit before it is complete is PENDING with the reason, never
/// PASS: the same correct service PASSes the complete search above (the control).
#[test]
fn a_search_stopped_at_its_limit_is_pending_never_pass() {
    let Some(url) = crate::support::pg_url() else {
        return;
    };
    for mode in ["bounded", "reduced"] {
        let o = run_interposed(&interposed_serve(None, mode, 2), &url, None);
        let text = ticketflow_harness::blackbox::summary::summary_text(&o);
        assert_eq!(
            o.verdict,
            ticketflow_harness::verdict::Verdict::Pending,
            "{mode}: {text}"
        );
        let reason = o.reason.clone().unwrap_or_default();
        assert!(
            reason.contains("stopped at its limit of 2 schedules before it was complete")
                && reason.contains("Raise [schedule] limit"),
            "{mode}: {reason}"
        );
        let coverage = o.coverage.clone().unwrap_or_default();
        assert!(coverage.contains("stopped at the limit of 2"), "{coverage}");
    }
}

#[test]
fn a_served_wrong_implementation_fails_exploration_and_its_schedule_replays() {
    let Some(url) = crate::support::pg_url() else {
        return;
    };
    let s = interposed_serve(Some("split-transactions"), "bounded", 60);
    let o = run_interposed(&s, &url, None);
    assert_eq!(
        o.verdict,
        ticketflow_harness::verdict::Verdict::Fail,
        "{:?}",
        o.coverage
    );
    let reason = o.reason.clone().unwrap();
    assert!(reason.contains("--schedule"), "{reason}");
    let failing = o
        .runs
        .iter()
        .find(|r| r.verdict == ticketflow_harness::verdict::Verdict::Fail)
        .unwrap();
    let id = crate::support::schedule_of(failing);
    let text = ticketflow_harness::blackbox::summary::summary_text(&o);
    assert!(
        text.contains(&format!("schedule {id}, as the store saw it")),
        "{text}"
    );
    // The same id, replayed: the same order, the same FAIL.
    let again = run_interposed(&s, &url, Some(id.clone()));
    assert_eq!(
        again.verdict,
        ticketflow_harness::verdict::Verdict::Fail,
        "{:?}",
        again.coverage
    );
    assert_eq!(
        again.runs[0]
            .evidence
            .as_ref()
            .unwrap()
            .schedule_id
            .as_deref(),
        Some(id.as_str())
    );
}

/// Two racers against the Python stub whose keys live in Redis (GET → SET NX → create → SET
/// record → DEL), through the interposer in front of Redis db 9.
pub(crate) fn redis_stub(mode: &str) -> ticketflow_harness::blackbox::TargetScenario {
    let script = crate::support::repo_path("tests/integration/redis_lock_stub.py");
    let text = format!(
        r#"
name = "redis-lock-stub"
description = "check, then lock with SET NX, delete the lock after storing the answer"

[barrier]
kind = "interposer"

[schedule]
mode = "{mode}"

[target]
redis_url = "redis://127.0.0.1:6379/9"

[target.retry]
attempts = 4
backoff_ms = 1

[target.request]
method = "POST"
path = "/orders"
body = {{ sku = "a-1", quantity = 1 }}

[[target.service]]
name = "shop"
command = ["python3", "{script}", "{{port}}", "{{redis_url}}"]

[[racers]]
name = "r"
count = 2
key = "k1"

[expect]
outcomes = {{ r = ["created", "replayed"] }}
"#,
        script = script.display()
    );
    ticketflow_harness::blackbox::TargetScenario::parse(
        std::path::Path::new("redis-stub.toml"),
        &text,
        &|_| None,
    )
    .unwrap()
}

/// Deletes the stub's keys from Redis db 9.
pub(crate) fn clean_stub_keys() {
    let mut c = redis::Client::open(format!("{REDIS}9").as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg("tfv-stub:*").query(&mut c).unwrap();
    if !keys.is_empty() {
        let _: () = redis::cmd("DEL").arg(&keys).query(&mut c).unwrap();
    }
}

#[test]
fn exploration_finds_a_redis_check_then_lock_defect_every_time_the_first_point_misses() {
    let Some(url) = crate::support::pg_url() else {
        return;
    };
    if !redis_up() {
        return;
    }
    // Exploration: the defect is found on every invocation, at the same schedule.
    let mut ids = Vec::new();
    for _ in 0..3 {
        let o = run_interposed(&redis_stub("exhaustive"), &url, None);
        assert_eq!(
            o.verdict,
            ticketflow_harness::verdict::Verdict::Fail,
            "{}",
            ticketflow_harness::blackbox::summary::summary_text(&o)
        );
        let failing = o
            .runs
            .iter()
            .find(|r| r.verdict == ticketflow_harness::verdict::Verdict::Fail)
            .unwrap();
        assert!(
            failing
                .checks
                .iter()
                .any(|c| !c.passed() && c.name == "one effect per intent"),
            "{:?}",
            failing.checks
        );
        ids.push(crate::support::schedule_of(failing));
    }
    assert!(ids.windows(2).all(|w| w[0] == w[1]), "{ids:?}");
    // The first point (both GETs held, then released together) runs free: the second request's
    // SET NX meets the first one's lock, it answers in progress and its retry replays.
    let first = run_interposed(&redis_stub("first-point"), &url, None);
    clean_stub_keys();
    assert_ne!(
        first.verdict,
        ticketflow_harness::verdict::Verdict::Pending,
        "{:?}",
        first.reason
    );
    eprintln!(
        "first point: {}",
        ticketflow_harness::blackbox::summary::summary_text(&first)
    );
}

#[test]
fn a_pool_smaller_than_the_racers_is_pending_with_the_reason_and_ends_the_exploration() {
    let Some(url) = crate::support::pg_url() else {
        return;
    };
    let o = run_interposed(
        &interposed_serve_with(None, "exhaustive", 50, 1),
        &url,
        None,
    );
    assert_eq!(
        o.verdict,
        ticketflow_harness::verdict::Verdict::Pending,
        "{}",
        ticketflow_harness::blackbox::summary::summary_text(&o)
    );
    let reason = o.reason.clone().unwrap_or_default();
    assert!(reason.contains("neither answered nor seen"), "{reason}");
    assert!(reason.contains("pool smaller than the racers"), "{reason}");
    assert_eq!(
        o.runs.len(),
        1,
        "the exploration stops at a run that could not be set up"
    );
}

/// PCT: a PASS states its runs, the per-run lower bound and the miss probability; the same
/// seed finds `split-transactions` (negative control), and its failing schedule is named.
#[test]
fn pct_states_its_bound_passes_the_protocol_and_finds_a_wrong_implementation() {
    let Some(url) = crate::support::pg_url() else {
        return;
    };
    let pct = |variant: Option<&str>, runs: usize| {
        let mut s = interposed_serve(variant, "pct", 50);
        let spec = s.schedule.as_mut().unwrap();
        spec.runs = runs;
        spec.seed = 1;
        s
    };
    let o = run_interposed(&pct(None, 6), &url, None);
    assert_eq!(
        o.verdict,
        ticketflow_harness::verdict::Verdict::Pass,
        "{}",
        ticketflow_harness::blackbox::summary::summary_text(&o)
    );
    assert_eq!(o.runs.len(), 6);
    let coverage = o.coverage.clone().unwrap();
    assert!(
        coverage.contains("PCT: 6 run(s) of depth 2 (seed 1)")
            && coverage.contains("probability at least")
            && coverage.contains("miss it with probability at most"),
        "{coverage}"
    );
    let o = run_interposed(&pct(Some("split-transactions"), 40), &url, None);
    assert_eq!(
        o.verdict,
        ticketflow_harness::verdict::Verdict::Fail,
        "{:?}",
        o.coverage
    );
    assert!(o.reason.unwrap_or_default().contains("--schedule"));
}

/// A replayed schedule that names a racer with no step held at a point (the service took a
/// shorter path, or the id is from another build of it) is followed, not refused: the default
/// order goes on there, and the coverage counts the divergences.
#[test]
fn a_replayed_schedule_the_service_does_not_follow_is_followed_and_its_divergences_counted() {
    let Some(url) = crate::support::pg_url() else {
        return;
    };
    let s = interposed_serve(None, "exhaustive", 50);
    // Racer B at every point: once B is done, the points that follow have only A.
    let o = run_interposed(&s, &url, Some("B".repeat(40)));
    assert_eq!(
        o.verdict,
        ticketflow_harness::verdict::Verdict::Pass,
        "{}",
        ticketflow_harness::blackbox::summary::summary_text(&o)
    );
    assert_eq!(o.runs.len(), 1);
    let coverage = o.coverage.clone().unwrap();
    let diverged: usize = coverage
        .split('(')
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(
        coverage.contains("divergence(s) where the service branched") && diverged > 0,
        "{coverage}"
    );
    // The schedule as run starts with B's steps, then A's.
    let id = crate::support::schedule_of(&o.runs[0]);
    assert!(id.starts_with("BB") && id.ends_with('A'), "{id}");
}

/// Two racers against `serve` (first point) with an extra count `extra` expected `want`.
fn serve_with_count(
    extra: &str,
    want: i64,
    tickets: i64,
) -> ticketflow_harness::blackbox::TargetScenario {
    let text = format!(
        r#"
name = "count-read"
description = "a count that cannot be read"

[barrier]
kind = "interposer"
timeout_ms = 5000

[schedule]
mode = "first-point"

[target]
own_service = true

[target.request]
method = "POST"
path = "/v1/tickets"
body = {{ actor_id = "u1", title = "Printer jammed", body = "Floor 3 printer shows E-42", priority = "high" }}

[[target.scopes]]
name = "A"
value = "A-{{run}}"
headers = {{ "X-Tenant-Id" = "{{scope}}" }}

[target.count]
tickets = "SELECT count(*) FROM tickets WHERE tenant_id = {{scope}}"
extra = "{extra}"

[[target.service]]
name = "api"
command = ["{{ticketflow}}", "serve", "--pool-size", "2", "--min-idle", "2", "--listen", "127.0.0.1:{{port}}", "--database-url", "{{database_url}}"]

[[racers]]
name = "r"
count = 2
scope = "A"
key = "key-1"

[expect]
outcomes = {{ r = ["created", "replayed"] }}

[[expect.counts]]
scope = "A"
tickets = {tickets}
extra = {want}
"#
    );
    ticketflow_harness::blackbox::TargetScenario::parse(
        std::path::Path::new("count-read.toml"),
        &text,
        &|_| None,
    )
    .unwrap()
}

/// A count query that fails when it is read (here: a division by zero once the ticket exists,
/// standing for a database gone mid-run) proves nothing: the run is PENDING with the reason,
/// never FAIL on it; a count that was read and is wrong still FAILs beside it (negative
/// control).
#[test]
fn a_count_that_cannot_be_read_is_pending_and_a_wrong_count_beside_it_still_fails() {
    let Some(url) = crate::support::pg_url() else {
        return;
    };
    let broken = "SELECT 1 / (count(*) - 1) FROM tickets WHERE tenant_id = {scope}";
    let o = run_interposed(&serve_with_count(broken, 1, 1), &url, None);
    assert_eq!(
        o.verdict,
        ticketflow_harness::verdict::Verdict::Pending,
        "{}",
        ticketflow_harness::blackbox::summary::summary_text(&o)
    );
    let reason = o.reason.clone().unwrap_or_default();
    assert!(reason.contains("counts read"), "{reason}");
    let o = run_interposed(&serve_with_count(broken, 1, 2), &url, None);
    assert_eq!(
        o.verdict,
        ticketflow_harness::verdict::Verdict::Fail,
        "{}",
        ticketflow_harness::blackbox::summary::summary_text(&o)
    );
    assert!(o.reason.unwrap_or_default().starts_with("counts:"));
}

/// A `CancelRequest` through the interposer: forwarded, then the client's connection is closed
/// at once, as PostgreSQL closes it (libpq, pgx and pgjdbc wait for that close; a connection
/// left open hung `psql`'s Ctrl-C and leaked a socket per cancel).
#[test]
fn a_cancel_request_is_forwarded_and_its_connection_closed() {
    use std::io::{Read as _, Write as _};
    let Some((_db, ip, _url)) = pg_through("ip_cancel") else {
        return;
    };
    for _ in 0..3 {
        let mut c = std::net::TcpStream::connect(ip.addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // Length 16, code 80877102, a backend pid and secret key that match no session.
        let mut packet = Vec::new();
        packet.extend_from_slice(&16u32.to_be_bytes());
        packet.extend_from_slice(&80_877_102u32.to_be_bytes());
        packet.extend_from_slice(&1u32.to_be_bytes());
        packet.extend_from_slice(&2u32.to_be_bytes());
        c.write_all(&packet).unwrap();
        let started = Instant::now();
        let n = c.read(&mut [0u8; 8]).expect("closed, not timed out");
        assert_eq!(n, 0, "the interposer closes a cancel's connection");
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}

/// The catalog ties a table to what its columns' domain checks and its row-level security
/// policies reach (through the functions they call): a write of the table and a write of the
/// table such a text reads are dependent; a table tied to nothing stays apart.
#[test]
fn the_catalog_ties_a_table_to_what_its_domain_checks_and_policies_read() {
    use ticketflow_harness::interpose::footprint::{footprint, Catalog};
    let Some(db) = TestDb::postgres("catalog-ties") else {
        return;
    };
    db.execute(
        "CREATE TABLE stock (item text PRIMARY KEY, n int NOT NULL); \
         CREATE TABLE tenants (id text PRIMARY KEY); \
         CREATE TABLE lonely (id text PRIMARY KEY); \
         CREATE FUNCTION in_stock(i text) RETURNS boolean LANGUAGE sql STABLE \
             AS $$ SELECT EXISTS (SELECT 1 FROM stock WHERE item = i AND n > 0) $$; \
         CREATE DOMAIN stocked_item AS text CHECK (in_stock(VALUE)); \
         CREATE TABLE sales (id text PRIMARY KEY, item stocked_item, tenant text); \
         ALTER TABLE sales ENABLE ROW LEVEL SECURITY; \
         CREATE POLICY known_tenant ON sales USING (tenant IN (SELECT id FROM tenants))",
    );
    let mut client = db.pg_config().unwrap().connect(postgres::NoTls).unwrap();
    let cat = Catalog::read(&mut client).unwrap();
    let pg = |t: &str| footprint(StoreKind::Postgres, t, Some(&cat));
    let sale = pg("INSERT INTO sales (id, item, tenant) VALUES ($1, $2, $3)");
    assert!(
        sale.conflicts(&pg("UPDATE stock SET n = n - 1")),
        "the domain's check"
    );
    assert!(sale.conflicts(&pg("DELETE FROM tenants")), "the policy");
    assert!(!sale.conflicts(&pg("DELETE FROM lonely")), "{sale:?}");
}
