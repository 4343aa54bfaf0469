#!/usr/bin/env bash
# Installs what the tests and the testbed need beyond cargo, each pinned:
#   - MinIO (S3 API) and toxiproxy (connection shaping), built with `go install`;
#   - Azurite (Azure Blob Storage's emulator, npm) and Azure's Python client;
#   - fake-gcs-server (GCS emulator), built with `go install`;
#   - boto3 (MinIO STS credentials for the credential-chain fakes);
#   - moto's server (AWS KMS on loopback for encrypted databases) and
#     cryptography (the pyarrow test unwraps the database key with it);
#   - nginx (plain HTTP range server), a TrueType font for the benchmark
#     plots and iproute2 (network namespace and tbf of the bottleneck
#     profile), from Debian;
#   - DuckDB and its TPC-H extension, the external correctness oracle (PyPI);
#   - psql (Debian's postgresql-client), psycopg, asyncpg, SQLAlchemy and ADBC's
#     Flight SQL driver with pyarrow (PyPI), pgjdbc (Maven Central): the
#     real clients of the server tests;
#   - pandas, Polars, dbapi-compliance, nbclient, ipykernel and matplotlib
#     (PyPI): the Python package's tests.
# Idempotent: skips what is already there.
set -euo pipefail

MINIO_VERSION="v0.0.0-20260212201848-7aac2a2c5b7c"   # last commit of the community repo
TOXIPROXY_VERSION="v2.5.0"                             # newest /v2 the module proxy serves
DUCKDB_VERSION="1.5.5"                                 # must match the extension wheels
PSYCOPG_VERSION="3.3.9"
ADBC_VERSION="1.13.0"       # adbc-driver-flightsql and adbc-driver-manager
PYARROW_VERSION="26.0.1"
SQLALCHEMY_VERSION="2.1.9"

GOBIN="${GOBIN:-$(go env GOPATH)/bin}"
export GOBIN
if [ ! -x "$GOBIN/minio" ]; then
  echo "install-test-deps: building MinIO $MINIO_VERSION with go install (takes ~5 min on 2 cores)" >&2
  go install "github.com/minio/minio@$MINIO_VERSION"
fi

TOXIPROXY_DIR="$HOME/.cache/blobhouse-tools/toxiproxy"
if [ ! -x "$TOXIPROXY_DIR/server" ]; then
  echo "install-test-deps: building toxiproxy $TOXIPROXY_VERSION with go install" >&2
  GOBIN="$TOXIPROXY_DIR" go install "github.com/Shopify/toxiproxy/v2/cmd/server@$TOXIPROXY_VERSION"
fi

