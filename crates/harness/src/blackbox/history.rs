//! A scenario judged by the idempotency model (`[expect] model = true`): its racers read as
//! one history, their final answers judged by [`crate::oracle::model`], and every count query
//! compared with the effects the model leaves under the (scope, key)s it binds.
//!
//! The history: waves in order; a wave of one racer is a request sent after every earlier
//! answer, a wave of two or more a concurrent group. A racer whose `expect` holds `rejected`
//! sends an invalid body. Racers whose bodies have one canonical JSON are one intent, so a body
//! with its members reordered or re-spaced is the same intent.

use super::format::{CountExpectation, TargetScenario};
use super::rules::AnswerKind;
use super::{CountSeen, RacerRun};
use crate::oracle::history::{Body, Form, History, Request, Step};
use crate::oracle::model::{judge, Answer, Judged, Names, Options};
use crate::verdict::Check;

/// The counts read at one point of a model-judged run.
#[derive(Debug, Clone)]
pub struct Recount {
    /// The wave after which they were read; `None`: after the last wave and the settle time.
    pub after_wave: Option<u32>,
    /// What each query counted.
    pub counts: Vec<CountSeen>,
}

/// One count per `[target.count]` query and binding of its placeholders among the racers: a
/// query using `{scope}` and `{key}` is read per (scope, key), one using `{key}` per key, one
/// using neither once. The expected value is set by [`model_checks`].
pub(crate) fn count_bindings(scenario: &TargetScenario) -> Vec<CountExpectation> {
    let mut out: Vec<CountExpectation> = Vec::new();
    for q in &scenario.target.counts {
        for r in &scenario.racers {
            let scope = q
                .params
                .contains(&"scope")
                .then(|| r.scope.clone())
                .flatten();
            let key = q.params.contains(&"key").then(|| r.key.clone());
            let seen = out.iter_mut().find(|e| e.scope == scope && e.key == key);
            match seen {
                Some(e) => {
                    e.values.insert(q.name.clone(), 0);
                }
                None => out.push(CountExpectation {
                    scope,
                    key,
                    values: [(q.name.clone(), 0)].into(),
                }),
            }
        }
    }
    out
}

/// The racers as a history, with the wave of each step and each racer's final answer.
struct AsHistory {
    history: History,
    waves: Vec<u32>,
    answers: Vec<Vec<Answer>>,
    /// Racer names per step, in the step's order.
    names: Vec<Vec<String>>,
    scopes: Vec<Option<String>>,
    keys: Vec<String>,
}

fn index_of<T: PartialEq + Clone>(list: &mut Vec<T>, item: &T) -> usize {
    match list.iter().position(|x| x == item) {
        Some(i) => i,
        None => {
            list.push(item.clone());
            list.len() - 1
        }
    }
}

fn as_history(scenario: &TargetScenario, racers: &[RacerRun]) -> AsHistory {
    let mut h = AsHistory {
        history: History::default(),
        waves: Vec::new(),
        answers: Vec::new(),
        names: Vec::new(),
        scopes: Vec::new(),
        keys: Vec::new(),
    };
    let mut intents: Vec<String> = Vec::new();
    for (wave, indices) in scenario.waves() {
        let mut requests = Vec::new();
        let mut answers = Vec::new();
        let mut names = Vec::new();
        for i in indices {
            let declared = &scenario.racers[i];
            let Some(run) = racers.iter().find(|r| r.name == declared.name) else {
                continue;
            };
            let body = if declared.expect.contains(&AnswerKind::Rejected) {
                Body::Invalid
            } else {
                Body::Valid {
                    variant: index_of(&mut intents, &run.intent_sha256),
                    form: Form::Plain,
                }
            };
            requests.push(Request {
                scope: index_of(&mut h.scopes, &declared.scope),
                key: index_of(&mut h.keys, &declared.key),
                body,
                instance: 0,
            });
            answers.push(answer_of(run));
            names.push(run.name.clone());
        }
        h.history.steps.push(match requests.len() {
            1 => Step::One(requests.remove(0)),
            _ => Step::Group(requests),
        });
        h.waves.push(wave);
        h.answers.push(answers);
        h.names.push(names);
    }
    h
}

/// A racer's final answer as the model reads it.
pub(crate) fn answer_of(run: &RacerRun) -> Answer {
    let last = run.last();
    match last.kind {
        AnswerKind::Created | AnswerKind::Replayed => match &last.id {
            Some(id) => Answer::Success {
                id: id.clone(),
                body: last
                    .answer
                    .as_ref()
                    .ok()
                    .and_then(|a| serde_json::from_slice(&a.body).ok()),
            },
            None => Answer::Error(format!("{} without an id", last.kind)),
        },
        AnswerKind::Conflict => Answer::Conflict,
        AnswerKind::Rejected => Answer::Rejected,
        AnswerKind::InProgress => Answer::InProgress,
        // No answer: the request may or may not have had its effect.
        AnswerKind::Timeout => Answer::Indeterminate,
        AnswerKind::Error => match &last.answer {
            Err(_) => Answer::Indeterminate,
            Ok(a) => Answer::Error(format!(
                "answered HTTP {}{}",
                a.status,
                last.note
                    .as_ref()
                    .map(|n| format!(" ({n})"))
                    .unwrap_or_default()
            )),
        },
    }
}

