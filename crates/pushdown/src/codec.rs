//! The request a storage node runs, and how it travels.
//!
//! A request is a Flight ticket holding a [`Task`]: a version and a
//! DataFusion physical plan fragment encoded with datafusion-proto, whose
//! one leaf is an [`ObjectSliceExec`] (a datafusion-proto extension node,
//! encoded by [`SliceCodec`]). Nothing is re-parsed from SQL; predicates and
//! aggregates arrive as DataFusion's own physical expressions, so the node
//! evaluates exactly what the compute side would have.
//!
//! A node checks a fragment before DataFusion decodes it ([`check_fragment`]):
//! only the separable operators FlexPushdownDB §4.1 names — projection,
//! filter, partial aggregation — over exactly one slice leaf are accepted.
//! Anything else (a scan of arbitrary files, a join, a sink) is rejected by
//! its protobuf variant, so no request can make a node read outside its
//! database's data objects or write anything.

use std::sync::Arc;

use datafusion::arrow::datatypes::Schema;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr_common::physical_expr::proto_decode::PhysicalExprDecodeCtx;
use datafusion::physical_expr_common::physical_expr::proto_encode::PhysicalExprEncodeCtx;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};
use datafusion_proto::protobuf::physical_plan_node::PhysicalPlanType;
use datafusion_proto::protobuf::{self, AggregateMode, PhysicalPlanNode};
use prost::Message;
use roaring::RoaringBitmap;

use blobhouse_storage::keys::parse_object_name;
use blobhouse_storage::rows::RowRanges;

use crate::bloom::{BloomFilter, BloomProbeExpr};
use crate::slice::{ObjectSlice, ObjectSliceExec, SliceChecks, SliceReader};

/// The version of [`Task`]; a node refuses tasks of another version.
pub const TASK_VERSION: u32 = 1;
/// Operators a fragment may stack over its leaf.
pub const MAX_FRAGMENT_DEPTH: usize = 16;
/// Row groups one task may read.
pub const MAX_ROW_GROUPS: usize = 4096;
/// Columns one task may read.
pub const MAX_COLUMNS: usize = 4096;

/// A Flight ticket's content.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Task {
    #[prost(uint32, tag = "1")]
    pub version: u32,
    /// A `PhysicalPlanNode` (datafusion-proto).
    #[prost(bytes = "vec", tag = "2")]
    pub fragment: Vec<u8>,
}

/// An [`ObjectSliceExec`] on the wire.
#[derive(Clone, PartialEq, prost::Message)]
struct SliceNode {
    #[prost(string, tag = "1")]
    object: String,
    #[prost(uint32, repeated, tag = "2")]
    row_groups: Vec<u32>,
    #[prost(uint32, repeated, tag = "3")]
    columns: Vec<u32>,
    /// A serialized roaring bitmap of deleted row positions; empty for none.
    #[prost(bytes = "vec", tag = "4")]
    deleted: Vec<u8>,
    #[prost(message, optional, tag = "5")]
    schema: Option<protobuf::Schema>,
    /// None (all rows of every row group), or one per row group.
    #[prost(message, repeated, tag = "6")]
    selections: Vec<SelectionNode>,
    /// The checksum of the object's footer; absent for objects written
    /// before checksums (then tags 8 and 9 are empty too).
    #[prost(uint64, optional, tag = "7")]
    footer_checksum: Option<u64>,
    /// The checksum of its page index, where the manifest records one.
    #[prost(uint64, optional, tag = "8")]
    page_index_checksum: Option<u64>,
    /// Column chunks' checksums, row group by row group, each in the
    /// order of `columns`.
    #[prost(fixed64, repeated, tag = "9")]
    chunk_checksums: Vec<u64>,
    /// Shaped like `chunk_checksums`: each chunk's page checksums (base64,
    /// empty where none were written), or nothing at all.
    #[prost(string, repeated, tag = "10")]
    page_checksums: Vec<String>,
}

