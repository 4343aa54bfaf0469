//! Which side of a partitioned hash join builds the table: the one with
//! fewer rows, where DataFusion picks the one with fewer bytes.
//!
//! DataFusion's `JoinSelection` compares the two inputs' estimated bytes and
//! builds on the smaller. Building costs per row — each row is hashed and
//! inserted into a table that, past the caches, misses on every insert —
//! while a probe row is hashed and looked up once; and the probe side is
//! where the build's keys become a Bloom filter at the scan
//! ([`crate::key_bloom`]), so a small build also shrinks the probe. Bytes
//! and rows disagree when the narrow side is the long one: in TPC-H Q9 at
//! SF 10 the 15 M `orders` rows (two columns, 180 MB) were built and the
//! 3.3 M joined line items (six columns) probed — 1.3 s of the query's
//! 4.8 core-seconds went into building `orders` alone, and the 8 M
//! `partsupp` rows were built the same way.
//!
//! [`BuildSideRule`] runs right after `JoinSelection` (before the
//! repartitions and the dynamic filters are placed) and swaps a partitioned
//! inner join whose build side has more estimated rows than its probe side,
//! as long as the new build side is not much wider in bytes (the table has
//! to fit in memory: at most [`BYTES_SLACK`] times the bytes DataFusion
//! chose). Joins whose build DataFusion collects into one shared table are
//! left alone: they were chosen for being small. The estimates come from
//! the engine's statistics registry ([`crate::selectivity`]).
//!
//! Why by hand: DataFusion's comparison is a private function of
//! `JoinSelection`; its extension point is a rule of our own over the plan.

use std::sync::Arc;

use datafusion::common::JoinType;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::operator_statistics::StatisticsRegistry;

/// How many times the bytes of DataFusion's choice the new build side may
/// hold: more rows built cost time, more bytes built cost memory, and a
/// table several times larger may not fit.
pub const BYTES_SLACK: usize = 4;

/// Builds partitioned hash joins on the side with fewer rows (module docs).
#[derive(Debug, Default)]
pub struct BuildSideRule;

impl PhysicalOptimizerRule for BuildSideRule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        if !config.optimizer.join_reordering {
            return Ok(plan);
        }
        let registry = crate::selectivity::registry();
        plan.transform_up(|node| {
            let Some(join) = node.downcast_ref::<HashJoinExec>() else {
                return Ok(Transformed::no(node));
            };
            if *join.partition_mode() != PartitionMode::Partitioned || *join.join_type() != JoinType::Inner || !fewer_rows_on_the_probe_side(join, &registry) {
                return Ok(Transformed::no(node));
            }
            Ok(Transformed::yes(join.swap_inputs(PartitionMode::Partitioned)?))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "build_side"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// Whether the probe (right) side has fewer estimated rows than the build
/// (left) side, and holds at most [`BYTES_SLACK`] times its bytes. False
/// where an estimate is missing.
fn fewer_rows_on_the_probe_side(join: &HashJoinExec, registry: &StatisticsRegistry) -> bool {
    let (Ok(left), Ok(right)) = (registry.compute_base(join.left().as_ref()), registry.compute_base(join.right().as_ref())) else {
        return false;
    };
    let (Some(&l_rows), Some(&r_rows)) = (left.num_rows.get_value(), right.num_rows.get_value()) else {
        return false;
    };
    let (Some(&l_bytes), Some(&r_bytes)) = (left.total_byte_size.get_value(), right.total_byte_size.get_value()) else {
        return false;
    };
    r_rows < l_rows && r_bytes <= l_bytes.saturating_mul(BYTES_SLACK)
}
