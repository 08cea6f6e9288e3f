"""Comparing conversation turns as a harness echoes them (the Rust SDK's
`messages`): a reply comes back with its null/empty fields dropped,
reasoning stripped, text parts joined, tool-call arguments re-serialised;
none of that is an edit of the history."""

import json

REASONING_KEYS = ("reasoning_content", "reasoning", "reasoning_details")
THINKING_BLOCKS = ("thinking", "redacted_thinking")
TEXT_PARTS = ("text", "input_text", "output_text")


def _empty(value):
    return value is None or (isinstance(value, (str, list, dict)) and not value)


def _without_empty_fields(value):
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if not _empty(v)}
    return value


def _content(content):
    if not isinstance(content, list):
        return content
    kept = [p for p in content if not (isinstance(p, dict) and p.get("type") in THINKING_BLOCKS)]
    texts = [p.get("text") if isinstance(p, dict) and p.get("type") in TEXT_PARTS else None
             for p in kept]
    if all(isinstance(t, str) for t in texts):
        return "".join(texts)
    return [_without_empty_fields(p) for p in kept]


def _tool_calls(calls):
    if not isinstance(calls, list):
        return calls
    out = []
    for call in calls:
        call = _without_empty_fields(call)
        if isinstance(call, dict):
            call.pop("index", None)
            function = call.get("function")
            if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                try:
                    call["function"] = {**function, "arguments": json.loads(function["arguments"])}
                except ValueError:
                    pass
        out.append(call)
    return out


def canonical_message(message):
    if not isinstance(message, dict):
        return message
    out = {}
    for key, value in message.items():
        if key in REASONING_KEYS:
            continue
        value = _content(value) if key == "content" else _tool_calls(value) if key == "tool_calls" else value
        if not _empty(value):
            out[key] = value
    return out


def same_message(a, b):
    return a == b or canonical_message(a) == canonical_message(b)


def messages_extend(prev, reply, next_messages):
    """None when `next_messages` starts with `prev` + `reply`; else why not."""
    for i, (want, got) in enumerate(zip([*prev, reply], next_messages)):
        if not same_message(want, got):
            what = "the previous assistant reply" if i == len(prev) else "an earlier message"
            role = got.get("role", "?") if isinstance(got, dict) else "?"
            return f"message {i} ({what}, role {role}) was changed"
    if len(next_messages) < len(prev) + 1:
        return (f"the next request has {len(next_messages)} messages, fewer than the "
                f"{len(prev) + 1} of the previous turn")
    return None
