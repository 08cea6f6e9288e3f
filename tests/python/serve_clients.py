"""Drives `agl serve`'s own rendering on a real policy with the real SDKs
(host/agl/tests/e2e/serve_rendering.rs). Prints one JSON summary.

    serve_clients.py messages    Anthropic Messages: create, then the same
                                 conversation continued, streamed, and its
                                 next prompt counted (ANTHROPIC_BASE_URL,
                                 ANTHROPIC_API_KEY)
    serve_clients.py responses   OpenAI Responses: create, then a follow-up
                                 streamed with previous_response_id
                                 (OPENAI_BASE_URL, OPENAI_API_KEY)
"""

import json
import sys

MODEL = "smollm2"
LIMIT = 48


def text_of(blocks):
    return "".join(b.text for b in blocks if b.type == "text")


def messages():
    import anthropic

    client = anthropic.Anthropic(max_retries=0)
    history = [{"role": "user", "content": "What colour is the sky? One word."}]
    first = client.messages.create(model=MODEL, max_tokens=LIMIT, messages=history)
    history += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": "And the grass? One word."},
    ]
    with client.messages.stream(model=MODEL, max_tokens=LIMIT, messages=history) as stream:
        events = [e.type for e in stream]
        second = stream.get_final_message()
    history += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in second.content]},
        {"role": "user", "content": "And the sun? One word."},
    ]
    counted = client.messages.count_tokens(model=MODEL, messages=history)
    return {
        "first": {"text": text_of(first.content), "stop": first.stop_reason},
        "second": {"text": text_of(second.content), "stop": second.stop_reason},
        "events": sorted(set(events)),
        "counted": counted.input_tokens,
        "history": history,
    }


def responses():
    from openai import OpenAI

    client = OpenAI(max_retries=0)
    first = client.responses.create(
        model=MODEL, input="What colour is the sky? One word.", max_output_tokens=LIMIT
    )
    with client.responses.stream(
        model=MODEL,
        previous_response_id=first.id,
        input="And the grass? One word.",
        max_output_tokens=LIMIT,
    ) as stream:
        events = [e.type for e in stream]
        second = stream.get_final_response()
    return {
        "first": {"id": first.id, "text": first.output_text, "status": first.status},
        "second": {"id": second.id, "text": second.output_text, "status": second.status},
        "events": sorted(set(events)),
    }


def main():
    mode = sys.argv[1]
    if mode == "messages":
        out = messages()
    elif mode == "responses":
        out = responses()
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
