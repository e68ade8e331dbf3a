use std::time::Duration;

use ticketflow_core::variants::{redis_lock_keys, Implementation, Variant};
use ticketflow_core::Protocol;
use ticketflow_harness::argv::implementation_args;
use ticketflow_harness::blackbox::{TargetOutcome, TargetScenario};
use ticketflow_harness::killmatrix::{interposed_gate, load_interposed, with_serve_args};
use ticketflow_harness::killmatrix::{GateOutcome, KillOptions};
use ticketflow_harness::verdict::Verdict;

use crate::serve::{call, serve, B0};
use crate::support::{pg_url, repo_path};

/// The Redis database the interposed Redis file names (`redis_url`).
const REDIS_DB9: &str = "redis://127.0.0.1:6379/9";

fn redis_up() -> bool {
    crate::support::redis_up_at(REDIS_DB9)
}

/// The shipped interposed file `name` (under scenarios/interposed/), serving `implementation`.
fn interposed(name: &str, implementation: Implementation) -> TargetScenario {
    let all = load_interposed(&repo_path("scenarios/interposed")).unwrap();
    let s = all
        .iter()
        .find(|s| s.file.file_name().is_some_and(|f| f == name))
        .unwrap_or_else(|| panic!("scenarios/interposed/{name} not loaded"));
    with_serve_args(s, &implementation_args(implementation))
}

const PG_FILE: &str = "two-racers-same-key.toml";
const REDIS_FILE: &str = "two-racers-same-key-redis.toml";

fn run(
    s: &TargetScenario,
    url: &str,
    explore: Option<&str>,
    schedule: Option<String>,
) -> TargetOutcome {
    run_on(s, url, explore, schedule, 1)
}

/// [`run`] with up to `lanes` schedules side by side.
fn run_on(
    s: &TargetScenario,
    url: &str,
    explore: Option<&str>,
    schedule: Option<String>,
    lanes: usize,
) -> TargetOutcome {
    let opts = ticketflow_harness::blackbox::RunOptions {
        exe: Some(std::path::PathBuf::from(env!("CARGO_BIN_EXE_ticketflow"))),
        explore: explore
            .map(|m| ticketflow_harness::blackbox::format::ExploreMode::parse(m).unwrap()),
        schedule,
        parallel: lanes,
        ..ticketflow_harness::blackbox::RunOptions::new(crate::support::server(url))
    };
    ticketflow_harness::blackbox::run_repeated(s, &opts).unwrap()
}

fn text(o: &TargetOutcome) -> String {
    ticketflow_harness::blackbox::summary::summary_text(o)
}

/// Deletes `redis-check-then-lock`'s keys of the runs in `outcome` from db 9.
fn clean_redis(outcome: &TargetOutcome) {
    let Ok(mut c) = redis::Client::open(REDIS_DB9).and_then(|c| c.get_connection()) else {
        return;
    };
    for r in &outcome.runs {
        let Some(e) = &r.evidence else { continue };
        let (rec, lock) = redis_lock_keys(
            &format!("A-{}", e.run_id),
            &format!("tfv-{}-key-1", e.run_id),
        );
        let _: redis::RedisResult<i64> = redis::cmd("DEL").arg(rec).arg(lock).query(&mut c);
    }
}

