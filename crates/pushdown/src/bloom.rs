//! Bloom-filter probes: the probe side of a hash join, filtered on the
//! storage node by the keys of the join's build side (FlexPushdownDB §4.2).
//!
//! The compute side builds a [`BloomFilter`] from the build side's join
//! keys while the join collects them, and ships it inside the pushed
//! fragment as a [`BloomProbeExpr`] — a DataFusion physical expression that
//! travels as a datafusion-proto extension ([`crate::SliceCodec`]). The node
//! then sends back only rows whose keys may match. A Bloom filter has false
//! positives but no false negatives, and the join checks every row it gets,
//! so answers never depend on it.
//!
//! Why our own filter: the node and the compute side must hash keys alike
//! even when they are different builds, so the hash is defined here, over
//! the values (not arrow's or DataFusion's hashers, whose seeds and
//! algorithms are not a wire format). The filter is small — a few bits per
//! key, capped at [`MAX_FILTER_BYTES`] — and a build side with more distinct
//! keys than that holds well gets no filter at all.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, BooleanBufferBuilder};
use datafusion::arrow::datatypes::{self as dt, DataType, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::ColumnarValue;
use datafusion::physical_expr::PhysicalExpr;

/// The largest filter shipped: 1 MiB, about 840 thousand keys at 10 bits each.
pub const MAX_FILTER_BYTES: usize = 1 << 20;
/// Bits per distinct key before rounding up to a power of two (about 1 %
/// false positives with [`HASHES`] probes).
pub const BITS_PER_KEY: usize = 10;
/// Bit probes per key.
pub const HASHES: u32 = 7;
/// The smallest filter (so that tiny build sides still hash well).
const MIN_WORDS: usize = 8;
/// Key columns one probe hashes together.
pub const MAX_KEY_COLUMNS: usize = 8;
/// The most distinct keys a filter is built for.
pub const MAX_KEYS: usize = MAX_FILTER_BYTES * 8 / BITS_PER_KEY;

/// A split-free Bloom filter over 64-bit key hashes ([`hash_rows`]), with a
/// power-of-two number of bits and double hashing.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct BloomFilter {
    words: Vec<u64>,
    hashes: u32,
}

impl fmt::Debug for BloomFilter {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "BloomFilter({} bits, {} hashes)", self.words.len() * 64, self.hashes)
    }
}

impl BloomFilter {
    /// A filter holding `keys` (key hashes, duplicates allowed); `None` when
    /// there are more than [`MAX_KEYS`] distinct keys.
    pub fn from_hashes(keys: &mut Vec<u64>) -> Option<BloomFilter> {
        keys.sort_unstable();
        keys.dedup();
        if keys.len() > MAX_KEYS {
            return None;
        }
        let words = (keys.len() * BITS_PER_KEY).div_ceil(64).next_power_of_two().max(MIN_WORDS);
        debug_assert!(words * 8 <= MAX_FILTER_BYTES);
        let mut f = BloomFilter { words: vec![0; words], hashes: HASHES };
        for &k in keys.iter() {
            f.insert(k);
        }
        Some(f)
    }

    /// A filter from its parts, as it travels; the error says what is wrong.
    pub fn from_parts(words: Vec<u64>, hashes: u32) -> std::result::Result<BloomFilter, String> {
        if !words.len().is_power_of_two() || words.len() < MIN_WORDS || words.len() * 8 > MAX_FILTER_BYTES {
            return Err(format!("a Bloom filter has a power of two of 64-bit words, {MIN_WORDS} to {}, not {}", MAX_FILTER_BYTES / 8, words.len()));
        }
        if !(1..=16).contains(&hashes) {
            return Err(format!("a Bloom filter probes 1 to 16 bits per key, not {hashes}"));
        }
        Ok(BloomFilter { words, hashes })
    }

    /// The filter's words and its number of probes.
    pub fn parts(&self) -> (&[u64], u32) {
        (&self.words, self.hashes)
    }

    /// Its size on the wire.
    pub fn byte_size(&self) -> usize {
        self.words.len() * 8
    }

