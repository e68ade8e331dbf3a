//! Scenarios with Redis in the loop: the shipped `[lease]` scenarios PASS with both
//! protocols on both backends; `lease-unsafe-release` FAILs the two-token check and
//! `lease-as-arbiter` the rows, by the lease gate on both backends; the runner's own checks
//! fail when what they check did not happen (no expiry; Redis that answers in `redis-down`);
//! an unreachable Redis is PENDING, exit 3 only under `--require-redis`.
//!
//! Each test uses a Redis database of its own (the flush scenarios empty it): 8 to 12.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use ticketflow_core::lease::{LeaseConfig, LeaseOutcome};
use ticketflow_core::store::Backend;
use ticketflow_core::variants::{Implementation, Variant};
use ticketflow_core::Protocol;
use ticketflow_harness::killmatrix::{lease_gate, GateOutcome, KillOptions};
use ticketflow_harness::scenario::lease::LeaseRunOptions;
use ticketflow_harness::scenario::{
    run_postgres, run_sqlite, PgOptions, Scenario, ScenarioRun, SqliteOptions,
};
use ticketflow_harness::verdict::Verdict;

/// The lease scenario files, in order.
const FILES: [&str; 5] = [
    "scenarios/n-lease-expiry.toml",
    "scenarios/o-lease-two-tokens.toml",
    "scenarios/p-lease-flush.toml",
    "scenarios/q-lease-restart.toml",
    "scenarios/r-lease-redis-down.toml",
];

fn load(file: &str) -> Scenario {
    Scenario::load(Path::new(file)).unwrap().remove(0)
}

/// The test's Redis database `db` on the server `lease::redis_url` found, or `None` (skip).
fn redis_db(db: u32) -> Option<LeaseRunOptions> {
    let url = crate::lease::redis_url()?;
    let base = url.rsplit_once('/').map(|(b, _)| b).unwrap_or(&url);
    let config = LeaseConfig::new(&format!("{base}/{db}"), Duration::from_millis(1_000)).unwrap();
    Some(LeaseRunOptions {
        config: Some(config),
        ..LeaseRunOptions::default()
    })
}

/// Runs `scenario` on each backend available with `implementation`.
fn run_all(
    scenario: &Scenario,
    implementation: Implementation,
    lease: &LeaseRunOptions,
) -> Vec<ScenarioRun> {
    let mut runs = vec![run_sqlite(
        scenario,
        &SqliteOptions {
            implementation,
            lease: lease.clone(),
            ..SqliteOptions::default()
        },
    )];
    if let Some(pg) = crate::support::pg_url() {
        let mut o = PgOptions::new(crate::support::server(&pg));
        o.implementation = implementation;
        o.lease = lease.clone();
        runs.push(run_postgres(scenario, &o));
    }
    runs
}

fn check<'r>(run: &'r ScenarioRun, name: &str) -> &'r ticketflow_harness::verdict::Check {
    run.checks
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no {name} check in {run:#?}"))
}

#[test]
fn lease_scenarios_pass_with_both_protocols_on_both_backends() {
    let Some(lease) = redis_db(12) else { return };
    for file in FILES {
        let s = load(file);
        for p in Protocol::ALL {
            for run in run_all(&s, Implementation::Protocol(p), &lease) {
                let what = format!("{} {} {:?}", s.name, run.setting.label(), p);
                assert_eq!(run.verdict, Verdict::Pass, "{what}: {:?}", run.reason);
                let rows = &run.rows["A"];
                assert_eq!(
                    (rows.tickets, rows.receipts, rows.created_events),
                    (1, 1, 1),
                    "{what}"
                );
                let ev = run.lease.as_ref().expect("lease evidence");
                if s.name.contains("redis-down") {
                    assert!(ev.tokens.is_empty(), "{what}: {ev:?}");
                    assert!(ev
                        .outcomes
                        .iter()
                        .all(|(_, o)| matches!(o, LeaseOutcome::NoLease { .. })));
                } else {
                    assert_eq!(ev.tokens.len(), 2, "{what}: {ev:?}");
                    assert_ne!(ev.tokens[0].1, ev.tokens[1].1);
                    assert!(ev.ops.iter().any(|o| o.actor == "runner"), "{what}");
                }
                if s.name.contains("two-tokens") {
                    assert_eq!(
                        ev.holder_after_old_release,
                        Some(Some(ev.tokens[1].1.clone())),
                        "{what}"
                    );
                }
            }
        }
    }
}