/// The rows of one row group to decode (a [`RowRanges`] on the wire):
/// also how a cluster's coordinator sends a scan's row selections.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SelectionNode {
    /// Rows of the row group.
    #[prost(uint64, tag = "1")]
    rows: u64,
    /// Start and end of each selected range; empty: all rows.
    #[prost(uint64, repeated, tag = "2")]
    bounds: Vec<u64>,
}

impl SelectionNode {
    /// `selection` on the wire (`None`: every row).
    pub fn of(selection: Option<&RowRanges>) -> Self {
        match selection {
            None => SelectionNode { rows: 0, bounds: Vec::new() },
            Some(r) => SelectionNode { rows: r.rows(), bounds: r.ranges().iter().flat_map(|r| [r.start, r.end]).collect() },
        }
    }

    /// The selection again, checked; `what` names the row group in errors.
    pub fn ranges(&self, what: &str) -> Result<Option<Arc<RowRanges>>> {
        if self.bounds.is_empty() {
            return Ok(None);
        }
        if !self.bounds.len().is_multiple_of(2) {
            return Err(invalid(format!("the row selection of {what} has an odd number of bounds")));
        }
        let ranges = self.bounds.chunks_exact(2).map(|b| b[0]..b[1]).collect();
        RowRanges::try_new(ranges, self.rows).map(|r| Some(Arc::new(r))).map_err(|e| invalid(format!("the row selection of {what} is malformed: {e}")))
    }
}

/// A [`BloomProbeExpr`] on the wire (its key expressions are its inputs).
#[derive(Clone, PartialEq, prost::Message)]
struct BloomNode {
    #[prost(uint32, tag = "1")]
    hashes: u32,
    /// The filter's 64-bit words, little-endian.
    #[prost(bytes = "vec", tag = "2")]
    words: Vec<u8>,
}

/// Encodes and decodes the slice leaf and Bloom probes. Without a reader (the compute side)
/// it only encodes; on a node it decodes leaves that read through the node's
/// [`SliceReader`].
#[derive(Debug, Default)]
pub struct SliceCodec {
    reader: Option<Arc<SliceReader>>,
}

impl SliceCodec {
    /// A node's codec: decoded leaves read through `reader`.
    pub(crate) fn for_node(reader: Arc<SliceReader>) -> Self {
        SliceCodec { reader: Some(reader) }
    }
}

fn invalid(what: impl Into<String>) -> DataFusionError {
    DataFusionError::Plan(what.into())
}

