//! The soak's report: a run that did not start, the invariants by name, the text printed.

use super::*;

impl SoakReport {
    /// A soak that did not run: every check PENDING with `reason` (or FAIL when `fail`).
    pub(super) fn not_run(opts: &SoakOptions, verdict: Verdict, reason: String) -> Self {
        SoakReport {
            verdict,
            reason: Some(reason.clone()),
            implementation: opts.implementation.name(),
            duration_s: opts.duration.as_secs_f64(),
            connections: opts.connections,
            tenants: opts.tenants,
            seed: opts.seed,
            faults_requested: opts.fault_kinds(),
            faults_injected: BTreeMap::new(),
            faults: Vec::new(),
            figures: Figures::default(),
            invariants: INVARIANTS
                .iter()
                .map(|name| Check::pending(name, format!("did not run: {reason}")))
                .collect(),
            alongside: None,
        }
    }

    /// A soak that broke before it could judge anything (`reason`): FAIL.
    pub fn failed(opts: &SoakOptions, reason: impl Into<String>) -> Self {
        SoakReport::not_run(opts, Verdict::Fail, reason.into())
    }

    /// A soak that did not run because `reason` (PostgreSQL unreachable, …): PENDING.
    pub fn pending(opts: &SoakOptions, reason: impl Into<String>) -> Self {
        SoakReport::not_run(opts, Verdict::Pending, reason.into())
    }

    /// The result of check `name`, if it is in the report.
    pub fn invariant(&self, name: &str) -> Option<&Check> {
        self.invariants.iter().find(|i| i.name == name)
    }

    /// The report for people: the settings, the figures, the faults and every check.
    pub fn text(&self) -> String {
        use std::fmt::Write as _;
        let f = &self.figures;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "soak: {} — {} s, 2 services ({}), {} connections, {} tenants, seed {}",
            self.verdict,
            self.duration_s,
            self.implementation,
            self.connections,
            self.tenants,
            self.seed
        );
        if let Some(r) = &self.reason {
            let _ = writeln!(out, "  reason: {r}");
        }
        let _ = writeln!(
            out,
            "requests {} ({} intents, {} retries, {} gave up), {:.1} req/s over {:.1} s, latency p50 {:.1} ms, p99 {:.1} ms",
            f.requests, f.intents, f.retries, f.gave_up, f.req_per_s, f.elapsed_s, f.p50_ms, f.p99_ms
        );
        let answers: Vec<String> = f.answers.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        let _ = writeln!(
            out,
            "answers by status: {}",
            if answers.is_empty() {
                "none".to_string()
            } else {
                answers.join(", ")
            }
        );
        let injected: Vec<String> = self
            .faults_requested
            .iter()
            .map(|k| {
                format!(
                    "{k} {}",
                    self.faults_injected.get(k.name()).copied().unwrap_or(0)
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "faults injected: {}",
            if injected.is_empty() {
                "none requested".into()
            } else {
                injected.join(", ")
            }
        );
        for r in &self.faults {
            let _ = writeln!(
                out,
                "  {:>7.2} s {} {}: {}",
                r.at_ms as f64 / 1000.0,
                r.verdict,
                r.kind,
                r.detail
            );
        }
        let _ = writeln!(out, "invariants:");
        for i in &self.invariants {
            let _ = writeln!(
                out,
                "  {:<7} {}: {}",
                i.verdict.to_string(),
                i.name,
                i.detail
            );
        }
        out
    }
}
