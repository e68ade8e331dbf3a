//! The starter set of `target init` against small services of ours with one known bug each:
//! every effect counted, the race able to fail, the decisive check first, PENDING and setup
//! errors told apart from a FAIL by their exit codes.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use ticketflow_harness::blackbox::{run_repeated, RunOptions, TargetRun, TargetScenario};
use ticketflow_harness::verdict::Verdict;

use crate::blackbox::{response, stub, StubRequest};
use crate::cli::{run_cli_in, Output};
use crate::support::{pg_url, TestDb};

/// How a shop service goes wrong (or does not).
#[derive(Clone, Copy, PartialEq)]
enum Bug {
    /// One transaction: claim the key, create the order, store its id; replays marked.
    None,
    /// Creates the order first, then claims the key: a refused body still leaves its order.
    WorkFirst,
    /// Keys unique per key only, not per caller: another caller gets the first one's order.
    KeyOnly,
    /// Replays look like creates: no marker header.
    Unmarked,
    /// Replays carry a marker the presets do not know.
    OwnMarker,
    /// One request at a time reaches the database (a pool of one connection).
    PoolOfOne,
    /// Correct, but refuses an invalid body with 422 (as FastAPI does), which the ietf preset
    /// reads as conflict.
    Validation422,
    /// Writes an order for an invalid body before refusing it.
    WritesInvalid,
}

/// A running shop: its base URL, its database and how many requests it received.
struct Shop {
    base: String,
    db: TestDb,
    url: String,
    requests: Arc<AtomicUsize>,
}

/// Starts a shop service with `bug` on a scratch database of its own, or `None` without
/// PostgreSQL.
fn shop(label: &str, bug: Bug) -> Option<Shop> {
    let db = TestDb::postgres(label)?;
    let url = db.url().unwrap();
    let key = if bug == Bug::KeyOnly {
        "PRIMARY KEY (key)"
    } else {
        "PRIMARY KEY (scope, key)"
    };
    let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    c.batch_execute(&format!(
        "CREATE TABLE idempotency_keys (scope text NOT NULL, key text NOT NULL, body text NOT NULL, order_id int, {key});
         CREATE TABLE orders (id serial PRIMARY KEY, idempotency_key text NOT NULL, owner text NOT NULL);"
    ))
    .unwrap();
    let requests = Arc::new(AtomicUsize::new(0));
    let (seen, db_url) = (requests.clone(), url.clone());
    let pool = Arc::new(Mutex::new(()));
    let base = stub(move |req| {
        seen.fetch_add(1, Ordering::SeqCst);
        let _one = (bug == Bug::PoolOfOne).then(|| pool.lock().unwrap_or_else(|p| p.into_inner()));
        handle(&db_url, bug, req)
    });
    Some(Shop {
        base,
        db,
        url,
        requests,
    })
}

