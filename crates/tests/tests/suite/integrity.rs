//! Damage in the store is found, not read as data: every column chunk is
//! checked against the checksum written with it, every metadata object
//! against its seal (issue 45), on the local store and on MinIO (the
//! download manager's path). `corruption.rs` flips bytes at random.

use blobhouse_engine::EngineOptions;
use blobhouse_storage::open_location;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};

use crate::common::*;
use crate::on_every_store;

on_every_store!(
    a_flipped_byte_in_a_column_chunk_fails_naming_the_object_and_range,
    a_damaged_deletion_vector_fails_instead_of_bringing_rows_back,
    damaged_swapped_and_replayed_metadata_objects_are_refused_naming_them
);

const SUM_K: &str = "5000050000";
const SUM_V: &str = "35000350000";

/// Table `t(k, v)` of 100 000 rows; its first object's path and the byte
/// range of `v`'s first chunk.
async fn table(db: &TestDb) -> (String, std::ops::Range<u64>, String) {
    let e = db.engine(EngineOptions::default()).await;
    run(&e, "CREATE TABLE t AS SELECT value AS k, value * 7 AS v FROM generate_series(1, 100000)").await;
    assert_eq!(scalar(&run(&e, "SELECT sum(v) FROM t").await), SUM_V);
    let entry = e.engine().database().current().tables["t"].clone();
    let manifest = e.engine().database().manifest(&entry).await.unwrap();
    let object = &manifest.objects[0];
    let chunk = &object.row_groups[0].columns[1];
    assert!(chunk.checksum.is_some() && object.row_groups.iter().flat_map(|rg| &rg.columns).all(|c| c.checksum.is_some()), "no checksums written: {chunk:?}");
    (object.path.clone(), chunk.range(), blobhouse_storage::versions::manifest_path(&entry.manifests[0]))
}

/// Replaces `rel` (under the database) with `change(bytes)`, behind
/// blobhouse's back.
async fn rewrite(db: &TestDb, rel: &str, change: impl FnOnce(Vec<u8>) -> Vec<u8>) {
    let raw = open_location(&db.url, &db.store_options).unwrap();
    let path = Path::from(format!("{}/{rel}", raw.prefix).trim_start_matches('/').to_string());
    let bytes = raw.store.get(&path).await.unwrap().bytes().await.unwrap().to_vec();
    raw.store.delete(&path).await.unwrap();
    raw.store.put(&path, PutPayload::from(change(bytes))).await.unwrap();
}

async fn a_flipped_byte_in_a_column_chunk_fails_naming_the_object_and_range(b: Backend) {
    let db = TestDb::new(b, "integrity-flip");
    let (object, range, _) = table(&db).await;
    let at = (range.start + (range.end - range.start) / 2) as usize;
    rewrite(&db, &object, |mut bytes| {
        bytes[at] ^= 0x10;
        bytes
    })
    .await;
    // A fresh engine: nothing cached, every chunk read from the store.
    let e = db.engine(EngineOptions::default()).await;
    let err = fail(&e, "SELECT sum(v) FROM t").await;
    assert!(err.contains(&object) && err.contains(&format!("bytes {}..{}", range.start, range.end)) && err.contains("damaged"), "{err}");
    // The other column's chunks are intact and still read.
    assert_eq!(scalar(&run(&e, "SELECT sum(k) FROM t").await), SUM_K);
}

