"""Running plugin code natively, in plain `unittest` tests: stand-ins for
the host imports, rollouts read from agl's rollout JSONL, and builders for
hand-made ones. `agl plugin build` runs a plugin's `test_*.py` this way
(against bindings generated from `wit/`) before it builds the component.

A hand-made call (`call`, a `TestCall`) holds its whole prompt and its
JSON; `rollout` hands each prompt over whole (linked to no call, which the
host does only for a prompt that shares no start with an earlier call) and
serves the JSON through the `rollout-data` stand-ins: each call's from its
own rollout, as the host serves the rollout under way. The `samples`
stand-ins merge and classify by the host's own rules: they run `agl plugin
rules` (the agl binary at `$AGL_BIN`, else `agl` on PATH; `agl plugin
build` sets it for the tests it runs).

    from agl_plugin import testing
    testing.install(config={"answer_field": "label"})
    rollouts = testing.read_rollouts("rollouts.jsonl")
"""

import dataclasses
import json
import os
import shutil
import subprocess

from wit_world.imports import config as _config
from wit_world.imports import log as _log
from wit_world.imports import rollout_data as _rollout_data
from wit_world.imports import tokenizer as _tokenizer
from componentize_py_types import Err
from wit_world.imports.types import (
    ApiKind, BreakKind, CallChoice, ChainBreak, Event, ModelCall, Prompt, Rollout, RolloutStatus,
    Sample, Span, Tag,
)

from . import samples as _sdk_samples

logs = []
"""(level name, message) of every line logged since `install`."""


class PieceTokenizer:
    """A tokenizer for tests: each id stands for a fixed piece of text."""

    def __init__(self, pieces):
        self.pieces = dict(pieces)

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.pieces[i] for i in ids)

    def encode(self, text, add_special_tokens=False):
        by_piece = sorted(self.pieces.items(), key=lambda kv: -len(kv[1]))
        ids = []
        while text:
            i, piece = next(((i, p) for i, p in by_piece if p and text.startswith(p)), (None, None))
            if i is None:
                raise ValueError(f"no piece for {text[:20]!r}")
            ids.append(i)
            text = text[len(piece):]
        return ids


def install(config=None, tokenizer=None):
    """Serves the host imports natively: `config` (a dict) as the plugin's
    table, `tokenizer` (an object with `decode`/`encode`, e.g. a
    `PieceTokenizer`) or none, log lines into `logs`."""
    logs.clear()
    table = json.dumps(config or {})

    def log(level, message):
        logs.append((level.name.lower(), message))

    def need():
        if tokenizer is None:
            raise Err("no tokenizer is configured (set model.tokenizer in agl.toml)")
        return tokenizer

    def fail_as_err(fn):
        def call(*args):
            try:
                return fn(*args)
            except Err:
                raise
            except Exception as e:
                raise Err(str(e)) from None
        return call

    _log.log = log
    _config.get = lambda: table
    _tokenizer.available = lambda: tokenizer is not None
    _tokenizer.vocab_size = fail_as_err(lambda: len(need().pieces))
    _tokenizer.encode = fail_as_err(lambda text, special: need().encode(text, special))
    _tokenizer.decode = fail_as_err(lambda ids, skip: need().decode(ids, skip))

    def no_template(*_):
        raise Err("apply_chat_template is not served by agl_plugin.testing")

    _tokenizer.apply_chat_template = no_template


class _Index(int):
    """A call index that, natively, carries the call's data (`served()`:
    request JSON, response JSON, whole prompt), so the stand-ins serve each
    call from its own rollout, as the host serves the rollout under way,
    however many rollouts a test has built. A plain index is served nothing."""


def _index(index, served):
    index = _Index(index)
    index.served = served
    return index


def _serving(part):
    def fetch(index):
        served = getattr(index, "served", None)
        found = served()[part] if served is not None else None
        return list(found) if isinstance(found, list) else found
    return fetch


# The `rollout-data` stand-ins need no setup: each index says what it serves.
_rollout_data.request_json = _serving(0)
_rollout_data.response_json = _serving(1)
_rollout_data.prompt_ids = _serving(2)


def agl_binary():
    """The agl binary the `samples` stand-ins run, or None."""
    return os.environ.get("AGL_BIN") or shutil.which("agl")


