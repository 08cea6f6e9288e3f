#!/usr/bin/env python3
"""GRPO simulator: the design record for the arith example (not run by the main job).

It replays what `agl run` does on examples/arith with transformers + torch on
CPU, so the task, prompt, reward and hyper-parameters can be chosen before
agl's own trainer runs them: the same model folder, the chat template applied
to the same system + user messages an OpenAI chat request carries, T=1 pure
sampling (no top-k/top-p) for training rollouts, greedy for validation, and
GRPO with one optimizer step per batch (ratio = 1, so the PPO clipped
surrogate reduces to -(1/N) sum_i mean_t A_i * logp_t), AdamW, grad-norm
clip 1.0. Prompt and reward come from agent.py, so the two cannot drift.

Run (2 threads, nice'd, a few minutes):
  nice -n 10 $AGL_VENV/bin/python examples/arith/sim_grpo.py --steps 12
"""

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).parent))
from agent import MAX_TOKENS, SYSTEM_PROMPT, reward  # noqa: E402

MODEL = "/root/.cache/agl/models/smollm2-135m-instruct"


def load_rows(split):
    path = Path(__file__).with_name("data.jsonl")
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["split"] == split]


def prompt_ids(tok, question, system):
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": question},
    ]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]


@torch.no_grad()
def generate(model, tok, prompts, greedy, max_tokens):
    """Left-padded batch generation; returns the response ids (up to and
    including <|im_end|>) of each prompt."""
    width = max(map(len, prompts))
    pad = tok.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=max_tokens,
        do_sample=not greedy,
        temperature=1.0,
        top_p=1.0,  # with the folder's generation_config (no top_k): pure sampling
        pad_token_id=pad,
        eos_token_id=tok.eos_token_id,
    )
    responses = []
    for row in out[:, width:].tolist():
        if tok.eos_token_id in row:
            row = row[: row.index(tok.eos_token_id) + 1]
        responses.append(row)
    return responses


def finished(response, tok):
    """finish_reason "stop": the reply ended with <|im_end|>, not at max_tokens."""
    return bool(response) and response[-1] == tok.eos_token_id


def evaluate(model, tok, rows, system, max_tokens, show=0):
    prompts = [prompt_ids(tok, r["question"], system) for r in rows]
    resp = generate(model, tok, prompts, greedy=True, max_tokens=max_tokens)
    texts = [tok.decode(r, skip_special_tokens=True) for r in resp]
    for r, t in list(zip(rows, texts))[:show]:
        print(f"    {r['question']!r} -> {t!r}")
    rewards = [reward(t, r["answer"], finished(x, tok)) for r, t, x in zip(rows, texts, resp)]
    return sum(rewards) / len(rewards), sum(map(len, resp)) / len(resp)


def grpo_loss(model, prompts, responses, advantages):
    """-(1/N) sum_i A_i * mean_t logp_t, one forward over the padded batch."""
    seqs = [p + r for p, r in zip(prompts, responses)]
    width = max(map(len, seqs))
    ids = torch.tensor([s + [0] * (width - len(s)) for s in seqs])
    attn = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
    loss = 0.0
    for i, (p, r) in enumerate(zip(prompts, responses)):
        # logits at position k predict token k+1: response tokens sit at len(p)..len(p)+len(r)-1
        token_logp = logp[i, len(p) - 1 : len(p) - 1 + len(r)]
        loss = loss - advantages[i] * token_logp.mean()
    return loss / len(prompts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--n", type=int, default=8, help="rollouts per group")
    ap.add_argument("--groups", type=int, default=4, help="groups per step")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--warmup", type=int, default=0, help="linear warmup steps")
    ap.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    ap.add_argument("--val", type=int, default=20)
    ap.add_argument("--val-every", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--baseline-only", action="store_true")
    ap.add_argument("--system", default=SYSTEM_PROMPT, help="try another system prompt")
    args = ap.parse_args()

    torch.set_num_threads(2)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    tok = AutoTokenizer.from_pretrained(MODEL)
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    train, val = load_rows("train"), load_rows("val")[: args.val]

    t0 = time.time()
    v, vlen = evaluate(model, tok, val, args.system, args.max_tokens, show=6)
    print(f"step 0 val {v:.3f} (mean len {vlen:.1f} tok, {time.time() - t0:.0f}s)", flush=True)
    if args.baseline_only:
        return

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / args.warmup) if args.warmup else 1.0
    )
    for step in range(1, args.steps + 1):
        t0 = time.time()
        batch = rng.sample(train, args.groups)
        prompts = [prompt_ids(tok, row["question"], args.system) for row in batch]
        prompts = [p for p in prompts for _ in range(args.n)]  # groups are consecutive
        responses = generate(model, tok, prompts, greedy=False, max_tokens=args.max_tokens)
        rewards = [
            reward(tok.decode(r, skip_special_tokens=True), row["answer"], finished(r, tok))
            for r, row in zip(responses, [row for row in batch for _ in range(args.n)])
        ]
        advantages = []
        for g in range(args.groups):
            rs = rewards[g * args.n : (g + 1) * args.n]
            mean = sum(rs) / len(rs)
            # sample std (n - 1), as agl's trainer (and TRL/verl) compute it
            std = (sum((x - mean) ** 2 for x in rs) / (len(rs) - 1)) ** 0.5
            advantages += [(x - mean) / (std + 1e-6) for x in rs]
        t_gen = time.time() - t0
        opt.zero_grad()
        loss = grpo_loss(model, prompts, responses, advantages)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        ntok = sum(map(len, responses))
        line = (
            f"step {step} train_r {sum(rewards) / len(rewards):.3f} tok {ntok} "
            f"gnorm {gnorm:.2f} gen {t_gen:.0f}s train {time.time() - t0 - t_gen:.0f}s"
        )
        if step % args.val_every == 0 or step == args.steps:
            show = 3 if step == args.steps else 0
            v, vlen = evaluate(model, tok, val, args.system, args.max_tokens, show=show)
            line += f" | val {v:.3f} (len {vlen:.1f})"
        print(line, flush=True)


if __name__ == "__main__":
    main()
