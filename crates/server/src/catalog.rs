//! PostgreSQL's system catalog over blobhouse's tables, for clients that
//! introspect: psql's `\d`, `\dt`, `\l`, `\du`, SQLAlchemy's inspector,
//! JDBC's `DatabaseMetaData`.
//!
//! These clients do not ask for tables the SQL way; they query
//! `pg_catalog.pg_class`, `pg_attribute`, `pg_namespace` … with PostgreSQL's
//! own functions and dialect (`OPERATOR(pg_catalog.~)`, `'t'::regclass`,
//! `= ANY(ARRAY[…])`). datafusion-pg-catalog provides those tables (built
//! from the DataFusion catalog the engine's statements see), the functions
//! and a rewriter for the dialect; this module installs them on the engine's
//! base context and decides which statements go through the rewriter —
//! only introspection, so that blobhouse's own syntax (time travel, COPY,
//! OPTIMIZE, snapshots) never meets a rewriter that does not know it.

use std::borrow::Cow;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion_pg_catalog::pg_catalog::context::{PgCatalogContextProvider, Role};
use datafusion_pg_catalog::sql::PostgresCompatibilityParser;

use blobhouse_engine::Engine;

use crate::ServerError;
use crate::auth::Users;

/// The users of the server, as `pg_roles` lists them (`\du`).
#[derive(Debug, Clone)]
struct Roles(Arc<Users>);

#[async_trait]
impl PgCatalogContextProvider for Roles {
    async fn roles(&self) -> Vec<String> {
        self.0.names()
    }

    async fn role(&self, name: &str) -> Option<Role> {
        self.0.names().into_iter().find(|n| n == name).map(|name| Role {
            name,
            // Every user may read and change every table: there are no
            // grants yet, so each is shown as what it is, a superuser.
            is_superuser: true,
            can_login: true,
            can_create_db: false,
            can_create_role: false,
            can_create_user: false,
            can_replication: false,
            grants: Vec::new(),
            inherited_roles: Vec::new(),
        })
    }
}

/// Installs `pg_catalog` and PostgreSQL's catalog functions on `engine`'s
/// base context; sessions opened afterwards see them.
pub(crate) fn install(engine: &Engine, users: Arc<Users>) -> Result<(), ServerError> {
    let ctx = engine.session();
    let catalog = ctx.state().config().options().catalog.default_catalog.clone();
    datafusion_pg_catalog::pg_catalog::setup_pg_catalog(ctx, &catalog, Roles(users)).map_err(|e| ServerError::Catalog(e.to_string()))?;
    crate::functions::register(ctx, PARAMETERS);
    Ok(())
}

