//! Which source serves a segment the SSD tier holds: the SSD or the store,
//! by the speed each has shown lately (beyond SAP IQ, whose SSD became
//! slower than S3 under write bursts, §5).
//!
//! Each source's reads are measured as they happen — time to read `n`
//! bytes — and a line (a fixed latency plus a time per byte) is fitted to
//! them by exponentially weighted least squares, from small and large reads
//! alike. The SSD's reads queue at one device, so its estimate for a read
//! counts the bytes queued ahead of it. A segment goes to whichever
//! source's estimate is lower. A source not
//! chosen still gets one read in [`PROBE_EVERY`] (the next segment of at
//! most [`PROBE_MAX_BYTES`]), so an SSD that recovers (or a store that slows
//! down) is noticed.

use std::sync::Mutex;
use std::time::Duration;

/// One read in this many goes to the source the estimates did not pick.
pub const PROBE_EVERY: u64 = 16;
/// Largest segment a probe reads: a probe of the slower source costs the
/// query that makes it, so it is made with the next small segment (the
/// fit of latency and per-byte time needs no large read).
pub const PROBE_MAX_BYTES: u64 = 1 << 20;
/// How much of the fit's weight a read keeps per later read.
const DECAY: f64 = 0.95;

/// Where a segment is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The SSD, with `ahead` bytes of reads queued before this one.
    Ssd { ahead: u64 },
    Store,
}

/// A source's speed: time of a read as a line in its size, fitted by least
/// squares over exponentially weighted sums (old reads fade by [`DECAY`]
/// per read), so that small and large reads together tell latency from
/// bandwidth, and a few odd reads do not swing it.
#[derive(Debug, Default, Clone, Copy)]
struct Speed {
    /// Weighted sums: weight, bytes, seconds, bytes², bytes × seconds.
    w: f64,
    x: f64,
    y: f64,
    xx: f64,
    xy: f64,
}

impl Speed {
    fn observe(&mut self, bytes: u64, took: Duration) {
        let (x, y) = (bytes as f64, took.as_secs_f64());
        for (sum, v) in [(&mut self.w, 1.0), (&mut self.x, x), (&mut self.y, y), (&mut self.xx, x * x), (&mut self.xy, x * y)] {
            *sum = *sum * DECAY + v;
        }
    }

    /// Seconds per read and per byte; `None` until measured.
    fn fit(&self) -> Option<(f64, f64)> {
        if self.w <= 0.0 {
            return None;
        }
        let (mx, my) = (self.x / self.w, self.y / self.w);
        let var = self.xx / self.w - mx * mx;
        let cov = self.xy / self.w - mx * my;
        // Reads of (nearly) one size cannot tell latency from bandwidth:
        // all of it per byte, exact at that size.
        if var <= (0.05 * mx).powi(2) || mx <= 0.0 {
            return Some((0.0, my / mx.max(1.0)));
        }
        let per_byte = (cov / var).max(0.0);
        let latency = (my - per_byte * mx).max(0.0);
        Some((latency, per_byte))
    }

    fn estimate(&self, bytes: u64) -> Option<f64> {
        self.fit().map(|(lat, per_byte)| lat + per_byte * bytes as f64)
    }
}

#[derive(Debug, Default)]
struct State {
    ssd: Speed,
    store: Speed,
    decisions: u64,
    to_store: u64,
    /// Bytes of SSD reads routed and not finished: the device's queue.
    ssd_queued: u64,
    /// A probe is due, waiting for a segment small enough.
    probe_due: bool,
}

/// The router. Shared by the scans of an engine.
#[derive(Debug, Default)]
pub struct Router {
    state: Mutex<State>,
}

/// What the router has seen, for `SHOW CACHE` and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RouterStats {
    /// Estimated time of a 1 MiB read from each source, seconds.
    pub ssd_mib_secs: Option<f64>,
    pub store_mib_secs: Option<f64>,
    /// Segments the SSD held that were read from the store instead.
    pub routed_to_store: u64,
}

