//! Equi-depth histograms of column chunks, for the optimizer's row
//! estimates.
//!
//! A zone map says where a chunk's values lie, not how they spread between
//! its bounds, and the optimizer assumes evenly. For keys with gaps that is
//! far off: a `yyyymmdd` integer date key spans 61 130 integers over seven
//! years but holds 2 557 values, so a quarter (300 integers) looked like
//! 0.5 % of the rows where it is 3.6 %. Join sides follow those estimates,
//! so SSB's star joins built their hash tables on the fact table
//! (docs/notes/2026-11-24-histograms.md).
//!
//! The writer samples each row group's values of every column with a
//! numeric order ([`Sampler`]) and stores the inner boundaries that cut the
//! sample into buckets of equal rows — one bucket per [`ROWS_PER_BUCKET`]
//! rows, between [`MIN_BUCKETS`] and [`MAX_BUCKETS`] — in
//! [`crate::format::ColumnChunkMeta::quantiles`]; the chunk's min and max
//! close the outer ones. A bucket of a large row group then spans weeks of
//! a date, not years. [`Histogram`] reads them back and answers what
//! share of a row group's rows a range keeps, interpolating within a
//! bucket. Written by hand: Parquet keeps no histograms of values (its
//! size statistics count levels), and DataFusion's statistics have no
//! place for one.

use datafusion::arrow::array::{Array, ArrayRef, UInt32Array};
use datafusion::arrow::compute::{SortOptions, cast, concat, sort_to_indices, take};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::ScalarValue;

/// Rows per bucket a row group's histogram aims at.
pub const ROWS_PER_BUCKET: u64 = 20_000;
/// Fewest buckets of a histogram (a small row group's).
pub const MIN_BUCKETS: usize = 8;
/// Most buckets of a histogram: at most 63 values per column chunk in the
/// manifest.
pub const MAX_BUCKETS: usize = 64;
/// Most values sampled per column of a row group. Every row is sampled
/// until then; past it, every other sample is dropped and the stride
/// doubles, so the sample stays evenly spaced (a 6-million-row row group
/// sorts at most this many values per column).
const MAX_SAMPLES: usize = 1 << 16;

/// Whether a column of `data_type` gets a histogram: types whose values map
/// onto numbers in order (so a range's share of a bucket can be
/// interpolated).
pub fn supported(data_type: &DataType) -> bool {
    data_type.is_integer() || data_type.is_floating() || matches!(data_type, DataType::Date32 | DataType::Date64 | DataType::Timestamp(..) | DataType::Decimal128(..))
}

/// `value` on the number line its type orders by: integers, floats,
/// days or ticks since the epoch, decimals by their unscaled integer (one
/// column has one scale). `None` for null and unsupported values.
pub fn to_number(value: &ScalarValue) -> Option<f64> {
    use ScalarValue::*;
    Some(match value {
        Int8(Some(v)) => *v as f64,
        Int16(Some(v)) => *v as f64,
        Int32(Some(v)) => *v as f64,
        Int64(Some(v)) => *v as f64,
        UInt8(Some(v)) => *v as f64,
        UInt16(Some(v)) => *v as f64,
        UInt32(Some(v)) => *v as f64,
        UInt64(Some(v)) => *v as f64,
        Float32(Some(v)) => *v as f64,
        Float64(Some(v)) => *v,
        Date32(Some(v)) => *v as f64,
        Date64(Some(v)) => *v as f64,
        TimestampSecond(Some(v), _) | TimestampMillisecond(Some(v), _) | TimestampMicrosecond(Some(v), _) | TimestampNanosecond(Some(v), _) => *v as f64,
        Decimal128(Some(v), _, _) => *v as f64,
        _ => return None,
    })
    .filter(|n| n.is_finite())
}

/// Collects an evenly spaced sample of the row group being written, per
/// column.
#[derive(Debug)]
pub struct Sampler {
    /// Per column of the table: the sampled pieces (`None`: no histogram).
    columns: Vec<Option<Vec<ArrayRef>>>,
    /// Rows of the row group so far.
    rows: u64,
    /// Row `i` of the row group is sampled when `i % stride == 0`.
    stride: u64,
    /// Values sampled per column so far.
    sampled: usize,
}

