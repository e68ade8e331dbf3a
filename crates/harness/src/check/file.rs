//! A check file: a black-box scenario's `[target]` (and `[barrier]`, `[schedule]`) with a
//! `[check]` table in place of racers and expectations (docs/check.md). Unlike a scenario
//! file, replays are compared with the first answer unless `[target.replay] same_answer =
//! false` says otherwise.
//!
//! ```toml
//! [check]
//! histories = 40        # at most this many histories
//! budget_s = 120        # and stop starting new ones after this many seconds
//! operations = 8        # operations per history
//! keys = 3              # keys per scope
//! bodies = 3            # body variants (another intent under a used key)
//! seed = 7              # default: a random seed, printed
//! settle_ms = 1000      # wait after a history's last answer, then recount
//! invalid_body = { item = "", quantity = 0 }   # a body the service refuses
//! shrink_runs = 150     # re-runs spent shrinking a failure
//! replays = 20          # replays of the minimal failing history (its flake rate)
//! schedules = 8         # interposed files: runs of each history, each in another step order
//! ```

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::blackbox::format::{BodyTemplate, TargetScenario, DEFAULT_SETTLE_MS, MAX_SETTLE_MS};
use crate::blackbox::template;
use crate::scenario::ScenarioError;

/// `[check] histories` when the file gives none.
pub const DEFAULT_HISTORIES: usize = 40;
/// `[check] budget_s` when the file gives none: new histories start for this many seconds.
pub const DEFAULT_BUDGET_S: u64 = 120;
/// `[check] operations` when the file gives none.
pub const DEFAULT_OPERATIONS: usize = 8;
/// `[check] shrink_runs` when the file gives none.
pub const DEFAULT_SHRINK_RUNS: usize = 150;
/// `[check] replays` when the file gives none.
pub const DEFAULT_REPLAYS: usize = 20;
/// `[check] schedules` when the file gives none (interposed files only).
pub const DEFAULT_SCHEDULES: usize = 8;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCheck {
    histories: Option<usize>,
    budget_s: Option<u64>,
    operations: Option<usize>,
    keys: Option<usize>,
    bodies: Option<usize>,
    seed: Option<u64>,
    settle_ms: Option<u64>,
    invalid_body: Option<toml::Value>,
    shrink_runs: Option<usize>,
    replays: Option<usize>,
    schedules: Option<usize>,
}

/// A loaded check file.
#[derive(Debug, Clone)]
pub struct CheckFile {
    /// The file.
    pub path: PathBuf,
    /// Its text, for the replay file written from it.
    pub text: String,
    /// The scenario every history shares (target, barrier, schedule; one probe racer per
    /// scope).
    pub template: TargetScenario,
    /// The file's request body as a JSON template (variant 0 of the pool).
    pub body: serde_json::Value,
    /// The body the service must refuse, if the file gives one.
    pub invalid_body: Option<serde_json::Value>,
    /// Histories at most.
    pub histories: usize,
    /// Seconds during which new histories start.
    pub budget_s: u64,
    /// Operations per history.
    pub operations: usize,
    /// Keys per scope.
    pub keys: usize,
    /// Body variants.
    pub bodies: usize,
    /// The seed, if the file fixes one.
    pub seed: Option<u64>,
    /// Milliseconds waited before the recount at the end of each history (and at a settle).
    pub settle_ms: u64,
    /// Re-runs spent shrinking a failure.
    pub shrink_runs: usize,
    /// Replays of the minimal failing history.
    pub replays: usize,
    /// With the interposer barrier: runs of each history, each in another order of its groups'
    /// steps (a PCT schedule); 1 otherwise.
    pub schedules: usize,
}

