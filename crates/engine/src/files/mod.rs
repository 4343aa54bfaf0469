//! Files queried in place: Parquet and CSV files outside the database —
//! a local directory or any bucket, often hive-partitioned
//! (`sales/year=2024/region=eu/data_0.parquet`) — read by
//! `read_parquet(…)` / `read_csv(…)` in a FROM clause, by `CREATE EXTERNAL
//! TABLE … LOCATION …` tables, and by `COPY t FROM '<glob>'`.
//!
//! DataFusion's listing tables do the planning: globs, listing, partition
//! pruning from the path before any file is opened, and row-group pruning
//! from each footer's statistics. On a bucket the listing is a walk of
//! the directories, several at once (`store::walk`). Every byte they read
//! comes through [`store`]: our caching tiers and download manager, as the
//! database's own objects do.
//! A statement's listings are kept for the statement only
//! (`store::Listings`), so the next statement sees files added or
//! removed meanwhile.
//!
//! As in DuckDB: the columns are the first file's (by path), and
//! partition columns are typed from the values in the paths — all
//! integers → BIGINT, all dates → DATE, otherwise VARCHAR.

pub mod access;
pub mod store;

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Schema, SchemaRef};
use datafusion::catalog::Session;
use datafusion::catalog::TableProvider;
use datafusion::datasource::file_format::FileFormat;
use datafusion::datasource::file_format::csv::CsvFormat;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::{ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl};
use datafusion::error::DataFusionError;
use futures::TryStreamExt;

use blobhouse_storage::format::ExternalTable;

use crate::EngineError;

pub use access::FileAccess;
pub use store::{FileRequest, FileStores};

/// The schema of a statement's catalog that holds its `read_parquet(…)`
/// and `read_csv(…)` tables (`crate::parser` renames the calls into it).
pub const FILES_SCHEMA: &str = "blobhouse_files";

/// The table name of the statement's `n`th file scan.
pub fn table_name(n: usize) -> String {
    format!("f{n}")
}

/// A path value hive writers use for NULL.
const HIVE_NULL: &str = "__HIVE_DEFAULT_PARTITION__";

/// How files are read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Format {
    Parquet,
    /// `header`: the first line names the columns; `delimiter`: one ASCII
    /// character.
    Csv { header: bool, delimiter: u8 },
}

impl Format {
    /// The name stored in an external table's definition.
    pub fn name(&self) -> &'static str {
        match self {
            Format::Parquet => "parquet",
            Format::Csv { .. } => "csv",
        }
    }

    fn file_format(&self) -> Arc<dyn FileFormat> {
        match self {
            Format::Parquet => Arc::new(ParquetFormat::default()),
            Format::Csv { header, delimiter } => Arc::new(CsvFormat::default().with_has_header(*header).with_delimiter(*delimiter)),
        }
    }

    /// The format an external table's definition names.
    pub fn of(table: &ExternalTable) -> Result<Format, EngineError> {
        match table.format.as_str() {
            "parquet" => Ok(Format::Parquet),
            "csv" => Ok(Format::Csv {
                header: table.options.get("header").is_none_or(|h| h == "true"),
                delimiter: table.options.get("delimiter").and_then(|d| d.bytes().next()).unwrap_or(b','),
            }),
            other => Err(EngineError::Unsupported(format!("external table format '{other}' is not known to this build; it reads parquet and csv"))),
        }
    }
}

/// Files a statement reads: a `read_parquet(…)` or `read_csv(…)` call, or
/// what `COPY … FROM` reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileScan {
    /// Paths, URLs or globs (`s3://b/sales/**/*.parquet`), read as one table.
    pub locations: Vec<String>,
    pub format: Format,
    /// Hive partitioning: `Some(true)` reads `key=value` directories as
    /// columns, `Some(false)` ignores them, `None` finds out (DuckDB's
    /// default).
    pub hive: Option<bool>,
    /// `union_by_name => true`: the columns of all files, matched by name
    /// (a file without one reads NULL there); otherwise the first file's.
    pub union_by_name: bool,
}

