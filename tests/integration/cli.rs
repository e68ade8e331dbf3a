use std::io::Write;
use std::process::{Command, Stdio};

use crate::support::repo_path;

pub struct Output {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs the `ticketflow` binary with `args`, feeding `stdin`, in a fresh temp directory.
pub fn run_cli(args: &[&str], stdin: &str) -> Output {
    run_cli_in(&tempfile::tempdir().unwrap().keep(), args, stdin.as_bytes())
}

pub fn run_cli_in(dir: &std::path::Path, args: &[&str], stdin: &[u8]) -> Output {
    run_cli_env(dir, args, stdin, None)
}

/// As [`run_cli_in`], with `DATABASE_URL` set to `database_url` (`None`: unset).
pub fn run_cli_env(
    dir: &std::path::Path,
    args: &[&str],
    stdin: &[u8],
    database_url: Option<&str>,
) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ticketflow"));
    match database_url {
        Some(url) => command.env("DATABASE_URL", url),
        None => command.env_remove("DATABASE_URL"),
    };
    let mut child = command
        .args(args)
        .current_dir(dir)
        // verify also runs the property suites; a few cases keep these CLI tests quick.
        .env("PROPTEST_CASES", "4")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    Output {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

const B0: &str = r#"{"actor_id":"u1","title":"x","body":"y","priority":"high"}"#;

#[test]
fn create_replay_conflict_get_update_on_the_default_sqlite_file() {
    let dir = tempfile::tempdir().unwrap();
    let created = run_cli_in(
        dir.path(),
        &["create", "--tenant", "A", "--key", "key-1"],
        B0.as_bytes(),
    );
    assert_eq!(created.code, 0, "{}", created.stderr);
    assert!(
        dir.path().join("ticketflow.db").exists(),
        "default database file"
    );
    let c: serde_json::Value = serde_json::from_str(&created.stdout).unwrap();
    assert_eq!(c["outcome"], "created");
    assert_eq!(c["http_status"], 201);
    let id = c["ticket"]["id"].as_str().unwrap().to_string();

    // Same request with keys reordered and pretty-printed: a replay.
    let pretty = "{\n \"priority\": \"high\",\n \"body\": \"y\",\n \"title\": \"x\",\n \"actor_id\": \"u1\"\n}";
    let replay = run_cli_in(
        dir.path(),
        &["create", "--tenant", "A", "--key", "key-1"],
        pretty.as_bytes(),
    );
    let r: serde_json::Value = serde_json::from_str(&replay.stdout).unwrap();
    assert_eq!(
        (replay.code, r["outcome"].as_str(), r["replayed"].as_bool()),
        (0, Some("replayed"), Some(true))
    );
    assert_eq!(r["ticket"]["id"], id.as_str());

    let conflict = run_cli_in(
        dir.path(),
        &["create", "--tenant", "A", "--key", "key-1"],
        B0.replace("\"y\"", "\"z\"").as_bytes(),
    );
    assert_eq!(conflict.code, 4);
    let x: serde_json::Value = serde_json::from_str(&conflict.stdout).unwrap();
    assert_eq!(x["http_status"], 409);
    // The conflict names both fingerprints, so `ticketflow fingerprint` can show what differed.
    let fp = run_cli_in(dir.path(), &["fingerprint"], B0.as_bytes());
    let fp: serde_json::Value = serde_json::from_str(&fp.stdout).unwrap();
    assert_eq!(x["conflict"]["stored_hash"], fp["sha256"]);
    assert_ne!(x["conflict"]["request_hash"], fp["sha256"]);

    let got = run_cli_in(dir.path(), &["get", "--tenant", "A", "--id", &id], b"");
    assert_eq!(got.code, 0, "{}", got.stderr);
    let other_tenant = run_cli_in(dir.path(), &["get", "--tenant", "B", "--id", &id], b"");
    assert_eq!(other_tenant.code, 5);

    let upd = run_cli_in(
        dir.path(),
        &["update", "--tenant", "A", "--id", &id, "--priority", "low"],
        b"",
    );
    assert_eq!(upd.code, 0, "{}", upd.stderr);
    let u: serde_json::Value = serde_json::from_str(&upd.stdout).unwrap();
    assert_eq!(
        (u["version"].as_i64(), u["priority"].as_str()),
        (Some(2), Some("low"))
    );
}

#[test]
fn bad_input_exits_2_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let twice = br#"{"actor_id":"u1","title":"x","title":"z","body":"y","priority":"high"}"#;
    let cases: [(&[&str], &[u8]); 8] = [
        (&["create", "--tenant", "A", "--key", "k"], twice),
        (&["fingerprint"], twice),
        (&["create", "--tenant", "A", "--key", "k"], br#"["u1","x","y","high"]"#),
        (&["create", "--tenant", "A", "--key", "k"], b"\xff\xfe not utf-8"),
        (&["create", "--tenant", "A", "--key", "k"], b"{\"actor_id\":\"u1\"}"),
        (&["create", "--tenant", "A", "--key", "k"], b"{\"actor_id\":\"u1\",\"title\":\"x\",\"body\":\"y\",\"priority\":\"high\",\"extra\":1}"),
        (&["create", "--tenant", "A", "--key", "k"], br#"{"actor_id":"u1","title":"x","body":"y","priority":"bogus"}"#),
        (&["create", "--tenant", "A", "--key", ""], B0.as_bytes()),
    ];
    for (args, input) in cases {
        let out = run_cli_in(dir.path(), args, input);
        assert_eq!(out.code, 2, "{args:?}: {}", out.stderr);
        assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
    }
    let ok = run_cli_in(
        dir.path(),
        &["create", "--tenant", "A", "--key", "k"],
        B0.as_bytes(),
    );
    let c: serde_json::Value = serde_json::from_str(&ok.stdout).unwrap();
    assert_eq!(
        c["outcome"], "created",
        "the rejected requests left nothing behind"
    );
}

/// `soak --faults none,kill-service` was taken as `kill-service`: `none` now stands alone
/// (exit 2 before anything starts), while `none` by itself still means no faults.
#[test]
fn soak_refuses_none_listed_with_fault_kinds() {
    for faults in ["none,kill-service", "kill-service,none"] {
        let out = run_cli(&["soak", "--duration", "1s", "--faults", faults], "");
        assert_eq!(out.code, 2, "{faults}: {}{}", out.stdout, out.stderr);
        assert!(out.stderr.contains("`none` stands alone"), "{}", out.stderr);
    }
}

/// `--update-report` writes this repository's evidence, made from the shipped scenarios/: a
/// run over another directory is refused before anything runs (it replaced the tracked
/// REPORT.md with a one-scenario report and deleted the other scenarios' detail files).
#[test]
fn update_report_refuses_another_scenario_directory() {
    // Scenario a in another directory than the working directory's scenarios/.
    let own = scenario_a_dir();
    let mine = own.path().join("scenarios");
    let dir = tempfile::tempdir().unwrap();
    let out = run_cli_in(
        dir.path(),
        &[
            "verify",
            "--update-report",
            "--scenarios",
            &mine.to_string_lossy(),
        ],
        b"",
    );
    assert_eq!(out.code, 2, "{}{}", out.stdout, out.stderr);
    assert!(out.stderr.contains("drop --scenarios"), "{}", out.stderr);
    assert!(!dir.path().join("REPORT.md").exists());
}

#[test]
fn verify_rejects_a_bad_scenario_file_with_exit_2_naming_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let scen = dir.path().join("scenarios");
    std::fs::create_dir(&scen).unwrap();
    std::fs::copy(
        repo_path("scenarios/a-same-key-same-body.toml"),
        scen.join("a.toml"),
    )
    .unwrap();
    std::fs::write(
        scen.join("b.toml"),
        "name = \"b\"\ndescription = \"d\"\nsurprise = 1\n",
    )
    .unwrap();
    let out = run_cli_in(dir.path(), &["verify", "--backend", "sqlite"], b"");
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("b.toml:3"), "{}", out.stderr);
    for report in [
        "REPORT.md",
        "ticketflow-report/REPORT.md",
        "ticketflow-report/partial/REPORT.md",
    ] {
        assert!(!dir.path().join(report).exists(), "nothing ran, no report");
    }
}

/// A PostgreSQL URL that was given is required: its runs PENDING make the exit 3 even without
/// `--require-postgres` (only the built-in default may degrade to PENDING, exit 0: see
/// `run_files_names_what_is_wrong_and_runs_the_rest`), and the report is still written.
#[test]
fn verify_writes_a_report_and_pending_postgres_at_a_given_url_exits_3() {
    let dir = tempfile::tempdir().unwrap();
    let scen = dir.path().join("scenarios");
    std::fs::create_dir(&scen).unwrap();
    std::fs::copy(
        repo_path("scenarios/a-same-key-same-body.toml"),
        scen.join("a.toml"),
    )
    .unwrap();
    let nowhere = crate::support::UNREACHABLE_PG;
    let out = run_cli_in(dir.path(), &["verify", "--pg-url", nowhere], b"");
    assert_eq!(out.code, 3, "{}{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("PostgreSQL is required") && out.stderr.contains("--pg-url"),
        "{}",
        out.stderr
    );
    let report = std::fs::read_to_string(dir.path().join("ticketflow-report/REPORT.md")).unwrap();
    assert!(report.contains("## PENDING: did not run"), "{report}");
    // PostgreSQL cells PENDING at every isolation level, never PASS; SQLite cells ran.
    assert!(
        report.contains("| **PENDING** | **PENDING** | **PENDING** |"),
        "{report}"
    );
    assert!(report.contains(&"| **PASS** ".repeat(6)), "{report}");
    let required = run_cli_in(
        dir.path(),
        &["verify", "--pg-url", nowhere, "--require-postgres"],
        b"",
    );
    assert_eq!(required.code, 3, "{}", required.stdout);
}

#[test]
fn the_report_never_shows_a_password() {
    let dir = tempfile::tempdir().unwrap();
    let scen = dir.path().join("scenarios");
    std::fs::create_dir(&scen).unwrap();
    std::fs::copy(
        repo_path("scenarios/a-same-key-same-body.toml"),
        scen.join("a.toml"),
    )
    .unwrap();
    let url = "postgres://postgres:s3cret-pw@127.0.0.1:1/postgres?connect_timeout=2";
    let out = run_cli_in(
        dir.path(),
        &["verify", "--backend", "postgres", "--pg-url", url],
        b"",
    );
    assert_eq!(out.code, 3, "{}", out.stderr);
    // `--backend postgres` narrows the run: its report is partial.
    let out_dir = dir.path().join("ticketflow-report/partial");
    let report = std::fs::read_to_string(out_dir.join("REPORT.md")).unwrap();
    assert!(!report.contains("s3cret-pw"), "{report}");
    assert!(report.contains("postgres:***@127.0.0.1:1"), "{report}");
    for machine in ["report.json", "report.junit.xml"] {
        let text = std::fs::read_to_string(out_dir.join(machine)).unwrap();
        assert!(!text.contains("s3cret-pw"), "{machine}: {text}");
        assert!(text.contains("postgres:***@127.0.0.1:1"), "{machine}");
    }
    assert!(!out.stdout.contains("s3cret-pw") && !out.stderr.contains("s3cret-pw"));
}

#[test]
fn debug_logs_of_a_postgres_create_never_contain_the_body() {
    let Some(db) = crate::support::TestDb::postgres("log_body") else {
        return;
    };
    let url = db.url().unwrap();
    let body = "BODY-MARKER-7f3a secret text";
    let request = format!(r#"{{"actor_id":"u1","title":"x","body":"{body}","priority":"high"}}"#);
    for filter in ["trace", "debug", "ticketflow=trace,tokio_postgres=trace"] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ticketflow"))
            .args([
                "create",
                "--database-url",
                &url,
                "--tenant",
                "A",
                "--key",
                filter,
            ])
            .env("TICKETFLOW_LOG", filter)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(request.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert!(!stderr.is_empty(), "{filter}: expected some log output");
        assert!(
            !stderr.contains("BODY-MARKER"),
            "{filter}: body in logs:\n{stderr}"
        );
    }
}

#[test]
fn an_interrupted_verify_drops_its_scratch_database() {
    let Some(url) = crate::support::pg_url() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let scen = dir.path().join("scenarios");
    std::fs::create_dir(&scen).unwrap();
    // 32 worker processes keep the run busy long enough to interrupt it mid-way.
    std::fs::write(
        scen.join("probe.toml"),
        r#"name = "sigterm-probe"
description = "a long run to interrupt"
backends = ["postgres"]
isolation = ["read-committed"]
racers_as = "processes"
[[racers]]
name = "r"
count = 32
tenant = "A"
key = "k"
request = { actor_id = "u1", title = "x", body = "y", priority = "high" }
[expect]
created = 1
"#,
    )
    .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_ticketflow"))
        .args(["verify", "--backend", "postgres", "--pg-url", &url])
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let config = ticketflow_core::store::url::parse_postgres(&url).unwrap();
    let mut admin = ticketflow_core::store::postgres::connect(&config).unwrap();
    let probe = "SELECT datname FROM pg_database WHERE datname LIKE 'tf_sigterm_probe_%'";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let name: String = loop {
        if let Some(row) = admin.query_opt(probe, &[]).unwrap() {
            break row.get(0);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "scratch database never appeared"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    };
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(143), "SIGTERM: 128 + 15\n{stderr}");
    assert!(
        stderr.contains("ticketflow: interrupted; dropped scratch databases")
            && stderr.contains(&name),
        "the handler names what it dropped: {stderr}"
    );
    let left: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_database WHERE datname = $1",
            &[&name],
        )
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "{name} was left behind");
}

