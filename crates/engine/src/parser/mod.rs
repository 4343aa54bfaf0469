//! One parser for every statement blobhouse takes.
//!
//! A statement's text is tokenized and parsed once, by DataFusion's parser
//! (sqlparser underneath, in the configured dialect with table versions:
//! [`dialect`]). blobhouse's own statements — snapshots, versions,
//! RESTORE, VACUUM, OPTIMIZE, SHOW CACHE / STORAGE — are parsed by
//! [`ours`] on the same token stream with sqlparser's own primitives, so
//! their syntax errors carry line and column like any other. The result is
//! one [`Statement`] that the dispatcher (`crate::dispatch`) matches on;
//! nothing downstream looks at SQL text again.
//!
//! Time travel is part of the tree: `t AT(VERSION => 3)` is a table
//! reference with a version clause, which [`crate::time_travel`] resolves
//! into a read-only schema of the statement's own catalog.

pub(crate) mod dialect;
mod files;
mod ours;
mod versions;

use datafusion::sql::parser::{DFParserBuilder, Statement as DFStatement};
use datafusion::sql::sqlparser::ast;
use datafusion::sql::sqlparser::dialect::Dialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::parser::ParserError;
use datafusion::sql::sqlparser::tokenizer::Token;

use crate::EngineError;
use crate::copy::{CopyFrom, CopyTo};
use crate::history::History;
use crate::settings::SettingStatement;
use crate::time_travel::AsOf;
use crate::transaction::Control;

/// A statement, parsed: what the dispatcher matches on.
#[derive(Debug)]
pub(crate) enum Statement {
    /// What DataFusion plans: queries, EXPLAIN, INSERT, CREATE TABLE [AS],
    /// DROP TABLE, DESCRIBE, `SET datafusion.…`. Its plan decides the rest
    /// (`crate::dispatch`).
    Sql(Box<DFStatement>),
    /// DELETE or UPDATE, which [`crate::dml`] turns into a query of row ids.
    Dml(Box<ast::Statement>),
    CopyFrom(CopyFrom),
    CopyTo(CopyTo),
    /// BEGIN, COMMIT, ROLLBACK, SAVEPOINT.
    Transaction(Control),
    /// Snapshots, versions, RESTORE, VACUUM ([`crate::history`]).
    History(History),
    /// `OPTIMIZE [TABLE] t`.
    Optimize { table: String },
    /// SET, RESET and SHOW of a setting of the registry ([`crate::settings`]).
    Setting(SettingStatement),
    /// `SHOW TABLES`: the database's tables.
    ShowTables,
    /// `SHOW CACHE`: a row per caching tier.
    ShowCache,
}

/// A parsed statement and the past versions its tables are read at.
#[derive(Debug)]
pub(crate) struct Parsed {
    pub statement: Statement,
    /// Every distinct point in time the statement's version clauses name
    /// (`t AT(VERSION => 3)`); their tables were renamed into the schema
    /// of each ([`AsOf::schema`]).
    pub past: Vec<AsOf>,
    /// Every `read_parquet(…)`/`read_csv(…)` call, in order; each became
    /// table `f<n>` of the statement's `blobhouse_files` schema
    /// ([`files`]).
    pub files: Vec<crate::files::FileScan>,
}

impl Parsed {
    /// Whether the statement is a plain query (its plan may only read and
    /// return rows).
    pub(crate) fn is_query(&self) -> bool {
        matches!(&self.statement, Statement::Sql(s) if matches!(&**s, DFStatement::Statement(q) if matches!(**q, ast::Statement::Query(_))))
    }
}

