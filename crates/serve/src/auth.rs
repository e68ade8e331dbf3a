//! Optional bearer-token authentication of `ticketflow serve`: the token decides the tenant.
//!
//! Without it (the default, for local tests and harness runs) the service trusts the
//! `X-Tenant-Id` header of any caller. With `--auth-tokens FILE` (or the
//! `TICKETFLOW_AUTH_TOKENS` environment variable, same lines) every ticket route needs
//! `Authorization: Bearer TOKEN` (RFC 6750 §2.1) naming a known token, and the tenant is the
//! one the token maps to; a request that also sends `X-Tenant-Id` is refused (400), so a
//! client can never believe it chose the tenant. `GET /healthz` stays open (a readiness
//! probe sees no tenant data).
//!
//! The token table: one `TOKEN TENANT` pair per line (the tenant is the rest of the line,
//! trimmed); blank lines and lines starting with `#` are skipped. A token is RFC 6750's
//! `b64token` (`A–Z a–z 0–9 - . _ ~ + /`, then `=` padding) of at least
//! [`MIN_TOKEN_LEN`] characters; a token listed twice is an error. Tokens are kept only as
//! SHA-256 digests, so a lookup's timing depends on the digest, not on how many leading
//! characters of a guess were right.

use std::collections::HashMap;
use std::path::Path;

use axum::http::{header, HeaderMap};
use sha2::{Digest, Sha256};

/// Shortest token accepted (characters): 128 bits of a random base64 token.
pub const MIN_TOKEN_LEN: usize = 22;

/// The environment variable that may hold the token table instead of a file.
pub const TOKENS_ENV: &str = "TICKETFLOW_AUTH_TOKENS";

/// Why a token table cannot be used; names the line.
#[derive(Debug, thiserror::Error)]
pub enum TokenTableError {
    /// The file cannot be read.
    #[error("cannot read token file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A line is not `TOKEN TENANT`, or its token is malformed, short or repeated.
    #[error("{origin} line {line}: {reason}")]
    Line {
        /// The file path or the environment variable.
        origin: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong (never the token itself).
        reason: String,
    },
    /// No token at all: authentication on with nobody allowed in is a mistake.
    #[error("{0}: no tokens")]
    Empty(String),
}

/// Known tokens (as SHA-256 digests) and their tenants.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    tenants: HashMap<[u8; 32], String>,
}

