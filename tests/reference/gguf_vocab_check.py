#!/usr/bin/env python3
"""Reference check of spool's GGUF tokenizers against llama.cpp's vocabulary test files (outside
ctest: the files are megabytes). llama.cpp's models/ directory holds ggml-vocab-NAME.gguf (a
tokenizer-only GGUF written by its converter) with NAME.gguf.inp (test texts separated by lines
"__ggml_vocab_test__") and NAME.gguf.out (one line per text: the Hugging Face tokenizer's ids,
add_special_tokens=False, space-separated), the files llama.cpp's tests/test-tokenizer-0 reads.

For every such file this runs `spool tokenize --model FILE.gguf --text-file CASE` on each text
and compares the ids. A vocabulary whose tokenizer.ggml.model / .pre spool does not support is
reported as "unsupported" with spool's message. Exit status 1 if any case of a supported file
fails.

  python3 tests/reference/gguf_vocab_check.py --spool build/spool \
      --dir /path/to/llama.cpp/models [--only llama-spm,gpt-2] [-v]
"""
import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

SEP = "\n__ggml_vocab_test__\n"


def read_cases(inp: Path, out: Path):
    raw = inp.read_bytes().decode("utf-8")
    texts = []
    pos = 0
    while pos < len(raw):  # as test-tokenizer-0.cpp's read_tests splits
        nxt = raw.find(SEP, pos)
        if nxt < 0:
            texts.append(raw[pos:])
            break
        texts.append(raw[pos:nxt])
        pos = nxt + len(SEP)
    ids = [[int(x) for x in line.split()] for line in out.read_text(encoding="utf-8").split("\n")]
    if ids and ids[-1] == [] and len(ids) == len(texts) + 1:
        ids.pop()  # the file's final newline
    if len(ids) != len(texts):
        raise SystemExit(f"{inp}: {len(texts)} texts but {out}: {len(ids)} lines")
    return list(zip(texts, ids))


def tokenize(spool: str, model: Path, text: str, tmp: Path):
    tmp.write_bytes(text.encode("utf-8"))
    p = subprocess.run([spool, "tokenize", "--model", str(model), "--text-file", str(tmp)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        return None, p.stderr.strip()
    return [int(x) for x in p.stdout.split()], ""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spool", required=True)
    ap.add_argument("--dir", required=True, type=Path)
    ap.add_argument("--only", default="", help="comma-separated NAMEs of ggml-vocab-NAME.gguf")
    ap.add_argument("-v", action="store_true", help="print every failing case")
    a = ap.parse_args()
    only = {x for x in a.only.split(",") if x}
    failed_any = False
    rows = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d) / "case.txt"
        for g in sorted(a.dir.glob("ggml-vocab-*.gguf")):
            name = g.name[len("ggml-vocab-"):-len(".gguf")]
            inp, out = Path(str(g) + ".inp"), Path(str(g) + ".out")
            if (only and name not in only) or not inp.exists() or not out.exists():
                continue
            cases = read_cases(inp, out)
            ids, err = tokenize(a.spool, g, cases[0][0], tmp)
            if ids is None:
                rows.append((name, "unsupported", err.splitlines()[-1] if err else "?"))
                continue
            passed = shown = 0
            for i, (text, want) in enumerate(cases):
                got, err = tokenize(a.spool, g, text, tmp)
                if got == want:
                    passed += 1
                    continue
                shown += 1
                if a.v or shown <= 3:
                    print(f"  {name} case {i}: {text!r}\n    want {want}\n    got  {got if got is not None else err}")
            failed_any = failed_any or passed != len(cases)
            rows.append((name, f"{passed}/{len(cases)} pass", ""))
    for name, res, note in rows:
        print(f"{name:16} {res}" + (f"  ({note})" if note else ""))
    return 1 if failed_any else 0


if __name__ == "__main__":
    sys.exit(main())
