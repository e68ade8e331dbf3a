//! The documentation's relative links: in README.md, ARCHITECTURE.md and every `docs/*.md`,
//! each `[text](path)`, `[text](path#anchor)` and `[text](#anchor)` outside code names a file
//! that exists and, for a Markdown target, an anchor that one of its headings produces
//! (GitHub's slug rules). README.md stays short enough to read in five minutes. Every
//! `ticketflow …` command line they show names subcommands and `--flags` the binary has
//! (checked against its `--help`).

use std::collections::{HashMap, HashSet};
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

/// The `ticketflow …` command lines of `text` (in code spans, code blocks or prose), each as
/// its 1-based line number and the words after `ticketflow`, up to a shell comment, a pipe,
/// a redirection or the end of the span.
fn command_lines(text: &str) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(at) = rest.find("ticketflow ") {
            let before = rest[..at].chars().last();
            let after = &rest[at + "ticketflow ".len()..];
            rest = after;
            // `ticketflow` as a command: at a line's or span's start, after a space, `$`,
            // or a path (`./target/release/ticketflow`); not inside another word.
            if before.is_some_and(|c| !matches!(c, ' ' | '`' | '/' | '$' | '(' | '"')) {
                continue;
            }
            let end = after
                .find(['`', '#', '|', '>', '<', ';', '&', ')'])
                .unwrap_or(after.len());
            let words: Vec<String> = after[..end]
                .split_whitespace()
                .map(|w| w.trim_matches(|c| c == '[' || c == ']').to_string())
                .filter(|w| !w.is_empty() && w != "\\")
                .collect();
            if words
                .first()
                .is_some_and(|w| w.chars().all(|c| c.is_ascii_lowercase() || c == '-'))
            {
                out.push((i + 1, words));
            }
        }
    }
    out
}

/// The subcommands (`Commands:`) and the long flags of one `--help` text.
type HelpNames = (HashSet<String>, HashSet<String>);

/// The subcommands (`Commands:`) and long flags a `--help` text lists.
fn help_names(help: &str) -> HelpNames {
    let mut commands = HashSet::new();
    let mut flags = HashSet::new();
    let mut in_commands = false;
    for line in help.lines() {
        if line.trim_end().ends_with(':') && !line.starts_with(' ') {
            in_commands = line.starts_with("Commands:");
            continue;
        }
        if in_commands {
            if let Some(w) = line.split_whitespace().next() {
                commands.insert(w.to_string());
            }
        }
        for w in
            line.split(|c: char| c.is_whitespace() || c == ',' || c == '=' || c == '[' || c == ']')
        {
            if w.starts_with("--") && w.len() > 2 {
                flags.insert(w.trim_end_matches(['.', ':']).to_string());
            }
        }
    }
    (commands, flags)
}

/// What is wrong with the command lines of `files`: a subcommand the binary does not have,
/// or a `--flag` its subcommand's `--help` does not list. `help` gives the help text of a
/// subcommand path (`["scenario", "run"]`), `None` when there is no such path.
fn command_problems(
    files: &[PathBuf],
    help: &mut dyn FnMut(&[String]) -> Option<String>,
) -> Vec<String> {
    let mut cache: HashMap<Vec<String>, Option<HelpNames>> = HashMap::new();
    let mut problems = Vec::new();
    for file in files {
        let text = fs::read_to_string(file).expect("a documentation file is readable");
        let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("?");
        for (n, words) in command_lines(&text) {
            let mut path: Vec<String> = Vec::new();
            let mut names = cache
                .entry(path.clone())
                .or_insert_with(|| help(&path).map(|h| help_names(&h)))
                .clone();
            let mut rest = words.as_slice();
            // Follow the subcommands as far as the help lists them.
            while let (Some((commands, _)), Some(w)) = (&names, rest.first()) {
                if !commands.contains(w) {
                    break;
                }
                path.push(w.clone());
                rest = &rest[1..];
                names = cache
                    .entry(path.clone())
                    .or_insert_with(|| help(&path).map(|h| help_names(&h)))
                    .clone();
            }
            let Some((commands, flags)) = names else {
                problems.push(format!(
                    "{name}:{n}: `ticketflow {}` has no help",
                    path.join(" ")
                ));
                continue;
            };
            if path.is_empty()
                || (!commands.is_empty() && rest.first().is_some_and(|w| !w.starts_with('-')))
            {
                problems.push(format!(
                    "{name}:{n}: `ticketflow {}`: no such subcommand",
                    words.join(" ")
                ));
                continue;
            }
            for w in rest {
                let flag = w.split('=').next().unwrap_or(w);
                if flag.starts_with("--") && flag.len() > 2 && !flags.contains(flag) {
                    problems.push(format!(
                        "{name}:{n}: `ticketflow {}` has no flag {flag}",
                        path.join(" ")
                    ));
                }
            }
        }
    }
    problems
}

/// `ticketflow PATH… --help`, `None` when it does not exit 0.
fn binary_help(path: &[String]) -> Option<String> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ticketflow"))
        .args(path)
        .arg("--help")
        .output()
        .expect("the ticketflow binary runs");
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn every_command_line_in_the_docs_names_real_subcommands_and_flags() {
    let files = documentation_files();
    let mut seen = 0;
    for f in &files {
        seen += command_lines(&fs::read_to_string(f).unwrap()).len();
    }
    assert!(
        seen >= 40,
        "only {seen} command lines found: the extraction broke"
    );
    let problems = command_problems(&files, &mut binary_help);
    assert!(
        problems.is_empty(),
        "command lines the binary would refuse:\n{}",
        problems.join("\n")
    );
}

/// The checker can fail: an unknown subcommand, an unknown flag and a flag of another
/// subcommand are reported; a comment, a placeholder and a redirection are not read as flags.
#[test]
fn a_wrong_command_line_is_reported() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let a = dir.path().join("a.md");
    fs::write(
        &a,
        "```\nticketflow verify --report R.md   # --not-a-flag here\n\
         ticketflow verfiy --report R.md\n\
         ticketflow scenario run FILE --no-such-flag\n\
         ticketflow serve --repeat 3 > out.txt --also-not\n\
         ticketflow scenario walk FILE\n```\n\
         Run `ticketflow clean [--dry-run]` first.\n",
    )
    .unwrap();
    let problems = command_problems(&[a], &mut binary_help);
    assert_eq!(problems.len(), 4, "{problems:#?}");
    assert!(problems[0].contains("verfiy"), "{problems:#?}");
    assert!(problems[1].contains("--no-such-flag"), "{problems:#?}");
    assert!(
        problems[2].contains("serve` has no flag --repeat"),
        "{problems:#?}"
    );
    assert!(problems[3].contains("scenario walk"), "{problems:#?}");
}