#[test]
fn a_full_verify_run_at_trace_level_never_logs_a_body() {
    let dir = tempfile::tempdir().unwrap();
    let scen = dir.path().join("scenarios");
    std::fs::create_dir(&scen).unwrap();
    let text = std::fs::read_to_string(repo_path("scenarios/c-same-key-different-bodies.toml"))
        .unwrap()
        .replace("body X", "BODY-MARKER-x1 secret")
        .replace("body Y", "BODY-MARKER-y2 secret");
    std::fs::write(scen.join("c.toml"), text).unwrap();
    // Every part but the soak, whose child services log to their own stderr and whose
    // verdict is not what this test is about.
    let mut args = vec![
        "verify",
        "--no-kill-matrix",
        "--isolation",
        "read-committed",
        "--filter",
        "c-same",
        "--filter",
        "property:",
        "--filter",
        "faults",
    ];
    let url = crate::support::pg_url();
    if let Some(u) = &url {
        args.extend(["--pg-url", u.as_str()]);
    } else {
        args.extend(["--backend", "sqlite"]);
    }
    let out = Command::new(env!("CARGO_BIN_EXE_ticketflow"))
        .args(&args)
        .current_dir(dir.path())
        .env("TICKETFLOW_LOG", "trace")
        .env("PROPTEST_CASES", "2")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.lines().count() > 20,
        "expected a trace log, got:\n{stderr}"
    );
    assert!(!stderr.contains("BODY-MARKER"), "a body reached the logs");
    // The run really happened: the (partial) report names the scenario.
    let report =
        std::fs::read_to_string(dir.path().join("ticketflow-report/partial/REPORT.md")).unwrap();
    assert!(report.contains("c-same-key-different-bodies"));
}

