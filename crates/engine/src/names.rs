//! Output column names as PostgreSQL gives them: two columns of a result
//! may have the same name.
//!
//! `SELECT 1, 1`, `SELECT a, a FROM t` and `SELECT x AS v, y AS v` are
//! valid SQL that ORMs and BI tools generate, but DataFusion's planner
//! requires unique names within a projection. The top-level SELECT's
//! repeated items are therefore planned under unique internal aliases, and
//! the result's columns get their names back afterwards — Arrow schemas
//! allow repeated names, only the planner does not. Nothing else about the
//! statement changes.

use std::sync::Arc;

use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{Expr, Ident, SelectItem, SetExpr, Statement};

/// The prefix of the internal aliases (never a name a user writes).
const PREFIX: &str = "__blobhouse_repeated_";

/// What [`plan_unique`] renamed, to undo on the result.
#[derive(Debug, Default)]
pub(crate) struct Renames {
    /// (internal alias, the name to give back); `None`: the planner's own
    /// name for the first item with the same expression, at `first`.
    renamed: Vec<(String, Option<String>, usize)>,
}

impl Renames {
    /// Whether nothing was renamed.
    pub(crate) fn is_empty(&self) -> bool {
        self.renamed.is_empty()
    }

    /// `schema` with the repeated names back.
    pub(crate) fn schema(&self, schema: &SchemaRef) -> SchemaRef {
        if self.is_empty() {
            return schema.clone();
        }
        let fields: Vec<Field> = schema
            .fields()
            .iter()
            .map(|f| match self.renamed.iter().find(|(alias, _, _)| alias == f.name()) {
                Some((_, Some(name), _)) => f.as_ref().clone().with_name(name.clone()),
                Some((_, None, first)) => f.as_ref().clone().with_name(schema.fields().get(*first).map_or_else(|| f.name().clone(), |g| g.name().clone())),
                None => f.as_ref().clone(),
            })
            .collect();
        Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
    }

    /// `batches` under [`Renames::schema`]; the columns are shared, not copied.
    pub(crate) fn batches(&self, schema: &SchemaRef, batches: Vec<RecordBatch>) -> Vec<RecordBatch> {
        if self.is_empty() {
            return batches;
        }
        batches.into_iter().map(|b| RecordBatch::try_new(schema.clone(), b.columns().to_vec()).unwrap_or(b)).collect()
    }
}

/// Gives the repeated items of `statement`'s top-level SELECT unique
/// internal aliases; what it returns puts the names back.
pub(crate) fn plan_unique(statement: &mut DFStatement) -> Renames {
    let mut renames = Renames::default();
    let DFStatement::Statement(s) = statement else { return renames };
    let Statement::Query(query) = s.as_mut() else { return renames };
    let SetExpr::Select(select) = query.body.as_mut() else { return renames };
    // Wildcards expand to columns whose names are not known here, and
    // shift positions: items after one are compared by name only.
    let mut seen: Vec<(String, Option<String>, Option<usize>)> = Vec::new();
    let mut wildcard_before = false;
    for (i, item) in select.projection.iter_mut().enumerate() {
        let (key, name, expr) = match item {
            SelectItem::UnnamedExpr(e) => {
                let (key, name) = match &*e {
                    Expr::Identifier(id) => (normal(id), Some(normal(id))),
                    Expr::CompoundIdentifier(parts) => match parts.last() {
                        Some(last) => (normal(last), Some(normal(last))),
                        None => continue,
                    },
                    other => (format!("expr:{other}"), None),
                };
                (key, name, e.clone())
            }
            SelectItem::ExprWithAlias { alias, expr } => (normal(alias), Some(normal(alias)), expr.clone()),
            _ => {
                wildcard_before = true;
                continue;
            }
        };
        let position = (!wildcard_before).then_some(i);
        match seen.iter().find(|(k, _, _)| *k == key) {
            Some((_, first_name, first_at)) => {
                let alias = format!("{PREFIX}{i}");
                let back = match (name.clone().or_else(|| first_name.clone()), first_at) {
                    (Some(n), _) => (Some(n), 0),
                    (None, Some(at)) => (None, *at),
                    (None, None) => (Some(expr.to_string()), 0),
                };
                renames.renamed.push((alias.clone(), back.0, back.1));
                *item = SelectItem::ExprWithAlias { expr, alias: Ident::new(alias) };
            }
            None => seen.push((key, name, position)),
        }
    }
    renames
}

/// An identifier as the planner resolves it: unquoted ones fold to lower case.
fn normal(id: &Ident) -> String {
    if id.quote_style.is_some() { id.value.clone() } else { id.value.to_lowercase() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::sql::parser::DFParser;

    fn renamed(sql: &str) -> (String, Renames) {
        let mut statement = DFParser::parse_sql(sql).expect("parses").pop_front().expect("one statement");
        let renames = plan_unique(&mut statement);
        (statement.to_string(), renames)
    }

    #[test]
    fn only_repeated_items_are_aliased() {
        let (sql, r) = renamed("SELECT 1, 1, a, t.a, b AS v, c AS V FROM t");
        assert!(sql.contains("1 AS __blobhouse_repeated_1") && sql.contains("t.a AS __blobhouse_repeated_3") && sql.contains("c AS __blobhouse_repeated_5"), "{sql}");
        assert!(sql.starts_with("SELECT 1, 1 AS") && sql.contains(", a, "), "{sql}");
        let schema: SchemaRef = Arc::new(Schema::new(
            ["Int64(1)", "__blobhouse_repeated_1", "a", "__blobhouse_repeated_3", "v", "__blobhouse_repeated_5"]
                .iter()
                .map(|n| Field::new(*n, datafusion::arrow::datatypes::DataType::Int64, false))
                .collect::<Vec<_>>(),
        ));
        let back: Vec<String> = r.schema(&schema).fields().iter().map(|f| f.name().clone()).collect();
        assert_eq!(back, ["Int64(1)", "Int64(1)", "a", "a", "v", "v"]);
        let (sql, r) = renamed("SELECT a, b FROM t");
        assert!(r.is_empty() && sql == "SELECT a, b FROM t", "{sql}");
        let (_, r) = renamed("INSERT INTO t SELECT 1, 1");
        assert!(r.is_empty());
    }
}
