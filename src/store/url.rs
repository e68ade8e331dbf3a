//! Database URLs in one place: the default PostgreSQL server, `--pg-url` against
//! `DATABASE_URL`, which backend a `--database-url` selects, PostgreSQL connection configs,
//! a URL pointed at another database, password redaction for anything printed, and the
//! reachability probe run once before PostgreSQL work.

use std::time::Duration;

use postgres::Config;

use super::postgres::connect;
use super::{Backend, StoreResult};
use crate::error::{DbErrorKind, StoreError};

/// The default PostgreSQL URL: the loopback server, user `postgres`, database `postgres`.
pub const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// Where to find PostgreSQL: the flag (`--pg-url`), else `DATABASE_URL` when it is a
/// `postgres://` URL, else [`DEFAULT_PG_URL`].
pub fn resolve_pg_url(flag: Option<&str>, database_url: Option<&str>) -> String {
    if let Some(url) = flag {
        return url.to_string();
    }
    match database_url {
        Some(u) if is_postgres(u) => u.to_string(),
        _ => DEFAULT_PG_URL.to_string(),
    }
}

/// `true` for a `postgres://` or `postgresql://` URL.
fn is_postgres(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// Which database a URL selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatabaseUrl {
    /// A `postgres://` or `postgresql://` URL.
    Postgres(String),
    /// A SQLite file path (given plain or as `sqlite://PATH` / `sqlite:PATH`).
    Sqlite(std::path::PathBuf),
}

impl DatabaseUrl {
    /// Parses a `--database-url`. Will return `Err` for an empty string or another scheme
    /// (`mysql://`, `http://`, …).
    pub fn parse(url: &str) -> Result<Self, crate::Error> {
        if is_postgres(url) {
            return Ok(DatabaseUrl::Postgres(url.to_string()));
        }
        let path = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
            .unwrap_or(url);
        // `:memory:` would give every session its own empty database and keep nothing.
        if path.is_empty()
            || path == ":memory:"
            || (path.contains("://") && !url.starts_with("sqlite:"))
        {
            return Err(crate::Error::BadUrl(url.to_string()));
        }
        Ok(DatabaseUrl::Sqlite(path.into()))
    }

    /// The backend this URL selects.
    pub fn backend(&self) -> Backend {
        match self {
            DatabaseUrl::Postgres(_) => Backend::Postgres,
            DatabaseUrl::Sqlite(_) => Backend::Sqlite,
        }
    }
}

/// Parses a `postgres://` URL (or key=value string) into a connection config.
///
/// Will return `Err` if it is malformed.
pub fn parse_postgres(url: &str) -> StoreResult<Config> {
    url.parse::<Config>().map_err(|e| StoreError {
        kind: DbErrorKind::Other,
        backend: Backend::Postgres,
        operation: "parse url",
        code: None,
        message: e.to_string(),
    })
}

/// A URL that cannot be pointed at another database.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot derive a database URL from {redacted:?}: expected postgres://…")]
pub struct NotAUrl {
    /// The text given, password hidden ([`redact`]).
    pub redacted: String,
}

/// `base` (a `postgres://` URL) pointed at database `dbname`, keeping user, password, host
/// and query.
///
/// Will return `Err` when `base` is not a URL (a key=value string).
pub fn url_with_db(base: &str, dbname: &str) -> Result<String, NotAUrl> {
    let Some(scheme_end) = base.find("://") else {
        return Err(NotAUrl {
            redacted: redact(base),
        });
    };
    let authority_start = scheme_end + 3;
    let path_start = base[authority_start..]
        .find(['/', '?'])
        .map(|i| authority_start + i)
        .unwrap_or(base.len());
    let query = base[path_start..]
        .find('?')
        .map(|q| &base[path_start + q..])
        .unwrap_or("");
    Ok(format!("{}/{dbname}{query}", &base[..path_start]))
}

