//! The bank workload: the classic check of a transactional store under
//! concurrency (Jepsen's "bank", SAP IQ's and every OLTP paper's sanity
//! test), run by separate processes against one database.
//!
//! `accounts` rows each hold a balance; writer processes move random
//! amounts between two random accounts, each transfer one transaction of
//! two UPDATEs and an INSERT into `transfers` (its log, written in the same
//! transaction); reader processes meanwhile check that the balances sum to
//! the initial total and that every account appears exactly once. At the
//! end the driver checks the total, that the `transfers` table holds exactly
//! the transfers whose COMMIT succeeded (each once), and that every balance
//! equals its initial value plus what the logged transfers moved. A
//! transfer whose COMMIT fails with a serialization error is counted, not
//! retried.
//!
//! Workers are processes (the driver is given a command that starts one; it
//! passes the worker's task in [`WORKER_ENV`]), because separate processes
//! share nothing but the store — the case the commit protocol must handle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use blobhouse_engine::{EngineError, EngineOptions, Session};
use blobhouse_storage::{StorageError, StoreOptions};

use crate::answers::result_rows;

/// The environment variable that carries a worker's task (JSON).
pub const WORKER_ENV: &str = "BLOBHOUSE_BANK_WORKER";

/// The workload's size.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BankOptions {
    pub accounts: u32,
    pub initial_balance: i64,
    pub writers: u32,
    pub readers: u32,
    /// Transfers each writer attempts.
    pub transfers: u32,
    /// Seed of the writers' random choices.
    pub seed: u64,
}

impl Default for BankOptions {
    fn default() -> Self {
        BankOptions { accounts: 16, initial_balance: 1000, writers: 4, readers: 2, transfers: 200, seed: 42 }
    }
}

/// One worker's task.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerTask {
    pub url: String,
    pub store: StoreOptions,
    pub options: BankOptions,
    pub reader: bool,
    pub id: u32,
    /// Readers stop once this file exists.
    pub stop_file: PathBuf,
}

/// What a worker did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WorkerReport {
    pub id: u32,
    pub reader: bool,
    /// Writer: sequence numbers of the transfers that committed.
    pub committed: Vec<u32>,
    pub serialization_failures: u32,
    /// Other failures (conflicts, store errors), with their messages.
    pub errors: Vec<String>,
    /// Reader: consistency checks run, and what each broken one saw.
    pub checks: u32,
    pub broken: Vec<String>,
}

/// The run's outcome, checked.
#[derive(Debug, Clone, Default)]
pub struct BankReport {
    pub committed: u64,
    pub serialization_failures: u64,
    pub errors: Vec<String>,
    pub reader_checks: u64,
    pub broken_reads: Vec<String>,
    /// Violations found at the end (empty: the invariants held).
    pub violations: Vec<String>,
    pub elapsed: Duration,
}

impl BankReport {
    /// A table for people.
    pub fn describe(&self, o: &BankOptions) -> String {
        let attempted = u64::from(o.writers) * u64::from(o.transfers);
        let mut s = format!(
            "bank: {} writers x {} transfers, {} readers, {} accounts, {:.1} s\n\
             committed transfers      {:>8}\n\
             serialization failures   {:>8} ({:.1} % of {attempted})\n\
             other errors             {:>8}\n\
             reader checks            {:>8} (broken: {})\n\
             invariants               {}\n",
            o.writers,
            o.transfers,
            o.readers,
            o.accounts,
            self.elapsed.as_secs_f64(),
            self.committed,
            self.serialization_failures,
            100.0 * self.serialization_failures as f64 / attempted.max(1) as f64,
            self.errors.len(),
            self.reader_checks,
            self.broken_reads.len(),
            if self.violations.is_empty() { "hold".to_string() } else { format!("VIOLATED: {}", self.violations.join("; ")) },
        );
        for e in self.errors.iter().take(5) {
            s += &format!("  error: {e}\n");
        }
        s
    }
}

/// Creates the two tables: one INSERT per account, so each account's row
/// lives in a data object of its own (transfers between different accounts
/// then touch different objects and do not conflict).
pub async fn setup(engine: &Session, o: &BankOptions) -> Result<(), EngineError> {
    engine.execute("CREATE TABLE accounts (id INT NOT NULL, balance BIGINT NOT NULL)").await?;
    engine.execute("CREATE TABLE transfers (writer INT NOT NULL, seq INT NOT NULL, src INT NOT NULL, dst INT NOT NULL, amount BIGINT NOT NULL)").await?;
    for id in 0..o.accounts {
        engine.execute(&format!("INSERT INTO accounts VALUES ({id}, {})", o.initial_balance)).await?;
    }
    Ok(())
}

