//! A history written as a black-box scenario file that replays it (`ticketflow scenario run
//! FILE` judges it by the model, `[expect] model = true`), and as curl lines.
//!
//! The file is the check file's text with its `[check]` table taken out and the history's
//! racers and `[expect]` appended, so its target, barrier, `${ENV}` references and comments
//! stay as the user wrote them.

use std::fmt::Write as _;

use serde_json::Value;

use super::file::CheckFile;
use crate::blackbox::format::request::build_request;
use crate::blackbox::format::{BodyTemplate, TargetScenario};
use crate::blackbox::init::toml_key;

/// The check file's text without its `[check]` table (from its header to the next table
/// header).
fn without_check_table(text: &str) -> String {
    let mut out = String::new();
    let mut skipping = false;
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with('[') {
            let header = t.trim_start_matches('[').trim_start();
            skipping = header.starts_with("check]")
                || header.starts_with("check ]")
                || header.starts_with("check.");
        }
        if !skipping {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// `value` as a TOML inline value; `None` when it holds a JSON `null` (TOML has none).
fn toml_inline(value: &Value) -> Option<String> {
    Some(match value {
        Value::Null => return None,
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => toml::Value::String(s.clone()).to_string(),
        Value::Array(items) => format!(
            "[{}]",
            items
                .iter()
                .map(toml_inline)
                .collect::<Option<Vec<_>>>()?
                .join(", ")
        ),
        Value::Object(members) => format!(
            "{{ {} }}",
            members
                .iter()
                .map(|(k, v)| toml_inline(v).map(|v| format!("{} = {v}", toml_key(k))))
                .collect::<Option<Vec<_>>>()?
                .join(", ")
        ),
    })
}

/// The scenario file that replays `scenario` (a history as [`super::run::scenario_for`] built
/// it), with a header naming where it came from.
pub fn replay_file(file: &CheckFile, scenario: &TargetScenario, header: &[String]) -> String {
    let mut out = String::new();
    for line in header {
        let _ = writeln!(out, "# {line}");
    }
    out.push_str(&without_check_table(&file.text));
    for r in &scenario.racers {
        let _ = writeln!(out, "\n[[racers]]");
        let _ = writeln!(out, "name = {}", toml::Value::String(r.name.clone()));
        let _ = writeln!(out, "wave = {}", r.wave);
        if let Some(s) = &r.scope {
            let _ = writeln!(out, "scope = {}", toml::Value::String(s.clone()));
        }
        let _ = writeln!(out, "key = {}", toml::Value::String(r.key.clone()));
        if let Some(v) = &r.via {
            let _ = writeln!(out, "via = {}", toml::Value::String(v.clone()));
        }
        match &r.body {
            Some(BodyTemplate::Json(v)) => match toml_inline(v) {
                Some(t) => {
                    let _ = writeln!(out, "body = {t}");
                }
                None => {
                    let raw =
                        crate::blackbox::template::raw_text(v, crate::oracle::history::Form::Plain);
                    let _ = writeln!(out, "raw = {}", toml::Value::String(raw));
                }
            },
            Some(BodyTemplate::Raw { text, .. }) => {
                let _ = writeln!(out, "raw = {}", toml::Value::String(text.clone()));
            }
            Some(BodyTemplate::Empty) | None => {}
        }
        if !r.expect.is_empty() {
            let kinds: Vec<String> = r
                .expect
                .iter()
                .map(|k| format!("\"{}\"", k.name()))
                .collect();
            let _ = writeln!(out, "expect = [{}]", kinds.join(", "));
        }
    }
    let _ = writeln!(out, "\n[expect]\nmodel = true");
    if let Some(m) = &scenario.model {
        let _ = writeln!(out, "settle_ms = {}", m.settle_ms);
        if !m.settle_after.is_empty() {
            let waves: Vec<String> = m.settle_after.iter().map(u32::to_string).collect();
            let _ = writeln!(out, "settle_after = [{}]", waves.join(", "));
        }
    }
    out
}

/// One curl command per racer of `scenario` as run `run_id` sent it, each preceded by its wave
/// (requests of one wave are sent together).
pub fn curl_lines(scenario: &TargetScenario, base_urls: &[String], run_id: &str) -> Vec<String> {
    let quote = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
    let endpoints = scenario.target.endpoints();
    scenario
        .racers
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let base = r
                .via
                .as_ref()
                .and_then(|v| endpoints.iter().position(|e| e == v))
                .or_else(|| (!base_urls.is_empty()).then(|| i % base_urls.len()))
                .and_then(|at| base_urls.get(at))
                .cloned()
                .unwrap_or_default();
            let req = build_request(scenario, r, &base, run_id);
            let mut line = format!(
                "# wave {}\ncurl -sS -X {} {}",
                r.wave,
                req.method,
                quote(&req.url)
            );
            for (n, v) in &req.headers {
                line.push_str(&format!(" -H {}", quote(&format!("{n}: {v}"))));
            }
            if !req.body.is_empty() {
                line.push_str(&format!(
                    " --data-binary {}",
                    quote(&String::from_utf8_lossy(&req.body))
                ));
            }
            line
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_check_table_goes_and_the_rest_stays() {
        let text = "name = \"x\"\n[check]\nhistories = 3\nseed = 1\n[target]\nbase_urls = []\n";
        assert_eq!(
            without_check_table(text),
            "name = \"x\"\n[target]\nbase_urls = []\n"
        );
    }

    #[test]
    fn json_bodies_become_toml_inline_tables_and_null_has_none() {
        assert_eq!(
            toml_inline(&json!({"item": "book", "n": 1, "tags": ["a"], "x y": true})).as_deref(),
            Some("{ item = \"book\", n = 1, tags = [\"a\"], \"x y\" = true }")
        );
        assert_eq!(toml_inline(&json!({"a": null})), None);
    }
}
