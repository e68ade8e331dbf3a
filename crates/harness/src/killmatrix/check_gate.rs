//! The kill matrix's `check` gate: `ticketflow check` (generated histories judged against the
//! idempotency model, [`crate::check`]) of the check file `scenarios/check/serve.toml` with the
//! served implementation's arguments on its `serve` commands. The real protocols must survive
//! it; each variant only a sequence of requests shows ([`Variant::SEQUENCE`]) must be killed.
//! It runs [`CHECK_GATE_HISTORIES`] histories from a fixed seed, without shrinking or replays
//! (a kill needs the failing history, not the minimal one); `scripts/check-proof.sh` runs the
//! default budget with twenty seeds.

use std::path::{Path, PathBuf};

use ticketflow_core::variants::{Implementation, Variant};

use super::{gate_outcome, one_line, with_serve_args, GateOutcome, KillOptions};
use crate::argv::implementation_args;
use crate::check::file::CheckFile;
use crate::check::run::{check, CheckOptions};
use crate::verdict::Verdict;

/// The check file of the gate, under the scenario directory.
pub const CHECK_GATE_FILE: &str = "check/serve.toml";

/// Histories per implementation.
pub const CHECK_GATE_HISTORIES: usize = 10;

/// The seed of the gate's histories (any seed kills every variant: `scripts/check-proof.sh`).
pub const CHECK_GATE_SEED: u64 = 1;

/// Loads the gate's check file from the scenario directory `dir`.
///
/// Will return `Err` with the reason (then the gate is PENDING).
pub fn load_check_file(dir: &Path) -> Result<CheckFile, String> {
    let path: PathBuf = dir.join(CHECK_GATE_FILE);
    CheckFile::load(&path).map_err(|e| e.to_string())
}

/// Whether the `check` gate runs `implementation`: the real protocols and
/// [`Variant::SEQUENCE`].
pub(super) fn check_gate_runs(implementation: Implementation) -> bool {
    match implementation {
        Implementation::Protocol(_) => true,
        Implementation::Variant(v) => Variant::SEQUENCE.contains(&v),
    }
}

/// The `check` gate of `implementation`.
pub(super) fn check_gate(implementation: Implementation, opts: &KillOptions) -> GateOutcome {
    let file = match &opts.check_file {
        Ok(f) => f,
        Err(why) => return GateOutcome::Pending(format!("check file: {why}")),
    };
    let args = implementation_args(implementation);
    let mut file = file.clone();
    file.template = with_serve_args(&file.template, &args);
    let out = std::env::temp_dir().join(format!(
        "ticketflow-check-gate-{}-{}.toml",
        std::process::id(),
        implementation.name()
    ));
    let run = crate::blackbox::RunOptions {
        exe: opts.worker_exe.clone(),
        ..crate::blackbox::RunOptions::new(opts.pg.clone())
    };
    let outcome = check(
        &file,
        &CheckOptions {
            run,
            seed: Some(CHECK_GATE_SEED),
            histories: Some(CHECK_GATE_HISTORIES),
            budget_s: None,
            shrink_runs: Some(0),
            replays: Some(0),
            out: Some(out.clone()),
            on_history: None,
        },
    );
    let _ = std::fs::remove_file(&out);
    match outcome {
        Err(e) => GateOutcome::Pending(format!("check {CHECK_GATE_FILE}: {e}")),
        Ok(o) => match o.verdict {
            Verdict::Fail => GateOutcome::Killed(format!(
                "check {CHECK_GATE_FILE} (serve … {}, seed {CHECK_GATE_SEED}): {}",
                args.join(" "),
                one_line(&o.reason.unwrap_or_default())
            )),
            Verdict::Pending => GateOutcome::Pending(o.reason.unwrap_or_default()),
            Verdict::Pass => GateOutcome::Survived,
        },
    }
}

/// The starter set `ticketflow target init` writes for the gate's check file (its request,
/// scopes, invalid body and count queries; the two URLs stand for its two services): the
/// five scenario files, parsed, with the check file's target (its services) in place of the
/// URLs. `via` URLs become the service of the same position.
///
/// Will return `Err` with the reason when the check file's target cannot be written as a
/// starter set (no table-lock barrier, no scope header).
pub fn starter_scenarios(file: &CheckFile) -> Result<Vec<crate::blackbox::TargetScenario>, String> {
    starter_set(file, false)
}

/// [`starter_scenarios`] as `target init --interposer` writes them: each racing through an
/// interposer the runner starts in front of the check file's services (`[barrier] kind =
/// "interposer"`, `[schedule] mode = "auto"`).
///
/// Will return `Err` as [`starter_scenarios`] does.
pub fn interposed_starter_scenarios(
    file: &CheckFile,
) -> Result<Vec<crate::blackbox::TargetScenario>, String> {
    starter_set(file, true)
}

