#!/usr/bin/env python3
"""Writes data.jsonl: multiplications of two 2-digit numbers ("What is
47 * 38?") with their products, distinct pairs drawn with a fixed seed (so the
file is reproducible), never the prompt's worked example (12 * 34). Rows
carry `split`: the first 40 are the held-out `val` split, the other 160
`train`. Run: python3 examples/calc/gen_data.py"""

import json
import random
from pathlib import Path

N_TRAIN, N_VAL, SEED = 160, 40, 1234
EXAMPLE = (12, 34)  # agent.py's worked example, never asked


def main():
    rng = random.Random(SEED)
    pairs = []
    while len(pairs) < N_VAL + N_TRAIN:
        pair = (rng.randint(11, 99), rng.randint(11, 99))
        if pair not in pairs and pair != EXAMPLE:
            pairs.append(pair)
    out = Path(__file__).with_name("data.jsonl")
    with out.open("w") as f:
        for i, (a, b) in enumerate(pairs):
            row = {
                "id": f"calc-{i:03d}",
                "split": "val" if i < N_VAL else "train",
                "question": f"What is {a} * {b}?",
                "answer": a * b,
            }
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
