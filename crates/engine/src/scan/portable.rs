//! The scan outside its process: how a [`BlobScanExec`] is cut into disjoint
//! shares for a cluster's tasks ([`BlobScanExec::split`]) and how a share
//! travels to a worker and runs there ([`ScanCodec`]).
//!
//! A share carries everything the coordinator planned — per row group its
//! object, rows, row selection, column chunks, range requests and decoded
//! size estimates, and per object its footer — so a worker needs no catalog
//! and no manifest: objects are immutable and named, and the worker reads
//! them through its own download manager and caching tiers. A worker only
//! ever reads data objects of its own database: names are checked to be
//! data-object names and resolved under the worker's database prefix.
//!
//! Runtime filters do not travel: they are filled by joins that may run in
//! another process while the query runs. A scan never answered "pushed
//! down" for them (its parents keep filtering), so dropping them changes
//! what is read, never an answer.
//!
//! Why by hand: the scan is ours, and so is what it needs on the wire;
//! datafusion-proto carries DataFusion's nodes and calls this codec for it.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use datafusion::arrow::datatypes::Schema;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use datafusion::physical_plan::{ExecutionPlan, Partitioning, PlanProperties};
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};
use datafusion_proto::protobuf;
use parquet::arrow::arrow_reader::ArrowReaderMetadata;
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaDataReader, ParquetMetaDataWriter};
use prost::Message;
use roaring::RoaringBitmap;

use blobhouse_pushdown::codec::SelectionNode;
use blobhouse_storage::Location;
use blobhouse_storage::keys::parse_object_name;

use super::metadata::MetadataCache;
use super::pipeline::ScanCounters;
use super::plan::{PlanSummary, ScanObject, ScanUnit, assign_morsels};
use super::BlobScanExec;
use crate::chunks::Span;
use crate::scheduler::SchedulerOptions;
use crate::source::DataSource;
use crate::tiers::DecodedSize;
use crate::zone_maps::ZoneMaps;

/// The most row groups one share may carry.
pub const MAX_UNITS: usize = 1 << 20;
/// The most columns one share may read.
pub const MAX_COLUMNS: usize = 4096;
/// The most partitions a share may be run in.
pub const MAX_PARTITIONS: usize = 4096;

impl BlobScanExec {
    /// How many row groups the scan reads.
    pub fn unit_count(&self) -> usize {
        self.units.len()
    }

    /// Each row group's identity, in plan order: its object's name and its
    /// index there. What a cluster hashes to find the row group's home.
    pub fn unit_identities(&self) -> Vec<(&str, usize)> {
        self.units.iter().map(|u| (u.object.name.as_str(), u.row_group)).collect()
    }

    /// The scan cut into `shares` disjoint scans: row group `i` goes to
    /// share `share_of[i]`. Every share keeps this scan's partitions and
    /// schema (a cluster runs each share as one task of a stage), re-cuts
    /// its own row groups into morsels, and carries no runtime filter.
    /// Errors when `share_of` does not give every row group exactly one
    /// share below `shares`: a row group read twice or never would change
    /// the answer.
    pub fn split(&self, share_of: &[usize], shares: usize) -> Result<Vec<BlobScanExec>> {
        if share_of.len() != self.units.len() {
            return Err(DataFusionError::Internal(format!("a split of the scan of {} names {} row groups; it reads {}", self.table, share_of.len(), self.units.len())));
        }
        if let Some(bad) = share_of.iter().find(|s| **s >= shares) {
            return Err(DataFusionError::Internal(format!("a split of the scan of {} into {shares} shares names share {bad}", self.table)));
        }
        if self.split.is_some() {
            return Err(DataFusionError::Internal(format!("the scan of {} is already split with a storage node", self.table)));
        }
        let mut units: Vec<Vec<ScanUnit>> = vec![Vec::new(); shares];
        for (unit, share) in self.units.iter().zip(share_of) {
            units[*share].push(unit.clone());
        }
        Ok(units
            .into_iter()
            .map(|mut units| {
                let morsels = assign_morsels(&mut units, self.partitions);
                let mut scan = self.rebuilt(None, None, units, self.partitions, self.properties.clone(), false);
                scan.metrics = ExecutionPlanMetricsSet::new();
                scan.counters = ScanCounters::new(&scan.metrics, self.source.download_manager().is_some());
                scan.summary = share_summary(&scan.units, morsels);
                scan
            })
            .collect())
    }
}

