//! A SIGKILLed harness leaves no child serving and its scratch databases are swept by the next run or `ticketflow clean`.
//!
//! Each test keeps its scratch ledger apart from every other test's: the harness keeps the
//! ledger in the database its PostgreSQL URL names, so the runs here are pointed at a
//! maintenance database of their own (`orphans_<tag>`), and a `clean` or a sweep by any
//! other test (which looks at the ledger in `postgres`) never sees their rows.

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use postgres::Client;

use crate::support::pg_url;

/// Between two looks at `/proc` or the server while waiting.
const POLL: Duration = Duration::from_millis(10);

/// A tag of this test's own (at most 12 characters, the scratch tag's limit).
fn tag(what: &str) -> String {
    format!("o{what}{}", &uuid::Uuid::new_v4().simple().to_string()[..6])
}

/// A maintenance database of the test's own on the server at `url`, and `url` pointed at it.
/// Dropped with the value.
struct Maintenance {
    admin: Client,
    name: String,
    url: String,
}

impl Maintenance {
    fn new(url: &str, tag: &str) -> Maintenance {
        let config = ticketflow_core::store::url::parse_postgres(url).unwrap();
        let mut admin = ticketflow_core::store::postgres::connect(&config).unwrap();
        let name = format!("orphans_{tag}");
        admin
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .unwrap();
        let url = ticketflow_core::store::url::url_with_db(url, &name).unwrap();
        Maintenance { admin, name, url }
    }

    /// The databases whose names start with `prefix`.
    fn databases(&mut self, prefix: &str) -> Vec<String> {
        self.admin
            .query(
                "SELECT datname::text FROM pg_database WHERE starts_with(datname, $1) ORDER BY 1",
                &[&prefix],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    fn exists(&mut self, name: &str) -> bool {
        !self.databases(name).iter().all(|d| d != name)
    }

    /// A connection to the maintenance database itself (where the ledger is).
    fn ledger(&self) -> Client {
        let config = ticketflow_core::store::url::parse_postgres(&self.url).unwrap();
        ticketflow_core::store::postgres::connect(&config).unwrap()
    }
}

impl Drop for Maintenance {
    fn drop(&mut self) {
        let _ = self.admin.batch_execute(&format!(
            "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
            self.name
        ));
    }
}

/// Whether process `pid` is alive (exists and is not a zombie).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim().to_string()))
        .is_some_and(|rest| !rest.starts_with('Z') && !rest.starts_with('X'))
}

/// The processes whose parent is `pid` (any of its threads), from `/proc/*/stat`.
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| {
                    let (_, rest) = s.rsplit_once(')')?;
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}

/// Kills what a failed test would leave running (services that outlived their parent).
struct KillOnDrop(Vec<u32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for pid in &self.0 {
            if alive(*pid) {
                // SAFETY: kill takes a pid and a signal and has no memory effects.
                unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
            }
        }
    }
}

fn ticketflow(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ticketflow"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Starts `ticketflow soak` on the maintenance database's URL and waits until its two
/// services are up (two children, sessions on its scratch database); returns the process,
/// its scratch database and the services' pids.
// The caller kills and waits for the process it gets back.
#[allow(clippy::zombie_processes)]
fn soak_under_way(m: &mut Maintenance, tag: &str) -> (Child, String, Vec<u32>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ticketflow"))
        .args([
            "soak",
            "--duration",
            "60s",
            "--connections",
            "1",
            "--faults",
            "none",
            "--pg-url",
            &m.url,
        ])
        .env(ticketflow_harness::scratch::SCRATCH_TAG_VAR, tag)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let dbs = m.databases(&format!("tf_{tag}_soak_"));
        let kids = children_of(child.id());
        if let (Some(db), 2..) = (dbs.first(), kids.len()) {
            let sessions: i64 = m
                .admin
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = $1",
                    &[db],
                )
                .unwrap()
                .get(0);
            if sessions > 0 {
                return (child, db.clone(), kids);
            }
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the soak never got going");
        }
        std::thread::sleep(POLL);
    }
}

/// SIGKILL of a running `soak` (no cleanup runs): its `serve` children die with it within a
/// bound, and `ticketflow clean` lists (`--dry-run`) and then drops its scratch database.
#[test]
fn a_sigkilled_soak_leaves_no_child_and_clean_drops_its_database() {
    let Some(url) = pg_url() else { return };
    let tag = tag("k");
    let mut m = Maintenance::new(&url, &tag);
    let (mut soak, db, services) = soak_under_way(&mut m, &tag);
    let _reaper = KillOnDrop(services.clone());
    soak.kill().unwrap();
    soak.wait().unwrap();

    let deadline = Instant::now() + Duration::from_secs(5);
    while services.iter().any(|p| alive(*p)) {
        assert!(
            Instant::now() < deadline,
            "services {services:?} outlived the SIGKILLed soak by 5 s"
        );
        std::thread::sleep(POLL);
    }
    assert!(m.exists(&db), "SIGKILL runs no cleanup: {db} is left");

    let dry = ticketflow(&["clean", "--dry-run", "--pg-url", &m.url]);
    assert_eq!(dry.status.code(), Some(0), "{}", text(&dry));
    assert!(
        String::from_utf8_lossy(&dry.stdout).contains(&db),
        "--dry-run lists {db}: {}",
        text(&dry)
    );
    assert!(m.exists(&db), "--dry-run dropped {db}");

    let clean = ticketflow(&["clean", "--pg-url", &m.url]);
    assert_eq!(clean.status.code(), Some(0), "{}", text(&clean));
    assert!(
        String::from_utf8_lossy(&clean.stdout).contains(&db),
        "clean names {db}: {}",
        text(&clean)
    );
    assert!(!m.exists(&db), "clean left {db}");
    assert!(
        m.databases(&format!("tf_{tag}_")).is_empty(),
        "a scratch database of the killed soak is left"
    );
}

