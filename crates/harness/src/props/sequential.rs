//! Sequential model-based suite: generated sequences of create (fresh, exact retry of an
//! earlier request, same key with another body, another tenant), get and update over
//! 3 tenants x 4 keys and the [`super::request_pool`], each outcome compared with the
//! [`Model`]; after each sequence, invariants read back by SQL:
//!
//! - one receipt per (tenant, key);
//! - every receipt's ticket exists and belongs to the same tenant (SQL join);
//! - every ticket has exactly one `ticket.created` event and `version - 1` `ticket.updated`
//!   events whose payload versions are 2..=version;
//! - no event payload contains the ticket's body;
//! - rows equal the model's, tenant by tenant;
//! - a get across tenants returns not found.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use uuid::Uuid;

use super::{
    case_prefix, request_pool, CheckFailure, Implementation, Sessions, SuiteBackend, SuiteConfig,
    SuiteResult,
};
use crate::scratch::ScratchDb;
use ticketflow_core::domain::{OutcomeKind, Ticket, TicketPatch};
use ticketflow_core::error::Error;
use ticketflow_core::model::{Expected, Model, TicketRef};
use ticketflow_core::store::Dump;

/// Cases when `PROPTEST_CASES` is not set.
pub const DEFAULT_CASES: u32 = 40;
const TENANTS: [&str; 3] = ["A", "B", "C"];
const KEYS: [&str; 4] = ["key-1", "key-2", "key-3", "key-4"];

/// One step of a generated sequence. Indices are taken modulo what exists at that point.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    /// A create with tenant, key and request chosen from the pools.
    Create {
        /// Tenant index.
        tenant: usize,
        /// Key index.
        key: usize,
        /// Request-pool index.
        request: usize,
    },
    /// An exact retry of the n-th earlier create.
    Retry {
        /// Which earlier create.
        nth: usize,
    },
    /// A get of the n-th ticket so far, as a tenant (often not its owner).
    Get {
        /// Tenant index.
        tenant: usize,
        /// Which ticket.
        ticket: usize,
    },
    /// An update of the n-th ticket so far, as a tenant.
    Update {
        /// Tenant index.
        tenant: usize,
        /// Which ticket.
        ticket: usize,
        /// Which patch.
        patch: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..TENANTS.len(), 0..KEYS.len(), 0..request_pool().len())
            .prop_map(|(tenant, key, request)| Op::Create { tenant, key, request }),
        3 => (0..16usize).prop_map(|nth| Op::Retry { nth }),
        1 => (0..TENANTS.len(), 0..16usize).prop_map(|(tenant, ticket)| Op::Get { tenant, ticket }),
        1 => (0..TENANTS.len(), 0..16usize, 0..4usize)
            .prop_map(|(tenant, ticket, patch)| Op::Update { tenant, ticket, patch }),
    ]
}

fn patch(i: usize) -> TicketPatch {
    match i % 4 {
        0 => TicketPatch {
            title: Some("edited title".into()),
            ..Default::default()
        },
        1 => TicketPatch {
            body: Some("edited body \u{1f600}".into()),
            ..Default::default()
        },
        2 => TicketPatch {
            priority: Some("urgent".into()),
            ..Default::default()
        },
        _ => TicketPatch {
            title: Some("t2".into()),
            body: Some("b2".into()),
            priority: Some("low".into()),
        },
    }
}

/// Runs the suite. PENDING when the backend cannot be set up.
pub fn run(
    backend: &SuiteBackend,
    implementation: Implementation,
    config: &SuiteConfig,
) -> SuiteResult {
    let db = match backend.suite_db("sequential", implementation, config) {
        Ok(db) => db,
        Err(pending) => return *pending,
    };
    let sessions = Sessions::on(&db);
    let mut runner = config.runner();
    let result = runner.run(
        &proptest::collection::vec(op(), 1..24),
        config.fused(|ops: Vec<_>| {
            check_sequence(&db, &sessions, implementation, &ops)
                .map_err(|e| TestCaseError::fail(e.to_string()))
        }),
    );
    SuiteResult::from_run(
        "sequential",
        Some(backend.backend()),
        implementation,
        config,
        result,
    )
}

fn same_fields(t: &Ticket, m: &ticketflow_core::model::ModelTicket) -> bool {
    t.tenant_id == m.tenant
        && t.actor_id == m.request.actor_id
        && t.title == m.request.title
        && t.body == m.request.body
        && t.priority == m.request.priority
        && t.version == m.version
}

