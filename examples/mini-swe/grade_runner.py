"""The grader's test runner (grade.py starts it; not for direct use).

Runs as `python -I -B grade_runner.py` (isolated: no PYTHON* variables, no
user site, neither the script's folder nor the working directory on
sys.path; no bytecode written) with the working directory a fresh copy of
the task: its base state, the hidden tests, and the agent's kept changes.

The job comes on stdin (read whole, then stdin is /dev/null):
  {"token": str, "fd": int, "runner": "unittest"|"pytest", "ids": [...],
   "network": "record"|"refuse", "lo_up": bool, "allow_unix": [dirs]}
and the verdict goes to the inherited pipe `fd`, one JSON line each, every
line carrying the token:
  {"id": ..., "outcome": "passed"|"failed"|"error"|"skipped"}  per test id
  {"network": [...]}      connection / name look-up attempts (at most 20)
  {"tampered": [...]}     runner or builtins internals replaced (fatal)
  {"unguarded": why}      the network could not be blocked
  {"done": true}          everything was reported
then it leaves with os._exit (no atexit handler of the code under test
runs after the verdict). The test runner is imported before the repo goes
on sys.path, so a module of the repo named `unittest` / `pytest` cannot
replace it; loading errors (SystemExit at import included) are "error"; a
test id with nothing to run is "error"; only "passed" passes.
"""

import builtins
import json
import os
import socket
import sys
import types
import unittest
import unittest.case
import unittest.loader
import unittest.result
import unittest.suite

RANK = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}


def worst(a, b):
    return a if a is not None and (b is None or RANK[a] >= RANK[b]) else b


class Guard:
    """Identity snapshot of the callables the verdict depends on (the test
    runner's classes and modules, builtins, this module): the code under
    test replacing one of them is tampering."""

    def __init__(self, owners):
        self.owners = owners
        self.snap = {name: self._callables(obj) for name, obj in owners}

    @staticmethod
    def _callables(obj):
        out = {}
        for k, v in list(vars(obj).items()):
            f = v.__func__ if isinstance(v, (classmethod, staticmethod)) else v
            if isinstance(f, property):
                f = f.fget
            if isinstance(f, (types.FunctionType, types.BuiltinFunctionType, type)):
                out[k] = (f, getattr(f, "__code__", None))
        return out

    def changed(self):
        bad = []
        for name, obj in self.owners:
            now = self._callables(obj)
            for k, (f, code) in self.snap[name].items():
                cur = now.get(k)
                if cur is None or cur[0] is not f or getattr(f, "__code__", None) is not code:
                    bad.append(f"{name}.{k}")
        return bad


def network_hook(mode, allow_unix, seen):
    """An audit hook: records connection and name look-up attempts; in
    "refuse" mode (no network namespace) refuses them; always refuses
    AF_UNIX connections outside `allow_unix` (a network namespace does
    not cover filesystem sockets)."""
    allow = tuple(os.path.join(os.path.abspath(d), "") for d in allow_unix)
    lookups = {"socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr", "socket.getnameinfo"}
    af_unix = getattr(socket, "AF_UNIX", None)

    def refuse(what):
        raise PermissionError(f"grading: network access refused ({what})")

    def hook(event, args):
        if not event.startswith("socket."):
            return
        if event in ("socket.connect", "socket.sendto", "socket.bind"):
            sock, addr = args[0], args[1]
            if af_unix is not None and getattr(sock, "family", None) == af_unix:
                path = addr.decode("latin-1") if isinstance(addr, (bytes, bytearray)) else str(addr)
                if not path or path.startswith("\0"):  # abstract: per network namespace
                    if mode == "refuse":
                        refuse(f"{event} {path!r}")
                    return
                if event != "socket.bind" and not os.path.join(os.path.abspath(path), "").startswith(allow):
                    refuse(f"{event} {path!r}")
                return
            if event == "socket.bind":
                if mode == "refuse":
                    refuse(f"{event} {addr!r}")
                return
            if len(seen) < 20:
                seen.append(f"{event.split('.')[1]} {addr!r}")
            if mode == "refuse":
                refuse(f"{event} {addr!r}")
        elif event in lookups:
            if len(seen) < 20:
                seen.append(f"{event.split('.')[1]} {args[0]!r}")
            if mode == "refuse":
                refuse(f"{event} {args[0]!r}")

    return hook


def lo_up():
    """Brings the loopback interface up in a fresh network namespace, so
    tests that serve on 127.0.0.1 still work (best effort)."""
    import fcntl
    import struct

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            req = struct.pack("16sH22x", b"lo", 0)
            flags = struct.unpack("16sH22x", fcntl.ioctl(s, 0x8913, req))[1]  # SIOCGIFFLAGS
            fcntl.ioctl(s, 0x8914, struct.pack("16sH22x", b"lo", flags | 0x1))  # SIOCSIFFLAGS, IFF_UP
    except OSError:
        pass


def flatten(suite):
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from flatten(t)
        else:
            yield t


class Result(unittest.TestResult):
    """Per test: the worst outcome seen (a failing subtest fails its test)."""

    def __init__(self):
        super().__init__()
        self.outcomes = {}

    def _set(self, test, outcome):
        self.outcomes[id(test)] = worst(outcome, self.outcomes.get(id(test)))

    def addSuccess(self, test):
        self._set(test, "passed")

    def addFailure(self, test, err):
        self._set(test, "failed")

    def addError(self, test, err):
        self._set(test, "error")

    def addSkip(self, test, reason):
        self._set(test, "skipped")

    def addExpectedFailure(self, test, err):
        self._set(test, "skipped")

    def addUnexpectedSuccess(self, test):
        self._set(test, "failed")

    def addSubTest(self, test, subtest, err):
        if err is not None:
            self._set(test, "failed" if issubclass(err[0], test.failureException) else "error")


