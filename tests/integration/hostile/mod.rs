//! Hostile servers, targets, inputs and kills, one module per kind of containment.

/// A silent PostgreSQL, a stalling proxy, a locked barrier table and a count that never returns: each is reported within its bound, naming what was waited for.
mod deadlines;
/// Secrets in paths and echoed answers are masked, URLs redacted in refusals, control characters escaped, Markdown from a target rendered as code.
mod escape;
/// A stuck lease with a huge TTL: requests on its key wait without a database session; fresh keys still get 201; out-of-range Redis db and TTL refused at start.
mod lease;
/// Template and URL errors in a scenario file are load errors; a URL with no host is exit 2.
mod load_errors;
/// A SIGKILLed harness leaves no child serving and its scratch databases are swept by the next run or `ticketflow clean`.
mod orphans;
/// Report directories with foreign files and symlinks, and traversal names: the tool removes only what its manifest lists and writes only inside its output directory.
mod outputs;
/// The target's database is only read: count queries in a read-only transaction with their own timeout; setup SQL only in a transaction on the scratch database.
mod readonly;
/// Serve's small ones: a read-only database is 503 with nothing written, a body that times out wrote nothing, serve binds before migrating.
mod small;
