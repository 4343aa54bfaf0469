//! Garbage collection: `VACUUM [RETAIN interval]`.
//!
//! Every commit records what it stopped referencing (`Retired`, SAP IQ's
//! roll-forward bitmap). VACUUM deletes those items once no version a
//! reader may still ask for references them:
//!
//! 1. The **horizon** H is the version that was current `retain` ago
//!    (default 7 days). Versions ≥ H are retained; older ones expire.
//! 2. Candidates: the items retired by versions in (previous H, H], and the
//!    previous VACUUM's deferred items.
//! 3. An item still referenced by version H or by a RESTORE version after
//!    H is kept (it will be retired again when no longer referenced). One
//!    referenced only by a snapshot is **deferred** to the next VACUUM.
//!    Everything else is deleted.
//! 4. Version objects before H are deleted, except the checkpoint version
//!    H's delta needs, snapshot versions, and versions whose successor was
//!    committed less than GRACE ago (a writer may still be putting that
//!    successor; see `database::FRESH_BASE`); those wait for a later VACUUM.
//!
//! The plan (deletions, deferrals) is written to a list object and
//! committed as a version that moves the horizon; the commit validates that
//! no VACUUM, snapshot or RESTORE committed since the plan was made, and
//! every RESTORE or snapshot committed later is refused below H
//! (`changes::apply`). Deletion happens only after that commit, objects
//! before the manifests that list them. The next VACUUM deletes the
//! previous list's items again before its own (deletes are idempotent), so
//! a VACUUM that crashed half-way is finished by the next one — and, when
//! several crashed in a row, by the first that gets through: a list names
//! its predecessors whose objects still exist, and the VACUUM that
//! finishes deletes them all. Why this is safe with concurrent writers,
//! readers and VACUUMs: docs/lifecycle.md.
//!
//! Why no crate: the rules follow blobhouse's own layout.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde::{Deserialize, Serialize};

use crate::changes::Change;
use crate::database::{CommitOutcome, Database};
use crate::error::{Result, StorageError};
use crate::format::*;
use crate::keys::{KeyBlock, object_name};
use crate::versions::manifest_path;

/// Default retention, as Delta Lake's VACUUM.
pub const DEFAULT_RETAIN: Duration = Duration::from_secs(7 * 24 * 3600);
/// Default grace period: the longest a transaction may stay open. Uploads
/// of a writer that stopped longer than retention + grace ago and that no
/// kept version references are collected as a crashed writer's.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(24 * 3600);
/// Extension of VACUUM's list objects.
pub const LIST_EXT: &str = "gc.json";
/// How often VACUUM re-plans when a concurrent VACUUM, snapshot or
/// RESTORE committed first.
const ATTEMPTS: u32 = 30;

/// What one VACUUM decided: deletions, deferrals, expired versions.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct GcList {
    /// Format version of the list (0: written before format 3, unsealed).
    #[serde(default)]
    format_version: u32,
    horizon: u64,
    /// Items to delete (manifests with all their objects).
    delete: Retired,
    /// Version objects to delete.
    versions: Vec<u64>,
    /// Items only snapshots reference, and snapshot versions below the
    /// horizon: for the next VACUUM.
    deferred: Retired,
    deferred_versions: Vec<u64>,
    /// The lists of earlier VACUUMs that may not have finished (the
    /// previous one, and its predecessors whose lists still exist), oldest
    /// last: their items are deleted again, then their list objects.
    #[serde(default)]
    previous: Vec<u64>,
}

/// What a VACUUM did (or, dry, would do).
#[derive(Debug, Clone, Default)]
pub struct VacuumReport {
    pub previous_horizon: u64,
    pub horizon: u64,
    /// Version objects read to find the retired items.
    pub versions_scanned: u64,
    /// Items considered, kept because a retained version references them,
    /// deferred for snapshots.
    pub candidates: u64,
    pub kept: u64,
    pub deferred: u64,
    /// Paths deleted (dry run: to delete), each with why.
    pub deleted: Vec<(String, String)>,
    /// Requests to the store: GETs, DELETEs (bulk deletes count one per
    /// 1,000 keys on S3; each path is counted here).
    pub gets: u64,
    pub deletes: u64,
}

