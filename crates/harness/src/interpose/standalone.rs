//! `ticketflow interpose`, the command: [`Standalone`] starts one [`Interposer`] per store on
//! the given (or free) loopback ports and a [`ControlServer`] on the control address, writes
//! the control token file, and serves until it is told to stop (docs/INTERPOSER.md, "Your own
//! running service"). The control protocol it serves is [`super::control`]'s.

use std::future::Future;
use std::net::SocketAddr;

use ticketflow_core::flags::{self, Flag};
use ticketflow_core::store::url::redact;

use super::control::{ControlServer, Endpoint};
use super::hub::StoreKind;
use super::token::{ControlToken, TokenError};
use super::{upstream_of, url_through, Interposer, Limits};

/// What `ticketflow interpose` starts.
#[derive(Debug, Clone)]
pub struct StandaloneConfig {
    /// The PostgreSQL the service uses (`postgres://…`), which the interposer relays to.
    pub postgres: String,
    /// The Redis the service uses (`redis://…`), if any.
    pub redis: Option<String>,
    /// Where the PostgreSQL interposer listens (port 0: a free one). Loopback only.
    pub listen_postgres: SocketAddr,
    /// Where the Redis interposer listens (port 0: a free one). Loopback only.
    pub listen_redis: SocketAddr,
    /// The control address (port 0: a free one). Loopback only.
    pub control: SocketAddr,
    /// The token a controller must send first; a new random one by default.
    pub token: ControlToken,
    /// Where to write `token`, a new file of mode 0600 removed when the interposer stops;
    /// `None`: nowhere (the caller hands the token to its controller in memory).
    pub token_file: Option<std::path::PathBuf>,
    /// Whether an upstream off this host is allowed (the relay to it is plain text).
    pub allow_remote_upstream: bool,
    /// The interposers' bounds.
    pub limits: Limits,
}

impl StandaloneConfig {
    /// A configuration relaying to `postgres`, every address on a free loopback port, default
    /// bounds.
    pub fn new(postgres: impl Into<String>) -> Self {
        let free = SocketAddr::from(([127, 0, 0, 1], 0));
        StandaloneConfig {
            postgres: postgres.into(),
            redis: None,
            listen_postgres: free,
            listen_redis: free,
            control: free,
            token: ControlToken::generate(),
            token_file: None,
            allow_remote_upstream: false,
            limits: Limits::default(),
        }
    }
}

/// Why `ticketflow interpose` could not start.
#[derive(Debug, thiserror::Error)]
pub enum StandaloneError {
    /// A listen or control address that is not a loopback address.
    #[error(
        "{option} {addr}: the interposer listens on loopback only (127.0.0.1 or ::1): it relays plain text and its control holds a service's commands"
    )]
    NotLoopback {
        /// The option that named it.
        option: Flag,
        /// The address.
        addr: SocketAddr,
    },
    /// An upstream URL that names no usable server.
    #[error("{option} {url}: {reason}")]
    BadUrl {
        /// The option that named it.
        option: Flag,
        /// The URL, password hidden.
        url: String,
        /// Why.
        reason: String,
    },
    /// An address that cannot be bound (in use, not this host's).
    #[error("{option}: cannot listen on {addr}: {source}")]
    Listen {
        /// The option that named it.
        option: Flag,
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// An upstream off this host without [`flags::ALLOW_REMOTE_UPSTREAM`].
    #[error(
        "{option} names {upstream}, not this host: the interposer relays the service's statements, parameters and password exchange to it in plain text; pass {allow} to relay off this host anyway"
    )]
    RemoteUpstream {
        /// The option that named it.
        option: Flag,
        /// The upstream address.
        upstream: SocketAddr,
        /// The flag that allows it.
        allow: Flag,
    },
    /// The control token file could not be written.
    #[error("{}: {0}", flags::CONTROL_TOKEN_FILE)]
    Token(#[source] TokenError),
    /// The wait for a signal could not be set up.
    #[error("cannot wait for a signal: {0}")]
    Runtime(#[source] std::io::Error),
}

impl StandaloneError {
    /// Whether the command line itself was wrong (a usage error), as opposed to the host
    /// refusing what it asked.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            StandaloneError::NotLoopback { .. }
                | StandaloneError::BadUrl { .. }
                | StandaloneError::RemoteUpstream { .. }
                | StandaloneError::Token(_)
        )
    }
}

