//! HTTP/1.1 as the download manager speaks it: GET (with Range) and PUT
//! requests, and a strict parser for the responses of object stores.
//!
//! Strict means: CRLF line ends, no obsolete line folding, a Content-Length
//! that is digits only and agrees with itself, never both Content-Length and
//! Transfer-Encoding, only the `chunked` transfer coding. Object stores send
//! nothing else; anything else is a broken or hostile peer and is reported,
//! never guessed at. The parser works on the receive buffer in place: the head
//! is parsed from the buffer's front, and the body decoder compacts chunked
//! payload within the buffer, so bodies are never copied on their way to the
//! caller. A body that ends early — the connection closed before the declared
//! length or before the last chunk — is a [`HttpError::Truncated`] error.

use std::ops::Range;

/// Bounds that keep a misbehaving peer from consuming memory or time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest response head (status line and headers) accepted.
    pub max_head_bytes: usize,
    /// Most header fields accepted.
    pub max_headers: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_head_bytes: 64 << 10, max_headers: 128 }
    }
}

/// What was wrong with a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpError {
    /// The bytes are not a valid HTTP/1.1 response.
    #[error("malformed HTTP response: {0}")]
    Malformed(String),
    /// The head grew beyond [`Limits::max_head_bytes`] or [`Limits::max_headers`].
    #[error("HTTP response head too large (limit {0})")]
    HeadTooLarge(usize),
    /// The body framing is contradictory or unsupported.
    #[error("HTTP response framing: {0}")]
    Framing(String),
    /// The connection ended before the body was complete.
    #[error("HTTP response body truncated after {received} bytes{}", .expected.map(|e| format!(" of {e}")).unwrap_or_default())]
    Truncated { expected: Option<u64>, received: u64 },
    /// A request field would break the request (CR or LF in it).
    #[error("invalid request {field}: contains a line break")]
    InvalidRequest { field: &'static str },
}

fn malformed(what: impl Into<String>) -> HttpError {
    HttpError::Malformed(what.into())
}

/// How the body of a response is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// Exactly this many bytes follow the head.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// The body ends when the server closes the connection (HTTP/1.0 style).
    UntilClose,
    /// No body (1xx, 204, 304, or the answer to HEAD).
    Empty,
}

/// A parsed status line and header section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    /// The status code, 100–599.
    pub status: u16,
    /// Header fields in order; names lower-cased, values trimmed.
    pub headers: Vec<(String, String)>,
    /// How the body is delimited.
    pub framing: Framing,
    /// Whether the connection may carry the next request.
    pub keep_alive: bool,
}

