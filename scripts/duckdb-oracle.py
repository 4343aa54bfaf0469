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


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    db_dir = pathlib.Path(sys.argv[1])
    versions = sorted((db_dir / "catalog").glob("*.json"))
    if not versions:
        sys.exit(f"{db_dir} has no committed catalog version")
    catalog = json.loads(versions[-1].read_text())
    con = duckdb.connect()
    for name, entry in catalog["tables"].items():
        manifest = json.loads((db_dir / entry["manifest"]).read_text())
        files = [str(db_dir / o["path"]) for o in manifest["objects"]]
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
