use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Decimal128Array, Int32Array, StringArray};
use datafusion::arrow::datatypes::{DataType, Decimal128Type, Int32Type};

use super::{ChunkPieces, DecodedChunk, held_width};

fn ints(range: std::ops::Range<i32>) -> ArrayRef {
    Arc::new(Int32Array::from(range.collect::<Vec<i32>>()))
}

/// A chunk of `0..n` in pieces of the given sizes, pushed by two scans'
/// morsels (the first half of the pieces by one, the rest by the other).
fn chunk_of(sizes: &[i32]) -> DecodedChunk {
    let (mut a, mut b) = (ChunkPieces::default(), ChunkPieces::default());
    let mut at = 0;
    for (i, &n) in sizes.iter().enumerate() {
        let piece = ints(at..at + n);
        if i < sizes.len() / 2 { a.push(&piece) } else { b.push(&piece) }
        at += n;
    }
    DecodedChunk::join([a, b]).unwrap()
}

fn values(array: &ArrayRef) -> Vec<i32> {
    array.as_primitive::<Int32Type>().values().to_vec()
}

#[test]
fn rows_are_copied_across_pieces_in_order() {
    let chunk = chunk_of(&[10, 5, 20, 1, 14]);
    assert_eq!(chunk.len(), 50);
    let got = chunk.rows(&[3..12, 14..16, 34..50]).unwrap();
    let want: Vec<i32> = (3..12).chain(14..16).chain(34..50).collect();
    assert_eq!(values(&got), want);
    assert_eq!(values(&chunk.rows(&[0..50]).unwrap()), (0..50).collect::<Vec<_>>());
    assert!(chunk.rows(&[]).unwrap().is_empty());
    assert!(chunk.rows(&[40..51]).is_err(), "rows past the chunk are an error, not a panic");
}

#[test]
fn a_whole_piece_is_itself_and_a_part_of_one_is_lent() {
    let chunk = chunk_of(&[1000, 500, 2000]);
    let whole = chunk.rows(&[1000..1500]).unwrap();
    assert!(Arc::ptr_eq(&whole, &chunk.pieces[1]), "exactly one piece: the piece itself");
    let part = chunk.rows(&[1100..1103]).unwrap();
    assert_eq!(values(&part), vec![1100, 1101, 1102]);
    assert!(part.get_array_memory_size() < chunk.pieces[1].get_array_memory_size() / 4, "a copy holds only its rows");

    let lent = chunk.lend(&(1600..1604)).unwrap();
    assert_eq!(values(&lent), vec![1600, 1601, 1602, 1603]);
    assert!(chunk.lend(&(1500..3500)).is_none(), "a whole piece is not lent");
    assert!(chunk.lend(&(998..1002)).is_none(), "across two pieces: copied, not lent");
    assert!(chunk.lend(&(3400..3501)).is_none(), "past the chunk");
}

fn decimals(values: &[Option<i128>], precision: u8) -> ArrayRef {
    Arc::new(Decimal128Array::from(values.to_vec()).with_precision_and_scale(precision, 2).unwrap())
}

#[test]
fn decimals_of_up_to_18_digits_are_held_in_64_bits_and_read_back_exactly() {
    let big = 999_999_999_999_999_999i128; // 18 nines
    let first = decimals(&[Some(1), None, Some(-big), Some(big)], 18);
    let second = decimals(&[Some(-5), Some(7), None], 18);
    let mut p = ChunkPieces::default();
    p.push(&first);
    p.push(&second);
    let chunk = DecodedChunk::join([p]).unwrap();
    assert!(chunk.pieces.iter().all(|piece| piece.data_type() == &DataType::Int64), "narrowed");
    let many = decimals(&(0..10_000).map(|v| Some(v * 1_000_000_007)).collect::<Vec<_>>(), 18);
    let mut m = ChunkPieces::default();
    m.push(&many);
    let held = DecodedChunk::join([m]).unwrap();
    assert!((held.memory_size() as usize) < many.get_array_memory_size() * 6 / 10, "{} bytes held against {} wide", held.memory_size(), many.get_array_memory_size());
    assert_eq!(&held.rows(&[0..10_000]).unwrap(), &many, "read back exactly");

    let got = chunk.rows(&[0..7]).unwrap();
    assert_eq!(got.data_type(), &DataType::Decimal128(18, 2), "read back as scans read it");
    let got = got.as_primitive::<Decimal128Type>();
    assert_eq!(got.iter().collect::<Vec<_>>(), vec![Some(1), None, Some(-big), Some(big), Some(-5), Some(7), None]);
    assert!(chunk.lend(&(1..3)).is_none(), "a narrowed piece is never lent: it must be widened");
    let one = chunk.rows(&[4..7]).unwrap();
    assert_eq!(one.as_primitive::<Decimal128Type>().iter().collect::<Vec<_>>(), vec![Some(-5), Some(7), None]);
}

