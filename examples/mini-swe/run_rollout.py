#!/usr/bin/env python3
"""One mini-swe rollout, started by the agl controller per attempt.

1. Copies the task's repo snapshot (AGL_INPUT: a row of tasks.jsonl, see
   tasks.py) to a fresh temp dir, without `.git`, so the agent cannot
   `git diff`/`git log` its way to the answer.
2. Runs the unmodified `mini` CLI (mini-swe-agent 2.4.6, default mini.yaml,
   tool calling) in it: model `openai/<name>` at the rollout's proxy
   (OPENAI_BASE_URL / OPENAI_API_KEY from the controller, handed over in a
   per-rollout config file rather than the agent shell's environment),
   non-interactive (-y --exit-immediately, stdin closed), offline (local cost
   map, cost errors ignored), with a step limit and a wall-time limit, and
   the task's interpreter first on PATH as `python`.
3. Restores the pristine test files (an agent that edits the tests gains
   nothing), applies the row's `test_patch` if any, runs FAIL_TO_PASS and
   PASS_TO_PASS, and posts the `reward` event to AGL_EVENT_URL:
   {"value": 1.0 if every test passes else 0.0,
    "tests": {"passed": [...], "failed": [...]},
    "exit_status": "Submitted" | "LimitsExceeded" | "TimeExceeded" | ...}
   The reward does not depend on how mini stopped: only the tests count.

Exit codes: 0 = scored (reward posted); 75 = system failure, nothing posted
(mini crashed, e.g. the engine was unreachable after its retries; agl
retries the attempt and never scores it 0); 2 = bad task row.

Environment (all optional): MSWE_TASKS_ROOT (repo snapshots),
MSWE_STEP_LIMIT (20), MSWE_WALL_TIME (600 s), MSWE_CMD_TIMEOUT (60 s per
command), MSWE_TEST_TIMEOUT (120 s), MSWE_TASK_PYTHON (the task's
interpreter; default this one), MSWE_MINI (the mini binary; default next to
this interpreter, else on PATH), MSWE_MODEL (policy), MSWE_TEMPERATURE and
MSWE_MAX_TOKENS (per model call; unset: the engine's default),
MSWE_KEEP_WORKDIR=1 (keep the temp dir).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tasks  # noqa: E402

SYSTEM_FAILURE = int(os.environ.get("AGL_SYSTEM_FAILURE_EXIT_CODE", "75"))
# How mini stops when the policy, not the system, ended the episode.
AGENT_STATUSES = {"Submitted", "LimitsExceeded", "TimeExceeded", "RepeatedFormatError"}
# Raised by litellm when the policy's context overflows: the policy's doing.
AGENT_ERRORS = {"ContextWindowExceededError"}
# Variables the agent's shell must not see (its own input, the event URL).
HIDDEN_ENV = ("AGL_INPUT", "AGL_EVENT_URL", "OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_API_BASE")


def env_int(name, default):
    return int(os.environ.get(name) or default)


def log(message):
    print(f"run_rollout: {message}", file=sys.stderr, flush=True)


def mini_binary():
    if os.environ.get("MSWE_MINI"):
        return os.environ["MSWE_MINI"]
    local = Path(sys.executable).parent / "mini"
    return str(local) if local.exists() else (shutil.which("mini") or "mini")


def mini_config(path, base_url, api_key):
    """The per-rollout config: mini's -c accepts JSON files as YAML."""
    kwargs = {"api_base": base_url, "api_key": api_key}
    if os.environ.get("MSWE_TEMPERATURE"):
        kwargs["temperature"] = float(os.environ["MSWE_TEMPERATURE"])
    if os.environ.get("MSWE_MAX_TOKENS"):
        kwargs["max_tokens"] = int(os.environ["MSWE_MAX_TOKENS"])
    config = {
        "agent": {
            "step_limit": env_int("MSWE_STEP_LIMIT", 20),
            "wall_time_limit_seconds": env_int("MSWE_WALL_TIME", 600),
            "cost_limit": 0,
        },
        "environment": {"timeout": env_int("MSWE_CMD_TIMEOUT", 60)},
        "model": {"model_kwargs": kwargs, "cost_tracking": "ignore_errors"},
    }
    path.write_text(json.dumps(config))
    path.chmod(0o600)


