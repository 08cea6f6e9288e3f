#!/usr/bin/env python3
"""One Claude Code rollout on a mini-swe bug-fix task, started by the agl
controller per attempt. The task's base state, its environment, the
grading the agent cannot reach (grade.py: a fresh copy, only the agent's
source changes, isolated runner, no network) and the reward are
examples/mini-swe/rollout.py's; this file runs the unmodified
`claude` CLI (pinned 2.1.328 by deploy/setup.sh) headless in the copy:

  claude -p <problem_statement> --output-format json --max-turns N
         --tools T --allowedTools T [--bare] [--system-prompt S]

- model calls go to the rollout's Messages proxy (ANTHROPIC_BASE_URL, the
  rollout token as ANTHROPIC_API_KEY, model `policy`): the controller's
  variables, handed to Claude Code alone;
- a private HOME per rollout (its settings, sessions and todos stay there),
  telemetry, auto-update and other background traffic off
  (CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC, DISABLE_TELEMETRY,
  DISABLE_AUTOUPDATER), and CLAUDE_CODE_ATTRIBUTION_HEADER=0 (no
  per-conversation billing line; the gateway drops it anyway);
- permissions: the tools in CC_TOOLS are allowed without asking
  (`--allowedTools`; `bypassPermissions` is refused when running as root),
  in the rollout's scratch copy of the repo.

How it stopped (`exit_status`): Claude Code's result `subtype` (`success`,
`error_max_turns`, `error_during_execution`, ...) or `TimeExceeded`; all
scored. Exit 75 (system failure, retried, never scored) when Claude Code
could not start or the gateway was unreachable.

Environment (all optional, besides rollout.py's): CC_MAX_TURNS (20),
CC_WALL_TIME (900 s), CC_TOOLS ("Bash,Read,Edit,Write"; "Agent" lets it
start sub-agents, which needs CC_BARE=0), CC_BARE (1: `--bare`, no hooks,
CLAUDE.md discovery, plugins or Agent tool), CC_SYSTEM_PROMPT (replaces
Claude Code's own system prompt; a small-context model needs it),
CC_MAX_TOKENS (CLAUDE_CODE_MAX_OUTPUT_TOKENS per call), CC_CLAUDE (the
binary; default: the one setup installed, else `claude` on PATH),
CC_MODEL (policy).
"""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "mini-swe"))
import rollout  # noqa: E402
from rollout import Outcome, env_int  # noqa: E402


def run_claude(work, repo, task):
    home = work / "home"
    home.mkdir()
    tools = os.environ.get("CC_TOOLS") or "Bash,Read,Edit,Write"
    cmd = [
        rollout.node_cli("claude", "CC_CLAUDE"), "-p", task["problem_statement"], "--output-format", "json",
        "--max-turns", str(env_int("CC_MAX_TURNS", 20)), "--tools", tools, "--allowedTools", tools,
    ]
    if os.environ.get("CC_BARE", "1") != "0":
        cmd.append("--bare")
    if os.environ.get("CC_SYSTEM_PROMPT"):
        cmd += ["--system-prompt", os.environ["CC_SYSTEM_PROMPT"]]
    extra = {
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": os.environ["ANTHROPIC_BASE_URL"],
        "ANTHROPIC_API_KEY": os.environ.get("ANTHROPIC_AUTH_TOKEN") or os.environ["OPENAI_API_KEY"],
        "ANTHROPIC_MODEL": os.environ.get("CC_MODEL") or "policy",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
    }
    if os.environ.get("CC_MAX_TOKENS"):
        extra["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = os.environ["CC_MAX_TOKENS"]
    env = rollout.agent_env(work, extra)
    rc, out = rollout.run_cli(cmd, repo, env, env_int("CC_WALL_TIME", 900))
    try:
        result = json.loads(out.strip().splitlines()[-1])
        status = result.get("subtype") or "unknown"
        if result.get("is_error") and status == "success":
            # An API error the model's turn ended on (the gateway's
            # context-length error, say): the policy's doing.
            status = "error_api"
    except (ValueError, IndexError, AttributeError):
        status = "no result"
    outcome = rollout.cli_outcome(rc, status)
    if outcome.scored and status == "no result":
        return Outcome(False, f"claude exited {rc} without a result")
    return outcome


if __name__ == "__main__":
    sys.exit(rollout.main(run_claude, prefix="cc-"))