/// A relay of a [`Standalone`]: the interposer and the URL its service should use.
struct Relay {
    interposer: Interposer,
    service_url: String,
}

/// A running `ticketflow interpose`: its control server and one interposer per store. Stopped
/// on drop (the control first, so a controller's runs end before the listeners close).
pub struct Standalone {
    control: ControlServer,
    relays: Vec<Relay>,
    token: ControlToken,
    token_file: Option<std::path::PathBuf>,
}

impl Drop for Standalone {
    fn drop(&mut self) {
        if let Some(f) = &self.token_file {
            let _ = std::fs::remove_file(f);
        }
    }
}

/// Why an upstream URL asks for what a plain-text relay cannot give: TLS (`sslmode=require`,
/// `verify-ca` or `verify-full` in its query); `None` when it does not.
pub fn wants_tls(url: &str) -> Option<String> {
    let query = url.split_once('?')?.1;
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == "sslmode" && matches!(v, "require" | "verify-ca" | "verify-full")).then(|| {
            format!(
                "sslmode={v}: the interposer relays plain text and cannot do TLS; name the server with sslmode=disable (the service connects to the interposer on loopback)"
            )
        })
    })
}

impl Standalone {
    /// Checks `config` and starts the interposers and the control server.
    ///
    /// Will return `Err` for a non-loopback address ([`StandaloneError::NotLoopback`]), an
    /// upstream URL without a resolvable TCP host or asking for TLS
    /// ([`StandaloneError::BadUrl`]), an upstream off this host without
    /// `allow_remote_upstream` ([`StandaloneError::RemoteUpstream`]), an address that cannot
    /// be bound ([`StandaloneError::Listen`]), or a token file that cannot be created
    /// ([`StandaloneError::Token`]).
    pub fn start(config: &StandaloneConfig) -> Result<Self, StandaloneError> {
        for (option, addr) in [
            (flags::LISTEN_POSTGRES, config.listen_postgres),
            (flags::LISTEN_REDIS, config.listen_redis),
            (flags::CONTROL, config.control),
        ] {
            if !addr.ip().is_loopback() {
                return Err(StandaloneError::NotLoopback { option, addr });
            }
        }
        let mut wanted = vec![(
            flags::POSTGRES,
            flags::LISTEN_POSTGRES,
            StoreKind::Postgres,
            &config.postgres,
            config.listen_postgres,
        )];
        if let Some(r) = &config.redis {
            wanted.push((
                flags::REDIS,
                flags::LISTEN_REDIS,
                StoreKind::Redis,
                r,
                config.listen_redis,
            ));
        }
        let mut relays = Vec::new();
        for (option, listen_option, store, url, listen) in wanted {
            let bad = |reason: String| StandaloneError::BadUrl {
                option,
                url: redact(url),
                reason,
            };
            let scheme_ok = match store {
                StoreKind::Postgres => {
                    url.starts_with("postgres://") || url.starts_with("postgresql://")
                }
                StoreKind::Redis => url.starts_with("redis://"),
            };
            if !scheme_ok {
                return Err(bad(format!("expected a {}:// URL", store.name())));
            }
            if let Some(reason) = wants_tls(url) {
                return Err(bad(reason));
            }
            let upstream = upstream_of(url).map_err(|e| bad(e.to_string()))?;
            if !upstream.ip().is_loopback() {
                if !config.allow_remote_upstream {
                    return Err(StandaloneError::RemoteUpstream {
                        option,
                        upstream,
                        allow: flags::ALLOW_REMOTE_UPSTREAM,
                    });
                }
                tracing::warn!(%upstream, "the interposer relays to a server off this host in plain text");
            }
            let interposer = Interposer::start_on(listen, store, upstream, config.limits.clone())
                .map_err(|source| StandaloneError::Listen {
                option: listen_option,
                addr: listen,
                source,
            })?;
            let service_url = url_through(url, interposer.addr())
                .ok_or_else(|| bad("not a URL (no ://)".into()))?;
            relays.push(Relay {
                interposer,
                service_url,
            });
        }
        let endpoints = relays.iter().map(|r| Endpoint::of(&r.interposer)).collect();
        let control = ControlServer::start(config.control, endpoints, config.token.clone())
            .map_err(|source| StandaloneError::Listen {
                option: flags::CONTROL,
                addr: config.control,
                source,
            })?;
        if let Some(f) = &config.token_file {
            config.token.write_new(f).map_err(StandaloneError::Token)?;
        }
        Ok(Standalone {
            control,
            relays,
            token: config.token.clone(),
            token_file: config.token_file.clone(),
        })
    }

