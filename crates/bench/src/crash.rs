//! The crash harness: `blobhouse bench crash --trials N`.
//!
//! Each trial starts a writer process that runs one operation — INSERT,
//! COPY, DELETE, UPDATE (each a transaction with a marker row), OPTIMIZE,
//! VACUUM, CREATE SNAPSHOT, RESTORE TABLE — and injects one fault: a fail
//! point that aborts the process or fails the step
//! (`blobhouse_storage::failpoint`), a `kill -9` at a random moment, or
//! nothing. After the process ended, the harness (another process, with its
//! own handle) decides from the marker whether the operation committed,
//! applies it to its oracle — a model of the table and its snapshots — and
//! checks: the table equals the model (no committed row lost, no
//! uncommitted row visible, nothing half applied), snapshots still read as
//! when they were taken, every version since the horizon is readable, and,
//! after a recovery VACUUM (RETAIN and GRACE 0), the store holds exactly
//! what the catalog references: no object missing, no orphan left.
//!
//! Why this shape: SQLite's and FoundationDB's testing culture — many
//! cheap random trials against an oracle, crashes at every named step.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use blobhouse_engine::{EngineError, EngineOptions, Session};
use blobhouse_storage::StoreOptions;
use blobhouse_storage::failpoint::POINTS;

use crate::answers::result_rows;

/// The environment variable that carries a crash worker's task (JSON).
pub const WORKER_ENV: &str = "BLOBHOUSE_CRASH_WORKER";

/// How long workers use a declared key block: short, so that the recovery
/// VACUUM can collect a dead worker's uploads right away.
const WORKER_BLOCK_TTL: Duration = Duration::from_millis(50);

/// How long a killed worker's last request may take to land.
const KILL_SETTLE: Duration = Duration::from_millis(250);

/// A worker's task: statements to run, in order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerTask {
    pub url: String,
    pub store: StoreOptions,
    pub statements: Vec<String>,
}

/// Runs the crash worker described by [`WORKER_ENV`]; `None`: not a worker.
/// Fail points come from `BLOBHOUSE_FAILPOINTS`.
pub async fn worker_from_env() -> Option<Result<(), String>> {
    let task = std::env::var(WORKER_ENV).ok()?;
    Some(
        async {
            let task: WorkerTask = serde_json::from_str(&task).map_err(|e| format!("{WORKER_ENV}: {e}"))?;
            let options = EngineOptions { key_block_ttl: WORKER_BLOCK_TTL, target_partitions: 1, ..EngineOptions::default() };
            let e = Session::open(&task.url, &task.store, options).await.map_err(|e| e.to_string())?;
            for s in &task.statements {
                if let Err(err) = e.execute(s).await {
                    // A failed statement: the transaction rolls back (its
                    // uploads are deleted, unless a fail point stops that).
                    println!("CRASH-WORKER failed: {err}");
                    e.rollback().await;
                    return Ok(());
                }
            }
            println!("CRASH-WORKER done");
            Ok(())
        }
        .await,
    )
}

/// The harness's options.
#[derive(Debug, Clone)]
pub struct CrashOptions {
    pub trials: usize,
    pub seed: u64,
    /// Run a recovery VACUUM and the orphan check every this many trials
    /// (and after the last).
    pub check_every: usize,
    /// Where COPY's CSV files go.
    pub scratch: PathBuf,
}

/// The outcome: counts and every violation found.
#[derive(Debug, Clone, Default)]
pub struct CrashReport {
    pub trials: usize,
    pub by_fault: BTreeMap<String, usize>,
    pub by_operation: BTreeMap<String, usize>,
    pub committed: usize,
    pub violations: Vec<String>,
    pub lost_committed_rows: usize,
    pub uncommitted_rows_seen: usize,
    pub orphans_after_gc: usize,
    pub missing_objects: usize,
    pub torn_versions: usize,
    pub elapsed: Duration,
}

impl CrashReport {
    /// The result table.
    pub fn describe(&self) -> String {
        let mut s = format!("crash harness: {} trials in {:.1} s, {} committed\n", self.trials, self.elapsed.as_secs_f64(), self.committed);
        s += "faults:     ";
        s += &self.by_fault.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ");
        s += "\noperations: ";
        s += &self.by_operation.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ");
        s += &format!(
            "\ninvariant violations     {:>6}\nlost committed rows      {:>6}\nuncommitted rows seen    {:>6}\norphans after GC         {:>6}\nreferenced but missing   {:>6}\ntorn versions seen       {:>6}\n",
            self.violations.len(),
            self.lost_committed_rows,
            self.uncommitted_rows_seen,
            self.orphans_after_gc,
            self.missing_objects,
            self.torn_versions
        );
        for v in self.violations.iter().take(10) {
            s += &format!("  violation: {v}\n");
        }
        s
    }
}

