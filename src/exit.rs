//! The exit codes of the `ticketflow` process, every one in this module (docs/CLI.md, the
//! exit-code table): one type, [`Exit`]. 0–3 are the verdict codes of `verify`, `scenario run`
//! and `soak`; 4 and 5 are the answers of `create`, `get` and `update` that are not success;
//! 130 is an interrupt, as shells report a process ended by SIGINT (128 + 2).
//!
//! The `EXIT_…` constants are the same codes as numbers, for what carries a code as a number
//! (`report.json`'s `exit_code`, [`crate::verify::VerifyOutcome::exit_code`]).

/// How the `ticketflow` process ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Exit {
    /// Success (0): every run PASSed (`verify`: runs PENDING only for want of a PostgreSQL
    /// server at the built-in default URL, or of Redis, allowed unless required); created,
    /// replayed, found.
    Pass,
    /// Failure (1): at least one FAIL, or a database error.
    Fail,
    /// Usage (2): a usage error or a bad scenario file; nothing ran.
    Usage,
    /// Pending (3): a run did not run, or could not be set up as declared (or
    /// PostgreSQL or Redis was required and missing).
    Pending,
    /// Conflict (4): the idempotency key was used with a different request (HTTP 409).
    Conflict,
    /// Not found (5): the ticket is not in this tenant (HTTP 404).
    NotFound,
    /// Interrupted (130): ended by Ctrl-C (128 + SIGINT's number, as shells do). SIGTERM and
    /// SIGHUP end the process the same way with 143 and 129, and a closed stdout with 141
    /// (`ticketflow_harness::cleanup::end_as`).
    Interrupted,
}

impl Exit {
    /// The process exit status.
    pub const fn code(self) -> i32 {
        match self {
            Exit::Pass => 0,
            Exit::Fail => 1,
            Exit::Usage => 2,
            Exit::Pending => 3,
            Exit::Conflict => 4,
            Exit::NotFound => 5,
            Exit::Interrupted => 130,
        }
    }

    /// [`Exit::code`] as the byte a process exit status holds; every code fits.
    pub const fn byte(self) -> u8 {
        self.code() as u8
    }
}

/// [`Exit::Pass`]'s code.
pub const EXIT_PASS: i32 = Exit::Pass.code();
/// [`Exit::Fail`]'s code.
pub const EXIT_FAIL: i32 = Exit::Fail.code();
/// [`Exit::Usage`]'s code.
pub const EXIT_USAGE: i32 = Exit::Usage.code();
/// [`Exit::Pending`]'s code.
pub const EXIT_PENDING: i32 = Exit::Pending.code();

/// `code` (one of the codes above, as a number) as the byte a process exit status holds.
pub const fn byte(code: i32) -> u8 {
    code as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The codes are distinct, fit a byte, and are docs/CLI.md's table.
    #[test]
    fn the_codes_are_the_documented_table() {
        let all = [
            Exit::Pass,
            Exit::Fail,
            Exit::Usage,
            Exit::Pending,
            Exit::Conflict,
            Exit::NotFound,
            Exit::Interrupted,
        ];
        let codes: Vec<i32> = all.iter().map(|e| e.code()).collect();
        assert_eq!(codes, [0, 1, 2, 3, 4, 5, 130]);
        assert!(all.iter().all(|e| i32::from(e.byte()) == e.code()));
    }
}
