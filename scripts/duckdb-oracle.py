#!/usr/bin/env python3
"""Runs SQL in DuckDB directly on the Parquet data objects of a blobhouse
database in a local directory — an independent engine reading blobhouse's
objects with its own Parquet reader.

    duckdb-oracle.py DB_DIR QUERY.sql [QUERY.sql ...]
    duckdb-oracle.py --script DB_DIR SCRIPT.sql

Every table of the database's newest version becomes a DuckDB view over its
data objects (found through the catalog and manifest, see
docs/storage-format.md). For each query file it prints a line `==> <file>`, a
header line and the result rows, values separated by '|'.

With --script the tables are copied into DuckDB tables instead, and the
statements of SCRIPT.sql (one per line) run in order; each prints `==> <n>`,
a header line and its rows (a DELETE, UPDATE or INSERT: the rows it changed;
BEGIN, COMMIT and ROLLBACK print nothing after the marker).

Tables with deleted rows are refused: this reader sees data objects as plain
Parquet and would show deleted rows (export with COPY … TO instead).
"""
import datetime
import decimal
import json
import pathlib
import sys

import duckdb


def fmt(v):
    if v is None:
        return "NULL"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (datetime.date, datetime.datetime)):
        return v.isoformat()
    return str(v)


M64 = (1 << 64) - 1


def object_name(key, ext):
    """objects/<hhhh>/<key:016x>.<ext>: hhhh is the top 16 bits of SplitMix64's finaliser of the key."""
    z = (key + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    z ^= z >> 31
    return f"objects/{z >> 48:04x}/{key:016x}.{ext}"


def version_file(db_dir, v):
    """Version v: log/<v // 1000:017>/<v:020>.json (format 2) or catalog/<v:020>.json."""
    for path in (db_dir / "log" / f"{v // 1000:017}" / f"{v:020}.json", db_dir / "catalog" / f"{v:020}.json"):
        if path.exists():
            return json.loads(path.read_text())
    sys.exit(f"{db_dir} has no version {v}")


def newest_tables(db_dir):
    """The newest version's tables, each with its list of manifest files."""
    buckets = sorted((db_dir / "log").glob("*"))
    names = sorted(buckets[-1].glob("*.json")) if buckets else sorted((db_dir / "catalog").glob("*.json"))
    if not names:
        sys.exit(f"{db_dir} has no committed catalog version")
    version = json.loads(names[-1].read_text())
    if version["format_version"] == 1:
        return {n: [t["manifest"]] for n, t in version["tables"].items()}
    tables = {}
    with_deletes = [n for n, t in version["tables"].items() if t.get("deletes") or t.get("removed")]
    if version.get("checkpoint") is not None:
        base = version_file(db_dir, version["checkpoint"])
        tables = {n: t["manifests"] for n, t in base["tables"].items() if n not in version.get("dropped", [])}
        with_deletes += [n for n, t in base["tables"].items() if (t.get("deletes") or t.get("removed")) and n in tables]
    if with_deletes:
        sys.exit(f"tables {sorted(set(with_deletes))} have deleted rows, which plain Parquet readers would show; export them with COPY (SELECT ...) TO")
    for n, t in version["tables"].items():
        tables[n] = (tables.get(n, []) if t.get("extends_checkpoint") else []) + t["manifests"]
    return {n: [object_name(m["key"], "manifest.json") for m in ms] for n, ms in tables.items()}


def open_tables(con, db_dir, kind):
    for name, manifests in newest_tables(db_dir).items():
        files = [str(db_dir / o["path"]) for m in manifests for o in json.loads((db_dir / m).read_text())["objects"]]
        if files:
            con.execute(f'CREATE {kind} "{name}" AS SELECT * FROM read_parquet({files!r})')


def print_result(marker, cur):
    print(f"==> {marker}")
    if cur.description is None:
        return
    print("|".join(d[0] for d in cur.description))
    for row in cur.fetchall():
        print("|".join(fmt(v) for v in row))


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    con = duckdb.connect()
    if sys.argv[1] == "--script":
        open_tables(con, pathlib.Path(sys.argv[2]), "TABLE")
        statements = [l for l in pathlib.Path(sys.argv[3]).read_text().splitlines() if l.strip()]
        for n, statement in enumerate(statements):
            print_result(n, con.execute(statement))
        return
    db_dir = pathlib.Path(sys.argv[1])
    open_tables(con, db_dir, "VIEW")
    for query in sys.argv[2:]:
        print_result(query, con.execute(pathlib.Path(query).read_text()))


if __name__ == "__main__":
    main()
