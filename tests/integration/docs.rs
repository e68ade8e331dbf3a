//! The documentation's relative links: in README.md, ARCHITECTURE.md and every `docs/*.md`,
//! each `[text](path)`, `[text](path#anchor)` and `[text](#anchor)` outside code names a file
//! that exists and, for a Markdown target, an anchor that one of its headings produces
//! (GitHub's slug rules). README.md stays short enough to read in five minutes.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

use crate::support::repo_path;

/// The most lines README.md may have; the guide and the reference live in `docs/`.
const README_MAX_LINES: usize = 260;

/// GitHub's heading anchor: lowercase, every character that is not a letter, digit, space,
/// `-` or `_` dropped, each space turned into `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The lines of `text` outside fenced code blocks (``` or ~~~), with their 1-based numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        let marker = if t.starts_with("```") {
            Some("```")
        } else if t.starts_with("~~~") {
            Some("~~~")
        } else {
            None
        };
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(f), Some(m)) if f == m => fence = None,
            (None, None) => out.push((i + 1, line)),
            _ => {}
        }
    }
    out
}

/// Every anchor the headings of `text` produce; a repeated slug gets `-1`, `-2`, … as on GitHub.
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(line[hashes..].trim().trim_end_matches('#'));
        let mut candidate = base.clone();
        let mut n = 0;
        while seen.contains(&candidate) {
            n += 1;
            candidate = format!("{base}-{n}");
        }
        seen.insert(candidate);
    }
    seen
}

/// `line` with its inline code spans (`` `…` ``) blanked, so a link shown as code is not checked.
fn without_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
            out.push(' ');
        } else if in_code {
            out.push(' ');
        } else {
            out.push(c);
        }
    }
    out
}

/// The targets of the inline links `[text](target)` on one line of prose.
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code_spans(line);
    let mut out = Vec::new();
    let mut rest = line.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        match after.find(')') {
            Some(end) => {
                let target = after[..end].split_whitespace().next().unwrap_or("");
                out.push(target.trim_matches(|c| c == '<' || c == '>').to_string());
                rest = &after[end + 1..];
            }
            None => break,
        }
    }
    out
}

/// Every broken relative link in `files`, as `FILE:LINE: target: why`.
fn broken_links(files: &[PathBuf]) -> Vec<String> {
    let mut problems = Vec::new();
    for file in files {
        let text = fs::read_to_string(file).expect("a documentation file is readable");
        for (number, line) in prose_lines(&text) {
            for target in link_targets(line) {
                if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (path, anchor) = match target.split_once('#') {
                    Some((p, a)) => (p, Some(a)),
                    None => (target.as_str(), None),
                };
                let resolved: PathBuf = if path.is_empty() {
                    file.clone()
                } else {
                    file.parent().unwrap_or(Path::new(".")).join(path)
                };
                let place = format!("{}:{number}: {target}", file.display());
                if !resolved.exists() {
                    problems.push(format!("{place}: no file {}", resolved.display()));
                    continue;
                }
                let Some(anchor) = anchor else { continue };
                if resolved.extension().and_then(|e| e.to_str()) != Some("md") {
                    continue;
                }
                let target_text = fs::read_to_string(&resolved).unwrap_or_default();
                if !anchors(&target_text).contains(anchor) {
                    problems.push(format!(
                        "{place}: no heading in {} makes #{anchor}",
                        resolved.display()
                    ));
                }
            }
        }
    }
    problems
}

/// README.md, ARCHITECTURE.md and every `docs/*.md`, sorted.
fn documentation_files() -> Vec<PathBuf> {
    let mut files = vec![repo_path("README.md"), repo_path("ARCHITECTURE.md")];
    let mut docs: Vec<PathBuf> = fs::read_dir(repo_path("docs"))
        .expect("docs/ is readable")
        .map(|e| e.expect("a docs/ entry").path())
        .filter(|p| p.extension().and_then(|e| e.to_str()) == Some("md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let files = documentation_files();
    assert!(
        files.len() >= 4,
        "README, ARCHITECTURE and docs/*.md: {files:?}"
    );
    let problems = broken_links(&files);
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

#[test]
fn readme_is_short() {
    let text = fs::read_to_string(repo_path("README.md")).expect("README.md is readable");
    let lines = text.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, at most {README_MAX_LINES}: move detail into docs/"
    );
}

#[test]
fn slugs_follow_github() {
    assert_eq!(
        slug("Safety: what the tool writes, reads and runs"),
        "safety-what-the-tool-writes-reads-and-runs"
    );
    assert_eq!(
        slug("4. Services no one here wrote: `examples/targets/` and FIELD.md"),
        "4-services-no-one-here-wrote-examplestargets-and-fieldmd"
    );
    assert_eq!(slug("Model checking (loom)"), "model-checking-loom");
    assert_eq!(slug("a_b — c"), "a_b--c");
}

/// The checker can fail: a missing file, a missing anchor and a link inside code are told
/// apart; a duplicate heading's `-1` anchor resolves.
#[test]
fn broken_links_are_reported() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let a = dir.path().join("a.md");
    let b = dir.path().join("b.md");
    fs::write(
        &b,
        "# B\n\n## Same\n\n## Same\n\n```\n## Not a heading\n```\n",
    )
    .unwrap();
    fs::write(
        &a,
        "# A\n\n[ok](b.md#same-1) [self](#a) [web](https://example.com/x#y)\n\
         [gone](c.md) [bad anchor](b.md#same-2) [fenced](b.md#not-a-heading)\n\
         `[code](nowhere.md)`\n\n```\n[fence](nowhere.md)\n```\n",
    )
    .unwrap();
    let problems = broken_links(&[a]);
    assert_eq!(problems.len(), 3, "{problems:#?}");
    assert!(problems[0].contains("c.md: no file"), "{problems:#?}");
    assert!(problems[1].contains("#same-2"), "{problems:#?}");
    assert!(problems[2].contains("#not-a-heading"), "{problems:#?}");
}
