"""Task rows for the mini-swe example (SWE-bench's fields), their loader,
the base state a rollout starts from, and `--check`.

One row per task, JSONL or parquet (a SWE-bench / SWE-smith export, or the
bundled tiny tasks of gen_tasks.py):

  instance_id        str   unique task id
  problem_statement  str   the issue text the agent gets
  FAIL_TO_PASS       [str] test ids that must pass after the fix (lists, or
  PASS_TO_PASS       [str] SWE-bench's JSON strings) / must keep passing
  patch              str   the gold fix (a diff; `--check` applies it)
  test_patch         str   a diff applied before grading: the hidden tests
                           (the agent never sees them)
  environment        obj   how to set up the interpreter (envs.py):
                           {"python": "python3.11", "packages": ["six==1.16.0"],
                           "pip_args": [...]}; absent = an empty venv
  split              str   "train" | "val" (agl run: "val" rows validate)

and the base state, one of:

  snapshot           str   a folder holding the repo at its base state,
                           relative to the tasks root ($MSWE_TASKS_ROOT,
                           default ~/.cache/agl/mini-swe/repos) or absolute;
                           `repo_path` is an accepted alias. Copied without
                           `.git`.
  repo + base_commit str   SWE-bench's: `git archive base_commit` of a local
                           git mirror of `repo` ("owner/name"):
                           `<tasks root>/<owner>__<name>.git`, or the row's
                           `repo_dir` / `source` (relative to the tasks root
                           or absolute). The workspace never holds history.

Optional: `test_runner` ("unittest": ids like pkg.mod.Class.test; "pytest":
ids like tests/test_x.py::test_y; default "pytest" if an id contains "::"),
`test_files` (files the grader always treats as tests; default: the files
the test ids name), `step_limit`, `wall_time`, `image` (Kubernetes). Other
fields (hints_text, version, ...) are kept and ignored.

  python3 tasks.py IN.jsonl|IN.parquet --out tasks.jsonl [--val N]
      converts a dataset file into agl data rows (lists decoded, defaults
      filled in, a split on every row) and warns about missing base states.
  python3 tasks.py --check FILE [--root DIR]
      proves every row through the grader (grade.py): FAIL_TO_PASS fail at
      base + test_patch and pass with the gold patch; PASS_TO_PASS pass both.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import envs  # noqa: E402

REQUIRED = ("instance_id", "problem_statement", "FAIL_TO_PASS", "PASS_TO_PASS")


class TaskError(ValueError):
    pass


def default_root():
    return Path(os.environ.get("MSWE_TASKS_ROOT") or Path.home() / ".cache/agl/mini-swe/repos")


def git_env():
    """The environment for every git command here and in grade.py: no user
    or system config, no inherited GIT_* variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, GIT_TERMINAL_PROMPT="0")
    return env


def _ids(row, key):
    value = row.get(key, [])
    if isinstance(value, str):  # SWE-bench: a JSON list in a string
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise TaskError(f"{key}: not a JSON list: {e}") from e
    if hasattr(value, "tolist"):  # a numpy array (pandas-made parquet)
        value = value.tolist()
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


def _under(root, value):
    path = Path(value).expanduser()
    return path if path.is_absolute() else root / path


