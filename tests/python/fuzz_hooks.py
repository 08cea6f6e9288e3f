"""Schemathesis hooks for the fuzzing of `/openapi.json` (host/agl/tests/e2e/openapi_fuzz.rs,
tests/fuzz_api.sh), loaded through SCHEMATHESIS_HOOKS. They keep the gateway under test
serving, so every operation is fuzzed against a working gateway rather than one a previous
call switched off:

- `GET /v1/changes` holds a request up to `wait_ms` (at most a minute) while the store's
  change counter reads `after`; a fuzzer that hits the counter's value would spend that minute
  waiting for nothing. Waits are cut to 50 ms: the same answer, sooner (values over the bound,
  which the gateway refuses at once, are kept).
- The engine the test registered (AGL_FUZZ_ENGINE, a `RegisterEngine` body) is registered
  again right after a `DELETE /v1/engines/{name}` removed it, and the proxy resumed right
  after a `POST /v1/proxy/pause` (each call's own answer is checked as it came).
"""

import json
import os

import requests
import schemathesis

MAX_WAIT_MS = 50


@schemathesis.hook
def map_query(context, query):
    operation = context.operation
    if operation is None or operation.path != "/v1/changes" or not isinstance(query, dict):
        return query
    wait = query.get("wait_ms")
    if isinstance(wait, int) and not isinstance(wait, bool) and 0 <= wait <= 60_000:
        query["wait_ms"] = min(wait, MAX_WAIT_MS)
    return query


def _admin(path, body):
    base = os.environ["AGL_FUZZ_BASE"]
    key = os.environ["AGL_FUZZ_ADMIN_KEY"]
    answer = requests.post(
        f"{base}{path}", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=10
    )
    answer.raise_for_status()


@schemathesis.hook
def after_call(context, case, response):
    if response.status_code != 200 or "AGL_FUZZ_BASE" not in os.environ:
        return
    path, method = case.operation.path, case.method.upper()
    if method == "DELETE" and path == "/v1/engines/{name}":
        _admin("/v1/engines", json.loads(os.environ["AGL_FUZZ_ENGINE"]))
    elif method == "POST" and path == "/v1/proxy/pause":
        _admin("/v1/proxy/resume", None)
