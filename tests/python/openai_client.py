"""Drives the agl proxy with the real OpenAI Python SDK (host/gateway/tests/gateway/openai_sdk.rs).

Reads OPENAI_BASE_URL / OPENAI_API_KEY from the environment and prints one
JSON object summarising what the SDK received.

    openai_client.py all            chat, streamed chat, tool call, completion
    openai_client.py retry N        one chat with max_retries=N (proxy paused)
"""

import json
import sys

from openai import OpenAI

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


def user(text):
    return [{"role": "user", "content": text}]


def run_all(client):
    chat = client.chat.completions.create(model="policy", messages=user("hi"))
    stream = client.chat.completions.create(
        model="policy", messages=user("stream please"), stream=True
    )
    chunks = 0
    streamed = ""
    for chunk in stream:
        chunks += 1
        if chunk.choices and chunk.choices[0].delta.content:
            streamed += chunk.choices[0].delta.content
    tool = client.chat.completions.create(
        model="policy", messages=user("weather in Paris?"), tools=TOOLS
    )
    calls = tool.choices[0].message.tool_calls or []
    completion = client.completions.create(model="policy", prompt="say")
    return {
        "chat": chat.choices[0].message.content,
        "chat_finish": chat.choices[0].finish_reason,
        "stream": streamed,
        "stream_chunks": chunks,
        "tool_calls": [
            {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
            for c in calls
        ],
        "tool_finish": tool.choices[0].finish_reason,
        "completion": completion.choices[0].text,
    }


def run_retry(max_retries):
    # The SDK's own retry of the paused proxy's 429 (Retry-After: 1).
    client = OpenAI(max_retries=max_retries)
    raw = client.chat.completions.with_raw_response.create(
        model="policy", messages=user("retry me")
    )
    chat = raw.parse()
    return {
        "chat": chat.choices[0].message.content,
        "retry_count": raw.retries_taken,
    }


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "all"
    if mode == "retry":
        summary = run_retry(int(sys.argv[2]))
    else:
        summary = run_all(OpenAI())
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
