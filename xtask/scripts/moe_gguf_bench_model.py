"""A Mixture-of-Experts GGUF of realistic proportions, scaled to one small machine, for
`cargo xtask bench llama-server` (and `bench inference --with-llama-cpp`): the file a Linux user
downloads from the GGUF publishers, made the way they make it.

Qwen3-30B-A3B's proportions (every layer MoE, 64 experts of which 8 run per token, 4x
grouped-query attention, per-head Q/K norms) at 12 layers of width 1024 with experts half as
wide (512: a multiple of 256, so every expert takes a K-quant as the release's 768 does): about
1.35 B parameters, about 0.26 B active per token. Seeded random weights written as a Hugging
Face folder (float16, with SmolLM2's tokenizer) by `moe_gguf_fixtures.py`'s own writer, then
llama.cpp's `convert_hf_to_gguf.py --outtype f16` and `llama-quantize ... Q4_K_M`, as the
publishers do; the folder and the f16 file are deleted (about 2.7 GB each, for minutes).

    python moe_gguf_bench_model.py OUT_FILE --tokenizer DIR --llama-cpp SRC --quantize BIN

Runs in the converter's venv (`cargo xtask setup`'s `gguf-convert-venv`), with SRC/gguf-py
on the path.
"""

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import moe_gguf_fixtures as fixtures  # noqa: E402  (the writer of the tiny fixtures)

SHAPE = dict(fixtures.MODELS["qwen3moe"]["config"], **{
    "hidden_size": 1024, "num_hidden_layers": 12, "num_attention_heads": 16,
    "num_key_value_heads": 4, "head_dim": 64, "intermediate_size": 3072,
    "moe_intermediate_size": 512, "num_experts": 64, "num_experts_per_tok": 8,
    "max_position_embeddings": 40960, "torch_dtype": "float16",
})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--llama-cpp", type=Path, required=True)
    ap.add_argument("--quantize", type=Path, required=True)
    args = ap.parse_args()
    work = args.out.with_name(args.out.name + ".work")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    spec = {"config": SHAPE, "added_tokens": []}
    # The tiny fixtures' writer, at this shape; float16 halves the folder (the values are
    # the seeded float32 ones rounded, which the converter keeps as f16).
    original = fixtures.weights
    fixtures.weights = lambda arch, cfg: {
        k: v.astype(np.float16) for k, v in original(arch, cfg).items()
    }
    fixtures.log("qwen3moe bench shape: writing the Hugging Face folder (float16)")
    hf = fixtures.hf_folder(work, "qwen3moe", spec, args.tokenizer)
    f16 = work / "model.F16.gguf"
    fixtures.log("convert_hf_to_gguf.py --outtype f16")
    subprocess.run(
        [sys.executable, str(args.llama_cpp / "convert_hf_to_gguf.py"), str(hf),
         "--outtype", "f16", "--outfile", str(f16)],
        check=True, stdout=subprocess.DEVNULL,
    )
    shutil.rmtree(hf)
    fixtures.log("llama-quantize Q4_K_M")
    partial = work / "model.Q4_K_M.gguf"
    subprocess.run([str(args.quantize), str(f16), str(partial), "Q4_K_M"],
                   check=True, capture_output=True)
    partial.rename(args.out)
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
