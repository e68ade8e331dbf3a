//! An answer read back: the head (interim `1xx` heads skipped), then the body framed by
//! `Content-Length`, chunked encoding or the end of the connection, within the limits.

use super::{
    is_timeout, ClientError, Clock, HttpAnswer, BODY_LIMIT, HEAD_LIMIT, LINE_LIMIT, MAX_HEADERS,
};
use std::io::{self, Read};
use std::net::TcpStream;
use std::time::Duration;

/// A byte source whose next read can be bounded in time.
pub(super) trait Source: Read {
    /// Bounds the next read to `wait` (non-zero).
    fn bound_read(&mut self, wait: Duration) -> io::Result<()>;
}

impl Source for &mut TcpStream {
    fn bound_read(&mut self, wait: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(wait))
    }
}

/// Buffered reading of one answer under the deadline.
pub(super) struct Conn<'a, S: Source> {
    pub(super) src: S,
    pub(super) buf: Vec<u8>,
    /// Bytes of `buf` before `pos` are consumed.
    pub(super) pos: usize,
    pub(super) clock: &'a Clock,
    pub(super) addr: &'a str,
}

impl<S: Source> Conn<'_, S> {
    pub(super) fn available(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    pub(super) fn consume(&mut self, n: usize) {
        self.pos += n;
    }

    /// Reads more bytes into the buffer; `Ok(0)` at the end of the stream.
    pub(super) fn fill(&mut self) -> Result<usize, ClientError> {
        if self.pos > 0 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        let mut chunk = [0u8; 16 * 1024];
        loop {
            let wait = self.clock.remaining("read answer")?;
            self.src
                .bound_read(wait)
                .map_err(|source| ClientError::Read {
                    addr: self.addr.to_string(),
                    source,
                })?;
            match self.src.read(&mut chunk) {
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    return Ok(n);
                }
                // A timed-out read goes round again: `remaining` ends it once the deadline
                // has really passed (a socket timeout may fire a little early).
                Err(e) if e.kind() == io::ErrorKind::Interrupted || is_timeout(&e) => {}
                Err(source) => {
                    return Err(ClientError::Read {
                        addr: self.addr.to_string(),
                        source,
                    })
                }
            }
        }
    }

    /// One line without its `\r\n` (or bare `\n`); at most `max` bytes before the terminator.
    pub(super) fn read_line(
        &mut self,
        max: usize,
        during: &'static str,
    ) -> Result<Vec<u8>, ClientError> {
        loop {
            let avail = self.available();
            if let Some(end) = avail.iter().position(|&b| b == b'\n') {
                let mut line = avail[..end].to_vec();
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                self.consume(end + 1);
                if line.len() > max {
                    break;
                }
                return Ok(line);
            }
            if avail.len() > max + 1 {
                break;
            }
            if self.fill()? == 0 {
                return Err(ClientError::Closed { during });
            }
        }
        Err(ClientError::Malformed {
            reason: format!("a line {during} is longer than {max} bytes"),
        })
    }

    /// Appends exactly `n` more bytes to `out`.
    pub(super) fn read_exact_to(
        &mut self,
        mut n: usize,
        out: &mut Vec<u8>,
        during: &'static str,
    ) -> Result<(), ClientError> {
        while n > 0 {
            if self.available().is_empty() && self.fill()? == 0 {
                return Err(ClientError::Closed { during });
            }
            let take = n.min(self.available().len());
            out.extend_from_slice(&self.available()[..take]);
            self.consume(take);
            n -= take;
        }
        Ok(())
    }

    /// Everything up to the end of the stream, at most [`BODY_LIMIT`] bytes.
    pub(super) fn read_to_end(&mut self) -> Result<Vec<u8>, ClientError> {
        let mut body = Vec::new();
        loop {
            body.extend_from_slice(self.available());
            self.consume(self.available().len());
            if body.len() > BODY_LIMIT {
                return Err(ClientError::TooLarge {
                    what: "answer body",
                    limit: BODY_LIMIT,
                });
            }
            if self.fill()? == 0 {
                return Ok(body);
            }
        }
    }

    /// The final answer's status and headers, interim `1xx` answers skipped.
    pub(super) fn read_head(&mut self) -> Result<(u16, Vec<(String, String)>), ClientError> {
        let mut head_bytes = 0usize;
        loop {
            let parsed = {
                let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
                let mut response = httparse::Response::new(&mut slots);
                match response.parse(self.available()) {
                    Ok(httparse::Status::Complete(len)) => {
                        let status = response.code.unwrap_or_default();
                        let headers = response
                            .headers
                            .iter()
                            .map(|h| {
                                (
                                    h.name.to_string(),
                                    String::from_utf8_lossy(h.value).into_owned(),
                                )
                            })
                            .collect::<Vec<_>>();
                        Some((len, status, headers))
                    }
                    Ok(httparse::Status::Partial) => None,
                    Err(e) => {
                        let first_line = self
                            .available()
                            .split(|&b| b == b'\n')
                            .next()
                            .unwrap_or_default();
                        let shown: String = String::from_utf8_lossy(first_line)
                            .trim_end()
                            .chars()
                            .take(120)
                            .collect();
                        return Err(ClientError::Malformed {
                            reason: format!("answer head: {e} (first line {shown:?})"),
                        });
                    }
                }
            };
            match parsed {
                Some((len, status, headers)) => {
                    head_bytes += len;
                    if head_bytes > HEAD_LIMIT {
                        break;
                    }
                    self.consume(len);
                    match status {
                        101 => {
                            return Err(ClientError::Malformed {
                                reason: "101 Switching Protocols, but no upgrade was asked for"
                                    .to_string(),
                            })
                        }
                        100..=199 => continue,
                        _ => return Ok((status, headers)),
                    }
                }
                None => {
                    if head_bytes + self.available().len() > HEAD_LIMIT {
                        break;
                    }
                    if self.fill()? == 0 {
                        return Err(ClientError::Closed {
                            during: "before the answer head was complete",
                        });
                    }
                }
            }
        }
        Err(ClientError::TooLarge {
            what: "answer head",
            limit: HEAD_LIMIT,
        })
    }

    /// A chunked body, decoded; chunk extensions and trailers are read and ignored.
    pub(super) fn read_chunked(&mut self) -> Result<Vec<u8>, ClientError> {
        let mut body = Vec::new();
        loop {
            let line = self.read_line(LINE_LIMIT, "in a chunk-size line")?;
            let size = line.split(|&b| b == b';').next().unwrap_or_default();
            let size = std::str::from_utf8(size)
                .unwrap_or("")
                .trim_end_matches([' ', '\t']);
            let malformed = || ClientError::Malformed {
                reason: format!("bad chunk-size line {:?}", String::from_utf8_lossy(&line)),
            };
            if size.is_empty() || !size.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(malformed());
            }
            let size = u64::from_str_radix(size, 16).map_err(|_| malformed())?;
            if size == 0 {
                let mut trailers = 0usize;
                loop {
                    let line = self.read_line(LINE_LIMIT, "in the chunked trailers")?;
                    if line.is_empty() {
                        return Ok(body);
                    }
                    trailers += line.len();
                    if trailers > HEAD_LIMIT {
                        return Err(ClientError::TooLarge {
                            what: "chunked trailers",
                            limit: HEAD_LIMIT,
                        });
                    }
                }
            }
            if size > (BODY_LIMIT - body.len()) as u64 {
                return Err(ClientError::TooLarge {
                    what: "answer body",
                    limit: BODY_LIMIT,
                });
            }
            self.read_exact_to(size as usize, &mut body, "inside a chunk")?;
            if !self.read_line(0, "after a chunk")?.is_empty() {
                return Err(ClientError::Malformed {
                    reason: "chunk data not followed by CRLF".to_string(),
                });
            }
        }
    }
}

