"""agl's guest SDK for plugins written in Python.

A plugin is a folder with `plugin.toml` (name, version, description,
world) and `app.py`, built by `agl plugin build DIR` into a WebAssembly
component with componentize-py (CPython inside), which runs in the same
sandbox as a Rust plugin. See plugins/README.md, "In Python".

    from agl_plugin import reward, last_reward

    @reward
    def score(rollout):
        return last_reward(rollout)

The WIT records (`Rollout`, `ModelCall`, `Prompt`, `Event`, `Sample`,
`Span`, `ChainBreak`, ...) are the dataclasses componentize-py generates
from `wit/` at build time; the helpers have the Rust SDK's semantics. A
call carries its prompt as what it adds to an earlier call (`Prompt`);
its JSON and whole prompt come from the host on demand (`request_json`,
`response_json`, `prompt_ids`).
"""

from wit_world.imports.types import (
    ApiKind,
    BreakKind,
    CallChoice,
    ChainBreak,
    Event,
    ModelCall,
    PluginInfo,
    Prompt,
    Rollout,
    RolloutStatus,
    Sample,
    Span,
    Tag,
)

from .calls import (
    agent,
    assistant_message,
    assistant_text,
    content_text,
    final_text,
    graded_tests,
    input_value,
    last_reward,
    last_reward_event,
    request,
    request_messages,
    response,
    tag,
)
from .host import (
    HostError,
    config,
    config_json,
    debug,
    error,
    info,
    log,
    prompt_ids,
    prompt_len,
    request_json,
    response_json,
    tokenizer,
    trace,
    warn,
)
from .samples import classify_break, merge_chains
from .world import adapter, reward

__all__ = [
    "ApiKind", "BreakKind", "CallChoice", "ChainBreak", "Event", "ModelCall", "PluginInfo", "Prompt",
    "Rollout",
    "RolloutStatus", "Sample", "Span", "Tag",
    "agent", "assistant_message", "assistant_text", "content_text", "final_text",
    "graded_tests", "input_value", "last_reward", "last_reward_event", "request",
    "request_messages", "response", "tag",
    "HostError", "config", "config_json", "debug", "error", "info", "log", "prompt_ids",
    "prompt_len", "request_json", "response_json", "tokenizer", "trace", "warn",
    "classify_break", "merge_chains",
    "adapter", "reward",
]
