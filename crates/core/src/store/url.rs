//! Database URLs in one place: the default PostgreSQL server, `--pg-url` against
//! `DATABASE_URL` (checked, with where each came from: a given URL must parse, and only the
//! default may be unreachable without error), which backend a `--database-url` selects, PostgreSQL connection configs,
//! a URL pointed at another database, password redaction for anything printed, and the
//! reachability probe run once before PostgreSQL work.

use std::time::Duration;

use postgres::Config;

use super::{Backend, StoreResult};
use crate::error::{DbErrorKind, StoreError};

/// The default PostgreSQL URL: the loopback server, user `postgres`, database `postgres`.
pub const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// Where to find PostgreSQL: the flag (`--pg-url`), else `DATABASE_URL` when it is a
/// `postgres://` URL, else [`DEFAULT_PG_URL`]. Unchecked: the command line uses
/// [`resolve_pg`], which also says where the URL came from and refuses a bad one.
pub fn resolve_pg_url(flag: Option<&str>, database_url: Option<&str>) -> String {
    if let Some(url) = flag {
        return url.to_string();
    }
    match database_url {
        Some(u) if is_postgres(u) => u.to_string(),
        _ => DEFAULT_PG_URL.to_string(),
    }
}

/// Where a database URL came from, named in every message about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UrlOrigin {
    /// A command-line option, by its name (`--pg-url`).
    Flag(&'static str),
    /// An environment variable, by its name (`DATABASE_URL`).
    Env(&'static str),
    /// The built-in default ([`DEFAULT_PG_URL`], or `ticketflow.db` for the ticket database).
    Default,
}

impl std::fmt::Display for UrlOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UrlOrigin::Flag(name) | UrlOrigin::Env(name) => f.write_str(name),
            UrlOrigin::Default => f.write_str("the default URL"),
        }
    }
}

/// A database URL that was given (by option or environment variable) and cannot be used as
/// given: a usage error, found before anything runs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    /// Set, but to the empty string.
    #[error("{origin} is set but empty: give a URL or unset it")]
    Empty {
        /// Where it was set.
        origin: UrlOrigin,
    },
    /// Not a `postgres://` URL where only PostgreSQL will do (another scheme, a file path, a
    /// key=value string).
    #[error(
        "{origin}: {redacted:?} is not a PostgreSQL URL: expected \
         postgres://USER@HOST:PORT/DATABASE (or postgresql://…)"
    )]
    NotPostgres {
        /// Where it was given.
        origin: UrlOrigin,
        /// The text given, password hidden ([`redact`]).
        redacted: String,
    },
    /// A `postgres://` URL that parses but names no server (`postgres://`, `postgres:///db`,
    /// `postgres://user@/db`): every command refuses it the same way, before anything runs.
    #[error(
        "{origin}: PostgreSQL URL {redacted:?} names no host: expected \
         postgres://USER@HOST:PORT/DATABASE"
    )]
    NoHost {
        /// Where it was given.
        origin: UrlOrigin,
        /// The text given, password hidden.
        redacted: String,
    },
    /// Neither a PostgreSQL URL nor a SQLite file.
    #[error(
        "{origin}: {redacted:?} is not a database URL: expected a SQLite file path, \
         sqlite://PATH or postgres://USER@HOST:PORT/DATABASE (not :memory:, which keeps nothing)"
    )]
    NotADatabase {
        /// Where it was given.
        origin: UrlOrigin,
        /// The text given, password hidden.
        redacted: String,
    },
    /// A `postgres://` URL that does not parse (a bad port, an unknown parameter, …).
    #[error("{origin}: cannot parse PostgreSQL URL {redacted:?}: {reason}")]
    Malformed {
        /// Where it was given.
        origin: UrlOrigin,
        /// The text given, password hidden.
        redacted: String,
        /// The parser's complaint.
        reason: String,
    },
}

/// A PostgreSQL URL and where it came from ([`resolve_pg`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgUrl {
    /// The server, parsed.
    pub server: PgServer,
    /// Where it came from.
    pub origin: UrlOrigin,
}

impl PgUrl {
    /// `true` when the URL was given (option or environment variable): such a server must
    /// answer. Only the built-in default may leave PostgreSQL runs PENDING.
    pub fn is_explicit(&self) -> bool {
        self.origin != UrlOrigin::Default
    }
}

/// Checks that `url`, given at `origin`, is a `postgres://` URL that parses and names a
/// host, and returns it parsed.
///
/// Will return `Err` ([`UrlError`]) when it is empty, of another kind, or malformed.
pub fn check_postgres(url: &str, origin: UrlOrigin) -> Result<PgServer, UrlError> {
    if url.is_empty() {
        return Err(UrlError::Empty { origin });
    }
    let redacted = || redact(url);
    if !is_postgres(url) {
        return Err(UrlError::NotPostgres {
            origin,
            redacted: redacted(),
        });
    }
    let config = url.parse::<Config>().map_err(|e| UrlError::Malformed {
        origin,
        redacted: redacted(),
        reason: e.to_string(),
    })?;
    if !names_a_host(&config) {
        return Err(UrlError::NoHost {
            origin,
            redacted: redacted(),
        });
    }
    Ok(PgServer {
        url: url.to_string(),
        config: std::sync::Arc::new(config),
    })
}

