"""Grading a bug-fix rollout in a way the agent cannot reach.

After the agent stops, `grade(task, workspace, env)`:

1. Compares the agent's workspace with the task's base state, file by file
   (added / modified / deleted), without following symlinks (changes.py).
2. Drops, and flags with a reason, every change the tests' verdict could
   depend on other than the source under test: tests, test and runner
   configuration, interpreter start-up hooks, new modules shadowing the
   standard library or the runner, VCS metadata, caches, package metadata,
   compiled extensions, symlinks, special files, and source that tampers
   with the runner or the interpreter (changes.py: `classify`).
3. Fatal flags (reward 0 whatever the tests say): the workspace holds a git
   repository containing the task's own history (the agent copied or cloned
   the source repo, where the fix may be: history.py); the task's
   environment (its venv, envs.py) was modified; the runner's internals
   were replaced, or its report forged, by the code under test; tests or
   configuration changed on disk while the tests ran.
4. Builds a FRESH copy of the task at its base state, applies `test_patch`
   (the hidden tests) and only the kept changes, and runs FAIL_TO_PASS +
   PASS_TO_PASS with grade_runner.py (`python -I -B`, outside the copy,
   its verdict per test id written to a pipe, never its exit status), under
   a time limit ($MSWE_TEST_TIMEOUT, default 120 s: unreported tests fail)
   and without network: `unshare -rn` (a new network namespace with only
   loopback) when it works, else an audit hook in the runner that refuses
   connections and name look-ups ($MSWE_GRADE_SANDBOX = auto | unshare |
   audit).

The result: {"value": 1.0 iff every F2P and P2P test passed and nothing
fatal was flagged, "tests": {"passed", "failed"}, "outcomes": {id:
passed|failed|error|skipped|missing|timeout}, "flags": [{"path", "reason",
"fatal"}], "model_patch": the applied changes as a git diff (at most 64
KiB), "sandbox": "unshare" | "audit", "duration": seconds, "log": the
runner's output tail}.
"""

import hashlib
import json
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import envs  # noqa: E402
import tasks  # noqa: E402
# Re-exported: grade.flag, grade.tree_digest, grade.file_diff, ... keep working.
from changes import (  # noqa: E402
    CONFIG_FILES, STARTUP_FILES, VCS_DIRS, _read, classify, diff, file_diff, flag, is_test, patch_paths, scan,
    tree_digest,
)
from history import holds_history, task_history  # noqa: E402

RUNNER = HERE / "grade_runner.py"
MAX_PATCH = 64 * 1024
MAX_FLAGS = 100
RANK = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}


class GradeError(RuntimeError):
    """Grading could not run (a system problem, not the agent's doing)."""


# --- running the tests ---------------------------------------------------------

_SANDBOX = None


def sandbox_kind():
    """"unshare" (a network namespace: `unshare -rn`) when it works here,
    else "audit" (the runner's audit hook); $MSWE_GRADE_SANDBOX forces one."""
    global _SANDBOX
    want = os.environ.get("MSWE_GRADE_SANDBOX", "auto")
    if want == "audit":
        return "audit"
    if _SANDBOX is None:
        ok = False
        if shutil.which("unshare"):
            try:
                ok = subprocess.run(["unshare", "-rn", "true"], capture_output=True, timeout=30).returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                ok = False
        _SANDBOX = "unshare" if ok else "audit"
    if want == "unshare" and _SANDBOX != "unshare":
        raise GradeError("MSWE_GRADE_SANDBOX=unshare, but `unshare -rn` does not work here")
    return _SANDBOX


