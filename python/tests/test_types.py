"""Values in and out: every SQL type reaches Python as the type a Python
user expects (DECIMAL as decimal.Decimal and Arrow decimal, DATE, TIMESTAMP
with and without time zone, NULL as None, unicode intact), and parameters
bound with ``?`` and ``$1`` round-trip exactly, never spliced raw."""

import datetime
import decimal

import pyarrow as pa
import pytest

import blobhouse


@pytest.fixture
def con(tmp_path):
    con = blobhouse.connect(str(tmp_path / "db"), autocommit=True)
    yield con
    con.close()


ROW = (
    7,
    "héllo ☃ — 世界 🦆",
    decimal.Decimal("12345678901.23"),
    datetime.date(2024, 2, 29),
    datetime.datetime(2024, 1, 2, 3, 4, 5, 123456),
    2.5,
    True,
    b"\x00\xffbytes",
)


def make_table(con):
    con.execute(
        "CREATE TABLE v (i BIGINT, s VARCHAR, d DECIMAL(15,2), dt DATE, ts TIMESTAMP, f DOUBLE, b BOOLEAN, bin BYTEA)"
    )
    con.execute("INSERT INTO v VALUES (?, ?, ?, ?, ?, ?, ?, ?)", ROW)
    con.execute("INSERT INTO v VALUES ($1, $2, $3, $4, $5, $6, $7, $8)", (None,) * 8)


def test_values_come_back_as_python_types(con):
    make_table(con)
    cur = con.execute("SELECT * FROM v ORDER BY i NULLS LAST")
    rows = cur.fetchall()
    assert rows == [ROW, (None,) * 8]
    assert [type(v) for v in rows[0]] == [int, str, decimal.Decimal, datetime.date, datetime.datetime, float, bool, bytes]
    names = [d[1] for d in cur.description]
    assert names == ["BIGINT", "VARCHAR", "DECIMAL(15,2)", "DATE", "TIMESTAMP", "DOUBLE", "BOOLEAN", "BYTEA"]
    assert cur.description[2][4:6] == (15, 2)
    assert names[0] == blobhouse.NUMBER and names[2] == blobhouse.NUMBER and names[1] == blobhouse.STRING
    assert names[3] == blobhouse.DATETIME and names[4] == blobhouse.DATETIME and names[7] == blobhouse.BINARY
    assert names[1] != blobhouse.NUMBER


def test_arrow_types_are_exact(con):
    make_table(con)
    table = con.sql("SELECT * FROM v ORDER BY i NULLS LAST").arrow()
    types = dict(zip(table.column_names, table.schema.types))
    assert types["d"] == pa.decimal128(15, 2)
    assert types["dt"] == pa.date32()
    assert pa.types.is_timestamp(types["ts"]) and types["ts"].tz is None
    assert table.column("d")[0].as_py() == ROW[2]
    assert table.column("s")[0].as_py() == ROW[1]
    assert table.column("i").null_count == 1


def test_timestamps_with_time_zone_keep_it(con):
    berlin = datetime.timezone(datetime.timedelta(hours=2))
    aware = datetime.datetime(2024, 6, 1, 12, 30, tzinfo=berlin)
    data = pa.table({"at": pa.array([aware, None], pa.timestamp("us", tz="UTC"))})
    con.register("events", data)
    cur = con.execute("SELECT at FROM events")
    assert cur.description[0][1] == "TIMESTAMP(6) WITH TIME ZONE"
    got = cur.fetchall()
    assert got[0][0] == aware and got[0][0].utcoffset() == datetime.timedelta(0)
    assert got[1] == (None,)
    # An aware parameter is bound as the instant it is (in UTC).
    assert con.execute("SELECT CAST(? AS TIMESTAMP)", (aware,)).fetchone() == (datetime.datetime(2024, 6, 1, 10, 30),)


def test_parameters_are_values_not_sql(con):
    con.execute("CREATE TABLE p (s VARCHAR)")
    evil = "x'); DROP TABLE p; --"
    con.execute("INSERT INTO p VALUES (?)", (evil,))
    assert con.execute("SELECT s, ? AS q FROM p", ("it's ?",)).fetchall() == [(evil, "it's ?")]
    # A ? inside a literal is not a placeholder.
    assert con.execute("SELECT '?' AS a, ? AS b", (1,)).fetchall() == [("?", 1)]
    with pytest.raises(blobhouse.ProgrammingError, match="takes 1 parameter"):
        con.execute("SELECT ?", (1, 2))
    with pytest.raises(blobhouse.ProgrammingError, match="takes 2 parameter"):
        con.execute("SELECT ?, ?", (1,))
    # Empty parameters: a statement without placeholders runs, one with them is refused.
    assert con.execute("SELECT '?' AS a", ()).fetchall() == [("?",)]
    with pytest.raises(blobhouse.ProgrammingError, match="takes 1 parameter"):
        con.execute("SELECT $1", [])
    with pytest.raises(blobhouse.ProgrammingError, match="positional"):
        con.execute("SELECT ?", {"a": 1})


def test_special_values(con):
    row = con.execute("SELECT ?, ?, ?, ?", (float("inf"), -0.0, 2**63 - 1, "")).fetchone()
    assert row == (float("inf"), -0.0, 2**63 - 1, "")
    assert con.execute("SELECT ?", (float("nan"),)).fetchone()[0] != con.execute("SELECT ?", (float("nan"),)).fetchone()[0]
    assert con.execute("SELECT ?::DATE", (datetime.date(1, 1, 1),)).fetchone() == (datetime.date(1, 1, 1),)


def test_errors_carry_sqlstate_and_class(con):
    cases = [
        ("SELECT * FROM missing_table", blobhouse.ProgrammingError, "42P01"),
        ("SELEC 1", blobhouse.ProgrammingError, "42601"),
        ("SELECT 1/0", blobhouse.DataError, "22012"),
    ]
    for sql, cls, code in cases:
        with pytest.raises(cls) as info:
            # Rows are computed as they are fetched: an error while
            # computing them is raised by the fetch.
            con.execute(sql).fetchall()
        assert info.value.sqlstate == code, (sql, info.value.sqlstate, str(info.value))
        assert isinstance(info.value, blobhouse.DatabaseError) and isinstance(info.value, blobhouse.Error)
    con.execute("CREATE TABLE n (x BIGINT NOT NULL)")
    with pytest.raises(blobhouse.IntegrityError) as info:
        con.execute("INSERT INTO n VALUES (NULL)")
    assert info.value.sqlstate.startswith("23")
