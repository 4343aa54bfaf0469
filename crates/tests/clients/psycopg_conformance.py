"""psycopg 3 against `blobhouse serve`, on the driver's default settings.

Run by the suite (`server_clients.rs`) as
    python3 psycopg_conformance.py HOST PORT USER PASSWORD CASE...
Each case is a function below; it asserts what PostgreSQL would answer and
prints "ok CASE". A case that fails raises, and the script exits non-zero
with the case's name and the traceback.
"""

import datetime
import decimal
import sys

from cases import run_cases

import psycopg
from psycopg import errors

HOST, PORT, USER, PASSWORD = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]


def connect(**kw):
    args = dict(host=HOST, port=PORT, user=USER, password=PASSWORD, dbname="blobhouse", sslmode="disable")
    args.update(kw)
    return psycopg.connect(**args)


def binary_and_text_results_agree():
    """A parameter's type must not change the bytes of the result column.
    `SELECT %s + i` announced int4 and sent int8: a binary cursor read 0."""
    with connect(autocommit=True) as c:
        c.execute("CREATE TABLE pt (id BIGINT NOT NULL, i INT)")
        c.execute("INSERT INTO pt VALUES (1, 42), (2, NULL)")
        for binary in (False, True):
            cur = c.cursor(binary=binary)
            cur.execute("SELECT %s + i AS v FROM pt WHERE id = %s", (5, 1))
            assert cur.fetchall() == [(47,)], (binary, cur.description)
            cur.execute("SELECT i, %s::bigint * 2 AS w FROM pt ORDER BY id", (2**40,))
            assert cur.fetchall() == [(42, 2**41), (None, 2**41)], binary
            # Prepared and reused past psycopg's prepare threshold.
            for n in range(8):
                cur.execute("SELECT i + %s FROM pt WHERE id = %s", (n, 1), prepare=True)
                assert cur.fetchone() == (42 + n,), (binary, n)


def first_statement_with_parameters_in_autocommit():
    """The extended protocol's Parse may be a connection's first message."""
    with connect(autocommit=True) as c:
        assert c.execute("SELECT %s::int + 1", (1,)).fetchone() == (2,)
        assert c.execute("SELECT %s::int + 2", (1,)).fetchone() == (3,)


def repeated_expression_names():
    with connect(autocommit=True) as c:
        cur = c.execute("SELECT 1, 1")
        assert cur.fetchone() == (1, 1)
        assert cur.description[0].name == cur.description[1].name, cur.description
        cur = c.execute("SELECT 'a' AS x, 'b' AS x")
        assert cur.fetchone() == ("a", "b") and [d.name for d in cur.description] == ["x", "x"]


def untyped_parameters_keep_their_types():
    with connect(autocommit=True) as c:
        row = c.execute("SELECT %s, %s, %s, %s", (1.25, 7, True, "text")).fetchone()
        assert row == (1.25, 7, True, "text"), row
        assert [type(v) for v in row] == [float, int, bool, str], row
        for binary in (False, True):
            row = c.cursor(binary=binary).execute("SELECT %s, %s, %s", (decimal.Decimal("12.50"), datetime.date(2024, 2, 29), None)).fetchone()
            assert row[0] == decimal.Decimal("12.50") and row[1] == datetime.date(2024, 2, 29) and row[2] is None, (binary, row)


SETTINGS = [
    ("SET application_name = 'conformance'", "application_name", "conformance"),
    ("SET extra_float_digits = 3", "extra_float_digits", "3"),
    ("SET search_path TO public", "search_path", "public"),
    ("SET TIME ZONE 'UTC'", "TimeZone", "UTC"),
    ("SET statement_timeout = '30s'", "statement_timeout", "30000"),
    ("SET DateStyle = 'ISO, MDY'", "DateStyle", "ISO, MDY"),
    ("SET client_min_messages TO warning", "client_min_messages", "warning"),
    ("SET client_encoding TO 'UTF8'", "client_encoding", "UTF8"),
    ("SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL REPEATABLE READ", "default_transaction_isolation", "repeatable read"),
    ("SET default_transaction_isolation = 'read committed'", "default_transaction_isolation", "repeatable read"),
    ("SET myapp.tenant = 'acme'", "myapp.tenant", "acme"),
]


