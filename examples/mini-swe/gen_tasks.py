#!/usr/bin/env python3
"""Generates the mini-swe example's tasks: tiny Python repos, each a module
with one planted bug, an issue text and unittest tests (no dependency but
Python), as SWE-bench-shaped rows. Deterministic: same templates, same
seed, same bytes.

Writes
  <root>/<instance_id>/            the repo at its base state (the task's
                                   `snapshot`): the module with the bug and
                                   the PASS_TO_PASS tests only
  examples/mini-swe/tasks.jsonl    one row per task (schema: tasks.py):
                                   `test_patch` adds the FAIL_TO_PASS tests
                                   (hidden from the agent), `patch` is the
                                   gold fix, `environment` an empty venv

Run: python3 examples/mini-swe/gen_tasks.py [--root DIR] [--out FILE] [--check]
(--root default: $MSWE_TASKS_ROOT or ~/.cache/agl/mini-swe/repos; --check
proves every row through the grader, as `tasks.py --check`: FAIL_TO_PASS
fail at base + test_patch and pass with the gold patch, PASS_TO_PASS pass
both.)
"""

import argparse
import json
import random
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import tasks  # noqa: E402
from changes import file_diff  # noqa: E402

SEED, VARIANTS, N_VAL = 4242, 3, 6

# name, function source, the buggy line -> fixed line, issue text, and
# tests: (test name, expression that must be True, fails on the bug?).
# `{a}`, `{b}`, `{c}` are small integers drawn per variant.
TEMPLATES = [
    (
        "arith",
        "def add(a, b):\n    return a - b\n",
        ("return a - b", "return a + b"),
        "`add({a}, {b})` returns {diff} instead of {sum}.",
        [("adds", "add({a}, {b}) == {sum}", True), ("zero", "add(0, 0) == 0", False)],
    ),
    (
        "bounds",
        "def clamp(x, lo, hi):\n    return max(hi, min(lo, x))\n",
        ("return max(hi, min(lo, x))", "return max(lo, min(hi, x))"),
        "`clamp({a}, 0, {c})` should return {a} (it is inside the range) but returns {c}.",
        [("inside", "clamp({a}, 0, {c}) == {a}", True), ("equal", "clamp(3, 3, 3) == 3", False)],
    ),
    (
        "parity",
        "def is_even(n):\n    return n % 2 == 1\n",
        ("return n % 2 == 1", "return n % 2 == 0"),
        "`is_even({even})` returns False.",
        [("even", "is_even({even}) is True", True), ("type", "isinstance(is_even(3), bool)", False)],
    ),
    (
        "fact",
        "def factorial(n):\n    out = 1\n    for i in range(1, n):\n        out *= i\n    return out\n",
        ("for i in range(1, n):", "for i in range(1, n + 1):"),
        "`factorial({small})` is wrong: it looks like the last factor is missing.",
        [("value", "factorial({small}) == {fact}", True), ("base", "factorial(0) == 1", False)],
    ),
    (
        "words",
        "def reverse_words(s):\n    return ' '.join(s.split())\n",
        ("return ' '.join(s.split())", "return ' '.join(reversed(s.split()))"),
        "`reverse_words('w{a} w{b}')` should give 'w{b} w{a}' but the order is unchanged.",
        [("two", "reverse_words('w{a} w{b}') == 'w{b} w{a}'", True), ("one", "reverse_words('x') == 'x'", False)],
    ),
    (
        "vowels",
        "def count_vowels(s):\n    return sum(1 for ch in s if ch in 'aeiou')\n",
        ("if ch in 'aeiou'", "if ch.lower() in 'aeiou'"),
        "`count_vowels` ignores upper-case vowels: `count_vowels('A{a}E')` returns 0.",
        [("upper", "count_vowels('A{a}E') == 2", True), ("lower", "count_vowels('banana') == 3", False)],
    ),
    (
        "stats",
        "def mean(xs):\n    return sum(xs) / (len(xs) - 1)\n",
        ("return sum(xs) / (len(xs) - 1)", "return sum(xs) / len(xs)"),
        "`mean([{a}, {a}])` should be {a} but is {dbl}.",
        [("pair", "mean([{a}, {a}]) == {a}", True), ("type", "callable(mean)", False)],
    ),
    (
        "temp",
        "def c_to_f(c):\n    return c * 5 / 9 + 32\n",
        ("return c * 5 / 9 + 32", "return c * 9 / 5 + 32"),
        "`c_to_f(100)` should be 212 (water boils) but is not.",
        [("boil", "c_to_f(100) == 212", True), ("freeze", "c_to_f(0) == 32", False)],
    ),
    (
        "text",
        "def is_palindrome(s):\n    return s == s[::-1]\n",
        ("return s == s[::-1]", "return s.lower() == s.lower()[::-1]"),
        "`is_palindrome('Abba')` returns False; case should not matter.",
        [("case", "is_palindrome('Abba') is True", True), ("plain", "is_palindrome('abc') is False", False)],
    ),
    (
        "lists",
        "def last(xs, n):\n    return xs[-n + 1:]\n",
        ("return xs[-n + 1:]", "return xs[-n:]"),
        "`last([1, 2, 3, {a}], 2)` should return [3, {a}] but returns one item too few.",
        [("two", "last([1, 2, 3, {a}], 2) == [3, {a}]", True), ("empty", "last([], 1) == []", False)],
    ),
    (
        "money",
        "def total_cents(prices):\n    return sum(int(p * 10) for p in prices)\n",
        ("int(p * 10)", "round(p * 100)"),
        "`total_cents([{a}.5])` should be {cents} cents.",
        [("cents", "total_cents([{a}.5]) == {cents}", True), ("none", "total_cents([]) == 0", False)],
    ),
    (
        "grid",
        "def neighbours(x, y):\n    return [(x + 1, y), (x - 1, y), (x, y + 1)]\n",
        ("(x, y + 1)]", "(x, y + 1), (x, y - 1)]"),
        "`neighbours({a}, {b})` misses the cell below, ({a}, {bm1}).",
        [("below", "({a}, {bm1}) in neighbours({a}, {b})", True), ("right", "({ap1}, {b}) in neighbours({a}, {b})", False)],
    ),
]


