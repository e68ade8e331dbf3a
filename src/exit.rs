//! The exit codes of the `ticketflow` process, every one in this module (docs/CLI.md, the
//! exit-code table). 0–3 are the verdict codes of `verify`, `scenario run` and `soak`; 4 and 5
//! are the answers of `create`, `get` and `update` that are not success; 130 is an
//! interrupt, as shells report a process ended by SIGINT (128 + 2).

/// Success: every run PASSed (`verify`: runs PENDING only for want of a PostgreSQL server at
/// the built-in default URL, or of Redis, allowed unless required); created, replayed, found.
pub const EXIT_PASS: i32 = 0;
/// At least one FAIL, or a database error.
pub const EXIT_FAIL: i32 = 1;
/// A usage error or a bad scenario file: nothing ran.
pub const EXIT_USAGE: i32 = 2;
/// A run was PENDING: it did not run, or could not be set up as declared (or PostgreSQL or
/// Redis was required and missing).
pub const EXIT_PENDING: i32 = 3;
/// Conflict: the idempotency key was used with a different request (HTTP 409).
pub const EXIT_CONFLICT: i32 = 4;
/// The ticket is not found in this tenant (HTTP 404).
pub const EXIT_NOT_FOUND: i32 = 5;
/// Ended by Ctrl-C or SIGTERM (128 + SIGINT's number, as shells do).
pub const EXIT_INTERRUPTED: i32 = 130;

/// `code` as the byte a process exit status holds; every code above fits.
pub const fn byte(code: i32) -> u8 {
    code as u8
}
