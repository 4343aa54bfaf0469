//! `read_parquet(…)` and `read_csv(…)` in the tree: each call becomes a
//! table of the statement's own `blobhouse_files` schema, which the
//! statement's context fills with the files' listing table
//! ([`crate::files`]). Done here, before planning, because listing and
//! reading footers are asynchronous and DataFusion's table functions are
//! not.
//!
//! Arguments, as DuckDB takes them: a path, URL or glob, or a list of
//! them (`['a.parquet', 'b.parquet']`); `hive_partitioning => bool`;
//! `union_by_name => bool` (the columns of all files, by name); for
//! CSV `header => bool` and `delim => 'c'` (or `delimiter`, `sep`).

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    BinaryOperator, Expr, FunctionArg, FunctionArgExpr, Ident, ObjectName, ObjectNamePart, TableAlias, TableFactor, Value, VisitorMut,
};

use super::Parsed;
use crate::EngineError;
use crate::files::{FILES_SCHEMA, FileScan, Format, table_name};


/// Replaces every `read_parquet(…)`/`read_csv(…)` of the statement by its
/// table in [`FILES_SCHEMA`] and lists the scans.
pub(super) fn resolve_files(parsed: &mut Parsed) -> Result<(), EngineError> {
    let mut found = Found { scans: Vec::new(), error: None };
    super::versions::visit_tables(&mut parsed.statement, &mut found);
    if let Some(e) = found.error {
        return Err(EngineError::Unsupported(e));
    }
    parsed.files = found.scans;
    Ok(())
}

struct Found {
    scans: Vec<FileScan>,
    error: Option<String>,
}

impl VisitorMut for Found {
    type Break = ();

    fn pre_visit_table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<()> {
        let TableFactor::Table { name, alias, args: Some(args), .. } = factor else { return ControlFlow::Continue(()) };
        let function = match name.0.as_slice() {
            [ObjectNamePart::Identifier(id)] => id.value.to_ascii_lowercase(),
            _ => return ControlFlow::Continue(()),
        };
        let csv = match function.as_str() {
            "read_parquet" | "parquet_scan" => false,
            "read_csv" | "read_csv_auto" => true,
            // A function of that shape we do not read: DataFusion's own
            // table functions (`generate_series`, `range`) go on.
            _ => return ControlFlow::Continue(()),
        };
        match scan(&function, csv, &args.args) {
            Ok(scan) => {
                if alias.is_none() {
                    *alias = Some(TableAlias { explicit: true, name: Ident::new(&function), columns: Vec::new(), at: None });
                }
                *name = ObjectName(vec![ObjectNamePart::Identifier(Ident::new(FILES_SCHEMA)), ObjectNamePart::Identifier(Ident::new(table_name(self.scans.len())))]);
                factor_args_clear(factor);
                self.scans.push(scan);
                ControlFlow::Continue(())
            }
            Err(e) => {
                self.error = Some(e);
                ControlFlow::Break(())
            }
        }
    }
}

fn factor_args_clear(factor: &mut TableFactor) {
    if let TableFactor::Table { args, .. } = factor {
        *args = None;
    }
}

