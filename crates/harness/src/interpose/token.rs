//! The control token of `ticketflow interpose`: a random secret the control server demands as
//! a client's first message, so that only the holders of the token file can reach a
//! service's held statements and parameters (docs/INTERPOSER.md, "Who can reach the control
//! address").
//!
//! The token is 32 bytes from the operating system's generator, written as 64 lowercase hex
//! digits. `ticketflow interpose` writes it to a file created new (never an existing file or
//! a symlink) with mode 0600, and removes the file when it stops. A runner reads it from
//! `[target] interposer_token_file` or the file [`TOKEN_FILE_ENV`] names; a runner that starts
//! the control server itself passes the [`ControlToken`] in memory.

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};

use rand::RngCore;

/// The environment variable a runner reads the control token file's path from when the
/// scenario names none (`[target] interposer_token_file`).
pub const TOKEN_FILE_ENV: &str = "TICKETFLOW_INTERPOSE_TOKEN_FILE";

/// Bytes of randomness in a token (64 hex digits written).
const TOKEN_BYTES: usize = 32;

/// Longest token file read, in bytes: a token and a line end, with room to spare.
const MAX_TOKEN_FILE: u64 = 4096;

/// The secret a control client sends first. Its `Debug` shows no digit of it; it is compared
/// in constant time ([`ControlToken::matches`]).
#[derive(Clone, PartialEq, Eq)]
pub struct ControlToken(String);

impl fmt::Debug for ControlToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ControlToken(***)")
    }
}

/// Why a token file could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The file could not be created (it exists, the folder is missing or not writable).
    #[error("cannot create the control token file {path}: {source} (it must not exist yet; it is created with mode 0600)")]
    Create {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file could not be read.
    #[error("cannot read the control token file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file holds no token of the expected shape.
    #[error("the control token file {path} holds no control token ({TOKEN_BYTES} bytes as hex, as `ticketflow interpose` writes it)")]
    Malformed {
        /// The file.
        path: PathBuf,
    },
}

impl ControlToken {
    /// A new random token (32 bytes from the operating system's generator).
    pub fn generate() -> Self {
        let mut bytes = [0u8; TOKEN_BYTES];
        rand::rngs::OsRng.fill_bytes(&mut bytes);
        ControlToken(bytes.iter().map(|b| format!("{b:02x}")).collect())
    }

    /// The token as sent on the wire. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `offered` is this token, compared in constant time over the token's length (a
    /// wrong length is refused without looking at its bytes).
    pub fn matches(&self, offered: &str) -> bool {
        let (a, b) = (self.0.as_bytes(), offered.as_bytes());
        if a.len() != b.len() {
            return false;
        }
        let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
        std::hint::black_box(diff) == 0
    }

    /// Writes the token to `path`, a file created new with mode 0600 (owner read and write
    /// only): an existing file or symlink at `path` is refused, never overwritten or followed.
    ///
    /// Will return [`TokenError::Create`] when the file cannot be created or written.
    pub fn write_new(&self, path: &Path) -> Result<(), TokenError> {
        let create = |source| TokenError::Create {
            path: path.to_path_buf(),
            source,
        };
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        let mut file = options.open(path).map_err(create)?;
        // The umask can only take bits away; set the mode outright all the same.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            file.set_permissions(std::fs::Permissions::from_mode(0o600))
                .map_err(create)?;
        }
        writeln!(file, "{}", self.0)
            .and_then(|()| file.sync_all())
            .map_err(create)
    }

    /// Reads the token `ticketflow interpose` wrote to `path` (surrounding white space
    /// ignored).
    ///
    /// Will return [`TokenError::Read`] when the file cannot be read and
    /// [`TokenError::Malformed`] when it holds no token.
    pub fn read(path: &Path) -> Result<Self, TokenError> {
        use std::io::Read;
        let read = |source| TokenError::Read {
            path: path.to_path_buf(),
            source,
        };
        let mut text = String::new();
        std::fs::File::open(path)
            .map_err(read)?
            .take(MAX_TOKEN_FILE)
            .read_to_string(&mut text)
            .map_err(|_| TokenError::Malformed {
                path: path.to_path_buf(),
            })?;
        let token = text.trim();
        if token.len() != 2 * TOKEN_BYTES || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(TokenError::Malformed {
                path: path.to_path_buf(),
            });
        }
        Ok(ControlToken(token.to_ascii_lowercase()))
    }
}

/// Where `ticketflow interpose` writes its token file when not told: a new file
/// `ticketflow-interpose-PID-RANDOM.token` in `$XDG_RUNTIME_DIR` (a folder only the user can
/// enter) when it is set and absolute, else in the temporary folder.
pub fn default_token_path() -> PathBuf {
    let dir = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|d| d.is_absolute() && d.is_dir())
        .unwrap_or_else(std::env::temp_dir);
    let mut tag = [0u8; 4];
    rand::rngs::OsRng.fill_bytes(&mut tag);
    let tag: String = tag.iter().map(|b| format!("{b:02x}")).collect();
    dir.join(format!(
        "ticketflow-interpose-{}-{tag}.token",
        std::process::id()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_matches_itself_only_and_never_shows_in_debug() {
        let t = ControlToken::generate();
        assert_eq!(t.expose().len(), 64);
        assert!(t.matches(t.expose()));
        assert!(!t.matches(""));
        assert!(!t.matches(&t.expose()[..63]));
        assert!(!ControlToken::generate().matches(t.expose()));
        assert!(!format!("{t:?}").contains(&t.expose()[..8]));
    }

    #[test]
    fn the_file_is_created_new_with_mode_0600_and_read_back() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.token");
        let t = ControlToken::generate();
        t.write_new(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{mode:o}");
        assert_eq!(ControlToken::read(&path).unwrap(), t);
        // An existing file is never overwritten, nor a symlink followed.
        assert!(matches!(
            ControlToken::generate().write_new(&path),
            Err(TokenError::Create { .. })
        ));
        let link = dir.path().join("link.token");
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), &link).unwrap();
        assert!(ControlToken::generate().write_new(&link).is_err());
        assert!(!dir.path().join("elsewhere").exists());
        std::fs::write(dir.path().join("bad"), "not a token\n").unwrap();
        assert!(matches!(
            ControlToken::read(&dir.path().join("bad")),
            Err(TokenError::Malformed { .. })
        ));
    }
}