impl Sampler {
    /// A sampler for a table whose columns have `types`.
    pub fn new(types: impl IntoIterator<Item = DataType>) -> Self {
        Sampler { columns: types.into_iter().map(|t| supported(&t).then(Vec::new)).collect(), rows: 0, stride: 1, sampled: 0 }
    }

    /// Samples `columns` (one batch, in table order).
    pub fn add(&mut self, columns: &[ArrayRef]) {
        let rows = columns.first().map_or(0, |c| c.len());
        let first = ((self.stride - self.rows % self.stride) % self.stride) as usize;
        self.rows += rows as u64;
        if first >= rows {
            return;
        }
        let picked = UInt32Array::from_iter_values((first..rows).step_by(self.stride as usize).map(|i| i as u32));
        self.sampled += picked.len();
        for (pieces, values) in self.columns.iter_mut().zip(columns) {
            if let (Some(pieces), Ok(sample)) = (pieces, take(values.as_ref(), &picked, None)) {
                pieces.push(sample);
            }
        }
        while self.sampled > MAX_SAMPLES {
            self.thin();
        }
    }

    /// Keeps every other sample (those at multiples of twice the stride).
    fn thin(&mut self) {
        let kept = UInt32Array::from_iter_values((0..self.sampled).step_by(2).map(|i| i as u32));
        for pieces in self.columns.iter_mut().flatten() {
            let refs: Vec<&dyn Array> = pieces.iter().map(|p| p.as_ref()).collect();
            let thinned = concat(&refs).and_then(|all| take(all.as_ref(), &kept, None));
            *pieces = thinned.map(|t| vec![t]).unwrap_or_default();
        }
        self.sampled = kept.len();
        self.stride *= 2;
    }

    /// The histograms of the row group sampled so far, per column (`None`:
    /// unsupported type, or no values), and a fresh start for the next one.
    pub fn finish_row_group(&mut self) -> Vec<Option<Vec<String>>> {
        let buckets = (self.rows.div_ceil(ROWS_PER_BUCKET) as usize).clamp(MIN_BUCKETS, MAX_BUCKETS);
        (self.rows, self.stride, self.sampled) = (0, 1, 0);
        self.columns.iter_mut().map(|pieces| pieces.as_mut().and_then(|p| quantiles(&std::mem::take(p), buckets))).collect()
    }
}

/// The `buckets − 1` inner boundaries of `pieces`' values as text that
/// casts back to their type.
fn quantiles(pieces: &[ArrayRef], buckets: usize) -> Option<Vec<String>> {
    if pieces.is_empty() {
        return None;
    }
    let refs: Vec<&dyn Array> = pieces.iter().map(|p| p.as_ref()).collect();
    let all = concat(&refs).ok()?;
    let valid = all.len() - all.null_count();
    if valid == 0 {
        return None;
    }
    let order = sort_to_indices(&all, Some(SortOptions { descending: false, nulls_first: false }), None).ok()?;
    let at = UInt32Array::from_iter_values((1..buckets).map(|k| order.value((k * valid / buckets).min(valid - 1))));
    let picked = take(all.as_ref(), &at, None).ok()?;
    let text = cast(&picked, &DataType::Utf8).ok()?;
    let text = text.as_any().downcast_ref::<datafusion::arrow::array::StringArray>()?;
    (0..text.len()).map(|i| text.is_valid(i).then(|| text.value(i).to_string())).collect()
}

/// A row group's histogram of one column, read back: buckets of equal
/// rows between `bounds[i]` and `bounds[i + 1]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    /// The row group's rows.
    pub rows: u64,
    /// min, the inner boundaries, max: ascending.
    bounds: Vec<f64>,
}

