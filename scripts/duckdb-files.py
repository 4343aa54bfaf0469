#!/usr/bin/env python3
"""Files written and read by DuckDB, to check blobhouse's queries of files
in place against (crates/tests/tests/suite/files.rs).

    duckdb-files.py write DIR
        writes, under DIR:
          sales/year=Y/region=R/data_0.parquet  hive-partitioned (COPY … PARTITION_BY),
                                                3 years x 2 regions, 3,000 rows
          csv/part-1.csv, csv/part-2.csv        100 rows with a header (and csv/notes.txt,
                                                which a *.csv glob must not read)
          big.parquet                           400,000 rows in row groups of 20,000,
                                                ordered by id (row-group pruning)
    duckdb-files.py query DIR SQL [SQL ...]
        runs each SQL with {files} replaced by DIR and prints, per query, a
        line `==> <n>`, a header line and the rows, values separated by '|'.
"""
import pathlib
import sys

import duckdb


def fmt(v):
    if v is None:
        return "NULL"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def write(root):
    root.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect()
    con.execute(f"""
        COPY (SELECT i AS id, 2022 + i % 3 AS year, ['eu', 'us'][1 + i % 2] AS region,
                     (i * 7 % 1000) / 10.0 AS amount, 'item ' || i AS name
              FROM range(3000) t(i))
        TO '{root / "sales"}' (FORMAT parquet, PARTITION_BY (year, region))""")
    (root / "csv").mkdir(exist_ok=True)
    for n, (lo, hi) in enumerate([(0, 50), (50, 100)], start=1):
        con.execute(f"COPY (SELECT i AS id, i * 2 AS v, 'x' || i AS s FROM range({lo}, {hi}) t(i)) TO '{root / 'csv' / f'part-{n}.csv'}' (HEADER)")
    (root / "csv" / "notes.txt").write_text("not,a,data,file\n")
    con.execute(f"""
        COPY (SELECT i AS id, hash(i) AS payload FROM range(400000) t(i) ORDER BY i)
        TO '{root / "big.parquet"}' (FORMAT parquet, ROW_GROUP_SIZE 20000)""")


def query(root, statements):
    con = duckdb.connect()
    for n, sql in enumerate(statements):
        cur = con.execute(sql.replace("{files}", str(root)))
        print(f"==> {n}")
        print("|".join(d[0] for d in cur.description))
        for row in cur.fetchall():
            print("|".join(fmt(v) for v in row))


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in ("write", "query"):
        sys.exit(__doc__)
    root = pathlib.Path(sys.argv[2])
    if sys.argv[1] == "write":
        write(root)
    else:
        query(root, sys.argv[3:])


if __name__ == "__main__":
    main()
