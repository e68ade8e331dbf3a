//! Output folders the tool writes into, and only into: a manifest of what it wrote, files
//! removed only when a manifest lists them, nothing written or removed through a symlink, and
//! every file name derived from a scenario or target name confined to its folder.
//!
//! Each folder the tool writes files into holds a manifest, [`MANIFEST`]
//! (`.ticketflow-manifest.json`): `{"version": 1, "tool": "<ticketflow version>", "files":
//! ["<name>", ...]}`, the names (single path components, relative to that folder) of the files
//! the last run wrote there, sorted. A file that exists and is not listed is *foreign*: it is
//! never removed, and overwriting it is refused unless the caller forces it (`--force`).

use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::{Component, Path, PathBuf};

/// The manifest's file name in each output folder.
pub const MANIFEST: &str = ".ticketflow-manifest.json";

/// The manifest format's version ([`Manifest::version`]).
pub(crate) const MANIFEST_VERSION: u32 = 1;

/// What the manifest of an output folder holds.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Manifest {
    /// The format's version: [`MANIFEST_VERSION`].
    pub version: u32,
    /// The version of ticketflow that wrote it (`CARGO_PKG_VERSION`).
    pub tool: String,
    /// The files it wrote, as names relative to the folder (one normal path component each),
    /// sorted.
    pub files: Vec<String>,
}

