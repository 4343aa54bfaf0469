//! Encrypted databases (issue 45): what reaches the store is ciphertext,
//! what comes back is authenticated, rotation
//! rewrites nothing, and a standard Parquet Modular Encryption reader
//! (pyarrow) given the keys reads the data objects.

use std::sync::Arc;

use blobhouse_bench::tpch;
use blobhouse_engine::EngineOptions;
use blobhouse_storage::encryption::{KeySpec, LocalKey};
use blobhouse_storage::open_location;
use futures::TryStreamExt;
use object_store::{ObjectStoreExt, PutPayload};

use crate::common::*;
use crate::on_every_store;

on_every_store!(an_encrypted_database_answers_and_leaves_no_plaintext_in_the_store);

const CANARY: &str = "plaintext-canary";

/// A fresh random master key in a file of `dir`.
fn key_file(dir: &std::path::Path, name: &str) -> KeySpec {
    let key: [u8; 32] = rand::random();
    let path = dir.join(name);
    std::fs::write(&path, blobhouse_storage::encryption::hex(&key)).unwrap();
    KeySpec::File { path }
}

/// Every object of the database: its path relative to the root and bytes.
async fn objects(db: &TestDb) -> Vec<(String, Vec<u8>)> {
    let raw = open_location(&db.url, &db.store_options).unwrap();
    let listed: Vec<_> = raw.store.list(Some(&raw.prefix)).try_collect().await.unwrap();
    let mut out = Vec::new();
    for m in listed {
        let bytes = raw.store.get(&m.location).await.unwrap().bytes().await.unwrap().to_vec();
        let rel = m.location.as_ref().strip_prefix(raw.prefix.as_ref()).unwrap_or(m.location.as_ref()).trim_start_matches('/').to_string();
        out.push((rel, bytes));
    }
    out
}

/// Whether `needle` occurs in `hay`.
fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// Every file under `dir`, read.
fn files_under(dir: &std::path::Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else if let Ok(bytes) = std::fs::read(&path) {
            out.push((path, bytes));
        }
    }
    out
}

/// Creates, deletes from, snapshots and updates `secrets`, and reads it
/// back through an SSD tier in `ssd`.
async fn fill(db: &TestDb, ssd: &std::path::Path) {
    let e = db.engine(EngineOptions::default()).await;
    run(&e, &format!("CREATE TABLE secrets AS SELECT value AS k, '{CANARY}-' || value AS s FROM generate_series(1, 20000)")).await;
    run(&e, "DELETE FROM secrets WHERE k % 7 = 0").await;
    run(&e, "CREATE SNAPSHOT before_update").await;
    run(&e, &format!("UPDATE secrets SET s = '{CANARY}-updated' WHERE k < 100")).await;
    assert_eq!(lines(&run(&e, QUERY).await), EXPECTED);
    drop(e);
    let cached = blobhouse_engine::CacheOptions { ssd_dir: Some(ssd.to_path_buf()), ..blobhouse_engine::CacheOptions::default() };
    let e = db.engine(EngineOptions { cache: cached, ..EngineOptions::default() }).await;
    for _ in 0..2 {
        assert_eq!(lines(&run(&e, "SELECT count(*), sum(k), count(*) FILTER (WHERE s LIKE '%updated'), max(s) FROM secrets").await)[0].split('|').next(), Some("17143"));
    }
    // The SSD tier writes in the background.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
}

const QUERY: &str = "SELECT count(*), sum(k), count(*) FILTER (WHERE s LIKE '%updated') FROM secrets";
const EXPECTED: [&str; 1] = ["17143|171431429|85"];

