"""Reference LoRA numbers from PEFT for the Rust parity test
(trainer/rl/tests/rl/lora_parity.rs).

Usage: python peft_reference.py OUT_DIR
       python peft_reference.py --load BASE ADAPTER TOKENS OUT

Builds a tiny random Llama (fixed seed), saves it to OUT_DIR/base with
save_pretrained, wraps it with a PEFT LoRA adapter on every projection
(r=4, alpha=8, no dropout), sets lora_B to random values (PEFT starts it at
zero, which would make the adapter invisible), saves the adapter to
OUT_DIR/adapter, and writes OUT_DIR/reference.safetensors: the input
`tokens` and `attention_mask`, the f32 `logits`, the `loss_weights` of a
fixed scalar loss `sum(logits * loss_weights)` over real positions, and that
loss's gradient for every adapter tensor under its saved name
(`grad.base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`, ...).
"""

import sys
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def main(out: Path):
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    base = LlamaForCausalLM(config).float().eval()
    base.save_pretrained(out / "base", safe_serialization=True)

    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=TARGETS, bias="none")
    model = get_peft_model(base, lora)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05)
    model.save_pretrained(out / "adapter", safe_serialization=True)

    tokens = torch.randint(0, config.vocab_size, (2, 12))
    mask = torch.ones_like(tokens)
    mask[1, 9:] = 0
    logits = model(input_ids=tokens, attention_mask=mask).logits.float()
    weights = torch.randn(logits.shape) * mask.unsqueeze(-1)
    (logits * weights).sum().backward()

    tensors = {
        "tokens": tokens,
        "attention_mask": mask,
        "logits": logits.detach().contiguous(),
        "loss_weights": weights.contiguous(),
    }
    for name, p in model.named_parameters():
        if p.requires_grad:
            saved = name.replace(".default", "")
            tensors[f"grad.{saved}"] = p.grad.detach().contiguous()
    save_file(tensors, out / "reference.safetensors")


def load(base: Path, adapter: Path, tokens: Path, out: Path):
    """PEFT loads an adapter folder (one agl wrote) onto the base and writes
    its logits for the reference tokens."""
    from peft import PeftModel
    from safetensors.torch import load_file

    ref = load_file(tokens)
    model = PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained(base).float(), adapter).eval()
    with torch.no_grad():
        logits = model(input_ids=ref["tokens"], attention_mask=ref["attention_mask"]).logits.float()
    save_file({"logits": logits.contiguous()}, out)


if __name__ == "__main__":
    if sys.argv[1] == "--load":
        load(*map(Path, sys.argv[2:6]))
    else:
        main(Path(sys.argv[1]))
