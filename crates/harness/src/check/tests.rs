//! The model, generator and shrinker against an in-process service with planted defects: the
//! correct one passes every history, each defect fails some history and shrinks small.

use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::json;

use super::generate::{generate, Pools};
use super::shrink::shrink;
use crate::oracle::history::{Body, Form, History, Request, Step};
use crate::oracle::model::{judge, Answer, Options};

/// A defect planted in the simulated service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bug {
    None,
    /// A replay answers the scope's newest effect instead of the keyed one.
    ReplayNewest,
    /// A refused body overwrites the stored fingerprint.
    RefusedOverwrites,
    /// The response cache is keyed without the scope.
    CacheWithoutScope,
    /// The fingerprint is the raw text (reordered members are another body).
    RawFingerprint,
    /// A replay is re-rendered from the current row, with a field changed.
    ReplayRerendered,
    /// An invalid body leaves a record that refuses the key afterwards.
    InvalidPoisons,
    /// Keys 1 and 2 of a scope hash to one slot.
    KeyCollision,
    /// Each replay writes one more effect (a late outbox row), seen at a recount.
    EffectOnReplay,
}

#[derive(Default)]
struct Sim {
    bug: Option<Bug>,
    rows: HashMap<(usize, usize), (String, String, u64)>,
    newest: HashMap<usize, String>,
    cache: HashMap<usize, (String, String, u64)>,
    effects: usize,
    next: u64,
}

impl Sim {
    fn new(bug: Bug) -> Self {
        Sim {
            bug: Some(bug),
            ..Sim::default()
        }
    }

    fn bug(&self, b: Bug) -> bool {
        self.bug == Some(b)
    }

    fn answer(&mut self, r: &Request) -> Answer {
        let slot = if self.bug(Bug::KeyCollision) {
            r.key / 2
        } else {
            r.key
        };
        let key = (r.scope, slot);
        let Some(intent) = r.body.intent() else {
            if self.bug(Bug::InvalidPoisons) {
                self.rows
                    .entry(key)
                    .or_insert(("invalid".into(), "none".into(), 0));
            }
            return Answer::Rejected;
        };
        let fp = if self.bug(Bug::RawFingerprint) {
            format!("{:?}", r.body)
        } else {
            format!("{intent}")
        };
        if self.bug(Bug::CacheWithoutScope) {
            if let Some((cached_fp, id, created)) = self.cache.get(&r.key) {
                if *cached_fp == fp {
                    return Answer::Success {
                        id: id.clone(),
                        body: Some(json!({ "id": id, "status": "new", "created": created })),
                    };
                }
            }
        }
        if let Some((stored, id, created)) = self.rows.get(&key).cloned() {
            if stored == fp {
                if self.bug(Bug::EffectOnReplay) {
                    self.effects += 1;
                }
                let id = if self.bug(Bug::ReplayNewest) {
                    self.newest[&r.scope].clone()
                } else {
                    id
                };
                let status = if self.bug(Bug::ReplayRerendered) {
                    "open"
                } else {
                    "new"
                };
                return Answer::Success {
                    id: id.clone(),
                    body: Some(json!({ "id": id, "status": status, "created": created })),
                };
            }
            if self.bug(Bug::RefusedOverwrites) {
                self.rows.get_mut(&key).expect("present").0 = fp;
            }
            return Answer::Conflict;
        }
        self.next += 1;
        let id = format!("t{}", self.next);
        self.rows.insert(key, (fp.clone(), id.clone(), self.next));
        self.newest.insert(r.scope, id.clone());
        self.cache.insert(r.key, (fp, id.clone(), self.next));
        self.effects += 1;
        Answer::Success {
            id: id.clone(),
            body: Some(json!({ "id": id, "status": "new", "created": self.next })),
        }
    }
}

/// Runs `h` on a fresh service with `bug`: `Err` with the model's verdict when it fails.
fn run(h: &History, bug: Bug) -> Result<(), String> {
    let mut sim = Sim::new(bug);
    let mut answers = Vec::new();
    let mut recounts = Vec::new();
    for (i, step) in h.steps.iter().enumerate() {
        if let Step::Settle = step {
            recounts.push((i, sim.effects));
        }
        answers.push(step.requests().iter().map(|r| sim.answer(r)).collect());
    }
    let opts = Options {
        same_answer: true,
        ignore: vec!["/created".into()],
        names: None,
    };
    let judged = judge(h, &answers, &opts).map_err(|v| v.to_string())?;
    recounts.push((h.steps.len().saturating_sub(1), sim.effects));
    for (step, counted) in recounts {
        if h.steps.is_empty() {
            break;
        }
        judged
            .check_effects(step, counted)
            .map_err(|v| v.to_string())?;
    }
    Ok(())
}

fn histories(n: u64) -> impl Iterator<Item = (u64, History)> {
    (0..n).map(|seed| {
        let mut rng = StdRng::seed_from_u64(seed);
        (seed, generate(&Pools::default(), &mut rng).history)
    })
}

#[test]
fn a_correct_service_passes_every_generated_history() {
    for (seed, h) in histories(400) {
        assert_eq!(
            run(&h, Bug::None),
            Ok(()),
            "seed {seed}: {:#?}",
            h.describe()
        );
    }
}