/// One create: 400 for an empty item, else claim the key (waiting on the table lock the
/// barrier holds), create the order and answer 201, or replay or refuse (422) against the
/// stored body.
fn handle(url: &str, bug: Bug, req: &StubRequest) -> String {
    let json: serde_json::Value = serde_json::from_slice(&req.body).unwrap_or_default();
    // Stored and compared as canonical JSON (members sorted): one intent, however spelled.
    let body = json.to_string();
    let scope = req.header("x-user-id").unwrap_or("").to_string();
    let key = req.key.clone();
    let mut c = postgres::Client::connect(url, postgres::NoTls).unwrap();
    if json["item"].as_str().unwrap_or("").is_empty() {
        if bug == Bug::WritesInvalid {
            create(&mut c, &key, &scope);
        }
        return match bug {
            Bug::Validation422 => response("422 Unprocessable Entity", &[], r#"{"detail":"item"}"#),
            _ => response("400 Bad Request", &[], r#"{"error":"item is required"}"#),
        };
    }
    let early = (bug == Bug::WorkFirst).then(|| create(&mut c, &key, &scope));
    let mut tx = c.transaction().unwrap();
    let claimed = tx
        .execute(
            "INSERT INTO idempotency_keys (scope, key, body) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
            &[&scope, &key, &body],
        )
        .unwrap();
    if claimed == 1 {
        let id = early.unwrap_or_else(|| create(&mut tx, &key, &scope));
        tx.execute(
            "UPDATE idempotency_keys SET order_id = $3 WHERE scope = $1 AND key = $2",
            &[&scope, &key, &id],
        )
        .unwrap();
        tx.commit().unwrap();
        return response("201 Created", &[], &format!(r#"{{"id":{id}}}"#));
    }
    tx.commit().unwrap();
    let by = if bug == Bug::KeyOnly {
        "key = $2 AND $1 = $1"
    } else {
        "scope = $1 AND key = $2"
    };
    let row = c
        .query_one(
            &format!("SELECT body, order_id FROM idempotency_keys WHERE {by}"),
            &[&scope, &key],
        )
        .unwrap();
    let (stored, id): (String, i32) = (row.get(0), row.get(1));
    if stored != body {
        return response("422 Unprocessable Entity", &[], r#"{"error":"key reused"}"#);
    }
    let marker: &[(&str, &str)] = match bug {
        Bug::Unmarked => &[],
        Bug::OwnMarker => &[("X-Idempotent-Replayed", "true")],
        _ => &[("Idempotent-Replayed", "true")],
    };
    response("201 Created", marker, &format!(r#"{{"id":{id}}}"#))
}

/// Inserts an order for `key` owned by `scope`; its id.
fn create(c: &mut impl postgres::GenericClient, key: &str, scope: &str) -> i32 {
    c.query_one(
        "INSERT INTO orders (idempotency_key, owner) VALUES ($1, $2) RETURNING id",
        &[&key, &scope],
    )
    .unwrap()
    .get(0)
}

const COUNT_BY_KEY: &str = "orders=SELECT count(*) FROM orders WHERE idempotency_key = {key}";
const COUNT_BY_SCOPE: &str =
    "orders=SELECT count(*) FROM orders WHERE owner = {scope} AND idempotency_key = {key}";

/// `target init` for `shop` into `dir/out` with `extra` options; the written files.
fn init(dir: &Path, base: &str, db_url: &str, extra: &[&str]) -> Vec<PathBuf> {
    let mut args = vec![
        "target",
        "init",
        "--url",
        base,
        "--target-database-url",
        db_url,
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
        "--out",
        "out",
    ];
    args.extend_from_slice(extra);
    let out = run_cli_in(dir, &args, b"");
    assert_eq!(out.code, 0, "{}", out.stderr);
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("out"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
}

/// The file of `files` whose name starts with `n-`.
fn file(files: &[PathBuf], n: u32) -> &Path {
    files
        .iter()
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(&format!("{n}-"))
        })
        .unwrap()
}

/// One run of `path` through the library.
fn run(path: &Path, pg: &str) -> TargetRun {
    let s = TargetScenario::load(path).unwrap_or_else(|e| panic!("{e}"));
    let opts = RunOptions {
        barrier_timeout: Some(std::time::Duration::from_millis(2_000)),
        ..RunOptions::new(crate::support::server(pg))
    };
    let mut o = run_repeated(&s, &opts).unwrap_or_else(|e| panic!("{}: {e}", s.name));
    o.runs.remove(0)
}

fn scenario_run(dir: &Path, path: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["scenario", "run", path.to_str().unwrap()];
    args.extend_from_slice(extra);
    run_cli_in(dir, &args, b"")
}

#[test]
fn a_service_that_works_first_fails_the_two_bodies_file_on_its_count() {
    let (Some(pg), Some(s)) = (pg_url(), shop("st_workfirst", Bug::WorkFirst)) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let files = init(dir.path(), &s.base, &s.url, &["--count", COUNT_BY_KEY]);
    let r = run(file(&files, 2), &pg);
    assert_eq!(r.verdict, Verdict::Fail, "{:?}", r.checks);
    let reason = r.reason.unwrap();
    assert!(
        // Every request of the refused body works first: two in the race and two after it.
        reason.starts_with("counts: orders[key=k1]: expected 1, counted "),
        "{reason}"
    );
    // The control: the same file passes a service that claims the key first.
    let (_, good) = (s.db, shop("st_workfirst_ok", Bug::None).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let files = init(
        dir.path(),
        &good.base,
        &good.url,
        &["--count", COUNT_BY_KEY],
    );
    let ok = run(file(&files, 2), &pg);
    assert_eq!(ok.verdict, Verdict::Pass, "{:?}", ok.reason);
    assert!(ok
        .evidence_line
        .unwrap()
        .contains("counts: orders[key=k1] = 1"));
}

#[test]
fn a_pass_without_counts_says_effects_were_not_counted() {
    let (Some(pg), Some(s)) = (pg_url(), shop("st_nocount", Bug::None)) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = run_cli_in(
        dir.path(),
        &[
            "target",
            "init",
            "--url",
            &s.base,
            "--target-database-url",
            &s.url,
            "--table",
            "idempotency_keys",
            "--path",
            "/orders",
            "--body",
            r#"{"item":"book"}"#,
            "--invalid-body",
            r#"{"item":""}"#,
            "--scope-header",
            "X-User-Id",
            "--out",
            "out",
        ],
        b"",
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stderr.contains("effects not counted"), "{}", out.stderr);
    let r = run(&dir.path().join("out/1-same-body.toml"), &pg);
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reason);
    assert!(
        r.evidence_line.unwrap().contains("effects not counted"),
        "a PASS without counts must say so"
    );
}

#[test]
fn a_two_scopes_file_with_a_scope_count_loads_and_fails_a_key_only_service_on_isolation() {
    let (Some(pg), Some(s)) = (pg_url(), shop("st_keyonly", Bug::KeyOnly)) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let files = init(dir.path(), &s.base, &s.url, &["--count", COUNT_BY_SCOPE]);
    // Every file loads, the {scope} count included.
    for f in files.iter().filter(|f| !f.ends_with("check.toml")) {
        TargetScenario::load(f).unwrap_or_else(|e| panic!("{e}"));
    }
    let r = run(file(&files, 3), &pg);
    assert_eq!(r.verdict, Verdict::Fail);
    let reason = r.reason.unwrap();
    assert!(reason.starts_with("scope isolation: "), "{reason}");
    let counts = r.checks.iter().find(|c| c.name == "counts").unwrap();
    assert!(
        !counts.passed(),
        "the other scope's count is 0: {}",
        counts.detail
    );
}

#[test]
fn unmarked_replays_get_the_marked_false_hint_and_pass_when_declared() {
    let (Some(pg), Some(s)) = (pg_url(), shop("st_unmarked", Bug::Unmarked)) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let files = init(dir.path(), &s.base, &s.url, &["--count", COUNT_BY_KEY]);
    let r = run(file(&files, 1), &pg);
    assert_eq!(r.verdict, Verdict::Fail);
    let reason = r.reason.unwrap();
    assert!(
        reason.starts_with("one effect per intent") && reason.contains("marked = false"),
        "{reason}"
    );
    let dir = tempfile::tempdir().unwrap();
    let files = init(
        dir.path(),
        &s.base,
        &s.url,
        &["--count", COUNT_BY_KEY, "--unmarked-replays"],
    );
    for n in [1, 4] {
        let r = run(file(&files, n), &pg);
        assert_eq!(r.verdict, Verdict::Pass, "file {n}: {:?}", r.reason);
    }
}

#[test]
fn a_service_s_own_replay_marker_is_shown_in_json_and_text() {
    let (Some(_pg), Some(s)) = (pg_url(), shop("st_marker", Bug::OwnMarker)) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let files = init(dir.path(), &s.base, &s.url, &["--count", COUNT_BY_KEY]);
    let json = scenario_run(dir.path(), file(&files, 1), &["--json"]);
    assert_eq!(json.code, 1, "{}", json.stderr);
    assert!(
        json.stdout.contains("X-Idempotent-Replayed"),
        "{}",
        json.stdout
    );
    let text = scenario_run(dir.path(), file(&files, 1), &[]);
    assert!(
        text.stdout.contains("X-Idempotent-Replayed: true"),
        "{}",
        text.stdout
    );
}

#[test]
fn a_pool_of_one_is_pending_with_exit_3_not_a_fail() {
    let (Some(pg), Some(s)) = (pg_url(), shop("st_pool", Bug::PoolOfOne)) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let files = init(dir.path(), &s.base, &s.url, &["--count", COUNT_BY_KEY]);
    let r = run(file(&files, 1), &pg);
    assert_eq!(r.verdict, Verdict::Pending, "{:?}", r.checks);
    assert!(r.reason.unwrap().contains("requests seen waiting"));
    let out = scenario_run(
        dir.path(),
        file(&files, 1),
        &["--barrier-timeout-ms", "1000"],
    );
    assert_eq!(out.code, 3, "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.starts_with("PENDING"), "{}", out.stdout);
}

#[test]
fn a_count_with_a_typo_and_a_driver_url_are_setup_errors_with_nothing_sent() {
    let Some(s) = shop("st_setup", Bug::None) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let typo = "orders=SELECT count(*) FROM ordrs WHERE idempotency_key = {key}";
    let files = init(dir.path(), &s.base, &s.url, &["--count", typo]);
    let out = scenario_run(dir.path(), file(&files, 2), &[]);
    assert_eq!(out.code, 2, "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("2-two-bodies.toml:") && out.stderr.contains("ordrs"),
        "{}",
        out.stderr
    );
    assert_eq!(s.requests.load(Ordering::SeqCst), 0, "a request was sent");

    let driver = s.url.replacen("postgres://", "postgresql+psycopg://", 1);
    let dir = tempfile::tempdir().unwrap();
    let files = init(dir.path(), &s.base, &driver, &["--count", COUNT_BY_KEY]);
    let out = scenario_run(dir.path(), file(&files, 1), &[]);
    assert_eq!(out.code, 2, "{}\n{}", out.stdout, out.stderr);
    let fixed = s.url.replacen("postgres://", "postgresql://", 1);
    assert!(
        out.stderr.contains(&format!("use {fixed}")) && out.stderr.contains("1-same-body.toml:"),
        "{}",
        out.stderr
    );
    assert_eq!(s.requests.load(Ordering::SeqCst), 0, "a request was sent");
}

#[test]
fn every_starter_file_passes_a_correct_service() {
    let (Some(pg), Some(s)) = (pg_url(), shop("st_correct", Bug::None)) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let files = init(
        dir.path(),
        &s.base,
        &s.url,
        &[
            "--count",
            COUNT_BY_KEY,
            "--count",
            COUNT_BY_SCOPE.replacen("orders=", "mine=", 1).as_str(),
        ],
    );
    for f in &files {
        if f.ends_with("check.toml") {
            // The check file: generated histories, judged by the model, pass too.
            let out = run_cli_in(
                dir.path(),
                &[
                    "check",
                    f.to_str().unwrap(),
                    "--pg-url",
                    &pg,
                    "--histories",
                    "4",
                    "--seed",
                    "3",
                ],
                b"",
            );
            assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
            continue;
        }
        let r = run(f, &pg);
        assert_eq!(r.verdict, Verdict::Pass, "{}: {:?}", f.display(), r.reason);
    }
}

#[test]
fn the_rejected_file_passes_a_422_validation_and_fails_a_write_before_refusing() {
    let (Some(pg), Some(s)) = (pg_url(), shop("st_v422", Bug::Validation422)) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let files = init(dir.path(), &s.base, &s.url, &["--count", COUNT_BY_KEY]);
    let r = run(file(&files, 5), &pg);
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reason);
    let writes = shop("st_writes", Bug::WritesInvalid).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let files = init(
        dir.path(),
        &writes.base,
        &writes.url,
        &["--count", COUNT_BY_KEY],
    );
    let r = run(file(&files, 5), &pg);
    assert_eq!(r.verdict, Verdict::Fail);
    let reason = r.reason.unwrap();
    assert!(reason.starts_with("counts: "), "{reason}");
    assert!(
        reason.contains("orders[key=k2]: expected 0, counted 1"),
        "{reason}"
    );
}