impl PhysicalExtensionCodec for SliceCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        _: &TaskContext,
        _: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if !inputs.is_empty() {
            return Err(invalid("an object slice has no inputs"));
        }
        let node = SliceNode::decode(buf).map_err(|e| invalid(format!("the object slice does not decode: {e}")))?;
        if parse_object_name(&node.object, "parquet").is_none() {
            return Err(invalid(format!("{:?} is not the name of a data object of this database", node.object)));
        }
        if node.row_groups.is_empty() || node.row_groups.len() > MAX_ROW_GROUPS {
            return Err(invalid(format!("a slice reads 1 to {MAX_ROW_GROUPS} row groups, not {}", node.row_groups.len())));
        }
        if node.columns.len() > MAX_COLUMNS {
            return Err(invalid(format!("a slice reads at most {MAX_COLUMNS} columns, not {}", node.columns.len())));
        }
        let schema = node.schema.as_ref().ok_or_else(|| invalid("the object slice has no schema"))?;
        let schema = Schema::try_from(schema).map_err(|e| invalid(format!("the object slice's schema does not decode: {e}")))?;
        if schema.fields().len() != node.columns.len() {
            return Err(invalid(format!("the slice names {} columns and its schema {}", node.columns.len(), schema.fields().len())));
        }
        let deleted = if node.deleted.is_empty() {
            None
        } else {
            let d = RoaringBitmap::deserialize_from(&node.deleted[..]).map_err(|e| invalid(format!("the slice's deleted rows do not decode: {e}")))?;
            Some(Arc::new(d))
        };
        if !node.selections.is_empty() && node.selections.len() != node.row_groups.len() {
            return Err(invalid(format!("the slice has {} row selections for {} row groups", node.selections.len(), node.row_groups.len())));
        }
        let selections = node
            .selections
            .iter()
            .zip(&node.row_groups)
            .map(|(s, rg)| s.ranges(&format!("row group {rg}")))
            .collect::<Result<Vec<_>>>()?;
        let checks = match node.footer_checksum {
            None => None,
            Some(footer) => {
                let width = node.columns.len();
                if node.chunk_checksums.len() != width * node.row_groups.len() {
                    return Err(invalid(format!(
                        "the slice has {} chunk checksums for {} row groups of {width} columns",
                        node.chunk_checksums.len(),
                        node.row_groups.len()
                    )));
                }
                let chunks = match width {
                    0 => vec![Vec::new(); node.row_groups.len()],
                    _ => node.chunk_checksums.chunks(width).map(<[u64]>::to_vec).collect(),
                };
                let pages = match node.page_checksums.len() {
                    0 => Vec::new(),
                    n if n == node.chunk_checksums.len() && width > 0 => {
                        node.page_checksums.chunks(width).map(|row| row.iter().map(|p| (!p.is_empty()).then(|| p.clone())).collect()).collect()
                    }
                    n => return Err(invalid(format!("the slice has {n} page checksum lists for {} chunks", node.chunk_checksums.len()))),
                };
                Some(SliceChecks { footer, page_index: node.page_index_checksum, chunks, pages })
            }
        };
        let slice = ObjectSlice {
            object: node.object,
            row_groups: node.row_groups.iter().map(|r| *r as usize).collect(),
            columns: node.columns.iter().map(|c| *c as usize).collect(),
            deleted,
            selections,
            checks,
        };
        let exec = ObjectSliceExec::new(slice, Arc::new(schema));
        Ok(Arc::new(match &self.reader {
            Some(r) => exec.with_reader(r.clone()),
            None => exec,
        }))
    }

    fn try_decode_expr(&self, buf: &[u8], inputs: &[Arc<dyn PhysicalExpr>], _: &PhysicalExprDecodeCtx<'_>) -> Result<Arc<dyn PhysicalExpr>> {
        SliceCodec::decode_bloom(buf, inputs)
    }

    fn try_encode_expr(&self, node: &Arc<dyn PhysicalExpr>, buf: &mut Vec<u8>, _: &PhysicalExprEncodeCtx<'_>) -> Result<()> {
        let Some(probe) = node.downcast_ref::<BloomProbeExpr>() else {
            return Err(invalid(format!("the expression {node} cannot run on a storage node")));
        };
        let (words, hashes) = probe.filter().parts();
        BloomNode { hashes, words: words.iter().flat_map(|w| w.to_le_bytes()).collect() }.encode(buf).map_err(|e| DataFusionError::External(Box::new(e)))
    }

    fn try_encode(&self, node: Arc<dyn ExecutionPlan>, buf: &mut Vec<u8>, _: &dyn PhysicalProtoConverterExtension) -> Result<()> {
        let Some(leaf) = node.downcast_ref::<ObjectSliceExec>() else {
            return Err(invalid(format!("{} cannot run on a storage node", node.name())));
        };
        let slice = leaf.slice();
        let mut deleted = Vec::new();
        if let Some(d) = &slice.deleted {
            d.serialize_into(&mut deleted).map_err(|e| DataFusionError::External(Box::new(e)))?;
        }
        let schema = protobuf::Schema::try_from(leaf.schema().as_ref()).map_err(|e| invalid(e.to_string()))?;
        SliceNode {
            object: slice.object.clone(),
            row_groups: slice.row_groups.iter().map(|r| *r as u32).collect(),
            columns: slice.columns.iter().map(|c| *c as u32).collect(),
            deleted,
            schema: Some(schema),
            selections: match slice.selections.iter().any(Option::is_some) {
                false => Vec::new(),
                true => slice
                    .selections
                    .iter()
                    .map(|s| SelectionNode::of(s.as_deref()))
                    .collect(),
            },
            footer_checksum: slice.checks.as_ref().map(|c| c.footer),
            page_index_checksum: slice.checks.as_ref().and_then(|c| c.page_index),
            chunk_checksums: slice.checks.iter().flat_map(|c| c.chunks.iter().flatten().copied()).collect(),
            page_checksums: slice.checks.iter().flat_map(|c| c.pages.iter().flatten().map(|p| p.clone().unwrap_or_default())).collect(),
        }
        .encode(buf)
        .map_err(|e| DataFusionError::External(Box::new(e)))
    }
}

