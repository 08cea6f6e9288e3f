"""torch.optim.AdamW on given tensors, for the Rust AdamW parity test.

Usage: python adamw_reference.py IN.safetensors OUT.safetensors

IN holds `param.<name>` (initial values), `grad.<k>.<name>` (the gradient of
step k), `lr` (f64, one per step) and `hyper` (f64: beta1, beta2,
weight_decay, eps). OUT gets `param.<k>.<name>` after every step and the
final `exp_avg.<name>` / `exp_avg_sq.<name>`.
"""

import sys

import torch
from safetensors.torch import load_file, save_file


def main(src: str, dst: str) -> None:
    t = load_file(src)
    names = sorted(k[len("param.") :] for k in t if k.startswith("param."))
    params = {n: t[f"param.{n}"].clone().requires_grad_(True) for n in names}
    lrs = t["lr"].tolist()
    beta1, beta2, weight_decay, eps = t["hyper"].tolist()
    # CPU parameters take the single-tensor path; say so explicitly.
    opt = torch.optim.AdamW(
        [params[n] for n in names],
        lr=lrs[0],
        betas=(beta1, beta2),
        weight_decay=weight_decay,
        eps=eps,
        foreach=False,
        amsgrad=False,
    )
    out = {}
    for k, lr in enumerate(lrs):
        for group in opt.param_groups:
            group["lr"] = lr
        for n in names:
            params[n].grad = t[f"grad.{k}.{n}"].clone()
        opt.step()
        for n in names:
            out[f"param.{k}.{n}"] = params[n].detach().clone()
    for n in names:
        state = opt.state[params[n]]
        out[f"exp_avg.{n}"] = state["exp_avg"]
        out[f"exp_avg_sq.{n}"] = state["exp_avg_sq"]
    save_file(out, dst)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
