//! Time travel in queries: a table read as of a past version.
//!
//! One syntax family, Snowflake's `AT(…)` clause with blobhouse's keys, and
//! Databricks' two short forms:
//!
//! ```sql
//! SELECT … FROM t AT(VERSION => 42)
//! SELECT … FROM t AT(TIMESTAMP => '2026-11-23 05:00:00')   -- UTC; the version current then
//! SELECT … FROM t AT(SNAPSHOT => 'nightly')
//! SELECT … FROM t VERSION AS OF 42
//! SELECT … FROM t TIMESTAMP AS OF '2026-11-23 05:00:00'
//! ```
//!
//! sqlparser parses these only in dialects with table versioning, and
//! DataFusion's planner has no notion of table versions; so the statement's
//! tokens are rewritten before parsing: `t AT(VERSION => 42)` becomes
//! `"blobhouse_at_v42"."t"`, a schema the statement's session resolves to
//! version 42 of the database (read only).

use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer, Word};

use crate::session::EngineError;

/// Prefix of the schemas that hold past versions.
pub(crate) const AT_SCHEMA_PREFIX: &str = "blobhouse_at_";

/// Which past version a table is read at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AsOf {
    Version(u64),
    /// Milliseconds since the epoch (UTC).
    Timestamp(u64),
    Snapshot(String),
}

impl AsOf {
    /// The schema a table read at this point is placed in.
    pub(crate) fn schema(&self) -> String {
        match self {
            AsOf::Version(v) => format!("{AT_SCHEMA_PREFIX}v{v}"),
            AsOf::Timestamp(ms) => format!("{AT_SCHEMA_PREFIX}ts{ms}"),
            AsOf::Snapshot(name) => format!("{AT_SCHEMA_PREFIX}snapshot_{name}"),
        }
    }
}

/// `sql` with every time-travel clause replaced by its schema, and the
/// points in time it names (`None`: the statement has none).
pub(crate) fn rewrite(sql: &str) -> Result<Option<(String, Vec<AsOf>)>, EngineError> {
    let upper = sql.to_ascii_uppercase();
    if !(upper.contains("=>") || upper.contains(" AS OF")) {
        return Ok(None);
    }
    let Ok(mut tokens) = Tokenizer::new(&GenericDialect {}, sql).tokenize() else { return Ok(None) };
    let mut found = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let Some((as_of, end)) = clause_at(&tokens, i)? else {
            i += 1;
            continue;
        };
        // The table name before the clause: word (. word)*.
        let mut start = prev(&tokens, i).filter(|&j| matches!(tokens[j], Token::Word(_))).ok_or_else(|| bad("a time-travel clause must follow a table name"))?;
        while let Some(dot) = prev(&tokens, start).filter(|&j| tokens[j] == Token::Period) {
            match prev(&tokens, dot).filter(|&j| matches!(tokens[j], Token::Word(_))) {
                Some(w) => start = w,
                None => break,
            }
        }
        let Token::Word(table) = tokens[prev(&tokens, i).expect("found above")].clone() else { unreachable!("checked to be a word") };
        let replacement = vec![quoted(&as_of.schema()), Token::Period, Token::Word(table)];
        let len = replacement.len();
        tokens.splice(start..end, replacement);
        found.push(as_of);
        i = start + len;
    }
    if found.is_empty() {
        return Ok(None);
    }
    Ok(Some((tokens.iter().map(Token::to_string).collect(), found)))
}

