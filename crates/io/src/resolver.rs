//! The throughput-based resolver (AnyBlob §3.3).
//!
//! An object store's name resolves to many addresses, and they are not
//! equally fast: one may sit behind a busy front end. Resolving once per
//! request wastes time and lets the system resolver pick; resolving once
//! forever sticks with a slow address. So an endpoint keeps a few active
//! addresses, spreads requests over them, measures each one's throughput
//! per request, and swaps an address that stays well below the others for
//! a spare one from the same resolution.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

/// Active addresses per endpoint at most.
pub const MAX_ACTIVE: usize = 4;
/// Completions between two checks of the active addresses.
const CHECK_EVERY: u32 = 32;
/// Samples an address needs before it can be judged.
const MIN_SAMPLES: u32 = 8;
/// An address slower than this share of the median is replaced.
const SLOW_SHARE: f64 = 0.5;
/// Requests smaller than this say little about throughput.
const MIN_BYTES: u64 = 1 << 20;

#[derive(Debug, Clone)]
struct Active {
    addr: SocketAddr,
    bytes: u64,
    secs: f64,
    samples: u32,
}

impl Active {
    fn new(addr: SocketAddr) -> Self {
        Active { addr, bytes: 0, secs: 0.0, samples: 0 }
    }
    fn throughput(&self) -> f64 {
        self.bytes as f64 / self.secs.max(1e-9)
    }
}

#[derive(Debug)]
struct State {
    active: Vec<Active>,
    spare: VecDeque<SocketAddr>,
    next: usize,
    since_check: u32,
    replaced: u64,
}

/// The addresses of one host:port and what they delivered.
#[derive(Debug)]
pub struct Endpoint {
    state: Mutex<State>,
}

impl Endpoint {
    /// An endpoint over the resolved `addrs` (at least one), using up to
    /// `max_active` of them at a time.
    pub fn new(addrs: Vec<SocketAddr>, max_active: usize) -> Endpoint {
        assert!(!addrs.is_empty(), "an endpoint needs an address");
        let mut spare: VecDeque<SocketAddr> = addrs.into();
        let active = (0..max_active.max(1)).map_while(|_| spare.pop_front()).map(Active::new).collect();
        Endpoint { state: Mutex::new(State { active, spare, next: 0, since_check: 0, replaced: 0 }) }
    }

    /// The address for the next request (round robin over the active ones).
    pub fn pick(&self) -> SocketAddr {
        let mut s = self.state.lock().expect("not poisoned");
        s.next = (s.next + 1) % s.active.len();
        s.active[s.next].addr
    }

    /// Records a completed request to `addr`; now and then replaces an
    /// address persistently slower than the others.
    pub fn record(&self, addr: SocketAddr, bytes: u64, total: Duration) {
        if bytes < MIN_BYTES {
            return;
        }
        let mut s = self.state.lock().expect("not poisoned");
        let Some(a) = s.active.iter_mut().find(|a| a.addr == addr) else { return };
        a.bytes += bytes;
        a.secs += total.as_secs_f64();
        a.samples += 1;
        s.since_check += 1;
        if s.since_check < CHECK_EVERY || s.spare.is_empty() || s.active.len() < 2 {
            return;
        }
        s.since_check = 0;
        let judged: Vec<f64> = s.active.iter().filter(|a| a.samples >= MIN_SAMPLES).map(Active::throughput).collect();
        if judged.len() < 2 {
            return;
        }
        let mut sorted = judged.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted[sorted.len() / 2];
        let slowest = s.active.iter().enumerate().filter(|(_, a)| a.samples >= MIN_SAMPLES).min_by(|x, y| x.1.throughput().total_cmp(&y.1.throughput())).map(|(i, a)| (i, a.throughput()));
        if let Some((i, t)) = slowest
            && t < SLOW_SHARE * median
        {
            let fresh = s.spare.pop_front().expect("checked non-empty");
            let old = std::mem::replace(&mut s.active[i], Active::new(fresh));
            // It may recover; it waits at the back of the spares.
            s.spare.push_back(old.addr);
            s.replaced += 1;
        }
    }

    /// The active addresses now.
    pub fn active(&self) -> Vec<SocketAddr> {
        self.state.lock().expect("not poisoned").active.iter().map(|a| a.addr).collect()
    }

    /// Addresses replaced so far.
    pub fn replaced(&self) -> u64 {
        self.state.lock().expect("not poisoned").replaced
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(i: u8) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, i], 443))
    }

    #[test]
    fn requests_are_spread_over_the_active_addresses() {
        let e = Endpoint::new((1..=6).map(addr).collect(), 4);
        assert_eq!(e.active(), vec![addr(1), addr(2), addr(3), addr(4)]);
        let mut seen: Vec<SocketAddr> = (0..8).map(|_| e.pick()).collect();
        seen.sort();
        assert_eq!(seen, vec![addr(1), addr(1), addr(2), addr(2), addr(3), addr(3), addr(4), addr(4)]);
    }

    #[test]
    fn a_persistently_slow_address_is_replaced_by_a_spare() {
        let e = Endpoint::new((1..=5).map(addr).collect(), 4);
        // 16 MiB in 0.2 s from three addresses, in 2 s from 10.0.0.3.
        for _ in 0..40 {
            for a in 1..=4 {
                let secs = if a == 3 { 2.0 } else { 0.2 };
                e.record(addr(a), 16 << 20, Duration::from_secs_f64(secs));
            }
        }
        assert_eq!(e.replaced(), 1);
        assert!(!e.active().contains(&addr(3)), "{:?}", e.active());
        assert!(e.active().contains(&addr(5)));
    }

    #[test]
    fn similar_addresses_and_small_requests_change_nothing() {
        let e = Endpoint::new((1..=5).map(addr).collect(), 4);
        for i in 0..200u32 {
            for a in 1..=4 {
                // ±30 % noise, no outlier; and many small requests from a slow one.
                let secs = 0.2 * (1.0 + 0.3 * (((i * 7 + a as u32) % 5) as f64 - 2.0) / 2.0);
                e.record(addr(a), 16 << 20, Duration::from_secs_f64(secs));
                e.record(addr(1), 4096, Duration::from_secs(5));
            }
        }
        assert_eq!(e.replaced(), 0);
        // One address, nothing to compare with.
        let lone = Endpoint::new(vec![addr(9)], 4);
        for _ in 0..100 {
            lone.record(addr(9), 16 << 20, Duration::from_secs(9));
        }
        assert_eq!((lone.replaced(), lone.pick()), (0, addr(9)));
    }
}
