//! Queries and EXPLAIN, and every other statement DataFusion plans: the
//! plan decides what it is (a query's rows, a CREATE or DROP TABLE for
//! [`crate::ddl`], a DESCRIBE, a `SET datafusion.…`), and a query is
//! planned down to its physical plan and run — collected, or streamed.

use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::{ArrayRef, RecordBatch, StringArray};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::DataFusionError;
use datafusion::dataframe::DataFrame;
use datafusion::execution::context::SessionContext;
use datafusion::logical_expr::{DdlStatement, DescribeTable, LogicalPlan, Statement};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{ExecutionPlan, SendableRecordBatchStream, collect, execute_stream};
use futures::{StreamExt, TryStreamExt};
use datafusion::sql::parser::Statement as DFStatement;

use crate::env::Env;
use crate::result::{MemoryUse, QueryResult, RowStream, count_result, empty_result};
use crate::scan::{collect_scan_metrics, collect_scheduler_timelines};
use crate::EngineError;

/// What `SHOW TABLES` runs: the database's tables, not the catalogs and
/// views DataFusion and the server add beside them.
pub(crate) const SHOW_TABLES: &str = "SELECT table_name AS name FROM information_schema.tables WHERE table_schema = 'public' ORDER BY table_name";

/// A query planned down to the physical plan, ready to run.
pub(crate) struct Planned {
    task: Arc<datafusion::execution::TaskContext>,
    physical: Arc<dyn ExecutionPlan>,
    /// Asked who failed a run ([`Planned::with_cluster`]).
    cluster: Option<Arc<dyn crate::StatementExtension>>,
    /// Whether a run a worker failed may run again.
    rerun: bool,
    /// What it was planned from, to plan it again for a rerun.
    logical: Option<DataFrame>,
}

/// Plans `statement` in `ctx` down to the physical plan when it is a
/// plain query (its plan reads and returns rows, nothing else); `None`
/// otherwise. `keep`: as in [`plan_physical`].
pub(crate) async fn plan_query(ctx: &SessionContext, statement: DFStatement, keep: bool) -> Result<Option<Planned>, EngineError> {
    let plan = ctx.state().statement_to_plan(statement).await?;
    if matches!(
        plan,
        LogicalPlan::Ddl(_) | LogicalPlan::Dml(_) | LogicalPlan::Statement(_) | LogicalPlan::DescribeTable(_) | LogicalPlan::Copy(_) | LogicalPlan::Explain(_) | LogicalPlan::Analyze(_)
    ) {
        return Ok(None);
    }
    let df = ctx.execute_logical_plan(plan).await?;
    Ok(Some(plan_physical(df, keep).await?))
}

