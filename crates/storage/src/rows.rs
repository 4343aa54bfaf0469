//! Which rows of a row group a reader decodes, and where each decoded row
//! sits in its object.
//!
//! A scan whose filters rule out some pages of a row group (by the page
//! index's min/max) decodes only the other pages' rows. The decoder then
//! returns fewer rows than the row group has, and the object position of
//! each row — what row ids and deletion vectors are keyed by — follows from
//! the selection only. Both readers of data objects (the engine's scan and
//! a storage node) go through this module, so they agree on every row.
//!
//! Written here rather than taken from `parquet`: its `RowSelection` says
//! what to decode but not where the decoded rows were, and it is not a wire
//! format; [`RowRanges`] is both, and is checked when it comes off the wire.

use std::ops::Range;
use std::sync::Arc;

use datafusion::arrow::array::{BooleanArray, BooleanBufferBuilder, UInt64Array};
use datafusion::arrow::compute::filter_record_batch;
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::record_batch::{RecordBatch, RecordBatchOptions};
use parquet::arrow::arrow_reader::{RowSelection, RowSelector};
use roaring::RoaringBitmap;

/// The rows of one row group to decode: sorted, disjoint, non-empty ranges
/// of positions within the row group (0 is its first row).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowRanges {
    ranges: Vec<Range<u64>>,
    rows: u64,
}

impl RowRanges {
    /// Every row of a row group of `rows` rows.
    pub fn all(rows: u64) -> Self {
        RowRanges { ranges: if rows == 0 { Vec::new() } else { vec![0..rows] }, rows }
    }

    /// `ranges` of a row group of `rows` rows, checked: they must be sorted,
    /// disjoint, non-empty and inside the row group (they may come from
    /// another process).
    pub fn try_new(ranges: Vec<Range<u64>>, rows: u64) -> Result<Self, String> {
        let mut end = 0u64;
        for r in &ranges {
            if r.start >= r.end {
                return Err(format!("the row range {}..{} is empty", r.start, r.end));
            }
            if r.start < end {
                return Err(format!("the row range {}..{} is out of order or overlaps the one before", r.start, r.end));
            }
            if r.end > rows {
                return Err(format!("the row range {}..{} ends past the row group's {rows} rows", r.start, r.end));
            }
            end = r.end;
        }
        Ok(RowRanges { ranges, rows })
    }

    /// The rows that `selection` (over a row group of `rows` rows) selects.
    pub fn from_selection(selection: &RowSelection, rows: u64) -> Self {
        let mut ranges: Vec<Range<u64>> = Vec::new();
        let mut at = 0u64;
        for s in selection.iter() {
            let end = (at + s.row_count as u64).min(rows);
            if !s.skip && end > at {
                match ranges.last_mut() {
                    Some(last) if last.end == at => last.end = end,
                    _ => ranges.push(at..end),
                }
            }
            at = end;
        }
        RowRanges { ranges, rows }
    }

    /// The same rows as a selection for the Parquet decoder.
    pub fn selection(&self) -> RowSelection {
        let mut selectors = Vec::with_capacity(self.ranges.len() * 2 + 1);
        let mut at = 0u64;
        for r in &self.ranges {
            if r.start > at {
                selectors.push(RowSelector::skip((r.start - at) as usize));
            }
            selectors.push(RowSelector::select((r.end - r.start) as usize));
            at = r.end;
        }
        if at < self.rows {
            selectors.push(RowSelector::skip((self.rows - at) as usize));
        }
        RowSelection::from(selectors)
    }

    /// Whether every row is selected (nothing to skip).
    pub fn is_all(&self) -> bool {
        self.selected() == self.rows
    }

    /// Rows selected.
    pub fn selected(&self) -> u64 {
        self.ranges.iter().map(|r| r.end - r.start).sum()
    }

    /// Rows of the row group.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// The selected ranges.
    pub fn ranges(&self) -> &[Range<u64>] {
        &self.ranges
    }

