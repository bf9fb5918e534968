"""Drives `spool serve`'s /v1/responses (demo model) with the official openai SDK's
responses.create (plain, streamed, a function-call round trip with function_call_output,
previous_response_id, retrieve/delete, errors) and one openai-agents Runner loop (an Agent with
one function tool on OpenAIResponsesModel, tracing disabled). The demo model is tiny and
random: the checks are on protocol shape, not content. Usage: responses_client.py BASE_URL API_KEY"""
import asyncio
import json
import sys
import urllib.request
from typing import Literal

import openai
from openai import AsyncOpenAI, OpenAI

base_url, key = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=120)
model = client.models.list().data[0].id
prompt = "Tell me a story about the sea and a whale named Moby."


def check_usage(u, limit):
    assert u.input_tokens > 5 and 0 < u.output_tokens <= limit, u
    assert u.total_tokens == u.input_tokens + u.output_tokens, u
    assert u.input_tokens_details.cached_tokens >= 0 and u.output_tokens_details.reasoning_tokens >= 0, u


# Plain.
r = client.responses.create(model=model, input=prompt, max_output_tokens=16, temperature=0, instructions="Be brief.",
                            metadata={"case": "plain"})
assert r.object == "response" and r.id.startswith("resp_"), r
assert r.status in ("completed", "incomplete"), r.status
if r.status == "incomplete":
    assert r.incomplete_details.reason == "max_output_tokens", r.incomplete_details
assert r.instructions == "Be brief." and r.metadata == {"case": "plain"} and r.max_output_tokens == 16, r
msgs = [o for o in r.output if o.type == "message"]
assert len(msgs) == 1 and msgs[0].role == "assistant" and msgs[0].content[0].type == "output_text", r.output
assert isinstance(r.output_text, str) and r.output_text == msgs[0].content[0].text
check_usage(r.usage, 16)

# Streamed: typed events in order with sequence numbers; the deltas add up to the same text.
events = list(client.responses.create(model=model, input=prompt, max_output_tokens=16, temperature=0,
                                      instructions="Be brief.", stream=True))
types = [e.type for e in events]
assert types[:2] == ["response.created", "response.in_progress"], types
assert types[-1] in ("response.completed", "response.incomplete"), types
assert [e.sequence_number for e in events] == list(range(len(events)))
for t in ("response.output_item.added", "response.content_part.added", "response.output_text.done",
          "response.content_part.done", "response.output_item.done"):
    assert t in types, (t, types)
streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
final = events[-1].response
assert streamed == r.output_text == final.output_text, (streamed, r.output_text)
check_usage(final.usage, 16)

# Stored: retrieve; continue with previous_response_id (the earlier turn is in the prompt).
got = client.responses.retrieve(r.id)
assert got.id == r.id and got.output_text == r.output_text
r2 = client.responses.create(model=model, input="And then?", previous_response_id=r.id, max_output_tokens=8)
assert r2.previous_response_id == r.id
assert r2.usage.input_tokens > r.usage.input_tokens + r.usage.output_tokens, (r.usage, r2.usage)
client.responses.delete(r2.id)
try:
    client.responses.retrieve(r2.id)
    raise AssertionError("deleted response still retrievable")
except openai.NotFoundError:
    pass
try:
    client.responses.create(model=model, input="x", previous_response_id="resp_unknown")
    raise AssertionError("unknown previous_response_id accepted")
except openai.BadRequestError as e:
    assert e.code == "previous_response_not_found" and e.param == "previous_response_id", e.body