/// A database written before checksums and seals (format 2, the fixture
/// crates/tests/fixtures/v2-inline-page-index) keeps opening and answering;
/// what is written into it now is sealed and checksummed, and `verify`
/// checks both, saying which objects it could check by structure only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_written_before_checksums_and_seals_opens_answers_and_verifies() {
    let db = crate::format::fixture_copy("v2-inline-page-index", "integrity-old");
    let e = db.engine(EngineOptions::default()).await;
    let entry = e.engine().database().current().tables["readings"].clone();
    assert!(entry.manifests.iter().all(|m| m.checksum.is_none()), "the fixture predates seals");
    let manifest = e.engine().database().manifest(&entry).await.unwrap();
    assert!(manifest.objects.iter().all(|o| o.checksum.is_none() && o.row_groups.iter().flat_map(|rg| &rg.columns).all(|c| c.checksum.is_none())));
    assert_eq!(lines(&run(&e, "SELECT count(*) FROM readings").await), ["50000"]);
    let before = blobhouse_storage::verify::verify(e.engine().database(), &|_| {}).await.unwrap();
    assert!(before.damaged.is_empty() && before.unchecked >= 2, "{before:?}");

    run(&e, "INSERT INTO readings SELECT id + 50000, bucket, label FROM readings WHERE id < 10").await;
    let entry = e.engine().database().current().tables["readings"].clone();
    assert!(entry.manifests.last().unwrap().checksum.is_some(), "the new manifest is sealed");
    let fresh = db.engine(EngineOptions::default()).await;
    assert_eq!(lines(&run(&fresh, "SELECT count(*) FROM readings").await), ["50010"]);
    let after = blobhouse_storage::verify::verify(fresh.engine().database(), &|_| {}).await.unwrap();
    assert!(after.damaged.is_empty() && after.manifests == before.manifests + 1, "{after:?}");
}

