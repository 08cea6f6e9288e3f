"""The agl training step in PyTorch eager, for trainer/rl/benches/step.rs.

Usage: python step_torch.py DIR THREADS

DIR holds the model (config.json + model.safetensors, saved by agl) and
batch.json (tokens, weights and advantages on the [B, T-1] logprob grid,
engine logprobs, temperature, clip and TIS settings). Runs the same
forward + backward as agl (on-policy: old = detached new logprobs; PPO clip,
TIS weight, fixed token weights).

Steps on request, so the bench can put each of agl's steps beside one of
these on a shared machine: after a warm-up step of each kind it prints
`{"ready": true}`, then for each line `step all` or `step weighed` on stdin
runs one step and prints one JSON line, its milliseconds and the loss; it
ends at the end of stdin. `all` runs the LM head and log-softmax on every
position, as a plain eager step does; `weighed` only on the positions the
loss weighs (as agl does, and as TRL's `logits_to_keep` would): the same
loss and gradient.
"""

import json
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM


def main():
    folder, threads = Path(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.train()
    b = json.loads((folder / "batch.json").read_text())
    tokens = torch.tensor(b["tokens"])
    shape = (tokens.shape[0], tokens.shape[1] - 1)
    grid = {k: torch.tensor(b[k], dtype=torch.float32).view(shape) for k in ("weight", "advantage", "engine")}
    lo, hi, tis_max, temp = 1 - b["eps_low"], 1 + b["eps_high"], b["tis_threshold"], b["temperature"]

    weighed = grid["weight"] > 0
    targets = tokens[:, 1:]

    def step(kind):
        model.zero_grad(set_to_none=False)
        if kind == "all":
            logits = model(input_ids=tokens).logits[:, :-1]
            new = (logits.float() / temp).log_softmax(-1).gather(2, targets[..., None]).squeeze(-1)
            at = lambda g: g  # noqa: E731
        else:
            hidden = model.model(input_ids=tokens).last_hidden_state[:, :-1][weighed]
            logits = model.lm_head(hidden)
            new = (logits.float() / temp).log_softmax(-1).gather(1, targets[weighed][:, None]).squeeze(-1)
            at = lambda g: g[weighed]  # noqa: E731
        old = new.detach()
        ratio = (new - old).exp()
        adv = at(grid["advantage"])
        pg = torch.maximum(-ratio * adv, -ratio.clamp(lo, hi) * adv)
        tis = (old - at(grid["engine"])).exp().clamp(max=tis_max)
        loss = (pg * tis * at(grid["weight"])).sum()
        loss.backward()
        return loss.item()

    step("all")  # warm-up
    step("weighed")
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        kind = line.split()[1:] if line.startswith("step ") else None
        if kind not in (["all"], ["weighed"]):
            raise SystemExit(f"step_torch.py: unknown request {line!r}")
        start = time.perf_counter()
        loss = step(kind[0])
        ms = (time.perf_counter() - start) * 1000
        print(json.dumps({"ms": ms, "loss": loss}), flush=True)


if __name__ == "__main__":
    main()
