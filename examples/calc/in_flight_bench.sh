#!/usr/bin/env bash
# Drain vs partial rollouts on a real run: the multi-turn calc example
# (SmolLM2 on the embedded engine), async, the same seed and steps, once with
# in-flight calls drained before each update and once left running
# (`[run] in_flight = "continue"`). Prints per mode the mean drain/pause
# time per step (`drain_s`: pause, drain, weight load, resume), the mean
# step time, and the tokens masked as too stale.
#
#   examples/calc/in_flight_bench.sh [STEPS]      (after examples/main.sh
#                                                 built agl and fetched the model)
set -euo pipefail
cd "$(dirname "$0")/../.."
. deploy/env.sh
steps=${1:-4}
agl="${CARGO_TARGET_DIR:-target}/release/agl"
model=$("$agl" --log warn model fetch smollm2)
out="agl-runs/in-flight-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$out"
for mode in drain continue; do
    "$agl" --log warn --config examples/calc/agl.toml \
        -o "model.path=$model" -o "run.out_dir=$PWD/$out/$mode" \
        -o run.mode=async -o run.groups_in_flight=8 -o run.groups_per_step=4 \
        -o "run.steps=$steps" -o run.val_every=0 -o run.progress=false \
        -o "run.in_flight=\"$mode\"" run > "$out/$mode.log" 2>&1 ||
        { tail -20 "$out/$mode.log"; exit 1; }
done
"${AGL_VENV}/bin/python" - "$out" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
print(f"| in flight | steps | drain/pause s per step | step s | stale tokens masked | mean staleness |")
print(f"|-----------|-------|------------------------|--------|---------------------|----------------|")
for mode in ("drain", "continue"):
    rows = [json.loads(l) for l in (out / mode / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0]
    mean = lambda k: sum(r[k] for r in steps) / max(len(steps), 1)
    print(f"| {mode:>9} | {len(steps):5} | {mean('drain_s'):22.2f} | {mean('step_s'):6.1f} | "
          f"{sum(r.get('stale_tokens', 0) for r in steps):19} | {mean('mean_staleness'):14.2f} |")
PY
