"""What the agent changed, and which of its changes the grader drops and
flags: one job, shared by grade.py (and gen_tasks.py's diffs).

`scan` / `diff` compare the agent's workspace with the task's base state,
file by file (added / modified / deleted), without following symlinks.
`classify` says, with a reason, which change the tests' verdict could
depend on other than the source under test, so the grader drops it: tests
(the row's `test_files`, whatever `test_patch` touches, test_*.py /
*_test.py / tests.py / conftest.py, anything under tests/ test/ testing/),
test and runner configuration (pytest.ini, tox.ini, setup.cfg,
pyproject.toml, ...), interpreter start-up hooks (sitecustomize.py,
usercustomize.py, *.pth), NEW top-level modules or packages named like a
standard library module or the runner (unittest, pytest, _pytest, pluggy,
py), VCS metadata, caches and package metadata (.git, __pycache__, *.pyc,
*.egg-info, ...), compiled extension modules, symlinks and special files,
and source files whose added lines tamper with the runner or the
interpreter (`TAMPER`). `file_diff` writes a kept change as a git diff;
`tree_digest` fingerprints a base state.
"""

import ast
import difflib
import filecmp
import hashlib
import json
import os
import re
import sys
import tokenize
from io import BytesIO
from pathlib import Path

TEST_DIRS = {"tests", "test", "testing"}
CONFIG_FILES = {
    "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini", "setup.cfg", "pyproject.toml",
    "noxfile.py", "nose.cfg", ".noserc", "unittest.cfg", "unittest2.cfg", ".stestr.conf", ".testr.conf",
    "runtests.py",
}
STARTUP_FILES = {"sitecustomize.py", "usercustomize.py"}
VCS_DIRS = {".git", ".hg", ".svn"}
CACHE_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis", ".tox", ".nox", ".eggs"}
META_SUFFIXES = (".egg-info", ".dist-info")
EXTENSION_SUFFIXES = (".so", ".pyd")
IMPORTABLE_SUFFIXES = (".py", ".pyc", ".pyo", ".pyw") + EXTENSION_SUFFIXES
SHADOWED = set(getattr(sys, "stdlib_module_names", ())) | {"unittest", "pytest", "_pytest", "pluggy", "py"}
# Added lines of a (non-test) source file that tamper with the runner or the
# interpreter: (pattern over the line's code, without comments and strings;
# what; only when it runs at import: outside functions and `__main__` blocks).
TAMPER = [
    (re.compile(r"^\s*(import|from)\s+(unittest|pytest|_pytest|pluggy|nose|doctest)\b"), "imports a test runner",
     False),
    (re.compile(r"\b__import__\s*\("), "imports dynamically (__import__)", False),
    (re.compile(r"\bsys\s*\.\s*modules\b"), "touches sys.modules", False),
    (re.compile(r"\b__builtins__\b|^\s*(import|from)\s+builtins\b|\bbuiltins\s*\."), "touches builtins", False),
    (re.compile(r"\batexit\b"), "registers an exit handler (atexit)", False),
    (re.compile(r"\b_exit\s*\("), "ends the process (os._exit)", False),
    (re.compile(r"\bset(trace|profile)\b"), "installs a trace/profile hook", False),
    (re.compile(r"\bsys\s*\.\s*(meta_path|path_hooks)\b"), "installs an import hook", False),
    (re.compile(r"\b(exit|quit)\s*\(|\bSystemExit\b"), "exits at import", True),
]


def flag(path, reason, fatal=False):
    return {"path": path, "reason": reason, "fatal": fatal}


# --- the agent's changes -----------------------------------------------------


def scan(root):
    """Every entry under `root` without following symlinks: rel -> ("f",
    executable) | ("l", target) | ("d",) | ("o",) a cache / VCS / metadata
    folder (not entered) | ("g",) a folder shaped like a git dir (not
    entered) | ("x",) anything else."""
    out = {}
    stack = [""]
    while stack:
        rel = stack.pop()
        try:
            entries = list(os.scandir(os.path.join(root, rel) if rel else root))
        except OSError:
            continue
        names = {e.name for e in entries}
        if rel and {"HEAD", "objects", "refs"} <= names:
            out[rel] = ("g",)
            continue
        for e in entries:
            path = f"{rel}/{e.name}" if rel else e.name
            if e.is_symlink():
                out[path] = ("l", os.readlink(e.path))
            elif e.is_dir(follow_symlinks=False):
                if e.name in VCS_DIRS or e.name in CACHE_DIRS or e.name.endswith(META_SUFFIXES):
                    out[path] = ("o",)
                else:
                    out[path] = ("d",)
                    stack.append(path)
            elif e.is_file(follow_symlinks=False):
                out[path] = ("f", bool(e.stat(follow_symlinks=False).st_mode & 0o111))
            else:
                out[path] = ("x",)
    return out


