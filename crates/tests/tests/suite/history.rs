//! Time travel, snapshots, SHOW VERSIONS and RESTORE (docs/lifecycle.md).

use std::sync::Arc;

use blobhouse_bench::answers::{self, Verdict};
use blobhouse_bench::tpch;
use blobhouse_engine::{EngineOptions, Session};

use blobhouse_testkit::Request;

use crate::common::*;
use crate::on_every_store_encrypted_too;

on_every_store_encrypted_too!(past_versions_read_restore_and_snapshot_without_copying);

async fn version(e: &Session) -> u64 {
    e.engine().database().refresh().await.unwrap().version
}

async fn past_versions_read_restore_and_snapshot_without_copying(b: Backend) {
    let db = TestDb::new(b, "history");
    let e = db.engine(EngineOptions::default()).await;
    run(&e, "CREATE TABLE t (id INT, v VARCHAR)").await;
    run(&e, "INSERT INTO t VALUES (1, 'a'), (2, 'b'), (3, 'c')").await;
    let v1 = version(&e).await;
    let v1_time = e.engine().database().current().committed_at_ms;
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    run(&e, "DELETE FROM t WHERE id = 2").await;
    run(&e, "UPDATE t SET v = 'z' WHERE id = 3").await;
    run(&e, "CREATE TABLE other AS SELECT 1 AS x").await;
    let v2 = version(&e).await;

    // Reading the past, in every spelling.
    let at_v1 = vec!["1|a", "2|b", "3|c"];
    assert_eq!(lines(&run(&e, &format!("SELECT * FROM t AT(VERSION => {v1}) ORDER BY id")).await), at_v1);
    assert_eq!(lines(&run(&e, &format!("SELECT * FROM t VERSION AS OF {v1} ORDER BY id")).await), at_v1);
    let when = |ms: u64| {
        let t = datafusion::arrow::temporal_conversions::timestamp_ms_to_datetime(ms as i64).unwrap();
        t.format("%Y-%m-%d %H:%M:%S%.3f").to_string()
    };
    assert_eq!(lines(&run(&e, &format!("SELECT * FROM t AT(TIMESTAMP => '{}') ORDER BY id", when(v1_time))).await), at_v1);
    assert_eq!(lines(&run(&e, &format!("SELECT * FROM t TIMESTAMP AS OF '{}' ORDER BY id", when(v1_time + 5))).await), at_v1);
    // Past and present in one query.
    let diff = format!("SELECT o.id, o.v, n.v FROM t AT(VERSION => {v1}) o LEFT JOIN t n ON o.id = n.id ORDER BY o.id");
    assert_eq!(lines(&run(&e, &diff).await), vec!["1|a|a", "2|b|NULL", "3|c|z"]);
    // A table that did not exist then is not there.
    assert!(fail(&e, &format!("SELECT * FROM other AT(VERSION => {v1})")).await.contains("other"));
    // Past versions cannot be written: the target of an INSERT takes no version clause.
    let err = fail(&e, &format!("INSERT INTO t AT(VERSION => {v1}) VALUES (9, 'x')")).await;
    assert!(err.contains("read only") || err.contains("found: AT at Line: 1, Column: 15"), "{err}");
    let err = fail(&e, "SELECT * FROM t AT(TIMESTAMP => '2001-01-01 00:00:00')").await;
    assert!(err.contains("no version was current"), "{err}");
    let err = fail(&e, "SELECT * FROM t AT(VERSION => 999999)").await;
    assert!(err.contains("999999"), "{err}");

    // SHOW VERSIONS, newest first.
    let versions = lines(&run(&e, "SHOW VERSIONS 3").await);
    assert_eq!(versions.len(), 3);
    assert!(versions[0].starts_with(&format!("{v2}|")) && versions[0].contains("CREATE TABLE other"), "{versions:?}");
    assert!(versions[2].contains("DELETE 1 rows from t"), "{versions:?}");

    // A snapshot is one commit and copies nothing: it names the version its
    // commit builds on, so a handle that saw the newest version a moment
    // ago (database::FRESH_BASE) just puts the next version.
    let puts = |r: &[Request]| r.iter().filter(|r| matches!(r, Request::Put { .. })).count();
    let lists = |r: &[Request]| r.iter().filter(|r| matches!(r, Request::List { .. })).count();
    e.engine().database().refresh().await.unwrap();
    let seen = std::time::Instant::now();
    let before = db.audit.requests().len();
    run(&e, "CREATE SNAPSHOT before_wipe").await;
    let requests = db.audit.requests()[before..].to_vec();
    if seen.elapsed() < blobhouse_storage::database::FRESH_BASE {
        assert!(matches!(requests.as_slice(), [Request::Put { create: true, .. }]), "CREATE SNAPSHOT on a fresh handle is one PUT: {requests:#?}");
    }
    assert_eq!(puts(&requests), 1, "creating a snapshot writes one version object: {requests:#?}");
    // An idle handle lists the log first: one LIST on S3 and GCS (after
    // the known version: they list from an offset), two elsewhere.
    tokio::time::sleep(blobhouse_storage::database::FRESH_BASE).await;
    let before = db.audit.requests().len();
    run(&e, "CREATE SNAPSHOT later").await;
    let requests = db.audit.requests()[before..].to_vec();
    let refresh = if matches!(b, Backend::Minio | Backend::MinioEncrypted | Backend::Gcs) { 1 } else { 2 };
    assert_eq!((lists(&requests), puts(&requests), requests.len()), (refresh, 1, refresh + 1), "{requests:#?}");
    run(&e, "DROP SNAPSHOT later").await;
    assert!(fail(&e, "CREATE SNAPSHOT before_wipe").await.contains("already exists"));
    run(&e, "DELETE FROM t").await;
    run(&e, "DROP TABLE other").await;
    let snapshots = lines(&run(&e, "SHOW SNAPSHOTS").await);
    assert_eq!(snapshots.len(), 1);
    let fields: Vec<&str> = snapshots[0].split('|').collect();
    assert_eq!((fields[0], fields[1]), ("before_wipe", v2.to_string().as_str()));
    assert!(fields[3].parse::<u64>().unwrap() > 0, "the snapshot pins the deleted rows' objects: {snapshots:?}");
    assert_eq!(lines(&run(&e, "SELECT count(*) FROM t AT(SNAPSHOT => 'before_wipe')").await), vec!["2"]);

    // RESTORE TABLE brings one table back; RESTORE DATABASE all of them.
    let restored_at = version(&e).await;
    run(&e, "RESTORE TABLE t TO SNAPSHOT before_wipe").await;
    assert_eq!(version(&e).await, restored_at + 1, "a restore is one commit");
    assert_eq!(lines(&run(&e, "SELECT * FROM t ORDER BY id").await), vec!["1|a", "3|z"]);
    assert!(fail(&e, "SELECT * FROM other").await.contains("other"));
    run(&e, &format!("RESTORE DATABASE TO VERSION {v1}")).await;
    assert_eq!(lines(&run(&e, "SELECT * FROM t ORDER BY id").await), at_v1);
    assert!(fail(&e, "SELECT * FROM other").await.contains("other"), "other did not exist at version {v1}");
    run(&e, "RESTORE DATABASE TO SNAPSHOT before_wipe").await;
    assert_eq!(scalar(&run(&e, "SELECT x FROM other").await), "1");
    // Restored data is the same data: a new handle reads it, and writes go on.
    let e2 = db.engine(EngineOptions::default()).await;
    run(&e2, "INSERT INTO t VALUES (4, 'd')").await;
    assert_eq!(lines(&run(&e, "SELECT * FROM t ORDER BY id").await), vec!["1|a", "3|z", "4|d"]);
    run(&e, "DROP SNAPSHOT before_wipe").await;
    assert!(fail(&e, "SELECT * FROM t AT(SNAPSHOT => 'before_wipe')").await.contains("does not exist"));
    run(&e, "DROP SNAPSHOT IF EXISTS before_wipe").await;
}