def _rules(request):
    agl = agl_binary()
    if agl is None:
        raise Err("natively the host's sample rules run through the agl binary: set AGL_BIN "
                  "(agl plugin build does) or put agl on PATH")
    done = subprocess.run([agl, "plugin", "rules"], input=json.dumps(request),
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise Err(f"agl plugin rules: {done.stderr.strip()}")
    return json.loads(done.stdout)


def _record(c):
    """One call of a hand-made rollout as a rollout JSONL call."""
    request_json, response_json, prompt = c.index.served()
    return {
        "index": int(c.index), "api": c.api.name.lower(),
        "request": json.loads(request_json), "response": json.loads(response_json),
        "prompt_ids": list(prompt), "response_ids": list(c.response_ids),
        "response_logprobs": list(c.response_logprobs), "weight_version": c.weight_version,
        "finish_reason": c.finish_reason, "tags": {t.key.lower(): t.value for t in c.tags},
        "continues": c.continues, "constrained": c.constrained,
        "choice": None if c.choice is None else {"index": c.choice.index,
                                                 "count": c.choice.count},
        "response_versions": c.response_versions,
    }


def _row(calls):
    return {"id": "r0", "status": "succeeded", "calls": [_record(c) for c in calls]}


def _break(b):
    return ChainBreak(kind=BreakKind[b["kind"].upper().replace("-", "_")],
                      call_index=b["call_index"], detail=b["detail"])


def _sample(s):
    return Sample(prompt_ids=s["prompt_ids"], response_ids=s["response_ids"],
                  trainable=[Span(start=t["start"], end=t["end"]) for t in s["trainable"]],
                  logprobs=s["logprobs"], source_calls=s["source_calls"],
                  weight_version=s["weight_version"], agent=s.get("agent"),
                  break_before=_break(s["break_before"]) if s.get("break_before") else None)


def _merge(options):
    rollout = _sdk_samples.testing_rollout[0]
    if rollout is None:
        raise Err("no rollout under way")
    merge = {"chain_by_agent": options.chain_by_agent,
             "skip_empty_responses": options.skip_empty_responses,
             "summary_markers": list(options.summary_markers)}
    merged = _rules({"rollout": _row(rollout.calls), "merge": merge})
    return [_sdk_samples._samples.Merged(sample=_sample(m["sample"]), after=m["after"])
            for m in merged]


def _classify(prev, next_call):
    calls = [getattr(i, "call", None) for i in (prev, next_call)]
    if None in calls:
        raise Err("natively a break is classified between calls of a testing.rollout")
    return _break(_rules({"rollout": _row(calls), "classify": [int(prev), int(next_call)]}))


if _sdk_samples._samples is not None:  # a sample adapter's bindings
    _sdk_samples._samples.merge = _merge
    _sdk_samples._samples.classify_break = _classify


def _text(value):
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


@dataclasses.dataclass
class TestCall(ModelCall):
    """A hand-made call: the record a plugin gets with its prompt whole
    (`prompt.tail`, linked to no call), and the JSON the host would serve
    for it, serving them as they are when asked. `rollout` links the calls
    of a rollout."""

    request_json: str = "{}"
    response_json: str = "{}"

    def __post_init__(self):
        self.index = _index(self.index, lambda: (self.request_json, self.response_json,
                                                 self.prompt.tail))


def call(index, prompt_ids, response_ids, logprobs=None, api=ApiKind.CHAT_COMPLETIONS,
         request=None, response=None, tags=None, continues=None, weight_version=0,
         finish_reason="stop", choice=None, constrained=False, response_versions=None):
    """A model call (a `TestCall`); `request`/`response` are JSON values,
    `tags` a dict, `choice` an `(index, count)` pair, `response_versions` one
    per response id."""
    return TestCall(
        index=index, api=api, request_json=_text(request or {}),
        response_json=_text(response or {}),
        prompt=Prompt(extends=None, shared=0, tail=list(prompt_ids)),
        response_ids=list(response_ids),
        response_logprobs=list(logprobs) if logprobs is not None else [0.0] * len(response_ids),
        weight_version=weight_version, finish_reason=finish_reason, started_at_ms=0,
        finished_at_ms=0, tags=[Tag(key=k, value=v) for k, v in sorted((tags or {}).items())],
        continues=continues,
        choice=CallChoice(index=choice[0], count=choice[1]) if choice is not None else None,
        constrained=constrained,
        response_versions=list(response_versions) if response_versions is not None else None,
    )


def event(kind, payload, timestamp_ms=0):
    return Event(kind=kind, payload_json=_text(payload), timestamp_ms=timestamp_ms)


def rollout(calls=(), events=(), input=None, id="r0", group_id="g0", attempt=1,
            status=RolloutStatus.SUCCEEDED):
    """A rollout of hand-made `calls` as the host hands it over, each prompt
    whole, the calls' JSON served by the `rollout-data` stand-ins."""
    calls = list(calls)
    for c in calls:
        if not isinstance(c, TestCall):
            raise TypeError(f"rollout takes hand-made calls (testing.call), not {type(c).__name__}")
    record = [f.name for f in dataclasses.fields(ModelCall) if f.name not in ("index", "prompt")]
    linked = []
    for c in calls:
        data = (c.request_json, c.response_json, list(c.prompt.tail))
        index = _index(c.index, lambda data=data: data)
        linked.append(ModelCall(**{k: getattr(c, k) for k in record}, index=index,
                                prompt=Prompt(extends=None, shared=0, tail=list(c.prompt.tail))))
        index.call = linked[-1]
    return Rollout(id=id, group_id=group_id, attempt=attempt, input_json=_text(input or {}),
                   status=status, calls=linked, events=list(events))


def chat(content, tool_calls=None):
    """A Chat Completions response body answering `content`."""
    message = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}


def from_json(row):
    """One rollout JSONL row (plugins/README.md, "Rollout JSONL") as a Rollout."""
    calls = [
        call(
            c["index"], c["prompt_ids"], c["response_ids"], c["response_logprobs"],
            api=ApiKind[c["api"].upper()], request=c.get("request"), response=c.get("response"),
            tags=c.get("tags"), continues=c.get("continues"),
            weight_version=c.get("weight_version", 0), finish_reason=c.get("finish_reason"),
            choice=(c["choice"]["index"], c["choice"]["count"]) if c.get("choice") else None,
            constrained=c.get("constrained", False),
            response_versions=c.get("response_versions"),
        )
        for c in row.get("calls", [])
    ]
    for c, raw in zip(calls, row.get("calls", [])):
        c.started_at_ms = raw.get("started_at_ms", 0)
        c.finished_at_ms = raw.get("finished_at_ms", 0)
    events = [event(e["kind"], e.get("payload"), e.get("timestamp_ms", 0))
              for e in row.get("events", [])]
    return rollout(calls, events, row.get("input"), row["id"], row.get("group_id", ""),
                   row.get("attempt", 0), RolloutStatus[row["status"].upper()])


def read_rollouts(path):
    """Every rollout of a rollout JSONL file."""
    with open(path, encoding="utf-8") as f:
        return [from_json(json.loads(line)) for line in f if line.strip()]
