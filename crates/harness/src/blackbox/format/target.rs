//! The `[target]` table checked: endpoints, request, scopes, rules, ids, retry, and the count
//! queries (SQL or a read-only Redis command).

use std::collections::{BTreeMap, BTreeSet};

use toml::Spanned;

use super::fields::{sample, toml_to_json, Parser, SAMPLE_BASE_URL};
use super::raw::{RawId, RawReplay, RawRequest, RawRetry, RawRule, RawScope, RawTarget};
use super::{
    BodyTemplate, CountQuery, ReplaySpec, RequestTemplate, RetrySpec, Scope, ServiceSpec, Target,
    DEFAULT_COUNT_TIMEOUT_MS, DEFAULT_KEY_TEMPLATE, DEFAULT_REQUEST_TIMEOUT_MS,
    MAX_COUNT_TIMEOUT_MS,
};
use crate::blackbox::client::HttpRequest;
use crate::blackbox::rules::{AnswerKind, HeaderTest, IdSource, PointerTest, Preset, Rule};
use crate::blackbox::template::{self};
use crate::scenario::ScenarioError;
use ticketflow_core::store::url::redact;

impl Parser<'_> {
    /// Long because it validates the `[target]` table's fields one after another, each refused
    /// with its own message at the file's line; the checks share only the parser.
    pub(super) fn target(&self, t: RawTarget, at: usize) -> Result<Target, ScenarioError> {
        if t.service.is_empty() == t.base_urls.is_empty() {
            return Err(self.err(
                Some(at),
                "[target] needs either [[target.service]] entries or base_urls, not both".into(),
            ));
        }
        let base_urls = self.base_urls(&t.base_urls, at)?;
        let mut services = Vec::with_capacity(t.service.len());
        for s in &t.service {
            if s.command.is_empty() {
                return Err(self.err(
                    Some(at),
                    format!("service {:?} has an empty command", s.name),
                ));
            }
            services.push(self.service(s, at)?);
        }
        let database_url = t
            .database_url
            .as_deref()
            .map(|u| self.env(at, "database_url", u))
            .transpose()?;
        if let Some(u) = &database_url {
            check_database_url(u).map_err(|m| self.err(Some(at), m.to_string()))?;
        }
        if t.own_service && t.service.is_empty() {
            return Err(self.err(
                Some(at),
                "own_service = true needs [[target.service]] (our migrations go to the scratch database)".into(),
            ));
        }
        if !t.setup_sql.is_empty() && (t.service.is_empty() || database_url.is_some()) {
            return Err(self.err(
                Some(at),
                "setup_sql runs only on the runner's scratch database ([[target.service]] without database_url)".into(),
            ));
        }
        let preset = t.preset.unwrap_or(if t.own_service {
            Preset::Ticketflow
        } else {
            Preset::Ietf
        });
        let request = self.request(t.request)?;
        let scopes = self.scopes(&t.scopes)?;
        let mut rules = Vec::new();
        for r in &t.rules {
            rules.push(self.rule(r)?);
        }
        rules.extend(preset.rules());
        if !rules.iter().any(|r| r.outcome == AnswerKind::Created) {
            return Err(self.err(
                Some(at),
                format!(
                    "no rule classifies an answer as created (preset {}, {} rule(s) of the scenario's own)",
                    preset.name(),
                    t.rules.len()
                ),
            ));
        }
        let id = self.id_source(t.id.as_ref())?;
        let any_replayed_rule = rules.iter().any(|r| r.outcome == AnswerKind::Replayed);
        let replay = self.replay(t.replay.as_ref(), any_replayed_rule)?;
        let (retry, retry_statuses) = self.retry(t.retry.as_ref())?;
        let redis_url = t
            .redis_url
            .as_deref()
            .map(|u| self.env(at, "redis_url", u))
            .transpose()?;
        if let Some(u) = &redis_url {
            if !u.starts_with("redis://") {
                return Err(self.err(
                    Some(at),
                    format!(
                        "redis_url {:?} must be a redis:// URL",
                        ticketflow_core::store::url::redact(u)
                    ),
                ));
            }
        }
        let counts = self.count_queries(&t.count, redis_url.as_deref())?;
        let interposer = t
            .interposer
            .as_deref()
            .map(|u| self.env(at, "interposer", u))
            .transpose()?
            .map(|u| match u.parse::<std::net::SocketAddr>() {
                Ok(a) if a.ip().is_loopback() => Ok(a),
                _ => Err(self.err(
                    Some(at),
                    format!(
                        "interposer {u:?} must be a loopback IP:PORT: the control address `ticketflow interpose` printed"
                    ),
                )),
            })
            .transpose()?;
        if interposer.is_some() && (!t.service.is_empty() || database_url.is_none()) {
            return Err(self.err(
                Some(at),
                "interposer (a running `ticketflow interpose`) goes with base_urls (your running service) and database_url (the direct URL of the database it uses); [[target.service]] gets the runner's own interposer".into(),
            ));
        }
        let interposer_token_file = t
            .interposer_token_file
            .as_deref()
            .map(|p| self.env(at, "interposer_token_file", p))
            .transpose()?
            .map(|p| {
                let p = std::path::PathBuf::from(p);
                match self.path.parent() {
                    Some(dir) if p.is_relative() => dir.join(p),
                    _ => p,
                }
            });
        if interposer_token_file.is_some() && interposer.is_none() {
            return Err(self.err(
                Some(at),
                "interposer_token_file goes with interposer (the control address of a running `ticketflow interpose`)".into(),
            ));
        }
        let target = Target {
            base_urls,
            services,
            database_url,
            redis_url,
            interposer,
            interposer_token_file,
            own_service: t.own_service,
            setup_sql: t.setup_sql,
            request,
            scopes,
            preset,
            rules,
            id,
            replay,
            retry,
            retry_statuses,
            request_timeout_ms: t.request_timeout_ms.unwrap_or(DEFAULT_REQUEST_TIMEOUT_MS),
            counts,
            count_timeout_ms: t.count_timeout_ms.unwrap_or(DEFAULT_COUNT_TIMEOUT_MS),
            lock_ttl_ms: t.lock_ttl_ms,
            state_across_keys: t.state_across_keys,
        };
        if target.lock_ttl_ms == Some(0) {
            return Err(self.err(Some(at), "lock_ttl_ms must be at least 1".into()));
        }
        if !(1..=MAX_COUNT_TIMEOUT_MS).contains(&target.count_timeout_ms) {
            return Err(self.err(
                Some(at),
                format!(
                    "count_timeout_ms must be 1 to {MAX_COUNT_TIMEOUT_MS} (milliseconds), not {}",
                    target.count_timeout_ms
                ),
            ));
        }
        let mut seen = BTreeSet::new();
        for e in target.endpoints() {
            if !seen.insert(e.clone()) {
                return Err(self.err(Some(at), format!("endpoint {e:?} is named twice")));
            }
        }
        if target.counts.iter().any(|q| q.redis.is_none())
            && target.database_url.is_none()
            && target.services.is_empty()
        {
            return Err(self.err(
                Some(at),
                "[target.count] needs database_url (the target's database)".into(),
            ));
        }
        Ok(target)
    }

    /// `base_urls`, env-expanded, each `http://`, without a trailing `/`.
    pub(super) fn base_urls(
        &self,
        base_urls: &[String],
        at: usize,
    ) -> Result<Vec<String>, ScenarioError> {
        let mut out = Vec::new();
        for u in base_urls {
            let u = self.env(at, "base_urls", u)?;
            // Shown with any password hidden, and masked as every secret is when printed.
            let shown = ticketflow_core::store::url::redact(&u);
            if !u.starts_with("http://") {
                return Err(self.err(
                    Some(at),
                    format!("base URL {shown:?} must start with http:// (https is not supported)"),
                ));
            }
            let authority = u["http://".len()..]
                .split(['/', '?', '#'])
                .next()
                .unwrap_or("");
            if authority.contains('@') {
                return Err(self.err(
                    Some(at),
                    format!(
                        "base URL {shown:?} has user information, which is never sent: give \
                         credentials in a header (Authorization = \"Bearer ${{TOKEN}}\")"
                    ),
                ));
            }
            self.sendable(at, "base_urls", &HttpRequest::new("GET", &u))?;
            out.push(u.trim_end_matches('/').to_string());
        }
        Ok(out)
    }

    /// `[[target.scopes]]`: unique non-empty names, templated values and headers.
    pub(super) fn scopes(&self, raw: &[Spanned<RawScope>]) -> Result<Vec<Scope>, ScenarioError> {
        let mut scopes = Vec::new();
        for s in raw {
            let at = s.span().start;
            let s = s.get_ref();
            if scopes.iter().any(|x: &Scope| x.name == s.name) || s.name.is_empty() {
                return Err(self.err(
                    Some(at),
                    format!("scope name {:?} is empty or given twice", s.name),
                ));
            }
            scopes.push(Scope {
                name: s.name.clone(),
                value: self.template(at, "scope value", s.value.as_deref().unwrap_or(&s.name))?,
                headers: self.headers(at, "scope headers", &s.headers)?,
            });
        }
        Ok(scopes)
    }

    /// `[target.id]`: where a created ticket's id is read (default: the body's `/id`).
    pub(super) fn id_source(
        &self,
        raw: Option<&Spanned<RawId>>,
    ) -> Result<IdSource, ScenarioError> {
        Ok(match raw {
            None => IdSource::Pointer("/id".into()),
            Some(id) => {
                let at = id.span().start;
                let id = id.get_ref();
                match (&id.pointer, &id.header) {
                    (Some(p), None) if id.regex.is_none() => {
                        IdSource::Pointer(self.pointer(at, "[target.id]", p)?)
                    }
                    (None, Some(h)) => IdSource::Header {
                        name: h.clone(),
                        regex: match &id.regex {
                            Some(re) => {
                                let re = self.regex(at, "[target.id] regex", re)?;
                                if re.captures_len() != 2 {
                                    return Err(self.err(
                                        Some(at),
                                        "[target.id] regex needs exactly one capture group".into(),
                                    ));
                                }
                                Some(re)
                            }
                            None => None,
                        },
                    },
                    _ => {
                        return Err(self.err(
                            Some(at),
                            "[target.id] needs either pointer or header (with an optional regex)"
                                .into(),
                        ))
                    }
                }
            }
        })
    }

    /// `[target.replay]`; `any_replayed_rule`: some rule classifies an answer as replayed.
    pub(super) fn replay(
        &self,
        raw: Option<&Spanned<RawReplay>>,
        any_replayed_rule: bool,
    ) -> Result<ReplaySpec, ScenarioError> {
        Ok(match raw {
            None => ReplaySpec {
                marked: any_replayed_rule,
                same_answer: false,
                ignore: Vec::new(),
            },
            Some(r) => {
                let at = r.span().start;
                let r = r.get_ref();
                if r.marked == Some(true) && !any_replayed_rule {
                    return Err(self.err(
                        Some(at),
                        "replay.marked = true but no rule classifies an answer as replayed".into(),
                    ));
                }
                ReplaySpec {
                    marked: r.marked.unwrap_or(any_replayed_rule),
                    same_answer: r.same_answer,
                    ignore: r
                        .ignore
                        .iter()
                        .map(|p| self.pointer(at, "replay.ignore", p))
                        .collect::<Result<_, _>>()?,
                }
            }
        })
    }

    /// `[target.retry]` and the statuses it retries (default: 10 attempts, 25 ms doubling to
    /// 1000 ms, transport errors retried).
    pub(super) fn retry(
        &self,
        raw: Option<&Spanned<RawRetry>>,
    ) -> Result<(RetrySpec, Vec<u16>), ScenarioError> {
        Ok(match raw {
            None => (
                RetrySpec {
                    attempts: 10,
                    backoff_ms: 25,
                    max_backoff_ms: 1000,
                    transport_errors: true,
                },
                Vec::new(),
            ),
            Some(r) => {
                let at = r.span().start;
                let r = r.get_ref();
                let attempts = r.attempts.unwrap_or(10);
                if attempts == 0 {
                    return Err(self.err(Some(at), "retry.attempts must be at least 1".into()));
                }
                if let Some(s) = r.statuses.iter().find(|s| !(100..=599).contains(*s)) {
                    return Err(self.err(
                        Some(at),
                        format!("retry.statuses: {s} is not an HTTP status"),
                    ));
                }
                (
                    RetrySpec {
                        attempts,
                        backoff_ms: r.backoff_ms.unwrap_or(25),
                        max_backoff_ms: r.max_backoff_ms.unwrap_or(1000),
                        transport_errors: r.transport_errors.unwrap_or(true),
                    },
                    r.statuses.clone(),
                )
            }
        })
    }

    /// `[target.count]`: each query env-expanded and validated, with `{scope}`, `{key}` and
    /// `{run}` bound as parameters. A string is SQL; a table `{ redis = … }` is a Redis count
    /// (a command as an array of words, or one string split at whitespace), which needs
    /// `redis_url`.
    ///
    /// Long because SQL and Redis counts are validated side by side, query by query, each
    /// refused with its own message.
    pub(super) fn count_queries(
        &self,
        raw: &BTreeMap<String, Spanned<toml::Value>>,
        redis_url: Option<&str>,
    ) -> Result<Vec<CountQuery>, ScenarioError> {
        let mut counts = Vec::new();
        for (name, value) in raw {
            let at = value.span().start;
            let origin = format!(
                "{}:{}",
                self.path.display(),
                self.text[..at.min(self.text.len())].matches('\n').count() + 1
            );
            let only_bound = |params: &[&str]| -> Result<(), ScenarioError> {
                if params.iter().any(|p| matches!(*p, "racer" | "n")) {
                    return Err(self.err(
                        Some(at),
                        format!(
                            "count query {name:?}: only {{scope}}, {{key}} and {{run}} can be bound"
                        ),
                    ));
                }
                Ok(())
            };
            match value.get_ref() {
                toml::Value::String(sql) => {
                    let sql = self.env(at, "count query", sql)?;
                    template::validate(&sql)
                        .map_err(|e| self.template_err(at, "count query", e))?;
                    let (bound_sql, params) = bind_placeholders(&sql);
                    only_bound(&params)?;
                    counts.push(CountQuery {
                        name: name.clone(),
                        sql,
                        bound_sql,
                        params,
                        origin,
                        redis: None,
                    });
                }
                toml::Value::Table(t) => {
                    let what = format!("count {name:?}");
                    if let Some(k) = t.keys().find(|k| k.as_str() != "redis") {
                        return Err(self.err(
                            Some(at),
                            format!("{what}: unknown field {k:?} (a table count takes redis = [\"COMMAND\", \"arg\", …])"),
                        ));
                    }
                    let words: Vec<String> = match t.get("redis") {
                        Some(toml::Value::Array(a)) => a
                            .iter()
                            .map(|w| match w {
                                toml::Value::String(s) => Ok(s.clone()),
                                toml::Value::Integer(i) => Ok(i.to_string()),
                                _ => Err(self.err(
                                    Some(at),
                                    format!("{what}: each word of a Redis command is a string or an integer"),
                                )),
                            })
                            .collect::<Result<_, _>>()?,
                        Some(toml::Value::String(s)) => {
                            s.split_whitespace().map(str::to_string).collect()
                        }
                        _ => {
                            return Err(self.err(
                                Some(at),
                                format!("{what}: redis = [\"COMMAND\", \"arg\", …] or \"COMMAND arg …\""),
                            ))
                        }
                    };
                    let mut expanded = Vec::with_capacity(words.len());
                    for w in &words {
                        let w = self.env(at, &what, w)?;
                        template::validate(&w).map_err(|e| self.template_err(at, &what, e))?;
                        expanded.push(w);
                    }
                    let words = check_count_command(&expanded)
                        .map_err(|m| self.err(Some(at), format!("{what}: {m}")))?;
                    if redis_url.is_none() {
                        return Err(self.err(
                            Some(at),
                            format!("{what} is a Redis count: it needs [target] redis_url (the Redis it counts in)"),
                        ));
                    }
                    let params = placeholders_in(&words);
                    only_bound(&params)?;
                    counts.push(CountQuery {
                        name: name.clone(),
                        sql: words.join(" "),
                        bound_sql: String::new(),
                        params,
                        origin,
                        redis: Some(words),
                    });
                }
                _ => {
                    return Err(self.err(
                        Some(at),
                        format!("count {name:?}: expected SQL text or a table {{ redis = [\"COMMAND\", \"arg\", …] }}"),
                    ))
                }
            }
        }
        Ok(counts)
    }

    pub(super) fn request(
        &self,
        r: Option<Spanned<RawRequest>>,
    ) -> Result<RequestTemplate, ScenarioError> {
        let Some(r) = r else {
            return Err(self.err(
                None,
                "[target.request] is missing (method, path, body)".into(),
            ));
        };
        let at = r.span().start;
        let r = r.into_inner();
        let method = r
            .method
            .unwrap_or_else(|| "POST".into())
            .to_ascii_uppercase();
        if method.is_empty() || !method.bytes().all(|b| b.is_ascii_alphabetic()) {
            return Err(self.err(
                Some(at),
                format!("request method {method:?} is not a token"),
            ));
        }
        let path = self.template(at, "request path", r.path.as_deref().unwrap_or("/"))?;
        if !path.starts_with('/') {
            return Err(self.err(Some(at), format!("request path {path:?} must start with /")));
        }
        self.sendable(
            at,
            "request path",
            &HttpRequest::new(&method, format!("{SAMPLE_BASE_URL}{}", sample(&path))),
        )?;
        if r.content_type.is_some() && r.raw.is_none() {
            return Err(self.err(
                Some(at),
                "content_type goes with raw (a JSON body is application/json)".into(),
            ));
        }
        let body = self
            .body(
                at,
                "request body",
                r.body.as_ref(),
                r.raw.as_ref(),
                r.content_type.as_ref(),
            )?
            .unwrap_or(BodyTemplate::Empty);
        let key_header = r.key_header.unwrap_or_else(|| "Idempotency-Key".into());
        self.sendable(
            at,
            "request key_header",
            &HttpRequest::new(&method, SAMPLE_BASE_URL).with_header(&key_header, "k"),
        )?;
        Ok(RequestTemplate {
            method,
            path,
            key_header,
            key: self.template(
                at,
                "request key",
                r.key.as_deref().unwrap_or(DEFAULT_KEY_TEMPLATE),
            )?,
            headers: self.headers(at, "request headers", &r.headers)?,
            body,
        })
    }

    /// A `[[target.service]]` with `${NAME}` expanded in its command and `env` values (an
    /// unset variable is a load error at the line that names it); env names must be
    /// non-empty and free of `=` and NUL.
    fn service(&self, s: &ServiceSpec, at: usize) -> Result<ServiceSpec, ScenarioError> {
        let what = format!("service {:?}", s.name);
        let command = s
            .command
            .iter()
            .map(|a| self.env(at, &what, a))
            .collect::<Result<Vec<_>, _>>()?;
        let mut env = BTreeMap::new();
        for (k, v) in &s.env {
            if k.is_empty() || k.contains('=') || k.contains('\0') {
                return Err(self.err(
                    Some(at),
                    format!("{what}: env name {k:?} cannot be set (empty, or holds '=' or NUL)"),
                ));
            }
            env.insert(k.clone(), self.env(at, &what, v)?);
        }
        Ok(ServiceSpec {
            command,
            env,
            ..s.clone()
        })
    }

    pub(super) fn rule(&self, r: &Spanned<RawRule>) -> Result<Rule, ScenarioError> {
        let at = r.span().start;
        let r = r.get_ref();
        let status = r
            .status
            .as_ref()
            .map(crate::blackbox::rules::StatusMatch::parse)
            .transpose()
            .map_err(|e| self.err(Some(at), e.to_string()))?;
        let header = match (&r.header, &r.header_value, &r.header_regex) {
            (None, None, None) => None,
            (None, _, _) => {
                return Err(self.err(Some(at), "header_value/header_regex need header".into()))
            }
            (Some(_), Some(_), Some(_)) => {
                return Err(self.err(
                    Some(at),
                    "give header_value or header_regex, not both".into(),
                ))
            }
            (Some(h), Some(v), None) => Some((h.clone(), HeaderTest::Equals(v.clone()))),
            (Some(h), None, Some(re)) => Some((
                h.clone(),
                HeaderTest::Matches(self.regex(at, "header_regex", re)?),
            )),
            (Some(h), None, None) => Some((h.clone(), HeaderTest::Present)),
        };
        let pointer = match (&r.pointer, &r.equals) {
            (None, None) => None,
            (None, Some(_)) => return Err(self.err(Some(at), "equals needs pointer".into())),
            (Some(p), eq) => Some((
                self.pointer(at, "rule pointer", p)?,
                match eq {
                    None => PointerTest::Present,
                    Some(v) => PointerTest::Equals(toml_to_json(v)),
                },
            )),
        };
        let body_regex = r
            .body_regex
            .as_deref()
            .map(|re| self.regex(at, "body_regex", re))
            .transpose()?;
        if r.outcome == AnswerKind::Timeout {
            return Err(self.err(
                Some(at),
                "a rule cannot give outcome \"timeout\": it is what the runner records when no answer came within the request timeout".into(),
            ));
        }
        Ok(Rule {
            status,
            header,
            pointer,
            body_regex,
            outcome: r.outcome,
            origin: format!(
                "{}:{}",
                self.path.display(),
                self.text[..at].matches('\n').count() + 1
            ),
        })
    }
}

