#!/usr/bin/env python3
"""What Iceberg metadata costs per commit, beside blobhouse's own metadata
(issue 47): the objects (one PUT each) and bytes a statement adds under
iceberg/ against those it adds for blobhouse itself (versions, manifests,
deletion vectors, data objects), on a local database.

    iceberg-cost.py BLOBHOUSE_BINARY DB_DIR

DB_DIR must hold TPC-H (`blobhouse load tpch --sf 1 --db DB_DIR`). Runs a
1-row INSERT and a 1-row DELETE on lineitem, each in its own process, and
prints a table. Each process also reads back the table's newest Iceberg
metadata once (1 LIST, 2 GETs); a long-running process (serve, a Python
connection) keeps it in memory and reads nothing.
"""
import pathlib
import subprocess
import sys


def files(db: pathlib.Path) -> dict[str, int]:
    return {str(p.relative_to(db)): p.stat().st_size for p in db.rglob("*") if p.is_file()}


def kind(path: str) -> str:
    if path.startswith("iceberg/"):
        return "iceberg"
    if path.endswith(".parquet"):
        return "data"
    return "blobhouse metadata"


def main() -> None:
    binary, db = sys.argv[1], pathlib.Path(sys.argv[2])
    statements = [
        ("1-row INSERT into lineitem", "INSERT INTO lineitem SELECT * FROM lineitem WHERE l_orderkey = 1 AND l_linenumber = 1"),
        ("1-row DELETE from lineitem", "DELETE FROM lineitem WHERE l_orderkey = 7 AND l_linenumber = 1"),
    ]
    print(f"| statement | blobhouse metadata objects | bytes | Iceberg objects | bytes | data objects | bytes |")
    print(f"|---|---:|---:|---:|---:|---:|---:|")
    for label, sql in statements:
        before = files(db)
        subprocess.run([binary, "sql", "--db", str(db), "-c", sql], check=True, capture_output=True)
        after = files(db)
        new = {p: s for p, s in after.items() if p not in before}
        sums = {k: [0, 0] for k in ("blobhouse metadata", "iceberg", "data")}
        for p, s in new.items():
            sums[kind(p)][0] += 1
            sums[kind(p)][1] += s
        b, i, d = sums["blobhouse metadata"], sums["iceberg"], sums["data"]
        print(f"| {label} | {b[0]} | {b[1]:,} | {i[0]} | {i[1]:,} | {d[0]} | {d[1]:,} |")
        for p in sorted(new):
            print(f"|   {p} | | {new[p]:,} | | | | |", file=sys.stderr)


if __name__ == "__main__":
    main()
