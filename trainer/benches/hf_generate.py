"""transformers greedy `generate` throughput for trainer/benches/engine.rs.

    hf_generate.py MODEL_DIR NEW_TOKENS THREADS
Prints {"prompt_ids", "single_tok_s", "batch8_tok_s", "peak_rss_mb"}.
"""

import json
import resource
import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    folder, new, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "Tell me about the history of Rome."}],
        add_generation_prompt=True, return_dict=False,
    )
    if not isinstance(ids, list):
        ids = ids["input_ids"]

    def run(batch):
        x = torch.tensor([ids] * batch)
        kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False,
                  attention_mask=torch.ones_like(x), pad_token_id=tok.eos_token_id)
        with torch.no_grad():
            model.generate(x, max_new_tokens=2, do_sample=False,
                           attention_mask=torch.ones_like(x), pad_token_id=tok.eos_token_id)
            t = time.perf_counter()
            model.generate(x, **kw)
            return batch * new / (time.perf_counter() - t)

    single, batch8 = run(1), run(8)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"prompt_ids": list(ids), "single_tok_s": single,
                      "batch8_tok_s": batch8, "peak_rss_mb": rss}))


if __name__ == "__main__":
    main()
