"""connect(workers=[…]): statements run on a `blobhouse worker` process,
with the answers of one process."""

import os
import subprocess

import pytest

import blobhouse
from conftest import blobhouse_binary, free_port, wait_listening

TOKEN = "python-cluster-test-token"


def cpu_ticks(pid: int) -> int:
    """The process's CPU time so far (user + system), in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


@pytest.fixture
def db(tmp_path) -> str:
    """Table t(x, k) in six data objects, so the scan has row groups to share."""
    url = str(tmp_path / "db")
    con = blobhouse.connect(url, autocommit=True)
    con.execute("CREATE TABLE t AS SELECT value AS x, value % 7 AS k FROM generate_series(1, 50000)")
    for i in range(1, 6):
        con.execute(f"INSERT INTO t SELECT value AS x, value % 7 AS k FROM generate_series({i * 50000 + 1}, {(i + 1) * 50000})")
    con.close()
    return url


@pytest.fixture
def worker(db):
    port = free_port()
    env = dict(os.environ, BLOBHOUSE_CLUSTER_TOKEN=TOKEN)
    child = subprocess.Popen(
        [str(blobhouse_binary()), "worker", "--db", db, "--listen", f"127.0.0.1:{port}", "--threads", "2", "--memory-limit", "1G"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_listening(child, port, "the worker")
    yield child, f"http://127.0.0.1:{port}"
    child.kill()
    child.wait()


def test_statements_run_on_the_workers_given(db, worker, monkeypatch):
    child, url = worker
    monkeypatch.setenv("BLOBHOUSE_CLUSTER_TOKEN", TOKEN)
    alone = blobhouse.connect(db, autocommit=True, threads=2)
    coordinator = blobhouse.connect(db, autocommit=True, threads=2, workers=[url])
    queries = [
        "SELECT k, count(*) AS n, sum(x) AS s FROM t GROUP BY k ORDER BY k",
        "SELECT count(*) FROM t AS l JOIN t AS r ON l.x = r.x + 1 WHERE l.k = 3",
    ]
    before = cpu_ticks(child.pid)
    for sql in queries:
        assert coordinator.sql(sql).fetchall() == alone.sql(sql).fetchall(), sql
    assert cpu_ticks(child.pid) > before, "the statements did not run on the worker"
    assert alone.sql(queries[0]).fetchall()[0] == (0, 42857, sum(x for x in range(1, 300001) if x % 7 == 0))
    coordinator.close()
    alone.close()


def test_a_worker_needs_the_token(db, worker, monkeypatch):
    _, url = worker
    monkeypatch.delenv("BLOBHOUSE_CLUSTER_TOKEN", raising=False)
    with pytest.raises(blobhouse.InterfaceError, match="BLOBHOUSE_CLUSTER_TOKEN"):
        blobhouse.connect(db, autocommit=True, workers=[url], threads=1)