if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ] || [ ! -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || ! command -v openssl >/dev/null 2>&1 || ! command -v tc >/dev/null 2>&1; then
  echo "install-test-deps: installing nginx-light, fonts-dejavu-core, openssl and iproute2 (ip, tc: the bottleneck profile) from Debian" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends nginx-light fonts-dejavu-core openssl iproute2 >/dev/null
fi

FAKE_GCS_VERSION="v1.56.1"      # GCS emulator; the suite puts a loopback proxy in front (crates/testkit/src/gcs.rs)
FAKE_GCS_DIR="$HOME/.cache/blobhouse-tools/fake-gcs"
if [ ! -x "$FAKE_GCS_DIR/fake-gcs-server" ]; then
  echo "install-test-deps: building fake-gcs-server $FAKE_GCS_VERSION with go install" >&2
  GOBIN="$FAKE_GCS_DIR" go install "github.com/fsouza/fake-gcs-server@$FAKE_GCS_VERSION"
fi
BOTO3_VERSION="1.43.11"         # STS for the fake container-credentials endpoint (tests of credential chains)
if ! python3 -c "import boto3; assert boto3.__version__ == '$BOTO3_VERSION'" 2>/dev/null; then
  echo "install-test-deps: installing boto3==$BOTO3_VERSION (gets temporary credentials from MinIO's STS in the credential tests)" >&2
  python3 -m pip install --quiet --disable-pip-version-check "boto3==$BOTO3_VERSION"
fi
MOTO_VERSION="5.2.1"            # AWS KMS fake (moto_server) for the KMS key provider's tests
if ! python3 -c "import moto, flask, cryptography; assert moto.__version__ == '$MOTO_VERSION'" 2>/dev/null || ! command -v moto_server >/dev/null; then
  echo "install-test-deps: installing moto[server]==$MOTO_VERSION (AWS KMS on loopback for the encryption tests)" >&2
  python3 -m pip install --quiet --disable-pip-version-check "moto[server]==$MOTO_VERSION"
fi
AZURITE_VERSION="3.35.0"        # the newest that runs on Node.js 20 (3.36+ need 22)
AZURE_BLOB_PY_VERSION="12.31.1" # creates the test container (object_store has no container API)
AZURITE_DIR="$HOME/.cache/blobhouse-tools/azurite"
if [ ! -x "$AZURITE_DIR/node_modules/.bin/azurite-blob" ] || ! grep -q "\"version\": \"$AZURITE_VERSION\"" "$AZURITE_DIR/node_modules/azurite/package.json" 2>/dev/null; then
  echo "install-test-deps: installing Azurite $AZURITE_VERSION (Azure Blob Storage emulator) with npm" >&2
  mkdir -p "$AZURITE_DIR"
  (cd "$AZURITE_DIR" && npm install --no-audit --no-fund --loglevel=error "azurite@$AZURITE_VERSION" >/dev/null)
fi
if ! python3 -c "import azure.storage.blob as b; assert b.__version__ == '$AZURE_BLOB_PY_VERSION'" 2>/dev/null; then
  echo "install-test-deps: installing azure-storage-blob==$AZURE_BLOB_PY_VERSION (creates Azurite's test container)" >&2
  python3 -m pip install --quiet --disable-pip-version-check "azure-storage-blob==$AZURE_BLOB_PY_VERSION"
fi

if ! python3 -c "import duckdb, duckdb_extension_tpch; assert duckdb.__version__ == '$DUCKDB_VERSION'" 2>/dev/null; then
  echo "install-test-deps: installing duckdb==$DUCKDB_VERSION (oracle for TPC-H answers)" >&2
  python3 -m pip install --quiet --disable-pip-version-check \
    "duckdb==$DUCKDB_VERSION" "duckdb-extension-tpch==$DUCKDB_VERSION"
fi
if ! command -v psql >/dev/null 2>&1; then
  echo "install-test-deps: installing postgresql-client (psql) from Debian" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends postgresql-client >/dev/null
fi

if ! python3 -c "import psycopg; assert psycopg.__version__ == '$PSYCOPG_VERSION'" 2>/dev/null; then
  echo "install-test-deps: installing psycopg==$PSYCOPG_VERSION (server tests)" >&2
  python3 -m pip install --quiet --disable-pip-version-check "psycopg[binary]==$PSYCOPG_VERSION"
fi
ASYNCPG_VERSION="0.31.0"
if ! python3 -c "import asyncpg; assert asyncpg.__version__ == '$ASYNCPG_VERSION'" 2>/dev/null; then
  echo "install-test-deps: installing asyncpg==$ASYNCPG_VERSION (server tests: binary protocol)" >&2
  python3 -m pip install --quiet --disable-pip-version-check "asyncpg==$ASYNCPG_VERSION"
fi
if ! python3 -c "import adbc_driver_flightsql, pyarrow, sqlalchemy; assert adbc_driver_flightsql.__version__ == '$ADBC_VERSION' and pyarrow.__version__ == '$PYARROW_VERSION' and sqlalchemy.__version__ == '$SQLALCHEMY_VERSION'" 2>/dev/null; then
  echo "install-test-deps: installing adbc-driver-flightsql==$ADBC_VERSION, pyarrow==$PYARROW_VERSION, sqlalchemy==$SQLALCHEMY_VERSION (server tests)" >&2
  python3 -m pip install --quiet --disable-pip-version-check \
    "adbc-driver-flightsql==$ADBC_VERSION" "adbc-driver-manager==$ADBC_VERSION" "pyarrow==$PYARROW_VERSION" "sqlalchemy==$SQLALCHEMY_VERSION"
fi
# The Python package's tests (python/tests): DataFrames in and out (pandas,
# Polars), the DB-API 2.0 compliance suite (dbapi-compliance's dbapi20.py),
# and the quickstart notebook run by nbclient on an ipykernel, plotting with
# matplotlib. The package itself is built by scripts/test.sh.
PANDAS_VERSION="3.1.1"
POLARS_VERSION="2.1.0"
DBAPI_COMPLIANCE_VERSION="1.15.0"
NBCLIENT_VERSION="0.11.0"
NBFORMAT_VERSION="5.11.1"
IPYKERNEL_VERSION="7.4.0"
MATPLOTLIB_VERSION="3.11.2"
PYTEST_VERSION="9.2.0"
if ! python3 -c "import pandas, polars, dbapi20, nbclient, nbformat, ipykernel, matplotlib, pytest, importlib.metadata as m; assert (pandas.__version__, polars.__version__, m.version('dbapi-compliance'), nbclient.__version__, nbformat.__version__, ipykernel.__version__, matplotlib.__version__, pytest.__version__) == ('$PANDAS_VERSION', '$POLARS_VERSION', '$DBAPI_COMPLIANCE_VERSION', '$NBCLIENT_VERSION', '$NBFORMAT_VERSION', '$IPYKERNEL_VERSION', '$MATPLOTLIB_VERSION', '$PYTEST_VERSION')" 2>/dev/null; then
  echo "install-test-deps: installing pandas, Polars, dbapi-compliance, nbclient, ipykernel and matplotlib (Python package tests)" >&2
  python3 -m pip install --quiet --disable-pip-version-check "pandas==$PANDAS_VERSION" "polars==$POLARS_VERSION" \
    "dbapi-compliance==$DBAPI_COMPLIANCE_VERSION" "nbclient==$NBCLIENT_VERSION" "nbformat==$NBFORMAT_VERSION" \
    "ipykernel==$IPYKERNEL_VERSION" "matplotlib==$MATPLOTLIB_VERSION" "pytest==$PYTEST_VERSION"
fi
# Other engines reading blobhouse tables as Iceberg (issue 47): DuckDB's
# iceberg extension (with avro, and httpfs for REST catalogs), loaded by
# path from the PyPI wheels, and pyiceberg.
PYICEBERG_VERSION="0.12.0"
if ! python3 -c "import duckdb_extension_iceberg, duckdb_extension_avro, duckdb_extension_httpfs, pyiceberg; assert pyiceberg.__version__ == '$PYICEBERG_VERSION'" 2>/dev/null; then
  echo "install-test-deps: installing duckdb-extension-iceberg/avro/httpfs==$DUCKDB_VERSION and pyiceberg==$PYICEBERG_VERSION (Iceberg readers)" >&2
  python3 -m pip install --quiet --disable-pip-version-check "duckdb-extension-iceberg==$DUCKDB_VERSION" \
    "duckdb-extension-avro==$DUCKDB_VERSION" "duckdb-extension-httpfs==$DUCKDB_VERSION" "pyiceberg[pyarrow]==$PYICEBERG_VERSION"
fi
# pgjdbc (what DBeaver, DataGrip, Metabase and every JVM program use) for
# the JDBC conformance cases; they run it with `java` from the JDK.
PGJDBC_VERSION="42.7.14"
PGJDBC_JAR="$HOME/.m2/repository/org/postgresql/postgresql/$PGJDBC_VERSION/postgresql-$PGJDBC_VERSION.jar"
if ! command -v java >/dev/null 2>&1 || ! command -v mvn >/dev/null 2>&1; then
  echo "install-test-deps: installing a JDK and Maven from Debian (pgjdbc conformance cases)" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends default-jdk-headless maven >/dev/null
fi
if [ ! -f "$PGJDBC_JAR" ]; then
  echo "install-test-deps: fetching pgjdbc $PGJDBC_VERSION from Maven Central" >&2
  mvn -q dependency:get -Dartifact="org.postgresql:postgresql:$PGJDBC_VERSION" >/dev/null
fi
echo "install-test-deps: minio, toxiproxy, azurite $AZURITE_VERSION, fake-gcs-server $FAKE_GCS_VERSION, nginx, duckdb $DUCKDB_VERSION, psql, psycopg, ADBC, SQLAlchemy, pyiceberg, pgjdbc $PGJDBC_VERSION and the Python package's test tools ready" >&2
