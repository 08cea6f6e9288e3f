"""Whether a workspace holds the task's own git history: `task_history`
lists the commits of the task's source, `holds_history` looks for one of
them among the object ids of a git dir the agent left (without running git
on what the agent wrote). A workspace that does had the fix within reach.
"""

import mmap
import struct
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tasks  # noqa: E402


def _idx_shas(path):
    """The object ids (raw) of a pack index (v1 or v2, SHA-1)."""
    with open(path, "rb") as f:
        try:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # empty
            return
    with data:
        if data[:4] == b"\xfftOc":
            n = struct.unpack(">I", data[8 + 255 * 4: 8 + 256 * 4])[0]
            start = 8 + 1024
            for i in range(n):
                yield data[start + 20 * i: start + 20 * i + 20]
        else:
            n = struct.unpack(">I", data[255 * 4: 256 * 4])[0]
            for i in range(n):
                yield data[1024 + 24 * i + 4: 1024 + 24 * i + 24]


def _objects(objdir, depth=0):
    """Every object id (raw) of an objects folder, its alternates included."""
    objdir = Path(objdir)
    if depth > 4 or not objdir.is_dir():
        return
    for sub in objdir.iterdir():
        if len(sub.name) == 2 and sub.is_dir():
            for f in sub.iterdir():
                try:
                    yield bytes.fromhex(sub.name + f.name)
                except ValueError:
                    pass
    for idx in (objdir / "pack").glob("*.idx"):
        yield from _idx_shas(idx)
    alternates = objdir / "info" / "alternates"
    if alternates.is_file():
        for line in alternates.read_text(errors="replace").splitlines():
            if line.strip() and not line.startswith("#"):
                alt = Path(line.strip())
                yield from _objects(alt if alt.is_absolute() else objdir / alt, depth + 1)


def _git_objdirs(gitdir, depth=0):
    gitdir = Path(gitdir)
    if depth > 4:
        return []
    if gitdir.is_file():  # "gitdir: <path>" (a worktree or submodule pointer)
        text = gitdir.read_text(errors="replace").strip()
        if not text.startswith("gitdir:"):
            return []
        target = Path(text[len("gitdir:"):].strip())
        return _git_objdirs(target if target.is_absolute() else gitdir.parent / target, depth + 1)
    dirs = [gitdir / "objects"]
    common = gitdir / "commondir"
    if common.is_file():
        c = Path(common.read_text(errors="replace").strip())
        dirs += _git_objdirs(c if c.is_absolute() else gitdir / c, depth + 1)
    return dirs


def holds_history(gitdir, commits, limit=5_000_000):
    """Whether the git dir `gitdir` (a folder, or a `gitdir:` file) holds one
    of `commits` (raw ids). Reads object ids only: no git command runs on
    what the agent wrote."""
    if not commits:
        return False
    seen = 0
    try:
        for objdir in _git_objdirs(gitdir):
            for sha in _objects(objdir):
                if bytes(sha) in commits:
                    return True
                seen += 1
                if seen > limit:
                    return False
    except OSError:
        return False
    return False


_HISTORY = {}


def task_history(task):
    """The raw ids of every commit of the task's source (its mirror, or its
    snapshot's .git), base_commit included."""
    commits = set()
    if isinstance(task.get("base_commit"), str):
        try:
            commits.add(bytes.fromhex(task["base_commit"]))
        except ValueError:
            pass
    source = task.get("_mirror")
    args = ["--git-dir", str(source)] if source else None
    if source is None and task.get("_snapshot") is not None and (task["_snapshot"] / ".git").exists():
        args, source = ["-C", str(task["_snapshot"])], task["_snapshot"]
    if args:
        key = str(source)
        if key not in _HISTORY:
            r = subprocess.run(["git", *args, "rev-list", "--all"], capture_output=True, env=tasks.git_env())
            _HISTORY[key] = {bytes.fromhex(h) for h in r.stdout.decode().split()} if r.returncode == 0 else set()
        commits |= _HISTORY[key]
    return commits
