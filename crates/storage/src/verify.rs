//! `blobhouse verify`: reads every object a database's retained versions
//! reference and checks it against what was recorded when it was written —
//! version objects and GC lists by their seals (`crate::seal`), manifests
//! by their seals and their parents' records, data objects by their
//! whole-object and column-chunk checksums and their footer against the
//! manifest's copy, deletion vectors by checksum and row count.
//!
//! Queries check what they read as they read it; this finds damage in
//! what no query has read yet (a footer, an old version kept by a
//! snapshot), so that it can be restored before it is needed. One pass,
//! `VERIFY_CONCURRENCY` objects at a time, each data object read whole
//! once.

use std::collections::{BTreeMap, HashMap};

use base64::Engine as _;
use futures::StreamExt;

use crate::database::Database;
use crate::error::{Result, StorageError};
use crate::format::*;
use crate::keys::object_name;
use crate::versions::manifest_path;

/// Objects read at once.
pub const VERIFY_CONCURRENCY: usize = 8;

/// One damaged (or missing) object.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Damage {
    /// The object, as a full URL.
    pub object: String,
    /// What is wrong with it, with the byte range where known.
    pub reason: String,
}

/// What `verify` checked and found.
#[derive(Debug, Default, Clone)]
pub struct VerifyReport {
    /// Database versions read (the retained ones and the snapshots').
    pub versions: u64,
    /// Manifest files read.
    pub manifests: u64,
    /// Data objects read whole.
    pub data_objects: u64,
    /// Deletion vectors read.
    pub vectors: u64,
    /// GC lists read.
    pub gc_lists: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Objects written before checksums were kept: read, but only their
    /// structure could be checked.
    pub unchecked: u64,
    /// What is damaged, in the order found.
    pub damaged: Vec<Damage>,
}

/// Progress of a [`verify`] run, reported after each object.
#[derive(Debug, Clone, Copy)]
pub struct VerifyProgress {
    /// Objects checked so far.
    pub done: u64,
    /// Objects to check in all (grows while versions and manifests are read).
    pub total: u64,
    /// Bytes read so far.
    pub bytes: u64,
}

/// Checks every object the database's retained versions and snapshots
/// reference. Damage is reported, not returned as an error; an error means
/// the check itself could not run (the store did not answer).
pub async fn verify(db: &Database, progress: &(dyn Fn(VerifyProgress) + Sync)) -> Result<VerifyReport> {
    let mut report = VerifyReport::default();
    let newest = db.refresh().await?;
    let mut numbers: Vec<u64> = ((newest.gc.horizon.max(1))..=newest.version).collect();
    numbers.extend(newest.snapshots.values().map(|s| s.version).filter(|v| *v < newest.gc.horizon.max(1)));
    numbers.sort_unstable();
    numbers.dedup();

    let mut total = numbers.len() as u64 + u64::from(newest.gc.list.is_some());
    let mut done = 0u64;
    let tick = |done: u64, total: u64, bytes: u64| progress(VerifyProgress { done, total, bytes });

    // Versions: their seals, their checkpoints' seals; what they reference.
    let mut manifests: BTreeMap<u64, (u64, ManifestRef)> = BTreeMap::new();
    let mut vectors: BTreeMap<u64, DeleteRef> = BTreeMap::new();
    let mut versions = futures::stream::iter(numbers.iter().map(|&v| async move { (v, db.read_version(v).await) })).buffered(VERIFY_CONCURRENCY);
    while let Some((v, read)) = versions.next().await {
        done += 1;
        report.versions += 1;
        match read {
            Ok(version) => {
                for t in version.tables.values() {
                    for m in &t.manifests {
                        manifests.entry(m.key).or_insert((t.id, *m));
                    }
                    for d in t.deletes.values() {
                        vectors.entry(d.key).or_insert(*d);
                    }
                }
            }
            Err(e) => report.damaged.push(damage_of(db, &crate::versions::log_path(v), e)?),
        }
        tick(done, total, report.bytes);
    }
    drop(versions);
    if let Some(key) = newest.gc.list {
        done += 1;
        report.gc_lists += 1;
        let relative = object_name(key, crate::gc::LIST_EXT);
        if let Err(e) = db.get_sealed::<serde_json::Value>(&relative, newest.gc.list_seal).await {
            report.damaged.push(damage_of(db, &relative, e)?);
        }
        tick(done, total, report.bytes);
    }

    // Manifests: their seals and references; the data objects they list.
    total += manifests.len() as u64 + vectors.len() as u64;
    let mut objects: HashMap<u64, DataObject> = HashMap::new();
    let mut files = futures::stream::iter(manifests.values().map(|&(table, m)| async move { (m, db.manifest_file(table, m).await) })).buffer_unordered(VERIFY_CONCURRENCY);
    while let Some((m, read)) = files.next().await {
        done += 1;
        report.manifests += 1;
        match read {
            Ok(manifest) => {
                report.unchecked += u64::from(m.checksum.is_none());
                for o in &manifest.objects {
                    objects.entry(o.key).or_insert_with(|| o.clone());
                }
            }
            Err(e) => report.damaged.push(damage_of(db, &manifest_path(&m), e)?),
        }
        tick(done, total, report.bytes);
    }
    drop(files);

    // Deletion vectors.
    let mut reads = futures::stream::iter(vectors.values().map(|&d| async move { (d, db.deletion_vector(d).await) })).buffer_unordered(VERIFY_CONCURRENCY);
    while let Some((d, read)) = reads.next().await {
        done += 1;
        report.vectors += 1;
        report.unchecked += u64::from(d.checksum.is_none());
        if let Err(e) = read {
            report.damaged.push(damage_of(db, &object_name(d.key, DV_EXT), e)?);
        }
        tick(done, total, report.bytes);
    }
    drop(reads);

    // Data objects, whole.
    total += objects.len() as u64;
    let mut reads = futures::stream::iter(objects.values().map(|o| async move { (o, check_object(db, o).await) })).buffer_unordered(VERIFY_CONCURRENCY);
    while let Some((o, checked)) = reads.next().await {
        done += 1;
        report.data_objects += 1;
        match checked {
            Ok((bytes, found)) => {
                report.bytes += bytes;
                report.unchecked += u64::from(o.checksum.is_none());
                if let Some(reason) = found {
                    report.damaged.push(Damage { object: db.location().display(&db.location().child(&o.path)), reason });
                }
            }
            Err(e) => report.damaged.push(damage_of(db, &o.path, e)?),
        }
        tick(done, total, report.bytes);
    }
    // Every delta over a damaged checkpoint names it again.
    let mut seen = std::collections::HashSet::new();
    // What other engines read: Iceberg metadata in force names only
    // objects that are there.
    for (object, named_by) in crate::iceberg::dangling(db).await? {
        report.damaged.push(Damage { object, reason: format!("missing, yet the Iceberg metadata {named_by} names it: other engines reading that snapshot will fail") });
    }
    report.damaged.retain(|d| seen.insert(d.clone()));
    Ok(report)
}