/// Runs the worker described by [`WORKER_ENV`], if set, and prints its
/// report as one line `BANK-REPORT <json>`. `None`: not a worker.
pub async fn worker_from_env() -> Option<Result<(), String>> {
    let task = std::env::var(WORKER_ENV).ok()?;
    Some(async {
        let task: WorkerTask = serde_json::from_str(&task).map_err(|e| format!("{WORKER_ENV}: {e}"))?;
        let report = worker(&task).await.map_err(|e| e.to_string())?;
        println!("BANK-REPORT {}", serde_json::to_string(&report).expect("report serialises"));
        Ok(())
    }.await)
}

/// One worker: transfers (writer) or checks (reader) until done.
pub async fn worker(task: &WorkerTask) -> Result<WorkerReport, EngineError> {
    let options = EngineOptions { target_partitions: 1, memory_limit: Some(512 << 20), ..EngineOptions::default() };
    let e = Session::open(&task.url, &task.store, options).await?;
    let mut report = WorkerReport { id: task.id, reader: task.reader, ..Default::default() };
    let o = &task.options;
    if task.reader {
        let expected = format!("{}|{}|{}", i64::from(o.accounts as i32) * o.initial_balance, o.accounts, o.accounts);
        while !task.stop_file.exists() {
            let r = e.execute("SELECT sum(balance), count(*), count(DISTINCT id) FROM accounts").await?;
            let seen = result_rows(&r.batches).first().map(|row| row.join("|")).unwrap_or_default();
            report.checks += 1;
            if seen != expected {
                report.broken.push(format!("saw {seen}, expected {expected} (version {})", e.engine().database().current().version));
            }
        }
        return Ok(report);
    }
    let mut rng = o.seed ^ (u64::from(task.id) + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut next = |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    for seq in 0..o.transfers {
        let src = next(u64::from(o.accounts));
        let dst = (src + 1 + next(u64::from(o.accounts) - 1)) % u64::from(o.accounts);
        let amount = 1 + next(100);
        let statements = [
            "BEGIN".to_string(),
            format!("UPDATE accounts SET balance = balance - {amount} WHERE id = {src}"),
            format!("UPDATE accounts SET balance = balance + {amount} WHERE id = {dst}"),
            format!("INSERT INTO transfers VALUES ({}, {seq}, {src}, {dst}, {amount})", task.id),
            "COMMIT".to_string(),
        ];
        let mut outcome = Ok(());
        for s in &statements {
            if let Err(err) = e.execute(s).await {
                outcome = Err(err);
                break;
            }
        }
        match outcome {
            Ok(()) => report.committed.push(seq),
            Err(EngineError::Storage(StorageError::Serialization { .. })) => report.serialization_failures += 1,
            Err(err) => report.errors.push(format!("transfer {seq}: {err}")),
        }
        if e.in_transaction() {
            e.rollback().await;
        }
    }
    Ok(report)
}

/// Runs the whole workload on the database at `url` (created here):
/// starts the workers with `command` (a command that runs
/// [`worker_from_env`]), waits for the writers, stops the readers and
/// checks the invariants.
pub async fn run(url: &str, store: &StoreOptions, o: &BankOptions, command: &dyn Fn() -> std::process::Command, progress: &dyn Fn(&str)) -> Result<BankReport, String> {
    let started = Instant::now();
    let e = Session::open(url, store, EngineOptions::default()).await.map_err(|e| format!("open {url}: {e}"))?;
    setup(&e, o).await.map_err(|e| format!("set up the bank tables: {e}"))?;
    let stop = tempfile_path();
    let spawn = |reader: bool, id: u32| -> Result<tokio::process::Child, String> {
        let task = WorkerTask { url: url.to_string(), store: store.clone(), options: o.clone(), reader, id, stop_file: stop.clone() };
        let mut c = command();
        c.env(WORKER_ENV, serde_json::to_string(&task).expect("task serialises")).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
        tokio::process::Command::from(c).kill_on_drop(true).spawn().map_err(|e| format!("start a bank worker: {e}"))
    };
    let writers: Vec<_> = (0..o.writers).map(|i| spawn(false, i)).collect::<Result<_, _>>()?;
    let readers: Vec<_> = (0..o.readers).map(|i| spawn(true, i)).collect::<Result<_, _>>()?;
    progress(&format!("{} writers and {} readers started", o.writers, o.readers));
    let mut reports = Vec::new();
    for w in writers {
        reports.push(collect(w).await?);
    }
    progress("writers done; stopping the readers");
    std::fs::write(&stop, b"stop").map_err(|e| format!("{}: {e}", stop.display()))?;
    for r in readers {
        reports.push(collect(r).await?);
    }
    let _ = std::fs::remove_file(&stop);
    let mut report = BankReport { elapsed: started.elapsed(), ..Default::default() };
    for r in &reports {
        report.committed += r.committed.len() as u64;
        report.serialization_failures += u64::from(r.serialization_failures);
        report.errors.extend(r.errors.iter().cloned());
        report.reader_checks += u64::from(r.checks);
        report.broken_reads.extend(r.broken.iter().cloned());
    }
    report.violations = check(&e, o, &reports).await.map_err(|e| format!("final check: {e}"))?;
    Ok(report)
}

/// The final invariants; each violation described.
async fn check(e: &Session, o: &BankOptions, reports: &[WorkerReport]) -> Result<Vec<String>, EngineError> {
    let mut violations = Vec::new();
    let rows = |r: blobhouse_engine::QueryResult| result_rows(&r.batches);
    let balances: BTreeMap<i64, i64> =
        rows(e.execute("SELECT id, balance FROM accounts").await?).iter().map(|r| (r[0].parse().unwrap_or(-1), r[1].parse().unwrap_or(0))).collect();
    let account_rows = rows(e.execute("SELECT count(*) FROM accounts").await?)[0][0].parse::<u64>().unwrap_or(0);
    if account_rows != u64::from(o.accounts) || balances.len() != o.accounts as usize {
        violations.push(format!("{account_rows} account rows, {} distinct accounts, expected {}", balances.len(), o.accounts));
    }
    let total: i64 = balances.values().sum();
    if total != i64::from(o.accounts as i32) * o.initial_balance {
        violations.push(format!("total balance {total}, expected {}", i64::from(o.accounts as i32) * o.initial_balance));
    }
    let logged = rows(e.execute("SELECT writer, seq, src, dst, amount FROM transfers").await?);
    let mut seen = BTreeSet::new();
    let mut expected_balance: BTreeMap<i64, i64> = (0..i64::from(o.accounts)).map(|a| (a, o.initial_balance)).collect();
    for r in &logged {
        let v: Vec<i64> = r.iter().map(|x| x.parse().unwrap_or(-1)).collect();
        if !seen.insert((v[0], v[1])) {
            violations.push(format!("transfer {} of writer {} is logged twice", v[1], v[0]));
        }
        *expected_balance.entry(v[2]).or_default() -= v[4];
        *expected_balance.entry(v[3]).or_default() += v[4];
    }
    let committed: BTreeSet<(i64, i64)> = reports.iter().filter(|r| !r.reader).flat_map(|r| r.committed.iter().map(move |s| (i64::from(r.id), i64::from(*s)))).collect();
    if committed != seen {
        let missing = committed.difference(&seen).count();
        let extra = seen.difference(&committed).count();
        violations.push(format!("{missing} committed transfers missing from the log, {extra} logged transfers that did not commit"));
    }
    if expected_balance != balances {
        let wrong = expected_balance.iter().filter(|(a, b)| balances.get(a) != Some(b)).count();
        violations.push(format!("{wrong} accounts do not match the transfer log"));
    }
    Ok(violations)
}

async fn collect(child: tokio::process::Child) -> Result<WorkerReport, String> {
    let out = child.wait_with_output().await.map_err(|e| format!("bank worker: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().find_map(|l| l.split_once("BANK-REPORT ").map(|(_, json)| json));
    match (out.status.success(), line) {
        (true, Some(json)) => serde_json::from_str(json).map_err(|e| format!("bank worker report: {e}")),
        _ => Err(format!("bank worker failed ({}): {}{}", out.status, stdout.chars().take(2000).collect::<String>(), String::from_utf8_lossy(&out.stderr).chars().take(4000).collect::<String>())),
    }
}

fn tempfile_path() -> PathBuf {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    std::env::temp_dir().join(format!("blobhouse-bank-stop-{}-{nanos}", std::process::id()))
}
