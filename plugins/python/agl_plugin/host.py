"""The host imports as plain functions: `log`, `config()`, `tokenizer`.

In a component they call the host; natively (tests) `agl_plugin.testing`
stands in for them. Errors the host returns raise `HostError`.
"""

import json

from componentize_py_types import Err
from wit_world.imports import config as _config
from wit_world.imports import log as _log
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
