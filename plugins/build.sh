#!/usr/bin/env bash
# Builds the plugin components into build/plugins/<name>.wasm.
#
#   plugins/build.sh            # every crate under plugins/ except the sdk
#   plugins/build.sh faulty     # only the named ones (directory names)
#
# <name> is the crate's directory name (plugins/<name> or plugins/testing/<name>).
# The test plugin `faulty` is also built with `--features reward` as
# faulty-reward.wasm, a component of the other world, and with
# `--features wit-v0-1` ... `wit-v0-5` as faulty-v0.1.wasm ... faulty-v0.5.wasm,
# plugins of agl:adapter 0.1 to 0.5.
#
# Python plugins (plugins/python/<name>/{plugin.toml,app.py}, the SDK in
# plugins/python/agl_plugin) are built with the venv's componentize-py
# (pinned by deploy/setup.sh) into build/plugins/<name>-py.wasm, when it is
# there and every plugin is built (no names given).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
out="$root/build/plugins"
mkdir -p "$out"

# Directory of every plugin crate, keyed by its directory name.
declare -A dirs
for manifest in plugins/*/Cargo.toml plugins/testing/*/Cargo.toml; do
    dir="$(dirname "$manifest")"
    name="$(basename "$dir")"
    [[ "$name" == sdk ]] && continue
    dirs[$name]="$dir"
done

if [[ $# -gt 0 ]]; then
    names=("$@")
else
    mapfile -t names < <(printf '%s\n' "${!dirs[@]}" | sort)
fi

crate_of() {
    sed -n 's/^name *= *"\(.*\)"/\1/p' "$1/Cargo.toml" | head -n1
}

build() { # build <name> <crate> <output name> [cargo args...]
    local name="$1" crate="$2" output="$3"
    shift 3
    echo "building $name -> build/plugins/$output.wasm" >&2
    cargo build --release --target wasm32-wasip2 -p "$crate" "$@"
    cp "$target_dir/wasm32-wasip2/release/${crate//-/_}.wasm" "$out/$output.wasm"
}

for name in "${names[@]}"; do
    dir="${dirs[$name]:-}"
    if [[ -z "$dir" ]]; then
        echo "no plugin crate named $name under plugins/" >&2
        exit 1
    fi
    crate="$(crate_of "$dir")"
    build "$name" "$crate" "$name"
    if [[ "$name" == faulty ]]; then
        build "$name" "$crate" faulty-reward --features reward
        build "$name" "$crate" faulty-v0.1 --features wit-v0-1
        build "$name" "$crate" faulty-v0.2 --features wit-v0-2
        build "$name" "$crate" faulty-v0.3 --features wit-v0-3
        build "$name" "$crate" faulty-v0.4 --features wit-v0-4
        build "$name" "$crate" faulty-v0.5 --features wit-v0-5
    fi
done

# Python plugins: one component each, CPython inside, built by the SDK's
# builder (plugins/python/agl_build.py) from plugin.toml + app.py.
# componentize-py's output differs from build to build (its CPython heap
# snapshot; upstream issue #247), so a component is kept under the hash of
# its inputs beside the cargo cache and reused while they are unchanged:
# the same bytes hit the host's compile cache.
python="${AGL_VENV:-$root/.venv}/bin/python"
if [[ $# -eq 0 && -x "${python%/python}/componentize-py" ]]; then
    kept="$target_dir/python-plugins"
    mkdir -p "$kept"
    tool="$("${python%/python}/componentize-py" --version 2>&1)"
    for manifest in plugins/python/*/plugin.toml; do
        dir="$(dirname "$manifest")"
        name="$(basename "$dir")"
        key="$( { echo "$tool"; find "$dir" plugins/python/agl_plugin plugins/python/agl_build.py wit \
            -name '*.py' -o -name '*.toml' -o -name '*.wit' | grep -v '/\.agl/' | sort | xargs sha256sum; } \
            | sha256sum | cut -c1-16)"
        if [[ -f "$kept/$name-$key.wasm" ]]; then
            cp "$kept/$name-$key.wasm" "$out/$name-py.wasm"
            continue
        fi
        echo "building python $name -> build/plugins/$name-py.wasm" >&2
        PYTHONPATH="$root/plugins/python" "$python" -m agl_build "$dir" \
            --out "$out/$name-py.wasm" >/dev/null
        rm -f "$kept/$name"-*.wasm
        cp "$out/$name-py.wasm" "$kept/$name-$key.wasm"
    done
fi
