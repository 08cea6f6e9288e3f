#!/usr/bin/env bash
# Installs what agl needs on a fresh machine, skipping what is already there:
# the wasm32-wasip2 Rust target, a Python venv with the torch that tch 0.26
# links against plus the openai and anthropic SDKs (for the proxy's SDK tests), and the
# built-in plugins (build/plugins/*.wasm), and the Python references the
# GGUF import and trainer parity tests compare against (transformers, gguf,
# jinja2, accelerate, peft), componentize-py (the Python plugins), jsonschema
# (the constrained-decoding tests), pyarrow (parquet task files), tensorboard
# and wandb (the `[report]` exports of agl run / agl train),
# openapi-spec-validator and schemathesis (the checks of the gateway's
# /openapi.json), mini-swe-agent (the harness of examples/mini-swe), and
# the Claude Code, Codex and OpenCode CLIs from npm (examples/claude-code,
# examples/codex, examples/opencode and the tests that drive them) into
# $AGL_VENV/node, so deploy/env.sh puts them on PATH, and Debian's chromium
# (the viewer's browser test drives it headless).
#
# Environment:
#   AGL_VENV          venv location (default: .venv in the repo)
#   CARGO_TARGET_DIR  cargo's build folder (default: target in the repo)
set -euo pipefail
cd "$(dirname "$0")/.."
main_only=false
case "${1:-}" in
    --main) main_only=true ;;
    "") ;;
    *) echo "usage: deploy/setup.sh [--main]" >&2; exit 2 ;;
esac

log="${AGL_SETUP_LOG:-${TMPDIR:-/tmp}/agl-setup.log}"
: >"$log"
# step WHAT COMMAND...: one line for the terminal, the command's output to the log.
step() {
    local what="$1"
    shift
    echo "setup: $what"
    if ! "$@" >>"$log" 2>&1; then
        echo "setup: failed: $what; the last lines of $log:" >&2
        tail -n 40 "$log" >&2
        exit 1
    fi
}

TORCH_VERSION=2.13.0  # tch 0.26 is built against exactly this libtorch
OPENAI_VERSION=3.57.0  # the SDK host/gateway/tests/gateway/openai_sdk.rs drives the proxy with
ANTHROPIC_VERSION=2.15.0  # the SDK host/gateway/tests/gateway/anthropic_sdk.rs drives it with
# host/agl/tests/e2e/model_import.rs and trainer/model/tests/model/hf_parity.rs compare against these.
TRANSFORMERS_VERSION=5.24.0
GGUF_VERSION=0.19.0
JINJA2_VERSION=3.1.6
ACCELERATE_VERSION=1.15.0  # transformers needs it to load a model from a GGUF
PEFT_VERSION=0.21.2  # trainer/rl/tests/rl/lora_parity.rs compares LoRA against it
# Builds the Python plugins (plugins/python) into components (plugins/build.sh).
COMPONENTIZE_PY_VERSION=0.25.1
JSONSCHEMA_VERSION=4.26.0  # validates constrained outputs (host/agl/tests/e2e/engine_choices.rs)
# Writes and reads parquet task files (SWE-bench rows: host/agl/tests/e2e/eval.rs,
# examples/mini-swe/tasks.py).
PYARROW_VERSION=26.0.1
# `[report]` exports (host/agl/python/report_sink.py writes with them) and their
# read-back test (host/agl/tests/e2e/report_export.rs reads with them).
TENSORBOARD_VERSION=2.21.0
WANDB_VERSION=0.31.0
# The real harness examples/mini-swe runs and host/agl/tests/e2e/mini_swe.rs drives
# (pulls litellm; about 70 s to install on 2 cores with a warm pip cache).
MINI_SWE_AGENT_VERSION=2.4.6
# Header-only wheels the CUDA headers of the torch wheel need, so the `nccl`
# feature (data parallel on GPUs) compiles here (tests/run.sh builds it).
CUDA_CRT_VERSION=13.0.88
CUDA_CCCL_VERSION=13.0.85
# Validates every Kubernetes manifest in deploy/ against this schema version
# (host/agl/tests/e2e/manifests.rs).
KUBERNETES_VALIDATE_VERSION=1.37.0
KUBERNETES_SCHEMA_VERSION=1.34.0
# Check the gateway's /openapi.json: valid OpenAPI 3.1
# (host/gateway/tests/gateway/openapi.rs), fuzzed against a live agl serve
# (host/agl/tests/e2e/openapi_fuzz.rs, tests/fuzz_api.sh).
OPENAPI_SPEC_VALIDATOR_VERSION=0.9.0
SCHEMATHESIS_VERSION=4.32.5
# The coding-agent CLIs (each ships its native binary as a platform package).
CLAUDE_CODE_VERSION=2.1.328
CODEX_VERSION=0.169.0
OPENCODE_VERSION=1.18.33
VENV=${AGL_VENV:-.venv}

