//! Layers, by what the compiler cannot say. The crates are the layers (ARCHITECTURE.md):
//! `ticketflow` (the command line, `verify`) → `ticketflow-report` → `ticketflow-harness` →
//! `ticketflow-core`, and `ticketflow` → `ticketflow-serve` → `ticketflow-core`; a module
//! cannot import a crate its manifest does not name, so the direction holds by construction.
//! What is left to check here: the manifests keep that direction and the core's invariants of
//! absence (no command-line, HTTP-server, property-test, progress-bar, XML or HTTP-client
//! crate), ARCHITECTURE.md's code map names every source file and module directory, in
//! directory order, so a new file without an entry fails here, and no two top modules of one
//! crate import each other (through any chain).

use std::path::Path;

use crate::support::repo_path;

/// The workspace's crates: (manifest directory, package name).
const CRATES: [(&str, &str); 5] = [
    ("", "ticketflow"),
    ("crates/core", "ticketflow-core"),
    ("crates/serve", "ticketflow-serve"),
    ("crates/harness", "ticketflow-harness"),
    ("crates/report", "ticketflow-report"),
];

/// The workspace crates each crate may depend on (normal dependencies): one way down.
fn allowed_below(package: &str) -> &'static [&'static str] {
    match package {
        "ticketflow" => &[
            "ticketflow-core",
            "ticketflow-serve",
            "ticketflow-harness",
            "ticketflow-report",
        ],
        "ticketflow-report" => &["ticketflow-core", "ticketflow-harness"],
        "ticketflow-harness" | "ticketflow-serve" => &["ticketflow-core"],
        _ => &[],
    }
}

/// Crates the core never depends on (directly; `scripts/layers` checks the whole tree with
/// `cargo tree`); `clap` only as the optional dependency of its `cli` feature.
const NOT_IN_CORE: [&str; 11] = [
    "axum",
    "ctrlc",
    "tempfile",
    "tokio",
    "hyper",
    "hyper-util",
    "tower",
    "proptest",
    "indicatif",
    "quick-xml",
    "ureq",
];

/// (name, optional) of each normal dependency of a manifest's text.
fn normal_dependencies(manifest: &str) -> Vec<(String, bool)> {
    let doc: toml::Table = manifest.parse().expect("a manifest is TOML");
    let Some(deps) = doc.get("dependencies").and_then(|d| d.as_table()) else {
        return Vec::new();
    };
    deps.iter()
        .map(|(name, spec)| {
            let optional = spec
                .get("optional")
                .and_then(|o| o.as_bool())
                .unwrap_or(false);
            (name.clone(), optional)
        })
        .collect()
}

/// What is wrong with the manifests `(package, text)`: a workspace crate depended on against
/// the direction, a crate the core must not have, clap in the core other than optional.
fn manifest_problems(manifests: &[(&str, String)]) -> Vec<String> {
    let workspace: Vec<&str> = CRATES.iter().map(|(_, p)| *p).collect();
    let mut problems = Vec::new();
    for (package, text) in manifests {
        for (dep, optional) in normal_dependencies(text) {
            if workspace.contains(&dep.as_str()) && !allowed_below(package).contains(&dep.as_str())
            {
                problems.push(format!("{package} depends on {dep}, against the layers"));
            }
            if *package == "ticketflow-core" {
                if NOT_IN_CORE.contains(&dep.as_str()) {
                    problems.push(format!("ticketflow-core depends on {dep}"));
                }
                if dep == "clap" && !optional {
                    problems.push("ticketflow-core depends on clap outside its cli feature".into());
                }
            }
        }
    }
    problems
}