/// Parses one statement (a trailing `;` allowed) in the configured dialect
/// (DataFusion's `sql_parser.dialect` name).
pub(crate) fn parse(sql: &str, dialect_name: &str, recursion_limit: usize) -> Result<Parsed, EngineError> {
    let base = datafusion::sql::sqlparser::dialect::dialect_from_str(dialect_name)
        .ok_or_else(|| EngineError::Unsupported(format!("unknown SQL dialect '{dialect_name}' (datafusion.sql_parser.dialect)")))?;
    let dialect = dialect::VersionedDialect(base);
    let mut parser = DFParserBuilder::new(sql).with_dialect(&dialect as &dyn Dialect).with_recursion_limit(recursion_limit).build()?;
    let statement = match ours::parse(&mut parser.parser).map_err(syntax)? {
        Some(ours) => ours,
        None => classify(&mut parser)?,
    };
    // One statement: at most a `;` after it.
    while parser.parser.consume_token(&Token::SemiColon) {}
    let next = parser.parser.peek_token();
    if next.token != Token::EOF {
        return Err(syntax(error_at(format!("Expected: end of statement, found: {}", next.token), next.span.start)));
    }
    let mut parsed = Parsed { statement, past: Vec::new(), files: Vec::new() };
    versions::resolve_versions(&mut parsed)?;
    files::resolve_files(&mut parsed)?;
    Ok(parsed)
}

/// The statement DataFusion's parser reads, sorted into its family.
fn classify(parser: &mut datafusion::sql::parser::DFParser) -> Result<Statement, EngineError> {
    let first = parser.parser.peek_token().token;
    // COPY … FROM / TO with PostgreSQL's grammar; DataFusion's own `COPY …
    // TO … STORED AS` form is left to it.
    if matches!(&first, Token::Word(w) if w.keyword == Keyword::COPY) {
        let start = parser.parser.index();
        if let Some(copy) = parser.parser.maybe_parse(|p| p.parse_statement()).map_err(syntax)? {
            if matches!(parser.parser.peek_token().token, Token::EOF | Token::SemiColon) {
                return Ok(match crate::copy::from_ast(copy)? {
                    crate::copy::Copy::From(c) => Statement::CopyFrom(c),
                    crate::copy::Copy::To(c) => Statement::CopyTo(c),
                });
            }
            // More follows (DataFusion's `STORED AS …`): its grammar, not ours.
            while parser.parser.index() > start {
                parser.parser.prev_token();
            }
        }
    }
    if let Some(setting) = crate::settings::statement(&mut parser.parser).map_err(syntax)? {
        return Ok(Statement::Setting(setting));
    }
    let statement = parser.parse_statement()?;
    let DFStatement::Statement(s) = &statement else { return Ok(Statement::Sql(Box::new(statement))) };
    if let Some(control) = crate::transaction::control(s) {
        return Ok(Statement::Transaction(control));
    }
    Ok(match **s {
        ast::Statement::Delete(_) | ast::Statement::Update(_) => {
            let DFStatement::Statement(s) = statement else { unreachable!("matched above") };
            Statement::Dml(s)
        }
        ast::Statement::ShowTables { .. } => Statement::ShowTables,
        _ => Statement::Sql(Box::new(statement)),
    })
}

/// A parse error at `location`, worded as sqlparser words its own.
pub(crate) fn error_at(message: String, location: datafusion::sql::sqlparser::tokenizer::Location) -> ParserError {
    ParserError::ParserError(format!("{message}{location}"))
}