/// Why a request was not authenticated: 401, or 400 for a tenant header sent anyway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthError {
    /// No `Authorization` header, or not `Bearer TOKEN`, or an unknown token (401).
    Unauthenticated(&'static str),
    /// `X-Tenant-Id` sent while the token decides the tenant (400).
    TenantHeader,
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

fn is_b64token(token: &str) -> bool {
    let body = token.trim_end_matches('=');
    !body.is_empty()
        && body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~+/".contains(&b))
}

impl Tokens {
    /// Reads a token table from a file.
    ///
    /// Will return `Err` if the file cannot be read or a line is malformed.
    pub fn from_file(path: &Path) -> Result<Tokens, TokenTableError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokenTableError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Tokens::parse(&text, &path.display().to_string())
    }

    /// Parses a token table (see the module docs); `origin` names it in errors.
    ///
    /// Will return `Err` for a line that is not `TOKEN TENANT`, a token that is not a
    /// `b64token` of at least [`MIN_TOKEN_LEN`] characters, a repeated token, or no token.
    pub fn parse(text: &str, origin: &str) -> Result<Tokens, TokenTableError> {
        let mut tenants = HashMap::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |reason: String| TokenTableError::Line {
                origin: origin.to_string(),
                line: i + 1,
                reason,
            };
            let (token, tenant) = line
                .split_once(char::is_whitespace)
                .map(|(t, rest)| (t, rest.trim()))
                .ok_or_else(|| bad("expected `TOKEN TENANT`".into()))?;
            if !is_b64token(token) {
                return Err(bad("the token is not an RFC 6750 b64token".into()));
            }
            if token.len() < MIN_TOKEN_LEN {
                return Err(bad(format!(
                    "the token has {} characters; at least {MIN_TOKEN_LEN} are required",
                    token.len()
                )));
            }
            ticketflow_core::domain::validate_tenant(tenant).map_err(|e| bad(e.to_string()))?;
            if tenants.insert(digest(token), tenant.to_string()).is_some() {
                return Err(bad("this token is listed twice".into()));
            }
        }
        if tenants.is_empty() {
            return Err(TokenTableError::Empty(origin.to_string()));
        }
        Ok(Tokens { tenants })
    }

    /// How many tokens are known.
    pub fn len(&self) -> usize {
        self.tenants.len()
    }

    /// `true` when no token is known.
    pub fn is_empty(&self) -> bool {
        self.tenants.is_empty()
    }

    /// The tenant of a request: the one its bearer token maps to.
    ///
    /// Will return `Err` for a missing, repeated, malformed or unknown `Authorization`
    /// header, or for an `X-Tenant-Id` header sent anyway.
    pub fn tenant(&self, headers: &HeaderMap) -> Result<String, AuthError> {
        let mut values = headers.get_all(header::AUTHORIZATION).iter();
        let value = values
            .next()
            .ok_or(AuthError::Unauthenticated("missing Authorization header"))?;
        if values.next().is_some() {
            return Err(AuthError::Unauthenticated(
                "more than one Authorization header",
            ));
        }
        let text = value
            .to_str()
            .map_err(|_| AuthError::Unauthenticated("Authorization is not ASCII"))?;
        // The scheme is case-insensitive (RFC 9110 §11.1); one space, then the token.
        let token = text
            .split_once(' ')
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim())
            .filter(|token| is_b64token(token))
            .ok_or(AuthError::Unauthenticated(
                "Authorization must be `Bearer TOKEN`",
            ))?;
        let tenant = self
            .tenants
            .get(&digest(token))
            .ok_or(AuthError::Unauthenticated("unknown token"))?;
        // Checked after the credentials, so an anonymous caller learns only "401".
        if headers.contains_key(ticketflow_core::wire::TENANT_HEADER) {
            return Err(AuthError::TenantHeader);
        }
        Ok(tenant.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    const T1: &str = "tok-aaaaaaaaaaaaaaaaaaaaaa";
    const T2: &str = "tok-bbbbbbbbbbbbbbbbbbbbbb";

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn a_token_decides_the_tenant_and_everything_else_is_refused() {
        let table = format!("# tokens\n{T1} tenant A\n\n{T2}\tB\n");
        let tokens = Tokens::parse(&table, "test").unwrap();
        assert_eq!(tokens.len(), 2);
        let bearer = |t: &str| format!("Bearer {t}");
        assert_eq!(
            tokens.tenant(&headers(&[("authorization", &bearer(T1))])),
            Ok("tenant A".to_string())
        );
        assert_eq!(
            tokens.tenant(&headers(&[("authorization", &format!("bearer {T2}"))])),
            Ok("B".to_string())
        );
        let refused = [
            headers(&[]),
            headers(&[("authorization", &format!("Basic {T1}"))]),
            headers(&[("authorization", &bearer("tok-unknownunknownunknown"))]),
            headers(&[
                ("authorization", &bearer(T1)),
                ("authorization", &bearer(T2)),
            ]),
        ];
        for h in refused {
            assert!(
                matches!(tokens.tenant(&h), Err(AuthError::Unauthenticated(_))),
                "{h:?}"
            );
        }
        let both = headers(&[("authorization", &bearer(T1)), ("x-tenant-id", "B")]);
        assert_eq!(tokens.tenant(&both), Err(AuthError::TenantHeader));
    }

    #[test]
    fn a_bad_table_names_its_line_and_never_echoes_a_token() {
        for (table, want) in [
            (format!("{T1}\n"), "line 1: expected `TOKEN TENANT`"),
            (
                "short A\n".to_string(),
                "line 1: the token has 5 characters",
            ),
            (
                format!("{T1} A\n{T1} B\n"),
                "line 2: this token is listed twice",
            ),
            (
                format!("\n{T1}:x A\n"),
                "line 2: the token is not an RFC 6750 b64token",
            ),
            ("# only a comment\n".to_string(), "no tokens"),
        ] {
            let e = Tokens::parse(&table, "tokens.txt").unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
            assert!(!e.contains("aaaa"), "the error echoes a token: {e}");
        }
    }
}
