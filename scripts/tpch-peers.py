#!/usr/bin/env python3
"""Runs TPC-H queries on peer engines (DuckDB, DataFusion) for
`blobhouse bench tpch`, reading the same Parquet objects from the same
S3-compatible endpoint as blobhouse.

    python3 scripts/tpch-peers.py SPEC.json

Why a long-lived runner driven over stdin/stdout: the Rust benchmark
interleaves blobhouse and the peers query by query (blobhouse q1, duckdb q1,
datafusion q1, blobhouse q2, ...), so that every engine sees the same state
of the machine and of the endpoint (MinIO, possibly behind a toxiproxy that
adds latency) at nearly the same time, and no engine pays Python's or its own
start-up inside a timing. Every engine reads remote objects only: nothing is
copied to local disk and the caches of remote data and metadata that can be
turned off are turned off, so a repeated query pays its round trips again, as
blobhouse's remote-only runs do.

SPEC.json:

    {"endpoint": "http://127.0.0.1:9000", "bucket": "bh", "region": "us-east-1",
     "local": false,           # true: the keys are local file paths, no endpoint
     "memory_limit_bytes": 4294967296,   # optional: each engine's memory limit
     "access_key": "...", "secret_key": "...",
     "queries_dir": ".../crates/bench/tpch/queries",   # q01.sql ... q22.sql
     "engines": ["duckdb", "datafusion"],
     "threads": 2,
     "tables": {"lineitem": {"prefix": "peers/lineitem/",
                             "keys": ["peers/lineitem/0.parquet", ...]}, ...}}

Protocol (one line each way, stdout flushed after every line; nothing else is
written to stdout -- logs, warnings and anything a native library prints go
to stderr):

    runner:  ERR setup <engine> <message>     an engine could not be set up
                                              (the others still are)
    runner:  READY                            setup finished
    bench:   RUN <engine> <n>                 run query n (1-22) on engine
    runner:  OK <engine> <n> <seconds> <rows> <peak_rss>
                                              seconds with 6 decimals: the
                                              whole query file, from sending
                                              the SQL to having fetched every
                                              result row into Arrow; peak_rss:
                                              this process's peak resident set
                                              during it, in bytes (the kernel's
                                              VmHWM, reset before the query
                                              through /proc/self/clear_refs; 0
                                              where that is not available).
                                              Run one engine per process for a
                                              peak that is that engine's alone.
    runner:  ERR <engine> <n> <message>       the query failed (message on
                                              one line)
    bench:   QUIT  (or end of input)          the runner exits 0

An unrecognised line is answered `ERR - - <message>`. A query file may hold
several statements (e.g. CREATE VIEW; SELECT; DROP VIEW): they run in order,
the whole file is timed, and the rows counted are those of the last query
(SELECT/WITH/VALUES) statement. If such a file fails, its DROP statements are
still tried, so the next run starts clean.

With "local": true the keys are paths of local Parquet files (and each
prefix a local directory): DuckDB reads them with read_parquet() without
httpfs, DataFusion registers each prefix as a listing table; endpoint,
bucket and keys' credentials are then not used. "memory_limit_bytes" sets
DuckDB's memory_limit and DataFusion's datafusion.runtime.memory_limit.

Engines:

  duckdb      DuckDB with the httpfs extension loaded by file path from the
              `duckdb-extension-httpfs` wheel (no autoinstall or autoload, so
              nothing is downloaded). One S3 secret (path-style URLs, SSL only
              for an https endpoint), `threads` = spec threads, and one view
              per table over read_parquet() of the explicit s3:// URLs of its
              keys. Caching off: enable_external_file_cache = false (DuckDB
              1.5 keeps Parquet bytes read from remote files in memory by
              default), enable_http_metadata_cache = false,
              parquet_metadata_cache = false. Left as they are: HTTP
              keep-alive (connections, not data) and the Parquet prefetching
              within one query.

  datafusion  DataFusion-Python (55): a SessionContext with target_partitions
              = spec threads, the bucket registered as an
              datafusion.object_store.AmazonS3 store (path-style, allow_http)
              under s3://<bucket>, and one listing table per table
              (register_listing_table over s3://<bucket>/<prefix>, files
              ending in .parquet). Caching off, through SET of the runtime
              settings: datafusion.runtime.metadata_cache_limit = 0 (Parquet
              footers and page indexes, 50M by default),
              datafusion.runtime.list_files_cache_limit = 0 (object listings
              of a table's prefix), datafusion.runtime.file_statistics_cache_limit
              = 0 (per-file statistics), so every query lists the prefix and
              reads the footers again. Could not turn off / left as is: the
              table's schema, inferred once at registration (as any catalog
              would hold it); statistics collection itself
              (datafusion.execution.collect_statistics stays true: the join
              planner needs it, it is recomputed per query since its cache is
              off); HTTP connection pooling of the object store client; and
              the size of the Tokio runtime DataFusion-Python creates (one
              worker per core, not settable from Python -- the parallelism of
              a query is bounded by target_partitions).
"""
import json
import os
import pathlib
import sys
import time
import traceback
import urllib.parse

