//! The object scheduler: how many bytes a scan keeps in flight, and on how
//! many download threads (AnyBlob paper §4.3, Algorithm 1).
//!
//! A scan that waits for each row group before asking for the next leaves
//! the link idle; one that downloads too far ahead holds memory (and, with
//! more loop threads than needed, CPU) that the query wants. Each epoch the
//! scheduler compares what the network delivered with what the query's
//! partitions could consume and sets:
//!
//! - `required` = min(link, processing speed): the bandwidth worth having
//!   (Algorithm 1 line 4, `min(bandwidth, bandwidth × ratio)`, with the
//!   link bandwidth written as what it stands for, retrieval at its best);
//! - the bytes in flight that sustain it, `overprepare × required ×
//!   request latency` (Little's law; up to 2× prepared ahead, as the paper
//!   recommends), never more than the memory budget, and growing at most
//!   2× per request latency once the first request has completed (slow
//!   start, so a LIMIT that stops early has not asked for much and a
//!   fresh scan does not send its whole plan at once);
//! - the loop threads, `max × required / link` (line 5), at least one.
//!
//! Processing speed is measured as the paper does: bytes consumed per
//! second a partition was busy (decoding, or in the operators above the
//! scan), times the partitions at work. Partitions idle waiting for data
//! are not counted, so a retrieval-bound scan reports what the query
//! could take, not what it got.
//!
//! No crate does this: the decision needs the scan's own view of arrivals
//! and consumption and the download manager's threads. This module is the
//! pure decision, driven by numbers, so tests can drive it with synthetic
//! speeds; `crate::pipeline` feeds it from the running scan.

use std::time::Duration;

/// How a scan paces its downloads.
#[derive(Debug, Clone)]
pub struct SchedulerOptions {
    /// Adapt bytes in flight and threads each epoch. When off, each
    /// partition has one row group downloading ahead of the one it decodes
    /// (the fixed policy, kept for comparison and as a fallback).
    pub adaptive: bool,
    /// Most bytes a scan holds undelivered: in flight plus downloaded and
    /// not yet taken by a partition. A single row group larger than this
    /// is still read, alone.
    pub memory: u64,
    /// The link's bandwidth in bytes per second, if known (a configured
    /// instance bandwidth, or a testbed's calibrated throughput). Unknown:
    /// only memory and processing speed cap the bytes in flight.
    pub link_bytes_per_sec: Option<f64>,
    /// How often the scheduler decides.
    pub epoch: Duration,
    /// Bytes in flight beyond what the required bandwidth needs (2×: the
    /// paper's over-preparation).
    pub overprepare: f64,
    /// Bytes in flight allowed until the first request completes (128 MiB).
    pub initial: u64,
    /// Most bytes a scan downloads (in flight plus held) before any of its
    /// partitions first asks for data. Operators start every scan of a plan
    /// at once, but consume them one pipeline after another: a hash join's
    /// probe side waits for its build side. Downloading a waiting scan at
    /// full budget takes the link from the scan the query is waiting for;
    /// a small head start still hides its first request's latency.
    pub prefetch: u64,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        SchedulerOptions {
            adaptive: true,
            memory: 1 << 30,
            link_bytes_per_sec: None,
            epoch: Duration::from_millis(100),
            overprepare: 2.0,
            initial: 128 << 20,
            prefetch: 16 << 20,
        }
    }
}

/// What one epoch saw.
#[derive(Debug, Clone, Copy, Default)]
pub struct EpochStats {
    /// Wall time of the epoch.
    pub elapsed: Duration,
    /// Bytes that arrived.
    pub retrieved_bytes: u64,
    /// Bytes the partitions consumed (decoded and handed on).
    pub processed_bytes: u64,
    /// Time partitions were busy with them, summed over partitions.
    pub processing_time: Duration,
    /// Partitions consuming during the epoch.
    pub partitions: usize,
    /// Downloads finished, and their summed latency (submit to last byte).
    pub requests: u64,
    pub request_time: Duration,
}

