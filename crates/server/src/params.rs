//! Binding the extended protocol's parameters into a statement.
//!
//! blobhouse's statements are not all DataFusion plans (COPY, DELETE and
//! UPDATE rewrites, time travel, snapshots), so a bound statement is the
//! SQL text with each `$n` replaced by a SQL literal of its value, which
//! every statement kind then parses as usual. Values are never spliced raw:
//! numbers are re-printed from the parsed number, booleans as TRUE/FALSE,
//! everything else as a quoted string (quotes doubled) cast to its type.

use datafusion::arrow::datatypes::DataType;
use pgwire::api::Type;
use pgwire::api::portal::{Format, Portal};
use pgwire::error::PgWireResult;

use crate::pg::{Prepared, user_error};

/// Most parameters one statement may take (PostgreSQL's limit).
pub const MAX_PARAMETERS: usize = 65_535;

/// `sql` with `portal`'s parameter values in place of `$1`, `$2`, ….
/// Each value is read as the type the client declared for it (its OID in
/// Parse), else as the type the statement infers for it, else as text.
pub(crate) fn bind(portal: &Portal<Prepared>, sql: &str, inferred: &[Option<DataType>]) -> PgWireResult<String> {
    let n = portal.parameter_len();
    if n > MAX_PARAMETERS {
        return Err(user_error("54023", format!("{n} parameters; at most {MAX_PARAMETERS}")));
    }
    if let Format::Individual(codes) = &portal.parameter_format
        && codes.len() != n
    {
        return Err(user_error("08P01", format!("{} parameter format codes for {n} parameters (send none, one, or one per parameter)", codes.len())));
    }
    let mut literals = Vec::with_capacity(n);
    for i in 0..n {
        let declared = portal.statement.parameter_types.get(i).cloned().flatten().filter(|t| *t != Type::UNKNOWN);
        let pg_type = declared.or_else(|| inferred.get(i).cloned().flatten().and_then(|t| arrow_pg::datatypes::into_pg_type(&t).ok())).unwrap_or(Type::TEXT);
        literals.push(literal(portal, i, &pg_type)?);
    }
    substitute(sql, &literals).map_err(|e| user_error("08P01", e))
}

