#!/usr/bin/env bash
# The test command: formatting, lints, and every test in the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/setup.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