async fn an_encrypted_database_answers_and_leaves_no_plaintext_in_the_store(b: Backend) {
    // The control: a plaintext database shows what the checks below look
    // for, in the store and in the SSD tier.
    let plain_ssd = tempfile::tempdir().unwrap();
    let plain = TestDb::new(b, "plaintext");
    fill(&plain, plain_ssd.path()).await;
    let stored = objects(&plain).await;
    for needle in [CANARY, "secrets", "before_update"] {
        assert!(stored.iter().any(|(_, bytes)| contains(bytes, needle)), "the plaintext database does not show {needle:?}: the check below could not fail");
    }
    assert!(files_under(plain_ssd.path()).iter().any(|(_, bytes)| contains(bytes, CANARY)), "the plaintext SSD tier does not show the canary");

    let keys = tempfile::tempdir().unwrap();
    let spec = key_file(keys.path(), "master.key");
    let db = TestDb::new(b, "encrypted").with_key(Some(spec.clone()));
    let ssd = tempfile::tempdir().unwrap();
    fill(&db, ssd.path()).await;
    let cached = files_under(ssd.path());
    assert!(cached.iter().map(|(_, b)| b.len()).sum::<usize>() > 10_000, "the SSD tier kept nothing");
    for (path, bytes) in &cached {
        assert!(!contains(bytes, CANARY), "{} holds rows in plaintext", path.display());
    }
    let expected = EXPECTED;
    let query = QUERY;

    // Nothing in the store says what the rows, the table or its zone maps
    // hold: every object is the marker, a keyring, sealed metadata or an
    // encrypted Parquet object — and the marker and keyring hold no key.
    let key_text = match &spec {
        KeySpec::File { path } => std::fs::read_to_string(path).unwrap(),
        _ => unreachable!(),
    };
    let stored = objects(&db).await;
    assert!(stored.len() > 8, "{} objects", stored.len());
    for (rel, bytes) in &stored {
        for needle in [CANARY, "secrets", "before_update", "171431429", key_text.trim()] {
            assert!(!contains(bytes, needle), "{rel} holds {needle:?} in plaintext");
        }
        if rel == "blobhouse.json" {
            // A build that knows no encryption refuses it ("upgrade
            // blobhouse") instead of reading ciphertext as damaged JSON.
            let marker: serde_json::Value = serde_json::from_slice(bytes).unwrap();
            assert_eq!((marker["format_version"].as_u64(), marker["encryption"].as_str()), (Some(4), Some("aes-256-gcm-v1")), "{marker}");
        }
        let kind_ok = rel == "blobhouse.json"
            || rel.starts_with("encryption/")
            || bytes.starts_with(blobhouse_storage::encryption::MAGIC)
            || (rel.ends_with(".parquet") && bytes.ends_with(b"PARE"));
        assert!(kind_ok, "{rel} is neither sealed metadata nor encrypted Parquet: {:?}", String::from_utf8_lossy(&bytes[..bytes.len().min(60)]));
    }

    // Opened again with the key: the same answers, time travel included.
    let e = db.engine(EngineOptions::default()).await;
    assert_eq!(lines(&run(&e, query).await), expected);
    assert_eq!(lines(&run(&e, "SELECT count(*) FROM secrets AT(SNAPSHOT => 'before_update') WHERE s LIKE '%updated'").await), ["0"]);
    let report = blobhouse_storage::verify::verify(e.engine().database(), &|_| {}).await.unwrap();
    assert!(report.damaged.is_empty() && report.data_objects > 0, "{report:?}");
    drop(e);

    // Without the key, and with another key: one error saying which key.
    let master = LocalKey::from_bytes("k", key_text.as_bytes()).unwrap();
    use blobhouse_storage::encryption::KeyProvider as _;
    let err = open_error(db.location.clone().with_encryption(None), Default::default(), EngineOptions::default()).await;
    assert!(err.contains("is encrypted") && err.contains(&master.key_id()) && err.contains("--encryption-key-file"), "{err}");
    let other = key_file(keys.path(), "other.key");
    let err = open_error(db.location.clone().with_encryption(Some(other)), Default::default(), EngineOptions::default()).await;
    assert!(err.contains(&format!("wrapped by the master key {}", master.key_id())) && err.contains("the key given is local:"), "{err}");
}

/// Why the database at `loc` does not open.
async fn open_error(loc: blobhouse_storage::Location, store: blobhouse_storage::StoreOptions, options: EngineOptions) -> String {
    match blobhouse_engine::Session::open_location(loc, store, options).await {
        Ok(_) => panic!("the database opened"),
        Err(e) => e.to_string(),
    }
}

/// Replaces `rel` with `change(bytes)` behind blobhouse's back.
async fn rewrite(db: &TestDb, rel: &str, change: impl FnOnce(Vec<u8>) -> Vec<u8>) {
    let raw = open_location(&db.url, &db.store_options).unwrap();
    let path = raw.child(rel);
    let bytes = raw.store.get(&path).await.unwrap().bytes().await.unwrap().to_vec();
    raw.store.delete(&path).await.unwrap();
    raw.store.put(&path, PutPayload::from(change(bytes))).await.unwrap();
}

