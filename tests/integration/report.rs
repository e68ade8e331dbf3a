//! The outputs of `verify`: report.json against its schema, report.junit.xml against the
//! JUnit XSD shape CI systems read, exit codes, `--filter`, diff-friendly tables, Mermaid
//! diagrams, and isolation-tester specs that replay a recorded PostgreSQL race.

use std::path::Path;
use std::process::Command;

use ticketflow_core::store::call::StoreCall;
use ticketflow_core::store::postgres::{self as pg, IsolationLevel};
use ticketflow_core::store::Backend;
use ticketflow_core::variants::{Implementation, Variant};
use ticketflow_harness::blackbox::isolation;
use ticketflow_harness::scenario::format::Scenario;
use ticketflow_harness::scenario::runner::{run_postgres, PgOptions};
use ticketflow_harness::scenario::Evidence;
use ticketflow_harness::scratch::ScratchDatabase;
use ticketflow_harness::verdict::Verdict;

use crate::cli::run_cli_in;
use crate::support::{pg_url, repo_path};
use ticketflow_core::store::url::url_with_db;

/// A directory with `scenarios/` holding scenario a and, when `failing`, a copy whose
/// expectation is wrong (tenant A expects 2 tickets), so every run of it FAILs.
fn workdir(failing: bool) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let scen = dir.path().join("scenarios");
    std::fs::create_dir(&scen).unwrap();
    let a = std::fs::read_to_string(repo_path("scenarios/a-same-key-same-body.toml")).unwrap();
    std::fs::write(scen.join("a.toml"), &a).unwrap();
    if failing {
        let z = a
            .replace(
                "name = \"a-same-key-same-body\"",
                "name = \"z-wrong-expectation\"",
            )
            .replace("tickets = 1", "tickets = 2");
        std::fs::write(scen.join("z.toml"), z).unwrap();
    }
    dir
}

pub fn schema_validator() -> jsonschema::Validator {
    let schema: serde_json::Value = serde_json::from_str(ticketflow_report::json::SCHEMA).unwrap();
    assert!(
        jsonschema::meta::is_valid(&schema),
        "schemas/report.schema.json is not a valid JSON Schema"
    );
    jsonschema::validator_for(&schema).unwrap()
}

pub fn schema_errors(v: &jsonschema::Validator, doc: &serde_json::Value) -> Vec<String> {
    v.iter_errors(doc)
        .map(|e| format!("{} at {}", e, e.instance_path))
        .collect()
}

