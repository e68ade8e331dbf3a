//! The PostgreSQL baseline: `pgbench -n -M prepared` running the custom scripts of
//! `scripts/bench/` (embedded at build time) against the bench's scratch database at the same
//! client count, one thread per client. Throughput is pgbench's `tps` (without connection
//! time); p50 and p99 come from its per-transaction log (`-l`).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{BenchError, BenchOptions, Measure, TENANT};
use crate::scratch::ScratchDatabase;
use ticketflow_core::protocol::Protocol;

/// `scripts/bench/pg-create-savepoint.sql`.
pub(crate) const CREATE_SAVEPOINT_SQL: &str =
    include_str!("../../../../scripts/bench/pg-create-savepoint.sql");
/// `scripts/bench/pg-create-on-conflict.sql`.
pub(crate) const CREATE_ON_CONFLICT_SQL: &str =
    include_str!("../../../../scripts/bench/pg-create-on-conflict.sql");
/// `scripts/bench/pg-replay.sql`.
pub(crate) const REPLAY_SQL: &str = include_str!("../../../../scripts/bench/pg-replay.sql");
/// `scripts/bench/pg-create-single-statement.sql`: must equal
/// [`single_statement_script`]`(false)` (a test checks it).
pub(crate) const CREATE_SINGLE_STATEMENT_SQL: &str =
    include_str!("../../../../scripts/bench/pg-create-single-statement.sql");
/// `scripts/bench/pg-replay-single-statement.sql`: must equal
/// [`single_statement_script`]`(true)`.
pub(crate) const REPLAY_SINGLE_STATEMENT_SQL: &str =
    include_str!("../../../../scripts/bench/pg-replay-single-statement.sql");

/// The pgbench script of the `single-statement` protocol: the store's own
/// [`ticketflow_core::store::postgres::CLAIM_AND_CREATE_SQL`] with each `$N` replaced by a pgbench
/// expression, sent outside `BEGIN` as the protocol sends it. `replay`: the key is one of the
/// `nkeys` keys created beforehand (`-D tag=KEY_PREFIX -D nkeys=N`), so the statement meets
/// its receipt and reads the ticket; else a fresh key (`-D tag=RUN_PREFIX`). Ids derive from a
/// random number on the server (`md5(…)::uuid`), as in the other create scripts.
#[cfg(test)]
pub(crate) fn single_statement_script(replay: bool) -> String {
    let key = if replay {
        ":tag::text || :i::text"
    } else {
        ":tag::text || :k::text"
    };
    let id = "md5(:tag::text || :k::text)::uuid";
    let event_id = "md5('e' || :tag::text || :k::text)::uuid";
    let hash = "'2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881'";
    let payload = format!("'{}'", super::raw::PAYLOAD);
    let values: [&str; 21] = [
        ":tenant",
        key,
        hash,
        id,
        "now()",
        id,
        ":tenant",
        "'u1'",
        "'Printer jammed'",
        "'Floor 3 printer shows E-42'",
        "'high'",
        "'open'",
        "1",
        "now()",
        "now()",
        event_id,
        id,
        ":tenant",
        "'ticket.created'",
        &payload,
        "now()",
    ];
    let mut statement = ticketflow_core::store::postgres::CLAIM_AND_CREATE_SQL.to_string();
    // Highest first, so `$1` does not match the start of `$12`.
    for (n, value) in values.iter().enumerate().rev() {
        statement = statement.replace(&format!("${}", n + 1), &format!("({value})"));
    }
    let (what, vars, pick) = if replay {
        (
            "replay (the statement meets an existing receipt and reads its ticket)",
            "-D tag=KEY_PREFIX -D tenant=TENANT -D nkeys=N: keys tag || 0..N-1, created beforehand",
            "\\set i random(0, :nkeys - 1)\n\\set k random(1, 9000000000000000000)\n",
        )
    } else {
        (
            "create",
            "-D tag=RUN_PREFIX -D tenant=TENANT; keys are tag || random 63-bit number (distinct)",
            "\\set k random(1, 9000000000000000000)\n",
        )
    };
    format!(
        "-- Baseline of `ticketflow bench` (PostgreSQL, {what}, single-statement protocol):\n\
         -- the one statement the protocol sends, outside BEGIN (its own transaction), run by\n\
         -- pgbench -n -M prepared. {vars}.\n\
         -- Generated from store::postgres::CLAIM_AND_CREATE_SQL (bench::pgbench::single_statement_script).\n\
         {pick}{statement};\n"
    )
}