def run_unittest(ids, report, check):
    loader = unittest.TestLoader()
    for n, test_id in enumerate(ids):
        try:
            suite = loader.loadTestsFromName(test_id)
        except BaseException as e:  # SystemExit / KeyboardInterrupt at import included
            report(test_id, "error", f"loading: {type(e).__name__}: {e}")
            if check(ids[n + 1:]):
                return
            continue
        if check(ids[n:]):
            return
        tests = list(flatten(suite))
        if not tests:
            report(test_id, "error", "no tests")
            continue
        result = Result()
        try:
            suite.run(result)
        except BaseException as e:
            report(test_id, "error", f"running: {type(e).__name__}: {e}")
            if check(ids[n + 1:]):
                return
            continue
        if check(ids[n:]):
            return
        outcome = None
        for t in tests:
            outcome = worst(result.outcomes.get(id(t), "error"), outcome)
        report(test_id, outcome)


def run_pytest(ids, report, check, pytest):
    class Recorder:
        def __init__(self):
            self.outcomes = {}

        def pytest_runtest_logreport(self, report):
            if report.when == "call":
                outcome = "passed" if report.passed else "failed" if report.failed else "skipped"
            elif report.failed:
                outcome = "error"
            elif report.skipped:
                outcome = "skipped"
            else:
                outcome = "passed"
            self.outcomes[report.nodeid] = worst(outcome, self.outcomes.get(report.nodeid))

    recorder = Recorder()
    cwd = os.getcwd()
    args = ["-q", "-p", "no:cacheprovider", "--rootdir", cwd, "--confcutdir", cwd, *ids]
    # grade.py puts an empty pytest.ini next to the fresh copy: the config
    # search stops there when the repo has none (never reaching /tmp).
    try:
        pytest.main(args, plugins=[recorder])
    except BaseException as e:
        print(f"grade_runner: pytest raised {type(e).__name__}: {e}", file=sys.stderr)
    if check([]):
        for test_id in ids:
            report(test_id, "error", "tampered")
        return
    for test_id in ids:
        outcome, ran = None, False
        for nid, o in recorder.outcomes.items():
            if nid == test_id or nid.startswith((test_id + "::", test_id + "[")):
                ran, outcome = True, worst(o, outcome)
        report(test_id, outcome if ran else "error", None if ran else "not run")


def main():
    job = json.loads(sys.stdin.read())
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    token, fd = job["token"], job["fd"]

    def emit(line):
        line["token"] = token
        os.write(fd, (json.dumps(line) + "\n").encode())

    def report(test_id, outcome, detail=None):
        emit({"id": test_id, "outcome": outcome, **({"detail": str(detail)[:300]} if detail else {})})

    owners = [("unittest.TestCase", unittest.TestCase), ("unittest.TestSuite", unittest.TestSuite),
              ("unittest.BaseTestSuite", unittest.suite.BaseTestSuite),
              ("unittest.TestResult", unittest.TestResult), ("unittest.TestLoader", unittest.TestLoader),
              ("unittest.case._Outcome", unittest.case._Outcome), ("unittest.case", unittest.case),
              ("unittest.suite", unittest.suite), ("unittest.loader", unittest.loader),
              ("unittest.result", unittest.result), ("builtins", builtins),
              ("grade_runner", sys.modules[__name__]), ("grade_runner.Result", Result)]
    pytest = None
    if job["runner"] == "pytest":
        try:
            import _pytest.main
            import _pytest.python
            import _pytest.reports
            import _pytest.runner
            import pluggy._callers
            import pluggy._hooks
            import pytest
        except BaseException as e:
            for test_id in job["ids"]:
                report(test_id, "error", f"pytest not importable in the task environment: {e}")
            emit({"done": True})
            os._exit(0)
        owners += [("_pytest.runner", _pytest.runner), ("_pytest.reports.TestReport", _pytest.reports.TestReport),
                   ("_pytest.reports.BaseReport", _pytest.reports.BaseReport),
                   ("_pytest.python.Function", _pytest.python.Function), ("_pytest.python", _pytest.python),
                   ("_pytest.main", _pytest.main), ("_pytest.main.Session", _pytest.main.Session),
                   ("pluggy._callers", pluggy._callers), ("pluggy.HookCaller", pluggy._hooks.HookCaller)]
    guard = Guard(owners)
    seen = []

    def check(rest):
        """True (and the rest reported as errors) when something was tampered with."""
        bad = guard.changed()
        if bad:
            emit({"tampered": bad[:20]})
            for test_id in rest:
                report(test_id, "error", "tampered")
        return bool(bad)

    if job.get("lo_up"):
        lo_up()
    if hasattr(sys, "addaudithook"):
        sys.addaudithook(network_hook(job["network"], job.get("allow_unix", []), seen))
    elif job["network"] == "refuse":  # Python < 3.8 and no network namespace
        emit({"unguarded": "no audit hooks before Python 3.8: the network was not blocked"})
    sys.path.insert(0, os.getcwd())  # only now: the runner is already imported
    try:
        if pytest is not None:
            run_pytest(job["ids"], report, check, pytest)
        else:
            run_unittest(job["ids"], report, check)
    finally:
        if seen:
            emit({"network": seen})
    emit({"done": True})
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