/// Checks `xml` against the shape of Jenkins' / Surefire's JUnit XSD (junit-10.xsd):
/// required elements and attributes, their order, numeric fields, and counts that add up.
pub fn junit_shape(xml: &str) -> Result<(), String> {
    let doc = roxmltree::Document::parse(xml).map_err(|e| format!("not XML: {e}"))?;
    let root = doc.root_element();
    if root.tag_name().name() != "testsuites" {
        return Err(format!(
            "root is <{}>, want <testsuites>",
            root.tag_name().name()
        ));
    }
    let num = |n: roxmltree::Node<'_, '_>, attr: &str| -> Result<u64, String> {
        n.attribute(attr)
            .ok_or_else(|| format!("<{}> lacks {attr}", n.tag_name().name()))?
            .parse::<u64>()
            .map_err(|_| format!("<{}> {attr} is not a count", n.tag_name().name()))
    };
    let secs = |n: roxmltree::Node<'_, '_>| -> Result<f64, String> {
        let t = n
            .attribute("time")
            .ok_or_else(|| format!("<{}> lacks time", n.tag_name().name()))?;
        match t.parse::<f64>() {
            Ok(v) if v >= 0.0 && !t.starts_with('-') => Ok(v),
            _ => Err(format!(
                "<{}> time {t:?} is not a non-negative decimal",
                n.tag_name().name()
            )),
        }
    };
    let (mut tests, mut failures, mut skipped) = (0, 0, 0);
    let suites: Vec<_> = root.children().filter(|n| n.is_element()).collect();
    if suites.is_empty() {
        return Err("no <testsuite>".into());
    }
    for suite in suites {
        if suite.tag_name().name() != "testsuite" {
            return Err(format!("<testsuites> holds <{}>", suite.tag_name().name()));
        }
        for attr in ["name", "timestamp", "hostname"] {
            if suite.attribute(attr).map_or(true, str::is_empty) {
                return Err(format!("<testsuite> lacks {attr}"));
            }
        }
        let ts = suite.attribute("timestamp").unwrap();
        let ts_ok = ts.len() == 19
            && ts.chars().enumerate().all(|(i, c)| match i {
                4 | 7 => c == '-',
                10 => c == 'T',
                13 | 16 => c == ':',
                _ => c.is_ascii_digit(),
            });
        if !ts_ok {
            return Err(format!(
                "timestamp {ts:?} is not an xs:dateTime without zone"
            ));
        }
        secs(suite)?;
        let order: Vec<&str> = suite
            .children()
            .filter(|n| n.is_element())
            .map(|n| n.tag_name().name())
            .collect();
        let cases = order.iter().filter(|n| **n == "testcase").count();
        let want: Vec<&str> = std::iter::once("properties")
            .chain(std::iter::repeat("testcase").take(cases))
            .chain(["system-out", "system-err"])
            .collect();
        if order != want {
            return Err(format!("<testsuite> children {order:?}, want {want:?}"));
        }
        let (mut f, mut s) = (0, 0);
        for case in suite.children().filter(|n| n.has_tag_name("testcase")) {
            for attr in ["name", "classname"] {
                if case.attribute(attr).map_or(true, str::is_empty) {
                    return Err(format!("<testcase> lacks {attr}"));
                }
            }
            secs(case)?;
            let kids: Vec<_> = case.children().filter(|n| n.is_element()).collect();
            match kids.as_slice() {
                [] => {}
                [k] if k.has_tag_name("failure") => {
                    if k.attribute("message").is_none() || k.attribute("type").is_none() {
                        return Err("<failure> lacks message or type".into());
                    }
                    f += 1;
                }
                [k] if k.has_tag_name("skipped") => s += 1,
                other => return Err(format!("<testcase> holds {} elements", other.len())),
            }
        }
        if num(suite, "tests")? != cases as u64
            || num(suite, "failures")? != f
            || num(suite, "skipped")? != s
            || num(suite, "errors")? != 0
        {
            return Err(format!(
                "suite {} counts do not add up",
                suite.attribute("name").unwrap()
            ));
        }
        tests += cases as u64;
        failures += f;
        skipped += s;
    }
    if num(root, "tests")? != tests
        || num(root, "failures")? != failures
        || num(root, "skipped")? != skipped
    {
        return Err("<testsuites> counts do not add up".into());
    }
    secs(root)?;
    Ok(())
}

