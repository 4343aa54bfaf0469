//! Morsels: the pieces an arrived row group is cut into, so that several
//! partitions decode one row group at once, and the memory tier's decoded
//! copies of its chunks, put together from what those pieces decoded.
//!
//! A row group is fetched whole (its requests are sized for the store) and
//! then shared by its morsels ([`Landed`]); each morsel is a consecutive
//! piece of the rows to decode ([`RowRanges::split`]). The Parquet reader
//! of a morsel skips the pages before its rows by their headers, without
//! decompressing them; only a dictionary page and the page a cut falls in
//! are decoded by two morsels.
//!
//! The memory tier may want some of the row group's chunks in decoded
//! form (every row, one array) in place of the compressed bytes it served
//! (`crate::tiers`: a chunk's second read). They are not decoded a second
//! time for it: each morsel keeps the arrays its batches decoded for them,
//! and the morsel that finishes last hands all the pieces to the tier, as
//! they are: joined into one array they cost a copy in fresh memory on the
//! query's path (`crate::tiers::decoded`) ([`Fills::Assembled`]). Only a row group that the page index thinned
//! out is decoded whole for the tier ([`Fills::Whole`]): its batches do not
//! hold every row.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;


use blobhouse_storage::rows::RowRanges;

use crate::chunks::FetchedChunks;
use crate::scan::ScanUnit;
use crate::tiers::{ChunkPieces, DecodedChunk, DecodedFills};

use super::Arrived;

/// A downloaded row group, shared by the morsels it is decoded in.
pub(super) struct Landed {
    pub unit: ScanUnit,
    /// Its chunks in Parquet form.
    pub compressed: FetchedChunks,
    /// (index in the unit's chunks, chunk) of those the memory tier held
    /// decoded.
    pub decoded: Vec<(usize, Arc<DecodedChunk>)>,
    /// When it arrived.
    pub at: Instant,
    pub fills: Fills,
    /// Morsels not yet decoded to their end.
    left: AtomicUsize,
}

/// The chunks the memory tier waits for decoded, and how they are made.
pub(super) enum Fills {
    None,
    /// Decoded whole by the unit's only morsel before it starts: a row
    /// group the page index thinned out decodes only some rows, and the
    /// tier holds every row.
    Whole(Mutex<Option<DecodedFills>>),
    /// Put together from the arrays the morsels decode anyway.
    Assembled(Mutex<Assembly>),
}

/// The memory tier's decoded chunks of one row group, piece by piece.
pub(super) struct Assembly {
    fills: DecodedFills,
    /// The unit's chunk indexes to fill, ascending.
    columns: Vec<usize>,
    /// Per morsel, per column of `columns`: the arrays its batches decoded.
    pieces: Vec<Option<Vec<ChunkPieces>>>,
}

/// One piece of an arrived row group, for one partition to decode.
pub(super) struct Morsel {
    pub landed: Arc<Landed>,
    /// Its position among the row group's morsels.
    pub piece: usize,
    /// The rows it decodes (positions in the row group).
    pub rows: Arc<RowRanges>,
    /// Its share of the row group's bytes, counted as ready until taken.
    pub bytes: u64,
}

impl Landed {
    /// Cuts an arrived row group into its morsels ([`ScanUnit::morsels`]
    /// of them, fewer when fewer rows are selected), in row order.
    pub(super) fn cut(arrived: Arrived) -> Vec<Morsel> {
        let Arrived { unit, data, at } = arrived;
        let thinned = unit.selection.is_some();
        let rows = unit.selection.clone().unwrap_or_else(|| Arc::new(RowRanges::all(unit.rows)));
        let parts = match (&data.fills, thinned) {
            (Some(_), true) => 1,
            _ => unit.morsels.max(1),
        };
        let mut pieces: Vec<Arc<RowRanges>> = match parts {
            1 => vec![rows.clone()],
            n => rows.split(n).into_iter().map(Arc::new).collect(),
        };
        if pieces.is_empty() {
            pieces.push(rows);
        }
        let fills = match data.fills {
            None => Fills::None,
            Some(f) if thinned => Fills::Whole(Mutex::new(Some(f))),
            Some(f) => {
                let mut columns: Vec<usize> = f.indexes().collect();
                columns.sort_unstable();
                Fills::Assembled(Mutex::new(Assembly { fills: f, columns, pieces: (0..pieces.len()).map(|_| None).collect() }))
            }
        };
        let (n, bytes) = (pieces.len() as u64, unit.bytes());
        let landed = Arc::new(Landed { unit, compressed: data.compressed, decoded: data.decoded, at, fills, left: AtomicUsize::new(pieces.len()) });
        pieces
            .into_iter()
            .enumerate()
            .map(|(piece, rows)| {
                // Shares that add up to the row group's bytes.
                let share = bytes * (piece as u64 + 1) / n - bytes * piece as u64 / n;
                Morsel { landed: landed.clone(), piece, rows, bytes: share }
            })
            .collect()
    }

    /// The unit's chunk indexes whose arrays a morsel keeps for the memory
    /// tier, ascending (empty unless [`Fills::Assembled`]).
    pub(super) fn assembled_columns(&self) -> Vec<usize> {
        match &self.fills {
            Fills::Assembled(a) => a.lock().expect("not poisoned").columns.clone(),
            _ => Vec::new(),
        }
    }

    /// Morsel `piece` decoded all its rows; `arrays` are those it kept for
    /// the memory tier (per [`Landed::assembled_columns`] column). Returns
    /// whether it was the row group's last: its bytes may then be released,
    /// and the tier's chunks are filled.
    pub(super) fn finished(&self, piece: usize, arrays: Vec<ChunkPieces>) -> bool {
        if let Fills::Assembled(a) = &self.fills
            && let Some(slot) = a.lock().expect("not poisoned").pieces.get_mut(piece)
        {
            *slot = Some(arrays);
        }
        let last = self.left.fetch_sub(1, Ordering::AcqRel) == 1;
        if last && let Fills::Assembled(a) = &self.fills {
            a.lock().expect("not poisoned").fill(self.unit.rows);
        }
        last
    }
}

impl Assembly {
    /// Hands every morsel's pieces of each chunk to the tier, in row order.
    /// A chunk that cannot be put together (a morsel's pieces are missing)
    /// is left to [`DecodedFills`]'s drop, which gives its space back.
    fn fill(&mut self, rows: u64) {
        if self.pieces.iter().any(Option::is_none) {
            return;
        }
        let mut morsels: Vec<std::vec::IntoIter<ChunkPieces>> = self.pieces.iter_mut().flatten().map(|p| std::mem::take(p).into_iter()).collect();
        for &index in &self.columns {
            let parts: Vec<ChunkPieces> = morsels.iter_mut().flat_map(|m| m.next()).collect();
            if let Some(chunk) = DecodedChunk::join(parts) {
                self.fills.fill(index, Arc::new(chunk), rows);
            }
        }
    }
}
