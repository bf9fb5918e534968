#!/usr/bin/env python3
"""Writes tokenizer-only GGUF files (metadata, no tensors) the way llama.cpp's convert_hf_to_gguf.py
writes a byte-level BPE vocabulary (bench/moe_to_gguf.py's add_hf_vocab: tokens padded to the
model's vocab_size with `[PADi]` UNUSED tokens, added tokens CONTROL / USER_DEFINED, merges,
special ids from tokenizer_config.json and config.json, the chat template), with the `gguf`
package:

  gguf/qwen3_tokenizer.gguf  tests/data/tokenizers/qwen3 (Qwen3's vocab_size 151936,
                             bos 151643 / eos 151645 as in Qwen3's config.json)
  gguf/demo_tokenizer.gguf   models/spool-demo-moe (its config.json's vocab_size 8256), whose
                             control tokens sit at ids 0..13 inside the BPE vocabulary
  gguf/models/qwen3_moe.q-0000N-of-00003.gguf
                             gguf/models/qwen3_moe.q.gguf (written by gguf_models.py) re-written as a
                             split set of 3 shards (GGUFWriter split_max_tensors), same KVs and tensors

  python3 -m venv /tmp/gguf-venv && /tmp/gguf-venv/bin/pip install gguf==0.19.0 numpy
  /tmp/gguf-venv/bin/python tests/reference/gguf_tokenizer.py   (writes tests/data/gguf/*.gguf.xz)
"""
import json
import lzma
import sys
from pathlib import Path

import gguf

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from moe_to_gguf import add_hf_vocab  # noqa: E402


def write(out, tok_json, tok_config, vocab_size, chat_template, config):
    tmp = out.with_suffix("")
    w = gguf.GGUFWriter(str(tmp), "qwen3moe")
    add_hf_vocab(w, tok_json, tok_config, vocab_size, chat_template, config)
    w.add_vocab_size(vocab_size)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    out.write_bytes(lzma.compress(tmp.read_bytes(), preset=9 | lzma.PRESET_EXTREME))
    tmp.unlink()
    print(out, out.stat().st_size)


def write_split(src, out_prefix, shards):
    r = gguf.GGUFReader(str(src))
    n = len(r.tensors)
    w = gguf.GGUFWriter(str(out_prefix) + ".gguf", r.fields["general.architecture"].contents(),
                        split_max_tensors=(n + shards - 1) // shards)
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        vt = f.types[0]
        w.add_key_value(k, f.contents(), vt, f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_shape=list(reversed([int(x) for x in t.shape])) if t.tensor_type in
                     (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16) else None,
                     raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    data = ROOT / "tests/data"
    q = data / "tokenizers/qwen3"
    write(data / "gguf/qwen3_tokenizer.gguf.xz", json.loads(lzma.open(q / "tokenizer.json.xz").read()),
          (q / "tokenizer_config.json").read_text(), 151936, None,
          {"bos_token_id": 151643, "eos_token_id": 151645})
    src = data / "gguf/models/qwen3_moe.q.gguf.xz"
    tmp = data / "gguf/models/_src.gguf"
    tmp.write_bytes(lzma.open(src).read())
    write_split(tmp, data / "gguf/models/qwen3_moe.q", 3)
    tmp.unlink()
    for i in range(1, 4):
        f = data / f"gguf/models/qwen3_moe.q-{i:05d}-of-00003.gguf"
        (f.parent / (f.name + ".xz")).write_bytes(lzma.compress(f.read_bytes(), preset=9 | lzma.PRESET_EXTREME))
        f.unlink()
    d = ROOT / "models/spool-demo-moe"
    write(data / "gguf/demo_tokenizer.gguf.xz", json.loads(lzma.open(d / "tokenizer.json.xz").read()),
          (d / "tokenizer_config.json").read_text(), json.loads((d / "config.json").read_text())["vocab_size"],
          (d / "chat_template.jinja").read_text(), json.loads((d / "config.json").read_text()))


if __name__ == "__main__":
    main()
