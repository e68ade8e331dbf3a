//! `ticketflow bench --interposer`'s isolation-tester row: PostgreSQL's isolation tester
//! (`src/test/isolation` in the PostgreSQL sources; the binary ships with the server's
//! development files under `$(pg_config --pkglibdir)/pgxs/src/test/isolation/`) running every
//! permutation of one recorded race's statements, beside our exploration of the same race.
//!
//! The race is the first schedule of the two-racer file (`savepoint`, one key), exported as
//! an isolation-tester spec ([`crate::blackbox::isolation::render_schedule`]) with its one
//! `permutation` line taken out, so that the tester runs every permutation of the steps (its
//! rule when a spec names none), and a `teardown` that empties `serve`'s tables between
//! permutations. The tester replays the recorded statements verbatim: a permutation is an
//! order of statements, not of a service's requests (no branch a service would take on what
//! it saw), so its count is that of every interleaving, with no reduction.
//!
//! Figures, not assertions.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;
use ticketflow_core::protocol::Protocol;
use ticketflow_core::store::url::PgServer;
use ticketflow_core::variants::Implementation;

use crate::scratch::ScratchDb;

/// The isolation-tester row.
#[derive(Debug, Clone, Serialize)]
pub struct TesterRow {
    /// The race: its file, protocol and schedule.
    pub race: String,
    /// Steps in the spec (statements of every session).
    pub steps: usize,
    /// Permutations the tester ran (its `starting permutation` lines).
    pub permutations: usize,
    /// Seconds from the tester's start to its end (the scratch database made before).
    pub seconds: f64,
    /// Permutations per second.
    pub per_second: f64,
    /// Why the row has no figures (no tester, a spec that could not be written, a tester
    /// that failed or ran out of [`TESTER_TIMEOUT`]), if it has none.
    pub not_run: Option<String>,
}

/// Longest the tester may run; past it, it is stopped and the row says so.
pub const TESTER_TIMEOUT: Duration = Duration::from_secs(300);

/// PostgreSQL's isolation tester: `$ISOLATIONTESTER`, else where `pg_config` says it is
/// (`$(pg_config --pkglibdir)/pgxs/src/test/isolation/isolationtester`); `None` without
/// either (the path is not checked to exist).
pub fn isolationtester() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ISOLATIONTESTER") {
        return Some(p.into());
    }
    let out = std::process::Command::new("pg_config")
        .arg("--pkglibdir")
        .output()
        .ok()?;
    let lib = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (!lib.is_empty()).then(|| Path::new(&lib).join("pgxs/src/test/isolation/isolationtester"))
}

/// `spec` with its `permutation` lines taken out (the tester then runs every permutation) and
/// a `teardown` emptying `serve`'s tables before the first session; and its step count.
fn every_permutation(spec: &str) -> (String, usize) {
    let mut out = String::new();
    let mut teardown = false;
    let mut steps = 0;
    for line in spec.lines() {
        if line.starts_with("permutation ") {
            continue;
        }
        if line.starts_with("session ") && !teardown {
            out.push_str(
                "teardown { TRUNCATE tickets, outbox_events, idempotency_receipts CASCADE; }\n\n",
            );
            teardown = true;
        }
        if line.starts_with("step ") {
            steps += 1;
        }
        out.push_str(line);
        out.push('\n');
    }
    (out, steps)
}