/// Checks a target's `database_url` before anything runs: a `postgres://` or `postgresql://`
/// URL (libpq's URI form, PostgreSQL docs §34.1.1.2) that parses. SQLAlchemy's
/// `postgresql+DRIVER://` form (what Python settings often hold) is refused with the URL to
/// use instead. Passwords never appear in the message.
///
/// Will return `Err` with the message for any other URL.
pub(crate) fn check_database_url(url: &str) -> Result<(), DatabaseUrlError> {
    let shown = || redact(url);
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(DatabaseUrlError::NoScheme { url: shown() });
    };
    let lower = scheme.to_ascii_lowercase();
    if let Some((base, driver)) = lower.split_once('+') {
        if base == "postgres" || base == "postgresql" {
            return Err(DatabaseUrlError::Driver {
                url: shown(),
                driver: driver.to_string(),
                instead: redact(&format!("postgresql://{rest}")),
            });
        }
    }
    if lower != "postgres" && lower != "postgresql" {
        return Err(DatabaseUrlError::Scheme { url: shown() });
    }
    let config = ticketflow_core::store::url::parse_postgres(url).map_err(|source| {
        DatabaseUrlError::Parse {
            url: shown(),
            source,
        }
    })?;
    if !ticketflow_core::store::url::names_a_host(&config) {
        return Err(DatabaseUrlError::NoHost { url: shown() });
    }
    Ok(())
}

