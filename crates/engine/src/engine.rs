//! [`Engine`]: one open database and everything a process holds for it —
//! the storage handle, the download manager, the memory budget, the
//! caching tiers, the footer cache, the storage node's client and the
//! DataFusion state every statement starts from. It is shared: every
//! `Session` (a shell, a server connection, a benchmark's client) and,
//! next, every cluster worker reads through the same one. Nothing in it
//! belongs to one connection; that is the session's.

use std::path::PathBuf;
use std::sync::Arc;

use datafusion::catalog::{CatalogProvider, CatalogProviderList, MemoryCatalogProvider, MemoryCatalogProviderList};
use datafusion::execution::context::SessionContext;
use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::session_state::{SessionState, SessionStateBuilder};
use datafusion::prelude::SessionConfig;

use blobhouse_io::DownloadManager;
use blobhouse_storage::format::CatalogVersion;
use blobhouse_storage::{Database, Location, StorageError, StoreOptions, open_location};

use crate::memory::MemoryBudget;
use crate::options::{CATALOG, SKIP_PARTIAL_AGGREGATION_RATIO, collect_left_bytes, sort_merge_reservation};
use crate::provider::{BlobSchemaProvider, DML_SCHEMA, Scope};
use crate::scan::MetadataCache;
use crate::source::DataSource;
use crate::time_travel::AsOf;
use crate::{EngineError, EngineOptions, selectivity};

/// An open database, shared by its sessions (cheap to clone).
#[derive(Clone)]
pub struct Engine {
    shared: Arc<Shared>,
}

struct Shared {
    db: Arc<Database>,
    /// The DataFusion state sessions start from: configuration, runtime
    /// (memory pool, spill directories), functions, optimizer rules, and
    /// the schemas an embedder adds beside the tables.
    base: SessionContext,
    options: Arc<EngineOptions>,
    source: DataSource,
    memory: MemoryBudget,
    /// The tables; each statement gets a copy bound to its [`Scope`].
    tables: Arc<BlobSchemaProvider>,
    pushdown: Option<Arc<crate::hybrid::Pushdown>>,
    /// What a layer above changes in every statement's state (the
    /// cluster's distributed planning), if anything.
    extension: std::sync::RwLock<Option<Arc<dyn crate::StatementExtension>>>,
    /// The metadata scans keep (footers, zone maps), shared with workers'
    /// scans decoded in this process.
    metadata: Arc<MetadataCache>,
    /// The stores of files queried in place, opened on first use
    /// ([`crate::files::store`]).
    files: Arc<crate::files::FileStores>,
}

impl Engine {
    /// Opens the database at `url`, creating it if needed unless
    /// [`EngineOptions::create_missing`] says not to.
    pub async fn open(url: &str, store_options: &StoreOptions, options: EngineOptions) -> Result<Engine, EngineError> {
        let loc = open_location(url, store_options)?;
        Self::open_location(loc, store_options.clone(), options).await
    }