/// Runs VACUUM on `db`. `dry_run`: plan and report, delete nothing.
pub async fn vacuum(db: &Arc<Database>, retain: Duration, grace: Duration, dry_run: bool) -> Result<VacuumReport> {
    for attempt in 0..ATTEMPTS {
        let before = db.refresh().await?.gc.clone();
        match vacuum_once(db, retain, grace, dry_run).await {
            Ok(report) => return Ok(report),
            Err(e) if attempt + 1 < ATTEMPTS => {
                // Another VACUUM committed while this one planned (and may
                // have deleted versions or its list this one was reading):
                // plan again on its result.
                let moved = db.refresh().await?.gc != before;
                if !(moved || matches!(e, StorageError::Conflict { .. })) {
                    return Err(e);
                }
                // Two VACUUMs re-planning in step would collide again.
                use rand::Rng;
                let pause = rand::rng().random_range(5..=20 + 10 * u64::from(attempt.min(10)));
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
            Err(e) => return Err(e),
        }
    }
    unreachable!("the last attempt returns")
}

async fn vacuum_once(db: &Arc<Database>, retain: Duration, grace: Duration, dry_run: bool) -> Result<VacuumReport> {
    let newest = db.refresh().await?;
    let old = newest.gc.clone();
    let mut report = VacuumReport { previous_horizon: old.horizon, horizon: old.horizon, ..Default::default() };
    if newest.version == 0 {
        return Ok(report);
    }
    let cutoff = now_ms().saturating_sub(retain.as_millis() as u64);
    let horizon = match db.version_at(cutoff).await {
        Ok(v) => v.max(old.horizon),
        Err(StorageError::NoVersionAt { .. }) => old.horizon.max(1),
        Err(e) => return Err(e),
    };
    report.horizon = horizon;

    // The previous VACUUM's list (unfinished deletions, deferred items),
    // and the lists before it that still exist (their VACUUMs may have
    // crashed after committing).
    let mut unfinished: Vec<(u64, GcList)> = Vec::new();
    if let Some(key) = old.list {
        report.gets += 1;
        let list: GcList = db.get_sealed(&object_name(key, LIST_EXT), old.list_seal).await?;
        for ancestor in &list.previous {
            report.gets += 1;
            match read_json::<GcList>(db, &object_name(*ancestor, LIST_EXT)).await {
                Ok(l) => unfinished.push((*ancestor, l)),
                Err(StorageError::Store { source: object_store::Error::NotFound { .. }, .. }) => {}
                Err(e) => return Err(e),
            }
        }
        unfinished.insert(0, (key, list));
    }
    let previous = unfinished.first().map(|(_, l)| l.clone());

    // Candidates.
    let mut candidates = Retired::default();
    let mut candidate_versions: Vec<u64> = Vec::new();
    if let Some(list) = &previous {
        candidates.extend(&list.deferred);
        candidate_versions.extend(&list.deferred_versions);
    }
    let first = old.horizon.max(1);
    for v in (old.horizon + 1).max(1)..=horizon {
        let r: RetiredOnly = version_json(db, v).await?;
        report.versions_scanned += 1;
        report.gets += 1;
        candidates.extend(&r.retired);
    }
    candidate_versions.extend(first..horizon);

    // What protects them.
    let mut retained = vec![horizon];
    retained.extend(newest.restores.iter().map(|r| r.version).filter(|v| *v > horizon));
    let snapshot_versions: BTreeSet<u64> = newest.snapshots.values().map(|s| s.version).collect();
    let mut by_retained = References::default();
    let mut protecting = vec![newest.clone()];
    for v in retained {
        report.gets += 2;
        let version = read(db, v, &newest).await?;
        by_retained.add(&version);
        protecting.push(version);
    }
    let mut by_snapshots = References::default();
    let mut snapshot_checkpoints = Vec::new();
    for v in &snapshot_versions {
        report.gets += 2;
        let version = read(db, *v, &newest).await?;
        by_snapshots.add(&version);
        protecting.push(version);
        snapshot_checkpoints.extend(checkpoint_of(db, *v).await?);
    }

    let mut list = GcList { format_version: FORMAT_VERSION, horizon, previous: unfinished.iter().map(|(k, _)| *k).collect(), ..Default::default() };
    let mut sort = |kind: Kind, item: u64, manifest: u64| {
        report.candidates += 1;
        if by_retained.references(kind, item, manifest) {
            report.kept += 1;
            return;
        }
        let target = if by_snapshots.references(kind, item, manifest) {
            report.deferred += 1;
            &mut list.deferred
        } else {
            &mut list.delete
        };
        match kind {
            Kind::Manifest => target.manifests.push(item),
            Kind::Object => target.objects.push([item, manifest]),
            Kind::Vector => target.vectors.push(item),
        }
    };
    for m in dedup(&candidates.manifests) {
        sort(Kind::Manifest, m, 0);
    }
    let mut seen = HashSet::new();
    for [o, m] in candidates.objects.iter().copied() {
        if seen.insert(o) {
            sort(Kind::Object, o, m);
        }
    }
    for d in dedup(&candidates.vectors) {
        sort(Kind::Vector, d, 0);
    }
    // Versions below the horizon: H's checkpoint and snapshot versions stay
    // (for the next VACUUM to look at again), and so does every version
    // whose successor is younger than GRACE: a writer that saw it as the
    // newest may still be putting the next version, which must not land
    // in a gap (`database::FRESH_BASE`).
    let keep: HashSet<u64> = checkpoint_of(db, horizon).await?.into_iter().collect();
    let settled = if grace <= retain {
        horizon
    } else {
        match db.version_at(now_ms().saturating_sub(grace.as_millis() as u64)).await {
            Ok(v) => v.min(horizon),
            Err(StorageError::NoVersionAt { .. }) => 0,
            Err(e) => return Err(e),
        }
    };
    for v in dedup(&candidate_versions) {
        if v >= horizon {
            continue;
        }
        if snapshot_versions.contains(&v) || snapshot_checkpoints.contains(&v) || keep.contains(&v) || v >= settled {
            list.deferred_versions.push(v);
        } else {
            list.versions.push(v);
        }
    }

    // Blocks of keys whose writers are done for sure (crashed ones too): a
    // key used before now - retain - grace belongs to a transaction that
    // ended (transactions last less than the grace period) before version
    // H was current, so if it committed, H, the newest version, a restore
    // or a snapshot references it.
    let quiet = grace + retain;
    let orphans = orphan_sweep(db, &protecting, quiet, &mut report).await?;

    if dry_run {
        report.deleted = describe(db, &list, &mut report).await?;
        report.deleted.extend(orphans.describe());
        return Ok(report);
    }
    // Commit the plan, then carry it out.
    let (key, path) = db.new_object(LIST_EXT).await?;
    let seal = db.put_sealed(&path, &list).await?;
    let gc = GcState { horizon, at_ms: now_ms(), list: Some(key), list_seal: Some(seal) };
    let expected = Box::new((old.clone(), newest.snapshots.clone(), newest.restores.clone()));
    match db.commit(&[Change::Vacuum { gc, expected }]).await {
        Ok(CommitOutcome::Committed(_)) | Ok(CommitOutcome::NoOp) => {}
        // It may have landed: the list stays (the sweep collects it if not).
        Err(e @ StorageError::CommitUnknown { .. }) => return Err(e),
        Err(e) => {
            db.delete_unreferenced(vec![path]).await;
            return Err(e);
        }
    }
    crate::failpoint::hit("gc.after_commit")?;
    // Iceberg's metadata and mirrors before the objects they name.
    let dead: HashSet<u64> = unfinished
        .iter()
        .map(|(_, l)| l)
        .chain([&list])
        .flat_map(|l| l.delete.manifests.iter().chain(&l.delete.vectors).copied())
        .collect();
    let iceberg = crate::iceberg::collect(db, horizon, &protecting[1..], &dead).await?;
    report.deletes += iceberg.len() as u64;
    for (_, prev_list) in unfinished.iter().rev() {
        // Finishes the earlier VACUUMs if they crashed half-way (else finds
        // its items gone).
        carry_out(db, prev_list, &mut report).await?;
    }
    report.deleted = carry_out(db, &list, &mut report).await?;
    report.deleted.extend(iceberg);
    let swept = orphans.carry_out(db, key, &mut report).await?;
    report.deleted.extend(swept);
    Ok(report)
}

/// What commits since the GC horizon stopped referencing — what VACUUM
/// may collect once retention allows: data objects and their bytes, and
/// other objects (manifests, deletion vectors). Reads every version since
/// the horizon (one GET each) and the retired manifests.
pub async fn awaiting(db: &Database) -> Result<(u64, u64, u64)> {
    let newest = db.refresh().await?;
    let mut retired = Retired::default();
    for v in (newest.gc.horizon + 1).max(1)..=newest.version {
        let r: RetiredOnly = version_json(db, v).await?;
        retired.extend(&r.retired);
    }
    let (mut objects, mut bytes, mut other) = (0u64, 0u64, 0u64);
    let mut sizes: HashMap<u64, u64> = HashMap::new();
    for m in dedup(&retired.manifests) {
        other += 1;
        if let Ok(file) = read_json::<Manifest>(db, &manifest_path(&ManifestRef { key: m, objects: 0, rows: 0, bytes: 0, checksum: None })).await {
            for o in file.objects {
                objects += 1;
                bytes += o.size;
                sizes.insert(o.key, 0);
            }
        }
    }
    for [o, m] in &retired.objects {
        if sizes.contains_key(o) {
            continue;
        }
        let size = match read_json::<Manifest>(db, &manifest_path(&ManifestRef { key: *m, objects: 0, rows: 0, bytes: 0, checksum: None })).await {
            Ok(file) => file.objects.iter().find(|x| x.key == *o).map_or(0, |x| x.size),
            Err(_) => 0,
        };
        objects += 1;
        bytes += size;
        sizes.insert(*o, size);
    }
    other += dedup(&retired.vectors).len() as u64;
    Ok((objects, bytes, other))
}

/// What the store holds under `objects/` that nothing references, and what
/// is referenced but missing: the newest version's and the snapshots'
/// manifests, data objects and deletion vectors, and the newest VACUUM's
/// list. Lists all of `objects/`: for tests and `blobhouse gc --check`.
pub async fn audit(db: &Database) -> Result<(Vec<String>, Vec<String>)> {
    let newest = db.refresh().await?;
    let mut versions = vec![newest.clone()];
    for s in newest.snapshots.values() {
        versions.push(Arc::new(db.read_version(s.version).await?));
    }
    let mut referenced = BTreeSet::new();
    for v in versions {
        for t in v.tables.values() {
            referenced.extend(t.manifests.iter().map(manifest_path));
            referenced.extend(t.deletes.values().map(|d| object_name(d.key, DV_EXT)));
            let data = db.table_data(t).await?;
            referenced.extend(data.objects.iter().map(|l| data.object(l).path.clone()));
        }
    }
    referenced.extend(newest.gc.list.map(|k| object_name(k, LIST_EXT)));
    let dir = db.location().child(OBJECTS_DIR);
    let metas: Vec<object_store::ObjectMeta> =
        futures::TryStreamExt::try_collect(db.store().list(Some(&dir))).await.map_err(|e| StorageError::store("LIST", db.location().display(&dir), e))?;
    let stored: BTreeSet<String> = metas.iter().map(|m| db.location().relative(&m.location)).collect();
    Ok((referenced.difference(&stored).cloned().collect(), stored.difference(&referenced).cloned().collect()))
}

/// Crash recovery: the key blocks that no writer may use any more and
/// whose uploads, if unreferenced, are a dead writer's (or a rolled-back
/// transaction's whose deletes failed), and the unused lease records.
struct Orphans {
    /// Blocks to sweep, with the keys in them that nothing references.
    blocks: Vec<(KeyBlock, Vec<u64>)>,
    /// Lease records no writer needs (older leases without blocks left).
    leases: Vec<String>,
}

/// Every name an object of key `key` may have.
const EXTENSIONS: [&str; 4] = ["parquet", MANIFEST_EXT, DV_EXT, LIST_EXT];

impl Orphans {
    fn describe(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (block, keys) in &self.blocks {
            out.push((
                block.path(),
                format!("key block of a writer that stopped using it before {}: {} of its keys are referenced by no kept version; whatever exists under their names is deleted", format_ms(block.usable_until_ms), keys.len()),
            ));
        }
        for l in &self.leases {
            out.push((l.clone(), "lease record no writer uses any more".into()));
        }
        out
    }

    /// Deletes them; `except` is this VACUUM's own list, written after the
    /// sweep was planned.
    async fn carry_out(&self, db: &Database, except: u64, report: &mut VacuumReport) -> Result<Vec<(String, String)>> {
        let mut names = Vec::new();
        for (_, keys) in &self.blocks {
            for k in keys.iter().filter(|k| **k != except) {
                names.extend(EXTENSIONS.iter().map(|ext| object_name(*k, ext)));
            }
        }
        // The objects first, then the records that say where to look.
        report.deletes += names.len() as u64;
        delete_all(db, names).await?;
        let records: Vec<String> = self.blocks.iter().map(|(b, _)| b.path()).chain(self.leases.iter().cloned()).collect();
        report.deletes += records.len() as u64;
        delete_all(db, records).await?;
        Ok(self.describe())
    }
}

/// Finds the blocks whose time of use ended more than `quiet` ago (their
/// committed keys are referenced by `protecting`: the newest version, the
/// horizon, restores and snapshots — see the caller). Cost: one recursive LIST of `keys/` (the blocks
/// of the last `quiet` period and the lease records) and the manifest
/// files of `protecting` (cached by the handle); nothing under `objects/`
/// is listed.
async fn orphan_sweep(db: &Database, protecting: &[Arc<CatalogVersion>], quiet: Duration, report: &mut VacuumReport) -> Result<Orphans> {
    let dir = db.location().child(KEYS_DIR);
    let metas: Vec<object_store::ObjectMeta> =
        futures::TryStreamExt::try_collect(db.store().list(Some(&dir))).await.map_err(|e| StorageError::store("LIST", db.location().display(&dir), e))?;
    report.gets += 1 + metas.len() as u64 / 1000;
    let relative = |m: &object_store::ObjectMeta| db.location().relative(&m.location);
    let blocks: Vec<KeyBlock> = metas.iter().filter_map(|m| KeyBlock::parse(&relative(m))).collect();
    let leases: Vec<(u64, String)> = metas
        .iter()
        .map(relative)
        .filter_map(|p| Some((p.strip_prefix(&format!("{KEYS_DIR}/"))?.strip_suffix(".json")?.parse::<u64>().ok()?, p.clone())))
        .collect();
    let deadline = now_ms().saturating_sub(quiet.as_millis() as u64);
    let old: Vec<KeyBlock> = blocks.iter().copied().filter(|b| b.usable_until_ms < deadline).collect();
    let mut out = Orphans { blocks: Vec::new(), leases: Vec::new() };
    if !old.is_empty() {
        // Only the newest VACUUM's list is needed (older versions name
        // older lists, which their successors deleted or failed to).
        let mut referenced: HashSet<u64> = protecting.first().and_then(|v| v.gc.list).into_iter().collect();
        for v in protecting {
            for t in v.tables.values() {
                referenced.extend(t.deletes.values().map(|d| d.key));
                for (m, file) in db.manifest_files(t).await? {
                    report.gets += 1;
                    referenced.insert(m.key);
                    referenced.extend(file.objects.iter().map(|o| o.key));
                }
            }
        }
        for b in &old {
            let keys: Vec<u64> = b.keys().filter(|k| !referenced.contains(k)).collect();
            out.blocks.push((*b, keys));
        }
    }
    // Lease records: the newest stays (it numbers the next lease); an older
    // one goes once no block of it is left.
    let newest_lease = leases.iter().map(|(n, _)| *n).max().unwrap_or(0);
    let remaining: HashSet<u64> = blocks.iter().filter(|b| b.usable_until_ms >= deadline).map(|b| b.lease).collect();
    out.leases = leases.into_iter().filter(|(n, _)| *n < newest_lease && !remaining.contains(n)).map(|(_, p)| p).collect();
    Ok(out)
}

#[derive(Clone, Copy)]
enum Kind {
    Manifest,
    Object,
    Vector,
}

/// What some versions reference, in the terms retire records use.
#[derive(Default)]
struct References {
    versions: Vec<VersionRefs>,
}

/// What one version references.
struct VersionRefs {
    manifests: HashSet<u64>,
    vectors: HashSet<u64>,
    /// Manifest key → the removed objects of the table listing it.
    removed_by_manifest: HashMap<u64, Arc<HashSet<u64>>>,
}

impl References {
    fn add(&mut self, v: &CatalogVersion) {
        let mut refs = VersionRefs { manifests: HashSet::new(), vectors: HashSet::new(), removed_by_manifest: HashMap::new() };
        for t in v.tables.values() {
            let removed = Arc::new(t.removed.iter().copied().collect::<HashSet<u64>>());
            for m in &t.manifests {
                refs.manifests.insert(m.key);
                refs.removed_by_manifest.insert(m.key, removed.clone());
            }
            refs.vectors.extend(t.deletes.values().map(|d| d.key));
        }
        self.versions.push(refs);
    }

    fn references(&self, kind: Kind, item: u64, manifest: u64) -> bool {
        self.versions.iter().any(|v| match kind {
            Kind::Manifest => v.manifests.contains(&item),
            Kind::Vector => v.vectors.contains(&item),
            // Listing unknown (a RESTORE removed it): kept; the orphan
            // sweep of the crash-recovery GC finds it once unreferenced.
            Kind::Object if manifest == 0 => true,
            Kind::Object => v.removed_by_manifest.get(&manifest).is_some_and(|removed| !removed.contains(&item)),
        })
    }
}

/// Version `v`, resolved (the newest is at hand).
async fn read(db: &Database, v: u64, newest: &Arc<CatalogVersion>) -> Result<Arc<CatalogVersion>> {
    if v == newest.version {
        return Ok(newest.clone());
    }
    Ok(Arc::new(db.read_version(v).await?))
}

/// The checkpoint version `v` is a delta of (none if it is a checkpoint).
async fn checkpoint_of(db: &Database, v: u64) -> Result<Option<u64>> {
    let header: CheckpointOnly = version_json(db, v).await?;
    Ok(header.checkpoint)
}

/// Deletes the items of `list`: objects of the manifests and the objects,
/// vectors, then the manifests, then the versions. Returns what it deleted.
async fn carry_out(db: &Database, list: &GcList, report: &mut VacuumReport) -> Result<Vec<(String, String)>> {
    let deleted = describe(db, list, report).await?;
    // Data before the manifests that list them: a crash in between leaves
    // manifests whose objects are gone, which the retry deletes again.
    let (manifests, rest): (Vec<_>, Vec<_>) = deleted.iter().map(|(p, _)| p.clone()).partition(|p| p.ends_with(MANIFEST_EXT));
    let (versions, data): (Vec<_>, Vec<_>) = rest.into_iter().partition(|p| p.starts_with(LOG_DIR) || p.starts_with(CATALOG_DIR));
    let mut first = true;
    let previous: Vec<String> = list.previous.iter().map(|k| object_name(*k, LIST_EXT)).collect();
    for batch in [data, manifests, versions, previous] {
        if !std::mem::take(&mut first) {
            crate::failpoint::hit("gc.between_deletes")?;
        }
        report.deletes += batch.len() as u64;
        delete_all(db, batch).await?;
    }
    Ok(deleted)
}

/// Every path `list` deletes, with the reason (GETs the manifests it
/// deletes, to name their objects).
async fn describe(db: &Database, list: &GcList, report: &mut VacuumReport) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    let h = list.horizon;
    for m in &list.delete.manifests {
        let path = manifest_path(&ManifestRef { key: *m, objects: 0, rows: 0, bytes: 0, checksum: None });
        report.gets += 1;
        match read_json::<Manifest>(db, &path).await {
            Ok(manifest) => {
                for o in manifest.objects {
                    out.push((o.path, format!("data object of manifest {m:016x}, no longer listed before version {h}")));
                }
            }
            // Deleted by an earlier, interrupted VACUUM after its objects.
            Err(StorageError::Store { source: object_store::Error::NotFound { .. }, .. }) => {}
            Err(e) => return Err(e),
        }
        out.push((path, format!("manifest no longer listed before version {h}")));
    }
    for [o, _] in &list.delete.objects {
        out.push((object_name(*o, "parquet"), format!("data object rewritten by OPTIMIZE before version {h}")));
    }
    for d in &list.delete.vectors {
        out.push((object_name(*d, DV_EXT), format!("deletion vector replaced or dropped before version {h}")));
    }
    for v in &list.versions {
        // An upgraded format-1 database has versions under either name;
        // deleting the name it does not have finds nothing.
        for path in db.version_paths(*v) {
            out.push((path, format!("version expired (before {h})")));
        }
    }
    Ok(out)
}

