"""Building training samples: one chain of calls (`SampleBuilder`), a whole
rollout (`merge_chains`), and why a chain broke (`classify_break`); the
Rust SDK's builder, merge and break classifier, same semantics and
results on the same rollouts (checked against the Rust `trajectory`).
"""

from wit_world.imports.types import ApiKind, BreakKind, ChainBreak, Sample, Span

from . import calls, host
from .messages import messages_extend, same_message


def common_prefix_len(a, b):
    """Length of the longest common prefix of two id lists."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def starts_with_ids(ids, prefix):
    return len(prefix) <= len(ids) and ids[:len(prefix)] == prefix


class SampleBuilder:
    """Accumulates calls into one sample: the first call's prompt is the
    sample's prompt, its response the first trainable span; each extension
    adds the next call's new prompt tokens as masked context (log-prob 0.0),
    then its response as the next trainable span.

    The sample so far is always its last call's prompt + response, so a call
    whose prompt the host linked to that call in full (`prompt.extends`,
    `prompt.shared`) continues it by its `tail` alone, without the whole
    prompt being fetched or compared."""

    def __init__(self, call, break_before=None):
        self.prompt_ids = list(host.prompt_ids(call))
        self.response_ids = []
        self.trainable = []
        self.logprobs = []
        self.source_calls = []
        self.weight_version = call.weight_version
        self.agent = calls.agent(call)
        self.break_before = break_before
        self._push(call)

    def __len__(self):
        return len(self.prompt_ids) + len(self.response_ids)

    def continues(self, call):
        """Whether `call`'s prompt starts with this sample's prompt + response."""
        return self._observation(call)[0] is not None

    def first_difference(self, call):
        """Position in this sample's prompt + response where `call`'s prompt
        first differs (or ends); the sample's length when it continues."""
        return self._observation(call)[1]

    def join(self, call):
        """Appends `call` if it continues the sample and returns None; if not,
        leaves the sample unchanged and returns where the ids first differ."""
        observation, at = self._observation(call)
        if observation is None:
            return at
        self.response_ids.extend(observation)
        self.logprobs.extend([0.0] * (len(self.response_ids) - len(self.logprobs)))
        self._push(call)
        return None

    def extend(self, call):
        """Appends `call` if it continues the sample; False (unchanged) if not."""
        return self.join(call) is None

    def _observation(self, call):
        """(the ids `call`'s prompt adds to the sample, len(self)), or (None,
        where it first differs)."""
        link = call.prompt
        if link.extends == self.source_calls[-1]:
            if link.shared == len(self):
                return link.tail, link.shared
            # Linked to the same ids, so it first differs where it stops sharing.
            return None, link.shared
        whole = host.prompt_ids(call)
        n = len(self.prompt_ids)
        at = common_prefix_len(self.prompt_ids, whole)
        if at == n:
            at += common_prefix_len(self.response_ids, whole[n:])
        return (whole[at:] if at == len(self) else None), at

    def _push(self, call):
        start = len(self.response_ids)
        self.response_ids.extend(call.response_ids)
        end = len(self.response_ids)
        # One log-prob per id; a short list is padded so positions never shift.
        lps = list(call.response_logprobs[:end - start])
        self.logprobs.extend(lps + [0.0] * (end - start - len(lps)))
        if self.trainable and self.trainable[-1].end == start:
            self.trainable[-1].end = end
        elif start < end:
            self.trainable.append(Span(start=start, end=end))
        self.source_calls.append(call.index)
        self.weight_version = min(self.weight_version, call.weight_version)

    def build(self):
        return Sample(
            prompt_ids=self.prompt_ids, response_ids=self.response_ids,
            trainable=self.trainable, logprobs=self.logprobs,
            source_calls=self.source_calls, weight_version=self.weight_version,
            agent=self.agent, break_before=self.break_before,
        )


def _first_choice(call):
    return call.index - (call.choice.index if call.choice is not None else 0)


def _siblings(a, b):
    """Whether `a` and `b` are choices of the same `n` > 1 request."""
    return (a.choice is not None and b.choice is not None and a.choice.count == b.choice.count
            and _first_choice(a) == _first_choice(b))


