//! Secrets in paths and echoed answers are masked, URLs redacted in refusals, control characters escaped, Markdown from a target rendered as code.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::blackbox::{response, stub};

/// The secret the scenario takes from the environment (`${TF_ESCAPE_KEY}`).
const SECRET: &str = "tf-Secret-7Qx9wz";

/// A black-box scenario whose path, query and `Authorization` header carry the secret.
const SCENARIO: &str = r#"
name = "echo"
description = "a target that echoes the secret and answers with control bytes and Markdown"
[barrier]
kind = "http"
timeout_ms = 5000
[target]
base_urls = ["BASE"]
preset = "ietf"
[target.request]
path = "/payments/${TF_ESCAPE_KEY}?api_key=${TF_ESCAPE_KEY}"
headers = { Authorization = "Bearer ${TF_ESCAPE_KEY}" }
body = { amount = 100, currency = "EUR" }
[target.retry]
attempts = 2
backoff_ms = 1
max_backoff_ms = 2
[[racers]]
name = "client"
count = 2
key = "k1"
"#;

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs the binary in `dir` with `TF_ESCAPE_KEY` set to [`SECRET`].
fn ticketflow(dir: &Path, args: &[&str]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_ticketflow"))
        .args(args)
        .current_dir(dir)
        .env("TF_ESCAPE_KEY", SECRET)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The characters a target must never get onto a terminal or into a report as they are: C0
/// (but newline and tab, which our own text uses), DEL, C1 and the Unicode bidi controls.
fn raw_control(text: &str) -> Option<char> {
    text.chars().find(|&c| {
        (c.is_control() && c != '\n' && c != '\t')
            || matches!(c, '\u{200e}' | '\u{200f}' | '\u{061c}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    })
}

/// `md` without its code: fenced blocks and code spans (a run of N backticks up to the next
/// run of exactly N), as CommonMark reads them. What is left is what a renderer may treat as
/// HTML or links.
fn outside_code(md: &str) -> String {
    let chars: Vec<char> = md.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    let run_at = |i: usize| chars[i..].iter().take_while(|&&c| c == '`').count();
    while i < chars.len() {
        if chars[i] != '`' {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let n = run_at(i);
        let mut j = i + n;
        let mut closed = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let m = run_at(j);
                if m == n {
                    closed = Some(j + m);
                    break;
                }
                j += m;
            } else {
                j += 1;
            }
        }
        match closed {
            Some(end) => {
                out.push_str("<code>");
                i = end;
            }
            None => {
                // An unclosed run is literal backticks.
                out.extend(&chars[i..i + n]);
                i += n;
            }
        }
    }
    out
}

/// Every file under `dir`, as text, with its path.
fn files_under(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            let text = String::from_utf8_lossy(&std::fs::read(&p).unwrap()).into_owned();
            out.push((p.display().to_string(), text));
        }
    }
    out
}

fn assert_contained(what: &str, text: &str) {
    assert!(!text.contains(SECRET), "{what} shows the secret:\n{text}");
    if let Some(c) = raw_control(text) {
        panic!("{what} has a raw control character {c:?}:\n{text}");
    }
}

#[test]
fn a_path_secret_and_a_hostile_echoing_target_reach_no_output() {
    // The target echoes the bearer token it was sent in a header and in its body, which also
    // clears the screen, retitles the terminal, rings the bell, reverses the text direction,
    // and carries a script tag and a javascript: link.
    let base = stub(|req| {
        let token = req
            .headers
            .iter()
            .find(|(n, _)| n == "authorization")
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        let body = format!(
            "in progress {token}\u{1b}[2J\u{1b}]0;pwned\u{7}\r\u{202e}evil <script>alert(1)</script> \
             [click](javascript:alert(1)) ``` `tick`"
        );
        response(
            "409 Conflict",
            &[("X-Idempotency-Echo", &token), ("Location", &token)],
            &body,
        )
    });
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("echo.toml"),
        SCENARIO.replace("BASE", &base),
    )
    .unwrap();

    let text = ticketflow(
        dir.path(),
        &["scenario", "run", "echo.toml", "--report", "out/REPORT.md"],
    );
    // In progress forever: a FAIL that quotes the answers.
    assert_eq!(text.code, 1, "{}\n{}", text.stdout, text.stderr);
    assert!(text.stdout.contains("409"), "{}", text.stdout);
    // The hostile text is shown, neutralised: the secret by its variable's name, the control
    // bytes escaped.
    assert!(text.stdout.contains("${TF_ESCAPE_KEY}"), "{}", text.stdout);
    assert!(text.stdout.contains("\\u{1b}"), "{}", text.stdout);
    assert_contained("stdout", &text.stdout);
    assert_contained("stderr", &text.stderr);

    let json = ticketflow(dir.path(), &["scenario", "run", "echo.toml", "--json"]);
    assert_eq!(json.code, 1, "{}\n{}", json.stdout, json.stderr);
    assert!(json.stdout.contains("${TF_ESCAPE_KEY}"), "{}", json.stdout);
    assert_contained("--json stdout", &json.stdout);
    assert_contained("--json stderr", &json.stderr);
    for line in json.stdout.lines() {
        serde_json::from_str::<serde_json::Value>(line)
            .unwrap_or_else(|e| panic!("--json line is not JSON ({e}): {line}"));
    }

    let files = files_under(&dir.path().join("out"));
    assert!(
        files.iter().any(|(p, _)| p.ends_with("report.json")),
        "{files:?}"
    );
    for (path, text) in &files {
        assert_contained(path, text);
        if path.ends_with(".json") {
            serde_json::from_str::<serde_json::Value>(text)
                .unwrap_or_else(|e| panic!("{path} is not JSON ({e})"));
        }
        if path.ends_with(".md") {
            let active = outside_code(text);
            for bad in ["<script", "javascript:", "](javascript"] {
                assert!(
                    !active.to_ascii_lowercase().contains(bad),
                    "{path}: {bad} outside code:\n{active}"
                );
            }
        }
    }
    // The details quote the answer (as code), so the test above is not vacuous.
    let details = files
        .iter()
        .find(|(p, _)| p.ends_with("black-box.md"))
        .map(|(_, t)| t.as_str())
        .unwrap_or_else(|| panic!("no black-box details: {files:?}"));
    assert!(details.contains("<script>"), "{details}");
    assert!(details.contains("${TF_ESCAPE_KEY}"), "{details}");
}

