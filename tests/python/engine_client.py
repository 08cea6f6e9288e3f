"""Drives agl's embedded engine through the gateway with the real OpenAI
Python SDK (host/agl/tests/e2e/engine_server.rs). Prints one JSON summary.

    engine_client.py greedy PROMPT...   one chat per prompt
    engine_client.py stream PROMPT...   the same, streamed
    engine_client.py concurrent N       N chats one at a time, then all at once
    engine_client.py completion PROMPT  one completion
    engine_client.py conversation PROMPT...  one chat, a turn per prompt,
                                        every reply echoed back verbatim,
                                        streamed and whole turns alternating
"""

import json
import sys
from concurrent.futures import ThreadPoolExecutor

from openai import OpenAI

MAX_TOKENS = 16


def chat(client, text, **kw):
    return client.chat.completions.create(
        model="policy",
        messages=[{"role": "user", "content": text}],
        max_tokens=MAX_TOKENS,
        **kw,
    )


def streamed(client, text):
    stream = chat(client, text, stream=True, stream_options={"include_usage": True})
    out, chunks, usage, finish = "", 0, None, None
    for chunk in stream:
        chunks += 1
        if chunk.usage:
            usage = chunk.usage.completion_tokens
        for choice in chunk.choices:
            out += choice.delta.content or ""
            finish = choice.finish_reason or finish
    return {"text": out, "chunks": chunks, "usage": usage, "finish": finish}


def conversation(client, prompts):
    """A harness that keeps its history as text: each reply (the message the
    SDK returned, or the streamed deltas joined) goes back as it was read."""
    messages, replies = [], []
    for i, prompt in enumerate(prompts):
        messages.append({"role": "user", "content": prompt})
        if i % 2:
            stream = client.chat.completions.create(
                model="policy", messages=messages, max_tokens=MAX_TOKENS, stream=True
            )
            reply = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        else:
            answer = client.chat.completions.create(
                model="policy", messages=messages, max_tokens=MAX_TOKENS
            )
            reply = answer.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": reply})
        replies.append(reply)
    return {"replies": replies}


def main():
    client = OpenAI()
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "greedy":
        answers = [chat(client, p) for p in args]
        result = {
            "texts": [a.choices[0].message.content for a in answers],
            "finishes": [a.choices[0].finish_reason for a in answers],
            "usage": [a.usage.completion_tokens for a in answers],
        }
    elif mode == "stream":
        result = {"streams": [streamed(client, p) for p in args]}
    elif mode == "concurrent":
        prompts = [f"question number {i} " * (i + 1) for i in range(int(args[0]))]

        def one(p):
            return chat(client, p).choices[0].message.content

        alone = [one(p) for p in prompts]
        with ThreadPoolExecutor(len(prompts)) as pool:
            together = list(pool.map(one, prompts))
        result = {"alone": alone, "together": together}
    elif mode == "conversation":
        result = conversation(client, args)
    elif mode == "completion":
        c = client.completions.create(model="policy", prompt=args[0], max_tokens=MAX_TOKENS)
        result = {"text": c.choices[0].text, "finish": c.choices[0].finish_reason}
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
