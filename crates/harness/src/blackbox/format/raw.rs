//! The file's TOML shapes as serde reads them: unknown fields rejected, spans kept for
//! the lines errors name.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;
use toml::Spanned;

use super::{Cut, ExploreMode, ServiceSpec};
use crate::blackbox::rules::{AnswerKind, Preset};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFile {
    pub(super) name: String,
    pub(super) description: String,
    #[serde(default)]
    pub(super) barrier: Option<Spanned<RawBarrier>>,
    #[serde(default)]
    pub(super) schedule: Option<Spanned<RawSchedule>>,
    pub(super) target: Spanned<RawTarget>,
    #[serde(default)]
    pub(super) racers: Vec<Spanned<RawRacer>>,
    #[serde(default)]
    pub(super) expect: RawExpect,
    #[serde(default)]
    pub(super) fault: Vec<Spanned<RawFault>>,
    /// A check file's table: refused in a scenario file, read by `check`.
    pub(super) check: Option<Spanned<toml::Value>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFault {
    pub(super) racer: String,
    pub(super) step: Option<usize>,
    #[serde(rename = "match")]
    pub(super) words: Option<String>,
    #[serde(default)]
    pub(super) each: bool,
    pub(super) store: Option<String>,
    pub(super) kind: Option<String>,
    pub(super) cut: Option<Cut>,
    pub(super) when: Option<Cut>,
    pub(super) hold_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBarrier {
    pub(super) kind: Option<String>,
    pub(super) table: Option<String>,
    pub(super) lock: Option<String>,
    pub(super) advisory_key: Option<i64>,
    pub(super) timeout_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSchedule {
    pub(super) mode: Option<ExploreMode>,
    pub(super) preemptions: Option<u32>,
    pub(super) limit: Option<usize>,
    pub(super) runs: Option<usize>,
    pub(super) depth: Option<u32>,
    pub(super) seed: Option<u64>,
    pub(super) step_timeout_ms: Option<u64>,
    pub(super) poll_repeats: Option<usize>,
    pub(super) after_answer_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTarget {
    #[serde(default)]
    pub(super) base_urls: Vec<String>,
    #[serde(default)]
    pub(super) service: Vec<ServiceSpec>,
    pub(super) database_url: Option<String>,
    pub(super) redis_url: Option<String>,
    pub(super) interposer: Option<String>,
    pub(super) interposer_token_file: Option<String>,
    #[serde(default)]
    pub(super) own_service: bool,
    #[serde(default)]
    pub(super) setup_sql: Vec<String>,
    pub(super) preset: Option<Preset>,
    pub(super) request_timeout_ms: Option<u64>,
    pub(super) request: Option<Spanned<RawRequest>>,
    #[serde(default)]
    pub(super) scopes: Vec<Spanned<RawScope>>,
    #[serde(default)]
    pub(super) rules: Vec<Spanned<RawRule>>,
    pub(super) id: Option<Spanned<RawId>>,
    #[serde(default)]
    pub(super) replay: Option<Spanned<RawReplay>>,
    #[serde(default)]
    pub(super) retry: Option<Spanned<RawRetry>>,
    #[serde(default)]
    pub(super) count: BTreeMap<String, Spanned<toml::Value>>,
    pub(super) count_timeout_ms: Option<u64>,
    pub(super) lock_ttl_ms: Option<u64>,
    #[serde(default)]
    pub(super) state_across_keys: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRequest {
    pub(super) method: Option<String>,
    pub(super) path: Option<String>,
    pub(super) key_header: Option<String>,
    pub(super) key: Option<String>,
    #[serde(default)]
    pub(super) headers: BTreeMap<String, String>,
    pub(super) body: Option<toml::Value>,
    pub(super) raw: Option<String>,
    pub(super) content_type: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawScope {
    pub(super) name: String,
    pub(super) value: Option<String>,
    #[serde(default)]
    pub(super) headers: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRule {
    pub(super) status: Option<toml::Value>,
    pub(super) header: Option<String>,
    pub(super) header_value: Option<String>,
    pub(super) header_regex: Option<String>,
    pub(super) pointer: Option<String>,
    pub(super) equals: Option<toml::Value>,
    pub(super) body_regex: Option<String>,
    pub(super) outcome: AnswerKind,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawId {
    pub(super) pointer: Option<String>,
    pub(super) header: Option<String>,
    pub(super) regex: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReplay {
    pub(super) marked: Option<bool>,
    #[serde(default)]
    pub(super) same_answer: bool,
    #[serde(default)]
    pub(super) ignore: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRetry {
    pub(super) attempts: Option<u32>,
    pub(super) backoff_ms: Option<u64>,
    pub(super) max_backoff_ms: Option<u64>,
    #[serde(default)]
    pub(super) statuses: Vec<u16>,
    pub(super) transport_errors: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRacer {
    pub(super) name: String,
    pub(super) count: Option<usize>,
    pub(super) scope: Option<String>,
    pub(super) key: Option<String>,
    pub(super) body: Option<toml::Value>,
    pub(super) raw: Option<String>,
    pub(super) via: Option<String>,
    pub(super) wave: Option<u32>,
    pub(super) expect: Option<RawKinds>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(super) enum RawKinds {
    One(AnswerKind),
    Many(Vec<AnswerKind>),
}

impl RawKinds {
    pub(super) fn set(&self) -> BTreeSet<AnswerKind> {
        match self {
            RawKinds::One(k) => [*k].into(),
            RawKinds::Many(v) => v.iter().copied().collect(),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawExpect {
    #[serde(default)]
    pub(super) outcomes: BTreeMap<String, Spanned<RawKinds>>,
    #[serde(default)]
    pub(super) counts: Vec<Spanned<RawCounts>>,
    pub(super) model: Option<Spanned<bool>>,
    pub(super) settle_ms: Option<Spanned<u64>>,
    #[serde(default)]
    pub(super) settle_after: Vec<u32>,
}

#[derive(Debug, Deserialize)]
pub(super) struct RawCounts {
    pub(super) scope: Option<String>,
    pub(super) key: Option<String>,
    #[serde(flatten)]
    pub(super) values: BTreeMap<String, toml::Value>,
}

pub(super) fn default_ready_path() -> String {
    "/healthz".into()
}
pub(super) fn default_ready_timeout_ms() -> u64 {
    20_000
}

/// Racer names in the file → the expanded racers' names.
pub(super) type Groups = BTreeMap<String, Vec<String>>;