/// A location split where its glob starts: the directory (or file) URL
/// and the pattern below it. DataFusion splits globs of local paths only;
/// `s3://b/sales/*/*.parquet` is split here the same way.
fn split(location: &str) -> Result<(ListingTableUrl, Option<String>), EngineError> {
    let bad = |e: String| EngineError::Files { location: location.to_string(), message: format!("not a path, URL or glob: {e}") };
    let Some(at) = location.find(['*', '?', '[']) else {
        return ListingTableUrl::parse(location).map(|u| (u, None)).map_err(|e| bad(e.to_string()));
    };
    let cut = location[..at].rfind('/').map_or(0, |i| i + 1);
    let (base, pattern) = location.split_at(cut);
    let base = if base.is_empty() { "./" } else { base };
    let url = ListingTableUrl::parse(base).map_err(|e| bad(e.to_string()))?;
    glob::Pattern::new(pattern).map_err(|e| bad(format!("{pattern}: {e}")))?;
    Ok((url, Some(pattern.to_string())))
}

/// What one location names: the listing table's URL (with the glob as
/// DataFusion applies it) and each matching file's path segments below
/// the URL's prefix.
struct Resolved {
    url: ListingTableUrl,
    files: Vec<Vec<String>>,
    /// The first matching file (by path).
    first: object_store::ObjectMeta,
}

/// Lists `location`'s files once and matches the glob the way DuckDB and
/// shells do (`*` stays within one directory, `**` crosses them).
///
/// DataFusion matches a listing table's glob against the path *without*
/// its `key=value` segments, so `sales/*/*/*.parquet` would match no file
/// of a hive-partitioned dataset there; the glob it is given leaves out
/// the pattern's segments that stand for partition directories.
async fn resolve(state: &dyn Session, location: &str, extension: &str) -> Result<Resolved, EngineError> {
    let named = |message: String| EngineError::Files { location: location.to_string(), message };
    let (url, pattern) = split(location)?;
    let store = state.runtime_env().object_store(&url)?;
    let listed: Vec<_> = url.list_all_files(state, store.as_ref(), extension).await.map_err(|e| named(crate::error::describe_df(&e)))?.try_collect().await.map_err(|e| named(crate::error::describe_df(&e)))?;
    let options = glob::MatchOptions { case_sensitive: true, require_literal_separator: true, require_literal_leading_dot: false };
    let compiled = pattern.as_deref().map(glob::Pattern::new).transpose().map_err(|e| named(e.to_string()))?;
    let mut files = Vec::new();
    let mut first = None;
    // By path: a listing's order is the store's (or the walk's).
    let mut listed = listed;
    listed.sort_by(|a, b| a.location.cmp(&b.location));
    for meta in &listed {
        if meta.size == 0 {
            continue;
        }
        let Some(parts) = url.strip_prefix(&meta.location) else { continue };
        let parts: Vec<String> = parts.map(percent_decode).collect();
        if compiled.as_ref().is_none_or(|p| p.matches_with(&parts.join("/"), options)) {
            files.push(parts);
            first.get_or_insert_with(|| meta.clone());
        }
    }
    let Some(first) = first else {
        let what = if extension.is_empty() { String::new() } else { format!("{extension} ") };
        let hint = if pattern.is_some() { " (a glob's `*` stays within one directory; `**` crosses directories)" } else { "" };
        return Err(named(format!("no {what}file matches{hint}")));
    };
    let Some(pattern) = pattern else { return Ok(Resolved { url, files, first }) };
    // Which directory levels are partitions (`key=value`) in the files.
    let mut segments: Vec<&str> = pattern.split('/').collect();
    let file = segments.pop().unwrap_or("*");
    let hive_level = |i: usize| files.iter().any(|f| f.len() > i + 1 && f[i].contains('='));
    let kept: Vec<&str> = segments.iter().enumerate().filter(|(i, s)| !(s.contains('=') || (!pattern.contains("**") && hive_level(*i)))).map(|(_, s)| *s).collect();
    let datafusion_glob = kept.into_iter().chain(std::iter::once(file)).collect::<Vec<_>>().join("/");
    let url = url.with_glob(&datafusion_glob).map_err(|e| named(e.to_string()))?;
    Ok(Resolved { url, files, first })
}