/// The types `CAST($n AS type)` and `$n::type` in `sql` give their
/// parameters, for those planning left untyped (`SELECT $1::int + 1`:
/// PostgreSQL describes `$1` as int4, and asyncpg encodes it by that).
pub(crate) fn cast_types(sql: &str) -> std::collections::HashMap<usize, DataType> {
    use datafusion::sql::sqlparser::ast::{DataType as Sql, Expr, Value, visit_expressions};
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::parser::Parser;
    let mut types = std::collections::HashMap::new();
    let Ok(statements) = Parser::parse_sql(&PostgreSqlDialect {}, sql) else { return types };
    let _ = visit_expressions(&statements, |e| {
        if let Expr::Cast { expr, data_type, .. } = e
            && let Expr::Value(v) = expr.as_ref()
            && let Value::Placeholder(p) = &v.value
            && let Some(n) = p.strip_prefix('$').and_then(|n| n.parse::<usize>().ok())
        {
            let arrow = match data_type {
                Sql::SmallInt(_) | Sql::Int2(_) => Some(DataType::Int16),
                Sql::Int(_) | Sql::Integer(_) | Sql::Int4(_) => Some(DataType::Int32),
                Sql::BigInt(_) | Sql::Int8(_) => Some(DataType::Int64),
                Sql::Real | Sql::Float4 => Some(DataType::Float32),
                Sql::Double(_) | Sql::DoublePrecision | Sql::Float8 => Some(DataType::Float64),
                Sql::Boolean | Sql::Bool => Some(DataType::Boolean),
                Sql::Date => Some(DataType::Date32),
                Sql::Text | Sql::Varchar(_) | Sql::String(_) => Some(DataType::Utf8),
                Sql::Bytea => Some(DataType::Binary),
                _ => None,
            };
            if let Some(t) = arrow {
                types.entry(n).or_insert(t);
            }
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
    types
}

/// The SQL type a parameter the client declared as `pg_type` is planned
/// as, when blobhouse has one that holds exactly its values. A declared
/// type fixes the statement's types the way PostgreSQL's does: `SELECT $1`
/// with an int2 parameter returns int2, not text.
pub(crate) fn declared_sql_type(pg_type: &Type) -> Option<&'static str> {
    Some(match *pg_type {
        Type::BOOL => "BOOLEAN",
        Type::INT2 => "SMALLINT",
        Type::INT4 => "INT",
        Type::INT8 => "BIGINT",
        Type::FLOAT4 => "REAL",
        Type::FLOAT8 => "DOUBLE",
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME => "VARCHAR",
        Type::DATE => "DATE",
        Type::TIMESTAMP => "TIMESTAMP",
        // blobhouse keeps instants as UTC timestamps.
        Type::TIMESTAMPTZ => "TIMESTAMP",
        Type::TIME => "TIME",
        Type::BYTEA => "BYTEA",
        _ => return None,
    })
}

/// `sql` with each `$n` whose type the client declared written as
/// `CAST($n AS type)`, so that planning sees the declared types; `None`
/// when no parameter has one.
pub(crate) fn declare(sql: &str, declared: &[Option<Type>]) -> Option<String> {
    cast_placeholders(sql, declared, declared_sql_type)
}

/// What [`declare`] does, for describing only: a NUMERIC parameter
/// described as a decimal too. It is not bound so — the value keeps the
/// scale it was sent with, as PostgreSQL's numeric does, and NUMERIC's
/// wire forms carry each value's scale.
pub(crate) fn declare_for_describe(sql: &str, declared: &[Option<Type>]) -> Option<String> {
    cast_placeholders(sql, declared, |t| if *t == Type::NUMERIC { Some("DECIMAL(38, 10)") } else { declared_sql_type(t) })
}

/// `sql` with each `$n` replaced by a sample value of its declared type
/// (`0`, `''`, a date …), for describing a statement that cannot be
/// planned with placeholders at all (`range($1)`: a table function's
/// arguments must be literals). `None` when no type was declared.
pub(crate) fn with_samples(sql: &str, declared: &[Option<Type>]) -> Option<String> {
    if declared.is_empty() {
        return None;
    }
    let samples: Vec<String> = declared
        .iter()
        .map(|t| {
            match t.as_ref() {
                Some(t) if matches!(*t, Type::INT2 | Type::INT4 | Type::INT8 | Type::NUMERIC) => "0",
                Some(t) if matches!(*t, Type::FLOAT4 | Type::FLOAT8) => "0.0",
                Some(&Type::BOOL) => "FALSE",
                Some(&Type::DATE) => "DATE '2000-01-01'",
                Some(&Type::TIMESTAMP) | Some(&Type::TIMESTAMPTZ) => "TIMESTAMP '2000-01-01 00:00:00'",
                Some(&Type::TIME) => "TIME '00:00:00'",
                Some(&Type::BYTEA) => "X''",
                None => "NULL",
                Some(_) => "''",
            }
            .to_string()
        })
        .collect();
    substitute(sql, &samples).ok()
}

fn cast_placeholders(sql: &str, declared: &[Option<Type>], sql_type: impl Fn(&Type) -> Option<&'static str>) -> Option<String> {
    let types: Vec<Option<&str>> = declared.iter().map(|t| t.as_ref().and_then(&sql_type)).collect();
    if types.iter().all(Option::is_none) {
        return None;
    }
    let placeholders: Vec<String> = (1..=types.len()).map(|n| match types[n - 1] {
        Some(t) => format!("CAST(${n} AS {t})"),
        None => format!("${n}"),
    }).collect();
    substitute(sql, &placeholders).ok()
}

/// Parameter `i` of `portal` as a SQL literal of type `pg_type`, decoded
/// from its text or binary form. A binary value of a type blobhouse cannot
/// decode is refused, never read as text.
fn literal(portal: &Portal<Prepared>, i: usize, pg_type: &Type) -> PgWireResult<String> {
    let Some(raw) = portal.parameters.get(i).cloned().flatten() else { return Ok("NULL".to_string()) };
    let binary = portal.parameter_format.is_binary(i);
    let bad = |e: pgwire::error::PgWireError| user_error("22P02", format!("parameter ${}: not a valid {}: {e}", i + 1, pg_type.name()));
    let quoted = |s: &str| format!("'{}'", s.replace('\'', "''"));
    let text = || std::str::from_utf8(&raw).map_err(|_| user_error("22021", format!("parameter ${}: not valid UTF-8", i + 1)));
    let value = match *pg_type {
        Type::BOOL => portal.parameter::<bool>(i, pg_type).map_err(bad)?.map(|b| if b { "TRUE".to_string() } else { "FALSE".to_string() }),
        Type::INT2 => portal.parameter::<i16>(i, pg_type).map_err(bad)?.map(|v| v.to_string()),
        Type::INT4 => portal.parameter::<i32>(i, pg_type).map_err(bad)?.map(|v| v.to_string()),
        Type::INT8 => portal.parameter::<i64>(i, pg_type).map_err(bad)?.map(|v| v.to_string()),
        Type::FLOAT4 => portal.parameter::<f32>(i, pg_type).map_err(bad)?.map(|v| float(v as f64)),
        Type::FLOAT8 => portal.parameter::<f64>(i, pg_type).map_err(bad)?.map(float),
        Type::NUMERIC if !binary => {
            let t = text()?.trim();
            let valid = !t.is_empty() && t.chars().all(|c| c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E'));
            if !valid {
                return Err(user_error("22P02", format!("parameter ${}: not a valid numeric: '{t}'", i + 1)));
            }
            let scale = t.split(['e', 'E']).next().and_then(|m| m.split_once('.')).map_or(0, |(_, f)| f.len()).min(38);
            Some(format!("CAST('{t}' AS DECIMAL(38, {scale}))"))
        }
        Type::NUMERIC => {
            let text = binary_numeric(&raw).map_err(|why| user_error("22P02", format!("parameter ${}: not a valid binary numeric: {why}", i + 1)))?;
            let scale = text.split_once('.').map_or(0, |(_, f)| f.len()).min(38);
            Some(format!("CAST('{text}' AS DECIMAL(38, {scale}))"))
        }
        Type::DATE => portal.parameter::<chrono::NaiveDate>(i, pg_type).map_err(bad)?.map(|d| format!("DATE '{d}'")),
        Type::TIMESTAMP => portal.parameter::<chrono::NaiveDateTime>(i, pg_type).map_err(bad)?.map(|t| format!("TIMESTAMP '{}'", t.format("%Y-%m-%d %H:%M:%S%.f"))),
        // An instant: written in UTC, which is how blobhouse keeps it.
        Type::TIMESTAMPTZ if binary => portal.parameter::<chrono::DateTime<chrono::FixedOffset>>(i, pg_type).map_err(bad)?.map(|t| format!("TIMESTAMP '{}'", t.naive_utc().format("%Y-%m-%d %H:%M:%S%.f"))),
        Type::TIME if binary => portal.parameter::<chrono::NaiveTime>(i, pg_type).map_err(bad)?.map(|t| format!("TIME '{}'", t.format("%H:%M:%S%.f"))),
        Type::BYTEA if binary => Some(format!("X'{}'", raw.iter().map(|b| format!("{b:02x}")).collect::<String>())),
        Type::BYTEA => {
            let t = text()?;
            let hex = t.strip_prefix("\\x").ok_or_else(|| user_error("22P02", format!("parameter ${}: a bytea in text form must be hex (\\x…)", i + 1)))?;
            if hex.len() % 2 != 0 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
                return Err(user_error("22P02", format!("parameter ${}: invalid hex in bytea", i + 1)));
            }
            Some(format!("X'{hex}'"))
        }
        Type::UUID if binary => {
            let b: [u8; 16] = raw.as_ref().try_into().map_err(|_| user_error("22P02", format!("parameter ${}: a binary uuid is 16 bytes, got {}", i + 1, raw.len())))?;
            let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
            Some(quoted(&format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])))
        }
        Type::INTERVAL if binary => {
            let b: [u8; 16] = raw.as_ref().try_into().map_err(|_| user_error("22P02", format!("parameter ${}: a binary interval is 16 bytes, got {}", i + 1, raw.len())))?;
            let micros = i64::from_be_bytes(b[0..8].try_into().expect("8 bytes"));
            let days = i32::from_be_bytes(b[8..12].try_into().expect("4 bytes"));
            let months = i32::from_be_bytes(b[12..16].try_into().expect("4 bytes"));
            Some(format!("INTERVAL '{months} months {days} days {micros} microseconds'"))
        }
        Type::INTERVAL => Some(format!("INTERVAL {}", quoted(text()?))),
        // Text types' binary form is their UTF-8.
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN | Type::JSON => Some(quoted(text()?)),
        _ if binary => {
            return Err(user_error("0A000", format!("parameter ${}: binary values of type {} are not supported; send it in text format", i + 1, pg_type.name())));
        }
        // Text as the client sent it, byte for byte (pgwire's text decoder
        // would fold a doubled quote into one).
        _ => Some(quoted(text()?)),
    };
    Ok(value.unwrap_or_else(|| "NULL".to_string()))
}