/// Exploration FAILs `variant` on `file` with `check` among the failed checks; its failing
/// schedule, replayed by id, FAILs again at the same id. Returns the outcomes.
fn explored_fails_and_replays(
    url: &str,
    file: &str,
    variant: Variant,
    check: &str,
) -> (TargetOutcome, TargetOutcome) {
    let s = interposed(file, Implementation::Variant(variant));
    let o = run(&s, url, None, None);
    assert_eq!(o.verdict, Verdict::Fail, "{variant}: {}", text(&o));
    let failing = o.runs.iter().find(|r| r.verdict == Verdict::Fail).unwrap();
    assert!(
        failing
            .checks
            .iter()
            .any(|c| !c.passed() && c.name == check),
        "{variant}: {:?}",
        failing.checks
    );
    let id = crate::support::schedule_of(failing);
    let again = run(&s, url, None, Some(id.clone()));
    assert_eq!(
        again.verdict,
        Verdict::Fail,
        "{variant} replay {id}: {}",
        text(&again)
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
    assert!(
        again.runs[0]
            .checks
            .iter()
            .any(|c| !c.passed() && c.name == check),
        "{variant} replay {id}: {:?}",
        again.runs[0].checks
    );
    (o, again)
}

#[test]
fn exploration_finds_an_answer_completed_in_a_second_transaction_and_its_schedule_replays() {
    let Some(url) = pg_url() else { return };
    let (o, _) = explored_fails_and_replays(
        &url,
        PG_FILE,
        Variant::AnswerInSecondTransaction,
        "same answer",
    );
    // The replay that read the receipt between the commits answered the placeholder.
    let reason = o.reason.unwrap_or_default();
    assert!(reason.contains(r#""title":"""#), "{reason}");
}

#[test]
fn exploration_finds_a_second_ticket_behind_a_redis_check_then_lock_and_its_schedule_replays() {
    let Some(url) = pg_url() else { return };
    if !redis_up() {
        return;
    }
    let (o, again) = explored_fails_and_replays(
        &url,
        REDIS_FILE,
        Variant::RedisCheckThenLock,
        "one effect per intent",
    );
    // Two tickets for one key, counted in the database, in the explored and the replayed run.
    for r in [o.runs.last().unwrap(), &again.runs[0]] {
        let tickets = r.counts.iter().find(|c| c.name == "tickets").unwrap();
        assert_eq!(tickets.counted.as_ref().ok(), Some(&2), "{:?}", r.counts);
    }
    clean_redis(&o);
    clean_redis(&again);
}

#[test]
fn exploration_finds_split_transactions_in_the_shipped_interposed_file() {
    let Some(url) = pg_url() else { return };
    let s = interposed(PG_FILE, Implementation::Variant(Variant::SplitTransactions));
    let o = run(&s, &url, None, None);
    assert_eq!(o.verdict, Verdict::Fail, "{}", text(&o));
}

/// The negative control: the real protocols PASS the same files under the same exploration
/// and at the first point, through the kill matrix's own gate.
#[test]
fn the_real_protocols_survive_both_interposed_gates_on_every_file() {
    let Some(url) = pg_url() else { return };
    let opts = kill_options(&url);
    let with_redis = redis_up();
    for p in Protocol::ALL {
        let control = Implementation::Protocol(p);
        for gate in ["explore", "first-point"] {
            let outcome = interposed_gate(gate, control, &opts);
            match outcome {
                GateOutcome::Survived => {}
                // Without Redis the Redis file is PENDING and nothing failed.
                GateOutcome::Pending(why) if !with_redis => assert!(why.contains("Redis"), "{why}"),
                other => panic!("{} × {gate}: {other:?}", control.name()),
            }
        }
    }
}

/// The kill matrix's explore gate kills each variant it is for. The first point's result for
/// each is printed, not asserted: whether a free run lands in the window is timing.
#[test]
fn the_explore_gate_kills_each_explored_variant_and_the_first_point_is_recorded() {
    let Some(url) = pg_url() else { return };
    let opts = kill_options(&url);
    let with_redis = redis_up();
    for v in Variant::EXPLORED {
        if v.needs_redis() && !with_redis {
            continue;
        }
        let i = Implementation::Variant(v);
        let explore = interposed_gate("explore", i, &opts);
        assert!(
            matches!(explore, GateOutcome::Killed(_)),
            "{v}: {explore:?}"
        );
        let first = interposed_gate("first-point", i, &opts);
        assert!(
            !matches!(first, GateOutcome::NotApplicable(_)),
            "{v}: {first:?}"
        );
        eprintln!("first-point × {v}: {first:?}");
    }
}

/// With Redis unreachable the Redis variant's interposed cells are PENDING, saying Redis was
/// not usable (what `--require-redis` reads), and nothing is run or killed.
#[test]
fn the_redis_variants_cells_are_pending_with_the_reason_when_redis_is_down() {
    let Some(url) = pg_url() else { return };
    let mut opts = kill_options(&url);
    opts.lease.config = Some(
        ticketflow_core::lease::LeaseConfig::new("redis://127.0.0.1:1/9", Duration::from_secs(2))
            .unwrap(),
    );
    for gate in ["explore", "first-point"] {
        let outcome = interposed_gate(
            gate,
            Implementation::Variant(Variant::RedisCheckThenLock),
            &opts,
        );
        let GateOutcome::Pending(why) = &outcome else {
            panic!("{gate}: {outcome:?}")
        };
        assert!(
            why.starts_with(ticketflow_harness::scenario::lease::REDIS_PENDING),
            "{gate}: {why}"
        );
    }
}

fn kill_options(url: &str) -> KillOptions {
    KillOptions {
        pg: crate::support::server(url),
        pg_unusable: None,
        cases: 8,
        seed: None,
        loom_report: "reports/loom.json".into(),
        worker_exe: Some(env!("CARGO_BIN_EXE_ticketflow").into()),
        lease: ticketflow_harness::scenario::lease::LeaseRunOptions {
            config: Some(
                ticketflow_core::lease::LeaseConfig::new(REDIS_DB9, Duration::from_secs(2))
                    .unwrap(),
            ),
            ..Default::default()
        },
        interposed: load_interposed(&repo_path("scenarios/interposed")),
        check_file: Err("not loaded in this test".into()),
    }
}

/// A client that is not raced sees correct behaviour from both new variants: 201, then a
/// replay of the same body (the same ticket), and another body under the key is a conflict.
#[test]
fn an_unraced_client_gets_created_then_the_same_answer_replayed_from_both_variants() {
    let Some(db) = crate::support::TestDb::postgres("iv_unraced") else {
        return;
    };
    let db_url = db.url().unwrap();
    let mut cases = vec![vec!["--variant", "answer-in-second-transaction"]];
    if redis_up() {
        cases.push(vec![
            "--variant",
            "redis-check-then-lock",
            "--lease",
            REDIS_DB9,
        ]);
    }
    for (n, args) in cases.iter().enumerate() {
        let s = serve(&db_url, args);
        let tenant = format!("T{n}-{}", std::process::id());
        let h = [("X-Tenant-Id", tenant.as_str()), ("Idempotency-Key", "k1")];
        let a = call("POST", &format!("{}/v1/tickets", s.base), &h, Some(B0));
        let b = call("POST", &format!("{}/v1/tickets", s.base), &h, Some(B0));
        assert_eq!((a.status, b.status), (201, 201), "{args:?}");
        assert_eq!(b.replayed.as_deref(), Some("true"), "{args:?}");
        assert_eq!(a.json, b.json, "{args:?}");
        assert_eq!(a.json["title"], "x", "{args:?}");
        let other = B0.replace("\"y\"", "\"z\"");
        let c = call("POST", &format!("{}/v1/tickets", s.base), &h, Some(&other));
        assert_eq!(c.status, 409, "{args:?}");
        if args.contains(&"--lease") {
            let mut conn = redis::Client::open(REDIS_DB9)
                .unwrap()
                .get_connection()
                .unwrap();
            let (rec, lock) = redis_lock_keys(&tenant, "k1");
            let _: i64 = redis::cmd("DEL")
                .arg(rec)
                .arg(lock)
                .query(&mut conn)
                .unwrap();
        }
    }
}

#[test]
fn redis_check_then_lock_without_a_redis_url_is_a_usage_error() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ticketflow"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            "postgres://postgres@127.0.0.1:5432/postgres",
            "--variant",
            "redis-check-then-lock",
        ])
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--lease"), "{err}");
}

