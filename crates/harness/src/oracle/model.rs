//! The idempotency model a whole history is judged against (PROTOCOL §11).
//!
//! Per (scope, key) the state is *empty* or *done(intent, id, answer)*. The first request of an
//! intent that finds the key empty and succeeds creates; the same intent later gets that id
//! (and, when answers are compared, an equal answer minus the ignored members); another intent
//! is refused and changes nothing; an invalid body is rejected, changes nothing and does not
//! poison the key. Scopes are independent, and distinct keys give distinct ids. A concurrent
//! group is correct when some order of its requests explains every answer ("in progress" is
//! allowed while another request of the group holds the key). A request with no answer (a cut
//! connection, a deadline) is indeterminate: it may or may not have created, so the model keeps
//! both possibilities until a later answer tells them apart.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::history::{History, Request, Step};
use super::json::{differing_pointers, without};

/// What a service's answer to one request meant, as the runner classified it.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// Created or replayed: the id of the effect, and the answer's JSON body when it had one.
    Success {
        /// The effect's id as the answer names it.
        id: String,
        /// The answer's body, for comparing replays with the first answer.
        body: Option<Value>,
    },
    /// Refused: another body under a used key.
    Conflict,
    /// Rejected: the body is invalid.
    Rejected,
    /// The key's first request is still running.
    InProgress,
    /// No answer (connection cut, deadline): the outcome is unknown.
    Indeterminate,
    /// Any other answer (a 5xx, an unclassified status), with what was seen.
    Error(String),
}

/// How answers are compared.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Compare a replay's body with the first answer's.
    pub same_answer: bool,
    /// JSON pointers (RFC 6901) left out of that comparison (timestamps, request ids), as a
    /// black-box file's `ignore`.
    pub ignore: Vec<String>,
    /// Names of the scopes and keys by index, for messages (`A/k1` when absent).
    pub names: Option<Names>,
}

/// The names a history's scope and key indices stand for.
#[derive(Debug, Clone, Default)]
pub struct Names {
    /// Scope names by index.
    pub scopes: Vec<String>,
    /// Key names by index.
    pub keys: Vec<String>,
}

/// The first request the model cannot explain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Index of the step in the history (0-based).
    pub step: usize,
    /// Index of the request within the step (0-based).
    pub request: usize,
    /// What was wrong, in words.
    pub message: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "step {}: {}", self.step + 1, self.message)
    }
}

/// The state of one (scope, key) that has an effect.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Done {
    intent: usize,
    /// `None` while the effect came from an indeterminate request and no answer named it yet.
    id: Option<String>,
    /// The first answer's body, canonical text (for comparing replays).
    answer: Option<String>,
}

/// Every (scope, key) with an effect; an absent key is empty.
type State = BTreeMap<(usize, usize), Done>;

/// What the model expects after each step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judged {
    /// Per step, the fewest and the most effects the history may have made by then (they
    /// differ only while an indeterminate request is unresolved).
    pub effects_after: Vec<(usize, usize)>,
    /// Per step, per (scope, key) the history used so far, the fewest and the most effects
    /// (0 or 1 each) that key may hold by then.
    pub keys_after: Vec<BTreeMap<(usize, usize), (usize, usize)>>,
}

impl Judged {
    /// Checks effects `counted` after step `step` (e.g. at a settle, or at the end) against the
    /// model's range.
    ///
    /// Will return `Err` naming both numbers when the count is outside the range.
    pub fn check_effects(&self, step: usize, counted: usize) -> Result<(), Violation> {
        let (min, max) = self.effects_after.get(step).copied().unwrap_or((0, 0));
        if (min..=max).contains(&counted) {
            return Ok(());
        }
        let expected = if min == max {
            format!("{min}")
        } else {
            format!("{min} to {max}")
        };
        Err(Violation {
            step,
            request: 0,
            message: format!(
                "the service holds {counted} effect(s) where the model has {expected}"
            ),
        })
    }
}

