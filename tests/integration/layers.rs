//! Layers, by what the compiler cannot say. The crates are the layers (ARCHITECTURE.md):
//! `ticketflow` (the command line, `verify`) → `ticketflow-report` → `ticketflow-harness` →
//! `ticketflow-core`, and `ticketflow` → `ticketflow-serve` → `ticketflow-core`; a module
//! cannot import a crate its manifest does not name, so the direction holds by construction.
//! What is left to check here: the manifests keep that direction and the core's invariants of
//! absence (no command-line, HTTP-server, property-test, progress-bar, XML or HTTP-client
//! crate), ARCHITECTURE.md's code map names every source file and module directory, in
//! directory order, so a new file without an entry fails here, and no two top modules of one
//! crate, and no two files or subfolders of one folder, import each other (through any chain).

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
    assert_eq!(listed, ticketflow_harness::killmatrix::LOOM_SOURCES);
}

/// The module path of a source file below a crate's `src/` (`rel`, `/`-separated):
/// `a/b.rs` → `a::b`, `a/mod.rs` → `a`, `lib.rs` and `main.rs` → the crate root (empty).
fn module_path(rel: &str) -> Vec<String> {
    let mut parts: Vec<String> = rel.split('/').map(String::from).collect();
    let last = parts.pop().unwrap_or_default();
    if !matches!(last.as_str(), "mod.rs" | "lib.rs" | "main.rs") {
        parts.push(last.trim_end_matches(".rs").to_string());
    }
    parts
}

/// The module paths `text` (the file of module `module`) names by `crate::`, `super::` and
/// `self::` paths, resolved from the crate root, with `{…}` groups (nested too, across lines)
/// expanded into one path per item. Line comments are skipped.
fn named_paths(text: &str, module: &[String]) -> Vec<Vec<String>> {
    let code: Vec<char> = text
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
        .chars()
        .collect();
    let is_word = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = Vec::new();
    let mut i = 0;
    while i < code.len() {
        if !is_word(code[i]) || (i > 0 && (is_word(code[i - 1]) || code[i - 1] == ':')) {
            i += 1;
            continue;
        }
        let start = i;
        while i < code.len() && is_word(code[i]) {
            i += 1;
        }
        let head: String = code[start..i].iter().collect();
        let base: Vec<String> = match head.as_str() {
            "crate" => Vec::new(),
            "super" => module[..module.len().saturating_sub(1)].to_vec(),
            "self" => module.to_vec(),
            _ => continue,
        };
        if code.get(i..i + 2) != Some(&[':', ':']) {
            continue;
        }
        i += 2;
        i = path_tree(&code, i, base, &mut out);
    }
    out
}

/// Reads the rest of a path (after its `::`) at `code[i..]`: segments, a leading run of
/// `super`, or a `{…}` group; pushes `prefix` extended by each path named; returns where it
/// ended.
fn path_tree(
    code: &[char],
    mut i: usize,
    mut prefix: Vec<String>,
    out: &mut Vec<Vec<String>>,
) -> usize {
    let skip_space = |code: &[char], mut i: usize| {
        while i < code.len() && code[i].is_whitespace() {
            i += 1;
        }
        i
    };
    loop {
        i = skip_space(code, i);
        if code.get(i) == Some(&'{') {
            i += 1;
            loop {
                i = skip_space(code, i);
                match code.get(i) {
                    None => return i,
                    Some('}') => return i + 1,
                    Some(',') => i += 1,
                    Some(_) => {
                        let before = i;
                        i = path_tree(code, i, prefix.clone(), out);
                        if i == before {
                            i += 1;
                        }
                    }
                }
            }
        }
        let start = i;
        while i < code.len() && (code[i].is_alphanumeric() || code[i] == '_') {
            i += 1;
        }
        let segment: String = code[start..i].iter().collect();
        match segment.as_str() {
            "" => {
                out.push(prefix);
                return i;
            }
            "self" => {}
            "super" => {
                prefix.pop();
            }
            _ => prefix.push(segment),
        }
        let after = skip_space(code, i);
        if code.get(after..after + 2) == Some(&[':', ':']) {
            i = after + 2;
        } else {
            out.push(prefix);
            return i;
        }
    }
}

/// The source files of the crate in `src_dir` (repository-relative): each file's path, its
/// module path ([`module_path`]) and its text.
fn crate_files(src_dir: &str) -> Vec<(String, Vec<String>, String)> {
    let prefix = format!("{src_dir}/");
    source_files()
        .into_iter()
        .filter_map(|f| {
            let module = module_path(f.strip_prefix(&prefix)?);
            let text = std::fs::read_to_string(repo_path(&f)).unwrap();
            Some((f, module, text))
        })
        .collect()
}

