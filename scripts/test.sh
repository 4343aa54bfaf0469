#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs MinIO and
# fake-gcs-server (pinned, via go install), Azurite (pinned, npm) and the
# Python oracle and client packages, then runs every test — the storage and
# SQL tests against a local directory, MinIO, Azurite and fake-gcs-server,
# which the harness starts on 127.0.0.1 and kills when the tests exit.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-test-deps.sh
export PATH="$(go env GOPATH)/bin:$PATH"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace --locked "$@" 2>&1 | tee "$log" || status=$?
# One total over all test binaries.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed;?$/) p += $(i-1); if ($i ~ /^failed;?$/) f += $(i-1) } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
exit "$status"
