#!/usr/bin/env python3
"""Reference renders for chat templates that have no transformers goldens, made with plain jinja2
(3.1) set up the way transformers 5.17's render_jinja_template sets it up:
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]),
tojson = json.dumps(ensure_ascii=False, indent, separators, sort_keys), raise_exception ->
TemplateError, strftime_now fixed at 2026-06-01 00:00:00, and the context
special tokens + kwargs + messages / tools / documents=None / add_generation_prompt.

  python3 tests/reference/make_jinja_goldens.py check          # re-renders every transformers golden
  python3 tests/reference/make_jinja_goldens.py write NAME...   # writes tests/data/chat/NAME/chat_cases.json

`check` must report every case equal before `write` is trusted: it renders the inputs of the
tests/data/chat/*/chat_cases.json and assistant_cases.json that make_chat_goldens.py made with
transformers itself and compares. `write` renders the same conversations as
tests/data/chat/glm4_6/chat_cases.json (make_chat_goldens.py's list) with tests/data/chat/NAME/
chat_template.jinja and the special tokens below; a case the template refuses gets
"error": "<exception type>: <message>" instead of "rendered".
"""
import copy, datetime, json, os, sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "chat")
# The special tokens of each family's tokenizer_config.json that its template uses.
SPECIAL = {
    "mistral_small_3_2": {"bos_token": "<s>", "eos_token": "</s>"},
    "ministral_3_reasoning": {"bos_token": "<s>", "eos_token": "</s>"},
    "gemma2": {"bos_token": "<bos>", "eos_token": "<eos>"},
    "gemma4": {"bos_token": "<bos>", "eos_token": "<eos>"},
}


def compile_template(source):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime(2026, 6, 1).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


def render(tmpl, special, case):
    c = copy.deepcopy(case)
    for k in ("rendered", "error"):
        c.pop(k, None)
    msgs = c.pop("messages")
    tools = c.pop("tools", None)
    agp = c.pop("add_generation_prompt", False)
    ctx = dict(special)
    ctx.update(c)
    ctx.update(messages=msgs, tools=tools, documents=None, add_generation_prompt=agp)
    return tmpl.render(**ctx)


def check():
    bad = total = 0
    for name in sorted(os.listdir(DATA)):
        d = os.path.join(DATA, name)
        if name in SPECIAL or not os.path.exists(os.path.join(d, "chat_cases.json")):
            continue
        tmpl = compile_template(open(os.path.join(d, "chat_template.jinja"), encoding="utf-8").read())
        chat = json.load(open(os.path.join(d, "chat_cases.json"), encoding="utf-8"))
        special = chat["special_tokens"]
        for i, c in enumerate(chat["cases"]):
            total += 1
            if render(tmpl, special, c) != c["rendered"]:
                bad += 1
                print(f"{name} chat case {i}: differs")
        for i, a in enumerate(json.load(open(os.path.join(d, "assistant_cases.json"), encoding="utf-8"))):
            total += 1
            tools = a["tools"] or None
            head = render(tmpl, special, dict(messages=a["prior"], tools=tools, add_generation_prompt=True))
            full = render(tmpl, special, dict(messages=a["prior"] + [a["message"]], tools=tools, add_generation_prompt=False))
            if head != a["generation_prompt"] or full != head + a["emitted"]:
                bad += 1
                print(f"{name} assistant case {i}: differs")
    print(f"{total - bad}/{total} transformers goldens reproduced")
    return bad == 0


def write(names):
    convs = json.load(open(os.path.join(DATA, "glm4_6", "chat_cases.json"), encoding="utf-8"))["cases"]
    for name in names:
        d = os.path.join(DATA, name)
        tmpl = compile_template(open(os.path.join(d, "chat_template.jinja"), encoding="utf-8").read())
        cases = []
        for c in convs:
            c = {k: v for k, v in c.items() if k != "rendered"}
            try:
                cases.append(dict(c, rendered=render(tmpl, SPECIAL[name], c)))
            except Exception as e:  # the template's own refusal (raise_exception) or a runtime error
                cases.append(dict(c, error=f"{type(e).__name__}: {e}"))
        out = {"special_tokens": SPECIAL[name], "strftime_now": "2026-06-01",
               "reference": f"jinja2 {jinja2.__version__} set up like transformers 5.17 (make_jinja_goldens.py)", "cases": cases}
        with open(os.path.join(d, "chat_cases.json"), "w", encoding="utf-8") as f:
            json.dump(out, f, ensure_ascii=False, indent=1)
        ok = sum("rendered" in c for c in cases)
        print(f"{name}: {ok}/{len(cases)} rendered")


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "check":
        sys.exit(0 if check() else 1)
    if len(sys.argv) >= 3 and sys.argv[1] == "write":
        if not check():
            sys.exit("the jinja2 setup does not reproduce the transformers goldens: not writing")
        write(sys.argv[2:])
        sys.exit(0)
    sys.exit(__doc__)
