//! A column chunk as the memory tier holds it decoded: the arrays the scan
//! that filled it decoded, batch by batch, never joined into one, and
//! decimals of up to 18 digits in 64 bits.
//!
//! Why pieces. The tier's decoded form is made from a scan's own batches on
//! a chunk's second read (`crate::tiers`). Joining them into one array per
//! chunk copied every value once more into memory fresh from the kernel, on
//! the query's path, and held both copies until the copy was done: SF 10's
//! Q6 read a second time in one process took 4.7 s against 1.4 s the first
//! time and 0.2 s the third, and 40 % of its CPU was the kernel zeroing
//! pages (docs/notes/2026-11-27-issue43-scaling.md). Held as pieces, the
//! batches the scan decoded anyway are the tier's copy.
//!
//! Why 64 bits. Arrow's decimal type of DataFusion 55 is `Decimal128`, 16
//! bytes a value, while a decimal of precision ≤ 18 fits an `i64` (|v| <
//! 10^18 < 2^63): TPC-H's prices and quantities would take twice the
//! memory they need, and twice the fresh pages to fill. A piece is widened
//! back as its rows are copied out, a copy every read makes anyway (a
//! batch of its own, for the operators' accounting) — so a narrowed piece
//! is never lent as a slice. A piece holding a value outside 64 bits
//! (precision metadata is not a promise the bytes keep) stays as it came.
//!
//! Why by hand: arrow has no array made of pieces, and its `Decimal64`
//! type is not what DataFusion 55's operators compute with.

use std::ops::Range;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Decimal128Array, Int64Array, MutableArrayData, make_array, new_empty_array};
use datafusion::arrow::datatypes::{DataType, Decimal128Type, Int64Type};
use datafusion::arrow::error::ArrowError;

/// Whether the tier holds `data_type` narrowed to 64 bits.
fn narrows(data_type: &DataType) -> bool {
    matches!(data_type, DataType::Decimal128(p, _) if *p <= 18)
}

/// Bytes a value of `data_type` takes held decoded, when values have a
/// fixed width: what planning charges the tier for a decoded chunk.
pub fn held_width(data_type: &DataType) -> Option<usize> {
    match narrows(data_type) {
        true => Some(8),
        false => data_type.primitive_width(),
    }
}

/// The arrays one scan decoded of one chunk, in row order, as the tier will
/// hold them ([`ChunkPieces::push`]).
#[derive(Debug, Default, Clone)]
pub struct ChunkPieces {
    /// The type scans read (the first piece's, before narrowing).
    data_type: Option<DataType>,
    pieces: Vec<ArrayRef>,
    /// A piece of another type came: a decoder fault, and no chunk is made.
    mixed: bool,
}

impl ChunkPieces {
    /// The next decoded rows of the chunk. Decimals of precision ≤ 18 are
    /// narrowed here, in the partition that decoded them; an array whose
    /// buffers are shared with a larger one (a slice) is copied, so a
    /// piece holds and is charged for its own rows only.
    pub fn push(&mut self, array: &ArrayRef) {
        if array.is_empty() {
            return;
        }
        let data_type = self.data_type.get_or_insert_with(|| array.data_type().clone());
        if data_type != array.data_type() {
            self.mixed = true;
            return;
        }
        if narrows(array.data_type())
            && let Some(narrow) = narrow(array.as_primitive::<Decimal128Type>())
        {
            self.pieces.push(Arc::new(narrow));
            return;
        }
        let data = array.to_data();
        let compact = match data.get_slice_memory_size() {
            Ok(own) => array.get_array_memory_size() <= own.saturating_mul(2).max(4096),
            Err(_) => false,
        };
        let copy = || {
            let mut copy = MutableArrayData::new(vec![&data], false, array.len());
            copy.try_extend(0, 0, array.len()).map(|()| make_array(copy.freeze()))
        };
        self.pieces.push(match compact {
            true => array.clone(),
            false => copy().unwrap_or_else(|_| array.clone()),
        });
    }
}

/// The values of `array` in 64 bits; `None` when one does not fit.
fn narrow(array: &Decimal128Array) -> Option<Int64Array> {
    let narrow: Int64Array = array.unary(|v| v as i64);
    let pairs = array.values().iter().zip(narrow.values().iter());
    // Values under nulls are unspecified and may not fit: only valid ones count.
    let fits = match array.nulls() {
        None => pairs.fold(true, |fits, (&wide, &n)| fits & (n as i128 == wide)),
        Some(nulls) => pairs.zip(nulls.iter()).fold(true, |fits, ((&wide, &n), valid)| fits & (!valid || n as i128 == wide)),
    };
    fits.then_some(narrow)
}

/// A narrowed piece as scans read it.
fn widen(array: &ArrayRef, data_type: &DataType) -> Result<ArrayRef, ArrowError> {
    match (array.data_type(), data_type) {
        (DataType::Int64, DataType::Decimal128(p, s)) => Ok(Arc::new(array.as_primitive::<Int64Type>().unary::<_, Decimal128Type>(|v| v as i128).with_precision_and_scale(*p, *s)?)),
        _ => Ok(array.clone()),
    }
}

