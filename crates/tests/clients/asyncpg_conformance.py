"""asyncpg (binary protocol for everything, by default) against `blobhouse serve`.

Run by the suite (`server_clients.rs`) as
    python3 asyncpg_conformance.py HOST PORT USER PASSWORD CASE...
Each case prints "ok CASE"; a failed one prints "FAILED CASE" and the
traceback, and the exit code is then 1.
"""

import asyncio
import datetime
import decimal
import sys

from cases import run_cases

import asyncpg

HOST, PORT, USER, PASSWORD = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]


async def connect():
    return await asyncpg.connect(host=HOST, port=PORT, user=USER, password=PASSWORD, database="blobhouse", ssl=False)


async def binary_round_trips():
    """Every value is sent and read in binary: typed parameters, typed
    results, prepared statements reused, transactions, errors' codes."""
    c = await connect()
    try:
        await c.execute("CREATE TABLE ap (id BIGINT NOT NULL, i INT, d DECIMAL(12,2), t TIMESTAMP, dt DATE, b BOOLEAN, f DOUBLE, s VARCHAR)")
        await c.execute(
            "INSERT INTO ap VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            1, 42, decimal.Decimal("12.50"), datetime.datetime(2024, 2, 29, 12, 34, 56, 789000), datetime.date(2024, 2, 29), True, 0.1, "it's",
        )
        row = await c.fetchrow("SELECT id, i, d, t, dt, b, f, s FROM ap WHERE id = $1", 1)
        want = (1, 42, decimal.Decimal("12.50"), datetime.datetime(2024, 2, 29, 12, 34, 56, 789000), datetime.date(2024, 2, 29), True, 0.1, "it's")
        assert tuple(row) == want, (tuple(row), want)
        stmt = await c.prepare("SELECT i + $1 FROM ap WHERE id = $2")
        for n in range(8):
            assert await stmt.fetchval(n, 1) == 42 + n, n
        assert await c.fetchval("SELECT $1::int + 1", 1) == 2
        assert await c.fetchval("SELECT count(*) FROM ap WHERE d = $1", decimal.Decimal("12.50")) == 1
        try:
            await c.fetch("SELECT * FROM no_such_table")
            raise AssertionError("a missing table was found")
        except asyncpg.exceptions.UndefinedTableError:
            pass
        async with c.transaction():
            await c.execute("INSERT INTO ap (id) VALUES (2)")
        assert await c.fetchval("SELECT count(*) FROM ap") == 2
        # A cursor in a transaction pages a result.
        async with c.transaction():
            seen = [r[0] async for r in c.cursor("SELECT value FROM range(5000)", prefetch=500)]
        assert seen == list(range(5000)), len(seen)
    finally:
        await c.close()


CASES = [
    binary_round_trips,
]

if __name__ == "__main__":
    run_cases(CASES, sys.argv[5:], lambda case: asyncio.run(case()))
