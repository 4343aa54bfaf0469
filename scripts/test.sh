#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs MinIO (pinned, via
# go install) and the Python oracle packages, then runs every test — the
# storage and SQL tests against a local directory and against MinIO, which the
# harness starts on 127.0.0.1 and kills when the tests exit.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-test-deps.sh
export PATH="$(go env GOPATH)/bin:$PATH"
cargo test --workspace --locked "$@"