/// PostgreSQL's binary NUMERIC (digit count, weight, sign, display scale,
/// then base-10000 digits) as decimal text, every digit kept: rust_decimal
/// (pgwire's decoder) holds 28 and would round a DECIMAL(38, s) value.
fn binary_numeric(raw: &[u8]) -> Result<String, String> {
    let word = |at: usize| raw.get(at..at + 2).map(|b| u16::from_be_bytes([b[0], b[1]])).ok_or_else(|| format!("{} bytes", raw.len()));
    let (ndigits, weight, sign, dscale) = (word(0)? as usize, word(2)? as i16, word(4)?, word(6)? as usize);
    match sign {
        0x0000 | 0x4000 => {}
        0xC000 => return Err("NaN has no DECIMAL value".into()),
        0xD000 | 0xF000 => return Err("infinity has no DECIMAL value".into()),
        other => return Err(format!("sign word {other:#x}")),
    }
    let digits: Vec<u16> = (0..ndigits).map(|k| word(8 + 2 * k)).collect::<Result<_, _>>()?;
    if digits.iter().any(|d| *d > 9999) || dscale > 1000 {
        return Err("a digit beyond 9999".into());
    }
    // Digit k stands for digits[k] * 10000^(weight - k).
    let mut int = String::new();
    for k in 0..=weight.max(-1) as isize {
        let d = digits.get(k as usize).copied().unwrap_or(0);
        if int.is_empty() { int = d.to_string() } else { int.push_str(&format!("{d:04}")) }
    }
    if int.is_empty() {
        int.push('0');
    }
    let mut frac = String::new();
    let first_frac = (weight as isize + 1).max(0);
    // Leading zero groups of a number below 1 (weight < -1).
    for _ in 0..(-(weight as isize) - 1).max(0) {
        frac.push_str("0000");
    }
    for k in first_frac..ndigits as isize {
        frac.push_str(&format!("{:04}", digits[k as usize]));
    }
    frac.truncate(dscale);
    while frac.len() < dscale {
        frac.push('0');
    }
    let sign = if sign == 0x4000 { "-" } else { "" };
    Ok(if frac.is_empty() { format!("{sign}{int}") } else { format!("{sign}{int}.{frac}") })
}

