"""Built-in reward `exact-match`, in Python (the Rust `plugins/exact-match`,
same config and results): 1.0 when the final answer (the last call's
assistant text) equals the rollout input's answer, else 0.0.

Config (`[plugin.exact-match-py]`): `pattern` (regex; group 1, or the whole
match, of its LAST match is the answer; no match scores 0.0),
`answer_field` (default "answer"), `case_sensitive` (default false). Both
sides are trimmed; answers that both parse as numbers also match when
numerically equal. A missing answer field or a bad pattern is an error.
"""

import re

from agl_plugin import config, final_text, input_value, reward

DEFAULTS = {"pattern": None, "answer_field": "answer", "case_sensitive": False}


def extract(pattern, text):
    if pattern is None:
        return text.strip()
    found = list(pattern.finditer(text))
    if not found:
        return None
    last = found[-1]
    group = last.group(1) if last.re.groups and last.group(1) is not None else last.group(0)
    return group.strip()


def expected_answer(row, field):
    value = row.get(field) if isinstance(row, dict) else None
    if value is None:
        raise ValueError(f"exact-match: the input has no `{field}` field")
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"exact-match: input field `{field}` is not a string or number: {value!r}")
    return value if isinstance(value, str) else _number_text(value)


def _number_text(value):
    # serde_json prints 87 as "87" and 87.5 as "87.5", as Python does.
    return str(value)


def _number(text):
    # Rust's f64 parse takes no digit separators; Python's float would.
    if "_" in text:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def matches(answer, expected, case_sensitive):
    answer, expected = answer.strip(), expected.strip()
    same = answer == expected if case_sensitive else answer.lower() == expected.lower()
    a, b = _number(answer), _number(expected)
    return same or (a is not None and b is not None and a == b)


@reward
def score(rollout):
    cfg = config(DEFAULTS)
    try:
        pattern = None if cfg["pattern"] is None else re.compile(cfg["pattern"])
    except re.error as e:
        raise ValueError(f"exact-match: invalid `pattern` {cfg['pattern']!r}: {e}") from None
    expected = expected_answer(input_value(rollout), cfg["answer_field"])
    text = final_text(rollout)
    answer = extract(pattern, text) if text is not None else None
    return 1.0 if answer is not None and matches(answer, expected, cfg["case_sensitive"]) else 0.0