/// Why an output file or folder was not written (or not removed).
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// A file name derived from a name (a scenario's, a target's) is not a single normal
    /// path component: empty, blank, `.`, `..`, or with a path separator or NUL.
    #[error("{name:?} is not a file name inside {}: {why}", dir.display())]
    NotAName {
        /// The folder it was to go into.
        dir: PathBuf,
        /// The refused name.
        name: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A folder the tool makes, or a file it writes or removes, is a symlink.
    #[error("{} is a symlink: refusing to write or remove anything through it (make it a plain folder or file, or choose another {})", path.display(), ticketflow_core::flags::REPORT)]
    Symlink {
        /// The symlink.
        path: PathBuf,
    },
    /// Something is in the way of a folder or file: a file where a folder goes, or a folder
    /// (or special file) where a file goes.
    #[error("{} is not a {expected}", path.display())]
    InTheWay {
        /// The path.
        path: PathBuf,
        /// `folder` or `regular file`.
        expected: &'static str,
    },
    /// The file exists and the folder's manifest does not list it: the tool did not write it.
    #[error("{} exists and was not written by ticketflow (not listed in {}): refusing to overwrite it; move it away, choose another path, or give {}", path.display(), manifest.display(), ticketflow_core::flags::FORCE)]
    Foreign {
        /// The file.
        path: PathBuf,
        /// The manifest that does not list it.
        manifest: PathBuf,
    },
    /// The manifest cannot be read as one.
    #[error("{}: not a ticketflow manifest ({why}); remove it, or give {} to ignore it", path.display(), ticketflow_core::flags::FORCE)]
    Manifest {
        /// The manifest.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// Reading, creating, writing or removing failed.
    #[error("cannot {what} {}: {source}", path.display())]
    Io {
        /// `create`, `write`, `read`, `remove`.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// `dir` joined with `name`, a file name derived from a scenario or target name.
///
/// Will return `Err` ([`OutputError::NotAName`]) unless `name` is exactly one normal path
/// component: not empty or blank, not `.` or `..`, without `/`, `\` or NUL, and not the
/// manifest's own name.
pub fn confine(dir: &Path, name: &str) -> Result<PathBuf, OutputError> {
    let refuse = |why| OutputError::NotAName {
        dir: dir.to_path_buf(),
        name: name.to_string(),
        why,
    };
    if name.trim().is_empty() {
        return Err(refuse("it is empty or blank"));
    }
    if name.contains(['/', '\\', '\0']) {
        return Err(refuse("it holds a path separator or NUL"));
    }
    if name == MANIFEST {
        return Err(refuse("it is the manifest's name"));
    }
    let mut parts = Path::new(name).components();
    match (parts.next(), parts.next()) {
        (Some(Component::Normal(n)), None) if n == name => Ok(dir.join(name)),
        _ => Err(refuse("it is not a single plain file name")),
    }
}

/// What `path` is, without following a symlink: `None` when it does not exist.
fn kind(path: &Path) -> Result<Option<std::fs::FileType>, OutputError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) => Ok(Some(m.file_type())),
        // Under a file: nothing can be there.
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                || e.raw_os_error() == Some(libc::ENOTDIR) =>
        {
            Ok(None)
        }
        Err(source) => Err(OutputError::Io {
            what: "read",
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// One output folder: `base` (chosen by the user, e.g. the `--report` file's folder; it may
/// itself be a symlink) joined with `sub` (a folder of the tool's, e.g. `reports/details`;
/// empty for `base` itself), every component of `sub` a plain folder (never a symlink).
///
/// [`OutputDir::write`] writes a file and lists it in the manifest (before the file is
/// written, so a run cut short leaves no unlisted file of its own); [`OutputDir::finish`]
/// removes, when the folder is swept, the files the previous manifest listed that this run
/// did not write, and writes the manifest of this run.
#[derive(Debug)]
pub struct OutputDir {
    base: PathBuf,
    sub: PathBuf,
    dir: PathBuf,
    previous: BTreeSet<String>,
    written: BTreeSet<String>,
    force: bool,
    sweep: bool,
}

impl OutputDir {
    /// Opens the output folder `base/sub` (neither need exist yet) and reads its manifest.
    /// `force` lets [`OutputDir::write`] replace foreign files (and ignore an unreadable
    /// manifest); it never lets anything through a symlink. `sweep`: [`OutputDir::finish`]
    /// removes the files of the previous run that this one did not write again (otherwise
    /// they stay, and stay listed).
    ///
    /// Will return `Err` ([`OutputError::Symlink`]) when a component of `sub` or the manifest
    /// is a symlink, ([`OutputError::InTheWay`]) when one is not a folder, or
    /// ([`OutputError::Manifest`]) for an unreadable manifest without `force`.
    pub fn open(base: &Path, sub: &str, force: bool, sweep: bool) -> Result<Self, OutputError> {
        let dir = if sub.is_empty() {
            base.to_path_buf()
        } else {
            base.join(sub)
        };
        let mut out = OutputDir {
            base: base.to_path_buf(),
            sub: PathBuf::from(sub),
            dir,
            previous: BTreeSet::new(),
            written: BTreeSet::new(),
            force,
            sweep,
        };
        out.check_folders(false)?;
        out.previous = out.read_manifest()?;
        Ok(out)
    }

    /// The folder's path.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The manifest's path.
    pub(crate) fn manifest_path(&self) -> PathBuf {
        self.dir.join(MANIFEST)
    }

    /// The folder as the file system takes it (`.` for an empty path: the working directory).
    fn on_disk(&self) -> &Path {
        if self.dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            &self.dir
        }
    }

    /// Checks `base` (a folder, when it exists) and each component of `sub` (a plain folder,
    /// not a symlink); with `create`, makes the missing ones.
    fn check_folders(&self, create: bool) -> Result<(), OutputError> {
        let mut path = self.base.clone();
        // The user's own folder may be a symlink; it must be a folder (when writing: a run
        // may start, and be reported unwritten after it).
        if path.exists() && !path.is_dir() {
            if !create {
                return Ok(());
            }
            return Err(OutputError::InTheWay {
                path,
                expected: "folder",
            });
        }
        if create && !path.as_os_str().is_empty() && !path.exists() {
            std::fs::create_dir_all(&path).map_err(|source| OutputError::Io {
                what: "create",
                path: path.clone(),
                source,
            })?;
        }
        for part in self.sub.components() {
            path.push(part);
            match kind(&path)? {
                Some(t) if t.is_symlink() => return Err(OutputError::Symlink { path }),
                Some(t) if !t.is_dir() => {
                    return Err(OutputError::InTheWay {
                        path,
                        expected: "folder",
                    })
                }
                Some(_) => {}
                None if !create => return Ok(()),
                None => match std::fs::create_dir(&path) {
                    Ok(()) => {}
                    // Made meanwhile: checked again below.
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                        if !kind(&path)?.is_some_and(|t| t.is_dir()) {
                            return Err(OutputError::InTheWay {
                                path,
                                expected: "folder",
                            });
                        }
                    }
                    Err(source) => {
                        return Err(OutputError::Io {
                            what: "create",
                            path,
                            source,
                        })
                    }
                },
            }
        }
        Ok(())
    }

    /// The names the manifest lists (empty when there is none; names that are not one plain
    /// component are dropped: they were never ours).
    fn read_manifest(&self) -> Result<BTreeSet<String>, OutputError> {
        let path = self.manifest_path();
        match kind(&path)? {
            None => return Ok(BTreeSet::new()),
            Some(t) if t.is_symlink() => return Err(OutputError::Symlink { path }),
            Some(_) => {}
        }
        let bad = |why: String| OutputError::Manifest {
            path: path.clone(),
            why,
        };
        let parsed = std::fs::read_to_string(&path)
            .map_err(|e| bad(e.to_string()))
            .and_then(|text| {
                serde_json::from_str::<Manifest>(&text).map_err(|e| bad(e.to_string()))
            })
            .and_then(|m| {
                if m.version == MANIFEST_VERSION {
                    Ok(m)
                } else {
                    Err(bad(format!(
                        "version {}, this ticketflow reads {MANIFEST_VERSION}",
                        m.version
                    )))
                }
            });
        match parsed {
            Ok(m) => Ok(m
                .files
                .into_iter()
                .filter(|n| confine(&self.dir, n).is_ok())
                .collect()),
            Err(_) if self.force => Ok(BTreeSet::new()),
            Err(e) => Err(e),
        }
    }

    /// Writes the manifest listing `names`, atomically (a temporary file renamed over it).
    fn save_manifest(&self, names: &BTreeSet<String>) -> Result<(), OutputError> {
        let path = self.manifest_path();
        if kind(&path)?.is_some_and(|t| t.is_symlink()) {
            return Err(OutputError::Symlink { path });
        }
        let manifest = Manifest {
            version: MANIFEST_VERSION,
            tool: env!("CARGO_PKG_VERSION").to_string(),
            files: names.iter().cloned().collect(),
        };
        let text = serde_json::to_string_pretty(&manifest).expect("a manifest serializes") + "\n";
        let io = |what, source| OutputError::Io {
            what,
            path: path.clone(),
            source,
        };
        let mut tmp =
            tempfile::NamedTempFile::new_in(self.on_disk()).map_err(|e| io("write", e))?;
        tmp.write_all(text.as_bytes()).map_err(|e| io("write", e))?;
        // Readable as the reports beside it are (a temporary file starts owner-only).
        {
            use std::os::unix::fs::PermissionsExt as _;
            tmp.as_file()
                .set_permissions(std::fs::Permissions::from_mode(0o644))
                .map_err(|e| io("write", e))?;
        }
        // rename(2) replaces the name itself, never a file a symlink there points to.
        tmp.persist(&path).map_err(|e| io("write", e.error))?;
        Ok(())
    }

    /// Where `name` would be written, checked: confined to the folder ([`confine`]), not a
    /// symlink, not a folder, and when it exists, listed in the manifest (or `force`).
    ///
    /// Will return `Err` ([`OutputError`]) for the first of these that fails.
    pub fn check(&self, name: &str) -> Result<PathBuf, OutputError> {
        let path = confine(&self.dir, name)?;
        match kind(&path)? {
            None => Ok(path),
            Some(t) if t.is_symlink() => Err(OutputError::Symlink { path }),
            Some(t) if !t.is_file() => Err(OutputError::InTheWay {
                path,
                expected: "regular file",
            }),
            Some(_)
                if self.force || self.previous.contains(name) || self.written.contains(name) =>
            {
                Ok(path)
            }
            Some(_) => Err(OutputError::Foreign {
                path,
                manifest: self.manifest_path(),
            }),
        }
    }

    /// Writes `text` to `name` in the folder (made if missing, [`OutputDir::check`]ed), after
    /// listing it in the manifest; returns its path. The file is opened with `O_NOFOLLOW`, so a
    /// symlink put there meanwhile is not followed.
    ///
    /// Will return `Err` ([`OutputError`]) when a check fails or the folder, the manifest or
    /// the file cannot be written.
    pub fn write(&mut self, name: &str, text: &[u8]) -> Result<PathBuf, OutputError> {
        self.check_folders(true)?;
        let path = self.check(name)?;
        if !self.previous.contains(name) && !self.written.contains(name) {
            let mut listed: BTreeSet<String> =
                self.previous.union(&self.written).cloned().collect();
            listed.insert(name.to_string());
            self.save_manifest(&listed)?;
        }
        self.written.insert(name.to_string());
        let io = |source| OutputError::Io {
            what: "write",
            path: path.clone(),
            source,
        };
        let mut file = {
            use std::os::unix::fs::OpenOptionsExt as _;
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&path)
                .map_err(|e| {
                    if e.raw_os_error() == Some(libc::ELOOP) {
                        OutputError::Symlink { path: path.clone() }
                    } else {
                        io(e)
                    }
                })?
        };
        file.write_all(text).map_err(io)?;
        Ok(path)
    }

    /// Ends this run's writing into the folder: when it is swept, removes each regular file
    /// the previous manifest listed that this run did not write (a symlink or folder by that
    /// name is left alone), then writes the manifest of what this run wrote (plus, when not
    /// swept, the previous run's files that are still there). A folder nothing was ever
    /// written into is left as it is. Returns the files removed.
    ///
    /// Will return `Err` ([`OutputError`]) when a folder has become a symlink, or a file
    /// cannot be removed or the manifest written.
    pub fn finish(self) -> Result<Vec<PathBuf>, OutputError> {
        let stale: Vec<&String> = self.previous.difference(&self.written).collect();
        if self.written.is_empty() && self.previous.is_empty() {
            return Ok(Vec::new());
        }
        if kind(self.on_disk())?.is_none() {
            return Ok(Vec::new());
        }
        self.check_folders(false)?;
        let mut removed = Vec::new();
        let mut kept = self.written.clone();
        for name in stale {
            let Ok(path) = confine(&self.dir, name) else {
                continue;
            };
            match kind(&path)? {
                Some(t) if t.is_file() && self.sweep => {
                    std::fs::remove_file(&path).map_err(|source| OutputError::Io {
                        what: "remove",
                        path: path.clone(),
                        source,
                    })?;
                    removed.push(path);
                }
                Some(t) if t.is_file() => {
                    kept.insert(name.clone());
                }
                _ => {}
            }
        }
        self.save_manifest(&kept)?;
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn confine_takes_one_plain_component_only() {
        let dir = Path::new("/out");
        for good in [
            "a.md",
            "scenario-x.read-committed.spec",
            "..a",
            "a..b",
            ".hidden",
        ] {
            assert_eq!(confine(dir, good).unwrap(), dir.join(good), "{good}");
        }
        for bad in [
            "",
            " ",
            "\t",
            ".",
            "..",
            "../x",
            "../../x",
            "a/b",
            "/etc/passwd",
            "a\\b",
            "a\0b",
            "a/",
            "./a",
            MANIFEST,
        ] {
            assert!(confine(dir, bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn foreign_files_are_refused_unless_forced_and_ours_are_swept() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path();
        std::fs::create_dir_all(base.join("d")).unwrap();
        std::fs::write(base.join("d/foreign.md"), "x").unwrap();
        let mut out = OutputDir::open(base, "d", false, true).unwrap();
        assert!(matches!(
            out.write("foreign.md", b"y"),
            Err(OutputError::Foreign { .. })
        ));
        out.write("a.md", b"a").unwrap();
        out.write("b.md", b"b").unwrap();
        assert!(out.finish().unwrap().is_empty());
        // The next run writes a only: b (ours) goes, the foreign file stays.
        let mut out = OutputDir::open(base, "d", false, true).unwrap();
        out.write("a.md", b"a2").unwrap();
        let removed = out.finish().unwrap();
        assert_eq!(removed, vec![base.join("d/b.md")]);
        assert_eq!(
            std::fs::read_to_string(base.join("d/foreign.md")).unwrap(),
            "x"
        );
        let m: Manifest =
            serde_json::from_str(&std::fs::read_to_string(base.join("d").join(MANIFEST)).unwrap())
                .unwrap();
        assert_eq!(m.files, vec!["a.md".to_string()]);
        // Forced, the foreign file is replaced and becomes ours.
        let mut out = OutputDir::open(base, "d", true, true).unwrap();
        out.write("foreign.md", b"z").unwrap();
        out.finish().unwrap();
        assert!(!base.join("d/a.md").exists());
        assert!(OutputDir::open(base, "d", false, true)
            .unwrap()
            .check("foreign.md")
            .is_ok());
    }

    #[test]
    fn symlinks_are_never_written_or_removed_through() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path();
        let elsewhere = base.join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::fs::create_dir(base.join("r")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, base.join("r/details")).unwrap();
        assert!(matches!(
            OutputDir::open(base, "r/details", true, true),
            Err(OutputError::Symlink { .. })
        ));
        std::fs::write(elsewhere.join("t.md"), "keep").unwrap();
        std::os::unix::fs::symlink(elsewhere.join("t.md"), base.join("x.md")).unwrap();
        let mut out = OutputDir::open(base, "", true, true).unwrap();
        assert!(matches!(
            out.write("x.md", b"no"),
            Err(OutputError::Symlink { .. })
        ));
        assert_eq!(
            std::fs::read_to_string(elsewhere.join("t.md")).unwrap(),
            "keep"
        );
    }
}
