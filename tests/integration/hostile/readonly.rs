//! The target's database is only read: count queries in a read-only transaction with their own timeout; setup SQL only in a transaction on the scratch database.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ticketflow_harness::blackbox::{run_repeated, run_target, RunOptions, TargetScenario};
use ticketflow_harness::verdict::Verdict;

use crate::blackbox::{response, stub};
use crate::support::{pg_url, TestDb};

fn parse(text: &str) -> TargetScenario {
    TargetScenario::parse(Path::new("t.toml"), text, &|_| None)
        .unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn opts(url: &str) -> RunOptions {
    RunOptions {
        exe: Some(PathBuf::from(env!("CARGO_BIN_EXE_ticketflow"))),
        ..RunOptions::new(crate::support::server(url))
    }
}

/// One racer against a stub answering 201 with an id, and one count query `COUNT` on the
/// database at `DB`.
const COUNTED: &str = r#"
name = "counted"
description = "d"
[barrier]
kind = "http"
[target]
base_urls = ["BASE"]
database_url = "DB"
preset = "ietf"
EXTRA
[target.request]
path = "/things"
body = { a = 1 }
[target.count]
things = "COUNT"
[[racers]]
name = "client"
key = "k1"
[[expect.counts]]
things = 1
"#;

fn counted(base: &str, db: &str, count: &str, extra: &str) -> TargetScenario {
    parse(
        &COUNTED
            .replace("BASE", base)
            .replace("DB", db)
            .replace("COUNT", count)
            .replace("EXTRA", extra),
    )
}

fn created_stub() -> String {
    stub(|_| response("201 Created", &[], r#"{"id":"t-1"}"#))
}

#[test]
fn a_count_calling_a_deleting_function_is_refused_and_the_rows_stay() {
    let Some(db) = TestDb::postgres("hostile_ro_delete") else {
        return;
    };
    db.execute(
        "CREATE TABLE victims (id int PRIMARY KEY);
         INSERT INTO victims SELECT generate_series(1, 5);
         CREATE FUNCTION count_and_delete() RETURNS bigint LANGUAGE sql AS
           $$ WITH d AS (DELETE FROM victims RETURNING 1) SELECT count(*) FROM d $$;",
    );
    let s = counted(
        &created_stub(),
        &db.url().unwrap(),
        "SELECT count_and_delete()",
        "",
    );
    let r = run_target(&s, &opts(&db.url().unwrap())).unwrap();
    assert_eq!(db.scalar("SELECT count(*) FROM victims"), 5, "rows deleted");
    assert_ne!(r.verdict, Verdict::Pass, "{:?}", r.checks);
    let reason = r.reason.clone().unwrap_or_default();
    assert!(
        reason.contains("read-only transaction") && reason.contains("25006"),
        "{reason}"
    );
}

#[test]
fn a_count_that_does_not_return_is_cancelled_at_its_own_timeout() {
    let Some(db) = TestDb::postgres("hostile_ro_slow") else {
        return;
    };
    let s = counted(
        &created_stub(),
        &db.url().unwrap(),
        "SELECT count(*) FROM pg_sleep(60)",
        "count_timeout_ms = 300",
    );
    let started = Instant::now();
    let r = run_target(&s, &opts(&db.url().unwrap())).unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(r.verdict, Verdict::Pending, "{:?}", r.checks);
    let reason = r.reason.clone().unwrap_or_default();
    assert!(
        reason.contains("count_timeout_ms = 300") && reason.contains("57014"),
        "{reason}"
    );
}

#[test]
fn count_timeout_ms_must_be_positive_and_bounded() {
    let text = |extra: &str| {
        COUNTED
            .replace("BASE", "http://127.0.0.1:1")
            .replace("DB", "postgres://u@127.0.0.1:1/x")
            .replace("COUNT", "SELECT 1")
            .replace("EXTRA", extra)
    };
    let ok = parse(&text("count_timeout_ms = 250"));
    assert_eq!(ok.target.count_timeout_ms, 250);
    let default = parse(&text(""));
    assert_eq!(
        default.target.count_timeout_ms,
        ticketflow_harness::blackbox::format::DEFAULT_COUNT_TIMEOUT_MS
    );
    for bad in ["count_timeout_ms = 0", "count_timeout_ms = 99999999999"] {
        let e = TargetScenario::parse(Path::new("t.toml"), &text(bad), &|_| None).unwrap_err();
        assert!(e.to_string().contains("count_timeout_ms must be"), "{e}");
        assert!(e.to_string().contains("t.toml:"), "{e}");
    }
}

/// A database of the cluster outside the scratch one, dropped when this ends.
struct Other {
    admin: String,
    name: String,
}

impl Other {
    fn create(admin: &str, label: &str) -> Other {
        let name = format!("tf_hostile_{label}_{}", std::process::id());
        let mut c = postgres::Client::connect(admin, postgres::NoTls).unwrap();
        c.batch_execute(&format!("DROP DATABASE IF EXISTS {name}"))
            .unwrap();
        c.batch_execute(&format!("CREATE DATABASE {name}")).unwrap();
        Other {
            admin: admin.to_string(),
            name,
        }
    }

    fn exists(&self) -> bool {
        let mut c = postgres::Client::connect(&self.admin, postgres::NoTls).unwrap();
        c.query_one(
            "SELECT count(*) FROM pg_database WHERE datname = $1",
            &[&self.name],
        )
        .unwrap()
        .get::<_, i64>(0)
            == 1
    }
}

impl Drop for Other {
    fn drop(&mut self) {
        if let Ok(mut c) = postgres::Client::connect(&self.admin, postgres::NoTls) {
            let _ = c.batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ));
        }
    }
}

const SETUP: &str = r#"
name = "setup"
description = "d"
[barrier]
kind = "http"
[target]
own_service = true
setup_sql = SETUP_SQL
[target.request]
path = "/v1/tickets"
body = { actor_id = "u1", title = "t", body = "b", priority = "high" }
[[target.service]]
name = "api"
command = ["{ticketflow}", "serve", "--listen", "127.0.0.1:{port}", "--database-url", "{database_url}"]
[[racers]]
name = "client"
key = "k1"
"#;

fn setup_refused(label: &str, setup_sql: impl Fn(&str) -> String, expect: &[&str]) {
    let Some(url) = pg_url() else {
        return;
    };
    let other = Other::create(&url, label);
    let s = parse(&SETUP.replace("SETUP_SQL", &setup_sql(&other.name)));
    let result = run_repeated(&s, &opts(&url));
    assert!(other.exists(), "setup_sql dropped {}", other.name);
    let e = match result {
        Err(e) => e.to_string(),
        Ok(o) => panic!("setup_sql was not refused: {:?}", o.runs[0].reason),
    };
    for word in expect {
        assert!(e.contains(word), "{word:?} not in: {e}");
    }
}

#[test]
fn setup_sql_cannot_drop_another_database_of_the_cluster() {
    setup_refused(
        "drop",
        |other| format!(r#"["DROP DATABASE {other}"]"#),
        &["setup_sql", "25001", "transaction"],
    );
}

#[test]
fn setup_sql_cannot_end_the_runners_transaction_to_escape_it() {
    setup_refused(
        "escape",
        |other| format!(r#"["COMMIT", "DROP DATABASE {other}"]"#),
        &["setup_sql", "transaction"],
    );
}
