//! The loom section: the models read from `reports/loom.json`.

use std::fmt::Write as _;

use super::md;
use ticketflow_harness::killmatrix::LoomReport;

pub(super) fn render_loom(out: &mut String, loom: &LoomReport) {
    let _ = writeln!(out, "## Model checking (loom)\n");
    if let Some(why) = &loom.unusable {
        let _ = writeln!(out, "**PENDING**: {why}.\n");
        return;
    }
    let _ = writeln!(
        out,
        "The real `create_ticket` code over the in-memory READ COMMITTED store, every interleaving \
         within the preemption bound. Not run by `verify`: read from `reports/loom.json`, written \
         by `scripts/loom.sh`{} for the sources it hashes (a stale file is PENDING). Verdict: **{}**.\n",
        loom.generated_at
            .as_deref()
            .map(|at| format!(" at {at}"))
            .unwrap_or_default(),
        loom.verdict()
    );
    let _ = writeln!(
        out,
        "| model | implementation | threads | preemption bound | interleavings | expected | result |\n|---|---|---|---|---|---|---|"
    );
    for m in &loom.raw {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | **{}** |",
            m["name"].as_str().unwrap_or("?"),
            m["implementation"].as_str().unwrap_or("?"),
            m["threads"],
            m["preemption_bound"],
            m["interleavings"],
            m["expected"].as_str().unwrap_or("?"),
            m["result"].as_str().unwrap_or("?"),
        );
    }
    out.push('\n');
    let findings: Vec<String> = loom
        .raw
        .iter()
        .filter_map(|m| {
            m["finding"].as_str().map(|f| {
                format!(
                    "- `{}` × {}: {}",
                    m["implementation"].as_str().unwrap_or("?"),
                    m["name"].as_str().unwrap_or("?"),
                    md(f)
                )
            })
        })
        .collect();
    if !findings.is_empty() {
        let _ = writeln!(
            out,
            "<details><summary>Failing interleavings found in the wrong implementations</summary>\n\n{}\n\n</details>\n",
            findings.join("\n")
        );
    }
}