impl Router {
    pub fn new() -> Router {
        Router::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An SSD read of `bytes` took `took`, with nothing queued before it.
    pub fn observe_ssd(&self, bytes: u64, took: Duration) {
        self.lock().ssd.observe(bytes, took);
    }

    /// An SSD read that [`Router::route`] sent, with `ahead` bytes queued
    /// before it, is over: it took `took` if it read anything. The disk
    /// moved `ahead + bytes` in that time (its bandwidth is shared, so a
    /// read waits for those ahead of it: a saturated disk shows as a
    /// queue, not as a slower disk).
    pub fn ssd_finished(&self, bytes: u64, ahead: u64, took: Option<Duration>) {
        let mut s = self.lock();
        s.ssd_queued = s.ssd_queued.saturating_sub(bytes);
        if let Some(took) = took {
            s.ssd.observe(ahead + bytes, took);
        }
    }

    /// A read of `bytes` from the store took `took`.
    pub fn observe_store(&self, bytes: u64, took: Duration) {
        self.lock().store.observe(bytes, took);
    }

    /// Where to read a segment of `bytes` that the SSD holds. Until both
    /// sources are measured, the SSD (it is local). The SSD's estimate
    /// counts the reads queued at it: the store serves requests side by
    /// side, a disk shares its bandwidth. A read sent to the SSD joins the
    /// queue (`Route::Ssd { ahead }`: the bytes before it) until
    /// [`Router::ssd_finished`].
    pub fn route(&self, bytes: u64) -> Route {
        let mut s = self.lock();
        s.decisions += 1;
        let ahead = s.ssd_queued;
        let to_ssd = |s: &mut State| {
            s.ssd_queued += bytes;
            Route::Ssd { ahead }
        };
        let (Some(ssd), Some(store)) = (s.ssd.estimate(bytes + ahead), s.store.estimate(bytes)) else { return to_ssd(&mut s) };
        let preferred = if ssd <= store { Route::Ssd { ahead } } else { Route::Store };
        if s.decisions.is_multiple_of(PROBE_EVERY) {
            s.probe_due = true;
        }
        let probe = s.probe_due && bytes <= PROBE_MAX_BYTES;
        if probe {
            s.probe_due = false;
        }
        let route = match probe {
            true => match preferred {
                Route::Ssd { .. } => Route::Store,
                Route::Store => Route::Ssd { ahead },
            },
            false => preferred,
        };
        match route {
            Route::Store => {
                s.to_store += 1;
                route
            }
            Route::Ssd { .. } => to_ssd(&mut s),
        }
    }

    /// The estimates and counts.
    pub fn stats(&self) -> RouterStats {
        let s = self.lock();
        RouterStats { ssd_mib_secs: s.ssd.estimate(1 << 20), store_mib_secs: s.store.estimate(1 << 20), routed_to_store: s.to_store }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// Routes a read and, if it went to the SSD, finishes it at once.
    fn route_done(r: &Router, bytes: u64) -> Route {
        let route = r.route(bytes);
        if let Route::Ssd { ahead } = route {
            r.ssd_finished(bytes, ahead, None);
        }
        route
    }

    #[test]
    fn the_faster_source_is_chosen_and_the_other_is_probed() {
        let r = Router::new();
        assert_eq!(r.route(MIB), Route::Ssd { ahead: 0 }, "unmeasured: the local SSD");
        r.ssd_finished(MIB, 0, None);
        for _ in 0..20 {
            r.observe_ssd(MIB, Duration::from_millis(2));
            r.observe_store(MIB, Duration::from_millis(40));
        }
        let routes: Vec<Route> = (0..64).map(|_| route_done(&r, MIB)).collect();
        let to_store = routes.iter().filter(|x| **x == Route::Store).count();
        assert!(to_store >= 2 && to_store <= 64 / PROBE_EVERY as usize + 1, "a fast SSD serves all but the probes: {to_store}");
        // The SSD slows down (write bursts): the store takes over.
        for _ in 0..30 {
            r.observe_ssd(MIB, Duration::from_millis(200));
        }
        let routes: Vec<Route> = (0..64).map(|_| route_done(&r, MIB)).collect();
        let to_ssd = routes.iter().filter(|x| matches!(x, Route::Ssd { .. })).count();
        assert!(to_ssd >= 2 && to_ssd <= 64 / PROBE_EVERY as usize + 1, "a slow SSD gets only probes: {to_ssd}");
        assert!(r.stats().ssd_mib_secs.unwrap() > r.stats().store_mib_secs.unwrap());
        assert!(r.stats().routed_to_store > 0);
    }

    #[test]
    fn probes_wait_for_a_small_segment() {
        let r = Router::new();
        for _ in 0..20 {
            r.observe_ssd(MIB, Duration::from_millis(300));
            r.observe_store(MIB, Duration::from_millis(40));
        }
        // Large segments only: the slow SSD is never probed with one.
        let large: Vec<Route> = (0..64).map(|_| r.route(12 * MIB)).collect();
        assert!(large.iter().all(|x| *x == Route::Store), "{large:?}");
        // The probe that came due goes with the next small segment.
        assert_eq!(route_done(&r, PROBE_MAX_BYTES), Route::Ssd { ahead: 0 });
        assert_eq!(route_done(&r, PROBE_MAX_BYTES), Route::Store);
    }

    #[test]
    fn a_busy_disk_sends_the_overflow_to_the_store() {
        // The SSD: 1 ms + 10 ms per MiB (100 MiB/s); the store: 40 ms per MiB request, side by side.
        let r = Router::new();
        for _ in 0..20 {
            r.observe_ssd(MIB, Duration::from_millis(11));
            r.observe_store(MIB, Duration::from_millis(40));
        }
        // A scan asks for 32 MiB at once: the first reads queue at the
        // SSD until waiting there costs more than a request to the store.
        let routes: Vec<Route> = (0..32).map(|_| r.route(MIB)).collect();
        let to_ssd: Vec<u64> = routes.iter().filter_map(|x| match x { Route::Ssd { ahead } => Some(*ahead), _ => None }).collect();
        assert!((3..=5).contains(&to_ssd.len()), "about 40 ms of queue: {routes:?}");
        assert_eq!(to_ssd[..3], [0, MIB, 2 * MIB], "each read knows what is ahead of it");
        // The queue drains: the SSD is preferred again.
        for (i, ahead) in to_ssd.iter().enumerate() {
            r.ssd_finished(MIB, *ahead, Some(Duration::from_millis(11 * (i as u64 + 1))));
        }
        assert_eq!(r.route(MIB), Route::Ssd { ahead: 0 });
    }

    #[test]
    fn latency_and_bandwidth_are_told_apart() {
        // The store: 30 ms to the first byte, 50 MiB/s. The SSD: 0.1 ms, 500 MiB/s.
        let r = Router::new();
        for i in 0..200u64 {
            let bytes = (i % 8 + 1) * MIB / 4;
            r.observe_store(bytes, Duration::from_secs_f64(0.030 + bytes as f64 / (50.0 * MIB as f64)));
            r.observe_ssd(bytes, Duration::from_secs_f64(0.0001 + bytes as f64 / (500.0 * MIB as f64)));
        }
        let s = r.stats();
        let (store, ssd) = (s.store_mib_secs.unwrap(), s.ssd_mib_secs.unwrap());
        assert!((store - 0.050).abs() < 0.01, "store 1 MiB ≈ 50 ms: {store}");
        assert!((ssd - 0.0021).abs() < 0.001, "ssd 1 MiB ≈ 2 ms: {ssd}");
    }
}
