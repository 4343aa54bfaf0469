//! The HTTP/1.1 codec against every way a response can arrive or break.

use blobhouse_io::http::*;

/// Receives `wire` in blocks cut at `cuts`, as a socket would deliver it:
/// head bytes accumulate until parsed, then each block is body-decoded in place.
fn receive(wire: &[u8], cuts: &[usize], request_was_head: bool) -> Result<(ResponseHead, Vec<u8>, bool), HttpError> {
    let limits = Limits::default();
    let mut pending: Vec<u8> = Vec::new();
    let mut head: Option<(ResponseHead, BodyDecoder)> = None;
    let mut body = Vec::new();
    let mut bounds: Vec<usize> = cuts.iter().copied().filter(|&c| c > 0 && c < wire.len()).collect();
    bounds.sort_unstable();
    bounds.dedup();
    bounds.push(wire.len());
    let mut start = 0;
    for end in bounds {
        let mut block = wire[start..end].to_vec();
        start = end;
        if head.is_none() {
            pending.extend_from_slice(&block);
            match parse_head(&pending, &limits, request_was_head)? {
                None => continue,
                Some((h, n)) => {
                    let decoder = BodyDecoder::new(h.framing);
                    block = pending[n..].to_vec();
                    head = Some((h, decoder));
                }
            }
        }
        let (_, decoder) = head.as_mut().unwrap();
        let d = decoder.decode(&mut block)?;
        assert_eq!(d.consumed, block.len(), "bytes after the end of the body");
        body.extend_from_slice(&block[..d.payload]);
    }
    let (h, mut decoder) = head.ok_or_else(|| HttpError::Malformed("no head".into()))?;
    let eof = decoder.finish_at_eof();
    eof?;
    Ok((h, body, decoder.is_done()))
}

fn chunked(payload: &[u8], sizes: &[usize]) -> Vec<u8> {
    let mut out = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    let mut at = 0;
    let mut i = 0;
    while at < payload.len() {
        let n = sizes[i % sizes.len()].max(1).min(payload.len() - at);
        out.extend_from_slice(format!("{n:x}{}\r\n", if i % 3 == 1 { ";ext=1" } else { "" }).as_bytes());
        out.extend_from_slice(&payload[at..at + n]);
        out.extend_from_slice(b"\r\n");
        at += n;
        i += 1;
    }
    out.extend_from_slice(b"0\r\nx-trailer: t\r\n\r\n");
    out
}

/// A small deterministic generator, so failures reproduce.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

const RANGE_RESPONSE: &[u8] = b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 100-109/1000\r\nContent-Length: 10\r\nETag: \"x\"\r\n\r\n0123456789";

#[test]
fn a_range_response_parses_at_every_split_point() {
    for cut in 0..=RANGE_RESPONSE.len() {
        for cut2 in [cut, cut + 1, cut + 7] {
            let (head, body, done) = receive(RANGE_RESPONSE, &[cut, cut2], false).unwrap();
            assert_eq!(head.status, 206);
            assert_eq!(head.framing, Framing::Length(10));
            assert!(head.keep_alive);
            assert_eq!(head.header("content-range"), Some("bytes 100-109/1000"));
            assert_eq!(head.header("ETag"), Some("\"x\""));
            assert_eq!(body, b"0123456789");
            assert!(done);
        }
    }
}

#[test]
fn incomplete_heads_ask_for_more() {
    let head_len = RANGE_RESPONSE.len() - 10;
    for n in 0..head_len {
        assert_eq!(parse_head(&RANGE_RESPONSE[..n], &Limits::default(), false), Ok(None), "prefix {n}");
    }
    let (_, used) = parse_head(RANGE_RESPONSE, &Limits::default(), false).unwrap().unwrap();
    assert_eq!(used, head_len);
}

#[test]
fn chunked_bodies_decode_in_place_for_any_chunking_and_any_split() {
    let mut rng = Rng(0x5eed);
    for round in 0..300 {
        let len = rng.below(3000);
        let payload: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        let sizes: Vec<usize> = (0..1 + rng.below(5)).map(|_| 1 + rng.below(700)).collect();
        let wire = chunked(&payload, &sizes);
        let cuts: Vec<usize> = (0..rng.below(12)).map(|_| rng.below(wire.len() + 1)).collect();
        let (head, body, done) = receive(&wire, &cuts, false).unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(head.framing, Framing::Chunked);
        assert_eq!(body, payload, "round {round}");
        assert!(done);
    }
}

#[test]
fn every_truncation_is_detected() {
    // Cut the wire anywhere inside the body: the close must be an error.
    let head_len = RANGE_RESPONSE.len() - 10;
    for keep in head_len..RANGE_RESPONSE.len() {
        let err = receive(&RANGE_RESPONSE[..keep], &[], false).unwrap_err();
        assert_eq!(err, HttpError::Truncated { expected: Some(10), received: (keep - head_len) as u64 });
    }
    let wire = chunked(b"hello chunked world", &[5]);
    let head_len = find_head_end(&wire);
    for keep in head_len..wire.len() {
        let err = receive(&wire[..keep], &[], false).unwrap_err();
        assert!(matches!(err, HttpError::Truncated { expected: None, .. }), "cut at {keep}: {err:?}");
    }
}

