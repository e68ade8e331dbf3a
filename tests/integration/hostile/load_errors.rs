//! Template and URL errors in a scenario file are load errors (exit 2, file:line, nothing sent);
//! a PostgreSQL URL with no host is exit 2 in every command.

use std::net::TcpListener;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ticketflow_harness::blackbox::TargetScenario;

use crate::support::repo_path;

/// A black-box file whose request, scope and racer carry the marked parts.
const TEMPLATED: &str = r#"
name = "templated"
description = "d"
[barrier]
kind = "http"
[target]
base_urls = ["@BASE@"]
preset = "ietf"
[target.request]
path = "@PATH@"
key_header = "@KEYHDR@"
headers = { X-Trace = "@HDR@" }
body = { a = 1 }
[[target.scopes]]
name = "A"
value = "@SCOPE@"
headers = { X-Tenant = "{scope}" }
[[racers]]
name = "client"
count = 2
scope = "A"
key = "@KEY@"
"#;

/// [`TEMPLATED`] with every marked part valid, then `swaps` applied (marker, value).
fn templated(swaps: &[(&str, &str)]) -> String {
    let mut text = TEMPLATED.to_string();
    for (marker, value) in swaps {
        text = text.replacen(marker, value, 1);
    }
    for (marker, value) in [
        ("@BASE@", "http://127.0.0.1:9"),
        ("@PATH@", "/things/{run}"),
        ("@KEYHDR@", "Idempotency-Key"),
        ("@HDR@", "t-{racer}"),
        ("@SCOPE@", "A-{run}"),
        ("@KEY@", "k1"),
    ] {
        text = text.replacen(marker, value, 1);
    }
    text
}

fn load_error(text: &str, env: &dyn Fn(&str) -> Option<String>) -> String {
    match TargetScenario::parse(Path::new("t.toml"), text, env) {
        Ok(_) => panic!("loaded:\n{text}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn template_and_url_errors_name_their_line_at_load() {
    let none = |_: &str| None;
    TargetScenario::parse(Path::new("t.toml"), &templated(&[]), &none)
        .unwrap_or_else(|e| panic!("the valid file: {e}"));
    let cases: [(&str, &str, &str); 11] = [
        ("@HDR@", r#"a\r\nInjected: 1"#, "X-Trace"),
        ("@HDR@", r#"bell\u0007"#, "X-Trace"),
        ("@HDR@", "${SECRET}", "X-Trace"),
        ("@SCOPE@", r#"A\r\nX-Evil: 1"#, "X-Tenant"),
        ("@KEY@", r#"k\r\n1"#, "Idempotency-Key"),
        ("@PATH@", r#"/things\r\nX-Evil: 1"#, "path"),
        ("@PATH@", "/a b", "path"),
        ("@BASE@", "http://127.0.0.1:notaport", "127.0.0.1:notaport"),
        ("@BASE@", "http://exa mple", "exa mple"),
        ("@KEYHDR@", "Host", "Host"),
        ("@KEYHDR@", "Bad Header", "Bad Header"),
    ];
    let env = |n: &str| (n == "SECRET").then(|| "s3cret\r\nX-Evil: 1".to_string());
    let e = load_error(&templated(&[("@PATH@", "/p?k=${SECRET}")]), &env);
    assert!(e.contains("request path") && !e.contains("s3cret"), "{e}");
    for (marker, value, named) in cases {
        let e = load_error(&templated(&[(marker, value)]), &env);
        assert!(e.contains("t.toml:"), "{marker} = {value}: no line in: {e}");
        assert!(
            e.contains(named),
            "{marker} = {value}: {named:?} not in: {e}"
        );
        assert!(!e.contains("s3cret"), "a secret in: {e}");
    }
    let e = load_error(&templated(&[]).replace("X-Trace", "Content-Length"), &none);
    assert!(e.contains("Content-Length") && e.contains("t.toml:"), "{e}");
}

/// A listener that counts the connections made to it.
fn counting_listener() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            counter.fetch_add(1, Ordering::SeqCst);
            drop(conn);
        }
    });
    (base, seen)
}

#[test]
fn a_crlf_in_a_header_is_exit_2_with_its_line_and_nothing_is_sent() {
    let (base, seen) = counting_listener();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("t.toml");
    std::fs::write(
        &file,
        templated(&[("@BASE@", &base), ("@HDR@", r#"a\r\nInjected: 1"#)]),
    )
    .unwrap();
    let (code, stderr) = super::run_bounded(
        dir.path(),
        &["scenario", "run", file.to_str().unwrap()],
        &[],
        Duration::from_secs(30),
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("t.toml:"), "{stderr}");
    assert_eq!(seen.load(Ordering::SeqCst), 0, "connections were made");
}

/// A command line and the environment variables it runs with.
type Invocation<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>);

#[test]
fn a_postgres_url_without_a_host_is_exit_2_with_one_message_in_every_command() {
    let root = repo_path("");
    let file = repo_path("scenarios/a-same-key-same-body.toml");
    let file = file.to_str().unwrap();
    let commands: Vec<Invocation> = vec![
        (
            vec![
                "verify",
                "--pg-url",
                "postgres://",
                "--filter",
                "a-same-key",
            ],
            vec![],
        ),
        (
            vec!["scenario", "run", file, "--pg-url", "postgresql://u@/db"],
            vec![],
        ),
        (
            vec!["scenario", "run", file],
            vec![("DATABASE_URL", "postgres:///db")],
        ),
        (
            vec![
                "create",
                "--tenant",
                "A",
                "--key",
                "k",
                "--database-url",
                "postgres://",
            ],
            vec![],
        ),
        (
            vec![
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--database-url",
                "postgres://",
            ],
            vec![],
        ),
        (
            vec!["serve", "--listen", "127.0.0.1:0"],
            vec![("DATABASE_URL", "postgres://u@:5432/db")],
        ),
        (
            vec!["soak", "--pg-url", "postgres://", "--duration", "1s"],
            vec![],
        ),
        (vec!["bench", "--quick", "--pg-url", "postgres://"], vec![]),
        (
            vec!["worker", "--pg-url", "postgres://", "--dbname", "x"],
            vec![],
        ),
        (vec!["interpose", "--postgres", "postgres://"], vec![]),
    ];
    for (args, env) in commands {
        let (code, stderr) = super::run_bounded(&root, &args, &env, Duration::from_secs(30));
        assert_eq!(code, 2, "{args:?} {env:?}: {stderr}");
        assert!(
            stderr.contains("names no host"),
            "{args:?} {env:?}: {stderr}"
        );
    }
}