    /// Opens the database at an already-built location (tests wrap stores).
    pub async fn open_location(loc: Location, store_options: StoreOptions, options: EngineOptions) -> Result<Engine, EngineError> {
        let source = match (&options.download, &loc.signer) {
            (Some(dm), Some(signer)) => {
                let dm = DownloadManager::new(dm.clone()).map_err(EngineError::DownloadManager)?;
                DataSource::managed(loc.store.clone(), dm, signer.clone())
            }
            _ => DataSource::store(loc.store.clone()),
        };
        let db = Database::open_with(loc, options.create_missing, options.key_block_ttl).await?;
        let options = Arc::new(options);
        let mut config = SessionConfig::new()
            .with_default_catalog_and_schema(CATALOG, "public")
            .with_information_schema(true)
            .with_target_partitions(options.target_partitions)
            .with_batch_size(options.batch_size);
        config.options_mut().execution.sort_spill_reservation_bytes = sort_merge_reservation(options.memory_limit);
        // Join sides are chosen with our filter estimates ([`crate::selectivity`]).
        config.options_mut().optimizer.use_statistics_registry = true;
        // A hash table up to this size is built once and shared by all
        // partitions (the probe side is then not repartitioned). DataFusion's
        // 1 MiB default came from compressed sizes; in decoded bytes SF 10's
        // `supplier` keys are 5 MiB, and sharing them made Q2, Q7 and Q11
        // 25–40 % faster (docs/notes/2026-11-23-join-estimates.md). With
        // fewer partitions, larger tables pay ([`collect_left_bytes`]).
        config.options_mut().optimizer.hash_join_single_partition_threshold = collect_left_bytes(options.target_partitions);
        // A partial aggregation stops aggregating (and passes rows on to the
        // final one) when its groups are at least this share of its rows.
        // DataFusion's 0.8 keeps a partial aggregation that only reduces 4×
        // (TPC-H Q18: 60 M line items into 15 M orders), which then costs
        // about as much as the final one. At 0.1, SF 10 Q18 took 4.4–4.8 s
        // against 5.2–5.4 s at 2 threads, Q3, Q10, Q13 within noise
        // (docs/notes/2026-11-27-issue43-scaling.md, sixth session).
        config.options_mut().execution.skip_partial_aggregation_probe_ratio_threshold = SKIP_PARTIAL_AGGREGATION_RATIO;
        let memory = MemoryBudget::new(options.memory_limit);
        let spill_mode = match &options.spill.dir {
            // Spill files are plaintext Arrow: an encrypted database keeps
            // its rows off local disk unless the user allows it.
            _ if db.keyring().is_some() && !options.spill.allow_plaintext => DiskManagerMode::Disabled,
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(|source| EngineError::SpillDir { dir: dir.clone(), source })?;
                DiskManagerMode::Directories(vec![dir.clone()])
            }
            None => DiskManagerMode::OsTmpDirectory,
        };
        let tiers = crate::tiers::Tiers::new(&options.cache, options.memory_limit, &memory.pool(), options.requests.clone());
        if let Some(t) = &tiers {
            let weak: std::sync::Weak<dyn crate::memory::Reclaim> = Arc::downgrade(t) as std::sync::Weak<dyn crate::memory::Reclaim>;
            memory.set_reclaimer(weak);
            if t.ssd().is_some() {
                db.observe_uploads(Arc::new(crate::tiers::WriteThrough { tiers: t.clone(), location: db.location().clone() }));
            }
        }
        let source = source.with_tiers(tiers);
        let metadata = Arc::new(MetadataCache::new(&memory.pool()));
        db.account_caches_in(&memory.pool());
        let log = options.record_file_requests.then(crate::files::store::RequestLog::default);
        let files = Arc::new(crate::files::FileStores::new(&db.location().url, &store_options, source.clone(), log));
        // Workers' tasks run on this runtime too: they read files in place
        // through the same stores (their counters go nowhere).
        let mut runtime = RuntimeEnvBuilder::new();
        // Listings are the statement's ([`crate::files::store`]): none is
        // kept across statements, where files come and go.
        runtime.cache_manager.list_files_cache_limit = 0;
        let runtime = runtime
            .with_object_store_registry(Arc::new(crate::files::store::StatementFiles::new(files.clone(), Arc::default())))
            .with_memory_pool(memory.pool())
            .with_disk_manager_builder(DiskManagerBuilder::default().with_mode(spill_mode).with_max_temp_directory_size(options.spill.max_bytes));
        let pushdown = match &options.pushdown {
            Some(p) => Some(crate::hybrid::Pushdown::new(p.clone()).map_err(EngineError::Pushdown)?),
            None => None,
        };
        let mut state = SessionStateBuilder::new()
            .with_config(config)
            .with_runtime_env(runtime.build_arc()?)
            .with_default_features()
            .with_statistics_registry(selectivity::registry())
            // Last among the logical rules: it matches the joins that
            // DataFusion's decorrelation leaves (TPC-H Q17's scalar subquery).
            .with_optimizer_rule(Arc::new(crate::subquery::SubqueryWindowRule))
            // Q11's HAVING against the total of its own joins.
            .with_optimizer_rule(Arc::new(crate::subquery::SubqueryTotalRule));
        // Ours last, over the final plan: DataFusion's rules place the
        // filters and split the aggregations first.
        let mut rules = datafusion::physical_optimizer::optimizer::PhysicalOptimizer::new().rules;
        // Right after DataFusion's join selection, before repartitions and
        // dynamic filters are placed: builds on the side with fewer rows.
        if let Some(i) = rules.iter().position(|r| r.name() == "join_selection") {
            rules.insert(i + 1, Arc::new(crate::build_side::BuildSideRule));
        }
        if let Some(p) = &pushdown {
            rules.push(Arc::new(crate::hybrid::HybridRule::new(p.clone())));
            rules.push(Arc::new(crate::bloom_join::BloomRule::new(p.clone())));
        }
        rules.push(Arc::new(crate::key_transfer::KeyTransferRule));
        rules.push(Arc::new(crate::decimal64::Decimal64Rule));
        // Before the adaptive filter: it estimates subplans with DataFusion's
        // statistics, which cannot read an adaptive conjunction.
        rules.push(Arc::new(crate::shared_subplan::SharedSubplanRule));
        rules.push(Arc::new(crate::adaptive_filter::AdaptiveFilterRule));
        state = state.with_physical_optimizer_rules(rules);
        let base = SessionContext::new_with_state(state.build());
        let tables = Arc::new(BlobSchemaProvider::new(db.clone(), options.clone(), metadata.clone(), source.clone()));
        base.catalog(CATALOG).expect("the default catalog exists").register_schema("public", tables.clone())?;
        Ok(Engine { shared: Arc::new(Shared { db, base, options, source, memory, tables, pushdown, extension: Default::default(), metadata, files }) })
    }

    /// The DataFusion context sessions start from. Embedders extend it
    /// before connecting sessions: functions they register are callable in
    /// every statement, and schemas they add to its default catalog (beside
    /// `public`, the tables) are visible to every statement — how the
    /// server adds PostgreSQL's `pg_catalog`.
    pub fn base_context(&self) -> &SessionContext {
        &self.shared.base
    }

    /// Installs (or with `None` removes) what a layer above changes in every
    /// statement's DataFusion state from the next statement on
    /// ([`crate::extension`]).
    pub fn set_statement_extension(&self, extension: Option<Arc<dyn crate::StatementExtension>>) {
        *self.shared.extension.write().expect("not poisoned") = extension;
    }

    /// The statement extension installed, if any.
    pub fn statement_extension(&self) -> Option<Arc<dyn crate::StatementExtension>> {
        self.shared.extension.read().expect("not poisoned").clone()
    }

    /// A codec that runs scans sent by a coordinator through this engine
    /// (a worker's): its download manager, tiers, footer cache and
    /// scheduler, under its database prefix.
    pub fn scan_codec(&self) -> crate::scan::ScanCodec {
        crate::scan::ScanCodec::reading(
            self.shared.source.clone(),
            self.shared.db.location().clone(),
            self.shared.metadata.clone(),
            self.shared.options.scan.clone(),
            self.shared.db.decryption().cloned(),
        )
    }

    /// Every request sent for files queried in place so far, when
    /// [`EngineOptions::record_file_requests`] is set.
    pub fn file_requests(&self) -> Vec<crate::files::FileRequest> {
        self.shared.files.requests()
    }

    /// The stores of files queried in place (DataFusion's object store
    /// registry of every statement).
    pub(crate) fn file_stores(&self) -> &Arc<crate::files::FileStores> {
        &self.shared.files
    }

    /// The storage handle.
    pub fn database(&self) -> &Arc<Database> {
        &self.shared.db
    }

    /// The options it was opened with.
    pub fn options(&self) -> &EngineOptions {
        &self.shared.options
    }

    /// The engine's memory budget (limit, what is reserved, peaks).
    pub fn memory(&self) -> &MemoryBudget {
        &self.shared.memory
    }

    /// The download manager reading this database's data, if any (stores
    /// that presign to plain HTTP; see [`DataSource`]).
    pub fn download_manager(&self) -> Option<&DownloadManager> {
        self.shared.source.download_manager()
    }

    /// The reader of its data ranges (download manager or object_store).
    pub fn source(&self) -> &DataSource {
        &self.shared.source
    }

    /// The caching tiers its scans consult, if any.
    pub fn tiers(&self) -> Option<&Arc<crate::tiers::Tiers>> {
        self.shared.source.tiers()
    }

    /// The storage node its scans push work to, if any.
    pub fn pushdown(&self) -> Option<&Arc<crate::hybrid::Pushdown>> {
        self.shared.pushdown.as_ref()
    }

    /// The directories spill files go to (created on first spill).
    pub fn spill_dirs(&self) -> Vec<PathBuf> {
        self.shared.base.runtime_env().disk_manager.temp_dir_paths()
    }

    /// Changes the memory limit of the running engine (what `SET
    /// memory_limit` does) for every session: the budget, and what sorts
    /// set aside for merging (taken per statement).
    pub fn set_memory_limit(&self, limit: Option<usize>) {
        self.shared.memory.set_limit(limit);
    }

    /// The tables, for the statements that read them directly (OPTIMIZE).
    pub(crate) fn tables(&self) -> &Arc<BlobSchemaProvider> {
        &self.shared.tables
    }

    /// A DataFusion context for one statement: `session`'s settings and
    /// functions, the tables seen through `scope` and the session's
    /// `registered` ones, the past versions the
    /// statement reads, and a memory pool of its own within the budget.
    pub(crate) async fn statement_context(&self, session: &SessionState, scope: &Scope, registered: &crate::registered::Registered) -> Result<SessionContext, EngineError> {
        let catalog = MemoryCatalogProvider::new();
        let tables = &self.shared.tables;
        catalog.register_schema("public", registered.over(Arc::new(tables.scoped(scope.clone(), false)))).expect("memory catalog registers");
        catalog.register_schema(DML_SCHEMA, Arc::new(tables.scoped(scope.clone(), true))).expect("memory catalog registers");
        // Schemas an embedder registered beside the tables (a server's
        // pg_catalog) are seen by every statement.
        let default_catalog = session.config().options().catalog.default_catalog.clone();
        if let Some(base) = self.shared.base.catalog(&default_catalog) {
            for name in base.schema_names().into_iter().filter(|n| n != "public" && n != DML_SCHEMA) {
                if let Some(schema) = base.schema(&name) {
                    catalog.register_schema(&name, schema).expect("memory catalog registers");
                }
            }
        }
        let files = Arc::new(datafusion::catalog::MemorySchemaProvider::new());
        if !scope.files.is_empty() {
            catalog.register_schema(crate::files::FILES_SCHEMA, files.clone()).expect("memory catalog registers");
        }
        for at in &scope.past {
            let version = self.past_version(scope, at).await?;
            catalog.register_schema(&at.schema(), Arc::new(tables.at(version))).expect("memory catalog registers");
        }
        let catalogs = MemoryCatalogProviderList::new();
        catalogs.register_catalog(default_catalog, Arc::new(catalog));
        // The statement's operators take from the engine's budget through a
        // pool of its own, so that one statement over its share of a spent
        // budget fails rather than the others (memory::StatementPool).
        let counters = Arc::new(crate::files::store::FileCounters::default());
        // Files in place are read through the engine's stores, and each
        // statement lists them anew, keeping its listings for itself
        // (`files::store`): DataFusion's list-files cache is off (its
        // default keeps listings forever, which would hide new files).
        let mut runtime = RuntimeEnvBuilder::from_runtime_env(session.runtime_env())
            .with_memory_pool(self.shared.memory.statement_pool())
            .with_object_store_registry(Arc::new(crate::files::store::StatementFiles::new(self.shared.files.clone(), counters.clone())));
        runtime.cache_manager.list_files_cache = None;
        runtime.cache_manager.list_files_cache_limit = 0;
        let runtime = runtime.build_arc()?;
        let mut builder = SessionStateBuilder::new_from_existing(session.clone()).with_catalog_list(Arc::new(catalogs)).with_runtime_env(runtime);
        let extension = self.shared.extension.read().expect("not poisoned").clone();
        if let Some(extension) = extension {
            builder = extension.extend(builder.with_physical_optimizer_rules(crate::extension::portable_rules(session.physical_optimizers())));
        }
        let mut state = builder.build();
        state.config_mut().options_mut().execution.sort_spill_reservation_bytes = sort_merge_reservation(self.shared.memory.limit());
        // A directory of files in place is read with its subdirectories,
        // as Spark and Hive write tables (`crate::files`).
        state.config_mut().options_mut().execution.listing_table_ignore_subdirectory = false;
        // What its reads of files cost, for its result (`query::run_planned`).
        state.config_mut().set_extension(counters);
        // (`listing_table` checks each location against the session's
        // `FileAccess`, carried in the configuration.)
        for (n, scan) in scope.files.iter().enumerate() {
            let table = crate::files::listing_table(&state, scan).await?;
            datafusion::catalog::SchemaProvider::register_table(files.as_ref(), crate::files::table_name(n), table)?;
        }
        Ok(SessionContext::new_with_state(state))
    }

    /// The number of the version `at` names, as `scope` sees the history.
    pub(crate) async fn past_version_number(&self, scope: &Scope, at: &AsOf) -> Result<u64, EngineError> {
        let v = match at {
            AsOf::Version(v) => *v,
            AsOf::Timestamp(ms) => self.shared.db.version_at(*ms).await?,
            AsOf::Snapshot(name) => scope.view.snapshots.get(name).ok_or_else(|| StorageError::SnapshotNotFound(name.clone()))?.version,
        };
        if v < scope.view.gc.horizon && !scope.view.snapshots.values().any(|s| s.version == v) {
            return Err(StorageError::VersionExpired { version: v, horizon: scope.view.gc.horizon }.into());
        }
        if v == 0 {
            return Err(EngineError::Unsupported("version 0 is the empty database; versions start at 1 (SHOW VERSIONS lists them)".into()));
        }
        Ok(v)
    }

    /// The version `at` names, as committed: inside a transaction, the
    /// version it started from is read without the transaction's changes.
    pub(crate) async fn past_version(&self, scope: &Scope, at: &AsOf) -> Result<Arc<CatalogVersion>, EngineError> {
        let v = self.past_version_number(scope, at).await?;
        if v == scope.snapshot.version {
            return Ok(scope.snapshot.clone());
        }
        Ok(Arc::new(self.shared.db.read_version(v).await?))
    }

    /// An object that a statement reading version `read` needed was gone:
    /// when a VACUUM has since moved the horizon past `read`, say so (the
    /// statement outlived the retention), rather than report a missing
    /// object as if the database were damaged.
    /// Also says why an encrypted database did not spill.
    pub(crate) async fn explain_expiry<T>(&self, result: Result<T, EngineError>, read: u64) -> Result<T, EngineError> {
        let Err(e) = result else { return result };
        let text = e.to_string();
        if text.contains("DiskManager is disabled") && self.shared.db.keyring().is_some() {
            return Err(EngineError::Query(datafusion::error::DataFusionError::ResourcesExhausted(format!(
                "{text}: the database is encrypted and spill files would hold its rows in plaintext, so it does not spill; raise the memory limit (SET memory_limit = '…' or --memory-limit), or allow plaintext spill files with --allow-plaintext-spill"
            ))));
        }
        let missing = ["not found", "NotFound", "NoSuchKey", "404"].iter().any(|m| text.contains(m));
        match self.shared.db.refresh().await {
            Ok(now) if missing && now.gc.horizon > read => Err(EngineError::transaction(
                crate::TxnRule::Expired,
                format!(
                    "this statement read version {read}, which a VACUUM expired while it ran (versions before {} are gone): run it again, and keep VACUUM's RETAIN longer than your longest statement or transaction ({text})",
                    now.gc.horizon
                ),
            )),
            _ => Err(e),
        }
    }
}
