"""Drives the gateway's Responses proxy with the real OpenAI Python SDK
(host/gateway/tests/gateway/responses_sdk.rs): a function call, its output
sent back as input items, then the answer. Prints one JSON summary.
OPENAI_BASE_URL and OPENAI_API_KEY come from the test."""

import json

from openai import OpenAI

TOOLS = [
    {
        "type": "function",
        "name": "bash",
        "description": "Run a shell command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    }
]


def main():
    client = OpenAI()
    input_items = [{"role": "user", "content": "How many files?"}]
    first = client.responses.create(
        model="policy", instructions="Be brief.", tools=TOOLS, input=input_items, max_output_tokens=256
    )
    call = next(i for i in first.output if i.type == "function_call")
    input_items += [i.model_dump(exclude_none=True) for i in first.output]
    input_items.append({"type": "function_call_output", "call_id": call.call_id, "output": "a b c"})
    second = client.responses.create(
        model="policy", instructions="Be brief.", tools=TOOLS, input=input_items, max_output_tokens=256
    )
    print(json.dumps({
        "call": {"name": call.name, "arguments": json.loads(call.arguments)},
        "first_status": first.status,
        "text": second.output_text,
        "usage": second.usage.input_tokens,
    }))


if __name__ == "__main__":
    main()