/// Flipped, cut, swapped and replayed metadata objects of an encrypted
/// database do not open (AES-GCM over the object, its path and the
/// database), and the error names the object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampered_swapped_and_replayed_metadata_of_an_encrypted_database_is_refused_naming_it() {
    let db = TestDb::new(Backend::LocalEncrypted, "tamper");
    let spec = db.store_options.encryption.clone();
    let e = db.engine(EngineOptions::default()).await;
    run(&e, "CREATE TABLE a AS SELECT value AS x FROM generate_series(1, 1000)").await;
    run(&e, "CREATE TABLE b AS SELECT value AS x FROM generate_series(1, 10)").await;
    run(&e, "DELETE FROM a WHERE x <= 10").await;
    let current = e.engine().database().current();
    let manifest_a = blobhouse_storage::versions::manifest_path(&current.tables["a"].manifests[0]);
    let manifest_b = blobhouse_storage::versions::manifest_path(&current.tables["b"].manifests[0]);
    let vector = blobhouse_storage::keys::object_name(current.tables["a"].deletes.values().next().unwrap().key, "dv");
    let version = blobhouse_storage::versions::log_path(current.version);
    drop(e);
    let sum = "SELECT sum(x) FROM a";
    let fresh = || async { db.engine(EngineOptions::default()).await };
    assert_eq!(scalar(&run(&fresh().await, sum).await), "500445");

    let stored = objects(&db).await;
    let bytes_of = |rel: &str| stored.iter().find(|(r, _)| r == rel).unwrap().1.clone();
    let check = |err: String, rel: &str| assert!(err.contains(rel) && (err.contains("fail authentication") || err.contains("not encrypted")), "{err}");

    // A manifest: one flipped bit, then cut, then another table's in its place.
    for change in [
        Box::new(|mut b: Vec<u8>| {
            let at = b.len() / 2;
            b[at] ^= 1;
            b
        }) as Box<dyn FnOnce(Vec<u8>) -> Vec<u8>>,
        Box::new(|b: Vec<u8>| b[..b.len() - 5].to_vec()),
        Box::new(|_| bytes_of(&manifest_b)),
    ] {
        rewrite(&db, &manifest_a, change).await;
        check(fail(&fresh().await, sum).await, &manifest_a);
        rewrite(&db, &manifest_a, |_| bytes_of(&manifest_a)).await;
    }
    assert_eq!(scalar(&run(&fresh().await, sum).await), "500445");

    // A deletion vector: a flipped byte would bring rows back.
    rewrite(&db, &vector, |mut b| {
        b[20] ^= 0x40;
        b
    })
    .await;
    let err = fail(&fresh().await, sum).await;
    assert!(err.contains(&vector), "{err}");
    rewrite(&db, &vector, |_| bytes_of(&vector)).await;

    // The newest version, replaced by the previous one (a replay under
    // the newest name): refused, the database does not open.
    let previous = blobhouse_storage::versions::log_path(current.version - 1);
    rewrite(&db, &version, |_| bytes_of(&previous)).await;
    let err = open_error(db.location.clone(), db.store_options.clone(), EngineOptions::default()).await;
    check(err, &version);
    rewrite(&db, &version, |_| bytes_of(&version)).await;

    // A version object of another database under the same master key,
    // replayed here: refused (the database's identity is authenticated too).
    let other = TestDb::new(Backend::Local, "tamper-other").with_key(spec);
    let o = other.engine(EngineOptions::default()).await;
    for _ in 0..current.version {
        run(&o, "CREATE TABLE IF NOT EXISTS z (x INT)").await;
        run(&o, "INSERT INTO z VALUES (1)").await;
    }
    drop(o);
    let theirs = objects(&other).await.into_iter().find(|(r, _)| *r == version).expect("the other database has that version").1;
    rewrite(&db, &version, |_| theirs).await;
    let err = open_error(db.location.clone(), db.store_options.clone(), EngineOptions::default()).await;
    check(err, &version);
    rewrite(&db, &version, |_| bytes_of(&version)).await;
    assert_eq!(scalar(&run(&fresh().await, sum).await), "500445");
}