/// `scenario run`'s library half (`verify::run_files`): what the CLI turns into exit 2 comes
/// back as a typed error, and the runs of a library scenario with their exit code.
#[test]
fn run_files_names_what_is_wrong_and_runs_the_rest() {
    use ticketflow::verify::{run_files, RunFilesError, RunFilesOptions, Selection};
    use ticketflow_core::store::postgres::IsolationLevel;
    use ticketflow_core::store::sqlite::{JournalMode, TxMode};
    use ticketflow_core::store::Backend;
    use ticketflow_harness::scenario::RunSetting;
    let opts = |files: &[&str]| RunFilesOptions {
        lease: Default::default(),
        require_redis: false,
        require_postgres: false,
        on_wait: None,
        explore: None,
        schedule: None,
        keep_going: false,
        parallel: 1,
        service_logs: None,
        files: files.iter().map(|f| repo_path(f)).collect(),
        // Never contacted: the selection holds SQLite cells only.
        pg: crate::support::server("postgres://postgres@127.0.0.1:1/postgres"),
        selection: Selection {
            backends: vec![Backend::Sqlite],
            isolation: Vec::new(),
            sqlite: vec![RunSetting::Sqlite {
                journal: JournalMode::Wal,
                tx: TxMode::Lazy,
            }],
        },
        retry: ticketflow_core::RetryPolicy::default(),
        implementation: ticketflow_core::variants::Implementation::default(),
        export_isolation_spec: None,
        repeat: 1,
        barrier_timeout: None,
        force: false,
    };
    let missing = run_files(&opts(&["scenarios/no-such-file.toml"])).unwrap_err();
    assert!(
        matches!(
            missing,
            RunFilesError::Load(ticketflow_harness::load::LoadError::File { .. })
        ),
        "{missing}"
    );
    let mut with_isolation = opts(&["scenarios/l-http-two-serves-different-bodies.toml"]);
    with_isolation.selection.isolation = vec![IsolationLevel::Serializable];
    let refused = run_files(&with_isolation).unwrap_err();
    assert!(
        matches!(
            refused,
            RunFilesError::Refused(ticketflow::verify::Refusal::IsolationForTargets)
        ),
        "{refused}"
    );
    let ran = run_files(&opts(&["scenarios/a-same-key-same-body.toml"])).unwrap();
    assert_eq!(ran.runs.len(), 1);
    assert!(ran.targets.is_empty() && ran.specs.is_empty());
    assert_eq!(ran.exit_code, 0, "{:?}", ran.runs[0].reason);

    // PostgreSQL unreachable: PENDING, exit 0 (what the built-in default URL may do) unless
    // PostgreSQL is required (what a given URL is): exit 3.
    let mut on_pg = opts(&["scenarios/a-same-key-same-body.toml"]);
    on_pg.pg = crate::support::server(crate::support::UNREACHABLE_PG);
    on_pg.selection = Selection {
        backends: vec![Backend::Postgres],
        isolation: vec![IsolationLevel::ReadCommitted],
        sqlite: Vec::new(),
    };
    let pending = run_files(&on_pg).unwrap();
    assert_eq!(pending.runs.len(), 1);
    assert_eq!(
        (pending.runs[0].verdict, pending.exit_code),
        (ticketflow_harness::verdict::Verdict::Pending, 0)
    );
    on_pg.require_postgres = true;
    assert_eq!(run_files(&on_pg).unwrap().exit_code, 3);
}

