//! The one loader of scenario files, for `verify` and `scenario run` alike: files and
//! directories, each file a library scenario ([`crate::scenario`]) or a black-box one (a
//! `[target]` table, [`crate::blackbox`]).

use std::path::{Path, PathBuf};

use crate::blackbox::format::secret_env;
use crate::blackbox::{is_target_file, TargetScenario};
use crate::scenario::{Scenario, ScenarioError};

/// The `*.toml` files directly in `dir`, sorted by name (the files `verify` loads, and what
/// `scenario run DIR` runs).
///
/// Will return `Err` when `dir` cannot be read.
pub(crate) fn toml_files_in(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    Ok(files)
}

/// For a relative `path` that cannot be read: ` (relative to the working directory CWD;
/// HINT)`, so the message says where it was looked for; empty for an absolute path.
pub fn where_hint(path: &Path, hint: &str) -> String {
    if path.is_absolute() {
        return String::new();
    }
    let cwd = std::env::current_dir()
        .map(|d| d.display().to_string())
        .unwrap_or_else(|_| "?".into());
    format!(" (relative to the working directory {cwd}; {hint})")
}

/// Every scenario file in a directory: library scenarios and black-box ones.
#[derive(Debug, Clone, Default)]
pub struct Loaded {
    /// Library scenarios (racers call the create protocol).
    pub scenarios: Vec<Scenario>,
    /// Black-box scenarios (a `[target]` table: racers are HTTP clients of a service).
    pub targets: Vec<TargetScenario>,
}

/// Why scenario files could not be loaded ([`load`]).
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A directory cannot be listed.
    #[error("{}: cannot read scenario directory: {source}{hint}", path.display())]
    Directory {
        /// The directory.
        path: PathBuf,
        /// Where a relative path was looked for, and what to do ([`where_hint`]); may be
        /// empty.
        hint: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A directory holds no `*.toml` file: nothing would run.
    #[error("{}: no scenario files (*.toml) in this directory; nothing to run", .0.display())]
    EmptyDirectory(PathBuf),
    /// A file cannot be read.
    #[error("{}: cannot read scenario: {source}{hint}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// Where a relative path was looked for, and what to do; may be empty.
        hint: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A file is not a valid scenario.
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
}

/// What a [`LoadError`] for a relative path that cannot be read tells the user to do
/// (after where it was looked for, [`where_hint`]); `None` adds nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoadHints<'a> {
    /// For a directory.
    pub directory: Option<&'a str>,
    /// For a file.
    pub file: Option<&'a str>,
}

/// The one loader of scenario files, for `verify` and `scenario run` alike: each path is a
/// file, or a directory standing for the `*.toml` files directly in it (sorted by name). A
/// file with a `[target]` table is a black-box scenario ([`crate::blackbox::format`]), any
/// other a library scenario (one file may hold several). A check file ([`is_check_file`]) in
/// a directory is skipped. Stops at the first bad path.
///
/// Will return `Err` ([`LoadError`]) naming the directory that cannot be listed or holds no
/// `*.toml`, the file that cannot be read, or the file and line of the first bad scenario.
pub fn load(paths: &[PathBuf], hints: LoadHints<'_>) -> Result<Loaded, LoadError> {
    // (file, found in a directory)
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            files.extend(
                scenario_files_in(path, hints.directory)?
                    .into_iter()
                    .map(|f| (f, true)),
            );
        } else {
            files.push((path.clone(), false));
        }
    }
    let mut all = Loaded::default();
    for (f, in_directory) in &files {
        let bytes = std::fs::read(f).map_err(|source| LoadError::File {
            path: f.clone(),
            hint: hints.file.map(|h| where_hint(f, h)).unwrap_or_default(),
            source,
        })?;
        let text = crate::scenario::format::utf8_text(f, bytes)?;
        // A check file beside the scenarios (`target init` writes one) is `check`'s; named
        // on its own, it is refused with the command that runs it.
        if *in_directory && is_check_file(&text) {
            continue;
        }
        if is_target_file(&text) {
            all.targets
                .push(TargetScenario::parse(f, &text, &secret_env)?);
        } else {
            all.scenarios.extend(Scenario::parse(f, &text)?);
        }
    }
    Ok(all)
}

/// Whether TOML text is a check file (a top-level `[check]` table, `ticketflow check`).
pub fn is_check_file(text: &str) -> bool {
    toml::from_str::<toml::Table>(text)
        .map(|t| t.contains_key("check"))
        .unwrap_or(false)
}

/// The `*.toml` files directly in the directory `dir` ([`toml_files_in`]), at least one.
///
/// Will return `Err` ([`LoadError::Directory`], with `hint` after where a relative path was
/// looked for) when `dir` cannot be listed (missing, or not a directory), or
/// [`LoadError::EmptyDirectory`].
fn scenario_files_in(dir: &Path, hint: Option<&str>) -> Result<Vec<PathBuf>, LoadError> {
    let files = toml_files_in(dir).map_err(|source| LoadError::Directory {
        path: dir.to_path_buf(),
        hint: hint.map(|h| where_hint(dir, h)).unwrap_or_default(),
        source,
    })?;
    if files.is_empty() {
        return Err(LoadError::EmptyDirectory(dir.to_path_buf()));
    }
    Ok(files)
}

/// Every scenario in the directory `dir`, as `verify` loads `--scenarios` ([`load`] of its
/// `*.toml` files).
///
/// Will return `Err` as [`load`] does; a `dir` that is missing or not a directory is
/// [`LoadError::Directory`].
pub fn load_all(dir: &Path) -> Result<Loaded, LoadError> {
    let hint = format!(
        "run from the repository root, or pass {} DIR",
        ticketflow_core::flags::SCENARIOS
    );
    let files = scenario_files_in(dir, Some(&hint))?;
    load(&files, LoadHints::default())
}

/// The library scenarios in `dir` ([`load_all`] without the black-box ones).
///
/// Will return `Err` as [`load_all`] does.
pub fn load_dir(dir: &Path) -> Result<Vec<Scenario>, LoadError> {
    load_all(dir).map(|l| l.scenarios)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One loader for both commands: files and directories mixed, library and black-box
    /// files told apart; an empty directory, a missing file and a missing `--scenarios`
    /// directory are their own errors.
    #[test]
    fn load_takes_files_and_directories_and_names_what_it_cannot_read() {
        // The repository root: this crate is `crates/harness`.
        let root = &Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let loaded = load(
            &[
                root.join("scenarios/negative"),
                root.join("scenarios/a-same-key-same-body.toml"),
            ],
            LoadHints::default(),
        )
        .unwrap();
        assert_eq!(loaded.scenarios.len(), 1);
        assert_eq!(
            loaded.targets.len(),
            toml_files_in(&root.join("scenarios/negative"))
                .unwrap()
                .len()
        );
        let empty = tempfile::tempdir().unwrap();
        assert!(matches!(
            load(&[empty.path().to_path_buf()], LoadHints::default()),
            Err(LoadError::EmptyDirectory(_))
        ));
        let missing = load(
            &[PathBuf::from("no-such-dir/x.toml")],
            LoadHints {
                directory: None,
                file: Some("give a path from there"),
            },
        )
        .unwrap_err();
        assert!(matches!(missing, LoadError::File { .. }), "{missing}");
        assert!(
            missing.to_string().contains("give a path from there"),
            "{missing}"
        );
        let not_a_dir = load_all(&root.join("scenarios/a-same-key-same-body.toml")).unwrap_err();
        assert!(
            matches!(not_a_dir, LoadError::Directory { .. }),
            "{not_a_dir}"
        );
    }
}