impl SliceCodec {
    fn decode_bloom(buf: &[u8], inputs: &[Arc<dyn PhysicalExpr>]) -> Result<Arc<dyn PhysicalExpr>> {
        let node = BloomNode::decode(buf).map_err(|e| invalid(format!("the Bloom probe does not decode: {e}")))?;
        if node.words.len() % 8 != 0 {
            return Err(invalid(format!("a Bloom filter of {} bytes is not whole 64-bit words", node.words.len())));
        }
        let words = node.words.chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes"))).collect();
        let filter = BloomFilter::from_parts(words, node.hashes).map_err(invalid)?;
        Ok(Arc::new(BloomProbeExpr::new(inputs.to_vec(), Arc::new(filter))?))
    }
}

/// Encodes a fragment (separable operators over one [`ObjectSliceExec`])
/// into a ticket.
pub fn encode_task(fragment: Arc<dyn ExecutionPlan>) -> Result<Vec<u8>> {
    let bytes = datafusion_proto::bytes::physical_plan_to_bytes_with_extension_codec(fragment, &SliceCodec::default())?;
    let node = PhysicalPlanNode::decode(&bytes[..]).map_err(|e| DataFusionError::External(Box::new(e)))?;
    check_fragment(&node).map_err(invalid)?;
    Ok(Task { version: TASK_VERSION, fragment: bytes.to_vec() }.encode_to_vec())
}

/// Whether a node can run `fragment`: it encodes, passes the node's checks
/// and decodes again. Some expressions encode but cannot run alone (a
/// scalar subquery's value comes from an operator outside the fragment);
/// a planner asks this once per query and keeps such chains local.
pub fn shippable(fragment: Arc<dyn ExecutionPlan>) -> Result<()> {
    // One context for every check, rather than a session (with its
    // registry of built-in functions) built at every separable scan of
    // every query planned with pushdown on.
    static CONTEXT: std::sync::LazyLock<Arc<TaskContext>> = std::sync::LazyLock::new(|| datafusion::prelude::SessionContext::new().task_ctx());
    let ticket = encode_task(fragment)?;
    let task = Task::decode(&ticket[..]).map_err(|e| DataFusionError::External(Box::new(e)))?;
    datafusion_proto::bytes::physical_plan_from_bytes_with_extension_codec(&task.fragment, &CONTEXT, &SliceCodec::default()).map(|_| ())
}

/// Checks, on the protobuf and before anything is decoded, that a fragment
/// is a stack of separable operators over exactly one extension leaf (the
/// codec then accepts only object slices). The error says what is refused.
pub fn check_fragment(node: &PhysicalPlanNode) -> std::result::Result<(), String> {
    let mut node = node;
    for _ in 0..MAX_FRAGMENT_DEPTH {
        let input = match node.physical_plan_type.as_ref() {
            None => return Err("a plan node is empty".into()),
            Some(PhysicalPlanType::Extension(e)) => {
                return if e.inputs.is_empty() { Ok(()) } else { Err("the fragment's leaf has inputs".into()) };
            }
            Some(PhysicalPlanType::Projection(p)) => p.input.as_deref(),
            Some(PhysicalPlanType::Filter(f)) => f.input.as_deref(),
            Some(PhysicalPlanType::CoalesceBatches(c)) => c.input.as_deref(),
            Some(PhysicalPlanType::Aggregate(a)) => {
                if a.mode != AggregateMode::Partial as i32 {
                    return Err("only partial (first-phase) aggregation runs on a storage node".into());
                }
                a.input.as_deref()
            }
            Some(other) => return Err(format!("{} does not run on a storage node (only projection, filter and partial aggregation over an object slice do)", variant_name(other))),
        };
        node = input.ok_or("an operator of the fragment has no input")?;
    }
    Err(format!("the fragment is deeper than {MAX_FRAGMENT_DEPTH} operators"))
}