/// pgbench transactions per client when a side runs under one second (`-t` instead of `-T`,
/// which takes whole seconds).
pub(crate) const SHORT_RUN_TRANSACTIONS: u32 = 20;

/// The scripts written to a temporary directory (kept while this value lives).
pub(crate) struct Scripts {
    // Held so the directory lives as long as the scripts; removed on drop.
    _dir: crate::scratch::ScratchDir,
    /// The savepoint create script.
    pub create_savepoint: PathBuf,
    /// The on-conflict create script.
    pub create_on_conflict: PathBuf,
    /// The replay script (savepoint, on-conflict).
    pub replay: PathBuf,
    /// The single-statement create script.
    pub create_single_statement: PathBuf,
    /// The single-statement replay script.
    pub replay_single_statement: PathBuf,
}

impl Scripts {
    /// Writes the five scripts.
    ///
    /// Will return `Err` if the temporary directory cannot be written.
    pub(crate) fn write() -> Result<Self, BenchError> {
        let io = |context: &str| {
            let context = context.to_string();
            move |source| BenchError::Io { context, source }
        };
        let dir = crate::scratch::ScratchDir::new().map_err(io("create a temporary directory"))?;
        let put = |name: &str, text: &str| -> Result<PathBuf, BenchError> {
            let path = dir.path().join(name);
            std::fs::write(&path, text).map_err(io(&format!("write {}", path.display())))?;
            Ok(path)
        };
        Ok(Scripts {
            create_savepoint: put("pg-create-savepoint.sql", CREATE_SAVEPOINT_SQL)?,
            create_on_conflict: put("pg-create-on-conflict.sql", CREATE_ON_CONFLICT_SQL)?,
            replay: put("pg-replay.sql", REPLAY_SQL)?,
            create_single_statement: put(
                "pg-create-single-statement.sql",
                CREATE_SINGLE_STATEMENT_SQL,
            )?,
            replay_single_statement: put(
                "pg-replay-single-statement.sql",
                REPLAY_SINGLE_STATEMENT_SQL,
            )?,
            _dir: dir,
        })
    }

    /// The create script of `protocol`.
    pub(crate) fn create(&self, protocol: Protocol) -> PathBuf {
        match protocol {
            Protocol::Savepoint => self.create_savepoint.clone(),
            Protocol::OnConflict => self.create_on_conflict.clone(),
            Protocol::SingleStatement => self.create_single_statement.clone(),
        }
    }

    /// The replay script of `protocol`: the single statement for `single-statement`, the
    /// lookup and ticket read in a transaction for the other two.
    pub(crate) fn replay(&self, protocol: Protocol) -> PathBuf {
        match protocol {
            Protocol::SingleStatement => self.replay_single_statement.clone(),
            Protocol::Savepoint | Protocol::OnConflict => self.replay.clone(),
        }
    }
}

/// The pgbench arguments for one run (without the binary): connection, `-n -M prepared`,
/// `-f script -c N -j N`, `-T secs` (or `-t` for short runs), `-l --log-prefix`, the `-D`
/// variables (`tenant` always) and the database name.
pub fn args(
    opts: &BenchOptions,
    scratch: &ScratchDatabase,
    script: &Path,
    clients: usize,
    vars: &[(&str, &str)],
    log_prefix: &Path,
) -> Vec<String> {
    let config = scratch.config();
    let mut a = Vec::new();
    if let Some(postgres::config::Host::Tcp(host)) = config.get_hosts().first() {
        a.extend(["-h".to_string(), host.clone()]);
    }
    if let Some(port) = config.get_ports().first() {
        a.extend(["-p".to_string(), port.to_string()]);
    }
    if let Some(user) = config.get_user() {
        a.extend(["-U".to_string(), user.to_string()]);
    }
    a.extend(["-n", "-M", "prepared", "-f"].map(String::from));
    a.push(script.display().to_string());
    a.extend([
        "-c".into(),
        clients.to_string(),
        "-j".into(),
        clients.to_string(),
    ]);
    let secs = opts.duration.as_secs();
    if secs >= 1 {
        a.extend(["-T".into(), secs.to_string()]);
    } else {
        a.extend(["-t".into(), SHORT_RUN_TRANSACTIONS.to_string()]);
    }
    a.extend([
        "-l".into(),
        "--log-prefix".into(),
        log_prefix.display().to_string(),
    ]);
    a.extend(["-D".into(), format!("tenant={TENANT}")]);
    for (k, v) in vars {
        a.extend(["-D".into(), format!("{k}={v}")]);
    }
    a.push(scratch.name().to_string());
    a
}

