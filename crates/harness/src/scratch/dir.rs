//! A temporary directory the interrupt handler removes too: for a scratch SQLite file,
//! scripts, logs.

use std::path::Path;

use crate::cleanup::Registration;

/// A new temporary directory, removed when dropped and by the interrupt handler
/// ([`crate::cleanup`]; `tempfile`'s own removal runs only on drop, which an exiting process
/// skips): for a scratch SQLite file, scripts, logs.
pub struct ScratchDir {
    dir: Option<tempfile::TempDir>,
    cleanup: Registration,
}

impl std::fmt::Debug for ScratchDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScratchDir")
            .field("path", &self.path())
            .finish()
    }
}

impl ScratchDir {
    /// Creates it in the system's temporary directory (`TMPDIR`). Never returns once the
    /// process was interrupted ([`crate::cleanup::critical`]).
    ///
    /// Will return `Err` if the directory cannot be created.
    pub fn new() -> std::io::Result<Self> {
        let _section = crate::cleanup::critical();
        let dir = tempfile::tempdir()?;
        let path = dir.path().to_path_buf();
        let cleanup = crate::cleanup::register(
            crate::cleanup::Kind::ScratchDirectory,
            path.display().to_string(),
            move || remove_dir_settled(&path),
        );
        Ok(ScratchDir {
            dir: Some(dir),
            cleanup,
        })
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        self.dir.as_ref().map_or(Path::new(""), |d| d.path())
    }
}

/// Removes `path` and everything in it for the interrupt handler, retrying briefly (at most
/// about 100 ms): a racer thread still running may create a file (an SQLite `-wal` or
/// `-journal`) between the listing and the final `rmdir`; once the directory is gone, none
/// can be created in it. `true` when it is gone.
fn remove_dir_settled(path: &Path) -> bool {
    for _ in 0..50 {
        match std::fs::remove_dir_all(path) {
            Ok(()) => return true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return true,
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(2)),
        }
    }
    !path.exists()
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        // Removed first, unregistered after, in one section (as a scratch database).
        let _section = crate::cleanup::critical();
        drop(self.dir.take());
        self.cleanup.cancel();
    }
}
