//! `blobhouse bench calibrate`: the testbed's own versions of the AnyBlob
//! paper's Figure 2 (first-byte and total latency per request size) and
//! Figure 10 (aggregate throughput against requests in flight), with the
//! paper's model fitted to the measurements:
//!
//!   requests = throughput × (baseLatency + size × dataLatency) / size
//!
//! Requests go to the testbed's nginx (cheap on CPU, so a 2-core machine
//! measures the shaping rather than the server) through the profile's proxy,
//! with reqwest as the client. The project's download manager is measured
//! elsewhere; this calibrates the environment it will be measured in.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use blobhouse_testbed::{CALIBRATION_OBJECTS, Profile, Testbed, profile};

use crate::plot::{Axes, Series, line_chart};

/// What to measure.
#[derive(Debug, Clone)]
pub struct CalibrateOptions {
    /// Sequential samples per request size.
    pub samples: usize,
    /// Concurrency levels of the throughput sweep.
    pub concurrency: Vec<usize>,
    /// Measurement window per concurrency level.
    pub window: Duration,
    /// Where tables (CSV) and plots (PNG) go.
    pub out: PathBuf,
}

const MIB: f64 = 1048576.0;

/// Outcome of one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Outcome {
    /// Complete: time to the response headers and to the last byte.
    Ok { first_byte: Duration, total: Duration },
    /// No complete answer in time (stalled or lost).
    Timeout,
    /// Connection reset or closed before the body was complete.
    Broken,
    /// HTTP status other than 200/206.
    Status(u16),
}

/// Latency statistics of one request size.
#[derive(Debug, Clone)]
pub struct SizeStats {
    pub label: String,
    pub size: usize,
    pub samples: Vec<Outcome>,
}

impl SizeStats {
    fn ok(&self) -> (Vec<f64>, Vec<f64>) {
        let mut fb = Vec::new();
        let mut total = Vec::new();
        for o in &self.samples {
            if let Outcome::Ok { first_byte, total: t } = o {
                fb.push(first_byte.as_secs_f64() * 1e3);
                total.push(t.as_secs_f64() * 1e3);
            }
        }
        fb.sort_by(f64::total_cmp);
        total.sort_by(f64::total_cmp);
        (fb, total)
    }
}

/// One point of the throughput sweep.
#[derive(Debug, Clone, Copy)]
pub struct SweepPoint {
    pub concurrency: usize,
    pub mib_per_s: f64,
}

/// The fitted request model.
#[derive(Debug, Clone, Copy)]
pub struct Model {
    /// Median first-byte latency of 1 KiB requests, seconds.
    pub base_latency: f64,
    /// Median (total − base) per MiB of 16 MiB requests, seconds per MiB.
    pub data_latency_per_mib: f64,
    /// Highest measured aggregate throughput, MiB/s.
    pub peak_mib_per_s: f64,
}

impl Model {
    /// Throughput the model predicts with `c` requests of `size_mib` in flight.
    pub fn throughput(&self, c: usize, size_mib: f64) -> f64 {
        (c as f64 * size_mib / (self.base_latency + size_mib * self.data_latency_per_mib)).min(self.peak_mib_per_s)
    }

    /// Requests in flight the model needs for the peak throughput.
    pub fn requests_for_peak(&self, size_mib: f64) -> f64 {
        self.peak_mib_per_s * (self.base_latency + size_mib * self.data_latency_per_mib) / size_mib
    }
}

/// Everything a calibration run measured.
#[derive(Debug, Clone)]
pub struct Calibration {
    pub profile: Profile,
    pub sizes: Vec<SizeStats>,
    pub sweep: Vec<SweepPoint>,
    pub model: Model,
}

fn client(max_conns: usize, timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(max_conns)
        .timeout(timeout)
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        .build()
        .expect("reqwest client")
}

