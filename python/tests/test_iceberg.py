"""Other engines read blobhouse tables as Apache Iceberg tables
(docs/interop.md): DuckDB 1.5.5's iceberg extension and pyiceberg 0.12,
pointed at the metadata path SHOW TABLES gives, see the 22 TPC-H answers
of SF 0.01, no deleted row after DELETE and UPDATE, and an older version
through their own time travel."""

import json
import pathlib
import subprocess
import sys

import pytest

import blobhouse
from conftest import ANSWERS, QUERIES, blobhouse_binary, free_port, wait_listening

TABLES = ["customer", "lineitem", "nation", "orders", "part", "partsupp", "region", "supplier"]
READER = pathlib.Path(__file__).with_name("iceberg_reader.py")


def load(tmp_path_factory, name: str) -> str:
    db = tmp_path_factory.mktemp(name) / "sf0.01"
    subprocess.run([str(blobhouse_binary()), "load", "tpch", "--sf", "0.01", "--db", str(db)], check=True, capture_output=True)
    return str(db)


def queries() -> list[str]:
    return [(QUERIES / f"q{n:02}.sql").read_text() for n in range(1, 23)]


def metadata_paths(con) -> dict[str, str]:
    return {name: path for name, path in con.sql("SHOW TABLES").fetchall()}