    /// The selected rows cut into at most `parts` consecutive pieces of
    /// nearly equal size (in selected rows), each over the same row group:
    /// the morsels that several threads decode at once. Together the pieces
    /// select exactly these rows, in order; none is empty, so fewer than
    /// `parts` come back when fewer rows are selected.
    pub fn split(&self, parts: usize) -> Vec<RowRanges> {
        let selected = self.selected();
        let parts = (parts.max(1) as u64).min(selected.max(1));
        let mut out = Vec::with_capacity(parts as usize);
        let mut current: Vec<Range<u64>> = Vec::new();
        let (mut taken, mut in_current) = (0u64, 0u64);
        for r in &self.ranges {
            let mut start = r.start;
            while start < r.end {
                // Piece i ends after ⌈(i+1)·selected/parts⌉ selected rows.
                let piece = out.len() as u64;
                let piece_end = ((piece + 1) * selected).div_ceil(parts);
                let len = (r.end - start).min(piece_end - taken);
                current.push(start..start + len);
                (start, taken, in_current) = (start + len, taken + len, in_current + len);
                if taken == piece_end {
                    out.push(RowRanges { ranges: std::mem::take(&mut current), rows: self.rows });
                    in_current = 0;
                }
            }
        }
        debug_assert!(in_current == 0 && current.is_empty(), "every selected row is in a piece");
        out
    }

    /// Rows selected that `deleted` (object positions; the row group starts
    /// at `first_row`) does not delete.
    pub fn live(&self, first_row: u64, deleted: Option<&RoaringBitmap>) -> u64 {
        let dead: u64 = deleted.map_or(0, |d| self.ranges.iter().map(|r| d.range_cardinality(object_range(first_row, r))).sum());
        self.selected() - dead
    }
}

/// Positions of decoded rows, handed out batch by batch in decoding order.
#[derive(Debug)]
pub struct Positions {
    ranges: Arc<RowRanges>,
    /// The range the next row is in, and how far into it.
    next: usize,
    within: u64,
}

impl Positions {
    /// A cursor over the positions of the rows of `ranges`, as the decoder
    /// returns them.
    pub fn new(ranges: Arc<RowRanges>) -> Self {
        Positions { ranges, next: 0, within: 0 }
    }

    /// Rows the selection holds in all.
    pub fn selected(&self) -> u64 {
        self.ranges.selected()
    }

    /// The positions (within the row group) of the next `n` decoded rows.
    /// Fewer when the selection has fewer rows left, which a caller treats
    /// as a decoder that returned more rows than it was asked for.
    pub fn take(&mut self, n: usize) -> Vec<Range<u64>> {
        let mut left = n as u64;
        let mut out = Vec::new();
        while left > 0 {
            let Some(r) = self.ranges.ranges.get(self.next) else { break };
            let start = r.start + self.within;
            let len = (r.end - start).min(left);
            out.push(start..start + len);
            left -= len;
            self.within += len;
            if start + len == r.end {
                self.next += 1;
                self.within = 0;
            }
        }
        out
    }
}

fn object_range(first_row: u64, r: &Range<u64>) -> Range<u32> {
    // Objects hold fewer than 2^32 rows (row ids keep positions in 32 bits).
    (first_row + r.start) as u32..(first_row + r.end) as u32
}

/// Row ids of rows at `positions` of a row group starting at `first_row` in
/// the object with ordinal `ordinal`: the ordinal in the upper 32 bits, the
/// position in the object in the lower.
pub fn row_ids(ordinal: u32, first_row: u64, positions: &[Range<u64>]) -> UInt64Array {
    let high = u64::from(ordinal) << 32;
    positions.iter().flat_map(|r| (first_row + r.start..first_row + r.end).map(move |p| high | p)).collect()
}

