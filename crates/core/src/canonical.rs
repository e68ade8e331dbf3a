//! Canonical JSON text: one escaper for the crate (docs/PROTOCOL.md §2.2).
//!
//! The text is byte-for-byte what Python's
//! `json.dumps(obj, sort_keys=True, separators=(",", ":"))` writes with its default
//! `ensure_ascii=True`. The request fingerprint ([`crate::fingerprint`]) and the outbox
//! payloads ([`crate::domain`]) are both written with it, so its key order never depends on
//! how a map was built (serde_json's `preserve_order` feature, switched on by some other
//! dependency, cannot change it). Depends on nothing else in the crate.

use sha2::{Digest, Sha256};

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
