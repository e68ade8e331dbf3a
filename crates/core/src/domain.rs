//! Tickets, requests, receipts, outbox events, outcomes and input validation (docs/PROTOCOL.md §3, §6).
//! No IO here.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::canonical::canonical_json;
use crate::error::ValidationError;

/// Longest idempotency key accepted, in bytes (UTF-8).
pub const MAX_KEY_BYTES: usize = 255;
/// Longest tenant id accepted, in bytes (UTF-8).
pub const MAX_TENANT_BYTES: usize = 255;
/// Longest actor id accepted, in bytes (UTF-8).
pub const MAX_ACTOR_BYTES: usize = 255;
/// Longest title accepted, in characters (Unicode scalar values).
pub const MAX_TITLE_CHARS: usize = 200;
/// Largest body accepted, in bytes (UTF-8): 64 KiB.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// The priorities a ticket may have.
pub const PRIORITIES: [&str; 4] = ["low", "normal", "high", "urgent"];

/// Outbox event type written with every created ticket.
pub const TICKET_CREATED: &str = "ticket.created";
/// Outbox event type written with every update.
pub const TICKET_UPDATED: &str = "ticket.updated";

/// The business part of a "create ticket" request: exactly the four fields the fingerprint
/// covers (docs/PROTOCOL.md §2.1). Tenant and idempotency key travel beside it (in HTTP, as headers).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TicketRequest {
    /// Who asks for the ticket.
    pub actor_id: String,
    /// Short summary, at most [`MAX_TITLE_CHARS`] characters.
    pub title: String,
    /// Free text, at most [`MAX_BODY_BYTES`] bytes. Never logged, never put into an event.
    pub body: String,
    /// One of [`PRIORITIES`].
    pub priority: String,
}

/// Fields an update may change; `None` leaves a field as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TicketPatch {
    /// New title.
    pub title: Option<String>,
    /// New body.
    pub body: Option<String>,
    /// New priority.
    pub priority: Option<String>,
}

impl TicketRequest {
    /// What a request must look like, for error messages.
    pub const JSON_SHAPE: &'static str =
        "a JSON object with exactly actor_id, title, body, priority (strings)";

    /// Parses a request from JSON text given as bytes: UTF-8 first, then [`json_object`].
    ///
    /// Will return `Err` if `bytes` is not UTF-8, not JSON, not an object, or an object
    /// without exactly the four string fields.
    pub fn from_json(bytes: &[u8]) -> Result<TicketRequest, JsonBodyError> {
        std::str::from_utf8(bytes).map_err(|e| JsonBodyError::NotUtf8 {
            valid_up_to: e.valid_up_to(),
        })?;
        json_object(bytes)
    }
}

impl TicketPatch {
    /// What a patch must look like, for error messages.
    pub const JSON_SHAPE: &'static str =
        "a JSON object with any of title, body, priority (strings)";
}

