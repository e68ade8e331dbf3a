//! `verify` with PostgreSQL and Redis each up or down: always a verdict, the report files and
//! the `TOTAL` line, with the documented exit code (PASS 0; a Redis PENDING 0 unless
//! `--require-redis`, then 3; a PostgreSQL PENDING 3 at a given URL, 0 at the built-in
//! default). Each run is narrowed to `n-lease-expiry` (one SQLite and one PostgreSQL run, both
//! with a Redis lease), its report goes into a folder of a tempdir that does not exist yet,
//! and the Redis that answers is db 13 (the runs keep their keys under a prefix of their own).

use std::path::{Path, PathBuf};

use ticketflow_core::store::Backend;
use ticketflow_harness::scenario::lease::LeaseRunOptions;
use ticketflow_harness::verdict::Verdict;

use crate::cli::{run_cli_env, Output};
use crate::support::{repo_path, UNREACHABLE_PG};

/// Where no Redis listens (port 1), at the db the tests would use.
const NO_REDIS: &str = "redis://127.0.0.1:1/14";

/// The scenario every run here is narrowed to.
const FILTER: &str = "n-lease-expiry";

/// The test Redis ([`crate::lease::redis_url`]'s server) at db 13, or `None` (skip).
fn redis_up() -> Option<String> {
    let url = crate::lease::redis_url()?;
    let base = url.rsplit_once('/').map_or(url.as_str(), |(b, _)| b);
    Some(format!("{base}/13"))
}

/// `verify --filter FILTER --lease LEASE --report REPORT extra…` from the repository root,
/// `DATABASE_URL` unset.
fn verify(report: &Path, lease: &str, extra: &[&str]) -> Output {
    let report = report.display().to_string();
    let mut args = vec![
        "verify", "--filter", FILTER, "--lease", lease, "--report", &report,
    ];
    args.extend_from_slice(extra);
    run_cli_env(&repo_path(""), &args, b"", None)
}

/// A report path in a folder of `dir` that does not exist yet.
fn fresh_report(dir: &Path, name: &str) -> PathBuf {
    let report = dir.join(name).join("REPORT.md");
    assert!(!report.parent().unwrap().exists());
    report
}

/// The run gave a verdict: no panic, the report files written, a `TOTAL` line on stdout.
fn assert_reported(out: &Output, report: &Path, code: i32) {
    let all = format!("exit {}\n{}\n{}", out.code, out.stdout, out.stderr);
    assert!(!out.stderr.contains("panicked"), "{all}");
    assert_eq!(out.code, code, "{all}");
    let dir = report.parent().unwrap();
    for file in ["REPORT.md", "report.json", "report.junit.xml"] {
        assert!(dir.join(file).is_file(), "{file} not written: {all}");
    }
    assert!(
        out.stdout.lines().any(|l| l.starts_with("TOTAL ")),
        "no TOTAL line: {all}"
    );
}

/// The library's `verify` over the same narrowed run with PostgreSQL at `pg_url` not required:
/// what the command line does at the built-in default URL, which here answers.
fn verify_not_required(
    report: &Path,
    pg_url: &str,
    lease: &str,
) -> ticketflow::verify::VerifyOutcome {
    let config =
        ticketflow_core::lease::LeaseConfig::new(lease, ticketflow_core::lease::DEFAULT_TTL)
            .unwrap();
    let opts = ticketflow::verify::VerifyOptions {
        scenarios: repo_path("scenarios"),
        pg: crate::support::server(pg_url),
        selection: ticketflow::verify::Selection {
            backends: ticketflow::verify::BackendChoice::Both.backends(),
            isolation: Vec::new(),
            sqlite: ticketflow_harness::scenario::RunSetting::sqlite_matrix(),
        },
        report: report.to_path_buf(),
        require_postgres: false,
        retry: ticketflow_core::RetryPolicy::default(),
        seed: None,
        kill_matrix: true,
        restart_postgres: false,
        protocol: ticketflow_core::Protocol::default(),
        filters: vec![FILTER.to_string()],
        repeat: 1,
        progress: false,
        lease: LeaseRunOptions {
            config: Some(config),
            ..LeaseRunOptions::default()
        },
        require_redis: false,
        jobs: 2,
        force: false,
    };
    std::fs::create_dir_all(report.parent().unwrap()).unwrap();
    ticketflow::verify::verify(&opts).unwrap()
}

