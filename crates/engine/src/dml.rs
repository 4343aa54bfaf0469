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
//! The SELECT is built as a syntax tree from the statement's own tree (its
//! WHERE and SET expressions move over unchanged); nothing is printed and
//! parsed again.
//!
//! Why not DataFusion's `TableProvider::delete_from` / `update`: in
//! DataFusion 55 they receive only the filters that push down to the table,
//! so a WHERE with a subquery cannot be expressed through them.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use datafusion::arrow::array::{Array, RecordBatch, UInt64Array};
use datafusion::common::{Column, DataFusionError};
use datafusion::logical_expr::{Expr, LogicalPlanBuilder, cast};
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::helpers::attached_token::AttachedToken;
use datafusion::sql::sqlparser::ast::{
    self, AssignmentTarget, FromTable, GroupByExpr, Ident, ObjectName, ObjectNamePart, Query, Select, SelectFlavor, SelectItem, SetExpr, Statement, TableAlias, TableFactor, TableWithJoins,
};
use futures::StreamExt;
use roaring::RoaringBitmap;

use blobhouse_storage::{LiveObject, StorageError, TableWriter};

use crate::EngineError;
use crate::env::Env;
use crate::provider::{DML_SCHEMA, ROW_ID_COLUMN};
use crate::transaction::joined;

/// A DELETE or UPDATE as the query that selects its rows.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DmlQuery {
    pub kind: DmlKind,
    /// The table changed.
    pub table: String,
    /// The rewritten SELECT: the row ids first, then for UPDATE one column
    /// per table column (`__v0`, `__v1`, …) with its new value.
    pub query: Query,
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
            let query = select(vec![SelectItem::UnnamedExpr(qualified(&alias, ROW_ID_COLUMN))], &table, &alias, d.selection.clone());
            Ok(Some(DmlQuery { kind: DmlKind::Delete, table, query }))
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
            let mut items = vec![SelectItem::UnnamedExpr(qualified(&alias, ROW_ID_COLUMN))];
            for (i, (name, value)) in names.iter().zip(&values).enumerate() {
                let expr = match value {
                    Some(e) => ast::Expr::Nested(Box::new((*e).clone())),
                    None => qualified(&alias, name),
                };
                items.push(SelectItem::ExprWithAlias { expr, alias: Ident::with_quote('"', format!("__v{i}")) });
            }
            let query = select(items, &table, &alias, u.selection.clone());
            Ok(Some(DmlQuery { kind: DmlKind::Update, table, query }))
        }
        _ => Ok(None),
    }
}

/// Runs a DELETE or UPDATE: its SELECT of row ids (and new values),
/// then the deletion vectors and new data objects, staged in the
/// statement's transaction. Returns the rows deleted or updated.
pub(crate) async fn run(env: &Env<'_>, statement: &Statement) -> Result<u64, EngineError> {
    let (ctx, scope, db) = (&env.ctx, &env.scope, env.engine.database());
    let columns = |t: &str| scope.view.tables.get(t).map(|e| e.schema.fields().iter().map(|f| f.name().clone()).collect());
    let dml = rewrite(statement, columns)?.ok_or_else(|| EngineError::Unsupported(format!("'{statement}' is not a DELETE or UPDATE")))?;
    let entry = scope.view.tables.get(&dml.table).cloned().ok_or_else(|| StorageError::TableNotFound(dml.table.clone()))?;
    let data = db.table_data(&entry).await?;
    let table_schema = Arc::new(entry.schema.clone());
    let plan = ctx.state().statement_to_plan(DFStatement::Statement(Box::new(Statement::Query(Box::new(dml.query))))).await?;
    // New values take the column's type, as INSERT's do.
    let mut exprs = vec![Expr::Column(Column::new_unqualified(ROW_ID_COLUMN))];
    if dml.kind == DmlKind::Update {
        for (i, f) in table_schema.fields().iter().enumerate() {
            exprs.push(cast(Expr::Column(Column::new_unqualified(format!("__v{i}"))), f.data_type().clone()).alias(f.name()));
        }
    }
    let plan = LogicalPlanBuilder::from(plan).project(exprs)?.build()?;
    let mut stream = ctx.execute_logical_plan(plan).await?.execute_stream().await?;
    let mut deleted: BTreeMap<u32, RoaringBitmap> = Default::default();
    let mut writer = (dml.kind == DmlKind::Update).then(|| TableWriter::new(db.clone(), table_schema.clone(), env.engine.options().write.clone()));
    let mut rows = 0u64;
    let outcome: Result<(), EngineError> = async {
        while let Some(batch) = stream.next().await {
            let batch = batch?;
            let ids = batch.column(0).as_any().downcast_ref::<UInt64Array>().expect("row ids are UInt64");
            for id in ids.values() {
                let fresh = deleted.entry((id >> 32) as u32).or_default().insert(*id as u32);
                if !fresh {
                    return Err(EngineError::Unsupported(format!("{} {}: a row matched twice; the statement had no effect", if writer.is_some() { "UPDATE" } else { "DELETE" }, dml.table)));
                }
            }
            rows += batch.num_rows() as u64;
            if let Some(w) = writer.as_mut() {
                let values = RecordBatch::try_new(table_schema.clone(), batch.columns()[1..].to_vec()).map_err(DataFusionError::from)?;
                w.write(&values).await?;
            }
        }
        Ok(())
    }
    .await;
    if let Err(e) = outcome {
        if let Some(w) = writer {
            w.abort().await;
        }
        return Err(e);
    }
    let objects = match writer {
        Some(w) => w.finish().await?,
        None => Vec::new(),
    };
    let by_ordinal: HashMap<u32, &LiveObject> = data.objects.iter().map(|l| (l.ordinal, l)).collect();
    let mut vectors = Vec::with_capacity(deleted.len());
    for (ordinal, new) in deleted {
        let live = by_ordinal.get(&ordinal).ok_or_else(|| EngineError::Unsupported(format!("{}: row id of unknown data object {ordinal}", dml.table)))?;
        let union = match &live.deleted {
            Some(old) => old.as_ref() | &new,
            None => new,
        };
        vectors.push((data.object(live).key, live.manifest, live.vector, union));
    }
    let mut slot = scope.txn.lock().await;
    let txn = joined(db, &mut slot, &objects).await?;
    txn.record_uploads(objects.iter().map(|o| o.path.clone()));
    txn.delete(&dml.table, vectors).await?;
    if !objects.is_empty() {
        txn.append(&dml.table, entry.id, objects).await?;
    }
    Ok(rows)
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
        [catalog, schema, t] if catalog == crate::CATALOG && schema == "public" => t.clone(),
        _ => return Err(EngineError::Unsupported(format!("{verb} {name}: blobhouse tables live in the default schema"))),
    };
    let table = name.0.last().and_then(|p| p.as_ident()).map_or(table, |i| i.value.clone());
    let alias = alias.as_ref().map_or(table.clone(), |a| a.name.value.clone());
    Ok((table, alias))
}

