//! A Bloom filter over a join's build-side key values, checked by the scan
//! of the probe side before DataFusion's own join filter.
//!
//! DataFusion's filter for a partitioned hash join is a `CASE` over the
//! row's hash partition whose branches look the key up in that
//! partition's hash table: a hash and a probe of a table of millions of
//! entries per scanned row. In TPC-H Q5 at SF 10 it ran on all 60 M
//! `lineitem` rows to keep 0.37 M and took a sixth of the query's CPU.
//! [`KeyBloom`] answers the same question wrongly for about one row in a
//! hundred and never for a row that matches, from one 64-bit word per
//! probe (blocked: all of a key's bits lie in one word), in a filter of
//! [`BITS_PER_KEY`] to twice that many bits per key (1 MiB for Q5's 0.46 M
//! keys: in the core's L2 or L3 cache, where the join's table is not).
//! The scan evaluates it first; DataFusion's filter then sees only the
//! rows it let through.
//!
//! Why ours and not `blobhouse_pushdown::bloom`: that one is a wire format
//! between processes (fixed hash, seven probes scattered over the filter,
//! capped at 1 MiB); this one never leaves the process and is built for
//! the probe's speed. The hash (that module's `mix`) is a fixed function
//! of the 64-bit value, so build and probe agree whatever the key's
//! integer width.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, BooleanArray, RecordBatch};
use datafusion::arrow::buffer::{BooleanBuffer, MutableBuffer};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Int64Type, Schema};
use datafusion::common::{DataFusionError, Result};
use datafusion::logical_expr::ColumnarValue;
use datafusion::physical_expr::PhysicalExpr;

use blobhouse_pushdown::bloom::mix;

/// Bits per distinct key before the word count is rounded up to a power
/// of two (false positives: about 1 % at 12 bits, 0.3 % at 24).
pub const BITS_PER_KEY: usize = 12;

/// A blocked Bloom filter over 64-bit values: four bits in one word each.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct KeyBloom {
    words: Vec<u64>,
    /// `64 - log2(words.len())`: the shift that turns a hash into a word.
    shift: u32,
    keys: usize,
}

impl fmt::Debug for KeyBloom {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "KeyBloom({} keys, {} KiB)", self.keys, self.words.len() / 128)
    }
}

impl KeyBloom {
    /// A filter holding the distinct `keys`.
    pub fn new(keys: &[i64]) -> KeyBloom {
        let words = (keys.len() * BITS_PER_KEY).div_ceil(64).next_power_of_two().max(2);
        let mut bloom = KeyBloom { words: vec![0; words], shift: 64 - words.trailing_zeros(), keys: keys.len() };
        for &k in keys {
            let (word, mask) = bloom.probe(k);
            bloom.words[word] |= mask;
        }
        bloom
    }

    /// The word and the bits of `key`.
    #[inline]
    fn probe(&self, key: i64) -> (usize, u64) {
        let h = mix(key as u64);
        let word = (h >> self.shift) as usize;
        let mask = (1u64 << (h & 63)) | (1u64 << ((h >> 6) & 63)) | (1u64 << ((h >> 12) & 63)) | (1u64 << ((h >> 18) & 63));
        (word, mask)
    }

    /// Whether `key` may be among the keys (always, for one that is).
    #[inline]
    pub fn contains(&self, key: i64) -> bool {
        let (word, mask) = self.probe(key);
        self.words[word] & mask == mask
    }

    /// The distinct keys it holds.
    pub fn keys(&self) -> usize {
        self.keys
    }
}

/// `column`'s value may be one of a [`KeyBloom`]'s keys: true for every
/// key that is, and for about one in a hundred that is not; null never
/// passes (it matches no key).
#[derive(Debug, Clone)]
pub struct KeyBloomExpr {
    column: Arc<dyn PhysicalExpr>,
    bloom: Arc<KeyBloom>,
}

impl KeyBloomExpr {
    /// The filter of `column` (an integer or date column) by `bloom`.
    pub fn new(column: Arc<dyn PhysicalExpr>, bloom: Arc<KeyBloom>) -> Self {
        KeyBloomExpr { column, bloom }
    }
}

impl PartialEq for KeyBloomExpr {
    fn eq(&self, other: &Self) -> bool {
        self.column.eq(&other.column) && Arc::ptr_eq(&self.bloom, &other.bloom)
    }
}