/// Every TPC-H table read at version `v`: a table name right after FROM,
/// JOIN or a comma of a FROM list gets an AT clause (the queries also use
/// `nation` as a column alias, which comes after other words).
fn at_version(query: &str, v: u64) -> String {
    let mut out = String::new();
    let mut word = String::new();
    let mut previous = String::new();
    let flush = |word: &mut String, out: &mut String, previous: &mut String| {
        if word.is_empty() {
            return;
        }
        out.push_str(word);
        let after = ["from", "join", ","].contains(&previous.to_ascii_lowercase().as_str());
        if after && tpch::TABLES.contains(&word.as_str()) {
            out.push_str(&format!(" AT(VERSION => {v})"));
        }
        *previous = std::mem::take(word);
    };
    for c in query.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            word.push(c);
        } else {
            flush(&mut word, &mut out, &mut previous);
            out.push(c);
            if !c.is_whitespace() {
                previous = c.to_string();
            }
        }
    }
    flush(&mut word, &mut out, &mut previous);
    out
}

async fn answers_now(e: &Session, version: Option<u64>) -> Vec<Vec<Vec<String>>> {
    let mut all = Vec::new();
    for q in 1..=22 {
        let sql = match version {
            Some(v) => at_version(tpch::query(q), v),
            None => tpch::query(q).to_string(),
        };
        all.push(answers::result_rows(&run(e, &sql).await.batches));
    }
    all
}