/// A scenario directory holding scenario a only, for the URL tests.
fn scenario_a_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let scen = dir.path().join("scenarios");
    std::fs::create_dir(&scen).unwrap();
    std::fs::copy(
        repo_path("scenarios/a-same-key-same-body.toml"),
        scen.join("a.toml"),
    )
    .unwrap();
    dir
}

/// Explicit means required: a PostgreSQL URL given by option or `DATABASE_URL`
/// that cannot be parsed is a usage error naming where it was given, for every command that
/// takes one; nothing runs and no report is written.
#[test]
fn a_given_url_that_cannot_be_parsed_is_exit_2_naming_the_option_or_variable() {
    let dir = scenario_a_dir();
    let a = "scenarios/a.toml";
    let pg = ["--backend", "postgres", "--isolation", "read-committed"];
    let http = "http://127.0.0.1:5432";
    let bad_port = "postgres://postgres@127.0.0.1:notaport/postgres";
    let run = |args: &[&str], env: Option<&str>| run_cli_env(dir.path(), args, b"", env);
    let cases: Vec<(Vec<&str>, Option<&str>, &str, &str)> = vec![
        (
            [&["scenario", "run", a][..], &pg, &["--pg-url", http]].concat(),
            None,
            "--pg-url",
            "is not a PostgreSQL URL",
        ),
        (
            [&["scenario", "run", a][..], &pg].concat(),
            Some(http),
            "DATABASE_URL",
            "is not a database URL",
        ),
        (
            [&["scenario", "run", a][..], &pg].concat(),
            Some(bad_port),
            "DATABASE_URL",
            "cannot parse PostgreSQL URL",
        ),
        (
            vec!["verify", "--backend", "sqlite", "--pg-url", http],
            None,
            "--pg-url",
            "is not a PostgreSQL URL",
        ),
        (
            vec!["verify", "--backend", "postgres", "--pg-url", bad_port],
            None,
            "--pg-url",
            "cannot parse PostgreSQL URL",
        ),
        (
            vec!["verify", "--backend", "postgres"],
            Some(""),
            "DATABASE_URL",
            "is set but empty",
        ),
        (
            vec!["bench", "--quick", "--backend", "sqlite", "--pg-url", http],
            None,
            "--pg-url",
            "is not a PostgreSQL URL",
        ),
        (
            vec!["soak", "--pg-url", "ticketflow.db"],
            None,
            "--pg-url",
            "is not a PostgreSQL URL",
        ),
        (
            vec!["worker", "--pg-url", http, "--dbname", "d"],
            None,
            "--pg-url",
            "is not a PostgreSQL URL",
        ),
        (
            vec![
                "create",
                "--tenant",
                "A",
                "--key",
                "k",
                "--database-url",
                http,
            ],
            None,
            "--database-url",
            "is not a database URL",
        ),
        (
            vec![
                "get",
                "--tenant",
                "A",
                "--id",
                "00000000-0000-0000-0000-000000000000",
            ],
            Some(bad_port),
            "DATABASE_URL",
            "cannot parse PostgreSQL URL",
        ),
        (
            vec![
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--database-url",
                bad_port,
            ],
            None,
            "--database-url",
            "cannot parse PostgreSQL URL",
        ),
    ];
    for (args, env, names, problem) in cases {
        let out = run(&args, env);
        assert_eq!(
            out.code, 2,
            "{args:?} DATABASE_URL={env:?}: {}{}",
            out.stdout, out.stderr
        );
        assert!(
            out.stderr.contains(&format!("ticketflow: {names}")) && out.stderr.contains(problem),
            "{args:?} DATABASE_URL={env:?}: {}",
            out.stderr
        );
        assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
    }
    assert!(!dir.path().join("REPORT.md").exists(), "nothing ran");
    assert!(!dir.path().join("ticketflow.db").exists(), "nothing opened");
}

