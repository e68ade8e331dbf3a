//! The SQLite door: [`ScratchSqlite`], a file of its own in a new [`ScratchDir`], removed with
//! the directory on drop and by the interrupt handler.

use std::io;
use std::path::{Path, PathBuf};

use ticketflow_core::store::sqlite::{SqliteConfig, SqliteStore};
use ticketflow_core::store::StoreResult;

use super::dir::ScratchDir;

/// A SQLite scratch file: `file_name` in a new [`ScratchDir`]. The file does not exist until
/// the first session opens it, which also migrates it (`SqliteStore::open` and `open_with`
/// migrate), so the caller's first session chooses the journal mode and transaction mode the
/// file is made with.
pub struct ScratchSqlite {
    // Removed, with the file, when the value is dropped.
    _dir: ScratchDir,
    path: PathBuf,
}

impl std::fmt::Debug for ScratchSqlite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScratchSqlite")
            .field("path", &self.path)
            .finish()
    }
}

impl ScratchSqlite {
    /// A new directory for the file `file_name` (a bare name).
    ///
    /// Will return `Err` if the directory cannot be created. Never returns once the process
    /// was interrupted ([`crate::cleanup::critical`]).
    pub fn new(file_name: &str) -> io::Result<Self> {
        let dir = ScratchDir::new()?;
        let path = dir.path().join(file_name);
        Ok(ScratchSqlite { _dir: dir, path })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A new session on the file with `config`; the first one creates and migrates it.
    ///
    /// Will return `Err` if the file cannot be opened or a migration fails.
    pub fn open_with(&self, config: &SqliteConfig) -> StoreResult<SqliteStore> {
        SqliteStore::open_with(&self.path, config)
    }
}