/// Why a JSON body is not the object a request type expects. Each variant keeps the parser's
/// own message (line and column) where there is one.
#[derive(Debug, thiserror::Error)]
pub enum JsonBodyError {
    /// Not UTF-8 ([`TicketRequest::from_json`] only); the first bad byte is at `valid_up_to`.
    #[error("not valid UTF-8 (byte {valid_up_to})")]
    NotUtf8 {
        /// Offset of the first byte that is not UTF-8.
        valid_up_to: usize,
    },
    /// Not JSON at all.
    #[error("not JSON: {0}")]
    Syntax(#[source] serde_json::Error),
    /// JSON, but not an object.
    #[error("not a JSON object but a JSON {kind}")]
    NotObject {
        /// `null`, `boolean`, `number`, `string` or `array`.
        kind: &'static str,
    },
    /// An object, but with missing, unknown or mistyped fields.
    #[error("{0}")]
    Shape(#[source] serde_json::Error),
    /// An object (at any depth) names a member twice. RFC 8259 §4 only says names SHOULD be
    /// unique and parsers differ on which one wins (serde_json and Python keep the last, others
    /// the first), so a proxy or an audit log could read another request than the one stored
    /// and fingerprinted: such a body is refused, and nothing is written.
    #[error("{0}")]
    DuplicateMember(#[source] serde_json::Error),
}

/// Parses `bytes` as any JSON value whose objects (at any depth) name each member once: how
/// every request body we read is parsed (the create request, a patch, `target init --body`).
///
/// Will return `Err` if `bytes` is not JSON ([`JsonBodyError::Syntax`]) or names a member
/// twice ([`JsonBodyError::DuplicateMember`]).
pub fn json_value(bytes: &[u8]) -> Result<serde_json::Value, JsonBodyError> {
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(JsonBodyError::Syntax)?;
    // The text is valid JSON; a second pass over it only looks for repeated member names,
    // which `Value` would have collapsed (the last one wins).
    serde_json::from_slice::<UniqueMembers>(bytes).map_err(JsonBodyError::DuplicateMember)?;
    Ok(value)
}

/// Parses `bytes` as a JSON object of type `T` (a request body: [`TicketRequest`],
/// [`TicketPatch`]), telling a non-object apart from an object of the wrong shape.
///
/// Will return `Err` if `bytes` is not JSON, not an object, or does not deserialize as `T`.
pub fn json_object<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, JsonBodyError> {
    let value = json_value(bytes)?;
    let kind = match &value {
        serde_json::Value::Object(_) => None,
        serde_json::Value::Null => Some("null"),
        serde_json::Value::Bool(_) => Some("boolean"),
        serde_json::Value::Number(_) => Some("number"),
        serde_json::Value::String(_) => Some("string"),
        serde_json::Value::Array(_) => Some("array"),
    };
    if let Some(kind) = kind {
        return Err(JsonBodyError::NotObject { kind });
    }
    serde_json::from_value(value).map_err(JsonBodyError::Shape)
}

/// A JSON document read only to prove that no object in it names a member twice; its
/// `Deserialize` fails with `duplicate member "NAME"` (names compared after unescaping, so
/// `"a"` and `"\u0061"` are the same name).
struct UniqueMembers;

impl<'de> serde::Deserialize<'de> for UniqueMembers {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(UniqueMembersVisitor)
    }
}

struct UniqueMembersVisitor;

impl<'de> serde::de::Visitor<'de> for UniqueMembersVisitor {
    type Value = UniqueMembers;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<UniqueMembers, E> {
        Ok(UniqueMembers)
    }

    fn visit_i64<E>(self, _: i64) -> Result<UniqueMembers, E> {
        Ok(UniqueMembers)
    }

    fn visit_u64<E>(self, _: u64) -> Result<UniqueMembers, E> {
        Ok(UniqueMembers)
    }

    fn visit_f64<E>(self, _: f64) -> Result<UniqueMembers, E> {
        Ok(UniqueMembers)
    }

    fn visit_str<E>(self, _: &str) -> Result<UniqueMembers, E> {
        Ok(UniqueMembers)
    }

    fn visit_unit<E>(self) -> Result<UniqueMembers, E> {
        Ok(UniqueMembers)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> Result<UniqueMembers, A::Error> {
        while seq.next_element::<UniqueMembers>()?.is_some() {}
        Ok(UniqueMembers)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(
        self,
        mut map: A,
    ) -> Result<UniqueMembers, A::Error> {
        let mut seen = std::collections::HashSet::new();
        while let Some(name) = map.next_key::<String>()? {
            if !seen.insert(name.clone()) {
                return Err(serde::de::Error::custom(format_args!(
                    "duplicate member {name:?}"
                )));
            }
            map.next_value::<UniqueMembers>()?;
        }
        Ok(UniqueMembers)
    }
}

/// A stored ticket (docs/PROTOCOL.md §3). Timestamps are UTC with microsecond precision, the
/// precision PostgreSQL's `timestamptz` keeps, so a value survives a round trip unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ticket {
    /// Ticket id (UUID v4), chosen by the service on create.
    pub id: Uuid,
    /// Owning tenant.
    pub tenant_id: String,
    /// Who created it.
    pub actor_id: String,
    /// Title.
    pub title: String,
    /// Body.
    pub body: String,
    /// One of [`PRIORITIES`].
    pub priority: String,
    /// `open` on create.
    pub status: String,
    /// 1 on create, +1 on every update.
    pub version: i64,
    /// When it was created (UTC).
    pub created_at: DateTime<Utc>,
    /// When it was last changed (UTC).
    pub updated_at: DateTime<Utc>,
}

/// A transactional outbox row (docs/PROTOCOL.md §3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboxEvent {
    /// Event id (UUID v4).
    pub id: Uuid,
    /// The ticket the event is about.
    pub aggregate_id: Uuid,
    /// Owning tenant.
    pub tenant_id: String,
    /// [`TICKET_CREATED`] or [`TICKET_UPDATED`].
    pub event_type: String,
    /// Compact JSON with sorted keys; see [`OutboxEvent::for_ticket`]. Never holds the body.
    pub payload_json: String,
    /// When it happened (UTC).
    pub occurred_at: DateTime<Utc>,
}

impl OutboxEvent {
    /// Builds the event for `ticket` as it is after the change. The payload has the keys
    /// `event_id`, `ticket_id`, `tenant_id`, `version`, `trace_context` (empty object),
    /// `occurred_at` (ISO-8601 UTC, `+00:00` offset as Python's `isoformat` writes it) and
    /// `payload` {`event_type`, `priority`, `status`, `title`} (docs/PROTOCOL.md §3).
    pub fn for_ticket(ticket: &Ticket, event_type: &str, occurred_at: DateTime<Utc>) -> Self {
        let id = Uuid::new_v4();
        let payload = serde_json::json!({
            "event_id": id.to_string(),
            "ticket_id": ticket.id.to_string(),
            "tenant_id": ticket.tenant_id,
            "version": ticket.version,
            "trace_context": {},
            "occurred_at": iso8601(occurred_at),
            "payload": {
                "event_type": event_type,
                "priority": ticket.priority,
                "status": ticket.status,
                "title": ticket.title,
            },
        });
        OutboxEvent {
            id,
            aggregate_id: ticket.id,
            tenant_id: ticket.tenant_id.clone(),
            event_type: event_type.to_string(),
            payload_json: canonical_json(&payload),
            occurred_at,
        }
    }
}

/// A durable idempotency receipt: (tenant, key) → fingerprint hash and ticket id (docs/PROTOCOL.md §3).
/// The pair (`tenant_id`, `idempotency_key`) is unique in the database; that constraint, not
/// a prior SELECT, decides who wins a race.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// Owning tenant.
    pub tenant_id: String,
    /// The client's Idempotency-Key.
    pub idempotency_key: String,
    /// SHA-256 hex of the canonical request ([`crate::fingerprint`]).
    pub payload_hash: String,
    /// The ticket the key created.
    pub ticket_id: Uuid,
    /// When it was written (UTC).
    pub created_at: DateTime<Utc>,
}

/// The current time in UTC, truncated to microseconds (see [`Ticket`]).
pub fn now_utc() -> DateTime<Utc> {
    let now = Utc::now();
    let micros = now.timestamp_micros();
    DateTime::from_timestamp_micros(micros).unwrap_or(now)
}

/// ISO-8601 with microseconds and a `+00:00` offset, e.g. `2026-11-29T19:23:51.123456+00:00`.
pub fn iso8601(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Micros, false)
}