#[test]
fn lease_unsafe_release_fails_only_the_two_token_check() {
    let Some(lease) = redis_db(11) else { return };
    let unsafe_release = Implementation::Variant(Variant::LeaseUnsafeRelease);
    let two = load("scenarios/o-lease-two-tokens.toml");
    for run in run_all(&two, unsafe_release, &lease) {
        assert_eq!(run.verdict, Verdict::Fail, "{}", run.setting.label());
        let c = check(&run, "lease");
        assert!(!c.passed());
        assert!(
            c.detail
                .contains("the old holder's release removed the new holder's lease"),
            "{}",
            c.detail
        );
        // The receipt still arbitrated: only the lease check fails.
        assert!(check(&run, "rows").passed(), "{:?}", run.reason);
        let ev = run.lease.as_ref().unwrap();
        assert_eq!(ev.holder_after_old_release, Some(None));
        assert!(ev
            .ops
            .iter()
            .any(|o| o.op == "release (plain DEL)" && o.result.contains(&ev.tokens[1].1)));
    }
    // Where no newer holder exists at its release, the plain DEL does no visible harm.
    for run in run_all(&load(FILES[0]), unsafe_release, &lease) {
        assert_eq!(run.verdict, Verdict::Pass, "{:?}", run.reason);
    }
}

#[test]
fn the_lease_gate_kills_lease_as_arbiter_by_expiry_and_flush_on_both_backends() {
    let Some(lease) = redis_db(10) else { return };
    let scenarios: Vec<Scenario> = FILES.iter().map(|f| load(f)).collect();
    let pg = crate::support::pg_url();
    let opts = KillOptions {
        pg: crate::support::server(&pg.clone().unwrap_or_default()),
        pg_unusable: None,
        cases: 8,
        seed: None,
        loom_report: "reports/loom.json".into(),
        worker_exe: Some(env!("CARGO_BIN_EXE_ticketflow").into()),
        lease,
        interposed: Ok(Vec::new()),
        check_file: Err("not loaded in this test".into()),
    };
    let mut backends = vec![Backend::Sqlite];
    if pg.is_some() {
        backends.push(Backend::Postgres);
    }
    for b in backends {
        let arbiter = lease_gate(
            &scenarios,
            b,
            Implementation::Variant(Variant::LeaseAsArbiter),
            &opts,
        );
        let GateOutcome::Killed(why) = &arbiter else {
            panic!("{b}: lease-as-arbiter not killed: {arbiter:?}")
        };
        for name in ["n-lease-expiry", "p-lease-flush"] {
            assert!(why.contains(name), "{b}: {why}");
        }
        assert!(why.contains("expected 1 created, got 2"), "{b}: {why}");
        let unsafe_release = lease_gate(
            &scenarios,
            b,
            Implementation::Variant(Variant::LeaseUnsafeRelease),
            &opts,
        );
        assert!(
            matches!(&unsafe_release, GateOutcome::Killed(w) if w.contains("o-lease-two-tokens")),
            "{b}: {unsafe_release:?}"
        );
        // The control survives the same gate.
        assert_eq!(
            lease_gate(&scenarios, b, Implementation::default(), &opts),
            GateOutcome::Survived,
            "{b}"
        );
    }
}

#[test]
fn without_the_runners_expiry_the_second_request_never_takes_the_lease_and_the_check_fails() {
    let Some(mut lease) = redis_db(9) else { return };
    // Short TTL: the second request waits for the holder's lease to run out on its own.
    lease.config = lease
        .config
        .map(|c| LeaseConfig::new(&c.url, Duration::from_millis(200)).unwrap());
    lease.skip_event = true;
    let s = load(FILES[0]);
    let run = run_sqlite(
        &s,
        &SqliteOptions {
            lease,
            ..SqliteOptions::default()
        },
    );
    assert_eq!(run.verdict, Verdict::Fail, "{run:#?}");
    let c = check(&run, "lease");
    assert!(
        c.detail.contains("second did not hold the lease (waited)"),
        "{}",
        c.detail
    );
}

#[test]
fn redis_down_counts_no_lease_and_a_redis_that_answers_fails_that_check() {
    let s = load(FILES[4]);
    // Needs no Redis: nothing listens on the port the runner picks.
    let run = run_sqlite(&s, &SqliteOptions::default());
    assert_eq!(run.verdict, Verdict::Pass, "{:?}", run.reason);
    assert!(check(&run, "lease").detail.contains("no lease"));
    let Some(mut lease) = redis_db(8) else { return };
    lease.down_url = lease.config.as_ref().map(|c| c.url.clone());
    let run = run_sqlite(
        &s,
        &SqliteOptions {
            lease,
            ..SqliteOptions::default()
        },
    );
    assert_eq!(run.verdict, Verdict::Fail, "{run:#?}");
    assert!(
        check(&run, "lease")
            .detail
            .contains("was not counted as no lease"),
        "{:?}",
        run.reason
    );
}