def normalize(row, root=None):
    """A validated task with defaults filled in, plus the internal keys
    `_snapshot` (a folder) or `_mirror` (a git dir; with `base_commit`)."""
    missing = [k for k in REQUIRED if k not in row]
    if missing:
        raise TaskError(f"missing fields: {', '.join(missing)}")
    root = Path(root) if root else default_root()
    task = {k: v for k, v in row.items() if not k.startswith("_")}
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
    task["split"] = row.get("split") or "train"
    for key in ("patch", "test_patch"):
        if task.get(key) is None:
            task[key] = ""
        elif not isinstance(task[key], str):
            raise TaskError(f"{key}: expected a diff (a string)")
    try:
        task["environment"] = envs.normalize(row.get("environment"))
    except envs.EnvError as e:
        raise TaskError(str(e)) from e
    snapshot = row.get("snapshot") or row.get("repo_path")
    if snapshot:
        task["_snapshot"] = _under(root, snapshot)
    elif row.get("base_commit"):
        source = row.get("repo_dir") or row.get("source")
        if source:
            task["_mirror"] = _under(root, source)
        elif isinstance(row.get("repo"), str) and row["repo"].count("/") == 1:
            task["_mirror"] = root / (row["repo"].replace("/", "__") + ".git")
        else:
            raise TaskError("base_commit needs `repo` (owner/name) or `repo_dir` / `source`")
        if not isinstance(row["base_commit"], str) or len(row["base_commit"]) not in (40, 64):
            raise TaskError("base_commit: expected a full commit hash")
    else:
        raise TaskError("no base state: `snapshot` (or `repo_path`), or `repo` + `base_commit`")
    return task


def public(task):
    """A normalized task as a data row (without the internal keys)."""
    return {k: v for k, v in task.items() if not k.startswith("_")}


def base_missing(task):
    """Why the task's base state is unavailable, or None."""
    if "_snapshot" in task:
        return None if task["_snapshot"].is_dir() else f"no repo snapshot at {task['_snapshot']}"
    if not task["_mirror"].exists():
        return f"no git mirror at {task['_mirror']}"
    return None


def materialize(task, dest):
    """Writes the task's base state into the new folder `dest`: the snapshot
    without `.git`, or `git archive base_commit` of the mirror (no history)."""
    dest = Path(dest)
    if "_snapshot" in task:
        shutil.copytree(task["_snapshot"], dest, ignore=shutil.ignore_patterns(".git"), symlinks=True)
        return dest
    dest.mkdir(parents=True)
    archive = subprocess.Popen(
        ["git", "--git-dir", str(task["_mirror"]), "archive", "--format=tar", task["base_commit"]],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=git_env(),
    )
    untar = subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, capture_output=True)
    archive.stdout.close()
    with archive.stderr:
        err = archive.stderr.read().decode(errors="replace")
    if archive.wait() != 0 or untar.returncode != 0:
        shutil.rmtree(dest, ignore_errors=True)
        raise TaskError(f"git archive {task['base_commit']} of {task['_mirror']}: {err or untar.stderr.decode()}")
    return dest


def history_commits(task):
    """Commits whose presence in a workspace's `.git` means the agent holds
    the task's own history (grade.py: a fatal flag)."""
    commits = [task["base_commit"]] if isinstance(task.get("base_commit"), str) else []
    snapshot = task.get("_snapshot")
    if snapshot is not None and (snapshot / ".git").exists():
        r = subprocess.run(["git", "-C", str(snapshot), "rev-parse", "HEAD"], capture_output=True, env=git_env())
        if r.returncode == 0:
            commits.append(r.stdout.decode().strip())
    return commits


