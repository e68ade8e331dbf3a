//! Inputs checked before anything runs: a schedule id's letters name racers; the interposer's
//! upstream comes from the environment, stays on this host unless allowed, and never asks for
//! TLS; a scenario file that is not UTF-8 or is cut inside `[[racers]]` is a load error.

use std::path::Path;
use std::time::Duration;

use super::run_for;

/// Two racers on a running service behind `ticketflow interpose` at a control address where
/// nothing listens.
const INTERPOSED: &str = r#"
name = "interposed"
description = "two racers"
[barrier]
kind = "interposer"
[target]
base_urls = ["http://127.0.0.1:9"]
database_url = "postgres://postgres@127.0.0.1:5432/postgres"
interposer = "127.0.0.1:1"
preset = "ticketflow"
[target.request]
path = "/v1/tickets"
body = { a = 1 }
[target.count]
tickets = "SELECT count(*) FROM tickets WHERE idempotency_key = {key}"
[[racers]]
name = "r"
count = 2
key = "key-1"
[[expect.counts]]
key = "key-1"
tickets = 1
"#;

#[test]
fn a_schedule_letter_that_names_no_racer_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("i.toml"), INTERPOSED).unwrap();
    let r = run_for(
        dir.path(),
        &["scenario", "run", "i.toml", "--schedule", "ABZZZ"],
        &[],
        Duration::from_secs(60),
    );
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert!(
        r.stderr.contains("'Z'") && r.stderr.contains("2 racers") && r.stderr.contains("A, B"),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("nothing answers"), "{}", r.stderr);
}

#[test]
fn the_interposers_upstream_comes_from_the_environment_and_stays_on_this_host_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let token = |name: &str| dir.path().join(name).display().to_string();
    // No URL on the command line: the environment's, its password never printed.
    let t = token("env.token");
    let r = run_for(
        dir.path(),
        &["interpose", "--control-token-file", &t],
        &[(
            "TICKETFLOW_INTERPOSE_POSTGRES",
            "postgres://app:pw-in-env@127.0.0.1:5432/shop",
        )],
        Duration::from_secs(4),
    );
    assert!(
        r.stdout.contains("ready:") && !r.stdout.contains("pw-in-env"),
        "{r:?}"
    );
    // Off this host: refused without the flag, naming it and why.
    let remote = "postgres://app@192.0.2.10:5432/shop";
    let r = run_for(
        dir.path(),
        &["interpose", "--postgres", remote],
        &[],
        Duration::from_secs(20),
    );
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(
        r.stderr.contains("--allow-remote-upstream") && r.stderr.contains("plain text"),
        "{}",
        r.stderr
    );
    // With it: it serves, and warns that the relay is plain text.
    let t = token("remote.token");
    let r = run_for(
        dir.path(),
        &[
            "interpose",
            "--postgres",
            remote,
            "--allow-remote-upstream",
            "--control-token-file",
            &t,
        ],
        &[],
        Duration::from_secs(4),
    );
    assert!(
        r.stdout.contains("ready:") && r.stderr.contains("plain text"),
        "{r:?}"
    );
}

#[test]
fn an_upstream_that_asks_for_tls_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    for mode in ["require", "verify-ca", "verify-full"] {
        let url = format!("postgres://app@127.0.0.1:5432/shop?sslmode={mode}");
        let r = run_for(
            dir.path(),
            &["interpose", "--postgres", &url],
            &[],
            Duration::from_secs(20),
        );
        assert_eq!(r.code, Some(2), "{mode}: {r:?}");
        assert!(
            r.stderr.contains(&format!("sslmode={mode}")) && r.stderr.contains("cannot do TLS"),
            "{}",
            r.stderr
        );
    }
}

/// `scenario run FILE` in `dir` on the bytes `text`: its exit code and stderr.
fn run_file(dir: &Path, name: &str, text: &[u8]) -> (Option<i32>, String) {
    std::fs::write(dir.join(name), text).unwrap();
    let r = run_for(
        dir,
        &["scenario", "run", name, "--backend", "sqlite"],
        &[],
        Duration::from_secs(60),
    );
    (r.code, r.stderr)
}

#[test]
fn a_scenario_file_that_is_not_utf8_is_a_load_error_with_its_byte_and_line() {
    let dir = tempfile::tempdir().unwrap();
    // Byte 29 (0-based) is the first that is not UTF-8, on line 2.
    let text = b"name = \"x\"\ndescription = \"caf\xe9\"\n";
    for name in ["library.toml", "target.toml"] {
        let mut bytes = text.to_vec();
        if name == "target.toml" {
            bytes.extend_from_slice(b"[target]\nbase_urls = [\"http://127.0.0.1:9\"]\n");
        }
        let (code, stderr) = run_file(dir.path(), name, &bytes);
        assert_eq!(code, Some(2), "{stderr}");
        assert!(
            stderr.contains(&format!("{name}:2"))
                && stderr.contains("not UTF-8")
                && stderr.contains("byte 29"),
            "{stderr}"
        );
    }
}
