//! The cost model of hybrid scans: the push and fetch rates measured on
//! earlier scans, where each row group goes by them ([`push_next`]), what a
//! cache miss weighs for Weighted-LFU ([`miss_weight`]), and the chain
//! shapes that measurements are kept under ([`shape_of`]).

use std::sync::Arc;

use datafusion::physical_plan::ExecutionPlan;

/// Smoothing of the measured rates: each scan's measurement weighs this much.
const RATE_WEIGHT: f64 = 0.5;

/// Push and fetch rates (compressed bytes of row groups handled per
/// second), measured on the scans that ran; `None` until measured. The
/// split sends each row group to the path that would finish it first
/// ([`push_next`]), so that both paths end together.
#[derive(Debug, Clone, Copy, Default)]
pub struct CostModel {
    pub push_bytes_per_second: Option<f64>,
    pub fetch_bytes_per_second: Option<f64>,
}

impl CostModel {
    pub(super) fn blend(old: Option<f64>, new: f64) -> Option<f64> {
        if !new.is_finite() || new <= 0.0 {
            return old;
        }
        Some(old.map_or(new, |o| o * (1.0 - RATE_WEIGHT) + new * RATE_WEIGHT))
    }

}

/// Whether the next row group not wholly cached goes to the node, given
/// the bytes each path already has: to the path that would finish it
/// first at its measured rate (list scheduling on two machines of known
/// speed). Pushing it moves `push_bytes` (the whole row group: the node
/// reads every chunk); fetching it only `fetch_bytes` (the chunks no tier
/// holds), so a row group that is mostly cached is fetched. Until both
/// rates are measured the paths count as equally fast, so that a scan of
/// two or more row groups measures both.
///
/// An earlier rule gave each path a share of the bytes by rate and sent
/// each row group to the path further behind its share; with the one or
/// two row groups a selective scan has, that sent every second row group
/// to be fetched even when the node was many times faster (a fetch of a
/// row group the node would have filtered to 2 % of its bytes).
pub fn push_next(pushed: f64, fetched: f64, push_bytes: f64, fetch_bytes: f64, push_rate: Option<f64>, fetch_rate: Option<f64>) -> bool {
    let (p, f) = match (push_rate, fetch_rate) {
        (Some(p), Some(f)) if p > 0.0 && f > 0.0 => (p, f),
        _ => (1.0, 1.0),
    };
    (pushed + push_bytes) / p <= (fetched + fetch_bytes) / f
}

/// A separable chain's shape: its plan text with every digit masked, so
/// that runs of one query template with other constants (dates,
/// quantities, row-group counts) share their measured output ratio.
/// String constants stay: a template whose strings vary is measured per
/// string, which costs only the unmeasured default on first use.
pub(super) fn shape_of(chain: &Arc<dyn ExecutionPlan>) -> Arc<str> {
    let text = datafusion::physical_plan::displayable(chain.as_ref()).indent(false).to_string();
    let mut masked = String::with_capacity(text.len());
    let mut last_digit = false;
    for c in text.chars() {
        let digit = c.is_ascii_digit();
        if !digit {
            masked.push(c);
        } else if !last_digit {
            masked.push('#');
        }
        last_digit = digit;
    }
    Arc::from(masked)
}

/// The cache policy's class of a chain shape ([`blobhouse_cache::Touch::class`]):
/// a hash, stable within the process, which is as long as a policy lives.
pub(super) fn shape_class(shape: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    shape.hash(&mut h);
    h.finish()
}