fn share_summary(units: &[ScanUnit], morsels: usize) -> PlanSummary {
    PlanSummary {
        row_groups_total: units.len(),
        bytes_planned: units.iter().map(ScanUnit::bytes).sum(),
        requests_planned: units.iter().map(|u| u.spans.iter().map(|s| s.requests.len()).sum::<usize>()).sum(),
        morsels,
        ..PlanSummary::default()
    }
}

/// What every scan a worker ran read, summed: how a test or a benchmark
/// shows that a cluster read each row group exactly once. Opt-in
/// ([`ScanCodec::with_tally`]); it grows with every scan.
#[derive(Debug, Default)]
pub struct ScanTally {
    scans: Mutex<Vec<TalliedScan>>,
}

#[derive(Debug)]
struct TalliedScan {
    row_groups: Vec<(String, usize)>,
    rows: u64,
    counters: ScanCounters,
}

impl ScanTally {
    /// Every (object, row group) the worker's scans were given, one entry
    /// per time given.
    pub fn row_groups(&self) -> Vec<(String, usize)> {
        self.scans.lock().expect("not poisoned").iter().flat_map(|s| s.row_groups.iter().cloned()).collect()
    }

    /// Rows of the row groups given (before deletions and selections).
    pub fn rows(&self) -> u64 {
        self.scans.lock().expect("not poisoned").iter().map(|s| s.rows).sum()
    }

    /// Row groups the scans read (from the store or the tiers), GET requests
    /// and bytes fetched from the store, and bytes the memory and SSD tiers
    /// served.
    pub fn read(&self) -> TallyRead {
        let scans = self.scans.lock().expect("not poisoned");
        let sum = |f: &dyn Fn(&ScanCounters) -> usize| scans.iter().map(|s| f(&s.counters) as u64).sum();
        TallyRead {
            row_groups_read: sum(&|c| c.row_groups_read.value()),
            get_requests: sum(&|c| c.get_requests.value()),
            bytes_fetched: sum(&|c| c.bytes_fetched.value()),
            tier_bytes: sum(&|c| c.memory_bytes.value() + c.ssd_bytes.value()),
        }
    }

    /// Forgets what was tallied.
    pub fn clear(&self) {
        self.scans.lock().expect("not poisoned").clear();
    }
}

/// [`ScanTally::read`]'s sums.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TallyRead {
    pub row_groups_read: u64,
    pub get_requests: u64,
    pub bytes_fetched: u64,
    pub tier_bytes: u64,
}

/// Encodes [`BlobScanExec`] for datafusion-proto and, with a reader,
/// decodes it into a scan that reads through this process's engine.
#[derive(Debug, Default)]
pub struct ScanCodec {
    reader: Option<Reader>,
}

#[derive(Debug)]
struct Reader {
    source: DataSource,
    location: Location,
    metadata: Arc<MetadataCache>,
    scheduler: SchedulerOptions,
    tally: Option<Arc<ScanTally>>,
    /// The database's data-object decryption, when it is encrypted.
    decryption: Option<Arc<parquet::encryption::decrypt::FileDecryptionProperties>>,
}

impl ScanCodec {
    /// A codec that decodes scans reading through `source` (an engine's
    /// download manager and caching tiers) and `metadata` (its footer
    /// cache), under the database at `location`, paced by `scheduler`
    /// (`Engine::scan_codec` gives an engine's), decrypting with
    /// `decryption` in an encrypted database.
    pub fn reading(
        source: DataSource,
        location: Location,
        metadata: Arc<MetadataCache>,
        scheduler: SchedulerOptions,
        decryption: Option<Arc<parquet::encryption::decrypt::FileDecryptionProperties>>,
    ) -> Self {
        ScanCodec { reader: Some(Reader { source, location, metadata, scheduler, tally: None, decryption }) }
    }

    /// Also adds every decoded scan to `tally`.
    pub fn with_tally(mut self, tally: Arc<ScanTally>) -> Self {
        if let Some(r) = &mut self.reader {
            r.tally = Some(tally);
        }
        self
    }
}

fn invalid(what: impl Into<String>) -> DataFusionError {
    DataFusionError::Plan(what.into())
}

/// A [`BlobScanExec`] on the wire.
#[derive(Clone, PartialEq, prost::Message)]
struct ScanNode {
    #[prost(string, tag = "1")]
    table: String,
    #[prost(message, optional, tag = "2")]
    schema: Option<protobuf::Schema>,
    #[prost(uint32, repeated, tag = "3")]
    projection: Vec<u32>,
    #[prost(uint32, tag = "4")]
    row_id_column: u32,
    #[prost(uint32, tag = "5")]
    partitions: u32,
    #[prost(uint64, tag = "6")]
    batch_size: u64,
    #[prost(string, repeated, tag = "7")]
    filters: Vec<String>,
    #[prost(message, repeated, tag = "8")]
    objects: Vec<ObjectNode>,
    #[prost(message, repeated, tag = "9")]
    units: Vec<UnitNode>,
}

