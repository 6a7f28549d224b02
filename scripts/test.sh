#!/usr/bin/env bash
# The whole test suite, as CI runs it: fetch what the tests need (the real
# models, cached outside the repo), then every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/fetch-models.sh
scripts/python-deps.sh
scripts/browser-deps.sh
scripts/fleet-deps.sh
cargo test --workspace --locked
scripts/test-arm.sh