def values(rng):
    a, b, c = rng.randint(2, 9), rng.randint(10, 40), rng.randint(50, 90)
    small = rng.randint(3, 6)
    fact = 1
    for i in range(1, small + 1):
        fact *= i
    return {
        "a": a, "b": b, "c": c, "sum": a + b, "diff": a - b, "even": 2 * b,
        "small": small, "fact": fact, "dbl": 2 * a, "cents": a * 100 + 50,
        "bm1": b - 1, "ap1": a + 1,
    }


def test_file(module, tests, v):
    lines = [
        "import unittest\n",
        f"from {module} import *  # noqa: F403\n\n",
        "\nclass TestIssue(unittest.TestCase):\n",
    ]
    for name, expr, _ in tests:
        lines.append(f"    def test_{name}(self):\n        self.assertTrue({expr.format(**v)})\n\n")
    lines.append("\nif __name__ == '__main__':\n    unittest.main()\n")
    return "".join(lines)


def make_tasks(root):
    """Writes the snapshots under `root`; returns the rows."""
    rng = random.Random(SEED)
    rows = []
    for variant in range(VARIANTS):
        for name, source, (bad, good), issue, tests in TEMPLATES:
            v = values(rng)
            instance_id = f"tiny__{name}-{variant}"
            module = f"{name}{variant}"
            repo = root / instance_id
            if repo.exists():
                shutil.rmtree(repo)
            (repo / "tests").mkdir(parents=True)
            code = f'"""The {name} helpers."""\n\n\n' + source
            assert code.count(bad) == 1, f"{instance_id}: the fix is not unique"
            (repo / f"{module}.py").write_text(code)
            (repo / "tests" / "__init__.py").write_text("")
            test_path = f"tests/test_{module}.py"
            visible = [t for t in tests if not t[2]]  # the PASS_TO_PASS tests
            (repo / test_path).write_text(test_file(module, visible, v))
            (repo / "README.md").write_text(f"# {module}\n\nRun the tests: `python -m unittest`.\n")
            ids = [f"tests.test_{module}.TestIssue.test_{t}" for t, _, _ in tests]
            rows.append({
                "instance_id": instance_id,
                "repo": f"agl-tiny/{name}",
                "snapshot": instance_id,
                "problem_statement": f"Bug in `{module}.py`: " + issue.format(**v),
                "patch": file_diff(f"{module}.py", code.encode(), code.replace(bad, good).encode()),
                "test_patch": file_diff(test_path, test_file(module, visible, v).encode(),
                                        test_file(module, tests, v).encode()),
                "FAIL_TO_PASS": [i for i, (_, _, f) in zip(ids, tests) if f],
                "PASS_TO_PASS": [i for i, (_, _, f) in zip(ids, tests) if not f],
                "environment": {},
            })
    for i, row in enumerate(rows):
        row["split"] = "val" if i >= len(rows) - N_VAL else "train"
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=tasks.default_root())
    ap.add_argument("--out", type=Path, default=HERE / "tasks.jsonl")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    args.root.mkdir(parents=True, exist_ok=True)
    rows = make_tasks(args.root)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} repos under {args.root} and {args.out}")
    if args.check:
        sys.exit(1 if tasks.check(args.out, args.root) else 0)


if __name__ == "__main__":
    main()