def merge_chains(rollout, chain_by_agent=True, skip_empty_responses=True, classify=None):
    """Merges calls into as few samples as the links allow. A call recorded
    as continuing call j (`continues`) joins the chain that ends with j; any
    other call is tested against its agent's latest chain (one chain per
    `x-agl-agent` tag unless `chain_by_agent` is off): appended when its
    prompt starts with the chain so far, else a new sample whose
    `break_before` is `classify(last_call, call)` (default
    `classify_break`). Samples come out ordered by their first call. A call
    the host linked to a chain's last call in full joins it by its prompt's
    `tail`; a whole prompt is fetched only for a fork or a break.

    The choices of an `n` > 1 request (`choice`) are parallel samples: the
    first joins the chain, each sibling forks a sample of its own (no break),
    and the next call joins the chain of the choice it extends (the one the
    harness kept)."""
    classify = classify or classify_break
    chains = []  # [key, builder, last call]
    for call in rollout.calls:
        if skip_empty_responses and not call.response_ids:
            continue
        key = calls.agent(call) if chain_by_agent else None
        if any(_siblings(c[2], call) for c in chains):
            chains.append([key, SampleBuilder(call), call])
            continue
        if call.continues is not None:
            target = next((c for c in reversed(chains) if c[2].index == call.continues), None)
            if target is not None and target[1].extend(call):
                target[2] = call
                continue
        latest = next((c for c in reversed(chains) if c[0] == key), None)
        chain_break = None
        if latest is not None:
            tip = latest[2]
            closest, joined = None, False
            for chain in reversed(chains):
                if chain[0] != key or not (chain is latest or _siblings(chain[2], tip)):
                    continue
                at = chain[1].join(call)
                if at is None:
                    chain[2] = call
                    joined = True
                    break
                if closest is None or at > closest[1]:
                    closest = (chain, at)
            if joined:
                continue
            broken = closest[0] if closest is not None else latest
            chain_break = classify(broken[2], call)
            host.debug(f"call {call.index}: new sample, {kind_name(chain_break.kind)} break")
        chains.append([key, SampleBuilder(call, chain_break), call])
    return [builder.build() for _, builder, _ in chains]


_KIND_NAMES = {
    BreakKind.RETOKENIZE: "retokenize", BreakKind.TEMPLATE: "template",
    BreakKind.OTHER: "other", BreakKind.SUMMARY: "summary", BreakKind.SUB_AGENT: "sub-agent",
}


def kind_name(kind):
    """The WIT name of a break kind."""
    return _KIND_NAMES[kind]


def divergence(prev, next_call):
    """Where `next_call`'s prompt first differs from `prev`'s prompt +
    response: (position, whether it is inside the previous response, detail)."""
    before, prompt = host.prompt_ids(prev), host.prompt_ids(next_call)
    n = len(before)
    at = common_prefix_len(before, prompt)
    if at == n:
        at = n + common_prefix_len(prev.response_ids, prompt[n:])
    previous = (list(before) + list(prev.response_ids))[at:at + 1]
    nxt = prompt[at:at + 1]
    place = f"response position {at - n}" if at >= n else f"prompt position {at}"
    show = lambda ids: str(ids[0]) if ids else "end"  # noqa: E731
    return at, at >= n, f"ids first differ at {at} ({place}): previous {show(previous)}, next {show(nxt)}"


def _system(messages):
    first = messages[0] if messages else None
    return first if isinstance(first, dict) and first.get("role") in ("system", "developer") else None


def _tools(call):
    body = calls._parsed(host.request_json(call))
    return body.get("tools") if isinstance(body, dict) else None


def other_agent(prev, next_call, prev_messages=None, next_messages=None):
    """Whether `next_call` is another agent's: another first system message,
    agent tag or tool list."""
    a = _system(prev_messages if prev_messages is not None else calls.request_messages(prev) or [])
    b = _system(next_messages if next_messages is not None else calls.request_messages(next_call) or [])
    other_system = not same_message(a, b) if a is not None and b is not None else (a is None) != (b is None)
    return (other_system or calls.agent(prev) != calls.agent(next_call)
            or _tools(prev) != _tools(next_call))