#[test]
fn verify_writes_report_json_matching_its_schema_and_junit_of_the_ci_shape() {
    let dir = workdir(true);
    let nowhere = crate::support::UNREACHABLE_PG;
    // SQLite runs FAIL (wrong expectation) and PASS; PostgreSQL runs are PENDING: all three
    // verdicts appear in every output.
    let out = run_cli_in(
        dir.path(),
        &[
            "verify",
            "--pg-url",
            nowhere,
            "--filter",
            "a-same",
            "--filter",
            "z-wrong",
            "--filter",
            "property:fingerprint",
        ],
        b"",
    );
    assert_eq!(out.code, 1, "a FAIL exits 1\n{}{}", out.stdout, out.stderr);
    // Not a terminal: no progress bar on stderr.
    assert!(!out.stderr.contains("[00:"), "{}", out.stderr);

    let partial = dir.path().join("ticketflow-report/partial");
    let text = std::fs::read_to_string(partial.join("report.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let v = schema_validator();
    assert_eq!(schema_errors(&v, &doc), Vec::<String>::new());
    assert_eq!(doc["exit_code"], 1);
    assert_eq!(
        doc["schema_version"],
        ticketflow_report::json::SCHEMA_VERSION
    );
    let verdicts: Vec<&str> = doc["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["verdict"].as_str().unwrap())
        .collect();
    for want in ["PASS", "FAIL", "PENDING"] {
        assert!(verdicts.contains(&want), "{verdicts:?}");
    }
    let s = &doc["summary"];
    assert_eq!(
        s["pass"].as_u64().unwrap() + s["fail"].as_u64().unwrap() + s["pending"].as_u64().unwrap(),
        s["total"].as_u64().unwrap()
    );
    assert!(doc["not_selected"]
        .as_array()
        .unwrap()
        .iter()
        .any(|n| n == "kill-matrix"));

    // Negative controls: the schema rejects a wrong verdict, a missing field, a bad step.
    let mut bad = doc.clone();
    bad["items"][0]["verdict"] = "MAYBE".into();
    assert!(!schema_errors(&v, &bad).is_empty());
    let mut bad = doc.clone();
    bad.as_object_mut().unwrap().remove("summary");
    assert!(!schema_errors(&v, &bad).is_empty());
    let mut bad = doc.clone();
    // Steps live in report.steps.json; where a racer carries them, the schema checks each.
    bad["scenario_runs"][0]["racers"][0]["steps"] = serde_json::json!([
        {"what": "x", "call": {"op": "teleport"}, "started_us": 0, "finished_us": 0}
    ]);
    assert!(!schema_errors(&v, &bad).is_empty());

    let xml = std::fs::read_to_string(partial.join("report.junit.xml")).unwrap();
    junit_shape(&xml).unwrap();
    assert!(
        xml.contains("<failure ") && xml.contains("<skipped "),
        "{xml}"
    );
    // Negative controls: the shape check rejects counts that do not add up and a missing
    // attribute.
    let miscounted = xml.replacen("failures=\"", "failures=\"9", 1);
    assert!(junit_shape(&miscounted).is_err());
    let no_classname = xml.replace(" classname=\"", " class=\"");
    assert!(junit_shape(&no_classname).is_err());
}

#[test]
fn exit_codes_and_filter() {
    let dir = workdir(false);
    let nowhere = crate::support::UNREACHABLE_PG;
    // A given URL is required: its PENDING runs make the exit 3, the report is written.
    let pending = run_cli_in(
        dir.path(),
        &["verify", "--pg-url", nowhere, "--filter", "a-same"],
        b"",
    );
    assert_eq!(pending.code, 3, "{}{}", pending.stdout, pending.stderr);
    let partial = dir.path().join("ticketflow-report/partial");
    let md = std::fs::read_to_string(partial.join("REPORT.md")).unwrap();
    assert!(md.contains("**Partial run**"), "{md}");
    assert!(
        md.contains("not selected by --filter: property:fingerprint"),
        "{md}"
    );
    // PENDING comes before any verdict table.
    let pending = md.find("## PENDING: did not run").unwrap();
    let first_table = md.find("## Verdicts:").unwrap();
    assert!(pending < first_table && md.find("## What this cannot prove").unwrap() < first_table);
    assert!(md.contains("SQLite runs prove control flow only"), "{md}");

    let required = run_cli_in(
        dir.path(),
        &[
            "verify",
            "--pg-url",
            nowhere,
            "--filter",
            "a-same",
            "--require-postgres",
        ],
        b"",
    );
    assert_eq!(required.code, 3, "{}", required.stdout);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(partial.join("report.json")).unwrap())
            .unwrap();
    assert_eq!(json["exit_code"], 3);

    // An unwritable report path is a usage error found before anything runs: a folder that
    // cannot be created (its parent is a file), a path that is a folder.
    std::fs::write(dir.path().join("plain-file"), "").unwrap();
    for bad in ["plain-file/dir/REPORT.md", "scenarios"] {
        let out = run_cli_in(dir.path(), &["verify", "--report", bad], b"");
        assert_eq!(out.code, 2, "{bad}: {}{}", out.stdout, out.stderr);
        assert!(out.stderr.contains("--report"), "{}", out.stderr);
        assert!(out.stdout.is_empty(), "nothing ran: {}", out.stdout);
    }

    let nothing = run_cli_in(dir.path(), &["verify", "--filter", "no-such-thing"], b"");
    assert_eq!(nothing.code, 2, "{}", nothing.stderr);
    assert!(
        nothing.stderr.contains("selects nothing"),
        "{}",
        nothing.stderr
    );
}

fn shipped(name: &str) -> Scenario {
    Scenario::load(&repo_path(&format!("scenarios/{name}.toml")))
        .unwrap()
        .remove(0)
}

/// The report above the Environment section: what must not change between runs with the
/// same results.
fn tables(md: &str) -> &str {
    &md[..md.find("## Environment").unwrap()]
}

#[test]
fn verdict_tables_do_not_change_with_timings_pids_ids_or_seeds() {
    let Some(url) = pg_url() else { return };
    let s = shipped("f-forced-unique-violation");
    let run = run_postgres(&s, &PgOptions::new(crate::support::server(&url)));
    assert_eq!(run.verdict, Verdict::Pass, "{:?}", run.reason);
    // The same results with every incidental value changed: times shifted (order kept),
    // pids, scratch database, ticket ids (consistently), timings.
    let mut other = run.clone();
    let mut ids = std::collections::HashMap::new();
    let mut remap = |id: &mut uuid::Uuid| {
        *id = *ids.entry(*id).or_insert_with(uuid::Uuid::new_v4);
    };
    other.release_to_done_ms = Some(999.0);
    for r in &mut other.racers {
        r.done_after_release_ms = Some(5.0);
        r.backend_pid = r.backend_pid.map(|p| p + 1000);
        if let Ok(o) = &mut r.result {
            if let Some(id) = &mut o.ticket_id {
                remap(id);
            }
        }
        for step in &mut r.steps {
            step.started_us += 1_000_000;
            step.finished_us += 1_000_000;
            match &mut step.call {
                StoreCall::InsertTicket { ticket } => remap(&mut ticket.id),
                StoreCall::InsertOutbox { event } => remap(&mut event.aggregate_id),
                StoreCall::InsertReceipt { receipt } => remap(&mut receipt.ticket_id),
                StoreCall::FindTicket { id, .. } => remap(id),
                _ => {}
            }
        }
    }
    if let Some(Evidence::Postgres {
        controller_pid,
        database,
        barrier_reached_ms,
        waits,
        controller,
        ..
    }) = &mut other.evidence
    {
        *controller_pid += 1000;
        *database = "tf_other".into();
        *barrier_reached_ms = Some(123.0);
        controller.locked_us += 1_000_000;
        controller.released_us += 1_000_000;
        controller.all_waiting_us = controller.all_waiting_us.map(|t| t + 1_000_000);
        for w in waits {
            w.pid += 1000;
            w.waited_ms = 77.0;
            w.blocked_by = vec![*controller_pid];
        }
    }
    let changed = render_one(&s, other);
    let original = render_one(&s, run);
    assert_eq!(tables(&original), tables(&changed));
    assert!(
        original.contains("```mermaid\nsequenceDiagram"),
        "{original}"
    );
    assert!(original.contains("unique violation (23505)"), "{original}");
    assert!(original.contains("ROLLBACK TO SAVEPOINT"), "{original}");
    assert!(original.contains("COMMIT (barrier released)"), "{original}");
}

/// A report context for rendering in tests, with `command` as the command line.
pub fn test_ctx(command: &str) -> ticketflow_report::Context {
    ticketflow_report::Context {
        command: command.into(),
        pg_url: "postgres://x".into(),
        custom_pg_url: false,
        version: "0".into(),
        git_commit: None,
        generated_at: ticketflow_core::domain::iso8601(ticketflow_core::domain::now_utc()),
        filters: Vec::new(),
        narrowed_by: Vec::new(),
        seed: None,
        protocol: ticketflow_core::protocol::Protocol::Savepoint,
        timings: ticketflow_report::Timings::default(),
    }
}

/// REPORT.md for one run of `s`, nothing else, followed by its detail files.
fn render_one(s: &Scenario, run: ticketflow_harness::scenario::ScenarioRun) -> String {
    let loom = ticketflow_harness::killmatrix::LoomReport::default();
    let ctx = test_ctx("ticketflow verify");
    let runs = [run];
    let input = ticketflow_report::ReportInput {
        scenarios: std::slice::from_ref(s),
        runs: &runs,
        targets: &[],
        target_descriptions: &[],
        suites: &[],
        kill: None,
        loom: &loom,
        faults: None,
        soak: None,
        ctx: &ctx,
        specs: &[],
        not_selected: &[],
    };
    let mut text = ticketflow_report::render(&input);
    for (_, detail) in ticketflow_report::markdown::render_details(&input) {
        text.push_str(&detail);
    }
    text
}

/// `isolationtester` from PostgreSQL's client package
/// ([`ticketflow_harness::bench::tester::isolationtester`]).
pub(crate) fn isolationtester() -> std::path::PathBuf {
    ticketflow_harness::bench::tester::isolationtester()
        .expect("pg_config (PostgreSQL client package) is on PATH, or ISOLATIONTESTER is set")
}

/// Replays `spec` in a fresh scratch database; returns the tester's output.
fn replay(url: &str, spec: &str, label: &str) -> String {
    let config = ticketflow_core::store::url::parse_postgres(url).unwrap();
    let scratch = ScratchDatabase::create(pg::connect(&config).unwrap(), &config, label).unwrap();
    // libpq takes a postgres:// URI as its connection string.
    let conn = url_with_db(url, scratch.name()).unwrap();
    // A replay that waits on the wrong session fails in 60 s, not the tester's default 300 s.
    let mut child = Command::new(isolationtester())
        .env("PGISOLATIONTIMEOUT", "60")
        .arg(conn)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("isolationtester runs");
    use std::io::Write as _;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(spec.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    drop(scratch);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "isolationtester failed:\n{text}");
    text
}

/// The observer's row for tenant `t`: (tickets, receipts, created events).
fn replayed_counts(output: &str, tenant: &str) -> (i64, i64, i64) {
    let after = &output[output.rfind("step counts").expect("counts step ran")..];
    let line = after
        .lines()
        .find(|l| l.split('|').next().map(str::trim) == Some(tenant))
        .unwrap_or_else(|| panic!("no row for {tenant} in:\n{after}"));
    let n: Vec<i64> = line
        .split('|')
        .skip(1)
        .map(|x| x.trim().parse().unwrap())
        .collect();
    (n[0], n[1], n[2])
}

#[test]
fn an_exported_postgres_race_replays_in_the_isolation_tester() {
    let Some(url) = pg_url() else { return };
    let s = shipped("a-same-key-same-body");
    // A wrong implementation's failing race replays to the same wrong rows. Its racers are held
    // at the receipt INSERT, after every lookup, so the race fails by construction (held at the
    // lookup, a racer granted its lock after the other's commit replays)...
    let mut opts = PgOptions::new(crate::support::server(&url));
    opts.implementation = Implementation::Variant(Variant::CheckThenInsert);
    let bad = run_postgres(
        &crate::negative_controls::held_at_insert("a-same-key-same-body.toml"),
        &opts,
    );
    assert_eq!(bad.verdict, Verdict::Fail);
    let spec = isolation::render(&bad).unwrap();
    assert!(spec.contains("\npermutation c_lock "), "{spec}");
    let out = replay(&url, &spec, "iso_bad");
    assert!(
        out.contains("<waiting ...>"),
        "racers blocked on the barrier:\n{out}"
    );
    assert_eq!(replayed_counts(&out, "A"), (2, 2, 2), "{out}");

    // ...and the real protocol's race, forced through the unique violation, replays to one
    // of each with the loser's 23505 and rollback to the savepoint.
    let f = shipped("f-forced-unique-violation");
    let mut opts = PgOptions::new(crate::support::server(&url));
    opts.isolation = IsolationLevel::ReadCommitted;
    let good = run_postgres(&f, &opts);
    assert_eq!(good.verdict, Verdict::Pass, "{:?}", good.reason);
    let out = replay(&url, &isolation::render(&good).unwrap(), "iso_good");
    assert!(
        out.contains("duplicate key value violates unique constraint"),
        "{out}"
    );
    assert!(out.contains("ROLLBACK TO SAVEPOINT"), "{out}");
    for (tenant, c) in &good.rows {
        assert_eq!(
            replayed_counts(&out, tenant),
            (c.tickets, c.receipts, c.created_events),
            "{out}"
        );
    }

    // A SQLite run has no PostgreSQL timeline to export.
    let sqlite = ticketflow_harness::scenario::runner::run_sqlite(&s, &Default::default());
    assert!(isolation::render(&sqlite).is_err());
}

#[test]
fn junit_stays_well_formed_when_a_reason_holds_control_characters() {
    let s = shipped("a-same-key-same-body");
    let setting = ticketflow_harness::scenario::RunSetting::Postgres {
        isolation: IsolationLevel::ReadCommitted,
    };
    let mut run = ticketflow_harness::scenario::ScenarioRun::pending(
        &s,
        setting,
        "HTTP 500: \u{1}\u{1b}[31mboom\u{1b}[0m <&>".into(),
    );
    run.verdict = Verdict::Fail;
    let loom = ticketflow_harness::killmatrix::LoomReport::default();
    let ctx = test_ctx("ticketflow verify \u{7}");
    let runs = [run];
    let xml = ticketflow_report::junit::render(&ticketflow_report::ReportInput {
        scenarios: std::slice::from_ref(&s),
        runs: &runs,
        targets: &[],
        target_descriptions: &[],
        suites: &[],
        kill: None,
        loom: &loom,
        faults: None,
        soak: None,
        ctx: &ctx,
        specs: &[],
        not_selected: &[],
    });
    junit_shape(&xml).unwrap();
    assert!(xml.contains("\\u{1b}[31mboom"), "{xml}");
    // Negative control: the same character left raw is not XML.
    assert!(junit_shape("<testsuites tests=\"0\">\u{1}</testsuites>").is_err());
}

/// The options of a full `verify` run of the scenarios in `dir`, as the CLI builds them
/// without any option.
fn full_options(dir: &Path) -> ticketflow::verify::VerifyOptions {
    ticketflow::verify::VerifyOptions {
        scenarios: dir.join("scenarios"),
        pg: crate::support::server(ticketflow_core::store::url::DEFAULT_PG_URL),
        selection: ticketflow::verify::Selection {
            backends: ticketflow::verify::BackendChoice::Both.backends(),
            isolation: Vec::new(),
            sqlite: ticketflow_harness::scenario::RunSetting::sqlite_matrix(),
        },
        report: dir.join("REPORT.md"),
        require_postgres: false,
        retry: ticketflow_core::RetryPolicy::default(),
        seed: None,
        kill_matrix: true,
        restart_postgres: false,
        protocol: ticketflow_core::Protocol::default(),
        filters: Vec::new(),
        repeat: 1,
        progress: false,
        lease: Default::default(),
        require_redis: false,
        jobs: 1,
        force: false,
    }
}

/// Which options narrow a run ([`ticketflow::verify::narrowed_by`]) and where each run's
/// report goes: a full run into ticketflow-report/, a narrowed one into
/// ticketflow-report/partial/, `--update-report` only from a full run.
#[test]
fn every_narrowing_option_makes_a_partial_report_and_the_rest_do_not() {
    use ticketflow::verify::{narrowed_by, report_path, VerifyOptions};
    use ticketflow_core::store::postgres::IsolationLevel;
    use ticketflow_core::store::sqlite::{JournalMode, TxMode};
    let dir = tempfile::tempdir().unwrap();
    let full = full_options(dir.path());
    assert_eq!(narrowed_by(&full), Vec::<String>::new());
    let sqlite = |journals: &[JournalMode], txs: &[TxMode]| {
        journals
            .iter()
            .flat_map(|&journal| {
                txs.iter().map(
                    move |&tx| ticketflow_harness::scenario::RunSetting::Sqlite { journal, tx },
                )
            })
            .collect::<Vec<_>>()
    };
    type Change = Box<dyn Fn(&mut VerifyOptions)>;
    let narrowing: Vec<(&str, Change)> = vec![
        ("--filter", Box::new(|o| o.filters = vec!["a-same".into()])),
        ("--no-kill-matrix", Box::new(|o| o.kill_matrix = false)),
        (
            "--backend sqlite",
            Box::new(|o| o.selection.backends = vec![Backend::Sqlite]),
        ),
        (
            "--backend postgres",
            Box::new(|o| o.selection.backends = vec![Backend::Postgres]),
        ),
        (
            "--isolation",
            Box::new(|o| o.selection.isolation = vec![IsolationLevel::Serializable]),
        ),
        (
            "--sqlite-journal",
            Box::new(move |o| {
                o.selection.sqlite = sqlite(
                    &[JournalMode::Wal],
                    &[TxMode::Lazy, TxMode::Deferred, TxMode::Immediate],
                )
            }),
        ),
        (
            "--sqlite-tx",
            Box::new(move |o| {
                o.selection.sqlite =
                    sqlite(&[JournalMode::Wal, JournalMode::Delete], &[TxMode::Lazy])
            }),
        ),
        (
            "--protocol on-conflict",
            Box::new(|o| o.protocol = ticketflow_core::Protocol::OnConflict),
        ),
        (
            "--no-retry",
            Box::new(|o| o.retry = ticketflow_core::RetryPolicy::NONE),
        ),
        ("--max-attempts", Box::new(|o| o.retry.max_attempts = 3)),
    ];
    for (option, change) in &narrowing {
        let mut o = full.clone();
        change(&mut o);
        let by = narrowed_by(&o);
        assert_eq!(by, vec![option.to_string()], "{option}");
        assert_eq!(
            report_path(None, false, &by).unwrap(),
            Path::new("ticketflow-report/partial/REPORT.md"),
            "{option}"
        );
        let refused = report_path(None, true, &by).unwrap_err().to_string();
        assert!(
            refused.contains("--update-report") && refused.contains(option),
            "{option}: {refused}"
        );
    }
    // More runs, one more case, a fixed seed, another server or Redis, every level or mode
    // named: the same checks, so still a full run.
    let full_too: Vec<Change> = vec![
        Box::new(|o| o.repeat = 3),
        Box::new(|o| o.restart_postgres = true),
        Box::new(|o| o.seed = Some(7)),
        Box::new(|o| o.pg = crate::support::server("postgres://postgres@127.0.0.1:5433/postgres")),
        Box::new(|o| o.jobs = 4),
        Box::new(|o| o.require_postgres = true),
        Box::new(|o| o.selection.isolation = IsolationLevel::ALL.to_vec()),
        Box::new(|o| o.selection.backends = Vec::new()),
        Box::new(|o| o.selection.sqlite = Vec::new()),
    ];
    for change in &full_too {
        let mut o = full.clone();
        change(&mut o);
        assert_eq!(narrowed_by(&o), Vec::<String>::new(), "{o:?}");
    }
    let none: &[String] = &[];
    assert_eq!(
        report_path(None, false, none).unwrap(),
        Path::new("ticketflow-report/REPORT.md")
    );
    assert_eq!(
        report_path(None, true, none).unwrap(),
        Path::new("REPORT.md")
    );
    assert!(report_path(Some(Path::new("x.md")), true, none).is_err());
    assert_eq!(
        report_path(Some(Path::new("x.md")), false, &["--no-kill-matrix".into()]).unwrap(),
        Path::new("x.md")
    );
}

/// An ordinary `verify` never touches the tracked REPORT.md, and a narrowed one never the full
/// report: it writes ticketflow-report/partial/. Only `--update-report` writes REPORT.md, from a
/// full run only: it refuses `--report` and every narrowing option, naming it, before anything
/// runs. (Where a full run without `--update-report` writes: see
/// `every_narrowing_option_makes_a_partial_report_and_the_rest_do_not` and
/// `cli::verify_lines_add_up_to_the_total_and_name_every_count`.)
#[test]
fn only_update_report_writes_the_tracked_report_and_never_from_a_partial_run() {
    let dir = workdir(false);
    let tracked = dir.path().join("REPORT.md");
    std::fs::write(&tracked, "the committed evidence\n").unwrap();
    let out_dir = dir.path().join("ticketflow-report");
    std::fs::create_dir(&out_dir).unwrap();
    std::fs::write(out_dir.join("REPORT.md"), "the last full report\n").unwrap();
    let run = |args: &[&str]| run_cli_in(dir.path(), &[&["verify"], args].concat(), b"");
    // Narrowed without --filter: it once replaced the full report.
    let narrowed = run(&[
        "--backend",
        "sqlite",
        "--sqlite-journal",
        "wal",
        "--sqlite-tx",
        "lazy",
        "--no-kill-matrix",
    ]);
    assert_eq!(narrowed.code, 0, "{}{}", narrowed.stdout, narrowed.stderr);
    assert!(
        narrowed
            .stdout
            .contains("report written to ticketflow-report/partial/REPORT.md"),
        "{}",
        narrowed.stdout
    );
    let partial = out_dir.join("partial");
    let partial_md = std::fs::read_to_string(partial.join("REPORT.md")).unwrap();
    assert!(
        partial_md.contains(
            "**Partial run**: narrowed by `--no-kill-matrix`, `--backend sqlite`, \
             `--sqlite-journal`, `--sqlite-tx`"
        ),
        "{partial_md}"
    );
    // The partial run left the full report and the tracked one alone.
    assert_eq!(
        std::fs::read_to_string(out_dir.join("REPORT.md")).unwrap(),
        "the last full report\n"
    );
    assert_eq!(
        std::fs::read_to_string(&tracked).unwrap(),
        "the committed evidence\n"
    );
    // Detail lives in linked files: every link into reports/details/ resolves, and the
    // scenario's file holds its racers and checks, which REPORT.md does not.
    let links: Vec<&str> = partial_md
        .split("](")
        .skip(1)
        .filter_map(|rest| rest.split(')').next())
        .filter(|l| l.starts_with("reports/details/"))
        .collect();
    assert!(links.len() >= 2, "{partial_md}");
    for link in &links {
        let file = link.split('#').next().unwrap_or(link);
        assert!(partial.join(file).is_file(), "dead link {link}");
    }
    // The verdict tables link each scenario to its detail file: REPORT.md has no scenario
    // headings for in-page anchors to land on.
    assert!(!partial_md.contains("](#"), "{partial_md}");
    assert!(
        partial_md
            .contains("[a-same-key-same-body](reports/details/scenario-a-same-key-same-body.md)"),
        "{partial_md}"
    );
    let detail =
        std::fs::read_to_string(partial.join("reports/details/scenario-a-same-key-same-body.md"))
            .unwrap();
    assert!(detail.contains("Reproduce:") && !partial_md.contains("Reproduce:"));
    // report.json is compact and holds no steps; report.steps.json has them.
    let json = std::fs::read_to_string(partial.join("report.json")).unwrap();
    assert_eq!(json.lines().count(), 1);
    assert!(!json.contains("\"steps\""));
    let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        doc["narrowed_by"],
        serde_json::json!([
            "--no-kill-matrix",
            "--backend sqlite",
            "--sqlite-journal",
            "--sqlite-tx"
        ])
    );
    let steps: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(partial.join("report.steps.json")).unwrap())
            .unwrap();
    assert!(steps
        .as_array()
        .unwrap()
        .iter()
        .any(|r| !r["steps"].as_array().unwrap().is_empty()));

    for (refused, names) in [
        (vec!["--filter", "a-same"], "--filter"),
        (vec!["--no-kill-matrix"], "--no-kill-matrix"),
        (vec!["--backend", "sqlite"], "--backend sqlite"),
        (vec!["--backend", "postgres"], "--backend postgres"),
        (vec!["--isolation", "serializable"], "--isolation"),
        (vec!["--sqlite-journal", "delete"], "--sqlite-journal"),
        (vec!["--sqlite-tx", "immediate"], "--sqlite-tx"),
        (vec!["--protocol", "on-conflict"], "--protocol on-conflict"),
        (vec!["--no-retry"], "--no-retry"),
        (vec!["--max-attempts", "2"], "--max-attempts"),
        (vec!["--report", "elsewhere.md"], "--report"),
    ] {
        let out = run(&[&["--update-report"], &refused[..]].concat());
        assert_eq!(out.code, 2, "{refused:?}: {}", out.stderr);
        assert!(
            out.stderr.contains("--update-report") && out.stderr.contains(names),
            "{refused:?}: {}",
            out.stderr
        );
        assert!(out.stdout.is_empty(), "nothing ran: {}", out.stdout);
    }
    // A full run (every part, both backends; a Redis database of its own for the kill
    // matrix's lease gate) rewrites the tracked report, and only it.
    let update = run(&[
        "--update-report",
        "--lease",
        "redis://127.0.0.1:6379/13",
        "--seed",
        "1",
    ]);
    assert_eq!(update.code, 0, "{}{}", update.stdout, update.stderr);
    let written = std::fs::read_to_string(&tracked).unwrap();
    assert!(
        written.starts_with("# TicketFlow Verify report") && !written.contains("Partial run"),
        "{written}"
    );
    assert!(dir.path().join("reports/details").is_dir());
    assert_eq!(
        std::fs::read_to_string(out_dir.join("REPORT.md")).unwrap(),
        "the last full report\n"
    );
    assert_eq!(
        std::fs::read_to_string(partial.join("REPORT.md")).unwrap(),
        partial_md
    );
}