/// The oracle: the table `t(op, k, v)` as it must be, and its snapshots.
#[derive(Debug, Clone, Default)]
struct Model {
    rows: BTreeMap<(i64, i64), i64>,
    snapshots: BTreeMap<String, BTreeMap<(i64, i64), i64>>,
    /// Operations whose rows exist (DELETE and UPDATE pick among them).
    inserted: Vec<i64>,
    /// Trials whose marker committed.
    committed: std::collections::BTreeSet<i64>,
}

/// One trial's operation.
#[derive(Debug, Clone)]
enum Op {
    Insert { rows: i64 },
    Copy { rows: i64, file: PathBuf },
    Delete { of: i64 },
    Update { of: i64 },
    Optimize,
    Vacuum,
    Snapshot { name: String },
    Restore { name: String },
}

impl Op {
    fn name(&self) -> &'static str {
        match self {
            Op::Insert { .. } => "insert",
            Op::Copy { .. } => "copy",
            Op::Delete { .. } => "delete",
            Op::Update { .. } => "update",
            Op::Optimize => "optimize",
            Op::Vacuum => "vacuum",
            Op::Snapshot { .. } => "snapshot",
            Op::Restore { .. } => "restore",
        }
    }

    /// The statements; every changing one is a transaction that also adds
    /// the trial's marker to `ops`, so the marker tells whether it committed.
    fn statements(&self, trial: i64) -> Vec<String> {
        let marked = |body: Vec<String>| {
            let mut s = vec!["BEGIN".to_string()];
            s.extend(body);
            s.push(format!("INSERT INTO ops VALUES ({trial})"));
            s.push("COMMIT".into());
            s
        };
        match self {
            Op::Insert { rows } => marked(vec![format!("INSERT INTO t SELECT {trial}, CAST(v AS BIGINT), 0 FROM generate_series(0, {}) AS s(v)", rows - 1)]),
            Op::Copy { file, .. } => marked(vec![format!("COPY t FROM '{}' WITH (FORMAT csv, HEADER false)", file.display())]),
            Op::Delete { of } => marked(vec![format!("DELETE FROM t WHERE op = {of} AND k % 2 = 0")]),
            Op::Update { of } => marked(vec![format!("UPDATE t SET v = v + 1 WHERE op = {of}")]),
            Op::Optimize => marked(vec!["OPTIMIZE t".into()]),
            Op::Vacuum => vec!["VACUUM RETAIN '0 seconds' GRACE '0 seconds'".into()],
            Op::Snapshot { name } => vec![format!("CREATE SNAPSHOT {name}")],
            Op::Restore { name } => marked(vec![format!("RESTORE TABLE t TO SNAPSHOT {name}")]),
        }
    }
}

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// Runs the harness on the database at `url` (created here). `command`
/// starts a process that runs [`worker_from_env`].
pub async fn run(url: &str, store: &StoreOptions, o: &CrashOptions, command: &dyn Fn() -> std::process::Command, progress: &dyn Fn(&str)) -> Result<CrashReport, String> {
    let started = Instant::now();
    let err = |what: &'static str| move |e: EngineError| format!("{what}: {e}");
    let e = Session::open(url, store, EngineOptions::default()).await.map_err(err("open"))?;
    e.execute("CREATE TABLE t (op BIGINT NOT NULL, k BIGINT NOT NULL, v BIGINT NOT NULL)").await.map_err(err("create t"))?;
    e.execute("CREATE TABLE ops (op BIGINT NOT NULL)").await.map_err(err("create ops"))?;
    std::fs::create_dir_all(&o.scratch).map_err(|e| format!("{}: {e}", o.scratch.display()))?;
    let mut rng = Rng(o.seed | 1);
    let mut model = Model::default();
    let mut report = CrashReport { trials: o.trials, ..Default::default() };
    for trial in 1..=o.trials as i64 {
        let op = choose(&mut rng, &model, trial, &o.scratch)?;
        let (fault, failpoints, kill_after) = match rng.below(20) {
            0..=4 => ("none".to_string(), String::new(), None),
            5..=11 => {
                let p = POINTS[rng.below(POINTS.len() as u64) as usize];
                (format!("crash at {p}"), format!("{p}=crash"), None)
            }
            12..=14 => {
                let p = POINTS[rng.below(POINTS.len() as u64) as usize];
                (format!("error at {p}"), format!("{p}=error"), None)
            }
            _ => ("kill -9".to_string(), String::new(), Some(Duration::from_millis(rng.below(400)))),
        };
        let kind = fault.split(" at ").next().unwrap_or("none").to_string();
        *report.by_fault.entry(kind).or_default() += 1;
        *report.by_operation.entry(op.name().to_string()).or_default() += 1;
        let task = WorkerTask { url: url.to_string(), store: store.clone(), statements: op.statements(trial) };
        let mut c = command();
        c.env(WORKER_ENV, serde_json::to_string(&task).expect("task serialises")).env("BLOBHOUSE_FAILPOINTS", &failpoints);
        c.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
        let mut child = tokio::process::Command::from(c).kill_on_drop(true).spawn().map_err(|e| format!("start a crash worker: {e}"))?;
        match kill_after {
            Some(after) => {
                if tokio::time::timeout(after, child.wait()).await.is_err() {
                    let _ = child.start_kill();
                    let _ = child.wait().await;
                    // A request the worker had fully sent still lands after
                    // its death (the kernel delivers the socket's buffer):
                    // its commit is in doubt for a moment, as any client's
                    // is whose connection broke. Let it settle.
                    tokio::time::sleep(KILL_SETTLE).await;
                }
            }
            None => {
                let _ = tokio::time::timeout(Duration::from_secs(120), child.wait()).await.map_err(|_| format!("trial {trial}: the worker hung"))?;
            }
        }
        // What committed, and the table, read in one snapshot: two
        // statements outside a transaction may read two versions.
        e.execute("BEGIN").await.map_err(err("BEGIN"))?;
        let markers = query(&e, "SELECT op FROM ops").await?;
        let mut counts = BTreeMap::<i64, usize>::new();
        for m in &markers {
            *counts.entry(m[0].parse().unwrap_or(-1)).or_default() += 1;
        }
        for (&marker, &n) in &counts {
            if n > 1 {
                report.violations.push(format!("trial {trial}: the marker of trial {marker} is there {n} times"));
            }
            if marker != trial && !model.committed.contains(&marker) {
                report.violations.push(format!("trial {trial}: trial {marker}'s commit appeared after its check (it was not visible then)"));
            }
        }
        let committed = match &op {
            Op::Vacuum => false,
            Op::Snapshot { name } => query(&e, "SHOW SNAPSHOTS").await?.iter().any(|r| r[0] == *name),
            _ => counts.contains_key(&trial),
        };
        if committed {
            report.committed += 1;
            apply(&mut model, &op, trial);
        }
        check_table(&e, &model, None, trial, &fault, &op, &mut report).await?;
        e.execute("COMMIT").await.map_err(err("COMMIT"))?;
        if (trial as usize).is_multiple_of(o.check_every) || trial as usize == o.trials {
            progress(&format!("{trial}/{} trials, {} committed, {} violations", o.trials, report.committed, report.violations.len()));
            recover_and_audit(&e, &model, trial, &mut report).await?;
        }
    }
    report.elapsed = started.elapsed();
    Ok(report)
}

