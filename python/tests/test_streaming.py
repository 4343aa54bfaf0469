"""Results stream: a 10-million-row result consumed by pyarrow, Polars and
DuckDB through ``__arrow_c_stream__`` never sits in the Python process
whole. Each consumer runs in a fresh process (stream_rss.py); the process's
peak resident set may grow by a small part of the result while it is
consumed — the batches in flight and the allocator's slack — never by the
result. The figures go to the test's output (``pytest -s``) and into
docs/python.md."""

import json
import pathlib
import subprocess
import sys

import pytest

ROWS = 10_000_000
SCRIPT = pathlib.Path(__file__).with_name("stream_rss.py")


@pytest.mark.parametrize("consumer", ["pyarrow", "polars", "duckdb"])
def test_a_large_result_streams_through_each_consumer(consumer):
    out = subprocess.run([sys.executable, str(SCRIPT), consumer, str(ROWS)], check=True, capture_output=True, text=True, timeout=600)
    m = json.loads(out.stdout)
    assert m["rows"] == ROWS and m["checksum"] == ROWS * (ROWS + 1) // 2
    print(
        f"{consumer}: result {m['result_bytes'] / 2**20:.0f} MiB, peak RSS growth {m['peak_growth'] / 2**20:.1f} MiB "
        f"({m['peak_growth'] / m['result_bytes']:.1%} of the result)"
        + (f", largest batch {m['largest_batch'] / 2**10:.0f} KiB over {m['batches']} batches" if m["batches"] else "")
    )
    # Holding the whole result would grow the process by result_bytes.
    assert m["peak_growth"] < 0.05 * m["result_bytes"], m
