//! `blobhouse worker` processes serving `blobhouse sql --worker …`: the
//! answers are the one-process answers, and a worker killed with SIGKILL
//! makes the next statement fail quickly, naming it.

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_blobhouse");
const TOKEN: &str = "test-cluster-token";

fn sql(db: &str, workers: &[String], script: &str) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.env("BLOBHOUSE_CLUSTER_TOKEN", TOKEN).args(["sql", "--db", db, "--threads", "2", "-c", script]);
    for w in workers {
        cmd.args(["--worker", w]);
    }
    cmd.output().expect("run blobhouse sql")
}

fn ok(out: Output) -> String {
    assert!(out.status.success(), "blobhouse failed: {}\n{}", String::from_utf8_lossy(&out.stderr), String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// Table `t(x, k)` of `objects` data objects of 50 000 rows each (x from 1).
fn load(db: &str, objects: u64) {
    let mut script = String::from("CREATE TABLE t AS SELECT value AS x, value % 7 AS k FROM generate_series(1, 50000)");
    for i in 1..objects {
        script.push_str(&format!("; INSERT INTO t SELECT value AS x, value % 7 AS k FROM generate_series({}, {})", i * 50000 + 1, (i + 1) * 50000));
    }
    ok(sql(db, &[], &script));
}

/// A worker process, killed when dropped.
struct Worker {
    child: Child,
    url: String,
}

impl Worker {
    fn start(db: &str) -> Worker {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(BIN)
            .env("BLOBHOUSE_CLUSTER_TOKEN", TOKEN)
            .args(["worker", "--db", db, "--listen", &format!("127.0.0.1:{port}"), "--threads", "2", "--memory-limit", "1G"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start a worker");
        let started = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(started.elapsed() < Duration::from_secs(30), "worker on port {port} did not listen within 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        Worker { child, url: format!("http://127.0.0.1:{port}") }
    }
}

impl Worker {
    /// The worker's CPU time so far (user + system), in clock ticks.
    fn cpu_ticks(&self) -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<&str> = rest.split_whitespace().collect();
        // utime and stime: fields 14 and 15 of stat, the 12th and 13th after the name.
        let field = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        field(11) + field(12)
    }

    fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

/// The workers' CPU time together once they are idle (unchanged for 0.3 s,
/// at most 10 s on): taken before a statement starts, so what they use
/// after is the statement's, not the end of their own start.
fn idle_cpu(workers: &[&Worker]) -> u64 {
    let sum = || workers.iter().map(|w| w.cpu_ticks()).sum::<u64>();
    let started = Instant::now();
    loop {
        let before = sum();
        std::thread::sleep(Duration::from_millis(300));
        let after = sum();
        if after == before || started.elapsed() > Duration::from_secs(10) {
            return after;
        }
    }
}

/// Returns once the statement runs: the workers together have used 0.2 s
/// of CPU more than `idle` (at most 20 s on). Together, because a worker
/// home to none of the row groups gets no scan work, only a task of a
/// later stage, which the statement still needs.
fn wait_busy(workers: &[&Worker], idle: u64) {
    let hz = 100; // USER_HZ on Linux
    let started = Instant::now();
    while workers.iter().map(|w| w.cpu_ticks()).sum::<u64>() < idle + hz / 5 && started.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn statements_run_on_worker_processes_and_a_killed_worker_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().to_string_lossy().to_string();
    // Six data objects, so the scan has row groups to share.
    load(&db, 6);
    let q = "SELECT k, count(*) AS n, sum(x) AS s FROM t GROUP BY k ORDER BY k";
    let alone = ok(sql(&db, &[], q));
    assert!(alone.contains("| 0 | 42857 |"), "{alone}");

    let (a, mut b) = (Worker::start(&db), Worker::start(&db));
    let urls = vec![a.url.clone(), b.url.clone()];
    assert_eq!(ok(sql(&db, &urls, q)), alone, "two workers");
    let join = "SELECT count(*) FROM t AS l JOIN t AS r ON l.x = r.x + 1 WHERE l.k = 3";
    assert_eq!(ok(sql(&db, &urls, join)), ok(sql(&db, &[], join)), "a join on two workers");

    // A coordinator with another token is refused, and says why.
    let mut wrong = Command::new(BIN);
    wrong.env("BLOBHOUSE_CLUSTER_TOKEN", "not-the-token").args(["sql", "--db", &db, "-c", q, "--worker", &a.url, "--worker", &b.url]);
    let out = wrong.output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("cluster token"), "{}", String::from_utf8_lossy(&out.stderr));
    // A worker for a database that does not exist does not start (nor create it).
    let missing = dir.path().join("no-such-db");
    let out = Command::new(BIN).env("BLOBHOUSE_CLUSTER_TOKEN", TOKEN).args(["worker", "--db", &missing.to_string_lossy(), "--listen", "127.0.0.1:0"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("no-such-db") && stderr.contains("existing database"), "{stderr}");
    assert!(!missing.join("blobhouse.json").exists(), "the worker created the database");
    // A worker without a token does not start.
    let out = Command::new(BIN).env_remove("BLOBHOUSE_CLUSTER_TOKEN").args(["worker", "--db", &db, "--listen", "127.0.0.1:0"]).output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("BLOBHOUSE_CLUSTER_TOKEN"), "{}", String::from_utf8_lossy(&out.stderr));

    // A worker whose TLS certificate does not load does not start.
    let bad = dir.path().join("bad.pem");
    std::fs::write(&bad, "-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n").unwrap();
    let bad = bad.to_string_lossy().to_string();
    let out = Command::new(BIN)
        .env("BLOBHOUSE_CLUSTER_TOKEN", TOKEN)
        .args(["worker", "--db", &db, "--listen", "127.0.0.1:0", "--tls-cert", &bad, "--tls-key", &bad])
        .output()
        .unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("TLS certificate"), "{}", String::from_utf8_lossy(&out.stderr));

    // SIGKILL a worker while a statement runs on it: the statement runs
    // again on the survivor and returns the exact answer, within 10 s.
    // (About 4 s on two workers in a debug build: hashing 24 kB per row;
    // the kill comes once the worker is busy, with room for a faster machine.)
    let heavy = "SELECT k, count(*) AS n, max(sha256(repeat(CAST(x AS VARCHAR), 4000))) AS h FROM t GROUP BY k ORDER BY k";
    let expected = ok(sql(&db, &[], heavy));
    let mut running = Command::new(BIN);
    running.env("BLOBHOUSE_CLUSTER_TOKEN", TOKEN).args(["sql", "--db", &db, "--threads", "2", "-c", heavy, "--worker", &a.url, "--worker", &b.url]);
    let idle = idle_cpu(&[&a, &b]);
    let started = Instant::now();
    let running = running.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    wait_busy(&[&a, &b], idle);
    b.kill();
    let out = running.wait_with_output().unwrap();
    let took = started.elapsed();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(ok(out), expected, "the statement whose worker was killed");
    assert!(err.contains("ran again on the others"), "the statement was not rerun: {err}");
    assert!(took < Duration::from_secs(10), "it took {took:?}");

    // A coordinator started while the worker is down says so, and runs on the survivor.
    let out = sql(&db, &urls, q);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(err.contains(&format!("worker {}/ does not answer", b.url)), "{err}");
    assert_eq!(ok(out), alone);

    // Inside a transaction nothing is run twice: a worker killed during a
    // statement fails it, naming the worker.
    let mut c = Worker::start(&db);
    let mut running = Command::new(BIN);
    running.env("BLOBHOUSE_CLUSTER_TOKEN", TOKEN).args(["sql", "--db", &db, "--threads", "2", "-c", &format!("BEGIN; {heavy}; COMMIT"), "--worker", &a.url, "--worker", &c.url]);
    let idle = idle_cpu(&[&a, &c]);
    let started = Instant::now();
    let running = running.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    wait_busy(&[&a, &c], idle);
    c.kill();
    let out = running.wait_with_output().unwrap();
    let took = started.elapsed();
    assert!(!out.status.success(), "a statement whose worker died succeeded in a transaction: {}", String::from_utf8_lossy(&out.stdout));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(c.url.trim_start_matches("http://")), "the error does not name the dead worker {}: {err}", c.url);
    assert!(took < Duration::from_secs(15), "failing took {took:?}");

    // A statement that writes is never run twice either: a DELETE whose
    // subquery loses its worker fails naming it, and deletes nothing.
    let mut d = Worker::start(&db);
    let count = "SELECT count(*) FROM t";
    let before = ok(sql(&db, &[], count));
    let delete = "DELETE FROM t WHERE x IN (SELECT x FROM t GROUP BY x, k HAVING max(sha256(repeat(CAST(x AS VARCHAR), 4000))) <> '')";
    let mut running = Command::new(BIN);
    running.env("BLOBHOUSE_CLUSTER_TOKEN", TOKEN).args(["sql", "--db", &db, "--threads", "2", "-c", delete, "--worker", &a.url, "--worker", &d.url]);
    let idle = idle_cpu(&[&a, &d]);
    let running = running.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    wait_busy(&[&a, &d], idle);
    d.kill();
    let out = running.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains(d.url.trim_start_matches("http://")) && err.contains("not run again"), "the DELETE did not fail naming {}: {err}", d.url);
    assert_eq!(ok(sql(&db, &[], count)), before, "the failed DELETE deleted rows");
}

/// `blobhouse serve --worker …`: a PostgreSQL client's statements run on
/// the workers (EXPLAIN shows the distributed plan) with the answers of
/// one process.
#[test]
fn serve_runs_client_statements_on_workers() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().to_string_lossy().to_string();
    load(&db, 2);
    let q = "SELECT k, count(*) AS n, sum(x) AS s FROM t GROUP BY k ORDER BY k";
    let (a, b) = (Worker::start(&db), Worker::start(&db));
    let mut serve = Command::new(BIN)
        .env("BLOBHOUSE_CLUSTER_TOKEN", TOKEN)
        .env("BLOBHOUSE_PASSWORD", "pw")
        .args(["serve", "--db", &db, "--pg-listen", "127.0.0.1:0", "--flight-listen", "off", "--metrics-listen", "127.0.0.1:0", "--user", "alice", "--worker", &a.url, "--worker", &b.url])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(serve.stderr.take().unwrap());
    let (port, metrics) = loop {
        let mut line = String::new();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "serve stopped before serving");
        if let Some(rest) = line.strip_prefix("serving ") {
            let port = rest.split(" on ").nth(1).unwrap().split([',', ';']).next().unwrap().rsplit(':').next().unwrap().to_string();
            let metrics = rest.split("http://").nth(1).unwrap().split('/').next().unwrap().to_string();
            break (port, metrics);
        }
    };
    let scrape = || {
        use std::io::{Read, Write};
        let mut s = TcpStream::connect(&metrics).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        text
    };
    let up = |w: &Worker, v: u8| format!("blobhouse_cluster_worker_up{{worker=\"{}\"}} {v}", w.url);
    let text = scrape();
    assert!(text.contains(&up(&a, 1)) && text.contains(&up(&b, 1)), "{text}");
    let psql = |sql: &str| {
        let out = Command::new("psql")
            .arg(format!("host=127.0.0.1 port={port} user=alice dbname=blobhouse sslmode=disable"))
            .args(["-X", "-A", "-t", "-c", sql])
            .env("PGPASSWORD", "pw")
            .output()
            .expect("psql runs (install postgresql-client)");
        assert!(out.status.success(), "{sql}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    assert!(psql(&format!("EXPLAIN {q}")).contains("distributed_plan"), "not distributed");
    let rows = psql(q);
    assert!(rows.starts_with("0|14285|"), "{rows}");
    let alone = ok(sql(&db, &[], q));
    for line in rows.lines() {
        let cells: Vec<&str> = line.split('|').collect();
        assert!(alone.contains(&format!("| {} | {} | {} |", cells[0], cells[1], cells[2])), "{line} is not in\n{alone}");
    }
    // A worker that dies is reported down once a statement found it so.
    let mut b = b;
    b.child.kill().unwrap();
    b.child.wait().unwrap();
    assert!(psql(q).starts_with("0|14285|"), "the statement after the kill");
    let text = scrape();
    assert!(text.contains(&up(&a, 1)) && text.contains(&up(&b, 0)), "{text}");
    serve.kill().unwrap();
    serve.wait().unwrap();
}

/// `--workers N`: the coordinator starts N worker processes bound to their
/// CPUs, runs its statements on them, and they end with it (N = 2 where
/// the process may use two CPUs).
#[test]
fn local_workers_are_bound_to_their_cpus_and_end_with_the_coordinator() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().to_string_lossy().to_string();
    load(&db, 2);
    let heavy = "SELECT k, count(*) AS n, max(sha256(repeat(CAST(x AS VARCHAR), 3000))) AS h FROM t GROUP BY k ORDER BY k";
    let expected = ok(sql(&db, &[], heavy));
    // One worker per CPU this process may use, two at most (a worker needs a CPU of its own).
    let n = std::thread::available_parallelism().map_or(1, |c| c.get()).min(2);
    let mut coordinator = Command::new(BIN)
        .env_remove("BLOBHOUSE_CLUSTER_TOKEN")
        .args(["sql", "--db", &db, "--workers", &n.to_string(), "--worker-memory-limit", "512M", "-c", heavy])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(coordinator.stderr.take().unwrap());
    let mut workers = Vec::new();
    while workers.len() < n {
        let mut line = String::new();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "the coordinator stopped before starting {n} workers");
        if let Some(rest) = line.strip_prefix("worker pid ") {
            let (pid, placement) = rest.split_once(": ").unwrap();
            let cpus = placement.strip_prefix("cpus ").unwrap().split(' ').next().unwrap().to_string();
            workers.push((pid.parse::<u32>().unwrap(), cpus));
        }
    }
    // While the statement runs, each worker may use only its CPUs.
    for (pid, cpus) in &workers {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let allowed = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap().trim().to_string();
        assert_eq!(&allowed, cpus, "worker {pid}");
    }
    let mut out = String::new();
    std::io::Read::read_to_string(coordinator.stdout.as_mut().unwrap(), &mut out).unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    assert!(coordinator.wait().unwrap().success());
    assert_eq!(out, expected);
    // At exit, each worker's peak resident set against its limit.
    for (pid, _) in &workers {
        assert!(rest.contains(&format!("worker pid {pid}: peak RSS ")) && rest.contains("memory limit 512 MiB"), "{rest}");
    }
    std::thread::sleep(Duration::from_millis(200));
    for (pid, _) in &workers {
        let state = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        assert!(state.is_empty() || state.contains("State:\tZ"), "worker {pid} outlived its coordinator");
    }
}