/// Per-request timeout: generous against the profile's expected duration, so
/// stalls of seconds complete but lost requests are cut.
fn request_timeout(p: Profile, size: usize) -> Duration {
    let kbps = match p {
        Profile::S3 => profile::S3_BANDWIDTH_KBPS,
        Profile::S3Scaled => profile::S3_SCALED_BANDWIDTH_KBPS,
        Profile::Lan | Profile::Throttled => 1_000_000,
        // The link is shared by every request in flight: assume 16.
        Profile::Bottleneck => blobhouse_testbed::Link::configured_mbit().unwrap_or(blobhouse_testbed::link::DEFAULT_LINK_MBIT) as u64 * 125 / 16,
    };
    Duration::from_secs(8) + Duration::from_secs_f64(3.0 * size as f64 / (kbps as f64 * 1000.0))
}

async fn one_request(client: &reqwest::Client, url: &str, bytes: Option<&AtomicU64>) -> Outcome {
    let started = Instant::now();
    let mut response = match client.get(url).send().await {
        Ok(r) => r,
        Err(e) if e.is_timeout() => return Outcome::Timeout,
        Err(_) => return Outcome::Broken,
    };
    let first_byte = started.elapsed();
    let status = response.status().as_u16();
    if status != 200 && status != 206 {
        return Outcome::Status(status);
    }
    let expected = response.content_length();
    let mut received = 0u64;
    loop {
        match response.chunk().await {
            Ok(Some(c)) => {
                received += c.len() as u64;
                if let Some(b) = bytes {
                    b.fetch_add(c.len() as u64, Ordering::Relaxed);
                }
            }
            Ok(None) => break,
            Err(e) if e.is_timeout() => return Outcome::Timeout,
            Err(_) => return Outcome::Broken,
        }
    }
    if expected.is_some_and(|n| n != received) {
        return Outcome::Broken;
    }
    Outcome::Ok { first_byte, total: started.elapsed() }
}

/// Runs the calibration against a running testbed.
pub async fn calibrate(tb: &Testbed, opts: &CalibrateOptions, progress: &dyn Fn(&str)) -> Result<Calibration, String> {
    tb.ensure_calibration_objects().map_err(|e| e.to_string())?;
    let profile = tb.profile();
    let base = tb.endpoints().http;
    // Slow per-connection profiles sample several requests at once: the
    // samples do not compete for the link, and the run stays short.
    let parallel = if profile == Profile::S3Scaled { 8 } else { 1 };
    let mut sizes = Vec::new();
    for (label, size, count) in CALIBRATION_OBJECTS {
        progress(&format!("latency of {label} requests ({} samples)", opts.samples));
        // A fresh connection per sample: the testbed draws faults per
        // connection, so each sample is an independent draw, as each request
        // to S3 is.
        let c = client(0, request_timeout(profile, size));
        let mut samples = Vec::with_capacity(opts.samples);
        let mut i = 0;
        while samples.len() < opts.samples {
            let batch: Vec<String> = (0..parallel.min(opts.samples - samples.len()))
                .map(|k| format!("{base}/cal/{label}-{}", (i + k) % count))
                .collect();
            i += batch.len();
            let outcomes = futures::future::join_all(batch.iter().map(|u| one_request(&c, u, None))).await;
            samples.extend(outcomes);
        }
        sizes.push(SizeStats { label: label.to_string(), size, samples });
    }

    let (label16, size16, count16) = CALIBRATION_OBJECTS[3];
    let mut sweep = Vec::new();
    for &conc in &opts.concurrency {
        progress(&format!("throughput with {conc} requests of {label16} in flight"));
        let c = client(conc, request_timeout(profile, size16));
        let bytes = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let mut workers = Vec::with_capacity(conc);
        for w in 0..conc {
            let (c, bytes, stop, base) = (c.clone(), bytes.clone(), stop.clone(), base.clone());
            workers.push(tokio::spawn(async move {
                let mut n = w;
                while !stop.load(Ordering::Relaxed) {
                    let url = format!("{base}/cal/{label16}-{}", n % count16);
                    let _ = one_request(&c, &url, Some(&bytes)).await;
                    n += conc;
                }
            }));
        }
        // Warm up (connections, slow start), then count bytes over the window.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let b0 = bytes.load(Ordering::Relaxed);
        let t0 = Instant::now();
        tokio::time::sleep(opts.window).await;
        let mib_per_s = (bytes.load(Ordering::Relaxed) - b0) as f64 / MIB / t0.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        for w in workers {
            w.abort();
        }
        sweep.push(SweepPoint { concurrency: conc, mib_per_s });
    }

    let median = |v: &[f64]| if v.is_empty() { f64::NAN } else { v[v.len() / 2] };
    let (fb_1k, _) = sizes[0].ok();
    let (_, total_16m) = sizes[3].ok();
    let base_latency = median(&fb_1k) / 1e3;
    let data_latency_per_mib = ((median(&total_16m) / 1e3) - base_latency) / (size16 as f64 / MIB);
    let peak_mib_per_s = sweep.iter().map(|p| p.mib_per_s).fold(0.0, f64::max);
    let cal = Calibration { profile, sizes, sweep, model: Model { base_latency, data_latency_per_mib, peak_mib_per_s } };
    write_outputs(&cal, &opts.out)?;
    Ok(cal)
}

