//! The bodies of a history's requests, made from the check file's request body.
//!
//! Variant 0 is the request's body as the file gives it; variant `v > 0` is that body with one
//! value changed (members in name order: the first string member gets ` (body v+1)` appended, else the first number
//! member is increased by `v`, else a member `tfv_variant = v` is added): another intent the
//! service must fingerprint as another body. Each valid variant is sent in one of three forms
//! ([`Form`]), all the same intent once canonicalised. The invalid body is the file's
//! `[check] invalid_body`.
//!
//! A form other than [`Form::Plain`] is sent as a raw template (the members' order and spacing
//! are the point of it), written by [`crate::blackbox::template::raw_text`].

use serde_json::Value;

use crate::blackbox::format::BodyTemplate;
use crate::oracle::history::{Body, Form};

/// The JSON value of variant `variant` of `base` (see the module docs for how it differs).
pub fn variant_value(base: &Value, variant: usize) -> Value {
    if variant == 0 {
        return base.clone();
    }
    let Value::Object(members) = base else {
        // Not an object: the variant wraps it, which no service would take for the base.
        return serde_json::json!({ "tfv_variant": variant, "value": base });
    };
    let mut members = members.clone();
    if let Some((_, Value::String(s))) = members.iter_mut().find(|(_, v)| v.is_string()) {
        s.push_str(&format!(" (body {})", variant + 1));
    } else if let Some((_, n)) = members.iter_mut().find(|(_, v)| v.is_number()) {
        let next = n.as_i64().map(|i| i + variant as i64);
        *n = match next {
            Some(i) => Value::from(i),
            None => Value::from(n.as_f64().unwrap_or(0.0) + variant as f64),
        };
    } else {
        members.insert("tfv_variant".into(), Value::from(variant));
    }
    Value::Object(members)
}

/// The body template a request with `body` sends, given the file's request body `base` (a JSON
/// template) and its invalid body.
///
/// `None` when `body` is [`Body::Invalid`] and the file gives no invalid body.
pub fn template_of(base: &Value, invalid: Option<&Value>, body: Body) -> Option<BodyTemplate> {
    match body {
        Body::Invalid => invalid.map(|v| BodyTemplate::Json(v.clone())),
        Body::Valid { variant, form } => {
            let value = variant_value(base, variant);
            Some(match form {
                Form::Plain => BodyTemplate::Json(value),
                _ => BodyTemplate::Raw {
                    text: crate::blackbox::template::raw_text(&value, form),
                    content_type: "application/json".into(),
                },
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blackbox::template;
    use serde_json::json;

    #[test]
    fn every_form_of_a_variant_is_the_same_json_and_variants_differ() {
        let base = json!({"item": "book {key}", "quantity": 1, "tags": ["a", {"x": 1}]});
        let vars = [("key", "k1".to_string())].into();
        let plain = template::expand_json(&base, &vars);
        for form in [Form::Reordered, Form::Respaced] {
            let text = template::expand(&template::raw_text(&base, form), &vars);
            let parsed: Value = serde_json::from_str(&text).expect("valid JSON");
            assert_eq!(parsed, plain, "{form:?}: {text}");
            assert_ne!(text, plain.to_string());
        }
        assert_ne!(variant_value(&base, 1), base);
        assert_ne!(variant_value(&base, 1), variant_value(&base, 2));
        let numbers = json!({"quantity": 1});
        assert_eq!(variant_value(&numbers, 2), json!({"quantity": 3}));
        assert_eq!(
            variant_value(&json!({"ok": true}), 1),
            json!({"ok": true, "tfv_variant": 1})
        );
    }
}
