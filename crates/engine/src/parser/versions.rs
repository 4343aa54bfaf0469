//! Version clauses in the tree: each `t AT(…)` becomes its past-version
//! schema under the name the statement gave the table
//! ([`crate::time_travel`] says why).

use std::ops::ControlFlow;

use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{Ident, ObjectName, ObjectNamePart, TableAlias, TableFactor, VisitMut, VisitorMut};

use super::{Parsed, Statement};
use crate::EngineError;
use crate::time_travel::{AsOf, FORMS, as_of};

/// Replaces every versioned table reference of the statement by its
/// past-version schema (see the module docs) and lists the points in time.
pub(super) fn resolve_versions(parsed: &mut Parsed) -> Result<(), EngineError> {
    let mut found = Found { past: Vec::new(), error: None };
    visit_tables(&mut parsed.statement, &mut found);
    if let Some(e) = found.error {
        return Err(EngineError::Unsupported(e));
    }
    parsed.past = found.past;
    Ok(())
}

/// Runs `visitor` over every table reference of a statement that reads
/// tables: queries and EXPLAIN, DELETE and UPDATE, `COPY (query) TO`.
pub(super) fn visit_tables<V: VisitorMut<Break = ()>>(statement: &mut Statement, visitor: &mut V) {
    match statement {
        Statement::Sql(s) => visit_df(s, visitor),
        Statement::Dml(s) => {
            let _ = s.visit(visitor);
        }
        Statement::CopyTo(copy) => {
            if let crate::copy::CopyQuery::Query(q) = &mut copy.query {
                let _ = q.visit(visitor);
            }
        }
        _ => {}
    }
}

fn visit_df<V: VisitorMut<Break = ()>>(s: &mut DFStatement, found: &mut V) {
    match s {
        DFStatement::Statement(s) => {
            let _ = s.visit(found);
        }
        DFStatement::Explain(e) => visit_df(&mut e.statement, found),
        _ => {}
    }
}

struct Found {
    past: Vec<AsOf>,
    error: Option<String>,
}

impl VisitorMut for Found {
    type Break = ();

    fn pre_visit_table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<()> {
        let TableFactor::Table { name, alias, version, .. } = factor else { return ControlFlow::Continue(()) };
        let Some(clause) = version.take() else { return ControlFlow::Continue(()) };
        let at = match as_of(&clause) {
            Ok(at) => at,
            Err(e) => {
                self.error = Some(e);
                return ControlFlow::Break(());
            }
        };
        let table = match name.0.last() {
            Some(ObjectNamePart::Identifier(id)) => id.clone(),
            _ => {
                self.error = Some(format!("time travel: '{name}' is not a table name; {FORMS}"));
                return ControlFlow::Break(());
            }
        };
        if alias.is_none() {
            *alias = Some(TableAlias { explicit: true, name: table.clone(), columns: Vec::new(), at: None });
        }
        *name = ObjectName(vec![ObjectNamePart::Identifier(Ident::new(at.schema())), ObjectNamePart::Identifier(table)]);
        if !self.past.contains(&at) {
            self.past.push(at);
        }
        ControlFlow::Continue(())
    }
}

