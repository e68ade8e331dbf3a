//! A request on the wire: the URL parsed (`http://` only), the request encoded (own headers
//! refused, `Content-Length` framing), the connection made and the bytes written, each within
//! what is left of the deadline.

use super::{is_timeout, ClientError, Clock, HttpRequest};
use std::io::{self, Write};
use std::net::{Ipv6Addr, SocketAddr, TcpStream, ToSocketAddrs};

/// Where to connect and what to put in the request line and `Host`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Target {
    /// A name to resolve, or an IP literal.
    pub(super) host: Host,
    pub(super) port: u16,
    /// `host:port` for error messages (IPv6 in brackets).
    pub(super) addr: String,
    /// The `Host` header value: the host as written, `:port` unless it is 80.
    pub(super) host_header: String,
    /// Path and query, at least `/`.
    pub(super) request_target: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Host {
    Name(String),
    V6(Ipv6Addr),
}

pub(super) fn parse_url(url: &str) -> Result<Target, ClientError> {
    let bad = |reason: &str| ClientError::Url {
        url: ticketflow_core::store::url::redact(url),
        reason: reason.to_string(),
    };
    if url.bytes().any(|b| b <= b' ' || b >= 0x7f) {
        return Err(bad(
            "contains a space, a control or a non-ASCII character (percent-encode it)",
        ));
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(bad("no scheme; expected http://host[:port][/path][?query]"));
    };
    if scheme.eq_ignore_ascii_case("https") {
        return Err(bad(
            "https is not supported: this client speaks plain HTTP/1.1",
        ));
    }
    if !scheme.eq_ignore_ascii_case("http") {
        return Err(bad("only http:// URLs are supported"));
    }
    let rest = rest.split('#').next().unwrap_or("");
    let split = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(split);
    if authority.contains('@') {
        return Err(bad("user info (user@host) is not supported"));
    }
    let (host, shown, port) = if let Some(after) = authority.strip_prefix('[') {
        let Some((literal, after)) = after.split_once(']') else {
            return Err(bad("unclosed '[' around an IPv6 literal"));
        };
        let ip: Ipv6Addr = literal
            .parse()
            .map_err(|_| bad("not an IPv6 address inside [...]"))?;
        let port = match after {
            "" => None,
            _ => match after.strip_prefix(':') {
                Some(port) => Some(port),
                None => return Err(bad("unexpected text after ']'")),
            },
        };
        (Host::V6(ip), format!("[{literal}]"), port)
    } else {
        let (name, port) = match authority.split_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (authority, None),
        };
        if name.is_empty() {
            return Err(bad("no host"));
        }
        if !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
        {
            return Err(bad(
                "the host is not a name or an IPv4 literal (IPv6 literals go in brackets)",
            ));
        }
        (Host::Name(name.to_string()), name.to_string(), port)
    };
    let port = match port {
        None => 80,
        Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => match p.parse() {
            Ok(0) | Err(_) => return Err(bad("the port is not in 1..=65535")),
            Ok(port) => port,
        },
        Some(_) => return Err(bad("the port is not a number")),
    };
    let request_target = if tail.is_empty() {
        "/".to_string()
    } else if tail.starts_with('?') {
        format!("/{tail}")
    } else {
        tail.to_string()
    };
    let addr = format!("{shown}:{port}");
    let host_header = if port == 80 { shown } else { addr.clone() };
    Ok(Target {
        host,
        port,
        addr,
        host_header,
        request_target,
    })
}

/// RFC 9110 `tchar`.
pub(super) fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// The header names the client writes itself (or whose meaning would contradict its framing).
pub(super) const OWN_HEADERS: [&str; 4] =
    ["host", "content-length", "connection", "transfer-encoding"];

/// The target and the exact bytes of the request.
pub(super) fn encode(req: &HttpRequest) -> Result<(Target, Vec<u8>), ClientError> {
    let target = parse_url(&req.url)?;
    if !is_token(&req.method) {
        return Err(ClientError::Method {
            method: req.method.clone(),
        });
    }
    for (name, value) in &req.headers {
        let refuse = |reason: &str| ClientError::Header {
            name: name.clone(),
            reason: reason.to_string(),
        };
        if OWN_HEADERS.iter().any(|own| name.eq_ignore_ascii_case(own)) {
            return Err(refuse(
                "the client sets Host, Content-Length and Connection itself and frames the body \
                 by Content-Length (no Transfer-Encoding)",
            ));
        }
        if !is_token(name) {
            return Err(refuse("the name is not an HTTP token"));
        }
        if value.bytes().any(|b| (b < b' ' && b != b'\t') || b == 0x7f) {
            return Err(refuse(
                "the value holds CR, LF or another control character",
            ));
        }
    }
    let mut head = format!(
        "{} {} HTTP/1.1\r\nHost: {}\r\n",
        req.method, target.request_target, target.host_header
    );
    if !req.body.is_empty() || matches!(req.method.as_str(), "POST" | "PUT" | "PATCH") {
        head.push_str(&format!("Content-Length: {}\r\n", req.body.len()));
    }
    head.push_str("Connection: close\r\n");
    for (name, value) in &req.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(&req.body);
    Ok((target, bytes))
}

/// Connects to the first address of the target that accepts, with `TCP_NODELAY` set.
pub(super) fn connect(target: &Target, clock: &Clock) -> Result<TcpStream, ClientError> {
    let failed = |source: io::Error| ClientError::Connect {
        addr: target.addr.clone(),
        source,
    };
    let addrs: Vec<SocketAddr> = match &target.host {
        Host::V6(ip) => vec![SocketAddr::from((*ip, target.port))],
        Host::Name(name) => (name.as_str(), target.port)
            .to_socket_addrs()
            .map_err(failed)?
            .collect(),
    };
    let mut last = io::Error::new(io::ErrorKind::NotFound, "the host resolved to no address");
    for addr in addrs {
        let wait = clock.remaining("connect")?;
        match TcpStream::connect_timeout(&addr, wait) {
            Ok(stream) => {
                stream.set_nodelay(true).map_err(failed)?;
                return Ok(stream);
            }
            Err(e) => last = e,
        }
    }
    if is_timeout(&last) {
        return Err(clock.timeout("connect"));
    }
    Err(failed(last))
}

/// Writes all of `bytes`, each write given what is left of the deadline.
pub(super) fn write_by(
    stream: &mut TcpStream,
    mut bytes: &[u8],
    clock: &Clock,
    addr: &str,
) -> Result<(), ClientError> {
    let failed = |source: io::Error| ClientError::Write {
        addr: addr.to_string(),
        source,
    };
    while !bytes.is_empty() {
        let wait = clock.remaining("write request")?;
        stream.set_write_timeout(Some(wait)).map_err(failed)?;
        match stream.write(bytes) {
            Ok(0) => return Err(failed(io::ErrorKind::WriteZero.into())),
            Ok(n) => bytes = &bytes[n..],
            // As in `Conn::fill`: the deadline check at the top of the loop ends it.
            Err(e) if e.kind() == io::ErrorKind::Interrupted || is_timeout(&e) => {}
            Err(e) => return Err(failed(e)),
        }
    }
    Ok(())
}