def session_settings():
    with connect(autocommit=True) as c:
        for statement, name, value in SETTINGS:
            c.execute(statement)
            assert c.execute(f'SHOW "{name}"').fetchone() == (value,), (statement, name)
            assert c.execute("SELECT current_setting(%s)", (name,)).fetchone()[0] is not None
        assert c.execute("SELECT current_setting('application_name')").fetchone() == ("conformance",)
        # psycopg reads reported parameters from ParameterStatus.
        assert c.info.parameter_status("application_name") == "conformance"
        c.execute("BEGIN")
        c.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
        c.execute("ROLLBACK")
        c.execute("RESET ALL")
        assert c.execute("SHOW application_name").fetchone() == ("",)
        try:
            c.execute("SET no_such_parameter = 1")
            raise AssertionError("an unknown parameter was accepted")
        except errors.UndefinedObject as e:
            assert "no_such_parameter" in str(e)
        try:
            c.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
            raise AssertionError("SERIALIZABLE was accepted")
        except errors.FeatureNotSupported as e:
            # Refusals are sentences, never a Rust debug dump.
            assert "snapshot isolation" in str(e) and "{" not in str(e), str(e)


def statement_timeout_stops_a_statement():
    with connect(autocommit=True) as c:
        c.execute("SET statement_timeout = 200")
        try:
            c.execute("SELECT sum(value % 7) FROM range(10000000000)")
            raise AssertionError("the statement outlived its timeout")
        except errors.QueryCanceled as e:
            assert "statement timeout" in str(e), str(e)
        assert c.execute("SELECT 1").fetchone() == (1,)


def copy_csv_follows_postgres():
    with connect(autocommit=True) as c:
        c.execute("CREATE TABLE cc (id INT NOT NULL, flag BOOLEAN, s VARCHAR)")
        with c.cursor().copy("COPY cc FROM STDIN (FORMAT csv)") as copy:
            copy.write('1,t,""\n2,f,\n3,,"a,""b""\nc"\n')
        rows = c.execute("SELECT id, flag, s FROM cc ORDER BY id").fetchall()
        assert rows == [(1, True, ""), (2, False, None), (3, None, 'a,"b"\nc')], rows
        try:
            with c.cursor().copy("COPY cc FROM STDIN (FORMAT csv)") as copy:
                copy.write("4,t,x\n5,maybe,y\n")
            raise AssertionError("a bad boolean was loaded")
        except errors.Error as e:
            assert "line 2" in str(e) and "STDIN" in str(e), str(e)
        assert c.execute("SELECT count(*) FROM cc").fetchone() == (3,)


def transaction_errors_carry_postgres_codes():
    with connect() as a, connect() as b:
        a.execute("CREATE TABLE acc (id INT NOT NULL, bal BIGINT)")
        a.execute("INSERT INTO acc VALUES (1, 100), (2, 100)")
        a.commit()
        a.execute("UPDATE acc SET bal = bal - 1 WHERE id = 1")
        b.execute("UPDATE acc SET bal = bal + 1 WHERE id = 1")
        a.commit()
        try:
            b.commit()
            raise AssertionError("two writers of one row both committed")
        except errors.SerializationFailure as e:
            assert e.sqlstate == "40001", e.sqlstate
        assert a.execute("SELECT bal FROM acc WHERE id = 1").fetchone() == (99,)
        a.rollback()
    with connect(autocommit=True) as c:
        notices = []
        c.add_notice_handler(lambda d: notices.append((d.sqlstate, d.message_primary)))
        c.execute("BEGIN")
        c.execute("BEGIN")  # a warning, as PostgreSQL gives
        assert any(n[0] == "25001" for n in notices), notices
        try:
            c.execute("SELECT * FROM no_such_table")
        except errors.UndefinedTable as e:
            assert e.sqlstate == "42P01"
        try:
            c.execute("SELECT 1")
            raise AssertionError("an aborted transaction ran a statement")
        except errors.InFailedSqlTransaction:
            pass
        cur = c.execute("COMMIT")  # PostgreSQL: ROLLBACK, not an error
        assert cur.statusmessage == "ROLLBACK", cur.statusmessage
        assert c.execute("SELECT 1").fetchone() == (1,)
        try:
            c.execute("SELECT no_such_column FROM acc")
            raise AssertionError("a missing column was found")
        except errors.UndefinedColumn as e:
            assert e.sqlstate == "42703"
        try:
            c.execute("UPDATE acc SET no_such_column = 1")
            raise AssertionError("a missing column was updated")
        except errors.UndefinedColumn as e:
            assert "no_such_column" in str(e) and "columns: id, bal" in str(e), str(e)


def failed_logins_look_alike():
    messages = []
    for user in (USER, "nobody_" + USER):
        try:
            connect(user=user, password="wrong password").close()
            raise AssertionError("a wrong password logged in")
        except psycopg.OperationalError as e:
            text = str(e)
            assert f'password authentication failed for user "{user}"' in text, text
            messages.append(text.replace(user, "USER"))
    assert messages[0] == messages[1], messages