/// A clause starting at token `i` and the index after it.
fn clause_at(tokens: &[Token], i: usize) -> Result<Option<(AsOf, usize)>, EngineError> {
    let word = |t: &Token, w: &str| matches!(t, Token::Word(Word { value, quote_style: None, .. }) if value.eq_ignore_ascii_case(w));
    // Non-whitespace tokens from i on.
    let ahead: Vec<usize> = (i..tokens.len()).filter(|&j| !matches!(tokens[j], Token::Whitespace(_))).take(6).collect();
    let at = |k: usize| ahead.get(k).map(|&j| &tokens[j]);
    if at(0).is_some_and(|t| word(t, "AT")) && at(1) == Some(&Token::LParen) && at(3) == Some(&Token::RArrow) && at(5) == Some(&Token::RParen) {
        let (kind, value) = (at(2).expect("checked"), at(4).expect("checked"));
        let as_of = if word(kind, "VERSION") {
            AsOf::Version(number(value)?)
        } else if word(kind, "TIMESTAMP") {
            AsOf::Timestamp(timestamp(value)?)
        } else if word(kind, "SNAPSHOT") {
            AsOf::Snapshot(name(value)?)
        } else {
            return Err(bad(&format!("AT({kind} => …): use VERSION, TIMESTAMP or SNAPSHOT")));
        };
        return Ok(Some((as_of, ahead[5] + 1)));
    }
    let short = at(0).filter(|t| word(t, "VERSION") || word(t, "TIMESTAMP"));
    if let Some(kind) = short
        && at(1).is_some_and(|t| word(t, "AS"))
        && at(2).is_some_and(|t| word(t, "OF"))
    {
        let value = at(3).ok_or_else(|| bad("AS OF needs a value"))?;
        let as_of = if word(kind, "VERSION") { AsOf::Version(number(value)?) } else { AsOf::Timestamp(timestamp(value)?) };
        return Ok(Some((as_of, ahead[3] + 1)));
    }
    Ok(None)
}

fn prev(tokens: &[Token], i: usize) -> Option<usize> {
    (0..i).rev().find(|&j| !matches!(tokens[j], Token::Whitespace(_)))
}

fn quoted(ident: &str) -> Token {
    Token::Word(Word { value: ident.to_string(), quote_style: Some('"'), keyword: datafusion::sql::sqlparser::keywords::Keyword::NoKeyword })
}

fn bad(message: &str) -> EngineError {
    EngineError::Unsupported(format!("time travel: {message}; write t AT(VERSION => n), t AT(TIMESTAMP => '2026-01-31 12:00:00'), t AT(SNAPSHOT => 'name'), t VERSION AS OF n or t TIMESTAMP AS OF '…'"))
}

fn number(t: &Token) -> Result<u64, EngineError> {
    match t {
        Token::Number(n, _) => n.parse().map_err(|_| bad(&format!("'{n}' is not a version number"))),
        other => Err(bad(&format!("'{other}' is not a version number"))),
    }
}

fn name(t: &Token) -> Result<String, EngineError> {
    match t {
        Token::SingleQuotedString(s) => Ok(s.clone()),
        Token::Word(w) => Ok(w.value.clone()),
        other => Err(bad(&format!("'{other}' is not a snapshot name"))),
    }
}

fn timestamp(t: &Token) -> Result<u64, EngineError> {
    let Token::SingleQuotedString(s) = t else { return Err(bad(&format!("'{t}' is not a quoted timestamp"))) };
    parse_timestamp_ms(s).map_err(|e| bad(&e))
}

/// `'2026-11-23 05:00:00'` (UTC unless it says otherwise) as milliseconds
/// since the epoch.
pub(crate) fn parse_timestamp_ms(s: &str) -> Result<u64, String> {
    let nanos = datafusion::arrow::compute::kernels::cast_utils::string_to_timestamp_nanos(s).map_err(|e| format!("'{s}' is not a timestamp ({e})"))?;
    u64::try_from(nanos / 1_000_000).map_err(|_| format!("'{s}' is before 1970"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clauses_become_schemas_and_other_sql_is_left_alone() {
        let (sql, found) = rewrite("SELECT * FROM t AT(VERSION => 3) JOIN public.u AT (SNAPSHOT => 'n1') ON t.a = u.a").unwrap().unwrap();
        assert_eq!(sql, r#"SELECT * FROM "blobhouse_at_v3".t JOIN "blobhouse_at_snapshot_n1".u ON t.a = u.a"#);
        assert_eq!(found, vec![AsOf::Version(3), AsOf::Snapshot("n1".into())]);
        let (sql, found) = rewrite("select count(*) from lineitem timestamp as of '2026-11-23 00:00:01'").unwrap().unwrap();
        assert_eq!(sql, r#"select count(*) from "blobhouse_at_ts1795392001000".lineitem"#);
        assert_eq!(found, vec![AsOf::Timestamp(1_795_392_001_000)]);
        assert!(rewrite("SELECT ts AT TIME ZONE 'UTC' FROM t").unwrap().is_none());
        assert!(rewrite("SELECT 'AT(VERSION => 3)' FROM t").unwrap().is_none());
        assert!(rewrite("SELECT * FROM t AT(OFFSET => 3)").unwrap_err().to_string().contains("VERSION, TIMESTAMP or SNAPSHOT"));
    }
}
