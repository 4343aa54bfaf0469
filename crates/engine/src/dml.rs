//! DELETE and UPDATE, planned as ordinary queries.
//!
//! A DELETE or UPDATE is rewritten into a SELECT over the same table read
//! through [`DML_SCHEMA`], where it has one more column,
//! [`ROW_ID_COLUMN`] (`ordinal of the data object << 32 | row position`):
//!
//! - `DELETE FROM t [AS a] WHERE p` → `SELECT a.__blobhouse_row_id FROM blobhouse_dml.t AS a WHERE p`
//! - `UPDATE t [AS a] SET c = e WHERE p` → `SELECT a.__blobhouse_row_id, <every column: e, or a.c> FROM … WHERE p`
//!
//! Because it is a SELECT, WHERE may hold anything a query may — subqueries,
//! correlated or not, IN lists, CTE-free joins through EXISTS — and
//! DataFusion plans it with every optimisation a query gets (pruning,
//! runtime filters). The engine turns the row ids into deletion vectors
//! and, for UPDATE, writes the selected rows as new data objects: an UPDATE
//! is a delete plus an append (docs/transactions.md).
//!
//! Why not DataFusion's `TableProvider::delete_from` / `update`: in
//! DataFusion 55 they receive only the filters that push down to the table,
//! so a WHERE with a subquery cannot be expressed through them.

use datafusion::sql::sqlparser::ast::{self, AssignmentTarget, FromTable, ObjectName, Statement, TableFactor, TableWithJoins};

use crate::provider::{DML_SCHEMA, ROW_ID_COLUMN};
use crate::session::EngineError;

/// A DELETE or UPDATE as the query that selects its rows.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DmlQuery {
    pub kind: DmlKind,
    /// The table changed.
    pub table: String,
    /// The rewritten SELECT: the row ids first, then for UPDATE one column
    /// per table column (`__v0`, `__v1`, …) with its new value.
    pub sql: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DmlKind {
    Delete,
    Update,
}

/// The query of `statement` if it is a DELETE or UPDATE; `columns` gives
/// the table's columns, by name, for a table name.
pub(crate) fn rewrite(statement: &Statement, columns: impl Fn(&str) -> Option<Vec<String>>) -> Result<Option<DmlQuery>, EngineError> {
    match statement {
        Statement::Delete(d) => {
            let unsupported = |what: &str| Err(EngineError::Unsupported(format!("DELETE with {what} is not supported; select the rows with WHERE (subqueries work)")));
            if !d.tables.is_empty() || d.using.is_some() {
                return unsupported("several tables or USING");
            }
            if d.returning.is_some() || d.output.is_some() {
                return unsupported("RETURNING");
            }
            if !d.order_by.is_empty() || d.limit.is_some() {
                return unsupported("ORDER BY or LIMIT");
            }
            let (FromTable::WithFromKeyword(from) | FromTable::WithoutKeyword(from)) = &d.from;
            let [target] = from.as_slice() else { return unsupported("several tables") };
            let (table, alias) = target_table(target, "DELETE")?;
            if columns(&table).is_none() {
                return Err(blobhouse_storage::StorageError::TableNotFound(table).into());
            }
            let sql = format!("SELECT {} FROM {} AS {}{}", qualified(&alias, ROW_ID_COLUMN), qualified(DML_SCHEMA, &table), quote(&alias), where_clause(&d.selection));
            Ok(Some(DmlQuery { kind: DmlKind::Delete, table, sql }))
        }
        Statement::Update(u) => {
            let unsupported = |what: &str| Err(EngineError::Unsupported(format!("UPDATE with {what} is not supported; use subqueries in SET and WHERE")));
            if u.from.is_some() {
                return unsupported("FROM");
            }
            if u.returning.is_some() || u.output.is_some() || u.or.is_some() {
                return unsupported("RETURNING or OR …");
            }
            if !u.order_by.is_empty() || u.limit.is_some() {
                return unsupported("ORDER BY or LIMIT");
            }
            let (table, alias) = target_table(&u.table, "UPDATE")?;
            let Some(names) = columns(&table) else {
                return Err(blobhouse_storage::StorageError::TableNotFound(table).into());
            };
            let mut values: Vec<Option<&ast::Expr>> = vec![None; names.len()];
            for a in &u.assignments {
                let AssignmentTarget::ColumnName(target) = &a.target else {
                    return unsupported("a tuple of columns in SET");
                };
                let column = last_ident(target);
                let Some(i) = names.iter().position(|n| *n == column) else {
                    return Err(EngineError::UnknownColumn { context: format!("UPDATE {table}"), column, columns: names.join(", ") });
                };
                if values[i].replace(&a.value).is_some() {
                    return Err(EngineError::Unsupported(format!("UPDATE {table}: column '{column}' is assigned twice")));
                }
            }
            let mut items = vec![qualified(&alias, ROW_ID_COLUMN)];
            for (i, (name, value)) in names.iter().zip(&values).enumerate() {
                let value = match value {
                    Some(e) => format!("({e})"),
                    None => qualified(&alias, name),
                };
                items.push(format!("{value} AS \"__v{i}\""));
            }
            let sql = format!("SELECT {} FROM {} AS {}{}", items.join(", "), qualified(DML_SCHEMA, &table), quote(&alias), where_clause(&u.selection));
            Ok(Some(DmlQuery { kind: DmlKind::Update, table, sql }))
        }
        _ => Ok(None),
    }
}

