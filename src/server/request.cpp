#include "server/request.h"

#include "server/chat_format.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/error.h"
#include "server/constrained.h"
#include "server/json_body.h"
#include "server/stop_strings.h"

namespace spool::server {

namespace {

std::vector<std::string> parse_stop(const json& b) {
  auto it = b.find("stop");
  if (it == b.end() || it->is_null()) return {};
  std::vector<std::string> out;
  if (it->is_string()) {
    out.push_back(it->get<std::string>());
  } else if (it->is_array()) {
    if (it->size() > 16) throw bad_request("'stop' has more than 16 strings", "stop");
    for (const auto& s : *it) {
      if (!s.is_string()) throw bad_request("'stop' must be a string or an array of strings", "stop");
      out.push_back(s.get<std::string>());
    }
  } else {
    throw bad_request("'stop' must be a string or an array of strings", "stop");
  }
  for (const auto& s : out)
    if (s.empty()) throw bad_request("'stop' strings must not be empty", "stop");
  return out;
}

// logit_bias: {"token id": bias} with ids in [0, vocab) and biases in [-100, 100], as OpenAI
// accepts it. Returned sorted by id.
std::vector<std::pair<int32_t, float>> parse_logit_bias(const json& b, int64_t vocab) {
  auto it = b.find("logit_bias");
  if (it == b.end() || it->is_null()) return {};
  if (!it->is_object()) throw bad_request("'logit_bias' must be an object mapping token ids to biases", "logit_bias");
  std::vector<std::pair<int32_t, float>> out;
  for (const auto& [key, v] : it->items()) {
    const bool digits = !key.empty() && key.size() <= 10 && std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    const long long id = digits ? std::stoll(key) : -1;
    if (id < 0 || id >= vocab)
      throw bad_request(strfmt("'logit_bias' keys must be token ids in [0, %lld)", (long long)vocab), "logit_bias");
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < -100 || v.get<double>() > 100)
      throw bad_request(strfmt("'logit_bias' values must be numbers in [-100, 100] (token %lld)", id), "logit_bias");
    out.emplace_back(static_cast<int32_t>(id), static_cast<float>(v.get<double>()));
  }
  std::sort(out.begin(), out.end());
  for (size_t i = 1; i < out.size(); ++i)
    if (out[i].first == out[i - 1].first)
      throw bad_request(strfmt("'logit_bias' names token %d twice", out[i].first), "logit_bias");
  return out;
}

// Everything chat and text completions share: sampling, limits, stop, stream options.
void parse_common(const json& b, const ModelFacts& f, GenRequest& r, uint64_t seed_source, std::optional<int64_t> max_tokens) {
  if (auto n = get_int(b, "n", 1, 128); n && *n != 1) throw bad_request("only n = 1 is supported", "n");
  if (auto it = b.find("response_format"); !r.chat && it != b.end() && !it->is_null()) {
    if (!it->is_object() || it->value("type", "") != "text")
      throw bad_request("response_format other than {\"type\": \"text\"} is only supported by /v1/chat/completions", "response_format");
  }
  r.lora = request_lora(f.lora.get(), b);  // `lora` / a `model` naming an adapter / the defaults
  engine::SamplingParams& p = r.sampling;
  p = f.defaults;
  if (auto v = get_number(b, "temperature", 0, 2)) p.temperature = static_cast<float>(*v);
  if (auto v = get_number(b, "top_p", 0, 1)) {
    if (*v <= 0) throw bad_request("'top_p' must be in (0, 1]", "top_p");
    p.top_p = static_cast<float>(*v);
  }
  if (auto v = get_int(b, "top_k", -1, std::numeric_limits<int32_t>::max())) p.top_k = *v < 0 ? 0 : static_cast<int>(*v);
  if (auto v = get_number(b, "min_p", 0, 1)) p.min_p = static_cast<float>(*v);
  if (auto v = get_number(b, "repetition_penalty", 0, 100)) {
    if (*v <= 0) throw bad_request("'repetition_penalty' must be > 0", "repetition_penalty");
    p.repetition_penalty = static_cast<float>(*v);
  }
  if (auto v = get_number(b, "presence_penalty", -2, 2)) p.presence_penalty = static_cast<float>(*v);
  if (auto v = get_number(b, "frequency_penalty", -2, 2)) p.frequency_penalty = static_cast<float>(*v);
  if (auto v = get_int(b, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max())) {
    p.seed = static_cast<uint64_t>(*v);
    r.seeded = true;
  } else {
    p.seed = seed_source;
  }
  try {
    p.validate();
  } catch (const UsageError& e) {
    throw bad_request(e.what());
  }
  r.logit_bias = parse_logit_bias(b, f.vocab_size);
  r.parser.stop = parse_stop(b);
  r.parser.id_seed = seed_source ^ 0x5bd1e995u;
  r.stream = get_bool(b, "stream").value_or(false);
  if (auto it = b.find("stream_options"); it != b.end() && !it->is_null()) {
    if (!it->is_object()) throw bad_request("'stream_options' must be an object", "stream_options");
    r.include_usage = get_bool(*it, "include_usage").value_or(false);
  }
  const int64_t n = static_cast<int64_t>(r.prompt.size());
  if (n == 0) throw bad_request("the prompt is empty (at least one token is needed)", r.chat ? "messages" : "prompt");
  if (n >= f.ctx_size)
    throw ApiError(400, "invalid_request_error",
                   strfmt("the prompt has %lld tokens, but the context size is %lld (at least one position must remain for output)",
                          (long long)n, (long long)f.ctx_size),
                   r.chat ? "messages" : "prompt");
  const int64_t room = f.ctx_size - n;
  r.max_tokens = static_cast<int>(std::min(max_tokens.value_or(room), room));
  r.stop_ids = f.stop_ids;
}

}  // namespace

