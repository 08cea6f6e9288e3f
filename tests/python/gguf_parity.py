"""Reference side of host/agl/tests/e2e/model_import.rs: what gguf-py and transformers
make of a GGUF file, for the Rust importer to be compared against.

    gguf_parity.py synthetic OUT.gguf             a GGUF with one tensor per encoding
    gguf_parity.py dequant GGUF TENSORS.safetensors
        compares each tensor (GGUF names) with gguf.quants.dequantize
    gguf_parity.py reference GGUF CORPUS CONVERSATIONS TOOLS_TEMPLATE
        transformers' tokenizer from the GGUF: ids and decodes per corpus
        line, and apply_chat_template per conversation with the GGUF's
        template and with TOOLS_TEMPLATE (one that uses tools and tojson)
    gguf_parity.py weights GGUF DIR
        transformers' model and config from the GGUF against DIR

Every command prints one JSON object on stdout.
"""

import json
import os
import sys

import numpy as np


def synthetic(out):
    import gguf
    from gguf import GGMLQuantizationType as Q

    rng = np.random.default_rng(7)
    writer = gguf.GGUFWriter(out, "llama")
    # A non-default alignment, so the reader must honour general.alignment.
    writer.data_alignment = 64
    writer.add_custom_alignment(64)
    rows, cols = 6, 512
    values = rng.normal(0, 0.05, size=(rows, cols)).astype(np.float32)
    writer.add_tensor("f32", values)
    writer.add_tensor("f16", values.astype(np.float16))
    writer.add_tensor("f32_3d", rng.normal(size=(2, 3, 32)).astype(np.float32))
    for qtype in (Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0):
        writer.add_tensor(qtype.name.lower(), gguf.quants.quantize(values, qtype), raw_dtype=qtype)
    # gguf-py cannot quantise K-quants; random blocks with sane f16 scales
    # exercise every bit of the decoder just as well.
    for qtype, scale_offsets in ((Q.Q4_K, (0, 2)), (Q.Q5_K, (0, 2)), (Q.Q6_K, (208,))):
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, size=(rows, cols // block, type_size), dtype=np.uint8)
        for offset in scale_offsets:
            scales = rng.uniform(0.001, 0.1, size=(rows, cols // block)).astype(np.float16)
            raw[:, :, offset : offset + 2] = scales.view(np.uint8).reshape(rows, cols // block, 2)
        writer.add_tensor(qtype.name.lower(), raw.reshape(rows, -1), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"written": out}


def dequant(gguf_path, tensors_path):
    import gguf
    from safetensors.numpy import load_file

    ours = load_file(tensors_path)
    report = []
    for t in gguf.GGUFReader(gguf_path).tensors:
        expected = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        expected = expected.reshape([int(d) for d in reversed(t.shape)])
        got = ours.get(t.name)
        entry = {"name": t.name, "type": t.tensor_type.name, "shape": list(expected.shape)}
        if got is None:
            entry["missing"] = True
        elif got.shape != expected.shape:
            entry["our_shape"] = list(got.shape)
        else:
            entry["max_abs_diff"] = float(np.max(np.abs(got - expected))) if got.size else 0.0
            entry["max_abs"] = float(np.max(np.abs(expected))) if got.size else 0.0
        report.append(entry)
    return {"tensors": report, "ours": sorted(ours)}


def load_tokenizer(gguf_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path))


def reference(gguf_path, corpus_path, conversations_path, tools_template_path):
    tok = load_tokenizer(gguf_path)
    with open(corpus_path, encoding="utf-8", newline="") as f:
        lines = f.read().split("\n")
    with open(conversations_path, encoding="utf-8") as f:
        conversations = json.load(f)
    encoded = []
    for line in lines:
        ids = tok(line)["input_ids"]
        encoded.append({
            "text": line,
            "ids": ids,
            "decoded": tok.decode(ids),
            "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
        })
    whole = "\n".join(lines)
    with open(tools_template_path, encoding="utf-8") as f:
        tools_template = f.read()
    rendered = []
    for template in ("gguf", "tools"):
        for case in conversations:
            for add_generation_prompt in (False, True):
                rendered.append({
                    "template": template,
                    "name": case["name"],
                    "add_generation_prompt": add_generation_prompt,
                    "text": tok.apply_chat_template(
                        case["messages"],
                        tools=case.get("tools"),
                        add_generation_prompt=add_generation_prompt,
                        tokenize=False,
                        chat_template=tools_template if template == "tools" else None,
                    ),
                })
    return {
        "lines": encoded,
        "whole": {"ids": tok(whole)["input_ids"]},
        "chat": rendered,
        "vocab_size": len(tok),
    }


def weights(gguf_path, out_dir):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs = {"gguf_file": os.path.basename(gguf_path)}
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf_path), **kwargs)
    theirs = model.state_dict()
    ours = load_file(os.path.join(out_dir, "model.safetensors"))
    tensors = []
    for name, expected in theirs.items():
        entry = {"name": name, "shape": list(expected.shape)}
        got = ours.get(name)
        if got is None:
            entry["missing"] = True
        elif tuple(got.shape) != tuple(expected.shape):
            entry["our_shape"] = list(got.shape)
        else:
            entry["max_abs_diff"] = float((got.float() - expected.float()).abs().max())
        tensors.append(entry)
    # Transformers' model from our folder must load and match too.
    reloaded = AutoModelForCausalLM.from_pretrained(out_dir)
    reload_diff = max(
        float((reloaded.state_dict()[k].float() - v.float()).abs().max()) for k, v in theirs.items()
    )
    ids = torch.tensor([[1, 9690, 198, 2683, 359, 253, 5356, 2]])
    with torch.no_grad():
        logits_diff = float((reloaded(ids).logits - model(ids).logits).abs().max())
    config_from_gguf = AutoConfig.from_pretrained(os.path.dirname(gguf_path), **kwargs).to_dict()
    config_from_dir = AutoConfig.from_pretrained(out_dir).to_dict()
    return {
        "tensors": tensors,
        "extra": sorted(set(ours) - set(theirs)),
        "tied": bool(model.config.tie_word_embeddings),
        "reload_max_abs_diff": reload_diff,
        "logits_max_abs_diff": logits_diff,
        "config_from_gguf": config_from_gguf,
        "config_from_dir": config_from_dir,
    }


def logits(gguf_path, ids_path, out_path):
    """transformers' logits for each prompt in IDS_PATH (JSON list of id
    lists), loaded straight from the GGUF, saved as safetensors `p0`, `p1`..."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path), dtype=torch.float32
    )
    prompts = json.load(open(ids_path))
    out = {}
    with torch.no_grad():
        for i, ids in enumerate(prompts):
            out[f"p{i}"] = model(torch.tensor([ids])).logits[0].float().contiguous()
    save_file(out, out_path)
    return {"prompts": len(prompts)}


def main():
    command, args = sys.argv[1], sys.argv[2:]
    commands = {"synthetic": synthetic, "dequant": dequant, "reference": reference,
                "weights": weights, "logits": logits}
    result = commands[command](*args)
    json.dump(result, sys.stdout, ensure_ascii=False, default=str)


if __name__ == "__main__":
    main()
