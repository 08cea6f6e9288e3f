"""Reward `tests-pass`, in Python (the Rust `plugins/tests-pass`, same
config and results): the grade a test-running grader posted as the
rollout's last `reward` event; None (excluded) without one.

Optional shaping (`[plugin.tests-pass-py]`) for solved rollouts only
(value 1.0): `step_penalty` (>= 0, default 0.0) per model call that
produced tokens, never below `min_reward` (<= 1.0, default 0.0).
"""

import math

from agl_plugin import config, debug, last_reward, reward

SOLVED = 1.0
DEFAULTS = {"step_penalty": 0.0, "min_reward": 0.0}


def settings():
    cfg = config(DEFAULTS)
    penalty, floor = cfg["step_penalty"], cfg["min_reward"]
    if isinstance(penalty, bool) or not isinstance(penalty, (int, float)) \
            or not math.isfinite(penalty) or penalty < 0:
        raise ValueError(f"invalid plugin config: step_penalty must be a finite number >= 0, got {penalty}")
    if isinstance(floor, bool) or not isinstance(floor, (int, float)) \
            or not math.isfinite(floor) or floor > SOLVED:
        raise ValueError(f"invalid plugin config: min_reward must be a finite number <= {SOLVED}, got {floor}")
    return float(penalty), float(floor)


@reward
def score(rollout):
    penalty, floor = settings()
    value = last_reward(rollout)
    if value is None or value != SOLVED or penalty == 0.0:
        return value
    # Failed or cancelled calls produced nothing: not a step.
    steps = sum(1 for c in rollout.calls if c.response_ids)
    shaped = max(value - penalty * steps, floor)
    debug(f"rollout {rollout.id}: solved in {steps} steps, reward {shaped}")
    return shaped