    /// The bits of `key`: double hashing over a power-of-two bit count.
    fn positions(words: usize, hashes: u32, key: u64) -> impl Iterator<Item = usize> {
        let mask = words as u64 * 64 - 1;
        let step = mix(key ^ 0x5851_f42d_4c95_7f2d) | 1;
        (0..hashes as u64).map(move |i| (key.wrapping_add(i.wrapping_mul(step)) & mask) as usize)
    }

    fn insert(&mut self, key: u64) {
        for b in Self::positions(self.words.len(), self.hashes, key) {
            self.words[b / 64] |= 1 << (b % 64);
        }
    }

    /// Whether the key may be in the set (never false for one that is).
    pub fn contains(&self, key: u64) -> bool {
        Self::positions(self.words.len(), self.hashes, key).all(|b| self.words[b / 64] & (1 << (b % 64)) != 0)
    }
}

/// The splitmix64 finaliser: every input bit affects every output bit
/// (also the engine's in-process key filters' hash).
#[inline]
pub fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// FNV-1a over bytes, then mixed.
fn hash_bytes(b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &x in b {
        h ^= x as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    mix(h ^ b.len() as u64)
}

/// Whether keys of this type can be hashed (both sides of an equi-join
/// have the same type, so values of one type need only agree with each
/// other).
pub fn supports(t: &DataType) -> bool {
    use DataType::*;
    matches!(t, Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 | Date32 | Date64 | Decimal128(_, _) | Utf8 | LargeUtf8 | Utf8View)
}

/// Folds one column's values into the rows' hashes; a null marks the row
/// as matching nothing (equi-joins never match a null key).
fn fold(column: &ArrayRef, hashes: &mut [u64], null: &mut [bool]) -> Result<()> {
    fn ints<T: dt::ArrowPrimitiveType>(a: &ArrayRef, hashes: &mut [u64], to: impl Fn(T::Native) -> u64) {
        for (i, v) in a.as_primitive::<T>().values().iter().enumerate() {
            hashes[i] = mix(hashes[i] ^ mix(to(*v)));
        }
    }
    fn strings<'a>(values: impl Iterator<Item = Option<&'a str>>, hashes: &mut [u64]) {
        for (i, v) in values.enumerate() {
            hashes[i] = mix(hashes[i] ^ hash_bytes(v.unwrap_or_default().as_bytes()));
        }
    }
    use DataType::*;
    match column.data_type() {
        Int8 => ints::<dt::Int8Type>(column, hashes, |v| v as i64 as u64),
        Int16 => ints::<dt::Int16Type>(column, hashes, |v| v as i64 as u64),
        Int32 => ints::<dt::Int32Type>(column, hashes, |v| v as i64 as u64),
        Int64 => ints::<dt::Int64Type>(column, hashes, |v| v as u64),
        UInt8 => ints::<dt::UInt8Type>(column, hashes, |v| v as u64),
        UInt16 => ints::<dt::UInt16Type>(column, hashes, |v| v as u64),
        UInt32 => ints::<dt::UInt32Type>(column, hashes, |v| v as u64),
        UInt64 => ints::<dt::UInt64Type>(column, hashes, |v| v),
        Date32 => ints::<dt::Date32Type>(column, hashes, |v| v as i64 as u64),
        Date64 => ints::<dt::Date64Type>(column, hashes, |v| v as u64),
        Decimal128(_, _) => ints::<dt::Decimal128Type>(column, hashes, |v| (v as u64) ^ mix((v >> 64) as u64)),
        Utf8 => strings(column.as_string::<i32>().iter(), hashes),
        LargeUtf8 => strings(column.as_string::<i64>().iter(), hashes),
        Utf8View => strings(column.as_string_view().iter(), hashes),
        other => return Err(DataFusionError::Execution(format!("a Bloom probe cannot hash keys of type {other}"))),
    }
    if let Some(nulls) = column.logical_nulls() {
        for (i, n) in null.iter_mut().enumerate() {
            *n |= nulls.is_null(i);
        }
    }
    Ok(())
}