/// Parses an RFC 3339 timestamp into UTC: the inverse of [`iso8601`], and the same answer as
/// chrono's `DateTime::parse_from_rfc3339` followed by a conversion to UTC for any input.
/// Text in [`iso8601`]'s exact shape (`YYYY-MM-DDTHH:MM:SS.ffffff+00:00`, what the stores
/// write) is decoded directly; anything else (other offsets, precisions, separators, leap
/// seconds, errors) goes through chrono.
///
/// Will return `Err` for text that is not RFC 3339.
pub fn parse_iso8601(s: &str) -> Result<DateTime<Utc>, chrono::ParseError> {
    match parse_iso8601_micros_utc(s.as_bytes()) {
        Some(at) => Ok(at),
        None => DateTime::parse_from_rfc3339(s).map(|t| t.with_timezone(&Utc)),
    }
}

/// [`iso8601`]'s own shape only; `None` for anything else (the caller falls back to chrono).
fn parse_iso8601_micros_utc(b: &[u8]) -> Option<DateTime<Utc>> {
    if b.len() != 32
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
        || b[19] != b'.'
        || &b[26..] != b"+00:00"
    {
        return None;
    }
    let num = |from: usize, to: usize| -> Option<u32> {
        b[from..to].iter().try_fold(0u32, |acc, &c| {
            c.is_ascii_digit().then(|| acc * 10 + u32::from(c - b'0'))
        })
    };
    let second = num(17, 19)?;
    if second >= 60 {
        return None; // a leap second: chrono's own representation
    }
    let date = chrono::NaiveDate::from_ymd_opt(num(0, 4)? as i32, num(5, 7)?, num(8, 10)?)?;
    let time =
        chrono::NaiveTime::from_hms_micro_opt(num(11, 13)?, num(14, 16)?, second, num(20, 26)?)?;
    Some(chrono::NaiveDateTime::new(date, time).and_utc())
}

