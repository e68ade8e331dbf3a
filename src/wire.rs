//! The HTTP wire contract of `ticketflow serve`, shared by the server ([`crate::serve`]) and
//! the black-box client ([`crate::target`]), so neither imports the other.

use crate::domain::DecisionPath;

/// The header that carries the tenant id.
pub const TENANT_HEADER: &str = "x-tenant-id";
/// The header that carries the idempotency key (IETF draft-ietf-httpapi-idempotency-key-header).
pub const KEY_HEADER: &str = "idempotency-key";
/// The header set to `true` on a replay (the name Stripe and the IETF draft's examples use).
pub const REPLAYED_HEADER: &str = "idempotent-replayed";
/// Diagnostic header with the protocol's decision path (`created`, `from-lookup`,
/// `after-unique-violation`, `after-insert-conflict`); only our service sends it, black-box
/// checks never need it.
pub const PATH_HEADER: &str = "ticketflow-decision-path";
/// Media type of error bodies (RFC 9457).
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The [`PATH_HEADER`] value of a decision path (its `Display` name).
pub fn path_value(path: DecisionPath) -> String {
    path.to_string()
}

/// Reads a [`PATH_HEADER`] value; `None` for anything else.
pub fn parse_path(value: &str) -> Option<DecisionPath> {
    [
        DecisionPath::Created,
        DecisionPath::FromLookup,
        DecisionPath::AfterUniqueViolation,
        DecisionPath::AfterInsertConflict,
    ]
    .into_iter()
    .find(|p| p.to_string() == value.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_round_trips_through_the_header_value() {
        for p in [
            DecisionPath::Created,
            DecisionPath::FromLookup,
            DecisionPath::AfterUniqueViolation,
            DecisionPath::AfterInsertConflict,
        ] {
            assert_eq!(parse_path(&path_value(p)), Some(p));
        }
        assert_eq!(parse_path("bogus"), None);
    }
}
