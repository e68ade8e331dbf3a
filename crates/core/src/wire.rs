//! The HTTP wire contract of `ticketflow serve`, shared by the server (`ticketflow-serve`)
//! and the harness's black-box client (`blackbox`), so neither imports the other.

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
/// Diagnostic header of `serve --lease`: what the lease did for this create (`held`,
/// `waited`, `no-lease`); checks never rely on it.
pub const LEASE_HEADER: &str = "ticketflow-lease";
/// Media type of error bodies (RFC 9457).
pub const PROBLEM_JSON: &str = "application/problem+json";

/// Problem types (the RFC 9457 `type` member) of `ticketflow serve`: stable tag URIs
/// (RFC 4151) a client may branch on; the `title` and `detail` texts may change.
pub mod problem {
    /// 400: the request cannot be read (headers, JSON shape, duplicate members, ticket id).
    pub const UNREADABLE_REQUEST: &str = "tag:ticketflow,2026:problem:unreadable-request";
    /// 401: authentication is on and no valid bearer token was sent.
    pub const UNAUTHENTICATED: &str = "tag:ticketflow,2026:problem:unauthenticated";
    /// 415: a POST or PATCH body not declared as JSON.
    pub const UNSUPPORTED_MEDIA_TYPE: &str = "tag:ticketflow,2026:problem:unsupported-media-type";
    /// 422: read, but breaks a domain rule.
    pub const INVALID_REQUEST: &str = "tag:ticketflow,2026:problem:invalid-request";
    /// 409: the idempotency key was used before with a different request.
    pub const KEY_CONFLICT: &str = "tag:ticketflow,2026:problem:idempotency-key-conflict";
    /// 503 with `Retry-After`: the request could not be completed now; retry it (a create
    /// with the same Idempotency-Key). The `written` member says `nothing` or `unknown`.
    pub const TEMPORARILY_UNAVAILABLE: &str = "tag:ticketflow,2026:problem:temporarily-unavailable";
    /// 500: a bug or a broken invariant; the `error_id` member names the service's log line.
    pub const INTERNAL_ERROR: &str = "tag:ticketflow,2026:problem:internal-error";
}

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