    /// The token a controller sends first ([`super::control::ControlClient::connect`]).
    pub fn token(&self) -> &ControlToken {
        &self.token
    }

    /// The control address (`[target] interposer` in a scenario).
    pub(crate) fn control_addr(&self) -> SocketAddr {
        self.control.addr()
    }

    /// What `ticketflow interpose` prints once it serves: per store `service database_url:
    /// URL` or `service redis_url: URL` (password shown as `***`) with the server it relays
    /// to, then `control: ADDR`, `control token file: PATH` (when written), then `ready: …`.
    pub fn lines(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .relays
            .iter()
            .map(|r| {
                let key = match r.interposer.store() {
                    StoreKind::Postgres => "database_url",
                    StoreKind::Redis => "redis_url",
                };
                format!(
                    "service {key}: {}   (relays to {})",
                    redact(&r.service_url),
                    r.interposer.upstream()
                )
            })
            .collect();
        let control = self.control_addr();
        out.push(format!(
            "control: {control}   (a scenario names it: [target] interposer = \"{control}\")"
        ));
        if let Some(f) = &self.token_file {
            out.push(format!(
                "control token file: {}   (mode 0600; only its holders can control this interposer: a runner reads it from [target] interposer_token_file or {})",
                f.display(),
                super::token::TOKEN_FILE_ENV
            ));
        }
        out.push(
            "ready: traffic passes through untouched outside a run; Ctrl-C or SIGTERM stops it"
                .into(),
        );
        out
    }
}

/// Runs `ticketflow interpose`: starts [`Standalone`] from `config`, calls `ready` with it,
/// serves until `shutdown` completes, then stops it (every run ended, every listener and
/// relayed connection closed).
///
/// Will return `Err` as [`Standalone::start`] does, or [`StandaloneError::Runtime`] when the
/// wait for `shutdown` cannot be set up.
pub fn serve_blocking(
    config: &StandaloneConfig,
    ready: impl FnOnce(&Standalone),
    shutdown: impl Future<Output = ()>,
) -> Result<(), StandaloneError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(StandaloneError::Runtime)?;
    let standalone = Standalone::start(config)?;
    ready(&standalone);
    runtime.block_on(shutdown);
    drop(standalone);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_non_loopback_listen_address_is_refused_before_anything_starts() {
        let mut config = StandaloneConfig::new("postgres://postgres@127.0.0.1:5432/postgres");
        config.control = "0.0.0.0:0".parse().unwrap();
        let e = Standalone::start(&config).err().unwrap();
        assert!(e.is_usage() && e.to_string().contains("--control"), "{e}");
        let mut config = StandaloneConfig::new("mysql://x");
        config.control = "127.0.0.1:0".parse().unwrap();
        assert!(Standalone::start(&config).err().unwrap().is_usage());
    }
}
