//! Placeholders in black-box scenario templates.
//!
//! Two kinds, expanded at different times:
//! - `${NAME}`: an environment variable, expanded when the file is loaded, so secrets (an API
//!   token) stay out of scenario files. An unset variable is a load error.
//! - `{run}`, `{key}`, `{scope}`, `{racer}`, `{n}`, `{uuid}`: per run and racer, expanded
//!   when the request is built. `{{` and `}}` are literal braces.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::oracle::history::Form;

/// The per-request placeholders a template may use.
pub const PLACEHOLDERS: [&str; 6] = ["run", "key", "scope", "racer", "n", "uuid"];

/// A template problem, in words (the loader adds file and line).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// `${NAME}` names a variable that is not set (or not valid UTF-8).
    #[error("environment variable {0} is not set")]
    UnsetVariable(String),
    /// `${` without a closing `}`, or an empty name.
    #[error("malformed ${{…}} in {0:?}")]
    MalformedVariable(String),
    /// `{name}` is not one of [`PLACEHOLDERS`].
    #[error("unknown placeholder {{{name}}} in {text:?} (known: {{run}}, {{key}}, {{scope}}, {{racer}}, {{n}}, {{uuid}})")]
    UnknownPlaceholder {
        /// The placeholder's name.
        name: String,
        /// The template.
        text: String,
    },
    /// A `{` without its `}` (write `{{` for a literal brace).
    #[error("unclosed {{ in {0:?} (write {{{{ for a literal brace)")]
    Unclosed(String),
}

/// Expands `${NAME}` from `lookup` (normally `std::env::var`).
///
/// Will return `Err` for an unset variable or a malformed `${…}`.
pub fn expand_env(
    text: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<String, TemplateError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            return Err(TemplateError::MalformedVariable(text.to_string()));
        };
        let name = &after[..end];
        let valid = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(TemplateError::MalformedVariable(text.to_string()));
        }
        out.push_str(&lookup(name).ok_or_else(|| TemplateError::UnsetVariable(name.into()))?);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Checks that `text` uses only known placeholders and closes every brace.
///
/// Will return `Err` naming the first unknown placeholder or unclosed brace.
pub fn validate(text: &str) -> Result<(), TemplateError> {
    render(text, &|name| {
        PLACEHOLDERS
            .contains(&name)
            .then(String::new)
            .ok_or_else(|| TemplateError::UnknownPlaceholder {
                name: name.into(),
                text: text.into(),
            })
    })
    .map(|_| ())
}

/// Values for the per-request placeholders.
pub(crate) type Vars = BTreeMap<&'static str, String>;

/// Expands `{name}` from `vars`; a name not in `vars` expands to nothing (templates are
/// validated at load, so this only happens for a placeholder with no value in this context,
/// such as `{scope}` without scopes).
pub(crate) fn expand(text: &str, vars: &Vars) -> String {
    render(text, &|name| {
        Ok(vars.get(name).cloned().unwrap_or_default())
    })
    .unwrap_or_else(|_| text.to_string())
}

