//! Response rules: how a black-box target's answer is classified, and where its id is.
//!
//! A scenario's `[[target.rules]]` come first, then its preset's; the first rule whose every
//! condition holds decides. An answer no rule matches is an `error`. Presets:
//!
//! | preset | created | replayed | conflict | in-progress | rejected |
//! |---|---|---|---|---|---|
//! | `ticketflow` | 201 | 201 + `Idempotent-Replayed: true` | 409 | — | other 4xx |
//! | `ietf` | 2xx | 2xx + `Idempotent-Replayed: true` | 422 | 409 | other 4xx |
//! | `stripe` | 2xx | 2xx + `Idempotent-Replayed: true` | 400 with `/error/type` = `idempotency_error` | 409 | other 4xx |
//! | `none` | only the scenario's rules | | | | |
//!
//! `ietf` follows draft-ietf-httpapi-idempotency-key-header (section 2.7: 409 Conflict for a
//! request still being processed, 422 Unprocessable Content for a key reused with another
//! payload, 400 for a missing key). `stripe` follows Stripe's documented behaviour (a replay
//! carries `Idempotent-Replayed: true`, a concurrent request is 409, parameters that differ
//! from the first request's are a 400 `idempotency_error`). 5xx is never matched by a preset:
//! it is an error.

use regex::Regex;
use serde::{Deserialize, Serialize};

use super::client::HttpAnswer;

/// How the harness reads one answer.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "kebab-case")]
pub enum AnswerKind {
    /// The request created the resource (the intent's one effect).
    Created,
    /// A stored answer for the key was returned (a replay of the created one).
    Replayed,
    /// Refused: the key was used with another request.
    Conflict,
    /// The key's first request is still being processed; retry later with the same key.
    InProgress,
    /// Refused before doing anything (validation, auth): nothing written, the key unused.
    Rejected,
    /// No answer within the request timeout. The request may or may not have had its effect;
    /// it is never retried (a retry would wait as long again) and no rule gives it.
    Timeout,
    /// Anything else: a 5xx, an unclassified answer, a transport error.
    #[default]
    Error,
}

impl AnswerKind {
    /// The kebab-case name used in scenario files.
    pub fn name(self) -> &'static str {
        match self {
            AnswerKind::Created => "created",
            AnswerKind::Replayed => "replayed",
            AnswerKind::Conflict => "conflict",
            AnswerKind::InProgress => "in-progress",
            AnswerKind::Rejected => "rejected",
            AnswerKind::Timeout => "timeout",
            AnswerKind::Error => "error",
        }
    }

    /// Whether the answer carries the resource (created or replayed).
    pub(crate) fn has_resource(self) -> bool {
        matches!(self, AnswerKind::Created | AnswerKind::Replayed)
    }
}

impl std::fmt::Display for AnswerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A condition of a target file's rule that does not parse.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RuleError {
    /// A status that is neither a code in 100..=599 nor a class `1xx`..`5xx`.
    #[error("status {value} must be a code (409) or a class (\"4xx\")")]
    Status {
        /// The value as written.
        value: toml::Value,
    },
    /// A JSON pointer that is not empty and does not start with `/`.
    #[error("JSON pointer {pointer:?} must start with \"/\" (RFC 6901)")]
    PointerStart {
        /// The pointer as written.
        pointer: String,
    },
    /// A `~` in a JSON pointer not followed by `0` or `1`.
    #[error("JSON pointer {pointer:?}: \"~\" must be followed by 0 or 1 (RFC 6901)")]
    PointerEscape {
        /// The pointer as written.
        pointer: String,
    },
}

/// Why an answer's id could not be read ([`IdSource::extract`]): a finding about the answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum IdError {
    /// The value at the pointer is neither a non-empty string nor an integer.
    #[error("id at {pointer} is {found}, not a string or integer")]
    WrongType {
        /// The JSON pointer.
        pointer: String,
        /// The value found there.
        found: serde_json::Value,
    },
    /// The body is not JSON, so the pointer finds nothing.
    #[error("no id at {pointer}: the body is not JSON")]
    NotJson {
        /// The JSON pointer.
        pointer: String,
    },
    /// Nothing at the pointer.
    #[error("no id at {pointer}")]
    Missing {
        /// The JSON pointer.
        pointer: String,
    },
    /// The answer lacks the header.
    #[error("no {name} header with the id")]
    NoHeader {
        /// The header name.
        name: String,
    },
    /// The header's value does not match the regex.
    #[error("{name} {value:?} does not match /{regex}/")]
    NoMatch {
        /// The header name.
        name: String,
        /// Its value.
        value: String,
        /// The regex, as written.
        regex: String,
    },
}

