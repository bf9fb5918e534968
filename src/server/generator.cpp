#include "server/generator.h"

#include "server/chat_format.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "common/sysinfo.h"
#include "engine/perplexity.h"

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

GenStepper::GenStepper(const GenRequest& req, const tokenizer::Tokenizer& tok, int64_t vocab, bool tool_syntax_greedy)
    : req_(req),
      tok_(tok),
      vocab_(vocab),
      greedy_markup_(tool_syntax_greedy),
      parser_(req.parser),  // checks the stop strings before any work
      sampler_((req.sampling.validate(), req.sampling), vocab),
      greedy_([&] {
        engine::SamplingParams gp = req.sampling;
        gp.temperature = 0.0f;
        return gp;
      }(), vocab),
      // Family formats whose markup may be special tokens (harmony's <|channel|>, Kimi's
      // sections) decode with special tokens kept; end-of-turn tokens are stop ids anyway.
      dec_(tok, /*skip_special=*/!chat_format(req.parser.syntax).keep_special_tokens),
      context_(req.prompt) {
  for (int32_t id : req.prompt)
    if (id < 0 || id >= vocab) fail("prompt token id %d is outside the vocabulary (%lld tokens)", id, (long long)vocab);
  if (req.prompt.empty()) fail("the prompt is empty (at least one token is needed)");
  if (!req.parser.stop.empty()) stops_.emplace(req.parser.stop);
  if (req.constraint) {
    if (!req.constraint_index || req.constraint_index->vocab_size() != vocab)
      fail("constrained decoding: the request's vocabulary index does not match the model (%lld tokens)", (long long)vocab);
    constraint_.emplace(req.constraint, req.constraint_index, req.stop_ids);
  }
}

void GenStepper::push_text(const std::string& text) {
  if (stops_) stops_->push(text);
  ev_.delta.append(parser_.push(text));
}

GenEvent GenStepper::take_event() {
  GenEvent e = std::move(ev_);
  ev_ = GenEvent{};
  return e;
}

bool GenStepper::on_logits(const float* logits) {
  work_.assign(logits, logits + vocab_);
  const bool argmax = greedy_markup_ && parser_.in_markup();
  for (const auto& [bias_id, bias] : req_.logit_bias)
    if (bias_id < vocab_) work_[static_cast<size_t>(bias_id)] += bias;
  const uint64_t* allowed = nullptr;
  if (constraint_) {
    if (constraint_->fill_mask(mask_) == 0)
      fail("constrained decoding: no token of the vocabulary continues the %s here", req_.constraint->what.c_str());
    allowed = mask_.data();
  }
  const bool was_reasoning = parser_.in_reasoning();
  if (req_.reasoning_budget >= 0 && !budget_done_ && was_reasoning && reasoning_tokens_ >= req_.reasoning_budget) {
    budget_done_ = true;  // the budget ran out: end the reasoning the family's way
    forced_.assign(req_.reasoning_end.rbegin(), req_.reasoning_end.rend());
  }
  int32_t id;
  const bool forced = !forced_.empty();  // the family's reasoning closer: never a stop, even where
                                         // a token of it is an end-of-generation id (gpt-oss <|end|>)
  if (forced) {
    id = forced_.back();
    forced_.pop_back();
  } else {
    id = (argmax ? greedy_ : sampler_).sample(work_.data(), context_, generated_, allowed);
    if (was_reasoning) ++reasoning_tokens_;
  }
  if (constraint_ && !constraint_->accept(id)) fail("constrained decoding: token %d does not follow the grammar", id);
  last_ = id;
  generated_.push_back(id);
  context_.push_back(id);
  if (req_.logprobs) {
    ev_.logprobs.push_back(token_logprob(logits, vocab_, id, req_.top_logprobs));  // the unbiased distribution
    logprobs_.push_back(ev_.logprobs.back());
  }
  if (!forced && std::find(req_.stop_ids.begin(), req_.stop_ids.end(), id) != req_.stop_ids.end()) {
    finish_ = "stop";
    return false;
  }
  if (id < tok_.vocab_size()) push_text(dec_.push(id));
  if (parser_.stopped()) {
    finish_ = "stop";
    return false;
  }
  return static_cast<int64_t>(generated_.size()) < req_.max_tokens;
}

GenResult GenStepper::finish() {
  push_text(dec_.flush());
  ev_.delta.append(parser_.finish());
  GenResult res;
  res.prompt_tokens = static_cast<int64_t>(req_.prompt.size());
  res.completion_tokens = generated();
  res.content = parser_.content();
  res.reasoning = parser_.reasoning();
  res.tool_calls = parser_.tool_calls();
  res.logprobs = logprobs_;
  res.finish_reason = finish_ == "stop" && !res.tool_calls.empty() ? "tool_calls" : finish_;
  if (parser_.stopped() && stops_ && stops_->matched() >= 0) res.stop_sequence = req_.parser.stop[static_cast<size_t>(stops_->matched())];
  return res;
}

Generator::Generator(engine::Session& session, PromptCache& cache, const tokenizer::Tokenizer& tok, bool tool_syntax_greedy)
    : session_(session), cache_(cache), tok_(tok), greedy_markup_(tool_syntax_greedy) {}

GenResult Generator::run(const GenRequest& req, const std::function<bool(const GenEvent&)>& on_event, const std::function<bool()>& alive) {
  const int64_t vocab = session_.model().spec().vocab_size;
  GenStepper g(req, tok_, vocab, greedy_markup_);
  GenResult cancelled;
  cancelled.cancelled = true;
  cancelled.prompt_tokens = static_cast<int64_t>(req.prompt.size());
  double t0 = now_seconds();
  session_.set_lora(req.lora);  // this request's adapters; prefix reuse only under the same
  cache_.set_variant(lora_variant(session_.model(), req.lora));
  const int64_t reused = cache_.prefill(session_, req.prompt, alive);
  const double prefill_s = now_seconds() - t0;
  if (reused < 0) return cancelled;
  t0 = now_seconds();
  auto flush = [&](bool final) {
    GenEvent ev = g.take_event();
    if (!final && ev.delta.empty() && ev.logprobs.empty()) return true;
    return on_event ? on_event(ev) : true;
  };
  bool more = req.max_tokens > 0;
  while (more) {
    more = g.on_logits(session_.logits().data());
    if (!more) break;
    if (!flush(false) || (alive && !alive())) {
      cancelled.completion_tokens = g.generated();
      cancelled.cached_tokens = reused;
      cancelled.prefill_s = prefill_s;
      cancelled.decode_s = now_seconds() - t0;
      return cancelled;
    }
    session_.decode(g.token());
    cache_.append(g.token());
  }
  GenResult res = g.finish();
  res.cached_tokens = reused;
  res.prefill_s = prefill_s;
  res.decode_s = now_seconds() - t0;
  if (!flush(false)) res.cancelled = true;
  return res;
}

}  // namespace spool::server