pub(crate) fn float(v: f64) -> String {
    if v.is_nan() {
        "CAST('NaN' AS DOUBLE)".into()
    } else if v.is_infinite() {
        format!("CAST('{}' AS DOUBLE)", if v > 0.0 { "inf" } else { "-inf" })
    } else {
        format!("{v:?}")
    }
}

/// Replaces `$n` outside strings, quoted identifiers and comments with
/// `literals[n - 1]`; a `$n` past the values is an error that names it.
pub(crate) fn substitute(sql: &str, literals: &[String]) -> Result<String, String> {
    walk(sql, |chars, i, out| {
        let c = chars[i];
        if !(c == '$' && chars.get(i + 1).is_some_and(char::is_ascii_digit) && !(i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_'))) {
            return Ok(None);
        }
        let end = (i + 1..chars.len()).find(|j| !chars[*j].is_ascii_digit()).unwrap_or(chars.len());
        let digits: String = chars[i + 1..end].iter().collect();
        let n: usize = digits.parse().unwrap_or(usize::MAX);
        let value = n
            .checked_sub(1)
            .and_then(|k| literals.get(k))
            .ok_or_else(|| format!("the statement uses ${digits} but {} parameter value(s) were bound", literals.len()))?;
        out.push_str(value);
        Ok(Some(end))
    })
}

/// `?` placeholders (ODBC's and DB-API's qmark style, what ADBC clients
/// write) numbered `$1`, `$2`, … in order, outside strings, quoted
/// identifiers and comments.
pub(crate) fn number_qmarks(sql: &str) -> String {
    let mut n = 0;
    let numbered: Result<String, std::convert::Infallible> = walk(sql, |chars, i, out| {
        if chars[i] != '?' {
            return Ok(None);
        }
        n += 1;
        out.push_str(&format!("${n}"));
        Ok(Some(i + 1))
    });
    numbered.unwrap_or_else(|never| match never {})
}

/// Copies `sql`, with strings, quoted identifiers and comments as they
/// are; at every other character `at(chars, i, out)` either writes a
/// replacement and returns the index after what it consumed, or declines.
/// An unterminated quote or comment runs to the end of the text.
fn walk<E>(sql: &str, mut at: impl FnMut(&[char], usize, &mut String) -> Result<Option<usize>, E>) -> Result<String, E> {
    let chars: Vec<char> = sql.chars().collect();
    let mut out = String::with_capacity(sql.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '\'' | '"' => {
                // A quoted run, its quote doubled inside.
                out.push(c);
                i += 1;
                while i < chars.len() {
                    out.push(chars[i]);
                    if chars[i] == c {
                        if chars.get(i + 1) == Some(&c) {
                            out.push(c);
                            i += 2;
                            continue;
                        }
                        break;
                    }
                    i += 1;
                }
                i += 1;
            }
            '-' if chars.get(i + 1) == Some(&'-') => {
                while i < chars.len() && chars[i] != '\n' {
                    out.push(chars[i]);
                    i += 1;
                }
            }
            '/' if chars.get(i + 1) == Some(&'*') => {
                let end = (i + 2..chars.len().saturating_sub(1)).find(|j| chars[*j] == '*' && chars[j + 1] == '/').map_or(chars.len(), |j| j + 2);
                out.extend(&chars[i..end]);
                i = end;
            }
            _ => match at(&chars, i, &mut out)? {
                Some(next) => i = next,
                None => {
                    out.push(c);
                    i += 1;
                }
            },
        }
    }
    Ok(out)
}

