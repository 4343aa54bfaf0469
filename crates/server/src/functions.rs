//! PostgreSQL functions that drivers call on connecting or introspecting
//! and that neither DataFusion nor datafusion-pg-catalog has: what
//! `version()` says, `current_setting`, `to_regtype`, `pg_get_serial_sequence`, `pg_get_indexdef`,
//! `pg_collation_is_visible`, `json_build_object`, and the translations
//! behind `LIKE … ESCAPE` and `unnest(indkey)` (see `catalog`). Each answers for
//! what blobhouse is — no sequences, one collation — never a fake value a
//! client would act on.

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, Int32Array, StringArray};
use datafusion::arrow::datatypes::DataType;
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarFunctionImplementation, ScalarUDF, ScalarUDFImpl, Signature, Volatility, create_udf};
use datafusion::prelude::SessionContext;
use datafusion::scalar::ScalarValue;

/// Registers every function here on `ctx`.
pub(crate) fn register(ctx: &SessionContext) {
    for udf in [version(), current_setting(), to_regtype(), like_pattern(), int_vector(), serial_sequence(), index_definition(), collation_is_visible(), ScalarUDF::new_from_impl(JsonBuildObject::new())] {
        ctx.register_udf(udf);
    }
}

/// `out`, computed row by row from `args`, as a scalar when every argument
/// was one (a constant folds to a constant) and as an array otherwise.
fn shaped_like(args: &[ColumnarValue], out: datafusion::arrow::array::ArrayRef) -> datafusion::error::Result<ColumnarValue> {
    match args.iter().all(|a| matches!(a, ColumnarValue::Scalar(_))) {
        true => Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(&out, 0)?)),
        false => Ok(ColumnarValue::Array(out)),
    }
}

/// `pg_like_pattern(pattern, escape)`: `pattern` written with `escape` as
/// its escape character, rewritten for the backslash (an empty `escape`:
/// none at all, so every backslash is literal).
fn like_pattern() -> ScalarUDF {
    let answer: ScalarFunctionImplementation = Arc::new(|args| {
        let arrays = ColumnarValue::values_to_arrays(args)?;
        let [patterns, escapes] = [&arrays[0], &arrays[1]].map(|a| datafusion::arrow::compute::cast(a, &DataType::Utf8));
        let (patterns, escapes) = (patterns?, escapes?);
        let (patterns, escapes) = (patterns.as_string::<i32>(), escapes.as_string::<i32>());
        let out: StringArray = patterns.iter().zip(escapes.iter()).map(|(p, e)| Some(backslash_escaped(p?, e?))).collect();
        shaped_like(args, Arc::new(out))
    });
    create_udf("pg_like_pattern", vec![DataType::Utf8, DataType::Utf8], DataType::Utf8, Volatility::Immutable, answer)
}

/// `pg_int_vector(text)`: a number list of the catalog as an array of
/// BIGINT. PostgreSQL's `pg_index.indkey` (an `int2vector`, "1 2"),
/// `indclass` (an `oidvector`) and `pg_constraint.conkey` (an `int2[]`) are
/// text in datafusion-pg-catalog's tables ("1 2", "[1, 2]"); clients
/// `unnest` them. BIGINT holds both column numbers and oids.
fn int_vector() -> ScalarUDF {
    use datafusion::arrow::array::{Int64Builder, ListBuilder};
    let answer: ScalarFunctionImplementation = Arc::new(|args| {
        let arrays = ColumnarValue::values_to_arrays(args)?;
        let text = datafusion::arrow::compute::cast(&arrays[0], &DataType::Utf8)?;
        let mut out = ListBuilder::new(Int64Builder::new());
        for value in text.as_string::<i32>().iter() {
            match value {
                None => out.append_null(),
                Some(v) => {
                    for part in v.split(|c: char| c == ',' || c.is_whitespace() || "[]{}".contains(c)).filter(|p| !p.is_empty()) {
                        let n: i64 = part.parse().map_err(|_| datafusion::error::DataFusionError::Execution(format!("pg_int_vector: '{v}' is not a list of numbers")))?;
                        out.values().append_value(n);
                    }
                    out.append(true);
                }
            }
        }
        shaped_like(args, Arc::new(out.finish()))
    });
    let item = Arc::new(datafusion::arrow::datatypes::Field::new("item", DataType::Int64, true));
    create_udf("pg_int_vector", vec![DataType::Utf8], DataType::List(item), Volatility::Immutable, answer)
}