def duckdb(tables: dict, sql: list[str], tmp_path, rest=None) -> list[dict]:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"tables": tables, "queries": sql, "rest": rest}))
    run = subprocess.run([sys.executable, str(READER), str(spec)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"DuckDB failed (exit {run.returncode}): {run.stderr[-3000:]}"
    return json.loads(run.stdout)["results"]


def same(a, b) -> bool:
    """Equal as TPC-H compares answers: numbers within 0.01 absolute or
    1e-6 relative, text after trimming, NULL as empty."""
    a = "" if a is None else str(a).strip()
    b = "" if b is None else str(b).strip()
    if a == b or {a, b} <= {"", "NULL"}:
        return True
    try:
        x, y = float(a), float(b)
    except ValueError:
        return False
    return abs(x - y) <= 0.01 or abs(x - y) <= 1e-6 * abs(y)


def text(v) -> str | None:
    if v is None:
        return None
    return v.isoformat() if hasattr(v, "isoformat") else str(v)


def assert_same_rows(n: int, ours: list, theirs: list) -> None:
    assert len(ours) == len(theirs), f"Q{n}: blobhouse has {len(ours)} rows, the other engine {len(theirs)}"
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert len(a) == len(b), f"Q{n} row {i + 1}: {a} vs {b}"
        for j, (x, y) in enumerate(zip(a, b)):
            assert same(x, y), f"Q{n} row {i + 1} column {j + 1}: blobhouse {x!r}, the other engine {y!r}"


def reference(n: int) -> list[list[str]]:
    lines = (ANSWERS / f"q{n:02}.csv").read_text().splitlines()
    return [line.split("|") for line in lines[1:]]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    return load(tmp_path_factory, "iceberg")


def test_show_tables_names_each_tables_iceberg_metadata(loaded):
    con = blobhouse.connect(loaded, autocommit=True)
    paths = metadata_paths(con)
    assert sorted(paths) == TABLES
    for name, path in paths.items():
        assert path and path.startswith("file://") and path.endswith(".metadata.json"), f"{name}: {path}"
        assert pathlib.Path(path.removeprefix("file://")).exists(), path
        metadata = json.loads(pathlib.Path(path.removeprefix("file://")).read_text())
        assert metadata["format-version"] == 2 and metadata["properties"]["blobhouse.table"] == name
    con.close()


def test_duckdb_reads_the_22_tpch_answers_through_iceberg_metadata(loaded, tmp_path):
    con = blobhouse.connect(loaded, autocommit=True)
    paths = metadata_paths(con)
    results = duckdb({n: {"metadata": p} for n, p in paths.items()}, queries(), tmp_path)
    for n, r in enumerate(results, start=1):
        assert_same_rows(n, reference(n), r["rows"])
    con.close()


def test_pyiceberg_reads_every_table_by_its_metadata_path(loaded):
    from pyiceberg.table import StaticTable

    con = blobhouse.connect(loaded, autocommit=True)
    for name, path in metadata_paths(con).items():
        table = StaticTable.from_metadata(path).scan().to_arrow()
        count = con.execute(f"SELECT count(*) FROM {name}").fetchone()[0]
        assert table.num_rows == count, f"{name}: pyiceberg {table.num_rows} rows, blobhouse {count}"
        assert table.column_names == [d[0] for d in con.execute(f"SELECT * FROM {name} LIMIT 0").description]
    con.close()


@pytest.fixture(scope="module")
def changed(tmp_path_factory):
    """A second database, changed by DELETE and UPDATE after the load:
    (path, the version before the changes)."""
    db = load(tmp_path_factory, "iceberg-dml")
    con = blobhouse.connect(db, autocommit=True)
    before = con.execute("SHOW VERSIONS 1").fetchone()[0]
    con.execute("DELETE FROM lineitem WHERE l_orderkey % 7 = 0")
    con.execute("UPDATE orders SET o_totalprice = o_totalprice + 1, o_comment = 'updated' WHERE o_orderkey % 5 = 0")
    con.execute("DELETE FROM customer WHERE c_custkey % 11 = 0")
    con.execute("DELETE FROM lineitem WHERE l_shipmode = 'AIR' AND l_orderkey % 3 = 0")
    con.close()
    return db, before


def test_after_delete_and_update_duckdb_sees_no_deleted_row(changed, tmp_path):
    db, _ = changed
    con = blobhouse.connect(db, autocommit=True)
    paths = metadata_paths(con)
    sql = queries() + [
        "SELECT count(*), sum(l_quantity), min(l_orderkey % 7), count(*) FILTER (WHERE l_shipmode = 'AIR' AND l_orderkey % 3 = 0) FROM lineitem",
        "SELECT count(*), sum(o_totalprice), count(*) FILTER (WHERE o_comment = 'updated') FROM orders",
        "SELECT count(*), min(c_custkey % 11) FROM customer",
    ]
    ours = [[[text(v) for v in row] for row in con.execute(q).fetchall()] for q in sql]
    assert ours[22][0][2] == "1" and ours[22][0][3] == "0", ours[22]
    theirs = duckdb({n: {"metadata": p} for n, p in paths.items()}, sql, tmp_path)
    for n, (a, b) in enumerate(zip(ours, theirs), start=1):
        assert_same_rows(n, a, b["rows"])
    con.close()


def test_an_older_version_through_duckdbs_time_travel_has_the_answers_before_the_changes(changed, tmp_path):
    db, before = changed
    con = blobhouse.connect(db, autocommit=True)
    tables = {}
    for name, path in metadata_paths(con).items():
        metadata = json.loads(pathlib.Path(path.removeprefix("file://")).read_text())
        # The table's snapshot current at blobhouse version `before`.
        snapshot = max(s["snapshot-id"] for s in metadata["snapshots"] if s["snapshot-id"] <= before)
        tables[name] = {"metadata": path, "snapshot": snapshot}
    results = duckdb(tables, queries(), tmp_path)
    for n, r in enumerate(results, start=1):
        assert_same_rows(n, reference(n), r["rows"])
    con.close()


def test_after_delete_pyiceberg_sees_no_deleted_row_now_and_every_row_before(changed):
    from pyiceberg.table import StaticTable

    db, before = changed
    con = blobhouse.connect(db, autocommit=True)
    path = metadata_paths(con)["lineitem"]
    table = StaticTable.from_metadata(path)
    # Every column, strings included: the objects tell other Arrow readers
    # plain `string` (pyarrow 26 cannot apply deletes to `string_view`).
    now = table.scan().to_arrow()
    count, quantity = con.execute("SELECT count(*), sum(l_quantity) FROM lineitem").fetchone()
    assert now.num_rows == count
    assert float(sum(now.column("l_quantity").to_pylist())) == pytest.approx(float(quantity))
    assert all(k % 7 != 0 for k in now.column("l_orderkey").to_pylist())
    assert not any(m == "AIR" and k % 3 == 0 for m, k in zip(now.column("l_shipmode").to_pylist(), now.column("l_orderkey").to_pylist()))
    orders = StaticTable.from_metadata(metadata_paths(con)["orders"]).scan().to_arrow()
    assert orders.column("o_comment").to_pylist().count("updated") == con.execute("SELECT count(*) FROM orders WHERE o_comment = 'updated'").fetchone()[0]
    snapshot = max(s.snapshot_id for s in table.metadata.snapshots if s.snapshot_id <= before)
    old = table.scan(snapshot_id=snapshot, selected_fields=("l_orderkey",)).to_arrow()
    assert old.num_rows == con.execute(f"SELECT count(*) FROM lineitem AT(VERSION => {before})").fetchone()[0]
    con.close()


@pytest.fixture
def served(changed):
    """`blobhouse serve` on the changed database, its HTTP listener (and
    so its Iceberg REST catalog) behind a bearer token."""
    import os

    db, before = changed
    http = free_port()
    env = dict(os.environ, CATALOG_TOKEN="s3cret-token")
    child = subprocess.Popen(
        [str(blobhouse_binary()), "serve", "--db", db, "--pg-listen", f"127.0.0.1:{free_port()}", "--flight-listen", "off",
         "--metrics-listen", f"127.0.0.1:{http}", "--metrics-token-env", "CATALOG_TOKEN"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    wait_listening(child, http, "blobhouse serve", within=60)
    yield db, before, f"http://127.0.0.1:{http}"
    child.kill()
    child.wait()


def test_the_rest_catalog_serves_duckdb_the_tables_now_and_before(served, tmp_path):
    db, before, endpoint = served
    con = blobhouse.connect(db, autocommit=True)
    rest = {"endpoint": endpoint, "warehouse": "blobhouse", "token": "s3cret-token", "namespace": "public"}
    sql = queries() + ["SELECT count(*), sum(l_quantity) FROM lineitem", "SELECT count(*) FROM orders WHERE o_comment = 'updated'"]
    ours = [[[text(v) for v in row] for row in con.execute(q).fetchall()] for q in sql]
    theirs = duckdb({name: {} for name in TABLES}, sql, tmp_path, rest=rest)
    for n, (a, b) in enumerate(zip(ours, theirs), start=1):
        assert_same_rows(n, a, b["rows"])
    # DuckDB's AT (VERSION => …) on an attached table is blobhouse's version.
    paths = metadata_paths(con)
    old = {}
    for name, path in paths.items():
        metadata = json.loads(pathlib.Path(path.removeprefix("file://")).read_text())
        old[name] = {"snapshot": max(s["snapshot-id"] for s in metadata["snapshots"] if s["snapshot-id"] <= before)}
    results = duckdb(old, queries(), tmp_path, rest=rest)
    for n, r in enumerate(results, start=1):
        assert_same_rows(n, reference(n), r["rows"])
    con.close()


def test_the_rest_catalog_serves_pyiceberg_and_refuses_without_the_token(served):
    import urllib.error
    import urllib.request

    from pyiceberg.catalog.rest import RestCatalog

    db, _, endpoint = served
    catalog = RestCatalog("blobhouse", uri=endpoint, token="s3cret-token")
    assert catalog.list_namespaces() == [("public",)]
    assert sorted(t[1] for t in catalog.list_tables("public")) == TABLES
    con = blobhouse.connect(db, autocommit=True)
    nation = catalog.load_table("public.nation").scan().to_arrow()
    assert nation.num_rows == con.execute("SELECT count(*) FROM nation").fetchone()[0] == 25
    orders = catalog.load_table("public.orders").scan().to_arrow()
    count, total = con.execute("SELECT count(*), sum(o_totalprice) FROM orders").fetchone()
    assert orders.num_rows == count
    assert float(sum(orders.column("o_totalprice").to_pylist())) == pytest.approx(float(total))
    con.close()
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{endpoint}/v1/namespaces")
    assert refused.value.code == 401
    request = urllib.request.Request(f"{endpoint}/v1/namespaces/public/tables/nope", headers={"Authorization": "Bearer s3cret-token"})
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(request)
    assert missing.value.code == 404
    assert json.loads(missing.value.read())["error"]["type"] == "NoSuchTableException"


def test_after_vacuum_duckdb_reads_every_retained_version(tmp_path_factory, tmp_path):
    db = load(tmp_path_factory, "iceberg-vacuum")
    con = blobhouse.connect(db, autocommit=True)
    con.execute("DELETE FROM lineitem WHERE l_orderkey % 5 = 0")
    con.execute("CREATE SNAPSHOT kept")
    kept = con.execute("SHOW VERSIONS 1").fetchone()[0]
    con.execute("UPDATE lineitem SET l_quantity = l_quantity + 1 WHERE l_orderkey % 3 = 0")
    con.execute("DELETE FROM orders WHERE o_orderkey % 4 = 0")
    iceberg = pathlib.Path(db) / "iceberg"
    before = {p for p in iceberg.rglob("*") if p.is_file()}
    con.execute("VACUUM RETAIN '0 seconds' GRACE '0 seconds'")
    after = {p for p in iceberg.rglob("*") if p.is_file()}
    assert after < before, "VACUUM deleted no Iceberg metadata"
    sql = queries() + ["SELECT count(*), sum(l_quantity) FROM lineitem", "SELECT count(*) FROM orders"]
    paths = metadata_paths(con)
    # The newest version.
    ours = [[[text(v) for v in row] for row in con.execute(q).fetchall()] for q in sql]
    theirs = duckdb({n: {"metadata": p} for n, p in paths.items()}, sql, tmp_path)
    for n, (a, b) in enumerate(zip(ours, theirs), start=1):
        assert_same_rows(n, a, b["rows"])
    # The snapshot's version, which VACUUM keeps.
    tables = {}
    for name, path in paths.items():
        metadata = json.loads(pathlib.Path(path.removeprefix("file://")).read_text())
        tables[name] = {"metadata": path, "snapshot": max(s["snapshot-id"] for s in metadata["snapshots"] if s["snapshot-id"] <= kept)}
    at_snapshot = [q.replace("lineitem", "lineitem AT(SNAPSHOT => 'kept')").replace("orders", "orders AT(SNAPSHOT => 'kept')") for q in sql[-2:]]
    ours = [[[text(v) for v in row] for row in con.execute(q).fetchall()] for q in at_snapshot]
    theirs = duckdb(tables, sql[-2:], tmp_path)
    for n, (a, b) in enumerate(zip(ours, theirs), start=1):
        assert_same_rows(n, a, b["rows"])
    assert ours[0] != [[text(v) for v in row] for row in con.execute(sql[-2]).fetchall()], "the snapshot should differ from now"
    con.close()


def test_format_3_deletion_vectors_and_nanosecond_timestamps_read_in_duckdb_and_pyiceberg(tmp_path_factory, tmp_path):
    """ALTER DATABASE SET iceberg = v3: deletes as Puffin deletion vectors
    (blobhouse's Roaring bitmaps), TIMESTAMP as timestamp_ns."""
    from pyiceberg.table import StaticTable

    db = load(tmp_path_factory, "iceberg-v3")
    con = blobhouse.connect(db, autocommit=True)
    rows = con.execute("ALTER DATABASE SET iceberg = v3").fetchall()
    assert sorted(r[0] for r in rows) == TABLES and all(r[1] for r in rows), rows
    before = con.execute("SHOW VERSIONS 1").fetchone()[0]
    con.execute("DELETE FROM lineitem WHERE l_orderkey % 7 = 0")
    con.execute("UPDATE orders SET o_comment = 'updated' WHERE o_orderkey % 5 = 0")
    con.execute("CREATE TABLE events (id BIGINT NOT NULL, happened TIMESTAMP, note VARCHAR)")
    con.execute("INSERT INTO events VALUES (1, '2026-01-02 03:04:05.123456789', 'a'), (2, NULL, 'b'), (3, '1999-12-31 23:59:59', 'c')")
    con.execute("DELETE FROM events WHERE id = 2")
    paths = metadata_paths(con)
    for name, path in paths.items():
        metadata = json.loads(pathlib.Path(path.removeprefix("file://")).read_text())
        assert metadata["format-version"] == 3 and "next-row-id" in metadata, name
    assert list(pathlib.Path(db, "iceberg").rglob("*.puffin")), "no deletion vector was written"
    sql = queries() + [
        "SELECT count(*), sum(l_quantity), min(l_orderkey % 7) FROM lineitem",
        "SELECT count(*) FILTER (WHERE o_comment = 'updated'), count(*) FROM orders",
        "SELECT id, CAST(happened AS VARCHAR), note FROM events ORDER BY id",
    ]
    ours = [[[text(v) for v in row] for row in con.execute(q).fetchall()] for q in sql[:-1]]
    ours.append([["1", "2026-01-02 03:04:05.123456789", "a"], ["3", "1999-12-31 23:59:59", "c"]])
    theirs = duckdb({n: {"metadata": p} for n, p in paths.items()}, sql, tmp_path)
    for n, (a, b) in enumerate(zip(ours, theirs), start=1):
        assert_same_rows(n, a, b["rows"])
    lineitem = StaticTable.from_metadata(paths["lineitem"])
    now = lineitem.scan().to_arrow()
    assert now.num_rows == con.execute("SELECT count(*) FROM lineitem").fetchone()[0]
    assert all(k % 7 != 0 for k in now.column("l_orderkey").to_pylist())
    snapshot = max(s.snapshot_id for s in lineitem.metadata.snapshots if s.snapshot_id <= before)
    assert lineitem.scan(snapshot_id=snapshot).to_arrow().num_rows == con.execute(f"SELECT count(*) FROM lineitem AT(VERSION => {before})").fetchone()[0]
    events = StaticTable.from_metadata(paths["events"]).scan().to_arrow()
    assert events.column("id").to_pylist() == [1, 3]
    assert str(events.column("happened").type) == "timestamp[ns]"
    con.close()
