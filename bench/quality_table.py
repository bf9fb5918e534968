#!/usr/bin/env python3
"""Writes bench/quality.sh's markdown table from its rows file (standard library only).

    quality_table.py ROWS PARAMS OUT NAME TEXT CHUNKS CALIB CROSS

ROWS: tab-separated tool, label, bytes, then KL, top-1, ppl, reference ppl, tokens (or one
"failed: ..." field), and optionally the scored path last. For each llama.cpp type the table says
whether a spool recipe no larger has a KL no higher (the issue's acceptance: spool's curve at or
below llama.cpp's at every size). "No larger" compares tensor bytes: a GGUF's bytes after its
metadata (vocabulary, chat template: ~0.3 MB on these models), a spool directory's safetensors
minus their JSON headers; with GGUF_PY (llama.cpp's gguf-py, numpy needed) for GGUF offsets.
"""
import json
import os
import struct
import sys


def tensor_bytes(path: str) -> int:
    """Bytes of tensor data: a GGUF file after its data offset, or a directory's safetensors minus headers."""
    if os.path.isdir(path):
        n = 0
        for f in os.listdir(path):
            if f.endswith(".safetensors"):
                full = os.path.join(path, f)
                with open(full, "rb") as fh:
                    n += os.path.getsize(full) - 8 - struct.unpack("<Q", fh.read(8))[0]
        return n
    if os.environ["GGUF_PY"] not in sys.path:
        sys.path.insert(0, os.environ["GGUF_PY"])
    import gguf  # noqa: E402 (llama.cpp's gguf-py)
    return os.path.getsize(path) - gguf.GGUFReader(path).data_offset


def main() -> None:
    rows_path, params, out, name, text, chunks, calib, cross = sys.argv[1:9]
    params = int(params)
    rows = []
    for line in open(rows_path):
        f = line.rstrip("\n").split("\t")
        r = {"tool": f[0], "label": f[1], "bytes": int(f[2])}
        if len(f) == 4:
            r["failed"] = f[3]
        else:
            r.update(kl=float(f[3]), top1=float(f[4]), ppl=float(f[5]), ref_ppl=float(f[6]), tokens=int(f[7]))
        r["tensor"] = tensor_bytes(f[8]) if len(f) > 8 and os.path.exists(f[8]) else r["bytes"]
        rows.append(r)
    ok = [r for r in rows if "failed" not in r]
    ref = next((r for r in ok if r["tool"] == "bf16"), None)
    spool = [r for r in ok if r["tool"] == "spool"]
    lines = [
        f"Quality per byte: **{name}** ({params / 1e6:.1f}M parameters without the MTP head), scored on "
        f"`{os.path.basename(text)}`" + (f" (first {chunks} windows of 512 tokens)" if chunks != "0" else "") +
        (f", {ref['tokens']} tokens" if ref else "") + ".",
        "Every file is scored by `spool perplexity --kl-reference` against the bf16 safetensors model on the same tokens "
        "(GGUF files with `--act-bits 32`, so only the weights differ): KL = mean KL(bf16 || quantized) per token in nats, "
        "top-1 = tokens whose argmax equals bf16's. Size = the file(s) on disk; tensor MB = the weights alone (a GGUF's "
        "bytes after its metadata, a spool checkpoint's safetensors minus their headers), which \"no larger\" compares; "
        "bits/weight = 8 x tensor bytes / parameters. "
        f"llama.cpp types come from `llama-quantize` on the BF16 GGUF of its own converter; (imatrix) types use "
        f"`llama-imatrix` on `{os.path.basename(calib)}`. spool rows are `spool convert` recipes (data-free).",
        "",
        "| tool | type / recipe | size MB | tensor MB | bits/weight | KL to bf16 | top-1 | PPL | a spool recipe no larger with KL no higher |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: -r["tensor"]):
        size = f"{r['bytes'] / 1e6:.2f} | {r['tensor'] / 1e6:.2f} | {8 * r['tensor'] / params:.2f}"
        if "failed" in r:
            lines.append(f"| {r['tool']} | {r['label']} | {size} | {r['failed']} | | | |")
            continue
        verdict = ""
        if r["tool"] == "llama.cpp" and r["label"] != "BF16 GGUF":
            fits = [s for s in spool if s["tensor"] <= r["tensor"]]
            wins = [s for s in fits if s["kl"] <= r["kl"]]
            if wins:
                best = min(wins, key=lambda s: s["kl"])
                verdict = f"yes: {best['label']} ({best['kl']:.4f})"
            elif fits:
                best = min(fits, key=lambda s: s["kl"])
                verdict = f"**no**: best no larger is {best['label']} ({best['kl']:.4f}, {best['kl'] / max(r['kl'], 1e-12):.2f}x)"
            else:
                verdict = "**no**: no spool recipe this small"
        lines.append(f"| {r['tool']} | {r['label']} | {size} | {r['kl']:.4f} | {100 * r['top1']:.1f}% | {r['ppl']:.3f} | {verdict} |")
    failed = [r for r in rows if "failed" in r]
    def tally(imatrix: bool) -> str:
        rows_ = [line for line in lines if line.startswith("| llama.cpp |") and "BF16 GGUF" not in line
                 and ("(imatrix)" in line) == imatrix and "failed:" not in line]
        return f"{sum(1 for line in rows_ if '| yes:' in line)} of {len(rows_)}"
    lines += ["", f"spool (data-free) matches or beats {tally(False)} data-free llama.cpp types and {tally(True)} imatrix types"
              + (f"; {len(failed)} file(s) failed to score (see the rows)." if failed else ".")]
    if cross:
        lines += ["", "Cross-check: " + cross]
    open(out, "w").write("\n".join(lines) + "\n")
    # The PNG's points (quality.sh's gnuplot): tool (0 spool, 1 llama.cpp), bits/weight, KL, top-1 %, label.
    with open(os.path.join(os.path.dirname(rows_path), "plot.dat"), "w") as f:
        for r in ok:
            if r["tool"] != "bf16" and r["label"] != "BF16 GGUF":
                f.write(f"{0 if r['tool'] == 'spool' else 1} {8 * r['tensor'] / params} {r['kl']} {100 * r['top1']} "
                        f"{r['label'].replace(' (imatrix)', '*')}\n")
    print("\n".join(lines))
    print(f"quality_table.py: wrote {out}")


if __name__ == "__main__":
    main()