fn starter_set(
    file: &CheckFile,
    interposed: bool,
) -> Result<Vec<crate::blackbox::TargetScenario>, String> {
    use crate::blackbox::format::BarrierKind;
    use crate::blackbox::init::{InitOptions, CHECK_FILE};
    let t = &file.template.target;
    let BarrierKind::TableLock { table, .. } = &file.template.barrier.kind else {
        return Err("the check file's barrier is not a table lock".into());
    };
    let scope_header = t
        .scopes
        .first()
        .and_then(|s| s.headers.first())
        .map(|(h, _)| h.clone())
        .ok_or("the check file's first scope has no header")?;
    let urls = vec![
        "http://127.0.0.1:1".to_string(),
        "http://127.0.0.1:2".to_string(),
    ];
    let init = InitOptions {
        urls: urls.clone(),
        database_url: Some("postgres://starter@127.0.0.1/starter".into()),
        table: (!interposed).then(|| table.clone()),
        method: t.request.method.clone(),
        path: t.request.path.clone(),
        body: file.body.clone(),
        invalid_body: file
            .invalid_body
            .clone()
            .unwrap_or_else(|| serde_json::json!({})),
        scope_header: Some(scope_header),
        // A placeholder: the check file's target (its services, no interposer address)
        // replaces the written one, so the runner starts its own interposer.
        interposer: interposed.then(|| "127.0.0.1:1".to_string()),
        key_header: t.request.key_header.clone(),
        preset: t.preset,
        counts: t
            .counts
            .iter()
            .filter(|q| q.redis.is_none())
            .map(|q| (q.name.clone(), q.sql.clone()))
            .collect(),
        clients: 4,
        replays_marked: t.replay.marked,
    };
    let services: Vec<String> = t.services.iter().map(|s| s.name.clone()).collect();
    let mut out = Vec::new();
    for (name, text) in init.render().map_err(|e| e.to_string())? {
        if name == CHECK_FILE {
            continue;
        }
        let mut s = crate::blackbox::TargetScenario::parse(Path::new(&name), &text, &|_| None)
            .map_err(|e| e.to_string())?;
        s.target = t.clone();
        for r in &mut s.racers {
            if let Some(at) = r
                .via
                .as_ref()
                .and_then(|v| urls.iter().position(|u| u == v))
            {
                r.via = services.get(at).cloned();
            }
        }
        out.push(s);
    }
    Ok(out)
}

/// The `starter` gate of `implementation` (informative): the five starter files
/// ([`starter_scenarios`]) against it, each run once. Killed names every file that failed.
pub(super) fn starter_gate(implementation: Implementation, opts: &KillOptions) -> GateOutcome {
    let files = match opts
        .check_file
        .as_ref()
        .map_err(Clone::clone)
        .and_then(starter_scenarios)
    {
        Ok(f) => f,
        Err(why) => return GateOutcome::Pending(format!("starter files: {why}")),
    };
    let args = implementation_args(implementation);
    let run = crate::blackbox::RunOptions {
        exe: opts.worker_exe.clone(),
        ..crate::blackbox::RunOptions::new(opts.pg.clone())
    };
    let (mut killed, mut pending) = (Vec::new(), Vec::new());
    for s in files {
        let s = with_serve_args(&s, &args);
        match crate::blackbox::run_repeated(&s, &run) {
            Err(e) => pending.push(format!("{}: {e}", s.name)),
            Ok(o) => match o.verdict {
                Verdict::Fail => killed.push(format!(
                    "{}: {}",
                    s.name,
                    one_line(&o.reason.unwrap_or_default())
                )),
                Verdict::Pending => {
                    pending.push(format!("{}: {}", s.name, o.reason.unwrap_or_default()))
                }
                Verdict::Pass => {}
            },
        }
    }
    gate_outcome(killed, pending)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blackbox::format::BarrierKind;

    #[test]
    fn the_interposed_starter_set_races_through_an_interposer_the_runner_starts() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios");
        let file = load_check_file(&dir).unwrap();
        let plain = starter_scenarios(&file).unwrap();
        let interposed = interposed_starter_scenarios(&file).unwrap();
        assert_eq!(plain.len(), 5);
        assert_eq!(
            plain.iter().map(|s| &s.name).collect::<Vec<_>>(),
            interposed.iter().map(|s| &s.name).collect::<Vec<_>>()
        );
        for s in &interposed {
            assert!(
                matches!(s.barrier.kind, BarrierKind::Interposer),
                "{}: {:?}",
                s.name,
                s.barrier.kind
            );
            assert!(
                s.target.interposer.is_none(),
                "{}: the runner's own",
                s.name
            );
            assert_eq!(s.target.services.len(), 2, "{}", s.name);
        }
        for s in &plain {
            assert!(
                matches!(s.barrier.kind, BarrierKind::TableLock { .. }),
                "{}",
                s.name
            );
        }
    }
}
