#!/usr/bin/env python3
"""Runs llama.cpp's convert_hf_to_gguf.py on a Hugging Face checkpoint (bench tooling, not in CI).

    python bench/gguf_convert.py LLAMA_SRC MODEL_DIR OUT.gguf [--outtype bf16]

LLAMA_SRC is a llama.cpp source tree (e.g. the llama-cpp-python sdist's vendor/llama.cpp); the
Python running this needs what the converter imports (torch, numpy, sentencepiece, transformers
as the converter asks). The converter names a BPE pre-tokenizer by the hash of a test encoding and
refuses tokenizers it does not know; the project's trained models (spool-demo-moe,
spool-wide-moe) have their own small BPE vocabularies with Qwen2's pre-tokenizer regex, so an
unknown hash is written as GGUF_PRE (default "qwen2") instead of failing. Known hashes are
unchanged.
"""
import os
import runpy
import sys


def main() -> None:
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    src, model, out, rest = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    script = os.path.join(src, "convert_hf_to_gguf.py")
    if not os.path.isfile(script):
        sys.exit(f"gguf_convert.py: no convert_hf_to_gguf.py in {src}")
    sys.path.insert(0, src)
    sys.path.insert(1, os.path.join(src, "gguf-py"))
    import conversion.base as base  # the converter's own module; imported once, patched below

    known = base.TextModel.get_vocab_base_pre

    def vocab_base_pre(self, tokenizer):
        try:
            return known(self, tokenizer)
        except NotImplementedError:
            return os.environ.get("GGUF_PRE", "qwen2")

    base.TextModel.get_vocab_base_pre = vocab_base_pre
    if "--outtype" not in rest:
        rest += ["--outtype", "bf16"]
    sys.argv = [script, model, "--outfile", out] + rest
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