/// The model's fewest and most effects under the (scope, key)s `c` binds, after step `step`.
fn expected(h: &AsHistory, judged: &Judged, step: usize, c: &CountSeen) -> (usize, usize) {
    let Some(keys) = judged.keys_after.get(step) else {
        return (0, 0);
    };
    keys.iter()
        .filter(|((s, k), _)| {
            c.scope
                .as_ref()
                .map_or(true, |x| h.scopes[*s].as_ref() == Some(x))
                && c.key.as_ref().map_or(true, |x| &h.keys[*k] == x)
        })
        .fold((0, 0), |(lo, hi), (_, (a, b))| (lo + a, hi + b))
}

/// Sets each count's expected value from the model and judges it: the counted value when it
/// lies in the model's range, else the nearer end of the range (so the report shows it).
fn judge_counts(
    h: &AsHistory,
    judged: &Judged,
    step: usize,
    counts: &mut [CountSeen],
    when: &str,
) -> Vec<String> {
    let mut problems = Vec::new();
    for c in counts.iter_mut() {
        let (lo, hi) = expected(h, judged, step, c);
        let (lo, hi) = (lo as i64, hi as i64);
        c.expected = match &c.counted {
            Ok(v) => (*v).clamp(lo, hi),
            Err(_) => lo,
        };
        if let Ok(v) = c.counted {
            if v != c.expected {
                let range = if lo == hi {
                    format!("{lo}")
                } else {
                    format!("{lo} to {hi}")
                };
                problems.push(format!(
                    "{}{} {when}: counted {v}, the model has {range}",
                    c.name,
                    binding(c)
                ));
            }
        }
    }
    problems
}

/// The `model` check (answers against the model) and the `counts` checks (end, after settle,
/// and after each `settle_after` wave), with every count's expected value set from the model.
pub(crate) fn model_checks(
    scenario: &TargetScenario,
    racers: &[RacerRun],
    counts: &mut [CountSeen],
    recounts: &mut [Recount],
) -> Vec<Check> {
    let h = as_history(scenario, racers);
    let opts = Options {
        same_answer: scenario.target.replay.same_answer,
        ignore: scenario.target.replay.ignore.clone(),
        names: Some(Names {
            scopes: h
                .scopes
                .iter()
                .map(|s| s.clone().unwrap_or_else(|| "-".into()))
                .collect(),
            keys: h.keys.clone(),
        }),
    };
    let judged = match judge(&h.history, &h.answers, &opts) {
        Ok(j) => j,
        Err(v) => {
            let who = h
                .names
                .get(v.step)
                .and_then(|n| n.get(v.request))
                .map(|n| format!(" (racer {n})"))
                .unwrap_or_default();
            let wave = h.waves.get(v.step).copied().unwrap_or(0);
            return vec![Check::fail(
                "model",
                format!("wave {wave}{who}: {}", v.message),
            )];
        }
    };
    let last = h.history.steps.len().saturating_sub(1);
    let mut checks = vec![Check::pass(
        "model",
        format!(
            "{} request(s) in {} step(s) explained by the idempotency model{}",
            h.history.request_count(),
            h.history.steps.len(),
            if opts.same_answer {
                ""
            } else {
                " (answers not compared: same_answer = false)"
            }
        ),
    )];
    let mut problems = judge_counts(&h, &judged, last, counts, "when the last answer arrived");
    for r in recounts.iter_mut() {
        let (step, when) = match r.after_wave {
            Some(w) => (
                h.waves.iter().position(|x| *x == w).unwrap_or(last),
                format!("after wave {w} settled"),
            ),
            None => (last, "after the settle time".to_string()),
        };
        problems.extend(judge_counts(&h, &judged, step, &mut r.counts, &when));
    }
    if !counts.is_empty() {
        let settled = recounts.iter().any(|r| r.after_wave.is_none());
        checks.push(match problems.is_empty() {
            true => Check::pass(
                "counts",
                format!(
                    "{} count(s) equal the model's effects{}",
                    counts.len(),
                    if settled {
                        " at the last answer and after the settle time"
                    } else {
                        ""
                    }
                ),
            ),
            false => Check::fail("counts", problems.join("; ")),
        });
    }
    checks
}

/// A count's binding as shown after its name: `[scope=A, key=k1]`, or nothing when unbound.
pub(super) fn binding(c: &CountSeen) -> String {
    let parts: Vec<String> = [("scope", &c.scope), ("key", &c.key)]
        .iter()
        .filter_map(|(n, v)| v.as_ref().map(|v| format!("{n}={v}")))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("[{}]", parts.join(", "))
    }
}
