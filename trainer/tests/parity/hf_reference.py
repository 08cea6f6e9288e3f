"""Reference logits from Hugging Face transformers for the Rust parity test.

Usage: python hf_reference.py OUT_DIR

For each case, builds a tiny random model from a config with a fixed seed,
saves it to OUT_DIR/<case>/ with save_pretrained(safe_serialization=True), and
writes OUT_DIR/<case>.reference.safetensors with the input `tokens`, the
`attention_mask` (second row right padded) and the model's f32 `logits`.
"""

import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

SHAPE = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
)

CASES = {
    # GQA (4 query heads over 2 kv heads) with tied embeddings.
    "llama_gqa_tied": (LlamaConfig, LlamaForCausalLM, dict(tie_word_embeddings=True)),
    # Llama 3.1 RoPE scaling; a small original context so all bands occur.
    "llama3_rope": (
        LlamaConfig,
        LlamaForCausalLM,
        dict(
            tie_word_embeddings=False,
            rope_scaling=dict(
                rope_type="llama3",
                rope_theta=500000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=16,
            ),
        ),
    ),
    # Linear RoPE scaling (positions divided by the factor).
    "llama_linear_rope": (
        LlamaConfig,
        LlamaForCausalLM,
        dict(tie_word_embeddings=True, rope_scaling=dict(rope_type="linear", rope_theta=10000.0, factor=2.5)),
    ),
    # q/k/v biases.
    "qwen2_bias": (Qwen2Config, Qwen2ForCausalLM, dict(tie_word_embeddings=False, rope_theta=1e6)),
    # q/k RMSNorm and a head_dim that is not hidden/heads.
    "qwen3_qk_norm": (Qwen3Config, Qwen3ForCausalLM, dict(tie_word_embeddings=True, head_dim=32)),
    # Sliding window shorter than the sequence.
    "mistral_window": (MistralConfig, MistralForCausalLM, dict(tie_word_embeddings=False, sliding_window=4)),
}


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Large random values everywhere (norms around 1) so every parameter,
    bias and norm included, moves the logits."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1.0 + 0.2 * noise if "norm" in name else 0.1 * noise)


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(1234)
    tokens = torch.randint(0, SHAPE["vocab_size"], (2, 12), generator=gen)
    mask = torch.ones_like(tokens)
    mask[1, 8:] = 0
    tokens[1, 8:] = 0
    for seed, (name, (config_cls, model_cls, extra)) in enumerate(CASES.items()):
        torch.manual_seed(seed)
        config = config_cls(**SHAPE, **extra)
        model = model_cls(config).to(torch.float32).eval()
        randomize(model, seed)
        with torch.no_grad():
            logits = model(input_ids=tokens, attention_mask=mask).logits.float()
        model.save_pretrained(out / name, safe_serialization=True)
        save_file(
            {"tokens": tokens.contiguous(), "attention_mask": mask.contiguous(), "logits": logits.contiguous()},
            str(out / f"{name}.reference.safetensors"),
        )


if __name__ == "__main__":
    main()