/// The reduced search (one schedule per class of interleavings under the dependency relation)
/// and the full search (the file's own: every schedule within its preemption bound, or every
/// interleaving) reach the same verdict on every shipped same-key file, for each variant
/// exploration is for and for the real protocols; on the protocols the reduced search
/// completes and says over how many classes, in fewer schedules than the interleavings.
#[test]
fn the_reduced_and_the_full_search_agree_on_the_interposed_files() {
    let Some(url) = pg_url() else { return };
    let with_redis = redis_up();
    let savepoint_lease: Vec<String> =
        implementation_args(Implementation::Protocol(Protocol::Savepoint))
            .into_iter()
            .chain(["--lease".to_string(), "{redis_url}".to_string()])
            .collect();
    let cases: Vec<(&str, Vec<String>, Option<&str>, Verdict)> = vec![
        (
            PG_FILE,
            implementation_args(Implementation::Variant(Variant::SplitTransactions)),
            None,
            Verdict::Fail,
        ),
        (
            PG_FILE,
            implementation_args(Implementation::Variant(Variant::AnswerInSecondTransaction)),
            None,
            Verdict::Fail,
        ),
        (
            PG_FILE,
            implementation_args(Implementation::Protocol(Protocol::Savepoint)),
            None,
            Verdict::Pass,
        ),
        // Few enough interleavings that the full search is every one of them.
        (
            PG_FILE,
            implementation_args(Implementation::Protocol(Protocol::SingleStatement)),
            Some("exhaustive"),
            Verdict::Pass,
        ),
        (
            REDIS_FILE,
            implementation_args(Implementation::Variant(Variant::RedisCheckThenLock)),
            None,
            Verdict::Fail,
        ),
        (REDIS_FILE, savepoint_lease, None, Verdict::Pass),
    ];
    for (file, args, full, want) in cases {
        if file == REDIS_FILE && !with_redis {
            continue;
        }
        let all = load_interposed(&repo_path("scenarios/interposed")).unwrap();
        let base = all
            .iter()
            .find(|s| s.file.file_name().is_some_and(|f| f == file))
            .unwrap();
        let s = with_serve_args(base, &args);
        // A run the machine could not host (a racer not seen in time under load) is PENDING,
        // which says nothing of the search: such a search is run once more, and a second
        // PENDING leaves the case out (said on stderr), never passed.
        let search = |mode: Option<&str>| {
            let o = run(&s, &url, mode, None);
            if o.verdict != Verdict::Pending {
                return Some(o);
            }
            if file == REDIS_FILE {
                clean_redis(&o);
            }
            let again = run(&s, &url, mode, None);
            (again.verdict != Verdict::Pending).then_some(again)
        };
        let (Some(reduced), Some(whole)) = (search(Some("reduced")), search(full)) else {
            eprintln!("{file} {args:?}: PENDING twice, not compared");
            continue;
        };
        assert_eq!(reduced.verdict, want, "{file} {args:?}: {}", text(&reduced));
        assert_eq!(whole.verdict, want, "{file} {args:?}: {}", text(&whole));
        let coverage = reduced.coverage.clone().unwrap_or_default();
        if want == Verdict::Pass {
            assert!(coverage.contains("complete over"), "{coverage}");
            assert!(coverage.contains("one per orbit"), "{coverage}");
        }
        if file == REDIS_FILE {
            clean_redis(&reduced);
            clean_redis(&whole);
        }
    }
}