apt_install() {
    local sudo=""
    [[ $(id -u) -eq 0 ]] || sudo=sudo
    $sudo apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@"
}

# --- what the main job needs -------------------------------------------------

if ! rustup target list --installed | grep -qx wasm32-wasip2; then
    step "adding the wasm32-wasip2 Rust target" rustup target add wasm32-wasip2
fi

make_venv() {
    python3 -m venv "$VENV" &&
        "$VENV/bin/pip" install --quiet --upgrade pip &&
        "$VENV/bin/pip" install --quiet "torch==$TORCH_VERSION" numpy
}
if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
    step "creating $VENV with torch==$TORCH_VERSION (a few GB, once)" make_venv
fi

# training.png's titles and labels (plot.rs takes any TrueType font).
if [[ -z $(find /usr/share/fonts -name '*.ttf' -print -quit 2>/dev/null) ]]; then
    step "installing Debian's fonts-dejavu-core (apt)" apt_install fonts-dejavu-core
fi

if $main_only; then
    # examples/calc/agl.toml's plugins.
    step "building the plugins trajectory and reported" plugins/build.sh trajectory reported
    exit 0
fi

# --- what the tests need besides ----------------------------------------------

# pinned PKG==VERSION...: installs them unless the venv has each at its version.
pinned() {
    if ! "$VENV/bin/python" - "$@" 2>/dev/null <<'PY'
import sys
from importlib.metadata import version
sys.exit(any(version(name) != want for name, want in (a.split("==") for a in sys.argv[1:])))
PY
    then
        step "installing $* into $VENV" "$VENV/bin/pip" install --quiet "$@"
    fi
}

pinned "openai==$OPENAI_VERSION"
pinned "anthropic==$ANTHROPIC_VERSION"
pinned "transformers==$TRANSFORMERS_VERSION" "gguf==$GGUF_VERSION" "jinja2==$JINJA2_VERSION" \
    "accelerate==$ACCELERATE_VERSION"
pinned "jsonschema==$JSONSCHEMA_VERSION"
pinned "pyarrow==$PYARROW_VERSION"
pinned "tensorboard==$TENSORBOARD_VERSION" "wandb==$WANDB_VERSION"
pinned "componentize-py==$COMPONENTIZE_PY_VERSION"
pinned "peft==$PEFT_VERSION"
pinned "nvidia-cuda-crt==$CUDA_CRT_VERSION" "nvidia-cuda-cccl==$CUDA_CCCL_VERSION" \
    "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
pinned "openapi-spec-validator==$OPENAPI_SPEC_VALIDATOR_VERSION" \
    "schemathesis==$SCHEMATHESIS_VERSION" "jsonschema==$JSONSCHEMA_VERSION"
pinned "mini-swe-agent==$MINI_SWE_AGENT_VERSION"

NODE_PREFIX="$VENV/node"
npm_install() {
    mkdir -p "$NODE_PREFIX" &&
        (cd "$NODE_PREFIX" && npm install --silent --no-audit --no-fund --no-save \
        "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" "@openai/codex@$CODEX_VERSION" \
        "opencode-ai@$OPENCODE_VERSION")
}
if ! (cd "$NODE_PREFIX" 2>/dev/null && node -e "
const want = {'@anthropic-ai/claude-code': '$CLAUDE_CODE_VERSION', '@openai/codex': '$CODEX_VERSION', 'opencode-ai': '$OPENCODE_VERSION'};
for (const [p, v] of Object.entries(want)) {
  if (require('./node_modules/' + p + '/package.json').version !== v) process.exit(1);
}" 2>/dev/null); then
    step "installing claude-code, codex and opencode from npm into $NODE_PREFIX" npm_install
fi

# The rollout viewer's browser test (host/agl/tests/e2e/viewer.rs).
if ! command -v chromium >/dev/null; then
    step "installing Debian's chromium (apt)" apt_install chromium
fi

step "building the plugins (build/plugins/*.wasm)" plugins/build.sh
