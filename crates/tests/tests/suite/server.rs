//! `blobhouse serve` with real clients: psql (Debian's postgresql-client)
//! and psycopg (PyPI), against a server started in the test on 127.0.0.1
//! over an audited store; and the server's refusals to start unsafely.

use std::process::Command;

use blobhouse_engine::EngineOptions;
use blobhouse_server::{Server, ServerError, ServerOptions, TlsFiles, Users};

use crate::common::*;
use crate::on_both_backends;

on_both_backends!(psql_runs_ddl_dml_transactions_and_queries_in_its_own_session);

pub(crate) const PASSWORD: &str = "correct horse battery staple";

/// Loopback on any port, with alice as the one user.
/// Flight SQL listens too, on any port.
pub(crate) fn alice_on_loopback() -> ServerOptions {
    let mut users = Users::new();
    users.add_password("alice", PASSWORD).expect("a valid user");
    ServerOptions { pg_listen: "127.0.0.1:0".parse().expect("an address"), flight_listen: Some("127.0.0.1:0".parse().expect("an address")), users, ..ServerOptions::new() }
}

pub(crate) async fn server(db: &TestDb) -> Server {
    Server::start(db.engine(EngineOptions::default()).await.engine().clone(), alice_on_loopback()).await.expect("the server starts")
}

/// Runs psql with `args` as alice (password from the environment), off the
/// test's runtime threads.
async fn psql(server: &Server, password: &str, args: &[&str]) -> std::process::Output {
    psql_with(server, password, "sslmode=disable", args).await
}

/// psql with `ssl`'s connection options (sslmode, sslrootcert).
async fn psql_with(server: &Server, password: &str, ssl: &str, args: &[&str]) -> std::process::Output {
    let conn = format!("host=127.0.0.1 port={} user=alice dbname=blobhouse {ssl}", server.pg_addr().port());
    let mut c = Command::new("psql");
    c.arg(conn).args(["-X", "-v", "ON_ERROR_STOP=1", "-A", "-F", ","]).args(args).env("PGPASSWORD", password);
    tokio::task::spawn_blocking(move || c.output().expect("psql runs (install postgresql-client)")).await.expect("joined")
}

async fn psql_runs_ddl_dml_transactions_and_queries_in_its_own_session(backend: Backend) {
    let db = TestDb::new(backend, "server-psql");
    let server = server(&db).await;
    let dir = tempfile::tempdir().expect("tempdir");
    // PostgreSQL's text format: \N is NULL, an empty field an empty string.
    let rows = dir.path().join("rows.txt");
    std::fs::write(&rows, "4\t\\N\n5\t\n6\ttab\\there\n").expect("write the rows");
    let script = dir.path().join("script.sql");
    std::fs::write(
        &script,
        format!("CREATE TABLE t (id INT NOT NULL, name VARCHAR);\n\
         INSERT INTO t VALUES (1, 'one'), (2, 'two'), (3, 'three');\n\
         \\copy t FROM '{rows}'\n\
         BEGIN;\n\
         COPY t FROM STDIN WITH (FORMAT csv);\n7,seven\n\\.\n\
         ROLLBACK;\n\
         SELECT id, name IS NULL AS null_name, length(name) AS len FROM t WHERE id > 3 ORDER BY id;\n\
         DELETE FROM t WHERE id > 3;\n\
         \\dt\n\
         \\d t\n\
         \\l\n\
         \\du\n\
         BEGIN;\n\
         DELETE FROM t WHERE id = 1;\n\
         SELECT count(*) AS inside FROM t;\n\
         ROLLBACK;\n\
         BEGIN;\n\
         UPDATE t SET name = 'TWO' WHERE id = 2;\n\
         COMMIT;\n\
         SELECT id, name FROM t ORDER BY id;\n", rows = rows.display()),
    )
    .expect("write the script");
    let out = psql(&server, PASSWORD, &["-f", script.to_str().expect("utf-8")]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "psql failed: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    for expected in ["CREATE TABLE", "INSERT 0 3", "COPY 3", "COPY 1", "BEGIN", "DELETE 1", "DELETE 3", "ROLLBACK", "UPDATE 1", "COMMIT"] {
        assert!(lines.contains(&expected), "no '{expected}' in:\n{stdout}");
    }
    // The text format's NULL, empty string and escape; the rolled-back CSV row is gone.
    let copied = lines.iter().position(|l| *l == "id,null_name,len").expect("the copied rows' header");
    assert_eq!(&lines[copied + 1..copied + 4], ["4,t,", "5,f,0", "6,f,8"], "{stdout}");
    // psql's catalog commands: \dt lists the table, \d its columns, \l the database.
    assert!(lines.contains(&"public,t,table,postgres"), "\\dt: {stdout}");
    for column in ["id,integer,,not null,", "name,text,,,"] {
        assert!(lines.contains(&column), "\\d t has no '{column}': {stdout}");
    }
    assert!(lines.iter().any(|l| l.starts_with("blobhouse,")), "\\l: {stdout}");
    assert!(lines.iter().any(|l| l.starts_with("alice,Superuser")), "\\du lists the server's user: {stdout}");
    // Inside the transaction its own delete shows; the rollback undid it.
    let inside = lines.iter().position(|l| *l == "inside").expect("the count's header");
    assert_eq!(lines[inside + 1], "2", "{stdout}");
    let header = lines.iter().position(|l| *l == "id,name").expect("the final query's header");
    assert_eq!(&lines[header + 1..header + 4], ["1,one", "2,TWO", "3,three"], "{stdout}");

    // An error names what failed and leaves the connection usable.
    let out = psql(&server, PASSWORD, &["-c", "SELECT * FROM missing_table"]).await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing_table"), "{}", String::from_utf8_lossy(&out.stderr));

    // A wrong password is refused, and says so without echoing it.
    let out = psql(&server, "wrong password", &["-c", "SELECT 1"]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("authentication failed"), "{stderr}");
    assert!(!stderr.contains("wrong password"), "{stderr}");
}