/// The single `Content-Length` value of `headers` (repeats must agree), if any.
pub(super) fn content_length(headers: &[(String, String)]) -> Result<Option<u64>, ClientError> {
    let mut found = None;
    for (_, value) in headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("content-length"))
    {
        for part in value.split(',') {
            let part = part.trim();
            let n = if !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) {
                part.parse::<u64>().ok()
            } else {
                None
            };
            let Some(n) = n else {
                return Err(ClientError::Malformed {
                    reason: format!("bad Content-Length {value:?}"),
                });
            };
            if found.is_some_and(|f| f != n) {
                return Err(ClientError::Malformed {
                    reason: "conflicting Content-Length values".to_string(),
                });
            }
            found = Some(n);
        }
    }
    Ok(found)
}

/// Reads the final answer from `src`. `head_request`: the request was `HEAD` (no body).
pub(super) fn read_answer<S: Source>(
    src: S,
    clock: &Clock,
    addr: &str,
    head_request: bool,
) -> Result<HttpAnswer, ClientError> {
    let mut conn = Conn {
        src,
        buf: Vec::new(),
        pos: 0,
        clock,
        addr,
    };
    let (status, headers) = conn.read_head()?;
    let body = if head_request || status == 204 || status == 304 {
        Vec::new()
    } else {
        let codings: Vec<String> = headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("transfer-encoding"))
            .flat_map(|(_, v)| v.split(','))
            .map(|c| c.trim().to_ascii_lowercase())
            .filter(|c| !c.is_empty())
            .collect();
        if let Some(last) = codings.last() {
            // RFC 9112 §6.3: Transfer-Encoding overrides Content-Length; a response whose
            // final coding is not chunked runs until the connection closes.
            if last == "chunked" {
                conn.read_chunked()?
            } else {
                conn.read_to_end()?
            }
        } else if let Some(len) = content_length(&headers)? {
            if len > BODY_LIMIT as u64 {
                return Err(ClientError::TooLarge {
                    what: "answer body",
                    limit: BODY_LIMIT,
                });
            }
            let mut body = Vec::with_capacity(len as usize);
            conn.read_exact_to(
                len as usize,
                &mut body,
                "before the whole Content-Length body arrived",
            )?;
            body
        } else {
            conn.read_to_end()?
        }
    };
    Ok(HttpAnswer {
        status,
        headers,
        body,
    })
}
