#!/usr/bin/env python3
"""The arith agent, run by the agl controller (one process per rollout).

One chat call through the OpenAI SDK (OPENAI_BASE_URL / OPENAI_API_KEY point
at the rollout's proxy) asks the question from AGL_INPUT, with at most
MAX_TOKENS of reply. The reward, posted as a `reward` event to AGL_EVENT_URL,
is 1.0 when the reply ended on its own (finish_reason "stop", not cut at
MAX_TOKENS) and the last number in it equals the input's `answer`, else 0.0.
SmolLM2-135M-Instruct ignores strict formats like `Answer: <n>`, but at T=1 it
sometimes replies briefly ("8 + 1 equals 9.") and is then mostly right, so
this reward has variance within a group from the first step and teaches the
policy to answer briefly and correctly (see README.md).

Exit codes: 0 = done (right or wrong answer), 75 = system failure (the
model endpoint was unreachable; agl retries the rollout, it is not scored).
"""

import json
import os
import re
import sys
import urllib.request

MAX_TOKENS = 24
SYSTEM_FAILURE = int(os.environ.get("AGL_SYSTEM_FAILURE_EXIT_CODE", "75"))
SYSTEM_PROMPT = "Answer in one short sentence."


def last_number(text):
    numbers = re.findall(r"-?\d+(?:\.\d+)?", text or "")
    return float(numbers[-1]) if numbers else None


def reward(text, expected, finished):
    """1.0 for a finished reply whose last number is the expected answer."""
    value = last_number(text)
    correct = value is not None and abs(value - float(expected)) < 1e-6
    return 1.0 if finished and correct else 0.0


def post_event(kind, payload):
    body = json.dumps({"kind": kind, "payload": payload}).encode()
    req = urllib.request.Request(
        os.environ["AGL_EVENT_URL"],
        data=body,
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}",
        },
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        resp.read()


def main():
    import openai  # here, so sim_grpo.py can import the prompt and reward without it

    data = json.loads(os.environ.get("AGL_INPUT") or "{}")
    question, expected = data.get("question", ""), data.get("answer")
    client = openai.OpenAI(max_retries=3, timeout=120)
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": question},
    ]
    try:
        resp = client.chat.completions.create(
            model=os.environ.get("AGL_MODEL", "policy"), messages=messages, max_tokens=MAX_TOKENS
        )
    except (openai.APIConnectionError, openai.InternalServerError) as e:
        print(f"model endpoint unreachable: {e}", file=sys.stderr)
        return SYSTEM_FAILURE
    choice = resp.choices[0]
    text, finished = choice.message.content or "", choice.finish_reason == "stop"
    value = 0.0 if expected is None else reward(text, expected, finished)
    post_event(
        "reward",
        {"value": value, "answer": last_number(text), "expected": expected, "finished": finished},
    )
    print(json.dumps({"reply": text, "expected": expected, "finished": finished, "reward": value}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