fn options(format: &Format, locations: &[String]) -> ListingOptions {
    let options = ListingOptions::new(format.file_format());
    // A directory (`…/`) holds the format's files (not `_SUCCESS` and the
    // like); a file named, or a glob, chooses itself (`*.tbl`, `x.txt`).
    if locations.iter().all(|l| l.ends_with('/')) { options } else { options.with_file_extension("") }
}

/// The table `scan` reads: its files listed, the partition columns found
/// in their paths, the schema of the files merged.
pub(crate) async fn listing_table(state: &dyn Session, scan: &FileScan) -> Result<Arc<ListingTable>, EngineError> {
    listing_table_as(state, scan, None).await
}

/// [`listing_table`], reading the files' columns as `schema` when given
/// (COPY reads a CSV file as its table's columns, without inference).
pub(crate) async fn listing_table_as(state: &dyn Session, scan: &FileScan, schema: Option<SchemaRef>) -> Result<Arc<ListingTable>, EngineError> {
    let access = FileAccess::of(state.config());
    for location in &scan.locations {
        access.check(location)?;
    }
    let named = |message: String| EngineError::Files { location: scan.locations.join(", "), message };
    let mut options = options(&scan.format, &scan.locations);
    let mut resolved = Vec::with_capacity(scan.locations.len());
    for location in &scan.locations {
        resolved.push(resolve(state, location, &options.file_extension).await?);
    }
    let first = resolved.first().ok_or_else(|| named("no file named".into()))?;
    if scan.hive != Some(false) {
        let partitions = partition_columns(&first.files).map_err(named)?;
        if scan.hive == Some(true) && partitions.is_empty() {
            return Err(named("hive_partitioning => true, but no file is below a key=value directory".into()));
        }
        options = options.with_table_partition_cols(partitions);
    }
    // The columns are the first file's, as DuckDB reads them: a query of
    // one partition then opens no other partition's file.
    let schema = match schema {
        Some(s) => s,
        // Every file's footer (or header) is read, and the schemas merged.
        None if scan.union_by_name => options.infer_schema(state, &first.url).await.map_err(|e| named(crate::error::describe_df(&e)))?,
        None => {
            let store = state.runtime_env().object_store(&first.url)?;
            options.format.infer_schema(state, &store, std::slice::from_ref(&first.first)).await.map_err(|e| named(crate::error::describe_df(&e)))?
        }
    };
    let urls: Vec<ListingTableUrl> = resolved.into_iter().map(|r| r.url).collect();
    let config = ListingTableConfig::new_with_multi_paths(urls).with_listing_options(options).with_schema(schema);
    Ok(Arc::new(ListingTable::try_new(config)?))
}

/// The columns of every file at `location` (then those of its partition
/// directories), as `CREATE EXTERNAL TABLE` without a column list stores
/// them: the definition of an external table.
pub(crate) async fn define(state: &dyn Session, location: &str, format: &Format, hive: Option<bool>) -> Result<ExternalTable, EngineError> {
    let scan = FileScan { locations: vec![location.to_string()], format: format.clone(), hive, union_by_name: false };
    let table = listing_table(state, &scan).await?;
    let partition_columns = table.options().table_partition_cols.len();
    let mut options = std::collections::BTreeMap::new();
    if let Format::Csv { header, delimiter } = format {
        options.insert("header".to_string(), header.to_string());
        options.insert("delimiter".to_string(), (*delimiter as char).to_string());
    }
    Ok(ExternalTable {
        location: location.to_string(),
        format: format.name().to_string(),
        options,
        schema: table.schema().as_ref().clone(),
        partition_columns,
        created_at_ms: blobhouse_storage::format::now_ms(),
    })
}