def run_mini(work, repo, task):
    """Runs mini in `repo`; returns (process rc, exit_status or None)."""
    bin_dir = work / "bin"
    bin_dir.mkdir()
    python = os.environ.get("MSWE_TASK_PYTHON") or sys.executable
    for name in ("python", "python3"):
        (bin_dir / name).symlink_to(python)
    config = work / "rollout.yaml"
    mini_config(config, os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"])
    env = {k: v for k, v in os.environ.items() if k not in HIDDEN_ENV}
    env.update({
        "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        "MSWEA_CONFIGURED": "true",
        "MSWEA_SILENT_STARTUP": "1",
        "MSWEA_COST_TRACKING": "ignore_errors",
        "MSWEA_GLOBAL_CONFIG_DIR": str(work / "mswea"),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "PYTHONDONTWRITEBYTECODE": "1",
    })
    traj = work / "traj.json"
    model = os.environ.get("MSWE_MODEL") or "policy"
    cmd = [
        mini_binary(), "-y", "--exit-immediately", "-m", f"openai/{model}",
        "-c", "mini.yaml", "-c", str(config), "-t", task["problem_statement"], "-o", str(traj),
    ]
    rc = subprocess.run(cmd, cwd=repo, env=env, stdin=subprocess.DEVNULL, stdout=sys.stderr).returncode
    try:
        status = json.loads(traj.read_text())["info"]["exit_status"]
    except (OSError, ValueError, KeyError, TypeError):
        status = None
    return rc, status


def restore_tests(task, repo):
    """Puts the snapshot's test files back (and removes ones the agent made up)."""
    for rel in task["test_files"]:
        src, dst = task["repo_dir"] / rel, repo / rel
        if dst.is_dir() and not dst.is_symlink():
            shutil.rmtree(dst)
        elif dst.exists() or dst.is_symlink():
            dst.unlink()
        if src.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    if task.get("test_patch"):
        subprocess.run(["git", "apply", "-"], cwd=repo, input=task["test_patch"].encode(), check=True)


def run_test(task, repo, test_id):
    python = os.environ.get("MSWE_TASK_PYTHON") or sys.executable
    if task["test_runner"] == "pytest":
        cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_id]
    else:
        cmd = [python, "-m", "unittest", test_id]
    try:
        r = subprocess.run(
            cmd, cwd=repo, stdin=subprocess.DEVNULL, capture_output=True,
            timeout=env_int("MSWE_TEST_TIMEOUT", 120), env=os.environ | {"PYTHONDONTWRITEBYTECODE": "1"},
        )
    except subprocess.TimeoutExpired:
        return False
    return r.returncode == 0


def post_event(kind, payload):
    body = json.dumps({"kind": kind, "payload": payload}).encode()
    req = urllib.request.Request(
        os.environ["AGL_EVENT_URL"],
        data=body,
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}",
        },
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        resp.read()


def main():
    try:
        task = tasks.normalize(json.loads(os.environ.get("AGL_INPUT") or "{}"))
    except (ValueError, tasks.TaskError) as e:
        log(f"bad task row: {e}")
        return 2
    if not task["repo_dir"].is_dir():
        log(f"no repo snapshot at {task['repo_dir']} (run examples/mini-swe/gen_tasks.py)")
        return 2
    work = Path(tempfile.mkdtemp(prefix="mswe-"))  # no "=": mini reads "-c a=b" as a key
    try:
        repo = work / "repo"
        shutil.copytree(task["repo_dir"], repo, ignore=shutil.ignore_patterns(".git"), symlinks=True)
        rc, status = run_mini(work, repo, task)
        if status not in AGENT_STATUSES and status not in AGENT_ERRORS:
            log(f"mini failed (rc {rc}, exit_status {status}): system failure, not scored")
            return SYSTEM_FAILURE
        restore_tests(task, repo)
        results = {t: run_test(task, repo, t) for t in task["FAIL_TO_PASS"] + task["PASS_TO_PASS"]}
        passed = [t for t, ok in results.items() if ok]
        failed = [t for t, ok in results.items() if not ok]
        value = 1.0 if not failed else 0.0
        post_event("reward", {"value": value, "tests": {"passed": passed, "failed": failed},
                              "exit_status": status})
        print(json.dumps({"instance_id": task["instance_id"], "exit_status": status, "reward": value}))
        return 0
    finally:
        if os.environ.get("MSWE_KEEP_WORKDIR") != "1":
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