/// A status condition: one code (`409`) or a class (`"4xx"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum StatusMatch {
    /// Exactly this code.
    Code(u16),
    /// Any code of this hundred (`4` for 4xx).
    Class(u16),
}

impl StatusMatch {
    /// Parses `409`, `"409"` or `"4xx"`.
    ///
    /// Will return `Err` for anything else, or a code outside 100..=599.
    pub fn parse(value: &toml::Value) -> Result<StatusMatch, RuleError> {
        let bad = || RuleError::Status {
            value: value.clone(),
        };
        let text = match value {
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::String(s) => s.to_ascii_lowercase(),
            _ => return Err(bad()),
        };
        if let Some(class) = text.strip_suffix("xx") {
            return match class.parse::<u16>() {
                Ok(c @ 1..=5) => Ok(StatusMatch::Class(c)),
                _ => Err(bad()),
            };
        }
        match text.parse::<u16>() {
            Ok(c @ 100..=599) => Ok(StatusMatch::Code(c)),
            _ => Err(bad()),
        }
    }

    fn matches(self, status: u16) -> bool {
        match self {
            StatusMatch::Code(c) => status == c,
            StatusMatch::Class(c) => status / 100 == c,
        }
    }

    fn label(self) -> String {
        match self {
            StatusMatch::Code(c) => c.to_string(),
            StatusMatch::Class(c) => format!("{c}xx"),
        }
    }
}

/// A header condition.
#[derive(Debug, Clone)]
pub enum HeaderTest {
    /// The header is present.
    Present,
    /// Its value equals this (ASCII case-insensitive).
    Equals(String),
    /// Its value matches this regex.
    Matches(Regex),
}

/// A JSON-pointer condition on the body (RFC 6901).
#[derive(Debug, Clone)]
pub enum PointerTest {
    /// The pointer resolves.
    Present,
    /// It resolves to this JSON value.
    Equals(serde_json::Value),
}

/// One rule: every condition given must hold; the first matching rule decides.
#[derive(Debug, Clone)]
pub struct Rule {
    /// Status condition.
    pub status: Option<StatusMatch>,
    /// Header name and condition.
    pub header: Option<(String, HeaderTest)>,
    /// JSON pointer and condition.
    pub pointer: Option<(String, PointerTest)>,
    /// Regex the body text must match.
    pub body_regex: Option<Regex>,
    /// The classification.
    pub outcome: AnswerKind,
    /// Where the rule came from: `file:line` or `preset ietf`.
    pub origin: String,
}

impl Rule {
    /// Whether every condition holds for `answer` (`json`: its body parsed, if it is JSON).
    pub fn matches(&self, answer: &HttpAnswer, json: Option<&serde_json::Value>) -> bool {
        if let Some(s) = self.status {
            if !s.matches(answer.status) {
                return false;
            }
        }
        if let Some((name, test)) = &self.header {
            let Some(value) = answer.header(name) else {
                return false;
            };
            let ok = match test {
                HeaderTest::Present => true,
                HeaderTest::Equals(v) => value.trim().eq_ignore_ascii_case(v),
                HeaderTest::Matches(re) => re.is_match(value),
            };
            if !ok {
                return false;
            }
        }
        if let Some((pointer, test)) = &self.pointer {
            let Some(found) = json.and_then(|j| j.pointer(pointer)) else {
                return false;
            };
            if let PointerTest::Equals(want) = test {
                if found != want {
                    return false;
                }
            }
        }
        if let Some(re) = &self.body_regex {
            if !re.is_match(&answer.body_text()) {
                return false;
            }
        }
        true
    }

