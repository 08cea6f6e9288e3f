"""The host's rule for `model-call.prompt` (`wit/agl.wit`, `record prompt`;
host/plugin-host/src/links.rs), for hand-made rollouts (`testing`): each
prompt is linked to the call, among the gateway's `continues` target and
the latest calls with response ids (of its agent, and of any) with their
sibling choices, whose prompt + response it shares the longest start with
(the latest on a tie)."""

from .calls import agent
from .samples import common_prefix_len


def prompt_links(calls, prompts):
    """`(extends, shared)` of every call of `calls` (`extends` a call index,
    None when no candidate shares a first id); `prompts[i]` is `calls[i]`'s
    whole prompt."""
    links = []
    latest_of_agent = {}
    latest = None
    for at, call in enumerate(calls):
        key = agent(call)
        candidates = set()
        if call.continues is not None:
            target = next((c for c in reversed(range(at)) if calls[c].index == call.continues), None)
            candidates.update([target] if target is not None else [])
        for tip in (latest_of_agent.get(key), latest):
            if tip is not None:
                candidates.update(_with_siblings(calls, tip, at))
        shared, best = max(((_shared_start(prompts[at], prompts[c], calls[c].response_ids), c)
                            for c in candidates), default=(0, None))
        links.append((calls[best].index, shared) if shared > 0 else (None, 0))
        if call.response_ids:
            latest_of_agent[key] = at
            latest = at
    return links


def _with_siblings(calls, tip, before):
    """`tip` and the other choices of its request before `before` (siblings
    are recorded next to each other)."""
    choice = calls[tip].choice
    if choice is None:
        return [tip]
    first = max(tip - choice.index, 0)
    return [c for c in range(first, min(first + choice.count, before))
            if calls[c].choice is not None and calls[c].choice.count == choice.count]


def _shared_start(prompt, before, response):
    """How many first ids `prompt` shares with `before ++ response`."""
    in_prompt = common_prefix_len(prompt, before)
    if in_prompt < len(before):
        return in_prompt
    return in_prompt + common_prefix_len(prompt[in_prompt:], response)
