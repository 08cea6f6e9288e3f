#!/usr/bin/env python3
"""One Codex rollout on a mini-swe bug-fix task, started by the agl
controller per attempt. The task's base state, its environment, the
grading the agent cannot reach (grade.py: a fresh copy, only the agent's
source changes, isolated runner, no network) and the reward are
examples/mini-swe/rollout.py's; this file runs the unmodified
`codex` CLI (pinned 0.169.0 by deploy/setup.sh) headless in the copy:

  codex exec --skip-git-repo-check --sandbox danger-full-access --json
             -o last.txt <problem_statement>

- a private CODEX_HOME per rollout whose config.toml names one provider,
  the rollout's Responses proxy (`base_url` = OPENAI_BASE_URL,
  `wire_api = "responses"`, the token in AGL_ROLLOUT_TOKEN, which
  `env_key` names), model `policy`, retries that ride out agl's pause
  during weight updates, update checks and web search off; HOME is the
  rollout's too;
- `--sandbox danger-full-access`: Codex's own sandbox needs bubblewrap,
  which this runner does not assume; the agent works in the rollout's
  scratch copy (isolate rollouts with the Kubernetes runner);
- Codex has no turn limit of its own: CX_WALL_TIME bounds the episode.

How it stopped (`exit_status`): `completed` (Codex exited 0), `failed`
(it exited non-zero with the gateway up: an error the model's turn ended
on, such as the context-length error), or `TimeExceeded`; all scored.
Exit 75 (system failure, retried, never scored) when Codex could not start
or the gateway was unreachable.

Environment (all optional, besides rollout.py's): CX_WALL_TIME (900 s),
CX_INSTRUCTIONS (replaces Codex's ~18 KB built-in instructions:
`model_instructions_file`; a small-context model needs it), CX_SUBAGENTS=0
(`[agents] enabled = false`: no sub-agent tools),
CX_CODEX (the binary; default: the one setup installed, else `codex` on
PATH), CX_MODEL (policy), CX_RETRIES (request and stream retries, 10).
"""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "mini-swe"))
import rollout  # noqa: E402
from rollout import env_int  # noqa: E402


def codex_config(home, base_url):
    """config.toml: one provider, the rollout's proxy (values as TOML
    strings: JSON string syntax is a TOML basic string)."""
    retries = env_int("CX_RETRIES", 10)
    model = os.environ.get("CX_MODEL") or "policy"
    lines = [
        f"model = {json.dumps(model)}",
        'model_provider = "agl"',
        "check_for_update_on_startup = false",
        # A hosted tool the policy cannot serve (the gateway leaves it out).
        'web_search = "disabled"',
    ]
    if os.environ.get("CX_INSTRUCTIONS"):
        path = home / "instructions.md"
        path.write_text(os.environ["CX_INSTRUCTIONS"])
        lines.append(f"model_instructions_file = {json.dumps(str(path))}")
    if os.environ.get("CX_SUBAGENTS") == "0":
        lines += ["[agents]", "enabled = false"]
    (home / "config.toml").write_text(
        "\n".join(lines) + "\n"
        "[model_providers.agl]\n"
        'name = "agl"\n'
        f"base_url = {json.dumps(base_url)}\n"
        'env_key = "AGL_ROLLOUT_TOKEN"\n'
        'wire_api = "responses"\n'
        f"request_max_retries = {retries}\n"
        f"stream_max_retries = {retries}\n"
    )


def run_codex(work, repo, task):
    home = work / "codex"
    home.mkdir()
    codex_config(home, os.environ["OPENAI_BASE_URL"])
    cmd = [
        rollout.node_cli("codex", "CX_CODEX"), "exec", "--skip-git-repo-check", "--sandbox", "danger-full-access",
        "--json", "-o", str(work / "last.txt"), task["problem_statement"],
    ]
    env = rollout.agent_env(work, {
        "HOME": str(work),
        "CODEX_HOME": str(home),
        "AGL_ROLLOUT_TOKEN": os.environ["OPENAI_API_KEY"],
    })
    rc, _ = rollout.run_cli(cmd, repo, env, env_int("CX_WALL_TIME", 900))
    return rollout.cli_outcome(rc, "completed" if rc == 0 else "failed")


if __name__ == "__main__":
    sys.exit(rollout.main(run_codex, prefix="cx-"))
