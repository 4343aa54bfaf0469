//! What the server is doing, for Prometheus (`GET /metrics`) and load
//! balancers (`GET /healthz`); the same HTTP listener serves the read-only
//! Iceberg REST catalog (`/v1/…`, `crate::rest_catalog`).
//!
//! The counters are atomics the statement path bumps; the engine's own
//! numbers (downloads, memory pool) are read at scrape time. The HTTP side
//! answers two fixed paths with one response per connection, and the text
//! exposition format is a few lines per metric: both are written here
//! rather than pulling an HTTP server and a metrics registry into the
//! build for what is a few dozen lines of each.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use blobhouse_engine::Engine;

/// Upper bounds of the latency histogram's buckets, in seconds.
const LATENCY_BUCKETS: [f64; 12] = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0];

/// The most a scrape request may send before its blank line.
const MAX_REQUEST_BYTES: usize = 8 << 10;

/// How a statement ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Ok,
    Error,
    /// Cancel request, or the client went away.
    Cancelled,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Error => "error",
            Outcome::Cancelled => "cancelled",
        }
    }
}

/// The server's counters.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    next_query_id: AtomicU64,
    sessions: AtomicI64,
    running: AtomicI64,
    queued: AtomicI64,
    outcomes: [AtomicU64; 3],
    buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    latency_sum_micros: AtomicU64,
    latency_count: AtomicU64,
}