/// A LIKE pattern escaped with `escape` (one character, or none) as one
/// escaped with the backslash.
fn backslash_escaped(pattern: &str, escape: &str) -> String {
    let escape = escape.chars().next();
    let mut out = String::with_capacity(pattern.len() + 2);
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if Some(c) == escape {
            // The escaped character, literal (an escape at the end: itself).
            match chars.next().unwrap_or(c) {
                special @ ('%' | '_' | '\\') => {
                    out.push('\\');
                    out.push(special);
                }
                literal => out.push(literal),
            }
        } else if c == '\\' {
            out.push_str("\\\\");
        } else {
            out.push(c);
        }
    }
    out
}

/// `to_regtype(name)`: the oid of the PostgreSQL type called `name`, or
/// NULL when there is none — how psycopg looks a type up (SQLAlchemy asks
/// for `hstore` on connecting; blobhouse has none, so NULL). The types are
/// PostgreSQL's built-in ones, as pgwire knows them.
fn to_regtype() -> ScalarUDF {
    let by_name: std::collections::HashMap<String, i32> =
        (0..10_000u32).filter_map(|oid| pgwire::api::Type::from_oid(oid).map(|t| (t.name().to_string(), oid as i32))).collect();
    let lookup = move |name: Option<&str>| name.and_then(|n| by_name.get(n.trim().trim_matches('"').to_ascii_lowercase().as_str()).copied());
    let answer: ScalarFunctionImplementation = Arc::new(move |args| {
        let text = match &args[0] {
            ColumnarValue::Scalar(s) => return Ok(ColumnarValue::Scalar(ScalarValue::Int32(lookup(s.cast_to(&DataType::Utf8)?.try_as_str().flatten())))),
            ColumnarValue::Array(a) => datafusion::arrow::compute::cast(a, &DataType::Utf8)?,
        };
        let names = text.as_string::<i32>();
        let oids: Int32Array = (0..names.len()).map(|i| lookup((!names.is_null(i)).then(|| names.value(i)))).collect();
        Ok(ColumnarValue::Array(Arc::new(oids)))
    });
    create_udf("to_regtype", vec![DataType::Utf8], DataType::Int32, Volatility::Stable, answer)
}

/// What a PostgreSQL server answers to `version()`, the PostgreSQL release
/// first: clients parse it (SQLAlchemy refuses a server whose version it
/// cannot read), and DataFusion's own answer names no PostgreSQL release.
fn version() -> ScalarUDF {
    let text = format!("PostgreSQL 16.0 (blobhouse {}) on {}-{}", env!("CARGO_PKG_VERSION"), std::env::consts::ARCH, std::env::consts::OS);
    let answer: ScalarFunctionImplementation = Arc::new(move |_| Ok(ColumnarValue::Scalar(ScalarValue::Utf8(Some(text.clone())))));
    create_udf("version", Vec::new(), datafusion::arrow::datatypes::DataType::Utf8, Volatility::Stable, answer)
}


/// `pg_get_serial_sequence(table, column)`: the sequence behind a serial
/// column — blobhouse has no sequences, so always NULL.
fn serial_sequence() -> ScalarUDF {
    let none: ScalarFunctionImplementation = Arc::new(|_| Ok(ColumnarValue::Scalar(ScalarValue::Utf8(None))));
    create_udf("pg_get_serial_sequence", vec![DataType::Utf8, DataType::Utf8], DataType::Utf8, Volatility::Immutable, none)
}

/// `current_setting(name)`: a run-time parameter's default value (the
/// server replaces calls with a literal name by the connection's own
/// value before planning: the engine inlines `current_setting`); an unknown
/// name is an error, as in PostgreSQL.
fn current_setting() -> ScalarUDF {
    let answer: ScalarFunctionImplementation = Arc::new(move |args| {
        let arrays = ColumnarValue::values_to_arrays(args)?;
        let names = datafusion::arrow::compute::cast(&arrays[0], &DataType::Utf8)?;
        let values = names
            .as_string::<i32>()
            .iter()
            .map(|name| {
                let Some(name) = name else { return Ok(None) };
                let setting = blobhouse_engine::settings::lookup(name).filter(|s| s.scope == blobhouse_engine::settings::Scope::Session);
                setting.map(|s| Some(s.default.to_string())).ok_or_else(|| datafusion::error::DataFusionError::Execution(format!("unrecognized configuration parameter \"{name}\"")))
            })
            .collect::<datafusion::error::Result<StringArray>>()?;
        shaped_like(args, Arc::new(values))
    });
    create_udf("current_setting", vec![DataType::Utf8], DataType::Utf8, Volatility::Stable, answer)
}