/// Whether a parsed config names a server: a non-empty `host` (a name, an address or a Unix
/// socket directory, in the URL's authority or as `?host=`) or a `hostaddr`. Without one the
/// client would refuse at connect time ("both host and hostaddr are missing").
pub fn names_a_host(config: &Config) -> bool {
    let named = |h: &postgres::config::Host| match h {
        postgres::config::Host::Tcp(name) => !name.is_empty(),
        postgres::config::Host::Unix(path) => !path.as_os_str().is_empty(),
    };
    (!config.get_hosts().is_empty() && config.get_hosts().iter().all(named))
        || !config.get_hostaddrs().is_empty()
}

/// Where to find PostgreSQL, checked: `flag` (its value, given as option `flag_name`), else
/// `DATABASE_URL` (`database_url`) when it is a `postgres://` URL, else [`DEFAULT_PG_URL`].
/// A `DATABASE_URL` naming a SQLite file is left to the commands that open one.
///
/// Will return `Err` ([`UrlError`]) when the flag is not a PostgreSQL URL that parses, or
/// `DATABASE_URL` is empty, a malformed `postgres://` URL, or no database URL at all.
pub fn resolve_pg(
    flag: Option<&str>,
    flag_name: &'static str,
    database_url: Option<&str>,
) -> Result<PgUrl, UrlError> {
    if let Some(url) = flag {
        let origin = UrlOrigin::Flag(flag_name);
        return Ok(PgUrl {
            server: check_postgres(url, origin)?,
            origin,
        });
    }
    if let Some(url) = database_url {
        let origin = UrlOrigin::Env("DATABASE_URL");
        if url.is_empty() || is_postgres(url) {
            return Ok(PgUrl {
                server: check_postgres(url, origin)?,
                origin,
            });
        }
        check_database(url, origin)?;
    }
    Ok(PgUrl {
        server: check_postgres(DEFAULT_PG_URL, UrlOrigin::Default)?,
        origin: UrlOrigin::Default,
    })
}

/// Checks a ticket database URL (`--database-url`, `DATABASE_URL`) given at `origin`: a
/// SQLite file, or a `postgres://` URL that parses.
///
/// Will return `Err` ([`UrlError`]) when it is empty, `:memory:`, another scheme, or a
/// malformed `postgres://` URL.
pub fn check_database(url: &str, origin: UrlOrigin) -> Result<DatabaseUrl, UrlError> {
    if url.is_empty() {
        return Err(UrlError::Empty { origin });
    }
    if is_postgres(url) {
        return Ok(DatabaseUrl::Postgres(check_postgres(url, origin)?));
    }
    match DatabaseUrl::parse(url) {
        Ok(sqlite) => Ok(sqlite),
        Err(_) => Err(UrlError::NotADatabase {
            origin,
            redacted: redact(url),
        }),
    }
}

/// `true` for a `postgres://` or `postgresql://` URL.
fn is_postgres(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// Which database a URL selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatabaseUrl {
    /// A `postgres://` or `postgresql://` URL, parsed.
    Postgres(PgServer),
    /// A SQLite file path (given plain or as `sqlite://PATH` / `sqlite:PATH`).
    Sqlite(std::path::PathBuf),
}

impl DatabaseUrl {
    /// Parses a `--database-url`. Will return `Err` for an empty string, another scheme
    /// (`mysql://`, `http://`, …) or a malformed `postgres://` URL.
    pub fn parse(url: &str) -> Result<Self, crate::Error> {
        if is_postgres(url) {
            return Ok(DatabaseUrl::Postgres(PgServer::parse(url)?));
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
            return Err(crate::Error::BadUrl(redact(url)));
        }
        Ok(DatabaseUrl::Sqlite(path.into()))
    }

