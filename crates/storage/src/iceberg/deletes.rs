//! Iceberg position delete files from blobhouse's deletion vectors.
//!
//! A blobhouse deletion vector is a Roaring bitmap of row positions in one
//! data object; an Iceberg format-2 reader wants the same positions as a
//! Parquet file of `(file_path, pos)` rows, sorted, with the spec's
//! reserved field ids, `file_path` first (DuckDB reads the two columns by
//! position).

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use roaring::RoaringBitmap;

use super::schema::{DELETE_FILE_PATH_ID, DELETE_POS_ID, FIELD_ID_KEY};

/// The Parquet bytes of a position delete file deleting `positions` of the
/// data file at `data_file` (its URI exactly as the manifest names it).
pub fn position_delete_file(data_file: &str, positions: &RoaringBitmap) -> parquet::errors::Result<Vec<u8>> {
    let id = |n: i32| HashMap::from([(FIELD_ID_KEY.to_string(), n.to_string())]);
    let schema = Arc::new(Schema::new(vec![
        Field::new("file_path", DataType::Utf8, false).with_metadata(id(DELETE_FILE_PATH_ID)),
        Field::new("pos", DataType::Int64, false).with_metadata(id(DELETE_POS_ID)),
    ]));
    let props = WriterProperties::builder().set_compression(Compression::ZSTD(ZstdLevel::default())).build();
    let mut out = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut out, schema.clone(), Some(props))?;
    // Batches of at most 64 Ki rows: a vector of millions of rows is
    // written without holding them all as Arrow arrays.
    let mut positions = positions.iter().peekable();
    while positions.peek().is_some() {
        let pos: Int64Array = positions.by_ref().take(65_536).map(i64::from).collect();
        let paths = StringArray::from(vec![data_file; pos.len()]);
        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(paths), Arc::new(pos)])?;
        writer.write(&batch)?;
    }
    writer.close()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    #[test]
    fn a_vector_becomes_sorted_rows_with_the_reserved_field_ids() {
        let positions: RoaringBitmap = [7u32, 1, 70_000, 3].into_iter().collect();
        let bytes = position_delete_file("file:///db/objects/0001/00000000001.parquet", &positions).unwrap();
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes::Bytes::from(bytes)).unwrap();
        let fields = reader.parquet_schema().root_schema().get_fields().to_vec();
        assert_eq!(fields[0].name(), "file_path");
        assert_eq!(fields[0].get_basic_info().id(), DELETE_FILE_PATH_ID);
        assert_eq!(fields[1].get_basic_info().id(), DELETE_POS_ID);
        let batches: Vec<RecordBatch> = reader.build().unwrap().collect::<Result<_, _>>().unwrap();
        let pos: Vec<i64> = batches.iter().flat_map(|b| b.column(1).as_any().downcast_ref::<Int64Array>().unwrap().values().to_vec()).collect();
        assert_eq!(pos, [1, 3, 7, 70_000]);
    }
}