/// The starter file `name` as `target init --interposer` writes it for the check file's two
/// `serve` instances, explored by the reduced search on two lanes side by side against the
/// savepoint protocol (asserted to PASS complete, each of `says` in its coverage line, in fewer
/// than `most` schedules) and against `variant` (asserted to FAIL). `None` when the machine
/// could not host the run.
fn reduced_starter_file(name: &str, says: &[&str], most: usize, variant: Variant) -> Option<()> {
    let url = pg_url()?;
    let check = ticketflow_harness::killmatrix::load_check_file(&repo_path("scenarios")).unwrap();
    let files = ticketflow_harness::killmatrix::interposed_starter_scenarios(&check).unwrap();
    let base = files.iter().find(|s| s.name == name).unwrap();
    let correct = with_serve_args(
        base,
        &implementation_args(Implementation::Protocol(Protocol::Savepoint)),
    );
    // Two lanes side by side: the reduced search on a tree of points, runs out at once.
    let o = run_on(&correct, &url, Some("reduced"), None, 2);
    if o.verdict == Verdict::Pending {
        eprintln!("skipped: the machine could not host the run: {}", text(&o));
        return None;
    }
    assert_eq!(o.verdict, Verdict::Pass, "{}", text(&o));
    let coverage = o.coverage.clone().unwrap_or_default();
    assert!(coverage.contains("reduced: complete over"), "{coverage}");
    for x in says {
        assert!(coverage.contains(x), "{x}: {coverage}");
    }
    assert!(
        o.runs.len() < most,
        "{} schedules: {coverage}",
        o.runs.len()
    );
    let wrong = with_serve_args(base, &implementation_args(Implementation::Variant(variant)));
    let o = run_on(&wrong, &url, Some("reduced"), None, 2);
    assert_eq!(o.verdict, Verdict::Fail, "{}", text(&o));
    Some(())
}

/// The starter set's two-scopes file: three clients per scope, the scopes' racers
/// independent, so the reduced search explores one scope's group at a time and completes (a
/// sum of the groups' classes, not their product); a cache keyed without the scope is still
/// caught (its answer crosses scopes in every order).
#[test]
fn the_two_scopes_starter_file_is_explored_one_independent_group_at_a_time() {
    reduced_starter_file(
        "two-scopes",
        &["2 independent groups", "side by side on 2 lanes"],
        200,
        Variant::CacheWithoutScope,
    );
}

/// The starter set's same-body file over two instances started from one command: its four
/// racers are interchangeable (one process image, the same request), and the reduced search
/// completes; split transactions still fail it.
#[test]
fn the_same_body_starter_file_over_two_alike_instances_completes_with_every_racer_interchangeable()
{
    reduced_starter_file(
        "same-body",
        &["3 racer(s) interchangeable", "side by side on 2 lanes"],
        300,
        Variant::SplitTransactions,
    );
}
