#!/usr/bin/env bash
# Installs what agl needs on a fresh machine, skipping what is already there:
# the wasm32-wasip2 Rust target, a Python venv with the torch that tch 0.26
# links against plus the openai SDK (for the proxy's SDK tests) and
# transformers + jinja2 (for the trainer's parity tests), and the built-in
# plugins (build/plugins/*.wasm).
#
# Environment:
#   AGL_VENV          venv location (default: .venv in the repo)
#   CARGO_TARGET_DIR  cargo's build folder (default: target in the repo)
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION=2.13.0  # tch 0.26 is built against exactly this libtorch
OPENAI_VERSION=3.57.0  # the SDK host/tests/openai_sdk.rs drives the proxy with
TRANSFORMERS_VERSION=5.24.0  # the reference for trainer/tests/hf_parity.rs
JINJA2_VERSION=3.1.6  # transformers needs it for chat templates
GGUF_VERSION=0.19.0  # transformers reads SmolLM2's GGUF with it (host/tests/engine_server.rs)
VENV=${AGL_VENV:-.venv}

if ! rustup target list --installed | grep -qx wasm32-wasip2; then
    echo "setup: adding the wasm32-wasip2 Rust target"
    rustup target add wasm32-wasip2
fi

if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
    echo "setup: creating $VENV with torch==$TORCH_VERSION (a few GB, once)"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --upgrade pip
    "$VENV/bin/pip" install --quiet "torch==$TORCH_VERSION" numpy
fi

if ! "$VENV/bin/python" -c "import openai, sys; sys.exit(openai.__version__ != '$OPENAI_VERSION')" 2>/dev/null; then
    echo "setup: installing openai==$OPENAI_VERSION into $VENV"
    "$VENV/bin/pip" install --quiet "openai==$OPENAI_VERSION"
fi

if ! "$VENV/bin/python" -c "import transformers, jinja2, sys; sys.exit(transformers.__version__ != '$TRANSFORMERS_VERSION' or jinja2.__version__ != '$JINJA2_VERSION')" 2>/dev/null; then
    echo "setup: installing transformers==$TRANSFORMERS_VERSION jinja2==$JINJA2_VERSION into $VENV"
    "$VENV/bin/pip" install --quiet "transformers==$TRANSFORMERS_VERSION" "jinja2==$JINJA2_VERSION"
fi
if ! "$VENV/bin/python" -c "import gguf, importlib.metadata as m, sys; sys.exit(m.version('gguf') != '$GGUF_VERSION')" 2>/dev/null; then
    echo "setup: installing gguf==$GGUF_VERSION into $VENV"
    "$VENV/bin/pip" install --quiet "gguf==$GGUF_VERSION"
fi

plugins/build.sh
