use std::path::Path;

use super::target::check_count_command;
use super::*;
use crate::scenario::ScenarioError;

const OK: &str = r#"
name = "t"
description = "d"
[barrier]
kind = "table-lock"
table = "orders"
[target]
base_urls = ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
database_url = "${DB}"
[target.request]
path = "/orders"
headers = { Authorization = "Bearer ${TOKEN}" }
body = { item = "book", note = "{run}-{racer}" }
[[target.rules]]
status = 409
body_regex = "in progress"
outcome = "in-progress"
[target.count]
orders = "SELECT count(*) FROM orders WHERE key = {key}"
[[racers]]
name = "c"
count = 2
key = "k1"
[[expect.counts]]
key = "k1"
orders = 1
"#;

fn env(n: &str) -> Option<String> {
    match n {
        "DB" => Some("postgres://u@h/d".into()),
        "TOKEN" => Some("s3cret".into()),
        _ => None,
    }
}

fn parse(text: &str) -> Result<TargetScenario, ScenarioError> {
    TargetScenario::parse(Path::new("t.toml"), text, &env)
}

#[test]
fn a_full_target_loads_with_its_defaults() {
    let s = parse(OK).unwrap();
    assert_eq!(s.target.database_url.as_deref(), Some("postgres://u@h/d"));
    assert_eq!(s.target.request.headers[0].1, "Bearer s3cret");
    assert_eq!(s.target.request.key, DEFAULT_KEY_TEMPLATE);
    assert_eq!(s.target.preset, Preset::Ietf);
    // The scenario's rule comes before the preset's.
    assert_eq!(s.target.rules[0].outcome, AnswerKind::InProgress);
    assert!(s.target.rules[0].origin.starts_with("t.toml:"));
    assert!(s.target.replay.marked);
    assert_eq!(s.racers.len(), 2);
    assert_eq!(s.counts[0].values["orders"], 1);
    assert_eq!(
        s.target.counts[0].bound_sql,
        "SELECT count(*) FROM orders WHERE key = $1::text"
    );
    assert_eq!(s.target.counts[0].params, ["key"]);
}

/// Every bad input is an error with the line it is on.
#[test]
fn bad_input_names_the_line() {
    let cases = [
        ("unset variable", "${TOKEN}", "${NOPE}", "NOPE"),
        (
            "malformed pointer",
            "[[racers]]",
            "[target.id]\npointer = \"id\"\n[[racers]]",
            "RFC 6901",
        ),
        (
            "bad regex",
            "\"in progress\"",
            "\"(unclosed\"",
            "invalid regex",
        ),
        (
            "unknown placeholder",
            "{run}-{racer}",
            "{bogus}",
            "unknown placeholder",
        ),
        (
            "unknown field",
            "kind = \"table-lock\"",
            "kind = \"table-lock\"\nbogus = 1",
            "unknown field",
        ),
        ("bad status", "status = 409", "status = \"9xx\"", "status"),
        ("unknown count", "orders = 1", "order = 1", "not a query"),
        (
            "count needs its key",
            "key = \"k1\"\norders = 1",
            "orders = 1",
            "give key",
        ),
        (
            "https",
            "http://127.0.0.1:8002",
            "https://127.0.0.1:8002",
            "http://",
        ),
        (
            "unknown via",
            "count = 2",
            "count = 2\nvia = \"api-z\"",
            "not a service",
        ),
        (
            "scope without scopes",
            "count = 2",
            "count = 2\nscope = \"A\"",
            "no [[target.scopes]]",
        ),
        (
            "barrier kind",
            "kind = \"table-lock\"",
            "kind = \"telepathy\"",
            "expected table-lock",
        ),
        (
            "odd table",
            "table = \"orders\"",
            "table = \"orders; DROP TABLE x\"",
            "plain",
        ),
    ];
    for (what, from, to, needle) in cases {
        let text = OK.replacen(from, to, 1);
        assert_ne!(text, OK, "{what}: nothing replaced");
        let e = parse(&text).unwrap_err();
        assert!(e.line.is_some(), "{what}: {e}");
        assert!(e.to_string().contains(needle), "{what}: {e}");
    }
}

