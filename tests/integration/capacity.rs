//! A racer count the backend cannot hold is refused before anything is created, naming the
//! count, the limit and where it comes from; a normal count under the same limits still runs.
//! SQLite's limit is this process's file descriptors (lowered with `ulimit -n` so the test
//! means the same everywhere); PostgreSQL's is the server's free connection slots.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// A refusal takes no time; a run that tried would take far longer (thousands of connections).
const QUICK: Duration = Duration::from_secs(20);

/// A scenario file of one racer group of `count` racers on `backend`.
fn scenario(dir: &Path, name: &str, backend: &str, count: usize) -> std::path::PathBuf {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!(
            r#"name = "{name}"
description = "many racers"
backends = ["{backend}"]
isolation = ["read-committed"]
[[racers]]
name = "r"
count = {count}
tenant = "A"
key = "k"
request = {{ actor_id = "u1", title = "x", body = "y", priority = "high" }}
[expect]
created = 1
"#
        ),
    )
    .unwrap();
    path
}

/// Runs `ticketflow ARGS` in `dir`, with the soft file-descriptor limit set to `nofile` when
/// given.
fn run_limited(
    dir: &Path,
    nofile: Option<u32>,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Output, Duration) {
    let started = Instant::now();
    let limit = nofile.map_or(String::new(), |n| format!("ulimit -S -n {n} && "));
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("{limit}exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_ticketflow"))
        .args(args)
        .current_dir(dir)
        .env_remove("DATABASE_URL")
        .env("PROPTEST_CASES", "2")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (out, started.elapsed())
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn scenario_run_refuses_more_sqlite_racers_than_file_descriptors_and_still_runs_a_normal_count() {
    let dir = tempfile::tempdir().unwrap();
    // Both under the same descriptor limit.
    let run = |file: &Path| {
        let args = [
            "scenario",
            "run",
            file.to_str().unwrap(),
            "--sqlite-journal",
            "wal",
        ];
        run_limited(dir.path(), Some(1024), &args, &[])
    };
    let (out, took) = run(&scenario(dir.path(), "big", "sqlite", 10_000));
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(2),
        "a usage error\n{stdout}{stderr}"
    );
    assert!(took < QUICK, "refused up front, not after trying: {took:?}");
    assert!(stdout.is_empty(), "nothing ran: {stdout}");
    for part in [
        "big.toml",
        "10000 racers",
        "RLIMIT_NOFILE 1024",
        "ulimit -n",
    ] {
        assert!(stderr.contains(part), "{part:?} missing: {stderr}");
    }
    let (out, _) = run(&scenario(dir.path(), "normal", "sqlite", 4));
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.lines().count() >= 1 && stdout.lines().all(|l| l.starts_with("PASS")),
        "{stdout}"
    );
}

/// The server's `max_connections`.
fn max_connections(url: &str) -> usize {
    let config = ticketflow_core::store::url::parse_postgres(url).unwrap();
    let mut admin = ticketflow_core::store::postgres::connect(&config).unwrap();
    let max: i64 = admin
        .query_one("SELECT current_setting('max_connections')::bigint", &[])
        .unwrap()
        .get(0);
    usize::try_from(max).unwrap()
}

/// The `tf_<tag>_…` databases on the server.
fn tagged(url: &str, tag: &str) -> i64 {
    let config = ticketflow_core::store::url::parse_postgres(url).unwrap();
    let mut admin = ticketflow_core::store::postgres::connect(&config).unwrap();
    admin
        .query_one(
            "SELECT count(*) FROM pg_database WHERE starts_with(datname, $1)",
            &[&format!("tf_{tag}_")],
        )
        .unwrap()
        .get(0)
}

#[test]
fn more_postgres_racers_than_free_connection_slots_are_refused_before_a_database_is_created() {
    let Some(url) = crate::support::pg_url() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // More than fit even on an idle server, few enough for any descriptor limit.
    let count = max_connections(&url) + 1;
    let big = scenario(dir.path(), "big", "postgres", count);
    let tag = format!("cap{}", std::process::id());
    let env = [(ticketflow_harness::scratch::SCRATCH_TAG_VAR, tag.as_str())];
    // `scenario run`: a usage error, nothing run.
    let args = ["scenario", "run", big.to_str().unwrap(), "--pg-url", &url];
    let (out, took) = run_limited(dir.path(), None, &args, &env);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(2),
        "a usage error\n{stdout}{stderr}"
    );
    assert!(took < QUICK, "refused up front, not after trying: {took:?}");
    assert!(stdout.is_empty(), "nothing ran: {stdout}");
    let need = format!("{count} racers need {} PostgreSQL sessions", count + 2);
    for part in ["big.toml", need.as_str(), "max_connections"] {
        assert!(stderr.contains(part), "{part:?} missing: {stderr}");
    }
    // `verify`: the run is PENDING with the reason (exit 3 under --require-postgres).
    std::fs::create_dir(dir.path().join("scenarios")).unwrap();
    std::fs::rename(&big, dir.path().join("scenarios/big.toml")).unwrap();
    let args = [
        "verify",
        "--backend",
        "postgres",
        "--pg-url",
        &url,
        "--filter",
        "big",
        "--no-kill-matrix",
        "--require-postgres",
    ];
    let (out, took) = run_limited(dir.path(), None, &args, &env);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{stdout}{}", text(&out.stderr));
    assert!(took < QUICK, "refused up front, not after trying: {took:?}");
    let line = stdout.lines().next().unwrap_or_default();
    assert!(
        line.starts_with("PENDING") && line.contains("max_connections"),
        "{stdout}"
    );
    assert_eq!(tagged(&url, &tag), 0, "a scratch database was created");
}

#[test]
fn a_black_box_wave_wider_than_the_file_descriptors_is_refused_before_anything_is_set_up() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("wide.toml");
    let toml = std::fs::read_to_string(crate::support::repo_path(
        "scenarios/examples/orders/1-same-body.toml",
    ))
    .unwrap()
    .replace("count = 4", "count = 2000");
    assert!(toml.contains("count = 2000"));
    std::fs::write(&file, toml).unwrap();
    // Never contacted: the refusal comes first.
    let env = [("TARGET_DATABASE_URL", crate::support::UNREACHABLE_PG)];
    let args = ["scenario", "run", file.to_str().unwrap()];
    let (out, took) = run_limited(dir.path(), Some(1024), &args, &env);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(2),
        "nothing raced\n{stdout}{stderr}"
    );
    assert!(took < QUICK, "refused up front: {took:?}");
    for part in ["wide.toml", "2000 racers", "RLIMIT_NOFILE 1024"] {
        assert!(stderr.contains(part), "{part:?} missing: {stderr}");
    }
}
