//! The property suites section.

use std::fmt::Write as _;

use ticketflow_harness::props::SuiteResult;
use ticketflow_harness::verdict::Verdict;

pub(super) fn render_suites(out: &mut String, suites: &[SuiteResult]) {
    if suites.is_empty() {
        return;
    }
    let _ = writeln!(out, "## Property suites (proptest)\n");
    let _ = writeln!(
        out,
        "Generated inputs against the reference model (`crates/core/src/model.rs`); replay a run with \
         `ticketflow verify --seed SEED` (seeds are listed under Environment) and the same \
         `PROPTEST_CASES`. Failures of the real protocol persist in `proptest-regressions/` and \
         are replayed first.\n"
    );
    let _ = writeln!(
        out,
        "| suite | backend | implementation | verdict | cases |\n|---|---|---|---|---|"
    );
    for s in suites {
        let _ = writeln!(
            out,
            "| {} | {} | {} | **{}** | {} |",
            s.suite,
            s.backend_name(),
            s.implementation.name(),
            s.verdict,
            s.cases,
        );
    }
    out.push('\n');
    for s in suites.iter().filter(|s| s.verdict == Verdict::Fail) {
        let _ = writeln!(
            out,
            "<details><summary>{} on {}: FAIL</summary>\n\n```text\n{}\n{}\n```\n</details>\n",
            s.suite,
            s.backend_name(),
            s.reason.as_deref().unwrap_or(""),
            s.counterexample.as_deref().unwrap_or("")
        );
    }
}
