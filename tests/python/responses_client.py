"""Drives the gateway's Responses proxy with the real OpenAI Python SDK
(host/gateway/tests/gateway/responses_sdk.rs): a function call, its output
sent back as input items, then the answer; then the same two turns
streamed through the SDK's stream helper, which rebuilds each response
from the events and checks them. Prints one JSON summary.
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
    # Streamed: a new conversation, so it starts its own chain.
    streamed_input = [{"role": "user", "content": "How many files, streamed?"}]
    event_types = []
    with client.responses.stream(
        model="policy", instructions="Be brief.", tools=TOOLS, input=streamed_input, max_output_tokens=256
    ) as stream:
        for event in stream:
            event_types.append(event.type)
        streamed_first = stream.get_final_response()
    streamed_call = next(i for i in streamed_first.output if i.type == "function_call")
    streamed_input += [i.model_dump(exclude_none=True) for i in streamed_first.output]
    streamed_input.append(
        {"type": "function_call_output", "call_id": streamed_call.call_id, "output": "a b c"}
    )
    with client.responses.stream(
        model="policy", instructions="Be brief.", tools=TOOLS, input=streamed_input, max_output_tokens=256
    ) as stream:
        deltas = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        streamed_second = stream.get_final_response()
    print(json.dumps({
        "call": {"name": call.name, "arguments": json.loads(call.arguments)},
        "first_status": first.status,
        "text": second.output_text,
        "usage": second.usage.input_tokens,
        "streamed_call": {"name": streamed_call.name, "arguments": json.loads(streamed_call.arguments),
                          "call_id": streamed_call.call_id},
        "streamed_text": streamed_second.output_text,
        "streamed_deltas": deltas,
        "streamed_status": streamed_second.status,
        "event_types": event_types,
    }))


if __name__ == "__main__":
    main()