impl Histogram {
    /// From a column chunk's zone map and quantiles (text of `data_type`);
    /// `None` when any is missing or does not parse, or they are not in
    /// order.
    pub fn parse(rows: u64, data_type: &DataType, min: Option<&str>, quantiles: Option<&[String]>, max: Option<&str>) -> Option<Histogram> {
        let number = |text: &str| ScalarValue::try_from_string(text.to_string(), data_type).ok().as_ref().and_then(to_number);
        let mut bounds = vec![number(min?)?];
        for q in quantiles? {
            bounds.push(number(q)?);
        }
        bounds.push(number(max?)?);
        let buckets = bounds.len() - 1;
        ((MIN_BUCKETS..=MAX_BUCKETS).contains(&buckets) && bounds.windows(2).all(|w| w[0] <= w[1])).then_some(Histogram { rows, bounds })
    }

    /// Bytes it holds, for memory budgets.
    pub fn memory_size(&self) -> usize {
        std::mem::size_of::<Self>() + self.bounds.capacity() * std::mem::size_of::<f64>()
    }

    /// The share of the rows whose value lies in `[lo, hi]` (either end
    /// open when `None`). Within a bucket values are taken as spread
    /// evenly; a bucket of one value counts whole when the range holds it.
    pub fn fraction(&self, lo: Option<f64>, hi: Option<f64>) -> f64 {
        let (lo, hi) = (lo.unwrap_or(f64::NEG_INFINITY), hi.unwrap_or(f64::INFINITY));
        if lo > hi {
            return 0.0;
        }
        let share: f64 = self
            .bounds
            .windows(2)
            .map(|w| {
                let (a, b) = (w[0], w[1]);
                if b <= a {
                    return if lo <= a && a <= hi { 1.0 } else { 0.0 };
                }
                let overlap = hi.min(b) - lo.max(a);
                (overlap.max(0.0) / (b - a)).min(1.0)
            })
            .sum();
        (share / (self.bounds.len() - 1) as f64).clamp(0.0, 1.0)
    }
}