fn pct(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v[((v.len() - 1) as f64 * p).round() as usize]
}

impl Calibration {
    /// The report as text tables.
    pub fn report(&self) -> String {
        let mut s = String::new();
        s.push_str(&format!("Calibration of profile '{}' ({})\n\n", self.profile.name(), self.profile.description()));
        s.push_str("size  samples  ok  timeout broken 5xx | first byte ms p5 / p50 / p95 / p99 | total ms p5 / p50 / p95 | MiB/s per request p5 / p50 / p95\n");
        for st in &self.sizes {
            let (fb, total) = st.ok();
            let count = |f: fn(&Outcome) -> bool| st.samples.iter().filter(|o| f(o)).count();
            let ok = count(|o| matches!(o, Outcome::Ok { .. }));
            let timeout = count(|o| matches!(o, Outcome::Timeout));
            let broken = count(|o| matches!(o, Outcome::Broken));
            let status = count(|o| matches!(o, Outcome::Status(_)));
            let mut bw: Vec<f64> = total.iter().map(|ms| st.size as f64 / MIB / (ms / 1e3)).collect();
            bw.sort_by(f64::total_cmp);
            s.push_str(&format!(
                "{:>4} {:>8} {:>3} {:>8} {:>6} {:>3} | {:>7.1} / {:>7.1} / {:>7.1} / {:>7.1}       | {:>7.1} / {:>7.1} / {:>7.1} | {:>7.1} / {:>7.1} / {:>7.1}\n",
                st.label,
                st.samples.len(),
                ok,
                timeout,
                broken,
                status,
                pct(&fb, 0.05),
                pct(&fb, 0.5),
                pct(&fb, 0.95),
                pct(&fb, 0.99),
                pct(&total, 0.05),
                pct(&total, 0.5),
                pct(&total, 0.95),
                pct(&bw, 0.05),
                pct(&bw, 0.5),
                pct(&bw, 0.95),
            ));
        }
        let m = &self.model;
        s.push_str(&format!(
            "\nmodel: base latency {:.1} ms, data latency {:.2} ms/MiB, peak {:.0} MiB/s => {:.0} requests of 16 MiB in flight needed for the peak\n\n",
            m.base_latency * 1e3,
            m.data_latency_per_mib * 1e3,
            m.peak_mib_per_s,
            m.requests_for_peak(16.0)
        ));
        s.push_str("in flight | measured MiB/s | model MiB/s\n");
        for p in &self.sweep {
            s.push_str(&format!("{:>9} | {:>14.1} | {:>11.1}\n", p.concurrency, p.mib_per_s, m.throughput(p.concurrency, 16.0)));
        }
        s
    }
}

