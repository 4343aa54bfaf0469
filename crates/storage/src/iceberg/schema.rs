//! blobhouse's table schemas as Iceberg's, and the Avro schemas of
//! Iceberg's manifests and manifest lists (format version 2).
//!
//! Column ids: a table's columns never change after CREATE TABLE
//! (blobhouse has no ALTER TABLE), so column `i` (0-based) has the stable
//! Iceberg field id `i + 1`. New data objects carry those ids as Parquet
//! field ids ([`FIELD_ID_KEY`]); for every object, old ones included, the
//! table's `schema.name-mapping.default` maps names to them, which is how
//! Iceberg readers resolve files without ids.

use datafusion::arrow::datatypes::{DataType, Schema, TimeUnit};
use serde_json::{Value as Json, json};

/// The Arrow field metadata key Parquet's writer turns into field ids.
pub const FIELD_ID_KEY: &str = parquet::arrow::PARQUET_FIELD_ID_META_KEY;

/// The Iceberg type of an Arrow type in format version `format` (2 or
/// 3), or why there is none.
pub fn iceberg_type(t: &DataType, format: u32) -> Result<String, String> {
    Ok(match t {
        DataType::Boolean => "boolean".into(),
        DataType::Int8 | DataType::Int16 | DataType::Int32 => "int".into(),
        DataType::Int64 => "long".into(),
        DataType::Float32 => "float".into(),
        DataType::Float64 => "double".into(),
        DataType::Decimal128(p, s) if *s >= 0 => format!("decimal({p}, {s})"),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "string".into(),
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => "binary".into(),
        DataType::Date32 => "date".into(),
        DataType::Time64(TimeUnit::Microsecond) => "time".into(),
        DataType::Timestamp(TimeUnit::Microsecond, None) => "timestamp".into(),
        DataType::Timestamp(TimeUnit::Microsecond, Some(_)) => "timestamptz".into(),
        DataType::Timestamp(TimeUnit::Nanosecond, None) if format >= 3 => "timestamp_ns".into(),
        DataType::Timestamp(TimeUnit::Nanosecond, Some(_)) if format >= 3 => "timestamptz_ns".into(),
        DataType::Timestamp(TimeUnit::Nanosecond, _) => {
            return Err("Iceberg format 2 has no nanosecond timestamps (blobhouse's TIMESTAMP): ALTER DATABASE SET iceberg = v3 shares them, or declare the column TIMESTAMP(6)".into());
        }
        DataType::Dictionary(_, value) => return iceberg_type(value, format),
        other => return Err(format!("Iceberg has no type for {other}")),
    })
}

/// The Iceberg schema (id 0) of an Arrow schema: `Err` names the first
/// column without an Iceberg type and why.
pub fn table_schema(schema: &Schema, format: u32) -> Result<Json, String> {
    let mut fields = Vec::with_capacity(schema.fields().len());
    for (i, f) in schema.fields().iter().enumerate() {
        let t = iceberg_type(f.data_type(), format).map_err(|why| format!("column {} ({}): {why}", f.name(), f.data_type()))?;
        fields.push(json!({"id": i + 1, "name": f.name(), "required": !f.is_nullable(), "type": t}));
    }
    Ok(json!({"type": "struct", "schema-id": 0, "fields": fields}))
}

/// `schema.name-mapping.default`: each column's name → its field id, for
/// data objects without Parquet field ids.
pub fn name_mapping(schema: &Schema) -> String {
    let m: Vec<Json> = schema.fields().iter().enumerate().map(|(i, f)| json!({"field-id": i + 1, "names": [f.name()]})).collect();
    Json::Array(m).to_string()
}