/// Why a target's `database_url` is refused ([`check_database_url`]); each carries the URL
/// with its password hidden.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DatabaseUrlError {
    /// No `scheme://`.
    #[error("database_url {url}: expected postgres://USER@HOST:PORT/DATABASE")]
    NoScheme {
        /// The URL, password hidden.
        url: String,
    },
    /// SQLAlchemy's `postgresql+DRIVER://` form.
    #[error(
        "database_url {url}: the +{driver} driver suffix is SQLAlchemy's, not a PostgreSQL URL; use {instead}"
    )]
    Driver {
        /// The URL, password hidden.
        url: String,
        /// The driver named after the `+`.
        driver: String,
        /// The URL to use instead, password hidden.
        instead: String,
    },
    /// A scheme other than `postgres` or `postgresql`.
    #[error(
        "database_url {url}: the scheme must be postgres:// or postgresql:// (the target's PostgreSQL database)"
    )]
    Scheme {
        /// The URL, password hidden.
        url: String,
    },
    /// The URL does not parse as a PostgreSQL URL.
    #[error("database_url {url}: {source}")]
    Parse {
        /// The URL, password hidden.
        url: String,
        /// The parser's reason.
        #[source]
        source: ticketflow_core::StoreError,
    },
    /// The URL names no host.
    #[error("database_url {url}: names no host: expected postgres://USER@HOST:PORT/DATABASE")]
    NoHost {
        /// The URL, password hidden.
        url: String,
    },
}