def named_cursors_page_a_large_result():
    """psycopg's server-side cursor: DECLARE, then FETCH a page at a time."""
    with connect() as c:
        with c.cursor(name="big") as cur:
            cur.itersize = 1000
            cur.execute("SELECT value, value * 2 AS twice FROM range(%s) ORDER BY value", (25000,))
            assert [d.name for d in cur.description] == ["value", "twice"], cur.description
            first = cur.fetchmany(10)
            assert first == [(i, 2 * i) for i in range(10)], first
            rows, total = 10, sum(r[0] for r in first)
            for row in cur:
                rows += 1
                total += row[0]
            assert rows == 25000 and total == 24999 * 25000 // 2, (rows, total)
        c.commit()
    with connect(autocommit=True) as c:
        c.execute("BEGIN")
        c.execute("DECLARE c1 CURSOR FOR SELECT value FROM range(5)")
        assert c.execute("FETCH 2 FROM c1").fetchall() == [(0,), (1,)]
        assert c.execute("FETCH ALL FROM c1").fetchall() == [(2,), (3,), (4,)]
        assert c.execute("FETCH 1 FROM c1").fetchall() == []
        c.execute("CLOSE c1")
        c.execute("COMMIT")
        try:
            c.execute("FETCH 1 FROM c1")
            raise AssertionError("a closed cursor fetched")
        except errors.InvalidCursorName:
            pass
        try:
            c.execute("DECLARE c2 CURSOR FOR SELECT 1")
            raise AssertionError("a cursor outside a transaction")
        except errors.NoActiveSqlTransaction:
            pass


def concurrent_transfers_retry_on_serialization_failure():
    """8 connections x 60 transfers with the standard retry-on-40001 loop:
    every transfer completes once, money is neither made nor lost."""
    import random
    import threading
    import time
    accounts, clients, transfers, start = 8, 8, 60, 1000
    with connect(autocommit=True) as c:
        c.execute("CREATE TABLE bank (id INT NOT NULL, bal BIGINT NOT NULL)")
        c.execute("INSERT INTO bank VALUES " + ", ".join(f"({i}, {start})" for i in range(accounts)))
    done, retries, failures = [0] * clients, [0] * clients, []

    def client(k):
        rng = random.Random(k)
        try:
            with connect() as conn:
                for _ in range(transfers):
                    a, b = rng.sample(range(accounts), 2)
                    while True:
                        try:
                            with conn.transaction():
                                conn.execute("UPDATE bank SET bal = bal - 1 WHERE id = %s", (a,))
                                conn.execute("UPDATE bank SET bal = bal + 1 WHERE id = %s", (b,))
                            break
                        except errors.SerializationFailure:
                            retries[k] += 1
                            time.sleep(rng.uniform(0, 0.02 * min(retries[k], 10)))
                    done[k] += 1
        except Exception as e:
            failures.append(repr(e))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    started = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    assert sum(done) == clients * transfers, done
    with connect(autocommit=True) as c:
        total, n = c.execute("SELECT sum(bal), count(*) FROM bank").fetchone()
        assert (total, n) == (accounts * start, accounts), (total, n)
    print(f"transfers {sum(done)} retries {sum(retries)} seconds {time.time() - started:.1f}", flush=True)


def results_stream():
    """A large result's first rows arrive while the rest is computed
    (psycopg's stream(): libpq's single-row mode)."""
    import time
    n = int(sys.argv[sys.argv.index("--rows") + 1]) if "--rows" in sys.argv else 2_000_000
    with connect(autocommit=True) as c:
        started = time.time()
        first = None
        rows = total = 0
        for (value,) in c.cursor().stream(f"SELECT value FROM range({n})"):
            if first is None:
                first = time.time() - started
            rows += 1
            total += value
        elapsed = time.time() - started
        assert rows == n and total == (n - 1) * n // 2, (rows, total)
        assert first < elapsed / 4, f"the first row came after {first:.2f} s of {elapsed:.2f} s"
        print(f"rows {rows} first {first:.3f} s total {elapsed:.2f} s", flush=True)


# The type matrix: (SQL type, a value, the value PostgreSQL gives back).
TYPES = [
    ("BOOLEAN", True, True),
    ("SMALLINT", -32768, -32768),
    ("INT", 2147483647, 2147483647),
    ("BIGINT", -9223372036854775808, -9223372036854775808),
    ("REAL", 1.5, 1.5),
    ("DOUBLE", 0.1, 0.1),
    ("DECIMAL(12,2)", decimal.Decimal("1234567890.12"), decimal.Decimal("1234567890.12")),
    ("DECIMAL(28,8)", decimal.Decimal("12345678901234567890.01234567"), decimal.Decimal("12345678901234567890.01234567")),
    ("VARCHAR", "it's \\ \t \u00e9", "it's \\ \t \u00e9"),
    ("DATE", datetime.date(2024, 2, 29), datetime.date(2024, 2, 29)),
    ("TIMESTAMP", datetime.datetime(2024, 2, 29, 12, 34, 56, 789000), datetime.datetime(2024, 2, 29, 12, 34, 56, 789000)),
    ("TIME", datetime.time(12, 34, 56, 789000), datetime.time(12, 34, 56, 789000)),
    ("BYTEA", b"\x00\xff'", b"\x00\xff'"),
]