/// Reads data object `o` whole: its bytes read and what is wrong with them.
async fn check_object(db: &Database, o: &DataObject) -> Result<(u64, Option<String>)> {
    let bytes = db.get(&db.location().child(&o.path)).await?;
    let len = bytes.len() as u64;
    if len != o.size {
        return Ok((len, Some(format!("it has {len} bytes, its manifest says {}", o.size))));
    }
    if let Some(sum) = o.checksum
        && chunk_checksum(&bytes) != sum
    {
        // Name the part that is damaged, where a finer checksum tells.
        let chunk = o.row_groups.iter().flat_map(|rg| rg.columns.iter()).find(|c| c.checksum.is_some_and(|s| bytes.get(c.offset as usize..(c.offset + c.length) as usize).is_none_or(|b| chunk_checksum(b) != s)));
        let part = match chunk {
            Some(c) => format!("column chunk bytes {}..{}", c.offset, c.offset + c.length),
            None => match o.page_index_at {
                Some(at) if at.checksum.is_some_and(|s| chunk_checksum(&bytes[at.offset as usize..(at.offset + at.length) as usize]) != s) => format!("page index bytes {}..{}", at.offset, at.offset + at.length),
                _ => footer_range(&bytes).map_or("bytes outside its column chunks".to_string(), |r| {
                    if footer_matches(o, &bytes) { "bytes outside its column chunks, page index and footer".to_string() } else { format!("footer bytes {}..{}", r.start, r.end) }
                }),
            },
        };
        return Ok((len, Some(format!("its bytes do not match the checksum written with them: damaged {part}"))));
    }
    // Objects written before whole-object checksums: what finer records say.
    for c in o.row_groups.iter().flat_map(|rg| rg.columns.iter()) {
        if let Some(s) = c.checksum {
            let intact = bytes.get(c.offset as usize..(c.offset + c.length) as usize).is_some_and(|b| chunk_checksum(b) == s);
            if !intact {
                return Ok((len, Some(format!("damaged column chunk bytes {}..{}", c.offset, c.offset + c.length))));
            }
        }
    }
    if !footer_matches(o, &bytes) {
        let r = footer_range(&bytes).unwrap_or(0..len);
        return Ok((len, Some(format!("its footer (bytes {}..{}) is not the one its manifest recorded", r.start, r.end))));
    }
    Ok((len, None))
}

/// Where the Parquet footer of `bytes` lies, if its tail is intact.
fn footer_range(bytes: &[u8]) -> Option<std::ops::Range<u64>> {
    let n = bytes.len();
    if n < 12 || !matches!(&bytes[n - 4..], b"PAR1" | b"PARE") {
        return None;
    }
    let footer = u32::from_le_bytes(bytes[n - 8..n - 4].try_into().ok()?) as usize;
    let start = n.checked_sub(8 + footer)?;
    Some(start as u64..n as u64)
}

/// Whether the object's footer is byte for byte the manifest's copy.
fn footer_matches(o: &DataObject, bytes: &[u8]) -> bool {
    let Ok(recorded) = base64::engine::general_purpose::STANDARD.decode(&o.footer) else { return false };
    let n = bytes.len();
    n >= recorded.len() + 8 && bytes[n - 8 - recorded.len()..n - 8] == recorded[..] && bytes[n - 8..n - 4] == (recorded.len() as u32).to_le_bytes() && &bytes[n - 4..] == if o.encrypted { b"PARE" } else { b"PAR1" }
}

/// `relative`'s damage, from the error reading it gave; errors that say
/// nothing about the object (the store did not answer) end the check.
fn damage_of(db: &Database, relative: &str, e: StorageError) -> Result<Damage> {
    let object = db.location().display(&db.location().child(relative));
    match e {
        // The error names the object that is damaged (a delta's checkpoint, say).
        StorageError::Corrupt { location, reason } => Ok(Damage { object: location, reason }),
        StorageError::Parquet { source, .. } => Ok(Damage { object, reason: source.to_string() }),
        StorageError::Store { source: object_store::Error::NotFound { .. }, .. } => Ok(Damage { object, reason: "it is missing".into() }),
        StorageError::VersionNotFound { .. } => Ok(Damage { object, reason: "it is missing".into() }),
        other => Err(other),
    }
}
