//! `blobhouse serve` with real clients: psql (Debian's postgresql-client)
//! and psycopg (PyPI), against a server started in the test on 127.0.0.1
//! over an audited store; and the server's refusals to start unsafely.

use std::process::Command;

use blobhouse_engine::EngineOptions;
use blobhouse_server::{Server, ServerError, ServerOptions, TlsFiles, Users};

use crate::common::*;
use crate::on_both_backends;

on_both_backends!(psql_runs_ddl_dml_transactions_and_queries_in_its_own_session);

const PASSWORD: &str = "correct horse battery staple";

/// Loopback on any port, with alice as the one user.
fn alice_on_loopback() -> ServerOptions {
    let mut users = Users::new();
    users.add_password("alice", PASSWORD).expect("a valid user");
    ServerOptions { pg_listen: "127.0.0.1:0".parse().expect("an address"), users, ..ServerOptions::new() }
}

async fn server(db: &TestDb) -> Server {
    Server::start(db.engine(EngineOptions::default()).await, alice_on_loopback()).await.expect("the server starts")
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
    let script = dir.path().join("script.sql");
    std::fs::write(
        &script,
        "CREATE TABLE t (id INT NOT NULL, name VARCHAR);\n\
         INSERT INTO t VALUES (1, 'one'), (2, 'two'), (3, 'three');\n\
         BEGIN;\n\
         DELETE FROM t WHERE id = 1;\n\
         SELECT count(*) AS inside FROM t;\n\
         ROLLBACK;\n\
         BEGIN;\n\
         UPDATE t SET name = 'TWO' WHERE id = 2;\n\
         COMMIT;\n\
         SELECT id, name FROM t ORDER BY id;\n",
    )
    .expect("write the script");
    let out = psql(&server, PASSWORD, &["-f", script.to_str().expect("utf-8")]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "psql failed: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    for expected in ["CREATE TABLE", "INSERT 0 3", "BEGIN", "DELETE 1", "ROLLBACK", "UPDATE 1", "COMMIT"] {
        assert!(lines.contains(&expected), "no '{expected}' in:\n{stdout}");
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_refuses_to_start_open_or_with_broken_tls() {
    let db = TestDb::new(Backend::Local, "server-refusals");
    // No users on a non-loopback address.
    let open = ServerOptions { pg_listen: "0.0.0.0:0".parse().expect("an address"), ..ServerOptions::new() };
    match Server::start(db.engine(EngineOptions::default()).await, open).await {
        Err(e @ ServerError::OpenWithoutUsers { .. }) => assert!(e.to_string().contains("127.0.0.1"), "{e}"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("an open server started"),
    }
    // A certificate that is not one: the server does not start (no plaintext fallback).
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = (dir.path().join("server.crt"), dir.path().join("server.key"));
    std::fs::write(&cert, "-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n").expect("write");
    std::fs::write(&key, "no key here\n").expect("write");
    let mut users = Users::new();
    users.add_password("alice", PASSWORD).expect("a valid user");
    let tls = ServerOptions { pg_listen: "127.0.0.1:0".parse().expect("an address"), users, tls: Some(TlsFiles { cert: cert.clone(), key }), ..ServerOptions::new() };
    match Server::start(db.engine(EngineOptions::default()).await, tls).await {
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
    let server = Server::start(db.engine(EngineOptions::default()).await, ServerOptions { tls: Some(tls), ..alice_on_loopback() }).await.expect("the TLS server starts");

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
