//! SIGINT in each phase of `verify` (scenario runs, faults, property suites, kill matrix) and
//! in `bench` leaves no scratch database behind, and what `verify` printed before the
//! interrupt is in its stdout file.
//!
//! Other tests create `tf_…` databases on the same server at the same time, so each run here
//! sets `TICKETFLOW_SCRATCH_TAG` to a tag of its own and only databases named `tf_<tag>_…`
//! are looked at. The signal is sent while the server runs a `CREATE DATABASE` of the phase
//! (seen in `pg_stat_activity`), and in the scenario phase after its first line was printed:
//! never after a fixed delay.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use postgres::Client;

use crate::support::repo_path;

/// How long a run may take to show all its signs.
const START_DEADLINE: Duration = Duration::from_secs(120);

/// Between two looks at the server or the stdout file while waiting for a sign.
const POLL: Duration = Duration::from_millis(5);

/// A tag for this process and `phase`: the prefix `tf_<tag>_` is this run's alone.
fn tag(phase: &str) -> String {
    format!("i{}{phase}", std::process::id())
}

/// The scratch databases whose names carry `tag`.
fn tagged(admin: &mut Client, tag: &str) -> Vec<String> {
    admin
        .query(
            "SELECT datname::text FROM pg_database WHERE starts_with(datname, $1) ORDER BY 1",
            &[&format!("tf_{tag}_")],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Whether a `CREATE DATABASE` of a database with `tag` is running on the server.
fn creating(admin: &mut Client, tag: &str) -> bool {
    admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND starts_with(query, $1)",
            &[&format!("CREATE DATABASE \"tf_{tag}_")],
        )
        .unwrap()
        .get::<_, i64>(0)
        > 0
}

/// What the run under test shows, in turn, before it is interrupted.
#[derive(Debug, Clone, Copy)]
enum Sign {
    /// The server is running a `CREATE DATABASE` for this run: the interrupt comes while a
    /// scratch database is being created, the narrowest window. (Should a create be too
    /// quick to be seen, a scratch database of this run that exists will do.)
    CreatingScratchDatabase,
    /// The stdout file holds a first complete line.
    FirstLine,
    /// The run's temporary directory (`TMPDIR`) holds a directory of its own (a scratch
    /// SQLite file's).
    TempDirectory,
}

/// Where the run under test is interrupted: on the PostgreSQL server at the URL (databases
/// are looked at), or on SQLite only.
enum On {
    Postgres,
    Sqlite,
}

/// What is in `dir`.
fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// Runs `ticketflow ARGS` in a directory holding `scenarios/a.toml`, with a tag and a
/// `TMPDIR` of its own and stdout to a file; once it has shown each of `signs` in turn, sends
/// SIGINT and waits for it. Then it must have exited 130, no database with its tag and nothing
/// in its `TMPDIR` may remain, and stdout must still hold what it held at the interrupt.
/// Returns its stdout and stderr (`None`: PostgreSQL is needed and not reachable).
fn interrupt(phase: &str, args: &[&str], signs: &[Sign], on: On) -> Option<(String, String)> {
    let url = match on {
        On::Postgres => Some(crate::support::pg_url()?),
        On::Sqlite => None,
    };
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let scen = dir.path().join("scenarios");
    std::fs::create_dir(&scen).unwrap();
    std::fs::copy(
        repo_path("scenarios/a-same-key-same-body.toml"),
        scen.join("a.toml"),
    )
    .unwrap();
    let tag = tag(phase);
    let stdout_path = dir.path().join("stdout.txt");
    let stderr_path = dir.path().join("stderr.txt");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ticketflow"))
        .args(args)
        .args(url.iter().flat_map(|u| ["--pg-url", u.as_str()]))
        .current_dir(dir.path())
        .env_remove("DATABASE_URL")
        .env_remove("PROPTEST_CASES")
        .env(ticketflow_harness::scratch::SCRATCH_TAG_VAR, &tag)
        .env("TMPDIR", &tmp)
        .stdin(Stdio::null())
        // Files, not pipes: what was printed must reach the file before the interrupt.
        .stdout(std::fs::File::create(&stdout_path).unwrap())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .unwrap();
    let mut admin = url.map(|u| {
        let config = ticketflow_core::store::url::parse_postgres(&u).unwrap();
        ticketflow_core::store::postgres::connect(&config).unwrap()
    });
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    let deadline = Instant::now() + START_DEADLINE;
    for sign in signs {
        loop {
            let shown = match sign {
                Sign::CreatingScratchDatabase => {
                    let admin = admin.as_mut().expect("a PostgreSQL sign");
                    creating(admin, &tag) || !tagged(admin, &tag).is_empty()
                }
                Sign::FirstLine => read(&stdout_path).contains('\n'),
                Sign::TempDirectory => !entries(&tmp).is_empty(),
            };
            if shown {
                break;
            }
            if let Some(status) = child.try_wait().unwrap() {
                panic!(
                    "{phase}: the run ended ({status}) before {sign:?}; stdout:\n{}\nstderr:\n{}",
                    read(&stdout_path),
                    read(&stderr_path)
                );
            }
            assert!(Instant::now() < deadline, "{phase}: no {sign:?} in time");
            std::thread::sleep(POLL);
        }
    }
    let printed_before = read(&stdout_path);
    signal(&child, "-INT");
    let status = child.wait().unwrap();
    let (stdout, stderr) = (read(&stdout_path), read(&stderr_path));
    assert_eq!(
        status.code(),
        Some(130),
        "{phase}: exit status\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    // A statement the process sent before it exited runs on: a `CREATE DATABASE` in flight
    // commits after the exit. Wait for the server to finish them before looking.
    if let Some(admin) = admin.as_mut() {
        let settled = Instant::now() + START_DEADLINE;
        while creating(admin, &tag) {
            assert!(
                Instant::now() < settled,
                "{phase}: a CREATE DATABASE never ended"
            );
            std::thread::sleep(POLL);
        }
        let left = tagged(admin, &tag);
        assert!(
            left.is_empty(),
            "{phase}: SIGINT left scratch databases behind: {left:?}\nstderr:\n{stderr}"
        );
    }
    let left = entries(&tmp);
    assert!(
        left.is_empty(),
        "{phase}: SIGINT left temporary files behind: {left:?}\nstderr:\n{stderr}"
    );
    assert!(
        stdout.starts_with(&printed_before),
        "{phase}: stdout lost what was printed before the interrupt:\nbefore:\n{printed_before}\nafter:\n{stdout}"
    );
    Some((stdout, stderr))
}

fn signal(child: &Child, which: &str) {
    let status = Command::new("kill")
        .args([which, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

const VERIFY_PG: [&str; 3] = ["verify", "--backend", "postgres"];

fn verify_args<'a>(filter: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = VERIFY_PG.to_vec();
    args.extend(["--filter", filter]);
    args.extend(extra);
    args
}

#[test]
fn sigint_during_scenario_runs_keeps_the_printed_lines_and_drops_every_scratch_database() {
    // One scenario at three isolation levels: its first line is printed when the first level
    // is done, and the interrupt comes while the next one runs.
    let args = verify_args("a-same-key-same-body", &["--no-kill-matrix"]);
    let signs = [Sign::FirstLine, Sign::CreatingScratchDatabase];
    let Some((stdout, _)) = interrupt("s", &args, &signs, On::Postgres) else {
        return;
    };
    let first = stdout.lines().next().unwrap();
    assert!(
        first.starts_with("PASS") && first.contains("a-same-key-same-body"),
        "the first run's line: {stdout}"
    );
}

#[test]
fn sigint_during_the_faults_phase_drops_every_scratch_database() {
    interrupt(
        "f",
        &verify_args("faults", &[]),
        &[Sign::CreatingScratchDatabase],
        On::Postgres,
    );
}

#[test]
fn sigint_during_the_sequential_property_suite_drops_every_scratch_database() {
    interrupt(
        "ps",
        &verify_args("property:sequential", &[]),
        &[Sign::CreatingScratchDatabase],
        On::Postgres,
    );
}

#[test]
fn sigint_during_the_concurrent_property_suite_drops_every_scratch_database() {
    interrupt(
        "pc",
        &verify_args("property:concurrent", &[]),
        &[Sign::CreatingScratchDatabase],
        On::Postgres,
    );
}

#[test]
fn sigint_during_the_soak_drops_its_scratch_database() {
    interrupt(
        "so",
        &verify_args("soak", &[]),
        &[Sign::CreatingScratchDatabase],
        On::Postgres,
    );
}

#[test]
fn sigint_during_the_kill_matrix_drops_every_scratch_database() {
    interrupt(
        "k",
        &verify_args("kill-matrix", &[]),
        &[Sign::CreatingScratchDatabase],
        On::Postgres,
    );
}

#[test]
fn sigint_during_bench_drops_every_scratch_database() {
    interrupt(
        "b",
        &["bench", "--quick", "--backend", "postgres"],
        &[Sign::CreatingScratchDatabase],
        On::Postgres,
    );
}

#[test]
fn sigint_during_a_sqlite_property_suite_removes_its_scratch_file() {
    interrupt(
        "q",
        &[
            "verify",
            "--backend",
            "sqlite",
            "--filter",
            "property:sequential",
        ],
        &[Sign::TempDirectory],
        On::Sqlite,
    );
}

/// `scenario run` of every shipped library scenario on PostgreSQL, tagged `tag`, with stdout
/// and stderr as given.
fn scenario_run(url: &str, tag: &str, stdout: Stdio) -> Child {
    Command::new(env!("CARGO_BIN_EXE_ticketflow"))
        .args(["scenario", "run", "scenarios", "--backend", "postgres"])
        .args(["--pg-url", url])
        .current_dir(repo_path(""))
        .env_remove("DATABASE_URL")
        .env(ticketflow_harness::scratch::SCRATCH_TAG_VAR, tag)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Waits for `child` to end, at most `within`; kills it and panics after that.
fn ended_within(child: &mut Child, within: Duration, what: &str) -> std::process::ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if started.elapsed() > within {
            let _ = child.kill();
            panic!("{what}: still running {within:?} later");
        }
        std::thread::sleep(POLL);
    }
}

/// Every scratch database with `tag` is gone once no `CREATE DATABASE` of it is running.
fn none_left(admin: &mut Client, tag: &str, what: &str) {
    let settled = Instant::now() + START_DEADLINE;
    while creating(admin, tag) {
        assert!(
            Instant::now() < settled,
            "{what}: a CREATE DATABASE never ended"
        );
        std::thread::sleep(POLL);
    }
    let left = tagged(admin, tag);
    assert!(left.is_empty(), "{what} left scratch databases: {left:?}");
}

/// SIGTERM and SIGHUP end `scenario run` mid-run as SIGINT does, with 128 + the signal's
/// number, within seconds, its scratch databases dropped.
#[test]
fn sigterm_and_sighup_end_a_run_with_their_own_codes_and_drop_its_databases() {
    let Some(url) = crate::support::pg_url() else {
        return;
    };
    let config = ticketflow_core::store::url::parse_postgres(&url).unwrap();
    let mut admin = ticketflow_core::store::postgres::connect(&config).unwrap();
    for (which, code) in [("-TERM", 143), ("-HUP", 129)] {
        let tag = tag(&format!("sig{code}"));
        let mut child = scenario_run(&url, &tag, Stdio::null());
        let deadline = Instant::now() + START_DEADLINE;
        while !creating(&mut admin, &tag) && tagged(&mut admin, &tag).is_empty() {
            assert!(child.try_wait().unwrap().is_none(), "{which}: ended first");
            assert!(
                Instant::now() < deadline,
                "{which}: no scratch database in time"
            );
            std::thread::sleep(POLL);
        }
        signal(&child, which);
        let status = ended_within(&mut child, Duration::from_secs(10), which);
        assert_eq!(status.code(), Some(code), "{which}: {status:?}");
        none_left(&mut admin, &tag, which);
    }
}

/// A closed stdout (its reader gone, as after `| head -1`) ends a run at its next line, as
/// SIGPIPE would (141), its scratch databases dropped: it neither panics nor runs on unread.
#[test]
fn a_closed_stdout_ends_a_run_at_its_next_line_and_drops_its_databases() {
    let Some(url) = crate::support::pg_url() else {
        return;
    };
    let config = ticketflow_core::store::url::parse_postgres(&url).unwrap();
    let mut admin = ticketflow_core::store::postgres::connect(&config).unwrap();
    let tag = tag("pipe");
    let mut child = scenario_run(&url, &tag, Stdio::piped());
    drop(child.stdout.take());
    // Every scenario of the directory would take far longer than this.
    let status = ended_within(&mut child, Duration::from_secs(60), "closed stdout");
    assert_eq!(status.code(), Some(141), "{status:?}");
    none_left(&mut admin, &tag, "closed stdout");
}