def read_rows(path):
    """The raw rows of a JSONL or parquet file."""
    path = Path(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise TaskError(f"{path}:{n}: {e}") from e
    return rows


def load(path, root=None):
    """All tasks of a JSONL or parquet file; errors name the row."""
    tasks = []
    for n, row in enumerate(read_rows(path), 1):
        try:
            tasks.append(normalize(row, root))
        except TaskError as e:
            raise TaskError(f"{path}: row {n}: {e}") from e
    return tasks


def apply_patch(repo, patch, what):
    """`git apply` of a diff in `repo` (not a git repository)."""
    if not patch.strip():
        return
    env = git_env() | {"GIT_CEILING_DIRECTORIES": str(Path(repo).resolve().parent)}
    r = subprocess.run(["git", "apply", "--whitespace=nowarn", "-"], cwd=repo, input=patch.encode(),
                       capture_output=True, env=env)
    if r.returncode != 0:
        raise TaskError(f"{what} does not apply: {r.stderr.decode(errors='replace').strip()}")


def check(path, root=None, out=sys.stdout):
    """Proves every row of `path` through the grader; returns the failures."""
    import grade

    failures, prepared = [], {}
    all_tasks = load(path, root)
    for task in all_tasks:
        tid = task["instance_id"]
        try:
            missing = base_missing(task)
            if missing:
                raise TaskError(missing)
            spec = json.dumps(task["environment"], sort_keys=True)
            if spec not in prepared:
                prepared[spec] = envs.prepare(task["environment"])
            env = prepared[spec]
            with tempfile.TemporaryDirectory(prefix="mswe-check-") as tmp:
                base = materialize(task, Path(tmp) / "base")
                at_base = grade.grade(task, base, env=env)
                gold = materialize(task, Path(tmp) / "gold")
                apply_patch(gold, task["patch"], "patch")
                fixed = grade.grade(task, gold, env=env)
            problems = []
            for t in task["FAIL_TO_PASS"]:
                if at_base["outcomes"].get(t) == "passed":
                    problems.append(f"FAIL_TO_PASS {t} passes at base")
                if fixed["outcomes"].get(t) != "passed":
                    problems.append(f"FAIL_TO_PASS {t} is {fixed['outcomes'].get(t)} with the gold patch")
            for t in task["PASS_TO_PASS"]:
                for name, r in (("at base", at_base), ("with the gold patch", fixed)):
                    if r["outcomes"].get(t) != "passed":
                        problems.append(f"PASS_TO_PASS {t} is {r['outcomes'].get(t)} {name}")
            if fixed["value"] != 1.0 and not problems:
                problems.append(f"the gold patch scores {fixed['value']}: {fixed['flags']}")
            flags = [f for f in fixed["flags"] if f["fatal"]] + [f for f in at_base["flags"] if f["fatal"]]
            if flags:
                problems.append(f"fatal flags: {flags}")
            for f in fixed["flags"]:
                print(f"{tid}: note: the gold patch: {f['path']}: {f['reason']}", file=out)
        except (TaskError, envs.EnvError, grade.GradeError) as e:
            problems = [str(e)]
        if problems:
            failures.append((tid, problems))
            for p in problems:
                print(f"{tid}: FAIL: {p}", file=out)
    sandbox = grade.sandbox_kind()
    print(f"checked {len(all_tasks)} tasks ({sandbox} sandbox): "
          f"{len(all_tasks) - len(failures)} ok, {len(failures)} failed", file=out)
    return failures


def main():
    """Converts a SWE-bench / SWE-smith style JSONL or parquet file into agl
    data rows (test id lists decoded, defaults filled in, a split on every
    row), or checks a task file (--check)."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("rows", type=Path, nargs="?", help="input JSONL or parquet (instance rows)")
    ap.add_argument("--out", type=Path, help="agl run data file to write")
    ap.add_argument("--root", type=Path, default=None, help="tasks root (default $MSWE_TASKS_ROOT)")
    ap.add_argument("--val", type=int, default=0, help="rows without a split: the last N are val")
    ap.add_argument("--check", type=Path, metavar="FILE", help="prove every row of FILE through the grader")
    args = ap.parse_args()
    if args.check:
        sys.exit(1 if check(args.check, args.root) else 0)
    if not args.rows or not args.out:
        ap.error("give IN --out OUT (convert) or --check FILE")
    raw = read_rows(args.rows)
    rows = []
    for i, task in enumerate(load(args.rows, args.root)):
        missing = base_missing(task)
        if missing:
            print(f"warning: {task['instance_id']}: {missing}")
        row = public(task)
        if not raw[i].get("split"):
            row["split"] = "val" if i >= len(raw) - args.val else "train"
        rows.append(row)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} rows to {args.out}")


if __name__ == "__main__":
    main()