def type_matrix():
    """Each type x (text result, binary result) x (text parameter, binary
    parameter, a literal) x NULL: the value and the reported type as
    PostgreSQL answers them. Collects every mismatch, then fails listing all."""
    bad = []
    with connect(autocommit=True) as c:
        columns = ", ".join(f"c{i} {t}" for i, (t, _, _) in enumerate(TYPES))
        c.execute(f"CREATE TABLE matrix (id INT NOT NULL, {columns})")
        marks = ", ".join("%s" for _ in TYPES)
        c.execute(f"INSERT INTO matrix VALUES (1, {marks})", [v for _, v, _ in TYPES])
        c.execute(f"INSERT INTO matrix (id) VALUES (2)")
        for binary in (False, True):
            cur = c.cursor(binary=binary)
            row = cur.execute(f"SELECT {', '.join(f'c{i}' for i in range(len(TYPES)))} FROM matrix WHERE id = %s", (1,)).fetchone()
            for (t, _, want), got in zip(TYPES, row):
                if got != want or type(got) is not type(want):
                    bad.append(f"{t} {'binary' if binary else 'text'} result: {got!r}, want {want!r}")
            nulls = cur.execute(f"SELECT {', '.join(f'c{i}' for i in range(len(TYPES)))} FROM matrix WHERE id = 2").fetchone()
            if any(v is not None for v in nulls):
                bad.append(f"NULLs {'binary' if binary else 'text'}: {nulls!r}")
            for i, (t, value, want) in enumerate(TYPES):
                # A parameter compared with the column, and returned as itself.
                for fmt in ("%s", "%t", "%b"):
                    try:
                        got = cur.execute(f"SELECT {fmt}, count(*) FROM matrix WHERE c{i} = {fmt}", (value, value)).fetchone()
                        if got[1] != 1 or got[0] != want:
                            bad.append(f"{t} {fmt} parameter ({'binary' if binary else 'text'} result): {got!r}")
                    except Exception as e:
                        bad.append(f"{t} {fmt} parameter: {type(e).__name__}: {e}")
        # COPY: the rows written back in text and CSV, read again.
        import csv
        import io
        def csv_value(v):
            if v is None:
                return None
            if isinstance(v, bool):
                return "t" if v else "f"
            if isinstance(v, bytes):
                return "\\x" + v.hex()
            return str(v)
        for fmt in ("text", "csv"):
            c.execute(f"CREATE TABLE matrix_{fmt} AS SELECT * FROM matrix WHERE id < 0")
            with c.cursor().copy(f"COPY matrix_{fmt} FROM STDIN (FORMAT {fmt})") as copy:
                if fmt == "text":
                    copy.write_row([1] + [v for _, v, _ in TYPES])
                    copy.write_row([2] + [None for _ in TYPES])
                else:
                    out = io.StringIO()
                    w = csv.writer(out, lineterminator="\n")
                    w.writerow([1] + [csv_value(v) for _, v, _ in TYPES])
                    w.writerow([2] + [None for _ in TYPES])
                    copy.write(out.getvalue())
            for i, (t, _, _) in enumerate(TYPES):
                same = c.execute(f"SELECT count(*) FROM matrix m JOIN matrix_{fmt} x ON m.id = x.id WHERE m.c{i} = x.c{i} OR (m.c{i} IS NULL AND x.c{i} IS NULL)").fetchone()
                if same != (2,):
                    got = c.execute(f"SELECT c{i} FROM matrix_{fmt} ORDER BY id").fetchall()
                    bad.append(f"COPY {fmt} {t}: {got!r}")
    assert not bad, "\n".join(bad)


CASES = [
    binary_and_text_results_agree,
    first_statement_with_parameters_in_autocommit,
    repeated_expression_names,
    untyped_parameters_keep_their_types,
    session_settings,
    statement_timeout_stops_a_statement,
    copy_csv_follows_postgres,
    transaction_errors_carry_postgres_codes,
    failed_logins_look_alike,
    named_cursors_page_a_large_result,
    concurrent_transfers_retry_on_serialization_failure,
    type_matrix,
    results_stream,
]

if __name__ == "__main__":
    run_cases(CASES, sys.argv[5:])
