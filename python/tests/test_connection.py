"""Connections: options, several databases in one process, transactions
mapped onto blobhouse's (autocommit off opens one), closing, and the
package's version being the engine's."""

import subprocess

import pytest

import blobhouse
from conftest import blobhouse_binary


def test_version_is_the_engines():
    out = subprocess.run([str(blobhouse_binary()), "--version"], check=True, capture_output=True, text=True).stdout
    assert out.split()[-1] == blobhouse.__version__


def test_autocommit_off_opens_a_transaction_that_commit_ends(tmp_path):
    url = str(tmp_path / "db")
    a = blobhouse.connect(url)
    b = blobhouse.connect(url, autocommit=True)
    a.execute("CREATE TABLE t (x BIGINT)")
    a.execute("INSERT INTO t VALUES (1), (2)")
    # Not committed: the other connection does not see the table.
    with pytest.raises(blobhouse.ProgrammingError):
        b.execute("SELECT * FROM t").fetchall()
    a.commit()
    assert b.execute("SELECT count(*) FROM t").fetchone() == (2,)
    a.execute("INSERT INTO t VALUES (3)")
    a.rollback()
    assert b.execute("SELECT count(*) FROM t").fetchone() == (2,)
    a.execute("DELETE FROM t WHERE x = 1")
    a.close()  # rolls back
    assert b.execute("SELECT count(*) FROM t").fetchone() == (2,)
    with blobhouse.connect(url) as c:
        c.execute("INSERT INTO t VALUES (4)")
    assert b.execute("SELECT count(*) FROM t").fetchone() == (3,)
    with pytest.raises(ZeroDivisionError):
        with blobhouse.connect(url) as c:
            c.execute("INSERT INTO t VALUES (5)")
            1 / 0
    assert b.execute("SELECT count(*) FROM t").fetchone() == (3,)
    b.close()


def test_several_databases_in_one_process(tmp_path):
    first = blobhouse.connect(str(tmp_path / "one"), autocommit=True)
    second = blobhouse.connect(str(tmp_path / "two"), autocommit=True)
    memory = blobhouse.connect(autocommit=True)
    for i, con in enumerate([first, second, memory]):
        con.execute(f"CREATE TABLE t AS SELECT {i} AS which")
    assert [c.execute("SELECT which FROM t").fetchone()[0] for c in (first, second, memory)] == [0, 1, 2]
    for con in (first, second, memory):
        con.close()


def test_closed_objects_refuse_work(tmp_path):
    con = blobhouse.connect(str(tmp_path / "db"), autocommit=True)
    cur = con.cursor()
    cur.close()
    with pytest.raises(blobhouse.InterfaceError, match="cursor is closed"):
        cur.execute("SELECT 1")
    con.close()
    with pytest.raises(blobhouse.InterfaceError, match="closed"):
        con.execute("SELECT 1")


def test_options_are_checked_by_name_and_value(tmp_path):
    with pytest.raises(blobhouse.InterfaceError, match="no option 'memroy_limit'"):
        blobhouse.connect(str(tmp_path / "db"), memroy_limit="1G")
    with pytest.raises(blobhouse.InterfaceError, match="memory_limit: 'lots' is not a size"):
        blobhouse.connect(str(tmp_path / "db"), memory_limit="lots")
    with pytest.raises(blobhouse.DatabaseError, match="cannot open database .*absent"):
        blobhouse.connect(str(tmp_path / "absent"), create=False)
    con = blobhouse.connect(str(tmp_path / "db"), autocommit=True, memory_limit="512M", threads=2, cache_dir=tmp_path / "ssd")
    assert con.execute("SHOW memory_limit").fetchone()[1].startswith("512")
    con.close()


def test_interrupted_transaction_and_errors_leave_the_connection_usable(tmp_path):
    con = blobhouse.connect(str(tmp_path / "db"))
    con.execute("CREATE TABLE t (x BIGINT)")
    with pytest.raises(blobhouse.ProgrammingError):
        con.execute("SELECT nope FROM t").fetchall()
    # A failed statement aborts the transaction, as in PostgreSQL.
    with pytest.raises(blobhouse.InternalError) as info:
        con.execute("SELECT 1").fetchall()
    assert info.value.sqlstate == "25P02"
    con.rollback()
    assert con.execute("SELECT 1").fetchone() == (1,)
    con.close()


def test_a_forked_child_is_told_to_connect_itself(tmp_path):
    import os

    con = blobhouse.connect(str(tmp_path / "db"), autocommit=True)
    con.execute("SELECT 1").fetchall()
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            con.execute("SELECT 1").fetchall()
        except blobhouse.InterfaceError as e:
            code = 0 if "forked" in str(e) and "spawn" in str(e) else 4
        except BaseException:
            code = 5
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0, os.WEXITSTATUS(status)
    assert con.execute("SELECT 2").fetchone() == (2,)
    con.close()


def test_the_engines_notices_arrive_as_python_warnings(tmp_path):
    con = blobhouse.connect(str(tmp_path / "db"), autocommit=True)
    con.execute("BEGIN")
    with pytest.warns(UserWarning, match="25001: there is already a transaction in progress"):
        con.execute("BEGIN")
    con.execute("ROLLBACK")
    # A table with a type Iceberg format 2 lacks is no failure: no warning.
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        con.execute("CREATE TABLE ev (at TIMESTAMP)")
        con.execute("INSERT INTO ev VALUES ('2026-01-01 00:00:00')")
    con.close()