/// The share of all rows of `histograms` (row groups) in `[lo, hi]`;
/// `None` without rows.
pub fn fraction(histograms: &[Histogram], lo: Option<f64>, hi: Option<f64>) -> Option<f64> {
    let rows: u64 = histograms.iter().map(|h| h.rows).sum();
    (rows > 0).then(|| histograms.iter().map(|h| h.rows as f64 * h.fraction(lo, hi)).sum::<f64>() / rows as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use datafusion::arrow::array::{Float64Array, Int32Array, StringArray};

    /// The case that motivated them: a `yyyymmdd` key of seven years' days.
    fn date_keys() -> Vec<i32> {
        let mut keys = Vec::new();
        for year in 1992..=1998 {
            for month in 1..=12 {
                let days = [31, if year % 4 == 0 { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][month - 1];
                for day in 1..=days {
                    keys.push(year * 10000 + month as i32 * 100 + day);
                }
            }
        }
        keys
    }

    fn histogram_of(values: &[i32]) -> Histogram {
        let mut s = Sampler::new([DataType::Int32, DataType::Utf8]);
        // Handed over in batches, as the writer does.
        for chunk in values.chunks(1000) {
            s.add(&[Arc::new(Int32Array::from(chunk.to_vec())) as ArrayRef, Arc::new(StringArray::from(vec!["x"; chunk.len()])) as ArrayRef]);
        }
        let h = s.finish_row_group();
        assert_eq!(h[1], None, "strings get none");
        let q = h[0].clone().expect("integers get one");
        let buckets = (values.len() as u64).div_ceil(ROWS_PER_BUCKET).clamp(MIN_BUCKETS as u64, MAX_BUCKETS as u64) as usize;
        assert_eq!(q.len(), buckets - 1);
        let (min, max) = (values.iter().min().unwrap().to_string(), values.iter().max().unwrap().to_string());
        Histogram::parse(values.len() as u64, &DataType::Int32, Some(&min), Some(&q), Some(&max)).expect("parses back")
    }

    #[test]
    fn a_quarter_of_gapped_date_keys_is_estimated_near_its_share() {
        let keys = date_keys();
        let h = histogram_of(&keys);
        let truth = keys.iter().filter(|k| (19980601..19980901).contains(*k)).count() as f64 / keys.len() as f64;
        let estimate = h.fraction(Some(19980601.0), Some(19980900.0));
        assert!((estimate / truth - 1.0).abs() < 0.25, "estimate {estimate} against {truth}");
        // The zone map alone (evenly between min and max) is 7× off.
        let even = 300.0 / (19981231.0 - 19920101.0);
        assert!(truth / even > 7.0, "{truth} against {even}");
        // Open ends and empty ranges.
        assert_eq!(h.fraction(None, None), 1.0);
        assert_eq!(h.fraction(Some(20000101.0), None), 0.0);
        assert_eq!(h.fraction(Some(5.0), Some(4.0)), 0.0);
        let first_year = h.fraction(None, Some(19921231.0));
        assert!((first_year - 366.0 / keys.len() as f64).abs() < 0.03, "{first_year}");

        // A fact table's date column, sorted, 400 rows a day: a million
        // rows, sampled with a doubled stride, in 52 buckets of weeks.
        let facts: Vec<i32> = keys.iter().flat_map(|k| std::iter::repeat_n(*k, 400)).collect();
        assert!(facts.len() > 8 * MAX_SAMPLES);
        let h = histogram_of(&facts);
        let estimate = h.fraction(Some(19980601.0), Some(19980900.0));
        assert!((estimate / truth - 1.0).abs() < 0.25, "estimate {estimate} against {truth}");
        let first_year = h.fraction(None, Some(19921231.0));
        assert!((first_year - 366.0 / keys.len() as f64).abs() < 0.01, "{first_year}");
    }

    #[test]
    fn repeated_values_and_row_groups_of_different_sizes() {
        // Half the rows are one value: its bucket(s) count whole.
        let mut values = vec![7; 5000];
        values.extend(0..5000);
        let h = histogram_of(&values);
        let sevens = h.fraction(Some(7.0), Some(7.0));
        assert!(sevens >= 0.375 && sevens <= 0.625, "{sevens}");
        // Two row groups: shares weigh by rows.
        let small = histogram_of(&(0..100).collect::<Vec<_>>());
        let large = histogram_of(&(1000..10_000).collect::<Vec<_>>());
        let both = fraction(&[small, large], Some(1000.0), None).unwrap();
        assert!((both - 9000.0 / 9100.0).abs() < 0.01, "{both}");
        assert_eq!(fraction(&[], None, None), None);
    }

    #[test]
    fn nulls_are_left_out_and_malformed_text_gives_none() {
        let mut s = Sampler::new([DataType::Float64]);
        s.add(&[Arc::new(Float64Array::from(vec![None, Some(1.0), None, Some(2.0)])) as ArrayRef]);
        let q = s.finish_row_group()[0].clone().unwrap();
        assert!(q.iter().all(|v| v == "1.0" || v == "2.0"), "{q:?}");
        assert_eq!(s.finish_row_group()[0], None, "each row group starts afresh");
        s.add(&[Arc::new(Float64Array::from(vec![None, None])) as ArrayRef]);
        assert_eq!(s.finish_row_group()[0], None, "no values, no histogram");
        let seven = |v: &str| vec![v.to_string(); MIN_BUCKETS - 1];
        assert!(Histogram::parse(10, &DataType::Int32, Some("1"), Some(&seven("5")), Some("9")).is_some());
        assert!(Histogram::parse(10, &DataType::Int32, Some("1"), Some(&seven("x")), Some("9")).is_none());
        assert!(Histogram::parse(10, &DataType::Int32, Some("1"), Some(&seven("50")), Some("9")).is_none(), "out of order");
        assert!(Histogram::parse(10, &DataType::Int32, Some("1"), Some(&["5".to_string()]), Some("9")).is_none(), "too few");
        assert!(Histogram::parse(10, &DataType::Int32, Some("1"), Some(&vec!["5".to_string(); MAX_BUCKETS]), Some("9")).is_none(), "too many");
        assert!(Histogram::parse(10, &DataType::Int32, Some("1"), None, Some("9")).is_none());
    }
}