#[test]
fn the_manifests_point_one_way_and_keep_the_core_free_of_the_outer_crates() {
    let manifests: Vec<(&str, String)> = CRATES
        .iter()
        .map(|(dir, package)| {
            let text = std::fs::read_to_string(repo_path(
                format!("{dir}/Cargo.toml").trim_start_matches('/'),
            ))
            .unwrap();
            (*package, text)
        })
        .collect();
    let problems = manifest_problems(&manifests);
    assert!(problems.is_empty(), "{problems:#?}");
    // The harness starts `serve` as a process and never links it.
    let harness = &manifests[3].1;
    assert!(!normal_dependencies(harness)
        .iter()
        .any(|(d, _)| d == "ticketflow-serve"));
}

#[test]
fn the_manifest_check_flags_an_upward_dependency_and_an_outer_crate_in_the_core() {
    let manifests = [
        (
            "ticketflow-core",
            "[dependencies]\naxum = \"0.8\"\nclap = \"4\"\nticketflow-harness = { path = \"x\" }\n".to_string(),
        ),
        (
            "ticketflow-harness",
            "[dependencies]\nticketflow-serve = { workspace = true }\nclap = { workspace = true, optional = true }\n".to_string(),
        ),
        (
            "ticketflow-serve",
            "[dependencies]\nticketflow-core.workspace = true\n".to_string(),
        ),
    ];
    assert_eq!(
        manifest_problems(&manifests),
        [
            "ticketflow-core depends on axum",
            "ticketflow-core depends on clap outside its cli feature",
            "ticketflow-core depends on ticketflow-harness, against the layers",
            "ticketflow-harness depends on ticketflow-serve, against the layers",
        ]
    );
}

/// Every `.rs` file below `src/` and `crates/`, relative to the repository, `/`-separated,
/// sorted.
fn source_files() -> Vec<String> {
    let root = repo_path("");
    let mut out = Vec::new();
    let mut pending = vec![repo_path("src"), repo_path("crates")];
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
/// directory (`required`) without an entry, `src/` and `crates/` entries out of directory
/// order, and
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
    let src: Vec<&String> = heads
        .iter()
        .filter(|h| h.starts_with("src/") || h.starts_with("crates/"))
        .collect();
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

/// Directories the code map must name: every directory under `src/` and `crates/`, every
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
    let mut pending = vec![repo_path("src"), repo_path("crates")];
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
    assert!(files.len() > 50 && files.contains(&"crates/core/src/store/memory.rs".to_string()));
    required.extend(files);
    for must in [
        "src/",
        "tests/",
        "crates/core/migrations/",
        "crates/core/src/store/",
        "crates/report/src/markdown/",
    ] {
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

/// The top modules of the crate whose sources are in `src_dir` (repository-relative): each
/// module's name with its files (`x.rs` and everything below `x/`). `lib.rs` and `main.rs` are
/// the crate root, not a module.
fn top_modules(src_dir: &str) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut modules = std::collections::BTreeMap::<String, Vec<String>>::new();
    let prefix = format!("{src_dir}/");
    for file in source_files() {
        let Some(rest) = file.strip_prefix(&prefix) else {
            continue;
        };
        let name = match rest.split_once('/') {
            Some((dir, _)) => dir.to_string(),
            None if rest == "lib.rs" || rest == "main.rs" => continue,
            None => rest.trim_end_matches(".rs").to_string(),
        };
        modules.entry(name).or_default().push(file);
    }
    modules
}

/// The top modules among `names` that `text` reaches by a `crate::` path (also inside a
/// `crate::{…}` group), and by `super::` when `text` is a top-level file (its parent is the
/// crate root). Line comments are skipped.
fn module_imports(
    text: &str,
    top_level: bool,
    names: &std::collections::BTreeSet<String>,
) -> std::collections::BTreeSet<String> {
    let path = regex::Regex::new(r"\b(crate|super)::(\{[^}]*\}|\w+)").unwrap();
    let word = regex::Regex::new(r"(?:^|[{,\s])(\w+)").unwrap();
    let mut out = std::collections::BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        for m in path.captures_iter(code) {
            if &m[1] == "super" && !top_level {
                continue;
            }
            let named: Vec<String> = match m[2].strip_prefix('{') {
                Some(group) => word
                    .captures_iter(group.trim_end_matches('}'))
                    .map(|w| w[1].to_string())
                    .collect(),
                None => vec![m[2].to_string()],
            };
            out.extend(named.into_iter().filter(|n| names.contains(n)));
        }
    }
    out
}