/// `scripts/loom.sh` writes the gitignored ticketflow-report/loom.json, and the tracked
/// reports/loom.json only with `--update-report` (run against a copy of the repository's
/// sources, with a stand-in `cargo` that reports one model).
#[test]
fn the_loom_script_touches_the_tracked_summary_only_when_asked() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("scripts")).unwrap();
    std::fs::copy(
        repo_path("scripts/loom.sh"),
        root.path().join("scripts/loom.sh"),
    )
    .unwrap();
    for f in ticketflow_harness::killmatrix::LOOM_SOURCES {
        let to = root.path().join(f);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(repo_path(f), to).unwrap();
    }
    let bin = root.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let cargo = bin.join("cargo");
    std::fs::write(
        &cargo,
        "#!/bin/sh\necho '{\"expected\":\"pass\",\"name\":\"m\",\"result\":\"pass\"}' >> \"$TICKETFLOW_LOOM_REPORT\"\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&cargo, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let loom = |args: &[&str]| {
        let out = std::process::Command::new(root.path().join("scripts/loom.sh"))
            .args(args)
            .env("PATH", &path)
            .env_remove("CARGO_TARGET_DIR")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let tracked = root.path().join("reports/loom.json");
    let own = root.path().join("ticketflow-report/loom.json");
    loom(&[]);
    assert!(own.exists() && !tracked.exists());
    std::fs::remove_file(&own).unwrap();
    loom(&["some_filter"]);
    assert!(
        !own.exists() && !tracked.exists(),
        "a filtered run writes nothing"
    );
    loom(&["--update-report"]);
    assert!(tracked.exists() && !own.exists());
}
