"""Clients of `blobhouse bench serve`: psycopg (PostgreSQL wire) and ADBC
(Arrow Flight SQL) connections, each in its own thread, running TPC-H
queries against a blobhouse server and recording every statement.

Run by the benchmark with one argument, a JSON file:
  pg_port, flight_port, user, password   where and as whom to connect
  queries   {"1": "SELECT ...", ...}
  clients   [["psycopg", [1, 3, 6, ...]], ["adbc", [...]], ...]: each
            client's kind and the order it runs the queries in
  duration  seconds: each client starts statements until then, in a loop;
            0: each client runs its list once
Prints one JSON object: {"records": [...], "connect_errors": [...]}, a record
per statement: client, kind, query, start and seconds (from the start of the
run), rows (or null) and error (or null).
"""

import json
import sys
import threading
import time


def connect(kind, cfg):
    if kind == "psycopg":
        import psycopg

        c = psycopg.connect(host="127.0.0.1", port=cfg["pg_port"], user=cfg["user"], password=cfg["password"],
                            dbname="blobhouse", sslmode="disable", autocommit=True)

        def run(q):
            return len(c.execute(q).fetchall())

        return run
    if kind == "adbc":
        import adbc_driver_flightsql.dbapi as flight

        c = flight.connect(f"grpc://127.0.0.1:{cfg['flight_port']}",
                           db_kwargs={"username": cfg["user"], "password": cfg["password"]}, autocommit=True)
        cur = c.cursor()

        def run(q):
            cur.execute(q)
            return cur.fetch_arrow_table().num_rows

        return run
    raise ValueError(f"unknown client kind {kind}")


def main():
    cfg = json.load(open(sys.argv[1]))
    queries = cfg["queries"]
    records, connect_errors = [], []
    lock = threading.Lock()
    ready = threading.Barrier(len(cfg["clients"]) + 1)
    timing = {}

    def client(i, kind, order):
        try:
            run = connect(kind, cfg)
        except Exception as e:  # reported, and the client takes no part
            with lock:
                connect_errors.append(f"client {i} ({kind}): {e!r}")
            ready.wait()
            return
        ready.wait()
        base, deadline = timing["base"], timing["deadline"]
        k = 0
        while (k < len(order)) if cfg["duration"] == 0 else (time.perf_counter() < deadline):
            q = order[k % len(order)]
            k += 1
            t0 = time.perf_counter()
            rows, error = None, None
            try:
                rows = run(queries[str(q)])
            except Exception as e:
                error = repr(e)[:500]
            t1 = time.perf_counter()
            with lock:
                records.append({"client": i, "kind": kind, "query": q, "start": t0 - base,
                                "seconds": t1 - t0, "rows": rows, "error": error})

    threads = [threading.Thread(target=client, args=(i, kind, order)) for i, (kind, order) in enumerate(cfg["clients"])]
    for t in threads:
        t.start()
    timing["base"] = time.perf_counter()
    timing["deadline"] = timing["base"] + cfg["duration"]
    ready.wait()
    for t in threads:
        t.join()
    print(json.dumps({"records": records, "connect_errors": connect_errors}))


if __name__ == "__main__":
    main()