/// `pg_get_serial_sequence(…)` replaced by NULL, which is what it returns
/// (blobhouse has no sequences), before the catalog rewriter turns its
/// `::regclass` into a lookup: SQLAlchemy correlates that lookup with the
/// column it describes, a subquery inside a subquery that DataFusion
/// cannot plan, while a NULL needs no lookup at all.
fn without_sequences(sql: &str) -> Cow<'_, str> {
    use datafusion::sql::sqlparser::ast::{Expr, Value, visit_expressions_mut};
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::parser::Parser;
    if !sql.to_ascii_lowercase().contains("pg_get_serial_sequence") {
        return Cow::Borrowed(sql);
    }
    let Ok(mut statements) = Parser::parse_sql(&PostgreSqlDialect {}, sql) else { return Cow::Borrowed(sql) };
    let _ = visit_expressions_mut(&mut statements, |e| {
        if let Expr::Function(f) = e
            && f.name.0.last().is_some_and(|part| part.to_string().eq_ignore_ascii_case("pg_get_serial_sequence"))
        {
            *e = Expr::value(Value::Null);
        }
        // A subquery that then compares with NULL in its WHERE selects no
        // row: its value is NULL.
        if let Expr::Subquery(query) = e
            && let datafusion::sql::sqlparser::ast::SetExpr::Select(select) = query.body.as_ref()
            && select.selection.clone().map(conjuncts).unwrap_or_default().iter().any(|c| matches!(c, Expr::BinaryOp { left, op: datafusion::sql::sqlparser::ast::BinaryOperator::Eq, right } if is_null(left) || is_null(right)))
        {
            *e = Expr::value(Value::Null);
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
    Cow::Owned(statements.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))
}

/// `(SELECT e FROM … WHERE …)` used as a value becomes `(SELECT max(e) …)`.
/// Introspection queries look one row up by oid this way (SQLAlchemy's
/// column types, defaults, collations); DataFusion plans a correlated
/// scalar subquery only when it is aggregated. Where PostgreSQL would
/// fail on a second row this answers with the largest — it is applied to
/// catalog queries only, whose lookups are by key.
fn aggregate_scalar_subqueries(statement: &mut datafusion::sql::sqlparser::ast::Statement) {
    use datafusion::sql::sqlparser::ast::{Expr, SelectItem, SetExpr, visit_expressions_mut};
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::parser::Parser;
    const AGGREGATES: &[&str] = &["max", "min", "sum", "count", "avg", "array_agg", "string_agg", "bool_and", "bool_or", "json_agg"];
    let _ = visit_expressions_mut(statement, |e| {
        if let Expr::Subquery(query) = e
            && let SetExpr::Select(select) = query.body.as_mut()
            && select.projection.len() == 1
            && matches!(&select.group_by, datafusion::sql::sqlparser::ast::GroupByExpr::Expressions(g, _) if g.is_empty())
            && let SelectItem::UnnamedExpr(item) | SelectItem::ExprWithAlias { expr: item, .. } = &mut select.projection[0]
            && !matches!(&*item, Expr::Function(f) if AGGREGATES.iter().any(|a| f.name.to_string().eq_ignore_ascii_case(a)))
            && let Ok(wrapped) = Parser::new(&PostgreSqlDialect {}).try_with_sql(&format!("max({item})")).and_then(|mut p| p.parse_expr())
        {
            *item = wrapped;
        }
        // Conditions on the outer row alone (SQLAlchemy repeats its CASE
        // condition inside the subquery) leave nothing DataFusion can
        // decorrelate on: they move out, into a CASE around the subquery.
        if let Expr::Subquery(query) = e
            && let SetExpr::Select(select) = query.body.as_mut()
            && let Some(selection) = select.selection.take()
        {
            let inner = relations(select);
            let (outer, own): (Vec<Expr>, Vec<Expr>) = conjuncts(selection).into_iter().partition(|c| outer_only(c, &inner));
            select.selection = own.into_iter().reduce(|a, b| Expr::BinaryOp { left: Box::new(a), op: datafusion::sql::sqlparser::ast::BinaryOperator::And, right: Box::new(b) });
            if !outer.is_empty() {
                let condition = outer.iter().map(|c| format!("({c})")).collect::<Vec<_>>().join(" AND ");
                if let Ok(case) = Parser::new(&PostgreSqlDialect {}).try_with_sql(&format!("CASE WHEN {condition} THEN {e} ELSE NULL END")).and_then(|mut p| p.parse_expr()) {
                    *e = case;
                }
            }
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
}

/// `ARRAY(SELECT e FROM …)` becomes `(SELECT array_agg(e) FROM …)`:
/// PostgreSQL's array constructor over a subquery (psql's `\du` lists each
/// role's memberships so), which DataFusion does not have, as the
/// aggregate it is. No rows give NULL rather than an empty array.
fn array_subqueries(statement: &mut datafusion::sql::sqlparser::ast::Statement) {
    use datafusion::sql::sqlparser::ast::{Expr, FunctionArguments, SelectItem, SetExpr, visit_expressions_mut};
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::parser::Parser;
    let _ = visit_expressions_mut(statement, |e| {
        if let Expr::Function(f) = e
            && f.name.to_string().eq_ignore_ascii_case("array")
            && let FunctionArguments::Subquery(query) = &f.args
        {
            let mut query = query.clone();
            if let SetExpr::Select(select) = query.body.as_mut()
                && select.projection.len() == 1
                && let SelectItem::UnnamedExpr(item) | SelectItem::ExprWithAlias { expr: item, .. } = &mut select.projection[0]
                && let Ok(aggregated) = Parser::new(&PostgreSqlDialect {}).try_with_sql(&format!("array_agg({item})")).and_then(|mut p| p.parse_expr())
            {
                *item = aggregated;
                *e = Expr::Subquery(query);
            }
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
}

/// `unnest(x.indkey)` becomes `unnest(pg_int_vector(x.indkey))` (also for
/// `indclass`, `indoption`, `indcollation`, `conkey`, `confkey`), and `generate_subscripts(x.indkey, 1)` the
/// positions `1 …` of the same array: the catalog holds these column lists
/// as text, and DataFusion has no `generate_subscripts`. SQLAlchemy's
/// key, constraint and index reflection asks so.
fn vector_columns(statement: &mut datafusion::sql::sqlparser::ast::Statement) {
    use datafusion::sql::sqlparser::ast::{Expr, FunctionArg, FunctionArgExpr, FunctionArguments, visit_expressions_mut};
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::parser::Parser;
    const VECTORS: &[&str] = &["indkey", "indclass", "indoption", "indcollation", "conkey", "confkey"];
    let vector = |e: &Expr| {
        let last = match e {
            Expr::Identifier(i) => Some(&i.value),
            Expr::CompoundIdentifier(parts) => parts.last().map(|i| &i.value),
            _ => None,
        };
        last.is_some_and(|name| VECTORS.iter().any(|v| name.eq_ignore_ascii_case(v)))
    };
    let _ = visit_expressions_mut(statement, |e| {
        if let Expr::Function(f) = e
            && let FunctionArguments::List(list) = &f.args
            && let Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(first))) = list.args.first()
            && vector(first)
        {
            let name = f.name.to_string().to_ascii_lowercase();
            let rewritten = match (name.as_str(), list.args.len()) {
                ("unnest", 1) => Some(format!("unnest(pg_int_vector({first}))")),
                ("generate_subscripts", 2) => Some(format!("unnest(generate_series(1, CAST(cardinality(pg_int_vector({first})) AS BIGINT)))")),
                _ => None,
            };
            if let Some(Ok(new)) = rewritten.map(|sql| Parser::new(&PostgreSqlDialect {}).try_with_sql(&sql).and_then(|mut p| p.parse_expr())) {
                *e = new;
            }
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
}

/// `pg_class.reloptions` (storage options, which blobhouse tables do not
/// have and datafusion-pg-catalog's `pg_class` lacks) becomes NULL, keeping
/// its name in a select list. SQLAlchemy's index reflection reads it.
fn missing_columns(statement: &mut datafusion::sql::sqlparser::ast::Statement) {
    use datafusion::sql::sqlparser::ast::{Expr, Ident, SelectItem, visit_expressions_mut};
    use datafusion::sql::sqlparser::ast::VisitMut;
    let missing = |e: &Expr| match e {
        Expr::CompoundIdentifier(parts) if parts.len() >= 2 => {
            let n = parts.len();
            parts[n - 1].value.eq_ignore_ascii_case("reloptions") && parts[n - 2].value.eq_ignore_ascii_case("pg_class")
        }
        _ => false,
    };
    // Named in a select list: `NULL AS reloptions`.
    struct Named<F>(F);
    impl<F: Fn(&Expr) -> bool> datafusion::sql::sqlparser::ast::VisitorMut for Named<F> {
        type Break = ();
        fn post_visit_select(&mut self, select: &mut datafusion::sql::sqlparser::ast::Select) -> std::ops::ControlFlow<()> {
            for item in &mut select.projection {
                if let SelectItem::UnnamedExpr(e) = item
                    && (self.0)(e)
                {
                    *item = SelectItem::ExprWithAlias { expr: Expr::Value(datafusion::sql::sqlparser::ast::Value::Null.into()), alias: Ident::new("reloptions") };
                }
            }
            std::ops::ControlFlow::Continue(())
        }
    }
    let _ = statement.visit(&mut Named(missing));
    let _ = visit_expressions_mut(statement, |e| {
        if missing(e) {
            *e = Expr::Value(datafusion::sql::sqlparser::ast::Value::Null.into());
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
}

/// The names a SELECT's FROM clause gives its relations (aliases, full
/// and last-part names), lower case.
fn relations(select: &datafusion::sql::sqlparser::ast::Select) -> Vec<String> {
    use datafusion::sql::sqlparser::ast::TableFactor;
    let mut names = Vec::new();
    for from in &select.from {
        for factor in std::iter::once(&from.relation).chain(from.joins.iter().map(|j| &j.relation)) {
            if let TableFactor::Table { name, alias, .. } = factor {
                names.push(name.to_string().to_lowercase());
                if let Some(last) = name.0.last() {
                    names.push(last.to_string().to_lowercase());
                }
                if let Some(alias) = alias {
                    names.push(alias.name.value.to_lowercase());
                }
            }
        }
    }
    names
}

/// Whether `e` is NULL, perhaps cast.
fn is_null(e: &datafusion::sql::sqlparser::ast::Expr) -> bool {
    use datafusion::sql::sqlparser::ast::{Expr, Value};
    match e {
        Expr::Value(v) => v.value == Value::Null,
        Expr::Cast { expr, .. } | Expr::Nested(expr) => is_null(expr),
        _ => false,
    }
}

/// `a AND b AND c` as `[a, b, c]`.
fn conjuncts(e: datafusion::sql::sqlparser::ast::Expr) -> Vec<datafusion::sql::sqlparser::ast::Expr> {
    use datafusion::sql::sqlparser::ast::{BinaryOperator, Expr};
    match e {
        Expr::BinaryOp { left, op: BinaryOperator::And, right } => {
            let mut out = conjuncts(*left);
            out.extend(conjuncts(*right));
            out
        }
        Expr::Nested(inner) if matches!(*inner, Expr::BinaryOp { op: BinaryOperator::And, .. }) => conjuncts(*inner),
        other => vec![other],
    }
}

/// Whether `e` names columns, every one qualified by a relation not among
/// `inner` (and none unqualified, which could be either).
fn outer_only(e: &datafusion::sql::sqlparser::ast::Expr, inner: &[String]) -> bool {
    use datafusion::sql::sqlparser::ast::{Expr, visit_expressions};
    let (mut outer, mut other) = (0, 0);
    let _ = visit_expressions(e, |x| {
        match x {
            Expr::CompoundIdentifier(parts) if parts.len() >= 2 => {
                let qualifier = parts[..parts.len() - 1].iter().map(|p| p.value.as_str()).collect::<Vec<_>>().join(".").to_lowercase();
                let last = parts[parts.len() - 2].value.to_lowercase();
                if inner.contains(&qualifier) || inner.contains(&last) { other += 1 } else { outer += 1 }
            }
            Expr::Identifier(_) | Expr::Subquery(_) | Expr::Exists { .. } | Expr::InSubquery { .. } => other += 1,
            _ => {}
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
    outer > 0 && other == 0
}

/// `x LIKE p ESCAPE 'c'` with another escape than the backslash (what
/// SQLAlchemy writes, `ESCAPE '/'`) becomes `x LIKE pg_like_pattern(p, 'c')`:
/// DataFusion's LIKE escapes with the backslash only, and the pattern may
/// be a parameter bound later, so the translation happens when it runs.
fn like_escapes(statement: &mut datafusion::sql::sqlparser::ast::Statement) {
    use datafusion::sql::sqlparser::ast::{Expr, Value, visit_expressions_mut};
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::parser::Parser;
    let _ = visit_expressions_mut(statement, |e| {
        if let Expr::Like { pattern, escape_char, .. } | Expr::ILike { pattern, escape_char, .. } = e
            && let Some(escape) = escape_char.as_ref().filter(|c| !matches!(&c.value, Value::SingleQuotedString(s) if s == "\\"))
            && let Ok(call) = Parser::new(&PostgreSqlDialect {}).try_with_sql(&format!("pg_like_pattern({pattern}, {escape})")).and_then(|mut p| p.parse_expr())
        {
            *pattern = Box::new(call);
            *escape_char = None;
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
}

/// Rewrites an introspection query into SQL the engine runs.
pub(crate) struct Introspection {
    parser: PostgresCompatibilityParser,
}

impl Introspection {
    pub(crate) fn new() -> Introspection {
        Introspection { parser: PostgresCompatibilityParser::new() }
    }

    /// `sql` in the form DataFusion plans, when it asks PostgreSQL's
    /// catalog (or its functions); any other statement unchanged.
    pub(crate) fn rewrite<'a>(&self, sql: &'a str) -> Cow<'a, str> {
        if let Some(answer) = show_parameter(sql) {
            return Cow::Owned(answer);
        }
        if !asks_the_catalog(sql) {
            return Cow::Borrowed(sql);
        }
        let sql = without_sequences(sql);
        match self.parser.parse(&sql) {
            Ok(mut statements) if statements.len() == 1 => {
                like_escapes(&mut statements[0]);
                array_subqueries(&mut statements[0]);
                vector_columns(&mut statements[0]);
                missing_columns(&mut statements[0]);
                aggregate_scalar_subqueries(&mut statements[0]);
                Cow::Owned(statements[0].to_string())
            }
            // What the rewriter cannot parse goes to the engine as it is,
            // whose error then names the problem.
            _ => Cow::Owned(sql.into_owned()),
        }
    }
}

/// PostgreSQL's run-time parameters that drivers read on connecting
/// (`SHOW transaction isolation level` from SQLAlchemy, …), with the values
/// that describe blobhouse: its snapshot isolation is what PostgreSQL calls
/// REPEATABLE READ. Names as `SHOW` takes them, lower case.
const PARAMETERS: &[(&str, &str)] = &[
    ("transaction isolation level", "repeatable read"),
    ("transaction_isolation", "repeatable read"),
    ("default_transaction_isolation", "repeatable read"),
    ("transaction_read_only", "off"),
    ("default_transaction_read_only", "off"),
    ("standard_conforming_strings", "on"),
    ("server_version", "16.0"),
    ("server_version_num", "160000"),
    ("server_encoding", "UTF8"),
    ("client_encoding", "UTF8"),
    ("search_path", "public"),
    ("datestyle", "ISO, MDY"),
    ("timezone", "UTC"),
    ("integer_datetimes", "on"),
    ("max_identifier_length", "63"),
    ("default_table_access_method", "heap"),
];

/// `SHOW <parameter>` of one of [`PARAMETERS`], as a query that answers it
/// (the column named as PostgreSQL names it).
fn show_parameter(sql: &str) -> Option<String> {
    let words: Vec<String> = sql.trim().trim_end_matches(';').split_whitespace().map(str::to_ascii_lowercase).collect();
    let (first, rest) = words.split_first()?;
    if first != "show" {
        return None;
    }
    let name = rest.join(" ");
    let (_, value) = PARAMETERS.iter().find(|(n, _)| *n == name)?;
    let column = if name == "transaction isolation level" { "transaction_isolation" } else { name.as_str() };
    Some(format!("SELECT '{value}' AS {column}"))
}

/// Whether `sql` reads PostgreSQL's catalog or calls what only it has.
fn asks_the_catalog(sql: &str) -> bool {
    let lower = sql.to_ascii_lowercase();
    ["pg_", "information_schema", "::reg", "to_regtype", "current_schema", "current_database", "version()", "current_user", "session_user"]
        .iter()
        .any(|word| lower.contains(word))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_introspection_is_rewritten() {
        let i = Introspection::new();
        // blobhouse's own syntax never meets the rewriter.
        for sql in ["SELECT * FROM t AS OF VERSION 3", "COPY t FROM 'x.csv'", "OPTIMIZE t", "SELECT 'a''b' AS x"] {
            assert!(matches!(i.rewrite(sql), Cow::Borrowed(s) if s == sql), "{sql}");
        }
        // psql's `\d t` asks with an operator DataFusion does not parse.
        let psql = "SELECT c.oid FROM pg_catalog.pg_class c WHERE c.relname OPERATOR(pg_catalog.~) '^(t)$' COLLATE pg_catalog.default";
        let rewritten = i.rewrite(psql);
        assert!(!rewritten.contains("OPERATOR") && !rewritten.contains("COLLATE"), "{rewritten}");
        assert!(rewritten.contains("pg_catalog.pg_class"), "{rewritten}");
        // The parameters drivers read on connecting are answered; others are the engine's.
        assert_eq!(i.rewrite("show transaction isolation level"), "SELECT 'repeatable read' AS transaction_isolation");
        assert_eq!(i.rewrite("SHOW standard_conforming_strings;"), "SELECT 'on' AS standard_conforming_strings");
        assert!(matches!(i.rewrite("SHOW memory_limit"), Cow::Borrowed(_)));
        // No sequences: nothing to look up.
        let seq = without_sequences("SELECT (SELECT max(s.seqstart) FROM pg_catalog.pg_sequence s WHERE s.seqrelid = CAST(CAST(pg_catalog.pg_get_serial_sequence(CAST(CAST(a.attrelid AS REGCLASS) AS TEXT), a.attname) AS REGCLASS) AS OID)) FROM pg_catalog.pg_attribute a");
        assert_eq!(seq, "SELECT NULL FROM pg_catalog.pg_attribute a");
        // SQLAlchemy's LIKE … ESCAPE '/' is translated when it runs.
        let like = i.rewrite("SELECT nspname FROM pg_catalog.pg_namespace WHERE nspname NOT LIKE $1::VARCHAR || '%' ESCAPE '/'");
        assert!(like.contains("pg_like_pattern(") && !like.contains("ESCAPE"), "{like}");
        // psql's \du: an array of a correlated subquery's rows.
        let du = i.rewrite("SELECT r.rolname, ARRAY(SELECT b.rolname FROM pg_catalog.pg_auth_members m JOIN pg_catalog.pg_roles b ON (m.roleid = b.oid) WHERE m.member = r.oid) as memberof FROM pg_catalog.pg_roles r");
        assert!(du.contains("(SELECT array_agg(b.rolname) FROM") && !du.contains("ARRAY("), "{du}");
        // SQLAlchemy's key reflection: catalog column lists unnested with their positions.
        let keys = i.rewrite("SELECT unnest(pg_catalog.pg_index.indkey) AS attnum, generate_subscripts(pg_catalog.pg_index.indkey, 1) AS ord FROM pg_catalog.pg_index");
        assert!(keys.contains("unnest(pg_int_vector(pg_catalog.pg_index.indkey))") && keys.contains("unnest(generate_series(1,") && !keys.contains("generate_subscripts"), "{keys}");
    }
}
