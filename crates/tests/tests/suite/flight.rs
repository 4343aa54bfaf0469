//! `blobhouse serve`'s Arrow Flight SQL endpoint with a real client:
//! ADBC's Flight SQL driver (adbc-driver-flightsql from PyPI, the Go
//! driver under its Python DB-API), against a server started in the test
//! on 127.0.0.1.

use std::process::Command;

use blobhouse_engine::EngineOptions;
use blobhouse_server::{Server, ServerOptions, TlsFiles};

use crate::common::*;
use crate::on_both_backends;
use crate::server::{PASSWORD, Stop, alice_on_loopback, cancel_through, server, stop_through, tpch_answers_through};

on_both_backends!(adbc_runs_queries_transactions_prepared_statements_metadata_and_ingest);

/// Runs a Python script that begins with `FLIGHT_PORT`, `PASSWORD` and a
/// `connect(**kwargs)` for alice; asserts it prints "ok".
async fn adbc(server: &Server, uri_scheme: &str, extra_db_kwargs: &str, body: &str) -> std::process::Output {
    let script = format!(
        r#"
import adbc_driver_flightsql.dbapi as flight, adbc_driver_manager, pyarrow as pa
FLIGHT_PORT = {port}
PASSWORD = {password:?}
URI = "{uri_scheme}://127.0.0.1:{port}"
def connect(**kwargs):
    return flight.connect(URI, db_kwargs={{"username": "alice", "password": PASSWORD, {extra_db_kwargs}}}, **kwargs)
{body}
"#,
        port = server.flight_addr().expect("Flight SQL is served").port(),
        password = PASSWORD,
    );
    tokio::task::spawn_blocking(move || Command::new("python3").args(["-c", &script]).output().expect("python3 runs")).await.expect("joined")
}

fn assert_ok(out: &std::process::Output) {
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok",
        "ADBC: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn adbc_runs_queries_transactions_prepared_statements_metadata_and_ingest(backend: Backend) {
    let db = TestDb::new(backend, "flight-adbc");
    let server = server(&db).await;
    let out = adbc(
        &server,
        "grpc",
        "",
        r#"
# DB-API's default: no autocommit, statements run in a transaction.
with connect() as c:
    cur = c.cursor()
    cur.execute("CREATE TABLE items (id BIGINT NOT NULL, name VARCHAR, price DOUBLE)")
    c.commit()
    # A prepared statement executed for many rows of parameters.
    cur.executemany("INSERT INTO items VALUES (?, ?, ?)", [(1, "it's", 2.5), (2, None, 10.0)])
    c.commit()
    cur.execute("INSERT INTO items VALUES (3, 'gone', 1.0)")
    c.rollback()
    # Parameters of several types, and the described columns.
    cur.execute("SELECT id, name FROM items WHERE price > ? AND id <> ? ORDER BY id", (1.0, 99))
    assert [d[0] for d in cur.description] == ["id", "name"], cur.description
    assert cur.fetchall() == [(1, "it's"), (2, None)]
    # A quote in a value stays a value.
    cur.execute("SELECT count(*) FROM items WHERE name = ?", ("x' OR '1'='1",))
    assert cur.fetchone() == (0,)
    for id, name in [(1, "it's"), (2, None)]:
        cur.execute("SELECT name FROM items WHERE id = ?", (id,))
        assert cur.fetchall() == [(name,)]
    # Metadata: get_info, objects, a table's schema, table types.
    info = c.adbc_get_info()
    assert info["vendor_name"] == "blobhouse" and info["vendor_version"], info
    objects = c.adbc_get_objects(depth="all", db_schema_filter="public", table_name_filter="items").read_all().to_pylist()
    assert [cat["catalog_name"] for cat in objects] == ["blobhouse"], objects
    [schema] = objects[0]["catalog_db_schemas"]
    [table] = schema["db_schema_tables"]
    assert schema["db_schema_name"] == "public" and table["table_name"] == "items" and table["table_type"] == "BASE TABLE", table
    assert [col["column_name"] for col in table["table_columns"]] == ["id", "name", "price"], table
    s = c.adbc_get_table_schema("items")
    assert s.names == ["id", "name", "price"] and s.field("id").type == pa.int64() and not s.field("id").nullable, s
    assert "BASE TABLE" in c.adbc_get_table_types()
    # Bulk ingest of a pyarrow table: create, append, refuse, replace.
    data = pa.table({"x": pa.array([1, 2, 3], pa.int32()), "label": ["p", None, "r"], "amount": pa.array([1.5, 2.5, None])})
    assert cur.adbc_ingest("ingested", data, mode="create") == 3
    assert cur.adbc_ingest("ingested", data.slice(0, 1), mode="append") == 1
    c.commit()
    try:
        cur.adbc_ingest("ingested", data, mode="create")
        raise SystemExit("create over an existing table succeeded")
    except adbc_driver_manager.Error as e:
        assert "ingested" in str(e) and "exists" in str(e), e
    c.rollback()
    cur.execute("SELECT x, label, amount FROM ingested ORDER BY x, label")
    assert cur.fetchall() == [(1, "p", 1.5), (1, "p", 1.5), (2, None, 2.5), (3, "r", None)]
    assert cur.adbc_ingest("ingested", data.slice(2), mode="replace") == 1
    c.commit()
    cur.execute("SELECT count(*) FROM ingested")
    assert cur.fetchone() == (1,)
    # The round trip keeps the types: string stays string (not string_view).
    cur.execute("SELECT x, label, amount FROM ingested")
    back = cur.fetch_arrow_table()
    assert back.schema.types == data.schema.types, (back.schema, data.schema)
    # An error names what failed.
    try:
        cur.execute("SELECT * FROM no_such_table")
        raise SystemExit("a missing table was found")
    except adbc_driver_manager.Error as e:
        assert "no_such_table" in str(e), e
    c.rollback()
# Each connection is its own session: an uncommitted row is not seen by another.
with connect() as a, connect(autocommit=True) as b:
    a.cursor().execute("INSERT INTO items VALUES (9, 'mine', 1.0)")
    cur = b.cursor()
    cur.execute("SELECT count(*) FROM items WHERE id = 9")
    assert cur.fetchone() == (0,)
    a.commit()
    cur.execute("SELECT count(*) FROM items WHERE id = 9")
    assert cur.fetchone() == (1,)
# Two writers of one row: the second commit is a serialization failure,
# sent as gRPC Aborted with its SQLSTATE (ADBC's Go driver reports Aborted
# as status UNKNOWN, an OperationalError).
with connect() as a, connect() as b:
    a.cursor().execute("UPDATE items SET name = 'a' WHERE id = 9")
    b.cursor().execute("UPDATE items SET name = 'b' WHERE id = 9")
    a.commit()
    try:
        b.commit()
        raise SystemExit("two writers of one row both committed")
    except adbc_driver_manager.OperationalError as e:
        assert "[SQLSTATE 40001]" in str(e) and "serialization failure" in str(e), e
# A wrong password, and no credentials at all, are refused without echoing them.
for kwargs in [{"username": "alice", "password": "wrong password"}, {}]:
    try:
        flight.connect(URI, db_kwargs=kwargs, autocommit=True).cursor().execute("SELECT 1")
        raise SystemExit(f"logged in with {kwargs}")
    except adbc_driver_manager.Error as e:
        assert "UNAUTHENTICATED" in str(e) and "wrong password" not in str(e), e
print("ok")
"#,
    )
    .await;
    assert_ok(&out);
    // Both protocols see one database.
    assert_eq!(scalar(&run(&server.engine().connect(), "SELECT count(*) AS n FROM ingested").await), "1");
}

