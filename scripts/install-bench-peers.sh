#!/usr/bin/env bash
# Installs the peer engines that `blobhouse bench tpch` compares against, each
# pinned, from PyPI (driven by scripts/tpch-peers.py):
#   - DuckDB and its httpfs extension as a wheel, so the extension is loaded
#     offline by file path (no download at run time);
#   - DataFusion-Python (Apache DataFusion with its object_store S3 client).
# Idempotent: skips what is already installed at the pinned version.
set -euo pipefail

DUCKDB_VERSION="1.5.5"       # must match the extension wheels
DATAFUSION_VERSION="55.0.0"  # DataFusion-Python

pkgs=()

if ! python3 -c "import duckdb; assert duckdb.__version__ == '$DUCKDB_VERSION'" 2>/dev/null; then
  pkgs+=("duckdb==$DUCKDB_VERSION")
fi

# The extension wheel has no __version__ of its own: ask pip's metadata.
if ! python3 - "$DUCKDB_VERSION" <<'EOF' 2>/dev/null
import sys
from importlib.metadata import version
import duckdb_extension_httpfs  # noqa: F401  (the module must import, too)
assert version("duckdb-extension-httpfs") == sys.argv[1]
EOF
then
  pkgs+=("duckdb-extension-httpfs==$DUCKDB_VERSION")
fi

if ! python3 -c "import datafusion; assert datafusion.__version__ == '$DATAFUSION_VERSION'" 2>/dev/null; then
  pkgs+=("datafusion==$DATAFUSION_VERSION")
fi

if [ "${#pkgs[@]}" -gt 0 ]; then
  echo "install-bench-peers: installing ${pkgs[*]}" >&2
  python3 -m pip install --quiet --disable-pip-version-check "${pkgs[@]}"
fi
echo "install-bench-peers: duckdb $DUCKDB_VERSION (+httpfs) and datafusion $DATAFUSION_VERSION ready" >&2