fn assert_same(expected: &[Vec<Vec<String>>], got: &[Vec<Vec<String>>], what: &str) {
    for (q, (e, g)) in expected.iter().zip(got).enumerate() {
        assert_eq!(answers::compare(e, g), Verdict::Verified, "Q{} {what}", q + 1);
    }
}

/// After a scripted history — load, deletes, updates, a drop — the 22
/// TPC-H answers read AT each recorded version equal the answers recorded
/// then, and RESTORE brings them back as the current answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpch_answers_as_of_each_version_match_what_was_answered_then() {
    let db = TestDb::new(Backend::Local, "history-tpch");
    let e = db.engine(EngineOptions::default()).await;
    tpch::load(&e, 0.01, Arc::new(|_, _, _| {})).await.expect("load TPC-H");
    let mut recorded = vec![(version(&e).await, answers_now(&e, None).await)];
    run(&e, "DELETE FROM lineitem WHERE l_orderkey % 7 = 3").await;
    run(&e, "UPDATE orders SET o_orderpriority = '1-URGENT' WHERE o_custkey % 5 = 0").await;
    recorded.push((version(&e).await, answers_now(&e, None).await));
    run(&e, "UPDATE lineitem SET l_discount = 0.10 WHERE l_partkey % 11 = 0").await;
    run(&e, "DELETE FROM customer WHERE c_nationkey = 7").await;
    run(&e, "DROP TABLE region").await;
    let loaded = recorded[0].0;
    run(&e, &format!("CREATE TABLE region AS SELECT * FROM region AT(VERSION => {loaded}) WHERE r_regionkey <> 2")).await;
    recorded.push((version(&e).await, answers_now(&e, None).await));
    assert_ne!(recorded[0].1, recorded[2].1, "the history must change the answers");
    for (v, expected) in &recorded {
        assert_same(expected, &answers_now(&e, Some(*v)).await, &format!("AT(VERSION => {v})"));
    }
    for (v, expected) in recorded.iter().rev() {
        run(&e, &format!("RESTORE DATABASE TO VERSION {v}")).await;
        assert_same(expected, &answers_now(&e, None).await, &format!("after RESTORE DATABASE TO VERSION {v}"));
    }
}
