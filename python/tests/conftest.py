"""Fixtures of the Python package's tests: a TPC-H SF 0.01 database loaded
by the ``blobhouse`` command (the same data and reference answers as the
Rust suite), and the paths of the repository's queries and answers."""

import os
import pathlib
import socket
import subprocess
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
QUERIES = REPO / "crates" / "bench" / "tpch" / "queries"
ANSWERS = REPO / "crates" / "bench" / "tpch" / "answers" / "sf0.01"


def blobhouse_binary() -> pathlib.Path:
    """The ``blobhouse`` command: $BLOBHOUSE_BIN, else the dev build in
    $CARGO_TARGET_DIR (default ~/.cache/blobhouse-target, as .ci/run), built by scripts/test.sh before these tests."""
    if os.environ.get("BLOBHOUSE_BIN"):
        return pathlib.Path(os.environ["BLOBHOUSE_BIN"])
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", pathlib.Path.home() / ".cache" / "blobhouse-target"))
    binary = target / "debug" / "blobhouse"
    assert binary.exists(), f"{binary} is missing: build it with `cargo build -p blobhouse`, or set BLOBHOUSE_BIN"
    return binary


@pytest.fixture(scope="session")
def tpch_db(tmp_path_factory) -> str:
    """A TPC-H SF 0.01 database in a temporary directory."""
    db = tmp_path_factory.mktemp("tpch") / "sf0.01"
    subprocess.run([str(blobhouse_binary()), "load", "tpch", "--sf", "0.01", "--db", str(db)], check=True, capture_output=True)
    return str(db)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(child: subprocess.Popen, port: int, what: str, within: float = 30) -> None:
    """Waits until `child` (a `blobhouse` process) accepts connections on
    `port`; fails naming `what` if it exits or takes longer than `within`
    seconds."""
    started = time.monotonic()
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert child.poll() is None, f"{what} exited with {child.returncode}"
            assert time.monotonic() - started < within, f"{what} did not listen within {within:.0f} s"
            time.sleep(0.05)