/// An autocommit ADBC connection with `run(query)` (for the shared
/// TPC-H and cancel checks).
const ADBC_CLIENT: &str = r#"
import adbc_driver_flightsql.dbapi as flight, adbc_driver_manager
c = flight.connect(f"grpc://127.0.0.1:{FLIGHT_PORT}", db_kwargs={"username": "alice", "password": PASSWORD}, autocommit=True)
cur = c.cursor()
def run(q):
    cur.execute(q)
    return cur.fetchall()
"#;

/// All 22 TPC-H answers through ADBC (Arrow batches over Flight SQL,
/// converted by pyarrow) equal the reference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_22_tpch_answers_through_adbc_equal_the_reference() {
    tpch_answers_through("adbc", ADBC_CLIENT).await;
}

/// ADBC's cancel (the driver cancels its call) stops the query within a
/// second, with its downloads, and the connection serves the next statement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adbc_cancel_stops_the_running_query_and_its_downloads() {
    let client = format!(
        "{ADBC_CLIENT}{}",
        r#"
def cancel():
    cur.adbc_cancel()
def cancelled(e):
    return isinstance(e, adbc_driver_manager.Error) and "CANCEL" in str(e).upper()
"#
    );
    cancel_through("adbc", &client).await;
}

/// An ADBC client killed in the middle of a long query: its HTTP/2
/// connection ends, and with it the call, the query and its downloads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adbc_client_that_hangs_up_mid_query_stops_it() {
    stop_through("adbc", ADBC_CLIENT, Stop::HangUp).await;
}

/// With TLS configured, Flight SQL is served over TLS only: a client that
/// trusts the CA gets in, a plaintext client and one that does not trust
/// the certificate do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flight_sql_over_tls_only_when_configured() {
    let db = TestDb::new(Backend::Local, "flight-tls");
    let dir = tempfile::tempdir().expect("tempdir");
    blobhouse_testbed::make_certificates(dir.path()).expect("openssl makes a CA and a certificate");
    let ca = std::fs::read_to_string(dir.path().join("ca.pem")).expect("the CA");
    let tls = TlsFiles { cert: dir.path().join("cert.pem"), key: dir.path().join("key.pem") };
    let server = Server::start(db.engine(EngineOptions::default()).await.engine().clone(), ServerOptions { tls: Some(tls), ..alice_on_loopback() }).await.expect("the TLS server starts");
    let trusted = format!("\"adbc.flight.sql.client_option.tls_root_certs\": {ca:?}");
    let body = r#"
with connect(autocommit=True) as c:
    cur = c.cursor()
    cur.execute("SELECT 41 + 1")
    assert cur.fetchone() == (42,)
print("ok")
"#;
    assert_ok(&adbc(&server, "grpc+tls", &trusted, body).await);
    for (scheme, kwargs, what) in [("grpc", "", "a plaintext client"), ("grpc+tls", "", "a client that does not trust the CA")] {
        let out = adbc(&server, scheme, kwargs, body).await;
        assert!(!out.status.success(), "{what} was served: {}", String::from_utf8_lossy(&out.stdout));
        assert!(!String::from_utf8_lossy(&out.stderr).contains(PASSWORD));
    }
}
