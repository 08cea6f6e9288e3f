"""Task rows for the mini-swe example, and the loader that reads them.

One JSON object per line (the generated tiny tasks, or a SWE-bench /
SWE-smith export converted to local repo snapshots):

  instance_id        str   unique task id
  repo_path          str   the repo snapshot (a folder), relative to the tasks
                           root ($MSWE_TASKS_ROOT, default
                           ~/.cache/agl/mini-swe/repos) or absolute
  problem_statement  str   the issue text the agent gets
  FAIL_TO_PASS       [str] test ids that must pass after the fix
  PASS_TO_PASS       [str] test ids that must keep passing
  split              str   "train" | "val" (agl run: "val" rows validate)
  test_runner        str   optional: "unittest" (ids like pkg.mod.Class.test)
                           or "pytest" (ids like tests/test_x.py::test_y);
                           default: "pytest" if any id contains "::"
  test_files         [str] optional: files restored from the snapshot before
                           the tests run (default: the files the test ids
                           name), so an agent that edits tests gains nothing
  test_patch         str   optional: a diff applied (git apply) after the
                           restore, e.g. SWE-bench's hidden tests

Convert a dataset file: `python3 tasks.py IN.jsonl --out tasks.jsonl [--val N]`.
SWE-bench stores FAIL_TO_PASS / PASS_TO_PASS as JSON-encoded strings; they
are decoded here. Extra fields (repo, base_commit, patch, ...) are kept and
ignored.
"""

import json
import os
from pathlib import Path

REQUIRED = ("instance_id", "repo_path", "problem_statement", "FAIL_TO_PASS", "PASS_TO_PASS")


class TaskError(ValueError):
    pass


def default_root():
    return Path(os.environ.get("MSWE_TASKS_ROOT") or Path.home() / ".cache/agl/mini-swe/repos")


def _ids(row, key):
    value = row.get(key, [])
    if isinstance(value, str):  # SWE-bench: a JSON list in a string
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise TaskError(f"{key}: not a JSON list: {e}") from e
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TaskError(f"{key}: expected a list of test ids")
    return value


def _test_files(ids, runner):
    files = []
    for test_id in ids:
        if runner == "pytest":
            path = test_id.split("::", 1)[0]
        else:  # pkg.mod.Class.test -> pkg/mod.py: the longest module prefix is unknown, so
            parts = test_id.split(".")  # take all parts before the first capitalised one
            mod = []
            for p in parts:
                if p[:1].isupper():
                    break
                mod.append(p)
            path = "/".join(mod) + ".py"
        if path not in files:
            files.append(path)
    return files


def normalize(row, root=None):
    """A validated task with defaults filled in and `repo_dir` the absolute snapshot path (`repo`, a dataset field, is left alone)."""
    missing = [k for k in REQUIRED if k not in row]
    if missing:
        raise TaskError(f"missing fields: {', '.join(missing)}")
    task = dict(row)
    task["FAIL_TO_PASS"] = _ids(row, "FAIL_TO_PASS")
    task["PASS_TO_PASS"] = _ids(row, "PASS_TO_PASS")
    ids = task["FAIL_TO_PASS"] + task["PASS_TO_PASS"]
    if not task["FAIL_TO_PASS"]:
        raise TaskError("FAIL_TO_PASS is empty: nothing to fix")
    runner = row.get("test_runner") or ("pytest" if any("::" in i for i in ids) else "unittest")
    if runner not in ("unittest", "pytest"):
        raise TaskError(f"test_runner: unknown {runner!r}")
    task["test_runner"] = runner
    task["test_files"] = list(row.get("test_files") or _test_files(ids, runner))
    task["split"] = row.get("split", "train")
    repo = Path(row["repo_path"]).expanduser()
    task["repo_dir"] = repo if repo.is_absolute() else (root or default_root()) / repo
    return task


def load(path, root=None):
    """All tasks of a JSONL file; errors name the line."""
    tasks = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            tasks.append(normalize(json.loads(line), root))
        except (json.JSONDecodeError, TaskError) as e:
            raise TaskError(f"{path}:{n}: {e}") from e
    return tasks


def main():
    """Converts a SWE-bench / SWE-smith style JSONL file into agl data rows:
    test id lists decoded, defaults filled in, a split on every row."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("rows", type=Path, help="input JSONL (instance rows)")
    ap.add_argument("--out", type=Path, required=True, help="agl run data file to write")
    ap.add_argument("--root", type=Path, default=None, help="tasks root (default $MSWE_TASKS_ROOT)")
    ap.add_argument("--val", type=int, default=0, help="rows without a split: the last N are val")
    args = ap.parse_args()
    raw = [json.loads(line) for line in args.rows.read_text().splitlines() if line.strip()]
    rows = []
    for i, task in enumerate(load(args.rows, args.root)):
        if not task["repo_dir"].is_dir():
            print(f"warning: {task['instance_id']}: no repo snapshot at {task['repo_dir']}")
        row = {k: v for k, v in task.items() if k != "repo_dir"}
        if "split" not in raw[i]:
            row["split"] = "val" if i >= len(raw) - args.val else "train"
        rows.append(row)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} rows to {args.out}")


if __name__ == "__main__":
    main()