impl Eq for KeyBloomExpr {}

impl Hash for KeyBloomExpr {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.column.hash(state);
        Arc::as_ptr(&self.bloom).hash(state);
    }
}

impl fmt::Display for KeyBloomExpr {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{} IN BLOOM ({} keys)", self.column, self.bloom.keys)
    }
}

impl PhysicalExpr for KeyBloomExpr {
    fn data_type(&self, _: &Schema) -> Result<DataType> {
        Ok(DataType::Boolean)
    }

    fn nullable(&self, _: &Schema) -> Result<bool> {
        Ok(false)
    }

    fn evaluate(&self, batch: &RecordBatch) -> Result<ColumnarValue> {
        let values = self.column.evaluate(batch)?.into_array(batch.num_rows())?;
        let values = match values.data_type() {
            DataType::Int64 => values,
            DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::UInt8 | DataType::UInt16 | DataType::UInt32 | DataType::Date32 => cast(&values, &DataType::Int64)?,
            other => return Err(DataFusionError::Internal(format!("a key Bloom filter reads integers, not {other}"))),
        };
        let values = values.as_primitive::<Int64Type>();
        let rows = values.len();
        let mut bits = MutableBuffer::from_len_zeroed(rows.div_ceil(8));
        let out = bits.as_slice_mut();
        for (i, &v) in values.values().iter().enumerate() {
            if self.bloom.contains(v) {
                out[i / 8] |= 1 << (i % 8);
            }
        }
        let mut mask = BooleanBuffer::new(bits.into(), 0, rows);
        if let Some(nulls) = values.nulls() {
            mask = &mask & nulls.inner();
        }
        Ok(ColumnarValue::Array(Arc::new(BooleanArray::new(mask, None))))
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        vec![&self.column]
    }

    fn with_new_children(self: Arc<Self>, mut children: Vec<Arc<dyn PhysicalExpr>>) -> Result<Arc<dyn PhysicalExpr>> {
        if children.len() != 1 {
            return Err(DataFusionError::Internal(format!("a key Bloom filter reads one column, was given {}", children.len())));
        }
        Ok(Arc::new(KeyBloomExpr { column: children.remove(0), bloom: Arc::clone(&self.bloom) }))
    }

    fn fmt_sql(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int32Array, Int64Array};
    use datafusion::arrow::datatypes::Field;
    use datafusion::physical_expr::expressions::Column;

    /// Every key passes; of a million others, about 1 % (at most 2 %).
    #[test]
    fn no_false_negatives_and_few_false_positives() {
        let keys: Vec<i64> = (0..200_000).map(|i| i * 7919 + 13).collect();
        let bloom = KeyBloom::new(&keys);
        assert!(keys.iter().all(|&k| bloom.contains(k)));
        let others = (0..1_000_000i64).map(|i| -(i * 104_729) - 1).filter(|&k| bloom.contains(k)).count();
        assert!(others < 20_000, "{others} false positives in a million");
    }

    /// The expression widens narrower integers the way the build side did,
    /// and a null key never passes.
    #[test]
    fn evaluates_narrow_integers_and_drops_nulls() {
        let bloom = Arc::new(KeyBloom::new(&[3, 5, 1_000_000]));
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int32, true), Field::new("w", DataType::Int64, true)]));
        let batch = RecordBatch::try_new(
            schema,
            vec![Arc::new(Int32Array::from(vec![Some(3), None, Some(5), Some(1_000_000)])), Arc::new(Int64Array::from(vec![Some(5), Some(3), None, Some(1_000_000)]))],
        )
        .unwrap();
        for (i, name) in ["k", "w"].into_iter().enumerate() {
            let e = KeyBloomExpr::new(Arc::new(Column::new(name, i)), Arc::clone(&bloom));
            let mask = e.evaluate(&batch).unwrap().into_array(4).unwrap();
            let mask = mask.as_boolean();
            assert_eq!(mask.null_count(), 0);
            let passed: Vec<bool> = mask.iter().map(|v| v.unwrap()).collect();
            let expected = if name == "k" { vec![true, false, true, true] } else { vec![true, true, false, true] };
            assert_eq!(passed, expected, "{name}");
        }
    }
}
