#include "server/generator.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "common/sysinfo.h"
#include "engine/perplexity.h"
#include "tokenizer/stream_decoder.h"

namespace spool::server {

TokenLogprob token_logprob(const float* logits, int64_t vocab, int32_t id, int k) {
  // token_nll is log-sum-exp(logits) - logits[id].
  const double nll = engine::token_nll(logits, vocab, id);
  const double lse = nll + static_cast<double>(logits[id]);
  TokenLogprob t;
  t.id = id;
  t.logprob = static_cast<float>(-nll);
  if (k > 0) {
    std::vector<int32_t> idx(static_cast<size_t>(vocab));
    for (int64_t i = 0; i < vocab; ++i) idx[i] = static_cast<int32_t>(i);
    const int64_t kk = std::min<int64_t>(k, vocab);
    std::partial_sort(idx.begin(), idx.begin() + kk, idx.end(),
                      [&](int32_t a, int32_t b) { return logits[a] != logits[b] ? logits[a] > logits[b] : a < b; });
    for (int64_t i = 0; i < kk; ++i) t.top.emplace_back(idx[i], static_cast<float>(logits[idx[i]] - lse));
  }
  return t;
}

Generator::Generator(engine::Session& session, PromptCache& cache, const tokenizer::Tokenizer& tok, bool tool_syntax_greedy)
    : session_(session), cache_(cache), tok_(tok), greedy_markup_(tool_syntax_greedy) {}

GenResult Generator::run(const GenRequest& req, const std::function<bool(const GenEvent&)>& on_event, const std::function<bool()>& alive) {
  GenResult res;
  res.prompt_tokens = static_cast<int64_t>(req.prompt.size());
  const int64_t vocab = session_.model().spec().vocab_size;
  for (int32_t id : req.prompt)
    if (id < 0 || id >= vocab) fail("prompt token id %d is outside the vocabulary (%lld tokens)", id, (long long)vocab);
  req.sampling.validate();
  OutputParser parser(req.parser);  // checks the stop strings before any work
  double t0 = now_seconds();
  const int64_t reused = cache_.prefill(session_, req.prompt, alive);
  res.prefill_s = now_seconds() - t0;
  if (reused < 0) {
    res.cancelled = true;
    return res;
  }
  res.cached_tokens = reused;

  engine::Sampler sampler(req.sampling, vocab);
  engine::SamplingParams gp = req.sampling;
  gp.temperature = 0.0f;
  engine::Sampler greedy(gp, vocab);
  tokenizer::StreamDecoder dec(tok_, /*skip_special=*/true);
  std::vector<int32_t> context = req.prompt, generated;
  std::vector<float> logits;
  GenEvent ev;
  auto absorb = [&](OutputDelta d) { ev.delta.append(std::move(d)); };
  auto flush_event = [&](bool force) {
    if (!force && ev.delta.empty() && ev.logprobs.empty()) return true;
    const bool ok = on_event ? on_event(ev) : true;
    ev = GenEvent{};
    return ok;
  };
  t0 = now_seconds();
  std::string finish = "length";
  for (int i = 0; i < req.max_tokens; ++i) {
    logits = session_.logits();
    const bool argmax = greedy_markup_ && parser.in_markup();
    std::vector<float> raw;
    if (req.logprobs) raw = logits;
    for (const auto& [bias_id, bias] : req.logit_bias)
      if (bias_id < vocab) logits[static_cast<size_t>(bias_id)] += bias;
    const int32_t id = (argmax ? greedy : sampler).sample(logits.data(), context, generated);
    generated.push_back(id);
    context.push_back(id);
    if (req.logprobs) {
      ev.logprobs.push_back(token_logprob(raw.data(), vocab, id, req.top_logprobs));
      res.logprobs.push_back(ev.logprobs.back());
    }
    if (std::find(req.stop_ids.begin(), req.stop_ids.end(), id) != req.stop_ids.end()) {
      finish = "stop";
      break;
    }
    if (id < tok_.vocab_size()) absorb(parser.push(dec.push(id)));
    if (parser.stopped()) {
      finish = "stop";
      break;
    }
    if (!flush_event(false) || (alive && !alive())) {
      res.cancelled = true;
      break;
    }
    if (i + 1 == req.max_tokens) break;
    session_.decode(id);
    cache_.append(id);
  }
  res.decode_s = now_seconds() - t0;
  res.completion_tokens = static_cast<int64_t>(generated.size());
  if (res.cancelled) return res;
  absorb(parser.push(dec.flush()));
  absorb(parser.finish());
  res.content = parser.content();
  res.reasoning = parser.reasoning();
  res.tool_calls = parser.tool_calls();
  if (finish == "stop" && !res.tool_calls.empty()) finish = "tool_calls";
  res.finish_reason = finish;
  if (!flush_event(false)) res.cancelled = true;
  return res;
}

}  // namespace spool::server