impl ResponseHead {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// Parses the response head at the start of `buf`. Returns `Ok(None)` while
/// the head is incomplete, else the head and the number of bytes it took.
/// `request_was_head` must be set for answers to HEAD (they have no body).
pub fn parse_head(buf: &[u8], limits: &Limits, request_was_head: bool) -> Result<Option<(ResponseHead, usize)>, HttpError> {
    let Some(end) = find(buf, b"\r\n\r\n") else {
        if buf.len() > limits.max_head_bytes {
            return Err(HttpError::HeadTooLarge(limits.max_head_bytes));
        }
        return Ok(None);
    };
    let head_len = end + 4;
    if head_len > limits.max_head_bytes {
        return Err(HttpError::HeadTooLarge(limits.max_head_bytes));
    }
    let text = std::str::from_utf8(&buf[..end]).map_err(|_| malformed("head is not valid UTF-8"))?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let (version, rest) = status_line.split_once(' ').ok_or_else(|| malformed(format!("bad status line {status_line:?}")))?;
    let http10 = match version {
        "HTTP/1.1" => false,
        "HTTP/1.0" => true,
        _ => return Err(malformed(format!("unsupported version {version:?}"))),
    };
    let code = rest.get(..3).filter(|c| c.bytes().all(|b| b.is_ascii_digit())).ok_or_else(|| malformed(format!("bad status code in {status_line:?}")))?;
    if rest.len() > 3 && rest.as_bytes()[3] != b' ' {
        return Err(malformed(format!("bad status code in {status_line:?}")));
    }
    let status: u16 = code.parse().expect("three digits");
    if !(100..=599).contains(&status) {
        return Err(malformed(format!("status {status} out of range")));
    }

    let mut headers = Vec::new();
    let mut content_length: Option<u64> = None;
    let mut chunked = false;
    let mut connection_close = http10;
    for line in lines {
        if headers.len() >= limits.max_headers {
            return Err(HttpError::HeadTooLarge(limits.max_headers));
        }
        if line.contains(['\r', '\n']) {
            return Err(malformed("bare CR or LF in the head"));
        }
        if line.starts_with([' ', '\t']) {
            return Err(malformed("obsolete line folding"));
        }
        let (name, value) = line.split_once(':').ok_or_else(|| malformed(format!("header line without ':' {line:?}")))?;
        if name.is_empty() || !name.bytes().all(is_token) {
            return Err(malformed(format!("bad header name {name:?}")));
        }
        let name = name.to_ascii_lowercase();
        let value = value.trim_matches([' ', '\t']).to_string();
        match name.as_str() {
            "content-length" => {
                for part in value.split(',') {
                    let part = part.trim();
                    if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) || part.len() > 19 {
                        return Err(HttpError::Framing(format!("bad Content-Length {value:?}")));
                    }
                    let n: u64 = part.parse().map_err(|_| HttpError::Framing(format!("bad Content-Length {value:?}")))?;
                    if content_length.is_some_and(|c| c != n) {
                        return Err(HttpError::Framing("Content-Length values disagree".into()));
                    }
                    content_length = Some(n);
                }
            }
            "transfer-encoding" => {
                let codings: Vec<String> = value.split(',').map(|c| c.trim().to_ascii_lowercase()).collect();
                if codings.iter().any(|c| c != "chunked") || chunked {
                    return Err(HttpError::Framing(format!("unsupported Transfer-Encoding {value:?}")));
                }
                chunked = true;
            }
            "connection" => {
                for token in value.split(',').map(|t| t.trim().to_ascii_lowercase()) {
                    match token.as_str() {
                        "close" => connection_close = true,
                        "keep-alive" if http10 => connection_close = false,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
        headers.push((name, value));
    }
    if chunked && content_length.is_some() {
        return Err(HttpError::Framing("both Content-Length and Transfer-Encoding".into()));
    }
    let framing = if request_was_head || (100..200).contains(&status) || status == 204 || status == 304 {
        Framing::Empty
    } else if chunked {
        Framing::Chunked
    } else if let Some(n) = content_length {
        Framing::Length(n)
    } else {
        Framing::UntilClose
    };
    let keep_alive = !connection_close && framing != Framing::UntilClose;
    Ok(Some((ResponseHead { status, headers, framing, keep_alive }, head_len)))
}

fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Where a chunked body's decoder is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Reading the hex size; `ext` once a `;` extension started, `cr` after CR.
    Size { size: u64, digits: u8, ext: bool, cr: bool },
    /// Inside chunk data.
    Data { remaining: u64 },
    /// After chunk data: expecting CR (false) or LF (true).
    DataEnd { cr: bool },
    /// In the trailer section: `line` bytes into the current line, `cr` after CR.
    Trailer { line: usize, cr: bool },
}

/// Decodes a response body as it arrives, in place, and knows when it ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyDecoder {
    framing: Framing,
    /// Payload bytes delivered so far.
    received: u64,
    chunk: Chunk,
    done: bool,
}

/// The result of decoding one received block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decoded {
    /// Payload bytes now at the front of the block.
    pub payload: usize,
    /// Bytes of the block that belonged to this body (the rest is not ours).
    pub consumed: usize,
}

impl BodyDecoder {
    /// A decoder for a body with `framing`.
    pub fn new(framing: Framing) -> Self {
        BodyDecoder { framing, received: 0, chunk: Chunk::Size { size: 0, digits: 0, ext: false, cr: false }, done: framing == Framing::Empty || framing == Framing::Length(0) }
    }

    /// Whether the whole body has been seen.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Payload bytes delivered so far.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// Decodes the received bytes in `block`: afterwards `block[..payload]`
    /// is body payload (for chunked bodies the framing is squeezed out by
    /// moving payload forward; other framings touch nothing).
    pub fn decode(&mut self, block: &mut [u8]) -> Result<Decoded, HttpError> {
        if self.done {
            return Ok(Decoded { payload: 0, consumed: 0 });
        }
        match self.framing {
            Framing::Empty => Ok(Decoded { payload: 0, consumed: 0 }),
            Framing::UntilClose => {
                self.received += block.len() as u64;
                Ok(Decoded { payload: block.len(), consumed: block.len() })
            }
            Framing::Length(total) => {
                let take = (total - self.received).min(block.len() as u64) as usize;
                self.received += take as u64;
                self.done = self.received == total;
                Ok(Decoded { payload: take, consumed: take })
            }
            Framing::Chunked => self.decode_chunked(block),
        }
    }

