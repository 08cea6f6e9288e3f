"""One bug-fix rollout, whatever the harness: the part every example's
run_rollout.py shares (mini-swe here; claude-code, codex and opencode
import it from here).

1. Reads the task row (AGL_INPUT, see tasks.py) and copies its repo snapshot
   to a fresh temp dir without `.git`, so the agent cannot `git diff` /
   `git log` its way to the answer.
2. Hands `(work, repo, task)` to the harness's `run_agent`, which runs the
   unmodified agent in `repo` and says how it stopped (an `Outcome`).
3. Restores the pristine test files (an agent that edits the tests gains
   nothing), applies the row's `test_patch` if any, runs FAIL_TO_PASS and
   PASS_TO_PASS, and posts the `reward` event to AGL_EVENT_URL:
   {"value": 1.0 if every test passes else 0.0,
    "tests": {"passed": [...], "failed": [...]},
    "exit_status": how the agent stopped}
   The reward does not depend on how the agent stopped: only the tests count.

Exit codes: 0 = scored (reward posted); 75 = system failure, nothing posted
(the agent could not run, or the gateway was unreachable: agl retries the
attempt and never scores it 0); 2 = bad task row.

Environment (all optional): MSWE_TASKS_ROOT (repo snapshots),
MSWE_TEST_TIMEOUT (120 s), MSWE_TASK_PYTHON (the task's interpreter;
default this one), MSWE_KEEP_WORKDIR=1 (keep the temp dir).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tasks  # noqa: E402

SYSTEM_FAILURE = int(os.environ.get("AGL_SYSTEM_FAILURE_EXIT_CODE", "75"))
# What the agent's own shell must not see: its input, the event URL, and
# the rollout's credentials (each harness gets its own in a config file or
# its own variable).
HIDDEN_ENV = (
    "AGL_INPUT", "AGL_EVENT_URL", "OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_API_BASE",
    "ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_API_KEY",
)


@dataclass
class Outcome:
    """How the agent stopped. `scored` False: a system failure (exit 75)."""

    scored: bool
    status: str


def env_int(name, default):
    return int(os.environ.get(name) or default)


def log(message):
    print(f"run_rollout: {message}", file=sys.stderr, flush=True)


def task_python():
    return os.environ.get("MSWE_TASK_PYTHON") or sys.executable


def agent_env(work, extra=None):
    """The agent's environment: this one without HIDDEN_ENV, the task's
    interpreter first on PATH as `python` / `python3`, plus `extra`."""
    bin_dir = work / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("python", "python3"):
        link = bin_dir / name
        if not link.exists():
            link.symlink_to(task_python())
    env = {k: v for k, v in os.environ.items() if k not in HIDDEN_ENV}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra or {})
    return env


def node_cli(name, override):
    """A coding-agent CLI: `$override` if set, else the one deploy/setup.sh
    installed into the venv, else `name` on PATH."""
    if os.environ.get(override):
        return os.environ[override]
    venv = Path(os.environ.get("AGL_VENV") or Path(sys.executable).parents[1])
    local = venv / "node/node_modules/.bin" / name
    return str(local) if local.exists() else (shutil.which(name) or name)


def gateway_reachable():
    """Whether the rollout's proxy answers (`GET .../models` with its token):
    an agent that failed while it does not was failed by the system."""
    base = os.environ.get("OPENAI_BASE_URL", "").rstrip("/")
    req = urllib.request.Request(
        f"{base}/models", headers={"Authorization": f"Bearer {os.environ.get('OPENAI_API_KEY', '')}"}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def run_cli(cmd, repo, env, wall_time):
    """Runs a headless agent CLI in `repo` (stdin closed, its output to our
    stderr); returns (rc or None when it ran out of `wall_time`, stdout)."""
    try:
        r = subprocess.run(
            cmd, cwd=repo, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=sys.stderr, timeout=wall_time,
        )
    except subprocess.TimeoutExpired as e:
        return None, (e.stdout or b"").decode(errors="replace")
    return r.returncode, r.stdout.decode(errors="replace")


def cli_outcome(rc, status):
    """The outcome of a CLI that exited `rc` (None: out of time) with its
    own `status`: scored unless it could not reach the gateway (a CLI that
    retries an unreachable server until its time is up included)."""
    if rc != 0 and not gateway_reachable():
        return Outcome(False, f"gateway unreachable ({'out of time' if rc is None else f'exit {rc}'})")
    if rc is None:
        return Outcome(True, "TimeExceeded")
    if rc < 0:
        return Outcome(False, f"killed by signal {-rc}")
    return Outcome(True, status)


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
    if task["test_runner"] == "pytest":
        cmd = [task_python(), "-m", "pytest", "-q", "-p", "no:cacheprovider", test_id]
    else:
        cmd = [task_python(), "-m", "unittest", test_id]
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


def main(run_agent, prefix="mswe-"):
    """The whole rollout around `run_agent(work, repo, task) -> Outcome`."""
    try:
        task = tasks.normalize(json.loads(os.environ.get("AGL_INPUT") or "{}"))
    except (ValueError, tasks.TaskError) as e:
        log(f"bad task row: {e}")
        return 2
    if not task["repo_dir"].is_dir():
        log(f"no repo snapshot at {task['repo_dir']} (run examples/mini-swe/gen_tasks.py)")
        return 2
    work = Path(tempfile.mkdtemp(prefix=prefix))  # no "=": mini reads "-c a=b" as a key
    try:
        repo = work / "repo"
        shutil.copytree(task["repo_dir"], repo, ignore=shutil.ignore_patterns(".git"), symlinks=True)
        try:
            outcome = run_agent(work, repo, task)
        except FileNotFoundError as e:
            outcome = Outcome(False, f"cannot start the agent: {e}")
        if not outcome.scored:
            log(f"{outcome.status}: system failure, not scored")
            return SYSTEM_FAILURE
        restore_tests(task, repo)
        results = {t: run_test(task, repo, t) for t in task["FAIL_TO_PASS"] + task["PASS_TO_PASS"]}
        passed = [t for t, ok in results.items() if ok]
        failed = [t for t, ok in results.items() if not ok]
        value = 1.0 if not failed else 0.0
        post_event("reward", {"value": value, "tests": {"passed": passed, "failed": failed},
                              "exit_status": outcome.status})
        print(json.dumps({"instance_id": task["instance_id"], "exit_status": outcome.status, "reward": value}))
        return 0
    finally:
        if os.environ.get("MSWE_KEEP_WORKDIR") != "1":
            shutil.rmtree(work, ignore_errors=True)
