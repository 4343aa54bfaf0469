//! A statement's result as PostgreSQL messages: the row description, the
//! rows in text or binary, and the command tag.
//!
//! The types a client is told (RowDescription, at Describe time for the
//! extended protocol) and the bytes it then gets must agree: a client
//! reading a binary int4 where eight bytes were sent reads garbage, and
//! does so silently. So every result goes through one schema — the one the
//! statement was described with when there was a Describe — and each batch
//! is cast to it before encoding; a value that does not fit is an error,
//! never a wrong number. Arrow types that arrow-pg would announce as one
//! PostgreSQL type and encode as another are mapped to their wire type
//! here first ([`wire_schema`]).

use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use futures::{StreamExt, stream};
use pgwire::api::Type;
use pgwire::api::portal::Format;
use pgwire::api::results::{FieldInfo, QueryResponse, Response, Tag};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::types::format::FormatOptions;

use blobhouse_engine::{EngineError, QueryResult};

use crate::exec::{Failure, Rows, conform};
use blobhouse_engine::result::CommandKind;
use crate::pg::user_error;

/// `schema` with each column in the Arrow type that arrow-pg encodes as
/// the PostgreSQL type it announces: Int8 as int2 (arrow-pg writes one
/// byte for an Int8 under an int2 description), Float16 as float4,
/// fixed-size binary as bytea, views as their plain types.
pub(crate) fn wire_schema(schema: &SchemaRef) -> SchemaRef {
    let wire = |t: &DataType| -> Option<DataType> {
        Some(match t {
            DataType::Int8 => DataType::Int16,
            DataType::Float16 => DataType::Float32,
            DataType::FixedSizeBinary(_) | DataType::BinaryView => DataType::Binary,
            DataType::Utf8View => DataType::Utf8,
            _ => return None,
        })
    };
    if !schema.fields().iter().any(|f| wire(f.data_type()).is_some()) {
        return schema.clone();
    }
    let fields: Vec<Field> = schema.fields().iter().map(|f| match wire(f.data_type()) {
        Some(t) => f.as_ref().clone().with_data_type(t),
        None => f.as_ref().clone(),
    }).collect();
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// The row description of `schema` in `format`, with NUMERIC's precision
/// and scale in the type modifier (what JDBC's `getPrecision`/`getScale`
/// and psycopg's `description` read).
pub(crate) fn fields(schema: &SchemaRef, format: &Format, options: Option<Arc<FormatOptions>>) -> PgWireResult<Vec<FieldInfo>> {
    if let Format::Individual(codes) = format
        && codes.len() != schema.fields().len()
    {
        return Err(user_error("08P01", format!("{} result format codes for {} columns (send none, one, or one per column)", codes.len(), schema.fields().len())));
    }
    let fields = arrow_pg::datatypes::arrow_schema_to_pg_fields(schema, format, options)?;
    Ok(fields
        .into_iter()
        .zip(schema.fields())
        .map(|(info, field)| match field.data_type() {
            DataType::Decimal128(p, s) | DataType::Decimal256(p, s) if *s >= 0 && info.datatype() == &Type::NUMERIC => {
                info.with_type_modifier(((i32::from(*p) << 16) | i32::from(*s as u8)) + 4).with_type_size(-1)
            }
            _ => info,
        })
        .collect())
}

/// The response to one statement's result: rows (under `described`, the
/// schema the client was told, when there was a Describe), or a command tag.
pub(crate) fn respond(sql: &str, result: QueryResult, described: Option<&SchemaRef>, format: &Format, options: Arc<FormatOptions>) -> PgWireResult<Response> {
    Ok(match CommandKind::of(sql) {
        CommandKind::Rows => {
            let schema = described.cloned().unwrap_or_else(|| result.schema.clone());
            rows(schema, result.batches, format, options)?
        }
        CommandKind::Begin => Response::TransactionStart(Tag::new("BEGIN")),
        // COMMIT of an aborted transaction rolled it back: PostgreSQL's tag says so.
        CommandKind::End(_) if result.rolled_back => Response::TransactionEnd(Tag::new("ROLLBACK")),
        CommandKind::End(word) => Response::TransactionEnd(Tag::new(word)),
        CommandKind::Counted(word) if word == "INSERT" => Response::Execution(Tag::new("INSERT").with_oid(0).with_rows(result.changed_rows())),
        CommandKind::Counted(word) => Response::Execution(Tag::new(&word).with_rows(result.changed_rows())),
        CommandKind::Plain(word) => Response::Execution(Tag::new(&word)),
    })
}

/// `batch` in `wire`'s types for encoding. A decimal stays the decimal it
/// is: NUMERIC's text and binary forms carry each value's own scale, so a
/// value of another scale than described is sent exactly as computed
/// (`12.50` stays `12.50`, not `12.5000000000`).
fn to_wire(batch: RecordBatch, wire: &SchemaRef, format: &Format) -> PgWireResult<RecordBatch> {
    let batch = decimals_to_wire(batch, wire)?;
    // arrow-pg encodes binary NUMERIC through rust_decimal, whose mantissa
    // is 96 bits: a wider value is refused here, by name, rather than fail
    // inside the encoder.
    for (i, (f, c)) in batch.schema().fields().iter().zip(batch.columns()).enumerate() {
        if matches!(f.data_type(), DataType::Decimal128(p, _) if *p > RUST_DECIMAL_DIGITS) && format.format_for(i) == pgwire::api::results::FieldFormat::Binary {
            use datafusion::arrow::array::AsArray;
            let values = c.as_primitive::<datafusion::arrow::datatypes::Decimal128Type>();
            if values.iter().flatten().any(|v| v.unsigned_abs() > RUST_DECIMAL_MAX) {
                return Err(user_error("0A000", format!("column {} ({}): a NUMERIC value of more than {RUST_DECIMAL_DIGITS} digits cannot be sent in binary format yet; ask for this column in text format", i + 1, f.name())));
            }
        }
    }
    // A NUMERIC wider than rust_decimal's 28 digits (arrow-pg's encoder
    // cannot take it) goes as its text in text format: the same bytes
    // PostgreSQL sends.
    if !batch.schema().fields().iter().enumerate().any(|(i, f)| matches!(f.data_type(), DataType::Decimal128(p, _) if *p > RUST_DECIMAL_DIGITS) && format.format_for(i) == pgwire::api::results::FieldFormat::Text) {
        return Ok(batch);
    }
    let mut fields = Vec::with_capacity(batch.num_columns());
    let mut columns = Vec::with_capacity(batch.num_columns());
    for (i, (f, c)) in batch.schema().fields().iter().zip(batch.columns()).enumerate() {
        if matches!(f.data_type(), DataType::Decimal128(p, _) if *p > RUST_DECIMAL_DIGITS) && format.format_for(i) == pgwire::api::results::FieldFormat::Text {
            columns.push(datafusion::arrow::compute::cast(c, &DataType::Utf8).map_err(|e| user_error("22003", e.to_string()))?);
            fields.push(f.as_ref().clone().with_data_type(DataType::Utf8));
        } else {
            columns.push(c.clone());
            fields.push(f.as_ref().clone());
        }
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(|e| user_error("22003", e.to_string()))
}

/// Digits rust_decimal (arrow-pg's NUMERIC encoder) always holds.
const RUST_DECIMAL_DIGITS: u8 = 28;

/// rust_decimal's largest mantissa (2^96 - 1).
const RUST_DECIMAL_MAX: u128 = (1 << 96) - 1;

fn decimals_to_wire(batch: RecordBatch, wire: &SchemaRef) -> PgWireResult<RecordBatch> {
    let decimals_differ = batch.schema().fields().iter().zip(wire.fields()).any(|(a, w)| matches!((a.data_type(), w.data_type()), (DataType::Decimal128(..), DataType::Decimal128(..))) && a.data_type() != w.data_type());
    let target = if decimals_differ {
        let fields: Vec<Field> = wire.fields().iter().zip(batch.schema().fields()).map(|(w, a)| match (a.data_type(), w.data_type()) {
            (DataType::Decimal128(..), DataType::Decimal128(..)) => w.as_ref().clone().with_data_type(a.data_type().clone()),
            _ => w.as_ref().clone(),
        }).collect();
        Arc::new(Schema::new_with_metadata(fields, wire.metadata().clone()))
    } else {
        wire.clone()
    };
    conform(batch, &target).map_err(|e| user_error("22003", format!("the result does not fit the types announced for it: {e}")))
}

/// Rows under `schema`: each batch cast to its wire form, then encoded.
pub(crate) fn rows(schema: SchemaRef, batches: Vec<RecordBatch>, format: &Format, options: Arc<FormatOptions>) -> PgWireResult<Response> {
    let wire = wire_schema(&schema);
    let fields = Arc::new(fields(&wire, format, Some(options))?);
    let mut conformed = Vec::with_capacity(batches.len());
    for batch in batches {
        conformed.push(to_wire(batch, &wire, format)?);
    }
    let encoded = fields.clone();
    let rows = conformed.into_iter().flat_map(move |b| arrow_pg::datatypes::encode_recordbatch(encoded.clone(), b));
    Ok(Response::Query(QueryResponse::new(fields, stream::iter(rows))))
}

/// A running query's rows as DataRows under `described` (else their own
/// schema), encoded a batch at a time as the client reads them.
pub(crate) fn streamed(rows: Rows, described: Option<&SchemaRef>, format: &Format, options: Arc<FormatOptions>) -> PgWireResult<QueryResponse> {
    let schema = described.cloned().unwrap_or_else(|| rows.schema.clone());
    let wire = wire_schema(&schema);
    let fields = Arc::new(fields(&wire, format, Some(options))?);
    let encoded = fields.clone();
    let format = format.clone();
    let data = rows
        .map(move |batch| {
            let batch = batch.map_err(|f| PgWireError::UserError(Box::new(failure_info(&f)))).and_then(|b| to_wire(b, &wire, &format));
            match batch {
                // One batch's rows at a time: bounded by the batch size.
                Ok(b) => arrow_pg::datatypes::encode_recordbatch(encoded.clone(), b).collect::<Vec<_>>(),
                Err(e) => vec![Err(e)],
            }
        })
        .flat_map(stream::iter);
    Ok(QueryResponse::new(fields, data))
}

/// An engine error as PostgreSQL reports it, with its SQLSTATE.
pub(crate) fn error_info(e: &EngineError) -> ErrorInfo {
    ErrorInfo::new("ERROR".into(), e.sqlstate().into(), e.to_string())
}

/// A statement's failure as PostgreSQL reports it.
pub(crate) fn failure_info(f: &Failure) -> ErrorInfo {
    match f {
        Failure::Engine(e) => error_info(e),
        Failure::ShuttingDown => ErrorInfo::new("FATAL".into(), "57P01".into(), f.to_string()),
        Failure::Crashed(_) => ErrorInfo::new("ERROR".into(), "XX000".into(), f.to_string()),
        Failure::TimedOut(_) | Failure::Cancelled => ErrorInfo::new("ERROR".into(), "57014".into(), f.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numeric_columns_carry_precision_and_scale_and_int8_goes_as_int2() {
        let schema: SchemaRef = Arc::new(Schema::new(vec![Field::new("d", DataType::Decimal128(12, 2), true), Field::new("b", DataType::Int8, true)]));
        let wire = wire_schema(&schema);
        assert_eq!(wire.field(1).data_type(), &DataType::Int16);
        let f = fields(&wire, &Format::UnifiedBinary, None).expect("fields");
        assert_eq!(f[0].type_modifier(), (12 << 16 | 2) + 4);
        assert_eq!(f[1].datatype(), &Type::INT2);
        assert_eq!(f[1].type_modifier(), -1);
        assert!(fields(&wire, &Format::Individual(vec![1]), None).is_err(), "one code per column, or one for all");
    }

    #[test]
    fn a_batch_wider_than_its_description_is_cast_or_refused() {
        use datafusion::arrow::array::Int64Array;
        let described: SchemaRef = Arc::new(Schema::new(vec![Field::new("v", DataType::Int32, true)]));
        let actual = RecordBatch::try_from_iter([("v", Arc::new(Int64Array::from(vec![47])) as _)]).expect("batch");
        assert!(rows(described.clone(), vec![actual], &Format::UnifiedBinary, Arc::new(FormatOptions::default())).is_ok());
        let too_big = RecordBatch::try_from_iter([("v", Arc::new(Int64Array::from(vec![i64::MAX])) as _)]).expect("batch");
        assert!(rows(described, vec![too_big], &Format::UnifiedBinary, Arc::new(FormatOptions::default())).is_err());
    }
}