/// The import graph of each folder of a crate (`files` as [`crate_files`] gives them), the
/// crate root included (as `""`): folder → (node → the nodes it imports). A folder's nodes are
/// its files and subfolders (`mod.rs`, `lib.rs` and `main.rs` are the node `mod`); a file
/// anywhere below a node imports another node of that folder when one of its paths
/// ([`named_paths`]) leads into it. Each edge keeps one example: the importing file and path.
fn folder_graphs(
    files: &[(String, Vec<String>, String)],
) -> std::collections::BTreeMap<String, FolderGraph> {
    let mut graphs = std::collections::BTreeMap::<String, FolderGraph>::new();
    let node_of = |module: &[String], folder: &[String]| -> Option<String> {
        if !module.starts_with(folder) {
            return None;
        }
        Some(
            module
                .get(folder.len())
                .cloned()
                .unwrap_or_else(|| "mod".to_string()),
        )
    };
    // Every folder (a module path with files below it) and its nodes.
    for (_, module, _) in files {
        for depth in 0..=module.len() {
            let folder = &module[..depth];
            let is_folder = files
                .iter()
                .any(|(_, m, _)| m.len() > depth && m.starts_with(folder));
            if is_folder {
                let graph = graphs.entry(folder.join("/")).or_default();
                graph.entry(node_of(module, folder).unwrap()).or_default();
            }
        }
    }
    for (file, module, text) in files {
        for path in named_paths(text, module) {
            for (folder_name, graph) in graphs.iter_mut() {
                let folder: Vec<String> = if folder_name.is_empty() {
                    Vec::new()
                } else {
                    folder_name.split('/').map(String::from).collect()
                };
                let (Some(from), Some(to)) = (node_of(module, &folder), node_of(&path, &folder))
                else {
                    continue;
                };
                if from == to || to == "mod" || !graph.contains_key(&to) {
                    continue;
                }
                let shown = format!("{file}: {}", path.join("::"));
                graph.get_mut(&from).unwrap().entry(to).or_insert(shown);
            }
        }
    }
    graphs
}

/// `graph`'s edges without their examples, as [`cycles`] takes them.
fn edge_sets(
    graph: &FolderGraph,
) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    graph
        .iter()
        .map(|(n, to)| (n.clone(), to.keys().cloned().collect()))
        .collect()
}

/// One folder's import graph: node → (imported node → the file and path that import it).
type FolderGraph = std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>;

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