/// The modules of `graph` (module → the modules it imports) that lie on a cycle, each cycle's
/// modules sorted; the graphs are small, so reachability is computed by closure.
fn cycles(
    graph: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
) -> Vec<Vec<String>> {
    let mut reach = graph.clone();
    loop {
        let mut grew = false;
        for m in graph.keys() {
            let next: std::collections::BTreeSet<String> = reach[m]
                .iter()
                .flat_map(|n| reach.get(n).cloned().unwrap_or_default())
                .collect();
            let entry = reach.get_mut(m).unwrap();
            let before = entry.len();
            entry.extend(next);
            grew |= entry.len() > before;
        }
        if !grew {
            break;
        }
    }
    let mut found: Vec<Vec<String>> = Vec::new();
    for m in graph.keys() {
        let mut cycle: Vec<String> = graph
            .keys()
            .filter(|n| *n == m || (reach[m].contains(*n) && reach[*n].contains(m)))
            .cloned()
            .collect();
        cycle.sort();
        if cycle.len() > 1 && !found.contains(&cycle) {
            found.push(cycle);
        }
    }
    found
}

/// The import graph between the top modules of the crate in `src_dir`.
fn module_graph(
    src_dir: &str,
) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let modules = top_modules(src_dir);
    let names = modules.keys().cloned().collect();
    modules
        .iter()
        .map(|(name, files)| {
            let mut imports = std::collections::BTreeSet::new();
            for file in files {
                let text = std::fs::read_to_string(repo_path(file)).unwrap();
                let top_level = !file[src_dir.len() + 1..].contains('/');
                imports.extend(module_imports(&text, top_level, &names));
            }
            imports.remove(name);
            (name.clone(), imports)
        })
        .collect()
}

/// The compiler allows two modules of one crate to import each other; the layers inside a
/// crate (ARCHITECTURE.md, Invariants) need them not to.
#[test]
fn no_crate_has_a_cycle_between_its_top_modules() {
    let mut seen = 0;
    for (dir, package) in CRATES {
        let src = if dir.is_empty() {
            "src".to_string()
        } else {
            format!("{dir}/src")
        };
        let graph = module_graph(&src);
        seen += graph.len();
        assert!(
            cycles(&graph).is_empty(),
            "{package}: top modules import each other: {:?}",
            cycles(&graph)
        );
    }
    assert!(seen > 30, "only {seen} top modules found");
}

#[test]
fn the_cycle_check_follows_paths_groups_and_super_and_finds_a_cycle() {
    let names: std::collections::BTreeSet<String> =
        ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
    let text = "use crate::{b, x::y};\n// crate::c in a comment\nfn f() { super::c::g() }";
    let top: Vec<String> = module_imports(text, true, &names).into_iter().collect();
    assert_eq!(top, ["b", "c"]);
    let nested: Vec<String> = module_imports(text, false, &names).into_iter().collect();
    assert_eq!(nested, ["b"]);
    let graph = |edges: &[(&str, &str)]| {
        let mut g = std::collections::BTreeMap::<String, std::collections::BTreeSet<String>>::new();
        for n in &names {
            g.entry(n.clone()).or_default();
        }
        for (from, to) in edges {
            g.get_mut(*from).unwrap().insert(to.to_string());
        }
        g
    };
    assert!(cycles(&graph(&[("a", "b"), ("b", "c")])).is_empty());
    assert_eq!(
        cycles(&graph(&[("a", "b"), ("b", "c"), ("c", "b")])),
        [vec!["b".to_string(), "c".to_string()]]
    );
}
