//! Which source serves a segment the SSD tier holds: the SSD or the store,
//! by the speed each has shown lately (beyond SAP IQ, whose SSD became
//! slower than S3 under write bursts, §5).
//!
//! Each source's reads are measured as they happen — time to read `n`
//! bytes — and kept as exponentially weighted averages of a fixed latency
//! and a per-byte time, fitted from small and large reads alike. A segment
//! goes to whichever source's estimate for its size is lower. A source not
//! chosen still gets one read in [`PROBE_EVERY`], so an SSD that recovers
//! (or a store that slows down) is noticed.

use std::sync::Mutex;
use std::time::Duration;

/// One read in this many goes to the source the estimates did not pick.
pub const PROBE_EVERY: u64 = 16;
/// Weight of a new measurement in the averages.
const ALPHA: f64 = 0.2;

/// Where a segment is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Ssd,
    Store,
}

#[derive(Debug, Default, Clone, Copy)]
struct Speed {
    /// Seconds per read and seconds per byte, averaged; `None` until measured.
    fit: Option<(f64, f64)>,
}

impl Speed {
    fn observe(&mut self, bytes: u64, took: Duration) {
        let secs = took.as_secs_f64();
        // Split a read's time into a fixed part and a per-byte part with the
        // current per-byte estimate (the first read is all per-byte).
        let (lat, per_byte) = self.fit.unwrap_or((0.0, secs / bytes.max(1) as f64));
        let new_per_byte = ((secs - lat).max(0.0) / bytes.max(1) as f64).max(per_byte * 0.1);
        let new_lat = (secs - per_byte * bytes as f64).max(0.0);
        self.fit = Some(match self.fit {
            None => (0.0, new_per_byte),
            Some(_) => (lat + ALPHA * (new_lat - lat), per_byte + ALPHA * (new_per_byte - per_byte)),
        });
    }

    fn estimate(&self, bytes: u64) -> Option<f64> {
        self.fit.map(|(lat, per_byte)| lat + per_byte * bytes as f64)
    }
}

#[derive(Debug, Default)]
struct State {
    ssd: Speed,
    store: Speed,
    decisions: u64,
    to_store: u64,
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

    /// An SSD read of `bytes` took `took`.
    pub fn observe_ssd(&self, bytes: u64, took: Duration) {
        self.lock().ssd.observe(bytes, took);
    }

    /// A read of `bytes` from the store took `took`.
    pub fn observe_store(&self, bytes: u64, took: Duration) {
        self.lock().store.observe(bytes, took);
    }

    /// Where to read a segment of `bytes` that the SSD holds. Until both
    /// sources are measured, the SSD (it is local).
    pub fn route(&self, bytes: u64) -> Route {
        let mut s = self.lock();
        s.decisions += 1;
        let (Some(ssd), Some(store)) = (s.ssd.estimate(bytes), s.store.estimate(bytes)) else { return Route::Ssd };
        let preferred = if ssd <= store { Route::Ssd } else { Route::Store };
        let route = match s.decisions.is_multiple_of(PROBE_EVERY) {
            true => match preferred {
                Route::Ssd => Route::Store,
                Route::Store => Route::Ssd,
            },
            false => preferred,
        };
        if route == Route::Store {
            s.to_store += 1;
        }
        route
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

    #[test]
    fn the_faster_source_is_chosen_and_the_other_is_probed() {
        let r = Router::new();
        assert_eq!(r.route(MIB), Route::Ssd, "unmeasured: the local SSD");
        for _ in 0..20 {
            r.observe_ssd(MIB, Duration::from_millis(2));
            r.observe_store(MIB, Duration::from_millis(40));
        }
        let routes: Vec<Route> = (0..64).map(|_| r.route(MIB)).collect();
        let to_store = routes.iter().filter(|x| **x == Route::Store).count();
        assert!(to_store >= 2 && to_store <= 64 / PROBE_EVERY as usize + 1, "a fast SSD serves all but the probes: {to_store}");
        // The SSD slows down (write bursts): the store takes over.
        for _ in 0..30 {
            r.observe_ssd(MIB, Duration::from_millis(200));
        }
        let routes: Vec<Route> = (0..64).map(|_| r.route(MIB)).collect();
        let to_ssd = routes.iter().filter(|x| **x == Route::Ssd).count();
        assert!(to_ssd >= 2 && to_ssd <= 64 / PROBE_EVERY as usize + 1, "a slow SSD gets only probes: {to_ssd}");
        assert!(r.stats().ssd_mib_secs.unwrap() > r.stats().store_mib_secs.unwrap());
        assert!(r.stats().routed_to_store > 0);
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
