#!/usr/bin/env python3
"""One mini-swe rollout, started by the agl controller per attempt.

The task's environment, its base state, the grading and the reward are
rollout.py's (shared with the claude-code, codex and opencode examples);
this file runs mini:

1. Prepares (or reuses) the task's environment (a venv, envs.py) and
   writes the task's base state (AGL_INPUT: a row of tasks.jsonl, see
   tasks.py) to a fresh temp dir, without history.
2. Runs the unmodified `mini` CLI (mini-swe-agent 2.4.6, default mini.yaml,
   tool calling) in it: model `openai/<name>` at the rollout's proxy
   (OPENAI_BASE_URL / OPENAI_API_KEY from the controller, handed over in a
   per-rollout config file rather than the agent shell's environment),
   non-interactive (-y --exit-immediately, stdin closed), offline (local cost
   map, cost errors ignored), with a step limit and a wall-time limit, and
   the task environment's interpreter first on PATH as `python`.
3. Grades with grade.py, out of the agent's reach: its changes to tests,
   test configuration, start-up hooks and the runner are dropped and
   flagged, the hidden tests (test_patch) and the kept changes go onto a
   fresh copy of the base state, and FAIL_TO_PASS + PASS_TO_PASS run there
   with an isolated runner, a time limit and no network. Posts the `reward`
   event to AGL_EVENT_URL:
   {"value": 1.0 if every test passes and nothing fatal was flagged else 0.0,
    "tests": {"passed": [...], "failed": [...]},
    "exit_status": "Submitted" | "LimitsExceeded" | "TimeExceeded" | ...,
    "flags": [{"path", "reason", "fatal"}, ...], "model_patch": "...",
    "sandbox": "unshare" | "audit"}
   The reward does not depend on how mini stopped: only the tests count.

Exit codes: 0 = scored (reward posted); 75 = system failure, nothing posted
(mini crashed, e.g. the engine was unreachable after its retries; agl
retries the attempt and never scores it 0); 2 = bad task row.

Environment (all optional): MSWE_TASKS_ROOT (snapshots and mirrors),
MSWE_ENVS_ROOT (prepared environments), MSWE_STEP_LIMIT (20),
MSWE_WALL_TIME (600 s), MSWE_CMD_TIMEOUT (60 s per command),
MSWE_TEST_TIMEOUT (120 s), MSWE_GRADE_SANDBOX (auto | unshare | audit),
MSWE_TASK_PYTHON (the task's interpreter instead of the prepared
environment's; not verified), MSWE_MINI (the mini binary; default next to
this interpreter, else on PATH), MSWE_MODEL (policy), MSWE_TEMPERATURE and
MSWE_MAX_TOKENS (per model call; unset: the engine's default),
MSWE_KEEP_WORKDIR=1 (keep the temp dir).
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rollout  # noqa: E402
from rollout import Outcome, env_int  # noqa: E402

# How mini stops when the policy, not the system, ended the episode.
AGENT_STATUSES = {"Submitted", "LimitsExceeded", "TimeExceeded", "RepeatedFormatError"}
# Raised by litellm when the policy's context overflows: the policy's doing.
AGENT_ERRORS = {"ContextWindowExceededError"}


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
    """Runs mini in `repo`; scored when mini says the policy stopped it."""
    config = work / "rollout.yaml"
    mini_config(config, os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"])
    env = rollout.agent_env(work, {
        "MSWEA_CONFIGURED": "true",
        "MSWEA_SILENT_STARTUP": "1",
        "MSWEA_COST_TRACKING": "ignore_errors",
        "MSWEA_GLOBAL_CONFIG_DIR": str(work / "mswea"),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
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
    if status not in AGENT_STATUSES and status not in AGENT_ERRORS:
        return Outcome(False, f"mini failed (rc {rc}, exit_status {status})")
    return Outcome(True, status)


if __name__ == "__main__":
    sys.exit(rollout.main(run_mini))
