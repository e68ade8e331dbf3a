//! The faults and bad input section.

use std::fmt::Write as _;

use super::md;
use ticketflow_harness::faults::FaultReport;

pub(super) fn render_faults(out: &mut String, f: &FaultReport) {
    let _ = writeln!(out, "## Faults and bad input\n");
    let lost: usize = f.cases.iter().map(|c| c.rows_lost).sum();
    let half: usize = f.cases.iter().map(|c| c.half_states).sum();
    let _ = writeln!(
        out,
        "Verdict: **{}**. {}. Rows lost: **{lost}**. Half states: **{half}**. After every fault \
         the same request is retried through a fresh session and must converge on one ticket.\n",
        f.verdict(),
        f.tally()
    );
    for (name, why) in &f.not_run {
        let _ = writeln!(out, "- **PENDING** {name}: {why}.");
    }
    if !f.not_run.is_empty() {
        out.push('\n');
    }
    let _ = writeln!(out, "| case | backend | verdict | rows lost | half states | detail |\n|---|---|---|---|---|---|");
    for c in &f.cases {
        let _ = writeln!(
            out,
            "| {} | {} | **{}** | {} | {} | {} |",
            c.name,
            c.backend,
            c.verdict,
            c.rows_lost,
            c.half_states,
            md(&c.detail)
        );
    }
    out.push('\n');
}