/// Runs a statement DataFusion plans, in the statement's scope.
/// `session` is the session's own context, where `SET datafusion.…` lands.
pub(crate) async fn run(env: &Env<'_>, statement: DFStatement, session: &SessionContext) -> Result<QueryResult, EngineError> {
    let started = env.started;
    let plan = env.ctx.state().statement_to_plan(statement).await?;
    match plan {
        LogicalPlan::Ddl(DdlStatement::CreateMemoryTable(create)) => {
            let rows = match crate::ddl::create_table(env, create).await {
                Ok(rows) => rows,
                Err(e) => return Err(name_failed_workers(env.engine, e).await),
            };
            Ok(count_result(rows, started))
        }
        LogicalPlan::Ddl(DdlStatement::CreateExternalTable(create)) => {
            crate::ddl::create_external_table(env, *create).await?;
            Ok(empty_result(started))
        }
        LogicalPlan::Ddl(DdlStatement::DropTable(drop)) => {
            crate::ddl::drop_table(env, &drop).await?;
            Ok(empty_result(started))
        }
        LogicalPlan::Ddl(other) => Err(EngineError::Unsupported(format!(
            "{} is not supported yet; blobhouse supports CREATE TABLE [AS SELECT], CREATE EXTERNAL TABLE, DROP TABLE, INSERT, DELETE, UPDATE, COPY … FROM and queries",
            other.name()
        ))),
        LogicalPlan::DescribeTable(describe) => Ok(describe_result(&describe, started)),
        plan @ LogicalPlan::Statement(Statement::SetVariable(_) | Statement::ResetVariable(_)) => {
            // DataFusion's settings are the session's: they outlive the statement.
            session.execute_logical_plan(plan).await?.collect().await?;
            Ok(empty_result(started))
        }
        plan => {
            // DataFusion's own `COPY … TO … STORED AS` writes outside the
            // database like ours does.
            if let LogicalPlan::Copy(copy) = &plan {
                crate::files::FileAccess::of(env.ctx.state().config()).check(&copy.output_url)?;
            }
            let analyze = matches!(plan, LogicalPlan::Analyze(_));
            let explained = match (&plan, env.engine.statement_extension()) {
                (LogicalPlan::Explain(e), Some(ext)) => Some((e.plan.as_ref().clone(), ext)),
                _ => None,
            };
            let reads_only = !matches!(plan, LogicalPlan::Dml(_) | LogicalPlan::Copy(_) | LogicalPlan::Ddl(_) | LogicalPlan::Statement(_));
            let df = env.ctx.execute_logical_plan(plan).await?;
            let keep = env.engine.statement_extension().is_some();
            let planned = plan_physical(df, keep).await?.with_cluster(env.engine, reads_only && !env.in_transaction);
            let mut result = run_planned(planned, started).await?;
            if analyze {
                // EXPLAIN ANALYZE: one more row with what the query held.
                record_memory(env.engine, &mut result);
                let text = result.memory.describe();
                append_explain_row(&mut result, "Memory", &text);
                if let Some(cache) = result.scan.cache_summary() {
                    append_explain_row(&mut result, "Cache", &cache);
                }
                if !result.processes.is_empty() {
                    let lines: Vec<String> = result.processes.iter().map(|(who, m)| format!("{who}: {}", m.describe_reads())).collect();
                    append_explain_row(&mut result, "Scans per process", &lines.join("\n"));
                }
            }
            if let Some((input, extension)) = explained {
                // What runs where: the plan as the extension (the cluster) cut it.
                let physical = env.ctx.execute_logical_plan(input).await?.create_physical_plan().await?;
                if let Some(text) = extension.explain(&physical) {
                    append_explain_row(&mut result, "distributed_plan", &text);
                }
            }
            Ok(result)
        }
    }
}

/// Fills in what the statement held: the budget's and the process's peaks.
pub(crate) fn record_memory(engine: &crate::Engine, result: &mut QueryResult) {
    result.memory.pool_peak = engine.memory().peak() as u64;
    result.memory.limit = engine.memory().limit().map(|l| l as u64);
    result.memory.rss_peak = crate::memory::process_memory().map(|m| m.peak_rss);
}

/// `keep` keeps what the plan was made from, for a rerun on a cluster
/// ([`Planned::with_cluster`]); without a cluster nothing is copied.
pub(crate) async fn plan_physical(df: DataFrame, keep: bool) -> Result<Planned, DataFusionError> {
    let task = Arc::new(df.task_ctx());
    let logical = keep.then(|| df.clone());
    let physical = df.create_physical_plan().await?;
    Ok(Planned { task, physical, cluster: None, rerun: false, logical })
}

impl Planned {
    /// With a statement extension on `engine` (a cluster): a run that fails
    /// because a worker died says which; with `rerun` (a statement that
    /// only reads, outside BEGIN … COMMIT) it runs once more, planned again
    /// without that worker. A streamed query is rerun only before its
    /// first rows are out.
    pub(crate) fn with_cluster(mut self, engine: &crate::Engine, rerun: bool) -> Planned {
        self.cluster = engine.statement_extension();
        self.rerun = rerun && self.cluster.is_some();
        if !self.rerun {
            self.logical = None;
        }
        self
    }
}

