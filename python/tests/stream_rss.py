"""Measures what a consumer of a blobhouse result holds: runs in a fresh
process, streams a result of ROWS rows into one consumer (pyarrow, Polars
or DuckDB, each through ``__arrow_c_stream__``), and prints JSON with the
result's size and the process's peak resident set growth while it was
consumed (the kernel's VmHWM, reset just before: /proc/self/clear_refs).

    python3 python/tests/stream_rss.py pyarrow 10000000
"""

import json
import sys

QUERY = "SELECT value AS id, value * 0.5 AS amount, concat('row-', value % 1000) AS label FROM generate_series(1, {rows})"


def rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def main(consumer: str, rows: int) -> dict:
    import pyarrow as pa

    import blobhouse

    con = blobhouse.connect("memory://", autocommit=True, threads=2, cache_memory="0")
    query = QUERY.format(rows=rows)
    # Warm every library and the engine once, on a small result.
    consume(consumer, con.sql(QUERY.format(rows=100_000)), pa)
    stats = {"largest_batch": 0, "batches": 0}
    before = rss_kib("VmRSS")
    reset_peak()
    total, checksum = consume(consumer, con.sql(query), pa, stats)
    peak = rss_kib("VmHWM")
    assert total == rows, (total, rows)
    # The whole result's Arrow size, measured on one batch and scaled.
    sample = con.sql(QUERY.format(rows=100_000)).arrow()
    whole = sample.nbytes * rows // sample.num_rows
    return {
        "consumer": consumer,
        "rows": rows,
        "checksum": checksum,
        "result_bytes": whole,
        "rss_before": before * 1024,
        "peak_growth": max(0, peak - before) * 1024,
        "largest_batch": stats["largest_batch"],
        "batches": stats["batches"],
    }


def consume(consumer, relation, pa, stats=None):
    if consumer == "pyarrow":
        reader = pa.RecordBatchReader.from_stream(relation)
        total, checksum = 0, 0
        for batch in reader:
            total += batch.num_rows
            checksum += pa.compute.sum(batch.column(0)).as_py() or 0
            if stats is not None:
                stats["largest_batch"] = max(stats["largest_batch"], batch.nbytes)
                stats["batches"] += 1
        return total, checksum
    if consumer == "polars":
        import polars as pl

        out = pl.scan_arrow_c_stream(relation).select(pl.len(), pl.col("id").sum()).collect(engine="streaming")
        return int(out.item(0, 0)), int(out.item(0, 1))
    if consumer == "duckdb":
        import duckdb

        total, checksum = duckdb.sql("SELECT count(*), sum(id) FROM relation").fetchone()
        return int(total), int(checksum)
    raise SystemExit(f"unknown consumer {consumer}: pyarrow, polars or duckdb")


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]))))