impl CheckFile {
    /// Reads a check file, expanding `${ENV}` as a scenario file does.
    ///
    /// Will return `Err` naming the file (and line where known) for what a scenario file
    /// refuses, for racers or expectations in it, for an unknown `[check]` field or a value
    /// out of range, and for a request body that is not JSON (histories reorder its members).
    pub fn load(path: &Path) -> Result<CheckFile, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(|e| ScenarioError {
            file: path.to_path_buf(),
            line: None,
            message: format!("cannot read check file: {e}"),
        })?;
        CheckFile::parse(path, &text, &crate::blackbox::format::secret_env)
    }

    /// Parses check-file text; `env` looks up `${NAME}`.
    ///
    /// Will return `Err` as [`CheckFile::load`] does.
    pub fn parse(
        path: &Path,
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<CheckFile, ScenarioError> {
        let err = |message: String| ScenarioError {
            file: path.to_path_buf(),
            line: None,
            message,
        };
        let (mut template, table) = TargetScenario::parse_check(path, text, env)?;
        // Answers are compared unless the file says `same_answer = false`.
        let said = toml::from_str::<toml::Table>(text).ok().is_some_and(|t| {
            t.get("target")
                .and_then(|t| t.get("replay"))
                .and_then(|r| r.get("same_answer"))
                .is_some()
        });
        if !said {
            template.target.replay.same_answer = true;
        }
        let Some(table) = table else {
            return Err(err(
                "no [check] table: a check file has one (a scenario file runs with `ticketflow scenario run`)"
                    .into(),
            ));
        };
        let raw: RawCheck = table
            .try_into()
            .map_err(|e: toml::de::Error| err(format!("[check]: {}", e.message())))?;
        let body = match &template.target.request.body {
            BodyTemplate::Json(v) => v.clone(),
            _ => {
                return Err(err(
                    "[target.request] body must be a JSON table: histories send it with its members reordered and re-spaced, and variants of it"
                        .into(),
                ))
            }
        };
        let invalid_body = match raw.invalid_body {
            None => None,
            Some(v) => {
                let json = crate::blackbox::format::toml_json(&v);
                template::validate_json(&json)
                    .map_err(|e| err(format!("[check] invalid_body: {e}")))?;
                Some(json)
            }
        };
        let positive = |name: &str, v: Option<usize>, default: usize, max: usize| {
            let v = v.unwrap_or(default);
            if v == 0 || v > max {
                Err(err(format!("[check] {name} = {v}: give 1 to {max}")))
            } else {
                Ok(v)
            }
        };
        let settle_ms = raw.settle_ms.unwrap_or(DEFAULT_SETTLE_MS);
        if settle_ms > MAX_SETTLE_MS {
            return Err(err(format!(
                "[check] settle_ms = {settle_ms} is over the largest, {MAX_SETTLE_MS}"
            )));
        }
        Ok(CheckFile {
            path: path.to_path_buf(),
            text: text.to_string(),
            histories: positive("histories", raw.histories, DEFAULT_HISTORIES, 100_000)?,
            budget_s: raw.budget_s.unwrap_or(DEFAULT_BUDGET_S).max(1),
            operations: positive("operations", raw.operations, DEFAULT_OPERATIONS, 64)?,
            keys: positive("keys", raw.keys, 3, 16)?,
            bodies: positive("bodies", raw.bodies, 3, 16)?.max(2),
            seed: raw.seed,
            settle_ms,
            shrink_runs: raw.shrink_runs.unwrap_or(DEFAULT_SHRINK_RUNS),
            replays: raw.replays.unwrap_or(DEFAULT_REPLAYS),
            schedules: positive("schedules", raw.schedules, DEFAULT_SCHEDULES, 1_000)?,
            template,
            body,
            invalid_body,
        })
    }

    /// Runs of each history (and of each shrink candidate): [`CheckFile::schedules`] with the
    /// interposer barrier, each in another order of the groups' steps; 1 with any other barrier.
    pub fn runs_per_history(&self) -> usize {
        match self.template.barrier.kind {
            crate::blackbox::format::BarrierKind::Interposer => self.schedules,
            _ => 1,
        }
    }

    /// Scope names, in file order (`[None]` when the target has no scopes).
    pub fn scopes(&self) -> Vec<Option<String>> {
        match self.template.target.scopes.as_slice() {
            [] => vec![None],
            s => s.iter().map(|s| Some(s.name.clone())).collect(),
        }
    }
}