/// Rotating the master key writes one keyring object and rewrites
/// nothing (the audit store checks no object was overwritten); the old
/// key stops opening the database, the new one opens it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotating_the_master_key_rewrites_nothing_and_the_new_key_opens_the_database() {
    let keys = tempfile::tempdir().unwrap();
    let old = key_file(keys.path(), "old");
    let new = key_file(keys.path(), "new");
    let db = TestDb::new(Backend::Local, "rotate").with_key(Some(old.clone()));
    let e = db.engine(EngineOptions::default()).await;
    run(&e, "CREATE TABLE t AS SELECT value AS x FROM generate_series(1, 5000)").await;
    let before: Vec<String> = objects(&db).await.into_iter().map(|(r, _)| r).collect();
    let keyring = e.engine().database().keyring().unwrap().clone();
    let number = keyring.rotate(e.engine().database().location(), new.provider().unwrap().as_ref()).await.unwrap();
    assert_eq!(number, 2);
    // A second rotation from the stale handle is refused, naming why.
    let err = keyring.rotate(e.engine().database().location(), new.provider().unwrap().as_ref()).await.unwrap_err().to_string();
    assert!(err.contains("keyring 2 was written after"), "{err}");
    drop(e);
    let after: Vec<String> = objects(&db).await.into_iter().map(|(r, _)| r).collect();
    let added: Vec<&String> = after.iter().filter(|r| !before.contains(r)).collect();
    assert_eq!(added, [&"encryption/00000000000000000002.json".to_string()]);

    let err = open_error(db.location.clone(), db.store_options.clone(), EngineOptions::default()).await;
    assert!(err.contains("a rotated database needs its newest master key"), "{err}");
    let rotated = db.handle().with_key(Some(new));
    let e = rotated.engine(EngineOptions::default()).await;
    assert_eq!(scalar(&run(&e, "SELECT sum(x) FROM t").await), "12502500");
    run(&e, "INSERT INTO t VALUES (1)").await;
    assert_eq!(scalar(&run(&e, "SELECT count(*) FROM t").await), "5001");
}

/// A plaintext database refuses a key (encryption is chosen at creation),
/// and an encrypted database does not spill rows to disk unless allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_for_a_plaintext_database_is_refused_and_encrypted_ones_do_not_spill() {
    let keys = tempfile::tempdir().unwrap();
    let db = TestDb::new(Backend::Local, "plain");
    let e = db.engine(EngineOptions::default()).await;
    run(&e, "CREATE TABLE t AS SELECT value AS x FROM generate_series(1, 10)").await;
    drop(e);
    let err = open_error(db.location.clone().with_encryption(Some(key_file(keys.path(), "k"))), db.store_options.clone(), EngineOptions::default())
        .await;
    assert!(err.contains("is not encrypted, and an encryption key was given"), "{err}");

    let enc = TestDb::new(Backend::LocalEncrypted, "nospill");
    let e = enc.engine(EngineOptions::default()).await;
    run(&e, "CREATE TABLE t AS SELECT value AS x, repeat('y', 100) AS pad FROM generate_series(1, 400000)").await;
    drop(e);
    let sort = "SELECT x FROM (SELECT x, row_number() OVER (ORDER BY pad, x DESC) AS r FROM t) WHERE r = 400000";
    let spill_dir = tempfile::tempdir().unwrap();
    let tight = |allow: bool| EngineOptions {
        memory_limit: Some(32 << 20),
        target_partitions: 1,
        spill: blobhouse_engine::SpillOptions { dir: Some(spill_dir.path().to_path_buf()), allow_plaintext: allow, ..Default::default() },
        ..EngineOptions::default()
    };
    let err = fail(&enc.engine(tight(false)).await, sort).await;
    assert!(err.contains("memory limit"), "{err}");
    assert_eq!(std::fs::read_dir(spill_dir.path()).unwrap().count(), 0, "nothing was written to the spill directory");
    assert_eq!(lines(&run(&enc.engine(tight(true)).await, sort).await), ["1"]);
}

/// pyarrow's Parquet Modular Encryption (its `CryptoFactory` and a
/// `KmsClient` given the database key) reads an encrypted data object;
/// without the keys, or with another database key, it cannot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pyarrow_reads_an_encrypted_data_object_given_the_database_key() {
    let db = TestDb::new(Backend::LocalEncrypted, "pyarrow");
    let spec = db.store_options.encryption.clone().unwrap();
    let e = db.engine(EngineOptions::default()).await;
    run(&e, "CREATE TABLE t AS SELECT value AS k, 'row ' || value AS s, CAST(value AS DOUBLE) / 4 AS d FROM generate_series(1, 3000)").await;
    let entry = e.engine().database().current().tables["t"].clone();
    let object = e.engine().database().manifest(&entry).await.unwrap().objects[0].clone();
    drop(e);
    let KeySpec::File { path: key_path } = &spec else { unreachable!() };
    let object_path = std::path::Path::new(&db.url).join(&object.path);
    let script = r#"