def run_tests(task, fresh, tmp, python, timeout, sandbox):
    """Runs the task's test ids with grade_runner.py in `fresh`: (outcomes,
    flags, log tail)."""
    ids = task["FAIL_TO_PASS"] + task["PASS_TO_PASS"]
    wanted = set(ids)
    home, scratch = tmp / "home", tmp / "tmp"
    home.mkdir()
    scratch.mkdir()
    # Stops pytest's config search next to the copy (never /tmp's).
    (tmp / "pytest.ini").write_text("[pytest]\n")
    token = secrets.token_hex(16)
    r, w = os.pipe()
    job = {"token": token, "fd": w, "runner": task["test_runner"], "ids": ids,
           "network": "record" if sandbox == "unshare" else "refuse", "lo_up": sandbox == "unshare",
           "allow_unix": [str(fresh), str(scratch)]}
    cmd = [str(python), "-I", "-B", str(RUNNER)]
    if sandbox == "unshare":
        cmd = [shutil.which("unshare") or "unshare", "-rn"] + cmd
    env = {"PATH": f"{Path(python).parent}{os.pathsep}{os.defpath}", "HOME": str(home), "TMPDIR": str(scratch),
           "LANG": "C.UTF-8", "TERM": "dumb"}
    log_path = tmp / "runner.log"
    started = time.monotonic()
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.Popen(cmd, cwd=fresh, env=env, stdin=subprocess.PIPE, stdout=log,
                                    stderr=subprocess.STDOUT, pass_fds=(w,), start_new_session=True)
        except OSError as e:
            os.close(r)
            os.close(w)
            raise GradeError(f"cannot start the test runner: {e}") from e
    os.close(w)
    try:
        proc.stdin.write(json.dumps(job).encode())
        proc.stdin.close()
    except OSError:  # BrokenPipeError: the runner is gone already
        pass
    buf, timed_out = b"", False
    try:
        while True:
            left = started + timeout - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([r], [], [], min(left, 0.5))
            if ready:
                chunk = os.read(r, 1 << 16)
                if not chunk:
                    break  # every writer closed the pipe
                buf += chunk
            elif proc.poll() is not None:
                break  # the runner ended; a child of it may still hold the pipe
    finally:
        os.close(r)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
    outcomes, flags, done, forged, tampered, network = {}, [], False, False, [], []
    for raw in buf.split(b"\n")[:-1]:  # complete lines only (a kill may cut the last)
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except ValueError:
            forged = True
            continue
        if not isinstance(line, dict) or line.get("token") != token or done:
            forged = True
        elif "id" in line:
            o = line.get("outcome") if line.get("outcome") in RANK else "error"
            if line["id"] in wanted:
                prev = outcomes.get(line["id"])
                outcomes[line["id"]] = o if prev is None or RANK[o] > RANK[prev] else prev
        elif "tampered" in line:
            tampered += [str(t) for t in line["tampered"]]
        elif "network" in line:
            network += [str(n) for n in line["network"]]
        elif "unguarded" in line:
            flags.append(flag("(tests)", f"sandbox: {line['unguarded']}"))
        elif line.get("done"):
            done = True
    missing = [t for t in ids if t not in outcomes]
    for t in missing:
        outcomes[t] = "timeout" if timed_out else "missing"
    if timed_out:
        flags.append(flag("(tests)", f"timed out after {timeout:g}s ({len(missing)} of {len(ids)} tests unreported)"))
    elif not done or missing:
        flags.append(flag("(tests)", f"the runner ended before reporting every test ({len(missing)} of {len(ids)} "
                                     f"unreported; exit status {proc.returncode})"))
    if tampered:
        flags.append(flag("(tests)", f"the code under test replaced runner internals: {', '.join(tampered[:10])}",
                          True))
    if forged:
        flags.append(flag("(tests)", "report lines the runner did not write (forged verdict)", True))
    if network:
        flags.append(flag("(tests)", f"network access attempted: {'; '.join(network[:5])}"))
    try:
        tail = log_path.read_bytes()[-4000:].decode(errors="replace")
    except OSError:
        tail = ""
    return outcomes, flags, tail


def _protected(fresh, test_paths):
    """Hashes of the copy's test and configuration files."""
    out = {}
    for rel, e in scan(fresh).items():
        name = rel.rsplit("/", 1)[-1]
        if e[0] == "f" and (is_test(rel, test_paths) or name in CONFIG_FILES or name in STARTUP_FILES) \
                and name.endswith((".py", ".ini", ".cfg", ".toml", ".conf")):
            out[rel] = hashlib.sha256(Path(fresh, rel).read_bytes()).hexdigest()
    return out


def _safe_target(root, rel):
    """Whether writing `rel` under `root` stays inside it (no symlink on the way)."""
    p = Path(root)
    for part in rel.split("/"):
        p = p / part
        if p.is_symlink():
            return False
    return True


def _env_flags(env, when, against=None):
    changed = env.changes(against)
    if not changed:
        return []
    env.invalidate()
    return [flag(str(env.dir / changed[0]) if not changed[0].startswith("...") else str(env.dir),
                 f"environment modified {when}: {', '.join(changed[:5])}", True)]


