"""ADBC's Flight SQL driver against `blobhouse serve`: the type matrix's
Flight column. Run by the suite (`server_clients.rs`) as
    python3 adbc_conformance.py FLIGHT_PORT USER PASSWORD CASE...
Each case prints "ok CASE"; a failed one prints "FAILED CASE" and the
traceback, and the exit code is then 1.
"""

import datetime
import decimal
import sys

from cases import run_cases

import adbc_driver_flightsql.dbapi as flight
import pyarrow as pa

PORT, USER, PASSWORD = int(sys.argv[1]), sys.argv[2], sys.argv[3]

# (SQL type, a value, the Arrow type a client gets back).
TYPES = [
    ("BOOLEAN", True, pa.bool_()),
    ("SMALLINT", -32768, pa.int16()),
    ("INT", 2147483647, pa.int32()),
    ("BIGINT", -9223372036854775808, pa.int64()),
    ("REAL", 1.5, pa.float32()),
    ("DOUBLE", 0.1, pa.float64()),
    ("DECIMAL(12,2)", decimal.Decimal("1234567890.12"), pa.decimal128(12, 2)),
    ("DECIMAL(28,8)", decimal.Decimal("12345678901234567890.01234567"), pa.decimal128(28, 8)),
    ("VARCHAR", "it's \\ \t \u00e9", pa.string()),
    ("DATE", datetime.date(2024, 2, 29), pa.date32()),
    ("TIMESTAMP", datetime.datetime(2024, 2, 29, 12, 34, 56, 789000), None),
    ("TIME", datetime.time(12, 34, 56, 789000), None),
    ("BYTEA", b"\x00\xff'", pa.binary()),
]


def type_matrix():
    """Each type written with a bound Arrow parameter and read back as Arrow:
    the value, and the Arrow type (timestamps and times at their own unit)."""
    bad = []
    with flight.connect(f"grpc://127.0.0.1:{PORT}", db_kwargs={"username": USER, "password": PASSWORD}, autocommit=True) as c:
        with c.cursor() as cur:
            columns = ", ".join(f"c{i} {t}" for i, (t, _, _) in enumerate(TYPES))
            cur.execute(f"CREATE TABLE fm (id INT NOT NULL, {columns})")
            cur.execute(f"INSERT INTO fm VALUES (1, {', '.join('?' for _ in TYPES)})", [v for _, v, _ in TYPES])
            cur.execute("INSERT INTO fm (id) VALUES (2)")
            cur.execute(f"SELECT {', '.join(f'c{i}' for i in range(len(TYPES)))} FROM fm ORDER BY id")
            table = cur.fetch_arrow_table()
            for i, (t, value, arrow) in enumerate(TYPES):
                column = table.column(i)
                if arrow is not None and column.type != arrow:
                    bad.append(f"{t}: Arrow type {column.type}, want {arrow}")
                got = column.to_pylist()
                if got != [value, None]:
                    bad.append(f"{t}: {got!r}, want {[value, None]!r}")
    assert not bad, "\n".join(bad)


CASES = [
    type_matrix,
]

if __name__ == "__main__":
    run_cases(CASES, sys.argv[4:])
