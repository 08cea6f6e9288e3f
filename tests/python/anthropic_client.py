"""Drives the gateway's Anthropic Messages proxy with the real anthropic
Python SDK (host/gateway/tests/gateway/anthropic_sdk.rs). Prints one JSON
summary. ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY come from the test.

    anthropic_client.py tools      create with a tool, send the tool result
                                   back, then the same turn streamed,
                                   counted, and the models listed
    anthropic_client.py retry N    one create, N SDK retries allowed
    anthropic_client.py forced PROMPT...  per prompt, a call forced to use
                                   the tool `paint` (tool_choice tool) and
                                   one forced to use any (tool_choice any):
                                   how many inputs validate against its schema
"""

import json
import sys

import anthropic

TOOLS = [
    {
        "name": "bash",
        "description": "Run a shell command",
        "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    }
]


def tools(client):
    messages = [{"role": "user", "content": "How many files?"}]
    first = client.messages.create(
        model="policy", max_tokens=256, system="Be brief.", tools=TOOLS, messages=messages
    )
    use = next(b for b in first.content if b.type == "tool_use")
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "a b c"}]},
    ]
    second = client.messages.create(
        model="policy", max_tokens=256, system="Be brief.", tools=TOOLS, messages=messages
    )
    with client.messages.stream(
        model="policy", max_tokens=256, system="Be brief.", tools=TOOLS, messages=messages
    ) as stream:
        events = [e.type for e in stream]
        streamed = stream.get_final_message()
    counted = client.messages.count_tokens(
        model="policy", system="Be brief.", tools=TOOLS, messages=messages
    )
    models = [m.id for m in client.models.list()]
    return {
        "models": models,
        "counted": counted.input_tokens,
        "second_input_tokens": second.usage.input_tokens,
        "first_stop": first.stop_reason,
        "tool": {"name": use.name, "input": use.input},
        "second_stop": second.stop_reason,
        "second_text": "".join(b.text for b in second.content if b.type == "text"),
        "streamed_text": "".join(b.text for b in streamed.content if b.type == "text"),
        "streamed_stop": streamed.stop_reason,
        "event_types": sorted(set(events)),
    }


PAINT = {
    "name": "paint",
    "description": "Paint something",
    "input_schema": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}},
        "required": ["color", "ok"],
        "additionalProperties": False,
    },
}


def forced(client, prompts):
    import jsonschema

    valid = 0
    for prompt in prompts:
        for choice in ({"type": "tool", "name": "paint"}, {"type": "any"}):
            reply = client.messages.create(
                model="policy", max_tokens=150, tools=[PAINT], tool_choice=choice,
                messages=[{"role": "user", "content": prompt}])
            use = next(b for b in reply.content if b.type == "tool_use")
            assert use.name == "paint", reply
            jsonschema.validate(use.input, PAINT["input_schema"])
            valid += 1
    return {"valid": valid}


def main():
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "tools":
        result = tools(anthropic.Anthropic())
    elif mode == "forced":
        result = forced(anthropic.Anthropic(), args)
    elif mode == "retry":
        client = anthropic.Anthropic(max_retries=int(args[0]))
        raw = client.messages.with_raw_response.create(
            model="policy", max_tokens=64, messages=[{"role": "user", "content": "retry me"}]
        )
        message = raw.parse()
        result = {
            "text": "".join(b.text for b in message.content if b.type == "text"),
            "retry_count": raw.retries_taken,
        }
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
