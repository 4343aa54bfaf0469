"""Runs SQL in DuckDB 1.5.5 over blobhouse tables read as Iceberg tables
by DuckDB's iceberg extension (loaded by path from the PyPI wheels, no
network) — the other engine of the Iceberg tests, in its own process
because a manifest it cannot read may abort it.

    iceberg_reader.py SPEC.json

SPEC: {"tables": {name: {"metadata": path, "snapshot": id or null}},
       "rest": null or {"endpoint": url, "warehouse": w, "token": t or null},
       "queries": [sql, ...]}
Each table becomes a view over ``iceberg_scan(metadata[, snapshot_from_id])``
or, with "rest", over the table of the attached REST catalog. Prints one JSON
object: {"results": [{"columns": [...], "rows": [[text, ...], ...]}, ...]}.
"""
import datetime
import decimal
import glob
import importlib
import json
import os
import sys

import duckdb


def extension(name: str) -> str:
    module = importlib.import_module(f"duckdb_extension_{name}")
    found = glob.glob(os.path.join(os.path.dirname(module.__file__), "**", f"{name}.duckdb_extension"), recursive=True)
    if not found:
        sys.exit(f"duckdb-extension-{name} has no {name}.duckdb_extension file")
    return found[0]


def text(v):
    if v is None:
        return None
    if isinstance(v, (datetime.date, datetime.datetime)):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return str(v)
    return str(v)


def main() -> None:
    spec = json.load(open(sys.argv[1]))
    con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    con.execute(f"LOAD '{extension('avro')}'")
    con.execute(f"LOAD '{extension('iceberg')}'")
    rest = spec.get("rest")
    if rest:
        con.execute(f"LOAD '{extension('httpfs')}'")
        auth = f"TOKEN '{rest['token']}'" if rest.get("token") else "AUTHORIZATION_TYPE 'none'"
        con.execute(f"ATTACH '{rest['warehouse']}' AS cat (TYPE iceberg, ENDPOINT '{rest['endpoint']}', {auth})")
    for name, t in spec["tables"].items():
        if rest:
            at = f" AT (VERSION => {t['snapshot']})" if t.get("snapshot") else ""
            source = f"cat.{rest['namespace']}.{name}{at}"
        else:
            snap = f", snapshot_from_id = {t['snapshot']}" if t.get("snapshot") else ""
            source = f"iceberg_scan('{t['metadata']}'{snap})"
        con.execute(f"CREATE VIEW {name} AS SELECT * FROM {source}")
    results = []
    for sql in spec["queries"]:
        cur = con.execute(sql)
        columns = [d[0] for d in cur.description]
        rows = [[text(v) for v in row] for row in cur.fetchall()]
        results.append({"columns": columns, "rows": rows})
    print(json.dumps({"results": results}))


if __name__ == "__main__":
    main()
