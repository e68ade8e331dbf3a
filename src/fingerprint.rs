//! Request fingerprint: canonical JSON plus SHA-256 (docs/PROTOCOL.md §2).
//!
//! The canonical text is byte-for-byte what Python's
//! `json.dumps(obj, sort_keys=True, separators=(",", ":"))` produces with its default
//! `ensure_ascii=True`, so a Rust service and a Python one can share one receipts
//! table (docs/PROTOCOL.md §2.4). The golden cases live in `tests/data/fingerprints.json`.
//!
//! The same JSON writer also renders outbox payloads ([`canonical_json`]), so there is one
//! escaper in the crate and its key order never depends on how a map was built (serde_json's
//! `preserve_order` feature, switched on by some other dependency, cannot change it).

use sha2::{Digest, Sha256};

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

/// Lower-case hex SHA-256 of `bytes` (64 characters).
pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut hex = [0u8; 64];
    for (pair, byte) in hex.chunks_exact_mut(2).zip(digest) {
        pair[0] = HEX[(byte >> 4) as usize];
        pair[1] = HEX[(byte & 0x0f) as usize];
    }
    std::str::from_utf8(&hex)
        .expect("hex digits are ASCII")
        .to_owned()
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Appends `s` as a JSON string literal using the canonical escaping of docs/PROTOCOL.md §2.2:
/// `"` and `\` escaped; `\n \r \t \b \f` short forms; other C0 controls and U+007F as
/// `\u00xx` (lower-case hex); every non-ASCII character as `\uXXXX`, with UTF-16 surrogate
/// pairs above U+FFFF; `/` left alone.
pub fn write_json_string(out: &mut String, s: &str) {
    out.reserve(s.len() + 2);
    out.push('"');
    let bytes = s.as_bytes();
    // Most values need no escape at all: one pass without an early exit (the compiler can
    // vectorize it) decides, and the text is copied in one piece.
    if bytes.iter().fold(true, |plain, &b| plain & is_plain(b)) {
        out.push_str(s);
        out.push('"');
        return;
    }
    // Printable ASCII other than `"` and `\` is copied as it is, a run at a time; `run` is
    // where the pending run starts, `i` the byte looked at (always a character boundary).
    let (mut run, mut i) = (0, 0);
    while i < bytes.len() {
        let b = bytes[i];
        if is_plain(b) {
            i += 1;
            continue;
        }
        out.push_str(&s[run..i]);
        if b.is_ascii() {
            match b {
                b'"' => out.push_str("\\\""),
                b'\\' => out.push_str("\\\\"),
                b'\n' => out.push_str("\\n"),
                b'\r' => out.push_str("\\r"),
                b'\t' => out.push_str("\\t"),
                0x08 => out.push_str("\\b"),
                0x0c => out.push_str("\\f"),
                _ => push_u_escape(out, u16::from(b)),
            }
            i += 1;
        } else {
            let ch = s[i..].chars().next().expect("a character starts here");
            let mut units = [0u16; 2];
            for unit in ch.encode_utf16(&mut units) {
                push_u_escape(out, *unit);
            }
            i += ch.len_utf8();
        }
        run = i;
    }
    out.push_str(&s[run..]);
    out.push('"');
}

/// Printable ASCII other than `"` and `\`: written as it is.
fn is_plain(b: u8) -> bool {
    (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\'
}

fn push_u_escape(out: &mut String, unit: u16) {
    out.push_str("\\u");
    for shift in [12, 8, 4, 0] {
        out.push(HEX[((unit >> shift) & 0x0f) as usize] as char);
    }
}

/// Renders a JSON value canonically: object keys sorted by code point (Python's `sort_keys`
/// order), `,` and `:` separators without spaces, strings escaped as in
/// [`write_json_string`]. Numbers are written as serde_json writes them.
pub fn canonical_json(value: &serde_json::Value) -> String {
    let mut out = String::new();
    write_value(&mut out, value);
    out
}

fn write_value(out: &mut String, value: &serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(s) => write_json_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => {
            // Sort explicitly: the map's own iteration order depends on serde_json features.
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_json_string(out, key);
                out.push(':');
                write_value(out, item);
            }
            out.push('}');
        }
    }
}

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
