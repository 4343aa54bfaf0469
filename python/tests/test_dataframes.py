"""Python data in: pandas and Polars DataFrames (and pyarrow tables)
registered, joined with a stored table, inserted into it and read back
equal; ``load()`` streaming a reader into a new or existing table."""

import decimal

import pandas as pd
import polars as pl
import pyarrow as pa
import pytest

import blobhouse


@pytest.fixture
def con(tmp_path):
    con = blobhouse.connect(str(tmp_path / "db"), autocommit=True)
    con.execute("CREATE TABLE customers (id BIGINT NOT NULL, name VARCHAR, balance DECIMAL(12,2))")
    con.executemany(
        "INSERT INTO customers VALUES (?, ?, ?)",
        [(1, "Ada", decimal.Decimal("10.50")), (2, "Brendan", decimal.Decimal("-3.00")), (3, "Cécile", None)],
    )
    yield con
    con.close()


def orders_pandas() -> pd.DataFrame:
    return pd.DataFrame({"order_id": [10, 11, 12, 13], "customer": [1, 1, 3, 2], "amount": [5.25, 7.0, 1.5, 100.0], "note": ["a", None, "ü", "d"]})


def test_pandas_registered_joined_inserted_and_read_back(con):
    df = orders_pandas()
    con.register("orders_df", df)
    joined = con.sql(
        "SELECT c.name, sum(o.amount) AS total FROM orders_df o JOIN customers c ON c.id = o.customer GROUP BY c.name ORDER BY c.name"
    ).df()
    assert joined.to_dict("list") == {"name": ["Ada", "Brendan", "Cécile"], "total": [12.25, 100.0, 1.5]}
    con.execute("CREATE TABLE orders (order_id BIGINT, customer BIGINT, amount DOUBLE, note VARCHAR)")
    cur = con.execute("INSERT INTO orders SELECT * FROM orders_df")
    assert cur.rowcount == 4
    back = con.sql("SELECT * FROM orders ORDER BY order_id").df()
    pd.testing.assert_frame_equal(back, df, check_dtype=False)
    # Registered data is this connection's: a stored table of the name is refused.
    with pytest.raises(blobhouse.ProgrammingError, match="already exists"):
        con.register("customers", df)
    assert "orders_df" in con.sql("SHOW TABLES").df()["name"].tolist()
    con.unregister("orders_df")
    with pytest.raises(blobhouse.ProgrammingError):
        con.execute("SELECT * FROM orders_df").fetchall()


def test_polars_registered_joined_inserted_and_read_back(con):
    df = pl.DataFrame({"order_id": [20, 21, 22], "customer": [2, 3, 3], "amount": [1.0, 2.0, 3.5], "note": ["x", "y", None]})
    con.register("orders_pl", df)
    joined = con.sql(
        "SELECT c.name, count(*) AS n, sum(o.amount) AS total FROM orders_pl o JOIN customers c ON c.id = o.customer GROUP BY c.name ORDER BY c.name"
    ).pl()
    assert joined.rows() == [("Brendan", 1, 1.0), ("Cécile", 2, 5.5)]
    con.execute("CREATE TABLE orders (order_id BIGINT, customer BIGINT, amount DOUBLE, note VARCHAR)")
    con.execute("INSERT INTO orders SELECT * FROM orders_pl")
    back = con.sql("SELECT * FROM orders ORDER BY order_id").pl()
    assert back.rows() == df.rows()
    assert back.columns == df.columns


def test_registered_data_is_scanned_again_and_seen_only_by_its_connection(con, tmp_path):
    con.register("t", pa.table({"x": list(range(10))}))
    assert con.sql("SELECT sum(x) FROM t").fetchall() == [(45,)]
    assert con.sql("SELECT count(*) FROM t a, t b").fetchall() == [(100,)]
    other = blobhouse.connect(con.url, autocommit=True)
    with pytest.raises(blobhouse.ProgrammingError):
        other.execute("SELECT * FROM t").fetchall()
    other.close()


def test_load_creates_then_appends_streaming_a_reader(con):
    schema = pa.schema([("k", pa.int64()), ("v", pa.large_string())])

    def batches(start):
        for i in range(start, start + 5):
            yield pa.record_batch([pa.array(range(i * 1000, i * 1000 + 1000)), pa.array([f"v{j}" for j in range(1000)], pa.large_string())], schema=schema)

    reader = pa.RecordBatchReader.from_batches(schema, batches(0))
    assert con.load("facts", reader) == 5000
    assert con.load("facts", pl.DataFrame({"k": [-1], "v": ["last"]})) == 1
    assert con.sql("SELECT count(*), count(DISTINCT k), max(k) FROM facts").fetchall() == [(5001, 5001, 4999)]
    # large_string is stored as VARCHAR.
    assert con.execute("SELECT * FROM facts LIMIT 1").description[1][1] == "VARCHAR"
    # The hidden table the load streamed from is gone.
    assert [t for t in con.sql("SHOW TABLES").df()["name"] if t.startswith("__blobhouse")] == []


def test_duckdb_reads_a_relation_and_blobhouse_reads_duckdb(con):
    duckdb = pytest.importorskip("duckdb")
    rel = con.sql("SELECT id, name FROM customers ORDER BY id")  # noqa: F841 (DuckDB reads it by name)
    assert duckdb.sql("SELECT count(*), max(id) FROM rel").fetchall() == [(3, 3)]
    con.register("from_duck", duckdb.sql("SELECT range AS x FROM range(5)").arrow())
    assert con.sql("SELECT sum(x) FROM from_duck").fetchall() == [(10,)]