fn find_head_end(wire: &[u8]) -> usize {
    wire.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4
}

#[test]
fn bodies_without_length_and_without_body() {
    let (h, body, _) = receive(b"HTTP/1.0 200 OK\r\nServer: x\r\n\r\nall of it", &[3, 20], false).unwrap();
    assert_eq!((h.framing, h.keep_alive), (Framing::UntilClose, false));
    assert_eq!(body, b"all of it");
    for (wire, head) in [
        (&b"HTTP/1.1 204 No Content\r\n\r\n"[..], false),
        (b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n", false),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n", true),
        (b"HTTP/1.1 100 Continue\r\n\r\n", false),
    ] {
        let (h, body, done) = receive(wire, &[], head).unwrap();
        assert_eq!(h.framing, Framing::Empty);
        assert!(body.is_empty() && done);
    }
    let (h, _, _) = receive(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", &[], false).unwrap();
    assert!(!h.keep_alive);
    let (h, _, _) = receive(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n", &[], false).unwrap();
    assert!(h.keep_alive);
}

#[test]
fn bytes_after_a_body_are_not_consumed() {
    let mut block = b"0123456789HTTP/1.1".to_vec();
    let mut d = BodyDecoder::new(Framing::Length(10));
    assert_eq!(d.decode(&mut block).unwrap(), Decoded { payload: 10, consumed: 10 });
    assert!(d.is_done());
}

#[test]
fn malformed_and_hostile_responses_are_refused() {
    let cases: &[(&[u8], &str)] = &[
        (b"HTTP/2 200 OK\r\n\r\n", "version"),
        (b"HTTP/1.1 2000 OK\r\n\r\n", "status"),
        (b"HTTP/1.1 99 Low\r\n\r\n", "status code"),
        (b"HTTP/1.1 099 Low\r\n\r\n", "range"),
        (b"HTTP/1.1 600 High\r\n\r\n", "range"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 12a\r\n\r\n", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", "disagree"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", "both"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "Transfer-Encoding"),
        (b"HTTP/1.1 200 OK\r\nX-A: 1\r\n folded\r\n\r\n", "folding"),
        (b"HTTP/1.1 200 OK\r\nBad Name: 1\r\n\r\n", "header name"),
        (b"HTTP/1.1 200 OK\r\nNoColon\r\n\r\n", "without ':'"),
        (b"HTTP/1.1 200 OK\r\nX: a\nY: b\r\n\r\n", "bare CR or LF"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX", "CRLF"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffff\r\n", "too large"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\r\n", "without digits"),
    ];
    for (wire, expect) in cases {
        let err = receive(wire, &[], false).expect_err(&String::from_utf8_lossy(wire));
        assert!(err.to_string().contains(expect), "{:?}: {err}", String::from_utf8_lossy(wire));
    }
    let mut huge = b"HTTP/1.1 200 OK\r\n".to_vec();
    huge.extend(std::iter::repeat_n(b'a', 70_000));
    assert_eq!(parse_head(&huge, &Limits::default(), false), Err(HttpError::HeadTooLarge(64 << 10)));
    let many: String = (0..200).map(|i| format!("X-{i}: v\r\n")).collect();
    let wire = format!("HTTP/1.1 200 OK\r\n{many}\r\n");
    assert_eq!(parse_head(wire.as_bytes(), &Limits::default(), false), Err(HttpError::HeadTooLarge(128)));
}

#[test]
fn requests_are_written_exactly_and_refuse_injection() {
    let mut out = Vec::new();
    write_request(&mut out, "GET", "127.0.0.1:9000", "/bucket/key?X-Amz-Signature=abc", &[("Range", &range_header(&(0..16)))], None).unwrap();
    assert_eq!(out, b"GET /bucket/key?X-Amz-Signature=abc HTTP/1.1\r\nHost: 127.0.0.1:9000\r\nRange: bytes=0-15\r\n\r\n");
    let mut out = Vec::new();
    write_request(&mut out, "PUT", "h", "/k", &[], Some(3)).unwrap();
    assert_eq!(out, b"PUT /k HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\n");
    let err = write_request(&mut Vec::new(), "GET", "h", "/k\r\nX-Evil: 1", &[], None).unwrap_err();
    assert_eq!(err, HttpError::InvalidRequest { field: "target" });
    let err = write_request(&mut Vec::new(), "GET", "h", "/k", &[("X", "a\nb")], None).unwrap_err();
    assert_eq!(err, HttpError::InvalidRequest { field: "header value" });
}

#[test]
fn content_ranges_round_trip_and_reject_nonsense() {
    assert_eq!(parse_content_range("bytes 100-109/1000"), Ok((100..110, Some(1000))));
    assert_eq!(parse_content_range("bytes 0-0/*"), Ok((0..1, None)));
    for bad in ["bytes 10-5/100", "bytes 0-100/100", "items 0-1/2", "bytes -1/2", "bytes 1-2", "bytes a-b/c"] {
        assert!(parse_content_range(bad).is_err(), "{bad}");
    }
    assert_eq!(range_header(&(8..(16 << 20))), "bytes=8-16777215");
}
