//! Column types as SQL names (`INTEGER`, `VARCHAR`, `DECIMAL(12,2)`), for
//! what users read: DESCRIBE and the shell's `\d`.
//!
//! Arrow's names (`Int32`, `Utf8View`, `Decimal128(12, 2)`) are the
//! engine's internals; a user wrote `INT` and `VARCHAR` in CREATE TABLE and
//! expects to read them back, as DuckDB's and PostgreSQL's DESCRIBE show.
//! The mapping is the inverse of DataFusion's SQL-to-Arrow type planning, so
//! a name printed here, written in a CREATE TABLE, gives the same column
//! type back. DataFusion exposes that direction only inside its unparser's
//! AST, so this is the small table it needs.

use datafusion::arrow::datatypes::{DataType, TimeUnit};

/// The SQL name of an Arrow type, as CREATE TABLE would spell it.
pub fn sql_type_name(data_type: &DataType) -> String {
    use DataType::*;
    match data_type {
        Null => "NULL".into(),
        Boolean => "BOOLEAN".into(),
        Int8 => "TINYINT".into(),
        Int16 => "SMALLINT".into(),
        Int32 => "INTEGER".into(),
        Int64 => "BIGINT".into(),
        UInt8 => "TINYINT UNSIGNED".into(),
        UInt16 => "SMALLINT UNSIGNED".into(),
        UInt32 => "INTEGER UNSIGNED".into(),
        UInt64 => "BIGINT UNSIGNED".into(),
        Float16 => "HALF FLOAT".into(),
        Float32 => "REAL".into(),
        Float64 => "DOUBLE".into(),
        Utf8 | LargeUtf8 | Utf8View => "VARCHAR".into(),
        Binary | LargeBinary | BinaryView | FixedSizeBinary(_) => "BYTEA".into(),
        Decimal32(p, s) | Decimal64(p, s) | Decimal128(p, s) | Decimal256(p, s) => format!("DECIMAL({p},{s})"),
        Date32 | Date64 => "DATE".into(),
        Time32(unit) | Time64(unit) => with_precision("TIME", unit, ""),
        Timestamp(unit, None) => with_precision("TIMESTAMP", unit, ""),
        Timestamp(unit, Some(_)) => with_precision("TIMESTAMP", unit, " WITH TIME ZONE"),
        Interval(_) | Duration(_) => "INTERVAL".into(),
        List(f) | LargeList(f) | ListView(f) | LargeListView(f) | FixedSizeList(f, _) => format!("{}[]", sql_type_name(f.data_type())),
        Struct(fields) => {
            let inner: Vec<String> = fields.iter().map(|f| format!("{} {}", f.name(), sql_type_name(f.data_type()))).collect();
            format!("STRUCT({})", inner.join(", "))
        }
        Map(entries, _) => match entries.data_type() {
            Struct(kv) if kv.len() == 2 => format!("MAP({}, {})", sql_type_name(kv[0].data_type()), sql_type_name(kv[1].data_type())),
            other => format!("MAP({other})"),
        },
        Dictionary(_, value) => sql_type_name(value),
        RunEndEncoded(_, values) => sql_type_name(values.data_type()),
        Union(..) => data_type.to_string(),
    }
}

/// `TIMESTAMP` for DataFusion's default (nanoseconds), `TIMESTAMP(p)` with
/// the fractional digits otherwise.
fn with_precision(name: &str, unit: &TimeUnit, suffix: &str) -> String {
    match unit {
        TimeUnit::Nanosecond => format!("{name}{suffix}"),
        TimeUnit::Second => format!("{name}(0){suffix}"),
        TimeUnit::Millisecond => format!("{name}(3){suffix}"),
        TimeUnit::Microsecond => format!("{name}(6){suffix}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::SessionContext;

    /// Every name printed for a column type that CREATE TABLE accepts gives
    /// that same type back when written in a CREATE TABLE.
    #[tokio::test]
    async fn names_round_trip_through_create_table() {
        let ctx = SessionContext::new();
        let columns = "a TINYINT, b SMALLINT, c INT, d BIGINT, e REAL, f DOUBLE, g VARCHAR, h DECIMAL(12,2), \
                       i DATE, j TIMESTAMP, k BOOLEAN, l BYTEA, m INT UNSIGNED, n BIGINT UNSIGNED, o TIME";
        ctx.sql(&format!("CREATE TABLE t ({columns})")).await.unwrap();
        let first = ctx.table("t").await.unwrap().schema().as_arrow().clone();
        let names: Vec<String> = first.fields().iter().map(|f| format!("{} {}", f.name(), sql_type_name(f.data_type()))).collect();
        ctx.sql(&format!("CREATE TABLE u ({})", names.join(", "))).await.unwrap();
        let second = ctx.table("u").await.unwrap().schema().as_arrow().clone();
        for (a, b) in first.fields().iter().zip(second.fields()) {
            assert_eq!(a.data_type(), b.data_type(), "{} printed as {}", a.name(), sql_type_name(a.data_type()));
        }
        assert_eq!(sql_type_name(first.field(2).data_type()), "INTEGER");
        assert_eq!(sql_type_name(first.field(6).data_type()), "VARCHAR");
        assert_eq!(sql_type_name(first.field(7).data_type()), "DECIMAL(12,2)");
    }

    #[test]
    fn nested_types_read_as_sql() {
        let list = DataType::List(std::sync::Arc::new(datafusion::arrow::datatypes::Field::new("item", DataType::Int64, true)));
        assert_eq!(sql_type_name(&list), "BIGINT[]");
        assert_eq!(sql_type_name(&DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))), "TIMESTAMP(6) WITH TIME ZONE");
        assert_eq!(sql_type_name(&DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8))), "VARCHAR");
    }
}
