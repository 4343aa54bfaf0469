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
    let ctx = engine.base_context();
    let catalog = ctx.state().config().options().catalog.default_catalog.clone();
    datafusion_pg_catalog::pg_catalog::setup_pg_catalog(ctx, &catalog, Roles(users)).map_err(|e| ServerError::Catalog(e.to_string()))?;
    crate::functions::register(ctx);
    ctx.register_udf(column_typmod(engine.database().clone()));
    Ok(())
}

/// `pg_column_typmod(table, column, fallback)`: PostgreSQL's type
/// modifier of a table's column — `((precision << 16) | scale) + 4` for a
/// DECIMAL, from the newest version's schema — else `fallback` (see
/// [`column_typmods`]).
fn column_typmod(db: Arc<blobhouse_storage::Database>) -> datafusion::logical_expr::ScalarUDF {
    use datafusion::arrow::array::{Array, AsArray, Int32Array};
    use datafusion::arrow::datatypes::{DataType, Int32Type};
    use datafusion::logical_expr::{ColumnarValue, ScalarFunctionImplementation, Volatility, create_udf};
    let answer: ScalarFunctionImplementation = Arc::new(move |args| {
        let rows = args.iter().find_map(|a| match a {
            ColumnarValue::Array(a) => Some(a.len()),
            ColumnarValue::Scalar(_) => None,
        });
        let arrays = ColumnarValue::values_to_arrays(args)?;
        let text = |i: usize| datafusion::arrow::compute::cast(&arrays[i], &DataType::Utf8);
        let (tables, columns) = (text(0)?, text(1)?);
        let fallback = datafusion::arrow::compute::cast(&arrays[2], &DataType::Int32)?;
        let (tables, columns, fallback) = (tables.as_string::<i32>(), columns.as_string::<i32>(), fallback.as_primitive::<Int32Type>());
        let version = db.current();
        let out: Int32Array = (0..tables.len())
            .map(|i| {
                let declared = (tables.is_valid(i) && columns.is_valid(i))
                    .then(|| version.tables.get(tables.value(i)))
                    .flatten()
                    .and_then(|t| t.schema.fields().iter().find(|f| f.name() == columns.value(i)).map(|f| f.data_type().clone()));
                match declared {
                    Some(DataType::Decimal128(p, s) | DataType::Decimal256(p, s)) if s >= 0 => Some(((i32::from(p) << 16) | i32::from(s as u8)) + 4),
                    _ => fallback.is_valid(i).then(|| fallback.value(i)),
                }
            })
            .collect();
        Ok(match rows {
            Some(_) => ColumnarValue::Array(Arc::new(out)),
            None => ColumnarValue::Scalar(datafusion::scalar::ScalarValue::try_from_array(&out, 0)?),
        })
    });
    create_udf("pg_column_typmod", vec![DataType::Utf8, DataType::Utf8, DataType::Int32], DataType::Int32, Volatility::Stable, answer)
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
    use datafusion::sql::sqlparser::ast::{AccessExpr, Expr, FunctionArg, FunctionArgExpr, FunctionArguments, Ident, Subscript, visit_expressions_mut};
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
    // PostgreSQL's int2vector columns count from 0, its arrays (conkey,
    // confkey) from 1, as DataFusion's lists do.
    let from_zero = |e: &Expr| {
        let last = match e {
            Expr::Identifier(i) => Some(&i.value),
            Expr::CompoundIdentifier(parts) => parts.last().map(|i| &i.value),
            _ => None,
        };
        // (`i_indoption`: pgjdbc's getIndexInfo subscripts indoption under that alias.)
        last.is_some_and(|name| ["indkey", "indclass", "indoption", "indcollation", "i_indoption"].iter().any(|v| name.eq_ignore_ascii_case(v)))
    };
    let _ = visit_expressions_mut(statement, |e| {
        // `con.conkey[pos.n]` (the column, then a subscript): an element
        // of the list the text holds.
        if let Expr::CompoundFieldAccess { root, access_chain } = e
            && let Some(at) = access_chain.iter().position(|a| matches!(a, AccessExpr::Subscript(_)))
            && let AccessExpr::Subscript(Subscript::Index { index }) = &access_chain[at]
            && access_chain[..at].iter().all(|a| matches!(a, AccessExpr::Dot(Expr::Identifier(_))))
        {
            let mut parts: Vec<Ident> = match root.as_ref() {
                Expr::Identifier(i) => vec![i.clone()],
                Expr::CompoundIdentifier(p) => p.clone(),
                _ => Vec::new(),
            };
            parts.extend(access_chain[..at].iter().filter_map(|a| match a {
                AccessExpr::Dot(Expr::Identifier(i)) => Some(i.clone()),
                _ => None,
            }));
            let column = Expr::CompoundIdentifier(parts);
            if !parts_are_empty(&column) && (vector(&column) || from_zero(&column)) {
                let index = if from_zero(&column) { format!("({index}) + 1") } else { index.to_string() };
                let rest: String = access_chain[at + 1..].iter().map(ToString::to_string).collect();
                if let Ok(new) = Parser::new(&PostgreSqlDialect {}).try_with_sql(&format!("pg_int_vector({column})[{index}]{rest}")).and_then(|mut p| p.parse_expr()) {
                    *e = new;
                }
            }
            return std::ops::ControlFlow::<()>::Continue(());
        }
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

/// Whether `e` is a compound identifier with no parts.
fn parts_are_empty(e: &datafusion::sql::sqlparser::ast::Expr) -> bool {
    matches!(e, datafusion::sql::sqlparser::ast::Expr::CompoundIdentifier(p) if p.is_empty())
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

/// `'pg_catalog.array_in'::regproc` becomes `'array_in'`: the catalog
/// keeps `pg_type.typinput` and the other procedure columns as names, not
/// as the oids PostgreSQL's regproc casts produce (pgjdbc's type cache
/// asks `typinput='pg_catalog.array_in'::regproc` for every array type).
fn regproc_literals(sql: &str) -> Cow<'_, str> {
    const CAST: &str = "::regproc";
    if !sql.to_ascii_lowercase().contains(CAST) {
        return Cow::Borrowed(sql);
    }
    let mut out = String::with_capacity(sql.len());
    let mut rest = sql;
    while let Some(at) = rest.to_ascii_lowercase().find(CAST) {
        let (before, after) = rest.split_at(at);
        // The literal just before the cast: '…'
        match before.strip_suffix('\'').and_then(|b| b.rfind('\'').map(|open| (open, &b[open + 1..]))) {
            Some((open, name)) if !name.contains('\'') => {
                let name = name.strip_prefix("pg_catalog.").unwrap_or(name);
                out.push_str(&before[..open]);
                out.push_str(&format!("'{name}'"));
            }
            _ => {
                out.push_str(before);
                out.push_str(&after[..CAST.len()]);
            }
        }
        rest = &after[CAST.len()..];
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// `information_schema._pg_expandarray(a)` (PostgreSQL's set-returning
/// function of an array's elements `x` and their positions `n`, which
/// pgjdbc's getPrimaryKeys and getIndexInfo select) becomes unnests:
/// `(… ).n` the positions, `(… ).x` and the bare call the elements, and a
/// later `(alias).x` of a bare call's alias the alias itself. The catalog
/// holds these arrays as text, read by `pg_int_vector`.
fn expanded_arrays(statement: &mut datafusion::sql::sqlparser::ast::Statement) {
    use datafusion::sql::sqlparser::ast::{AccessExpr, Expr, FunctionArg, FunctionArgExpr, FunctionArguments, SelectItem, visit_expressions_mut};
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::parser::Parser;
    if !statement.to_string().to_ascii_lowercase().contains("_pg_expandarray") {
        return;
    }
    fn only_argument<'a>(e: &'a Expr, name: &str) -> Option<&'a Expr> {
        let Expr::Function(f) = e else { return None };
        if !f.name.0.last().is_some_and(|p| p.to_string().eq_ignore_ascii_case(name)) {
            return None;
        }
        let FunctionArguments::List(list) = &f.args else { return None };
        match list.args.as_slice() {
            [FunctionArg::Unnamed(FunctionArgExpr::Expr(a))] => Some(a),
            _ => None,
        }
    }
    // The call, or what it became already: the expression visitor sees
    // `(_pg_expandarray(a)).n`'s inner call before the field access.
    let argument = |e: &Expr| -> Option<String> {
        only_argument(e, "_pg_expandarray")
            .or_else(|| only_argument(e, "unnest").and_then(|inner| only_argument(inner, "pg_int_vector")))
            .map(ToString::to_string)
    };
    let parse = |sql: String| Parser::new(&PostgreSqlDialect {}).try_with_sql(&sql).and_then(|mut p| p.parse_expr()).ok();
    // Aliases of bare calls, whose `(alias).x` is the element itself.
    struct Aliases(Vec<String>, fn(&Expr) -> bool);
    impl datafusion::sql::sqlparser::ast::Visitor for Aliases {
        type Break = ();
        fn pre_visit_query(&mut self, query: &datafusion::sql::sqlparser::ast::Query) -> std::ops::ControlFlow<()> {
            if let datafusion::sql::sqlparser::ast::SetExpr::Select(select) = query.body.as_ref() {
                for item in &select.projection {
                    if let SelectItem::ExprWithAlias { expr, alias } = item
                        && (self.1)(expr)
                    {
                        self.0.push(alias.value.to_lowercase());
                    }
                }
            }
            std::ops::ControlFlow::Continue(())
        }
    }
    fn is_call(e: &Expr) -> bool {
        matches!(e, Expr::Function(f) if f.name.0.last().is_some_and(|p| p.to_string().eq_ignore_ascii_case("_pg_expandarray")))
    }
    let mut aliases = Aliases(Vec::new(), is_call);
    let _ = datafusion::sql::sqlparser::ast::Visit::visit(&*statement, &mut aliases);
    let aliases = aliases.0;
    let _ = visit_expressions_mut(statement, |e| {
        let replacement = match &*e {
            Expr::CompoundFieldAccess { root, access_chain } if access_chain.len() == 1 => {
                let field = match &access_chain[0] {
                    AccessExpr::Dot(Expr::Identifier(id)) => id.value.to_lowercase(),
                    _ => return std::ops::ControlFlow::<()>::Continue(()),
                };
                let inner = match root.as_ref() {
                    Expr::Nested(inner) => inner.as_ref(),
                    other => other,
                };
                match (argument(inner), field.as_str()) {
                    (Some(a), "n") => parse(format!("unnest(generate_series(1, CAST(cardinality(pg_int_vector({a})) AS BIGINT)))")),
                    (Some(a), "x") => parse(format!("unnest(pg_int_vector({a}))")),
                    (None, "x") => match inner {
                        Expr::Identifier(id) if aliases.contains(&id.value.to_lowercase()) => Some(inner.clone()),
                        Expr::CompoundIdentifier(parts) if parts.last().is_some_and(|p| aliases.contains(&p.value.to_lowercase())) => Some(inner.clone()),
                        _ => None,
                    },
                    _ => None,
                }
            }
            call => argument(call).and_then(|a| parse(format!("unnest(pg_int_vector({a}))"))),
        };
        if let Some(r) = replacement {
            *e = r;
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
}

/// `pg_settings` (which datafusion-pg-catalog fills with one parameter)
/// becomes the server's parameters with their default values: pgjdbc's
/// `getMaxIndexKeys` and the foreign-key calls need `max_index_keys`.
fn settings_table(statement: &mut datafusion::sql::sqlparser::ast::Statement) {
    use datafusion::sql::sqlparser::ast::{Ident, TableAlias, TableFactor, VisitMut, VisitorMut};
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::parser::Parser;
    struct Swap;
    impl VisitorMut for Swap {
        type Break = ();
        fn pre_visit_table_factor(&mut self, factor: &mut TableFactor) -> std::ops::ControlFlow<()> {
            if let TableFactor::Table { name, alias, .. } = factor
                && name.0.last().is_some_and(|p| p.to_string().eq_ignore_ascii_case("pg_settings"))
            {
                let quoted = |s: &str| format!("'{}'", s.replace('\'', "''"));
                let rows: Vec<String> = blobhouse_engine::settings::session_defaults()
                    .into_iter()
                    .map(|(name, value, description)| format!("({}, {}, CAST(NULL AS TEXT), 'blobhouse', {}, 'user', 'string', 'default', {}, {})", quoted(name), quoted(&value), quoted(description), quoted(&value), quoted(&value)))
                    .collect();
                let sql = format!("SELECT * FROM (VALUES {}) AS s(name, setting, unit, category, short_desc, context, vartype, source, boot_val, reset_val)", rows.join(", "));
                if let Ok(subquery) = Parser::new(&PostgreSqlDialect {}).try_with_sql(&sql).and_then(|mut p| p.parse_query()) {
                    let alias = alias.clone().unwrap_or(TableAlias { explicit: true, name: Ident::new("pg_settings"), columns: Vec::new(), at: None });
                    *factor = TableFactor::Derived { lateral: false, subquery, alias: Some(alias), sample: None };
                }
            }
            std::ops::ControlFlow::Continue(())
        }
    }
    let _ = statement.visit(&mut Swap);
}

/// `a.atttypmod` of a query joining `pg_attribute a` with `pg_class c`
/// becomes `pg_column_typmod(c.relname, a.attname, a.atttypmod)`: the
/// catalog has no type modifiers, and a DECIMAL's precision and scale are
/// read from them (pgjdbc's getColumns, SQLAlchemy's reflection).
fn column_typmods(statement: &mut datafusion::sql::sqlparser::ast::Statement) {
    use datafusion::sql::sqlparser::ast::{Expr, Select, TableFactor, VisitMut, VisitorMut, visit_expressions_mut};
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::parser::Parser;
    struct Typmods;
    impl VisitorMut for Typmods {
        type Break = ();
        fn pre_visit_select(&mut self, select: &mut Select) -> std::ops::ControlFlow<()> {
            let (mut attribute, mut class) = (None, None);
            for from in &select.from {
                for factor in std::iter::once(&from.relation).chain(from.joins.iter().map(|j| &j.relation)) {
                    if let TableFactor::Table { name, alias, .. } = factor {
                        let last = name.0.last().map(|p| p.to_string().to_lowercase()).unwrap_or_default();
                        let called = alias.as_ref().map_or_else(|| name.to_string(), |a| a.name.value.clone());
                        match last.as_str() {
                            "pg_attribute" => attribute = Some(called),
                            "pg_class" if class.is_none() => class = Some(called),
                            _ => {}
                        }
                    }
                }
            }
            let (Some(a), Some(c)) = (attribute, class) else { return std::ops::ControlFlow::Continue(()) };
            let _ = visit_expressions_mut(select, |e| {
                if let Expr::CompoundIdentifier(parts) = e
                    && parts.len() >= 2
                    && parts[parts.len() - 1].value.eq_ignore_ascii_case("atttypmod")
                    && parts[..parts.len() - 1].iter().map(|p| p.value.as_str()).collect::<Vec<_>>().join(".").eq_ignore_ascii_case(&a)
                    && let Ok(call) = Parser::new(&PostgreSqlDialect {}).try_with_sql(&format!("pg_column_typmod({c}.relname, {a}.attname, {e})")).and_then(|mut p| p.parse_expr())
                {
                    *e = call;
                }
                std::ops::ControlFlow::<()>::Continue(())
            });
            // In the select list the column keeps its name.
            for item in &mut select.projection {
                if let datafusion::sql::sqlparser::ast::SelectItem::UnnamedExpr(e @ Expr::Function(_)) = item
                    && e.to_string().starts_with("pg_column_typmod(")
                {
                    *item = datafusion::sql::sqlparser::ast::SelectItem::ExprWithAlias { expr: e.clone(), alias: datafusion::sql::sqlparser::ast::Ident::new("atttypmod") };
                }
            }
            std::ops::ControlFlow::Continue(())
        }
    }
    let _ = statement.visit(&mut Typmods);
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
        if !asks_the_catalog(sql) {
            return Cow::Borrowed(sql);
        }
        let sql = without_sequences(sql);
        let sql = regproc_literals(&sql);
        match self.parser.parse(&sql) {
            Ok(mut statements) if statements.len() == 1 => {
                like_escapes(&mut statements[0]);
                array_subqueries(&mut statements[0]);
                expanded_arrays(&mut statements[0]);
                vector_columns(&mut statements[0]);
                missing_columns(&mut statements[0]);
                settings_table(&mut statements[0]);
                column_typmods(&mut statements[0]);
                aggregate_scalar_subqueries(&mut statements[0]);
                Cow::Owned(statements[0].to_string())
            }
            // What the rewriter cannot parse goes to the engine as it is,
            // whose error then names the problem.
            _ => Cow::Owned(sql.into_owned()),
        }
    }
}

/// Whether `sql` reads PostgreSQL's catalog or calls what only it has.
fn asks_the_catalog(sql: &str) -> bool {
    let lower = sql.to_ascii_lowercase();
    ["pg_", "information_schema", "::reg", "to_regtype", "current_schema", "current_database", "current_catalog", "version()", "current_user", "session_user"]
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
        // No sequences: nothing to look up.
        let seq = without_sequences("SELECT (SELECT max(s.seqstart) FROM pg_catalog.pg_sequence s WHERE s.seqrelid = CAST(CAST(pg_catalog.pg_get_serial_sequence(CAST(CAST(a.attrelid AS REGCLASS) AS TEXT), a.attname) AS REGCLASS) AS OID)) FROM pg_catalog.pg_attribute a");
        assert_eq!(seq, "SELECT NULL FROM pg_catalog.pg_attribute a");
        // SQLAlchemy's LIKE … ESCAPE '/' is translated when it runs.
        let like = i.rewrite("SELECT nspname FROM pg_catalog.pg_namespace WHERE nspname NOT LIKE $1::VARCHAR || '%' ESCAPE '/'");
        assert!(like.contains("pg_like_pattern(") && !like.contains("ESCAPE"), "{like}");
        // psql's \du: an array of a correlated subquery's rows.
        let du = i.rewrite("SELECT r.rolname, ARRAY(SELECT b.rolname FROM pg_catalog.pg_auth_members m JOIN pg_catalog.pg_roles b ON (m.roleid = b.oid) WHERE m.member = r.oid) as memberof FROM pg_catalog.pg_roles r");
        assert!(du.contains("(SELECT array_agg(b.rolname) FROM") && !du.contains("ARRAY("), "{du}");
        // pgjdbc: current_catalog, regproc names, pg_settings, array subscripts, _pg_expandarray, typmods.
        assert!(i.rewrite("select current_catalog").contains("current_database()"));
        let types = i.rewrite("SELECT typinput='pg_catalog.array_in'::regproc as is_array, typname FROM pg_catalog.pg_type");
        assert!(types.contains("typinput = 'array_in'") && !types.contains("regproc"), "{types}");
        let settings = i.rewrite("SELECT setting FROM pg_catalog.pg_settings WHERE name='max_index_keys'");
        assert!(settings.contains("'max_index_keys', '32'") && settings.contains("AS pg_settings"), "{settings}");
        let fk = i.rewrite("SELECT pka.attname FROM pg_catalog.pg_attribute pka, pg_catalog.pg_constraint con WHERE pka.attnum = con.confkey[pos.n] AND pka.attnum = con.conkey[pos.n]");
        assert!(fk.contains("pg_int_vector(con.confkey)[pos.n]") && fk.contains("pg_int_vector(con.conkey)[pos.n]"), "{fk}");
        let index = i.rewrite("SELECT tmp.I_INDOPTION[tmp.ORDINAL_POSITION - 1] FROM (SELECT i.indoption AS I_INDOPTION, 1 AS ORDINAL_POSITION FROM pg_catalog.pg_index i) tmp");
        assert!(index.contains("pg_int_vector(tmp.I_INDOPTION)[(tmp.ORDINAL_POSITION - 1) + 1]"), "int2vectors count from 0: {index}");
        let keys = i.rewrite("SELECT result.COLUMN_NAME FROM (SELECT a.attname AS COLUMN_NAME, (information_schema._pg_expandarray(con.conkey)).n AS KEY_SEQ, information_schema._pg_expandarray(con.conkey) AS KEYS, a.attnum AS A_ATTNUM FROM pg_catalog.pg_constraint con JOIN pg_catalog.pg_attribute a ON (a.attrelid = con.conrelid)) result WHERE result.A_ATTNUM = (result.KEYS).x");
        assert!(!keys.contains("_pg_expandarray") && keys.contains("unnest(pg_int_vector(con.conkey)) AS KEYS") && keys.contains("result.A_ATTNUM = result.KEYS"), "{keys}");
        let pk = i.rewrite(r#"SELECT        result.TABLE_CAT AS "TABLE_CAT",        result.TABLE_SCHEM AS "TABLE_SCHEM",        result.TABLE_NAME AS "TABLE_NAME",        result.COLUMN_NAME AS "COLUMN_NAME",        result.KEY_SEQ AS "KEY_SEQ",        result.PK_NAME AS "PK_NAME"FROM      (SELECT current_database() AS TABLE_CAT, n.nspname AS TABLE_SCHEM,   ct.relname AS TABLE_NAME, a.attname AS COLUMN_NAME,   (information_schema._pg_expandarray(con.conkey)).n AS KEY_SEQ, con.conname AS PK_NAME,   information_schema._pg_expandarray(con.conkey) AS KEYS, a.attnum AS A_ATTNUM FROM pg_catalog.pg_constraint con   JOIN pg_catalog.pg_class ct ON (con.conrelid = ct.oid)   JOIN pg_catalog.pg_namespace n ON (ct.relnamespace = n.oid)   JOIN pg_catalog.pg_attribute a ON (a.attrelid = ct.oid) WHERE con.contype = 'p'  AND n.nspname = $1 AND ct.relname = $2 ) result where  result.A_ATTNUM = (result.KEYS).x  ORDER BY result.table_name, result.pk_name, result.key_seq"#);
        assert!(!pk.contains("_pg_expandarray") && !pk.contains(".x") && !pk.contains(").n"), "pgjdbc's getPrimaryKeys: {pk}");
        let columns = i.rewrite("SELECT a.attname, a.atttypmod FROM pg_catalog.pg_namespace n JOIN pg_catalog.pg_class c ON (c.relnamespace = n.oid) JOIN pg_catalog.pg_attribute a ON (a.attrelid = c.oid)");
        assert!(columns.contains("pg_column_typmod(c.relname, a.attname, a.atttypmod) AS atttypmod"), "{columns}");
        // SQLAlchemy's key reflection: catalog column lists unnested with their positions.
        let keys = i.rewrite("SELECT unnest(pg_catalog.pg_index.indkey) AS attnum, generate_subscripts(pg_catalog.pg_index.indkey, 1) AS ord FROM pg_catalog.pg_index");
        assert!(keys.contains("unnest(pg_int_vector(pg_catalog.pg_index.indkey))") && keys.contains("unnest(generate_series(1,") && !keys.contains("generate_subscripts"), "{keys}");
    }
}