/// The table an external table's definition reads: no I/O until a scan
/// lists its files.
pub(crate) fn external_table(name: &str, table: &ExternalTable) -> Result<Arc<ListingTable>, EngineError> {
    let format = Format::of(table)?;
    let (url, pattern) = split(&table.location)?;
    let fields = table.schema.fields();
    let split = fields.len().checked_sub(table.partition_columns).ok_or_else(|| {
        EngineError::Files { location: table.location.clone(), message: format!("external table '{name}' names more partition columns than columns") }
    })?;
    let file_schema: SchemaRef = Arc::new(Schema::new(fields[..split].to_vec()));
    let partitions = fields[split..].iter().map(|f| (f.name().clone(), f.data_type().clone())).collect();
    let options = options(&format, std::slice::from_ref(&table.location)).with_table_partition_cols(partitions);
    // The glob DataFusion applies leaves out partition segments (see
    // `resolve`); a definition's glob was checked when it was created.
    let url = match pattern {
        Some(p) => {
            let kept: Vec<&str> = p.split('/').filter(|s| !s.contains('=')).collect();
            let skip = if p.contains("**") { 0 } else { table.partition_columns.min(kept.len().saturating_sub(1)) };
            let glob = kept[skip..].join("/");
            url.with_glob(&glob).map_err(|e| EngineError::Files { location: table.location.clone(), message: e.to_string() })?
        }
        None => url,
    };
    let config = ListingTableConfig::new(url).with_listing_options(options).with_schema(file_schema);
    Ok(Arc::new(ListingTable::try_new(config)?))
}

/// Why external table `name` cannot be changed, and what to do instead.
pub(crate) fn read_only(name: &str) -> String {
    format!("'{name}' is an external table: its files are read in place and blobhouse does not change them; CREATE TABLE … AS SELECT * FROM {name} makes a table you can change")
}

/// An external table as statements see it: read only — blobhouse never
/// writes into files it does not own.
#[derive(Debug)]
pub(crate) struct ReadOnly {
    name: String,
    /// Where its files are: checked against the reading session's
    /// [`FileAccess`] at each scan (another user may have created it).
    location: String,
    inner: Arc<dyn TableProvider>,
}

impl ReadOnly {
    pub(crate) fn new(name: &str, location: &str, inner: Arc<dyn TableProvider>) -> ReadOnly {
        ReadOnly { name: name.to_string(), location: location.to_string(), inner }
    }

    fn check(&self, state: &dyn Session) -> datafusion::error::Result<()> {
        FileAccess::of(state.config()).check(&self.location).map_err(|e| DataFusionError::External(Box::new(e)))
    }
}

#[async_trait::async_trait]
impl TableProvider for ReadOnly {
    fn schema(&self) -> SchemaRef {
        self.inner.schema()
    }

    fn table_type(&self) -> datafusion::datasource::TableType {
        datafusion::datasource::TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[datafusion::prelude::Expr],
        limit: Option<usize>,
    ) -> datafusion::error::Result<Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
        self.check(state)?;
        self.inner.scan(state, projection, filters, limit).await
    }

    async fn scan_with_args<'a>(&self, state: &dyn Session, args: datafusion::catalog::ScanArgs<'a>) -> datafusion::error::Result<datafusion::catalog::ScanResult> {
        self.check(state)?;
        self.inner.scan_with_args(state, args).await
    }

    fn supports_filters_pushdown(&self, filters: &[&datafusion::prelude::Expr]) -> datafusion::error::Result<Vec<datafusion::logical_expr::TableProviderFilterPushDown>> {
        self.inner.supports_filters_pushdown(filters)
    }

    async fn insert_into(
        &self,
        _state: &dyn Session,
        _input: Arc<dyn datafusion::physical_plan::ExecutionPlan>,
        _op: datafusion::logical_expr::dml::InsertOp,
    ) -> datafusion::error::Result<Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
        Err(DataFusionError::Plan(read_only(&self.name)))
    }
}