fn choose(rng: &mut Rng, model: &Model, trial: i64, scratch: &std::path::Path) -> Result<Op, String> {
    let pick = |rng: &mut Rng, items: &[i64]| items[rng.below(items.len() as u64) as usize];
    Ok(match rng.below(16) {
        _ if model.inserted.is_empty() => Op::Insert { rows: 1 + rng.below(40) as i64 },
        0..=3 => Op::Insert { rows: 1 + rng.below(40) as i64 },
        4..=5 => {
            let rows = 1 + rng.below(40) as i64;
            let file = scratch.join(format!("copy-{trial}.csv"));
            let body: String = (0..rows).map(|k| format!("{trial},{k},0\n")).collect();
            std::fs::write(&file, body).map_err(|e| format!("{}: {e}", file.display()))?;
            Op::Copy { rows, file }
        }
        6..=7 => Op::Delete { of: pick(rng, &model.inserted) },
        8..=9 => Op::Update { of: pick(rng, &model.inserted) },
        10 => Op::Optimize,
        11..=12 => Op::Vacuum,
        13 => Op::Snapshot { name: format!("s{trial}") },
        _ => match model.snapshots.keys().next_back() {
            Some(name) => Op::Restore { name: name.clone() },
            None => Op::Snapshot { name: format!("s{trial}") },
        },
    })
}