#[test]
fn refused_urls_never_print_their_password() {
    let dir = tempfile::tempdir().unwrap();
    let password = "pw-Refused-3kq";
    let scenario = |base: &str| {
        SCENARIO
            .replace("BASE", base)
            .replace("${TF_ESCAPE_KEY}", "plain")
    };
    let cases: Vec<(&str, Vec<String>)> = vec![
        (
            "https base URL",
            vec![scenario(&format!("https://user:{password}@127.0.0.1:1"))],
        ),
        (
            "http base URL with userinfo",
            vec![scenario(&format!("http://user:{password}@127.0.0.1:1"))],
        ),
    ];
    for (what, texts) in cases {
        std::fs::write(dir.path().join("t.toml"), &texts[0]).unwrap();
        let out = ticketflow(dir.path(), &["scenario", "run", "t.toml"]);
        assert_eq!(out.code, 2, "{what}: {}\n{}", out.stdout, out.stderr);
        assert!(
            !out.stderr.contains(password) && !out.stdout.contains(password),
            "{what}: {}\n{}",
            out.stdout,
            out.stderr
        );
        assert!(out.stderr.contains("***"), "{what}: {}", out.stderr);
    }
    // A refused --lease URL, for scenario run and verify alike.
    std::fs::write(dir.path().join("t.toml"), scenario("http://127.0.0.1:1")).unwrap();
    for lease in [
        format!("redis://:{password}@127.0.0.1:6379"),
        format!("redis://user:{password}@127.0.0.1:6379/0"),
    ] {
        for args in [
            vec!["scenario", "run", "t.toml", "--lease", &lease],
            vec!["verify", "--scenarios", ".", "--lease", &lease],
        ] {
            let out = ticketflow(dir.path(), &args);
            assert_eq!(out.code, 2, "{args:?}: {}\n{}", out.stdout, out.stderr);
            assert!(
                !out.stderr.contains(password) && !out.stdout.contains(password),
                "{args:?}: {}\n{}",
                out.stdout,
                out.stderr
            );
            assert!(out.stderr.contains("***"), "{args:?}: {}", out.stderr);
        }
    }
}