/// Explicit means required: a given PostgreSQL URL where nothing answers makes
/// `scenario run` exit 3 as it does `verify`, whether given by `--pg-url` or by
/// `DATABASE_URL`; `verify` has no `--database-url` to ignore (it once took one and ran
/// against the default server); `bench` stops (exit 1) instead of skipping PostgreSQL.
#[test]
fn a_given_url_that_does_not_answer_is_exit_3_for_scenario_run_and_verify() {
    let dir = scenario_a_dir();
    let nowhere = crate::support::UNREACHABLE_PG;
    let run = |args: &[&str], env: Option<&str>| run_cli_env(dir.path(), args, b"", env);
    let pg = [
        "scenarios/a.toml",
        "--backend",
        "postgres",
        "--isolation",
        "read-committed",
    ];
    let by_flag = run(
        &[&["scenario", "run"][..], &pg, &["--pg-url", nowhere]].concat(),
        None,
    );
    assert_eq!(by_flag.code, 3, "{}{}", by_flag.stdout, by_flag.stderr);
    assert!(by_flag.stdout.contains("PENDING"), "{}", by_flag.stdout);
    assert!(by_flag.stderr.contains("--pg-url"), "{}", by_flag.stderr);
    let by_env = run(&[&["scenario", "run"][..], &pg].concat(), Some(nowhere));
    assert_eq!(by_env.code, 3, "{}{}", by_env.stdout, by_env.stderr);
    assert!(by_env.stderr.contains("DATABASE_URL"), "{}", by_env.stderr);
    let verify = ["verify", "--backend", "postgres", "--filter", "a-same"];
    let by_env = run(&verify, Some(nowhere));
    assert_eq!(by_env.code, 3, "{}{}", by_env.stdout, by_env.stderr);
    let database_url = run(&[&verify[..], &["--database-url", nowhere]].concat(), None);
    assert_eq!(
        database_url.code, 2,
        "{}{}",
        database_url.stdout, database_url.stderr
    );
    assert!(
        database_url.stderr.contains("--database-url"),
        "{}",
        database_url.stderr
    );
    // bench measures nothing rather than skip a given server (it skips only the default).
    let bench = run(
        &[
            "bench",
            "--quick",
            "--backend",
            "both",
            "--workloads",
            "create",
            "--clients",
            "1",
            "--pg-url",
            nowhere,
        ],
        None,
    );
    assert_eq!(bench.code, 1, "{}{}", bench.stdout, bench.stderr);
    assert!(
        bench.stderr.contains("PostgreSQL unreachable") && bench.stderr.contains("--pg-url"),
        "{}",
        bench.stderr
    );
    assert!(bench.stdout.is_empty(), "measured: {}", bench.stdout);
}

/// Each subcommand's help shows the options it uses: `--database-url` on the commands that
/// open the ticket database only (it was a global option, shown on every command).
#[test]
fn database_url_is_an_option_of_the_commands_that_open_the_ticket_database_only() {
    let commands: [(&[&str], bool); 12] = [
        (&["create"], true),
        (&["get"], true),
        (&["update"], true),
        (&["prune"], true),
        (&["serve"], true),
        (&["fingerprint"], false),
        (&["verify"], false),
        (&["scenario", "run"], false),
        (&["target", "init"], false),
        (&["bench"], false),
        (&["soak"], false),
        (&["worker"], false),
    ];
    for (command, takes_it) in commands {
        let out = run_cli(&[command, &["--help"]].concat(), "");
        assert_eq!(out.code, 0, "{command:?}: {}", out.stderr);
        assert_eq!(
            out.stdout.contains("--database-url <URL>"),
            takes_it,
            "{command:?} --help:\n{}",
            out.stdout
        );
        if takes_it {
            assert!(out.stdout.contains("DATABASE_URL"), "{}", out.stdout);
        }
    }
    let top = run_cli(&["--help"], "");
    assert!(!top.stdout.contains("--database-url <"), "{}", top.stdout);
}