/// Replaces each `{scope}`, `{key}`, `{run}` (or other placeholder) in SQL by `$1`, `$2`, …
/// and returns the placeholder behind each parameter. A placeholder used twice is one
/// parameter. Values are bound as text, never spliced into the SQL.
pub(crate) fn bind_placeholders(sql: &str) -> (String, Vec<&'static str>) {
    let mut params: Vec<&'static str> = Vec::new();
    let mut out = sql.to_string();
    for p in template::PLACEHOLDERS {
        let token = format!("{{{p}}}");
        if out.contains(&token) {
            params.push(p);
            out = out.replace(&token, &format!("${}::text", params.len()));
        }
    }
    (out, params)
}

/// The per-request placeholders the templates `words` use, in [`template::PLACEHOLDERS`]
/// order (`{{` and `}}` are literal braces, not placeholders).
pub(crate) fn placeholders_in(words: &[String]) -> Vec<&'static str> {
    template::PLACEHOLDERS
        .into_iter()
        .filter(|p| {
            // Expanding with only `p` set to a marker shows whether `p` is used.
            let vars: template::Vars = [(*p, "\u{0}".to_string())].into();
            words
                .iter()
                .any(|w| template::expand(w, &vars).contains('\u{0}'))
        })
        .collect()
}

/// The commands a Redis count may run: each only reads (Redis' own `readonly` command flag,
/// "Command flags" in the Redis documentation of `COMMAND INFO`) and answers an integer, a
/// number as a string, or nil.
///
/// `GET`, `STRLEN`, `EXISTS`, `GETBIT`, `BITCOUNT` (strings); `HGET`, `HLEN`, `HEXISTS`,
/// `HSTRLEN` (hashes); `LLEN` (lists); `SCARD`, `SISMEMBER`, `SINTERCARD` (sets); `ZCARD`,
/// `ZCOUNT`, `ZLEXCOUNT`, `ZSCORE`, `ZRANK` (sorted sets); `XLEN` (streams); `PFCOUNT`
/// (HyperLogLog; it may refresh the key's cached cardinality, which changes no count); `DBSIZE`.
pub const READ_ONLY_COUNT_COMMANDS: [&str; 21] = [
    "GET",
    "STRLEN",
    "EXISTS",
    "GETBIT",
    "BITCOUNT",
    "HGET",
    "HLEN",
    "HEXISTS",
    "HSTRLEN",
    "LLEN",
    "SCARD",
    "SISMEMBER",
    "SINTERCARD",
    "ZCARD",
    "ZCOUNT",
    "ZLEXCOUNT",
    "ZSCORE",
    "ZRANK",
    "XLEN",
    "PFCOUNT",
    "DBSIZE",
];