/// One decision, kept for EXPLAIN ANALYZE and the benchmark's plots.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    /// Since the scan started.
    pub at: Duration,
    /// Bytes per second that arrived in the epoch.
    pub retrieve: f64,
    /// Bytes per second the partitions could consume; `None` before any
    /// partition consumed anything.
    pub process: Option<f64>,
    /// Bandwidth the scan should draw (bytes per second; infinite while
    /// neither processing speed nor link is known).
    pub required: f64,
    /// Bytes in flight allowed until the next decision.
    pub target_bytes: u64,
    /// Download threads to use.
    pub threads: usize,
}

/// Decides bytes in flight and threads from epoch statistics.
#[derive(Debug, Clone)]
pub struct Controller {
    opts: SchedulerOptions,
    max_threads: usize,
    target: u64,
    threads: usize,
    /// Mean latency of a download (seconds), smoothed over epochs.
    latency: Option<f64>,
    /// Latest processing speed seen (kept through epochs without samples).
    process: Option<f64>,
}

/// Weight of the newest epoch's latency in the running mean.
const LATENCY_WEIGHT: f64 = 0.5;

impl Controller {
    /// A controller for a scan that may use up to `max_threads` loop threads.
    pub fn new(opts: SchedulerOptions, max_threads: usize) -> Controller {
        assert!(max_threads >= 1, "a scan needs a download thread");
        assert!(opts.overprepare >= 1.0, "over-preparation below 1 starves the link");
        let target = opts.initial.min(opts.memory).max(1);
        Controller { max_threads, target, threads: max_threads, latency: None, process: None, opts }
    }

    /// Bytes in flight allowed now.
    pub fn target_bytes(&self) -> u64 {
        self.target
    }

    /// Download threads to use now.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The options it runs with.
    pub fn options(&self) -> &SchedulerOptions {
        &self.opts
    }