/// The `key=value` directories of `files` (path segments below the
/// table's prefix) as typed columns: the same keys in the same order for
/// every file, else an error naming two files that differ.
fn partition_columns(files: &[Vec<String>]) -> Result<Vec<(String, DataType)>, String> {
    let mut keys: Option<(Vec<String>, String)> = None;
    let mut values: Vec<Vec<String>> = Vec::new();
    for parts in files {
        let dirs = &parts[..parts.len().saturating_sub(1)];
        let pairs: Vec<(&str, &str)> = dirs.iter().filter_map(|d| d.split_once('=')).collect();
        let names: Vec<String> = pairs.iter().map(|(k, _)| k.to_string()).collect();
        match &keys {
            None => {
                values = vec![Vec::new(); names.len()];
                keys = Some((names, parts.join("/")));
            }
            Some((k, first)) if *k != names => {
                return Err(format!(
                    "files are partitioned differently: {first} by ({}), {} by ({}); read them separately or give hive_partitioning => false",
                    k.join(", "),
                    parts.join("/"),
                    names.join(", ")
                ));
            }
            Some(_) => {}
        }
        for (i, (_, v)) in pairs.iter().enumerate() {
            values[i].push(v.to_string());
        }
    }
    let Some((names, _)) = keys else { return Ok(Vec::new()) };
    Ok(names.into_iter().zip(values).map(|(n, v)| (n, value_type(&v))).collect())
}

/// The narrowest type every value of a partition column reads as.
fn value_type(values: &[String]) -> DataType {
    if values.iter().any(|v| v == HIVE_NULL) {
        return DataType::Utf8;
    }
    if !values.is_empty() && values.iter().all(|v| v.parse::<i64>().is_ok()) {
        return DataType::Int64;
    }
    if !values.is_empty() && values.iter().all(|v| is_date(v)) {
        return DataType::Date32;
    }
    DataType::Utf8
}

/// `YYYY-MM-DD` with a month and day that exist in some year.
fn is_date(v: &str) -> bool {
    let b = v.as_bytes();
    let digits = |r: std::ops::Range<usize>| b[r.clone()].iter().all(u8::is_ascii_digit).then(|| v[r].parse::<u32>().unwrap_or(0));
    b.len() == 10 && b[4] == b'-' && b[7] == b'-' && digits(0..4).is_some() && digits(5..7).is_some_and(|m| (1..=12).contains(&m)) && digits(8..10).is_some_and(|d| (1..=31).contains(&d))
}

/// A path segment's `%XX` escapes decoded (as hive writers escape `/`, `=`, …).
fn percent_decode(v: &str) -> String {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match (b[i], b.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok()).and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A column list given to `CREATE EXTERNAL TABLE` checked against the
/// columns found in the files: the same names, in any order, and types
/// the files' values cast to. The stored schema is the one given.
pub(crate) fn check_columns(location: &str, given: &Schema, found: &Schema) -> Result<(), EngineError> {
    for f in given.fields() {
        let Some(file) = found.fields().iter().find(|g| g.name() == f.name()) else {
            let names: Vec<&str> = found.fields().iter().map(|g| g.name().as_str()).collect();
            return Err(EngineError::Files { location: location.to_string(), message: format!("column '{}' is not in the files, which have {}", f.name(), names.join(", ")) });
        };
        if !datafusion::arrow::compute::can_cast_types(file.data_type(), f.data_type()) {
            return Err(EngineError::Files {
                location: location.to_string(),
                message: format!("column '{}' is {} in the files and cannot be read as {}", f.name(), file.data_type(), f.data_type()),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_values_are_typed_as_duckdb_types_them() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(value_type(&s(&["2023", "2024"])), DataType::Int64);
        assert_eq!(value_type(&s(&["2024-01-31", "2024-02-01"])), DataType::Date32);
        assert_eq!(value_type(&s(&["eu", "2024"])), DataType::Utf8);
        assert_eq!(value_type(&s(&["1", HIVE_NULL])), DataType::Utf8);
        assert_eq!(value_type(&s(&["2024-13-01"])), DataType::Utf8);
        let (url, glob) = split("s3://b/sales/*/x*.parquet").unwrap();
        assert_eq!((url.as_str(), glob.as_deref()), ("s3://b/sales/", Some("*/x*.parquet")));
        let (url, glob) = split("s3://b/sales/").unwrap();
        assert_eq!((url.as_str(), glob), ("s3://b/sales/", None));
        assert_eq!(percent_decode("a%2Fb%3Dc%"), "a/b=c%");
    }
}