/// Checks a Redis count command (its name and argument templates) against
/// [`READ_ONLY_COUNT_COMMANDS`] and returns it with the name upper-cased.
///
/// Will return `Err` with the reason for an empty command or a command not on the list.
pub(crate) fn check_count_command(words: &[String]) -> Result<Vec<String>, CountCommandError> {
    let Some(name) = words.first() else {
        return Err(CountCommandError::Empty);
    };
    let upper = name.to_ascii_uppercase();
    if !READ_ONLY_COUNT_COMMANDS.contains(&upper.as_str()) {
        return Err(CountCommandError::NotReadOnly { name: name.clone() });
    }
    let mut out = vec![upper];
    out.extend(words[1..].iter().cloned());
    Ok(out)
}

/// Why a Redis count command is refused ([`check_count_command`]).
#[derive(Debug, thiserror::Error)]
pub(crate) enum CountCommandError {
    /// No command name.
    #[error("the Redis command is empty")]
    Empty,
    /// A command not on [`READ_ONLY_COUNT_COMMANDS`].
    #[error(
        "Redis command {name:?} is not a read-only count command; allowed: {}",
        READ_ONLY_COUNT_COMMANDS.join(", ")
    )]
    NotReadOnly {
        /// The command's name as written.
        name: String,
    },
}
