"""Drives `spool serve` (demo model) with the official openai client: models, chat (plain and
streamed, with usage), GET /v1/models/{id}, prompt-cache reuse, seeds, stop strings, logprobs, tools request/response
plumbing, text completions and errors. Usage: openai_client.py BASE_URL API_KEY"""
import json
import sys
import urllib.request

import openai
from openai import OpenAI

base_url, key = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=120)
model = client.models.list().data[0].id
assert client.models.retrieve(model).id == model  # GET /v1/models/{id}
messages = [{"role": "user", "content": "Tell me a story about the sea and a whale named Moby."}]

# Chat, non-streamed.
r = client.chat.completions.create(model=model, messages=messages, max_tokens=16, temperature=0)
choice = r.choices[0]
assert r.object == "chat.completion", r
assert isinstance(choice.message.content, str) and choice.message.content, r
assert choice.finish_reason in ("stop", "length"), choice.finish_reason
assert r.usage.prompt_tokens > 16 and 0 < r.usage.completion_tokens <= 16, r.usage
assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens

# The same request again reuses the prompt prefix and gives the same text.
r2 = client.chat.completions.create(model=model, messages=messages, max_tokens=16, temperature=0)
assert r2.choices[0].message.content == choice.message.content
assert r2.usage.prompt_tokens_details.cached_tokens > 0, r2.usage

# Streamed: the concatenated deltas equal the non-streamed text; usage comes last.
text, finish, usage = "", None, None
stream = client.chat.completions.create(model=model, messages=messages, max_tokens=16, temperature=0, stream=True,
                                        stream_options={"include_usage": True})
for chunk in stream:
    if chunk.usage is not None:
        assert not chunk.choices, chunk  # only the last chunk has usage; the others carry null
        usage = chunk.usage
    for c in chunk.choices:
        text += c.delta.content or ""
        finish = c.finish_reason or finish
assert text == choice.message.content, (text, choice.message.content)
assert finish == choice.finish_reason and usage is not None and usage.completion_tokens == r.usage.completion_tokens

# Seeds reproduce sampled output.
a = client.chat.completions.create(model=model, messages=messages, max_tokens=12, temperature=1.0, seed=7)
b = client.chat.completions.create(model=model, messages=messages, max_tokens=12, temperature=1.0, seed=7)
assert a.choices[0].message.content == b.choices[0].message.content

# Stop strings (the same text streamed and not).
word = choice.message.content.split()[1] if len(choice.message.content.split()) > 1 else choice.message.content[:2]
s = client.chat.completions.create(model=model, messages=messages, max_tokens=16, temperature=0, stop=[word])
assert word not in s.choices[0].message.content and s.choices[0].finish_reason == "stop", (word, s)
streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
    model=model, messages=messages, max_tokens=16, temperature=0, stop=[word], stream=True) if c.choices)
assert streamed == s.choices[0].message.content

# Logprobs.
lp = client.chat.completions.create(model=model, messages=messages, max_tokens=5, temperature=0, logprobs=True, top_logprobs=2)
content = lp.choices[0].logprobs.content
assert len(content) == lp.usage.completion_tokens and all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in content)

# Tools: request and response plumbing (the demo model is not trained to call tools).
tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}]
history = [{"role": "user", "content": "Weather in Paris?"},
           {"role": "assistant", "content": None,
            "tool_calls": [{"id": "call_1", "type": "function",
                            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
           {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
# The prompt the model sees holds the tool's schema and the assistant's earlier call (what a request
# with tools must change; the reply of an untrained model cannot show it).
req = urllib.request.Request(base_url.rsplit("/v1", 1)[0] + "/apply-template",
                             data=json.dumps({"messages": history, "tools": tools}).encode(),
                             headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
prompt = json.loads(urllib.request.urlopen(req, timeout=60).read())["prompt"]
assert '"name": "get_weather"' in prompt and '"description": "Weather of a city"' in prompt and '"city"' in prompt, prompt
call_at = prompt.find("<tool_call>", prompt.find("Weather in Paris?"))
assert call_at > 0 and "get_weather" in prompt[call_at:] and "Paris" in prompt[call_at:], prompt
assert "sunny, 21 C" in prompt[call_at:], prompt
t = client.chat.completions.create(model=model, messages=history, tools=tools, max_tokens=12, temperature=0)
assert t.choices[0].finish_reason in ("stop", "length", "tool_calls")
assert t.usage.prompt_tokens > len(history)  # the schema and the call were part of the prompt
assert t.choices[0].message.tool_calls is None or all(c.function.name for c in t.choices[0].message.tool_calls)
t2 = client.chat.completions.create(model=model, messages=history, tools=tools, tool_choice="none", max_tokens=4)
assert t2.choices[0].message.tool_calls is None

# Text completions.
c = client.completions.create(model=model, prompt="Call me Ishmael.", max_tokens=6, temperature=0)
assert c.object == "text_completion" and c.choices[0].text and c.usage.completion_tokens <= 6

# Errors.
def expect(exc, fn):
    try:
        fn()
    except exc as e:
        return e
    raise AssertionError(f"expected {exc.__name__}")

e = expect(openai.AuthenticationError,
           lambda: OpenAI(base_url=base_url, api_key="wrong", max_retries=0).models.list())
assert e.status_code == 401
e = expect(openai.BadRequestError, lambda: client.chat.completions.create(model=model, messages=[], max_tokens=4))
assert e.status_code == 400 and "messages" in str(e)
e = expect(openai.BadRequestError, lambda: client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "word " * 2000}], max_tokens=4))
assert "context" in str(e)
e = expect(openai.BadRequestError, lambda: client.chat.completions.create(model=model, messages=messages, temperature=-1))
print("openai_client.py: all checks passed")
