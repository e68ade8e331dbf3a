//! Fingerprint properties over generated strings that include astral characters, control
//! characters, quotes and backslashes:
//!
//! 1. equal fields give an equal hash however the request value was built (a struct, or JSON
//!    with keys in another order, pretty-printed);
//! 2. changing any one character of any field gives another hash;
//! 3. the canonical text parses back to the same four fields;
//! 4. the canonical text equals that of a second, independently written canonicalizer
//!    ([`independent_canonical`]).

use proptest::prelude::*;

use super::{CheckFailure, Implementation, SuiteConfig, SuiteResult};
use ticketflow_core::domain::TicketRequest;
use ticketflow_core::fingerprint::{sha256_hex, Fingerprint};

/// Cases when `PROPTEST_CASES` is not set.
pub const DEFAULT_CASES: u32 = 512;

/// A second canonicalizer, written differently on purpose: serde_json's compact writer over a
/// sorted map (it escapes `"`, `\` and C0 controls as Python does), then every non-ASCII
/// character and U+007F rewritten as `\uXXXX` UTF-16 units.
pub fn independent_canonical(request: &TicketRequest) -> String {
    let map: std::collections::BTreeMap<&str, &str> = [
        ("title", request.title.as_str()),
        ("priority", request.priority.as_str()),
        ("body", request.body.as_str()),
        ("actor_id", request.actor_id.as_str()),
    ]
    .into_iter()
    .collect();
    let compact = serde_json::to_string(&map).expect("strings serialize");
    let mut out = String::with_capacity(compact.len());
    for c in compact.chars() {
        if c.is_ascii() && c != '\u{7f}' {
            out.push(c);
        } else {
            let mut buf = [0u16; 2];
            for unit in c.encode_utf16(&mut buf) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}

fn field() -> impl Strategy<Value = String> {
    let tricky = prop_oneof![
        Just('"'),
        Just('\\'),
        Just('/'),
        Just('\u{0}'),
        Just('\u{1f}'),
        Just('\u{7f}'),
        Just('\u{80}'),
        Just('\u{2028}'),
        Just('\u{feff}'),
        Just('\u{1f600}'),
        Just('\u{10ffff}'),
        Just('\n'),
        Just('\t'),
        Just('\u{8}'),
        Just('\u{c}'),
    ];
    proptest::collection::vec(
        prop_oneof![3 => any::<char>(), 2 => tricky, 3 => proptest::char::range('a', 'z')],
        0..24,
    )
    .prop_map(|cs| cs.into_iter().collect())
}

/// A generated request and a one-character edit of it (field index, char index, new char).
fn case() -> impl Strategy<Value = (TicketRequest, usize, usize, char)> {
    (
        field(),
        field(),
        field(),
        field(),
        0..4usize,
        any::<usize>(),
        any::<char>(),
    )
        .prop_map(|(actor_id, title, body, priority, f, i, c)| {
            (
                TicketRequest {
                    actor_id,
                    title,
                    body,
                    priority,
                },
                f,
                i,
                c,
            )
        })
}

fn check(
    request: &TicketRequest,
    field: usize,
    index: usize,
    replacement: char,
) -> Result<(), CheckFailure> {
    let fp = Fingerprint::of(request);
    // 1. Built another way: JSON with keys in another order, pretty-printed, parsed back.
    let pretty = serde_json::to_string_pretty(&serde_json::json!({
        "title": request.title, "priority": request.priority,
        "body": request.body, "actor_id": request.actor_id,
    }))?;
    let rebuilt: TicketRequest = serde_json::from_str(&pretty)?;
    if Fingerprint::of(&rebuilt).hash != fp.hash {
        return Err(CheckFailure::Violated(
            "same fields built from reordered JSON hash differently".into(),
        ));
    }
    // 3. The canonical text parses back to the same four fields.
    let parsed: TicketRequest = serde_json::from_str(&fp.canonical)
        .map_err(|e| CheckFailure::Violated(format!("canonical text does not parse: {e}")))?;
    if &parsed != request {
        return Err(CheckFailure::Violated(format!(
            "canonical text parses to {parsed:?}"
        )));
    }
    // 4. A second canonicalizer agrees byte for byte.
    let other = independent_canonical(request);
    if other != fp.canonical || sha256_hex(other.as_bytes()) != fp.hash {
        return Err(CheckFailure::Violated(format!(
            "canonicalizers disagree:\n ours   {}\n theirs {other}",
            fp.canonical
        )));
    }
    // 2. One character changed in one field: another hash.
    let mut edited = request.clone();
    let target = [
        &mut edited.actor_id,
        &mut edited.title,
        &mut edited.body,
        &mut edited.priority,
    ]
    .into_iter()
    .nth(field)
    .expect("four fields");
    let mut chars: Vec<char> = target.chars().collect();
    if chars.is_empty() {
        chars.push(replacement);
    } else {
        let i = index % chars.len();
        if chars[i] == replacement {
            return Ok(()); // not a change
        }
        chars[i] = replacement;
    }
    *target = chars.into_iter().collect();
    if Fingerprint::of(&edited).hash == fp.hash {
        return Err(CheckFailure::Violated(format!(
            "one-character edit {edited:?} kept the hash"
        )));
    }
    Ok(())
}

/// Runs the suite (no database).
pub fn run(config: &SuiteConfig) -> SuiteResult {
    let mut runner = config.runner();
    let result = runner.run(
        &case(),
        config.fused(|(r, f, i, c)| {
            check(&r, f, i, c).map_err(|e| TestCaseError::fail(e.to_string()))
        }),
    );
    SuiteResult::from_run(
        "fingerprint",
        None,
        Implementation::default(),
        config,
        result,
    )
}
