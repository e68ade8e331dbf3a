//! Tenant isolation, statically: every SQL statement in `src/**/*.rs` and `crates/**/*.rs`
//! that reads or changes tickets, receipts or outbox rows filters by `tenant_id` (the `Store`
//! trait's invariant). Inserts set the tenant and are not reads, so they are exempt.

use std::path::{Path, PathBuf};

use crate::support::repo_path;

/// Every `.rs` file below `dir`, sorted, so a new file with SQL is scanned without being
/// listed anywhere.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// String literals of a Rust source file, with `\`-newline continuations joined.
fn string_literals(src: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = src.chars().peekable();
    let mut in_comment = false;
    while let Some(c) = chars.next() {
        if in_comment {
            if c == '\n' {
                in_comment = false;
            }
            continue;
        }
        if c == '/' && chars.peek() == Some(&'/') {
            in_comment = true;
            continue;
        }
        if c == '\'' {
            // A char literal such as '"' must not open a string.
            let mut look = chars.clone();
            let a = look.next();
            let b = look.next();
            if a == Some('\\') || b == Some('\'') {
                while let Some(x) = chars.next() {
                    if x == '\\' {
                        chars.next();
                    } else if x == '\'' {
                        break;
                    }
                }
            }
            continue;
        }
        if c != '"' {
            continue;
        }
        let mut lit = String::new();
        while let Some(x) = chars.next() {
            match x {
                '\\' => match chars.next() {
                    Some('\n') => {
                        while chars.peek().is_some_and(|c| c.is_whitespace()) {
                            chars.next();
                        }
                    }
                    Some(e) => {
                        lit.push('\\');
                        lit.push(e);
                    }
                    None => break,
                },
                '"' => break,
                other => lit.push(other),
            }
        }
        out.push(lit);
    }
    out
}

const TABLES: [&str; 3] = ["tickets", "idempotency_receipts", "outbox_events"];

/// Statements that read or change rows of the three tables (FROM/JOIN/UPDATE/DELETE FROM).
fn row_statements(src: &str) -> Vec<String> {
    string_literals(src)
        .into_iter()
        .filter(|s| {
            let s = s.to_ascii_uppercase();
            TABLES.iter().any(|t| {
                let t = t.to_ascii_uppercase();
                [
                    format!("FROM {t}"),
                    format!("JOIN {t}"),
                    format!("UPDATE {t}"),
                ]
                .iter()
                .any(|p| s.contains(p.as_str()))
            })
        })
        .collect()
}

/// Statements exempt by design, with the reason.
const TENANT_AGNOSTIC: [(&str, &str); 1] = [(
    "DELETE FROM idempotency_receipts WHERE created_at < {p}",
    "receipt retention (`ticketflow prune`) is an operator action over every tenant",
)];

fn unscoped(src: &str) -> Vec<String> {
    row_statements(src)
        .into_iter()
        .filter(|s| !s.contains("tenant_id = ") && !s.contains("tenant_id LIKE "))
        .filter(|s| !TENANT_AGNOSTIC.iter().any(|(sql, _why)| s == sql))
        .collect()
}

#[test]
fn every_statement_on_tenant_rows_filters_by_tenant() {
    let mut seen = 0;
    let mut files = rust_files(&repo_path("src"));
    files.extend(rust_files(&repo_path("crates")));
    // The walk really reaches the stores (and the nested modules).
    for must in [
        "crates/core/src/store/sqlite.rs",
        "crates/core/src/store/postgres.rs",
        "crates/harness/src/scenario/runner.rs",
    ] {
        assert!(files.contains(&repo_path(must)), "the walk missed {must}");
    }
    let mut bad = Vec::new();
    for file in &files {
        let src = std::fs::read_to_string(file).unwrap();
        seen += row_statements(&src).len();
        for statement in unscoped(&src) {
            bad.push(format!("{}: {statement}", file.display()));
        }
    }
    assert!(
        bad.is_empty(),
        "statements without a tenant filter: {bad:#?}"
    );
    // The scan really found the stores' statements (lookup, ticket read, update, counts, dump).
    assert!(
        seen >= 12,
        "only {seen} statements found: the scanner is broken"
    );
}

#[test]
fn the_scanner_flags_a_statement_without_a_tenant_filter() {
    // Negative control: a lookup by key alone, as a wrong store would write it.
    let src = r#"let sql = "SELECT payload_hash FROM idempotency_receipts \
                 WHERE idempotency_key = $1";"#;
    assert_eq!(unscoped(src).len(), 1);
    let ok = r#"let sql = "SELECT payload_hash FROM idempotency_receipts WHERE tenant_id = $1";"#;
    assert!(unscoped(ok).is_empty());
    // A char literal holding a quote does not confuse the scanner.
    let chars = r#"let q = '"'; let sql = "UPDATE tickets SET x = 1";"#;
    assert_eq!(unscoped(chars).len(), 1);
}