impl Metrics {
    pub(crate) fn query_id(&self) -> u64 {
        self.next_query_id.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub(crate) fn session_opened(&self) {
        self.sessions.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn session_closed(&self) {
        self.sessions.fetch_sub(1, Ordering::Relaxed);
    }

    pub(crate) fn queued(&self, delta: i64) {
        self.queued.fetch_add(delta, Ordering::Relaxed);
    }

    pub(crate) fn running(&self, delta: i64) {
        self.running.fetch_add(delta, Ordering::Relaxed);
    }

    pub(crate) fn finished(&self, outcome: Outcome, elapsed: Duration) {
        self.outcomes[outcome as usize].fetch_add(1, Ordering::Relaxed);
        let seconds = elapsed.as_secs_f64();
        // Cumulative buckets are summed at render time; count each once here.
        if let Some(i) = LATENCY_BUCKETS.iter().position(|&b| seconds <= b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.latency_sum_micros.fetch_add(elapsed.as_micros() as u64, Ordering::Relaxed);
        self.latency_count.fetch_add(1, Ordering::Relaxed);
    }

    /// The Prometheus text exposition of the server's and `engine`'s numbers.
    pub(crate) fn render(&self, engine: &Engine) -> String {
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, f64)]| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, value) in samples {
                let _ = writeln!(out, "{name}{labels} {value}");
            }
        };
        let plain = |v: f64| vec![(String::new(), v)];
        let load = |a: &AtomicI64| a.load(Ordering::Relaxed) as f64;
        metric("blobhouse_sessions", "gauge", "Open client sessions.", &plain(load(&self.sessions)));
        metric("blobhouse_queries_running", "gauge", "Statements running now.", &plain(load(&self.running)));
        metric("blobhouse_queries_queued", "gauge", "Statements waiting for a free slot (--max-queries).", &plain(load(&self.queued)));
        let outcomes: Vec<(String, f64)> = [Outcome::Ok, Outcome::Error, Outcome::Cancelled]
            .iter()
            .map(|o| (format!("{{state=\"{}\"}}", o.label()), self.outcomes[*o as usize].load(Ordering::Relaxed) as f64))
            .collect();
        metric("blobhouse_queries_total", "counter", "Statements finished, by how they ended.", &outcomes);
        let mut cumulative = 0;
        let mut histogram: Vec<(String, f64)> = LATENCY_BUCKETS
            .iter()
            .zip(&self.buckets)
            .map(|(bound, count)| {
                cumulative += count.load(Ordering::Relaxed);
                (format!("_bucket{{le=\"{bound}\"}}"), cumulative as f64)
            })
            .collect();
        let count = self.latency_count.load(Ordering::Relaxed) as f64;
        histogram.push(("_bucket{le=\"+Inf\"}".into(), count));
        histogram.push(("_sum".into(), self.latency_sum_micros.load(Ordering::Relaxed) as f64 / 1e6));
        histogram.push(("_count".into(), count));
        metric("blobhouse_query_duration_seconds", "histogram", "Time from a statement's start to its end.", &histogram);
        let memory = engine.memory();
        metric("blobhouse_memory_pool_bytes", "gauge", "Bytes the engine's memory pool has handed out.", &plain(memory.reserved() as f64));
        metric("blobhouse_memory_pool_peak_bytes", "gauge", "Most bytes the pool has handed out since the last statement began.", &plain(memory.peak() as f64));
        if let Some(limit) = memory.limit() {
            metric("blobhouse_memory_limit_bytes", "gauge", "The memory limit.", &plain(limit as f64));
        }
        if let Some(dm) = engine.download_manager() {
            let s = dm.stats();
            let l = &s.loops;
            metric("blobhouse_get_requests_total", "counter", "Object requests finished by the download manager.", &plain(l.requests as f64));
            metric("blobhouse_get_failures_total", "counter", "Object requests that failed for good.", &plain(l.failures as f64));
            metric("blobhouse_get_retries_total", "counter", "Attempts beyond the first.", &plain(l.retries as f64));
            metric("blobhouse_get_hedges_total", "counter", "Duplicate attempts sent for late requests.", &plain(l.hedges as f64));
            metric("blobhouse_get_cancelled_total", "counter", "Requests stopped because their query no longer needed them.", &plain(l.cancelled as f64));
            metric("blobhouse_received_bytes_total", "counter", "Bytes received from the object store.", &plain(l.received_bytes as f64));
            metric("blobhouse_gets_in_flight", "gauge", "Requests on the wire now.", &plain(s.in_flight as f64));
            metric("blobhouse_gets_pending", "gauge", "Requests submitted and not yet answered.", &plain(s.pending as f64));
        }
        // A coordinator's workers (blobhouse_cluster), each up (1) or down (0).
        if let Some(cluster) = engine.statement_extension() {
            let workers: Vec<(String, f64)> = cluster.workers().into_iter().map(|(w, up)| (format!("{{worker=\"{w}\"}}"), if up { 1.0 } else { 0.0 })).collect();
            if !workers.is_empty() {
                metric("blobhouse_cluster_worker_up", "gauge", "Whether a cluster worker is up (0: left out of statements after it failed one).", &workers);
            }
        }
        // The caching tiers, one label value per tier that is on.
        let tiers = engine.tiers();
        let memory_tier = tiers.and_then(|t| t.memory()).map(|m| m.stats());
        let ssd_tier = tiers.and_then(|t| t.ssd()).map(|s| s.stats());
        let by_tier = |memory: Option<u64>, ssd: Option<u64>| -> Vec<(String, f64)> {
            [("memory", memory), ("ssd", ssd)].into_iter().filter_map(|(tier, v)| Some((format!("{{tier=\"{tier}\"}}"), v? as f64))).collect()
        };
        if memory_tier.is_some() || ssd_tier.is_some() {
            let (m, d) = (memory_tier.as_ref(), ssd_tier.as_ref());
            metric("blobhouse_cache_hits_total", "counter", "Column-chunk reads a cache tier served.", &by_tier(m.map(|m| m.hits), d.map(|d| d.hits)));
            metric("blobhouse_cache_misses_total", "counter", "Column-chunk reads a cache tier did not hold.", &by_tier(m.map(|m| m.misses), d.map(|d| d.misses)));
            metric("blobhouse_cache_hit_bytes_total", "counter", "Bytes a cache tier served instead of the store.", &by_tier(m.map(|m| m.hit_bytes), d.map(|d| d.hit_bytes)));
            metric("blobhouse_cache_evictions_total", "counter", "Segments a cache tier evicted.", &by_tier(m.map(|m| m.evicted), d.map(|d| d.evicted)));
            metric("blobhouse_cache_used_bytes", "gauge", "Bytes a cache tier holds.", &by_tier(m.map(|m| m.used), d.map(|d| d.used)));
            metric("blobhouse_cache_capacity_bytes", "gauge", "Bytes a cache tier may hold.", &by_tier(m.map(|m| m.capacity), d.map(|d| d.capacity)));
        }
        out
    }
}