/// Judges `answers` (one per request of each step, in the history's order) against the model.
///
/// Will return `Err` with the first request no order of its step can explain; a history whose
/// answers do not line up with its requests is a violation at the first step that differs.
pub fn judge(
    history: &History,
    answers: &[Vec<Answer>],
    opts: &Options,
) -> Result<Judged, Violation> {
    let mut states: Vec<State> = vec![State::new()];
    let mut effects_after = Vec::with_capacity(history.steps.len());
    let mut keys_after = Vec::with_capacity(history.steps.len());
    let mut used: BTreeSet<(usize, usize)> = BTreeSet::new();
    for (i, step) in history.steps.iter().enumerate() {
        let requests = step.requests();
        let seen = answers.get(i).map(Vec::as_slice).unwrap_or(&[]);
        if seen.len() != requests.len() {
            return Err(Violation {
                step: i,
                request: 0,
                message: format!(
                    "{} answer(s) recorded for {} request(s)",
                    seen.len(),
                    requests.len()
                ),
            });
        }
        if let Step::Group(_) = step {
            states =
                explain_group(&states, requests, seen, opts).map_err(|(request, message)| {
                    Violation {
                        step: i,
                        request,
                        message,
                    }
                })?;
        } else if let Some((r, a)) = requests.first().zip(seen.first()) {
            states = apply_to_all(&states, r, a, false, opts).map_err(|message| Violation {
                step: i,
                request: 0,
                message,
            })?;
        }
        let counts = states.iter().map(BTreeMap::len);
        let min = counts.clone().min().unwrap_or(0);
        let max = counts.max().unwrap_or(0);
        effects_after.push((min, max));
        used.extend(requests.iter().map(|r| (r.scope, r.key)));
        keys_after.push(
            used.iter()
                .map(|k| {
                    let held = states.iter().map(|s| usize::from(s.contains_key(k)));
                    (
                        *k,
                        (held.clone().min().unwrap_or(0), held.max().unwrap_or(0)),
                    )
                })
                .collect(),
        );
    }
    Ok(Judged {
        effects_after,
        keys_after,
    })
}

fn dedup(states: Vec<State>) -> Vec<State> {
    let set: BTreeSet<State> = states.into_iter().collect();
    set.into_iter().collect()
}