pub(crate) async fn delete_paths(db: &Database, paths: Vec<String>) -> Result<()> {
    delete_all(db, paths).await
}

async fn delete_all(db: &Database, paths: Vec<String>) -> Result<()> {
    let store = db.store().clone();
    let locations: Vec<object_store::Result<object_store::path::Path>> = paths.iter().map(|p| Ok(db.location().child(p))).collect();
    let results: Vec<object_store::Result<object_store::path::Path>> = store.delete_stream(futures::stream::iter(locations).boxed()).collect().await;
    for r in results {
        match r {
            Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(StorageError::store("DELETE", db.location().url.clone(), e)),
        }
    }
    Ok(())
}

/// Version `v`'s object, parsed as `T`.
async fn version_json<T: serde::de::DeserializeOwned>(db: &Database, v: u64) -> Result<T> {
    let (path, bytes) = db.version_object(v).await?;
    serde_json::from_slice(&bytes).map_err(|e| StorageError::Corrupt { location: db.location().display(&path), reason: format!("invalid JSON ({e})") })
}

/// The sealed JSON object at `relative` (its seal checked: VACUUM deletes
/// by what these objects say).
async fn read_json<T: serde::de::DeserializeOwned>(db: &Database, relative: &str) -> Result<T> {
    db.get_sealed(relative, None).await
}

