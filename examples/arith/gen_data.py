#!/usr/bin/env python3
"""Writes data.jsonl: single-digit additions "What is a + b?" with their
answers, all 81 pairs of a, b in 1..9 shuffled with a fixed seed (so the file
is reproducible). Rows carry `split`: the last 20 are the held-out `val`
split. Run: python3 examples/arith/gen_data.py"""

import json
import random
from pathlib import Path

N_VAL, SEED = 20, 1234


def main():
    pairs = [(a, b) for a in range(1, 10) for b in range(1, 10)]
    random.Random(SEED).shuffle(pairs)
    out = Path(__file__).with_name("data.jsonl")
    with out.open("w") as f:
        for i, (a, b) in enumerate(pairs):
            split = "val" if i >= len(pairs) - N_VAL else "train"
            row = {"id": f"arith-{i:03d}", "split": split, "question": f"What is {a} + {b}?"}
            row["answer"] = a + b
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