    /// The conditions in words: `409, body ~ /in progress/`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(s) = self.status {
            parts.push(s.label());
        }
        if let Some((name, test)) = &self.header {
            parts.push(match test {
                HeaderTest::Present => format!("header {name}"),
                HeaderTest::Equals(v) => format!("{name}: {v}"),
                HeaderTest::Matches(re) => format!("{name} ~ /{re}/"),
            });
        }
        if let Some((p, test)) = &self.pointer {
            parts.push(match test {
                PointerTest::Present => format!("body {p} present"),
                PointerTest::Equals(v) => format!("body {p} = {v}"),
            });
        }
        if let Some(re) = &self.body_regex {
            parts.push(format!("body ~ /{re}/"));
        }
        if parts.is_empty() {
            parts.push("any answer".into());
        }
        format!("{} → {}", parts.join(", "), self.outcome)
    }
}

/// A shipped rule set, appended after the scenario's own rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum Preset {
    // `help = None`: `--help` lists the bare names, as it always has; these docs are for
    // the code's readers.
    /// `ticketflow serve`: 201 created, 201 + `Idempotent-Replayed: true` replayed, 409
    /// conflict, other 4xx rejected.
    #[cfg_attr(feature = "cli", value(help = None::<&str>))]
    Ticketflow,
    /// The IETF Idempotency-Key draft: 409 in progress, 422 conflict.
    #[cfg_attr(feature = "cli", value(help = None::<&str>))]
    Ietf,
    /// Stripe-like: 409 in progress, 400 `idempotency_error` conflict.
    #[cfg_attr(feature = "cli", value(help = None::<&str>))]
    Stripe,
    /// No shipped rules.
    #[cfg_attr(feature = "cli", value(help = None::<&str>))]
    None,
}

impl Preset {
    /// The kebab-case name.
    pub fn name(self) -> &'static str {
        match self {
            Preset::Ticketflow => "ticketflow",
            Preset::Ietf => "ietf",
            Preset::Stripe => "stripe",
            Preset::None => "none",
        }
    }

    /// The preset's rules, in order.
    pub fn rules(self) -> Vec<Rule> {
        let origin = format!("preset {}", self.name());
        let rule = |status: StatusMatch, outcome: AnswerKind| Rule {
            status: Some(status),
            header: None,
            pointer: None,
            body_regex: None,
            outcome,
            origin: origin.clone(),
        };
        let replayed = |status: StatusMatch| Rule {
            header: Some((
                ticketflow_core::wire::REPLAYED_HEADER.into(),
                HeaderTest::Equals("true".into()),
            )),
            ..rule(status, AnswerKind::Replayed)
        };
        let two = StatusMatch::Class(2);
        let four = StatusMatch::Class(4);
        match self {
            Preset::Ticketflow => vec![
                replayed(StatusMatch::Code(201)),
                rule(StatusMatch::Code(201), AnswerKind::Created),
                rule(StatusMatch::Code(409), AnswerKind::Conflict),
                rule(four, AnswerKind::Rejected),
            ],
            Preset::Ietf => vec![
                replayed(two),
                rule(two, AnswerKind::Created),
                rule(StatusMatch::Code(409), AnswerKind::InProgress),
                rule(StatusMatch::Code(422), AnswerKind::Conflict),
                rule(four, AnswerKind::Rejected),
            ],
            Preset::Stripe => vec![
                replayed(two),
                rule(two, AnswerKind::Created),
                rule(StatusMatch::Code(409), AnswerKind::InProgress),
                Rule {
                    pointer: Some((
                        "/error/type".into(),
                        PointerTest::Equals("idempotency_error".into()),
                    )),
                    ..rule(StatusMatch::Code(400), AnswerKind::Conflict)
                },
                rule(four, AnswerKind::Rejected),
            ],
            Preset::None => Vec::new(),
        }
    }
}

/// Where a created or replayed answer carries the resource's id.
#[derive(Debug, Clone)]
pub enum IdSource {
    /// A JSON pointer into the body; the value must be a string or an integer.
    Pointer(String),
    /// A header (e.g. `Location`); with a regex, its first capture group.
    Header {
        /// Header name.
        name: String,
        /// Optional regex with one capture group.
        regex: Option<Regex>,
    },
}