/// Runs one sequence on fresh tenants and compares every step with the model.
// Long on purpose: one loop over the operations, each arm running one operation on the store
// and on the model side by side and comparing them at once; the arms share the tenants, the
// ids seen so far and the model, which a split would have to pass to every part.
fn check_sequence(
    db: &ScratchDb,
    sessions: &Sessions<'_>,
    implementation: Implementation,
    ops: &[Op],
) -> Result<(), CheckFailure> {
    let prefix = case_prefix();
    let tenant = |i: usize| format!("{prefix}{}", TENANTS[i % TENANTS.len()]);
    let pool = request_pool();
    let mut store = sessions.take()?;
    let mut model = Model::new();
    let mut ids: Vec<Uuid> = Vec::new(); // model TicketRef -> real id
    let mut creates: Vec<(usize, usize, usize)> = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        let here = |what: String| CheckFailure::Step {
            step,
            op: format!("{op:?}"),
            what,
        };
        let create = match op {
            Op::Create {
                tenant,
                key,
                request,
            } => Some((*tenant, *key, *request)),
            Op::Retry { nth } if !creates.is_empty() => Some(creates[nth % creates.len()]),
            _ => None,
        };
        if let Some((t, k, r)) = create {
            creates.push((t, k, r));
            let (tn, key, req) = (tenant(t), KEYS[k], &pool[r]);
            let expected = model.create(&tn, key, req);
            let got = implementation
                .create(
                    store.as_mut(),
                    &tn,
                    key,
                    req,
                    &ticketflow_core::RetryPolicy::default(),
                )
                .map_err(|e| here(format!("error {e}")))?;
            match (expected, got.outcome.kind(), got.outcome.ticket()) {
                (Expected::Created(m), OutcomeKind::Created, Some(ticket)) => {
                    if ids.contains(&ticket.id) || m != ids.len() {
                        return Err(here(format!("created a known id {}", ticket.id)));
                    }
                    ids.push(ticket.id);
                }
                (Expected::Replayed(m), OutcomeKind::Replayed, Some(ticket)) => {
                    if ticket.id != ids[m] || !same_fields(ticket, &model.tickets[m]) {
                        return Err(here(format!(
                            "replayed {ticket:?}, model has {:?} as {}",
                            model.tickets[m], ids[m]
                        )));
                    }
                }
                (Expected::Conflict, OutcomeKind::Conflict, None) => {}
                (expected, kind, _) => {
                    return Err(here(format!(
                        "model says {expected:?}, implementation said {kind}"
                    )))
                }
            }
            continue;
        }
        match op {
            Op::Get { tenant: t, ticket } if !ids.is_empty() => {
                let m: TicketRef = ticket % ids.len();
                let tn = tenant(*t);
                let got = ticketflow_core::protocol::get_ticket(store.as_mut(), &tn, ids[m]);
                match (model.get(&tn, m), got) {
                    (Some(mt), Ok(t)) if same_fields(&t, mt) => {}
                    (None, Err(Error::NotFound { .. })) => {}
                    (want, got) => return Err(here(format!("get: model {want:?}, got {got:?}"))),
                }
            }
            Op::Update {
                tenant: t,
                ticket,
                patch: p,
            } if !ids.is_empty() => {
                let m: TicketRef = ticket % ids.len();
                let tn = tenant(*t);
                let got = ticketflow_core::protocol::update_ticket(
                    store.as_mut(),
                    &tn,
                    ids[m],
                    &patch(*p),
                );
                match (model.update(&tn, m, &patch(*p)), got) {
                    (Some(_), Ok(t)) if same_fields(&t, &model.tickets[m]) => {}
                    (None, Err(Error::NotFound { .. })) => {}
                    (want, got) => {
                        return Err(here(format!("update: model version {want:?}, got {got:?}")))
                    }
                }
            }
            _ => {}
        }
    }
    // Every step answered as the model did, so the session is idle.
    sessions.give_back([store]);
    check_invariants(db, &prefix, &model, &ids)
}

/// The invariants of the module docs, on every row of this case's tenants: the receipts
/// ([`check_receipts`]), then each ticket with its events ([`check_tickets`]), and no event
/// without its ticket.
fn check_invariants(
    db: &ScratchDb,
    prefix: &str,
    model: &Model,
    ids: &[Uuid],
) -> Result<(), CheckFailure> {
    let dump = db.dump(prefix)?;
    check_receipts(&dump, model, ids)?;
    let mut events = events_by_ticket(&dump)?;
    check_tickets(&dump, model, ids, &mut events)?;
    if let Some(id) = events.keys().next() {
        return Err(CheckFailure::Violated(format!(
            "events for a ticket that does not exist: {id}"
        )));
    }
    Ok(())
}

