//! The `blobhouse` binary, run as separate processes.

use std::process::{Command, Output};

use blobhouse_testkit::MinioServer;

fn blobhouse(db: &str, env: &[(&str, String)], args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_blobhouse"));
    cmd.args(["sql", "--db", db]).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run blobhouse")
}

fn ok(out: Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "blobhouse failed: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    stdout
}

fn reopen_in_a_new_process(db: &str, env: &[(&str, String)]) {
    ok(blobhouse(db, env, &["-c", "CREATE TABLE t AS SELECT * FROM (VALUES (1, 'x'), (2, 'y')) AS v(a, b); INSERT INTO t VALUES (3, 'z')"]));
    let out = ok(blobhouse(db, env, &["-c", "SELECT a, b FROM t ORDER BY a"]));
    for row in ["| 1 | x |", "| 2 | y |", "| 3 | z |"] {
        assert!(out.contains(row), "missing {row} in\n{out}");
    }
}

#[test]
fn reopening_a_local_database_in_a_new_process_sees_committed_data() {
    let dir = tempfile::tempdir().unwrap();
    reopen_in_a_new_process(&dir.path().to_string_lossy(), &[]);
}

#[test]
fn reopening_an_s3_database_in_a_new_process_sees_committed_data() {
    let minio = MinioServer::shared();
    reopen_in_a_new_process(&minio.fresh_url("cli-reopen"), &minio.env());
}

#[test]
fn two_writer_processes_insert_every_row_exactly_once() {
    let minio = MinioServer::shared();
    let env = minio.env();
    let db = minio.fresh_url("cli-concurrent");
    ok(blobhouse(&db, &env, &["-c", "CREATE TABLE c (w INT NOT NULL, i INT NOT NULL)"]));
    let script = |w: u32| (0..10).map(|i| format!("INSERT INTO c VALUES ({w}, {i})")).collect::<Vec<_>>().join(";");
    let spawn = |w: u32| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_blobhouse"));
        cmd.args(["sql", "--db", &db, "-c", &script(w)]);
        for (k, v) in &env {
            cmd.env(k, v);
        }
        cmd.stdout(std::process::Stdio::null()).spawn().expect("spawn")
    };
    let (mut a, mut b) = (spawn(1), spawn(2));
    assert!(a.wait().unwrap().success() && b.wait().unwrap().success());
    let out = ok(blobhouse(&db, &env, &["-c", "SELECT count(*) AS n, count(DISTINCT w * 100 + i) AS d FROM c"]));
    assert!(out.contains("| 20 | 20 |"), "{out}");
}

