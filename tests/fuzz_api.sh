#!/usr/bin/env bash
# A longer fuzzing of the gateway's API than the test suite's: the same
# schemathesis run against a live `agl serve` (host/agl/tests/e2e/openapi_fuzz.rs:
# auth on, a test engine registered, no 5xx, every answer of a documented status,
# content type and schema, the store's integrity check afterwards), with more
# examples per operation.
#
#   tests/fuzz_api.sh [EXAMPLES [SEED]]   # default 2000 examples, a random seed
#
# The figures (operations, test cases, failures) are printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/agl/target}"
export AGL_VENV="${AGL_VENV:-$HOME/.cache/agl/venv}"
deploy/setup.sh
. deploy/env.sh
export AGL_FUZZ_EXAMPLES="${1:-2000}"
export AGL_FUZZ_SEED="${2:-$RANDOM$RANDOM}"
echo "fuzz_api: $AGL_FUZZ_EXAMPLES examples per operation, seed $AGL_FUZZ_SEED"
cargo test -p agl --test e2e openapi_fuzz -- --nocapture
