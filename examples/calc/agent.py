#!/usr/bin/env python3
"""The calculator agent, run by the agl controller (one process per rollout).

A multi-turn tool loop of its own over plain HTTP (OpenAI chat completions at
OPENAI_BASE_URL, key OPENAI_API_KEY): the model is asked a multiplication of
two 2-digit numbers (from AGL_INPUT), which SmolLM2-135M cannot do in its
head. Its tool is a calculator with a text protocol of the harness's own, as
mini-swe-agent has for its shell: a reply containing `CALC <expression>` is a
call; the harness evaluates it and answers with a user turn
`RESULT <expression> = <value>`.
A reply without a call is the final answer. The prompt teaches the protocol
with one worked example (as conversation turns; see README.md for why a text
protocol and not JSON function calls).

Each tool use is posted as a `tool_call` event, the reward as a `reward`
event to AGL_EVENT_URL: 1.0 when the final reply ended on its own
(finish_reason "stop") and its last number is the product, else 0.0.

`--no-tool` withholds the calculator (the ablation): the prompt never
mentions it, the example answers directly, and a `CALC` line is not run.

Exit codes: 0 = done (right or wrong answer), 75 = system failure (the model
endpoint was unreachable; agl retries the rollout, it is not scored).
"""

import argparse
import ast
import json
import operator
import os
import re
import sys
import time
import urllib.error
import urllib.request

MAX_CALLS = 3
MAX_TOKENS = 24
SYSTEM_FAILURE = int(os.environ.get("AGL_SYSTEM_FAILURE_EXIT_CODE", "75"))

SYSTEM_TOOL = "You have a calculator. Reply CALC <expression> to use it; it replies RESULT <number>."
SYSTEM_NO_TOOL = "Answer the question."
EXAMPLE = (12, 34)

CALL = re.compile(r"CALC\s*:?\s*([\d\s+\-*/().]+\d\)*)")

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


class Unreachable(Exception):
    """The model endpoint did not answer: a system failure, not the policy's."""


def safe_eval(expression):
    """Arithmetic only: numbers and the operators in _OPS, nothing else."""

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError("unsupported expression")

    return ev(ast.parse(expression.strip(), mode="eval"))


def calculator(expression):
    """The tool: the value as the model should read it, or the error."""
    try:
        value = safe_eval(expression)
    except (SyntaxError, ValueError, ZeroDivisionError, TypeError) as e:
        return f"error: {e}"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def result_turn(expression, result):
    """What the harness answers a call with: the calculator echoes what it
    computed (`RESULT 47 * 38 = 1786`), which SmolLM2 copies into its
    answer twice as often as a bare `RESULT 1786` (README.md)."""
    if result.startswith("error"):
        return f"RESULT {result}"
    return f"RESULT {expression} = {result}"


def tool_call(text):
    """The expression of a `CALC <expression>` in a reply, or None."""
    m = CALL.search(text or "")
    return m.group(1).strip() if m else None


def last_number(text):
    numbers = re.findall(r"-?\d+(?:\.\d+)?", text or "")
    return float(numbers[-1]) if numbers else None


def reward(text, expected, finished):
    """1.0 for a finished reply whose last number is the expected answer."""
    value = last_number(text)
    correct = value is not None and expected is not None and abs(value - float(expected)) < 1e-6
    return 1.0 if finished and correct else 0.0


def prompt(question, tool):
    """The system prompt, one worked example as conversation turns, the question."""
    a, b = EXAMPLE
    if tool:
        example = [
            {"role": "user", "content": f"What is {a} * {b}?"},
            {"role": "assistant", "content": f"CALC {a} * {b}"},
            {"role": "user", "content": result_turn(f"{a} * {b}", str(a * b))},
            {"role": "assistant", "content": f"{a} * {b} = {a * b}"},
        ]
    else:
        example = [
            {"role": "user", "content": f"What is {a} * {b}?"},
            {"role": "assistant", "content": f"{a} * {b} = {a * b}"},
        ]
    system = SYSTEM_TOOL if tool else SYSTEM_NO_TOOL
    return [{"role": "system", "content": system}, *example, {"role": "user", "content": question}]


def post(url, body, retries=8):
    """POSTs JSON with the rollout's token; waits out 429/503 (a paused
    gateway says when to come back in Retry-After)."""
    data = json.dumps(body).encode()
    headers = {
        "Content-Type": "application/json",
        "Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}",
    }
    for attempt in range(retries + 1):
        req = urllib.request.Request(url, data=data, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=300) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            if e.code not in (429, 503) or attempt == retries:
                raise
            time.sleep(float(e.headers.get("Retry-After") or 1))
        except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
            raise Unreachable(str(e)) from e
    raise AssertionError("unreachable")


def chat(messages):
    """One model call; returns (text, finished)."""
    base = os.environ["OPENAI_BASE_URL"].rstrip("/")
    body = {
        "model": os.environ.get("AGL_MODEL", "policy"),
        "messages": messages,
        "max_tokens": MAX_TOKENS,
    }
    choice = post(f"{base}/chat/completions", body)["choices"][0]
    return choice["message"].get("content") or "", choice.get("finish_reason") == "stop"


def post_event(kind, payload):
    post(os.environ["AGL_EVENT_URL"], {"kind": kind, "payload": payload}, retries=2)


def solve(question, tool):
    """The agent loop: returns (final text, finished, model calls, tool calls)."""
    messages = prompt(question, tool)
    tools_used = 0
    for call in range(1, MAX_CALLS + 1):
        text, finished = chat(messages)
        expression = tool_call(text) if tool and finished else None
        if expression is None or call == MAX_CALLS:
            return text, finished, call, tools_used
        result = calculator(expression)
        tools_used += 1
        post_event("tool_call", {"name": "calculator", "input": expression, "output": result})
        messages += [
            {"role": "assistant", "content": text},
            {"role": "user", "content": result_turn(expression, result)},
        ]
    raise AssertionError("unreachable")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-tool", action="store_true", help="withhold the calculator")
    args = parser.parse_args()
    data = json.loads(os.environ.get("AGL_INPUT") or "{}")
    question, expected = data.get("question", ""), data.get("answer")
    try:
        text, finished, calls, tools_used = solve(question, tool=not args.no_tool)
        value = reward(text, expected, finished)
        post_event(
            "reward",
            {
                "value": value,
                "answer": last_number(text),
                "expected": expected,
                "finished": finished,
                "calls": calls,
                "tool_calls": tools_used,
            },
        )
    except Unreachable as e:
        print(f"model endpoint unreachable: {e}", file=sys.stderr)
        return SYSTEM_FAILURE
    print(json.dumps({"reply": text, "expected": expected, "reward": value, "calls": calls}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
