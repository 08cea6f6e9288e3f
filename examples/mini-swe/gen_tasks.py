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
                                   (hidden from the agent: the call the
                                   issue text shows and HIDDEN inputs it
                                   does not), `patch` is the gold fix,
                                   `environment` an empty venv

Run: python3 examples/mini-swe/gen_tasks.py [--root DIR] [--out FILE] [--check]
(--root default: $MSWE_TASKS_ROOT or ~/.cache/agl/mini-swe/repos; --check
proves every row through the grader, as `tasks.py --check`: FAIL_TO_PASS
fail at base + test_patch and pass with the gold patch, PASS_TO_PASS pass
both.)
"""

import argparse
import json
import math
import random
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import tasks  # noqa: E402
from changes import file_diff  # noqa: E402

SEED, VARIANTS, N_VAL, HIDDEN = 4242, 3, 6, 3

# name, function source, the buggy line -> fixed line, issue text, and
# tests: (test name, expression that must be True, fails on the bug?).
# `{a}`, `{b}`, `{c}` are small integers drawn per variant. The issue text
# shows one call (the first FAIL_TO_PASS test's); HIDDEN more FAIL_TO_PASS
# tests per task (`test_<name>_1`, ...) check inputs it does not show,
# drawn by the template's hidden_* function below, so a "fix" that only
# special-cases the shown call still fails.
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


# One unseen input per call: an expression that holds with the fix. Drawn
# again (make_tasks) while it repeats an earlier one or holds on the bug.
def hidden_arith(r):
    x, y = r.randint(-99, 99), r.randint(1, 99)
    return f"add({x}, {y}) == {x + y}"


def hidden_bounds(r):
    lo = r.randint(-50, 10)
    hi = lo + r.randint(5, 60)
    x = r.randint(lo + 1, hi - 1)
    return f"clamp({x}, {lo}, {hi}) == {x}"


def hidden_parity(r):
    n = r.randint(-999, 999)
    return f"is_even({n}) is {n % 2 == 0}"


def hidden_fact(r):
    n = r.randint(2, 12)
    return f"factorial({n}) == {math.factorial(n)}"


def hidden_words(r):
    words = [f"{r.choice('abcdefgh')}{r.randint(0, 99)}" for _ in range(r.randint(2, 5))]
    return f"reverse_words({' '.join(words)!r}) == {' '.join(reversed(words))!r}"


def hidden_vowels(r):
    s = "".join(r.choice("AEIOUaeiouxyzBCD") for _ in range(r.randint(4, 9)))
    return f"count_vowels({s!r}) == {sum(ch in 'aeiouAEIOU' for ch in s)}"


def hidden_stats(r):
    n = r.randint(2, 5)
    xs = [r.randint(1, 60) for _ in range(n)]
    xs[-1] += -sum(xs) % n  # a whole mean: no float rounding to argue about
    return f"mean({xs}) == {sum(xs) // n}"


def hidden_temp(r):
    c = 5 * r.randint(-20, 40)
    return f"abs(c_to_f({c}) - {c * 9 // 5 + 32}) < 1e-9"


def hidden_text(r):
    half = "".join(r.choice("abcdefgh") for _ in range(r.randint(2, 4)))
    s = half + r.choice(["", "x"]) + half[::-1]
    s = "".join(ch.upper() if r.random() < 0.5 else ch for ch in s)
    return f"is_palindrome({s!r}) is True"


def hidden_lists(r):
    xs = [r.randint(0, 99) for _ in range(r.randint(3, 7))]
    n = r.randint(2, len(xs))
    return f"last({xs}, {n}) == {xs[-n:]}"


def hidden_money(r):
    prices = [r.randint(0, 99) + r.choice([0.25, 0.5, 0.75]) for _ in range(r.randint(1, 3))]
    return f"total_cents({prices}) == {sum(round(p * 100) for p in prices)}"


def hidden_grid(r):
    x, y = r.randint(-20, 20), r.randint(-20, 20)
    return f"({x}, {y - 1}) in neighbours({x}, {y})"


def holds(code, expr):
    """Whether `expr` is True with the module source `code` loaded."""
    ns = {}
    try:
        exec(code, ns)
        return eval(expr, ns) is True
    except Exception:
        return False


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


def test_file(module, tests):
    lines = [
        "import unittest\n",
        f"from {module} import *  # noqa: F403\n\n",
        "\nclass TestIssue(unittest.TestCase):\n",
    ]
    for name, expr, _ in tests:
        lines.append(f"    def test_{name}(self):\n        self.assertTrue({expr})\n\n")
    lines.append("\nif __name__ == '__main__':\n    unittest.main()\n")
    return "".join(lines)


def make_tasks(root):
    """Writes the snapshots under `root`; returns the rows."""
    rng = random.Random(SEED)
    # Every task's shown values first (the issue texts), then the hidden
    # inputs, all from the one seeded RNG.
    shown = [values(rng) for _ in range(VARIANTS * len(TEMPLATES))]
    rows = []
    for variant in range(VARIANTS):
        for name, source, (bad, good), issue, tests in TEMPLATES:
            v = shown[len(rows)]
            instance_id = f"tiny__{name}-{variant}"
            module = f"{name}{variant}"
            repo = root / instance_id
            if repo.exists():
                shutil.rmtree(repo)
            (repo / "tests").mkdir(parents=True)
            code = f'"""The {name} helpers."""\n\n\n' + source
            assert code.count(bad) == 1, f"{instance_id}: the fix is not unique"
            fixed = code.replace(bad, good)
            tests = [(t, expr.format(**v), f2p) for t, expr, f2p in tests]
            seen = {expr for _, expr, _ in tests}
            for k in range(1, HIDDEN + 1):
                expr = globals()[f"hidden_{name}"](rng)
                while expr in seen or holds(code, expr):
                    expr = globals()[f"hidden_{name}"](rng)
                seen.add(expr)
                tests.insert(k, (f"{tests[0][0]}_{k}", expr, True))
            for t, expr, f2p in tests:
                assert holds(fixed, expr) and holds(code, expr) != f2p, f"{instance_id}: test_{t} {expr}"
            (repo / f"{module}.py").write_text(code)
            (repo / "tests" / "__init__.py").write_text("")
            test_path = f"tests/test_{module}.py"
            visible = [t for t in tests if not t[2]]  # the PASS_TO_PASS tests
            (repo / test_path).write_text(test_file(module, visible))
            (repo / "README.md").write_text(f"# {module}\n\nRun the tests: `python -m unittest`.\n")
            ids = [f"tests.test_{module}.TestIssue.test_{t}" for t, _, _ in tests]
            rows.append({
                "instance_id": instance_id,
                "repo": f"agl-tiny/{name}",
                "snapshot": instance_id,
                "problem_statement": f"Bug in `{module}.py`: " + issue.format(**v),
                "patch": file_diff(f"{module}.py", code.encode(), fixed.encode()),
                "test_patch": file_diff(test_path, test_file(module, visible).encode(),
                                        test_file(module, tests).encode()),
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