fn last_ident(name: &ObjectName) -> String {
    name.0.last().and_then(|p| p.as_ident()).map_or_else(|| name.to_string(), |i| i.value.clone())
}

/// `qualifier.name`, both quoted (taken as written).
fn qualified(qualifier: &str, name: &str) -> ast::Expr {
    ast::Expr::CompoundIdentifier(vec![Ident::with_quote('"', qualifier), Ident::with_quote('"', name)])
}

/// `SELECT items FROM blobhouse_dml.table AS alias [WHERE selection]`.
fn select(items: Vec<SelectItem>, table: &str, alias: &str, selection: Option<ast::Expr>) -> Query {
    let name = ObjectName(vec![ObjectNamePart::Identifier(Ident::with_quote('"', DML_SCHEMA)), ObjectNamePart::Identifier(Ident::with_quote('"', table))]);
    let relation = TableFactor::Table {
        name,
        alias: Some(TableAlias { explicit: true, name: Ident::with_quote('"', alias), columns: Vec::new(), at: None }),
        args: None,
        with_hints: Vec::new(),
        version: None,
        with_ordinality: false,
        partitions: Vec::new(),
        json_path: None,
        sample: None,
        index_hints: Vec::new(),
    };
    let select = Select {
        select_token: AttachedToken::empty(),
        optimizer_hints: Vec::new(),
        distinct: None,
        select_modifiers: None,
        top: None,
        top_before_distinct: false,
        projection: items,
        exclude: None,
        into: None,
        from: vec![TableWithJoins { relation, joins: Vec::new() }],
        lateral_views: Vec::new(),
        prewhere: None,
        selection,
        connect_by: Vec::new(),
        group_by: GroupByExpr::Expressions(Vec::new(), Vec::new()),
        cluster_by: Vec::new(),
        distribute_by: Vec::new(),
        sort_by: Vec::new(),
        having: None,
        named_window: Vec::new(),
        qualify: None,
        window_before_qualify: false,
        value_table_mode: None,
        flavor: SelectFlavor::Standard,
    };
    Query {
        with: None,
        body: Box::new(SetExpr::Select(Box::new(select))),
        order_by: None,
        limit_clause: None,
        fetch: None,
        locks: Vec::new(),
        for_clause: None,
        settings: None,
        format_clause: None,
        pipe_operators: Vec::new(),
    }
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
        assert_eq!(d.query.to_string(), r#"SELECT "t"."__blobhouse_row_id" FROM "blobhouse_dml"."t" AS "t" WHERE a IN (SELECT a FROM t WHERE b > 1)"#);
        let u = rewritten("UPDATE t AS x SET b = b + 1 WHERE x.a = 3").unwrap().unwrap();
        assert_eq!(u.kind, DmlKind::Update);
        assert_eq!(u.query.to_string(), r#"SELECT "x"."__blobhouse_row_id", "x"."a" AS "__v0", (b + 1) AS "__v1" FROM "blobhouse_dml"."t" AS "x" WHERE x.a = 3"#);
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