/// After `error` failed a run: the notice of a rerun when a worker is
/// found down and `rerun` allows it (57P01, admin_shutdown: PostgreSQL's
/// code for a server process that went away); otherwise the error, naming
/// the workers found down.
async fn after_failure(cluster: Option<&Arc<dyn crate::StatementExtension>>, rerun: bool, error: DataFusionError) -> Result<crate::Notice, DataFusionError> {
    let Some(cluster) = cluster else { return Err(error) };
    let down = cluster.failed_by(&error).await;
    if down.is_empty() {
        return Err(error);
    }
    let workers = down.join(", ");
    if !rerun {
        return Err(DataFusionError::Execution(format!(
            "cluster worker {workers} failed during this statement; inside a transaction (or when it writes) it is not run again: ROLLBACK and run it again ({error})"
        )));
    }
    let message = format!("cluster worker {workers} failed this statement and it ran again on the others: {error}");
    Ok(crate::Notice { severity: "WARNING", sqlstate: "57P01", message })
}

/// `error`, which failed a statement that writes (DELETE, UPDATE, CTAS,
/// COPY … TO) without going through [`run_planned`]: naming the cluster's
/// workers found down, when there are some. Such statements never run
/// twice.
pub(crate) async fn name_failed_workers(engine: &crate::Engine, error: crate::EngineError) -> crate::EngineError {
    let Some(cluster) = engine.statement_extension() else { return error };
    let down = cluster.failed_by(&DataFusionError::Execution(error.to_string())).await;
    if down.is_empty() {
        return error;
    }
    crate::EngineError::Query(DataFusionError::Execution(format!(
        "cluster worker {} failed during this statement, which writes and is not run again: run it again (inside BEGIN … COMMIT, ROLLBACK first) ({error})",
        down.join(", ")
    )))
}

/// The plan of `logical` made again, for a rerun: a distributed plan that
/// ran keeps the workers its stages were sent to (a rerun of the same plan
/// failed again on the dead one), a new plan asks for the workers up.
async fn replan(logical: Option<DataFrame>) -> Result<Arc<dyn ExecutionPlan>, DataFusionError> {
    let logical = logical.ok_or_else(|| DataFusionError::Internal("a rerun without the statement's plan".into()))?;
    logical.create_physical_plan().await
}

/// Starts a planned query; its rows come as they are computed.
pub(crate) fn stream_planned(planned: Planned) -> Result<RowStream, EngineError> {
    let Planned { task, physical, cluster, rerun, logical } = planned;
    let schema = physical.schema();
    let Some(cluster) = cluster else {
        return Ok(RowStream { schema, batches: execute_stream(physical, task)? });
    };
    // The first batch decides: an error before any row is out may be rerun;
    // one after names the worker.
    let first = async move {
        let mut batches = execute_stream(physical.clone(), task.clone())?;
        match batches.next().await {
            Some(Err(e)) => {
                after_failure(Some(&cluster), rerun, e).await?;
                execute_stream(replan(logical).await?, task)
            }
            first => {
                let rest = batches.then(move |b| {
                    let cluster = cluster.clone();
                    async move {
                        match b {
                            Err(e) => Err(after_failure(Some(&cluster), false, e).await.err().unwrap_or_else(|| DataFusionError::Internal("a failure became a rerun".into()))),
                            ok => ok,
                        }
                    }
                });
                Ok(Box::pin(RecordBatchStreamAdapter::new(physical.schema(), futures::stream::iter(first).chain(rest))) as SendableRecordBatchStream)
            }
        }
    };
    let batches = futures::stream::once(first).try_flatten();
    Ok(RowStream { schema: schema.clone(), batches: Box::pin(RecordBatchStreamAdapter::new(schema, batches)) })
}

