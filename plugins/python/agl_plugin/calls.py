"""Reading a rollout and its model calls (the Rust SDK's `call` and
`rollout` modules, same semantics). A call's JSON is fetched from the host
(`host.request_json`, `host.response_json`) and parsed on demand."""

import json

from wit_world.imports.types import ApiKind

from . import host

AGENT_TAG = "x-agl-agent"
REWARD_EVENT = "reward"


def input_value(rollout):
    """The dataset row the harness was started with, parsed."""
    return json.loads(rollout.input_json)


def last_reward_event(rollout):
    """The last `reward` event's payload, parsed; None without one."""
    for event in reversed(rollout.events):
        if event.kind == REWARD_EVENT:
            return json.loads(event.payload_json)
    return None


def last_reward(rollout):
    """The harness's own reward: the last `reward` event's `{"value": n}`
    (or bare number) payload; None when it posted none. A last reward event
    without a number raises (a harness bug worth seeing, not a silent 0)."""
    if not any(e.kind == REWARD_EVENT for e in rollout.events):
        return None
    payload = last_reward_event(rollout)
    value = payload.get("value") if isinstance(payload, dict) else payload
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"reward event payload has no numeric value: {json.dumps(payload)}")
    return float(value)


def graded_tests(rollout):
    """What a test-running grader reported with its reward (the mini-swe
    example's `{"value": 1.0, "tests": {"passed": [...], "failed": [...]}}`):
    the `tests` object of the last reward event, None without one."""
    payload = last_reward_event(rollout)
    tests = payload.get("tests") if isinstance(payload, dict) else None
    return tests if isinstance(tests, dict) else None


def tag(call, key):
    """The value of tag `key` (case-insensitive, as headers are)."""
    key = key.lower()
    return next((t.value for t in call.tags if t.key.lower() == key), None)


def agent(call):
    """The call's `x-agl-agent` tag: which agent or sub-agent made it."""
    return tag(call, AGENT_TAG)


def request(call):
    return json.loads(host.request_json(call))


def response(call):
    return json.loads(host.response_json(call))


def _parsed(text):
    try:
        return json.loads(text)
    except ValueError:
        return None


def request_messages(call):
    """The conversation the request sent, as OpenAI-style messages (chat
    `messages`; Anthropic `messages` after `system`; Responses `input`
    after `instructions`). None for the completions API or bad JSON."""
    body = _parsed(host.request_json(call))
    keys = {
        ApiKind.CHAT_COMPLETIONS: (None, "messages"),
        ApiKind.ANTHROPIC_MESSAGES: ("system", "messages"),
        ApiKind.RESPONSES: ("instructions", "input"),
    }.get(call.api)
    if not isinstance(body, dict) or keys is None:
        return None
    system_key, messages_key = keys
    messages = []
    if system_key and body.get(system_key) is not None:
        messages.append({"role": "system", "content": body[system_key]})
    items = body.get(messages_key)
    if isinstance(items, list):
        messages.extend(items)
    elif isinstance(items, str):
        messages.append({"role": "user", "content": items})
    else:
        return None
    return messages


def assistant_message(call):
    """The assistant message the call returned as a harness echoes it (chat
    `choices[0].message`; Anthropic role + content blocks); else None."""
    body = _parsed(host.response_json(call))
    if not isinstance(body, dict):
        return None
    if call.api == ApiKind.CHAT_COMPLETIONS:
        choices = body.get("choices") or [{}]
        return choices[0].get("message")
    if call.api == ApiKind.ANTHROPIC_MESSAGES and "content" in body:
        return {"role": "assistant", "content": body["content"]}
    return None


_TEXT_PARTS = ("text", "input_text", "output_text")


def _join_texts(parts):
    texts = [p["text"] for p in parts
             if isinstance(p, dict) and p.get("type") in _TEXT_PARTS and isinstance(p.get("text"), str)]
    return "".join(texts) if texts else None


def content_text(content):
    """A message `content`: a string, or the joined text of its parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return _join_texts(content)
    return None


def assistant_text(call):
    """The text the model answered (chat message content, completions text,
    Responses `output_text` parts, Anthropic `text` blocks), joined; None
    when there is none (e.g. only tool calls) or the response is not JSON."""
    body = _parsed(host.response_json(call))
    if not isinstance(body, dict):
        return None
    text = None
    if call.api in (ApiKind.CHAT_COMPLETIONS, ApiKind.COMPLETIONS):
        choice = (body.get("choices") or [None])[0]
        if isinstance(choice, dict):
            if call.api == ApiKind.COMPLETIONS:
                text = choice.get("text") if isinstance(choice.get("text"), str) else None
            else:
                text = content_text((choice.get("message") or {}).get("content"))
    elif call.api == ApiKind.RESPONSES:
        parts = [p for item in body.get("output") or []
                 if isinstance(item, dict) and item.get("type") == "message"
                 for p in item.get("content") or []]
        text = _join_texts(parts)
    elif call.api == ApiKind.ANTHROPIC_MESSAGES:
        text = _join_texts(body.get("content") or [])
    return text or None


def final_text(rollout):
    """The last call's assistant text: a harness's final answer."""
    return assistant_text(rollout.calls[-1]) if rollout.calls else None