/// Clients reach no file outside the database unless the operator allows
/// its location (`--allow-files`): not the server's files, not its
/// buckets. COPY … FROM STDIN still loads (through the connection's own
/// spool directory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_reach_only_the_files_the_server_allows() {
    let db = TestDb::new(Backend::Local, "server-files");
    let dir = tempfile::tempdir().expect("tempdir");
    let allowed = dir.path().join("allowed");
    std::fs::create_dir_all(&allowed).expect("mkdir");
    std::fs::write(allowed.join("a.csv"), "id,name\n1,one\n2,two\n").expect("write");
    std::fs::write(dir.path().join("secret.csv"), "key\nhunter2\n").expect("write");
    let secret = dir.path().join("secret.csv").display().to_string();
    let engine = db.engine(EngineOptions::default()).await.engine().clone();

    // The default: nothing outside the database.
    let server = Server::start(engine.clone(), alice_on_loopback()).await.expect("the server starts");
    for sql in [
        format!("SELECT * FROM read_csv('{secret}')"),
        format!("CREATE EXTERNAL TABLE s STORED AS CSV LOCATION '{secret}'"),
        format!("COPY (SELECT 1 AS x) TO '{}/out.csv'", dir.path().display()),
        "CREATE TABLE t (id INT, name VARCHAR)".to_string(),
        format!("COPY t FROM '{secret}'"),
    ] {
        let out = psql(&server, PASSWORD, &["-c", &sql]).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if sql.starts_with("CREATE TABLE") {
            assert!(out.status.success(), "{stderr}");
            continue;
        }
        assert!(!out.status.success() && stderr.contains("--allow-files"), "{sql}: {stderr}");
        assert!(!String::from_utf8_lossy(&out.stdout).contains("hunter2"));
    }
    assert!(!dir.path().join("out.csv").exists(), "nothing was written");
    let out = psql(&server, PASSWORD, &["-c", "COPY t FROM STDIN WITH (FORMAT csv)"]).await;
    assert!(out.status.success(), "COPY … FROM STDIN loads through the connection's spool: {}", String::from_utf8_lossy(&out.stderr));

    // An allowed directory is read; a path climbing out of it is not.
    let options = ServerOptions { files: blobhouse_engine::FileAccess::only([allowed.display().to_string()]), ..alice_on_loopback() };
    let server = Server::start(engine, options).await.expect("the server starts");
    let out = psql(&server, PASSWORD, &["-t", "-c", &format!("SELECT sum(id) FROM read_csv('{}/*.csv')", allowed.display())]).await;
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "3", "{}", String::from_utf8_lossy(&out.stderr));
    let out = psql(&server, PASSWORD, &["-c", &format!("SELECT * FROM read_csv('{}/../secret.csv')", allowed.display())]).await;
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("outside the locations this server allows"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psycopg_binds_parameters_and_prepares_statements() {
    let db = TestDb::new(Backend::Local, "server-psycopg");
    let server = server(&db).await;
    let script = format!(
        r#"
import psycopg
with psycopg.connect(host="127.0.0.1", port={port}, user="alice", password={password:?}, dbname="blobhouse", sslmode="disable") as c:
    cur = c.cursor()
    cur.execute("CREATE TABLE p (id BIGINT NOT NULL, name VARCHAR, price DOUBLE)")
    cur.execute("INSERT INTO p VALUES (%s, %s, %s), (%s, %s, %s)", (1, "it's", 2.5, 2, None, 10.0))
    assert cur.rowcount == 2, cur.rowcount
    c.commit()
    # Server-side parameters of several types, and the described columns.
    cur.execute("SELECT id, name FROM p WHERE price > %s AND id <> %s ORDER BY id", (1.0, 99))
    assert [d.name for d in cur.description] == ["id", "name"], cur.description
    assert cur.fetchall() == [(1, "it's"), (2, None)]
    # A quote in a value stays a value.
    cur.execute("SELECT count(*) FROM p WHERE name = %s", ("x' OR '1'='1",))
    assert cur.fetchone() == (0,)
    # A prepared statement, executed twice with other values.
    for id, name in [(1, "it's"), (2, None)]:
        cur.execute("SELECT name FROM p WHERE id = %s", (id,), prepare=True)
        assert cur.fetchall() == [(name,)]
    c.rollback()
print("ok")
"#,
        port = server.pg_addr().port(),
        password = PASSWORD
    );
    let out = tokio::task::spawn_blocking(move || Command::new("python3").args(["-c", &script]).output().expect("python3 runs")).await.expect("joined");
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok", "psycopg: {}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}

/// SQLAlchemy (on psycopg) connects — it reads `version()`, the isolation
/// level, type oids with `to_regtype` inside a SAVEPOINT — and its inspector
/// lists the schema's tables and their columns with types and nullability
/// (its catalog queries use LIKE … ESCAPE '/', correlated subqueries inside
/// CASE and json_build_object).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlalchemys_inspector_lists_tables_and_columns_and_reflects_tables() {
    let db = TestDb::new(Backend::Local, "server-sqlalchemy");
    let server = server(&db).await;
    run(&server.engine().connect(), "CREATE TABLE orders (id BIGINT NOT NULL, customer VARCHAR, total DECIMAL(12, 2), placed DATE)").await;
    run(&server.engine().connect(), "CREATE TABLE customers (id INT, name VARCHAR)").await;
    let script = format!(
        r#"
import sqlalchemy as sa
engine = sa.create_engine("postgresql+psycopg://alice:{password}@127.0.0.1:{port}/blobhouse", connect_args={{"sslmode": "disable"}})
inspector = sa.inspect(engine)
assert "public" in inspector.get_schema_names(), inspector.get_schema_names()
assert inspector.get_table_names() == ["customers", "orders"], inspector.get_table_names()
assert inspector.has_table("orders") and not inspector.has_table("nope")
columns = [(c["name"], str(c["type"]), c["nullable"]) for c in inspector.get_columns("orders")]
assert columns == [("id", "BIGINT", False), ("customer", "TEXT", True), ("total", "NUMERIC(12, 2)", True), ("placed", "DATE", True)], columns
# No keys, constraints or indexes in blobhouse: each reflects as empty, not as an error.
assert inspector.get_pk_constraint("orders")["constrained_columns"] == []
assert inspector.get_foreign_keys("orders") == [] and inspector.get_unique_constraints("orders") == []
assert inspector.get_indexes("orders") == [] and inspector.get_check_constraints("orders") == []
# A reflected table, used in a query SQLAlchemy builds.
orders = sa.Table("orders", sa.MetaData(), autoload_with=engine)
assert [c.name for c in orders.columns] == ["id", "customer", "total", "placed"], orders.columns
with engine.begin() as c:
    c.execute(orders.insert().values(id=1, customer="ann", total=12.5, placed="2026-11-23"))
with engine.connect() as c:
    assert c.execute(sa.select(sa.func.count()).select_from(orders).where(orders.c.customer == "ann")).scalar() == 1
print("ok")
"#,
        password = PASSWORD.replace(' ', "%20"),
        port = server.pg_addr().port(),
    );
    let out = tokio::task::spawn_blocking(move || Command::new("python3").args(["-c", &script]).output().expect("python3 runs")).await.expect("joined");
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok", "SQLAlchemy: {}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_refuses_to_start_open_or_with_broken_tls() {
    let db = TestDb::new(Backend::Local, "server-refusals");
    // No users on a non-loopback address.
    let loopback = "127.0.0.1:0".parse().expect("an address");
    let anywhere = "0.0.0.0:0".parse().expect("an address");
    for (pg_listen, flight_listen) in [(anywhere, None), (loopback, Some(anywhere))] {
        let open = ServerOptions { pg_listen, flight_listen, ..ServerOptions::new() };
        match Server::start(db.engine(EngineOptions::default()).await.engine().clone(), open).await {
            Err(e @ ServerError::OpenWithoutUsers { .. }) => assert!(e.to_string().contains("0.0.0.0") && e.to_string().contains("127.0.0.1"), "{e}"),
            Err(e) => panic!("wrong error: {e}"),
            Ok(_) => panic!("an open server started (PostgreSQL on {pg_listen}, Flight SQL on {flight_listen:?})"),
        }
    }
    // /metrics off loopback without a token: refused; with one, callers must send it.
    let unprotected = ServerOptions { metrics_listen: Some(anywhere), ..alice_on_loopback() };
    match Server::start(db.engine(EngineOptions::default()).await.engine().clone(), unprotected).await {
        Err(e @ ServerError::MetricsWithoutToken { .. }) => assert!(e.to_string().contains("--metrics-token-env"), "{e}"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("/metrics was served to anyone on {anywhere}"),
    }
    // (On loopback: tests listen nowhere else. A token given is required there too.)
    let guarded = ServerOptions { metrics_listen: Some(loopback), metrics_token: Some("scrape-me".into()), ..alice_on_loopback() };
    let server = Server::start(db.engine(EngineOptions::default()).await.engine().clone(), guarded).await.expect("a guarded /metrics starts");
    let port = server.metrics_addr().expect("metrics are served").port();
    let get = |auth: &'static str| async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.expect("connect to /metrics");
        s.write_all(format!("GET /metrics HTTP/1.1\r\nHost: x\r\n{auth}\r\n").as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    };
    assert!(get("").await.starts_with("HTTP/1.1 401"), "no token");
    assert!(get("Authorization: Bearer not-it\r\n").await.starts_with("HTTP/1.1 401"), "a wrong token");
    let ok = get("authorization: Bearer scrape-me\r\n").await;
    assert!(ok.starts_with("HTTP/1.1 200") && ok.contains("blobhouse_"), "{ok}");
    drop(server);
    // A certificate that is not one: the server does not start (no plaintext fallback).
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = (dir.path().join("server.crt"), dir.path().join("server.key"));
    std::fs::write(&cert, "-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n").expect("write");
    std::fs::write(&key, "no key here\n").expect("write");
    let mut users = Users::new();
    users.add_password("alice", PASSWORD).expect("a valid user");
    let tls = ServerOptions { pg_listen: "127.0.0.1:0".parse().expect("an address"), users, tls: Some(TlsFiles { cert: cert.clone(), key }), ..ServerOptions::new() };
    match Server::start(db.engine(EngineOptions::default()).await.engine().clone(), tls).await {
        Err(e @ ServerError::Tls { .. }) => {
            let text = e.to_string();
            assert!((text.contains("server.crt") || text.contains("server.key")) && text.contains("does not start"), "{text}");
            assert!(!text.contains(PASSWORD));
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a server with a broken certificate started"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_is_required_when_configured_and_never_faked() {
    let db = TestDb::new(Backend::Local, "server-tls");
    let dir = tempfile::tempdir().expect("tempdir");
    blobhouse_testbed::make_certificates(dir.path()).expect("openssl makes a CA and a certificate");
    let ca = dir.path().join("ca.pem");
    let tls = TlsFiles { cert: dir.path().join("cert.pem"), key: dir.path().join("key.pem") };
    let server = Server::start(db.engine(EngineOptions::default()).await.engine().clone(), ServerOptions { tls: Some(tls), ..alice_on_loopback() }).await.expect("the TLS server starts");

    // A client that verifies the certificate gets in, over TLS.
    let verified = format!("sslmode=verify-full sslrootcert={}", ca.display());
    let out = psql_with(&server, PASSWORD, &verified, &["-c", "SELECT ssl FROM (VALUES (1)) AS v(ssl)"]).await;
    assert!(out.status.success(), "TLS client refused: {}", String::from_utf8_lossy(&out.stderr));
    // A plaintext client (no SSLRequest at all) is refused before any password is asked.
    let out = psql_with(&server, PASSWORD, "sslmode=disable", &["-c", "SELECT 1"]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("TLS connections only") && stderr.contains("sslmode=require"), "{stderr}");
    assert!(out.stdout.is_empty(), "a plaintext client was served: {}", String::from_utf8_lossy(&out.stdout));
    // A client that does not trust the certificate's issuer does not connect.
    let out = psql_with(&server, PASSWORD, "sslmode=verify-full sslrootcert=/dev/null", &["-c", "SELECT 1"]).await;
    assert!(!out.status.success(), "an untrusted certificate was accepted");

    // A client that requires TLS from a server without it is told so.
    let plain = self::server(&db).await;
    let out = psql_with(&plain, PASSWORD, "sslmode=require", &["-c", "SELECT 1"]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("does not support SSL"), "{stderr}");
    assert!(!stderr.contains(PASSWORD));
}

/// All 22 TPC-H answers through psycopg (the extended protocol, as a
/// Python program sees them) equal the reference; psql runs one too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_22_tpch_answers_through_psycopg_equal_the_reference() {
    use blobhouse_bench::answers::{self, Verdict};
    use blobhouse_bench::tpch;
    let server = tpch_answers_through("psycopg", PSYCOPG_CLIENT).await;
    // psql, unaligned with '|' between cells, as the reference is written.
    let out = psql(&server, PASSWORD, &["-t", "-F", "|", "-c", tpch::query(1)]).await;
    assert!(out.status.success(), "psql Q1: {}", String::from_utf8_lossy(&out.stderr));
    let rows = answers::parse_answer(&format!("header\n{}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(answers::compare(&answers::parse_answer(answers::reference(1, 0.01).expect("Q1's answer")), &rows), Verdict::Verified);
}

/// Loads TPC-H SF 0.01, serves it, and checks the 22 answers a Python
/// client gets. `client` defines `run(query)` (a list of tuples) after
/// connecting with `PG_PORT`, `FLIGHT_PORT` and `PASSWORD`. Returns the
/// server for more checks.
pub(crate) async fn tpch_answers_through(name: &str, client: &str) -> Server {
    use blobhouse_bench::answers::{self, Verdict};
    use blobhouse_bench::tpch;
    let db = TestDb::new(Backend::Local, &format!("server-tpch-{name}"));
    let engine = db.engine(EngineOptions::default()).await;
    tpch::load(&engine, 0.01, std::sync::Arc::new(|_, _, _| {})).await.expect("load TPC-H");
    let server = Server::start(engine.engine().clone(), alice_on_loopback()).await.expect("the server starts");
    let dir = tempfile::tempdir().expect("tempdir");
    let queries: Vec<String> = (1..=22).map(|q| tpch::query(q).to_string()).collect();
    std::fs::write(dir.path().join("queries.json"), serde_json::to_string(&queries).expect("json")).expect("write the queries");
    let script = format!(
        "import json\nPG_PORT = {pg}\nFLIGHT_PORT = {flight}\nPASSWORD = {password:?}\n{client}\nanswers = []\nfor q in json.load(open({queries:?})):\n    answers.append([[\"NULL\" if v is None else str(v) for v in row] for row in run(q)])\nprint(json.dumps(answers))\n",
        pg = server.pg_addr().port(),
        flight = server.flight_addr().map_or(0, |a| a.port()),
        password = PASSWORD,
        queries = dir.path().join("queries.json").display().to_string(),
    );
    let out = tokio::task::spawn_blocking(move || Command::new("python3").args(["-c", &script]).output().expect("python3 runs")).await.expect("joined");
    assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
    let got: Vec<Vec<Vec<String>>> = serde_json::from_slice(&out.stdout).expect("the script prints the answers as JSON");
    assert_eq!(got.len(), 22);
    let mut wrong = Vec::new();
    for (i, rows) in got.iter().enumerate() {
        let expected = answers::parse_answer(answers::reference(i + 1, 0.01).expect("a reference answer"));
        if let Verdict::Mismatch(why) = answers::compare(&expected, rows) {
            wrong.push(format!("Q{}: {why}", i + 1));
        }
    }
    assert!(wrong.is_empty(), "{} of 22 answers through {name} are wrong:\n{}", wrong.len(), wrong.join("\n"));
    server
}

/// A cancel request from psycopg stops a long query within a second: the
/// client gets QueryCanceled, the query's downloads stop and its operators
/// let go of their memory, and the connection serves the next statement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_request_stops_the_running_query_and_its_downloads() {
    cancel_through(
        "psycopg",
        &format!(
            "{PSYCOPG_CLIENT}{}",
            r#"
def cancel():
    (c.cancel_safe if hasattr(c, "cancel_safe") else c.cancel)()
def cancelled(e):
    return isinstance(e, psycopg.errors.QueryCanceled)
"#
        ),
    )
    .await;
}

/// A psycopg connection as alice that defines `run(query)`.
const PSYCOPG_CLIENT: &str = r#"
import psycopg
c = psycopg.connect(host="127.0.0.1", port=PG_PORT, user="alice", password=PASSWORD, dbname="blobhouse", sslmode="disable", autocommit=True)
def run(q):
    return c.execute(q).fetchall()
"#;

/// psql's Ctrl-C (SIGINT to psql, which sends a cancel request) stops a
/// long query within a second, with its downloads and memory; the next
/// psql statement is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ctrl_c_in_psql_stops_the_running_query_and_its_downloads() {
    cancel_through(
        "psql",
        r#"
import os, signal, subprocess
running = []
def run(q):
    p = subprocess.Popen(["psql", f"host=127.0.0.1 port={PG_PORT} user=alice dbname=blobhouse sslmode=disable", "-X", "-A", "-t",
                          "-v", "ON_ERROR_STOP=1", "-v", "VERBOSITY=verbose", "-c", q],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ, PGPASSWORD=PASSWORD))
    running.append(p)
    out, err = p.communicate()
    running.remove(p)
    if p.returncode != 0:
        raise RuntimeError(err)
    return [line.split("|") for line in out.splitlines()]
def cancel():
    for p in list(running):
        p.send_signal(signal.SIGINT)
def cancelled(e):
    return "57014" in str(e)
"#,
    )
    .await;
}

/// A psycopg client killed in the middle of a long query: the server
/// notices the hang-up and stops the query and its downloads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_mid_query_stops_it() {
    stop_through("psycopg", PSYCOPG_CLIENT, Stop::HangUp).await;
}

/// How a test stops a client's long query.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Stop {
    /// The client's own cancel (a cancel request, ADBC's cancel).
    Cancel,
    /// The client process is killed (SIGKILL): its connection just ends.
    HangUp,
}

