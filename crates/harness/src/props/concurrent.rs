//! Concurrent histories: generated batches of create requests run by 2-8 threads, each on its
//! own connection, started together in a generated order. The result must be linearizable
//! against the [`ticketflow_core::model`] rules: some sequential order that respects each thread's own
//! order explains every outcome (kinds and ticket ids) and the final rows (receipts, tickets,
//! `ticket.created` events). A failing batch is shrunk by proptest and its observed history
//! printed.

use std::collections::{BTreeMap, HashSet};
use std::sync::Barrier;

use proptest::prelude::*;
use uuid::Uuid;

use super::{
    case_prefix, request_pool, CheckFailure, Implementation, Sessions, SuiteBackend, SuiteConfig,
    SuiteResult,
};
use crate::scratch::ScratchDb;
use ticketflow_core::domain::OutcomeKind;
use ticketflow_core::fingerprint::Fingerprint;

/// Cases when `PROPTEST_CASES` is not set.
pub const DEFAULT_CASES: u32 = 24;
const TENANTS: [&str; 2] = ["A", "B"];
const KEYS: [&str; 2] = ["key-1", "key-2"];
/// Requests used: the first few of the pool, so collisions of key and body are frequent.
const REQUESTS: usize = 3;

/// One request of a thread: tenant, key and request-pool indices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Req {
    /// Tenant index.
    pub tenant: usize,
    /// Key index.
    pub key: usize,
    /// Request-pool index.
    pub request: usize,
}

/// A generated batch: each thread's requests, and the order threads are spawned in.
#[derive(Debug, Clone)]
pub(crate) struct Batch {
    /// Requests per thread, run in order.
    pub threads: Vec<Vec<Req>>,
    /// Spawn order (a permutation of thread indices).
    pub start_order: Vec<usize>,
}

fn batch() -> impl Strategy<Value = Batch> {
    let req =
        (0..TENANTS.len(), 0..KEYS.len(), 0..REQUESTS).prop_map(|(tenant, key, request)| Req {
            tenant,
            key,
            request,
        });
    proptest::collection::vec(proptest::collection::vec(req, 1..=3), 2..=8).prop_flat_map(
        |threads| {
            let n = threads.len();
            (
                Just(threads),
                Just((0..n).collect::<Vec<_>>()).prop_shuffle(),
            )
                .prop_map(|(threads, start_order)| Batch {
                    threads,
                    start_order,
                })
        },
    )
}

/// What one request observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Outcome kind and ticket id (none for a conflict).
    Outcome(OutcomeKind, Option<Uuid>),
    /// The implementation returned an error.
    Error(String),
}

/// Runs the suite. PENDING when the backend cannot be set up.
pub fn run(
    backend: &SuiteBackend,
    implementation: Implementation,
    config: &SuiteConfig,
) -> SuiteResult {
    let db = match backend.suite_db("concurrent", implementation, config) {
        Ok(db) => db,
        Err(pending) => return *pending,
    };
    let sessions = Sessions::on(&db);
    let mut runner = config.runner();
    let result = runner.run(
        &batch(),
        config.fused(|b: Batch| {
            check_batch(&db, &sessions, implementation, &b)
                .map_err(|e| TestCaseError::fail(e.to_string()))
        }),
    );
    SuiteResult::from_run(
        "concurrent",
        Some(backend.backend()),
        implementation,
        config,
        result,
    )
}