import base64, hmac, hashlib, json, sys, datetime
import pyarrow.parquet as pq, pyarrow.parquet.encryption as pe
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
root, key_file, obj = sys.argv[1:4]
master = bytes.fromhex(open(key_file).read().strip())
marker = json.load(open(f"{root}/blobhouse.json"))
identity = f"{marker['created_at_ms']:016x}{marker['id']:016x}"
ring = json.load(open(f"{root}/encryption/00000000000000000001.json"))
wrapped = base64.b64decode(ring["wrapped"])
database_key = AESGCM(master).decrypt(wrapped[:12], wrapped[12:], identity.encode())
def reader(database_key):
    wrap = hmac.new(database_key, b"blobhouse data keys v1", hashlib.sha256).digest()
    class Keys(pe.KmsClient):
        def __init__(self, config):
            pe.KmsClient.__init__(self)
        def wrap_key(self, key, master_key_id):
            raise NotImplementedError
        def unwrap_key(self, wrapped_key, master_key_id):
            w = base64.b64decode(wrapped_key)
            return AESGCM(wrap).decrypt(w[:12], w[12:], master_key_id.encode())
    return pe.CryptoFactory(lambda config: Keys(config)).file_decryption_properties(pe.KmsConnectionConfig(), pe.DecryptionConfiguration(cache_lifetime=datetime.timedelta(seconds=1)))
t = pq.read_table(obj, decryption_properties=reader(database_key))
print(t.num_rows, sum(t.column("k").to_pylist()), t.column("s")[2], sum(t.column("d").to_pylist()))
for name, props in [("without keys", None), ("with another key", reader(bytes(32)))]:
    try:
        pq.read_table(obj, decryption_properties=props)
        print("read", name)
    except Exception as e:
        print(name + ":", type(e).__name__)
"#;
    let out = std::process::Command::new("python3").arg("-c").arg(script).arg(&db.url).arg(key_path).arg(&object_path).output().expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "pyarrow failed: {stdout}{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], format!("3000 {} row 3 1125375.0", 3000 * 3001 / 2), "{stdout}");
    assert!(lines[1].starts_with("without keys:") && lines[2].starts_with("with another key:"), "{stdout}");
}

/// A storage node started with the database's key decrypts what it reads
/// and the 22 answers hold with every row group pushed to it; a node
/// started without it fails those tasks saying so, and the engine fetches
/// and decrypts them itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storage_node_reads_an_encrypted_database_given_its_key() {
    use blobhouse_engine::CacheOptions;
    use blobhouse_engine::hybrid::PushdownMode;
    use blobhouse_pushdown::NodeOptions;
    let db = TestDb::new(Backend::LocalEncrypted, "node-encrypted");
    let loader = db.engine(EngineOptions { cache: CacheOptions::off(), ..small_chunks(64 << 10) }).await;
    tpch::load(&loader, 0.01, Arc::new(|_, _, _| {})).await.expect("load TPC-H");
    drop(loader);

    let (node, endpoint, _h) = crate::pushdown::node(&db, NodeOptions::new(crate::pushdown::TOKEN)).await;
    let e = db.engine(crate::pushdown::pushing(&endpoint, PushdownMode::On, CacheOptions::off())).await;
    crate::tpch::assert_22_answers(&e, " (encrypted, pushed to a node with the key)").await;
    let stats = node.stats();
    assert!(stats.tasks_done > 0 && stats.tasks_failed == 0, "{stats:?}");
    assert!(e.engine().pushdown().unwrap().take_warnings().is_empty());

    let keyless = TestDb::handle(&db).with_key(None);
    let (node, endpoint, _h) = crate::pushdown::node(&keyless, NodeOptions::new(crate::pushdown::TOKEN)).await;
    let e = db.engine(crate::pushdown::pushing(&endpoint, PushdownMode::On, CacheOptions::off())).await;
    let query = "SELECT count(*), sum(l_quantity), max(l_comment) FROM lineitem";
    let fetched = lines(&run(&db.engine(EngineOptions { cache: CacheOptions::off(), ..EngineOptions::default() }).await, query).await);
    assert_eq!(lines(&run(&e, query).await), fetched);
    let warnings = e.engine().pushdown().unwrap().take_warnings().join("\n");
    assert!(node.stats().tasks_failed > 0 && warnings.contains("encrypted") && warnings.contains("no key was given"), "{warnings}");
}

