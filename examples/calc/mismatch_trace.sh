#!/usr/bin/env bash
# The trainer/engine mismatch of a recorded trace taken through vLLM's
# token-in contract: the calc example runs against an engine served apart
# (`[engine] kind = "external"`, `render = "gateway"`, `api = "openai"`: token
# ids to `/v1/completions` with `return_token_ids` and logprobs, exactly the
# requests and answers agl exchanges with vLLM), the store's calls are
# exported as rollout JSONL, and the mismatch bench scores every sampled token
# against the f32 trainer. With no vLLM on this machine the server is agl's own
# engine in bf16 (`agl engine serve --dtype bf16`); on a machine with vLLM,
# point ENGINE_URL at it (e.g. `vllm serve <model> --dtype bfloat16`) and the
# same steps measure vLLM's kernels.
#
#   examples/calc/mismatch_trace.sh [ROLLOUT_GROUPS]   (after examples/main.sh
#                                                        built agl and fetched the model)
#   ENGINE_URL=http://host:8000 examples/calc/mismatch_trace.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
. deploy/env.sh
groups=${1:-4}
agl="${CARGO_TARGET_DIR:-target}/release/agl"
model=$("$agl" --log warn model fetch smollm2)
out="agl-runs/mismatch-trace-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$out"
url=${ENGINE_URL:-}
if [ -z "$url" ]; then
    port=18431
    "$agl" --log warn engine serve --model "$model" --dtype bf16 \
        --listen "127.0.0.1:$port" > "$out/engine.log" 2>&1 &
    engine=$!
    trap 'kill $engine 2>/dev/null || true' EXIT
    url="http://127.0.0.1:$port"
    for _ in $(seq 120); do
        curl -sf "$url/v1/models" > /dev/null && break
        sleep 0.5
    done
fi
# One step: the step-0 rollouts are sampled by the served weights, which are
# the trainer's (an external engine is never reloaded, so later steps would
# compare diverged weights).
"$agl" --log warn --config examples/calc/agl.toml \
    -o "model.path=$model" -o "run.out_dir=$PWD/$out/run" \
    -o engine.kind=\"external\" -o "engine.base_url=\"$url\"" -o engine.api=\"openai\" \
    -o "run.groups_per_step=$groups" -o run.steps=1 -o run.val_every=0 \
    -o run.progress=false run > "$out/run.log" 2>&1 || { tail -20 "$out/run.log"; exit 1; }
"$agl" rollouts export --db "$out/run/agl.db" --out "$out/trace.jsonl"
cargo bench -q -p agl --bench mismatch -- --trace "$PWD/$out/trace.jsonl" --model "$model"
