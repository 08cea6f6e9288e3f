#!/usr/bin/env bash
# The main job: a short real RL run of SmolLM2-135M-Instruct on the embedded
# engine (CPU is fine): `agl run` starts the gateway, agl's own tch engine,
# the controller (one Python harness process per rollout), the plugin host
# and the trainer, and prints one line per step, the validation reward
# before training and every few steps, and a summary table at the end.
# Outputs (metrics.jsonl, training.png, checkpoints, the SQLite store) land
# in agl-runs/main-<time>/.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/setup.sh
. deploy/env.sh
cargo build --release -p agl
agl="${CARGO_TARGET_DIR:-target}/release/agl"
model=$("$agl" model fetch smollm2)
out="agl-runs/main-$(date +%Y%m%d-%H%M%S)"
"$agl" --config examples/arith/agl.toml \
    -o "model.path=$model" -o "run.out_dir=$PWD/$out" \
    run --plugin build/plugins/trajectory.wasm --reward build/plugins/reported.wasm
