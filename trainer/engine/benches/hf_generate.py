"""transformers greedy `generate` throughput for trainer/engine/benches/engine.rs.

    hf_generate.py MODEL_DIR NEW_TOKENS THREADS [--device=cuda] [--dtype=f32|bf16]
                   [--batches=1,8,32] [--prompt=ID,ID,...]
Without options (CPU, f32, the folder's tokenizer and chat template) prints
{"prompt_ids", "single_tok_s", "batch8_tok_s", "peak_rss_mb"}. With --batches
it prints {"prompt_ids", "tok_s": {batch: tok/s}, "peak_rss_mb", "peak_gpu_mb"}.
A folder with only a config.json gets a randomly initialised model; then
--prompt is required.
"""

import json
import os
import resource
import sys
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def main():
    pos = [a for a in sys.argv[1:] if not a.startswith("--")]
    opts = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--"))
    folder, new, threads = pos[0], int(pos[1]), int(pos[2])
    device = opts.get("device", "cpu")
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[opts.get("dtype", "f32")]
    torch.set_num_threads(threads)
    if os.path.exists(os.path.join(folder, "model.safetensors")):
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    else:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=dtype)
    model = model.to(device).eval()
    if "prompt" in opts:
        ids = [int(x) for x in opts["prompt"].split(",")]
    else:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(folder)
        ids = tok.apply_chat_template(
            [{"role": "user", "content": "Tell me about the history of Rome."}],
            add_generation_prompt=True, return_dict=False,
        )
        if not isinstance(ids, list):
            ids = ids["input_ids"]

    def sync():
        if device != "cpu":
            torch.cuda.synchronize()

    def run(batch):
        x = torch.tensor([ids] * batch, device=device)
        kw = dict(do_sample=False, attention_mask=torch.ones_like(x), pad_token_id=0)
        with torch.no_grad():
            model.generate(x, max_new_tokens=2, **kw)
            sync()
            t = time.perf_counter()
            model.generate(x, max_new_tokens=new, min_new_tokens=new, **kw)
            sync()
            return batch * new / (time.perf_counter() - t)

    rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if "batches" not in opts:
        single, batch8 = run(1), run(8)
        print(json.dumps({"prompt_ids": list(ids), "single_tok_s": single,
                          "batch8_tok_s": batch8, "peak_rss_mb": rss()}))
        return
    tok_s = {b: run(int(b)) for b in opts["batches"].split(",")}
    gpu = torch.cuda.max_memory_allocated() / 2**20 if device != "cpu" else None
    print(json.dumps({"prompt_ids": list(ids), "tok_s": tok_s, "peak_rss_mb": rss(),
                      "peak_gpu_mb": gpu}))


if __name__ == "__main__":
    main()
