#!/usr/bin/env bash
# The test command: formatting, lints, and every test in the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/setup.sh
. deploy/env.sh
cargo fmt --all --check
# One build serves the lints and the tests: clippy's driver compiles the
# workspace's crates (lints on, warnings denied, as `cargo clippy
# --all-targets -- -D warnings` does) while the dependencies are built once,
# by rustc, for the tests. (`cargo clippy` would check every dependency
# again, ~15 minutes on 2 cores with an empty cache.) CLIPPY_ARGS is how
# cargo-clippy hands its arguments to the driver.
RUSTC_WORKSPACE_WRAPPER="$(rustc --print sysroot)/bin/clippy-driver"
CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
export RUSTC_WORKSPACE_WRAPPER CLIPPY_ARGS
cargo test --workspace --all-targets --no-run
# The NCCL backend of the data-parallel trainer compiles here (its C++
# shim and the shim's symbol check in the build script; its Rust
# type-checked and linted); it runs only where there is a GPU. Metadata
# only: the dependencies are the test build's, and no second codegen of
# the trainer for a library nothing here links.
cargo rustc -p agl-rl --lib --features nccl -- --emit=metadata
log=$(mktemp)
# Tests that cannot run here record themselves (tests/support/skip.rs).
AGL_SKIPS=$(mktemp)
export AGL_SKIPS
trap 'rm -f "$log" "$AGL_SKIPS"' EXIT
status=0
cargo test --workspace --no-fail-fast 2>&1 | tee "$log" || status=$?
# One closing tally for the whole run (cargo prints one line per test
# binary), every skip named.
awk -v skips="$AGL_SKIPS" -f tests/support/tally.awk "$log"
exit "$status"
