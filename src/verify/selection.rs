//! What a `verify` run selects: `--filter` names, what narrows a run (so that a partial run
//! never replaces the full report), and the scenarios and parts selected.

use super::*;

/// What `--filter` selects. A pattern matches a part when the part's name contains it
/// (case-sensitive substring, as `cargo test` filters): scenario names, `property:fingerprint`,
/// `property:sequential`, `property:concurrent`, `kill-matrix`, `faults`, `soak`. Loom models are
/// read from `reports/loom.json`, not run, and always shown.
#[derive(Debug, Clone, Default)]
pub struct Filter(pub Vec<String>);

/// The names `--filter` can select besides scenarios.
pub const FILTERABLE_PARTS: [&str; 6] = [
    "property:fingerprint",
    "property:sequential",
    "property:concurrent",
    "kill-matrix",
    "faults",
    "soak",
];

impl Filter {
    /// Whether `name` is selected.
    pub fn selects(&self, name: &str) -> bool {
        self.0.is_empty() || self.0.iter().any(|p| name.contains(p.as_str()))
    }
}

/// The options that narrow a `verify` run, each as `verify` names it in messages and in the
/// report (`--backend sqlite`, `--no-kill-matrix`, …): a run with any of them checks less
/// than a full run, or checks it with other settings than the shipped ones, so its report is
/// partial ([`report_location`]).
///
/// Narrowing: `--filter`; `--no-kill-matrix`; `--backend` other than `both`; `--isolation`
/// without all three levels; `--sqlite-journal` or `--sqlite-tx` without every value; a
/// `--protocol` other than the default (`savepoint`); a retry policy other than the default
/// (`--no-retry`, `--max-attempts`, `--base-backoff-ms`, `--max-backoff-ms`). Not narrowing:
/// `--repeat` (more runs of the black-box scenarios), `--restart-postgres` (one more case),
/// `--seed` (the same suites, replayable), `--scenarios`, `--pg-url`, `--lease`,
/// `--lease-ttl-ms`, `--jobs` and the `--require-*` options (where and how strictly, not what).
pub fn narrowed_by(opts: &VerifyOptions) -> Vec<String> {
    use ticketflow_core::store::sqlite::{JournalMode, TxMode};
    let mut out = Vec::new();
    if !opts.filters.is_empty() {
        out.push("--filter".to_string());
    }
    if !opts.kill_matrix {
        out.push("--no-kill-matrix".to_string());
    }
    let backends = opts.selection.backends();
    if !Backend::ALL.iter().all(|b| backends.contains(b)) {
        let names: Vec<&str> = backends.iter().map(|b| b.name()).collect();
        out.push(format!("--backend {}", names.join(",")));
    }
    let isolation = &opts.selection.isolation;
    if !isolation.is_empty() && !IsolationLevel::ALL.iter().all(|l| isolation.contains(l)) {
        out.push("--isolation".to_string());
    }
    let sqlite = &opts.selection.sqlite;
    let journals = [JournalMode::Wal, JournalMode::Delete];
    let txs = [TxMode::Lazy, TxMode::Deferred, TxMode::Immediate];
    let has = |journal, tx| sqlite.contains(&RunSetting::Sqlite { journal, tx });
    if !sqlite.is_empty() {
        if !journals.iter().all(|&j| txs.iter().any(|&t| has(j, t))) {
            out.push("--sqlite-journal".to_string());
        }
        if !txs.iter().all(|&t| journals.iter().any(|&j| has(j, t))) {
            out.push("--sqlite-tx".to_string());
        }
    }
    if opts.protocol != ticketflow_core::protocol::Protocol::default() {
        out.push(format!("--protocol {}", opts.protocol));
    }
    let shipped = RetryPolicy::default();
    if opts.retry == RetryPolicy::NONE && shipped != RetryPolicy::NONE {
        out.push("--no-retry".to_string());
    } else {
        if opts.retry.max_attempts != shipped.max_attempts {
            out.push("--max-attempts".to_string());
        }
        if opts.retry.base_backoff != shipped.base_backoff {
            out.push("--base-backoff-ms".to_string());
        }
        if opts.retry.max_backoff != shipped.max_backoff {
            out.push("--max-backoff-ms".to_string());
        }
    }
    out
}

/// What `verify`'s filters select: scenarios, black-box scenarios, property suites, the kill
/// matrix (only when `opts.kill_matrix`) and the fault cases, and what they leave out.
pub(super) struct Selected {
    pub(super) scenarios: Vec<Scenario>,
    pub(super) targets: Vec<ticketflow_harness::blackbox::TargetScenario>,
    pub(super) suites: Vec<&'static str>,
    pub(super) kill: bool,
    pub(super) faults: bool,
    pub(super) soak: bool,
    pub(super) not_selected: Vec<String>,
}

/// Applies `opts.filters` to the loaded scenarios and the other parts of `verify`.
///
/// Will return `Err` if the filters select nothing.
pub(super) fn select(
    opts: &VerifyOptions,
    all_scenarios: &[Scenario],
    targets: Vec<ticketflow_harness::blackbox::TargetScenario>,
) -> Result<Selected, VerifyError> {
    let filter = Filter(opts.filters.clone());
    let mut not_selected: Vec<String> = Vec::new();
    let scenarios: Vec<Scenario> = all_scenarios
        .iter()
        .filter(|s| {
            let keep = filter.selects(&s.name);
            if !keep {
                not_selected.push(format!("scenario `{}`", s.name));
            }
            keep
        })
        .cloned()
        .collect();
    let target_scenarios: Vec<ticketflow_harness::blackbox::TargetScenario> = targets
        .into_iter()
        .filter(|s| {
            let keep = filter.selects(&s.name);
            if !keep {
                not_selected.push(format!("scenario `{}`", s.name));
            }
            keep
        })
        .collect();
    let part = |name: &str, not_selected: &mut Vec<String>| {
        let keep = filter.selects(name);
        if !keep {
            not_selected.push(name.to_string());
        }
        keep
    };
    let suites_selected: Vec<&'static str> = ["fingerprint", "sequential", "concurrent"]
        .into_iter()
        .filter(|s| part(&format!("property:{s}"), &mut not_selected))
        .collect();
    let run_kill = opts.kill_matrix && part("kill-matrix", &mut not_selected);
    let run_faults = part("faults", &mut not_selected);
    let run_soak = part("soak", &mut not_selected);
    if scenarios.is_empty()
        && target_scenarios.is_empty()
        && suites_selected.is_empty()
        && !run_kill
        && !run_faults
        && !run_soak
    {
        return Err(VerifyError::NothingSelected(opts.filters.clone()));
    }
    Ok(Selected {
        scenarios,
        targets: target_scenarios,
        suites: suites_selected,
        kill: run_kill,
        faults: run_faults,
        soak: run_soak,
        not_selected,
    })
}