fn apply(model: &mut Model, op: &Op, trial: i64) {
    if !matches!(op, Op::Snapshot { .. }) {
        model.committed.insert(trial);
    }
    match op {
        Op::Insert { rows } | Op::Copy { rows, .. } => {
            for k in 0..*rows {
                model.rows.insert((trial, k), 0);
            }
            model.inserted.push(trial);
        }
        Op::Delete { of } => model.rows.retain(|(op, k), _| !(*op == *of && k % 2 == 0)),
        Op::Update { of } => model.rows.iter_mut().filter(|((op, _), _)| *op == *of).for_each(|(_, v)| *v += 1),
        Op::Optimize | Op::Vacuum => {}
        Op::Snapshot { name } => {
            model.snapshots.insert(name.clone(), model.rows.clone());
        }
        Op::Restore { name } => model.rows = model.snapshots[name].clone(),
    }
}

async fn query(e: &Session, sql: &str) -> Result<Vec<Vec<String>>, String> {
    let r = e.execute(sql).await.map_err(|err| format!("{sql}: {err}"))?;
    Ok(result_rows(&r.batches))
}

/// Compares `t` (or `t AT(SNAPSHOT => s)`) with the model.
async fn check_table(e: &Session, model: &Model, snapshot: Option<&str>, trial: i64, fault: &str, op: &Op, report: &mut CrashReport) -> Result<(), String> {
    let (from, want) = match snapshot {
        Some(s) => (format!("t AT(SNAPSHOT => '{s}')"), &model.snapshots[s]),
        None => ("t".to_string(), &model.rows),
    };
    let got: BTreeMap<(i64, i64), i64> = query(e, &format!("SELECT op, k, v FROM {from}"))
        .await?
        .into_iter()
        .map(|r| ((r[0].parse().unwrap_or(-1), r[1].parse().unwrap_or(-1)), r[2].parse().unwrap_or(-1)))
        .collect();
    if got != *want {
        let lost = want.iter().filter(|(k, v)| got.get(k) != Some(v)).count();
        let extra = got.iter().filter(|(k, v)| want.get(k) != Some(v)).count();
        report.lost_committed_rows += lost;
        report.uncommitted_rows_seen += extra;
        report.violations.push(format!("trial {trial} ({} with {fault}): {from} differs from the oracle: {lost} rows missing or changed, {extra} unexpected", op.name()));
    }
    Ok(())
}

/// A recovery VACUUM (after the workers' key blocks expired), then: every
/// version since the horizon reads, snapshots read as taken, and the store
/// holds exactly what is referenced.
async fn recover_and_audit(e: &Session, model: &Model, trial: i64, report: &mut CrashReport) -> Result<(), String> {
    tokio::time::sleep(WORKER_BLOCK_TTL * 3).await;
    e.execute("VACUUM RETAIN '0 seconds' GRACE '0 seconds'").await.map_err(|err| format!("recovery VACUUM after trial {trial}: {err}"))?;
    let newest = e.engine().database().refresh().await.map_err(|err| err.to_string())?;
    for v in newest.gc.horizon.max(1)..=newest.version {
        if let Err(err) = e.engine().database().read_version(v).await {
            report.torn_versions += 1;
            report.violations.push(format!("after trial {trial}: version {v} does not read: {err}"));
        }
    }
    for s in model.snapshots.keys() {
        check_table(e, model, Some(s), trial, "recovery check", &Op::Vacuum, report).await?;
    }
    let (missing, orphans) = blobhouse_storage::gc::audit(e.engine().database()).await.map_err(|err| err.to_string())?;
    if !missing.is_empty() || !orphans.is_empty() {
        report.violations.push(format!("after trial {trial}'s recovery: {} referenced objects missing ({:?}…), {} orphans ({:?}…)", missing.len(), missing.first(), orphans.len(), orphans.first()));
    }
    report.missing_objects = missing.len();
    report.orphans_after_gc = orphans.len();
    // Iceberg metadata in force names only objects that are there.
    let dangling = blobhouse_storage::iceberg::dangling(e.engine().database()).await.map_err(|err| err.to_string())?;
    if !dangling.is_empty() {
        report.violations.push(format!("after trial {trial}'s recovery: Iceberg metadata names {} missing objects: {:?}", dangling.len(), &dangling[..dangling.len().min(5)]));
    }
    report.missing_objects += dangling.len();
    Ok(())
}