/// The hash of each row's key (the columns together); `None` for a row
/// with a null key.
pub fn hash_rows(columns: &[ArrayRef]) -> Result<Vec<Option<u64>>> {
    let rows = columns.first().map_or(0, |c| c.len());
    let mut hashes = vec![0x9e37_79b9_7f4a_7c15u64; rows];
    let mut null = vec![false; rows];
    for c in columns {
        if c.len() != rows {
            return Err(DataFusionError::Internal("Bloom key columns of different lengths".into()));
        }
        fold(c, &mut hashes, &mut null)?;
    }
    Ok(hashes.into_iter().zip(null).map(|(h, n)| (!n).then_some(h)).collect())
}

/// A filter being built from the partitions of a join's build side,
/// shared with the probe that will use it. It is ready when every
/// partition has ended; a build side with more than [`MAX_KEYS`] distinct
/// keys, or one that failed, leaves no filter (probes then run without).
///
/// The filter itself (sorting, deduplicating and setting bits) is built on
/// the first [`BloomSlot::ready`], not when the build side ends: most
/// joins over cached data push nothing and never ask, and the build side's
/// end is on the join's critical path. A probe that knows it will not ask
/// says so with [`BloomSlot::abandon`], and the build side stops hashing
/// ([`BloomSlot::wanted`]).
#[derive(Debug)]
pub struct BloomSlot {
    state: std::sync::Mutex<SlotState>,
}

#[derive(Debug)]
enum SlotState {
    Building { hashes: Vec<u64>, done: Vec<bool> },
    /// Every partition ended; the filter is built when first asked for.
    Complete(Vec<u64>),
    Ready(Option<Arc<BloomFilter>>),
}

impl BloomSlot {
    /// A slot for a build side of `partitions` partitions.
    pub fn new(partitions: usize) -> Self {
        BloomSlot { state: std::sync::Mutex::new(SlotState::Building { hashes: Vec::new(), done: vec![false; partitions.max(1)] }) }
    }

    /// Adds a batch's key hashes (null keys are left out: they match nothing).
    pub fn add(&self, hashes: &[Option<u64>]) {
        let mut state = self.state.lock().expect("not poisoned");
        let SlotState::Building { hashes: all, .. } = &mut *state else { return };
        all.extend(hashes.iter().flatten());
        if all.len() > 2 * MAX_KEYS {
            all.sort_unstable();
            all.dedup();
            if all.len() > MAX_KEYS {
                *state = SlotState::Ready(None);
            }
        }
    }

    /// Partition `partition` of the build side ended; the last one builds the filter.
    pub fn finish(&self, partition: usize) {
        let mut state = self.state.lock().expect("not poisoned");
        let SlotState::Building { hashes, done } = &mut *state else { return };
        if let Some(d) = done.get_mut(partition) {
            *d = true;
        }
        if done.iter().all(|d| *d) {
            *state = SlotState::Complete(std::mem::take(hashes));
        }
    }

    /// No filter from this build side: it failed or cannot be hashed, or
    /// the probe will not ask for one (its scan pushes nothing).
    pub fn abandon(&self) {
        *self.state.lock().expect("not poisoned") = SlotState::Ready(None);
    }

    /// Whether the build side should still hash its keys (no filter is
    /// ready or abandoned yet).
    pub fn wanted(&self) -> bool {
        matches!(&*self.state.lock().expect("not poisoned"), SlotState::Building { .. })
    }

    /// The filter, once every partition ended and if one can be built
    /// (built here, on the first call).
    pub fn ready(&self) -> Option<Arc<BloomFilter>> {
        let mut state = self.state.lock().expect("not poisoned");
        match &mut *state {
            SlotState::Ready(f) => f.clone(),
            SlotState::Building { .. } => None,
            SlotState::Complete(hashes) => {
                let filter = BloomFilter::from_hashes(hashes).map(Arc::new);
                *state = SlotState::Ready(filter.clone());
                filter
            }
        }
    }
}

