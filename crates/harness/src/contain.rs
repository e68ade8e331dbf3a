//! What the tool writes of text it does not own: secrets masked, control characters escaped,
//! a target's text made inert in Markdown.
//!
//! - Secrets: every value a black-box scenario file takes from the environment (`${NAME}`,
//!   [`crate::blackbox::template::expand_env`]) is registered when the file is loaded
//!   ([`register_secret`]) and replaced by `${NAME}` wherever the tool writes it ([`mask`]):
//!   the terminal, `--json`, report.json, REPORT.md and its details, the JUnit XML. The value
//!   is masked as it is, percent-encoded (a path or query) and JSON-escaped (an echo inside a
//!   JSON body). A value of fewer than [`SHORT_SECRET`] characters is masked only where it
//!   stands alone (no letter or digit on either side), so a one-letter value does not eat every
//!   word; an empty value is never masked (there is nothing to hide).
//! - Control characters: C0 (but newline and tab in our own multi-line text), DEL, C1 and the
//!   Unicode bidirectional controls are written as `\u{1b}` ([`escape_controls`]), so a target's
//!   ESC, BEL or CR cannot clear, retitle, recolour or rewrite a terminal or a report, and a
//!   right-to-left override cannot reorder what is shown. JSON output keeps them as JSON
//!   escapes (`\u001b`, `\u202e`: [`json`]), so a parser reads the value the target sent.
//! - Markdown: a target's text (body excerpts, headers, error text) is written as inline code
//!   whose fence is longer than any backtick run inside ([`code`]), so `<script>` or
//!   `[x](javascript:…)` is shown, never rendered as HTML or a link.

use std::borrow::Cow;
use std::sync::RwLock;

/// Secrets shorter than this (in characters) are masked only where they stand alone.
pub const SHORT_SECRET: usize = 4;

/// A registered secret: what it is replaced by, and the forms it is searched in.
struct Secret {
    /// `${NAME}`.
    label: String,
    /// The value, percent-encoded and JSON-escaped (each once, duplicates dropped).
    forms: Vec<String>,
}

static SECRETS: RwLock<Vec<Secret>> = RwLock::new(Vec::new());

/// Remembers that the environment variable `name` holds a secret `value`, to be masked as
/// `${name}` in everything written from now on (process-wide). An empty value is ignored;
/// registering the same pair again changes nothing.
pub fn register_secret(name: &str, value: &str) {
    if value.is_empty() {
        return;
    }
    let label = format!("${{{name}}}");
    let mut forms = vec![value.to_string()];
    for form in [percent_encoded(value), json_escaped(value)] {
        if !forms.contains(&form) {
            forms.push(form);
        }
    }
    let mut secrets = SECRETS.write().unwrap_or_else(|e| e.into_inner());
    if secrets
        .iter()
        .any(|s| s.label == label && s.forms[0] == value)
    {
        return;
    }
    secrets.push(Secret { label, forms });
}

/// Every byte but RFC 3986's unreserved characters as `%XX` (upper-case hex).
fn percent_encoded(value: &str) -> String {
    value
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The value as it stands inside a JSON string (serde_json's escapes, without the quotes).
fn json_escaped(value: &str) -> String {
    let quoted = serde_json::to_string(value).expect("a string serialises");
    quoted[1..quoted.len() - 1].to_string()
}

/// `text` with every registered secret replaced by `${NAME}` (see the module's rules).
pub fn mask(text: &str) -> Cow<'_, str> {
    let secrets = SECRETS.read().unwrap_or_else(|e| e.into_inner());
    mask_with(text, &secrets)
}

fn mask_with<'t>(text: &'t str, secrets: &[Secret]) -> Cow<'t, str> {
    if secrets.is_empty() || text.is_empty() {
        return Cow::Borrowed(text);
    }
    // Longest form first, so a secret that contains another is masked whole; one pass, so a
    // replacement is never searched again.
    let mut forms: Vec<(&str, &str)> = secrets
        .iter()
        .flat_map(|s| s.forms.iter().map(move |f| (f.as_str(), s.label.as_str())))
        .collect();
    forms.sort_by_key(|(f, _)| std::cmp::Reverse(f.len()));
    let alone = |i: usize, len: usize| {
        let before = text[..i].chars().next_back();
        let after = text[i + len..].chars().next();
        !before.is_some_and(char::is_alphanumeric) && !after.is_some_and(char::is_alphanumeric)
    };
    let mut out = String::new();
    let mut copied = 0;
    let mut i = 0;
    while i < text.len() {
        let hit = forms.iter().find(|(f, _)| {
            text[i..].starts_with(f) && (f.chars().count() >= SHORT_SECRET || alone(i, f.len()))
        });
        match hit {
            Some((f, label)) => {
                out.push_str(&text[copied..i]);
                out.push_str(label);
                i += f.len();
                copied = i;
            }
            None => i += text[i..].chars().next().map_or(1, char::len_utf8),
        }
    }
    if copied == 0 {
        return Cow::Borrowed(text);
    }
    out.push_str(&text[copied..]);
    Cow::Owned(out)
}

