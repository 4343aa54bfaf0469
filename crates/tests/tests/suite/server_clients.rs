//! PostgreSQL clients as they really connect: psycopg 3 on its default
//! settings (text and binary cursors, prepared statements, COPY, session
//! parameters, error codes) against a server started in the test, and a
//! raw-protocol client that ignores a failed login.
//!
//! The psycopg cases live in `crates/tests/clients/psycopg_conformance.py`,
//! one function each; every case here runs a few of them on a fresh
//! database so that a failure names what broke.

use std::io::{Read, Write};
use std::process::Command;

use crate::common::*;
use crate::server::{PASSWORD, server};

/// Starts a server on a fresh database and runs `program` with the
/// arguments `args` makes of it (its ports), followed by `cases`; every case
/// must report `ok CASE` and the program must succeed.
async fn conformance(name: &str, program: &str, args: impl FnOnce(&blobhouse_server::Server) -> Vec<String>, cases: &[&str]) {
    let db = TestDb::new(Backend::Local, name);
    let server = server(&db).await;
    let mut args = args(&server);
    args.extend(cases.iter().map(|c| c.to_string()));
    let program = program.to_string();
    let out = tokio::task::spawn_blocking(move || Command::new(&program).args(&args).output().unwrap_or_else(|e| panic!("{program} runs: {e}"))).await.expect("joined");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{name}: the client's conformance cases failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    for case in cases {
        assert!(stdout.lines().any(|l| l == format!("ok {case}")), "case {case} did not report:\n{stdout}");
    }
}