/// A creation that died between its keyring and its marker leaves a
/// keyring of a database that never was: the next creation writes the
/// next keyring and ignores that one, and the database opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyring_left_by_a_failed_creation_is_ignored() {
    let db = TestDb::new(Backend::LocalEncrypted, "leftover");
    let raw = open_location(&db.url, &db.store_options).unwrap();
    let leftover = r#"{"number":1,"database":"00000000000000010000000000000002","provider":"local","master_key":"local:0000000000000000","wrapped":"AAAA","check":"0000000000000000","created_at_ms":1}"#;
    raw.store.put(&raw.child("encryption/00000000000000000001.json"), PutPayload::from(leftover.as_bytes().to_vec())).await.unwrap();
    let e = db.engine(EngineOptions::default()).await;
    run(&e, "CREATE TABLE t AS SELECT 1 AS x").await;
    assert_eq!(e.engine().database().keyring().unwrap().number(), 2);
    drop(e);
    assert_eq!(scalar(&run(&db.engine(EngineOptions::default()).await, "SELECT sum(x) FROM t").await), "1");
}

/// Single-bit flips anywhere in any object of an encrypted database —
/// data objects, every metadata object, the keyring, the marker — never
/// give a wrong answer: a query reading a damaged byte fails (AES-GCM
/// tags, checksums), and so does opening a database whose marker or
/// keyring was damaged. 48 flips in the suite;
/// `BLOBHOUSE_FLIPS=1000 cargo test -p blobhouse-tests --test suite encryption::random -- --nocapture`
/// for more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_flips_in_an_encrypted_database_never_give_a_wrong_answer() {
    use rand::{Rng, SeedableRng};
    let db = TestDb::new(Backend::LocalEncrypted, "flips");
    let e = db.engine(EngineOptions::default()).await;
    run(&e, "CREATE TABLE t AS SELECT value AS id, value % 17 AS q, 'name ' || value AS s FROM generate_series(1, 30000)").await;
    run(&e, "DELETE FROM t WHERE id % 11 = 0").await;
    drop(e);
    let queries = ["SELECT count(*), sum(id), sum(q), max(s) FROM t", "SELECT count(*), sum(q) FROM t WHERE id BETWEEN 20500 AND 21500"];
    let fresh = || async { db.engine(EngineOptions { cache: blobhouse_engine::CacheOptions::off(), ..EngineOptions::default() }).await };
    let mut baseline = Vec::new();
    for q in queries {
        baseline.push(lines(&run(&fresh().await, q).await));
    }
    let objects: Vec<String> = objects(&db).await.into_iter().map(|(rel, _)| rel).collect();
    let root = std::path::PathBuf::from(&db.url);
    let flips: usize = std::env::var("BLOBHOUSE_FLIPS").ok().and_then(|v| v.parse().ok()).unwrap_or(48);
    let mut rng = rand::rngs::StdRng::seed_from_u64(std::env::var("BLOBHOUSE_FLIP_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(45));
    let (mut failed, mut unchanged, mut wrong) = (0, 0, Vec::new());
    for _ in 0..flips {
        let rel = &objects[rng.random_range(0..objects.len())];
        let path = root.join(rel);
        let original = std::fs::read(&path).unwrap();
        let mut damaged = original.clone();
        let at = rng.random_range(0..damaged.len());
        damaged[at] ^= 1 << rng.random_range(0..8);
        std::fs::write(&path, &damaged).unwrap();
        let mut outcome = "unchanged";
        match blobhouse_engine::Session::open_location(db.location.clone(), db.store_options.clone(), EngineOptions { cache: blobhouse_engine::CacheOptions::off(), ..EngineOptions::default() }).await {
            Err(_) => outcome = "failed",
            Ok(e) => {
                for (q, expected) in queries.iter().zip(&baseline) {
                    match e.execute(q).await {
                        Err(_) => outcome = "failed",
                        Ok(r) if lines(&r) != *expected => wrong.push(format!("{rel} byte {at}: {q} gave {:?}", lines(&r))),
                        Ok(_) => {}
                    }
                }
            }
        }
        match outcome {
            "failed" => failed += 1,
            _ => unchanged += 1,
        }
        std::fs::write(&path, &original).unwrap();
    }
    println!("{flips} flips in an encrypted database: {failed} failed, {unchanged} answers unchanged, {} wrong", wrong.len());
    assert!(wrong.is_empty(), "silently wrong answers:\n{}", wrong.join("\n"));
    assert!(failed >= flips / 4, "only {failed} of {flips} flips were noticed");
}
