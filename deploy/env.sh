# Sourced by the README commands after deploy/setup.sh: points tch's build at
# the venv's torch (libtorch 2.13.0, what tch 0.26 expects) instead of a
# downloaded libtorch, and makes AGL_VENV absolute for tests that run Python
# from other working directories; puts the venv and the coding-agent CLIs on PATH.
AGL_VENV=$(cd "${AGL_VENV:-.venv}" && pwd)
export AGL_VENV
export LIBTORCH_USE_PYTORCH=1
# The npm CLIs setup installs (claude, codex, opencode) are on PATH too.
export PATH="$AGL_VENV/bin:$AGL_VENV/node/node_modules/.bin:$PATH"