/// The row: the two-racer file's first schedule under `savepoint` through the interposer
/// (`explore_file` parsed, `exe` its `serve`), exported and run by the isolation tester on a
/// scratch database of `pg` migrated as `serve` migrates its own.
pub(super) fn tester_row(pg: &PgServer, exe: &str, explore_file: &str) -> TesterRow {
    let race = "two racers, savepoint, first schedule".to_string();
    let empty = |why: String| TesterRow {
        race: race.clone(),
        steps: 0,
        permutations: 0,
        seconds: 0.0,
        per_second: 0.0,
        not_run: Some(why),
    };
    let Some(tester) = isolationtester().filter(|p| p.exists()) else {
        return empty(
            "no isolationtester (pg_config --pkglibdir; scripts/tools-up installs it)".into(),
        );
    };
    let spec = match first_schedule_spec(pg, exe, explore_file) {
        Ok(s) => s,
        Err(why) => return empty(why),
    };
    let (spec, steps) = every_permutation(&spec);
    let db = match ScratchDb::postgres(pg, "bench-tester") {
        Ok(db) => db,
        Err(e) => return empty(format!("scratch database: {e}")),
    };
    let url = match db.url() {
        Ok(u) => u,
        Err(e) => return empty(format!("scratch database: {e}")),
    };
    let started = Instant::now();
    match run_tester(&tester, &url, &spec) {
        Ok(permutations) => {
            let seconds = started.elapsed().as_secs_f64();
            TesterRow {
                race,
                steps,
                permutations,
                seconds,
                per_second: permutations as f64 / seconds.max(1e-9),
                not_run: None,
            }
        }
        Err(why) => empty(why),
    }
}

/// The spec of the first schedule of `explore_file` under `savepoint`.
fn first_schedule_spec(pg: &PgServer, exe: &str, explore_file: &str) -> Result<String, String> {
    let parsed = crate::blackbox::TargetScenario::parse(
        Path::new("scenarios/interposed/two-racers-same-key.toml"),
        explore_file,
        &|_| None,
    )
    .map_err(|e| e.to_string())?;
    let scenario = crate::killmatrix::with_serve_args(
        &parsed,
        &crate::argv::implementation_args(Implementation::Protocol(Protocol::Savepoint)),
    );
    let opts = crate::blackbox::RunOptions {
        exe: Some(exe.into()),
        // The first racer first, then the default order: the first schedule.
        schedule: Some("A".into()),
        ..crate::blackbox::RunOptions::new(pg.clone())
    };
    let outcome = crate::blackbox::run_repeated(&scenario, &opts).map_err(|e| e.to_string())?;
    let run = outcome
        .runs
        .first()
        .ok_or_else(|| "the schedule did not run".to_string())?;
    crate::blackbox::isolation::render_schedule(run).map_err(|e| e.to_string())
}

/// Runs the tester on `spec` against `url`, stopped at [`TESTER_TIMEOUT`]: the permutations
/// it started.
fn run_tester(tester: &Path, url: &str, spec: &str) -> Result<usize, String> {
    use std::io::{Read as _, Write as _};
    let mut child = std::process::Command::new(tester)
        .env("PGISOLATIONTIMEOUT", "60")
        .arg(url)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("{}: {e}", tester.display()))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(spec.as_bytes())
            .map_err(|e| format!("write the spec: {e}"))?;
    }
    let mut stdout = child.stdout.take().ok_or("no stdout")?;
    // The tester's output ends when it exits: read to its end on a thread, waited for until
    // the deadline.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        let _ = tx.send(text);
    });
    let (text, timed_out) = match rx.recv_timeout(TESTER_TIMEOUT) {
        Ok(text) => (text, false),
        Err(_) => {
            let _ = child.kill();
            (rx.recv().unwrap_or_default(), true)
        }
    };
    let status = child
        .wait()
        .map_err(|e| format!("wait for the tester: {e}"))?;
    let status = (!timed_out).then_some(status);
    let permutations = text.matches("starting permutation:").count();
    match status {
        Some(s) if s.success() => Ok(permutations),
        Some(s) => Err(format!(
            "the tester exited with {s} after {permutations} permutation(s)"
        )),
        None => Err(format!(
            "the tester ran past {} s ({permutations} permutation(s) started)",
            TESTER_TIMEOUT.as_secs()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_permutation_drops_the_permutation_and_empties_the_tables_between() {
        let spec = "# header\n\nsession a\nstep a1 { BEGIN; }\nstep a2 { COMMIT; }\n\nsession b\nstep b1 { SELECT 1; }\n\npermutation a1 b1 a2\n";
        let (out, steps) = every_permutation(spec);
        assert_eq!(steps, 3);
        assert!(!out.contains("permutation a1"), "{out}");
        let teardown = out.find("teardown").unwrap();
        assert!(teardown < out.find("session a").unwrap(), "{out}");
        assert_eq!(out.matches("teardown").count(), 1);
    }
}