impl IdSource {
    /// The id of `answer` as text (an integer in decimal).
    ///
    /// Will return `Err` saying what was missing or of the wrong type.
    pub fn extract(
        &self,
        answer: &HttpAnswer,
        json: Option<&serde_json::Value>,
    ) -> Result<String, IdError> {
        match self {
            IdSource::Pointer(p) => match json.and_then(|j| j.pointer(p)) {
                Some(serde_json::Value::String(s)) if !s.is_empty() => Ok(s.clone()),
                Some(serde_json::Value::Number(n)) if n.is_i64() || n.is_u64() => Ok(n.to_string()),
                Some(other) => Err(IdError::WrongType {
                    pointer: p.clone(),
                    found: other.clone(),
                }),
                None if json.is_none() => Err(IdError::NotJson { pointer: p.clone() }),
                None => Err(IdError::Missing { pointer: p.clone() }),
            },
            IdSource::Header { name, regex } => {
                let Some(value) = answer.header(name) else {
                    return Err(IdError::NoHeader { name: name.clone() });
                };
                match regex {
                    None => Ok(value.trim().to_string()),
                    Some(re) => re
                        .captures(value)
                        .and_then(|c| c.get(1))
                        .map(|m| m.as_str().to_string())
                        .ok_or_else(|| IdError::NoMatch {
                            name: name.clone(),
                            value: value.to_string(),
                            regex: re.to_string(),
                        }),
                }
            }
        }
    }

    /// `body /id` or `header Location`.
    pub fn describe(&self) -> String {
        match self {
            IdSource::Pointer(p) => format!("body {p}"),
            IdSource::Header { name, regex: None } => format!("header {name}"),
            IdSource::Header {
                name,
                regex: Some(re),
            } => format!("header {name} ~ /{re}/"),
        }
    }
}

/// Checks an RFC 6901 JSON pointer: empty, or `/`-separated tokens where `~` is followed by
/// `0` or `1`.
///
/// Will return `Err` describing the problem.
pub(crate) fn check_pointer(p: &str) -> Result<(), RuleError> {
    if !p.is_empty() && !p.starts_with('/') {
        return Err(RuleError::PointerStart {
            pointer: p.to_string(),
        });
    }
    let mut chars = p.chars();
    while let Some(c) = chars.next() {
        if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
            return Err(RuleError::PointerEscape {
                pointer: p.to_string(),
            });
        }
    }
    Ok(())
}