/// Long because it runs the batch's threads in one `thread::scope` and then checks what they
/// saw against the rows dumped afterwards, which need the threads' records.
fn check_batch(
    db: &ScratchDb,
    sessions: &Sessions<'_>,
    implementation: Implementation,
    batch: &Batch,
) -> Result<(), CheckFailure> {
    let prefix = case_prefix();
    let pool = request_pool();
    let tenant = |i: usize| format!("{prefix}{}", TENANTS[i]);
    let mut stores = sessions.take_n(batch.threads.len())?;
    let barrier = Barrier::new(batch.threads.len());
    let mut seen: Vec<Vec<Seen>> = vec![Vec::new(); batch.threads.len()];
    std::thread::scope(|s| {
        let mut slots: Vec<Option<_>> = stores.iter_mut().map(Some).collect();
        let mut handles = Vec::new();
        for &i in &batch.start_order {
            let store = slots[i].take().expect("each thread once");
            let reqs = &batch.threads[i];
            let (barrier, pool, tenant) = (&barrier, &pool, &tenant);
            handles.push((
                i,
                s.spawn(move || {
                    barrier.wait();
                    reqs.iter()
                        .map(|r| {
                            match implementation.create(
                                store.as_mut(),
                                &tenant(r.tenant),
                                KEYS[r.key],
                                &pool[r.request],
                                &ticketflow_core::RetryPolicy::default(),
                            ) {
                                Ok(rep) => Seen::Outcome(
                                    rep.outcome.kind(),
                                    rep.outcome.ticket().map(|t| t.id),
                                ),
                                Err(e) => Seen::Error(e.to_string()),
                            }
                        })
                        .collect::<Vec<_>>()
                }),
            ));
        }
        for (i, h) in handles {
            seen[i] = h.join().expect("racer thread panicked");
        }
    });
    if seen
        .iter()
        .flatten()
        .all(|s| matches!(s, Seen::Outcome(..)))
    {
        sessions.give_back(stores);
    }
    let dump = db.dump(&prefix)?;
    let history = History {
        requests: batch
            .threads
            .iter()
            .map(|reqs| {
                reqs.iter()
                    .map(|r| {
                        (
                            tenant(r.tenant),
                            KEYS[r.key].to_string(),
                            Fingerprint::of(&pool[r.request]).hash,
                        )
                    })
                    .collect()
            })
            .collect(),
        seen,
    };
    let final_receipts: BTreeMap<(String, String), (String, Uuid)> = dump
        .receipts
        .iter()
        .map(|r| {
            (
                (r.tenant_id.clone(), r.idempotency_key.clone()),
                (r.payload_hash.clone(), r.ticket_id),
            )
        })
        .collect();
    let mut counts: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for (_, t, _, _) in &dump.tickets {
        counts.entry(t.clone()).or_default().0 += 1;
    }
    for (_, t, ty, _) in &dump.events {
        if ty == "ticket.created" {
            counts.entry(t.clone()).or_default().1 += 1;
        }
    }
    let rows = FinalRows {
        receipts: final_receipts,
        receipt_rows: dump.receipts.len(),
        tickets_and_events: counts,
    };
    if linearizable(&history, &rows) {
        Ok(())
    } else {
        Err(CheckFailure::NotLinearizable {
            history: history.describe(),
            rows: format!("{rows:#?}"),
        })
    }
}

/// The requests and what each observed, per thread.
#[derive(Debug, Clone)]
pub(crate) struct History {
    /// Per thread: (tenant, key, fingerprint hash) of each request.
    pub requests: Vec<Vec<(String, String, String)>>,
    /// Per thread: what each request observed.
    pub seen: Vec<Vec<Seen>>,
}

impl History {
    /// One line per request: `thread 0 #1 A/key-1 body 3f2a… -> replayed 9c1e…`.
    pub(crate) fn describe(&self) -> String {
        let mut out = String::new();
        for (i, (reqs, seen)) in self.requests.iter().zip(&self.seen).enumerate() {
            for (j, ((t, k, h), s)) in reqs.iter().zip(seen).enumerate() {
                let what = match s {
                    Seen::Outcome(kind, id) => format!(
                        "{kind} {}",
                        id.map(|u| u.simple().to_string()[..8].to_string())
                            .unwrap_or_default()
                    ),
                    Seen::Error(e) => format!("error: {e}"),
                };
                out.push_str(&format!(
                    "thread {i} #{j} {t}/{k} body {} -> {what}\n",
                    &h[..8]
                ));
            }
        }
        out
    }
}

/// Rows after the batch.
#[derive(Debug, Clone)]
pub(crate) struct FinalRows {
    /// (tenant, key) → (hash, ticket id).
    pub receipts: BTreeMap<(String, String), (String, Uuid)>,
    /// Receipt rows counted (a map above would hide duplicates).
    pub receipt_rows: usize,
    /// tenant → (tickets, ticket.created events).
    pub tickets_and_events: BTreeMap<String, (usize, usize)>,
}