#[test]
fn each_planted_defect_fails_a_history_that_shrinks_to_at_most_four_requests() {
    for (bug, reason) in [
        (Bug::ReplayNewest, "a retry was answered id"),
        (Bug::RefusedOverwrites, "another body under a used key"),
        (Bug::CacheWithoutScope, "distinct keys and scopes"),
        (Bug::RawFingerprint, "the same body was refused"),
        (Bug::ReplayRerendered, "differs from the first at /status"),
        (Bug::InvalidPoisons, "must not poison"),
        (Bug::KeyCollision, "distinct keys and scopes"),
        (Bug::EffectOnReplay, "effect(s) where the model has 1"),
    ] {
        let (seed, failing) = histories(400)
            .find(|(_, h)| run(h, bug).is_err())
            .unwrap_or_else(|| panic!("{bug:?} passed 400 histories"));
        let shrunk = shrink(&failing, 500, |c| run(c, bug).is_err());
        let verdict = run(&shrunk.history, bug).expect_err("the shrunk history still fails");
        assert!(
            verdict.contains(reason),
            "{bug:?} failed for another reason: {verdict}"
        );
        assert_eq!(
            run(&shrunk.history, Bug::None),
            Ok(()),
            "{bug:?}: fails a correct service too"
        );
        assert!(
            shrunk.history.request_count() <= 4,
            "{bug:?} (seed {seed}) shrank only to {:#?}",
            shrunk.history.describe()
        );
        assert!(!shrunk.budget_spent, "{bug:?}: shrinking ran out of budget");
    }
}

#[test]
fn a_seed_reproduces_its_history() {
    let a: Vec<_> = histories(20).collect();
    let b: Vec<_> = histories(20).collect();
    assert_eq!(a, b);
    assert_ne!(a[0].1, a[1].1, "two seeds gave one history");
}

fn one(scope: usize, key: usize, variant: usize) -> Request {
    Request {
        scope,
        key,
        body: Body::Valid {
            variant,
            form: Form::Plain,
        },
        instance: 0,
    }
}

fn ok(id: &str) -> Answer {
    Answer::Success {
        id: id.into(),
        body: None,
    }
}

#[test]
fn a_group_is_judged_by_some_order_of_its_requests() {
    let h = History {
        steps: vec![Step::Group(vec![one(0, 0, 0), one(0, 0, 1), one(0, 0, 0)])],
    };
    let opts = Options::default();
    // The second body won the race: the others are a conflict and, for the same body as the
    // first... a conflict too, since the winner holds another body.
    let answers = vec![vec![Answer::Conflict, ok("t1"), Answer::Conflict]];
    assert!(judge(&h, &answers, &opts).is_ok());
    // In progress is allowed while another request of the group holds the key.
    let answers = vec![vec![ok("t1"), Answer::Conflict, Answer::InProgress]];
    assert!(judge(&h, &answers, &opts).is_ok());
    // Two creates for one key: no order explains it.
    let answers = vec![vec![ok("t1"), Answer::Conflict, ok("t2")]];
    let v = judge(&h, &answers, &opts).expect_err("two effects for one key");
    assert!(v.message.contains("no order"), "{v}");
}

#[test]
fn an_indeterminate_request_may_have_created_and_its_retry_must_converge() {
    let h = History {
        steps: vec![
            Step::One(one(0, 0, 0)),
            Step::One(one(0, 0, 0)),
            Step::One(one(0, 0, 0)),
        ],
    };
    let opts = Options::default();
    let converged = vec![vec![Answer::Indeterminate], vec![ok("t1")], vec![ok("t1")]];
    let judged = judge(&h, &converged, &opts).expect("converges");
    assert_eq!(judged.effects_after, [(0, 1), (1, 1), (1, 1)]);
    assert!(judged.check_effects(0, 1).is_ok() && judged.check_effects(0, 0).is_ok());
    assert!(
        judged.check_effects(2, 2).is_err(),
        "a second effect after the retry"
    );
    let diverged = vec![vec![Answer::Indeterminate], vec![ok("t1")], vec![ok("t2")]];
    assert!(judge(&h, &diverged, &opts).is_err());
}

#[test]
fn an_in_progress_answer_with_nothing_in_flight_is_a_violation() {
    let h = History {
        steps: vec![Step::One(one(0, 0, 0))],
    };
    let v = judge(&h, &[vec![Answer::InProgress]], &Options::default()).expect_err("alone");
    assert!(v.message.contains("in progress"), "{v}");
}

#[test]
fn a_replays_answer_is_compared_minus_the_ignored_pointers() {
    let h = History {
        steps: vec![Step::One(one(0, 0, 0)), Step::One(one(0, 0, 0))],
    };
    let answer = |status: &str, at: u32| Answer::Success {
        id: "t1".into(),
        body: Some(json!({"id": "t1", "status": status, "meta": {"at": at}})),
    };
    let opts = |ignore: &[&str]| Options {
        same_answer: true,
        ignore: ignore.iter().map(|p| p.to_string()).collect(),
        names: None,
    };
    let answers = vec![vec![answer("new", 1)], vec![answer("open", 2)]];
    let v = judge(&h, &answers, &opts(&["/meta/at"])).expect_err("status differs");
    assert!(
        v.message.contains("differs from the first at /status"),
        "{v}"
    );
    assert!(!v.message.contains("/meta/at"), "{v}");
    let answers = vec![vec![answer("new", 1)], vec![answer("new", 2)]];
    assert!(judge(&h, &answers, &opts(&["/meta/at"])).is_ok());
    assert!(
        judge(&h, &answers, &opts(&[])).is_err(),
        "an unignored timestamp differs"
    );
}

#[test]
fn a_check_without_count_queries_says_effects_were_not_counted() {
    let mut coverage = super::run::Coverage {
        settles: 4,
        settle_ms: 1000,
        ..Default::default()
    };
    let lines = coverage.lines().join("\n");
    assert!(lines.contains("effects not counted"), "{lines}");
    assert!(!lines.contains("recounted"), "{lines}");
    coverage.count_queries = 1;
    let lines = coverage.lines().join("\n");
    assert!(
        lines.contains("effects recounted 4 time(s) after a settle time of 1000 ms"),
        "{lines}"
    );
}