/// Runs the psycopg conformance cases `cases` against a fresh server.
async fn psycopg(name: &str, cases: &[&str]) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/clients/psycopg_conformance.py");
    conformance(name, "python3", |s| vec![script.into(), "127.0.0.1".into(), s.pg_addr().port().to_string(), "alice".into(), PASSWORD.into()], cases).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_results_and_parameters_answer_what_text_does() {
    psycopg("pg-binary", &["binary_and_text_results_agree", "untyped_parameters_keep_their_types", "first_statement_with_parameters_in_autocommit"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_parameters_drivers_send_are_kept_and_answered() {
    psycopg("pg-settings", &["session_settings", "statement_timeout_stops_a_statement"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_carry_postgres_sqlstates_and_transactions_end_as_postgres_ends_them() {
    psycopg("pg-errors", &["transaction_errors_carry_postgres_codes", "repeated_expression_names", "failed_logins_look_alike"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_from_stdin_reads_csv_by_postgres_rules() {
    psycopg("pg-copy-csv", &["copy_csv_follows_postgres"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_cursors_page_a_large_result() {
    psycopg("pg-cursors", &["named_cursors_page_a_large_result"]).await;
}

/// 8 psycopg connections × 60 transfers with the standard retry-on-40001
/// loop: all complete, the money adds up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_transfers_complete_with_the_standard_retry_loop() {
    psycopg("pg-transfers", &["concurrent_transfers_retry_on_serialization_failure"]).await;
}

/// Every supported type through text and binary results, text and binary
/// parameters, literals, NULLs and COPY's text and CSV formats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_type_matrix_answers_as_postgres_does() {
    psycopg("pg-types", &["type_matrix"]).await;
}

/// A 2-million-row result's first row reaches the client within the first
/// quarter of the time the whole result takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_result_streams_to_the_client() {
    psycopg("pg-stream", &["results_stream"]).await;
}

/// asyncpg, a third driver family: binary parameters and results for
/// everything, prepared statements, transactions, a cursor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asyncpg_round_trips_every_value_in_binary() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/clients/asyncpg_conformance.py");
    conformance("pg-asyncpg", "python3", |s| vec![script.into(), "127.0.0.1".into(), s.pg_addr().port().to_string(), "alice".into(), PASSWORD.into()], &["binary_round_trips"]).await;
}

/// The type matrix's Flight column: each type bound as an Arrow parameter
/// through ADBC and read back as Arrow, value and type.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_type_matrix_through_flight_sql() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/clients/adbc_conformance.py");
    conformance("flight-types", "python3", |s| vec![script.into(), s.flight_addr().expect("Flight SQL listens").port().to_string(), "alice".into(), PASSWORD.into()], &["type_matrix"]).await;
}

/// A PostgreSQL message: type byte, length, body.
fn message(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![kind];
    m.extend_from_slice(&(body.len() as i32 + 4).to_be_bytes());
    m.extend_from_slice(body);
    m
}

/// pgwire answers a failed login with a FATAL and then keeps reading the
/// connection; a client that ignores the FATAL must still not get a
/// statement run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_failed_to_log_in_runs_nothing() {
    let db = TestDb::new(Backend::Local, "pg-login-bypass");
    let server = server(&db).await;
    let port = server.pg_addr().port();
    let replies = tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connects");
        s.set_read_timeout(Some(std::time::Duration::from_secs(5))).expect("timeout");
        let mut startup = Vec::new();
        startup.extend_from_slice(&196608i32.to_be_bytes());
        startup.extend_from_slice(b"user\0alice\0database\0blobhouse\0\0");
        let mut first = ((startup.len() + 4) as i32).to_be_bytes().to_vec();
        first.extend_from_slice(&startup);
        s.write_all(&first).expect("startup sent");
        // A SASL mechanism the server does not offer: the login fails.
        let mut sasl = b"NOT-A-MECHANISM\0".to_vec();
        sasl.extend_from_slice(&(-1i32).to_be_bytes());
        s.write_all(&message(b'p', &sasl)).expect("sasl sent");
        // Ignore the FATAL and try to create a table anyway.
        let _ = s.write_all(&message(b'Q', b"CREATE TABLE pwned (i INT)\0"));
        let mut replies = Vec::new();
        let _ = s.read_to_end(&mut replies);
        replies
    })
    .await
    .expect("joined");
    let text = String::from_utf8_lossy(&replies);
    assert!(text.contains("FATAL"), "the failed login is answered with a FATAL error: {text:?}");
    assert!(!text.contains("CREATE TABLE"), "a statement ran on a connection that did not log in: {text:?}");
    let e = db.engine(blobhouse_engine::EngineOptions::default()).await;
    assert_eq!(lines(&run(&e, "SHOW TABLES").await), Vec::<String>::new(), "no table was created");
}

/// The pgjdbc jar that `scripts/install-test-deps.sh` fetches.
fn pgjdbc_jar() -> std::path::PathBuf {
    let home = std::env::var("HOME").expect("HOME is set");
    std::path::Path::new(&home).join(".m2/repository/org/postgresql/postgresql/42.7.14/postgresql-42.7.14.jar")
}

/// Runs the pgjdbc conformance cases `cases` against a fresh server.
async fn jdbc(name: &str, cases: &[&str]) {
    let jar = pgjdbc_jar();
    assert!(jar.exists(), "{} is missing: run scripts/install-test-deps.sh", jar.display());
    let source = concat!(env!("CARGO_MANIFEST_DIR"), "/clients/JdbcConformance.java");
    conformance(name, "java", |s| vec!["-cp".into(), jar.display().to_string(), source.into(), s.pg_addr().port().to_string(), "alice".into(), PASSWORD.into()], cases).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgjdbc_connects_on_defaults_and_reuses_prepared_statements() {
    jdbc("jdbc-prepared", &["connectsWithDefaults", "preparedStatementsPastTheThreshold", "batchesAndTransactions"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgjdbc_database_metadata_answers_what_dbeaver_asks() {
    jdbc("jdbc-metadata", &["databaseMetadata"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgjdbc_fetch_size_reads_a_large_result_a_portal_at_a_time() {
    jdbc("jdbc-fetch-size", &["fetchSizeStreams"]).await;
}