/// Runs a planned query to the end; what came before it (planning, and
/// finding the newest version) counts as its planning time.
pub(crate) async fn run_planned(planned: Planned, started: Instant) -> Result<QueryResult, DataFusionError> {
    let Planned { task, mut physical, cluster, rerun, logical } = planned;
    let files = task.session_config().get_extension::<crate::files::store::FileCounters>();
    let planning = started.elapsed();
    let schema = physical.schema();
    let mut notices = Vec::new();
    let batches = match collect(physical.clone(), task.clone()).await {
        Err(e) => {
            notices.push(after_failure(cluster.as_ref(), rerun, e).await?);
            physical = replan(logical).await?;
            collect(physical.clone(), task).await?
        }
        Ok(batches) => batches,
    };
    let (spilled_bytes, spills) = spill_totals(&physical);
    // A plan that ran on workers: their scans' counters came back with
    // their streams; the plan here holds only what ran in this process.
    let remote = match &cluster {
        Some(c) => c.executed(&physical).await,
        None => None,
    };
    let (mut scan, processes) = match remote {
        Some(run) => (run.scan, run.processes),
        None => (collect_scan_metrics(&physical), Vec::new()),
    };
    // Files read in place (`read_parquet`, external tables) count beside
    // the tables' scans.
    if let Some(files) = files {
        scan += files.scan_metrics();
    }
    Ok(QueryResult {
        schema,
        batches,
        scan,
        processes,
        elapsed: started.elapsed(),
        planning,
        scheduler: collect_scheduler_timelines(&physical),
        memory: MemoryUse { spilled_bytes, spills, ..MemoryUse::default() },
        pushdown: crate::hybrid::collect_pushdown(&physical),
        notices,
        rolled_back: false,
    })
}

/// Bytes spilled and spill files written by every operator of an executed plan.
fn spill_totals(plan: &Arc<dyn ExecutionPlan>) -> (u64, u64) {
    let (mut bytes, mut count) = plan.metrics().map_or((0, 0), |m| (m.spilled_bytes().unwrap_or(0) as u64, m.spill_count().unwrap_or(0) as u64));
    for child in plan.children() {
        let (b, c) = spill_totals(child);
        bytes += b;
        count += c;
    }
    (bytes, count)
}

/// What each sort sets aside to merge its spill files: DataFusion's 10 MiB,
/// less under a small limit (a 64th of it, at least 1 MiB). A sort-merge
/// join sorts both inputs in every partition at once, so at 10 MiB each a
/// 96 MiB limit had no room left to sort anything.

/// names (`INTEGER`, `VARCHAR`) rather than Arrow's (`Int32`, `Utf8View`).
fn describe_result(describe: &DescribeTable, started: Instant) -> QueryResult {
    let schema: SchemaRef = Arc::new(describe.output_schema.as_arrow().clone());
    let fields = describe.schema.fields();
    let names: Vec<&str> = fields.iter().map(|f| f.name().as_str()).collect();
    let types: Vec<String> = fields.iter().map(|f| crate::types::sql_type_name(f.data_type())).collect();
    let nullable: Vec<&str> = fields.iter().map(|f| if f.is_nullable() { "YES" } else { "NO" }).collect();
    let columns: Vec<ArrayRef> = vec![Arc::new(StringArray::from(names)), Arc::new(StringArray::from(types)), Arc::new(StringArray::from(nullable))];
    let batch = RecordBatch::try_new(schema.clone(), columns).expect("DESCRIBE's output schema is three strings");
    QueryResult { batches: vec![batch], ..empty_result(started).with_schema(schema) }
}

/// Adds a row to EXPLAIN ANALYZE's (plan_type, plan) output.
fn append_explain_row(result: &mut QueryResult, plan_type: &str, text: &str) {
    let columns: Result<Vec<ArrayRef>, _> = [plan_type, text]
        .iter()
        .zip(result.schema.fields())
        .map(|(v, f)| datafusion::arrow::compute::cast(&StringArray::from(vec![*v]), f.data_type()))
        .collect();
    if let Ok(batch) = columns.and_then(|c| RecordBatch::try_new(result.schema.clone(), c)) {
        result.batches.push(batch);
    }
}
