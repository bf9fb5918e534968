#!/usr/bin/env python3
"""Copies a GGUF (any tensor types, e.g. a llama-quantize output) and gives it the byte-level BPE
vocabulary of a Hugging Face tokenizer.json, padded with unused tokens to the model's vocab_size.
bench/moe_to_gguf.py writes a tokenizer-less GGUF (llama-bench feeds random ids); llama-server
needs a vocabulary to tokenize requests. Used by bench/batch.sh.

  python3 bench/gguf_add_vocab.py IN.gguf OUT.gguf TOKENIZER_JSON
"""
import json
import sys

import numpy as np
import gguf


def vocab_fields(tokenizer_json, vocab_size):
    """tokens, token types, merges and special ids of a tokenizer.json, padded to vocab_size."""
    t = json.load(open(tokenizer_json, encoding="utf-8"))
    tokens = [None] * vocab_size
    types = [gguf.TokenType.UNUSED] * vocab_size
    for tok, i in t["model"]["vocab"].items():
        if i < vocab_size:
            tokens[i], types[i] = tok, gguf.TokenType.NORMAL
    special = {}
    for a in t.get("added_tokens", []):
        i = a["id"]
        if i < vocab_size:
            tokens[i] = a["content"]
            types[i] = gguf.TokenType.CONTROL if a.get("special") else gguf.TokenType.USER_DEFINED
            special[a["content"]] = i
    for i in range(vocab_size):
        if tokens[i] is None:
            tokens[i] = f"[PAD{i}]"
    merges = [m if isinstance(m, str) else " ".join(m) for m in t["model"].get("merges", [])]
    return tokens, types, merges, special


def main() -> None:
    src, out, tok_json = sys.argv[1], sys.argv[2], sys.argv[3]
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(out, arch)
    vocab_size = None
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name.startswith("tokenizer.") or name == "general.architecture":
            continue
        if name == f"{arch}.vocab_size":
            vocab_size = int(f.contents())
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_array(name, f.contents())
        else:
            w.add_key_value(name, f.contents(), vt)
    if vocab_size is None:
        vocab_size = next(int(t.shape[1]) for t in r.tensors if t.name == "token_embd.weight")
    tokens, types, merges, special = vocab_fields(tok_json, vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    eos = special.get("<|im_end|>", special.get("<|endoftext|>"))
    if eos is not None:
        w.add_eos_token_id(eos)
    pad = special.get("<|endoftext|>")
    if pad is not None:
        w.add_pad_token_id(pad)
    w.add_add_bos_token(False)
    for t in r.tensors:
        w.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in r.tensors:
        w.write_tensor_data(t.data)
    w.close()
    print(f"{out}: {arch}, {len(r.tensors)} tensors, vocabulary of {len(tokens)} ({len(merges)} merges)")


if __name__ == "__main__":
    main()