fn ticketflow(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ticketflow"))
        .args(args)
        .env_remove("DATABASE_URL")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[test]
fn unreachable_redis_is_pending_never_pass_and_exits_3_only_under_require_redis() {
    let base = ["scenario", "run", "--backend", "sqlite"];
    let with = |extra: &[&str]| {
        let mut a: Vec<&str> = base.to_vec();
        a.extend_from_slice(extra);
        ticketflow(&a)
    };
    let nowhere = ["--lease", "redis://127.0.0.1:1/14", FILES[0], FILES[4]];
    let (code, out) = with(&nowhere);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("PENDING") && out.contains("n-lease-expiry — Redis not usable"),
        "{out}"
    );
    assert!(
        out.contains("PASS     sqlite    wal, lazy                  r-lease-redis-down"),
        "{out}"
    );
    let mut required = nowhere.to_vec();
    required.push("--require-redis");
    let (code, out) = with(&required);
    assert_eq!(code, 3, "{out}");
    // A Redis PENDING is --require-redis's business: PostgreSQL required (asked for, or its
    // URL given) does not make it exit 3.
    let mut pg_required = nowhere.to_vec();
    pg_required.push("--require-postgres");
    let (code, out) = with(&pg_required);
    assert_eq!(code, 0, "{out}");
    // Bad input: usage errors.
    assert_eq!(with(&["--lease", "http://x/0", FILES[0]]).0, 2);
    assert_eq!(with(&["--lease-ttl-ms", "0", FILES[0]]).0, 2);
    // db 0 is shared: the flush scenarios refuse it (PENDING), they never flush it.
    let (code, out) = with(&["--lease", "redis://127.0.0.1:6379/0", FILES[2]]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("refusing FLUSHDB on db 0"), "{out}");
    // `/00` is db 0 to Redis as well.
    let (code, out) = with(&["--lease", "redis://127.0.0.1:6379/00", FILES[2]]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("refusing FLUSHDB on db 0"), "{out}");
}

#[test]
fn report_json_holds_the_lease_evidence_and_its_schema_refuses_a_bad_event() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("REPORT.md");
    let report_s = report.display().to_string();
    let (_, out) = ticketflow(&[
        "verify",
        "--backend",
        "sqlite",
        "--filter",
        "r-lease",
        "--no-kill-matrix",
        "--report",
        &report_s,
    ]);
    let md = std::fs::read_to_string(&report).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert!(
        md.contains("## Redis lease in front of the receipt"),
        "{md}"
    );
    assert!(
        md.contains("| r-lease-redis-down | redis-down | wal, lazy | **PASS**"),
        "{md}"
    );
    assert!(md.contains("What the lease scenarios cannot prove"));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("report.json")).unwrap())
            .unwrap();
    let v = crate::report::schema_validator();
    assert_eq!(
        crate::report::schema_errors(&v, &json),
        Vec::<String>::new()
    );
    let run = &json["scenario_runs"][0];
    assert_eq!(run["lease"]["event"], "redis-down", "{run}");
    let mut bad = json.clone();
    bad["scenario_runs"][0]["lease"]["event"] = "nope".into();
    assert!(!crate::report::schema_errors(&v, &bad).is_empty());
}

/// `verify`'s pool runs a `[lease]` run alone: the lease scenarios share one Redis database,
/// which the flush scenarios empty, and the same lease keys. Run four at once, the flush of
/// one emptied another's database mid-run and failed its token check (seen in `verify`).
#[test]
fn the_runs_pool_never_runs_two_lease_scenarios_at_once() {
    let Some(lease) = redis_db(7) else { return };
    let scenarios: Vec<Scenario> = FILES.iter().map(|f| load(f)).collect();
    let pg = crate::support::pg_url();
    let mut base = PgOptions::new(crate::support::server(&pg.clone().unwrap_or_default()));
    base.lease = lease;
    let selection = ticketflow::verify::Selection {
        backends: if pg.is_some() {
            Backend::ALL.to_vec()
        } else {
            vec![Backend::Sqlite]
        },
        ..Default::default()
    };
    // Twice, to give an overlap more than one chance.
    for _ in 0..2 {
        let ran = ticketflow::verify::run_all_on(
            &scenarios,
            &selection,
            &base,
            &ticketflow_core::RetryPolicy::default(),
            None,
            ticketflow_harness::jobs::Pool::new(4, 1_000),
            &mut |_| {},
        );
        for r in &ran.results {
            assert_eq!(
                r.verdict,
                Verdict::Pass,
                "{} [{}]: {:?} {:?}",
                r.scenario,
                r.setting.label(),
                r.reason,
                r.checks.iter().find(|c| !c.passed())
            );
        }
    }
}