std::vector<int32_t> encode_text(const ModelFacts& facts, const std::string& text, bool add_special) {
  if (!facts.tok) throw bad_request("the model has no tokenizer.json; send token ids");
  return add_special ? facts.tok->encode_prompt(text) : facts.tok->encode(text, false);
}

GenRequest parse_chat_request(const json& body, const ModelFacts& f, uint64_t seed_source) {
  GenRequest r;
  r.chat = true;
  if (!f.tok) throw bad_request("the model has no tokenizer.json; chat completions need one");
  ChatPrompt prompt = render_chat(body, f.chat, /*allow_template_override=*/false);
  r.prompt = f.tok->encode(prompt.text, /*add_special=*/false);
  std::optional<int64_t> max_tokens = get_int(body, "max_completion_tokens", 1, std::numeric_limits<int32_t>::max());
  if (!max_tokens) max_tokens = get_int(body, "max_tokens", 1, std::numeric_limits<int32_t>::max());
  parse_common(body, f, r, seed_source, max_tokens);
  r.logprobs = get_bool(body, "logprobs").value_or(false);
  if (auto k = get_int(body, "top_logprobs", 0, 20)) {
    if (!r.logprobs && *k > 0) throw bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
    r.top_logprobs = static_cast<int>(*k);
  }
  r.parser.syntax = prompt.syntax;
  r.parser.tool_calls = prompt.tool_calls;
  r.parser.parse_reasoning = true;
  r.parser.starts_in_reasoning = prompt.starts_in_reasoning;
  r.parser.tools = prompt.tools.is_null() ? nlohmann::json() : nlohmann::json::parse(prompt.tools.dump());
  // Thinking budget (llama-server's thinking_budget_tokens / --reasoning-budget).
  r.reasoning_budget = f.reasoning_budget;
  if (auto v = get_int(body, "thinking_budget_tokens", -1, std::numeric_limits<int32_t>::max())) r.reasoning_budget = static_cast<int>(*v);
  if (r.reasoning_budget >= 0) {
    const std::string& end = chat_format(prompt.syntax).reasoning_end;
    if (end.empty()) r.reasoning_budget = -1;  // the format has no reasoning to end
    else r.reasoning_end = f.tok->encode(end, /*add_special=*/false);
  }
  // A forced tool call wins over response_format (which is still checked).
  ForcedOutput forced = parse_response_format(body);
  if (prompt.force_tool) {
    forced = ForcedOutput{ForcedOutput::kToolCall, prompt.forced_tool, nullptr};
  }
  attach_constraint(r, f, prompt, forced, prompt.force_tool ? "tool_choice" : "response_format");
  return r;
}

GenRequest parse_completion_request(const json& body, const ModelFacts& f, uint64_t seed_source) {
  GenRequest r;
  r.chat = false;
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) throw bad_request("'prompt' is required", "prompt");
  // A text prompt gets what the tokenizer adds to a plain encode (add_special_tokens=True, as HF's
  // tokenizer(text), vLLM and llama-server do): the BOS of Llama/Mixtral/DeepSeek tokenizers,
  // nothing for Qwen's.
  if (it->is_array() && it->size() == 1 && (*it)[0].is_string()) {
    r.prompt = encode_text(f, (*it)[0].get<std::string>(), true);
  } else if (it->is_string()) {
    r.prompt = encode_text(f, it->get<std::string>(), true);
  } else if (it->is_array()) {
    for (const auto& id : *it) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= f.vocab_size)
        throw bad_request(strfmt("'prompt' must be a string or an array of token ids in [0, %lld)", (long long)f.vocab_size), "prompt");
      r.prompt.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
  } else {
    throw bad_request("'prompt' must be a string or an array of token ids", "prompt");
  }
  if (get_bool(body, "echo").value_or(false)) throw bad_request("'echo' is not supported", "echo");
  if (get_string(body, "suffix")) throw bad_request("'suffix' is not supported", "suffix");
  if (auto b = get_int(body, "best_of", 1, 128); b && *b != 1) throw bad_request("only best_of = 1 is supported", "best_of");
  parse_common(body, f, r, seed_source, get_int(body, "max_tokens", 1, std::numeric_limits<int32_t>::max()));
  if (auto k = get_int(body, "logprobs", 0, 5)) {
    r.logprobs = true;
    r.top_logprobs = static_cast<int>(*k);
  }
  r.parser.syntax = ToolSyntax::kNone;
  r.parser.parse_reasoning = false;
  return r;
}

}  // namespace spool::server
