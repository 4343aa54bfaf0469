#!/usr/bin/env python3
"""Runs SQL in DuckDB directly on the Parquet data objects of a blobhouse
database in a local directory — an independent engine reading blobhouse's
objects with its own Parquet reader.

    duckdb-oracle.py DB_DIR QUERY.sql [QUERY.sql ...]

Every table of the database's newest version becomes a DuckDB view over its
data objects (found through the catalog and manifest, see
docs/storage-format.md). For each query file it prints a line `==> <file>`, a
header line and the result rows, values separated by '|'.
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
    if version.get("checkpoint") is not None:
        base = version_file(db_dir, version["checkpoint"])
        tables = {n: t["manifests"] for n, t in base["tables"].items() if n not in version.get("dropped", [])}
    for n, t in version["tables"].items():
        tables[n] = (tables.get(n, []) if t.get("extends_checkpoint") else []) + t["manifests"]
    return {n: [object_name(m["key"], "manifest.json") for m in ms] for n, ms in tables.items()}


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    db_dir = pathlib.Path(sys.argv[1])
    con = duckdb.connect()
    for name, manifests in newest_tables(db_dir).items():
        files = [str(db_dir / o["path"]) for m in manifests for o in json.loads((db_dir / m).read_text())["objects"]]
        if files:
            con.execute(f'CREATE VIEW "{name}" AS SELECT * FROM read_parquet({files!r})')
    for query in sys.argv[2:]:
        cur = con.execute(pathlib.Path(query).read_text())
        print(f"==> {query}")
        print("|".join(d[0] for d in cur.description))
        for row in cur.fetchall():
            print("|".join(fmt(v) for v in row))


if __name__ == "__main__":
    main()