def _edit_kind(prev, next_call, prev_messages, reply, next_messages):
    if other_agent(prev, next_call, prev_messages, next_messages):
        return BreakKind.SUB_AGENT
    earlier = [*prev_messages, reply]
    kept = 0
    for a, b in zip(earlier, next_messages):
        if not same_message(a, b):
            break
        kept += 1
    dropped = any(not any(same_message(e, m) for m in next_messages[kept:]) for e in earlier[kept:])
    added = any(not any(same_message(e, m) for e in earlier) for m in next_messages[kept:])
    reply_edited = kept == len(prev_messages)
    return BreakKind.SUMMARY if dropped and added and not reply_edited else BreakKind.OTHER


def _history(prev, next_call):
    """("extends" | "text-extends" | "unknown", None) or ("edited", (kind, why))."""
    if prev.api == next_call.api == ApiKind.COMPLETIONS:
        before, now = _completion_prompt(prev), _completion_prompt(next_call)
        if before is None or now is None:
            return "unknown", None
        reply = calls.assistant_text(prev) or ""
        if now.startswith(before) and now[len(before):].startswith(reply):
            return "text-extends", None
        return "edited", (BreakKind.OTHER,
                          "the prompt text does not continue the previous prompt and completion")
    prev_messages, next_messages = calls.request_messages(prev), calls.request_messages(next_call)
    if prev_messages is None or next_messages is None:
        return "unknown", None
    reply = calls.assistant_message(prev)
    if reply is None:
        if other_agent(prev, next_call, prev_messages, next_messages):
            return "edited", (BreakKind.SUB_AGENT, "another system prompt, agent tag or tool list")
        return "unknown", None
    why = messages_extend(prev_messages, reply, next_messages)
    if why is None:
        return "extends", None
    return "edited", (_edit_kind(prev, next_call, prev_messages, reply, next_messages), why)


def _completion_prompt(call):
    body = calls._parsed(host.request_json(call))
    prompt = body.get("prompt") if isinstance(body, dict) else None
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else None


def _retokenized(prev, next_call):
    if not host.tokenizer.available():
        return None
    try:
        previous = host.tokenizer.decode(list(host.prompt_ids(prev)) + list(prev.response_ids))
        return host.tokenizer.decode(host.prompt_ids(next_call)).startswith(previous)
    except host.HostError as e:
        host.warn(f"break classification without the tokenizer: {e}")
        return None


def marked_summary(prev, next_call, markers):
    """A `summary` break when `next_call`'s history holds a message with
    one of a harness's compaction `markers` (the text it opens a summary
    with) that `prev`'s did not; None otherwise, for the caller's other
    rules (the Rust SDK's `breaks::marked_summary`)."""
    def texts(call):
        return [t for m in calls.request_messages(call) or []
                if isinstance(m, dict) and (t := calls.content_text(m.get("content"))) is not None]

    def marked(found):
        return next((m for m in markers if any(m in t for t in found)), None)

    found = marked(texts(next_call))
    if found is None or marked(texts(prev)) is not None:
        return None
    _, _, where = divergence(prev, next_call)
    return ChainBreak(kind=BreakKind.SUMMARY, call_index=next_call.index,
                      detail=f'summary: the history was compacted ("{found[:60]}..."); {where}')


def classify_break(prev, next_call):
    """Why `next_call`'s prompt does not continue `prev` (the chain's last
    call): the Rust SDK's `classify_break` (history edits first: sub-agent,
    summary, other; then retokenize / template / other from the ids)."""
    _, in_response, where = divergence(prev, next_call)
    state, edit = _history(prev, next_call)
    if state == "edited":
        kind, why = edit[0], f"history edited: {edit[1]}"
    elif state == "text-extends":
        kind, why = BreakKind.RETOKENIZE, "the prompt text continues"
    else:
        same_text = _retokenized(prev, next_call)
        note = " (no tokenizer)" if same_text is None else ""
        if same_text:
            kind, why = BreakKind.RETOKENIZE, "the decoded text continues"
        elif in_response:
            kind, why = BreakKind.TEMPLATE, f"the previous turn was rendered differently{note}"
        else:
            kind, why = BreakKind.OTHER, f"the earlier prompt changed{note}"
    return ChainBreak(kind=kind, call_index=next_call.index, detail=f"{why}; {where}")
