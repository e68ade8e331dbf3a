//! Request fingerprint: canonical JSON plus SHA-256 (docs/PROTOCOL.md §2).
//!
//! The canonical text is byte-for-byte what Python's
//! `json.dumps(obj, sort_keys=True, separators=(",", ":"))` produces with its default
//! `ensure_ascii=True`, so a Rust service and a Python one can share one receipts
//! table (docs/PROTOCOL.md §2.4). The golden cases live in `tests/data/fingerprints.json`.
//!
//! The JSON writer is [`crate::canonical`], which also renders outbox payloads: one escaper
//! in the crate (re-exported here as [`canonical_json`] and [`write_json_string`]).

pub use crate::canonical::{canonical_json, sha256_hex, write_json_string};
use crate::domain::TicketRequest;

/// A request fingerprint: the canonical text and its SHA-256.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint {
    /// Canonical JSON of `actor_id`, `body`, `priority`, `title` (sorted keys, no spaces,
    /// ASCII-only). It contains the body: never log it.
    pub canonical: String,
    /// SHA-256 of `canonical`'s UTF-8 bytes, lower-case hex, 64 characters.
    pub hash: String,
}

impl Fingerprint {
    /// Fingerprints a request. Infallible: any four strings have a canonical form.
    pub fn of(request: &TicketRequest) -> Self {
        let canonical = canonical_request(request);
        let hash = sha256_hex(canonical.as_bytes());
        Fingerprint { canonical, hash }
    }
}

/// The canonical JSON text of a request's four fingerprinted fields, keys in the fixed
/// sorted order `actor_id`, `body`, `priority`, `title`.
pub fn canonical_request(request: &TicketRequest) -> String {
    let values = [
        &request.actor_id,
        &request.body,
        &request.priority,
        &request.title,
    ];
    let keys: usize = REQUEST_KEYS.iter().map(|k| k.len()).sum();
    // The values' bytes (more if some need escapes), their quotes, the keys and the `}`.
    let mut out =
        String::with_capacity(keys + 1 + values.iter().map(|v| v.len() + 2).sum::<usize>());
    for (key, value) in REQUEST_KEYS.iter().zip(values) {
        out.push_str(key);
        write_json_string(&mut out, value);
    }
    out.push('}');
    out
}

/// What precedes each value of [`canonical_request`]: `{` or `,`, the key as a JSON string,
/// `:`. The order IS the sorted key order; a test checks it against a sort and the escaper.
const REQUEST_KEYS: [&str; 4] = [
    "{\"actor_id\":",
    ",\"body\":",
    ",\"priority\":",
    ",\"title\":",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn request(actor: &str, title: &str, body: &str, priority: &str) -> TicketRequest {
        TicketRequest {
            actor_id: actor.into(),
            title: title.into(),
            body: body.into(),
            priority: priority.into(),
        }
    }

    #[test]
    fn fixed_key_order_is_the_sorted_order() {
        let mut keys = ["actor_id", "body", "priority", "title"];
        let fixed = keys;
        keys.sort();
        assert_eq!(keys, fixed);
        for (i, (key, prefix)) in keys.iter().zip(REQUEST_KEYS).enumerate() {
            let mut expected = String::from(if i == 0 { "{" } else { "," });
            write_json_string(&mut expected, key);
            expected.push(':');
            assert_eq!(prefix, expected);
        }
    }

    #[test]
    fn the_escaper_matches_a_char_by_char_reference() {
        // The one-piece copy, the runs between escapes and every escape form, at the start,
        // middle and end of a value.
        fn reference(s: &str) -> String {
            let mut out = String::from('"');
            for ch in s.chars() {
                match ch {
                    '"' => out.push_str("\\\""),
                    '\\' => out.push_str("\\\\"),
                    '\n' => out.push_str("\\n"),
                    '\r' => out.push_str("\\r"),
                    '\t' => out.push_str("\\t"),
                    '\u{08}' => out.push_str("\\b"),
                    '\u{0c}' => out.push_str("\\f"),
                    ' '..='~' => out.push(ch),
                    _ => {
                        let mut units = [0u16; 2];
                        for unit in ch.encode_utf16(&mut units) {
                            out.push_str(&format!("\\u{unit:04x}"));
                        }
                    }
                }
            }
            out.push('"');
            out
        }
        let pieces = [
            "",
            "a",
            "plain text",
            "\"",
            "\\",
            "\n",
            "\r",
            "\t",
            "\u{8}",
            "\u{c}",
            "\u{0}",
            "\u{1f}",
            "\u{7f}",
            "\u{80}",
            "é",
            "€",
            "😀",
            "/",
            "~",
            " ",
        ];
        for a in pieces {
            for b in pieces {
                for c in ["", "x", "é"] {
                    let s = format!("{c}{a}{c}{b}{c}");
                    let mut out = String::new();
                    write_json_string(&mut out, &s);
                    assert_eq!(out, reference(&s), "{s:?}");
                }
            }
        }
    }

    #[test]
    fn escapes_follow_python_ensure_ascii() {
        let mut out = String::new();
        write_json_string(&mut out, "a\"\\/\n\r\t\u{8}\u{c}\u{1}\u{7f}é😀");
        assert_eq!(out, r#""a\"\\/\n\r\t\b\f\u0001\u007f\u00e9\ud83d\ude00""#);
    }

    #[test]
    fn canonical_json_sorts_keys_whatever_the_map_order() {
        let value = serde_json::json!({"b": 1, "a": {"d": [true, null], "c": "x"}});
        assert_eq!(
            canonical_json(&value),
            r#"{"a":{"c":"x","d":[true,null]},"b":1}"#
        );
    }

    #[test]
    fn one_changed_field_changes_the_hash() {
        let base = Fingerprint::of(&request("u1", "x", "y", "high"));
        for other in [
            request("u2", "x", "y", "high"),
            request("u1", "x2", "y", "high"),
            request("u1", "x", "y ", "high"),
            request("u1", "x", "y", "low"),
            request("u1", "y", "x", "high"),
        ] {
            assert_ne!(Fingerprint::of(&other).hash, base.hash);
        }
    }
}
