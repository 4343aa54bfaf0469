//! The testbed's promises: up/down leave nothing behind, and every fault mode
//! the profiles use is real on the wire.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use blobhouse_testbed::{Lifetime, Profile, Testbed, Toxic, process};
use serde_json::json;

/// Sends a keep-alive GET on a fresh connection, as object-store clients do,
/// and reads the response until its Content-Length is complete, the peer
/// closes, or `timeout` passes between two reads. Returns what arrived.
fn get(port: u16, path: &str, timeout: Duration) -> std::io::Result<Vec<u8>> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(timeout))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 65536];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize = head.lines().find_map(|l| l.strip_prefix("content-length: ").map(|v| v.trim().parse().unwrap())).unwrap_or(0);
            if buf.len() >= end + 4 + len {
                return Ok(buf);
            }
        }
        match s.read(&mut chunk)? {
            0 => return Ok(buf),
            n => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

fn status(response: &[u8]) -> u16 {
    std::str::from_utf8(&response[9..12]).unwrap().parse().unwrap()
}

fn content_length_and_body(response: &[u8]) -> (usize, usize) {
    let text = String::from_utf8_lossy(response);
    let (head, _) = text.split_once("\r\n\r\n").expect("headers");
    let len = head.lines().find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length: ").map(|v| v.trim().parse().unwrap())).expect("content-length");
    let body = response.len() - head.len() - 4;
    (len, body)
}

/// A proxy of its own in front of unshaped nginx, with one toxic.
fn faulty_proxy(tb: &Testbed, name: &str, toxic: Toxic) -> u16 {
    let port = process::free_port().unwrap();
    let api = tb.toxiproxy();
    api.proxy(name, port, tb.state().nginx_port).unwrap();
    api.add_toxic(name, &toxic).unwrap();
    port
}

#[test]
fn up_reshape_and_down_leave_no_process() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tb");
    let tb = Testbed::up(&path, Profile::S3, Lifetime::TiedToThisProcess).unwrap();
    let pids = tb.state().pids.clone();
    assert_eq!(pids.len(), 3);
    assert!(pids.iter().all(|&p| process::alive(p)));
    let s3_endpoint = tb.endpoints().s3;
    assert_ne!(s3_endpoint, tb.endpoints().s3_direct, "s3 goes through the proxy");
    // Up again: same processes, new shape.
    let again = Testbed::up(&path, Profile::Lan, Lifetime::TiedToThisProcess).unwrap();
    assert_eq!(again.state().pids, pids);
    assert_eq!(again.endpoints().s3, again.endpoints().s3_direct);
    assert_eq!(Testbed::status(&path).unwrap().unwrap().profile(), Profile::Lan);
    let stopped = Testbed::down(&path).unwrap();
    assert_eq!(stopped.len(), 3);
    assert!(pids.iter().all(|&p| !process::alive(p)), "a testbed process survived down");
    assert!(!path.exists());
    assert!(Testbed::down(&path).unwrap().is_empty(), "down is idempotent");
}

#[test]
fn s3_profile_delays_the_first_byte() {
    let dir = tempfile::tempdir().unwrap();
    let tb = Testbed::up(&dir.path().join("tb"), Profile::S3, Lifetime::TiedToThisProcess).unwrap();
    let port = tb.state().nginx_proxy_port;
    // Take the fastest of a few: stalls and lost connections are a few per cent.
    let best = (0..5)
        .filter_map(|_| {
            let t = Instant::now();
            get(port, "/health", Duration::from_secs(10)).ok().filter(|r| status(r) == 200).map(|_| t.elapsed())
        })
        .min()
        .expect("some request succeeds");
    assert!(best >= Duration::from_millis(20), "first byte after {best:?}");
    Testbed::down(tb.dir()).unwrap();
}

