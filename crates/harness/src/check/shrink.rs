//! Shrinking a failing history to a minimal one that still fails.
//!
//! Greedy, as QuickCheck shrinks: try simpler candidates in a fixed order (a step dropped, a
//! request dropped from a concurrent group, a group sent one by one, a body written plainly, a
//! request sent to the first instance, a scope, key or body merged into the first) and keep the
//! first that still fails; stop when none does or the budget of re-runs is spent. Each
//! candidate is re-run by the caller from a fresh run (new keys), so a flaky failure shrinks
//! only as far as it keeps failing.

use crate::oracle::history::{Body, Form, History, Request, Step};

/// A shrunk history and what shrinking it cost.
#[derive(Debug, Clone)]
pub struct Shrunk {
    /// The smallest failing history found.
    pub history: History,
    /// Candidates re-run.
    pub runs: usize,
    /// Whether the budget ran out before no candidate failed (the history may shrink further).
    pub budget_spent: bool,
}

/// Shrinks `failing` while `fails` says a candidate still fails, re-running at most `budget`
/// candidates.
pub fn shrink(failing: &History, budget: usize, mut fails: impl FnMut(&History) -> bool) -> Shrunk {
    let mut history = failing.clone();
    let mut runs = 0;
    'outer: loop {
        for candidate in candidates(&history) {
            if runs >= budget {
                return Shrunk {
                    history,
                    runs,
                    budget_spent: true,
                };
            }
            runs += 1;
            if fails(&candidate) {
                history = candidate;
                continue 'outer;
            }
        }
        return Shrunk {
            history,
            runs,
            budget_spent: false,
        };
    }
}

/// The simpler histories to try, simplest changes first.
fn candidates(h: &History) -> Vec<History> {
    let mut out = Vec::new();
    let mut push = |c: History| {
        if &c != h && !out.contains(&c) {
            out.push(c);
        }
    };
    // A step dropped, the latest first (an earlier step more often sets the failure up).
    for i in (0..h.steps.len()).rev() {
        let mut c = h.clone();
        c.steps.remove(i);
        push(c);
    }
    for (i, step) in h.steps.iter().enumerate() {
        if let Step::Group(rs) = step {
            // One request dropped from the group (a group of one is a plain step).
            for j in 0..rs.len() {
                let mut rest = rs.clone();
                rest.remove(j);
                let mut c = h.clone();
                c.steps[i] = if rest.len() == 1 {
                    Step::One(rest[0])
                } else {
                    Step::Group(rest)
                };
                push(c);
            }
            // The group sent one by one.
            let mut c = h.clone();
            c.steps.splice(i..=i, rs.iter().map(|r| Step::One(*r)));
            push(c);
        }
    }
    // Every request simplified the same way at once.
    let simplify = |f: &dyn Fn(Request) -> Request| History {
        steps: h
            .steps
            .iter()
            .map(|s| match s {
                Step::One(r) => Step::One(f(*r)),
                Step::Group(rs) => Step::Group(rs.iter().map(|r| f(*r)).collect()),
                Step::Settle => Step::Settle,
            })
            .collect(),
    };
    push(simplify(&|r| Request {
        body: match r.body {
            Body::Valid { variant, .. } => Body::Valid {
                variant,
                form: Form::Plain,
            },
            Body::Invalid => Body::Invalid,
        },
        ..r
    }));
    push(simplify(&|r| Request { instance: 0, ..r }));
    let used = |f: fn(&Request) -> usize| {
        let mut v: Vec<usize> = h.steps.iter().flat_map(|s| s.requests()).map(f).collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let scopes = used(|r| r.scope);
    let keys = used(|r| r.key);
    let variants = used(|r| match r.body {
        Body::Valid { variant, .. } => variant,
        Body::Invalid => 0,
    });
    for &s in scopes.iter().skip(1) {
        push(simplify(&|r| Request {
            scope: if r.scope == s { scopes[0] } else { r.scope },
            ..r
        }));
    }
    for &k in keys.iter().skip(1) {
        push(simplify(&|r| Request {
            key: if r.key == k { keys[0] } else { r.key },
            ..r
        }));
    }
    for &v in variants.iter().skip(1) {
        push(simplify(&|r| Request {
            body: match r.body {
                Body::Valid { variant, form } if variant == v => Body::Valid {
                    variant: variants[0],
                    form,
                },
                other => other,
            },
            ..r
        }));
    }
    out
}
