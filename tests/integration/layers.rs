//! Layers, statically (ARCHITECTURE.md, "Invariants"): the store layer, `serve` and the core
//! never import the harness; only the memory store takes the `sync` shim; the black-box client
//! never imports `serve`. And ARCHITECTURE.md's code map names every source file and module
//! directory, in directory order, so a new file without an entry fails here.
//!
//! The import scan reads code only (comments and string literals are blanked), follows every
//! path that starts at the crate root (`crate::`, `$crate::`, `ticketflow::`) or climbs with
//! `super::` (resolved against the file's module and its inline `mod … { }` blocks), and looks
//! inside `{ … }` groups, so `use crate::{store, report::Item}` and `super::super::scenario`
//! are seen as what they are.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::support::repo_path;

/// Top-level modules below the harness: the core, the store layer, `serve`, and what they
/// import (`variants` for `serve --variant`, `cleanup` for scratch databases, `logging`,
/// `deadline` and `ledger` for every PostgreSQL session and scratch database, `child` for
/// every process started, `contain` for every text written, `exit` for the exit codes).
const LOWER: [&str; 18] = [
    "child",
    "cleanup",
    "contain",
    "deadline",
    "domain",
    "error",
    "exit",
    "fingerprint",
    "lease",
    "ledger",
    "logging",
    "model",
    "protocol",
    "serve",
    "store",
    "sync",
    "variants",
    "wire",
];

/// The harness: what runs, judges and reports races, suites, faults and benchmarks.
const HARNESS: [&str; 13] = [
    "barrier",
    "bench",
    "blackbox",
    "faults",
    "interpose",
    "jobs",
    "killmatrix",
    "outputs",
    "props",
    "report",
    "scenario",
    "soak",
    "verify",
];

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    /// `::`
    Sep,
    Open,
    Close,
    Comma,
    Star,
    Other,
}

