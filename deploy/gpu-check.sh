#!/usr/bin/env bash
# The GPU check: on a machine with a CUDA device and the torch the binaries
# were linked against, runs agl's CUDA tests (model, engine and RL step on
# CUDA against CPU) and the engine, step and LoRA benchmarks, and ends
# with one verdict line. It builds nothing: build here, copy, run there.
#
# Recipe (on the build machine, CUDA torch in the venv: `pip install
# torch==2.13.0` from the CUDA index into $AGL_VENV, then deploy/setup.sh):
#   . deploy/env.sh
#   cargo test -p agl-rl --test rl --release --no-run --message-format=json \
#     | jq -r 'select(.executable != null) .executable' > build/gpu-bins.txt
#   cargo bench -p agl-engine -p agl-rl --no-run --message-format=json \
#     | jq -r 'select(.executable != null) .executable' >> build/gpu-bins.txt
# then copy the repo (with build/gpu-bins.txt and the listed binaries at the
# same paths) and $AGL_VENV to the GPU machine, and there:
#   deploy/gpu-check.sh [build/gpu-bins.txt]
#
# The CUDA tests are #[ignore]d (a machine without a GPU reports them
# skipped); this runs them with --ignored.
# Exit 0 and "gpu-check: PASS" when every CUDA test passed on a device;
# otherwise "gpu-check: FAIL (...)" or "gpu-check: NO GPU" (exit 2).
set -uo pipefail
cd "$(dirname "$0")/.."
list="${1:-build/gpu-bins.txt}"
[[ -f "$list" ]] || { echo "gpu-check: FAIL (no $list: build the binaries first, see the header)"; exit 1; }
. deploy/env.sh >/dev/null 2>&1 || true

if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu-check: NO GPU (nvidia-smi finds no device)"
    exit 2
fi
nvidia-smi -L

tests=$(grep '/deps/rl-' "$list" | head -n1)
[[ -x "$tests" ]] || { echo "gpu-check: FAIL (test binary $tests missing)"; exit 1; }
log=$(mktemp)
"$tests" cuda --ignored --test-threads 1 --nocapture 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
if grep -q "no CUDA device" "$log"; then
    echo "gpu-check: FAIL (the binaries see no CUDA: a CPU torch, or libtorch_cuda not linked)"
    exit 1
fi
if [[ $status -ne 0 ]]; then
    echo "gpu-check: FAIL (CUDA tests failed, exit $status)"
    exit 1
fi

# Benchmarks print tables; they do not decide the verdict.
for bench in engine step lora; do
    bin=$(grep "/deps/$bench-" "$list" | head -n1)
    if [[ -x "$bin" ]]; then
        echo "== bench $bench"
        "$bin" --bench 2>&1 | tail -n 25
    fi
done
echo "gpu-check: PASS ($(grep -c '^test .* ok$' "$log") CUDA tests on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1))"