/// A data object a share reads.
#[derive(Clone, PartialEq, prost::Message)]
struct ObjectNode {
    /// Its name relative to the database root.
    #[prost(string, tag = "1")]
    name: String,
    #[prost(uint64, tag = "2")]
    size: u64,
    #[prost(uint32, tag = "3")]
    ordinal: u32,
    /// Its Parquet metadata as a file tail; workers decode it without the
    /// page index.
    #[prost(bytes = "vec", tag = "4")]
    footer: Vec<u8>,
    /// A serialized roaring bitmap of deleted rows; empty for none.
    #[prost(bytes = "vec", tag = "5")]
    deleted: Vec<u8>,
}

/// A row group a share reads.
#[derive(Clone, PartialEq, prost::Message)]
struct UnitNode {
    /// Index of its object in [`ScanNode::objects`].
    #[prost(uint32, tag = "1")]
    object: u32,
    #[prost(uint32, tag = "2")]
    row_group: u32,
    #[prost(uint64, tag = "3")]
    rows: u64,
    #[prost(uint64, tag = "4")]
    first_row: u64,
    #[prost(message, optional, tag = "5")]
    selection: Option<SelectionNode>,
    /// Start and end of each column chunk, in projection order.
    #[prost(uint64, repeated, tag = "6")]
    chunks: Vec<u64>,
    #[prost(message, repeated, tag = "7")]
    spans: Vec<SpanNode>,
    /// Per chunk, its decoded size estimate.
    #[prost(uint64, repeated, tag = "8")]
    decoded_bytes: Vec<u64>,
    #[prost(bool, repeated, tag = "9")]
    decoded_fixed: Vec<bool>,
    #[prost(uint32, tag = "10")]
    morsels: u32,
    /// Per chunk, its checksum as written; empty for an object written
    /// before checksums were kept.
    #[prost(uint64, repeated, tag = "11")]
    checksums: Vec<u64>,
}

/// A span and its requests.
#[derive(Clone, PartialEq, prost::Message)]
struct SpanNode {
    #[prost(uint64, tag = "1")]
    start: u64,
    #[prost(uint64, tag = "2")]
    end: u64,
    /// Start and end of each request.
    #[prost(uint64, repeated, tag = "3")]
    requests: Vec<u64>,
}

fn pairs(bounds: &[u64], what: &str) -> Result<Vec<Range<u64>>> {
    if !bounds.len().is_multiple_of(2) {
        return Err(invalid(format!("{what} has an odd number of bounds")));
    }
    bounds
        .chunks_exact(2)
        .map(|b| if b[0] <= b[1] { Ok(b[0]..b[1]) } else { Err(invalid(format!("{what} has a range that ends before it starts"))) })
        .collect()
}

