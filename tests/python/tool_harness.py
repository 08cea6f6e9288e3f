"""A tool-calling harness written the way agents write them, with the real
OpenAI Python SDK (host/agl/tests/e2e/conversation.rs). Prints one JSON
summary.

    tool_harness.py tools TURNS        call `bash` until the model answers in
                                       text or TURNS calls were made
    tool_harness.py summary TURNS KEEP the same, but after KEEP calls the
                                       history's middle is replaced by a
                                       summary (compaction)

Turns alternate between whole and streamed answers. The harness keeps its
history as parsed objects and re-serialises tool arguments itself
(`json.dumps(..., sort_keys=True)`: other spacing and key order than the
model wrote), as SDK-based harnesses do.
"""

import json
import sys

from openai import OpenAI

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command",
            "parameters": {
                "type": "object",
                "properties": {"cmd": {"type": "string"}, "cwd": {"type": "string"}},
                "required": ["cmd"],
            },
        },
    }
]


def whole(client, messages):
    answer = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    message = answer.choices[0].message
    calls = [
        {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
        for c in message.tool_calls or []
    ]
    return message.content, calls


def streamed(client, messages):
    stream = client.chat.completions.create(
        model="policy", messages=messages, tools=TOOLS, stream=True
    )
    content, calls = "", {}
    for chunk in stream:
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            for c in delta.tool_calls or []:
                call = calls.setdefault(c.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = c.id or call["id"]
                if c.function:
                    call["name"] += c.function.name or ""
                    call["arguments"] += c.function.arguments or ""
    return content or None, [calls[i] for i in sorted(calls)]


def run(client, turns, keep=None):
    messages = [
        {"role": "system", "content": "You are a careful agent."},
        {"role": "user", "content": "How many files are in the repo?"},
    ]
    calls_made = 0
    for turn in range(turns):
        if keep is not None and turn == keep:
            # Compaction: everything after the task becomes one summary.
            messages = messages[:2] + [
                {"role": "user", "content": f"Summary: {calls_made} commands run so far."}
            ]
        content, calls = (streamed if turn % 2 else whole)(client, messages)
        if not calls:
            messages.append({"role": "assistant", "content": content})
            break
        messages.append(
            {
                "role": "assistant",
                "content": content,
                "tool_calls": [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {
                            "name": c["name"],
                            "arguments": json.dumps(json.loads(c["arguments"]), sort_keys=True),
                        },
                    }
                    for c in calls
                ],
            }
        )
        for c in calls:
            calls_made += 1
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": f"file{calls_made}.txt"})
    return {"calls": calls_made, "messages": len(messages)}


def main():
    client = OpenAI()
    mode, args = sys.argv[1], [int(a) for a in sys.argv[2:]]
    if mode == "tools":
        result = run(client, args[0])
    elif mode == "summary":
        result = run(client, args[0], keep=args[1])
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