#[test]
fn each_fault_mode_is_real() {
    let dir = tempfile::tempdir().unwrap();
    let tb = Testbed::up(&dir.path().join("tb"), Profile::Lan, Lifetime::TiedToThisProcess).unwrap();
    std::fs::write(tb.dir().join("www/blob"), vec![7u8; 64 << 10]).unwrap();

    // A stalled connection: the request times out.
    let stalled = faulty_proxy(&tb, "stalled", Toxic::new("lost", "timeout", 1.0, json!({"timeout": 0})));
    let t = Instant::now();
    let err = get(stalled, "/blob", Duration::from_millis(800)).expect_err("a stalled request must not complete");
    assert!(matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut), "{err:?}");
    assert!(t.elapsed() >= Duration::from_millis(700));

    // A dropped connection: reset by the peer (or closed before any byte).
    let reset = faulty_proxy(&tb, "reset", Toxic::new("reset", "reset_peer", 1.0, json!({"timeout": 0})));
    match get(reset, "/blob", Duration::from_secs(5)) {
        Err(e) => assert!(matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe | ErrorKind::UnexpectedEof), "{e:?}"),
        Ok(bytes) => assert!(bytes.is_empty(), "a reset connection delivered {} bytes", bytes.len()),
    }

    // A connection cut mid-body: the body is shorter than Content-Length.
    let cut = faulty_proxy(&tb, "cut", Toxic::new("truncate", "limit_data", 1.0, json!({"bytes": 20000})));
    let response = get(cut, "/blob", Duration::from_secs(5)).unwrap();
    let (declared, received) = content_length_and_body(&response);
    assert_eq!(declared, 64 << 10);
    assert!(received < declared, "received {received} of {declared} bytes");

    // Throttling: beyond the rate, nginx answers 503. Eight clients push
    // until the limit trips (bounded), however slow the machine is.
    let throttled = tb.state().nginx_throttled_port;
    let seen_503 = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let seen_503 = seen_503.clone();
            std::thread::spawn(move || {
                let mut statuses = Vec::new();
                for _ in 0..500 {
                    let s = status(&get(throttled, "/blob", Duration::from_secs(5)).unwrap());
                    statuses.push(s);
                    if s == 503 {
                        seen_503.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    if seen_503.load(std::sync::atomic::Ordering::Relaxed) && statuses.len() >= 10 {
                        break;
                    }
                }
                statuses
            })
        })
        .collect();
    let statuses: Vec<u16> = clients.into_iter().flat_map(|c| c.join().unwrap()).collect();
    let (ok, slow) = (statuses.iter().filter(|&&s| s == 200).count(), statuses.iter().filter(|&&s| s == 503).count());
    assert!(ok > 0 && slow > 0, "{ok} x 200, {slow} x 503");
    assert_eq!(ok + slow, statuses.len(), "only 200 and 503 expected");

    // An upload cut after 16 KiB sent: the server never keeps a partial
    // object (nginx, like MinIO, drops a body shorter than Content-Length).
    let upload_cut = faulty_proxy(&tb, "upload-cut", Toxic::upstream("truncate-upload", "limit_data", 1.0, json!({"bytes": 16 << 10})));
    let body = vec![9u8; 256 << 10];
    let answer = (|| -> std::io::Result<Vec<u8>> {
        let mut s = TcpStream::connect(("127.0.0.1", upload_cut))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(s, "PUT /upload/cut HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\n\r\n", body.len())?;
        s.write_all(&body)?;
        let mut answer = Vec::new();
        s.read_to_end(&mut answer)?;
        Ok(answer)
    })();
    // The client sees a broken pipe, a reset, or an error status; never a success.
    if let Ok(answer) = &answer {
        assert!(!answer.starts_with(b"HTTP/1.1 2"), "a cut upload was accepted: {}", String::from_utf8_lossy(answer));
    }
    std::thread::sleep(Duration::from_millis(200));
    let kept = std::fs::metadata(tb.dir().join("www/upload/cut")).map(|m| m.len()).ok();
    assert_eq!(kept, None, "a partial upload was kept");

    // S3 through nginx: a share of requests is answered 503 SlowDown before
    // MinIO sees it; the others reach MinIO (403 here: unsigned).
    let s3 = tb.state().nginx_s3_port;
    let mut by_status = std::collections::BTreeMap::<u16, usize>::new();
    for _ in 0..2000 {
        let r = get(s3, "/testbed/some-object", Duration::from_secs(5)).unwrap();
        if status(&r) == 503 {
            assert!(String::from_utf8_lossy(&r).contains("<Code>SlowDown</Code>"), "{}", String::from_utf8_lossy(&r));
        }
        *by_status.entry(status(&r)).or_default() += 1;
        if by_status.get(&503).is_some_and(|n| *n >= 2) && by_status.len() >= 2 {
            break;
        }
    }
    assert!(by_status.get(&503).is_some_and(|n| *n >= 2) && by_status.get(&403).is_some(), "{by_status:?}");
    Testbed::down(tb.dir()).unwrap();
}

/// The bottleneck profile: MinIO behind a veth link into a namespace of the
/// testbed's own, shaped by tbf each way; the link carries the traffic;
/// re-shaping to a profile with MinIO elsewhere is refused; down removes
/// the namespace and the link.
#[test]
fn bottleneck_puts_minio_behind_a_shaped_link_and_down_removes_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tb");
    let tb = Testbed::up(&path, Profile::Bottleneck, Lifetime::TiedToThisProcess).unwrap();
    let link = tb.link().expect("the bottleneck profile has a link");
    assert!(link.exists(), "{link:?}");
    let endpoint = tb.endpoints().s3;
    assert_eq!(endpoint, format!("http://{}:{}", link.store_ip, tb.state().minio_port));
    assert_eq!(tb.endpoints().s3_direct, endpoint, "no unshaped way around the link");
    // MinIO is not on the compute side's loopback.
    assert!(TcpStream::connect(("127.0.0.1", tb.state().minio_port)).is_err());
    let shaping = std::process::Command::new("tc").args(["qdisc", "show", "dev", &link.host_if]).output().unwrap();
    let mbit = blobhouse_testbed::Link::configured_mbit().unwrap();
    let shaping = String::from_utf8_lossy(&shaping.stdout);
    assert!(shaping.contains("tbf") && shaping.contains(&format!("rate {mbit}Mbit")), "{shaping}");
    let (before, _) = link.bytes_carried().unwrap();
    for _ in 0..20 {
        let (status, _) = process::http_to(&link.store_ip, tb.state().minio_port, "GET", "/minio/health/live", None).unwrap();
        assert_eq!(status, 200);
    }
    let (after, to_store) = link.bytes_carried().unwrap();
    assert!(after > before + 20 * 100 && to_store > 0, "the link's counters: {before} → {after}, {to_store} towards the store");
    let err = Testbed::up(&path, Profile::S3, Lifetime::TiedToThisProcess).unwrap_err().to_string();
    assert!(err.contains("testbed down"), "{err}");
    let pids = tb.state().pids.clone();
    Testbed::down(&path).unwrap();
    assert!(!link.exists(), "the namespace is gone");
    assert!(pids.iter().all(|&p| !process::alive(p)));
    let ip = std::process::Command::new("ip").args(["link", "show", &link.host_if]).output().unwrap();
    assert!(!ip.status.success(), "the veth pair is gone");
}
