#!/usr/bin/env python3
"""One OpenCode rollout on a mini-swe bug-fix task, started by the agl
controller per attempt. The task's base state, its environment, the
grading the agent cannot reach (grade.py: a fresh copy, only the agent's
source changes, isolated runner, no network) and the reward are
examples/mini-swe/rollout.py's; this file runs the unmodified
`opencode` CLI (pinned 1.18.33 by deploy/setup.sh) headless in the copy:

  opencode run -m agl/policy <problem_statement>

- its config (OPENCODE_CONFIG, outside the repo) names one provider, the
  rollout's Chat Completions proxy through `@ai-sdk/openai-compatible`
  (`options.baseURL` = OPENAI_BASE_URL, the token from AGL_ROLLOUT_TOKEN),
  sharing and auto-update off, every permission allowed (the agent works in
  the rollout's scratch copy);
- OpenCode takes its project directory from $PWD, not the process's
  working directory: both are the copy; HOME and the XDG dirs are the
  rollout's own;
- OpenCode has no turn limit flag: OC_WALL_TIME bounds the episode.

How it stopped (`exit_status`): `completed` (exit 0), `failed` (non-zero
with the gateway up), or `TimeExceeded`; all scored. Exit 75 (system
failure, retried, never scored) when OpenCode could not start or the
gateway was unreachable.

Environment (all optional, besides rollout.py's): OC_WALL_TIME (900 s),
OC_OPENCODE (the binary; default: the one setup installed, else `opencode`
on PATH), OC_MODEL (policy).
"""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "mini-swe"))
import rollout  # noqa: E402
from rollout import env_int  # noqa: E402


def run_opencode(work, repo, task):
    model = os.environ.get("OC_MODEL") or "policy"
    config = {
        "$schema": "https://opencode.ai/config.json",
        "model": f"agl/{model}",
        "share": "disabled",
        "autoupdate": False,
        "permission": {"edit": "allow", "bash": "allow", "webfetch": "deny"},
        "provider": {"agl": {
            "npm": "@ai-sdk/openai-compatible",
            "name": "agl",
            "options": {"baseURL": os.environ["OPENAI_BASE_URL"], "apiKey": "{env:AGL_ROLLOUT_TOKEN}"},
            "models": {model: {"name": model}},
        }},
    }
    path = work / "opencode.json"
    path.write_text(json.dumps(config))
    home = work / "home"
    home.mkdir()
    env = rollout.agent_env(work, {
        "PWD": str(repo),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local/share"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_STATE_HOME": str(home / ".local/state"),
        "OPENCODE_CONFIG": str(path),
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "AGL_ROLLOUT_TOKEN": os.environ["OPENAI_API_KEY"],
    })
    cmd = [rollout.node_cli("opencode", "OC_OPENCODE"), "run", "-m", f"agl/{model}", task["problem_statement"]]
    rc, _ = rollout.run_cli(cmd, repo, env, env_int("OC_WALL_TIME", 900))
    return rollout.cli_outcome(rc, "completed" if rc == 0 else "failed")


if __name__ == "__main__":
    sys.exit(rollout.main(run_opencode, prefix="oc-"))