/// The table a DELETE or UPDATE changes, and the name its columns are
/// qualified with (the alias, else the table's name).
fn target_table(t: &TableWithJoins, verb: &str) -> Result<(String, String), EngineError> {
    let unsupported = || EngineError::Unsupported(format!("{verb} works on one table of this database, not on joins, functions or subqueries"));
    if !t.joins.is_empty() {
        return Err(unsupported());
    }
    let TableFactor::Table { name, alias, args: None, .. } = &t.relation else { return Err(unsupported()) };
    let parts: Vec<String> = name.0.iter().map(|p| p.to_string().trim_matches('"').to_string()).collect();
    let table = match parts.as_slice() {
        [t] => t.clone(),
        [schema, t] if schema == "public" => t.clone(),
        [catalog, schema, t] if catalog == crate::session::CATALOG && schema == "public" => t.clone(),
        _ => return Err(EngineError::Unsupported(format!("{verb} {name}: blobhouse tables live in the default schema"))),
    };
    let table = name.0.last().and_then(|p| p.as_ident()).map_or(table, |i| i.value.clone());
    let alias = alias.as_ref().map_or(table.clone(), |a| a.name.value.clone());
    Ok((table, alias))
}

fn last_ident(name: &ObjectName) -> String {
    name.0.last().and_then(|p| p.as_ident()).map_or_else(|| name.to_string(), |i| i.value.clone())
}

fn where_clause(selection: &Option<ast::Expr>) -> String {
    selection.as_ref().map_or(String::new(), |p| format!(" WHERE {p}"))
}

fn quote(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

fn qualified(qualifier: &str, name: &str) -> String {
    format!("{}.{}", quote(qualifier), quote(name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::parser::Parser;

    fn rewritten(sql: &str) -> Result<Option<DmlQuery>, EngineError> {
        let statement = Parser::parse_sql(&GenericDialect {}, sql).unwrap().remove(0);
        rewrite(&statement, |t| (t == "t").then(|| vec!["a".to_string(), "b".to_string()]))
    }

    #[test]
    fn delete_and_update_become_selects_of_row_ids() {
        let d = rewritten("DELETE FROM t WHERE a IN (SELECT a FROM t WHERE b > 1)").unwrap().unwrap();
        assert_eq!(d.sql, r#"SELECT "t"."__blobhouse_row_id" FROM "blobhouse_dml"."t" AS "t" WHERE a IN (SELECT a FROM t WHERE b > 1)"#);
        let u = rewritten("UPDATE t AS x SET b = b + 1 WHERE x.a = 3").unwrap().unwrap();
        assert_eq!(u.kind, DmlKind::Update);
        assert_eq!(u.sql, r#"SELECT "x"."__blobhouse_row_id", "x"."a" AS "__v0", (b + 1) AS "__v1" FROM "blobhouse_dml"."t" AS "x" WHERE x.a = 3"#);
        assert!(rewritten("SELECT 1").unwrap().is_none());
    }

    #[test]
    fn what_cannot_be_rewritten_is_refused_by_name() {
        let err = |sql: &str| rewritten(sql).unwrap_err().to_string();
        assert!(err("UPDATE t SET c = 1").contains("no column 'c'"));
        assert!(err("UPDATE t SET a = 1, a = 2").contains("assigned twice"));
        assert!(err("DELETE FROM nope").contains("'nope' does not exist"));
        assert!(err("DELETE FROM t USING t AS u WHERE t.a = u.a").contains("USING"));
    }
}