/// Whether `c` must not reach a terminal or a report as it is: C0 and C1 controls, DEL, and
/// the Unicode bidirectional formatting characters (U+061C, U+200E, U+200F, U+202A–U+202E,
/// U+2066–U+2069).
pub fn is_hazard(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

/// `text` with every [`is_hazard`] character but those in `keep` written as `\u{XX}` (its
/// code point in lower-case hex, as Rust writes it).
pub fn escape_controls<'t>(text: &'t str, keep: &[char]) -> Cow<'t, str> {
    if !text.chars().any(|c| is_hazard(c) && !keep.contains(&c)) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if is_hazard(c) && !keep.contains(&c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Text for a terminal (stdout, stderr): secrets masked, control characters escaped but
/// newline and tab.
pub fn terminal(text: &str) -> String {
    escape_controls(&mask(text), &['\n', '\t']).into_owned()
}

/// A whole Markdown (or other text) document as written to a file: secrets masked, control
/// characters escaped but newline and tab. The target's text in it should already be code
/// ([`code`]); this is what keeps a byte that got past that inert.
pub fn document(text: &str) -> String {
    terminal(text)
}

/// JSON text (compact or pretty, as serde_json writes it) with every string value — not the
/// member names, which are the tool's — masked, and DEL, C1 and bidi characters written as
/// JSON escapes (`\u202e`); serde_json already escapes C0. The JSON still parses to the same
/// structure.
pub fn json(text: &str) -> String {
    let secrets = SECRETS.read().unwrap_or_else(|e| e.into_inner());
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find('"') {
        out.push_str(&rest[..start]);
        let body = &rest[start + 1..];
        // The closing quote: the first one not escaped by a backslash.
        let mut end = body.len();
        let mut escaped = false;
        for (i, c) in body.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => {
                    end = i;
                    break;
                }
                _ => {}
            }
        }
        let string = &body[..end];
        let after = body.get(end + 1..).unwrap_or("");
        let is_name = after.trim_start().starts_with(':');
        out.push('"');
        let masked = if is_name {
            Cow::Borrowed(string)
        } else {
            mask_with(string, &secrets)
        };
        for c in masked.chars() {
            if is_hazard(c) {
                out.push_str(&format!("\\u{:04x}", c as u32));
            } else {
                out.push(c);
            }
        }
        if end < body.len() {
            out.push('"');
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

/// `text` as one Markdown inline code span: secrets masked, control characters escaped (a
/// newline too: a span is one line), `|` written `\|` so it stays inside a table cell (GFM
/// reads `\|` as `|` there, in code too), fenced by one backtick more than its longest
/// backtick run, so nothing inside is read as HTML, a link or emphasis. Text that begins or
/// ends with a backtick, or with a space at both ends, is padded with a space each side
/// (CommonMark strips one). Empty text is `` ` ` ``.
pub fn code(text: &str) -> String {
    let text = mask(text);
    let text = escape_controls(&text, &[]).replace('|', "\\|");
    let longest = text.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest + 1);
    if text.is_empty() {
        return "` `".into();
    }
    let pad = text.starts_with('`')
        || text.ends_with('`')
        || (text.starts_with(' ') && text.ends_with(' '));
    let pad = if pad { " " } else { "" };
    format!("{fence}{pad}{text}{pad}{fence}")
}

/// The fence for a fenced code block holding `text`: backticks, at least three and one more
/// than the longest run of backticks inside, so the content cannot close it.
pub fn block_fence(text: &str) -> String {
    let longest = text.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    "`".repeat((longest + 1).max(3))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets(pairs: &[(&str, &str)]) -> Vec<Secret> {
        pairs
            .iter()
            .map(|(n, v)| Secret {
                label: format!("${{{n}}}"),
                forms: vec![v.to_string(), percent_encoded(v), json_escaped(v)],
            })
            .collect()
    }

    #[test]
    fn secrets_are_masked_raw_percent_encoded_and_json_escaped() {
        let s = secrets(&[("K", "a b\"c/d")]);
        assert_eq!(mask_with("x a b\"c/d y", &s), "x ${K} y");
        assert_eq!(mask_with("?k=a%20b%22c%2Fd&", &s), "?k=${K}&");
        assert_eq!(mask_with(r#"{"e":"a b\"c/d"}"#, &s), r#"{"e":"${K}"}"#);
        assert!(matches!(mask_with("nothing", &s), Cow::Borrowed(_)));
    }

    #[test]
    fn the_longest_secret_wins_and_replacements_are_not_searched_again() {
        let s = secrets(&[("A", "token"), ("B", "token-long"), ("C", "K")]);
        assert_eq!(mask_with("token-long token", &s), "${B} ${A}");
        // `K` stands alone in `${A}`'s braces, but the replacement is not searched again.
        assert_eq!(mask_with("token K", &s), "${A} ${C}");
    }

    #[test]
    fn short_secrets_are_masked_where_they_stand_alone() {
        let s = secrets(&[("V", "42")]);
        assert_eq!(mask_with("/v42/orders?n=42", &s), "/v42/orders?n=${V}");
        assert_eq!(mask_with("1420 42", &s), "1420 ${V}");
        let one = secrets(&[("S", "S")]);
        assert_eq!(mask_with("PASS S", &one), "PASS ${S}");
    }

    #[test]
    fn control_and_bidi_characters_are_escaped() {
        assert_eq!(
            escape_controls("a\u{1b}[2J\u{7}\r\n\u{202e}\u{9b}", &['\n']),
            "a\\u{1b}[2J\\u{7}\\u{d}\n\\u{202e}\\u{9b}"
        );
        assert!(matches!(escape_controls("plain é", &[]), Cow::Borrowed(_)));
    }

    #[test]
    fn json_strings_are_masked_and_escaped_and_member_names_kept() {
        register_secret("TF_CONTAIN_UNIT", "unit-secret-value");
        let value = serde_json::json!({
            "unit-secret-value": "x unit-secret-value \u{1b}\u{202e}\u{9b} \"q\"",
            "n": [1, "unit-secret-value"],
        });
        for text in [
            serde_json::to_string(&value).unwrap(),
            serde_json::to_string_pretty(&value).unwrap(),
        ] {
            let out = json(&text);
            assert!(
                !out.contains('\u{202e}') && !out.contains('\u{9b}'),
                "{out}"
            );
            let back: serde_json::Value = serde_json::from_str(&out).unwrap();
            assert_eq!(
                back,
                serde_json::json!({
                    "unit-secret-value": "x ${TF_CONTAIN_UNIT} \u{1b}\u{202e}\u{9b} \"q\"",
                    "n": [1, "${TF_CONTAIN_UNIT}"],
                })
            );
        }
    }

    #[test]
    fn code_spans_outrun_every_backtick_run_and_keep_table_cells() {
        assert_eq!(code("<script>"), "`<script>`");
        assert_eq!(code("a ``` b ` c"), "````a ``` b ` c````");
        assert_eq!(code("`tick` "), "`` `tick`  ``");
        assert_eq!(code("x|y\nz"), "`x\\|y\\u{a}z`");
        assert_eq!(code(""), "` `");
        assert_eq!(block_fence("no ticks"), "```");
        assert_eq!(block_fence("````"), "`````");
    }
}
