"""Reads a run folder's exports back with the projects' own readers and
prints them as one JSON document (host/agl/tests/e2e/report_export.rs):

  TensorBoard: `<run>/tensorboard/` through TensorBoard's EventAccumulator
    {"scalars": {TAG: [[STEP, VALUE], ...]}, "text": {TAG: [[STEP, TEXT], ...]}}
  W&B: each `<run>/wandb/offline-run-*/run-*.wandb` through the wandb
    package's transaction-log reader (`wandb leet inspect --json`)
    {"runs": [{"run_id", "project", "config", "history": [{"step", "items"}],
               "summary": {...}, "exit_code"}]}

Usage: read_report.py RUN_DIR
"""

import glob
import json
import os
import subprocess
import sys


def tensorboard(logdir):
    from tensorboard.backend.event_processing.event_accumulator import (
        EventAccumulator,
        SCALARS,
        TENSORS,
    )

    acc = EventAccumulator(logdir, size_guidance={SCALARS: 0, TENSORS: 0})
    acc.Reload()
    tags = acc.Tags()
    scalars = {
        tag: [[e.step, e.value] for e in acc.Scalars(tag)] for tag in tags["scalars"]
    }
    text = {
        tag: [[e.step, e.tensor_proto.string_val[0].decode("utf-8")] for e in acc.Tensors(tag)]
        for tag in tags["tensors"]
    }
    return {"scalars": scalars, "text": text}


def wandb_run(path):
    out = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", path],
        capture_output=True,
        text=True,
        check=True,
    )
    run = {"history": [], "summary": {}, "config": {}, "exit_code": None}
    for line in out.stdout.splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        kind = rec.get("type")
        if kind == "run":
            body = rec["run"]
            run["run_id"] = body.get("run_id")
            run["project"] = body.get("project")
            run["config"].update(body.get("config", {}).get("update", {}))
        elif kind == "config":
            run["config"].update(rec["config"].get("update", {}))
        elif kind == "history":
            body = rec["history"]
            run["history"].append(
                {"step": body.get("step", {}).get("num", 0), "items": body.get("item", {})}
            )
        elif kind == "summary":
            run["summary"].update(rec["summary"].get("update", {}))
        elif kind == "exit":
            run["exit_code"] = rec["exit"].get("exit_code", 0)
    return run


def main():
    run_dir = sys.argv[1]
    files = sorted(glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", "run-*.wandb")))
    print(
        json.dumps(
            {
                "tensorboard": tensorboard(os.path.join(run_dir, "tensorboard")),
                "wandb": {"runs": [wandb_run(f) for f in files]},
            }
        )
    )


if __name__ == "__main__":
    main()