/// Row `row` of a bound parameter column (Flight SQL sends parameters as
/// Arrow batches) as a SQL literal of its type, never spliced raw.
pub(crate) fn arrow_literal(column: &dyn datafusion::arrow::array::Array, row: usize) -> Result<String, String> {
    use datafusion::common::ScalarValue as S;
    let value = S::try_from_array(column, row).map_err(|e| e.to_string())?;
    let quoted = |s: &str| format!("'{}'", s.replace('\'', "''"));
    if value.is_null() {
        return Ok("NULL".into());
    }
    Ok(match &value {
        S::Boolean(Some(b)) => if *b { "TRUE".into() } else { "FALSE".into() },
        S::Int8(_) | S::Int16(_) | S::Int32(_) | S::Int64(_) | S::UInt8(_) | S::UInt16(_) | S::UInt32(_) | S::UInt64(_) => value.to_string(),
        S::Float32(Some(v)) => float(*v as f64),
        S::Float64(Some(v)) => float(*v),
        S::Decimal128(Some(_), p, s) => format!("CAST('{value}' AS DECIMAL({p}, {s}))"),
        S::Utf8(Some(v)) | S::LargeUtf8(Some(v)) | S::Utf8View(Some(v)) => quoted(v),
        // Temporal values as Arrow prints them (ISO 8601): a scalar's own
        // Display of a timestamp is its raw count of units.
        S::Date32(_) | S::Date64(_) => format!("DATE '{}'", temporal(column, row)?),
        S::TimestampSecond(_, None) | S::TimestampMillisecond(_, None) | S::TimestampMicrosecond(_, None) | S::TimestampNanosecond(_, None) => format!("TIMESTAMP '{}'", temporal(column, row)?),
        S::Time32Second(_) | S::Time32Millisecond(_) | S::Time64Microsecond(_) | S::Time64Nanosecond(_) => format!("TIME '{}'", temporal(column, row)?),
        S::Binary(Some(b)) | S::LargeBinary(Some(b)) | S::BinaryView(Some(b)) | S::FixedSizeBinary(_, Some(b)) => format!("X'{}'", b.iter().map(|x| format!("{x:02x}")).collect::<String>()),
        _ => return Err(format!("a parameter of type {} cannot be bound; bind it as a string and CAST it in the statement", column.data_type())),
    })
}

