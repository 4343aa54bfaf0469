//! Statement parameters bound as SQL literals.
//!
//! blobhouse's statements are not all DataFusion plans (COPY, DELETE and
//! UPDATE rewrites, time travel, snapshots), so a bound statement is the
//! SQL text with each `$n` (or `?`, numbered first) replaced by a SQL
//! literal of its value, which every statement kind then parses as usual.
//! Values are never spliced raw: numbers are re-printed from the parsed
//! number, booleans as TRUE/FALSE, everything else quoted (quotes doubled)
//! and typed. Every front end binds this way: the PostgreSQL extended
//! protocol and Flight SQL (the server), and the Python package's DB-API
//! cursor.

use datafusion::arrow::datatypes::DataType;

/// A float as a literal that reads back as the same float (NaN and the
/// infinities as casts).
pub fn float(v: f64) -> String {
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
pub fn substitute(sql: &str, literals: &[String]) -> Result<String, String> {
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

/// The highest `$n` that `sql` uses outside strings, quoted identifiers
/// and comments (0: none): how many values a statement needs, so that a
/// client binding more than that hears of it instead of having them ignored.
pub fn highest_placeholder(sql: &str) -> usize {
    let mut highest = 0;
    let scanned: Result<String, std::convert::Infallible> = walk(sql, |chars, i, _| {
        if chars[i] != '$' || !chars.get(i + 1).is_some_and(char::is_ascii_digit) || (i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')) {
            return Ok(None);
        }
        let end = (i + 1..chars.len()).find(|j| !chars[*j].is_ascii_digit()).unwrap_or(chars.len());
        let n: usize = chars[i + 1..end].iter().collect::<String>().parse().unwrap_or(usize::MAX);
        highest = highest.max(n);
        Ok(Some(end))
    });
    let _ = scanned;
    highest
}

/// `?` placeholders (ODBC's and DB-API's qmark style, what ADBC clients
/// write) numbered `$1`, `$2`, … in order, outside strings, quoted
/// identifiers and comments.
pub fn number_qmarks(sql: &str) -> String {
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

/// Row `row` of a bound parameter column (Flight SQL and the Python
/// package send parameters as Arrow batches) as a SQL literal of its
/// type, never spliced raw.
pub fn arrow_literal(column: &dyn datafusion::arrow::array::Array, row: usize) -> Result<String, String> {
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
        // An instant: written in UTC, which is how blobhouse keeps it (the
        // values of a zoned timestamp array are UTC already).
        S::TimestampSecond(_, Some(_)) | S::TimestampMillisecond(_, Some(_)) | S::TimestampMicrosecond(_, Some(_)) | S::TimestampNanosecond(_, Some(_)) => {
            let DataType::Timestamp(unit, _) = column.data_type() else { unreachable!("a timestamp scalar comes from a timestamp array") };
            let utc = datafusion::arrow::compute::cast(&column.slice(row, 1), &DataType::Timestamp(*unit, None)).map_err(|e| e.to_string())?;
            format!("TIMESTAMP '{}'", temporal(&utc, 0)?)
        }
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
    fn the_highest_placeholder_outside_quotes_is_found() {
        assert_eq!(highest_placeholder("SELECT $2, $1 + $10 -- $11\n"), 10);
        assert_eq!(highest_placeholder("SELECT '$3', x$4, \"$5\""), 0);
        assert_eq!(highest_placeholder(&number_qmarks("INSERT INTO t VALUES (?, ?, '?')")), 2);
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
    fn floats_print_exactly() {
        assert_eq!(float(0.1), "0.1");
        assert_eq!(float(1e300), "1e300");
        assert!(float(f64::NAN).contains("NaN"));
    }
}