/// Tokens of a Rust source with their 1-based line; comments, string, byte-string, raw-string
/// and char literals produce no tokens (a lifetime's `'` is dropped, its name kept).
fn tokens(src: &str) -> Vec<(Tok, usize)> {
    let c: Vec<char> = src.chars().collect();
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    let ident_char = |x: char| x == '_' || x.is_alphanumeric();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    // Skips a quoted literal starting at the opening quote `c[i]`, honouring escapes.
    let skip_quoted = |mut i: usize, line: &mut usize, quote: char| {
        i += 1;
        while i < c.len() && c[i] != quote {
            if c[i] == '\\' {
                i += 1;
            }
            if at(i) == '\n' {
                *line += 1;
            }
            i += 1;
        }
        i + 1
    };
    while i < c.len() {
        let x = c[i];
        if x == '\n' {
            line += 1;
            i += 1;
        } else if x.is_whitespace() {
            i += 1;
        } else if x == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if x == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if c[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if x == '"' {
            i = skip_quoted(i, &mut line, '"');
        } else if x == '\'' {
            if at(i + 1) == '\\' || at(i + 2) == '\'' {
                i = skip_quoted(i, &mut line, '\'');
            } else {
                i += 1; // a lifetime: its name follows as an identifier
            }
        } else if x == '_' || x.is_alphabetic() {
            let start = i;
            while i < c.len() && ident_char(c[i]) {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            let raw_string = matches!(word.as_str(), "r" | "br" | "cr")
                && (at(i) == '"' || (at(i) == '#' && matches!(at(i + 1), '"' | '#')));
            if raw_string {
                let mut hashes = 0;
                while at(i) == '#' {
                    hashes += 1;
                    i += 1;
                }
                i += 1; // the opening quote
                loop {
                    if i >= c.len() {
                        break;
                    }
                    if c[i] == '"' && (1..=hashes).all(|h| at(i + h) == '#') {
                        i += 1 + hashes;
                        break;
                    }
                    if c[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            } else if word == "r" && at(i) == '#' {
                i += 1; // a raw identifier: the identifier follows
            } else if matches!(word.as_str(), "b" | "c") && matches!(at(i), '"' | '\'') {
                // b"…", b'…', c"…": the literal is skipped by the next iteration
            } else {
                out.push((Tok::Ident(word), line));
            }
        } else if x.is_ascii_digit() {
            while i < c.len() && ident_char(c[i]) {
                i += 1;
            }
            out.push((Tok::Other, line));
        } else {
            let tok = match x {
                ':' if at(i + 1) == ':' => {
                    i += 1;
                    Tok::Sep
                }
                '{' => Tok::Open,
                '}' => Tok::Close,
                ',' => Tok::Comma,
                '*' => Tok::Star,
                _ => Tok::Other,
            };
            out.push((tok, line));
            i += 1;
        }
    }
    out
}

/// One crate-level name a path reaches: the top-level module (or a root re-export, `*` for a
/// glob of the root, `<above the crate root>` for a `super` that climbs out of it) and where.
#[derive(Debug, Clone, PartialEq)]
struct Reach {
    name: String,
    line: usize,
}

/// Every crate-level name the code of a file in module `module` (e.g. `["store", "sqlite"]`,
/// `["serve"]`) reaches through a path.
fn reaches(src: &str, module: &[&str]) -> Vec<Reach> {
    let toks = tokens(src);
    let tok = |i: usize| toks.get(i).map(|t| &t.0);
    let ident = |i: usize, s: &str| matches!(tok(i), Some(Tok::Ident(w)) if w == s);
    let mut out = Vec::new();
    let mut path: Vec<String> = module.iter().map(|s| s.to_string()).collect();
    // Inline modules: (name, brace depth inside it).
    let mut inline: Vec<usize> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        let line = toks[i].1;
        match &toks[i].0 {
            Tok::Open => depth += 1,
            Tok::Close => {
                if inline.last() == Some(&depth) {
                    inline.pop();
                    path.pop();
                }
                depth = depth.saturating_sub(1);
            }
            Tok::Ident(w) if w == "mod" => {
                if let (Some(Tok::Ident(name)), Some(Tok::Open)) = (tok(i + 1), tok(i + 2)) {
                    path.push(name.clone());
                    depth += 1;
                    inline.push(depth);
                    i += 3;
                    continue;
                }
            }
            Tok::Ident(w)
                if matches!(w.as_str(), "crate" | "ticketflow" | "super")
                    && tok(i + 1) == Some(&Tok::Sep)
                    && !(w == "super" && i > 0 && tok(i - 1) == Some(&Tok::Sep)) =>
            {
                let mut j = i + 2;
                let prefix: Option<&[String]> = if w == "super" {
                    let mut ups = 1;
                    while ident(j, "super") && tok(j + 1) == Some(&Tok::Sep) {
                        ups += 1;
                        j += 2;
                    }
                    path.len().checked_sub(ups).map(|keep| &path[..keep])
                } else {
                    Some(&[])
                };
                match prefix {
                    None => out.push(Reach {
                        name: "<above the crate root>".into(),
                        line,
                    }),
                    Some([top, ..]) => out.push(Reach {
                        name: top.clone(),
                        line,
                    }),
                    Some([]) => out.extend(first_segments(&toks, j)),
                }
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// The first segments a path continues with at token `j`: one name, `*`, or every item of a
/// `{ … }` group (nested groups belong to their item).
fn first_segments(toks: &[(Tok, usize)], j: usize) -> Vec<Reach> {
    let reach = |t: &(Tok, usize)| match &t.0 {
        Tok::Ident(w) if w != "self" => Some(Reach {
            name: w.clone(),
            line: t.1,
        }),
        Tok::Star => Some(Reach {
            name: "*".into(),
            line: t.1,
        }),
        _ => None,
    };
    let Some(first) = toks.get(j) else {
        return Vec::new();
    };
    if first.0 != Tok::Open {
        return reach(first).into_iter().collect();
    }
    let mut out = Vec::new();
    let (mut depth, mut item_start) = (0, true);
    for t in &toks[j..] {
        match t.0 {
            Tok::Open => {
                depth += 1;
                item_start = depth == 1;
                continue;
            }
            Tok::Close => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            Tok::Comma if depth == 1 => {
                item_start = true;
                continue;
            }
            _ => {}
        }
        if item_start && depth == 1 {
            out.extend(reach(t));
        }
        item_start = false;
    }
    out
}

/// Every `.rs` file below `src/`, as (path relative to the repository, module path); the
/// binary's files (`src/main.rs`, `src/cli/`) and the crate root are left out.
fn library_files() -> Vec<(String, Vec<String>)> {
    source_files()
        .into_iter()
        .filter_map(|rel| {
            let inner = rel.strip_prefix("src/")?.strip_suffix(".rs")?;
            let mut module: Vec<String> = inner.split('/').map(String::from).collect();
            if module.last().is_some_and(|m| m == "mod") {
                module.pop();
            }
            match module.first().map(String::as_str) {
                Some("main" | "cli" | "lib") => None,
                _ => Some((rel, module)),
            }
        })
        .collect()
}

/// Every `.rs` file below `src/`, relative to the repository, `/`-separated, sorted.
fn source_files() -> Vec<String> {
    let root = repo_path("");
    let mut out = Vec::new();
    let mut pending = vec![repo_path("src")];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(relative(&root, &path));
            }
        }
    }
    out.sort();
    out
}

fn relative(root: &Path, path: &Path) -> String {
    let rel = path.strip_prefix(root).unwrap();
    rel.components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("/")
}

/// What each library file reaches, by file.
fn reached_by_file() -> BTreeMap<String, (Vec<String>, Vec<Reach>)> {
    library_files()
        .into_iter()
        .map(|(rel, module)| {
            let src = std::fs::read_to_string(repo_path(&rel)).unwrap();
            let m: Vec<&str> = module.iter().map(String::as_str).collect();
            let r = reaches(&src, &m);
            (rel, (module, r))
        })
        .collect()
}

/// Reaches from a file of a lower module that leave the lower layer. A name that is not a
/// module is a root re-export (lib.rs re-exports only from lower modules, checked below).
fn leaves_the_lower_layer(module: &[&str], src: &str, modules: &BTreeSet<String>) -> Vec<Reach> {
    reaches(src, module)
        .into_iter()
        .filter(|r| {
            r.name == "*"
                || r.name.starts_with('<')
                || (modules.contains(&r.name) && !LOWER.contains(&r.name.as_str()))
        })
        .collect()
}

/// The top-level modules lib.rs declares, and the modules its `use` items re-export from.
fn lib_modules() -> (BTreeSet<String>, Vec<String>) {
    let lib = std::fs::read_to_string(repo_path("src/lib.rs")).unwrap();
    let toks = tokens(&lib);
    let mut declared = BTreeSet::new();
    let mut reexported = Vec::new();
    for w in toks.windows(2) {
        match (&w[0].0, &w[1].0) {
            (Tok::Ident(m), Tok::Ident(name)) if m == "mod" => {
                declared.insert(name.clone());
            }
            (Tok::Ident(u), Tok::Ident(from)) if u == "use" => reexported.push(from.clone()),
            _ => {}
        }
    }
    (declared, reexported)
}

#[test]
fn every_top_level_module_is_below_the_harness_or_in_it() {
    let (declared, reexported) = lib_modules();
    let classified: BTreeSet<String> = LOWER
        .iter()
        .chain(&HARNESS)
        .map(|s| s.to_string())
        .collect();
    assert_eq!(
        declared, classified,
        "every module in src/lib.rs is listed in exactly one of LOWER and HARNESS (a new module \
         must say which side it is on)"
    );
    assert!(LOWER.iter().all(|m| !HARNESS.contains(m)));
    // The crate root re-exports only from the lower layer, so `crate::Error` and the like
    // are lower names wherever they are used.
    assert!(
        !reexported.is_empty(),
        "the lib.rs scan found no re-exports"
    );
    for from in &reexported {
        assert!(
            LOWER.contains(&from.as_str()),
            "src/lib.rs re-exports from {from}, which is not below the harness"
        );
    }
}

#[test]
fn store_serve_and_the_core_never_import_the_harness() {
    let (modules, _) = lib_modules();
    let files = reached_by_file();
    let lower: Vec<_> = files
        .iter()
        .filter(|(_, (module, _))| LOWER.contains(&module[0].as_str()))
        .collect();
    for must in [
        "src/store/postgres.rs",
        "src/store/mod.rs",
        "src/serve/mod.rs",
        "src/protocol.rs",
    ] {
        assert!(
            lower.iter().any(|(rel, _)| rel.as_str() == must),
            "the walk missed {must}"
        );
    }
    let mut bad = Vec::new();
    for (rel, (module, _)) in &lower {
        let src = std::fs::read_to_string(repo_path(rel)).unwrap();
        let m: Vec<&str> = module.iter().map(String::as_str).collect();
        for r in leaves_the_lower_layer(&m, &src, &modules) {
            bad.push(format!("{rel}:{}: reaches {}", r.line, r.name));
        }
    }
    assert!(
        bad.is_empty(),
        "the layer below the harness imports the harness (or globs the crate root): {bad:#?}"
    );
    // The scan really resolves paths: serve's imports and the store's use of cleanup.
    let names =
        |rel: &str| -> BTreeSet<String> { files[rel].1.iter().map(|r| r.name.clone()).collect() };
    let serve = names("src/serve/mod.rs");
    for m in ["domain", "error", "protocol", "store", "variants", "wire"] {
        assert!(
            serve.contains(m),
            "serve.rs reaches {serve:?}: the scanner missed {m}"
        );
    }
    assert!(names("src/store/postgres.rs").contains("cleanup"));
    // And it sees real harness imports where they are allowed: verify builds the report.
    let verify = names("src/verify/mod.rs");
    assert!(
        verify.contains("report") && verify.contains("scenario"),
        "{verify:?}"
    );
}

#[test]
fn only_the_memory_store_takes_the_sync_shim() {
    let takers: Vec<String> = reached_by_file()
        .into_iter()
        .filter(|(_, (module, reached))| {
            module[0] != "sync" && reached.iter().any(|r| r.name == "sync")
        })
        .map(|(rel, _)| rel)
        .collect();
    assert_eq!(takers, ["src/store/memory.rs"]);
}

#[test]
fn the_black_box_client_never_imports_serve() {
    // They share the wire contract (`src/wire.rs`) instead.
    let files = reached_by_file();
    let target: Vec<_> = files
        .iter()
        .filter(|(_, (m, _))| m[0] == "blackbox")
        .collect();
    assert!(target.len() >= 5, "the walk missed src/blackbox/");
    let bad: Vec<String> = target
        .iter()
        .flat_map(|(rel, (_, reached))| {
            reached
                .iter()
                .filter(|r| r.name == "serve")
                .map(move |r| format!("{rel}:{}", r.line))
        })
        .collect();
    assert!(
        bad.is_empty(),
        "the black-box client imports serve: {bad:?}"
    );
}

#[test]
fn the_scanner_flags_a_planted_harness_import() {
    let (modules, _) = lib_modules();
    let flagged = |module: &[&str], src: &str| -> Vec<String> {
        leaves_the_lower_layer(module, src, &modules)
            .into_iter()
            .map(|r| r.name)
            .collect()
    };
    let sqlite = ["store", "sqlite"];
    // Negative controls: each of these is an import of the harness.
    assert_eq!(
        flagged(&sqlite, "use crate::scenario::Verdict;"),
        ["scenario"]
    );
    assert_eq!(
        flagged(&sqlite, "use crate::{domain::Ticket, report::Item};"),
        ["report"]
    );
    assert_eq!(
        flagged(
            &sqlite,
            "use crate::{\n    store::{self, Store},\n    verify,\n};"
        ),
        ["verify"]
    );
    assert_eq!(
        flagged(&sqlite, "use super::super::killmatrix;"),
        ["killmatrix"]
    );
    assert_eq!(
        flagged(&["serve"], "let r = super::bench::run();"),
        ["bench"]
    );
    assert_eq!(
        flagged(&sqlite, "ticketflow::faults::run(a, b)"),
        ["faults"]
    );
    assert_eq!(flagged(&sqlite, "let x: $crate::props::Op;"), ["props"]);
    assert_eq!(flagged(&sqlite, "use crate::*;"), ["*"]);
    assert_eq!(
        flagged(&sqlite, "use super::super::super::blackbox;"),
        ["<above the crate root>"]
    );
    assert_eq!(
        flagged(&sqlite, "mod tests { use super::super::super::barrier; }"),
        ["barrier"]
    );
    // Not imports: comments, doc links, strings, raw strings, chars; paths inside the layer.
    let clean = r###"
        // see crate::scenario
        /// [`crate::report::Item`] /* crate::verify */
        /* outer /* nested crate::blackbox */ still comment crate::bench */
        let a = "crate::faults::run";
        let b = r#"crate::props "quoted" crate::killmatrix"#;
        let c = b"crate::barrier";
        let q = '"'; let e = '\''; fn f<'a>(x: &'a str) {}
        use super::postgres::{self, PgStore};
        use crate::{domain::Ticket, error::StoreError, Error};
        pub(crate) fn g() -> crate::Result<()> { Ok(()) }
        mod tests { use super::*; }
    "###;
    assert_eq!(flagged(&["store", "scratch"], clean), Vec::<String>::new());
    assert_eq!(
        flagged(&["protocol"], "mod tests { use super::*; }"),
        Vec::<String>::new()
    );
    // A top-level file's `super` is the crate root: `*` there globs it.
    assert_eq!(flagged(&["protocol"], "use super::*;"), ["*"]);
    // Lines are reported.
    let r = reaches("\n// x\nuse crate::scenario;", &["serve"]);
    assert_eq!(
        r,
        [Reach {
            name: "scenario".into(),
            line: 3
        }]
    );
}

/// Directory order: components compared in turn, a directory's `mod.rs` before its other
/// files, a directory before what it holds.
fn order_key(path: &str) -> Vec<String> {
    path.trim_end_matches('/')
        .split('/')
        .map(|c| {
            if c == "mod.rs" {
                String::new()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// The first backticked text of each bullet (`- \`src/…\` — …`) of the code map section.
fn code_map_heads(doc: &str) -> Vec<String> {
    code_map(doc)
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("- `"))
        .filter_map(|l| l.split('`').next())
        .map(String::from)
        .collect()
}

fn code_map(doc: &str) -> &str {
    let start = doc
        .find("## Code map")
        .expect("ARCHITECTURE.md has a ## Code map section");
    let rest = &doc[start..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |e| e + 3);
    &rest[..end]
}

/// What is wrong with the code map of `doc`: a source file, module directory or repository
/// directory (`required`) without an entry, `src/` entries out of directory order, and
/// backticked repository paths (under one of `roots`) that do not exist.
fn code_map_problems(
    doc: &str,
    required: &[String],
    roots: &[String],
    exists: &dyn Fn(&str) -> bool,
) -> Vec<String> {
    let heads = code_map_heads(doc);
    let mut problems = Vec::new();
    for r in required {
        if !heads.contains(r) {
            problems.push(format!("no code map entry for {r}"));
        }
    }
    let src: Vec<&String> = heads.iter().filter(|h| h.starts_with("src/")).collect();
    for w in src.windows(2) {
        if order_key(w[0]) >= order_key(w[1]) {
            problems.push(format!(
                "{} comes after {}: not in directory order",
                w[1], w[0]
            ));
        }
    }
    for (n, text) in code_map(doc).split('`').enumerate() {
        let is_path = n % 2 == 1
            && roots.iter().any(|r| text.starts_with(r.as_str()))
            && !text.contains(|c: char| c.is_whitespace() || "{}*<>".contains(c));
        if is_path && !exists(text) {
            problems.push(format!("the code map names {text}, which does not exist"));
        }
    }
    problems
}

/// Directories the code map must name: every module directory under `src/`, every
/// repository directory (not hidden, not ignored by a root-anchored `.gitignore` line) and
/// its directories under `tests/`.
fn required_dirs() -> (Vec<String>, Vec<String>) {
    let root = repo_path("");
    let gitignore = std::fs::read_to_string(repo_path(".gitignore")).unwrap_or_default();
    let ignored = |name: &str| {
        gitignore
            .lines()
            .filter_map(|l| l.strip_prefix('/'))
            .any(|p| {
                let p = p.trim_end_matches('/');
                match p.strip_suffix('*') {
                    Some(prefix) => name.starts_with(prefix),
                    None => name == p,
                }
            })
    };
    let dirs_in = |dir: &Path| -> Vec<String> {
        let mut out: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_dir())
            .map(|p| relative(&root, &p) + "/")
            .collect();
        out.sort();
        out
    };
    let top: Vec<String> = dirs_in(&root)
        .into_iter()
        .filter(|d| !d.starts_with('.') && !ignored(d.trim_end_matches('/')))
        .collect();
    let mut required = top.clone();
    required.extend(dirs_in(&repo_path("tests")));
    let mut pending = vec![repo_path("src")];
    while let Some(d) = pending.pop() {
        for sub in dirs_in(&d) {
            pending.push(repo_path(&sub));
            required.push(sub);
        }
    }
    (required, top)
}

#[test]
fn the_code_map_names_every_source_file_in_directory_order() {
    let doc = std::fs::read_to_string(repo_path("ARCHITECTURE.md")).unwrap();
    let (mut required, roots) = required_dirs();
    let files = source_files();
    assert!(files.len() > 50 && files.contains(&"src/store/memory.rs".to_string()));
    required.extend(files);
    for must in ["src/", "tests/", "migrations/", "src/report/markdown/"] {
        assert!(required.iter().any(|r| r == must), "the walk missed {must}");
    }
    let problems = code_map_problems(&doc, &required, &roots, &|p| repo_path(p).exists());
    assert!(
        problems.is_empty(),
        "ARCHITECTURE.md's code map is stale: {problems:#?}"
    );
}

#[test]
fn the_code_map_check_flags_a_missing_stale_or_misplaced_entry() {
    let doc = "# A\n\n## Code map\n\n- `src/` — the crate.\n  - `src/b.rs` — b.\n  \
               - `src/a/` — a, see `src/a/gone.rs`.\n    - `src/a/x.rs` — x.\n    \
               - `src/a/mod.rs` — a.\n- `tests/` — tests; `src/{a,b}.rs` is no path.\n\n\
               ## Invariants\n\n- `src/c.rs` — outside the code map.\n";
    let required: Vec<String> = ["src/", "src/a/", "src/a/mod.rs", "src/a/x.rs", "src/b.rs"]
        .into_iter()
        .chain(["src/c.rs", "docs/"])
        .map(String::from)
        .collect();
    let roots = [
        "src/".to_string(),
        "tests/".to_string(),
        "docs/".to_string(),
    ];
    let exists = |p: &str| !p.contains("gone");
    let problems = code_map_problems(doc, &required, &roots, &exists);
    assert_eq!(
        problems,
        [
            "no code map entry for src/c.rs",
            "no code map entry for docs/",
            "src/a/ comes after src/b.rs: not in directory order",
            "src/a/mod.rs comes after src/a/x.rs: not in directory order",
            "the code map names src/a/gone.rs, which does not exist",
        ]
    );
    // In order and complete, it passes.
    let good =
        "## Code map\n- `src/`\n- `src/a/`\n- `src/a/mod.rs`\n- `src/a/x.rs`\n- `src/b.rs`\n";
    let required: Vec<String> = required[..5].to_vec();
    assert_eq!(
        code_map_problems(good, &required, &roots, &exists),
        Vec::<String>::new()
    );
}

/// The loom report's freshness check hashes the files `scripts/loom.sh` hashes, in its order:
/// a file added to one list and not the other would make every report stale, or none.
#[test]
fn the_loom_sources_are_the_same_in_the_script_and_the_kill_matrix() {
    let script = std::fs::read_to_string(repo_path("scripts/loom.sh")).unwrap();
    let line = script
        .lines()
        .find_map(|l| l.trim().strip_prefix("sources=("))
        .and_then(|l| l.strip_suffix(')'))
        .expect("scripts/loom.sh has a sources=(…) line");
    let listed: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(listed, ticketflow::killmatrix::LOOM_SOURCES);
}