/// `bloom_probe(keys…)`: true for rows whose key may be in the filter.
#[derive(Debug, Clone)]
pub struct BloomProbeExpr {
    keys: Vec<Arc<dyn PhysicalExpr>>,
    filter: Arc<BloomFilter>,
}

impl BloomProbeExpr {
    /// A probe of `keys` (1 to [`MAX_KEY_COLUMNS`] expressions) against `filter`.
    pub fn new(keys: Vec<Arc<dyn PhysicalExpr>>, filter: Arc<BloomFilter>) -> Result<Self> {
        if keys.is_empty() || keys.len() > MAX_KEY_COLUMNS {
            return Err(DataFusionError::Plan(format!("a Bloom probe has 1 to {MAX_KEY_COLUMNS} key columns, not {}", keys.len())));
        }
        Ok(BloomProbeExpr { keys, filter })
    }

    /// The filter.
    pub fn filter(&self) -> &Arc<BloomFilter> {
        &self.filter
    }
}

impl fmt::Display for BloomProbeExpr {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let keys: Vec<String> = self.keys.iter().map(|k| k.to_string()).collect();
        write!(f, "bloom_probe({}; {} KiB)", keys.join(", "), self.filter.byte_size() / 1024)
    }
}

impl PartialEq for BloomProbeExpr {
    fn eq(&self, other: &Self) -> bool {
        self.keys.len() == other.keys.len() && self.keys.iter().zip(&other.keys).all(|(a, b)| a.as_ref() == b.as_ref()) && self.filter == other.filter
    }
}

impl Eq for BloomProbeExpr {}

impl Hash for BloomProbeExpr {
    fn hash<H: Hasher>(&self, state: &mut H) {
        for k in &self.keys {
            k.hash(state);
        }
        self.filter.byte_size().hash(state);
    }
}

impl PhysicalExpr for BloomProbeExpr {
    fn data_type(&self, _: &Schema) -> Result<DataType> {
        Ok(DataType::Boolean)
    }

    fn nullable(&self, _: &Schema) -> Result<bool> {
        Ok(false)
    }

    fn evaluate(&self, batch: &RecordBatch) -> Result<ColumnarValue> {
        let columns = self.keys.iter().map(|k| k.evaluate(batch)?.into_array(batch.num_rows())).collect::<Result<Vec<_>>>()?;
        let mut keep = BooleanBufferBuilder::new(batch.num_rows());
        for h in hash_rows(&columns)? {
            keep.append(h.is_some_and(|h| self.filter.contains(h)));
        }
        Ok(ColumnarValue::Array(Arc::new(BooleanArray::new(keep.finish(), None))))
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        self.keys.iter().collect()
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn PhysicalExpr>>) -> Result<Arc<dyn PhysicalExpr>> {
        Ok(Arc::new(BloomProbeExpr::new(children, self.filter.clone())?))
    }

    fn fmt_sql(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int32Array, StringArray};
    use datafusion::arrow::datatypes::Field;
    use datafusion::physical_expr::expressions::col;

    #[test]
    fn no_false_negatives_and_few_false_positives() {
        let keys: Vec<i32> = (0..5000).map(|i| i * 7).collect();
        let a: ArrayRef = Arc::new(Int32Array::from(keys.clone()));
        let mut hashes: Vec<u64> = hash_rows(&[a.clone()]).unwrap().into_iter().flatten().collect();
        let f = BloomFilter::from_hashes(&mut hashes).unwrap();
        assert!(hash_rows(&[a]).unwrap().into_iter().all(|h| f.contains(h.unwrap())));
        let others: ArrayRef = Arc::new(Int32Array::from((0..100_000).map(|i| i * 7 + 3).collect::<Vec<_>>()));
        let positives = hash_rows(&[others]).unwrap().into_iter().filter(|h| f.contains(h.unwrap())).count();
        assert!(positives < 2_000, "{positives} false positives of 100000");
        assert!(positives > 0, "a 1 % filter that never errs is not sized as documented");
    }

