//! Logical rules that read a subquery's value from rows the outer query
//! computes anyway, instead of computing those rows a second time.
//!
//! DataFusion 55 decorrelates a subquery into a join with a second copy of
//! the tables it reads (or, uncorrelated, runs it as a plan of its own);
//! it never notices that the copy repeats the outer query's own work.
//! Each rule here rewrites one such shape, and only when the rewrite is
//! provably exact: the module of each rule states its conditions.
//!
//! - [`window`]: a correlated `avg`/`min`/`max` over rows the outer query
//!   already joins becomes a window over the outer rows (Q17, Q2).
//! - [`total`]: a scalar subquery that totals the rows a HAVING's
//!   aggregation groups is read from the groups (Q11).
//!
//! They run after DataFusion's logical rules, on the joins and filters its
//! decorrelation leaves; the physical rules (shared subplans, key transfer)
//! then see one copy of the work.

use datafusion::common::DFSchema;
use datafusion::logical_expr::Expr;

pub mod total;
pub mod window;

pub use total::SubqueryTotalRule;
pub use window::SubqueryWindowRule;

/// `expr` without the aliases around it.
fn unalias(expr: &Expr) -> &Expr {
    match expr {
        Expr::Alias(a) => unalias(&a.expr),
        e => e,
    }
}

/// Whether a rewritten plan has exactly the columns of the one it replaces:
/// qualifiers, names and types, in order.
fn same_columns(new: &DFSchema, old: &DFSchema) -> bool {
    new.fields().len() == old.fields().len() && new.iter().zip(old.iter()).all(|((q1, f1), (q2, f2))| q1 == q2 && f1.name() == f2.name() && f1.data_type() == f2.data_type())
}

/// What the rules' tests share: DataFusion with and without a rule, on the
/// same in-memory tables, answering the same SQL.
#[cfg(test)]
mod testing {
    use std::sync::Arc;

    use datafusion::arrow::util::pretty::pretty_format_batches;
    use datafusion::execution::SessionStateBuilder;
    use datafusion::optimizer::OptimizerRule;
    use datafusion::prelude::{SessionConfig, SessionContext};

    /// A context of three partitions, with `rule` added when given.
    pub(super) fn context(rule: Option<Arc<dyn OptimizerRule + Send + Sync>>) -> SessionContext {
        let config = SessionConfig::new().with_target_partitions(3);
        let mut state = SessionStateBuilder::new().with_config(config).with_default_features();
        if let Some(rule) = rule {
            state = state.with_optimizer_rule(rule);
        }
        SessionContext::new_with_state(state.build())
    }

    /// The sorted rows of `sql`, and its optimized logical plan.
    pub(super) async fn run(ctx: &SessionContext, sql: &str) -> (Vec<String>, String) {
        let df = ctx.sql(sql).await.unwrap();
        let plan = df.clone().into_optimized_plan().unwrap().display_indent().to_string();
        let batches = df.collect().await.unwrap();
        let text = pretty_format_batches(&batches).unwrap().to_string();
        let mut rows: Vec<String> = text.lines().filter(|l| l.starts_with("| ")).skip(1).map(str::to_string).collect();
        rows.sort();
        (rows, plan)
    }

    /// Runs `sql` without and with the rule (`plain`, `ruled`); asserts the
    /// same non-empty rows, and returns the plan with the rule.
    pub(super) async fn same_rows(plain: &SessionContext, ruled: &SessionContext, sql: &str) -> String {
        let (want, without) = run(plain, sql).await;
        let (got, plan) = run(ruled, sql).await;
        assert_eq!(got, want, "{sql}\nwith the rule:\n{plan}\nwithout:\n{without}");
        assert!(!want.is_empty(), "{sql}: a test that compares no rows proves nothing");
        plan
    }
}