/// A whole column chunk decoded, as pieces ([module docs](self)).
#[derive(Debug)]
pub struct DecodedChunk {
    /// The type scans read.
    data_type: DataType,
    pieces: Vec<ArrayRef>,
    /// The row just past each piece.
    ends: Vec<u64>,
}

impl DecodedChunk {
    /// The chunk made of `parts`, each one scan's consecutive rows, in row
    /// order. `None` with no rows, or when the pieces disagree on the type.
    pub fn join(parts: impl IntoIterator<Item = ChunkPieces>) -> Option<DecodedChunk> {
        let mut data_type: Option<DataType> = None;
        let mut pieces = Vec::new();
        for part in parts {
            if part.mixed {
                return None;
            }
            let Some(t) = part.data_type else { continue };
            match &data_type {
                Some(d) if *d != t => return None,
                Some(_) => {}
                None => data_type = Some(t),
            }
            pieces.extend(part.pieces);
        }
        let mut end = 0;
        let ends = pieces
            .iter()
            .map(|p| {
                end += p.len() as u64;
                end
            })
            .collect();
        Some(DecodedChunk { data_type: data_type?, pieces, ends })
    }

    /// Its rows.
    pub fn len(&self) -> u64 {
        self.ends.last().copied().unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes its arrays take.
    pub fn memory_size(&self) -> u64 {
        self.pieces.iter().map(|p| p.get_array_memory_size() as u64).sum()
    }

    /// The piece holding row `row`, and that piece's first row.
    fn piece_of(&self, row: u64) -> (usize, u64) {
        let i = self.ends.partition_point(|&end| end <= row);
        (i, if i == 0 { 0 } else { self.ends[i - 1] })
    }

    /// Whether piece `i` is held as scans read it (not narrowed).
    fn as_read(&self, i: usize) -> bool {
        self.pieces[i].data_type() == &self.data_type
    }

    /// Rows `range` as a slice of the tier's own buffers, without a copy:
    /// only when they lie in one piece held as scans read it, and are not
    /// that whole piece (which [`DecodedChunk::rows`] returns itself). The
    /// caller must not hand the slice on to operators as it is (it keeps
    /// the piece's buffers alive and counted); `None` otherwise.
    pub fn lend(&self, range: &Range<u64>) -> Option<ArrayRef> {
        if range.start >= range.end || range.end > self.len() {
            return None;
        }
        let (i, first) = self.piece_of(range.start);
        let piece = &self.pieces[i];
        let len = range.end - range.start;
        (self.as_read(i) && range.end <= self.ends[i] && len < piece.len() as u64).then(|| piece.slice((range.start - first) as usize, len as usize))
    }

    /// Rows `at` (ascending, within the chunk) in an array of their own, of
    /// the type scans read. Exactly one whole piece held as read is that
    /// piece itself, which is what a copy would be.
    pub fn rows(&self, at: &[Range<u64>]) -> Result<ArrayRef, ArrowError> {
        let total: u64 = at.iter().map(|r| r.end - r.start).sum();
        if at.iter().any(|r| r.start > r.end || r.end > self.len()) {
            return Err(ArrowError::InvalidArgumentError(format!("rows {at:?} of a decoded chunk of {} rows", self.len())));
        }
        if total == 0 {
            return Ok(new_empty_array(&self.data_type));
        }
        if let [one] = at {
            let (i, first) = self.piece_of(one.start);
            if i < self.pieces.len() && one.start == first && one.end == self.ends[i] && self.as_read(i) {
                return Ok(self.pieces[i].clone());
            }
        }
        // The pieces the ranges touch, and each range cut at their edges.
        let mut sources: Vec<usize> = Vec::new();
        let mut cuts: Vec<(usize, usize, usize)> = Vec::new(); // (source, start, end) in the piece
        for r in at {
            let mut row = r.start;
            while row < r.end {
                let (i, first) = self.piece_of(row);
                let end = r.end.min(self.ends[i]);
                if sources.last() != Some(&i) {
                    sources.push(i);
                }
                cuts.push((sources.len() - 1, (row - first) as usize, (end - first) as usize));
                row = end;
            }
        }
        // Narrowed pieces copy out as 64-bit values and widen after; with
        // a piece that kept its width among them, they widen first.
        let narrowed: Vec<bool> = sources.iter().map(|&i| !self.as_read(i)).collect();
        let all_narrowed = narrowed.iter().all(|&n| n);
        let held: Vec<ArrayRef> = sources
            .iter()
            .zip(&narrowed)
            .map(|(&i, &n)| match n && !all_narrowed {
                true => widen(&self.pieces[i], &self.data_type),
                false => Ok(self.pieces[i].clone()),
            })
            .collect::<Result<_, _>>()?;
        let data: Vec<_> = held.iter().map(|a| a.to_data()).collect();
        let mut out = MutableArrayData::new(data.iter().collect(), false, total as usize);
        for (source, start, end) in cuts {
            out.try_extend(source, start, end)?;
        }
        let array = make_array(out.freeze());
        match all_narrowed && !sources.is_empty() {
            true => widen(&array, &self.data_type),
            false => Ok(array),
        }
    }
}

#[cfg(test)]
mod tests;