# Function-call round trip: tools in Responses' flat form; the model's call (if the demo model
# wrote one) or a call the client supplies, answered with function_call_output.
tools = [{"type": "function", "name": "get_weather", "description": "Current weather of a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                         "additionalProperties": False}, "strict": True}]
t1 = client.responses.create(model=model, input="What is the weather in Paris?", tools=tools, tool_choice="auto",
                             max_output_tokens=24, temperature=0, parallel_tool_calls=True)
assert t1.tools[0].name == "get_weather" and t1.tool_choice == "auto", t1
calls = [o for o in t1.output if o.type == "function_call"]
model_called = bool(calls)
call = {"type": "function_call", "call_id": calls[0].call_id, "name": calls[0].name, "arguments": calls[0].arguments} if calls else \
    {"type": "function_call", "call_id": "call_client_1", "name": "get_weather", "arguments": json.dumps({"city": "Paris"})}
t2 = client.responses.create(model=model, tools=tools, max_output_tokens=8, temperature=0, input=[
    {"role": "user", "content": "What is the weather in Paris?"}, call,
    {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny, 24 C"}])
assert t2.status in ("completed", "incomplete") and t2.output, t2
# The same round trip through previous_response_id: only the tool output is sent.
if model_called:
    t3 = client.responses.create(model=model, tools=tools, max_output_tokens=8, previous_response_id=t1.id,
                                 input=[{"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}])
    assert t3.previous_response_id == t1.id

# A forced call (constrained decoding): tool_choice "required", then the named function, at
# temperature 1: exactly one function_call whose arguments validate against the schema.
enum_tools = [{"type": "function", "name": "get_weather", "description": "Current weather of a city",
               "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                              "required": ["city"], "additionalProperties": False}}]
for choice in ("required", {"type": "function", "name": "get_weather"}):
    forced = client.responses.create(model=model, input="What is the weather in Paris?", tools=enum_tools, tool_choice=choice,
                                     max_output_tokens=160, temperature=1)
    fcalls = [o for o in forced.output if o.type == "function_call"]
    assert len(fcalls) == 1 and fcalls[0].name == "get_weather", forced
    assert json.loads(fcalls[0].arguments)["city"] in ("Paris", "Rome"), fcalls[0].arguments

# Errors: required without tools; images refused.
for bad in ({"tool_choice": "required"}, {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}):
    try:
        client.responses.create(model=model, **({"input": "x"} | bad))
        raise AssertionError(f"accepted: {bad}")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and e.body and e.param, e.body

# One openai-agents loop: an Agent with one function tool, run to completion. The first turn
# forces the call (tool_choice "required", constrained decoding; the SDK resets it to auto after
# the tool ran). The SDK treats a response cut by max_output_tokens ("incomplete") as an error,
# and the demo model rarely ends on its own: spool's logit_bias extension makes it end as soon as
# the grammar allows (at once in the second turn: an empty message), so the loop finishes.
eos = json.loads(urllib.request.urlopen(urllib.request.Request(
    base_url.removesuffix("/v1") + "/tokenize", data=json.dumps({"content": "<|im_end|>"}).encode(),
    headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})).read())["tokens"]
assert len(eos) == 1, eos
eos = eos[0]
from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

set_tracing_disabled(True)
tool_calls = []


@function_tool
def get_weather(city: Literal["Paris", "Rome"]) -> str:
    """Current weather of a city."""
    tool_calls.append(city)
    return f"sunny in {city}"


async def agent_loop():
    aclient = AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=120)
    agent = Agent(name="weather", instructions="Answer with the weather tool.", tools=[get_weather],
                  model=OpenAIResponsesModel(model=model, openai_client=aclient),
                  model_settings=ModelSettings(max_tokens=160, temperature=0, tool_choice="required",
                                               extra_body={"logit_bias": {str(eos): 100}}))
    return await Runner.run(agent, "What is the weather in Paris?", max_turns=4)


result = asyncio.run(agent_loop())
assert isinstance(result.final_output, str), result
assert tool_calls and all(c in ("Paris", "Rome") for c in tool_calls), tool_calls
assert result.raw_responses and all(resp.response_id and resp.response_id.startswith("resp_") for resp in result.raw_responses)
print(f"e2e: agents loop finished after {len(result.raw_responses)} model turn(s), tool called {len(tool_calls)} time(s); "
      f"the plain request {'did' if model_called else 'did not'} produce a tool call")