/// The verdicts of the run's PostgreSQL and SQLite runs, in that order.
fn verdicts(outcome: &ticketflow::verify::VerifyOutcome) -> (Vec<Verdict>, Vec<Verdict>) {
    let on = |b: Backend| {
        outcome
            .runs
            .iter()
            .filter(|r| r.backend == b)
            .map(|r| r.verdict)
            .collect()
    };
    (on(Backend::Postgres), on(Backend::Sqlite))
}

#[test]
fn postgres_and_redis_up_pass_with_exit_0() {
    let (Some(pg), Some(redis)) = (crate::support::pg_url(), redis_up()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let report = fresh_report(dir.path(), "up-up");
    let out = verify(&report, &redis, &["--pg-url", &pg, "--require-redis"]);
    assert_reported(&out, &report, 0);
    assert!(!out.stdout.contains("Redis not usable"), "{}", out.stdout);
}

#[test]
fn postgres_up_and_redis_down_is_pending_said_so_exit_0_and_3_under_require_redis() {
    let Some(pg) = crate::support::pg_url() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let report = fresh_report(dir.path(), "up-down");
    let out = verify(&report, NO_REDIS, &["--pg-url", &pg]);
    assert_reported(&out, &report, 0);
    assert!(
        out.stdout.contains("PENDING") && out.stdout.contains("Redis not usable"),
        "{}",
        out.stdout
    );
    let report = fresh_report(dir.path(), "up-down-required");
    let out = verify(&report, NO_REDIS, &["--pg-url", &pg, "--require-redis"]);
    assert_reported(&out, &report, 3);
}

#[test]
fn postgres_down_and_redis_up_is_exit_3_at_a_given_url_and_0_at_the_default() {
    let Some(redis) = redis_up() else { return };
    let dir = tempfile::tempdir().unwrap();
    let report = fresh_report(dir.path(), "down-up");
    let out = verify(&report, &redis, &["--pg-url", UNREACHABLE_PG]);
    assert_reported(&out, &report, 3);
    assert!(out.stdout.contains("PENDING"), "{}", out.stdout);
    let outcome = verify_not_required(
        &fresh_report(dir.path(), "down-up-default"),
        UNREACHABLE_PG,
        &redis,
    );
    assert_eq!(outcome.exit_code, 0);
    assert_eq!(
        verdicts(&outcome),
        (vec![Verdict::Pending], vec![Verdict::Pass])
    );
    assert!(dir.path().join("down-up-default/report.json").is_file());
}

#[test]
fn postgres_and_redis_down_is_exit_3_at_a_given_url_and_0_at_the_default() {
    let dir = tempfile::tempdir().unwrap();
    let report = fresh_report(dir.path(), "down-down");
    let out = verify(&report, NO_REDIS, &["--pg-url", UNREACHABLE_PG]);
    assert_reported(&out, &report, 3);
    assert!(out.stdout.contains("Redis not usable"), "{}", out.stdout);
    let outcome = verify_not_required(
        &fresh_report(dir.path(), "down-down-default"),
        UNREACHABLE_PG,
        NO_REDIS,
    );
    assert_eq!(outcome.exit_code, 0);
    assert_eq!(
        verdicts(&outcome),
        (vec![Verdict::Pending], vec![Verdict::Pending])
    );
    assert!(dir.path().join("down-down-default/report.json").is_file());
}

#[test]
fn a_report_folder_that_does_not_exist_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("not").join("yet").join("X.md");
    let out = run_cli_env(
        &repo_path(""),
        &[
            "verify",
            "--backend",
            "sqlite",
            "--filter",
            "a-same-key-same-body",
            "--report",
            &report.display().to_string(),
        ],
        b"",
        None,
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert!(report.is_file(), "{}\n{}", out.stdout, out.stderr);
    assert!(report.with_file_name("report.json").is_file());
}