/// Metadata that still parses after damage would otherwise be trusted: a
/// zone map edited in a manifest, a row count in a version, a GC list that
/// would delete the wrong objects. Each is refused with an error naming
/// the object, and so is a valid object standing where another should be
/// (a manifest copied over another, a version from another database).
async fn damaged_swapped_and_replayed_metadata_objects_are_refused_naming_them(b: Backend) {
    let db = TestDb::new(b, "integrity-meta");
    let (_, _, first_manifest) = table(&db).await;
    let e = db.engine(EngineOptions::default()).await;
    run(&e, "INSERT INTO t SELECT value + 100000, value FROM generate_series(1, 10)").await;
    let newest = e.engine().database().current().version;
    let version = blobhouse_storage::versions::log_path(newest);
    let entry = e.engine().database().current().tables["t"].clone();
    let second_manifest = blobhouse_storage::versions::manifest_path(&entry.manifests[1]);
    let q = "SELECT count(*), sum(v) FROM t WHERE k > 99990";
    let answer = lines(&run(&e, q).await);

    // A zone map edited, the JSON still valid: the query would skip the object.
    let raw = open_location(&db.url, &db.store_options).unwrap();
    let read = |rel: String| {
        let raw = &raw;
        async move { raw.store.get(&Path::from(format!("{}/{rel}", raw.prefix).trim_start_matches('/').to_string())).await.unwrap().bytes().await.unwrap().to_vec() }
    };
    let original = read(first_manifest.clone()).await;
    let text = String::from_utf8(original.clone()).unwrap();
    assert!(text.contains("\"max\":\"100000\""), "{text}");
    rewrite(&db, &first_manifest, |_| text.replacen("\"max\":\"100000\"", "\"max\":\"100\"", 1).into_bytes()).await;
    let err = fail(&db.engine(EngineOptions::default()).await, q).await;
    assert!(err.contains(&first_manifest) && err.contains("seal"), "{err}");
    // Swapped: the other manifest's valid bytes in its place.
    let second = read(second_manifest.clone()).await;
    rewrite(&db, &first_manifest, |_| second.clone()).await;
    let err = fail(&db.engine(EngineOptions::default()).await, q).await;
    assert!(err.contains(&first_manifest) && err.contains("seal"), "{err}");
    rewrite(&db, &first_manifest, |_| original.clone()).await;
    assert_eq!(lines(&run(&db.engine(EngineOptions::default()).await, q).await), answer);

    // A version's row count edited (still valid JSON): opening fails.
    let version_bytes = read(version.clone()).await;
    rewrite(&db, &version, |bytes| {
        let text = String::from_utf8(bytes).unwrap();
        let edited = text.replacen("\"rows\":100010", "\"rows\":100011", 1);
        assert_ne!(edited, text, "the version records the rows: {text}");
        edited.into_bytes()
    })
    .await;
    let err = match blobhouse_engine::Session::open_location(db.location.clone(), db.store_options.clone(), EngineOptions::default()).await {
        Ok(_) => panic!("a damaged newest version opened"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains(&version) && err.contains("seal"), "{err}");
    // Replayed: the same version of another database with the same history.
    let other = TestDb::new(b, "integrity-meta-other");
    table(&other).await;
    run(&other.engine(EngineOptions::default()).await, "INSERT INTO t SELECT value + 100000, value FROM generate_series(1, 10)").await;
    let raw_other = open_location(&other.url, &other.store_options).unwrap();
    let theirs = raw_other.store.get(&Path::from(format!("{}/{version}", raw_other.prefix).trim_start_matches('/').to_string())).await.unwrap().bytes().await.unwrap().to_vec();
    rewrite(&db, &version, |_| theirs).await;
    let err = match blobhouse_engine::Session::open_location(db.location.clone(), db.store_options.clone(), EngineOptions::default()).await {
        Ok(_) => panic!("another database's version opened"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains(&version) && err.contains("another path or database"), "{err}");
    rewrite(&db, &version, |_| version_bytes).await;

    // A GC list that still parses: the next VACUUM refuses to act on it.
    let e = db.engine(EngineOptions::default()).await;
    run(&e, "DELETE FROM t WHERE k <= 10").await;
    run(&e, "VACUUM RETAIN '0s' GRACE '0s'").await;
    let gc = e.engine().database().current().gc.clone();
    let list = blobhouse_storage::keys::object_name(gc.list.expect("VACUUM wrote its list"), blobhouse_storage::gc::LIST_EXT);
    assert!(gc.list_seal.is_some());
    rewrite(&db, &list, |bytes| {
        let mut bytes = bytes;
        let at = bytes.iter().position(|b| b.is_ascii_digit()).expect("a number in the list");
        bytes[at] = if bytes[at] == b'9' { b'8' } else { bytes[at] + 1 };
        bytes
    })
    .await;
    let fresh = db.engine(EngineOptions::default()).await;
    let err = fail(&fresh, "VACUUM RETAIN '0s' GRACE '0s'").await;
    assert!(err.contains(&list) && err.contains("seal"), "{err}");
    let report = blobhouse_storage::verify::verify(fresh.engine().database(), &|_| {}).await.unwrap();
    assert_eq!(report.damaged.len(), 1, "{:?}", report.damaged);
    assert!(report.damaged[0].object.contains(&list), "{:?}", report.damaged);
    // Answers are untouched by a damaged list.
    assert_eq!(lines(&run(&fresh, "SELECT count(*) FROM t").await), ["100000"]);
}

async fn a_damaged_deletion_vector_fails_instead_of_bringing_rows_back(b: Backend) {
    let db = TestDb::new(b, "integrity-dv");
    table(&db).await;
    let e = db.engine(EngineOptions::default()).await;
    run(&e, "DELETE FROM t WHERE k % 3 = 0").await;
    let live = "66667";
    assert_eq!(scalar(&run(&e, "SELECT count(*) FROM t").await), live);
    let entry = e.engine().database().current().tables["t"].clone();
    let (_, vector) = entry.deletes.iter().next().expect("a deletion vector");
    assert!(vector.checksum.is_some(), "{vector:?}");
    let name = blobhouse_storage::keys::object_name(vector.key, blobhouse_storage::format::DV_EXT);
    // A byte inside the bitmap's first container key: it still decodes, to
    // as many rows, at other positions.
    rewrite(&db, &name, |mut bytes| {
        bytes[8] ^= 0x01;
        bytes
    })
    .await;
    let fresh = db.engine(EngineOptions::default()).await; // no cached vector
    let err = fail(&fresh, "SELECT count(*), sum(k) FROM t").await;
    assert!(err.contains(&name) && err.contains("deletion vector is damaged"), "{err}");
}
