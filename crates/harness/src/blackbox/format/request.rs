//! The request a racer sends, built from the file's templates: checked at load (with a
//! sample run id and base URL) and sent by the run.

use super::{BodyTemplate, TargetRacer, TargetScenario};
use crate::blackbox::client::HttpRequest;
use crate::blackbox::template::{self, Vars};
use ticketflow_core::fingerprint::sha256_hex;

/// Racers' requests, built from the templates.
pub(crate) struct Built {
    /// The request, every placeholder filled.
    pub(crate) request: HttpRequest,
    /// The key sent.
    pub(crate) wire_key: String,
    /// SHA-256 (hex) of the body sent.
    pub(crate) body_sha256: String,
    /// SHA-256 (hex) of the body's intent: [`intent_sha256`].
    pub(crate) intent_sha256: String,
}

/// SHA-256 (hex) of what a body means as an intent: of its canonical JSON (members sorted,
/// insignificant whitespace gone, as the fingerprint of docs/PROTOCOL.md §2 sees it) when the
/// bytes are JSON, else of the bytes. Two bodies that differ only in member order or spacing
/// are one intent.
pub(crate) fn intent_sha256(body: &[u8]) -> String {
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(value) => sha256_hex(ticketflow_core::canonical::canonical_json(&value).as_bytes()),
        Err(_) => sha256_hex(body),
    }
}

/// The placeholders' values for `racer` in run `run_id`.
pub(crate) fn vars_for(scenario: &TargetScenario, racer: &TargetRacer, run_id: &str) -> Vars {
    let t = &scenario.target;
    let mut vars: Vars = [
        ("run", run_id.to_string()),
        ("racer", racer.name.clone()),
        ("n", racer.n.to_string()),
    ]
    .into();
    if let Some(scope) = racer
        .scope
        .as_ref()
        .and_then(|s| t.scopes.iter().find(|x| &x.name == s))
    {
        let value = template::expand(&scope.value, &vars);
        vars.insert("scope", value);
    }
    vars.insert("key", racer.key.clone());
    vars.insert(
        "uuid",
        template::uuid_for(run_id, racer.scope.as_deref().unwrap_or(""), &racer.key),
    );
    let wire_key = template::expand(&t.request.key, &vars);
    vars.insert("key", wire_key);
    vars
}

/// A run id of the shape a run's own has (`r` and 8 hex digits), for checking requests at load.
pub(crate) const SAMPLE_RUN_ID: &str = "r00000000";

/// The request `racer` sends to `base_url` in run `run_id`, every placeholder filled.
pub(crate) fn build_request(
    scenario: &TargetScenario,
    racer: &TargetRacer,
    base_url: &str,
    run_id: &str,
) -> HttpRequest {
    build(scenario, racer, base_url, run_id).request
}

/// The request `racer` sends to `base_url` in run `run_id`, with its wire key and body hash.
pub(crate) fn build(
    scenario: &TargetScenario,
    racer: &TargetRacer,
    base_url: &str,
    run_id: &str,
) -> Built {
    let t = &scenario.target;
    let vars = vars_for(scenario, racer, run_id);
    let mut headers: Vec<(String, String)> = Vec::new();
    let mut set = |name: &str, value: String| {
        headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        headers.push((name.to_string(), value));
    };
    for (n, v) in &t.request.headers {
        set(n, template::expand(v, &vars));
    }
    if let Some(scope) = racer
        .scope
        .as_ref()
        .and_then(|s| t.scopes.iter().find(|x| &x.name == s))
    {
        for (n, v) in &scope.headers {
            set(n, template::expand(v, &vars));
        }
    }
    set(&t.request.key_header, vars["key"].clone());
    let (body, content_type) = match scenario.body_of(racer) {
        BodyTemplate::Empty => (Vec::new(), None),
        BodyTemplate::Json(j) => (
            serde_json::to_vec(&template::expand_json(j, &vars)).expect("JSON values serialise"),
            Some("application/json".to_string()),
        ),
        BodyTemplate::Raw { text, content_type } => (
            template::expand(text, &vars).into_bytes(),
            Some(content_type.clone()),
        ),
    };
    let has_content_type = headers
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case("content-type"));
    if let (Some(ct), false) = (content_type, has_content_type) {
        headers.push(("Content-Type".into(), ct));
    }
    Built {
        request: HttpRequest {
            method: t.request.method.clone(),
            url: format!("{base_url}{}", template::expand(&t.request.path, &vars)),
            headers,
            body: body.clone(),
        },
        wire_key: vars["key"].clone(),
        body_sha256: sha256_hex(&body),
        intent_sha256: intent_sha256(&body),
    }
}