#[test]
fn a_raw_json_body_that_is_not_json_is_refused_and_text_is_not_checked() {
    let raw = |ct: &str| {
        OK.replace(
            "body = { item = \"book\", note = \"{run}-{racer}\" }",
            &format!("raw = '{{{{\"item\": \"{{run}}\",'\ncontent_type = \"{ct}\""),
        )
    };
    let e = parse(&raw("application/json")).unwrap_err();
    assert!(e.message.contains("not JSON") && e.line.is_some(), "{e}");
    assert!(parse(&raw("text/plain")).is_ok());
}

#[test]
fn a_rule_set_that_classifies_nothing_as_created_is_refused() {
    let text = OK.replace("[target.request]", "preset = \"none\"\n[target.request]");
    let e = parse(&text).unwrap_err();
    assert!(e.message.contains("created"), "{e}");
    assert!(e.line.is_some());
}

/// `OK` with a Redis count `effects` (written as `count`) expected for key k1, and
/// `redis_url` when `with_url`.
fn with_redis_count(count: &str, with_url: bool) -> String {
    let text = OK
        .replacen(
            "[target.count]\n",
            &format!("[target.count]\neffects = {count}\n"),
            1,
        )
        .replacen("orders = 1\n", "orders = 1\neffects = 1\n", 1);
    if with_url {
        text.replacen(
            "[target.request]",
            "redis_url = \"redis://127.0.0.1:6379/11\"\n[target.request]",
            1,
        )
    } else {
        text
    }
}

#[test]
fn a_redis_count_is_a_read_only_command_with_bound_placeholders() {
    for written in [
        r#"{ redis = ["scard", "orders:{key}"] }"#,
        r#"{ redis = "SCARD orders:{key}" }"#,
    ] {
        let s = parse(&with_redis_count(written, true)).unwrap();
        let q = s
            .target
            .counts
            .iter()
            .find(|q| q.name == "effects")
            .unwrap();
        assert_eq!(
            q.redis.as_deref(),
            Some(&["SCARD".to_string(), "orders:{key}".to_string()][..]),
            "{written}"
        );
        assert_eq!(q.params, ["key"]);
        assert_eq!(s.counts[0].values["effects"], 1);
    }
}