/// No receipt dangles, none is there twice, and they are exactly the model's.
fn check_receipts(dump: &Dump, model: &Model, ids: &[Uuid]) -> Result<(), CheckFailure> {
    if dump.dangling_receipts != 0 {
        return Err(CheckFailure::Violated(format!(
            "{} receipts point at a missing or foreign ticket",
            dump.dangling_receipts
        )));
    }
    let mut keys = BTreeSet::new();
    for r in &dump.receipts {
        if !keys.insert((r.tenant_id.clone(), r.idempotency_key.clone())) {
            return Err(CheckFailure::Violated(format!(
                "two receipts for {}/{}",
                r.tenant_id, r.idempotency_key
            )));
        }
        let expected = model
            .receipts
            .get(&(r.tenant_id.clone(), r.idempotency_key.clone()))
            .map(|(hash, t)| (hash.clone(), ids[*t]));
        if expected != Some((r.payload_hash.clone(), r.ticket_id)) {
            return Err(CheckFailure::Violated(format!(
                "receipt {r:?} is not the model's {expected:?}"
            )));
        }
    }
    if dump.receipts.len() != model.receipts.len() {
        return Err(CheckFailure::Violated(format!(
            "{} receipts, model has {}",
            dump.receipts.len(),
            model.receipts.len()
        )));
    }
    Ok(())
}

/// Each ticket's events: `(event type, version)`.
type Events<'a> = BTreeMap<Uuid, Vec<(&'a str, i64)>>;

/// Each event's type and version by its ticket, once its payload is checked to name the row's
/// tenant and ticket.
fn events_by_ticket(dump: &Dump) -> Result<Events<'_>, CheckFailure> {
    let mut events: Events<'_> = BTreeMap::new();
    for (aggregate, tenant, event_type, payload) in &dump.events {
        let v: serde_json::Value = serde_json::from_str(payload)
            .map_err(|e| CheckFailure::Violated(format!("event payload is not JSON: {e}")))?;
        if v["tenant_id"] != tenant.as_str() || v["ticket_id"] != aggregate.to_string().as_str() {
            return Err(CheckFailure::Violated(format!(
                "event payload {payload} does not match its row"
            )));
        }
        events
            .entry(*aggregate)
            .or_default()
            .push((event_type.as_str(), v["version"].as_i64().unwrap_or(-1)));
    }
    Ok(events)
}

/// The tickets are the model's, each with one created event and an updated event per later
/// version, no payload holding its body; takes each ticket's events out of `events`.
fn check_tickets(
    dump: &Dump,
    model: &Model,
    ids: &[Uuid],
    events: &mut Events<'_>,
) -> Result<(), CheckFailure> {
    if dump.tickets.len() != model.tickets.len() {
        return Err(CheckFailure::Violated(format!(
            "{} tickets, model has {}",
            dump.tickets.len(),
            model.tickets.len()
        )));
    }
    for (id, tenant, version, body) in &dump.tickets {
        let evs = events.remove(id).unwrap_or_default();
        let created = evs.iter().filter(|(t, _)| *t == "ticket.created").count();
        let mut updated: Vec<i64> = evs
            .iter()
            .filter(|(t, _)| *t == "ticket.updated")
            .map(|(_, v)| *v)
            .collect();
        updated.sort();
        if created != 1 || updated != (2..=*version).collect::<Vec<_>>() {
            return Err(CheckFailure::Violated(format!(
                "ticket {id} (version {version}) has {created} created events and updated versions {updated:?}"
            )));
        }
        for (aggregate, _, _, payload) in &dump.events {
            if aggregate == id && payload_holds_body(payload, body) {
                return Err(CheckFailure::Violated(format!(
                    "an event payload of ticket {id} contains its body"
                )));
            }
        }
        let m = ids
            .iter()
            .position(|x| x == id)
            .ok_or(CheckFailure::Violated(format!(
                "ticket {id} unknown to the model"
            )))?;
        if model.tickets[m].tenant != *tenant || model.tickets[m].version != *version {
            return Err(CheckFailure::Violated(format!(
                "ticket {id} differs from the model's {:?}",
                model.tickets[m]
            )));
        }
    }
    Ok(())
}

/// Whether an event payload carries the body: a `body` key at any depth, or the body's text
/// itself (as canonical JSON writes it) when it is long enough to be told apart from other
/// fields.
fn payload_holds_body(payload: &str, body: &str) -> bool {
    fn has_body_key(v: &serde_json::Value) -> bool {
        match v {
            serde_json::Value::Object(m) => m.contains_key("body") || m.values().any(has_body_key),
            serde_json::Value::Array(a) => a.iter().any(has_body_key),
            _ => false,
        }
    }
    let parsed: serde_json::Value = serde_json::from_str(payload).unwrap_or_default();
    let escaped =
        ticketflow_core::fingerprint::canonical_json(&serde_json::Value::String(body.into()));
    let inner = &escaped[1..escaped.len() - 1];
    has_body_key(&parsed) || (body.chars().count() >= 8 && payload.contains(inner))
}