/// Hides the password of any `scheme://user:password@host` URL inside `text` (`***`).
/// Key=value connection strings (`password=…`) are hidden the same way.
pub fn redact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(scheme_end) = rest.find("://") {
        let (head, tail) = rest.split_at(scheme_end + 3);
        out.push_str(head);
        let authority_end = tail.find(['/', '?', ' ']).unwrap_or(tail.len());
        let authority = &tail[..authority_end];
        match (authority.rfind('@'), authority.find(':')) {
            (Some(at), Some(colon)) if colon < at => {
                out.push_str(&authority[..colon]);
                out.push_str(":***");
                out.push_str(&authority[at..]);
            }
            _ => out.push_str(authority),
        }
        rest = &tail[authority_end..];
    }
    out.push_str(rest);
    match out.find("password=") {
        Some(p) => {
            let value_end = out[p + 9..]
                .find([' ', '&'])
                .map(|e| p + 9 + e)
                .unwrap_or(out.len());
            format!("{}password=***{}", &out[..p], &out[value_end..])
        }
        None => out,
    }
}

/// Why [`probe_postgres`] found the server unusable.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The URL does not parse.
    #[error("{0}")]
    Url(#[source] StoreError),
    /// No server answered, or it refused the login.
    #[error("PostgreSQL unreachable: {0}")]
    Unreachable(#[source] StoreError),
}

/// Connects once to check that the server answers (5 s connect timeout unless the URL sets
/// one), so an absent server costs one timeout, not one per scenario.
///
/// Will return `Err` if the URL does not parse or the server cannot be reached.
pub fn probe_postgres(url: &str) -> Result<(), ProbeError> {
    let mut config = parse_postgres(url).map_err(ProbeError::Url)?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(5));
    }
    connect(&config).map(drop).map_err(ProbeError::Unreachable)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_url_selects_the_backend() {
        assert!(matches!(
            DatabaseUrl::parse("postgres://u@h/db").unwrap(),
            DatabaseUrl::Postgres(_)
        ));
        assert_eq!(
            DatabaseUrl::parse("sqlite://a.db").unwrap(),
            DatabaseUrl::Sqlite("a.db".into())
        );
        assert_eq!(
            DatabaseUrl::parse("ticketflow.db").unwrap(),
            DatabaseUrl::Sqlite("ticketflow.db".into())
        );
        assert_eq!(
            DatabaseUrl::parse("ticketflow.db").unwrap().backend(),
            Backend::Sqlite
        );
        assert!(DatabaseUrl::parse("mysql://x").is_err());
        assert!(DatabaseUrl::parse("").is_err());
        assert!(DatabaseUrl::parse(":memory:").is_err());
    }

    #[test]
    fn the_flag_wins_then_a_postgres_database_url_then_the_default() {
        assert_eq!(
            resolve_pg_url(Some("postgres://f/x"), Some("postgres://e/y")),
            "postgres://f/x"
        );
        assert_eq!(
            resolve_pg_url(None, Some("postgresql://e/y")),
            "postgresql://e/y"
        );
        assert_eq!(resolve_pg_url(None, Some("app.db")), DEFAULT_PG_URL);
        assert_eq!(resolve_pg_url(None, None), DEFAULT_PG_URL);
    }

    #[test]
    fn url_with_db_keeps_everything_but_the_database() {
        assert_eq!(
            url_with_db("postgres://u:p@h:5432/postgres?connect_timeout=2", "tf_x").unwrap(),
            "postgres://u:p@h:5432/tf_x?connect_timeout=2"
        );
        assert_eq!(url_with_db("postgres://h", "d").unwrap(), "postgres://h/d");
        assert!(url_with_db("host=h password=p", "d").is_err());
    }

    #[test]
    fn redact_hides_passwords_wherever_a_url_appears() {
        assert_eq!(
            redact("--pg-url=postgres://u:s3cret@h:5432/db?x=1"),
            "--pg-url=postgres://u:***@h:5432/db?x=1"
        );
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(
            redact("host=h password=p user=u"),
            "host=h password=*** user=u"
        );
        assert_eq!(redact("plain"), "plain");
    }
}
