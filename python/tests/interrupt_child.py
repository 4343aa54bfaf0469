"""A Python process that a test interrupts: runs a statement that takes
minutes, through MODE (fetch: DB-API fetchall; pyarrow: a
pyarrow.RecordBatchReader pulling the stream; s3: a fetch of a scan of
table `big` of the S3 database URL given second, read through the download
manager), and reports as JSON when KeyboardInterrupt arrived, the CPU the
process used in the second after (the statement stopped, so ~0), the bytes
received on loopback in the second before and after (downloads stop), and
whether the connection still works."""

import json
import sys
import threading
import time

import blobhouse

LONG = "SELECT count(*), sum(value % 7) FROM generate_series(1, 100000000000)"
# Cheap per row: the scan is bound by its downloads.
SCAN = "SELECT count(*), sum(length(s)) FROM big"


def bytes_read() -> int:
    """Bytes received on loopback, where the test's S3 server is (the
    download manager's socket reads are not in /proc/self/io)."""
    with open("/proc/net/dev") as f:
        return next(int(line.split(":", 1)[1].split()[0]) for line in f if line.strip().startswith("lo:"))


samples: list = []


def sample() -> None:
    while True:
        samples.append((time.monotonic(), bytes_read()))
        time.sleep(0.05)


def read_between(start: float, end: float) -> int:
    inside = [b for t, b in samples if start <= t <= end]
    return inside[-1] - inside[0] if len(inside) > 1 else 0


mode = sys.argv[1]
if mode == "s3":
    con = blobhouse.connect(sys.argv[2], autocommit=True, threads=1, cache_memory="0", create=False)
else:
    con = blobhouse.connect("memory://", autocommit=True, threads=2)
threading.Thread(target=sample, daemon=True).start()
print("ready", flush=True)
try:
    if mode == "fetch":
        con.execute(LONG).fetchall()
    elif mode == "s3":
        con.execute(SCAN).fetchall()
    elif mode == "pyarrow":
        import pyarrow as pa

        try:
            pa.RecordBatchReader.from_stream(con.sql(LONG)).read_all()
        except pa.ArrowException:
            # pyarrow reports the stopped stream as its own error; the
            # interrupt is raised right after.
            time.sleep(0.5)
    print(json.dumps({"finished": True}), flush=True)
except KeyboardInterrupt:
    at = time.monotonic()
    cpu = time.process_time()
    time.sleep(1.1)
    cpu_after = time.process_time() - cpu
    print(
        json.dumps(
            {
                "interrupted_at": at,
                "cpu_after": cpu_after,
                "read_before": read_between(at - 1.0, at),
                "read_after": read_between(at + 0.05, at + 1.05),
                "usable": con.execute("SELECT 42").fetchone()[0],
            }
        ),
        flush=True,
    )
