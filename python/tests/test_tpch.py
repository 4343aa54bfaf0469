"""The 22 TPC-H answers at SF 0.01 through every way a Python user reads
rows — DB-API ``fetchall()``, ``.arrow()`` and ``.pl()`` — against the
reference answers the Rust suite checks (DuckDB's, computed outside the
project), with the TPC-H tolerance for rounding: numbers within 0.01
absolute or 1e-6 relative, text after trimming."""

import datetime
import decimal

import pyarrow as pa
import pytest

import blobhouse
from blobhouse._convert import _rows
from conftest import ANSWERS, QUERIES


def reference(n: int) -> tuple[list[str], list[list[str]]]:
    lines = (ANSWERS / f"q{n:02}.csv").read_text().splitlines()
    return lines[0].split("|"), [line.split("|") for line in lines[1:]]


def same(value, expected: str) -> bool:
    if value is None:
        return expected.strip() in ("", "NULL")
    if isinstance(value, bool):
        return str(value).lower() == expected.strip().lower()
    if isinstance(value, (int, float, decimal.Decimal)):
        a, b = float(value), float(expected)
        return abs(a - b) <= 0.01 or abs(a - b) <= 1e-6 * abs(b)
    if isinstance(value, datetime.date):
        return value.isoformat() == expected.strip()
    return str(value).strip() == expected.strip()


def check(n: int, columns: list[str], rows: list[tuple]) -> None:
    header, expected = reference(n)
    # Names of unnamed expressions differ between engines (sum(l_quantity)):
    # the count is compared, as the Rust suite does.
    assert len(columns) == len(header), f"Q{n}: columns {columns}, the reference has {header}"
    assert len(rows) == len(expected), f"Q{n}: {len(rows)} rows, the reference has {len(expected)}"
    for i, (row, want) in enumerate(zip(rows, expected)):
        assert len(row) == len(want), f"Q{n} row {i + 1}: {len(row)} values, reference {len(want)}"
        for j, (v, w) in enumerate(zip(row, want)):
            assert same(v, w), f"Q{n} row {i + 1} column {columns[j]}: {v!r} != reference {w!r}"


@pytest.fixture(scope="module")
def con(tpch_db):
    con = blobhouse.connect(tpch_db, autocommit=True)
    yield con
    con.close()


QUERY_NUMBERS = list(range(1, 23))


@pytest.mark.parametrize("n", QUERY_NUMBERS)
def test_fetchall(con, n):
    cur = con.cursor()
    cur.execute((QUERIES / f"q{n:02}.sql").read_text())
    rows = cur.fetchall()
    check(n, [d[0] for d in cur.description], rows)
    assert cur.rowcount == len(rows)


@pytest.mark.parametrize("n", QUERY_NUMBERS)
def test_arrow(con, n):
    table = con.sql((QUERIES / f"q{n:02}.sql").read_text()).arrow()
    assert isinstance(table, pa.Table)
    rows = [row for batch in table.to_batches() for row in _rows(batch)]
    check(n, table.column_names, rows)


@pytest.mark.parametrize("n", QUERY_NUMBERS)
def test_polars(con, n):
    polars = pytest.importorskip("polars")
    df = con.sql((QUERIES / f"q{n:02}.sql").read_text()).pl()
    assert isinstance(df, polars.DataFrame)
    check(n, df.columns, df.rows())