/// The compiler allows two modules of one crate, or two files of one folder, to import each
/// other; the layers inside a crate and inside each folder (ARCHITECTURE.md, Invariants) need
/// them not to.
#[test]
fn no_folder_of_any_crate_has_an_import_cycle() {
    let mut folders = 0;
    let mut nodes = 0;
    let mut problems = Vec::new();
    for (dir, package) in CRATES {
        let src = if dir.is_empty() {
            "src".to_string()
        } else {
            format!("{dir}/src")
        };
        for (folder, graph) in folder_graphs(&crate_files(&src)) {
            folders += 1;
            nodes += graph.len();
            for cycle in cycles(&edge_sets(&graph)) {
                let through: Vec<&String> = cycle
                    .iter()
                    .flat_map(|n| graph[n].iter())
                    .filter(|(to, _)| cycle.contains(to))
                    .map(|(_, shown)| shown)
                    .collect();
                problems.push(format!(
                    "{package} {src}/{folder}: {cycle:?} import each other: {through:#?}"
                ));
            }
        }
    }
    assert!(
        folders > 12 && nodes > 100,
        "only {folders} folders, {nodes} nodes found"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_cycle_check_follows_paths_groups_super_and_self_and_finds_a_cycle() {
    let module = |m: &str| -> Vec<String> { m.split("::").map(String::from).collect() };
    let text = "use crate::{b, x::{y, z::w}};\n// crate::c in a comment\n\
                use super::{\n    c::d,\n    e,\n};\nfn f() { super::super::g::h() }\n\
                use self::k::l; let _ = crate::m::n::o;";
    let paths: Vec<String> = named_paths(text, &module("p::q::r"))
        .into_iter()
        .map(|p| p.join("::"))
        .collect();
    assert_eq!(
        paths,
        [
            "b",
            "x::y",
            "x::z::w",
            "p::q::c::d",
            "p::q::e",
            "p::g::h",
            "p::q::r::k::l",
            "m::n::o"
        ]
    );
    assert_eq!(module_path("a/mod.rs"), module("a"));
    assert_eq!(module_path("a/b.rs"), module("a::b"));
    assert!(module_path("lib.rs").is_empty());
    // A planted folder `a` whose file `b` and subfolder `c` import each other, and whose
    // `mod.rs` imports both (`mod` is never imported, so it lies on no cycle).
    let planted = |rel: &str, text: &str| (rel.to_string(), module_path(rel), text.to_string());
    let files = [
        planted("lib.rs", "pub mod a;"),
        planted("a/mod.rs", "pub use self::{b::X, c::Y};"),
        planted("a/b.rs", "use super::c::inner::Y; // super::d"),
        planted("a/c/mod.rs", "pub mod inner;"),
        planted("a/c/inner.rs", "use crate::a::b::X;\nuse super::super::d;"),
        planted("a/d.rs", "use crate::a::{b, c::{self}};"),
    ];
    let graphs = folder_graphs(&files);
    assert_eq!(graphs.keys().collect::<Vec<_>>(), ["", "a", "a/c"]);
    let edges = |folder: &str| -> Vec<String> {
        graphs[folder]
            .iter()
            .flat_map(|(n, to)| to.keys().map(move |t| format!("{n}->{t}")))
            .collect()
    };
    assert_eq!(
        edges("a"),
        ["b->c", "c->b", "c->d", "d->b", "d->c", "mod->b", "mod->c"]
    );
    assert_eq!(edges("a/c"), Vec::<String>::new());
    assert_eq!(graphs["a"]["b"]["c"], "a/b.rs: a::c::inner::Y");
    assert_eq!(cycles(&edge_sets(&graphs["a"])), [["b", "c", "d"]]);
    let graph = |edges: &[(&str, &str)]| {
        let mut g = std::collections::BTreeMap::<String, std::collections::BTreeSet<String>>::new();
        for n in ["a", "b", "c"] {
            g.entry(n.to_string()).or_default();
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

/// What in `text` (a source file) hands another crate's items on under this crate's name: a
/// `pub use` of a workspace crate's path, or, in a `lib.rs`, a `use` of another crate's top
/// modules (`use ticketflow_core::{store, domain};`: the old way of re-importing the core's
/// modules as `crate::store`, `crate::domain`).
fn reexport_problems(file: &str, text: &str) -> Vec<String> {
    let lib = file.ends_with("/lib.rs");
    let top_modules = |rest: &str| {
        let Some((_, items)) = rest.trim_end_matches(';').split_once("::") else {
            return false;
        };
        let items = items.trim_start_matches('{').trim_end_matches('}');
        items.split(',').map(str::trim).any(|item| {
            !item.is_empty()
                && !item.contains("::")
                && item.chars().all(|c| c.is_ascii_lowercase() || c == '_')
        })
    };
    text.lines()
        .enumerate()
        .filter(|(_, line)| {
            let line = line.trim_start();
            if line.starts_with("pub use ticketflow_")
                || line.starts_with("pub(crate) use ticketflow_")
            {
                return true;
            }
            lib && line
                .strip_prefix("use ")
                .is_some_and(|rest| rest.starts_with("ticketflow_") && top_modules(rest))
        })
        .map(|(i, line)| format!("{file}:{}: {}", i + 1, line.trim()))
        .collect()
}

#[test]
fn no_crate_hands_on_another_crates_items_under_its_own_name() {
    let problems: Vec<String> = source_files()
        .iter()
        .flat_map(|file| {
            let text = std::fs::read_to_string(repo_path(file)).unwrap();
            reexport_problems(file, &text)
        })
        .collect();
    assert!(
        problems.is_empty(),
        "re-exports of another crate's items (import them from the crate that owns them): {problems:#?}"
    );
}

#[test]
fn the_reexport_check_flags_a_pub_use_and_a_lib_alias_but_not_a_plain_use() {
    let module = "use ticketflow_core::store::Store;\npub use ticketflow_core::wire::KEY_HEADER;\n";
    assert_eq!(
        reexport_problems("crates/serve/src/conn.rs", module),
        ["crates/serve/src/conn.rs:2: pub use ticketflow_core::wire::KEY_HEADER;"]
    );
    let lib = "pub mod a;\nuse ticketflow_core::{store, domain};\n";
    assert_eq!(reexport_problems("crates/harness/src/lib.rs", lib).len(), 1);
    let plain = "pub mod a;\nuse ticketflow_core::wire::{KEY_HEADER, problem::Problem};\n";
    assert!(reexport_problems("crates/serve/src/lib.rs", plain).is_empty());
}