#[test]
fn errors_exit_nonzero_and_name_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let out = blobhouse(&dir.path().to_string_lossy(), &[], &["-c", "SELECT * FROM nope"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("nope") && stderr.starts_with("error:"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn verify_finds_a_flipped_byte_names_the_object_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().to_string_lossy().to_string();
    ok(blobhouse(&db, &[], &["-c", "CREATE TABLE t AS SELECT value AS k FROM generate_series(1, 1000)"]));
    let verify = || Command::new(env!("CARGO_BIN_EXE_blobhouse")).args(["verify", "--db", &db]).output().unwrap();
    let clean = verify();
    assert!(clean.status.success() && String::from_utf8_lossy(&clean.stdout).contains("no damage found"), "{clean:?}");
    let object = walk(dir.path()).into_iter().find(|p| p.extension().is_some_and(|e| e == "parquet")).expect("a data object");
    let mut bytes = std::fs::read(&object).unwrap();
    let at = bytes.len() / 3;
    bytes[at] ^= 0x04;
    std::fs::write(&object, bytes).unwrap();
    let damaged = verify();
    let out = String::from_utf8_lossy(&damaged.stdout);
    let name = object.file_name().unwrap().to_string_lossy();
    assert_eq!(damaged.status.code(), Some(1), "{out}");
    assert!(out.contains("DAMAGED") && out.contains(&*name) && out.contains("1 damaged"), "{out}");
}

#[test]
fn help_has_examples_everywhere() {
    for args in [
        vec!["--help"],
        vec!["demo", "--help"],
        vec!["sql", "--help"],
        vec!["load", "tpch", "--help"],
        vec!["testbed", "up", "--help"],
        vec!["bench", "calibrate", "--help"],
        vec!["bench", "io", "--help"],
        vec!["bench", "hedge", "--help"],
        vec!["verify", "--help"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_blobhouse")).args(&args).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && text.contains("Examples:"), "{args:?}:\n{text}");
    }
}

#[test]
fn a_script_that_ends_inside_a_transaction_commits_nothing_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().to_string_lossy().to_string();
    ok(blobhouse(&db, &[], &["-c", "CREATE TABLE t (a INT); BEGIN; INSERT INTO t VALUES (1)"]));
    let out = blobhouse(&db, &[], &["-c", "BEGIN; INSERT INTO t VALUES (2); COMMIT; BEGIN; DELETE FROM t; SELECT * FROM nope"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("statement 6 failed") && stderr.contains("rolled back"), "{stderr}");
    let out = ok(blobhouse(&db, &[], &["-c", "SELECT count(*) AS n, sum(a) AS s FROM t"]));
    assert!(out.contains("| 1 | 2 |"), "only the committed INSERT of 2 is there:\n{out}");
    let out = blobhouse(&db, &[], &["-c", "BEGIN; INSERT INTO t VALUES (3)"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("the open transaction was rolled back"));
}

#[test]
fn gc_dry_run_lists_and_keeps_then_gc_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().to_string_lossy().to_string();
    ok(blobhouse(&db, &[], &["-c", "CREATE TABLE t AS SELECT 1 AS x; DROP TABLE t; CREATE TABLE u AS SELECT 2 AS y"]));
    let files = || walk(dir.path());
    let before = files();
    let gc = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_blobhouse")).args(["gc", "--db", &db]).args(args).output().unwrap();
        ok(out)
    };
    let plan = gc(&["--retain", "0s", "--dry-run"]);
    assert!(plan.contains("no longer listed"), "{plan}");
    assert_eq!(files(), before, "a dry run deletes nothing");
    gc(&["--retain", "0s"]);
    let parquet = |files: Vec<std::path::PathBuf>| files.iter().filter(|p| p.extension().is_some_and(|e| e == "parquet")).count();
    assert_eq!((parquet(before), parquet(files())), (2, 1), "the dropped table's data object is gone, the live one stays");
    let out = ok(blobhouse(&db, &[], &["-c", "SELECT y FROM u"]));
    assert!(out.contains("| 2 |"), "{out}");
    let bad = Command::new(env!("CARGO_BIN_EXE_blobhouse")).args(["gc", "--db", &db, "--retain", "soon"]).output().unwrap();
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("--retain"));
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let p = entry.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// `blobhouse serve` as its users run it: a line per statement with a query
/// id, slow statements with their text, Prometheus metrics and a health
/// check over HTTP — and neither the right nor a wrong password (sent by
/// psql or by ADBC over Flight SQL), nor a Flight SQL token, anywhere in
/// its log.
#[test]
fn serve_logs_statements_and_serves_metrics_but_never_credentials() {
    use std::io::{BufRead, BufReader, Read, Write};
    const PASSWORD: &str = "Tr0ub4dor&3-right";
    const WRONG: &str = "Tr0ub4dor&3-wrong";
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_blobhouse"))
        .args(["serve", "--db", &dir.path().to_string_lossy(), "--user", "alice", "--pg-listen", "127.0.0.1:0", "--flight-listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .args(["--log-level", "debug", "--slow-query-ms", "0"])
        .env("BLOBHOUSE_PASSWORD", PASSWORD)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run blobhouse serve");
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut log = String::new();
    let (pg, flight, metrics) = loop {
        let mut line = String::new();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "serve stopped before serving:\n{log}");
        log += &line;
        if let Some(rest) = line.strip_prefix("serving ") {
            let pg = rest.split(" on ").nth(1).unwrap().split([',', ';']).next().unwrap().to_string();
            let flight = rest.split("grpc://").nth(1).unwrap().split([',', ';']).next().unwrap().to_string();
            let metrics = rest.split("http://").nth(1).unwrap().split('/').next().unwrap().to_string();
            break (pg, flight, metrics);
        }
    };
    let port = pg.rsplit(':').next().unwrap().to_string();
    let psql = |password: &str, sql: &str| {
        Command::new("psql")
            .arg(format!("host=127.0.0.1 port={port} user=alice dbname=blobhouse sslmode=disable"))
            .args(["-X", "-c", sql])
            .env("PGPASSWORD", password)
            .output()
            .expect("psql runs (install postgresql-client)")
    };
    assert!(psql(PASSWORD, "CREATE TABLE t AS SELECT value AS id FROM range(1000)").status.success());
    // Read twice: the second read is the memory tier's.
    for _ in 0..2 {
        assert!(psql(PASSWORD, "SELECT sum(id) FROM t").status.success());
    }
    assert!(!psql(PASSWORD, "SELECT * FROM missing_table").status.success());
    assert!(!psql(WRONG, "SELECT 1").status.success());
    // ADBC logs in, runs a statement and prints its token; a wrong password is refused.
    let adbc = |password: &str| {
        let script = format!(
            "import adbc_driver_flightsql.dbapi as f\nc = f.connect('grpc://{flight}', db_kwargs={{'username': 'alice', 'password': {password:?}}}, autocommit=True)\ncur = c.cursor()\ncur.execute('SELECT 1')\nprint(cur.fetchall())"
        );
        Command::new("python3").args(["-c", &script]).output().expect("python3 runs (install adbc-driver-flightsql)")
    };
    let out = adbc(PASSWORD);
    assert!(out.status.success(), "ADBC: {}", String::from_utf8_lossy(&out.stderr));
    let out = adbc(WRONG);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("authentication failed"), "{}", String::from_utf8_lossy(&out.stderr));
    let get = |path: &str| {
        let mut s = std::net::TcpStream::connect(&metrics).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap();
        body
    };
    let scraped = get("/metrics");
    for sample in [
        "blobhouse_queries_total{state=\"ok\"} 4",
        "blobhouse_queries_total{state=\"error\"} 1",
        "blobhouse_query_duration_seconds_count 5",
        "blobhouse_sessions 1",
        "blobhouse_cache_misses_total{tier=\"memory\"} 1",
        "blobhouse_cache_hits_total{tier=\"memory\"} 1",
    ] {
        assert!(scraped.contains(sample), "no '{sample}' in\n{scraped}");
    }
    assert!(get("/healthz").ends_with("ok\n"));
    assert!(get("/nothing").starts_with("HTTP/1.1 404"));
    child.kill().unwrap();
    child.wait().unwrap();
    stderr.read_to_string(&mut log).unwrap();
    for line in ["query_id=1", "query_id=4", "state=\"error\"", "missing_table' not found", "slow statement", "sql=SELECT * FROM missing_table"] {
        assert!(log.contains(line), "no '{line}' in the log:\n{log}");
    }
    // Each failed login is logged, with the user and which protocol, once.
    let refused: Vec<&str> = log.lines().filter(|l| l.contains("login refused")).collect();
    assert!(refused.iter().filter(|l| l.contains("protocol=\"postgres\"") && l.contains("user=alice")).count() == 1, "the failed PostgreSQL login is logged once: {refused:?}");
    assert!(refused.iter().any(|l| l.contains("protocol=\"flight\"")), "the failed Flight login is logged: {refused:?}");
    assert!(!log.contains(PASSWORD) && !log.contains(WRONG) && !log.contains("Tr0ub4dor"), "a password in the log:\n{log}");
    assert!(!log.to_lowercase().contains("bearer"), "a token in the log:\n{log}");
}

#[test]
fn the_shell_prints_each_output_format_and_runs_its_commands_in_scripts() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().to_string_lossy().to_string();
    ok(blobhouse(&db, &[], &["-c", "CREATE TABLE items (id INT, name VARCHAR, price DECIMAL(12,2)); INSERT INTO items VALUES (1, 'a, \"b\"', 1.5), (2, NULL, -3)"]));
    let select = "SELECT * FROM items ORDER BY id";
    assert_eq!(ok(blobhouse(&db, &[], &["--format", "csv", "-c", select])), "id,name,price\n1,\"a, \"\"b\"\"\",1.50\n2,,-3.00\n");
    let json: serde_json::Value = serde_json::from_str(&ok(blobhouse(&db, &[], &["--format", "json", "-c", select]))).unwrap();
    assert_eq!(json, serde_json::json!([{"id": 1, "name": "a, \"b\"", "price": 1.50}, {"id": 2, "name": null, "price": -3.00}]));
    assert_eq!(ok(blobhouse(&db, &[], &["--format", "markdown", "-c", select])), "| id | name | price |\n|---:|---|---:|\n| 1 | a, \"b\" | 1.50 |\n| 2 | NULL | -3.00 |\n");

    // Commands inside a script: \d shows SQL types, \dt takes a pattern, the mode switches mid-script.
    ok(blobhouse(&db, &[], &["-c", "CREATE TABLE other (x BIGINT)"]));
    let script = "\\d items\n\\dt i*\n\\d\n.mode json\nSELECT id FROM items\n  WHERE id = 2;\n\\timing off\nSELECT 42 AS answer;\n";
    let out = blobhouse(&db, &[], &["--format", "csv", "-c", script]);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let stdout = ok(out);
    assert_eq!(
        stdout,
        format!(
            "column_name,data_type,is_nullable\nid,INTEGER,YES\nname,VARCHAR,YES\nprice,\"DECIMAL(12,2)\",YES\n\
             name\nitems\n\
             name,iceberg_metadata\nitems,file://{db}/iceberg/tables/0000000000100000/metadata/v2.metadata.json\n\
             other,file://{db}/iceberg/tables/0000000000200000/metadata/v3.metadata.json\n\
             [{{\"id\":2}}]\n[{{\"answer\":42}}]\n"
        )
    );
    assert_eq!(stderr.matches(" row").count(), 1, "one summary line, before \\timing off:\n{stderr}");

    // A mistake in a script names its line and stops it.
    let out = blobhouse(&db, &[], &["-c", "SELECT 1;\n\\pset format yaml\nDROP TABLE items;"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("line 2") && stderr.contains("no output mode 'yaml'"), "{stderr}");
    let out = blobhouse(&db, &[], &["-c", "SELECT 1;\nSELECT *\n FROM nope;"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("statement 2 failed (line 2)"), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(ok(blobhouse(&db, &[], &["-c", "\\dt"])).contains("items"), "the DROP after the failed line did not run");
}

/// Ctrl-C in the shell stops the running statement within a second and the
/// shell goes on to the next one (stdin is a pipe here; at a terminal,
/// rustyline turns Ctrl-C at the prompt into clearing the line).
#[test]
fn ctrl_c_cancels_the_running_statement_and_keeps_the_shell() {
    use std::io::{BufRead, Write};
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_blobhouse"))
        .args(["sql", "--db", &dir.path().to_string_lossy()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send((Instant::now(), line));
        }
    });
    // Hours of work: a trillion rows counted.
    writeln!(stdin, "SELECT count(*) FROM range(1000000000000);").unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let sent = Instant::now();
    assert!(Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap().success());
    let mut seen = Vec::new();
    let cancelled = loop {
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok((at, line)) if line.starts_with("cancelled") => break at,
            Ok((_, line)) => seen.push(line),
            Err(_) => panic!("no 'cancelled' within 30 s; stderr so far: {seen:?}"),
        }
    };
    let took = cancelled.duration_since(sent);
    assert!(took < Duration::from_secs(1), "the statement stopped {took:?} after Ctrl-C");
    writeln!(stdin, "SELECT 40 + 2 AS answer;").unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains("| 42 "), "the shell went on after the cancel:\n{stdout}");
}

/// `serve --config FILE`: the file's settings and users are used, a flag on
/// the command line wins over the file, and a mistake in the file names it.
#[test]
fn serve_reads_its_settings_and_users_from_a_toml_file() {
    use std::io::{BufRead, BufReader, Write};
    let dir = tempfile::tempdir().unwrap();
    let mut hash = Command::new(env!("CARGO_BIN_EXE_blobhouse")).arg("hash-password").stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).spawn().unwrap();
    hash.stdin.take().unwrap().write_all(b"from-the-file\n").unwrap();
    let hash = String::from_utf8(hash.wait_with_output().unwrap().stdout).unwrap();
    let config = dir.path().join("blobhouse.toml");
    let db = dir.path().join("db");
    std::fs::write(&config, format!("# the server\ndb = {:?}\npg_listen = \"127.0.0.1:0\"\nflight-listen = \"off\"\nmax-queries = 2\n\n[users]\nalice = {:?}\n", db.to_string_lossy(), hash.trim())).unwrap();
    std::fs::set_permissions(&config, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_blobhouse"))
        .args(["serve", "--config", &config.to_string_lossy(), "--flight-listen", "127.0.0.1:0"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut log = String::new();
    let serving = loop {
        let mut line = String::new();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "serve stopped before serving:\n{log}");
        log += &line;
        if let Some(rest) = line.strip_prefix("serving ") {
            break rest.to_string();
        }
    };
    assert!(serving.starts_with(&*db.to_string_lossy()) && serving.contains("Flight SQL clients on grpc://127.0.0.1:"), "the file's db, the command line's Flight listener: {serving}");
    assert!(log.contains("max_queries=2"), "{log}");
    // Mode 0644: it holds password hashes others may read.
    assert!(log.contains("holds secrets ([users]' password hashes) and others may read it") && log.contains("chmod 600"), "{log}");
    let port = serving.split(" on ").nth(1).unwrap().split([',', ';']).next().unwrap().rsplit(':').next().unwrap().to_string();
    let psql = |password: &str| {
        Command::new("psql").arg(format!("host=127.0.0.1 port={port} user=alice dbname=blobhouse sslmode=disable")).args(["-X", "-c", "SELECT 1"]).env("PGPASSWORD", password).output().unwrap()
    };
    assert!(psql("from-the-file").status.success(), "the file's user logs in");
    assert!(!psql("something-else").status.success());
    child.kill().unwrap();
    child.wait().unwrap();

    std::fs::write(&config, "pg-listen = \"127.0.0.1:0\"\nmax-querys = 2\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_blobhouse")).args(["serve", "--db", &db.to_string_lossy(), "--config", &config.to_string_lossy()]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("blobhouse.toml: line 2: unknown setting 'max-querys'"), "{stderr}");
    std::fs::write(&config, "pg-listen = \"localhost-ish\"\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_blobhouse")).args(["serve", "--db", &db.to_string_lossy(), "--config", &config.to_string_lossy()]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("localhost-ish") && stderr.contains("config file"), "{stderr}");
}

/// `--threads` (or BLOBHOUSE_THREADS) sets the query's partitions; zero is
/// refused with the flag's name.
#[test]
fn threads_sets_the_partitions_and_refuses_zero() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().to_string_lossy().to_string();
    let show = ["-c", "SHOW datafusion.execution.target_partitions"];
    let out = ok(blobhouse(&db, &[], &[&["--threads", "3"][..], &show[..]].concat()));
    assert!(out.contains("| 3 "), "{out}");
    let out = ok(blobhouse(&db, &[("BLOBHOUSE_THREADS", "5".to_string())], &show));
    assert!(out.contains("| 5 "), "{out}");
    let out = blobhouse(&db, &[], &["--threads", "0", "-c", "SELECT 1"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--threads") && err.contains("1..=1024"), "{err}");
}