ENGINES = ("duckdb", "datafusion")


def log(msg):
    print(f"tpch-peers: {msg}", file=sys.stderr, flush=True)


def one_line(exc):
    text = f"{type(exc).__name__}: {exc}"
    text = " ".join(text.split())
    return text[:1000] if len(text) > 1000 else text


def sql_str(value):
    return "'" + str(value).replace("'", "''") + "'"


def split_statements(sql):
    """Splits SQL text on ';' outside quotes and comments; drops empty ones."""
    out, cur, i, n = [], [], 0, len(sql)
    while i < n:
        c = sql[i]
        if c in ("'", '"'):
            j = i + 1
            while j < n:
                if sql[j] == c:
                    if j + 1 < n and sql[j + 1] == c:  # doubled quote
                        j += 2
                        continue
                    break
                j += 1
            cur.append(sql[i:j + 1])
            i = j + 1
        elif sql.startswith("--", i):
            j = sql.find("\n", i)
            j = n if j < 0 else j
            cur.append(sql[i:j])
            i = j
        elif sql.startswith("/*", i):
            j = sql.find("*/", i + 2)
            j = n if j < 0 else j + 2
            cur.append(sql[i:j])
            i = j
        elif c == ";":
            out.append("".join(cur))
            cur = []
            i += 1
        else:
            cur.append(c)
            i += 1
    out.append("".join(cur))
    return [s.strip() for s in out if strip_comments(s).strip()]


def strip_comments(stmt):
    """The statement without leading/trailing comments, for classifying it."""
    s = stmt.strip()
    while True:
        if s.startswith("--"):
            j = s.find("\n")
            s = "" if j < 0 else s[j + 1:].lstrip()
        elif s.startswith("/*"):
            j = s.find("*/")
            s = "" if j < 0 else s[j + 2:].lstrip()
        else:
            return s


def first_word(stmt):
    s = strip_comments(stmt).lstrip("(").split(None, 1)
    return s[0].upper() if s else ""


def is_query(stmt):
    return first_word(stmt) in ("SELECT", "WITH", "VALUES", "FROM", "TABLE")


def reset_peak_rss():
    """Starts a new peak resident set (Linux: "5" to clear_refs resets VmHWM)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss():
    """This process's peak resident set in bytes (VmHWM), 0 if unknown."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class DuckDB:
    name = "duckdb"

    def __init__(self, spec):
        import duckdb

        self.con = duckdb.connect(config={
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
        })
        con = self.con
        con.execute(f"SET threads = {int(spec['threads'])}")
        con.execute("SET enable_progress_bar = false")
        if spec.get("memory_limit_bytes"):
            con.execute(f"SET memory_limit = '{int(spec['memory_limit_bytes']) >> 20}MiB'")
        if spec.get("local"):
            # The same Parquet files blobhouse reads, from the local disk.
            for table, entry in spec["tables"].items():
                files = ", ".join(sql_str(k) for k in entry["keys"])
                con.execute(f'CREATE VIEW "{table}" AS SELECT * FROM read_parquet([{files}])')
            return
        import glob
        import duckdb_extension_httpfs

        ext_dir = os.path.dirname(duckdb_extension_httpfs.__file__)
        found = sorted(glob.glob(os.path.join(ext_dir, "extensions", "*", "httpfs.duckdb_extension")))
        if not found:
            raise RuntimeError(f"no httpfs.duckdb_extension under {ext_dir}/extensions")
        con.execute(f"LOAD {sql_str(found[-1])}")
        ep = urllib.parse.urlsplit(spec["endpoint"])
        if ep.scheme not in ("http", "https") or not ep.netloc:
            raise ValueError(f"endpoint {spec['endpoint']!r} is not an http(s) URL")
        con.execute(
            "CREATE SECRET bench_s3 (TYPE s3"
            f", KEY_ID {sql_str(spec['access_key'])}"
            f", SECRET {sql_str(spec['secret_key'])}"
            f", REGION {sql_str(spec.get('region') or 'us-east-1')}"
            f", ENDPOINT {sql_str(ep.netloc)}"
            ", URL_STYLE 'path'"
            f", USE_SSL {'true' if ep.scheme == 'https' else 'false'})"
        )
        # Remote-only: no cache of remote data or metadata across queries.
        con.execute("SET enable_external_file_cache = false")
        con.execute("SET enable_http_metadata_cache = false")
        con.execute("SET parquet_metadata_cache = false")
        bucket = spec["bucket"]
        for table, entry in spec["tables"].items():
            keys = entry.get("keys") or []
            if not keys:
                raise ValueError(f"table {table} has no keys")
            urls = ", ".join(sql_str(f"s3://{bucket}/{k}") for k in keys)
            con.execute(f'CREATE VIEW "{table}" AS SELECT * FROM read_parquet([{urls}])')

    def run(self, stmt, query):
        cur = self.con.execute(stmt)
        if query:
            return cur.to_arrow_table().num_rows
        try:
            cur.fetchall()
        except Exception:  # statements without a result set
            pass
        return None


