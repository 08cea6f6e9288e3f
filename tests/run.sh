#!/usr/bin/env bash
# The test command: formatting, lints, and every test in the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/setup.sh
. deploy/env.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
# The NCCL backend of the data-parallel trainer compiles (and passes the
# shim's symbol check) here; it runs only where there is a GPU.
cargo build -p agl-trainer --features nccl
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace --no-fail-fast 2>&1 | tee "$log"
# One closing line for the whole run (cargo prints one per test binary,
# the last of which is often a crate's empty doc-test run).
awk '/^test result:/ { p += $4; f += $6; s += $8 } END { printf "%d passed, %d failed, %d skipped\n", p, f, s }' "$log"
