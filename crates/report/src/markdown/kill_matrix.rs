//! The kill matrix section: every gate against every wrong implementation and the controls.

use std::fmt::Write as _;

use super::{md, DETAILS_DIR, KILL_MATRIX_FILE};
use ticketflow_core::store::Backend;
use ticketflow_harness::killmatrix::{GateOutcome, KillMatrix};

pub(super) fn render_kill_matrix(out: &mut String, k: &KillMatrix) {
    let _ = writeln!(
        out,
        "## Kill matrix: the harness against the wrong implementations\n"
    );
    let _ = writeln!(
        out,
        "Every gate runs against each wrong implementation (`crates/core/src/variants.rs`, docs/PROTOCOL.md §8: the five, \
         `on-conflict-ignores-loss`, `single-statement-skips-reread`, the two wrong uses of the lease, and \
         the served `answer-in-second-transaction`, `redis-check-then-lock`, `lost-ack-creates-again`, \
         `claim-never-expires`, `redis-lock-expires`, `answer-stored-after-response` and the seven sequence variants) \
         and, as controls, against the three real create protocols (`protocol`, with a savepoint, \
         `on-conflict` and `single-statement`). A variant must be **killed** on every \
         backend where a gate applies; a control must survive every gate. The interposed gates race \
         `ticketflow serve` through the interposer with the files of `scenarios/interposed/`: `explore` \
         (the file's bounded exploration; one file cuts the first racer's connection after its \
         `COMMIT`, one kills the service after each of the first racer's store commands in turn and restarts it, \
         one holds the first racer's `BEGIN` past the service's lock TTL, one cuts a receipt write after the answer) \
         must kill `split-transactions`, `answer-in-second-transaction`, \
         `redis-check-then-lock`, `lost-ack-creates-again`, `claim-never-expires`, `redis-lock-expires` and \
         `answer-stored-after-response`; `first-point` (every racer held at its first store command, then \
         run free) is informative for a variant: its kills are shown, its misses are what exploration \
         adds. The `check` gate (`ticketflow check` of `scenarios/check/serve.toml`, generated histories judged against \
         the idempotency model) must kill the seven served variants only a sequence of requests shows \
         (`crates/core/src/sequence_variants.rs`); the `starter` gate (the five files `target init` writes, for the same \
         service) is informative: it shows which of them a written sequence catches. Verdict: **{}**: {}.\n",
        k.verdict(),
        k.summary()
    );
    let columns: Vec<(&str, Backend)> = {
        let mut v = Vec::new();
        for c in &k.cells {
            if !v.contains(&(c.gate, c.backend)) {
                v.push((c.gate, c.backend));
            }
        }
        v
    };
    let mut header = "| implementation |".to_string();
    let mut rule = "|---|".to_string();
    for (gate, backend) in &columns {
        let _ = write!(header, " {gate} ({backend}) |");
        rule.push_str("---|");
    }
    let _ = writeln!(out, "{header}\n{rule}");
    for implementation in ticketflow_harness::killmatrix::implementations() {
        let mut row = format!("| {} |", implementation.name());
        for (gate, backend) in &columns {
            let cell = k.cells.iter().find(|c| {
                c.implementation == implementation && c.gate == *gate && c.backend == *backend
            });
            let text = match cell.map(|c| &c.outcome) {
                Some(GateOutcome::Killed(_)) => "**killed**",
                Some(GateOutcome::Survived) => "survived",
                Some(GateOutcome::NotApplicable(_)) => "n/a",
                Some(GateOutcome::Pending(_)) => "PENDING",
                None => "—",
            };
            let _ = write!(row, " {text} |");
        }
        let _ = writeln!(out, "{row}");
    }
    out.push('\n');
    if k.cells.iter().any(|c| c.gate == "explore") {
        let missed: Vec<&str> = k.first_point_missed().iter().map(|i| i.name()).collect();
        let _ = writeln!(
            out,
            "Killed by exploration and missed by the first point in this run: {}.\n",
            if missed.is_empty() {
                "none".to_string()
            } else {
                missed
                    .iter()
                    .map(|n| format!("`{n}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        );
    }
    for p in k.problems() {
        let _ = writeln!(out, "- **FAIL**: {p}");
    }
    let _ = writeln!(
        out,
        "What killed each variant, gate by gate (the first failing check, whole): [{KILL_MATRIX_FILE}]({DETAILS_DIR}/{KILL_MATRIX_FILE}).\n"
    );
}

/// The kill matrix's detail file: for every cell that did not simply survive, why.
pub(super) fn render_kill_details(out: &mut String, k: &KillMatrix) {
    let _ = writeln!(
        out,
        "# Kill matrix: what killed each variant\n\nThe first failing check per gate, whole; also why a cell was PENDING or not applicable.\n"
    );
    for c in &k.cells {
        let detail = match &c.outcome {
            GateOutcome::Killed(d) => format!("killed — {}", md(d)),
            GateOutcome::Pending(d) => format!("PENDING — {}", md(d)),
            GateOutcome::NotApplicable(d) => format!("n/a — {}", md(d)),
            GateOutcome::Survived => continue,
        };
        let _ = writeln!(
            out,
            "- `{}` × {} ({}): {detail}",
            c.implementation.name(),
            c.gate,
            c.backend
        );
    }
    out.push('\n');
}
