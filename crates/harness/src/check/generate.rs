//! Histories generated from a seed over a pool of scopes × keys × bodies.

use rand::rngs::StdRng;
use rand::Rng;

use crate::oracle::history::{Body, Form, History, Request, Step};

/// The operations a history is made of (PROTOCOL §11's list), for coverage counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpKind {
    /// The first request of a new intent.
    First,
    /// A retry of a used intent (same or another instance).
    Retry,
    /// A used intent with its members reordered or re-spaced.
    Reshaped,
    /// Another body under a used key.
    OtherBody,
    /// A used key from another scope.
    OtherScope,
    /// Another key in a used scope.
    OtherKey,
    /// An invalid body, then a valid request under the same key.
    InvalidThenValid,
    /// Another body under a used key, then the original again.
    RefusedThenOriginal,
    /// Requests released together.
    Group,
    /// A wait, then a recount.
    Settle,
}

/// The pools a history draws from, and its length.
#[derive(Debug, Clone, Copy)]
pub struct Pools {
    /// Scopes (at least 1).
    pub scopes: usize,
    /// Keys per scope (at least 1).
    pub keys: usize,
    /// Body variants (at least 2, so another body exists).
    pub bodies: usize,
    /// Service instances (at least 1).
    pub instances: usize,
    /// Operations per history (at least 1).
    pub operations: usize,
    /// Whether an invalid body exists (else no invalid-then-valid operation is generated).
    pub invalid: bool,
}

impl Default for Pools {
    /// 2 scopes × 3 keys × 3 bodies, one instance, 8 operations.
    fn default() -> Self {
        Pools {
            scopes: 2,
            keys: 3,
            bodies: 3,
            instances: 1,
            operations: 8,
            invalid: true,
        }
    }
}

/// A history and the operations it was generated from.
#[derive(Debug, Clone)]
pub struct Generated {
    /// The history.
    pub history: History,
    /// The operation behind each group of steps, in order.
    pub operations: Vec<OpKind>,
}

/// Generates a history of `pools.operations` operations. Operations that need a used intent
/// fall back to [`OpKind::First`] until one exists.
pub fn generate(pools: &Pools, rng: &mut StdRng) -> Generated {
    let scopes = pools.scopes.max(1);
    let keys = pools.keys.max(1);
    let bodies = pools.bodies.max(2);
    let instances = pools.instances.max(1);
    let mut steps = Vec::new();
    let mut operations = Vec::new();
    // The (scope, key, variant) of every valid request sent so far.
    let mut used: Vec<(usize, usize, usize)> = Vec::new();
    let valid = |variant: usize| Body::Valid {
        variant,
        form: Form::Plain,
    };
    let req = |scope, key, body, rng: &mut StdRng| Request {
        scope,
        key,
        body,
        instance: rng.gen_range(0..instances),
    };
    for _ in 0..pools.operations.max(1) {
        let mut kind = match rng.gen_range(0..100) {
            0..=14 => OpKind::First,
            15..=29 => OpKind::Retry,
            30..=37 => OpKind::Reshaped,
            38..=47 => OpKind::OtherBody,
            48..=55 => OpKind::OtherScope,
            56..=65 => OpKind::OtherKey,
            66..=71 => OpKind::InvalidThenValid,
            72..=79 => OpKind::RefusedThenOriginal,
            80..=95 => OpKind::Group,
            _ => OpKind::Settle,
        };
        if used.is_empty() && !matches!(kind, OpKind::Group | OpKind::InvalidThenValid) {
            kind = OpKind::First;
        }
        if kind == OpKind::InvalidThenValid && !pools.invalid {
            kind = OpKind::First;
        }
        let pick =
            |rng: &mut StdRng, used: &[(usize, usize, usize)]| used[rng.gen_range(0..used.len())];
        match kind {
            OpKind::First => {
                let (s, k, b) = (
                    rng.gen_range(0..scopes),
                    rng.gen_range(0..keys),
                    rng.gen_range(0..bodies),
                );
                steps.push(Step::One(req(s, k, valid(b), rng)));
                used.push((s, k, b));
            }
            OpKind::Retry => {
                let (s, k, b) = pick(rng, &used);
                steps.push(Step::One(req(s, k, valid(b), rng)));
            }
            OpKind::Reshaped => {
                let (s, k, b) = pick(rng, &used);
                let form = if rng.gen_bool(0.5) {
                    Form::Reordered
                } else {
                    Form::Respaced
                };
                steps.push(Step::One(req(s, k, Body::Valid { variant: b, form }, rng)));
            }
            OpKind::OtherBody => {
                let (s, k, b) = pick(rng, &used);
                let other = (b + rng.gen_range(1..bodies)) % bodies;
                steps.push(Step::One(req(s, k, valid(other), rng)));
                used.push((s, k, other));
            }
            OpKind::OtherScope => {
                let (s, k, b) = pick(rng, &used);
                let other = if scopes > 1 {
                    (s + rng.gen_range(1..scopes)) % scopes
                } else {
                    s
                };
                steps.push(Step::One(req(other, k, valid(b), rng)));
                used.push((other, k, b));
            }
            OpKind::OtherKey => {
                let (s, k, b) = pick(rng, &used);
                let other = if keys > 1 {
                    (k + rng.gen_range(1..keys)) % keys
                } else {
                    k
                };
                steps.push(Step::One(req(s, other, valid(b), rng)));
                used.push((s, other, b));
            }
            OpKind::InvalidThenValid => {
                let (s, k) = (rng.gen_range(0..scopes), rng.gen_range(0..keys));
                let b = rng.gen_range(0..bodies);
                steps.push(Step::One(req(s, k, Body::Invalid, rng)));
                steps.push(Step::One(req(s, k, valid(b), rng)));
                used.push((s, k, b));
            }
            OpKind::RefusedThenOriginal => {
                let (s, k, b) = pick(rng, &used);
                let other = (b + rng.gen_range(1..bodies)) % bodies;
                steps.push(Step::One(req(s, k, valid(other), rng)));
                steps.push(Step::One(req(s, k, valid(b), rng)));
                used.push((s, k, other));
            }
            OpKind::Group => {
                // Mostly one key raced by the same or another body; sometimes two keys.
                let n = rng.gen_range(2..=4);
                let (s, k) = match used.is_empty() || rng.gen_bool(0.5) {
                    true => (rng.gen_range(0..scopes), rng.gen_range(0..keys)),
                    false => {
                        let (s, k, _) = pick(rng, &used);
                        (s, k)
                    }
                };
                let b = rng.gen_range(0..bodies);
                let group: Vec<Request> = (0..n)
                    .map(|_| {
                        let body = if rng.gen_bool(0.75) {
                            b
                        } else {
                            rng.gen_range(0..bodies)
                        };
                        let key = if rng.gen_bool(0.85) {
                            k
                        } else {
                            rng.gen_range(0..keys)
                        };
                        used.push((s, key, body));
                        req(s, key, valid(body), rng)
                    })
                    .collect();
                steps.push(Step::Group(group));
            }
            OpKind::Settle => steps.push(Step::Settle),
        }
        operations.push(kind);
    }
    Generated {
        history: History { steps },
        operations,
    }
}
