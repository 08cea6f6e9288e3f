"""Task environments: one interpreter (a venv) per distinct `environment`
of a task row, prepared once and reused by every rollout of every task that
names the same environment, so a rollout's setup installs nothing.

A row's `environment` (all keys optional; absent or {} = an empty venv on
the interpreter running the rollout):

  python    str    the base interpreter: a name on PATH ("python3.11") or a
                   path (a venv's python works: the new venv is based on its
                   base interpreter, without its packages)
  packages  [str]  pip requirements ("six==1.16.0", "pytest>=8")
  pip_args  [str]  extra `pip install` arguments ("--no-index",
                   "--find-links", "/wheels", ...)

The venv lives in `<envs root>/<key>/` ($MSWE_ENVS_ROOT, default
~/.cache/agl/mini-swe/envs), `key` = a hash of the three fields with the
resolved base interpreter's path. It is created with `python -m venv
--without-pip` (no pip inside: the agent cannot install into it) and the
packages are installed by the outer pip (`pip --python <venv> install`),
under a file lock (`<key>.lock`) so concurrent rollouts build it once. After
preparing, a manifest of every file (relative path, size, mtime; symlink
targets) is written to `<key>.json`; every later `prepare` verifies it and
rebuilds a venv that no longer matches, and the grader compares the venv
with the manifest the rollout started from: a changed environment is a
fatal flag (grade.py).
"""

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

SCHEME = 1  # bump when the layout of a prepared env changes
KEYS = ("python", "packages", "pip_args")


class EnvError(RuntimeError):
    """The environment could not be prepared (bad spec, no interpreter, pip failed)."""


def envs_root():
    return Path(os.environ.get("MSWE_ENVS_ROOT") or Path.home() / ".cache/agl/mini-swe/envs")


def normalize(environment):
    """The spec with defaults filled in: {"python": str|None, "packages": [...], "pip_args": [...]}."""
    env = environment if environment is not None else {}
    if isinstance(env, str):  # a JSON object in a string (parquet, CSV exports)
        try:
            env = json.loads(env) if env.strip() else {}
        except json.JSONDecodeError as e:
            raise EnvError(f"environment: not a JSON object: {e}") from e
    if not isinstance(env, dict):
        raise EnvError("environment: expected an object")
    unknown = sorted(set(env) - set(KEYS))
    if unknown:
        raise EnvError(f"environment: unknown keys {unknown} (known: {', '.join(KEYS)})")
    python = env.get("python") or None
    if python is not None and not isinstance(python, str):
        raise EnvError("environment.python: expected a string")
    spec = {"python": python}
    for key in ("packages", "pip_args"):
        value = env.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise EnvError(f"environment.{key}: expected a list of strings")
        spec[key] = list(value)
    return spec


def base_python(spec):
    """The resolved base interpreter of a spec."""
    name = spec["python"]
    if name is None:
        return Path(getattr(sys, "_base_executable", None) or sys.executable).resolve()
    path = Path(name).expanduser() if os.sep in name else shutil.which(name)
    if not path or not Path(path).exists():
        raise EnvError(f"environment.python: {name!r} not found")
    return Path(path).resolve()


def key_of(spec, base):
    blob = json.dumps({"scheme": SCHEME, "python": str(base), "packages": spec["packages"],
                       "pip_args": spec["pip_args"]}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def manifest(root, ctime=False):
    """Every entry under `root`: relative path -> [kind, ...]: files
    ["f", size, mtime_ns, mode] (+ ctime_ns: it cannot be set back, unlike
    mtime), symlinks ["l", target], dirs ["d"]."""
    out = {}
    stack = [""]
    while stack:
        rel = stack.pop()
        try:
            entries = list(os.scandir(os.path.join(root, rel) if rel else root))
        except OSError:
            continue
        for e in entries:
            path = f"{rel}/{e.name}" if rel else e.name
            st = e.stat(follow_symlinks=False)
            if e.is_symlink():
                out[path] = ["l", os.readlink(e.path)]
            elif e.is_dir(follow_symlinks=False):
                out[path] = ["d"]
                stack.append(path)
            else:
                out[path] = ["f", st.st_size, st.st_mtime_ns, st.st_mode] + ([st.st_ctime_ns] if ctime else [])
    return out


@dataclass
class Env:
    """A prepared environment: `python` is its interpreter; `files` the
    manifest it was verified against when this rollout started (with
    ctimes: `changes` compares against that)."""

    key: str
    dir: Path
    spec: dict
    files: dict = field(repr=False)

    @property
    def python(self):
        return self.dir / "bin" / "python"

    def changes(self, against=None, limit=20):
        """Paths (relative to the venv) that differ from `files` (or from
        the manifest `against`): added, removed or changed. Empty when the
        environment is untouched."""
        now, then = manifest(self.dir, ctime=True), self.files if against is None else against
        diff = sorted(p for p in set(now) | set(then) if now.get(p) != then.get(p))
        return diff[:limit] + ([f"... {len(diff) - limit} more"] if len(diff) > limit else [])

    def invalidate(self):
        """Makes the next `prepare` rebuild this environment."""
        try:
            (self.dir.parent / f"{self.key}.json").unlink()
        except FileNotFoundError:
            pass


def _run(cmd, what):
    try:
        r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise EnvError(f"{what}: {e}") from e
    if r.returncode != 0:
        tail = (r.stdout + r.stderr).decode(errors="replace")[-2000:]
        raise EnvError(f"{what} failed (exit {r.returncode}):\n{tail}")


def _build(target, base, spec):
    _run([str(base), "-m", "venv", "--without-pip", str(target)], f"venv {target}")
    if spec["packages"]:
        _run([sys.executable, "-m", "pip", "--python", str(target / "bin" / "python"), "install",
              "--disable-pip-version-check", "--no-input", *spec["pip_args"], *spec["packages"]],
             f"pip install {' '.join(spec['packages'])}")


def prepare(environment, root=None, log=None):
    """The environment of a task row, built if missing or modified; reused
    (no install) otherwise."""
    spec = normalize(environment)
    base = base_python(spec)
    key = key_of(spec, base)
    root = Path(root) if root else envs_root()
    root.mkdir(parents=True, exist_ok=True)
    target, record = root / key, root / f"{key}.json"
    with open(root / f"{key}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if record.exists() and target.is_dir():
            try:
                files = json.loads(record.read_text())["files"]
            except (OSError, ValueError, KeyError):
                files = None
            if files is not None and manifest(target) == files:
                return Env(key, target, spec, manifest(target, ctime=True))
            if log:
                log(f"environment {key} modified since it was prepared: rebuilding")
        record.unlink(missing_ok=True)
        shutil.rmtree(target, ignore_errors=True)
        started = time.monotonic()
        try:
            _build(target, base, spec)
        except EnvError:
            shutil.rmtree(target, ignore_errors=True)
            raise
        tmp = root / f"{key}.json.{os.getpid()}"
        tmp.write_text(json.dumps({"environment": spec, "python": str(base), "files": manifest(target)}))
        os.replace(tmp, record)
        if log:
            log(f"environment {key} prepared in {time.monotonic() - started:.1f}s")
        return Env(key, target, spec, manifest(target, ctime=True))