class DataFusion:
    name = "datafusion"

    def __init__(self, spec):
        from datafusion import RuntimeEnvBuilder, SessionConfig, SessionContext
        from datafusion.object_store import AmazonS3

        threads = int(spec["threads"])
        config = SessionConfig().with_target_partitions(threads).with_information_schema(True)
        self.ctx = SessionContext(config, RuntimeEnvBuilder())
        ctx = self.ctx
        # Remote-only: no cache of listings, footers or statistics across queries.
        for key in ("metadata_cache_limit", "list_files_cache_limit", "file_statistics_cache_limit"):
            ctx.sql(f"SET datafusion.runtime.{key} = '0'").collect()
        if spec.get("memory_limit_bytes"):
            limit = f"{int(spec['memory_limit_bytes']) >> 20}M"
            ctx.sql(f"SET datafusion.runtime.memory_limit = {sql_str(limit)}").collect()
        if spec.get("local"):
            for table, entry in spec["tables"].items():
                ctx.register_listing_table(table, entry["prefix"], file_extension=".parquet")
            return
        ep = urllib.parse.urlsplit(spec["endpoint"])
        if ep.scheme not in ("http", "https") or not ep.netloc:
            raise ValueError(f"endpoint {spec['endpoint']!r} is not an http(s) URL")
        bucket = spec["bucket"]
        store = AmazonS3(
            bucket_name=bucket,
            region=spec.get("region") or "us-east-1",
            access_key_id=spec["access_key"],
            secret_access_key=spec["secret_key"],
            endpoint=spec["endpoint"].rstrip("/"),
            allow_http=ep.scheme == "http",
        )
        ctx.register_object_store("s3://", store, bucket)
        for table, entry in spec["tables"].items():
            prefix = entry["prefix"].lstrip("/")
            if not prefix.endswith("/"):
                prefix += "/"
            ctx.register_listing_table(table, f"s3://{bucket}/{prefix}", file_extension=".parquet")
        settings = dict(
            (r["name"], r["value"])
            for r in ctx.sql(
                "SELECT name, value FROM information_schema.df_settings"
                " WHERE name LIKE 'datafusion.runtime.%cache%'"
                " OR name = 'datafusion.execution.target_partitions'"
            ).to_pylist()
        )
        log(f"datafusion settings: {settings}")

    def run(self, stmt, query):
        batches = self.ctx.sql(stmt).collect()
        if query:
            return sum(b.num_rows for b in batches)
        return None


def run_file(engine, statements):
    rows = 0
    start = time.perf_counter()
    try:
        for stmt in statements:
            n = engine.run(stmt, is_query(stmt))
            if n is not None:
                rows = n
    except Exception:
        for stmt in statements:  # leave no view of a half-run file behind
            if first_word(stmt) == "DROP":
                try:
                    engine.run(stmt, False)
                except Exception:
                    pass
        raise
    return time.perf_counter() - start, rows


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    # The protocol owns the real stdout; everything else that writes to
    # fd 1 (Python or native code) goes to stderr.
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def say(line):
        proto.write(line + "\n")
        proto.flush()

    spec = json.loads(pathlib.Path(sys.argv[1]).read_text())
    queries_dir = pathlib.Path(spec["queries_dir"])
    queries = {}
    for n in range(1, 23):
        path = queries_dir / f"q{n:02d}.sql"
        try:
            queries[n] = split_statements(path.read_text())
        except OSError as e:
            queries[n] = e

    engines, setup_errors = {}, {}
    for name in spec.get("engines") or list(ENGINES):
        try:
            if name == "duckdb":
                engines[name] = DuckDB(spec)
            elif name == "datafusion":
                engines[name] = DataFusion(spec)
            else:
                raise ValueError(f"unknown engine {name!r} (known: {', '.join(ENGINES)})")
            log(f"{name} ready")
        except Exception as e:
            traceback.print_exc(file=sys.stderr)
            setup_errors[name] = one_line(e)
            say(f"ERR setup {name} {setup_errors[name]}")
    say("READY")

    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "QUIT":
            break
        if words[0] != "RUN" or len(words) != 3:
            say(f"ERR - - unknown command: {' '.join(words)[:200]}")
            continue
        name, num = words[1], words[2]
        try:
            n = int(num)
            if n not in queries:
                raise ValueError(f"no TPC-H query {num} (1-22)")
            if isinstance(queries[n], Exception):
                raise queries[n]
            if name not in engines:
                if name in setup_errors:
                    raise RuntimeError(f"engine {name} failed setup: {setup_errors[name]}")
                raise RuntimeError(f"engine {name} is not in the spec's engines")
            reset_peak_rss()
            secs, rows = run_file(engines[name], queries[n])
            rss = peak_rss()
        except Exception as e:
            log(f"{name} q{num} failed")
            traceback.print_exc(file=sys.stderr)
            say(f"ERR {name} {num} {one_line(e)}")
            continue
        say(f"OK {name} {n} {secs:.6f} {rows} {rss}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
