"""Test-only Python reward whose behaviour is chosen by its config
`{"fault": ...}` or, overriding it for one rollout, by the rollout input's
`fault` (the host's sandbox tests, host/plugin-host/tests/plugins/python.rs):
`none` scores 1.0; `calls` scores the number of calls; `loop` spins forever; `memory` allocates without end;
`raise` raises; `wrong-type` returns a string; `exit` calls sys.exit;
`fs`, `net`, `env`, `clock` report what the guest sees of the filesystem,
network (a connect to the input's `target`), environment and clocks as the
error (the sandbox gives nothing); `data` reports as the error what the
host hands over of each call (its prompt's link, and the whole prompt and
JSON lengths fetched from `rollout-data`) and what it says of a call
index the rollout lacks.
"""

import dataclasses
import os
import socket
import sys
import time

from agl_plugin import (
    HostError, config, input_value, prompt_ids, request_json, response_json, reward,
)


def probe(fault, row):
    if fault == "fs":
        try:
            with open("/etc/passwd") as f:
                return f"read /etc/passwd: {f.read(20)!r}"
        except OSError as e:
            return f"fs denied: {type(e).__name__}"
    if fault == "net":
        try:
            host, port = row.get("target", "127.0.0.1:1").rsplit(":", 1)
            socket.create_connection((host, int(port)), timeout=1)
            return "net leaked: connected"
        except Exception as e:  # noqa: BLE001 - any failure is a denial
            return f"net denied: {type(e).__name__}"
    if fault == "env":
        return f"env: {dict(os.environ)}"
    if fault == "clock":
        return f"clock: time={time.time()} monotonic={time.monotonic()}"
    return None


def handed_over(rollout):
    seen = [f"call {c.index}: extends={c.prompt.extends} shared={c.prompt.shared} "
            f"tail={len(c.prompt.tail)} prompt={prompt_ids(c)} request={len(request_json(c))} "
            f"response={len(response_json(c))}" for c in rollout.calls]
    beyond = dataclasses.replace(rollout.calls[-1], index=len(rollout.calls))
    try:
        seen.append(f"beyond: {request_json(beyond)}")
    except HostError as e:
        seen.append(f"beyond: {e}")
    return "data: " + "; ".join(seen)


@reward
def score(rollout):
    row = input_value(rollout)
    fault = row.get("fault") if isinstance(row, dict) and "fault" in row else None
    fault = fault or config({"fault": "none"})["fault"]
    if fault == "calls":
        return float(len(rollout.calls))
    if fault == "loop":
        while True:
            pass
    if fault == "memory":
        hoard = []
        while True:
            hoard.append(bytearray(16 * 1024 * 1024))
    if fault == "raise":
        raise KeyError("the answer")
    if fault == "wrong-type":
        return "high"
    if fault == "exit":
        sys.exit(3)
    if fault == "data":
        raise RuntimeError(handed_over(rollout))
    seen = probe(fault, row if isinstance(row, dict) else {})
    if seen is not None:
        raise RuntimeError(seen)
    return 1.0