/// Runs pgbench once and reads its throughput and latencies.
///
/// Will return `Err` if pgbench cannot start, exits non-zero (an aborted client included),
/// reports failed transactions, or prints no `tps` line.
pub fn run(
    opts: &BenchOptions,
    scratch: &ScratchDatabase,
    script: &Path,
    clients: usize,
    vars: &[(&str, &str)],
) -> Result<Measure, BenchError> {
    let logs = crate::scratch::ScratchDir::new().map_err(|source| BenchError::Io {
        context: "create a pgbench log directory".into(),
        source,
    })?;
    let prefix = logs.path().join("tx");
    let argv = args(opts, scratch, script, clients, vars, &prefix);
    let mut command = Command::new(&opts.pgbench);
    command.args(&argv);
    // Dies with this process, even on SIGKILL (crate::child).
    let out = crate::child::output(command)
        .map_err(|e| BenchError::Pgbench(format!("cannot run {}: {e}", opts.pgbench.display())))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(BenchError::Pgbench(format!(
            "exit {:?}: {}",
            out.status.code(),
            stderr.lines().rev().take(3).collect::<Vec<_>>().join(" | ")
        )));
    }
    let (tps, failed) = parse_summary(&stdout)
        .ok_or_else(|| BenchError::Pgbench(format!("no tps line in: {stdout}")))?;
    if failed > 0 {
        return Err(BenchError::Pgbench(format!("{failed} failed transactions")));
    }
    let mut lat = read_latencies(logs.path())?;
    lat.sort_unstable();
    let pct = |p: f64| {
        if lat.is_empty() {
            f64::NAN
        } else {
            lat[((lat.len() as f64 - 1.0) * p).round() as usize] as f64
        }
    };
    Ok(Measure {
        value: tps,
        p50_us: pct(0.5),
        p99_us: pct(0.99),
        ops: lat.len() as u64,
    })
}

/// `tps = …` and `number of failed transactions: …` from pgbench's summary.
pub(crate) fn parse_summary(stdout: &str) -> Option<(f64, u64)> {
    let tps = stdout
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let failed = stdout
        .lines()
        .find_map(|l| l.strip_prefix("number of failed transactions: "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    Some((tps, failed))
}

/// Per-transaction latencies (µs, the third field of each `-l` log line) of every log file
/// in `dir`.
fn read_latencies(dir: &Path) -> Result<Vec<u64>, BenchError> {
    let mut out = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|source| BenchError::Io {
        context: "read the pgbench logs".into(),
        source,
    })?;
    for entry in entries.flatten() {
        let text = std::fs::read_to_string(entry.path()).map_err(|source| BenchError::Io {
            context: format!("read {}", entry.path().display()),
            source,
        })?;
        out.extend(
            text.lines()
                .filter_map(|l| l.split_whitespace().nth(2)?.parse::<u64>().ok()),
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_lines_are_parsed() {
        let out = "transaction type: x.sql\nnumber of failed transactions: 0 (0.000%)\n\
                   latency average = 7.371 ms\ntps = 271.335819 (without initial connection time)\n";
        assert_eq!(parse_summary(out), Some((271.335819, 0)));
        assert_eq!(parse_summary("nothing"), None);
    }

    #[test]
    fn the_scripts_send_the_protocols_statements() {
        assert!(CREATE_SAVEPOINT_SQL.contains("SAVEPOINT ticketflow_create"));
        assert!(CREATE_SAVEPOINT_SQL.contains("RELEASE SAVEPOINT ticketflow_create"));
        assert!(!CREATE_ON_CONFLICT_SQL.contains("SAVEPOINT"));
        assert!(CREATE_ON_CONFLICT_SQL
            .contains("ON CONFLICT (tenant_id, idempotency_key) DO NOTHING RETURNING 1"));
        assert!(REPLAY_SQL.contains("FROM tickets WHERE tenant_id = :tenant"));
    }
}
