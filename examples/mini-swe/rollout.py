"""One bug-fix rollout, whatever the harness: the part every example's
run_rollout.py shares (mini-swe here; claude-code, codex and opencode
import it from here).

1. Reads the task row (AGL_INPUT, see tasks.py), prepares (or reuses) the
   task's environment (envs.py: a venv per distinct `environment`) and
   writes the task's base state to a fresh temp dir: its snapshot without
   `.git`, or `git archive base_commit` of its mirror, so the agent cannot
   `git diff` / `git log` its way to the answer.
2. Hands `(work, repo, task)` to the harness's `run_agent`, which runs the
   unmodified agent in `repo` (`agent_env`: the task environment's python
   first on PATH) and says how it stopped (an `Outcome`).
3. Grades with grade.py, which the agent cannot reach: its changes are
   diffed against the base state, changes to tests, test configuration,
   start-up hooks, shadowing modules, VCS metadata, symlinks and runner
   tampering are dropped and flagged, and FAIL_TO_PASS + PASS_TO_PASS run
   on a fresh copy (base + test_patch + the kept changes) with an isolated
   runner, a time limit and no network. Posts the `reward` event to
   AGL_EVENT_URL:
   {"value": 1.0 if every test passes and nothing fatal was flagged else 0.0,
    "tests": {"passed": [...], "failed": [...]},
    "exit_status": how the agent stopped,
    "flags": [{"path", "reason", "fatal"}, ...],
    "model_patch": the applied changes (a git diff, at most 64 KiB),
    "sandbox": "unshare" | "audit"}
   The reward does not depend on how the agent stopped: only the tests count.

Exit codes: 0 = scored (reward posted); 75 = system failure, nothing posted
(the agent could not run, the environment could not be prepared, or the
gateway was unreachable: agl retries the attempt and never scores it 0);
2 = bad task row (no base state, a test_patch that does not apply).

Environment (all optional): MSWE_TASKS_ROOT (snapshots and mirrors),
MSWE_ENVS_ROOT (prepared environments), MSWE_TEST_TIMEOUT (120 s),
MSWE_GRADE_SANDBOX (auto | unshare | audit), MSWE_TASK_PYTHON (the task's
interpreter, instead of the prepared environment's: not verified),
MSWE_KEEP_WORKDIR=1 (keep the temp dir).
"""

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import envs  # noqa: E402
import grade  # noqa: E402
import tasks  # noqa: E402

SYSTEM_FAILURE = int(os.environ.get("AGL_SYSTEM_FAILURE_EXIT_CODE", "75"))
# What the agent's own shell must not see: its input (which holds the gold
# patch and the hidden tests), the event URL, the rollout's credentials
# (each harness gets its own in a config file or its own variable), and
# where the task sources live.
HIDDEN_ENV = (
    "AGL_INPUT", "AGL_EVENT_URL", "OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_API_BASE",
    "ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_API_KEY", "MSWE_TASKS_ROOT",
)
# The prepared task environment's interpreter (main() sets it).
_TASK_PYTHON = None


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
    """The task's interpreter: MSWE_TASK_PYTHON, else the prepared
    environment's (once main() prepared it), else this one."""
    return os.environ.get("MSWE_TASK_PYTHON") or _TASK_PYTHON or sys.executable


def hide_input():
    """Makes this process non-dumpable (Linux): other processes of the same
    user, the agent included, can no longer read /proc/<pid>/environ, where
    AGL_INPUT (the gold patch, the hidden tests) would be. Best effort."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    except (OSError, AttributeError):
        pass


def become_subreaper():
    """Makes this process the reaper of its orphaned descendants (Linux), so
    that whatever the agent left running in the background is found, and
    killed, before grading. Best effort."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def kill_leftovers():
    """Kills every child process still running (the agent's background
    processes, reparented here), until none is left. Linux /proc only."""
    me = str(os.getpid())
    for _ in range(100):
        kids = []
        for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if stat[stat.rfind(")") + 2:].split()[1] == me:
                kids.append(int(entry))
        if not kids:
            return
        for pid in kids:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        for pid in kids:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def agent_env(work, extra=None):
    """The agent's environment: this one without HIDDEN_ENV, the task's
    interpreter first on PATH as `python` / `python3` (small scripts that
    exec it: a symlink to a venv's python would lose the venv), plus
    `extra`."""
    bin_dir = work / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("python", "python3"):
        script = bin_dir / name
        if not script.exists():
            script.write_text(f"#!/bin/sh\nexec {shlex.quote(task_python())} \"$@\"\n")
            script.chmod(0o755)
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
    global _TASK_PYTHON
    hide_input()
    become_subreaper()
    try:
        task = tasks.normalize(json.loads(os.environ.get("AGL_INPUT") or "{}"))
    except (ValueError, tasks.TaskError) as e:
        log(f"bad task row: {e}")
        return 2
    missing = tasks.base_missing(task)
    if missing:
        log(f"{missing} (run examples/mini-swe/gen_tasks.py)")
        return 2
    env = None
    if not os.environ.get("MSWE_TASK_PYTHON"):
        try:
            env = envs.prepare(task["environment"], log=log)
        except envs.EnvError as e:
            log(f"environment: {e}: system failure, not scored")
            return SYSTEM_FAILURE
        _TASK_PYTHON = str(env.python)
    work = Path(tempfile.mkdtemp(prefix=prefix))  # no "=": mini reads "-c a=b" as a key
    try:
        repo = work / "repo"
        try:
            tasks.materialize(task, repo)
        except tasks.TaskError as e:
            log(f"bad task row: {e}")
            return 2
        base_digest = grade.tree_digest(repo)
        try:
            outcome = run_agent(work, repo, task)
        except FileNotFoundError as e:
            outcome = Outcome(False, f"cannot start the agent: {e}")
        finally:
            kill_leftovers()
        if not outcome.scored:
            log(f"{outcome.status}: system failure, not scored")
            return SYSTEM_FAILURE
        try:
            result = grade.grade(task, repo, env=env, python=task_python(), base_digest=base_digest)
        except tasks.TaskError as e:
            log(f"bad task row: {e}")
            return 2
        except grade.GradeError as e:
            log(f"grading: {e}: system failure, not scored")
            return SYSTEM_FAILURE
        for f in result["flags"]:
            log(f"flag{' (fatal)' if f['fatal'] else ''}: {f['path']}: {f['reason']}")
        post_event("reward", {
            "value": result["value"], "tests": result["tests"], "exit_status": outcome.status,
            "flags": result["flags"], "model_patch": result["model_patch"], "sandbox": result["sandbox"],
        })
        print(json.dumps({"instance_id": task["instance_id"], "exit_status": outcome.status,
                          "reward": result["value"], "flags": len(result["flags"])}))
        return 0
    finally:
        if os.environ.get("MSWE_KEEP_WORKDIR") != "1":
            shutil.rmtree(work, ignore_errors=True)