/// Checks tenant, key and request before anything touches the database.
///
/// Will return `Err` for an empty tenant, actor or key; a tenant, actor or key over 255 bytes;
/// a NUL character in any field; a priority other than `low`, `normal`, `high`, `urgent`;
/// a title over [`MAX_TITLE_CHARS`] characters; a body over [`MAX_BODY_BYTES`] bytes.
/// A rejected request writes nothing and does not poison its key.
pub fn validate_create(
    tenant_id: &str,
    idempotency_key: &str,
    request: &TicketRequest,
) -> Result<(), ValidationError> {
    validate_id("tenant_id", tenant_id, MAX_TENANT_BYTES)?;
    validate_id("idempotency_key", idempotency_key, MAX_KEY_BYTES)?;
    validate_id("actor_id", &request.actor_id, MAX_ACTOR_BYTES)?;
    validate_title(&request.title)?;
    validate_body(&request.body)?;
    validate_priority(&request.priority)
}

/// Checks the tenant and a patch for `update_ticket`: the same field rules as
/// [`validate_create`], and at least one field must be set.
pub fn validate_patch(tenant_id: &str, patch: &TicketPatch) -> Result<(), ValidationError> {
    validate_id("tenant_id", tenant_id, MAX_TENANT_BYTES)?;
    if patch.title.is_none() && patch.body.is_none() && patch.priority.is_none() {
        return Err(ValidationError::EmptyPatch);
    }
    if let Some(title) = &patch.title {
        validate_title(title)?;
    }
    if let Some(body) = &patch.body {
        validate_body(body)?;
    }
    if let Some(priority) = &patch.priority {
        validate_priority(priority)?;
    }
    Ok(())
}

/// Checks a tenant id used for reads.
pub fn validate_tenant(tenant_id: &str) -> Result<(), ValidationError> {
    validate_id("tenant_id", tenant_id, MAX_TENANT_BYTES)
}

fn validate_id(field: &'static str, value: &str, max_bytes: usize) -> Result<(), ValidationError> {
    if value.is_empty() {
        return Err(ValidationError::Empty { field });
    }
    if value.len() > max_bytes {
        return Err(ValidationError::TooLong {
            field,
            limit: max_bytes,
            unit: "bytes",
            actual: value.len(),
        });
    }
    no_nul(field, value)
}

fn validate_title(title: &str) -> Result<(), ValidationError> {
    let chars = title.chars().count();
    if chars > MAX_TITLE_CHARS {
        return Err(ValidationError::TooLong {
            field: "title",
            limit: MAX_TITLE_CHARS,
            unit: "characters",
            actual: chars,
        });
    }
    no_nul("title", title)
}

fn validate_body(body: &str) -> Result<(), ValidationError> {
    if body.len() > MAX_BODY_BYTES {
        return Err(ValidationError::TooLong {
            field: "body",
            limit: MAX_BODY_BYTES,
            unit: "bytes",
            actual: body.len(),
        });
    }
    no_nul("body", body)
}

fn validate_priority(priority: &str) -> Result<(), ValidationError> {
    no_nul("priority", priority)?;
    if PRIORITIES.contains(&priority) {
        Ok(())
    } else {
        Err(ValidationError::UnknownPriority {
            value: priority.chars().take(32).collect(),
        })
    }
}

fn no_nul(field: &'static str, value: &str) -> Result<(), ValidationError> {
    // One pass without an early exit (vectorizable) for the common answer; the offset only
    // when there is a NUL.
    if !value.bytes().fold(false, |nul, b| nul | (b == 0)) {
        return Ok(());
    }
    match value.find('\0') {
        Some(offset) => Err(ValidationError::NulCharacter { field, offset }),
        None => Ok(()),
    }
}