#[test]
fn a_redis_count_is_refused_without_redis_url_or_with_a_command_that_writes() {
    let cases = [
        (
            r#"{ redis = "GET effects:{key}" }"#,
            false,
            "needs [target] redis_url",
        ),
        (
            r#"{ redis = "INCR effects:{key}" }"#,
            true,
            "not a read-only count command",
        ),
        (
            r#"{ redis = ["DEL", "effects:{key}"] }"#,
            true,
            "not a read-only count command",
        ),
        (r#"{ redis = "" }"#, true, "empty"),
        (
            r#"{ redis = "GET e:{racer}" }"#,
            true,
            "only {scope}, {key} and {run}",
        ),
        (r#"{ sql = "SELECT 1" }"#, true, "unknown field"),
        ("3", true, "expected SQL text or a table"),
    ];
    for (written, with_url, needle) in cases {
        let e = parse(&with_redis_count(written, with_url)).unwrap_err();
        assert!(e.line.is_some(), "{written}: {e}");
        assert!(e.to_string().contains(needle), "{written}: {e}");
    }
}

#[test]
fn the_redis_pause_barrier_needs_redis_url_and_no_database() {
    let pause = |url: bool| {
        let text = OK
            .replacen(
                "kind = \"table-lock\"\ntable = \"orders\"",
                "kind = \"redis-pause\"",
                1,
            )
            .replacen("database_url = \"${DB}\"\n", "", 1)
            .replacen(
                "[target.count]\norders = \"SELECT count(*) FROM orders WHERE key = {key}\"\n",
                "[target.count]\norders = { redis = \"GET orders:{key}\" }\n",
                1,
            );
        if url {
            text.replacen(
                "[target.request]",
                "redis_url = \"redis://127.0.0.1:6379/11\"\n[target.request]",
                1,
            )
        } else {
            text
        }
    };
    let s = parse(&pause(true)).unwrap();
    assert_eq!(s.barrier.kind, BarrierKind::RedisPause);
    assert!(!s.barrier.kind.needs_database());
    assert!(s.barrier.kind.describe().contains("reads were not held"));
    let e = parse(&pause(false)).unwrap_err();
    assert!(e.line.is_some(), "{e}");
    assert!(e.to_string().contains("needs [target] redis_url"), "{e}");
}

const INTERPOSED: &str = r#"
name = "t"
description = "d"
[barrier]
kind = "interposer"
[target]
own_service = true
lock_ttl_ms = 2000
[target.request]
path = "/v1/tickets"
body = { title = "x" }
[[target.service]]
name = "api"
command = ["{ticketflow}", "serve", "--database-url", "{database_url}"]
[[racers]]
name = "r"
count = 2
[[fault]]
racer = "r-2"
match = "COMMIT"
cut = "after"
"#;

// Long because it is a table: one good fault read back, then each way a `[[fault]]` can be
// wrong refused with its own line, all on the one interposed sample file.
#[test]
fn a_fault_names_its_racer_step_and_cut_and_bad_ones_name_their_line() {
    let s = parse(INTERPOSED).unwrap();
    assert_eq!(s.target.lock_ttl_ms, Some(2000));
    assert_eq!(s.faults.len(), 1);
    let f = &s.faults[0];
    assert_eq!((f.racer, f.cut, f.store), (1, Cut::After, None));
    assert_eq!(f.at, FaultAt::Match("COMMIT".into()));
    assert_eq!(
        f.describe(&s, &f.at),
        "cut after r-2's step matching \"COMMIT\""
    );
    // A letter names the scenario's racer in file order.
    let by_letter = parse(&INTERPOSED.replace("racer = \"r-2\"", "racer = \"A\"")).unwrap();
    assert_eq!(by_letter.faults[0].racer, 0);
    let cases = [
        (
            "no such racer",
            "racer = \"r-2\"",
            "racer = \"zed\"",
            "neither a racer",
        ),
        (
            "a letter past the racers",
            "racer = \"r-2\"",
            "racer = \"C\"",
            "A to B",
        ),
        (
            "a group of two",
            "racer = \"r-2\"",
            "racer = \"r\"",
            "group of 2",
        ),
        (
            "step and match",
            "match = \"COMMIT\"",
            "match = \"COMMIT\"\nstep = 2",
            "exactly one of",
        ),
        ("neither", "match = \"COMMIT\"\n", "", "exactly one of"),
        ("step 0", "match = \"COMMIT\"", "step = 0", "from 1"),
        (
            "empty match",
            "match = \"COMMIT\"",
            "match = \" \"",
            "empty",
        ),
        ("no cut", "cut = \"after\"", "", "needs cut"),
        (
            "a bad cut",
            "cut = \"after\"",
            "cut = \"during\"",
            "unknown variant",
        ),
        (
            "redis without redis_url",
            "cut = \"after\"",
            "cut = \"after\"\nstore = \"redis\"",
            "redis_url",
        ),
        (
            "an unknown store",
            "cut = \"after\"",
            "cut = \"after\"\nstore = \"mysql\"",
            "expected postgres or redis",
        ),
        (
            "two on one racer",
            "cut = \"after\"\n",
            "cut = \"after\"\n[[fault]]\nracer = \"B\"\nstep = 1\ncut = \"before\"\n",
            "one per racer",
        ),
        (
            "each with another",
            "cut = \"after\"\n",
            "cut = \"after\"\n[[fault]]\nracer = \"A\"\neach = true\ncut = \"before\"\n",
            "only [[fault]]",
        ),
        (
            "first point",
            "kind = \"interposer\"",
            "kind = \"interposer\"\n[schedule]\nmode = \"first-point\"",
            "one at a time",
        ),
        (
            "a zero TTL",
            "lock_ttl_ms = 2000",
            "lock_ttl_ms = 0",
            "at least 1",
        ),
    ];
    for (what, from, to, needle) in cases {
        let text = INTERPOSED.replacen(from, to, 1);
        assert_ne!(text, INTERPOSED, "{what}: nothing replaced");
        let e = parse(&text).unwrap_err();
        assert!(e.line.is_some(), "{what}: {e}");
        assert!(e.to_string().contains(needle), "{what}: {e}");
    }
    // Faults are cut at the interposer: with another barrier they are refused.
    let e = parse(&OK.replace(
        "[[racers]]",
        "[[fault]]\nracer = \"A\"\nstep = 1\ncut = \"before\"\n[[racers]]",
    ))
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("goes with [barrier] kind = \"interposer\""),
        "{e}"
    );
    assert!(e.line.is_some());
}

#[test]
fn a_black_box_scenario_name_is_a_slug_checked_at_load() {
    let first = OK.lines().find(|l| l.starts_with("name = ")).unwrap();
    for bad in ["../../../../x", "", "two words"] {
        let e = parse(&OK.replacen(first, &format!("name = {bad:?}"), 1)).unwrap_err();
        assert!(e.message.contains("scenario name"), "{bad:?}: {e}");
    }
}

#[test]
fn target_files_are_told_from_library_scenarios() {
    assert!(is_target_file(OK));
    assert!(!is_target_file("name = \"x\"\n[[racers]]\nname = \"r\"\n"));
}

#[test]
fn a_running_interposer_is_named_by_a_loopback_control_address_with_base_urls_and_database_url() {
    let interposed = OK
        .replace(
            "kind = \"table-lock\"\ntable = \"orders\"",
            "kind = \"interposer\"",
        )
        .replace(
            "database_url = \"${DB}\"",
            "database_url = \"${DB}\"\ninterposer = \"127.0.0.1:7000\"",
        );
    let s = parse(&interposed).unwrap();
    assert_eq!(s.target.interposer, Some("127.0.0.1:7000".parse().unwrap()));
    assert!(s.schedule.is_some());
    let cases = [
        (
            "off loopback",
            "127.0.0.1:7000",
            "10.0.0.1:7000",
            "loopback IP:PORT",
        ),
        ("no port", "127.0.0.1:7000", "127.0.0.1", "loopback IP:PORT"),
        (
            "without database_url",
            "database_url = \"${DB}\"\n",
            "",
            "goes with base_urls",
        ),
        (
            "another barrier",
            "kind = \"interposer\"",
            "kind = \"http\"",
            "goes with [barrier] kind",
        ),
    ];
    for (what, from, to, expected) in cases {
        assert!(interposed.contains(from), "{what}");
        let e = parse(&interposed.replacen(from, to, 1))
            .unwrap_err()
            .to_string();
        assert!(e.contains(expected), "{what}: {e}");
    }
    // Without it, the interposer barrier still needs services the runner starts.
    let e = parse(&interposed.replace("interposer = \"127.0.0.1:7000\"\n", ""))
        .unwrap_err()
        .to_string();
    assert!(e.contains("[target] interposer"), "{e}");
}

#[test]
fn only_read_only_commands_are_accepted_and_their_names_upper_cased() {
    let ok = check_count_command(&["scard".into(), "orders:{key}".into()]).unwrap();
    assert_eq!(ok, ["SCARD", "orders:{key}"]);
    for bad in [
        "SET", "INCR", "DEL", "EVAL", "FLUSHDB", "CONFIG", "GETDEL", "KEYS",
    ] {
        let e = check_count_command(&[bad.into(), "k".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a read-only count command"), "{e}");
    }
    assert!(check_count_command(&[]).is_err());
}

#[test]
fn a_uuid_key_is_one_uuid_per_logical_key_and_run() {
    let text = OK
        .replace("path = \"/orders\"", "path = \"/orders\"\nkey = \"{uuid}\"")
        .replace(
            "[[expect.counts]]",
            "[[racers]]\nname = \"other\"\nkey = \"k2\"\n\n[[expect.counts]]",
        );
    let s = parse(&text).expect("loads");
    let key = |i: usize, run: &str| {
        let r = super::request::build_request(&s, &s.racers[i], "http://x", run);
        r.headers
            .iter()
            .find(|(n, _)| n == "Idempotency-Key")
            .map(|(_, v)| v.clone())
            .expect("a key header")
    };
    // The two racers of k1 share one UUID; k2 and another run have their own.
    assert_eq!(key(0, "r1"), key(1, "r1"));
    assert_ne!(key(0, "r1"), key(2, "r1"));
    assert_ne!(key(0, "r1"), key(0, "r2"));
    assert!(uuid::Uuid::parse_str(&key(0, "r1")).is_ok());
}
