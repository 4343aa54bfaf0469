//! SQL cursors: `DECLARE name CURSOR FOR query`, `FETCH n FROM name`,
//! `CLOSE name` — how psycopg's named cursors, and anyone paging a large
//! result by hand, read it a slice at a time.
//!
//! A cursor is a running query whose rows the server has not yet sent: it
//! holds the engine's row stream (computed ahead of the reader by a couple
//! of batches only, see `exec::Rows`), so a cursor over a billion rows
//! costs the server a few batches of memory. FETCH takes the next rows
//! from it; CLOSE, the end of its transaction (unless `WITH HOLD`) or the
//! end of the connection drops it, which stops the query. Only forward
//! reading is supported (`SCROLL`, `FETCH PRIOR`, `MOVE` are refused: the
//! rows are not kept).

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::sql::sqlparser::ast::{CloseCursor, DeclareType, FetchDirection, Statement, Value};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;
use futures::StreamExt;

use crate::exec::{Failure, Rows};

/// A cursor statement, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CursorStatement {
    /// `DECLARE name [BINARY] CURSOR [WITH HOLD] FOR query`.
    Declare { name: String, query: String, hold: bool, binary: bool },
    /// `FETCH [FORWARD] [n | ALL | NEXT] FROM name`; `None`: all.
    Fetch { name: String, count: Option<usize> },
    /// `CLOSE name | ALL`; `None`: all.
    Close { name: Option<String> },
}

/// A refused cursor statement: PostgreSQL's code and words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CursorError {
    pub(crate) sqlstate: &'static str,
    pub(crate) message: String,
}

fn refuse(sqlstate: &'static str, message: impl Into<String>) -> CursorError {
    CursorError { sqlstate, message: message.into() }
}

/// `Some` when `sql` is a cursor statement (`MOVE` and backward fetches
/// are refused with the reason).
pub(crate) fn parse(sql: &str) -> Option<Result<CursorStatement, CursorError>> {
    let first = sql.split_whitespace().next()?.to_ascii_lowercase();
    if first == "move" {
        return Some(Err(refuse("0A000", "MOVE is not supported: cursors read forward only (FETCH n skips by reading)")));
    }
    if !matches!(first.as_str(), "declare" | "fetch" | "close") {
        return None;
    }
    let statements = match Parser::parse_sql(&PostgreSqlDialect {}, sql) {
        Ok(s) => s,
        Err(e) => return Some(Err(refuse("42601", e.to_string()))),
    };
    let [statement] = statements.as_slice() else { return None };
    Some(match statement {
        Statement::Declare { stmts } => {
            let [declare] = stmts.as_slice() else { return Some(Err(refuse("0A000", "declare one cursor at a time"))) };
            if !matches!(declare.declare_type, Some(DeclareType::Cursor)) {
                return None;
            }
            let (Some(query), [name]) = (&declare.for_query, declare.names.as_slice()) else {
                return Some(Err(refuse("42601", "DECLARE name CURSOR FOR query")));
            };
            if declare.scroll == Some(true) {
                return Some(Err(refuse("0A000", "SCROLL cursors are not supported: cursors read forward only (declare it NO SCROLL)")));
            }
            Ok(CursorStatement::Declare { name: name.value.clone(), query: query.to_string(), hold: declare.hold == Some(true), binary: declare.binary == Some(true) })
        }
        Statement::Fetch { name, direction, into: None, .. } => {
            let count = |v: &Value| match v {
                Value::Number(n, _) => n.parse::<i64>().ok().filter(|n| *n >= 0).map(|n| n as usize).ok_or_else(|| refuse("0A000", "cursors read forward only: FETCH a count of 0 or more")),
                other => Err(refuse("42601", format!("FETCH count {other} is not a number"))),
            };
            let count = match direction {
                FetchDirection::Count { limit } => count(&limit.value).map(Some),
                FetchDirection::Forward { limit: Some(limit) } => count(&limit.value).map(Some),
                FetchDirection::Next | FetchDirection::Forward { limit: None } => Ok(Some(1)),
                FetchDirection::All | FetchDirection::ForwardAll => Ok(None),
                other => Err(refuse("0A000", format!("FETCH {other} is not supported: cursors read forward only (FETCH n, NEXT, FORWARD, ALL)"))),
            };
            count.map(|count| CursorStatement::Fetch { name: name.value.clone(), count })
        }
        Statement::Close { cursor: CloseCursor::All } => Ok(CursorStatement::Close { name: None }),
        Statement::Close { cursor: CloseCursor::Specific { name } } => Ok(CursorStatement::Close { name: Some(name.value.clone()) }),
        _ => return None,
    })
}

/// An open cursor.
pub(crate) struct Cursor {
    pub(crate) schema: SchemaRef,
    /// Kept past the end of its transaction.
    pub(crate) hold: bool,
    rows: Rows,
    /// Rows of a batch that a FETCH read only in part.
    pending: Option<RecordBatch>,
}

impl Cursor {
    pub(crate) fn new(rows: Rows, hold: bool) -> Cursor {
        Cursor { schema: rows.schema.clone(), hold, rows, pending: None }
    }

    /// The next `count` rows (all that are left for `None`); fewer at the end.
    pub(crate) async fn fetch(&mut self, count: Option<usize>) -> Result<Vec<RecordBatch>, Failure> {
        let mut need = count.unwrap_or(usize::MAX);
        let mut out = Vec::new();
        while need > 0 {
            let batch = match self.pending.take() {
                Some(b) => b,
                None => match self.rows.next().await {
                    Some(batch) => batch?,
                    None => break,
                },
            };
            if batch.num_rows() <= need {
                need -= batch.num_rows();
                out.push(batch);
            } else {
                out.push(batch.slice(0, need));
                self.pending = Some(batch.slice(need, batch.num_rows() - need));
                need = 0;
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_statements_parse_and_backward_reads_are_refused() {
        assert_eq!(
            parse("DECLARE \"c1\" CURSOR WITHOUT HOLD FOR SELECT * FROM t WHERE x = $1"),
            Some(Ok(CursorStatement::Declare { name: "c1".into(), query: "SELECT * FROM t WHERE x = $1".into(), hold: false, binary: false }))
        );
        assert!(matches!(parse("DECLARE c BINARY CURSOR WITH HOLD FOR SELECT 1"), Some(Ok(CursorStatement::Declare { hold: true, binary: true, .. }))));
        assert_eq!(parse("FETCH FORWARD 100 FROM \"c1\""), Some(Ok(CursorStatement::Fetch { name: "c1".into(), count: Some(100) })));
        assert_eq!(parse("fetch 5 in c"), Some(Ok(CursorStatement::Fetch { name: "c".into(), count: Some(5) })));
        assert_eq!(parse("FETCH ALL FROM c"), Some(Ok(CursorStatement::Fetch { name: "c".into(), count: None })));
        assert_eq!(parse("FETCH NEXT FROM c"), Some(Ok(CursorStatement::Fetch { name: "c".into(), count: Some(1) })));
        assert_eq!(parse("CLOSE c"), Some(Ok(CursorStatement::Close { name: Some("c".into()) })));
        assert_eq!(parse("CLOSE ALL"), Some(Ok(CursorStatement::Close { name: None })));
        for refused in ["FETCH PRIOR FROM c", "FETCH BACKWARD 2 FROM c", "MOVE 5 IN c", "DECLARE c SCROLL CURSOR FOR SELECT 1"] {
            assert_eq!(parse(refused).expect(refused).expect_err(refused).sqlstate, "0A000", "{refused}");
        }
        assert!(parse("SELECT 1").is_none());
    }
}