    /// Applies one epoch's statistics and decides (Algorithm 1).
    pub fn epoch(&mut self, s: &EpochStats, at: Duration) -> Decision {
        let secs = s.elapsed.as_secs_f64().max(1e-6);
        let retrieve = s.retrieved_bytes as f64 / secs;
        if s.requests > 0 {
            let mean = s.request_time.as_secs_f64() / s.requests as f64;
            self.latency = Some(match self.latency {
                Some(l) => l * (1.0 - LATENCY_WEIGHT) + mean * LATENCY_WEIGHT,
                None => mean,
            });
        }
        if s.processed_bytes > 0 && !s.processing_time.is_zero() {
            let per_partition = s.processed_bytes as f64 / (s.processing_time.as_secs_f64() / s.partitions.max(1) as f64);
            self.process = Some(per_partition);
        }
        let link = self.opts.link_bytes_per_sec.filter(|l| *l > 0.0).unwrap_or(f64::INFINITY);
        let required = self.process.map_or(link, |p| p.min(link));
        let memory = self.opts.memory.max(1);
        let want = match self.latency {
            Some(l) if required.is_finite() => (self.opts.overprepare * required * l) as u64,
            _ => memory,
        };
        // Shrink at once; grow at most 2x per request latency (slow start,
        // as TCP doubles per round trip), and not before a request has
        // completed: doubling every 100 ms epoch while the first requests
        // take 450 ms sent a fresh scan's first ~400 requests in one burst
        // into a store that could only queue them.
        let growth = self.latency.map_or(1.0, |l| 2f64.powf(secs / l.max(1e-3)).min(2.0));
        let cap = ((self.target as f64 * growth) as u64).max(self.target);
        self.target = want.min(cap).clamp(1, memory);
        self.threads = if link.is_finite() {
            ((self.max_threads as f64 * required / link).ceil() as usize).clamp(1, self.max_threads)
        } else {
            match self.process {
                // Without a link figure, Algorithm 1's ratio: processing
                // slower than retrieval gets proportionally fewer threads.
                Some(p) if retrieve > 0.0 => ((self.max_threads as f64 * (p / retrieve).min(1.0)).ceil() as usize).clamp(1, self.max_threads),
                _ => self.max_threads,
            }
        };
        Decision { at, retrieve, process: self.process, required, target_bytes: self.target, threads: self.threads }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: f64 = (1 << 20) as f64;

    /// A synthetic scan: requests take `latency` each, the link carries at
    /// most `link` bytes/s, partitions consume `process` bytes/s when fed.
    /// Retrieval delivers min(link, in-flight / latency, what the
    /// partitions leave room for), one epoch at a time.
    struct Sim {
        latency: f64,
        link: f64,
        process: f64,
        partitions: usize,
    }

    impl Sim {
        fn run(&self, c: &mut Controller, epochs: usize) -> Vec<Decision> {
            let epoch = c.options().epoch;
            let secs = epoch.as_secs_f64();
            (0..epochs)
                .map(|i| {
                    let target = c.target_bytes() as f64;
                    let retrieve = (target / self.latency).min(self.link);
                    // Partitions are busy for the share of the epoch they have data.
                    let consumed = retrieve.min(self.process) * secs;
                    let busy = consumed / (self.process / self.partitions as f64);
                    let s = EpochStats {
                        elapsed: epoch,
                        retrieved_bytes: (retrieve * secs) as u64,
                        processed_bytes: consumed as u64,
                        processing_time: Duration::from_secs_f64(busy),
                        partitions: self.partitions,
                        requests: ((retrieve * secs / (16.0 * MIB)).ceil() as u64).max(1),
                        request_time: Duration::from_secs_f64(self.latency * ((retrieve * secs / (16.0 * MIB)).ceil()).max(1.0)),
                    };
                    c.epoch(&s, epoch * (i as u32 + 1))
                })
                .collect()
        }
    }

    fn opts(link: Option<f64>, memory: u64) -> SchedulerOptions {
        SchedulerOptions { link_bytes_per_sec: link, memory, initial: 16 << 20, ..Default::default() }
    }

    #[test]
    fn retrieval_bound_scans_grow_in_flight_up_to_the_link_cap() {
        // Processing could take 2000 MiB/s; the link carries 500 MiB/s;
        // a request takes 300 ms. Filling the link needs 150 MiB in
        // flight, 300 MiB with over-preparation.
        let link = 500.0 * MIB;
        let mut c = Controller::new(opts(Some(link), 4 << 30), 4);
        let sim = Sim { latency: 0.3, link, process: 2000.0 * MIB, partitions: 2 };
        let d = sim.run(&mut c, 40);
        let targets: Vec<u64> = d.iter().map(|d| d.target_bytes).collect();
        assert!(targets.windows(2).all(|w| w[1] >= w[0]), "in flight only grows while retrieval is the bottleneck: {targets:?}");
        let cap = (2.0 * link * 0.3) as u64;
        let last = *targets.last().unwrap();
        assert!(last <= cap && last as f64 >= 0.95 * cap as f64, "settles at the link cap {cap}, got {last}");
        assert_eq!(d.last().unwrap().threads, 4, "the link is the bottleneck: all threads");
        assert!(d.last().unwrap().retrieve >= 0.99 * link, "the link is full");
    }

    #[test]
    fn processing_bound_scans_keep_fewer_bytes_in_flight_and_fewer_threads() {
        let link = 500.0 * MIB;
        let fast = Sim { latency: 0.3, link, process: 2000.0 * MIB, partitions: 2 };
        let slow = Sim { process: 50.0 * MIB, ..fast };
        let mut c = Controller::new(opts(Some(link), 4 << 30), 4);
        let before = *fast.run(&mut c, 40).last().unwrap();
        let after = *slow.run(&mut c, 20).last().unwrap();
        // 50 MiB/s x 0.3 s x 2 = 30 MiB in flight is enough.
        assert!(after.target_bytes < before.target_bytes / 5, "{before:?} -> {after:?}");
        let want = 2.0 * 50.0 * MIB * 0.3;
        assert!((after.target_bytes as f64 - want).abs() < 0.1 * want, "{after:?}, want ~{want}");
        assert_eq!(after.threads, 1, "a tenth of the link needs one of four threads");
        assert!((after.required - 50.0 * MIB).abs() < 1.0 * MIB, "{after:?}");
        // And back: when processing speeds up, in flight grows again.
        let again = *fast.run(&mut c, 40).last().unwrap();
        assert_eq!(again.target_bytes, before.target_bytes);
    }

    #[test]
    fn in_flight_never_exceeds_the_memory_budget() {
        // The link would need 2 x 500 MiB/s x 1 s = 1000 MiB; the budget is 128 MiB.
        for link in [Some(500.0 * MIB), None] {
            let mut c = Controller::new(opts(link, 128 << 20), 2);
            let sim = Sim { latency: 1.0, link: 500.0 * MIB, process: 4000.0 * MIB, partitions: 2 };
            for d in sim.run(&mut c, 60) {
                assert!(d.target_bytes <= 128 << 20, "{d:?}");
            }
            assert_eq!(c.target_bytes(), 128 << 20, "retrieval-bound: the whole budget");
        }
    }

    #[test]
    fn without_a_link_figure_threads_follow_the_ratio_of_processing_to_retrieval() {
        let mut c = Controller::new(opts(None, 4 << 30), 4);
        let sim = Sim { latency: 0.2, link: 1000.0 * MIB, process: 250.0 * MIB, partitions: 2 };
        let d = sim.run(&mut c, 30);
        // The bytes in flight follow processing: 2 x 250 MiB/s x 0.2 s.
        let last = d.last().unwrap();
        let want = 2.0 * 250.0 * MIB * 0.2;
        assert!((last.target_bytes as f64 - want).abs() < 0.1 * want, "{last:?}");
        // A retrieval twice as fast as processing halves the threads.
        let mut c = Controller::new(opts(None, 4 << 30), 4);
        let s = EpochStats {
            elapsed: Duration::from_millis(100),
            retrieved_bytes: (100.0 * MIB) as u64,
            processed_bytes: (50.0 * MIB) as u64,
            processing_time: Duration::from_millis(200),
            partitions: 2,
            requests: 4,
            request_time: Duration::from_millis(800),
        };
        assert_eq!(c.epoch(&s, Duration::from_millis(100)).threads, 2);
    }

    #[test]
    fn in_flight_stays_at_the_initial_budget_until_a_request_completes_then_doubles_per_latency() {
        let mut c = Controller::new(opts(None, 1 << 30), 1);
        assert_eq!(c.target_bytes(), 16 << 20);
        let idle = EpochStats { elapsed: Duration::from_millis(100), ..Default::default() };
        for i in 0..5 {
            assert_eq!(c.epoch(&idle, Duration::from_millis(100 * i)).target_bytes, 16 << 20, "nothing completed yet");
        }
        // Requests take 400 ms: four 100 ms epochs double the budget.
        let done = EpochStats { requests: 1, request_time: Duration::from_millis(400), ..idle };
        let seq: Vec<u64> = (0..12).map(|i| c.epoch(&done, Duration::from_millis(500 + 100 * i)).target_bytes).collect();
        assert!(seq.windows(2).all(|w| w[1] >= w[0]), "{seq:?}");
        for (i, t) in seq.iter().enumerate() {
            let expected = 16.0 * 2f64.powf((i + 1) as f64 / 4.0);
            assert!((*t as f64 / (1 << 20) as f64 - expected).abs() < 0.5, "epoch {i}: {t} bytes, want ~{expected} MiB");
        }
    }
}
