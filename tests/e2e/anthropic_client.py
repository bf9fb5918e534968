"""Drives `spool serve` (demo model) with the official anthropic SDK: messages.create (plain,
streamed through messages.stream and as raw events), prompt-cache usage, stop_sequences,
count_tokens, a tool_use -> tool_result round trip, and errors (missing max_tokens, image
block, wrong key). The demo model's text is random-ish: the checks are on protocol shape.
Usage: anthropic_client.py BASE_URL API_KEY"""
import json
import sys
import urllib.error
import urllib.request

import anthropic
from anthropic import Anthropic

base_url, key = sys.argv[1], sys.argv[2]
client = Anthropic(base_url=base_url, api_key=key, max_retries=0, timeout=120)
MODEL = "claude-sonnet-4-5"  # any name: spool serves its one model
messages = [{"role": "user", "content": "Tell me a story about the sea and a whale named Moby."}]
# Greedy decoding, so that repeated requests agree. Recent SDKs have no `temperature` argument
# (the current API deprecates sampling parameters); the server still reads the field.
T0 = {"temperature": 0}


def check_message(m, max_tokens):
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_"), m
    assert m.stop_reason in ("end_turn", "max_tokens", "stop_sequence", "tool_use"), m.stop_reason
    for b in m.content:
        assert b.type in ("text", "thinking", "tool_use"), b
        if b.type == "tool_use":
            assert b.id.startswith("toolu_") and isinstance(b.input, dict), b
    u = m.usage
    assert u.input_tokens + u.cache_read_input_tokens > 0 and 0 < u.output_tokens <= max_tokens, u
    assert u.cache_creation_input_tokens == 0, u


def text_of(m):
    return "".join(getattr(b, "text", "") + getattr(b, "thinking", "") for b in m.content)


# Create, non-streamed.
r = client.messages.create(model=MODEL, max_tokens=16, extra_body=T0, messages=messages)
check_message(r, 16)
prompt = r.usage.input_tokens + r.usage.cache_read_input_tokens

# count_tokens counts the same prompt.
assert client.messages.count_tokens(model=MODEL, messages=messages).input_tokens == prompt

# The same request again reads the prompt from the cache and gives the same blocks.
r2 = client.messages.create(model=MODEL, max_tokens=16, extra_body=T0, messages=messages)
assert r2.usage.cache_read_input_tokens > 0, r2.usage
assert r2.usage.input_tokens + r2.usage.cache_read_input_tokens == prompt
assert [b.model_dump() for b in r2.content] == [b.model_dump() for b in r.content]

# Streamed with the SDK's helper: the accumulated message equals the non-streamed one.
with client.messages.stream(model=MODEL, max_tokens=16, extra_body=T0, messages=messages) as stream:
    streamed_text = "".join(stream.text_stream)
    final = stream.get_final_message()
assert [b.model_dump() for b in final.content] == [b.model_dump() for b in r.content], (final, r)
assert streamed_text == "".join(b.text for b in r.content if b.type == "text")
assert final.stop_reason == r.stop_reason and final.usage.output_tokens == r.usage.output_tokens, final

# Raw events: the documented order.
types = [e.type for e in client.messages.create(model=MODEL, max_tokens=8, extra_body=T0, messages=messages, stream=True)]
assert types[0] == "message_start" and types[-2:] == ["message_delta", "message_stop"], types
# (the SDK drops `ping` events; the C++ HTTP test checks them)
assert set(types) <= {"message_start", "content_block_start", "content_block_delta", "content_block_stop",
                      "message_delta", "message_stop"}, types
assert types.count("content_block_start") == types.count("content_block_stop")

# Stop sequences: a piece of the text ends the output there.
text = text_of(r)
assert len(text) >= 4, r
stop = text[len(text) // 2]
s = client.messages.create(model=MODEL, max_tokens=16, extra_body=T0, messages=messages, stop_sequences=[stop])
assert s.stop_reason == "stop_sequence" and s.stop_sequence == stop and stop not in text_of(s), (stop, s)

# Tools: tool_choice "tool" forces the call (constrained decoding): the model answers with one
# tool_use block whose input validates (the schema's enum), stop_reason "tool_use"; "any" too. The
# client then sends the tool_result; the server renders it and answers.
tools = [{"name": "get_weather", "description": "Current weather in a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                           "required": ["city"]}}]
ask = [{"role": "user", "content": "What is the weather in Paris?"}]
for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"}):
    first = client.messages.create(model=MODEL, max_tokens=160, extra_body={"temperature": 1.0}, system="You are a weather bot.",
                                   tools=tools, tool_choice=choice, messages=ask)
    check_message(first, 160)
    calls = [b for b in first.content if b.type == "tool_use"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].input["city"] in ("Paris", "Rome"), first
    assert first.stop_reason == "tool_use", first
call = {"type": "tool_use", "id": calls[0].id, "name": calls[0].name, "input": calls[0].input}
history = ask + [{"role": "assistant", "content": [{"type": "text", "text": "Let me check."}, call]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"],
                                               "content": [{"type": "text", "text": "sunny, 21 C"}]}]}]
with_result = client.messages.count_tokens(model=MODEL, tools=tools, messages=history).input_tokens
history_short = json.loads(json.dumps(history))
history_short[-1]["content"][0]["content"] = "sunny"
assert with_result > client.messages.count_tokens(model=MODEL, tools=tools, messages=history_short).input_tokens
second = client.messages.create(model=MODEL, max_tokens=12, extra_body=T0, system="You are a weather bot.", tools=tools,
                                messages=history)
check_message(second, 12)
assert second.usage.input_tokens + second.usage.cache_read_input_tokens == \
    client.messages.count_tokens(model=MODEL, system="You are a weather bot.", tools=tools, messages=history).input_tokens
with client.messages.stream(model=MODEL, max_tokens=12, extra_body=T0, tools=tools, messages=history) as st:
    streamed = st.get_final_message()
check_message(streamed, 12)
# tool_choice none leaves the tools out of the prompt.
assert client.messages.count_tokens(model=MODEL, tools=tools, tool_choice={"type": "none"}, messages=ask).input_tokens == \
    client.messages.count_tokens(model=MODEL, messages=ask).input_tokens

# Errors: Anthropic error objects, raised as the SDK's exception classes.
try:
    client.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}])
    raise AssertionError("an image block was accepted")
except anthropic.BadRequestError as e:
    assert e.status_code == 400 and e.body["type"] == "error" and e.body["error"]["type"] == "invalid_request_error", e.body
    assert "image" in e.body["error"]["message"], e.body
try:
    Anthropic(base_url=base_url, api_key="wrong", max_retries=0).messages.create(model=MODEL, max_tokens=8, messages=messages)
    raise AssertionError("a wrong key was accepted")
except anthropic.AuthenticationError as e:
    assert e.status_code == 401 and e.body["error"]["type"] == "authentication_error", e.body
req = urllib.request.Request(base_url + "/v1/messages", data=json.dumps({"model": MODEL, "messages": messages}).encode(),
                             headers={"x-api-key": key, "content-type": "application/json", "anthropic-version": "2023-06-01"})
try:
    urllib.request.urlopen(req, timeout=60)
    raise AssertionError("a request without max_tokens was accepted")
except urllib.error.HTTPError as e:
    body = json.loads(e.read())
    assert e.code == 400 and body["error"]["type"] == "invalid_request_error" and "max_tokens" in body["error"]["message"], body
print("anthropic e2e: ok")
