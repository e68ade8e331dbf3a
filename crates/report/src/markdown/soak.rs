//! The soak section: the settings, and each invariant's verdict (evidence only when it is not
//! PASS). The soak's figures (requests, req/s, latencies, answers, faults injected) vary from
//! run to run and are in the Environment section.

use std::fmt::Write as _;

use super::md;
use ticketflow_harness::soak::SoakReport;
use ticketflow_harness::verdict::Verdict;

pub(super) fn render_soak(out: &mut String, s: &SoakReport) {
    let _ = writeln!(out, "## Soak\n");
    let kinds: Vec<&str> = s.faults_requested.iter().map(|k| k.name()).collect();
    let _ = writeln!(
        out,
        "Verdict: **{}**. `ticketflow soak` for {} s: two `ticketflow serve` processes (`{}`) on \
         a scratch database, {} client connections, {} tenants, mixed traffic (new keys, \
         retries, a contested key, conflicts, GETs in and across tenants; transport errors and \
         503 retried with the same key), faults: {}.{} Its figures are under Environment; a \
         longer run is in docs/GUIDE.md.\n",
        s.verdict,
        s.duration_s,
        s.implementation,
        s.connections,
        s.tenants,
        if kinds.is_empty() {
            "none".to_string()
        } else {
            kinds.join(", ")
        },
        s.alongside
            .as_ref()
            .map(|a| format!(
                " It ran beside {a}, sharing the machine with them, so its request rates and \
                 latencies are lower than alone; its invariants do not depend on them."
            ))
            .unwrap_or_default()
    );
    let _ = writeln!(
        out,
        "| soak invariant | verdict | evidence |\n|---|---|---|"
    );
    for i in &s.invariants {
        let evidence = if i.verdict == Verdict::Pass {
            String::new()
        } else {
            md(&i.detail)
        };
        let _ = writeln!(out, "| {} | **{}** | {evidence} |", i.name, i.verdict);
    }
    out.push('\n');
}

/// The soak's figures, for the Environment section.
pub(super) fn render_soak_figures(out: &mut String, s: &SoakReport) {
    let f = &s.figures;
    let answers: Vec<String> = f.answers.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    let injected: Vec<String> = s
        .faults_injected
        .iter()
        .map(|(k, v)| format!("{k} ×{v}"))
        .collect();
    let _ = writeln!(
        out,
        "Soak figures (they vary from run to run and are not part of any verdict):\n"
    );
    let _ = writeln!(
        out,
        "| soak | requests | req/s | p50 (ms) | p99 (ms) | retries | gave up | answers by status | faults injected |\n|---|---|---|---|---|---|---|---|---|"
    );
    let _ = writeln!(
        out,
        "| {} s × {} connections, seed {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
        s.duration_s,
        s.connections,
        s.seed,
        f.requests,
        f.req_per_s,
        f.p50_ms,
        f.p99_ms,
        f.retries,
        f.gave_up,
        answers.join(", "),
        if injected.is_empty() {
            "none".to_string()
        } else {
            injected.join(", ")
        }
    );
}
