//! The one verdict and the one check of every part the harness runs: library races,
//! black-box races, the soak, the property suites, the fault cases and the kill matrix.
//!
//! A part is judged by its [`Check`]s; how a part folds its checks into its [`Verdict`] and
//! its reason is the part's own rule (a black-box run whose barrier did not hold is PENDING,
//! a soak check that could not be counted is PENDING), but every part reads the same type.
//! Something that did not run, or could not be set up as declared, is PENDING, never PASS.
//!
//! `report.json` keeps one shape per part (its schema is `schemas/report.schema.json`): the
//! serializers in [`json`] write a list of checks as a library run's, a black-box run's or the
//! soak's.

use serde::Serialize;

/// A harness verdict. Something that did not run is PENDING, never PASS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Verdict {
    /// Every check held.
    Pass,
    /// At least one check failed.
    Fail,
    /// It did not run (reason given).
    Pending,
}

impl Verdict {
    /// The verdict of a whole made of `parts`: FAIL if any part failed, else PENDING if any
    /// did not run, else PASS (also for no parts).
    pub fn of_all(parts: impl IntoIterator<Item = Verdict>) -> Verdict {
        parts
            .into_iter()
            .fold(Verdict::Pass, |all, v| match (all, v) {
                (Verdict::Fail, _) | (_, Verdict::Fail) => Verdict::Fail,
                (Verdict::Pending, _) | (_, Verdict::Pending) => Verdict::Pending,
                _ => Verdict::Pass,
            })
    }
}

/// How the runs of a repeated or explored part went, in words: `3 pass, 1 fail`, with
/// `, 2 not run` when some did not run (the terminal line and REPORT.md both say it so).
pub fn pass_fail_not_run(passes: usize, failures: usize, not_run: usize) -> String {
    let mut out = format!("{passes} pass, {failures} fail");
    if not_run > 0 {
        out.push_str(&format!(", {not_run} not run"));
    }
    out
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::Pending => "PENDING",
        })
    }
}

/// One check of a run and whether it held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// Short name, the same in every run of its part (the report's and JUnit's name for it):
    /// `barrier`, `outcomes`, `same ticket`, `one effect per intent`, `exactly one ticket`, …
    pub name: &'static str,
    /// PASS: it held; FAIL: it did not; PENDING: it could not be checked here.
    pub verdict: Verdict,
    /// One line: what was seen (PASS), what differed (FAIL), or why it could not be checked
    /// (PENDING).
    pub detail: String,
    /// On a FAIL whose every problem an earlier failed check explains, that check's name.
    pub follows_from: Option<&'static str>,
}

impl Check {
    /// A check that held.
    pub fn pass(name: &'static str, detail: impl Into<String>) -> Check {
        Check::held(name, true, detail)
    }

    /// A check that failed.
    pub fn fail(name: &'static str, detail: impl Into<String>) -> Check {
        Check::held(name, false, detail)
    }

    /// A check that could not be checked, and why.
    pub fn pending(name: &'static str, why: impl Into<String>) -> Check {
        Check {
            name,
            verdict: Verdict::Pending,
            detail: why.into(),
            follows_from: None,
        }
    }

    /// PASS when `passed`, else FAIL.
    pub fn held(name: &'static str, passed: bool, detail: impl Into<String>) -> Check {
        Check {
            name,
            verdict: if passed { Verdict::Pass } else { Verdict::Fail },
            detail: detail.into(),
            follows_from: None,
        }
    }

    /// PASS with `ok` when there are no `problems`, else FAIL with the problems joined by
    /// `; `.
    pub(crate) fn of_problems(name: &'static str, problems: Vec<String>, ok: String) -> Check {
        if problems.is_empty() {
            Check::pass(name, ok)
        } else {
            Check::fail(name, problems.join("; "))
        }
    }

    /// Whether it held (PASS).
    pub fn passed(&self) -> bool {
        self.verdict == Verdict::Pass
    }
}

