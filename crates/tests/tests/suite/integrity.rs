//! Damage in the store is found, not read as data: every column chunk is
//! checked against the checksum written with it (issue 45), on the local
//! store and on MinIO (the download manager's path).

use blobhouse_engine::EngineOptions;
use blobhouse_storage::open_location;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};

use crate::common::*;
use crate::on_both_backends;

on_both_backends!(
    a_flipped_byte_in_a_column_chunk_fails_naming_the_object_and_range,
    objects_written_without_checksums_are_read_unchecked,
    a_damaged_deletion_vector_fails_instead_of_bringing_rows_back
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

async fn objects_written_without_checksums_are_read_unchecked(b: Backend) {
    let db = TestDb::new(b, "integrity-old");
    let (_, _, manifest) = table(&db).await;
    // As a database written before checksums were kept: no `checksum` in its manifest.
    rewrite(&db, &manifest, |bytes| {
        let mut json: serde_json::Value = serde_json::from_slice(&bytes).expect("a manifest is JSON");
        fn strip(v: &mut serde_json::Value) -> usize {
            match v {
                serde_json::Value::Object(m) => m.remove("checksum").map_or(0, |_| 1) + m.values_mut().map(strip).sum::<usize>(),
                serde_json::Value::Array(a) => a.iter_mut().map(strip).sum(),
                _ => 0,
            }
        }
        assert!(strip(&mut json) > 0, "the manifest held no checksums");
        serde_json::to_vec(&json).unwrap()
    })
    .await;
    let e = db.engine(EngineOptions::default()).await;
    assert_eq!(scalar(&run(&e, "SELECT sum(v) FROM t").await), SUM_V);
    let entry = e.engine().database().current().tables["t"].clone();
    let manifest = e.engine().database().manifest(&entry).await.unwrap();
    assert!(manifest.objects[0].row_groups[0].columns.iter().all(|c| c.checksum.is_none()));
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