/// Run from another directory, `verify` names where it looked for `scenarios/` and what to do;
/// `scenario run DIR` runs the scenario files in DIR, and a missing relative file names the
/// working directory.
#[test]
fn scenario_paths_are_explained_and_a_directory_runs_its_files() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_cli_in(dir.path(), &["verify", "--backend", "sqlite"], b"");
    assert_eq!(out.code, 2, "{}", out.stderr);
    let cwd = dir.path().canonicalize().unwrap();
    assert!(
        out.stderr.contains("working directory")
            && out.stderr.contains("--scenarios DIR")
            && (out.stderr.contains(&cwd.display().to_string())
                || out.stderr.contains(&dir.path().display().to_string())),
        "{}",
        out.stderr
    );
    let missing = run_cli_in(dir.path(), &["scenario", "run", "nope.toml"], b"");
    assert_eq!(missing.code, 2, "{}", missing.stderr);
    assert!(
        missing.stderr.contains("working directory"),
        "{}",
        missing.stderr
    );

    let scenarios = dir.path().join("mine");
    std::fs::create_dir(&scenarios).unwrap();
    std::fs::copy(
        crate::support::repo_path("scenarios/a-same-key-same-body.toml"),
        scenarios.join("a.toml"),
    )
    .unwrap();
    let ran = run_cli_in(
        dir.path(),
        &[
            "scenario",
            "run",
            "mine",
            "--backend",
            "sqlite",
            "--sqlite-tx",
            "lazy",
            "--sqlite-journal",
            "wal",
        ],
        b"",
    );
    assert_eq!(ran.code, 0, "{}\n{}", ran.stdout, ran.stderr);
    assert!(
        ran.stdout.contains("a-same-key-same-body"),
        "{}",
        ran.stdout
    );
}

/// Help texts that list the wrong implementations or the protocols name every one of them
/// (they once listed five of six).
#[test]
fn help_lists_every_variant_and_protocol_it_accepts() {
    use ticketflow_core::variants::Variant;
    for (command, served) in [("create", false), ("serve", true)] {
        let out = run_cli(&[command, "--help"], "");
        let help = out.stdout.replace('\n', " ");
        let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
        for v in Variant::every().chain(served.then_some(Variant::TenantBlind)) {
            assert!(
                help.contains(v.name()),
                "{command} --help lacks {}",
                v.name()
            );
        }
        for p in ticketflow_core::Protocol::ALL {
            assert!(
                help.contains(p.name()),
                "{command} --help lacks {}",
                p.name()
            );
        }
    }
}