/// Runs a long query from a Python client, cancels it from another thread
/// of that client, and checks that it stopped within a second, with its
/// downloads and memory, and that the connection serves the next
/// statement. `client` connects (with `PG_PORT`, `FLIGHT_PORT`,
/// `PASSWORD`) and defines `run(query)`, `cancel()` and `cancelled(error)`.
/// The query is long because its data comes through a 32 KB/s link.
pub(crate) async fn cancel_through(name: &str, client: &str) {
    stop_through(name, client, Stop::Cancel).await
}

/// As [`cancel_through`], or with the client killed mid-query
/// ([`Stop::HangUp`]): the server notices, and the query, its downloads and
/// its memory stop within a second all the same.
pub(crate) async fn stop_through(name: &str, client: &str, how: Stop) {
    use blobhouse_bench::tpch;
    use blobhouse_testbed::Toxic;
    let db = TestDb::new(Backend::Minio, &format!("server-{how:?}-{name}").to_lowercase());
    let loader = db.engine(EngineOptions::default()).await;
    tpch::load_tables(&loader, 0.01, &["lineitem"], std::sync::Arc::new(|_, _, _| {})).await.expect("load lineitem");
    drop(loader);
    // No chunk cache: what the pool holds beyond what scans keep per
    // object (footers, parsed zone maps) is the query's.
    let options = EngineOptions { cache: blobhouse_engine::CacheOptions::off(), ..EngineOptions::default() };
    let slow = [Toxic::new("slow", "bandwidth", 1.0, serde_json::json!({"rate": 32}))];
    let engine = crate::tpch::engine_through_proxy(&db, &format!("{how:?}-{name}").to_lowercase(), &slow, options).await;
    let server = Server::start(engine.engine().clone(), alice_on_loopback()).await.expect("the server starts");
    let long = "SELECT sum(l_extendedprice * (1 - l_discount)), max(l_comment) FROM lineitem";
    // Planning the query (EXPLAIN runs nothing) keeps its objects' footers
    // and its columns' zone maps: those stay when it stops.
    run(&server.engine().connect(), &format!("EXPLAIN {long}")).await;
    let idle = server.engine().memory().reserved();
    let script = format!(
        r#"
import threading, time
PG_PORT = {pg}
FLIGHT_PORT = {flight}
PASSWORD = {password:?}
{client}
out = {{}}
def go():
    try:
        run({long:?})
        out["how"] = "finished"
    except Exception as e:
        out["how"] = "canceled" if cancelled(e) else "error:" + type(e).__name__ + ":" + str(e).replace("\n", " ")
    out["at"] = time.time()
t = threading.Thread(target=go)
t.start()
time.sleep(2)
print("running", flush=True)
input()
asked = time.time()
cancel()
t.join(60)
print(out.get("how"), out.get("at", 1e18) - asked, flush=True)
print(run("SELECT 41 + 1")[0][0], flush=True)
"#,
        pg = server.pg_addr().port(),
        flight = server.flight_addr().map_or(0, |a| a.port()),
        password = PASSWORD,
    );
    use std::io::{BufRead, Write};
    let mut child = Command::new("python3").args(["-c", &script]).stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).spawn().expect("python3 runs");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    let read = |stdout: &mut std::io::BufReader<std::process::ChildStdout>, line: &mut String| {
        line.clear();
        stdout.read_line(line).expect("read the script's output");
        line.trim().to_string()
    };
    let (running, stdout) = tokio::task::spawn_blocking(move || (read(&mut stdout, &mut line), stdout)).await.expect("joined");
    assert_eq!(running, "running");
    // While it runs the query holds memory (its scan's buffers) and has downloads under way.
    let downloads = |server: &Server| server.engine().download_manager().expect("MinIO reads go through the download manager").stats();
    let held = server.engine().memory().reserved();
    assert!(held > idle, "the long query holds no memory ({held} bytes, {idle} idle): is it running?");
    let during = downloads(&server);
    assert!(during.pending + during.in_flight > 0 && during.loops.received_bytes > 0, "no download under way: {during:?}");
    if how == Stop::HangUp {
        let killed = std::time::Instant::now();
        child.kill().expect("kill the client");
        let _ = child.wait();
        // Within a second the server has noticed and stopped the query.
        let stopped = loop {
            let d = downloads(&server);
            if server.engine().memory().reserved() == idle && d.pending == 0 && d.in_flight == 0 {
                break killed.elapsed();
            }
            assert!(killed.elapsed() < std::time::Duration::from_secs(30), "the query of a killed client still runs after 30 s: {d:?}");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        };
        assert!(stopped < std::time::Duration::from_secs(1), "the query ran on for {stopped:?} after its client was killed");
        let after = downloads(&server);
        assert!(after.loops.cancelled > during.loops.cancelled, "the downloads were not stopped but finished: {after:?}");
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        assert_eq!(downloads(&server).loops.received_bytes, after.loops.received_bytes, "bytes still arrive after the hang-up");
        assert_eq!(run(&server.engine().connect(), "SELECT 41 + 1 AS answer").await.rows(), 1, "the server serves on");
        return;
    }
    writeln!(stdin, "go").expect("tell the script to cancel");
    let (outcome, answer) = tokio::task::spawn_blocking(move || {
        let mut stdout = stdout;
        let mut line = String::new();
        (read(&mut stdout, &mut line), read(&mut stdout, &mut line))
    })
    .await
    .expect("joined");
    let mut words = outcome.split_whitespace();
    assert_eq!(words.next(), Some("canceled"), "{outcome}");
    let seconds: f64 = words.next().and_then(|s| s.parse().ok()).expect("the time to cancel");
    assert!(seconds < 1.0, "the cancel took {seconds:.2} s");
    assert_eq!(answer, "42", "the connection serves the next statement");
    // The query's operators are gone: their memory is back, its requests
    // were stopped mid-body, and no byte arrives any more.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(server.engine().memory().reserved(), idle, "memory still held after the cancel ({held} while it ran)");
    let after = downloads(&server);
    assert!(after.pending == 0 && after.in_flight == 0 && after.loops.cancelled > during.loops.cancelled, "downloads went on after the cancel: {after:?}");
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(downloads(&server).loops.received_bytes, after.loops.received_bytes, "bytes still arrive after the cancel");
    drop(stdin);
    let _ = child.wait();
}