fn dedup(items: &[u64]) -> Vec<u64> {
    let set: BTreeSet<u64> = items.iter().copied().collect();
    set.into_iter().collect()
}

/// Only the retire record of a version object.
#[derive(Deserialize)]
struct RetiredOnly {
    #[serde(default)]
    retired: Retired,
}

/// Only the checkpoint a version object is a delta of.
#[derive(Deserialize)]
struct CheckpointOnly {
    #[serde(default)]
    checkpoint: Option<u64>,
}

/// Parses `'7 days'`, `'12h'`, `'0 seconds'`, `'30 min'` into a duration.
pub fn parse_interval(text: &str) -> std::result::Result<Duration, String> {
    let t = text.trim().trim_matches('\'').trim().to_ascii_lowercase();
    let split = t.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let n: f64 = number.parse().map_err(|_| format!("'{text}' is not an interval like '7 days' or '12 hours'"))?;
    let seconds = match unit.trim() {
        "s" | "sec" | "secs" | "second" | "seconds" => 1.0,
        "m" | "min" | "mins" | "minute" | "minutes" => 60.0,
        "h" | "hour" | "hours" => 3600.0,
        "d" | "day" | "days" => 86400.0,
        "w" | "week" | "weeks" => 7.0 * 86400.0,
        other => return Err(format!("unknown unit '{other}' in '{text}'; use seconds, minutes, hours, days or weeks")),
    };
    Ok(Duration::from_secs_f64(n * seconds))
}

#[cfg(test)]
mod tests {
    use super::parse_interval;
    use std::time::Duration;

    #[test]
    fn intervals() {
        assert_eq!(parse_interval("'7 days'").unwrap(), Duration::from_secs(7 * 86400));
        assert_eq!(parse_interval("12h").unwrap(), Duration::from_secs(12 * 3600));
        assert_eq!(parse_interval("0 seconds").unwrap(), Duration::ZERO);
        assert!(parse_interval("soon").is_err());
        assert!(parse_interval("3 fortnights").is_err());
    }
}
