"""agl's guest SDK for plugins written in Python (built into WebAssembly
components with componentize-py against `wit/agl.wit`; see
plugins/README.md).

The WIT records come from the bindings componentize-py generates at build
time (`wit_world.imports.types`: Rollout, ModelCall, Event, Sample, Span,
ChainBreak, PluginInfo); this module adds what the Rust SDK's helpers do,
with the same semantics, and `reward_world`, which turns a plain function
into the component's `WitWorld`.
"""

import json
import traceback

from componentize_py_types import Err
from wit_world.imports import types

REWARD = "reward"


def input_value(rollout):
    """The rollout's input, parsed."""
    return json.loads(rollout.input_json)


def last_reward(rollout):
    """The harness's own reward: the last `reward` event's `{"value": n}`
    (or bare number) payload; None without one. A last reward event
    without a number is an error, as in the Rust SDK's `last_reward`."""
    events = [e for e in rollout.events if e.kind == REWARD]
    if not events:
        return None
    payload = json.loads(events[-1].payload_json)
    value = payload.get("value") if isinstance(payload, dict) else payload
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"the last reward event has no number: {events[-1].payload_json}")
    return float(value)


def reward_world(name, version, description, reward):
    """The `WitWorld` class of a reward plugin whose `reward(rollout)`
    returns a float or None (None: the rollout has no reward and is left
    out). An exception fails that rollout's reward with its traceback."""

    class WitWorld:
        def describe(self):
            return types.PluginInfo(name=name, version=version, description=description)

        def reward(self, rollout):
            try:
                value = reward(rollout)
            except Exception:
                raise Err(traceback.format_exc(limit=8))
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise Err(f"{name}: reward() returned {type(value).__name__}, not a number or None")
            return None if value is None else float(value)

    return WitWorld