def grade(task, workspace, env=None, python=None, timeout=None, base_digest=None):
    """Grades the agent's `workspace` (see the module docstring). `env`: the
    task's envs.Env (its python runs the tests; its manifest is verified);
    `python` overrides the interpreter; `base_digest`: tree_digest of the
    base state when the rollout started (a fatal flag when the task's
    source no longer gives it)."""
    started = time.monotonic()
    workspace = Path(workspace)
    python = Path(python or (env.python if env else sys.executable))
    timeout = float(timeout or os.environ.get("MSWE_TEST_TIMEOUT") or 120)
    sandbox = sandbox_kind()
    flags = _env_flags(env, "by the agent") if env else []
    test_paths = set(task.get("test_files") or []) | patch_paths(task.get("test_patch"))
    history = task_history(task)
    with tempfile.TemporaryDirectory(prefix="mswe-grade-") as tmp:
        tmp = Path(tmp)
        fresh = tasks.materialize(task, tmp / "fresh")
        if base_digest and tree_digest(fresh) != base_digest:
            flags.append(flag(str(task.get("_snapshot") or task.get("_mirror")),
                              "the task's source changed during the rollout", True))
        base = scan(fresh)
        work = scan(workspace)
        kept, patch = [], []
        for change in diff(fresh, base, workspace, work):
            rel, status = change
            parts = rel.split("/")
            if parts[-1] in VCS_DIRS or work.get(rel, ("",))[0] == "g":
                if holds_history(workspace / rel, history):
                    flags.append(flag(rel, "a git repository holding the task's own history "
                                           "(copied or cloned from its source)", True))
                    continue
            try:
                why = classify(change, test_paths, base, fresh, workspace)
            except OSError as e:
                why = (f"unreadable: {e.strerror}", False)
            if why:
                flags.append(flag(rel, why[0], why[1]))
                continue
            if not _safe_target(fresh, rel):
                flags.append(flag(rel, "its path crosses a symlink of the base"))
                continue
            kept.append(change)
            old = _read(fresh / rel) if status != "added" else None
            new = _read(workspace / rel) if status != "deleted" else None
            patch.append(file_diff(rel, old, new, base.get(rel, ("", False))[-1] is True,
                                   work.get(rel, ("", False))[-1] is True))
        try:
            tasks.apply_patch(fresh, task.get("test_patch") or "", "test_patch")
        except tasks.TaskError as e:
            raise tasks.TaskError(f"{task['instance_id']}: {e}") from e
        for rel, status in sorted(kept, key=lambda c: c[1] != "deleted"):
            try:
                if status == "deleted":
                    (fresh / rel).unlink()
                else:
                    (fresh / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(workspace / rel, fresh / rel, follow_symlinks=False)
                    os.chmod(fresh / rel, 0o755 if work[rel][1] else 0o644)
            except OSError as e:
                flags.append(flag(rel, f"could not apply the change: {e}"))
        protected = _protected(fresh, test_paths)
        env_before = envs.manifest(env.dir, ctime=True) if env else None
        outcomes, run_flags, log = run_tests(task, fresh, tmp, python, timeout, sandbox)
        flags += run_flags
        after = _protected(fresh, test_paths)
        changed = sorted(p for p in set(protected) | set(after) if protected.get(p) != after.get(p))
        if changed:
            flags.append(flag(changed[0], f"tests or configuration changed while the tests ran: "
                                          f"{', '.join(changed[:5])}", True))
    if env:
        flags += _env_flags(env, "while the tests ran", env_before)
    ids = task["FAIL_TO_PASS"] + task["PASS_TO_PASS"]
    passed = [t for t in ids if outcomes.get(t) == "passed"]
    failed = [t for t in ids if outcomes.get(t) != "passed"]
    fatal = any(f["fatal"] for f in flags)
    if len(flags) > MAX_FLAGS:
        rest = flags[MAX_FLAGS:]
        flags = flags[:MAX_FLAGS] + [flag("...", f"{len(rest)} more flags", any(f["fatal"] for f in rest))]
    model_patch = "".join(patch)
    if len(model_patch.encode()) > MAX_PATCH:
        model_patch = model_patch.encode()[:MAX_PATCH].decode(errors="ignore") + "\n[... truncated]\n"
    return {
        "value": 1.0 if not failed and not fatal else 0.0,
        "tests": {"passed": passed, "failed": failed},
        "outcomes": outcomes,
        "flags": flags,
        "model_patch": model_patch,
        "sandbox": sandbox,
        "duration": round(time.monotonic() - started, 3),
        "log": log,
    }