fn external(e: impl std::error::Error + Send + Sync + 'static) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

impl PhysicalExtensionCodec for ScanCodec {
    fn try_encode(&self, node: Arc<dyn ExecutionPlan>, buf: &mut Vec<u8>, _: &dyn PhysicalProtoConverterExtension) -> Result<()> {
        let Some(scan) = node.downcast_ref::<BlobScanExec>() else {
            return Err(invalid(format!("{} is not a blobhouse scan", node.name())));
        };
        if scan.split.is_some() {
            return Err(invalid(format!("the scan of {} shares its row groups with a storage node and cannot leave its process", scan.table)));
        }
        let mut objects: Vec<ObjectNode> = Vec::new();
        let mut index: HashMap<*const ScanObject, u32> = HashMap::new();
        let mut units = Vec::with_capacity(scan.units.len());
        for u in &scan.units {
            let key = Arc::as_ptr(&u.object);
            let object = match index.get(&key) {
                Some(i) => *i,
                None => {
                    let mut footer = Vec::new();
                    match &u.object.encrypted_footer {
                        // Encrypted: the stored footer as a file tail.
                        Some(stored) => {
                            footer.extend_from_slice(stored);
                            footer.extend_from_slice(&(stored.len() as u32).to_le_bytes());
                            footer.extend_from_slice(b"PARE");
                        }
                        None => ParquetMetaDataWriter::new(&mut footer, u.object.reader.metadata()).finish().map_err(external)?,
                    }
                    let mut deleted = Vec::new();
                    if let Some(d) = &u.object.deleted {
                        d.serialize_into(&mut deleted).map_err(external)?;
                    }
                    objects.push(ObjectNode { name: u.object.name.clone(), size: u.object.size, ordinal: u.object.ordinal, footer, deleted });
                    let i = objects.len() as u32 - 1;
                    index.insert(key, i);
                    i
                }
            };
            units.push(UnitNode {
                object,
                row_group: u.row_group as u32,
                rows: u.rows,
                first_row: u.first_row,
                selection: u.selection.as_deref().map(|s| SelectionNode::of(Some(s))),
                chunks: u.chunks.iter().flat_map(|c| [c.start, c.end]).collect(),
                checksums: u.checksums.clone().unwrap_or_default(),
                spans: u.spans.iter().map(|s| SpanNode { start: s.range.start, end: s.range.end, requests: s.requests.iter().flat_map(|r| [r.start, r.end]).collect() }).collect(),
                decoded_bytes: u.decoded.iter().map(|d| d.bytes).collect(),
                decoded_fixed: u.decoded.iter().map(|d| d.fixed_width).collect(),
                morsels: u.morsels as u32,
            });
        }
        ScanNode {
            table: scan.table.clone(),
            schema: Some(protobuf::Schema::try_from(scan.schema.as_ref()).map_err(|e| invalid(e.to_string()))?),
            projection: scan.projection.iter().map(|c| *c as u32).collect(),
            row_id_column: scan.row_id_column as u32,
            partitions: scan.partitions as u32,
            batch_size: scan.batch_size as u64,
            filters: scan.filters.clone(),
            objects,
            units,
        }
        .encode(buf)
        .map_err(external)
    }

    fn try_decode(&self, buf: &[u8], inputs: &[Arc<dyn ExecutionPlan>], _: &TaskContext, _: &dyn PhysicalProtoConverterExtension) -> Result<Arc<dyn ExecutionPlan>> {
        let Some(reader) = &self.reader else {
            return Err(invalid("this process plans scans for workers and does not run them"));
        };
        if !inputs.is_empty() {
            return Err(invalid("a blobhouse scan has no inputs"));
        }
        let node = ScanNode::decode(buf).map_err(|e| invalid(format!("a blobhouse scan does not decode: {e}")))?;
        Ok(Arc::new(reader.scan(node)?))
    }
}

impl Reader {
    fn scan(&self, node: ScanNode) -> Result<BlobScanExec> {
        let table = node.table;
        let bad = |what: String| invalid(format!("the scan of {table} sent to this worker: {what}"));
        if node.units.len() > MAX_UNITS {
            return Err(bad(format!("{} row groups, more than {MAX_UNITS}", node.units.len())));
        }
        if node.projection.len() > MAX_COLUMNS {
            return Err(bad(format!("{} columns, more than {MAX_COLUMNS}", node.projection.len())));
        }
        let partitions = node.partitions as usize;
        if partitions == 0 || partitions > MAX_PARTITIONS {
            return Err(bad(format!("{partitions} partitions (1 to {MAX_PARTITIONS})")));
        }
        let schema = node.schema.as_ref().ok_or_else(|| bad("no schema".into()))?;
        let schema = Arc::new(Schema::try_from(schema).map_err(|e| bad(format!("its schema does not decode: {e}")))?);
        if schema.fields().len() != node.projection.len() {
            return Err(bad(format!("{} columns and a schema of {}", node.projection.len(), schema.fields().len())));
        }
        let objects = node.objects.into_iter().map(|o| self.object(o, &table)).collect::<Result<Vec<_>>>()?;
        let mut units = Vec::with_capacity(node.units.len());
        for (index, u) in node.units.into_iter().enumerate() {
            let object = objects.get(u.object as usize).ok_or_else(|| bad(format!("row group {index} names object {} of {}", u.object, objects.len())))?.clone();
            let what = format!("row group {} of {}", u.row_group, object.display);
            if u.row_group as usize >= object.reader.metadata().num_row_groups() {
                return Err(bad(format!("{what}: the object has {} row groups", object.reader.metadata().num_row_groups())));
            }
            let chunks = pairs(&u.chunks, &what)?;
            if chunks.len() != u.decoded_bytes.len() || chunks.len() != u.decoded_fixed.len() {
                return Err(bad(format!("{what}: {} chunks and {} decoded sizes", chunks.len(), u.decoded_bytes.len())));
            }
            let checksums = match u.checksums.len() {
                0 => None,
                n if n == chunks.len() => Some(u.checksums.clone()),
                n => return Err(bad(format!("{what}: {} chunks and {n} checksums", chunks.len()))),
            };
            let spans = u
                .spans
                .iter()
                .map(|s| {
                    let requests = pairs(&s.requests, &what)?;
                    let inside = s.start <= s.end && s.end <= object.size && requests.iter().all(|r| r.start >= s.start && r.end <= s.end);
                    if !inside {
                        return Err(bad(format!("{what}: a request outside the object's {} bytes", object.size)));
                    }
                    Ok(Span { range: s.start..s.end, requests })
                })
                .collect::<Result<Vec<_>>>()?;
            units.push(ScanUnit {
                index,
                object,
                row_group: u.row_group as usize,
                rows: u.rows,
                first_row: u.first_row,
                selection: u.selection.map(|s| s.ranges(&what)).transpose()?.flatten(),
                chunks,
                checksums,
                // Workers read whole chunks (checked by `checksums`).
                pages: Vec::new(),
                spans,
                decoded: u.decoded_bytes.iter().zip(&u.decoded_fixed).map(|(b, f)| DecodedSize { bytes: *b, fixed_width: *f }).collect(),
                morsels: (u.morsels as usize).max(1),
            });
        }
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(partitions),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        let metrics = ExecutionPlanMetricsSet::new();
        let counters = ScanCounters::new(&metrics, self.source.download_manager().is_some());
        if let Some(tally) = &self.tally {
            tally.scans.lock().expect("not poisoned").push(TalliedScan {
                row_groups: units.iter().map(|u| (u.object.name.clone(), u.row_group)).collect(),
                rows: units.iter().map(|u| u.rows).sum(),
                counters: counters.clone(),
            });
        }
        let morsels = units.iter().map(|u| u.morsels).sum();
        // No runtime filter runs here: zone maps of no column.
        let schema_for_maps = schema.clone();
        let rows = units.iter().map(|u| u.selection.as_ref().map_or(u.rows, |s| s.selected())).sum();
        Ok(BlobScanExec {
            summary: share_summary(&units, morsels),
            table,
            source: self.source.clone(),
            column_stats: vec![datafusion::common::ColumnStatistics::new_unknown(); schema.fields().len()],
            histograms: vec![None; schema.fields().len()],
            schema,
            projection: node.projection.iter().map(|c| *c as usize).collect(),
            row_id_column: node.row_id_column as usize,
            units,
            partitions,
            filters: node.filters,
            batch_size: (node.batch_size as usize).clamp(1, 1 << 20),
            rows,
            metrics,
            properties,
            scheduler: self.scheduler.clone(),
            counters,
            run: Arc::default(),
            download_cpu: Arc::default(),
            unit_zone_maps: Arc::new(ZoneMaps::new(self.metadata.bounds(), &schema_for_maps, &[], &[])),
            runtime_filters: None,
            pushed_predicate: None,
            split: None,
            tiers_planned: false,
        })
    }

    /// An object of a share: its name checked and resolved under this
    /// worker's database, its footer decoded (or taken from the cache).
    fn object(&self, o: ObjectNode, table: &str) -> Result<Arc<ScanObject>> {
        if parse_object_name(&o.name, "parquet").is_none() {
            return Err(invalid(format!("the scan of {table} sent to this worker names {:?}, which is not a data object of a database", o.name)));
        }
        let path = self.location.child(&o.name);
        let display = self.location.display(&path);
        let footer = Bytes::from(o.footer);
        let reader: ArrowReaderMetadata = self.metadata.footer_from_tail(&o.name, &display, || {
            // Without the page index: the coordinator already turned it into
            // row selections, and the index's offsets in the footer point
            // into the object, not into this tail.
            ParquetMetaDataReader::new().with_page_index_policy(PageIndexPolicy::Skip).with_decryption_properties(self.decryption.clone()).parse_and_finish(&footer)
        })?;
        let deleted = if o.deleted.is_empty() {
            None
        } else {
            Some(Arc::new(RoaringBitmap::deserialize_from(&o.deleted[..]).map_err(|e| invalid(format!("the deleted rows of {display} do not decode: {e}")))?))
        };
        Ok(Arc::new(ScanObject { path, name: o.name, display, size: o.size, reader, ordinal: o.ordinal, deleted, footer_checksum: None, page_index_checksum: None, encrypted_footer: None }))
    }
}
