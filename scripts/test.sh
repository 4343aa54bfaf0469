#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs MinIO and
# fake-gcs-server (pinned, via go install), Azurite (pinned, npm) and the
# Python oracle and client packages, then runs every test — the storage and
# SQL tests against a local directory, MinIO, Azurite and fake-gcs-server,
# which the harness starts on 127.0.0.1 and kills when the tests exit — and
# then builds the Python package (python/, from this workspace) into this
# machine's python3 and runs its pytest suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-test-deps.sh
export PATH="$(go env GOPATH)/bin:$PATH"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace --locked "$@" 2>&1 | tee "$log" || status=$?
# The Python package: `pip install ./python` as a user runs it, on the dev
# profile (the release default would rebuild the engine optimised, ~30 min
# on 2 cores). Its tests use the `blobhouse` command cargo test just built.
echo "building the Python package (pip install ./python) …"
if MATURIN_PEP517_ARGS="--profile dev" python3 -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps ./python 2>&1 | tee -a "$log"; then
  python3 -m pytest python/tests -q -p no:cacheprovider 2>&1 | tee -a "$log" || status=$?
else
  echo "the Python package did not build" | tee -a "$log"
  status=1
fi
# One total over all test binaries and the pytest suite.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed;?$/) p += $(i-1); if ($i ~ /^failed;?$/) f += $(i-1) } }
     / passed| failed/ && / in [0-9.]+s/ && !/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed,?$/) p += $(i-1); if ($i ~ /^failed,?$/) f += $(i-1) } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
exit "$status"
