"""What a plugin author implements, and the component's `WitWorld`.

    @reward
    def score(rollout): ...          # -> float | None

    @adapter
    def build_samples(rollout): ...  # -> list[Sample]

`agl plugin build` generates the component's entry module, which imports
the plugin's `app.py` and takes `WitWorld` from `component(...)` with the
name, version and description of its `plugin.toml`.
"""

import math
import traceback

from componentize_py_types import Err
from wit_world.imports.types import PluginInfo, Sample

REWARD = "reward"
ADAPTER = "sample-adapter"

_registered = {}


def _register(world, fn):
    if world in _registered and _registered[world] is not fn:
        raise RuntimeError(f"a second @{_DECORATOR[world]} function: {fn.__name__} "
                           f"(already {_registered[world].__name__})")
    _registered[world] = fn
    return fn


def reward(fn):
    """Marks `fn(rollout) -> float | None` as the plugin's reward. None: this
    rollout has no reward (it is left out, not scored 0); an exception
    fails this rollout's reward with its traceback."""
    return _register(REWARD, fn)


def adapter(fn):
    """Marks `fn(rollout) -> list[Sample]` as the plugin's sample adapter;
    an exception fails this rollout's samples with its traceback."""
    return _register(ADAPTER, fn)


_DECORATOR = {REWARD: "reward", ADAPTER: "adapter"}


def registered(world):
    """The function registered for `world` (None without one)."""
    return _registered.get(world)


def _failure(name):
    return Err(f"{name}: {traceback.format_exc(limit=8).rstrip()}")


def checked_reward(name, value):
    """A reward function's return value as the WIT wants it, or Err."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Err(f"{name}: the reward function returned {type(value).__name__} "
                  f"({value!r:.80}), not a number or None")
    if not math.isfinite(value):
        raise Err(f"{name}: the reward function returned {value}, not a finite number")
    return float(value)


def checked_samples(name, samples):
    if not isinstance(samples, (list, tuple)) or not all(isinstance(s, Sample) for s in samples):
        raise Err(f"{name}: the adapter returned {type(samples).__name__}, not a list of Sample")
    return list(samples)


def component(world, name, version, description):
    """The `WitWorld` class exporting the registered function for `world`."""
    fn = registered(world)
    if fn is None:
        raise RuntimeError(f"app.py has no @{_DECORATOR.get(world, world)} function "
                           f"(plugin.toml says world = {world!r})")
    info = PluginInfo(name=name, version=version, description=description)

    class RewardWorld:
        def describe(self):
            return info

        def reward(self, rollout):
            try:
                value = fn(rollout)
            except BaseException:  # noqa: B036 - SystemExit too: fail the rollout, not the host
                raise _failure(name) from None
            return checked_reward(name, value)

    class AdapterWorld:
        def describe(self):
            return info

        def build_samples(self, rollout):
            try:
                samples = fn(rollout)
            except BaseException:  # noqa: B036
                raise _failure(name) from None
            return checked_samples(name, samples)

    return {REWARD: RewardWorld, ADAPTER: AdapterWorld}[world]