/// `verify`'s last line gives the same totals as REPORT.md's headline, the report's path and
/// the time; a filtered run counts what `--filter` left out as PENDING in both (it once said
/// "0 PENDING" above a list of parts that did not run).
#[test]
fn verify_ends_with_the_reports_totals_and_a_partial_run_counts_what_it_left_out() {
    let dir = tempfile::tempdir().unwrap();
    let scen = dir.path().join("scenarios");
    std::fs::create_dir(&scen).unwrap();
    for name in [
        "a-same-key-same-body.toml",
        "b-committed-receipt-different-body.toml",
    ] {
        std::fs::copy(repo_path(&format!("scenarios/{name}")), scen.join(name)).unwrap();
    }
    let out = Command::new(env!("CARGO_BIN_EXE_ticketflow"))
        .args([
            "verify",
            "--backend",
            "sqlite",
            "--sqlite-journal",
            "wal",
            "--sqlite-tx",
            "lazy",
        ])
        .args(["--no-kill-matrix", "--filter", "a-same-key"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let last = stdout.lines().last().unwrap_or_default();
    let totals = last
        .strip_prefix("TOTAL    ")
        .and_then(|t| t.split(" — ").next())
        .unwrap_or_else(|| panic!("no totals line at the end:\n{stdout}"));
    assert!(last.contains("REPORT.md") && last.ends_with(" s"), "{last}");
    let report =
        std::fs::read_to_string(dir.path().join("ticketflow-report/partial/REPORT.md")).unwrap();
    assert!(
        report.contains(&format!("**{totals}**")),
        "{totals} not in the report headline"
    );
    assert!(totals.contains("not selected by --filter"), "{totals}");
    assert!(!totals.contains(" 0 PENDING"), "{totals}");
    // The parts left out are counted on a line of their own, as the TOTAL counts them.
    let [pass, fail, pending] = line_counts(&stdout);
    assert!(
        totals.starts_with(&format!("{pass} PASS, {fail} FAIL, {pending} PENDING")),
        "{totals}\n{stdout}"
    );
}

/// `scenario run` on a directory without scenario files says so (exit 2) instead of
/// running nothing and exiting 0.
#[test]
fn scenario_run_on_an_empty_directory_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let out = run_cli(&["scenario", "run", &d], "");
    assert_eq!(out.code, 2, "{}{}", out.stdout, out.stderr);
    assert!(out.stderr.contains("no scenario files"), "{}", out.stderr);
}

/// A working directory for a cheap full `verify`: scenario a only, and the loom report with
/// the sources it was made from, so the models are read as in the repository.
fn full_run_dir() -> tempfile::TempDir {
    let dir = scenario_a_dir();
    let files = ticketflow_harness::killmatrix::LOOM_SOURCES
        .into_iter()
        .chain(["reports/loom.json"]);
    for f in files {
        let to = dir.path().join(f);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(repo_path(f), to).unwrap();
    }
    dir
}

/// PASS / FAIL / PENDING as the lines of `verify`'s output carry them: a line beginning with
/// a verdict is one verdict of that kind, unless it ends with `[N verdicts: a PASS, …]`.
fn line_counts(stdout: &str) -> [usize; 3] {
    let tally = regex::Regex::new(r"\[(\d+) verdicts?(?:: ([^\]]*))?\]$").unwrap();
    let kinds = ["PASS", "FAIL", "PENDING"];
    let mut sum = [0; 3];
    for line in stdout.lines() {
        let Some(k) = kinds.iter().position(|k| line.split(' ').next() == Some(k)) else {
            continue;
        };
        match tally.captures(line) {
            None => sum[k] += 1,
            Some(c) => {
                let mut carried = 0;
                for part in c.get(2).map_or("", |m| m.as_str()).split(", ") {
                    if let Some((n, kind)) = part.split_once(' ') {
                        let n: usize = n.parse().unwrap();
                        sum[kinds.iter().position(|x| *x == kind).unwrap()] += n;
                        carried += n;
                    }
                }
                assert_eq!(carried.to_string(), &c[1], "{line}");
            }
        }
    }
    sum
}

/// `verify`'s verdict lines add up to its TOTAL line: the loom models (read, not run), the
/// restart fault case left out without `--restart-postgres`, and the kill matrix's and the
/// fault cases' many verdicts each show their count (once they printed no line, or one line
/// for 33 verdicts). The COUNTS line's parts add up to the same number. The fault cases are
/// counted one way on the terminal, in the report's headline, its faults section and its
/// Timings table (once 22 faults injected, 29 fault cases and 28 items).
#[test]
fn verify_lines_add_up_to_the_total_and_name_every_count() {
    let dir = full_run_dir();
    let args = [
        "verify",
        "--lease",
        "redis://127.0.0.1:6379/6",
        "--seed",
        "1",
    ];
    let out = run_cli_in(dir.path(), &args, b"");
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let stdout = &out.stdout;
    let total = stdout
        .lines()
        .find_map(|l| l.strip_prefix("TOTAL    "))
        .unwrap_or_else(|| panic!("no TOTAL line:\n{stdout}"));
    let numbers = regex::Regex::new(
        r"^(\d+) PASS, (\d+) FAIL, (\d+) PENDING — (\d+) verdicts — ticketflow-report/REPORT.md — ",
    )
    .unwrap();
    let c = numbers.captures(total).unwrap_or_else(|| panic!("{total}"));
    let n = |i: usize| c[i].parse::<usize>().unwrap();
    let (pass, fail, pending, all) = (n(1), n(2), n(3), n(4));
    assert_eq!(pass + fail + pending, all, "{total}");
    assert_eq!(line_counts(stdout), [pass, fail, pending], "{stdout}");
    let counts = stdout
        .lines()
        .find_map(|l| l.strip_prefix("COUNTS   "))
        .unwrap_or_else(|| panic!("no COUNTS line:\n{stdout}"));
    let (parts, sum) = counts.split_once(" = ").unwrap();
    let added: usize = parts
        .split(" + ")
        .map(|p| p.split(' ').next().unwrap().parse::<usize>().unwrap())
        .sum();
    assert_eq!(added, all, "{counts}");
    assert!(sum.starts_with(&format!("{all} verdicts")), "{counts}");

    // The lines that were missing, each with its count.
    let loom = regex::Regex::new(
        r"(?m)^PASS     loom models: (\d+) read from reports/loom\.json .*not run by verify \[(\d+) verdicts: (\d+) PASS\]$",
    )
    .unwrap();
    let m = loom
        .captures(stdout)
        .unwrap_or_else(|| panic!("no loom line:\n{stdout}"));
    assert!(m[1].parse::<usize>().unwrap() > 0 && m[1] == m[2] && m[2] == m[3]);
    assert!(
        counts.contains(&format!("{} loom models", &m[1])),
        "{counts}"
    );
    assert!(
        stdout.lines().any(
            |l| l.starts_with("PENDING  fault case: PostgreSQL restarts")
                && l.contains("--restart-postgres")
        ),
        "{stdout}"
    );
    let kill =
        regex::Regex::new(r"(?m)^\w+ +kill matrix: (\d+) verdicts .* \[(\d+) verdicts").unwrap();
    let k = kill.captures(stdout).unwrap_or_else(|| panic!("{stdout}"));
    assert_eq!(&k[1], &k[2]);

    // One count of fault cases everywhere, each number named.
    let faults = regex::Regex::new(
        r"(\d+) fault cases \((\d+) ran: (\d+) inject a fault, (\d+) try (\d+) bad inputs; (\d+) PENDING: PostgreSQL restarts during a run\)",
    )
    .unwrap();
    let line = stdout
        .lines()
        .find(|l| l.contains("faults and bad input:"))
        .unwrap_or_else(|| panic!("{stdout}"));
    let f = faults.captures(line).unwrap_or_else(|| panic!("{line}"));
    let f: Vec<usize> = (1..=6).map(|i| f[i].parse().unwrap()).collect();
    let (cases, ran, inject, bad, inputs, not_run) = (f[0], f[1], f[2], f[3], f[4], f[5]);
    assert_eq!(ran + not_run, cases, "{line}");
    assert_eq!(inject + bad, ran, "{line}");
    assert!(
        line.ends_with(&format!("[{ran} verdicts: {ran} PASS]")),
        "{line}"
    );
    assert!(counts.contains(&format!("{cases} fault cases")), "{counts}");
    let tally = faults.find(line).unwrap().as_str();
    let out_dir = dir.path().join("ticketflow-report");
    let md = std::fs::read_to_string(out_dir.join("REPORT.md")).unwrap();
    let headline = md.lines().find(|l| l.starts_with("**")).unwrap();
    assert!(
        headline.contains(&format!("over {all} items")),
        "{headline}"
    );
    assert!(headline.contains(tally), "{headline}\n{tally}");
    assert!(
        md.contains(&format!("Verdict: **PASS**. {tally}.")),
        "faults section"
    );
    assert!(
        md.contains(&format!("| fault cases (ran) | {ran} |")),
        "timings"
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("report.json")).unwrap())
            .unwrap();
    let items = json["items"].as_array().unwrap();
    let of_kind = |k: &str| items.iter().filter(|i| i["kind"] == k).count();
    assert_eq!(of_kind("fault"), cases);
    let json_cases = json["faults"]["cases"].as_array().unwrap();
    let ran_of = |kind: &str| {
        json_cases
            .iter()
            .filter(|c| c["kind"] == kind && c["verdict"] != "PENDING")
            .count()
    };
    assert_eq!((ran_of("fault"), ran_of("bad-input")), (inject, bad));
    assert_eq!(json["faults"]["inputs_tried"], inputs);
    assert_eq!(json["summary"]["total"], all);
}