fn variant_name(t: &PhysicalPlanType) -> String {
    let debug = format!("{t:?}");
    debug.split('(').next().unwrap_or("an operator").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf() -> PhysicalPlanNode {
        PhysicalPlanNode { physical_plan_type: Some(PhysicalPlanType::Extension(protobuf::PhysicalExtensionNode { node: vec![], inputs: vec![] })) }
    }

    #[test]
    fn only_separable_stacks_over_one_leaf_pass() {
        assert!(check_fragment(&leaf()).is_ok());
        let filter = PhysicalPlanNode {
            physical_plan_type: Some(PhysicalPlanType::Filter(Box::new(protobuf::FilterExecNode { input: Some(Box::new(leaf())), ..Default::default() }))),
        };
        assert!(check_fragment(&filter).is_ok());
        let final_agg = PhysicalPlanNode {
            physical_plan_type: Some(PhysicalPlanType::Aggregate(Box::new(protobuf::AggregateExecNode {
                input: Some(Box::new(filter.clone())),
                mode: AggregateMode::Final as i32,
                ..Default::default()
            }))),
        };
        assert!(check_fragment(&final_agg).unwrap_err().contains("partial"));
        let scan = PhysicalPlanNode { physical_plan_type: Some(PhysicalPlanType::ParquetScan(Default::default())) };
        assert!(check_fragment(&scan).unwrap_err().contains("ParquetScan does not run"));
        let mut deep = leaf();
        for _ in 0..MAX_FRAGMENT_DEPTH {
            deep = PhysicalPlanNode {
                physical_plan_type: Some(PhysicalPlanType::Filter(Box::new(protobuf::FilterExecNode { input: Some(Box::new(deep)), ..Default::default() }))),
            };
        }
        assert!(check_fragment(&deep).unwrap_err().contains("deeper"));
        assert!(check_fragment(&PhysicalPlanNode { physical_plan_type: None }).is_err());
    }

    #[test]
    fn bloom_probes_travel_and_bad_ones_are_refused() {
        use crate::bloom::{BloomFilter, BloomProbeExpr};
        use datafusion::arrow::datatypes::{DataType, Field};
        use datafusion::physical_expr::expressions::col;
        use datafusion::physical_plan::filter::FilterExec;
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        let slice = ObjectSlice { object: blobhouse_storage::keys::object_name(1, "parquet"), row_groups: vec![0], columns: vec![0], deleted: None, selections: Vec::new(), checks: None };
        let leaf = Arc::new(ObjectSliceExec::new(slice, schema.clone()));
        let mut keys: Vec<u64> = (1..100).collect();
        let filter = Arc::new(BloomFilter::from_hashes(&mut keys).unwrap());
        let probe = Arc::new(BloomProbeExpr::new(vec![col("k", &schema).unwrap()], filter.clone()).unwrap());
        let fragment = Arc::new(FilterExec::try_new(probe, leaf).unwrap());
        let bytes = datafusion_proto::bytes::physical_plan_to_bytes_with_extension_codec(fragment, &SliceCodec::default()).unwrap();
        let ctx = datafusion::prelude::SessionContext::new().task_ctx();
        match datafusion_proto::bytes::physical_plan_from_bytes_with_extension_codec(&bytes, &ctx, &SliceCodec::default()) {
            Ok(plan) => {
                let f = plan.downcast_ref::<FilterExec>().unwrap();
                let decoded = f.predicate().downcast_ref::<BloomProbeExpr>().expect("a Bloom probe");
                assert_eq!(decoded.filter(), &filter);
            }
            Err(e) => panic!("the fragment does not decode: {e}"),
        }
        let ok = BloomNode { hashes: 7, words: vec![0; 64] }.encode_to_vec();
        assert!(SliceCodec::decode_bloom(&ok, &[col("k", &schema).unwrap()]).is_ok());
        for (bad, why) in [
            (BloomNode { hashes: 7, words: vec![0; 63] }.encode_to_vec(), "whole 64-bit words"),
            (BloomNode { hashes: 7, words: vec![0; 96] }.encode_to_vec(), "power of two"),
            (BloomNode { hashes: 99, words: vec![0; 64] }.encode_to_vec(), "1 to 16"),
            (vec![0xff, 0xff, 0xff], "does not decode"),
        ] {
            let e = SliceCodec::decode_bloom(&bad, &[col("k", &schema).unwrap()]).unwrap_err().to_string();
            assert!(e.contains(why), "{e}");
        }
        assert!(SliceCodec::decode_bloom(&ok, &[]).unwrap_err().to_string().contains("1 to 8 key columns"));
    }

    #[test]
    fn row_selections_travel_and_malformed_ones_are_refused() {
        use datafusion::arrow::datatypes::{DataType, Field};
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        let ctx = datafusion::prelude::SessionContext::new().task_ctx();
        let codec = SliceCodec::default();
        let object = blobhouse_storage::keys::object_name(1, "parquet");
        let selection = Arc::new(RowRanges::try_new(vec![0..100, 4000..5000], 20_000).unwrap());
        let slice = ObjectSlice { object: object.clone(), row_groups: vec![0, 1], columns: vec![0], deleted: None, selections: vec![Some(selection), None], checks: Some(SliceChecks { footer: 7, page_index: None, chunks: vec![vec![1], vec![2]], pages: vec![vec![Some("AAAAAA==".into())], vec![None]] }) };
        let mut buf = Vec::new();
        codec.try_encode(Arc::new(ObjectSliceExec::new(slice.clone(), schema.clone())), &mut buf, &datafusion_proto::physical_plan::DefaultPhysicalProtoConverter {}).unwrap();
        let decoded = codec.try_decode(&buf, &[], &ctx, &datafusion_proto::physical_plan::DefaultPhysicalProtoConverter {}).unwrap();
        assert_eq!(decoded.downcast_ref::<ObjectSliceExec>().unwrap().slice(), &slice);

        let node = |selections: Vec<SelectionNode>| {
            let schema = protobuf::Schema::try_from(schema.as_ref()).unwrap();
            SliceNode { object: object.clone(), row_groups: vec![0, 1], columns: vec![0], deleted: vec![], schema: Some(schema), selections, ..Default::default() }.encode_to_vec()
        };
        let all = || SelectionNode { rows: 0, bounds: vec![] };
        for (bad, why) in [
            (vec![all()], "1 row selections for 2 row groups"),
            (vec![SelectionNode { rows: 10, bounds: vec![1, 2, 3] }, all()], "odd number of bounds"),
            (vec![SelectionNode { rows: 10, bounds: vec![1, 5, 4, 6] }, all()], "overlaps"),
            (vec![all(), SelectionNode { rows: 10, bounds: vec![5, 11] }], "past the row group's 10 rows"),
            (vec![SelectionNode { rows: 10, bounds: vec![3, 3] }, all()], "empty"),
        ] {
            let e = codec.try_decode(&node(bad), &[], &ctx, &datafusion_proto::physical_plan::DefaultPhysicalProtoConverter {}).unwrap_err().to_string();
            assert!(e.contains(why), "{e}");
        }
        // Checksums for another shape of slice than the one sent.
        let schema_node = protobuf::Schema::try_from(schema.as_ref()).unwrap();
        let short = SliceNode { object: object.clone(), row_groups: vec![0, 1], columns: vec![0], schema: Some(schema_node), footer_checksum: Some(1), chunk_checksums: vec![5], ..Default::default() }.encode_to_vec();
        let e = codec.try_decode(&short, &[], &ctx, &datafusion_proto::physical_plan::DefaultPhysicalProtoConverter {}).unwrap_err().to_string();
        assert!(e.contains("1 chunk checksums for 2 row groups"), "{e}");
    }
}