/// Under one memory limit, a statement that needs more than the limit fails
/// alone: its client gets PostgreSQL's out-of-memory error (53200) naming
/// the limit, while another client's queries, running at the same time,
/// all succeed with the right answer; the server and the failed client's
/// connection go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_over_the_memory_limit_fails_alone() {
    use blobhouse_bench::tpch;
    let db = TestDb::new(Backend::Local, "server-memory");
    let options = EngineOptions { memory_limit: Some(128 << 20), ..EngineOptions::default() };
    let engine = db.engine(options).await;
    tpch::load_tables(&engine, 0.01, &["lineitem"], std::sync::Arc::new(|_, _, _| {})).await.expect("load lineitem");
    // Warm: the footers and chunks the steady query reads stay cached.
    run(&engine, "SELECT l_returnflag, l_linestatus, sum(l_quantity) FROM lineitem GROUP BY 1, 2 ORDER BY 1, 2").await;
    // The cache may give its memory to the over-limit statements (the
    // budget reclaims it before refusing anyone), so what must come back
    // is everything but the cache.
    let beyond_cache = |engine: &blobhouse_engine::Engine| {
        use blobhouse_engine::memory::Reclaim;
        engine.memory().reserved() - engine.tiers().map_or(0, |t| t.reclaimable())
    };
    let idle = beyond_cache(engine.engine());
    let server = Server::start(engine.engine().clone(), alice_on_loopback()).await.expect("the server starts");
    let script = format!(
        r#"
import threading, psycopg
def connect():
    return psycopg.connect(host="127.0.0.1", port={port}, user="alice", password={password:?}, dbname="blobhouse", sslmode="disable", autocommit=True)
hog, other = connect(), connect()
done = threading.Event()
out = {{"ok": 0, "wrong": [], "failed": []}}
q = "SELECT l_returnflag, l_linestatus, sum(l_quantity) FROM lineitem GROUP BY 1, 2 ORDER BY 1, 2"
expected = other.execute(q).fetchall()
def steady():
    while not done.is_set():
        try:
            got = other.execute(q).fetchall()
            if got == expected:
                out["ok"] += 1
            else:
                out["wrong"].append(str(got))
        except Exception as e:
            out["failed"].append(repr(e))
t = threading.Thread(target=steady)
t.start()
errors = []
for _ in range(4):
    try:
        hog.execute("SELECT cardinality(array_agg(repeat('x', 1000) || value)) FROM range(1000000)").fetchall()
        errors.append("no error")
    except psycopg.errors.OutOfMemory as e:
        errors.append("oom" if "memory limit" in str(e) else "oom without the limit: " + str(e))
    except Exception as e:
        errors.append(repr(e))
done.set()
t.join()
print(errors, out["ok"], out["wrong"], out["failed"], hog.execute("SELECT 41 + 1").fetchall()[0][0])
"#,
        port = server.pg_addr().port(),
        password = PASSWORD,
    );
    let out = tokio::task::spawn_blocking(move || Command::new("python3").args(["-c", &script]).output().expect("python3 runs")).await.expect("joined");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let printed = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let (errors, rest) = printed.split_once("] ").expect("the script's line");
    assert_eq!(errors, "['oom', 'oom', 'oom', 'oom'", "each over-limit statement fails with 53200 naming the limit: {printed}");
    let mut rest = rest.split(' ');
    let ok: usize = rest.next().and_then(|n| n.parse().ok()).expect("a count");
    assert!(ok >= 1, "the other client ran nothing alongside: {printed}");
    assert!(printed.ends_with("[] [] 42"), "the other client's queries all succeeded with the right answer, and the failed client's connection goes on: {printed}");
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(beyond_cache(server.engine()), idle, "the failed statements let go of their memory");
}