/// `clean` drops only what the ledger says belongs to a process that is gone: a database of a
/// live owner (this test process) stays; a row naming this pid with another start time (the
/// pid reused) is an orphan; a `tf_…` database that is not in the ledger is never dropped.
#[test]
fn clean_spares_a_live_owner_and_databases_not_in_the_ledger() {
    let Some(url) = pg_url() else { return };
    let tag = tag("l");
    let mut m = Maintenance::new(&url, &tag);
    let live =
        ticketflow_harness::scratch::ScratchDb::postgres(&crate::support::server(&m.url), "live")
            .unwrap();
    let live_name = live.pg().unwrap().name().to_string();

    let reused = format!("tf_{tag}_reused");
    let foreign = format!("tf_{tag}_foreign");
    let vanished = format!("tf_{tag}_vanished");
    for db in [&reused, &foreign] {
        m.admin
            .batch_execute(&format!("CREATE DATABASE \"{db}\""))
            .unwrap();
    }
    let mut ledger = m.ledger();
    // Rows like the live one's, but with another start time: the pid was reused.
    for db in [&reused, &vanished] {
        let n = ledger
            .execute(
                "INSERT INTO ticketflow_scratch_ledger \
                 (database, owner_pid, owner_host, owner_boot, owner_pidns, owner_start, created_at) \
                 SELECT $1, owner_pid, owner_host, owner_boot, owner_pidns, owner_start + 1, now() \
                 FROM ticketflow_scratch_ledger WHERE database = $2",
                &[db, &live_name],
            )
            .unwrap();
        assert_eq!(n, 1, "the live database {live_name} has a ledger row");
    }

    let clean = ticketflow(&["clean", "--pg-url", &m.url]);
    let out = String::from_utf8_lossy(&clean.stdout).to_string();
    let foreign_left = m.exists(&foreign);
    let _ = m
        .admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS \"{foreign}\""));
    assert!(
        foreign_left,
        "clean dropped {foreign}, which is not in the ledger"
    );
    assert_eq!(clean.status.code(), Some(0), "{}", text(&clean));
    assert!(out.contains(&reused), "{}", text(&clean));
    assert!(!m.exists(&reused), "clean left {reused}");
    assert!(!out.contains(&live_name), "{}", text(&clean));
    assert!(
        m.exists(&live_name),
        "clean dropped a live owner's database"
    );
    assert!(!out.contains(&foreign), "{}", text(&clean));
    let rows: Vec<String> = ledger
        .query(
            "SELECT database FROM ticketflow_scratch_ledger ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        rows,
        std::slice::from_ref(&live_name),
        "only the live row is left"
    );
    drop(ledger);
    drop(live);
    assert!(!m.exists(&live_name));
}

/// The next run sweeps too: `scenario run` (here on SQLite only, so nothing else touches the
/// server) first drops the databases of dead owners in the ledger of its `--pg-url` and says
/// so on stderr, one line each.
#[test]
fn the_next_run_drops_a_dead_owners_database_and_says_so() {
    let Some(url) = pg_url() else { return };
    let tag = tag("n");
    let mut m = Maintenance::new(&url, &tag);
    // A ledger row of this process with another start time: its owner is gone (pid reuse).
    let live =
        ticketflow_harness::scratch::ScratchDb::postgres(&crate::support::server(&m.url), "live")
            .unwrap();
    let live_name = live.pg().unwrap().name().to_string();
    let orphan = format!("tf_{tag}_orphan");
    m.admin
        .batch_execute(&format!("CREATE DATABASE \"{orphan}\""))
        .unwrap();
    let n = m
        .ledger()
        .execute(
            "INSERT INTO ticketflow_scratch_ledger \
             (database, owner_pid, owner_host, owner_boot, owner_pidns, owner_start) \
             SELECT $1, owner_pid, owner_host, owner_boot, owner_pidns, owner_start + 1 \
             FROM ticketflow_scratch_ledger WHERE database = $2",
            &[&orphan, &live_name],
        )
        .unwrap();
    assert_eq!(n, 1);
    let scenario = crate::support::repo_path("scenarios/a-same-key-same-body.toml");
    let run = ticketflow(&[
        "scenario",
        "run",
        scenario.to_str().unwrap(),
        "--backend",
        "sqlite",
        "--pg-url",
        &m.url,
    ]);
    let left = m.exists(&orphan);
    let _ = m
        .admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS \"{orphan}\""));
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains(&format!("dropped orphaned scratch database {orphan}")),
        "{}",
        text(&run)
    );
    assert!(!left, "the run left {orphan}");
    assert!(
        m.exists(&live_name),
        "the run dropped a live owner's database"
    );
    drop(live);
}
