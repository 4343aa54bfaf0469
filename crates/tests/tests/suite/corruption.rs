//! Random single-byte damage in every kind of object a plaintext database
//! keeps, each class of byte position in turn (issue 45): every query that
//! reads damaged bytes fails naming the object, no answer is silently
//! wrong, and `verify` finds every flip.
//!
//! The suite runs 96 flips (12 per class); the table in
//! docs/storage-format.md ("Integrity, measured") comes from
//! `BLOBHOUSE_FLIPS=1200 cargo test -p blobhouse-tests --test suite corruption -- --nocapture`
//! (35 s on 2 cores; `BLOBHOUSE_FLIP_SEED` picks other flips).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use blobhouse_engine::EngineOptions;
use rand::{Rng, SeedableRng};
use datafusion::parquet::file::metadata::{PageIndexPolicy, ParquetMetaDataReader};

use crate::common::*;

/// The queries run after each flip: every column of every row, and a
/// filtered aggregate pruned by zone maps and the page index.
const QUERIES: [&str; 2] = [
    "SELECT * FROM t ORDER BY id",
    "SELECT count(*), sum(q), min(s), max(d), sum(price) FROM t WHERE id BETWEEN 20500 AND 21500",
];

/// Where a flip may land.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Class {
    DataPageHeader,
    PageValues,
    DictionaryPage,
    PageIndex,
    Footer,
    Manifest,
    DeletionVector,
    VersionObject,
}

/// What one flip did.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    flips: u32,
    /// Some query failed naming the damaged object.
    failed_naming_it: u32,
    /// Every query answered as before: no query read the damaged bytes.
    unaffected: u32,
    /// `verify` named the object.
    verify_found: u32,
}

/// The byte ranges of each class in the database at `root`, with the file
/// they lie in.
fn targets(root: &Path) -> BTreeMap<Class, Vec<(PathBuf, std::ops::Range<usize>)>> {
    let mut t: BTreeMap<Class, Vec<(PathBuf, std::ops::Range<usize>)>> = BTreeMap::new();
    for file in crate::format::walk(root) {
        let name = file.to_string_lossy().to_string();
        // Iceberg's metadata is for other engines: blobhouse never reads
        // it to answer, and `verify` does not check it (docs/interop.md).
        if name.contains("/iceberg/") {
            continue;
        }
        let len = std::fs::metadata(&file).unwrap().len() as usize;
        if name.ends_with(".parquet") {
            let bytes = bytes::Bytes::from(std::fs::read(&file).unwrap());
            let meta = ParquetMetaDataReader::new().with_page_index_policy(PageIndexPolicy::Required).parse_and_finish(&bytes).unwrap();
            let footer_len = u32::from_le_bytes(bytes[len - 8..len - 4].try_into().unwrap()) as usize;
            t.entry(Class::Footer).or_default().push((file.clone(), len - 8 - footer_len..len));
            let offsets = meta.offset_index().expect("an offset index");
            let mut index_start = usize::MAX;
            let mut index_end = 0;
            for (rg, row_group) in meta.row_groups().iter().enumerate() {
                for (c, column) in row_group.columns().iter().enumerate() {
                    let pages = offsets[rg][c].page_locations();
                    let first_data = pages[0].offset as usize;
                    if let Some(dict) = column.dictionary_page_offset() {
                        t.entry(Class::DictionaryPage).or_default().push((file.clone(), dict as usize..first_data));
                    }
                    for p in pages {
                        let (at, size) = (p.offset as usize, p.compressed_page_size as usize);
                        // A page header is at least its first 8 bytes (type and
                        // sizes); its values are surely in the page's second half.
                        t.entry(Class::DataPageHeader).or_default().push((file.clone(), at..at + 8));
                        t.entry(Class::PageValues).or_default().push((file.clone(), at + size / 2..at + size));
                    }
                    let column_index = column.column_index_offset().zip(column.column_index_length());
                    let offset_index = column.offset_index_offset().zip(column.offset_index_length());
                    for (at, len) in [column_index, offset_index].into_iter().flatten() {
                        index_start = index_start.min(at as usize);
                        index_end = index_end.max(at as usize + len as usize);
                    }
                }
            }
            if index_end > index_start {
                t.entry(Class::PageIndex).or_default().push((file.clone(), index_start..index_end));
            }
        } else if name.ends_with(".manifest.json") {
            t.entry(Class::Manifest).or_default().push((file.clone(), 0..len));
        } else if name.ends_with(".dv") {
            t.entry(Class::DeletionVector).or_default().push((file.clone(), 0..len));
        } else if name.contains("/log/") {
            t.entry(Class::VersionObject).or_default().push((file.clone(), 0..len));
        }
    }
    t
}

