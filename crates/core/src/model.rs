//! The reference model: a pure, sequential description of what the ticket service must do,
//! against which property suites compare the real implementation (docs/PROTOCOL.md §4–§6).
//!
//! Written independently of [`crate::protocol`]: receipts are a map, tickets a vector, and
//! ticket identity is the position of the ticket in that vector ([`TicketRef`]).

use std::collections::BTreeMap;

use crate::domain::{TicketPatch, TicketRequest};
use crate::fingerprint::Fingerprint;

/// A ticket of the model, by creation order.
pub type TicketRef = usize;

/// What the model says a create must return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expected {
    /// A new ticket.
    Created(TicketRef),
    /// An existing ticket, replayed.
    Replayed(TicketRef),
    /// HTTP 409.
    Conflict,
}

/// The reference decider (the rule of docs/PROTOCOL.md §4.1): from the receipts committed so far,
/// keyed by (tenant, key) with their fingerprint hash, decide what a request does.
/// Returns `None` for "create", `Some(Ok(t))` for "replay ticket t", `Some(Err(()))` for
/// "conflict".
pub fn reference_decide(
    receipts: &BTreeMap<(String, String), (String, TicketRef)>,
    tenant: &str,
    key: &str,
    request_hash: &str,
) -> Option<Result<TicketRef, ()>> {
    receipts
        .get(&(tenant.to_string(), key.to_string()))
        .map(|(hash, ticket)| {
            if hash == request_hash {
                Ok(*ticket)
            } else {
                Err(())
            }
        })
}

/// A ticket as the model keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelTicket {
    /// Owning tenant.
    pub tenant: String,
    /// Current title, body, priority and creator.
    pub request: TicketRequest,
    /// 1 on create, +1 per update.
    pub version: i64,
}

/// The whole service as a value.
#[derive(Debug, Clone, Default)]
pub struct Model {
    /// (tenant, key) → (fingerprint hash, ticket).
    pub receipts: BTreeMap<(String, String), (String, TicketRef)>,
    /// Tickets in creation order.
    pub tickets: Vec<ModelTicket>,
}

impl Model {
    /// An empty service.
    pub fn new() -> Self {
        Model::default()
    }

    /// Applies a create and returns what it must answer.
    pub fn create(&mut self, tenant: &str, key: &str, request: &TicketRequest) -> Expected {
        let hash = Fingerprint::of(request).hash;
        match reference_decide(&self.receipts, tenant, key, &hash) {
            Some(Ok(t)) => Expected::Replayed(t),
            Some(Err(())) => Expected::Conflict,
            None => {
                let t = self.tickets.len();
                self.tickets.push(ModelTicket {
                    tenant: tenant.to_string(),
                    request: request.clone(),
                    version: 1,
                });
                self.receipts
                    .insert((tenant.to_string(), key.to_string()), (hash, t));
                Expected::Created(t)
            }
        }
    }

    /// The ticket `t` as `tenant` may see it: `None` for another tenant's ticket.
    pub fn get(&self, tenant: &str, t: TicketRef) -> Option<&ModelTicket> {
        self.tickets.get(t).filter(|x| x.tenant == tenant)
    }

    /// Applies an update by `tenant`; `None` (not found) for another tenant's ticket.
    pub fn update(&mut self, tenant: &str, t: TicketRef, patch: &TicketPatch) -> Option<i64> {
        let ticket = self.tickets.get_mut(t).filter(|x| x.tenant == tenant)?;
        if let Some(title) = &patch.title {
            ticket.request.title = title.clone();
        }
        if let Some(body) = &patch.body {
            ticket.request.body = body.clone();
        }
        if let Some(priority) = &patch.priority {
            ticket.request.priority = priority.clone();
        }
        ticket.version += 1;
        Some(ticket.version)
    }

    /// (tickets, receipts, ticket.created events) of a tenant.
    pub fn counts(&self, tenant: &str) -> (i64, i64, i64) {
        let tickets = self.tickets.iter().filter(|t| t.tenant == tenant).count() as i64;
        let receipts = self.receipts.keys().filter(|(t, _)| t == tenant).count() as i64;
        (tickets, receipts, tickets)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(body: &str) -> TicketRequest {
        TicketRequest {
            actor_id: "u1".into(),
            title: "x".into(),
            body: body.into(),
            priority: "high".into(),
        }
    }

    #[test]
    fn reference_decider_covers_the_three_canonical_cases() {
        // With A/key-1/X committed: A/key-1/X replays, A/key-1/Y conflicts, B/key-1/X creates.
        let mut m = Model::new();
        assert_eq!(m.create("A", "key-1", &req("X")), Expected::Created(0));
        let x = Fingerprint::of(&req("X")).hash;
        let y = Fingerprint::of(&req("Y")).hash;
        assert_eq!(reference_decide(&m.receipts, "A", "key-1", &x), Some(Ok(0)));
        assert_eq!(
            reference_decide(&m.receipts, "A", "key-1", &y),
            Some(Err(()))
        );
        assert_eq!(reference_decide(&m.receipts, "B", "key-1", &x), None);
        assert_eq!(m.create("B", "key-1", &req("X")), Expected::Created(1));
        assert_eq!(m.counts("A"), (1, 1, 1));
    }

    #[test]
    fn update_is_tenant_scoped_and_bumps_version() {
        let mut m = Model::new();
        m.create("A", "k", &req("X"));
        let patch = TicketPatch {
            title: Some("t".into()),
            ..Default::default()
        };
        assert_eq!(m.update("B", 0, &patch), None);
        assert_eq!(m.update("A", 0, &patch), Some(2));
        assert!(m.get("B", 0).is_none());
    }
}