/// Row `row` of a date, time or timestamp column in ISO 8601.
fn temporal(column: &dyn datafusion::arrow::array::Array, row: usize) -> Result<String, String> {
    datafusion::arrow::util::display::array_value_to_string(column, row).map(|s| s.replace('T', " ")).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_outside_quotes_and_comments_are_replaced() {
        let l = vec!["42".to_string(), "'it''s'".to_string()];
        assert_eq!(substitute("SELECT $1, $2", &l).unwrap(), "SELECT 42, 'it''s'");
        assert_eq!(substitute("SELECT '$1', \"$2\", x$1 -- $1\n, $2", &l).unwrap(), "SELECT '$1', \"$2\", x$1 -- $1\n, 'it''s'");
        assert_eq!(substitute("SELECT 'a''$1' /* $2 */ + $1", &l).unwrap(), "SELECT 'a''$1' /* $2 */ + 42");
        let e = substitute("SELECT $3", &l).unwrap_err().to_string();
        assert!(e.contains("$3") && e.contains("2 parameter"), "{e}");
        assert!(substitute("SELECT $0", &l).is_err());
        assert!(substitute("SELECT $99999999999999999999999", &l).is_err());
        // Unterminated quotes and comments neither panic nor substitute.
        assert_eq!(substitute("SELECT '$1", &l).unwrap(), "SELECT '$1");
        assert_eq!(substitute("SELECT /* $1", &l).unwrap(), "SELECT /* $1");
    }

    #[test]
    fn qmarks_are_numbered_outside_quotes_and_comments() {
        assert_eq!(number_qmarks("SELECT ? + ?, '?', \"?\" -- ?\n FROM t WHERE x = ?"), "SELECT $1 + $2, '?', \"?\" -- ?\n FROM t WHERE x = $3");
        assert_eq!(number_qmarks("SELECT 1"), "SELECT 1");
    }

    #[test]
    fn arrow_values_become_typed_literals() {
        use datafusion::arrow::array::{Date32Array, Float64Array, Int64Array, StringArray};
        let text = StringArray::from(vec![Some("x' OR '1'='1"), None]);
        assert_eq!(arrow_literal(&text, 0).unwrap(), "'x'' OR ''1''=''1'");
        assert_eq!(arrow_literal(&text, 1).unwrap(), "NULL");
        assert_eq!(arrow_literal(&Int64Array::from(vec![-7]), 0).unwrap(), "-7");
        assert_eq!(arrow_literal(&Float64Array::from(vec![0.1]), 0).unwrap(), "0.1");
        assert_eq!(arrow_literal(&Date32Array::from(vec![0]), 0).unwrap(), "DATE '1970-01-01'");
        let list = datafusion::arrow::array::ListArray::from_iter_primitive::<datafusion::arrow::datatypes::Int32Type, _, _>(vec![Some(vec![Some(1)])]);
        assert!(arrow_literal(&list, 0).unwrap_err().contains("cannot be bound"));
    }

    #[test]
    fn binary_numerics_keep_every_digit() {
        // 12345678901234567890.0123456789: weight 4, groups 1234 5678 9012 3456 7890 . 0123 4567 89(00)
        let mut raw = Vec::new();
        for w in [8u16, 4, 0, 10, 1234, 5678, 9012, 3456, 7890, 123, 4567, 8900] {
            raw.extend_from_slice(&w.to_be_bytes());
        }
        assert_eq!(binary_numeric(&raw).unwrap(), "12345678901234567890.0123456789");
        // -0.00012: weight -1, groups 0001 2000, scale 5
        let raw: Vec<u8> = [2u16, (-1i16) as u16, 0x4000, 5, 1, 2000].iter().flat_map(|w| w.to_be_bytes()).collect();
        assert_eq!(binary_numeric(&raw).unwrap(), "-0.00012");
        // 0.000012: weight -2, one group 1200, scale 6
        let raw: Vec<u8> = [1u16, (-2i16) as u16, 0, 6, 1200].iter().flat_map(|w| w.to_be_bytes()).collect();
        assert_eq!(binary_numeric(&raw).unwrap(), "0.000012");
        // 0 with scale 2; 12.5 with scale 1
        let zero: Vec<u8> = [0u16, 0, 0, 2].iter().flat_map(|w| w.to_be_bytes()).collect();
        assert_eq!(binary_numeric(&zero).unwrap(), "0.00");
        let small: Vec<u8> = [2u16, 0, 0, 1, 12, 5000].iter().flat_map(|w| w.to_be_bytes()).collect();
        assert_eq!(binary_numeric(&small).unwrap(), "12.5");
        assert!(binary_numeric(&[0, 1]).is_err());
    }

    #[test]
    fn floats_print_exactly() {
        assert_eq!(float(0.1), "0.1");
        assert_eq!(float(1e300), "1e300");
        assert!(float(f64::NAN).contains("NaN"));
    }
}