/// Whether some interleaving of the threads, each in its own order, explains every observed
/// outcome under the model's rules and ends in exactly `rows`. Depth-first search with
/// memoization of states already known to fail (positions plus receipts so far).
pub(crate) fn linearizable(history: &History, rows: &FinalRows) -> bool {
    type Receipts = BTreeMap<(String, String), (String, Uuid)>;
    /// A search state: each thread's position and the receipts so far.
    type State = (Vec<usize>, Vec<((String, String), (String, Uuid))>);
    struct Search<'a> {
        h: &'a History,
        rows: &'a FinalRows,
        dead: HashSet<State>,
    }
    impl Search<'_> {
        fn go(&mut self, pos: &mut Vec<usize>, receipts: &mut Receipts) -> bool {
            if pos.iter().zip(&self.h.requests).all(|(p, r)| *p == r.len()) {
                return self.finished(receipts);
            }
            let key = (
                pos.clone(),
                receipts
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            );
            if self.dead.contains(&key) {
                return false;
            }
            for i in 0..pos.len() {
                let Some((t, k, h)) = self.h.requests[i].get(pos[i]) else {
                    continue;
                };
                let Seen::Outcome(kind, id) = &self.h.seen[i][pos[i]] else {
                    return false;
                };
                let tk = (t.clone(), k.clone());
                let inserted = match receipts.get(&tk) {
                    None => match (kind, id) {
                        (OutcomeKind::Created, Some(id))
                            if !receipts.values().any(|(_, x)| x == id) =>
                        {
                            receipts.insert(tk.clone(), (h.clone(), *id));
                            true
                        }
                        _ => continue,
                    },
                    Some((stored, sid)) => {
                        let ok = if stored == h {
                            *kind == OutcomeKind::Replayed && id.as_ref() == Some(sid)
                        } else {
                            *kind == OutcomeKind::Conflict
                        };
                        if !ok {
                            continue;
                        }
                        false
                    }
                };
                pos[i] += 1;
                let found = self.go(pos, receipts);
                pos[i] -= 1;
                if inserted {
                    receipts.remove(&tk);
                }
                if found {
                    return true;
                }
            }
            self.dead.insert(key);
            false
        }

        fn finished(&self, receipts: &Receipts) -> bool {
            if *receipts != self.rows.receipts || self.rows.receipt_rows != receipts.len() {
                return false;
            }
            let mut want: BTreeMap<String, (usize, usize)> = BTreeMap::new();
            for (t, _) in receipts.keys() {
                let e = want.entry(t.clone()).or_default();
                e.0 += 1;
                e.1 += 1;
            }
            want == self.rows.tickets_and_events
        }
    }
    let mut search = Search {
        h: history,
        rows,
        dead: HashSet::new(),
    };
    search.go(&mut vec![0; history.requests.len()], &mut BTreeMap::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    fn one_key_history(seen: Vec<Vec<Seen>>, hashes: Vec<Vec<&str>>) -> History {
        History {
            requests: hashes
                .into_iter()
                .map(|hs| {
                    hs.into_iter()
                        .map(|h| ("A".into(), "k".into(), h.into()))
                        .collect()
                })
                .collect(),
            seen,
        }
    }

    fn rows(receipts: &[(&str, Uuid)], tickets: usize) -> FinalRows {
        FinalRows {
            receipts: receipts
                .iter()
                .map(|(h, u)| (("A".to_string(), "k".to_string()), (h.to_string(), *u)))
                .collect(),
            receipt_rows: receipts.len(),
            tickets_and_events: if tickets == 0 {
                BTreeMap::new()
            } else {
                [("A".to_string(), (tickets, tickets))].into()
            },
        }
    }

    #[test]
    fn a_replay_before_any_create_is_explained_by_reordering() {
        let h = one_key_history(
            vec![
                vec![Seen::Outcome(OutcomeKind::Replayed, Some(id(1)))],
                vec![Seen::Outcome(OutcomeKind::Created, Some(id(1)))],
            ],
            vec![vec!["x"], vec!["x"]],
        );
        assert!(linearizable(&h, &rows(&[("x", id(1))], 1)));
    }

    #[test]
    fn two_creates_for_one_key_are_not_linearizable() {
        let h = one_key_history(
            vec![
                vec![Seen::Outcome(OutcomeKind::Created, Some(id(1)))],
                vec![Seen::Outcome(OutcomeKind::Created, Some(id(2)))],
            ],
            vec![vec!["x"], vec!["x"]],
        );
        assert!(!linearizable(&h, &rows(&[("x", id(1))], 2)));
    }

    #[test]
    fn a_replayed_other_body_or_orphan_rows_are_not_linearizable() {
        let replayed_other_body = one_key_history(
            vec![
                vec![Seen::Outcome(OutcomeKind::Created, Some(id(1)))],
                vec![Seen::Outcome(OutcomeKind::Replayed, Some(id(1)))],
            ],
            vec![vec!["x"], vec!["y"]],
        );
        assert!(!linearizable(
            &replayed_other_body,
            &rows(&[("x", id(1))], 1)
        ));
        let honest = one_key_history(
            vec![
                vec![Seen::Outcome(OutcomeKind::Created, Some(id(1)))],
                vec![Seen::Outcome(OutcomeKind::Replayed, Some(id(1)))],
            ],
            vec![vec!["x"], vec!["x"]],
        );
        assert!(linearizable(&honest, &rows(&[("x", id(1))], 1)));
        // The same outcomes with an orphan ticket and event left behind.
        assert!(!linearizable(&honest, &rows(&[("x", id(1))], 2)));
    }

    #[test]
    fn program_order_within_a_thread_is_respected() {
        // Thread 0 conflicted first and created later: impossible for one key in that order.
        let h = one_key_history(
            vec![vec![
                Seen::Outcome(OutcomeKind::Conflict, None),
                Seen::Outcome(OutcomeKind::Created, Some(id(1))),
            ]],
            vec![vec!["y", "x"]],
        );
        assert!(!linearizable(&h, &rows(&[("x", id(1))], 1)));
    }
}
