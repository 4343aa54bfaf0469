#!/usr/bin/env bash
# Installs what the test suite needs beyond cargo: the MinIO server (pinned, via
# `go install`) and the Python packages of the external correctness oracle
# (DuckDB with its TPC-H extension). Idempotent: skips what is already there.
set -euo pipefail

MINIO_VERSION="v0.0.0-20260212201848-7aac2a2c5b7c"   # last commit of the community repo
DUCKDB_VERSION="1.5.5"                                 # must match the extension wheels

GOBIN="${GOBIN:-$(go env GOPATH)/bin}"
export GOBIN
if [ ! -x "$GOBIN/minio" ]; then
  echo "install-test-deps: building MinIO $MINIO_VERSION with go install (takes ~5 min on 2 cores)" >&2
  go install "github.com/minio/minio@$MINIO_VERSION"
fi

if ! python3 -c "import duckdb, duckdb_extension_tpch; assert duckdb.__version__ == '$DUCKDB_VERSION'" 2>/dev/null; then
  echo "install-test-deps: installing duckdb==$DUCKDB_VERSION (oracle for TPC-H answers)" >&2
  python3 -m pip install --quiet --disable-pip-version-check \
    "duckdb==$DUCKDB_VERSION" "duckdb-extension-tpch==$DUCKDB_VERSION"
fi
echo "install-test-deps: minio at $GOBIN/minio; duckdb $DUCKDB_VERSION ready" >&2
