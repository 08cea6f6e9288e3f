#!/usr/bin/env bash
# The main job. Until the trainer lands, it runs the built-in plugins over the
# shipped fixture rollouts: samples with trained vs masked tokens, chain
# breaks by class, and rewards.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/setup.sh
. deploy/env.sh
cargo build --release -p agl
agl="${CARGO_TARGET_DIR:-target}/release/agl"
fixtures=examples/fixtures
for adapter in trajectory transition; do
    echo "=== $adapter.wasm + exact-match.wasm over $fixtures/rollouts.jsonl ==="
    "$agl" --config "$fixtures/agl.toml" plugin test \
        --plugin "build/plugins/$adapter.wasm" \
        --reward build/plugins/exact-match.wasm \
        --rollouts "$fixtures/rollouts.jsonl"
done
