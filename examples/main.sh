#!/usr/bin/env bash
# The main job: a short real RL run of SmolLM2-135M-Instruct on the embedded
# engine (CPU is fine), training the multi-turn calculator harness of
# examples/calc: `agl run` starts the gateway (which renders every call and
# continues the sampled tokens), agl's own tch engine, the controller (one
# Python agent process per rollout), the plugin host and the trainer. It
# prints two lines per step, the validation reward and tool use before
# training and every few steps, and a summary table at the end; its log goes
# to the run folder's agl.log (-v shows it). Outputs (metrics.jsonl,
# training.png, agl.log, checkpoints, the SQLite store) land in
# agl-runs/main-<time>/.
#
#   examples/main.sh              the main job
#   examples/main.sh --no-tool    the ablation: the same run with the
#                                 calculator withheld (agent.py --no-tool)
# Other arguments go to agl (e.g. -v, -o run.steps=4).
set -euo pipefail
cd "$(dirname "$0")/.."
name=main
args=()
for arg in "$@"; do
    if [[ $arg == --no-tool ]]; then
        # examples/calc/agl.toml's command with the harness's own flag.
        agent='exec "${AGL_VENV:-.venv}/bin/python" examples/calc/agent.py --no-tool'
        agent=${agent//\\/\\\\}
        args+=(-o "controller.command=\"${agent//\"/\\\"}\"")
        name=main-no-tool
    else
        args+=("$arg")
    fi
done
deploy/setup.sh --main
. deploy/env.sh
echo "setup: building agl (release; 12-18 min on 2 cores the first time)"
cargo build --quiet --release -p agl
agl="${CARGO_TARGET_DIR:-target}/release/agl"
model=$("$agl" --log warn model fetch smollm2)
out="agl-runs/$name-$(date +%Y%m%d-%H%M%S)"
"$agl" --config examples/calc/agl.toml \
    -o "model.path=$model" -o "run.out_dir=$PWD/$out" \
    "${args[@]}" run