/// Flips one bit of byte `at` of `file` (again to undo).
fn flip(file: &Path, at: usize, bit: u8) {
    let mut bytes = std::fs::read(file).unwrap();
    bytes[at] ^= 1 << bit;
    std::fs::write(file, bytes).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_flips_in_every_kind_of_object_fail_naming_it_and_verify_finds_each() {
    let flips: u32 = std::env::var("BLOBHOUSE_FLIPS").ok().and_then(|s| s.parse().ok()).unwrap_or(96);
    let seed: u64 = std::env::var("BLOBHOUSE_FLIP_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(45);
    let db = TestDb::new(Backend::Local, "corruption");
    let root = PathBuf::from(&db.url);
    {
        let e = db.engine(EngineOptions::default()).await;
        run(&e, "CREATE TABLE t AS SELECT value AS id, value % 97 AS q, 'label ' || (value % 13) AS s, DATE '2020-01-01' + CAST(value % 1000 AS INT) AS d, CAST(value AS DECIMAL(12,2)) / 100 AS price FROM generate_series(1, 60000)").await;
        run(&e, "DELETE FROM t WHERE id % 7 = 0").await;
        run(&e, "INSERT INTO t SELECT value + 60000, value % 5, 'late', DATE '2024-02-29', 1.25 FROM generate_series(1, 100)").await;
    }
    let expected: Vec<Vec<String>> = {
        let e = db.engine(EngineOptions::default()).await;
        let mut out = Vec::new();
        for q in QUERIES {
            out.push(lines(&run(&e, q).await));
        }
        out
    };
    assert_eq!(expected[0].len(), 60000 - 60000 / 7 + 100);
    let targets = targets(&root);
    for class in [Class::DataPageHeader, Class::PageValues, Class::DictionaryPage, Class::PageIndex, Class::Footer, Class::Manifest, Class::DeletionVector, Class::VersionObject] {
        assert!(targets.get(&class).is_some_and(|v| !v.is_empty()), "no {class:?} to damage in the test database");
    }
    let classes: Vec<Class> = targets.keys().copied().collect();

    // Seeded: the flips are the same on every run of a seed.
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut tally: BTreeMap<Class, Tally> = BTreeMap::new();
    let mut silent = Vec::new();
    let mut unnamed = Vec::new();
    let mut missed = Vec::new();
    for n in 0..flips {
        let class = classes[n as usize % classes.len()];
        let places = &targets[&class];
        let (file, range) = &places[rng.random_range(0..places.len())];
        let at = rng.random_range(range.clone());
        let bit: u8 = rng.random_range(0..8);
        let relative = file.strip_prefix(&root).unwrap().to_string_lossy().to_string();
        let what = format!("flip {n}: bit {bit} of byte {at} of {relative} ({class:?})");
        flip(file, at, bit);

        let t = tally.entry(class).or_default();
        t.flips += 1;
        // A fresh engine: nothing cached, everything read from the store.
        let outcome = blobhouse_engine::Session::open_location(db.location.clone(), db.store_options.clone(), EngineOptions::default()).await;
        let mut answers = Vec::new();
        let mut error = None;
        match outcome {
            Ok(e) => {
                for q in QUERIES {
                    match e.execute(q).await {
                        Ok(r) => answers.push(lines(&r)),
                        Err(err) => {
                            error = Some(err.to_string());
                            break;
                        }
                    }
                }
            }
            Err(err) => error = Some(err.to_string()),
        }
        match error {
            Some(err) if err.contains(&relative) => t.failed_naming_it += 1,
            Some(err) => unnamed.push(format!("{what}: {err}")),
            None if answers == expected => t.unaffected += 1,
            None => silent.push(what.clone()),
        }
        let report = {
            let e = blobhouse_engine::Session::open_location(db.location.clone(), db.store_options.clone(), EngineOptions::default()).await;
            match e {
                Ok(e) => blobhouse_storage::verify::verify(e.engine().database(), &|_| {}).await.map(|r| r.damaged).map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            }
        };
        match report {
            Ok(damaged) if damaged.iter().any(|d| d.object.contains(&relative)) => t.verify_found += 1,
            // The database no longer opens: the error names the object.
            Err(err) if err.contains(&relative) => t.verify_found += 1,
            other => missed.push(format!("{what}: verify said {other:?}")),
        }
        flip(file, at, bit);
    }

    eprintln!("{flips} single-bit flips (seed {seed}), a fresh engine for each, queries: {QUERIES:?}");
    eprintln!("| byte class | flips | query failed naming the object | answers unchanged (bytes not read) | silently wrong | verify found it |");
    eprintln!("|---|---:|---:|---:|---:|---:|");
    let mut all = Tally::default();
    for (class, t) in &tally {
        eprintln!("| {class:?} | {} | {} | {} | 0 | {} |", t.flips, t.failed_naming_it, t.unaffected, t.verify_found);
        all.flips += t.flips;
        all.failed_naming_it += t.failed_naming_it;
        all.unaffected += t.unaffected;
        all.verify_found += t.verify_found;
    }
    eprintln!("| all | {} | {} | {} | {} | {} |", all.flips, all.failed_naming_it, all.unaffected, silent.len(), all.verify_found);
    assert!(silent.is_empty(), "silently wrong answers:\n{}", silent.join("\n"));
    assert!(unnamed.is_empty(), "errors that do not name the damaged object:\n{}", unnamed.join("\n"));
    assert!(missed.is_empty(), "damage verify did not find:\n{}", missed.join("\n"));
    // Damage inside what the queries read always fails them. Only bytes no
    // query reads leave answers unchanged: an object's own footer (scans use
    // the manifest's copy), the page index of an object with one page per
    // chunk, a version object that is neither the newest nor its checkpoint.
    for (class, t) in &tally {
        if [Class::DataPageHeader, Class::PageValues, Class::DictionaryPage, Class::Manifest, Class::DeletionVector].contains(class) {
            assert_eq!(t.unaffected, 0, "{class:?}: {t:?}");
        }
    }
    // The undamaged database verifies clean.
    let e = db.engine(EngineOptions::default()).await;
    let clean = blobhouse_storage::verify::verify(e.engine().database(), &|_| {}).await.unwrap();
    assert!(clean.damaged.is_empty(), "{:?}", clean.damaged);
}