/// The first rule in `rules` matching `answer`, if any.
pub fn classify<'r>(
    rules: &'r [Rule],
    answer: &HttpAnswer,
    json: Option<&serde_json::Value>,
) -> Option<&'r Rule> {
    rules.iter().find(|r| r.matches(answer, json))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, headers: &[(&str, &str)], body: &str) -> HttpAnswer {
        HttpAnswer {
            status,
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            body: body.as_bytes().to_vec(),
        }
    }

    fn kind(preset: Preset, a: &HttpAnswer) -> Option<AnswerKind> {
        let json = serde_json::from_slice(&a.body).ok();
        classify(&preset.rules(), a, json.as_ref()).map(|r| r.outcome)
    }

    #[test]
    fn presets_classify_the_answers_they_describe() {
        use AnswerKind::*;
        let replay = answer(201, &[("Idempotent-Replayed", "TRUE")], "{}");
        let cases = [
            (Preset::Ticketflow, answer(201, &[], "{}"), Some(Created)),
            (Preset::Ticketflow, replay.clone(), Some(Replayed)),
            (Preset::Ticketflow, answer(409, &[], ""), Some(Conflict)),
            (Preset::Ticketflow, answer(422, &[], ""), Some(Rejected)),
            (Preset::Ticketflow, answer(500, &[], ""), None),
            (Preset::Ietf, answer(200, &[], "{}"), Some(Created)),
            (Preset::Ietf, replay.clone(), Some(Replayed)),
            (Preset::Ietf, answer(409, &[], ""), Some(InProgress)),
            (Preset::Ietf, answer(422, &[], ""), Some(Conflict)),
            (Preset::Ietf, answer(400, &[], ""), Some(Rejected)),
            (Preset::Ietf, answer(503, &[], ""), None),
            (
                Preset::Stripe,
                answer(400, &[], r#"{"error":{"type":"idempotency_error"}}"#),
                Some(Conflict),
            ),
            (
                Preset::Stripe,
                answer(400, &[], r#"{"error":{"type":"invalid_request_error"}}"#),
                Some(Rejected),
            ),
            (Preset::Stripe, answer(409, &[], ""), Some(InProgress)),
            (Preset::None, answer(201, &[], ""), None),
        ];
        for (preset, a, want) in cases {
            assert_eq!(kind(preset, &a), want, "{preset:?} {}", a.status);
        }
    }

    #[test]
    fn every_condition_kind_must_hold() {
        let rule = Rule {
            status: Some(StatusMatch::Class(4)),
            header: Some((
                "x-state".into(),
                HeaderTest::Matches(Regex::new("^pend").unwrap()),
            )),
            pointer: Some(("/code".into(), PointerTest::Equals(serde_json::json!(7)))),
            body_regex: Some(Regex::new("wait").unwrap()),
            outcome: AnswerKind::InProgress,
            origin: "t".into(),
        };
        let ok = answer(429, &[("X-State", "pending")], r#"{"code":7,"m":"wait"}"#);
        let json = serde_json::from_slice(&ok.body).ok();
        assert!(rule.matches(&ok, json.as_ref()));
        for bad in [
            answer(500, &[("X-State", "pending")], r#"{"code":7,"m":"wait"}"#),
            answer(429, &[("X-State", "done")], r#"{"code":7,"m":"wait"}"#),
            answer(429, &[], r#"{"code":7,"m":"wait"}"#),
            answer(429, &[("X-State", "pending")], r#"{"code":8,"m":"wait"}"#),
            answer(429, &[("X-State", "pending")], r#"{"code":7,"m":"go"}"#),
        ] {
            let json = serde_json::from_slice(&bad.body).ok();
            assert!(!rule.matches(&bad, json.as_ref()), "{}", bad.body_text());
        }
        let present = Rule {
            header: Some(("x-state".into(), HeaderTest::Present)),
            pointer: Some(("/code".into(), PointerTest::Present)),
            body_regex: None,
            status: None,
            ..rule
        };
        let json = serde_json::from_slice(&ok.body).ok();
        assert!(present.matches(&ok, json.as_ref()));
        assert!(!present.matches(&answer(200, &[("x-state", "")], "[]"), None));
    }

    #[test]
    fn ids_come_from_a_pointer_or_a_header() {
        let body = r#"{"data":{"id":42,"uuid":"u-1","f":1.5}}"#;
        let a = answer(201, &[("Location", "/orders/42")], body);
        let json = serde_json::from_slice(&a.body).ok();
        let j = json.as_ref();
        assert_eq!(
            IdSource::Pointer("/data/id".into()).extract(&a, j).unwrap(),
            "42"
        );
        assert_eq!(
            IdSource::Pointer("/data/uuid".into())
                .extract(&a, j)
                .unwrap(),
            "u-1"
        );
        assert!(IdSource::Pointer("/data/f".into()).extract(&a, j).is_err());
        assert!(IdSource::Pointer("/nope".into()).extract(&a, j).is_err());
        let location = IdSource::Header {
            name: "location".into(),
            regex: Some(Regex::new(r"/orders/(\d+)$").unwrap()),
        };
        assert_eq!(location.extract(&a, j).unwrap(), "42");
        let whole = IdSource::Header {
            name: "Location".into(),
            regex: None,
        };
        assert_eq!(whole.extract(&a, j).unwrap(), "/orders/42");
    }

    #[test]
    fn statuses_and_pointers_are_validated() {
        assert_eq!(
            StatusMatch::parse(&toml::Value::Integer(409)),
            Ok(StatusMatch::Code(409))
        );
        assert_eq!(
            StatusMatch::parse(&toml::Value::String("4XX".into())),
            Ok(StatusMatch::Class(4))
        );
        assert!(StatusMatch::parse(&toml::Value::Integer(42)).is_err());
        assert!(StatusMatch::parse(&toml::Value::String("9xx".into())).is_err());
        assert!(check_pointer("/a/b~1c").is_ok());
        assert!(check_pointer("a").is_err());
        assert!(check_pointer("/a~2").is_err());
    }
}