fn write_outputs(cal: &Calibration, out: &Path) -> Result<(), String> {
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let mut csv = String::from("size_bytes,outcome,first_byte_ms,total_ms\n");
    for st in &cal.sizes {
        for o in &st.samples {
            match o {
                Outcome::Ok { first_byte, total } => csv.push_str(&format!("{},ok,{:.3},{:.3}\n", st.size, first_byte.as_secs_f64() * 1e3, total.as_secs_f64() * 1e3)),
                Outcome::Timeout => csv.push_str(&format!("{},timeout,,\n", st.size)),
                Outcome::Broken => csv.push_str(&format!("{},broken,,\n", st.size)),
                Outcome::Status(code) => csv.push_str(&format!("{},http-{code},,\n", st.size)),
            }
        }
    }
    std::fs::write(out.join("latency.csv"), csv).map_err(|e| e.to_string())?;
    let mut csv = String::from("in_flight,measured_mib_s,model_mib_s\n");
    for p in &cal.sweep {
        csv.push_str(&format!("{},{:.3},{:.3}\n", p.concurrency, p.mib_per_s, cal.model.throughput(p.concurrency, 16.0)));
    }
    std::fs::write(out.join("throughput.csv"), csv).map_err(|e| e.to_string())?;
    std::fs::write(out.join("report.txt"), cal.report()).map_err(|e| e.to_string())?;

    // Figure 2: latency CDFs, first byte and total, per size.
    let mut series = Vec::new();
    for st in &cal.sizes {
        let (fb, total) = st.ok();
        let cdf = |v: &[f64]| v.iter().enumerate().map(|(i, &ms)| (ms, (i + 1) as f64 / v.len() as f64)).collect::<Vec<_>>();
        series.push(Series { label: format!("{} first byte", st.label), points: cdf(&fb), markers: false });
        series.push(Series { label: format!("{} total", st.label), points: cdf(&total), markers: false });
    }
    let title = format!("Request latency, profile {} (one request at a time)", cal.profile.name());
    line_chart(&out.join("latency.png"), &Axes { title, x_label: "latency [ms]".into(), y_label: "fraction of requests".into(), log_x: true, legend_lower_right: true }, &series)?;

    // Figure 10: throughput against requests in flight, measured and modelled.
    let measured: Vec<(f64, f64)> = cal.sweep.iter().map(|p| (p.concurrency as f64, p.mib_per_s)).collect();
    let model: Vec<(f64, f64)> = cal.sweep.iter().map(|p| (p.concurrency as f64, cal.model.throughput(p.concurrency, 16.0))).collect();
    let title = format!("Aggregate throughput of 16 MiB requests, profile {}", cal.profile.name());
    line_chart(
        &out.join("throughput.png"),
        &Axes { title, x_label: "requests in flight".into(), y_label: "MiB/s".into(), log_x: true, legend_lower_right: false },
        &[Series { label: "measured".into(), points: measured, markers: true }, Series { label: "model".into(), points: model, markers: false }],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Model;

    #[test]
    fn model_follows_the_papers_formula() {
        // The paper's S3: 30 ms base, 20 ms/MiB, 100 Gbit/s ~ 11 920 MiB/s.
        let m = Model { base_latency: 0.030, data_latency_per_mib: 0.020, peak_mib_per_s: 11_920.0 };
        let needed = m.requests_for_peak(16.0);
        assert!((needed - 260.8).abs() < 1.0, "{needed}");
        // One 16 MiB request: 16 MiB in 0.35 s.
        assert!((m.throughput(1, 16.0) - 16.0 / 0.35).abs() < 1e-9);
        assert_eq!(m.throughput(1000, 16.0), 11_920.0);
    }
}