/// A syntax error, as DataFusion reports its own (SQLSTATE 42601).
pub(crate) fn syntax(e: ParserError) -> EngineError {
    EngineError::Query(datafusion::common::DataFusionError::SQL(Box::new(e), None))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(sql: &str) -> Parsed {
        parse(sql, "generic", 50).unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    fn error(sql: &str) -> String {
        parse(sql, "generic", 50).expect_err(sql).to_string()
    }

    #[test]
    fn every_family_is_recognised_once() {
        assert!(matches!(parsed("SELECT 1").statement, Statement::Sql(_)));
        assert!(parsed("select * from t;").is_query());
        assert!(matches!(parsed("DELETE FROM t WHERE a = 1").statement, Statement::Dml(_)));
        assert!(matches!(parsed("update t set a = 2").statement, Statement::Dml(_)));
        assert!(matches!(parsed("COPY t FROM '/x.csv'").statement, Statement::CopyFrom(_)));
        assert!(matches!(parsed("COPY (SELECT 1) TO '/x.parquet'").statement, Statement::CopyTo(_)));
        assert!(matches!(parsed("BEGIN").statement, Statement::Transaction(Control::Begin)));
        assert!(matches!(parsed("commit;").statement, Statement::Transaction(Control::Commit)));
        assert!(matches!(parsed("OPTIMIZE TABLE Lineitem").statement, Statement::Optimize { table } if table == "lineitem"));
        assert!(matches!(parsed("OPTIMIZE \"MixedCase\"").statement, Statement::Optimize { table } if table == "MixedCase"));
        assert!(matches!(parsed("SHOW TABLES").statement, Statement::ShowTables));
        assert!(matches!(parsed("show cache").statement, Statement::ShowCache));
        assert!(matches!(parsed("SHOW SNAPSHOTS").statement, Statement::History(History::ShowSnapshots)));
        assert!(matches!(parsed("SET memory_limit = '1G'").statement, Statement::Setting(_)));
        assert!(matches!(parsed("SHOW statement_timeout").statement, Statement::Setting(_)));
        assert!(matches!(parsed("SET datafusion.execution.batch_size = 100").statement, Statement::Sql(_)));
    }

    #[test]
    fn syntax_errors_say_where() {
        let e = error("SELECT 1 FROM WHERE x = 1");
        assert!(e.contains("Line: 1, Column"), "{e}");
        // Our own statements too.
        let e = error("SHOW VERSIONS many");
        assert!(e.contains("Line: 1, Column: 15"), "{e}");
        let e = error("VACUUM\n  RETAIN '1 day' NOW");
        assert!(e.contains("Line: 2, Column: 18"), "{e}");
        let e = error("RESTORE TABLE t TO YESTERDAY");
        assert!(e.contains("VERSION, TIMESTAMP or SNAPSHOT") && e.contains("Line: 1, Column: 20"), "{e}");
        let e = error("SELECT 1; SELECT 2");
        assert!(e.contains("end of statement") && e.contains("Column: 11"), "{e}");
    }

    #[test]
    fn time_travel_is_part_of_the_tree_and_keeps_the_statement_as_written() {
        let p = parsed("SELECT sum(x), 'AT(VERSION => 9) Keep Case' FROM t AT(VERSION => 3) JOIN public.U VERSION AS OF 4 ON t.a = U.a");
        assert_eq!(p.past, vec![AsOf::Version(3), AsOf::Version(4)]);
        let Statement::Sql(s) = p.statement else { panic!() };
        let text = s.to_string();
        assert!(text.contains("'AT(VERSION => 9) Keep Case'"), "{text}");
        assert!(text.contains("blobhouse_at_v3.t AS t") && text.contains("blobhouse_at_v4.U AS U"), "{text}");
        let p = parsed("WITH c AS (SELECT * FROM t AT(SNAPSHOT => 'Nightly')) SELECT * FROM c WHERE a IN (SELECT a FROM t TIMESTAMP AS OF '2026-11-23 00:00:01')");
        assert_eq!(p.past, vec![AsOf::Snapshot("Nightly".into()), AsOf::Timestamp(1_795_392_001_000)]);
        let p = parsed("DELETE FROM t WHERE a IN (SELECT a FROM t AT(VERSION => 2))");
        assert_eq!(p.past, vec![AsOf::Version(2)]);
        assert!(error("SELECT * FROM t AT(OFFSET => 3)").contains("VERSION, TIMESTAMP or SNAPSHOT"));
        // AT TIME ZONE is not a version clause.
        assert!(parsed("SELECT ts AT TIME ZONE 'UTC' FROM t").past.is_empty());
    }
}
