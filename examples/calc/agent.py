#!/usr/bin/env python3
"""A small calculator agent, run by the agl controller (one process per rollout).

It asks the model the question from AGL_INPUT through the OpenAI SDK
(OPENAI_BASE_URL / OPENAI_API_KEY point at the rollout's proxy), runs the
`calculator` tool calls the model makes and feeds their results back, until
the model answers `Answer: <number>` or MAX_TURNS is reached. Then it posts
its own reward (1.0 if the answer equals the input's `answer`, else 0.0) as a
`reward` event to AGL_EVENT_URL.

Exit codes: 0 = done (right or wrong answer), 75 = system failure (the
model endpoint was unreachable; agl retries the rollout, it is not scored).
"""

import ast
import json
import operator
import os
import re
import sys
import urllib.request

import openai

MAX_TURNS = 6
SYSTEM_FAILURE = int(os.environ.get("AGL_SYSTEM_FAILURE_EXIT_CODE", "75"))

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression (+ - * / // % ** and parentheses).",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]

SYSTEM_PROMPT = (
    "Solve the arithmetic question. You may call the calculator tool. "
    "Finish with a line `Answer: <number>`."
)

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def safe_eval(expression):
    """Arithmetic only: numbers and the operators in _OPS, nothing else."""

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent too large")
            return _OPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError("unsupported expression")

    return ev(ast.parse(expression, mode="eval"))


def run_tool(call):
    if call.function.name != "calculator":
        return f"error: unknown tool {call.function.name}"
    try:
        expression = json.loads(call.function.arguments or "{}")["expression"]
        return str(safe_eval(str(expression)))
    except Exception as e:  # the model sees its mistake and may retry
        return f"error: {e}"


def parse_answer(text):
    m = re.search(r"Answer:\s*(-?\d+(?:\.\d+)?)", text or "")
    return float(m.group(1)) if m else None


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


def solve(client, question):
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": question},
    ]
    for turn in range(MAX_TURNS):
        resp = client.chat.completions.create(
            model=os.environ.get("AGL_MODEL", "policy"), messages=messages, tools=TOOLS
        )
        msg = resp.choices[0].message
        if msg.tool_calls:
            messages.append(msg.model_dump(exclude_none=True))
            for call in msg.tool_calls:
                messages.append(
                    {"role": "tool", "tool_call_id": call.id, "content": run_tool(call)}
                )
            continue
        return parse_answer(msg.content), turn + 1
    return None, MAX_TURNS


def main():
    data = json.loads(os.environ.get("AGL_INPUT") or "{}")
    question, expected = data.get("question", ""), data.get("answer")
    client = openai.OpenAI(max_retries=3, timeout=120)
    try:
        answer, turns = solve(client, question)
    except (openai.APIConnectionError, openai.InternalServerError) as e:
        print(f"model endpoint unreachable: {e}", file=sys.stderr)
        return SYSTEM_FAILURE
    correct = answer is not None and expected is not None and abs(answer - float(expected)) < 1e-6
    post_event(
        "reward",
        {"value": 1.0 if correct else 0.0, "answer": answer, "expected": expected, "turns": turns},
    )
    print(json.dumps({"answer": answer, "expected": expected, "correct": correct, "turns": turns}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
