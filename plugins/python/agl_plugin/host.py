"""The host imports as plain functions: `log`, `config()`, `tokenizer`,
and the rollout's data on demand (`request_json`, `response_json`,
`prompt_ids` of a call).

In a component they call the host; natively (tests) `agl_plugin.testing`
stands in for them. Errors the host returns raise `HostError`.
"""

import json

from componentize_py_types import Err
from wit_world.imports import config as _config
from wit_world.imports import log as _log
from wit_world.imports import rollout_data as _rollout_data
from wit_world.imports import tokenizer as _tokenizer


class HostError(Exception):
    """A host import answered with an error (e.g. no tokenizer configured)."""


def _host(call, *args):
    try:
        return call(*args)
    except Err as e:
        raise HostError(e.value) from None


# -- log --------------------------------------------------------------------

def log(level, message):
    """Logs `message` at `level` ("trace" ... "error") into the host's log."""
    _log.log(_log.Level[level.upper()], str(message))


def trace(message):
    log("trace", message)


def debug(message):
    log("debug", message)


def info(message):
    log("info", message)


def warn(message):
    log("warn", message)


def error(message):
    log("error", message)


# -- config -----------------------------------------------------------------

def config_json():
    """The plugin's `[plugin.NAME]` table as JSON text (`{}` without one)."""
    return _config.get()


def config(defaults=None):
    """The plugin's table as a dict, over `defaults`; a key that is not in
    `defaults` (when given) is an error, so a typo in agl.toml shows."""
    table = json.loads(config_json())
    if defaults is None:
        return table
    unknown = sorted(set(table) - set(defaults))
    if unknown:
        raise ValueError(f"invalid plugin config: unknown key(s) {', '.join(unknown)}")
    return {**defaults, **table}


# -- tokenizer --------------------------------------------------------------

class tokenizer:
    """The policy's tokenizer, when the host has one; every function but
    `available` raises `HostError` without one."""

    @staticmethod
    def available():
        return _tokenizer.available()

    @staticmethod
    def vocab_size():
        return _host(_tokenizer.vocab_size)

    @staticmethod
    def encode(text, add_special_tokens=False):
        return _host(_tokenizer.encode, text, add_special_tokens)

    @staticmethod
    def decode(ids, skip_special_tokens=False):
        return _host(_tokenizer.decode, list(ids), skip_special_tokens)

    @staticmethod
    def apply_chat_template(messages, tools=None, add_generation_prompt=True):
        """`messages` (and `tools`): lists, rendered as Hugging Face's
        `apply_chat_template(tokenize=False)` would."""
        tools_json = None if tools is None else json.dumps(tools)
        return _host(_tokenizer.apply_chat_template, json.dumps(messages), tools_json,
                     add_generation_prompt)


# -- rollout data -----------------------------------------------------------
# A call's request and response JSON and its whole prompt come from the host
# on demand (a long rollout's megabytes of JSON and repeated prompts are not
# copied into the plugin unless it reads them), each fetched once per call
# object and kept on it.

def _fetched(call, what, fetch):
    kept = f"_agl_{what}"
    value = call.__dict__.get(kept)
    if value is None:
        value = fetch(call.index)
        if value is None:
            raise HostError(f"call {call.index}: the host has no {what} for it (it serves the "
                            "calls of the rollout under way, during build-samples or reward)")
        setattr(call, kept, value)
    return value


def request_json(call):
    """The call's request body exactly as the harness sent it (JSON text)."""
    return _fetched(call, "request", _rollout_data.request_json)


def response_json(call):
    """The call's response body (JSON text; assembled if streamed)."""
    return _fetched(call, "response", _rollout_data.response_json)


def prompt_ids(call):
    """The call's whole prompt ids: its `prompt.tail` when it extends no
    call, else fetched from the host (once per call)."""
    if call.prompt.extends is None:
        return call.prompt.tail
    return _fetched(call, "prompt", _rollout_data.prompt_ids)


def prompt_len(call):
    """The length of the call's whole prompt, without fetching it."""
    return call.prompt.shared + len(call.prompt.tail)