/// How a part's checks are written in `report.json` (`#[serde(serialize_with = …)]` on a
/// `Vec<Check>` field), each in the key order of the schema.
pub mod json {
    use serde::ser::{SerializeSeq, SerializeStruct, Serializer};

    use super::Check;

    /// What one element is written as.
    #[derive(Clone, Copy)]
    enum Shape {
        /// `{name, passed, detail}`: a library race run's checks.
        Held,
        /// `{name, passed, detail, follows_from}`: a black-box run's checks.
        HeldAfter,
        /// `{name, verdict, evidence}`: the soak's checks (they may be PENDING).
        Verdicts,
    }

    struct One<'c>(&'c Check, Shape);

    impl serde::Serialize for One<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let One(c, shape) = *self;
            let mut st = s.serialize_struct("Check", 4)?;
            st.serialize_field("name", c.name)?;
            match shape {
                Shape::Held | Shape::HeldAfter => {
                    st.serialize_field("passed", &c.passed())?;
                    st.serialize_field("detail", &c.detail)?;
                    if let Shape::HeldAfter = shape {
                        st.serialize_field("follows_from", &c.follows_from)?;
                    }
                }
                Shape::Verdicts => {
                    st.serialize_field("verdict", &c.verdict)?;
                    st.serialize_field("evidence", &c.detail)?;
                }
            }
            st.end()
        }
    }

    fn list<S: Serializer>(checks: &[Check], shape: Shape, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(checks.len()))?;
        for c in checks {
            seq.serialize_element(&One(c, shape))?;
        }
        seq.end()
    }

    /// A library race run's checks: `[{name, passed, detail}]` (`passed` is false for a
    /// PENDING check).
    pub fn held<S: Serializer>(checks: &[Check], s: S) -> Result<S::Ok, S::Error> {
        list(checks, Shape::Held, s)
    }

    /// A black-box run's checks: `[{name, passed, detail, follows_from}]`, `follows_from`
    /// null when the check stands on its own.
    pub(crate) fn held_after<S: Serializer>(checks: &[Check], s: S) -> Result<S::Ok, S::Error> {
        list(checks, Shape::HeldAfter, s)
    }

    /// The soak's checks: `[{name, verdict, evidence}]`, `verdict` one of `PASS`, `FAIL`,
    /// `PENDING`.
    pub fn verdicts<S: Serializer>(checks: &[Check], s: S) -> Result<S::Ok, S::Error> {
        list(checks, Shape::Verdicts, s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Lists {
        #[serde(serialize_with = "json::held")]
        held: Vec<Check>,
        #[serde(serialize_with = "json::held_after")]
        after: Vec<Check>,
        #[serde(serialize_with = "json::verdicts")]
        verdicts: Vec<Check>,
    }

    #[test]
    fn each_part_writes_its_checks_in_its_own_shape_and_key_order() {
        let mut explained = Check::fail("same answer", "two answers");
        explained.follows_from = Some("answers");
        let lists = Lists {
            held: vec![
                Check::pass("barrier", "8 held"),
                Check::pending("rows", "no db"),
            ],
            after: vec![explained],
            verdicts: vec![Check::pending("sessions", "no server")],
        };
        assert_eq!(
            serde_json::to_string(&lists).unwrap(),
            r#"{"held":[{"name":"barrier","passed":true,"detail":"8 held"},{"name":"rows","passed":false,"detail":"no db"}],"after":[{"name":"same answer","passed":false,"detail":"two answers","follows_from":"answers"}],"verdicts":[{"name":"sessions","verdict":"PENDING","evidence":"no server"}]}"#
        );
    }

    #[test]
    fn only_a_pass_is_passed() {
        assert!(Check::held("x", true, "").passed());
        assert!(!Check::held("x", false, "").passed());
        assert!(!Check::pending("x", "").passed());
    }
}