    /// The URL for a message: a PostgreSQL URL with its password hidden, or the SQLite path.
    pub fn redacted(&self) -> String {
        match self {
            DatabaseUrl::Postgres(server) => server.redacted(),
            DatabaseUrl::Sqlite(path) => path.display().to_string(),
        }
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

/// A PostgreSQL server URL, parsed once: the text as given (shown redacted, handed to the
/// child processes that take a URL) and its connection config, which every session, scratch
/// database and probe is opened from. The command line checks a URL ([`check_postgres`]) and
/// makes this value; the runners carry it instead of the text.
#[derive(Debug, Clone)]
pub struct PgServer {
    url: String,
    /// Shared: the value is cloned into every runner's options.
    config: std::sync::Arc<Config>,
}

impl PgServer {
    /// Parses `url` (`postgres://…` or a key=value string).
    ///
    /// Will return `Err` if it is malformed.
    pub fn parse(url: &str) -> StoreResult<PgServer> {
        Ok(PgServer {
            url: url.to_string(),
            config: std::sync::Arc::new(parse_postgres(url)?),
        })
    }

    /// The URL as given (it may hold a password: show [`PgServer::redacted`]).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The URL with its password replaced by `***` ([`redact`]).
    pub fn redacted(&self) -> String {
        redact(&self.url)
    }

    /// The connection config.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Whether this is the built-in default server ([`DEFAULT_PG_URL`]).
    pub fn is_default(&self) -> bool {
        self.url == DEFAULT_PG_URL
    }
}

/// Two servers are equal when their URLs are (the config is parsed from the URL).
impl PartialEq for PgServer {
    fn eq(&self, other: &PgServer) -> bool {
        self.url == other.url
    }
}

impl Eq for PgServer {}

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
    /// No server answered, or it refused the login.
    #[error("PostgreSQL unreachable: {0}")]
    Unreachable(#[source] StoreError),
}

/// Connects once to check that the server answers (5 s connect timeout unless the URL sets
/// one), so an absent server costs one timeout, not one per scenario.
///
/// Will return `Err` if the URL does not parse or the server cannot be reached.
pub fn probe_postgres(server: &PgServer) -> Result<(), ProbeError> {
    let mut config = server.config().clone();
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(5));
    }
    crate::store::postgres::connect_as(&config, crate::store::postgres::SessionRole::Admin)
        .map(drop)
        .map_err(ProbeError::Unreachable)
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
    fn resolve_pg_says_where_the_url_came_from_and_only_the_default_is_implicit() {
        let flag = resolve_pg(Some("postgres://f/x"), "--pg-url", Some("postgres://e/y")).unwrap();
        assert_eq!(
            (flag.server.url(), flag.origin),
            ("postgres://f/x", UrlOrigin::Flag("--pg-url"))
        );
        assert!(flag.is_explicit());
        let env = resolve_pg(None, "--pg-url", Some("postgresql://e/y")).unwrap();
        assert_eq!(env.origin, UrlOrigin::Env("DATABASE_URL"));
        assert!(env.is_explicit());
        for sqlite in [None, Some("app.db"), Some("sqlite://a.db")] {
            let d = resolve_pg(None, "--pg-url", sqlite).unwrap();
            assert_eq!((d.server.url(), d.is_explicit()), (DEFAULT_PG_URL, false));
        }
    }

    #[test]
    fn a_given_url_that_cannot_be_parsed_is_refused_naming_its_origin() {
        let flag = |u: &str| resolve_pg(Some(u), "--pg-url", None).unwrap_err();
        let e = flag("http://127.0.0.1:5432");
        assert!(matches!(e, UrlError::NotPostgres { .. }), "{e}");
        assert!(
            e.to_string()
                .starts_with("--pg-url: \"http://127.0.0.1:5432\" is not a PostgreSQL URL"),
            "{e}"
        );
        for bad in ["ticketflow.db", "host=h user=u", "mysql://x"] {
            assert!(matches!(flag(bad), UrlError::NotPostgres { .. }), "{bad}");
        }
        let e = flag("postgres://u:s3cret@h:notaport/db");
        assert!(matches!(e, UrlError::Malformed { .. }), "{e}");
        assert!(!e.to_string().contains("s3cret"), "{e}");
        assert!(matches!(flag(""), UrlError::Empty { .. }));
        let env = |u: &str| resolve_pg(None, "--pg-url", Some(u)).unwrap_err();
        let e = env("postgres://h:99999999/db");
        assert!(
            e.to_string().starts_with("DATABASE_URL: cannot parse"),
            "{e}"
        );
        assert!(matches!(env("http://h/db"), UrlError::NotADatabase { .. }));
        assert!(matches!(env(""), UrlError::Empty { .. }));
        let db = |u: &str| check_database(u, UrlOrigin::Flag("--database-url"));
        assert_eq!(db("a.db").unwrap(), DatabaseUrl::Sqlite("a.db".into()));
        assert!(matches!(
            db("postgres://h:x/db"),
            Err(UrlError::Malformed { .. })
        ));
        assert!(matches!(db(":memory:"), Err(UrlError::NotADatabase { .. })));
    }

    #[test]
    fn a_url_naming_no_host_is_refused_and_a_host_in_the_query_or_a_hostaddr_is_one() {
        let flag = |u: &str| resolve_pg(Some(u), "--pg-url", None);
        for bad in [
            "postgres://",
            "postgresql://u:s3cret@/db",
            "postgres:///db",
            "postgres://u@:5432/db",
        ] {
            let e = flag(bad).unwrap_err();
            assert!(matches!(e, UrlError::NoHost { .. }), "{bad}: {e}");
            assert!(e.to_string().contains("names no host"), "{e}");
            assert!(!e.to_string().contains("s3cret"), "{e}");
        }
        for good in [
            "postgres://h/db",
            "postgres:///db?host=/var/run/postgresql",
            "postgres:///db?hostaddr=127.0.0.1",
        ] {
            assert!(flag(good).is_ok(), "{good}");
        }
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
