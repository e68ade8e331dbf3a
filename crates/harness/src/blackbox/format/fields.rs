//! The parser every table's checks share: errors at the file's line, `${ENV}` and templates
//! expanded, headers, bodies, regexes and JSON pointers checked, a sample request to test
//! sendability.

use std::collections::BTreeMap;
use std::path::Path;

use regex::Regex;

use super::BodyTemplate;
use crate::blackbox::client::{self, ClientError, HttpRequest};
use crate::blackbox::rules::check_pointer;
use crate::blackbox::template::{self, TemplateError};
use crate::scenario::ScenarioError;
use ticketflow_core::store::url::redact;

/// The base URL requests are checked against at load, before the real endpoints are known.
pub(super) const SAMPLE_BASE_URL: &str = "http://127.0.0.1:1";

/// `text` with every per-request placeholder filled by a plain sample value, for the load
/// checks of what the expanded text will be.
pub(super) fn sample(text: &str) -> String {
    let vars: template::Vars = template::PLACEHOLDERS
        .iter()
        .map(|p| (*p, "x".to_string()))
        .collect();
    template::expand(text, &vars)
}

/// A file being read: its path and text (errors name the line) and how `${NAME}` is looked up.
pub(super) struct Parser<'a> {
    pub(super) path: &'a Path,
    pub(super) text: &'a str,
    pub(super) env: &'a dyn Fn(&str) -> Option<String>,
}

impl Parser<'_> {
    pub(super) fn err(&self, offset: Option<usize>, message: String) -> ScenarioError {
        ScenarioError {
            file: self.path.to_path_buf(),
            line: offset.map(|o| self.text[..o.min(self.text.len())].matches('\n').count() + 1),
            message,
        }
    }

    /// An error at `at`, or, for an unset variable, at the line that names it.
    pub(super) fn template_err(&self, at: usize, what: &str, e: TemplateError) -> ScenarioError {
        let offset = match &e {
            TemplateError::UnsetVariable(n) => self.text.find(&format!("${{{n}}}")).unwrap_or(at),
            _ => at,
        };
        self.err(Some(offset), format!("{what}: {e}"))
    }

    pub(super) fn env(&self, at: usize, what: &str, s: &str) -> Result<String, ScenarioError> {
        template::expand_env(s, self.env).map_err(|e| self.template_err(at, what, e))
    }

    /// Env-expanded and validated template.
    pub(super) fn template(&self, at: usize, what: &str, s: &str) -> Result<String, ScenarioError> {
        let s = self.env(at, what, s)?;
        template::validate(&s).map_err(|e| self.template_err(at, what, e))?;
        Ok(s)
    }

    pub(super) fn headers(
        &self,
        at: usize,
        what: &str,
        raw: &BTreeMap<String, String>,
    ) -> Result<Vec<(String, String)>, ScenarioError> {
        raw.iter()
            .map(|(n, v)| {
                let valid_name = !n.is_empty()
                    && n.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
                if !valid_name {
                    return Err(self.err(Some(at), format!("{what}: invalid header name {n:?}")));
                }
                let v = self.template(at, what, v)?;
                self.sendable(
                    at,
                    what,
                    &HttpRequest::new("POST", SAMPLE_BASE_URL).with_header(n, sample(&v)),
                )?;
                Ok((n.clone(), v))
            })
            .collect()
    }

    /// Refuses at load what the HTTP client would refuse before sending (a control character
    /// in a header value, a header the client sets itself, a path or URL it cannot use),
    /// naming `what` and the line. The error never quotes a header's value, nor a URL other
    /// than a base URL (password hidden): a path may hold an `${ENV}` secret.
    pub(super) fn sendable(
        &self,
        at: usize,
        what: &str,
        req: &HttpRequest,
    ) -> Result<(), ScenarioError> {
        client::check(req).map_err(|e| {
            let why = match e {
                ClientError::Url { url, reason } if what == "base_urls" => {
                    format!("URL {:?} cannot be used: {reason}", redact(&url))
                }
                ClientError::Url { reason, .. } => format!("the URL cannot be used: {reason}"),
                other => other.to_string(),
            };
            self.err(Some(at), format!("{what}: {why}"))
        })
    }

    pub(super) fn regex(&self, at: usize, what: &str, s: &str) -> Result<Regex, ScenarioError> {
        Regex::new(s).map_err(|e| self.err(Some(at), format!("{what}: invalid regex {s:?}: {e}")))
    }

    pub(super) fn pointer(&self, at: usize, what: &str, s: &str) -> Result<String, ScenarioError> {
        check_pointer(s).map_err(|e| self.err(Some(at), format!("{what}: {e}")))?;
        Ok(s.to_string())
    }

    pub(super) fn body(
        &self,
        at: usize,
        what: &str,
        body: Option<&toml::Value>,
        raw: Option<&String>,
        content_type: Option<&String>,
    ) -> Result<Option<BodyTemplate>, ScenarioError> {
        match (body, raw) {
            (Some(_), Some(_)) => Err(self.err(
                Some(at),
                format!("{what}: give either body (JSON) or raw (text), not both"),
            )),
            (Some(v), None) => {
                let json = toml_to_json(v);
                let json = template::expand_env_json(&json, self.env)
                    .map_err(|e| self.template_err(at, what, e))?;
                template::validate_json(&json).map_err(|e| self.template_err(at, what, e))?;
                Ok(Some(BodyTemplate::Json(json)))
            }
            (None, Some(text)) => {
                let text = self.template(at, what, text)?;
                let content_type = content_type
                    .cloned()
                    .unwrap_or_else(|| "text/plain; charset=utf-8".into());
                // A raw body declared as JSON must be JSON once its placeholders are filled.
                if content_type.to_ascii_lowercase().contains("json") {
                    let sample: template::Vars = template::PLACEHOLDERS
                        .iter()
                        .map(|p| (*p, "x".to_string()))
                        .collect();
                    if let Err(e) =
                        serde_json::from_str::<serde_json::Value>(&template::expand(&text, &sample))
                    {
                        return Err(self.err(
                            Some(at),
                            format!("{what}: raw body with content type {content_type} is not JSON: {e}"),
                        ));
                    }
                }
                Ok(Some(BodyTemplate::Raw { text, content_type }))
            }
            (None, None) => Ok(None),
        }
    }
}

/// A TOML value as JSON (datetimes as their string form).
pub(crate) fn toml_to_json(v: &toml::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        toml::Value::String(s) => Value::String(s.clone()),
        toml::Value::Integer(i) => Value::from(*i),
        toml::Value::Float(f) => Value::from(*f),
        toml::Value::Boolean(b) => Value::Bool(*b),
        toml::Value::Datetime(d) => Value::String(d.to_string()),
        toml::Value::Array(a) => Value::Array(a.iter().map(toml_to_json).collect()),
        toml::Value::Table(t) => Value::Object(
            t.iter()
                .map(|(k, v)| (k.clone(), toml_to_json(v)))
                .collect(),
        ),
    }
}