    #[test]
    fn hashes_are_fixed_values_not_per_process() {
        // A node and a compute process of different builds must agree.
        let a: ArrayRef = Arc::new(Int32Array::from(vec![1, 2]));
        let s: ArrayRef = Arc::new(StringArray::from(vec!["ASIA", "ASIA"]));
        let h = hash_rows(&[a, s]).unwrap();
        assert_eq!(h, hash_rows(&[Arc::new(Int32Array::from(vec![1, 2])) as ArrayRef, Arc::new(StringArray::from(vec!["ASIA", "ASIA"])) as ArrayRef]).unwrap());
        assert_eq!(mix(1), 0x5692_161d_100b_05e5);
        assert_ne!(h[0], h[1]);
    }

    #[test]
    fn null_keys_match_nothing_and_the_probe_filters_batches() {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int32, true)]));
        let build: ArrayRef = Arc::new(Int32Array::from(vec![Some(1), None, Some(3)]));
        let mut hashes: Vec<u64> = hash_rows(&[build]).unwrap().into_iter().flatten().collect();
        assert_eq!(hashes.len(), 2);
        let f = Arc::new(BloomFilter::from_hashes(&mut hashes).unwrap());
        let probe = BloomProbeExpr::new(vec![col("k", &schema).unwrap()], f).unwrap();
        let batch = RecordBatch::try_new(schema, vec![Arc::new(Int32Array::from(vec![Some(1), None, Some(2), Some(3)]))]).unwrap();
        let out = probe.evaluate(&batch).unwrap().into_array(4).unwrap();
        let out = out.as_boolean();
        assert!(out.value(0) && !out.value(1) && out.value(3));
        assert_eq!(out.null_count(), 0);
    }

    #[test]
    fn a_slot_is_ready_when_every_partition_ended() {
        let slot = BloomSlot::new(2);
        slot.add(&[Some(1), None, Some(2)]);
        slot.finish(0);
        slot.finish(0);
        assert!(slot.ready().is_none(), "partition 1 has not ended");
        slot.finish(1);
        let f = slot.ready().unwrap();
        assert!(f.contains(1) && f.contains(2));
        assert!(Arc::ptr_eq(&f, &slot.ready().unwrap()), "built once, then shared");
        assert!(!slot.wanted(), "a ready slot needs no more hashes");
        let big = BloomSlot::new(1);
        big.add(&(0..2 * MAX_KEYS as u64 + 1).map(Some).collect::<Vec<_>>());
        big.finish(0);
        assert!(big.ready().is_none(), "too many keys: no filter");
    }

    #[test]
    fn an_abandoned_slot_stops_hashing_and_never_gives_a_filter() {
        let slot = BloomSlot::new(2);
        assert!(slot.wanted());
        slot.add(&[Some(1)]);
        slot.abandon();
        assert!(!slot.wanted(), "the build side stops hashing");
        // Partitions that were already running still add and end.
        slot.add(&[Some(2)]);
        slot.finish(0);
        slot.finish(1);
        assert!(slot.ready().is_none(), "a filter missing keys of unhashed batches must never be used");
        // Ended but not yet asked for: still complete, built on demand.
        let done = BloomSlot::new(1);
        done.add(&[Some(7)]);
        done.finish(0);
        assert!(!done.wanted());
        assert!(done.ready().unwrap().contains(7));
    }

    #[test]
    fn too_many_keys_build_no_filter_and_bad_parts_are_refused() {
        let mut many: Vec<u64> = (0..MAX_KEYS as u64 + 1).map(mix).collect();
        assert!(BloomFilter::from_hashes(&mut many).is_none());
        let mut dups: Vec<u64> = vec![5; MAX_KEYS * 2];
        assert!(BloomFilter::from_hashes(&mut dups).is_some(), "duplicates count once");
        assert!(BloomFilter::from_parts(vec![0; 12], 7).unwrap_err().contains("power of two"));
        assert!(BloomFilter::from_parts(vec![0; 8], 0).unwrap_err().contains("1 to 16"));
        assert!(BloomFilter::from_parts(vec![0; MAX_FILTER_BYTES / 4], 7).is_err());
    }
}