/// The states any of `states` may become after `r` answered `a` (deduplicated); else the reason
/// the first state could not explain it.
fn apply_to_all(
    states: &[State],
    r: &Request,
    a: &Answer,
    shared: bool,
    opts: &Options,
) -> Result<Vec<State>, String> {
    let mut next = Vec::new();
    let mut first_error = None;
    for s in states {
        match apply(s, r, a, shared, opts) {
            Ok(more) => next.extend(more),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    if next.is_empty() {
        return Err(first_error.unwrap_or_default());
    }
    Ok(dedup(next))
}

/// The states in which some order of the group's requests explains every answer; else the
/// request and reason of the order that got furthest.
fn explain_group(
    states: &[State],
    requests: &[Request],
    answers: &[Answer],
    opts: &Options,
) -> Result<Vec<State>, (usize, String)> {
    // Whether another request of the group uses the same key (then "in progress" is allowed).
    let shared: Vec<bool> = requests
        .iter()
        .enumerate()
        .map(|(i, r)| {
            requests
                .iter()
                .enumerate()
                .any(|(j, o)| j != i && (o.scope, o.key) == (r.scope, r.key))
        })
        .collect();
    let mut out = Vec::new();
    let mut furthest: Option<(usize, usize, String)> = None;
    for state in states {
        for order in permutations(requests.len()) {
            let mut current = vec![state.clone()];
            let mut failed = None;
            for (depth, &i) in order.iter().enumerate() {
                match apply_to_all(&current, &requests[i], &answers[i], shared[i], opts) {
                    Ok(next) => current = next,
                    Err(e) => {
                        failed = Some((depth, i, e));
                        break;
                    }
                }
            }
            match failed {
                None => out.extend(current),
                Some((depth, i, e)) => {
                    if furthest.as_ref().map_or(true, |(d, _, _)| depth > *d) {
                        furthest = Some((depth, i, e));
                    }
                }
            }
        }
    }
    if out.is_empty() {
        let (_, i, e) = furthest.unwrap_or_default();
        return Err((
            i,
            format!("no order of the requests sent together explains the answers: {e}"),
        ));
    }
    Ok(dedup(out))
}

/// Every order of `0..n` (n is at most 4 in a generated group: 24 orders).
fn permutations(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![Vec::new()];
    }
    let mut out = Vec::new();
    for rest in permutations(n - 1) {
        for at in 0..=rest.len() {
            let mut p = rest.clone();
            p.insert(at, n - 1);
            out.push(p);
        }
    }
    out
}

fn who(key: (usize, usize), opts: &Options) -> String {
    let names = opts.names.as_ref();
    let scope = names
        .and_then(|n| n.scopes.get(key.0).cloned())
        .unwrap_or_else(|| char::from(b'A' + (key.0 % 26) as u8).to_string());
    let k = names
        .and_then(|n| n.keys.get(key.1).cloned())
        .unwrap_or_else(|| format!("k{}", key.1 + 1));
    format!("{scope}/{k}")
}

/// The states `state` may become after request `r` answered `a`; `shared`: another request of
/// the same concurrent group uses the key, so "in progress" is allowed.
fn apply(
    state: &State,
    r: &Request,
    a: &Answer,
    shared: bool,
    opts: &Options,
) -> Result<Vec<State>, String> {
    let key = (r.scope, r.key);
    let Some(intent) = r.body.intent() else {
        return match a {
            // A service may refuse an invalid body with the status it uses for a conflict
            // (422 is both under the IETF draft): either way it is refused.
            Answer::Rejected | Answer::Conflict | Answer::Indeterminate => Ok(vec![state.clone()]),
            other => Err(format!(
                "{}: an invalid body was answered {}; it must be refused and change nothing",
                who(key, opts),
                describe(other)
            )),
        };
    };
    match (state.get(&key), a) {
        (_, Answer::Indeterminate) => {
            // It may have created (if the key was empty), or not.
            let mut created = state.clone();
            created.entry(key).or_insert(Done {
                intent,
                id: None,
                answer: None,
            });
            Ok(vec![state.clone(), created])
        }
        (_, Answer::InProgress) if shared => Ok(vec![state.clone()]),
        (_, Answer::InProgress) => Err(format!(
            "{}: answered in progress with no other request on the key in flight",
            who(key, opts)
        )),
        (_, Answer::Error(e)) => Err(format!("{}: {e}", who(key, opts))),
        (None, Answer::Success { id, body }) => {
            holder_of(state, id, key, opts)?;
            let mut next = state.clone();
            next.insert(
                key,
                Done {
                    intent,
                    id: Some(id.clone()),
                    answer: body.as_ref().map(ticketflow_core::canonical::canonical_json),
                },
            );
            Ok(vec![next])
        }
        (None, Answer::Conflict) => Err(format!(
            "{}: refused with nothing stored under the key (a refused or rejected request must not poison it)",
            who(key, opts)
        )),
        (_, Answer::Rejected) => Err(format!("{}: a valid body was rejected", who(key, opts))),
        (Some(done), Answer::Success { id, body }) if done.intent == intent => {
            match &done.id {
                Some(first) if first != id => {
                    return Err(format!(
                        "{}: a retry was answered id {id}, but the key's effect is {first}",
                        who(key, opts)
                    ))
                }
                Some(_) => {}
                None => holder_of(state, id, key, opts)?,
            }
            if opts.same_answer {
                if let (Some(first), Some(now)) = (&done.answer, body) {
                    let first: Value = serde_json::from_str(first).unwrap_or(Value::Null);
                    let differ = differing_pointers(
                        &without(&first, &opts.ignore),
                        &without(now, &opts.ignore),
                        8,
                    );
                    if !differ.is_empty() {
                        return Err(format!(
                            "{}: a retry's answer differs from the first at {} (declare volatile members in `ignore`)",
                            who(key, opts),
                            differ.join(", ")
                        ));
                    }
                }
            }
            let mut next = state.clone();
            let entry = next.get_mut(&key).expect("the key is done");
            entry.id = Some(id.clone());
            if entry.answer.is_none() {
                entry.answer = body.as_ref().map(ticketflow_core::canonical::canonical_json);
            }
            Ok(vec![next])
        }
        (Some(done), Answer::Conflict) if done.intent == intent => Err(format!(
            "{}: the same body was refused (members reordered or re-spaced are the same intent)",
            who(key, opts)
        )),
        (Some(_), Answer::Conflict) => Ok(vec![state.clone()]),
        (Some(done), Answer::Success { id, .. }) => Err(match &done.id {
            Some(first) if first == id => format!(
                "{}: another body under a used key was answered with the key's effect {id}; it must be refused",
                who(key, opts)
            ),
            _ => format!(
                "{}: another body under a used key was accepted (id {id}); it must be refused",
                who(key, opts)
            ),
        }),
    }
}

/// `Err` when another (scope, key) already holds `id`: distinct keys and scopes give distinct
/// effects.
fn holder_of(state: &State, id: &str, key: (usize, usize), opts: &Options) -> Result<(), String> {
    match state
        .iter()
        .find(|(k, d)| **k != key && d.id.as_deref() == Some(id))
    {
        Some((other, _)) => Err(format!(
            "{}: answered id {id}, which is {}'s effect (distinct keys and scopes must give distinct effects)",
            who(key, opts),
            who(*other, opts)
        )),
        None => Ok(()),
    }
}

fn describe(a: &Answer) -> String {
    match a {
        Answer::Success { id, .. } => format!("a success (id {id})"),
        Answer::Conflict => "a conflict".into(),
        Answer::Rejected => "rejected".into(),
        Answer::InProgress => "in progress".into(),
        Answer::Indeterminate => "nothing".into(),
        Answer::Error(e) => e.clone(),
    }
}