#[test]
fn a_decimal_piece_outside_64_bits_keeps_its_width_beside_narrowed_ones() {
    // Precision says 18 digits, the bytes say otherwise: kept as it came.
    let wide = decimals(&[Some(i128::from(i64::MAX) + 1), Some(3)], 18);
    let narrow = decimals(&[Some(4), None], 18);
    // A value that does not fit, under a null, does not stop narrowing.
    let hidden: ArrayRef = {
        let d = Decimal128Array::new(vec![i128::MAX, 6].into(), Some(vec![false, true].into())).with_precision_and_scale(18, 2).unwrap();
        Arc::new(d)
    };
    let mut p = ChunkPieces::default();
    p.push(&wide);
    p.push(&narrow);
    p.push(&hidden);
    let chunk = DecodedChunk::join([p]).unwrap();
    let types: Vec<&DataType> = chunk.pieces.iter().map(|piece| piece.data_type()).collect();
    assert_eq!(types, vec![&DataType::Decimal128(18, 2), &DataType::Int64, &DataType::Int64]);
    let got = chunk.rows(&[0..6]).unwrap();
    assert_eq!(got.as_primitive::<Decimal128Type>().iter().collect::<Vec<_>>(), vec![Some(i128::from(i64::MAX) + 1), Some(3), Some(4), None, None, Some(6)]);
    let tail = chunk.rows(&[3..6]).unwrap();
    assert_eq!(tail.as_primitive::<Decimal128Type>().iter().collect::<Vec<_>>(), vec![None, None, Some(6)]);
}

#[test]
fn wider_decimals_and_other_types_are_held_as_read() {
    let mut p = ChunkPieces::default();
    p.push(&decimals(&[Some(1)], 19));
    assert_eq!(DecodedChunk::join([p]).unwrap().pieces[0].data_type(), &DataType::Decimal128(19, 2));
    assert_eq!(held_width(&DataType::Decimal128(18, 2)), Some(8));
    assert_eq!(held_width(&DataType::Decimal128(19, 2)), Some(16));
    assert_eq!(held_width(&DataType::Int32), Some(4));
    assert_eq!(held_width(&DataType::Utf8), None);
}

#[test]
fn a_slice_of_a_larger_array_is_held_as_its_own_rows() {
    let big: ArrayRef = Arc::new(StringArray::from((0..100_000).map(|i| format!("value {i}")).collect::<Vec<_>>()));
    let mut p = ChunkPieces::default();
    p.push(&big.slice(10, 3));
    let chunk = DecodedChunk::join([p]).unwrap();
    assert!(chunk.memory_size() < 10_000, "{} bytes for 3 rows", chunk.memory_size());
    let got = chunk.rows(&[0..3]).unwrap();
    assert_eq!(got.as_string::<i32>().iter().collect::<Vec<_>>(), vec![Some("value 10"), Some("value 11"), Some("value 12")]);
}

#[test]
fn parts_of_different_types_or_no_rows_make_no_chunk() {
    let mut a = ChunkPieces::default();
    a.push(&ints(0..3));
    let mut b = ChunkPieces::default();
    b.push(&decimals(&[Some(1)], 10));
    assert!(DecodedChunk::join([a.clone(), b.clone()]).is_none());
    let mut mixed = a.clone();
    mixed.push(&decimals(&[Some(1)], 10));
    assert!(DecodedChunk::join([mixed]).is_none(), "a piece of another type within one part");
    assert!(DecodedChunk::join([ChunkPieces::default()]).is_none());
    assert_eq!(DecodedChunk::join([a, ChunkPieces::default()]).unwrap().len(), 3);
}
