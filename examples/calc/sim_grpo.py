#!/usr/bin/env python3
"""GRPO simulator: the design record for the calc example (not run by the main job).

It replays what `agl run` does on examples/calc with transformers + torch on
CPU, so the prompt, tool protocol and knobs could be chosen before agl's own
trainer ran them: the same model folder and chat template, the agent's own
prompt, tool parser, calculator and reward (imported from agent.py, so the
two cannot drift), T=1 pure sampling for training rollouts and greedy
validation, each rollout's turns as one sequence (what the gateway's
token-exact continuation makes of them) with the RESULT turns masked, GRPO
advantages (sample std, eps 1e-6) and one AdamW step per batch (ratio 1:
loss -(1/N) sum_i A_i * mean_t logp_t over each rollout's sampled tokens),
grad-norm clip 1.0, weight decay 0.

Run (2 threads, a few minutes):
  nice -n 10 $AGL_VENV/bin/python examples/calc/sim_grpo.py --steps 8
"""

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).parent))
from agent import (  # noqa: E402
    MAX_CALLS,
    MAX_TOKENS,
    calculator,
    prompt,
    result_turn,
    reward,
    tool_call,
)

MODEL = os.path.expanduser("~/.cache/agl/models/smollm2-135m-instruct")


def load_rows(split):
    path = Path(__file__).with_name("data.jsonl")
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["split"] == split]


@torch.no_grad()
def generate(model, tok, prompts, greedy):
    """Left-padded batch generation; the response ids up to <|im_end|>."""
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=MAX_TOKENS,
        do_sample=not greedy,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        pad_token_id=pad,
        eos_token_id=eos,
    )
    rows = []
    for row in out[:, width:].tolist():
        rows.append(row[: row.index(eos) + 1] if eos in row else row)
    return rows


def rollouts(model, tok, rows, greedy, tool=True):
    """Each row's rollout as one sequence: prompt, then each reply (trained)
    and each RESULT turn (masked), as the gateway continues them."""
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    state = []
    for row in rows:
        text = tok.apply_chat_template(
            prompt(row["question"], tool), tokenize=False, add_generation_prompt=True
        )
        ids = tok(text, add_special_tokens=False)["input_ids"]
        state.append(dict(row=row, ids=ids, plen=len(ids), mask=[], calls=0, tools=0, done=False))
    for call in range(1, MAX_CALLS + 1):
        live = [s for s in state if not s["done"]]
        if not live:
            break
        for s, r in zip(live, generate(model, tok, [s["ids"] for s in live], greedy)):
            s["calls"] += 1
            s["ids"] += r
            s["mask"] += [1] * len(r)
            finished = bool(r) and r[-1] == eos
            text = tok.decode([t for t in r if t != eos])
            expression = tool_call(text) if tool and finished else None
            if expression is None or call == MAX_CALLS:
                s.update(done=True, reward=reward(text, s["row"]["answer"], finished))
                continue
            s["tools"] += 1
            result = result_turn(expression, calculator(expression))
            turn = f"\n<|im_start|>user\n{result}<|im_end|>\n<|im_start|>assistant\n"
            obs = tok(turn, add_special_tokens=False)["input_ids"]
            s["ids"] += obs
            s["mask"] += [0] * len(obs)
    return state


def summary(state):
    n = len(state)
    return (
        sum(s["reward"] for s in state) / n,
        sum(s["tools"] > 0 for s in state) / n,
        sum(s["calls"] for s in state) / n,
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--n", type=int, default=8, help="group size")
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--val-every", type=int, default=4)
    ap.add_argument("--no-tool", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(MODEL)
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
    train, val = load_rows("train"), load_rows("val")
    random.Random(a.seed).shuffle(train)

    def validate(step):
        t = time.time()
        r, tool, calls = summary(rollouts(model, tok, val, True, not a.no_tool))
        print(f"val step {step}: reward {r:.3f} tool {tool:.2f} calls {calls:.2f} ({time.time() - t:.0f}s)")

    validate(0)
    for step in range(1, a.steps + 1):
        t = time.time()
        rows = [train[(step - 1) * a.groups + g] for g in range(a.groups) for _ in range(a.n)]
        state = rollouts(model, tok, rows, False, not a.no_tool)
        advantages = []
        for g in range(a.groups):
            rs = [s["reward"] for s in state[g * a.n : (g + 1) * a.n]]
            mean = sum(rs) / a.n
            std = (sum((x - mean) ** 2 for x in rs) / (a.n - 1)) ** 0.5
            advantages += [(x - mean) / (std + 1e-6) for x in rs]
        model.train()
        opt.zero_grad()
        for s, adv in zip(state, advantages):
            if adv == 0:
                continue
            ids = torch.tensor([s["ids"]])
            logp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
            logp = logp.gather(1, ids[0, 1:, None])[:, 0][s["plen"] - 1 :]
            mask = torch.tensor(s["mask"], dtype=torch.float32)
            (-(adv * (logp * mask).sum() / mask.sum()) / len(state)).backward()
        grad = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        model.eval()
        r, tool, calls = summary(state)
        print(
            f"step {step}: reward {r:.3f} tool {tool:.2f} calls {calls:.2f} "
            f"grad {float(grad):.2f} ({time.time() - t:.0f}s)",
            flush=True,
        )
        if step % a.val_every == 0:
            validate(step)


if __name__ == "__main__":
    main()