/// The scan a call's arguments ask for.
fn scan(function: &str, csv: bool, args: &[FunctionArg]) -> Result<FileScan, String> {
    let usage = if csv {
        "read_csv('path or glob' [, header => true, delim => ',', hive_partitioning => true, union_by_name => true])"
    } else {
        "read_parquet('path or glob' [, hive_partitioning => true, union_by_name => true])"
    };
    let mut locations = None;
    let (mut hive, mut header, mut delimiter, mut union_by_name) = (None, true, b',', false);
    for arg in args {
        // `name => value`, or DuckDB's `name = value` (which some dialects
        // parse as a comparison).
        let named = match arg {
            FunctionArg::Named { name, arg: FunctionArgExpr::Expr(e), .. } => Some((name, e)),
            FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::BinaryOp { left, op: BinaryOperator::Eq, right })) => match left.as_ref() {
                Expr::Identifier(name) => Some((name, right.as_ref())),
                _ => None,
            },
            _ => None,
        };
        match (arg, named) {
            (FunctionArg::Unnamed(FunctionArgExpr::Expr(e)), None) if locations.is_none() => locations = Some(paths(e).ok_or_else(|| format!("{function}: the first argument must be a quoted path or a list of them; {usage}"))?),
            (_, Some((name, e))) => {
                let option = name.value.to_ascii_lowercase();
                match option.as_str() {
                    "hive_partitioning" => hive = Some(boolean(e).ok_or_else(|| format!("{function}: hive_partitioning takes true or false"))?),
                    "union_by_name" => union_by_name = boolean(e).ok_or_else(|| format!("{function}: union_by_name takes true or false"))?,
                    "header" if csv => header = boolean(e).ok_or_else(|| format!("{function}: header takes true or false"))?,
                    "delim" | "delimiter" | "sep" if csv => {
                        delimiter = text(e)
                            .filter(|d| d.len() == 1 && d.is_ascii())
                            .map(|d| d.as_bytes()[0])
                            .ok_or_else(|| format!("{function}: {option} takes one ASCII character in quotes"))?
                    }
                    other => return Err(format!("{function}: unknown option '{other}'; {usage}")),
                }
            }
            (other, _) => return Err(format!("{function}: unexpected argument '{other}'; {usage}")),
        }
    }
    let locations = locations.ok_or_else(|| format!("{function}: which files? {usage}"))?;
    if locations.is_empty() {
        return Err(format!("{function}: the list of files is empty"));
    }
    let format = if csv { Format::Csv { header, delimiter } } else { Format::Parquet };
    Ok(FileScan { locations, format, hive, union_by_name })
}

fn text(e: &Expr) -> Option<String> {
    match e {
        Expr::Value(v) => match &v.value {
            Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => Some(s.clone()),
            _ => None,
        },
        _ => None,
    }
}

fn paths(e: &Expr) -> Option<Vec<String>> {
    match e {
        Expr::Array(a) => a.elem.iter().map(text).collect(),
        e => text(e).map(|t| vec![t]),
    }
}

fn boolean(e: &Expr) -> Option<bool> {
    match e {
        Expr::Value(v) => match &v.value {
            Value::Boolean(b) => Some(*b),
            Value::Number(n, _) if n == "1" || n == "0" => Some(n == "1"),
            _ => None,
        },
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_become_statement_tables_with_their_options() {
        let p = crate::parser::parse(
            "SELECT * FROM read_parquet('s3://b/s/*/*.parquet', hive_partitioning => true) JOIN read_csv(['a.csv', 'b.tbl'], header = false, delim => '|') c ON true",
            "generic",
            50,
        )
        .unwrap();
        assert_eq!(p.files.len(), 2);
        assert_eq!(p.files[0], FileScan { locations: vec!["s3://b/s/*/*.parquet".into()], format: Format::Parquet, hive: Some(true), union_by_name: false });
        assert_eq!(p.files[1], FileScan { locations: vec!["a.csv".into(), "b.tbl".into()], format: Format::Csv { header: false, delimiter: b'|' }, hive: None, union_by_name: false });
        let crate::parser::Statement::Sql(s) = p.statement else { panic!() };
        let text = s.to_string();
        assert!(text.contains("blobhouse_files.f0 AS read_parquet") && text.contains("blobhouse_files.f1 c "), "{text}");
        let p = crate::parser::parse("SELECT * FROM read_parquet('x/*.parquet', union_by_name => true)", "generic", 50).unwrap();
        assert!(p.files[0].union_by_name);
        // Other table functions are DataFusion's.
        assert!(crate::parser::parse("SELECT * FROM generate_series(1, 3)", "generic", 50).unwrap().files.is_empty());
    }

    #[test]
    fn bad_calls_say_what_is_taken() {
        let error = |sql: &str| crate::parser::parse(sql, "generic", 50).expect_err(sql).to_string();
        assert!(error("SELECT * FROM read_parquet('x', compression => 'zstd')").contains("unknown option 'compression'"));
        assert!(error("SELECT * FROM read_parquet(42)").contains("quoted path"));
        assert!(error("SELECT * FROM read_csv('x.csv', delim => ';;')").contains("one ASCII character"));
        assert!(error("SELECT * FROM read_parquet([])").contains("empty"));
        assert!(error("SELECT * FROM read_parquet(hive_partitioning => true)").contains("which files?"));
        assert!(error("SELECT * FROM read_parquet('x', union_by_name => 'yes')").contains("union_by_name takes true or false"));
    }
}