fn render(
    text: &str,
    value: &dyn Fn(&str) -> Result<String, TemplateError>,
) -> Result<String, TemplateError> {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            '{' if chars.peek().map(|p| p.1) == Some('{') => {
                chars.next();
                out.push('{');
            }
            '}' if chars.peek().map(|p| p.1) == Some('}') => {
                chars.next();
                out.push('}');
            }
            '{' => {
                let Some(len) = text[i + 1..].find('}') else {
                    return Err(TemplateError::Unclosed(text.to_string()));
                };
                let name = &text[i + 1..i + 1 + len];
                out.push_str(&value(name)?);
                // Skip the name and the closing brace.
                for _ in 0..name.chars().count() + 1 {
                    chars.next();
                }
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

/// Expands every string (member values, not member names) of a JSON template.
pub(crate) fn expand_json(value: &serde_json::Value, vars: &Vars) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::String(s) => Value::String(expand(s, vars)),
        Value::Array(a) => Value::Array(a.iter().map(|v| expand_json(v, vars)).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| (k.clone(), expand_json(v, vars)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Validates every string of a JSON template ([`validate`]).
///
/// Will return `Err` for the first bad string.
pub(crate) fn validate_json(value: &serde_json::Value) -> Result<(), TemplateError> {
    use serde_json::Value;
    match value {
        Value::String(s) => validate(s),
        Value::Array(a) => a.iter().try_for_each(validate_json),
        Value::Object(o) => o.values().try_for_each(validate_json),
        _ => Ok(()),
    }
}

/// Expands `${NAME}` in every string of a JSON template.
///
/// Will return `Err` for the first unset or malformed variable.
pub(crate) fn expand_env_json(
    value: &serde_json::Value,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<serde_json::Value, TemplateError> {
    use serde_json::Value;
    Ok(match value {
        Value::String(s) => Value::String(expand_env(s, lookup)?),
        Value::Array(a) => Value::Array(
            a.iter()
                .map(|v| expand_env_json(v, lookup))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| Ok((k.clone(), expand_env_json(v, lookup)?)))
                .collect::<Result<_, TemplateError>>()?,
        ),
        other => other.clone(),
    })
}

/// `value` (a JSON template) as a raw template whose expansion is that JSON written in
/// `form`: members in reverse order ([`Form::Reordered`]), one per line with a space after each
/// colon ([`Form::Respaced`]), or as they are, compact ([`Form::Plain`]). Structural braces are
/// doubled (`{{`, `}}`); each string member is kept as it was, so the placeholders in it
/// (`{run}`, `{key}`) expand as in a JSON body.
pub fn raw_text(value: &Value, form: Form) -> String {
    let mut out = String::new();
    write_value(value, form, 0, &mut out);
    out
}

fn write_value(value: &Value, form: Form, depth: usize, out: &mut String) {
    match value {
        Value::Object(members) => write_object(members, form, depth, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(item, form, depth + 1, out);
            }
            out.push(']');
        }
        // A string member is a template as it stands: its braces keep their meaning.
        Value::String(s) => out.push_str(&Value::String(s.clone()).to_string()),
        other => out.push_str(&other.to_string()),
    }
}

fn write_object(
    members: &serde_json::Map<String, Value>,
    form: Form,
    depth: usize,
    out: &mut String,
) {
    let mut list: Vec<(&String, &Value)> = members.iter().collect();
    if form == Form::Reordered {
        list.reverse();
    }
    let pad = "  ".repeat(depth + 1);
    out.push_str("{{");
    for (i, (name, v)) in list.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        if form == Form::Respaced {
            out.push('\n');
            out.push_str(&pad);
        }
        // Member names are literal text: their braces are doubled too.
        let name = Value::String(name.clone())
            .to_string()
            .replace('{', "{{")
            .replace('}', "}}");
        out.push_str(&name);
        out.push_str(if form == Form::Respaced { ": " } else { ":" });
        write_value(v, form, depth + 1, out);
    }
    if form == Form::Respaced {
        out.push('\n');
        out.push_str(&"  ".repeat(depth));
    }
    out.push_str("}}");
}

/// `{uuid}`: a version 4 UUID (RFC 9562 §5.4: version nibble 4, variant bits `10`) whose
/// random bits are the first 122 bits of SHA-256 over `run`, `scope` and the logical `key`,
/// each ended by a zero byte. One per scope and key per run: every racer and retry of that key
/// sends the same one, another run or key another (for services that take UUID keys only).
pub fn uuid_for(run: &str, scope: &str, key: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for part in [run, scope, key] {
        h.update(part.as_bytes());
        h.update([0u8]);
    }
    let d = h.finalize();
    let mut b = [0u8; 16];
    b.copy_from_slice(&d[..16]);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    uuid::Uuid::from_bytes(b).hyphenated().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uuid_is_a_v4_uuid_per_run_scope_and_key() {
        let u = uuid_for("r1", "A", "k1");
        let parsed = uuid::Uuid::parse_str(&u).expect("a UUID");
        assert_eq!(parsed.get_version_num(), 4);
        assert_eq!(parsed.get_variant(), uuid::Variant::RFC4122);
        assert_eq!(u, uuid_for("r1", "A", "k1"), "stable across retries");
        for other in [
            uuid_for("r2", "A", "k1"),
            uuid_for("r1", "B", "k1"),
            uuid_for("r1", "A", "k2"),
            uuid_for("r1", "Ak", "1"),
        ] {
            assert_ne!(u, other);
        }
    }

    fn vars() -> Vars {
        [("run", "r1".to_string()), ("key", "k".to_string())].into()
    }

    #[test]
    fn placeholders_expand_and_double_braces_are_literal() {
        assert_eq!(expand("{run}-{key}", &vars()), "r1-k");
        assert_eq!(expand("{{run}} {run}", &vars()), "{run} r1");
        assert_eq!(expand("é{key}ü", &vars()), "ékü");
    }

    #[test]
    fn unknown_and_unclosed_placeholders_are_errors() {
        assert!(matches!(
            validate("{bogus}"),
            Err(TemplateError::UnknownPlaceholder { .. })
        ));
        assert!(matches!(validate("{run"), Err(TemplateError::Unclosed(_))));
        assert!(validate("{run}{n}{racer}{scope}{key}").is_ok());
    }

    #[test]
    fn environment_variables_expand_or_fail() {
        let lookup = |n: &str| (n == "TOKEN").then(|| "s3cret".to_string());
        assert_eq!(
            expand_env("Bearer ${TOKEN}", &lookup).unwrap(),
            "Bearer s3cret"
        );
        assert_eq!(
            expand_env("${MISSING}", &lookup),
            Err(TemplateError::UnsetVariable("MISSING".into()))
        );
        assert!(matches!(
            expand_env("${", &lookup),
            Err(TemplateError::MalformedVariable(_))
        ));
    }

    #[test]
    fn json_templates_expand_string_values_only() {
        let t = serde_json::json!({"{key}": "{run}", "n": [1, "{key}"]});
        assert_eq!(
            expand_json(&t, &vars()),
            serde_json::json!({"{key}": "r1", "n": [1, "k"]})
        );
    }
}
