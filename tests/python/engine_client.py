"""Drives agl's embedded engine through the gateway with the real OpenAI
Python SDK (host/agl/tests/e2e/engine_server.rs). Prints one JSON summary.

    engine_client.py greedy PROMPT...   one chat per prompt
    engine_client.py stream PROMPT...   the same, streamed
    engine_client.py concurrent N       N chats one at a time, then all at once
    engine_client.py completion PROMPT  one completion
    engine_client.py conversation PROMPT...  one chat, a turn per prompt,
                                        every reply echoed back verbatim,
                                        streamed and whole turns alternating
    engine_client.py choices N PROMPT   n=N sampled choices, whole and streamed
    engine_client.py kept N K PROMPT [stream]  a harness that asks for n=N
                                        choices (streamed or not), keeps choice
                                        K and goes on from it
    engine_client.py top K PROMPT       greedy, logprobs with K alternatives,
                                        chat whole and streamed, and completions
    engine_client.py responses-top K PROMPT  Responses at temperature 0 with
                                        the output text's logprobs and K
                                        alternatives, whole and streamed
    engine_client.py constrained N [json-only]  N seeds each of a json_schema
                                        answer and a forced tool call: how many
                                        parse and validate against their schema
    engine_client.py models             the listed model ids
    engine_client.py refused ARGS_JSON  one chat with extra arguments that must
                                        be refused: the status and message
"""

import json
import sys
from concurrent.futures import ThreadPoolExecutor

from openai import OpenAI

MAX_TOKENS = 16


def chat(client, text, **kw):
    kw.setdefault("max_tokens", MAX_TOKENS)
    return client.chat.completions.create(
        model="policy",
        messages=[{"role": "user", "content": text}],
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


def choices(client, n, text):
    """n choices at temperature 1, whole and streamed: their indices and texts."""
    kw = dict(n=n, temperature=1.0, seed=7, extra_body={"ignore_eos": True})
    whole = chat(client, text, **kw)
    streamed_texts, finishes = {}, {}
    for chunk in chat(client, text, stream=True, **kw):
        for c in chunk.choices:
            streamed_texts[c.index] = streamed_texts.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    return {
        "indices": [c.index for c in whole.choices],
        "texts": [c.message.content for c in whole.choices],
        "usage": whole.usage.completion_tokens,
        "streamed": [streamed_texts[i] for i in sorted(streamed_texts)],
        "stream_finishes": len(finishes),
    }


def kept(client, n, k, text, stream):
    """n choices of one turn (indices and texts as the SDK read them), then
    the next turn after the reply of choice k, as a best-of-n harness goes on."""
    kw = dict(n=n, temperature=1.0, seed=3, extra_body={"ignore_eos": True})
    if stream:
        texts = {}
        for chunk in chat(client, text, stream=True, **kw):
            for c in chunk.choices:
                texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
        indices, texts = sorted(texts), [texts[i] for i in sorted(texts)]
    else:
        answer = chat(client, text, **kw)
        indices = [c.index for c in answer.choices]
        texts = [c.message.content for c in answer.choices]
    messages = [{"role": "user", "content": text}, {"role": "assistant", "content": texts[k]},
                {"role": "user", "content": "go on"}]
    after = client.chat.completions.create(model="policy", messages=messages, max_tokens=MAX_TOKENS)
    return {"indices": indices, "texts": texts, "next": after.choices[0].message.content}


def responses_top(client, k, text):
    """The output_text part's text and logprob entries, whole and as the
    streamed `response.completed` (or `.incomplete`, cut at the limit)
    carries them."""
    kw = dict(model="policy", input=text, max_output_tokens=MAX_TOKENS, temperature=0.0,
              include=["message.output_text.logprobs"], top_logprobs=k)

    def part(response):
        [message] = [o for o in response.output if o.type == "message"]
        p = message.content[0]
        return {"text": p.text, "entries": [
            {"token": e.token, "logprob": e.logprob, "bytes": e.bytes,
             "top": [[t.token, t.logprob] for t in e.top_logprobs]} for e in p.logprobs]}

    whole = part(client.responses.create(**kw))
    events = list(client.responses.create(stream=True, **kw))
    completed = [e.response for e in events
                 if e.type in ("response.completed", "response.incomplete")]
    assert completed, [getattr(e, "type", e) for e in events]
    return {"whole": whole, "streamed": part(completed[0])}


def entries(logprobs):
    return [{"token": e.token, "logprob": e.logprob,
             "top": [[t.token, t.logprob] for t in e.top_logprobs]} for e in logprobs.content]


def top(client, k, text):
    kw = dict(temperature=0.0, logprobs=True, top_logprobs=k)
    whole = chat(client, text, **kw)
    streamed = []
    for chunk in chat(client, text, stream=True, **kw):
        for c in chunk.choices:
            if c.logprobs and c.logprobs.content:
                streamed += entries(c.logprobs)
    completion = client.completions.create(
        model="policy", prompt=text, max_tokens=MAX_TOKENS, temperature=0.0, logprobs=k)
    lp = completion.choices[0].logprobs
    return {"chat": entries(whole.choices[0].logprobs), "streamed": streamed,
            "completion": {"tokens": lp.tokens, "logprobs": lp.token_logprobs,
                           "top": lp.top_logprobs}}


SCHEMA = {
    "type": "object",
    "properties": {"color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}},
    "required": ["color", "ok"],
    "additionalProperties": False,
}
TOOL = {"type": "function", "function": {"name": "paint", "description": "paints",
                                         "parameters": SCHEMA}}


def constrained(client, n, tools=True):
    """n seeds at temperature 1 of a json_schema answer and (`tools`) of a
    forced call of `paint`: each must parse and validate."""
    import jsonschema

    answers, calls, examples = 0, 0, []
    for seed in range(n):
        kw = dict(temperature=1.0, seed=seed, max_tokens=150)
        a = chat(client, "pick a color", response_format={
            "type": "json_schema", "json_schema": {"name": "pick", "schema": SCHEMA, "strict": True}}, **kw)
        jsonschema.validate(json.loads(a.choices[0].message.content), SCHEMA)
        answers += 1
        if not tools:
            examples.append([a.choices[0].message.content])
            continue
        c = chat(client, "paint it", tools=[TOOL],
                 tool_choice={"type": "function", "function": {"name": "paint"}}, **kw)
        assert c.choices[0].message.tool_calls, (c.choices[0].message.content, c.choices[0].finish_reason)
        call = c.choices[0].message.tool_calls[0]
        assert call.function.name == "paint", call
        jsonschema.validate(json.loads(call.function.arguments), SCHEMA)
        calls += 1
        examples.append([a.choices[0].message.content, call.function.arguments])
    return {"answers": answers, "calls": calls, "examples": examples[:3]}


def refused(client, extra):
    import openai

    try:
        chat(client, "hi", **extra)
    except openai.APIStatusError as e:
        return {"status": e.status_code, "message": e.message}
    return {"status": 200}


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
    elif mode == "choices":
        result = choices(client, int(args[0]), args[1])
    elif mode == "kept":
        result = kept(client, int(args[0]), int(args[1]), args[2], args[3:] == ["stream"])
    elif mode == "responses-top":
        result = responses_top(client, int(args[0]), args[1])
    elif mode == "top":
        result = top(client, int(args[0]), args[1])
    elif mode == "constrained":
        result = constrained(client, int(args[0]), tools=args[1:] != ["json-only"])
    elif mode == "models":
        result = {"ids": [m.id for m in client.models.list()]}
    elif mode == "refused":
        result = refused(client, json.loads(args[0]))
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