/// `batch` holds rows at `positions` of a row group starting at `first_row`
/// (in order); returns it without the rows `deleted` deletes, and how many
/// were dropped. Work in proportion to the deleted rows, not to the batch,
/// when few are deleted.
pub fn drop_deleted(batch: RecordBatch, first_row: u64, positions: &[Range<u64>], deleted: Option<&RoaringBitmap>) -> Result<(RecordBatch, usize), ArrowError> {
    let Some(deleted) = deleted.filter(|d| positions.iter().any(|r| d.range_cardinality(object_range(first_row, r)) > 0)) else {
        return Ok((batch, 0));
    };
    let rows = batch.num_rows();
    let mut bits = BooleanBufferBuilder::new(rows);
    bits.append_n(rows, true);
    let mut at = 0usize; // the batch row of the range's first position
    for r in positions {
        for p in deleted.range(object_range(first_row, r)) {
            let i = at + (u64::from(p) - first_row - r.start) as usize;
            if i >= rows {
                return Err(ArrowError::InvalidArgumentError(format!("a batch of {rows} rows was given positions for more rows")));
            }
            bits.set_bit(i, false);
        }
        at += (r.end - r.start) as usize;
    }
    let keep = BooleanArray::new(bits.finish(), None);
    let kept = keep.true_count();
    let out = if batch.num_columns() == 0 {
        RecordBatch::try_new_with_options(batch.schema(), vec![], &RecordBatchOptions::new().with_row_count(Some(kept)))?
    } else {
        filter_record_batch(&batch, &keep)?
    };
    Ok((out, rows - kept))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    #[test]
    fn split_cuts_the_selected_rows_into_even_consecutive_pieces() {
        let all = RowRanges::all(1000);
        let pieces = all.split(3);
        let got: Vec<Vec<Range<u64>>> = pieces.iter().map(|p| p.ranges().to_vec()).collect();
        assert_eq!(got, vec![vec![0..334], vec![334..667], vec![667..1000]]);
        assert!(pieces.iter().all(|p| p.rows() == 1000));

        // A selection with gaps: pieces follow the selected rows, and a
        // piece may span a gap.
        let some = RowRanges::try_new(vec![10..20, 50..60, 90..100], 100).unwrap();
        let got: Vec<Vec<Range<u64>>> = some.split(2).iter().map(|p| p.ranges().to_vec()).collect();
        assert_eq!(got, vec![vec![10..20, 50..55], vec![55..60, 90..100]]);
        let rejoined: Vec<Range<u64>> = some.split(7).iter().flat_map(|p| p.ranges().to_vec()).collect();
        let selected: u64 = rejoined.iter().map(|r| r.end - r.start).sum();
        assert_eq!(selected, 30, "every selected row in exactly one piece");

        // More pieces than rows: one row each; none empty.
        assert_eq!(RowRanges::all(3).split(8).len(), 3);
        assert_eq!(RowRanges::all(5).split(1), vec![RowRanges::all(5)]);
        assert_eq!(RowRanges::all(0).split(4).len(), 0);
    }

    #[test]
    fn ranges_and_selections_convert_both_ways() {
        let r = RowRanges::try_new(vec![10..20, 25..30, 40..50], 60).unwrap();
        let sel = r.selection();
        assert_eq!(sel.row_count(), 25);
        assert_eq!(sel.skipped_row_count(), 35);
        assert_eq!(RowRanges::from_selection(&sel, 60), r);
        assert!(!r.is_all());
        assert!(RowRanges::all(60).is_all());
        assert_eq!(RowRanges::from_selection(&RowRanges::all(60).selection(), 60), RowRanges::all(60));
    }

    #[test]
    fn ranges_from_elsewhere_are_checked() {
        assert!(RowRanges::try_new(vec![5..5], 10).unwrap_err().contains("empty"));
        assert!(RowRanges::try_new(vec![4..6, 5..8], 10).unwrap_err().contains("overlaps"));
        assert!(RowRanges::try_new(vec![6..8, 1..2], 10).unwrap_err().contains("out of order"));
        assert!(RowRanges::try_new(vec![8..11], 10).unwrap_err().contains("past the row group's 10 rows"));
        assert!(RowRanges::try_new(vec![0..4, 4..10], 10).is_ok());
    }

    #[test]
    fn positions_follow_the_selection_across_batches() {
        let r = Arc::new(RowRanges::try_new(vec![10..13, 20..22, 30..40], 50).unwrap());
        let mut p = Positions::new(r);
        assert_eq!(p.take(2), vec![10..12]);
        assert_eq!(p.take(4), vec![12..13, 20..22, 30..31]);
        assert_eq!(p.take(100), vec![31..40]);
        assert_eq!(p.take(1), Vec::<Range<u64>>::new());
        assert_eq!(row_ids(2, 1000, &[3..5, 9..10]).values().to_vec(), vec![2 << 32 | 1003, 2 << 32 | 1004, 2 << 32 | 1009]);
    }

    #[test]
    fn deleted_rows_are_dropped_by_their_position_in_the_object() {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        // Rows at positions 100..105 and 200..205 of the object (row group from 90).
        let values: Vec<i64> = (100..105).chain(200..205).collect();
        let batch = RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(values))]).unwrap();
        let deleted: RoaringBitmap = [99u32, 101, 105, 199, 200, 204, 205].into_iter().collect();
        let (kept, dropped) = drop_deleted(batch.clone(), 90, &[10..15, 110..115], Some(&deleted)).unwrap();
        let x = kept.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
        assert_eq!(x.values().to_vec(), vec![100, 102, 103, 104, 201, 202, 203]);
        assert_eq!(dropped, 3);
        let (same, none) = drop_deleted(batch, 90, &[10..15, 110..115], None).unwrap();
        assert_eq!((same.num_rows(), none), (10, 0));
        let r = RowRanges::try_new(vec![10..15, 110..115], 200).unwrap();
        assert_eq!(r.live(90, Some(&deleted)), 7);
    }
}