/// How a create request was decided; the path is evidence for the harness.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DecisionPath {
    /// No receipt at lookup; this request's savepoint inserted ticket, event and receipt.
    Created,
    /// The first receipt lookup found a receipt (docs/PROTOCOL.md §4.2 step 4).
    FromLookup,
    /// The receipt insert hit a unique violation; after rolling back to the savepoint the
    /// committed winner's receipt was read (docs/PROTOCOL.md §4.2 step 7).
    AfterUniqueViolation,
    /// `on-conflict` protocol: the receipt's `INSERT … ON CONFLICT DO NOTHING` found the key
    /// taken (after waiting for its holder); the committed winner's receipt was then read.
    AfterInsertConflict,
}

impl std::fmt::Display for DecisionPath {
    /// The same names as in JSON: `created`, `from-lookup`, `after-unique-violation`,
    /// `after-insert-conflict`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DecisionPath::Created => "created",
            DecisionPath::FromLookup => "from-lookup",
            DecisionPath::AfterUniqueViolation => "after-unique-violation",
            DecisionPath::AfterInsertConflict => "after-insert-conflict",
        })
    }
}

/// Why a create request was refused as a conflict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conflict {
    /// Tenant of the key.
    pub tenant_id: String,
    /// The key that was reused.
    pub idempotency_key: String,
    /// Fingerprint hash stored with the receipt (the first request's); compare it with
    /// `ticketflow fingerprint` output to see which request made the key.
    pub stored_hash: String,
    /// Fingerprint hash of this request.
    pub request_hash: String,
}

/// The result of `create_ticket` (docs/PROTOCOL.md §6).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// A new ticket, event and receipt were committed. HTTP 201.
    Created {
        /// The new ticket.
        ticket: Ticket,
    },
    /// The key was already used with the same fingerprint; the stored ticket is returned as it
    /// is now (the receipt keeps only its id). HTTP 201 with a replay marker.
    Replayed {
        /// The ticket the key created, in its current state.
        ticket: Ticket,
    },
    /// The key was already used with a different fingerprint. HTTP 409 (our contract,
    /// docs/PROTOCOL.md §6.1; the IETF Idempotency-Key draft uses 422 for this case).
    Conflict {
        /// What differed.
        conflict: Conflict,
    },
}

impl Outcome {
    /// The HTTP status the outcome maps to: 201, 201, 409.
    pub fn http_status(&self) -> u16 {
        match self {
            Outcome::Created { .. } | Outcome::Replayed { .. } => 201,
            Outcome::Conflict { .. } => 409,
        }
    }

    /// `created`, `replayed` or `conflict`.
    pub fn kind(&self) -> OutcomeKind {
        match self {
            Outcome::Created { .. } => OutcomeKind::Created,
            Outcome::Replayed { .. } => OutcomeKind::Replayed,
            Outcome::Conflict { .. } => OutcomeKind::Conflict,
        }
    }

    /// The ticket, for created and replayed outcomes.
    pub fn ticket(&self) -> Option<&Ticket> {
        match self {
            Outcome::Created { ticket } | Outcome::Replayed { ticket } => Some(ticket),
            Outcome::Conflict { .. } => None,
        }
    }
}

/// The three outcome kinds, without data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeKind {
    /// See [`Outcome::Created`].
    Created,
    /// See [`Outcome::Replayed`].
    Replayed,
    /// See [`Outcome::Conflict`].
    Conflict,
}

impl std::fmt::Display for OutcomeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OutcomeKind::Created => "created",
            OutcomeKind::Replayed => "replayed",
            OutcomeKind::Conflict => "conflict",
        })
    }
}

/// An outcome with the evidence of how it was reached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateReport {
    /// The outcome.
    #[serde(flatten)]
    pub outcome: Outcome,
    /// Which branch of the protocol decided it.
    pub path: DecisionPath,
    /// HTTP status (201 or 409).
    pub http_status: u16,
    /// `true` for a replay (HTTP `Idempotent-Replayed: true`).
    pub replayed: bool,
    /// Transactions run, 1 when the first succeeded.
    pub attempts: u32,
    /// Why each earlier attempt was retried (serialization failure, deadlock, busy, winner
    /// not visible), in order.
    pub retried: Vec<String>,
}