/// What a miss of a segment costs relative to fetching it, when the scan
/// that reads it can push down (Weighted-LFU's weight, FlexPushdownDB
/// Equation 1 in relative form: pushdown time over fetch time).
///
/// Once this chain shape has been pushed and a fetch measured, that is
/// `fetch rate / push rate of the shape`: the push rate is measured end to
/// end, so it holds all three of Equation 1's terms (the reply on the
/// link, the node's scan and its filtering) as they were, not as
/// constants would model them. Before, the network part is what the node
/// sends back per byte scanned (`output_ratio`, half until measured) and
/// the node's part its engine-wide time per byte relative to a fetch.
/// Clamped to [0.01, 1]. Segments of scans that cannot push weigh 1.
pub(super) fn miss_weight(output_ratio: Option<f64>, shape_push_rate: Option<f64>, model: CostModel) -> f64 {
    if let (Some(f), Some(p)) = (model.fetch_bytes_per_second, shape_push_rate)
        && p > 0.0
    {
        return (f / p).clamp(0.01, 1.0);
    }
    let network = output_ratio.unwrap_or(0.5);
    let node = match (model.fetch_bytes_per_second, model.push_bytes_per_second) {
        (Some(f), Some(p)) if p > 0.0 => f / p,
        _ => 0.0,
    };
    (network + node).clamp(0.01, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_miss_weighs_what_pushing_it_still_costs() {
        let unmeasured = CostModel::default();
        assert_eq!(miss_weight(None, None, unmeasured), 0.5);
        assert_eq!(miss_weight(Some(0.05), None, unmeasured), 0.05);
        // A node four times faster than the link: a quarter for its scan.
        let model = CostModel { push_bytes_per_second: Some(400.0), fetch_bytes_per_second: Some(100.0) };
        assert!((miss_weight(Some(0.05), None, model) - 0.30).abs() < 1e-12);
        // Never more than a fetch, never free.
        assert_eq!(miss_weight(Some(3.0), None, model), 1.0);
        assert_eq!(miss_weight(Some(0.0), None, CostModel { push_bytes_per_second: Some(1e12), fetch_bytes_per_second: Some(1.0) }), 0.01);
        // Once the shape was pushed: its own end-to-end time against a fetch.
        assert!((miss_weight(Some(0.05), Some(500.0), model) - 0.2).abs() < 1e-12);
        assert_eq!(miss_weight(Some(0.05), Some(50.0), model), 1.0);
    }

    /// Each row group goes to the path that would finish it first.
    #[test]
    fn the_split_follows_the_rates() {
        let split = |units: &[f64], p: Option<f64>, f: Option<f64>| -> Vec<bool> {
            let (mut pushed, mut fetched) = (0.0, 0.0);
            units
                .iter()
                .map(|b| {
                    let push = push_next(pushed, fetched, *b, *b, p, f);
                    if push { pushed += b } else { fetched += b }
                    push
                })
                .collect()
        };
        // Unmeasured: alternate, so that both paths get measured.
        assert_eq!(split(&[1.0, 1.0, 1.0, 1.0], None, Some(100.0)), [true, false, true, false]);
        // A node three times as fast takes three of four equal row groups…
        assert_eq!(split(&[1.0; 4], Some(300.0), Some(100.0)).iter().filter(|p| **p).count(), 3);
        // …and both of two: fetching one would end later than pushing both.
        assert_eq!(split(&[1.0, 1.0], Some(300.0), Some(100.0)), [true, true]);
        // A node slower than the link fetches most.
        assert_eq!(split(&[1.0; 4], Some(50.0), Some(100.0)).iter().filter(|p| **p).count(), 1);
        // A row group mostly cached is fetched (a tenth of it is missing)
        // although the node is three times as fast on the whole of it.
        assert!(!push_next(0.0, 0.0, 1.0, 0.1, Some(300.0), Some(100.0)));
        assert!(push_next(0.0, 0.0, 1.0, 0.5, Some(300.0), Some(100.0)));
        let mut b = CostModel::blend(None, 100.0);
        assert_eq!(b, Some(100.0));
        b = CostModel::blend(b, 200.0);
        assert_eq!(b, Some(150.0));
        assert_eq!(CostModel::blend(b, f64::NAN), Some(150.0));
    }
}