/// The Avro schema of a manifest's entries (Iceberg format 2, without the
/// optional column statistics, which readers do not need).
pub const MANIFEST_ENTRY: &str = r#"{"type":"record","name":"manifest_entry","fields":[{"name":"status","type":"int","field-id":0},{"name":"snapshot_id","type":["null","long"],"default":null,"field-id":1},{"name":"sequence_number","type":["null","long"],"default":null,"field-id":3},{"name":"file_sequence_number","type":["null","long"],"default":null,"field-id":4},{"name":"data_file","type":{"type":"record","name":"r2","fields":[{"name":"content","type":"int","field-id":134},{"name":"file_path","type":"string","field-id":100},{"name":"file_format","type":"string","field-id":101},{"name":"partition","type":{"type":"record","name":"r102","fields":[]},"field-id":102},{"name":"record_count","type":"long","field-id":103},{"name":"file_size_in_bytes","type":"long","field-id":104},{"name":"key_metadata","type":["null","bytes"],"default":null,"field-id":131},{"name":"split_offsets","type":["null",{"type":"array","items":"long","element-id":133}],"default":null,"field-id":132},{"name":"equality_ids","type":["null",{"type":"array","items":"int","element-id":136}],"default":null,"field-id":135},{"name":"sort_order_id","type":["null","int"],"default":null,"field-id":140},{"name":"referenced_data_file","type":["null","string"],"default":null,"field-id":143}]},"field-id":2}]}"#;

/// The Avro schema of a manifest list's entries (Iceberg format 2).
pub const MANIFEST_FILE: &str = r#"{"type":"record","name":"manifest_file","fields":[{"name":"manifest_path","type":"string","field-id":500},{"name":"manifest_length","type":"long","field-id":501},{"name":"partition_spec_id","type":"int","field-id":502},{"name":"content","type":"int","field-id":517},{"name":"sequence_number","type":"long","field-id":515},{"name":"min_sequence_number","type":"long","field-id":516},{"name":"added_snapshot_id","type":"long","field-id":503},{"name":"added_files_count","type":"int","field-id":504},{"name":"existing_files_count","type":"int","field-id":505},{"name":"deleted_files_count","type":"int","field-id":506},{"name":"added_rows_count","type":"long","field-id":512},{"name":"existing_rows_count","type":"long","field-id":513},{"name":"deleted_rows_count","type":"long","field-id":514},{"name":"partitions","type":["null",{"type":"array","items":{"type":"record","name":"r508","fields":[{"name":"contains_null","type":"boolean","field-id":509},{"name":"contains_nan","type":["null","boolean"],"default":null,"field-id":518},{"name":"lower_bound","type":["null","bytes"],"default":null,"field-id":510},{"name":"upper_bound","type":["null","bytes"],"default":null,"field-id":511}]},"element-id":508}],"default":null,"field-id":507},{"name":"key_metadata","type":["null","bytes"],"default":null,"field-id":519}]}"#;

/// [`MANIFEST_ENTRY`] in format 3: row lineage (`first_row_id`) and the
/// place of a deletion vector inside its Puffin file.
pub const MANIFEST_ENTRY_V3: &str = r#"{"type":"record","name":"manifest_entry","fields":[{"name":"status","type":"int","field-id":0},{"name":"snapshot_id","type":["null","long"],"default":null,"field-id":1},{"name":"sequence_number","type":["null","long"],"default":null,"field-id":3},{"name":"file_sequence_number","type":["null","long"],"default":null,"field-id":4},{"name":"data_file","type":{"type":"record","name":"r2","fields":[{"name":"content","type":"int","field-id":134},{"name":"file_path","type":"string","field-id":100},{"name":"file_format","type":"string","field-id":101},{"name":"partition","type":{"type":"record","name":"r102","fields":[]},"field-id":102},{"name":"record_count","type":"long","field-id":103},{"name":"file_size_in_bytes","type":"long","field-id":104},{"name":"key_metadata","type":["null","bytes"],"default":null,"field-id":131},{"name":"split_offsets","type":["null",{"type":"array","items":"long","element-id":133}],"default":null,"field-id":132},{"name":"equality_ids","type":["null",{"type":"array","items":"int","element-id":136}],"default":null,"field-id":135},{"name":"sort_order_id","type":["null","int"],"default":null,"field-id":140},{"name":"referenced_data_file","type":["null","string"],"default":null,"field-id":143},{"name":"first_row_id","type":["null","long"],"default":null,"field-id":142},{"name":"content_offset","type":["null","long"],"default":null,"field-id":144},{"name":"content_size_in_bytes","type":["null","long"],"default":null,"field-id":145}]},"field-id":2}]}"#;

