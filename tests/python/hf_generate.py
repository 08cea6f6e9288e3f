"""transformers' greedy `generate` for chat prompts (host/agl/tests/e2e/engine_server.rs).

    hf_generate.py MODEL_DIR MAX_NEW_TOKENS PROMPT...
Prints {"texts": [...], "prompt_ids": [[...], ...]}.
"""

import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    folder, max_new, prompts = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    texts, prompt_ids = [], []
    for p in prompts:
        ids = tok.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True, return_dict=False
        )
        if not isinstance(ids, list):
            ids = ids["input_ids"]
        with torch.no_grad():
            out = model.generate(
                torch.tensor([ids]), max_new_tokens=max_new, do_sample=False
            )
        texts.append(tok.decode(out[0, len(ids):], skip_special_tokens=True))
        prompt_ids.append(list(ids))
    print(json.dumps({"texts": texts, "prompt_ids": prompt_ids}))


if __name__ == "__main__":
    main()