impl CreateReport {
    pub(crate) fn new(outcome: Outcome, path: DecisionPath) -> Self {
        CreateReport {
            http_status: outcome.http_status(),
            replayed: matches!(outcome, Outcome::Replayed { .. }),
            outcome,
            path,
            attempts: 1,
            retried: Vec::new(),
        }
    }

    /// A fresh ticket, decided by its own inserts.
    pub(crate) fn created(ticket: Ticket) -> Self {
        CreateReport::new(Outcome::Created { ticket }, DecisionPath::Created)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_iso8601_agrees_with_chrono_and_inverts_iso8601() {
        let chrono_utc = |s: &str| DateTime::parse_from_rfc3339(s).map(|t| t.with_timezone(&Utc));
        for s in [
            "2026-11-29T19:23:51.123456+00:00",
            "0001-01-01T00:00:00.000000+00:00",
            "9999-12-31T23:59:59.999999+00:00",
            "2024-02-29T12:00:00.000001+00:00",
            "2023-02-29T12:00:00.000001+00:00",
            "2026-13-01T00:00:00.000000+00:00",
            "2026-11-31T00:00:00.000000+00:00",
            "2026-11-29T24:00:00.000000+00:00",
            "2026-11-29T23:60:00.000000+00:00",
            "2016-12-31T23:59:60.500000+00:00",
            "2026-11-29T19:23:51.12345a+00:00",
            "2026-11-29t19:23:51.123456+00:00",
            "2026-11-29 19:23:51.123456+00:00",
            "2026-11-29T19:23:51.123456-00:00",
            "2026-11-29T19:23:51.123456+01:00",
            "2026-11-29T19:23:51.1234567+00:00",
            "2026-11-29T19:23:51+00:00",
            "2026-11-29T19:23:51.123456Z",
            "+026-11-29T19:23:51.123456+00:00",
            "2026-11-29T19:23:51.123456+00:0x",
            "",
        ] {
            assert_eq!(parse_iso8601(s), chrono_utc(s), "{s:?}");
        }
        let now = now_utc();
        assert_eq!(parse_iso8601(&iso8601(now)), Ok(now));
        // Years 1..=9999 at random microseconds: the stores' shape, decoded directly.
        let (lo, hi) = (-62_135_596_800_000_000i64, 253_402_300_799_999_999i64);
        for _ in 0..5000 {
            let at = DateTime::from_timestamp_micros(rand::Rng::gen_range(
                &mut rand::thread_rng(),
                lo..=hi,
            ))
            .unwrap();
            let s = iso8601(at);
            assert_eq!(parse_iso8601(&s), Ok(at), "{s}");
            assert_eq!(parse_iso8601(&s), chrono_utc(&s), "{s}");
        }
    }

    fn ok_request() -> TicketRequest {
        TicketRequest {
            actor_id: "u1".into(),
            title: "x".into(),
            body: "y".into(),
            priority: "high".into(),
        }
    }

    #[test]
    fn a_member_named_twice_is_refused_at_any_depth_and_after_unescaping() {
        let base = r#""actor_id":"a","title":"x","body":"b","priority":"high""#;
        for (body, name) in [
            (format!(r#"{{{base},"title":"z"}}"#), "title"),
            (format!(r#"{{{base},"\u0074itle":"z"}}"#), "title"),
            (r#"[{"x":1,"y":{"k":1,"k":2}}]"#.to_string(), "k"),
        ] {
            match json_object::<serde_json::Value>(body.as_bytes()) {
                Err(JsonBodyError::DuplicateMember(e)) => {
                    assert!(
                        e.to_string()
                            .contains(&format!("duplicate member {name:?}")),
                        "{e}"
                    )
                }
                other => panic!("{body}: {other:?}"),
            }
        }
        // The same name in two different objects is fine, and so is the request itself.
        let ok = format!(r#"{{{base}}}"#);
        assert!(TicketRequest::from_json(ok.as_bytes()).is_ok());
        assert!(json_object::<serde_json::Value>(br#"{"a":{"k":1},"b":{"k":1}}"#).is_ok());
    }

    #[test]
    fn request_json_tells_each_kind_of_bad_body_apart() {
        let good = br#"{"priority":"high","body":"y","title":"x","actor_id":"u1"}"#;
        assert_eq!(TicketRequest::from_json(good).unwrap(), ok_request());
        let err = |bytes: &[u8]| TicketRequest::from_json(bytes).unwrap_err();
        assert!(matches!(
            err(b"{\"actor_id\":\"\xff\"}"),
            JsonBodyError::NotUtf8 { valid_up_to: 13 }
        ));
        assert!(matches!(err(b"{\"a\":"), JsonBodyError::Syntax(_)));
        for (body, want) in [
            (&b"[1]"[..], "array"),
            (b"null", "null"),
            (b"true", "boolean"),
            (b"1", "number"),
            (b"\"x\"", "string"),
        ] {
            assert!(
                matches!(err(body), JsonBodyError::NotObject { kind } if kind == want),
                "{want}"
            );
        }
        let unknown = br#"{"actor_id":"u1","title":"x","body":"y","priority":"high","x":1}"#;
        let missing = br#"{"actor_id":"u1"}"#;
        let mistyped = br#"{"actor_id":"u1","title":"x","body":"y","priority":3}"#;
        for body in [&unknown[..], missing, mistyped] {
            assert!(matches!(err(body), JsonBodyError::Shape(_)));
        }
    }

    #[test]
    fn json_object_leaves_utf8_to_the_json_parser() {
        // The server's check: invalid UTF-8 is a syntax error there, as serde_json reports it.
        let r = json_object::<TicketPatch>(b"{\"title\":\"\xff\"}");
        assert!(matches!(r, Err(JsonBodyError::Syntax(_))));
        assert_eq!(
            json_object::<TicketPatch>(br#"{"title":"t"}"#)
                .unwrap()
                .title
                .as_deref(),
            Some("t")
        );
    }

    #[test]
    fn bad_input_is_a_typed_validation_error() {
        let r = ok_request();
        assert!(validate_create("A", "key-1", &r).is_ok());
        assert!(matches!(
            validate_create("A", "", &r),
            Err(ValidationError::Empty {
                field: "idempotency_key"
            })
        ));
        assert!(matches!(
            validate_create("A", &"k".repeat(256), &r),
            Err(ValidationError::TooLong {
                field: "idempotency_key",
                ..
            })
        ));
        assert!(validate_create("A", &"k".repeat(255), &r).is_ok());
        let mut bad = ok_request();
        bad.priority = "bogus".into();
        assert!(matches!(
            validate_create("A", "k", &bad),
            Err(ValidationError::UnknownPriority { .. })
        ));
        let mut bad = ok_request();
        bad.title = "t".repeat(201);
        assert!(matches!(
            validate_create("A", "k", &bad),
            Err(ValidationError::TooLong { field: "title", .. })
        ));
        let mut bad = ok_request();
        bad.body = "b".repeat(MAX_BODY_BYTES + 1);
        assert!(matches!(
            validate_create("A", "k", &bad),
            Err(ValidationError::TooLong { field: "body", .. })
        ));
        let mut bad = ok_request();
        bad.body = "a\0b".into();
        assert!(matches!(
            validate_create("A", "k", &bad),
            Err(ValidationError::NulCharacter {
                field: "body",
                offset: 1
            })
        ));
    }

    #[test]
    fn event_payload_is_canonical_and_has_no_body() {
        let now = now_utc();
        let ticket = Ticket {
            id: Uuid::new_v4(),
            tenant_id: "A".into(),
            actor_id: "u1".into(),
            title: "x".into(),
            body: "secret-body-text".into(),
            priority: "high".into(),
            status: "open".into(),
            version: 1,
            created_at: now,
            updated_at: now,
        };
        let event = OutboxEvent::for_ticket(&ticket, TICKET_CREATED, now);
        assert!(!event.payload_json.contains("secret-body-text"));
        assert!(event.payload_json.starts_with("{\"event_id\":"));
        let parsed: serde_json::Value = serde_json::from_str(&event.payload_json).unwrap();
        assert_eq!(parsed["payload"]["event_type"], TICKET_CREATED);
        assert_eq!(parsed["version"], 1);
        assert!(parsed["occurred_at"].as_str().unwrap().ends_with("+00:00"));
    }
}
