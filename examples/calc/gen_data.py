#!/usr/bin/env python3
"""Writes data.jsonl: simple arithmetic questions with their answers
(fixed seed, so the file is reproducible). Rows carry `split`: the last
20 are the held-out `val` split. Run: python3 examples/calc/gen_data.py"""

import json
import random
from pathlib import Path

N, N_VAL, SEED = 100, 20, 1234


def question(rng):
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 9)
    form = rng.choice(["a+b", "a-b", "a*c", "(a+b)*c", "a*c-b"])
    expr = form.replace("a", str(a)).replace("b", str(b)).replace("c", str(c))
    return {"question": f"What is {expr}?", "answer": eval(expr)}  # our own literals only


def main():
    rng = random.Random(SEED)
    out = Path(__file__).with_name("data.jsonl")
    with out.open("w") as f:
        for i in range(N):
            row = {"id": f"calc-{i:03d}", "split": "val" if i >= N - N_VAL else "train"}
            row.update(question(rng))
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