/// `scenario run --report` over a library scenario: its runs and detail file are in the
/// report, which validates and covers that file only; `--help` describes the flag.
#[test]
fn scenario_run_report_holds_library_runs_of_the_given_file_only() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        crate::support::repo_path("scenarios/a-same-key-same-body.toml"),
        dir.path().join("a.toml"),
    )
    .unwrap();
    let args = [
        "scenario",
        "run",
        "a.toml",
        "--backend",
        "sqlite",
        "--sqlite-tx",
        "lazy",
        "--sqlite-journal",
        "wal",
    ];
    let ran = run_cli_in(
        dir.path(),
        &[&args[..], &["--report", "rep/REPORT.md"]].concat(),
        b"",
    );
    assert_eq!(ran.code, 0, "{}\n{}", ran.stdout, ran.stderr);
    let rep = dir.path().join("rep");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(rep.join("report.json")).unwrap()).unwrap();
    let v = crate::report::schema_validator();
    assert_eq!(
        crate::report::schema_errors(&v, &json),
        Vec::<String>::new()
    );
    assert_eq!(json["scope"]["files"], serde_json::json!(["a.toml"]));
    assert_eq!(json["scenario_runs"].as_array().unwrap().len(), 1);
    assert_eq!(json["items"][0]["kind"], "scenario");
    assert_eq!(json["items"].as_array().unwrap().len(), 1);
    let md = std::fs::read_to_string(rep.join("REPORT.md")).unwrap();
    assert!(md.contains("## Verdicts: SQLite"), "{md}");
    assert!(md.contains("a-same-key-same-body"), "{md}");
    assert!(!md.contains("## Verdicts: PostgreSQL"), "{md}");
    assert!(!md.contains("## PENDING"), "nothing is PENDING here:\n{md}");
    assert!(rep
        .join("reports/details/scenario-a-same-key-same-body.md")
        .exists());
    let help = run_cli(&["scenario", "run", "--help"], "");
    assert!(help.stdout.contains("--report <PATH>"), "{}", help.stdout);
    assert!(
        help.stdout.contains("verify --scenarios"),
        "{}",
        help.stdout
    );
}

/// Clap reads `{n}` in a help text as a line break: `--body`'s placeholders must print as
/// typed, on one line with the rest of its help.
#[test]
fn target_init_help_shows_the_body_placeholders_as_typed() {
    for flag in ["--help", "-h"] {
        let out = run_cli(&["target", "init", flag], "");
        assert_eq!(out.code, 0, "{}", out.stderr);
        let body = out
            .stdout
            .lines()
            .find(|l| l.trim_start().starts_with("--body"))
            .unwrap_or_else(|| panic!("no --body in {}", out.stdout));
        assert!(
            body.contains("(string values may use {run}, {racer}, {n})"),
            "{flag}: {}",
            out.stdout
        );
        assert!(
            !out.stdout.lines().any(|l| l.trim_start().starts_with(')')),
            "{flag}: {}",
            out.stdout
        );
    }
}