/// Set in the child process of `an_unexpected_release_failure_still_warns`.
const WARN_CHILD: &str = "TICKETFLOW_LEASE_WARN_CHILD";

/// Leases whose every release fails, as a Redis connection lost for a reason nobody injected.
struct LostOnRelease;

impl ticketflow_core::lease::Leases for LostOnRelease {
    fn acquire(
        &mut self,
        _: &str,
        _: &str,
        _: Duration,
    ) -> Result<bool, ticketflow_core::lease::LeaseError> {
        Ok(true)
    }
    fn release(&mut self, _: &str, _: &str) -> Result<bool, ticketflow_core::lease::LeaseError> {
        Err(ticketflow_core::lease::LeaseError {
            operation: "release",
            message: "Connection reset by peer (os error 104)".into(),
        })
    }
    fn delete(&mut self, key: &str) -> Result<bool, ticketflow_core::lease::LeaseError> {
        self.release(key, "")
    }
    fn holder(&mut self, _: &str) -> Result<Option<String>, ticketflow_core::lease::LeaseError> {
        Ok(None)
    }
}

/// The simulated Redis restart (`q-lease-restart`) kills the holder's connection on purpose,
/// so its release fails: `verify` shows no WARN for it at the default log level; at `info`
/// the expected failure is logged as the result of the simulated restart, and the evidence
/// says so.
#[test]
fn a_simulated_restart_warns_of_nothing_and_logs_its_failed_release_as_expected() {
    let Some(lease) = redis_db(5) else { return };
    let url = lease.config.unwrap().url;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("scenarios")).unwrap();
    std::fs::copy(
        crate::support::repo_path("scenarios/q-lease-restart.toml"),
        dir.path().join("scenarios/q-lease-restart.toml"),
    )
    .unwrap();
    let verify = |log: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_ticketflow"));
        c.args(["verify", "--filter", "q-lease-restart", "--lease", &url])
            .current_dir(dir.path())
            .env_remove("DATABASE_URL")
            .env_remove("TICKETFLOW_LOG");
        if let Some(l) = log {
            c.env("TICKETFLOW_LOG", l);
        }
        let out = c.output().unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        );
        assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with("PASS ") && l.contains("q-lease-restart")),
            "{stdout}"
        );
        stderr
    };
    let quiet = verify(None);
    assert!(
        !quiet.lines().any(|l| l.contains("WARN")),
        "an expected failure looks like a problem:\n{quiet}"
    );
    let info = verify(Some("info"));
    let expected: Vec<&str> = info
        .lines()
        .filter(|l| l.contains("lease release failed"))
        .collect();
    assert!(!expected.is_empty(), "the release did not fail:\n{info}");
    for l in expected {
        assert!(
            l.contains(" INFO ") && l.contains("to simulate a Redis restart"),
            "{l}"
        );
    }
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("ticketflow-report/partial/report.json")).unwrap(),
    )
    .unwrap();
    for run in json["scenario_runs"].as_array().unwrap() {
        let ops = run["lease"]["ops"].as_array().unwrap();
        assert!(
            ops.iter().any(|o| o["actor"] == "holder"
                && o["op"] == "release (compare-and-delete)"
                && o["result"]
                    .as_str()
                    .unwrap()
                    .contains("(expected: the runner killed this connection")),
            "{ops:?}"
        );
    }
}

/// A release that fails for a reason nobody injected still warns at the default log level
/// (checked in a child process with a global subscriber, so no other test's tracing state
/// can hide the event).
#[test]
fn an_unexpected_release_failure_still_warns() {
    if std::env::var_os(WARN_CHILD).is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(ticketflow::logging::filter(None))
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .init();
        let db = crate::support::TestDb::sqlite();
        let mut store = db.open();
        let config = LeaseConfig::new("redis://127.0.0.1:1/0", Duration::from_secs(1)).unwrap();
        let (created, outcome) = ticketflow_core::lease::create_with_lease(
            Some(&mut LostOnRelease),
            &config,
            ticketflow_core::lease::Release::CompareAndDelete,
            store.as_mut(),
            "A",
            "key-1",
            |s| {
                ticketflow_core::create_ticket(
                    s,
                    "A",
                    "key-1",
                    &crate::support::b0(),
                    &ticketflow_core::CreateOptions::default(),
                )
            },
        );
        created.unwrap();
        assert_eq!(outcome, LeaseOutcome::Held { released: false });
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "lease_scenarios::an_unexpected_release_failure_still_warns",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(WARN_CHILD, "1")
        .env_remove("TICKETFLOW_LOG")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "child failed: {}{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        stderr
            .lines()
            .any(|l| l.contains(" WARN ") && l.contains("lease release failed")),
        "{stderr}"
    );
}
