# Adds "ids" to a chat golden file that has only "rendered" (tokenizer/deepseek_v3/chat_cases.json,
# written by make_fixtures_chat_demo_hidden_quant.py `chat`): the tokenizer's ids of the rendered text, as
# make_fixtures_tokenizers_families_demo.py `tok_golden` encodes (the `tokenizers` library on tokenizer.json, special
# tokens written as text, add_special_tokens=False). Not transformers' AutoTokenizer: transformers
# 5.17 loads this tokenizer (tokenizer_class LlamaTokenizerFast) as a LlamaTokenizer with a
# Metaspace pre-tokenizer in place of tokenizer.json's byte-level one, and drops the spaces
# ("You are terse." -> You|are|ters|e|.). transformers renders the template (checked against the
# golden text). Needs no GPU and no torch.
#   python3 tests/reference/chat_ids.py TOKENIZER_DIR tests/data/tokenizer/deepseek_v3/chat_cases.json
# TOKENIZER_DIR: tests/data/tokenizers/deepseek_v3 with tokenizer.json.xz unpacked.
import json
import sys

import tokenizers
import transformers
from transformers import AutoTokenizer

tok_dir, path = sys.argv[1], sys.argv[2]
tok = AutoTokenizer.from_pretrained(tok_dir)
tk = tokenizers.Tokenizer.from_file(tok_dir + "/tokenizer.json")
cases = json.load(open(path, encoding="utf-8"))
for c in cases:
    if "rendered" not in c:
        continue
    # The rendering is re-checked too: the template must give the golden's text.
    kw = {k: v for k, v in c.items() if k in ("tools", "add_generation_prompt", "enable_thinking")}
    text = tok.apply_chat_template(c["messages"], tokenize=False, **kw)
    assert text == c["rendered"], (text, c["rendered"])
    c["ids"] = tk.encode(c["rendered"], add_special_tokens=False).ids
    assert tk.decode(c["ids"], skip_special_tokens=False) == c["rendered"]
json.dump(cases, open(path, "w", encoding="utf-8"), ensure_ascii=False, indent=1)
print(f"{path}: ids for {sum('ids' in c for c in cases)} of {len(cases)} cases (tokenizers {tokenizers.__version__}, transformers {transformers.__version__})")