    fn decode_chunked(&mut self, block: &mut [u8]) -> Result<Decoded, HttpError> {
        let (mut read, mut write) = (0usize, 0usize);
        while read < block.len() && !self.done {
            let b = block[read];
            match &mut self.chunk {
                Chunk::Data { remaining } => {
                    let n = (*remaining).min((block.len() - read) as u64) as usize;
                    block.copy_within(read..read + n, write);
                    read += n;
                    write += n;
                    *remaining -= n as u64;
                    self.received += n as u64;
                    if *remaining == 0 {
                        self.chunk = Chunk::DataEnd { cr: false };
                    }
                    continue;
                }
                Chunk::Size { size, digits, ext, cr } => {
                    if *cr {
                        if b != b'\n' {
                            return Err(malformed("chunk size line not ended by CRLF"));
                        }
                        if *digits == 0 {
                            return Err(malformed("chunk size without digits"));
                        }
                        self.chunk = if *size == 0 { Chunk::Trailer { line: 0, cr: false } } else { Chunk::Data { remaining: *size } };
                    } else if b == b'\r' {
                        *cr = true;
                    } else if *ext {
                        if b == b'\n' {
                            return Err(malformed("bare LF in chunk extension"));
                        }
                    } else if b == b';' {
                        *ext = true;
                    } else if let Some(d) = (b as char).to_digit(16) {
                        if *digits >= 15 {
                            return Err(HttpError::Framing("chunk size too large".into()));
                        }
                        *size = *size * 16 + d as u64;
                        *digits += 1;
                    } else if b == b' ' || b == b'\t' {
                        *ext = true; // whitespace before an extension
                    } else {
                        return Err(malformed(format!("bad chunk size byte {b:#04x}")));
                    }
                }
                Chunk::DataEnd { cr } => {
                    match (*cr, b) {
                        (false, b'\r') => *cr = true,
                        (true, b'\n') => self.chunk = Chunk::Size { size: 0, digits: 0, ext: false, cr: false },
                        _ => return Err(malformed("chunk data not followed by CRLF")),
                    }
                }
                Chunk::Trailer { line, cr } => {
                    if *cr {
                        if b != b'\n' {
                            return Err(malformed("trailer line not ended by CRLF"));
                        }
                        if *line == 0 {
                            self.done = true;
                        } else {
                            *line = 0;
                            *cr = false;
                        }
                    } else if b == b'\r' {
                        *cr = true;
                    } else if b == b'\n' {
                        return Err(malformed("bare LF in trailer"));
                    } else {
                        *line += 1;
                    }
                }
            }
            read += 1;
        }
        Ok(Decoded { payload: write, consumed: read })
    }

    /// The connection ended. Fine for a complete body or one delimited by
    /// the close; a truncation otherwise.
    pub fn finish_at_eof(&mut self) -> Result<(), HttpError> {
        if self.done {
            return Ok(());
        }
        match self.framing {
            Framing::UntilClose => {
                self.done = true;
                Ok(())
            }
            Framing::Length(total) => Err(HttpError::Truncated { expected: Some(total), received: self.received }),
            _ => Err(HttpError::Truncated { expected: None, received: self.received }),
        }
    }
}

/// Appends a request head to `out`. `target` is the path and query;
/// `headers` are extra fields (e.g. presigned-URL hosts need none, PUTs carry
/// their length through `content_length`).
pub fn write_request(out: &mut Vec<u8>, method: &str, host: &str, target: &str, headers: &[(&str, &str)], content_length: Option<u64>) -> Result<(), HttpError> {
    let clean = |field: &'static str, v: &str| if v.contains(['\r', '\n']) { Err(HttpError::InvalidRequest { field }) } else { Ok(()) };
    clean("method", method)?;
    clean("host", host)?;
    clean("target", target)?;
    for (n, v) in headers {
        clean("header name", n)?;
        clean("header value", v)?;
    }
    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(if target.is_empty() { b"/" } else { target.as_bytes() });
    out.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    out.extend_from_slice(host.as_bytes());
    out.extend_from_slice(b"\r\n");
    for (n, v) in headers {
        out.extend_from_slice(n.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(v.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if let Some(n) = content_length {
        out.extend_from_slice(format!("Content-Length: {n}\r\n").as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    Ok(())
}

/// The `Range` header value for the bytes `range` (non-empty).
pub fn range_header(range: &Range<u64>) -> String {
    assert!(range.end > range.start, "empty range {range:?}");
    format!("bytes={}-{}", range.start, range.end - 1)
}

/// Parses `Content-Range: bytes first-last/total` into the byte range and the
/// object size (`None` for `*`).
pub fn parse_content_range(value: &str) -> Result<(Range<u64>, Option<u64>), HttpError> {
    let bad = || malformed(format!("bad Content-Range {value:?}"));
    let rest = value.trim().strip_prefix("bytes ").ok_or_else(bad)?;
    let (span, total) = rest.split_once('/').ok_or_else(bad)?;
    let (first, last) = span.split_once('-').ok_or_else(bad)?;
    let num = |s: &str| -> Result<u64, HttpError> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        s.parse().map_err(|_| bad())
    };
    let (first, last) = (num(first)?, num(last)?);
    if last < first {
        return Err(bad());
    }
    let total = if total == "*" { None } else { Some(num(total)?) };
    if total.is_some_and(|t| last >= t) {
        return Err(bad());
    }
    Ok((first..last + 1, total))
}