/// [`MANIFEST_FILE`] in format 3: each data manifest's first row id.
pub const MANIFEST_FILE_V3: &str = r#"{"type":"record","name":"manifest_file","fields":[{"name":"manifest_path","type":"string","field-id":500},{"name":"manifest_length","type":"long","field-id":501},{"name":"partition_spec_id","type":"int","field-id":502},{"name":"content","type":"int","field-id":517},{"name":"sequence_number","type":"long","field-id":515},{"name":"min_sequence_number","type":"long","field-id":516},{"name":"added_snapshot_id","type":"long","field-id":503},{"name":"added_files_count","type":"int","field-id":504},{"name":"existing_files_count","type":"int","field-id":505},{"name":"deleted_files_count","type":"int","field-id":506},{"name":"added_rows_count","type":"long","field-id":512},{"name":"existing_rows_count","type":"long","field-id":513},{"name":"deleted_rows_count","type":"long","field-id":514},{"name":"partitions","type":["null",{"type":"array","items":{"type":"record","name":"r508","fields":[{"name":"contains_null","type":"boolean","field-id":509},{"name":"contains_nan","type":["null","boolean"],"default":null,"field-id":518},{"name":"lower_bound","type":["null","bytes"],"default":null,"field-id":510},{"name":"upper_bound","type":["null","bytes"],"default":null,"field-id":511}]},"element-id":508}],"default":null,"field-id":507},{"name":"key_metadata","type":["null","bytes"],"default":null,"field-id":519},{"name":"first_row_id","type":["null","long"],"default":null,"field-id":520}]}"#;

/// The Avro schemas of a manifest's entries and of a manifest list's, in
/// format version `format`.
pub fn manifest_schemas(format: u32) -> (&'static str, &'static str) {
    if format >= 3 { (MANIFEST_ENTRY_V3, MANIFEST_FILE_V3) } else { (MANIFEST_ENTRY, MANIFEST_FILE) }
}

/// Field id of a position delete file's `file_path` column (Iceberg spec,
/// "Position Delete Files").
pub const DELETE_FILE_PATH_ID: i32 = 2147483546;
/// Field id of its `pos` column.
pub const DELETE_POS_ID: i32 = 2147483545;

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::Field;

    #[test]
    fn types_map_to_iceberg_and_nanosecond_timestamps_are_named() {
        let s = Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("p", DataType::Decimal128(15, 2), true),
            Field::new("d", DataType::Date32, true),
            Field::new("s", DataType::Utf8, true),
        ]);
        let j = table_schema(&s, 2).unwrap();
        assert_eq!(j["fields"][0], json!({"id": 1, "name": "k", "required": true, "type": "long"}));
        assert_eq!(j["fields"][1]["type"], "decimal(15, 2)");
        assert_eq!(name_mapping(&s), r#"[{"field-id":1,"names":["k"]},{"field-id":2,"names":["p"]},{"field-id":3,"names":["d"]},{"field-id":4,"names":["s"]}]"#);
        let ts = Schema::new(vec![Field::new("at", DataType::Timestamp(TimeUnit::Nanosecond, None), true)]);
        let e = table_schema(&ts, 2).unwrap_err();
        assert_eq!(table_schema(&ts, 3).unwrap()["fields"][0]["type"], "timestamp_ns");
        assert!(e.contains("column at") && e.contains("nanosecond"), "{e}");
        // The Avro schemas parse, with the fields in the order values follow.
        assert!(matches!(super::super::avro::parse_schema(MANIFEST_ENTRY).unwrap(), super::super::avro::Schema::Record(f) if f.len() == 5));
        assert!(matches!(super::super::avro::parse_schema(MANIFEST_FILE).unwrap(), super::super::avro::Schema::Record(f) if f.len() == 15));
        assert!(matches!(super::super::avro::parse_schema(MANIFEST_FILE_V3).unwrap(), super::super::avro::Schema::Record(f) if f.len() == 16));
        assert!(super::super::avro::parse_schema(MANIFEST_ENTRY_V3).is_ok());
    }
}