/// `blobhouse bench serve` in short: both phases run through real psycopg
/// and ADBC clients, every statement's row count matches the serial run,
/// and the report, CSV and plot are written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_serve_runs_both_phases_with_both_drivers() {
    use blobhouse_bench::serve_bench::{self, ServeBenchOptions};
    use blobhouse_bench::tpch_bench::BenchStore;
    let data = tempfile::tempdir().expect("tempdir");
    let out = tempfile::tempdir().expect("tempdir");
    let opts = ServeBenchOptions {
        sf: 0.01,
        queries: vec![1, 6, 13],
        clients: 4,
        duration: std::time::Duration::from_secs(3),
        max_queries: 2,
        request_bytes: 16 << 20,
        chunk_bytes: 12 << 20,
        link: None,
        out: out.path().to_path_buf(),
    };
    let f = serve_bench::run(&BenchStore::Local(data.path().to_path_buf()), &opts, &|_| {}).await.expect("the benchmark runs");
    assert!(f.errors.is_empty(), "{:?}", f.errors);
    assert_eq!(f.serial.records.len(), 3);
    assert_eq!(f.expected_rows.get(&1), Some(&4), "Q1's four groups");
    assert!(f.concurrent.records.len() >= 4, "{} statements in 3 s", f.concurrent.records.len());
    for kind in ["psycopg", "adbc"] {
        assert!(f.concurrent.records.iter().any(|r| r.kind == kind), "no {kind} statement");
    }
    let report = serve_bench::report("local", &opts, &f);
    assert!(report.contains("statements per minute") && report.contains("errors"), "{report}");
    for file in ["serve.csv", "serve.png"] {
        assert!(std::fs::metadata(out.path().join(file)).is_ok_and(|m| m.len() > 0), "{file} written");
    }
}