/// Serves `/metrics` and `/healthz` on `listener` until the task is
/// aborted; with `token`, only to callers that send it as a bearer token.
pub(crate) async fn serve(listener: TcpListener, metrics: Arc<Metrics>, engine: Arc<Engine>, token: Option<String>) {
    let token: Option<Arc<str>> = token.map(Arc::from);
    loop {
        let Ok((socket, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let (metrics, engine, token) = (metrics.clone(), engine.clone(), token.clone());
        tokio::spawn(async move {
            // A client that sends nothing is dropped after a while.
            let _ = tokio::time::timeout(Duration::from_secs(10), answer(socket, &metrics, &engine, token.as_deref())).await;
        });
    }
}

/// Whether `request`'s headers carry `Authorization: Bearer <token>`,
/// compared in constant time.
fn authorized(request: &[u8], token: &str) -> bool {
    let text = String::from_utf8_lossy(request);
    let Some(given) = text.lines().skip(1).find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.trim().eq_ignore_ascii_case("authorization").then(|| value.trim().to_string())
    }) else {
        return false;
    };
    let Some(given) = given.strip_prefix("Bearer ") else { return false };
    given.len() == token.len() && given.bytes().zip(token.bytes()).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0
}

async fn answer(mut socket: TcpStream, metrics: &Metrics, engine: &Engine, token: Option<&str>) -> std::io::Result<()> {
    let mut request = Vec::new();
    let mut buf = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = socket.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        request.extend_from_slice(&buf[..n]);
        if request.len() > MAX_REQUEST_BYTES {
            return respond(&mut socket, "431 Request Header Fields Too Large", "text/plain", "request too large\n").await;
        }
    }
    let line = String::from_utf8_lossy(request.split(|&b| b == b'\n').next().unwrap_or_default()).trim().to_string();
    let mut words = line.split_whitespace();
    let (method, path) = (words.next().unwrap_or_default(), words.next().unwrap_or_default());
    let path = path.split('?').next().unwrap_or_default();
    if let Some(token) = token
        && !method.is_empty()
        && !authorized(&request, token)
    {
        return respond(&mut socket, "401 Unauthorized", "text/plain", "send the server's metrics token: Authorization: Bearer <token>\n").await;
    }
    if let Some((status, body)) = crate::rest_catalog::answer(method, path, engine).await {
        return respond(&mut socket, status, "application/json", &body).await;
    }
    match (method, path) {
        ("GET", "/metrics") => respond(&mut socket, "200 OK", "text/plain; version=0.0.4", &metrics.render(engine)).await,
        ("GET", "/healthz") => respond(&mut socket, "200 OK", "text/plain", "ok\n").await,
        ("GET", _) => respond(&mut socket, "404 Not Found", "text/plain", "not found: this server has /metrics, /healthz and an Iceberg REST catalog under /v1/\n").await,
        ("", _) => respond(&mut socket, "400 Bad Request", "text/plain", "bad request\n").await,
        _ => respond(&mut socket, "405 Method Not Allowed", "text/plain", "only GET\n").await,
    }
}

async fn respond(socket: &mut TcpStream, status: &str, content_type: &str, body: &str) -> std::io::Result<()> {
    let head = format!("HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
    socket.write_all(head.as_bytes()).await?;
    socket.write_all(body.as_bytes()).await?;
    socket.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_buckets_are_cumulative_and_outcomes_counted() {
        let m = Metrics::default();
        m.finished(Outcome::Ok, Duration::from_millis(3));
        m.finished(Outcome::Error, Duration::from_millis(300));
        m.finished(Outcome::Cancelled, Duration::from_secs(100));
        assert_eq!(m.outcomes.iter().map(|o| o.load(Ordering::Relaxed)).collect::<Vec<_>>(), [1, 1, 1]);
        // 3 ms in the 5 ms bucket, 300 ms in 0.5 s, 100 s beyond every bound.
        assert_eq!(m.buckets[1].load(Ordering::Relaxed), 1);
        assert_eq!(m.buckets[7].load(Ordering::Relaxed), 1);
        assert_eq!(m.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum::<u64>(), 2);
        assert_eq!(m.latency_count.load(Ordering::Relaxed), 3);
    }
}