def diff(base_root, base, work_root, work):
    """The changes from `base` to `work` (scans): [(rel, status)], status in
    added | modified | deleted | symlink | special | opaque (a cache, VCS or
    metadata folder, or a git-dir-shaped one, that the base does not have)."""
    changes = []
    for rel in sorted(set(base) | set(work)):
        b, w = base.get(rel), work.get(rel)
        bk, wk = (b or ("",))[0], (w or ("",))[0]
        if bk == "f" and wk != "f":
            changes.append((rel, "deleted"))
        if wk == "f":
            if bk != "f":
                changes.append((rel, "added"))
            elif b != w or not _same(os.path.join(base_root, rel), os.path.join(work_root, rel)):
                changes.append((rel, "modified"))
        elif wk == "l" and w != b or bk == "l" and wk != "l":
            changes.append((rel, "symlink"))
        elif wk == "x":
            changes.append((rel, "special"))
        elif wk in ("o", "g") and bk != wk:
            changes.append((rel, "opaque"))
    return changes


def _same(a, b):
    try:
        return filecmp.cmp(a, b, shallow=False)
    except OSError:  # unreadable: a change (its classification flags it)
        return False


def tree_digest(root):
    """A digest of a tree (scan + file contents): the base state a rollout
    started from, to prove the task's source did not change meanwhile."""
    h = hashlib.sha256()
    for rel, entry in sorted(scan(root).items()):
        h.update(json.dumps([rel, *entry]).encode())
        if entry[0] == "f":
            with open(os.path.join(root, rel), "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
    return h.hexdigest()


def is_test(rel, test_paths):
    parts = rel.split("/")
    name = parts[-1]
    return (
        rel in test_paths
        or name == "conftest.py"
        or name == "tests.py"
        or (name.startswith("test_") and name.endswith(".py"))
        or name.endswith("_test.py")
        or any(p in TEST_DIRS for p in parts[:-1])
    )


def patch_paths(patch):
    """The paths a diff touches (both sides of every file)."""
    paths = set()
    for line in (patch or "").splitlines():
        m = re.match(r"^diff --git a/(.+?) b/(.+)$", line)
        if m:
            paths.update(m.groups())
            continue
        m = re.match(r"^(?:---|\+\+\+) [ab]/(.+?)(?:\t.*)?$", line)
        if m:
            paths.add(m.group(1))
            continue
        m = re.match(r"^(?:rename|copy) (?:from|to) (.+)$", line)
        if m:
            paths.add(m.group(1))
    return paths


def shadow_top(rel, base):
    """The new top-level module (repo root or src/) `rel` belongs to when
    it is named like a standard library module or the runner, else None."""
    parts = rel.split("/")
    i = 1 if parts[0] == "src" and len(parts) > 1 else 0
    top = "/".join(parts[: i + 1])
    if top in base:  # the base has it: not new
        return None
    name = parts[i]
    if i == len(parts) - 1:  # a module file
        if not name.endswith(IMPORTABLE_SUFFIXES):
            return None
        name = name.split(".")[0]
    return top if name in SHADOWED else None


def _code_lines(text):
    """The lines of `text` with comments and string literals blanked."""
    lines = [list(line) for line in text.split("\n")]
    blank = {tokenize.COMMENT, tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}
    try:
        for tok in tokenize.tokenize(BytesIO(text.encode()).readline):
            if tok.type not in blank:
                continue
            (r0, c0), (r1, c1) = tok.start, tok.end
            for r in range(r0, r1 + 1):
                if r - 1 >= len(lines):
                    break
                line = lines[r - 1]
                start = c0 if r == r0 else 0
                end = c1 if r == r1 else len(line)
                for c in range(start, min(end, len(line))):
                    line[c] = " "
    except (tokenize.TokenError, SyntaxError):
        pass
    return ["".join(line) for line in lines]


def _deferred_lines(text):
    """Line numbers that do not run at import: function bodies and
    `if __name__ == "__main__":` blocks. None when the file does not parse."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    lines = set()
    for node in ast.walk(tree):
        body = None
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
        elif isinstance(node, ast.If) and "__main__" in ast.dump(node.test) and "__name__" in ast.dump(node.test):
            body = node.body
        if body:
            lines.update(range(body[0].lineno, max(getattr(n, "end_lineno", n.lineno) for n in body) + 1))
    return lines


def _split(text):
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def tamper(old, new):
    """Why the added lines of a Python source file (bytes; old None when
    added) tamper with the runner or the interpreter, or None."""
    try:
        new_text = new.decode()
        old_text = old.decode() if old is not None else ""
    except UnicodeDecodeError:
        return None
    old_lines, new_lines = _split(old_text), _split(new_text)
    added = set()
    for tag, _, _, j1, j2 in difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False).get_opcodes():
        if tag in ("replace", "insert"):
            added.update(range(j1 + 1, j2 + 1))
    if not added:
        return None
    code = _code_lines(new_text)
    deferred = _deferred_lines(new_text) or set()
    for n in sorted(added):
        line = code[n - 1] if n - 1 < len(code) else ""
        for pattern, what, import_time in TAMPER:
            if pattern.search(line) and not (import_time and n in deferred):
                return f"{what} (line {n}: {new_lines[n - 1].strip()[:80]})"
    return None


def classify(change, test_paths, base, base_root, work_root):
    """(reason, fatal) when a change must be dropped, else None."""
    rel, status = change
    parts = rel.split("/")
    name = parts[-1]
    if status == "symlink":
        return "symlink", False
    if status == "special":
        return "not a regular file", False
    if status == "opaque" or any(p in VCS_DIRS for p in parts):
        if name in VCS_DIRS or any(p in VCS_DIRS for p in parts):
            return "VCS metadata", False
        if name in CACHE_DIRS:
            return "cache", False
        if name.endswith(META_SUFFIXES):
            return "package metadata (entry points, plugins)", False
        return "a git repository", False
    if name.endswith((".pyc", ".pyo")) or any(p in CACHE_DIRS for p in parts):
        return "bytecode / cache", False
    if name in STARTUP_FILES or name.endswith(".pth"):
        return "interpreter start-up hook", False
    if is_test(rel, test_paths):
        return "test file", False
    if name in CONFIG_FILES:
        return "test / runner configuration", False
    if status != "deleted":
        top = shadow_top(rel, base)
        if top:
            return f"new top-level module `{top}` shadows the standard library or the test runner", False
        if name.endswith(EXTENSION_SUFFIXES):
            return "compiled extension module", False
        if name.endswith(".py"):
            old = Path(base_root, rel).read_bytes() if status == "modified" else None
            why = tamper(old, Path(work_root, rel).read_bytes())
            if why:
                return f"tampers with the runner or the interpreter: {why}", False
    return None


# --- the patch -----------------------------------------------------------------


def file_diff(rel, old, new, old_exec=False, new_exec=False):
    """A git-style diff of one file (old / new: bytes, None when absent)."""
    a, b = f"a/{rel}", f"b/{rel}"
    out = [f"diff --git {a} {b}\n"]
    mode = lambda x: "100755" if x else "100644"  # noqa: E731
    if old is None:
        out.append(f"new file mode {mode(new_exec)}\n")
    elif new is None:
        out.append(f"deleted file mode {mode(old_exec)}\n")
    elif old_exec != new_exec:
        out += [f"old mode {mode(old_exec)}\n", f"new mode {mode(new_exec)}\n"]
    if old == new:
        return "".join(out)
    try:
        old_text = old.decode() if old is not None else ""
        new_text = new.decode() if new is not None else ""
        if "\0" in old_text or "\0" in new_text:
            raise UnicodeDecodeError("utf-8", b"", 0, 1, "NUL")
    except UnicodeDecodeError:
        a, b = (a if old is not None else "/dev/null"), (b if new is not None else "/dev/null")
        out.append(f"Binary files {a} and {b} differ\n")
        return "".join(out)
    lines = difflib.unified_diff(_split(old_text), _split(new_text),
                                 a if old is not None else "/dev/null", b if new is not None else "/dev/null")
    for line in lines:
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def _read(path):
    try:
        return Path(path).read_bytes()
    except OSError:
        return None
