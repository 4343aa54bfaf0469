"""Ctrl-C and threads: SIGINT to a Python process running a long
statement raises KeyboardInterrupt within a second and stops the
statement (the process goes idle), the connection still works after; two
threads query at once, and other Python threads run meanwhile (the engine
works with the GIL released)."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

import blobhouse
from conftest import blobhouse_binary

CHILD = pathlib.Path(__file__).with_name("interrupt_child.py")


def interrupt(*args, env=None, after=1.5) -> tuple[dict, float]:
    """Runs interrupt_child.py with `args`, sends SIGINT `after` seconds
    into its statement; its report and the seconds until KeyboardInterrupt."""
    child = subprocess.Popen([sys.executable, str(CHILD), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout.readline().strip() == "ready", child.stderr.read()
        time.sleep(after)  # the statement is running
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    assert "interrupted_at" in report, f"the statement was not interrupted: {report} {err}"
    return report, report["interrupted_at"] - sent


@pytest.mark.parametrize("mode", ["fetch", "pyarrow"])
def test_ctrl_c_stops_the_statement_within_a_second(mode):
    report, latency = interrupt(mode)
    print(f"{mode}: KeyboardInterrupt {latency * 1000:.0f} ms after SIGINT; CPU in the next second {report['cpu_after']:.3f} s")
    assert latency < 1.0, report
    # The statement stopped: the process is idle, not computing on.
    assert report["cpu_after"] < 0.2, report
    assert report["usable"] == 42


def test_ctrl_c_stops_the_downloads_of_a_scan_on_s3(tmp_path):
    """The testbed's MinIO behind toxiproxy, each connection slowed to
    32 KB/s: a scan bound by its downloads is interrupted, and nothing more
    arrives on loopback (where MinIO is) in the second after."""
    testbed = tmp_path / "testbed"
    binary = str(blobhouse_binary())
    subprocess.run([binary, "testbed", "up", "lan", "--dir", str(testbed)], check=True, capture_output=True)
    try:
        url = f"s3://testbed/{tmp_path.name}"
        load = "CREATE TABLE big AS SELECT value AS k, concat('row-', value, '-', random()) AS s FROM generate_series(1, 300000)"
        subprocess.run([binary, "sql", "--db", url, "-c", load], check=True, capture_output=True, env=env_of_testbed(binary, testbed))
        # Through the proxy, slowed and with no failures injected.
        subprocess.run([binary, "testbed", "up", "s3", "--dir", str(testbed)], check=True, capture_output=True)
        api = f"http://127.0.0.1:{json.loads((testbed / 'state.json').read_text())['toxiproxy_api_port']}/proxies/minio/toxics"
        for toxic in json.load(urllib.request.urlopen(api)):
            if toxic["name"] != "bandwidth":
                urllib.request.urlopen(urllib.request.Request(f"{api}/{toxic['name']}", method="DELETE"))
        slow = json.dumps({"attributes": {"rate": 32}}).encode()
        urllib.request.urlopen(urllib.request.Request(f"{api}/bandwidth", data=slow, method="POST", headers={"Content-Type": "application/json"}))
        report, latency = interrupt("s3", url, env=env_of_testbed(binary, testbed), after=2.0)
    finally:
        subprocess.run([binary, "testbed", "down", "--dir", str(testbed)], capture_output=True)
    print(
        f"s3: KeyboardInterrupt {latency * 1000:.0f} ms after SIGINT; bytes received on loopback in the second before "
        f"{report['read_before']}, in the second after {report['read_after']}; CPU after {report['cpu_after']:.3f} s"
    )
    assert latency < 1.0, report
    assert report["read_before"] > 16 * 1024, f"the scan was not downloading when interrupted: {report}"
    assert report["read_after"] < 4 * 1024, f"downloads went on after the interrupt: {report}"
    assert report["cpu_after"] < 0.2, report
    assert report["usable"] == 42


def env_of_testbed(binary: str, testbed: pathlib.Path) -> dict:
    """This process's environment with the testbed's AWS_* settings."""
    exports = subprocess.run([binary, "testbed", "env", "--dir", str(testbed)], check=True, capture_output=True, text=True).stdout
    env = dict(os.environ)
    env.update(line.removeprefix("export ").split("=", 1) for line in exports.splitlines() if line.startswith("export "))
    return env


def test_two_threads_query_at_once_and_python_runs_meanwhile(tmp_path):
    url = str(tmp_path / "db")
    setup = blobhouse.connect(url, autocommit=True)
    setup.execute("CREATE TABLE t AS SELECT value AS x FROM generate_series(1, 1000)")
    setup.close()
    results, errors = {}, []
    ticks = 0
    stop = threading.Event()

    def ticker():
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.001)

    def query(name):
        try:
            con = blobhouse.connect(url, autocommit=True)
            results[name] = con.execute("SELECT count(*), sum(value % 3) FROM generate_series(1, 300000000)").fetchone()
            con.close()
        except Exception as e:  # reported below
            errors.append(e)

    t = threading.Thread(target=ticker)
    t.start()
    workers = [threading.Thread(target=query, args=(n,)) for n in ("a", "b")]
    started = time.monotonic()
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=300)
    elapsed = time.monotonic() - started
    stop.set()
    t.join()
    assert not errors, errors
    assert results == {"a": (300000000, 300000000), "b": (300000000, 300000000)}
    # With the GIL held by the engine the ticker would be starved.
    print(f"two queries in {elapsed:.1f} s; the Python ticker ran {ticks} times meanwhile")
    assert ticks > 100 * elapsed * 0.5, (ticks, elapsed)
