"""Files queried in place from Python (docs/interop.md): a hive-partitioned
Parquet dataset written by DuckDB, read by ``read_parquet`` and by an
external table through ``blobhouse.connect``, answers equal to DuckDB's
on the same files, and a DataFrame out."""

import duckdb
import pytest

import blobhouse


@pytest.fixture
def sales(tmp_path):
    path = tmp_path / "sales"
    duckdb.sql(
        f"""COPY (SELECT i AS id, 2020 + i % 4 AS year, ['eu', 'us', 'apac'][1 + i % 3] AS region, i % 97 AS qty
                 FROM range(12000) t(i))
            TO '{path}' (FORMAT parquet, PARTITION_BY (year, region))"""
    )
    return path


def test_read_parquet_and_external_tables_answer_as_duckdb(tmp_path, sales):
    query = "SELECT year, region, count(*) AS n, sum(qty) AS q FROM {src} WHERE year >= 2022 AND region <> 'us' GROUP BY year, region ORDER BY year, region"
    expected = duckdb.sql(query.format(src=f"read_parquet('{sales}/*/*/*.parquet', hive_partitioning = true)")).fetchall()
    assert len(expected) == 4
    con = blobhouse.connect(str(tmp_path / "db"), autocommit=True)
    got = con.sql(query.format(src=f"read_parquet('{sales}/*/*/*.parquet', hive_partitioning => true)")).fetchall()
    assert got == expected
    con.execute(f"CREATE EXTERNAL TABLE sales STORED AS PARQUET LOCATION '{sales}/'")
    assert con.sql(query.format(src="sales")).fetchall() == expected
    # Typed from the path: year is BIGINT, region VARCHAR, as in DuckDB.
    df = con.sql("SELECT * FROM sales WHERE year = 2021 AND region = 'eu' ORDER BY id LIMIT 3").df()
    assert list(df.columns) == ["id", "qty", "year", "region"]
    assert df["year"].tolist() == [2021] * 3 and df["region"].tolist() == ["eu"] * 3
    with pytest.raises(blobhouse.Error, match="external table"):
        con.execute("DELETE FROM sales WHERE year = 2020")
    con.close()


def test_union_by_name_reads_every_files_columns_as_duckdb(tmp_path):
    for name, select in [("a", "SELECT 1 AS id, 'one' AS x"), ("b", "SELECT 2 AS id, 20 AS y")]:
        duckdb.sql(f"COPY ({select}) TO '{tmp_path / name}.parquet'")
    query = "SELECT id, x, y FROM read_parquet('{glob}', union_by_name {op} true) ORDER BY id"
    glob = f"{tmp_path}/*.parquet"
    expected = duckdb.sql(query.format(glob=glob, op="=")).fetchall()
    assert expected == [(1, "one", None), (2, None, 20)]
    con = blobhouse.connect(str(tmp_path / "db"), autocommit=True)
    assert con.sql(query.format(glob=glob, op="=>")).fetchall() == expected
    # Without it, the first file's columns (DuckDB's default too).
    assert [d[0] for d in con.execute(f"SELECT * FROM read_parquet('{glob}')").description] == ["id", "x"]
    con.close()
