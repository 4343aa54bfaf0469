"""Fixtures of the Python package's tests: a TPC-H SF 0.01 database loaded
by the ``blobhouse`` command (the same data and reference answers as the
Rust suite), and the paths of the repository's queries and answers."""

import os
import pathlib
import subprocess

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
