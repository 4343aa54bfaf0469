//! Binding the extended protocol's parameters into a statement: each
//! value decoded by the type the client declared and written as a SQL
//! literal, which the engine's [`blobhouse_engine::placeholders`] put in
//! place of `$n` (why binding is textual is said there).

use datafusion::arrow::datatypes::DataType;
use pgwire::api::Type;
use pgwire::api::portal::{Format, Portal};
use pgwire::error::PgWireResult;

use crate::pg::{Prepared, user_error};

pub(crate) use blobhouse_engine::placeholders::{arrow_literal, float, number_qmarks, substitute};

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
