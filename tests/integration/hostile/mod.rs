//! Hostile servers, targets, inputs and kills, one module per kind of containment.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A silent PostgreSQL, a stalling proxy, a locked barrier table and a count that never returns: each is reported within its bound, naming what was waited for.
mod deadlines;
/// Secrets in paths and echoed answers are masked, URLs redacted in refusals, control characters escaped, Markdown from a target rendered as code.
mod escape;
/// Schedule letters, the interposer's upstream, non-UTF-8 and truncated scenario files: checked before anything runs.
mod inputs;
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

/// What [`run_for`] saw of one run of the binary.
#[derive(Debug)]
pub(super) struct Ran {
    /// The exit code; `None` when it was killed at the limit (or by a signal).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// From the spawn to the exit (or the kill).
    pub took: Duration,
}

/// Runs the binary in `dir` with `DATABASE_URL` unset, then `env` set, killed after `limit`.
/// Both outputs are read while it runs, so a chatty child never blocks on a full pipe.
pub(super) fn run_for(dir: &Path, args: &[&str], env: &[(&str, &str)], limit: Duration) -> Ran {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ticketflow"));
    command.env_remove("DATABASE_URL");
    for (k, v) in env {
        command.env(k, v);
    }
    let started = Instant::now();
    let mut child = command
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let read_all = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = pipe.read_to_string(&mut s);
            s
        })
    };
    let stdout = read_all(Box::new(child.stdout.take().unwrap()));
    let stderr = read_all(Box::new(child.stderr.take().unwrap()));
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ran {
        code,
        took: started.elapsed(),
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

/// [`run_for`], as (exit code, -1 when killed; stderr).
pub(super) fn run_bounded(
    dir: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    limit: Duration,
) -> (i32, String) {
    let ran = run_for(dir, args, env, limit);
    (ran.code.unwrap_or(-1), ran.stderr)
}