/// `pg_get_indexdef(index, column, pretty)`: an index's definition —
/// blobhouse tables have no indexes, and the catalog's own PostgreSQL
/// indexes have no definition here, so always NULL.
fn index_definition() -> ScalarUDF {
    let none: ScalarFunctionImplementation = Arc::new(|_| Ok(ColumnarValue::Scalar(ScalarValue::Utf8(None))));
    create_udf("pg_get_indexdef", vec![DataType::Int64, DataType::Int64, DataType::Boolean], DataType::Utf8, Volatility::Immutable, none)
}

/// `pg_collation_is_visible(oid)`: every collation is visible (blobhouse
/// has one, the default, in the one schema).
fn collation_is_visible() -> ScalarUDF {
    let yes: ScalarFunctionImplementation = Arc::new(|_| Ok(ColumnarValue::Scalar(ScalarValue::Boolean(Some(true)))));
    create_udf("pg_collation_is_visible", vec![DataType::Int64], DataType::Boolean, Volatility::Immutable, yes)
}

/// `json_build_object(key, value, …)`: a JSON object as text, keys as
/// strings, values as JSON numbers, booleans, strings or null.
#[derive(Debug, PartialEq, Eq, Hash)]
struct JsonBuildObject {
    signature: Signature,
}

impl JsonBuildObject {
    fn new() -> JsonBuildObject {
        JsonBuildObject { signature: Signature::variadic_any(Volatility::Immutable) }
    }
}

impl ScalarUDFImpl for JsonBuildObject {
    fn name(&self) -> &str {
        "json_build_object"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> datafusion::error::Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> datafusion::error::Result<ColumnarValue> {
        if args.args.len() % 2 != 0 {
            return datafusion::common::exec_err!("json_build_object takes key, value pairs; it was given {} arguments", args.args.len());
        }
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let mut out = Vec::with_capacity(args.number_rows);
        for row in 0..args.number_rows {
            let mut fields = Vec::with_capacity(arrays.len() / 2);
            for pair in arrays.chunks(2) {
                let key = ScalarValue::try_from_array(&pair[0], row)?;
                let value = ScalarValue::try_from_array(&pair[1], row)?;
                let key = if key.is_null() { return datafusion::common::exec_err!("json_build_object: a key is NULL") } else { key.to_string() };
                fields.push(format!("{}: {}", serde_json::Value::String(key), json(&value)));
            }
            out.push(format!("{{{}}}", fields.join(", ")));
        }
        Ok(ColumnarValue::Array(Arc::new(StringArray::from(out))))
    }
}

/// One value as JSON text.
fn json(value: &ScalarValue) -> String {
    use ScalarValue as S;
    match value {
        v if v.is_null() => "null".into(),
        S::Boolean(Some(b)) => b.to_string(),
        S::Int8(_) | S::Int16(_) | S::Int32(_) | S::Int64(_) | S::UInt8(_) | S::UInt16(_) | S::UInt32(_) | S::UInt64(_) | S::Float32(_) | S::Float64(_) | S::Decimal128(..) => {
            value.to_string()
        }
        other => serde_json::Value::String(other.to_string()).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn like_patterns_are_rewritten_for_the_backslash() {
        assert_eq!(backslash_escaped("pg/_%", "/"), "pg\\_%");
        assert_eq!(backslash_escaped("a\\b//", "/"), "a\\\\b/");
        assert_eq!(backslash_escaped("a\\b_", ""), "a\\\\b_");
    }

    #[test]
    fn json_values_are_typed() {
        assert_eq!(json(&ScalarValue::Int64(Some(3))), "3");
        assert_eq!(json(&ScalarValue::Utf8(Some("a\"b".into()))), "\"a\\\"b\"");
        assert_eq!(json(&ScalarValue::Utf8(None)), "null");
        assert_eq!(json(&ScalarValue::Boolean(Some(false))), "false");
    }
}
