#include "engine/session.h"

#include <algorithm>

#include "common/error.h"
#include "common/sysinfo.h"

namespace spool::engine {

Session::Session(models::Model& model) : model_(model), state_(model.new_state()), logits_(model.spec().vocab_size) {}

void Session::prefill(std::span<const int32_t> ids, int64_t step) {
  if (step <= 0) throw UsageError(strfmt("prefill step size must be positive (got %lld)", (long long)step));
  for (size_t i = 0; i < ids.size(); i += static_cast<size_t>(step)) {
    const size_t n = std::min<size_t>(static_cast<size_t>(step), ids.size() - i);
    const bool last = i + n == ids.size();
    models::SeqStep q{ids.subspan(i, n), &state_, last ? models::LogitsMode::kLast : models::LogitsMode::kNone, logits_.data()};
    q.lora = lora_;
    model_.forward_batch(std::span<const models::SeqStep>(&q, 1));
  }
}

void Session::decode(int32_t id) {
  models::SeqStep q{std::span<const int32_t>(&id, 1), &state_, models::LogitsMode::kLast, logits_.data()};
  q.lora = lora_;
  model_.forward_batch(std::span<const models::SeqStep>(&q, 1));
}

GenerateResult Session::generate(const GenerateRequest& req, const std::function<bool(int32_t)>& on_token) {
  if (req.prompt.empty()) fail("the prompt is empty (at least one token is needed)");
  if (req.max_tokens < 0) throw UsageError(strfmt("max tokens must be >= 0 (got %d)", req.max_tokens));
  req.sampling.validate();
  if (req.ctx_size > 0 && static_cast<int64_t>(req.prompt.size()) > req.ctx_size)
    fail("the prompt has %zu tokens, more than the context size %lld", req.prompt.size(), (long long)req.ctx_size);
  GenerateResult res;
  state_.reset();
  Sampler sampler(req.sampling, model_.spec().vocab_size);
  if (req.spec.mtp) return generate_mtp(req, on_token, sampler);
  std::vector<int32_t> context = req.prompt;
  double t0 = now_seconds();
  prefill(req.prompt, req.prefill_step);
  res.timings.prefill_s = now_seconds() - t0;
  res.timings.prompt_tokens = static_cast<int64_t>(req.prompt.size());
  res.finish_reason = "length";
  t0 = now_seconds();
  for (int i = 0; i < req.max_tokens; ++i) {
    if (req.ctx_size > 0 && static_cast<int64_t>(context.size()) >= req.ctx_size) break;
    const int32_t id = sampler.sample(logits_.data(), context, res.output);
    res.output.push_back(id);
    context.push_back(id);
    const bool keep_going = on_token ? on_token(id) : true;
    if (std::find(req.stop_ids.begin(), req.stop_ids.end(), id) != req.stop_ids.end() || !keep_going) {
      res.finish_reason = "stop";
      break;
    }
    if (i + 1 == req.max_tokens) break;
    if (req.ctx_size > 0 && static_cast<int64_t>(context.size()) >= req.ctx_size) break;
    decode(id);
    ++res.timings.decode_forwards;
  }
  res.timings.decode_s = now_seconds() - t0;
  res.timings.decode_tokens = res.timings.decode_forwards;
  return res;
}

GenerateResult Session::generate_mtp(const GenerateRequest& req, const std::function<bool(int32_t)>& on_token, Sampler& sampler) {
  GenerateResult res;
  MtpDecoder dec(model_, state_, req.spec);
  struct TrailOff {  // the trail is freed however generation ends
    models::State& st;
    ~TrailOff() { st.keep_step_trail(0); }
  } trail_off{state_};
  std::vector<int32_t> context = req.prompt;
  double t0 = now_seconds();
  dec.prefill(req.prompt, req.prefill_step);
  res.timings.prefill_s = now_seconds() - t0;
  res.timings.prompt_tokens = static_cast<int64_t>(req.prompt.size());
  res.finish_reason = "length";
  t0 = now_seconds();
  // The same ends as generate(): a stop id or the callback ("stop"), max_tokens or ctx_size ("length").
  auto emit = [&](int32_t id) {
    const bool keep_going = on_token ? on_token(id) : true;
    if (std::find(req.stop_ids.begin(), req.stop_ids.end(), id) != req.stop_ids.end() || !keep_going) {
      res.finish_reason = "stop";
      return false;
    }
    return true;
  };
  auto room = [&] {
    int64_t r = req.max_tokens - static_cast<int64_t>(res.output.size());
    if (req.ctx_size > 0) r = std::min<int64_t>(r, req.ctx_size - static_cast<int64_t>(context.size()));
    return r;
  };
  if (req.max_tokens > 0 && (req.ctx_size == 0 || static_cast<int64_t>(context.size()) < req.ctx_size)) {
    int32_t t = sampler.sample(dec.logits().data(), context, res.output);
    res.output.push_back(t);
    context.push_back(t);
    bool stopped = !emit(t);
    while (!stopped && room() > 0) {
      t = dec.step(t, sampler, context, res.output, static_cast<int>(std::min<int64_t>(room(), 1 << 20)), emit, &stopped);
      ++res.timings.decode_forwards;
    }
  }
  res.timings.decode_s = now_seconds() - t0;
  res.timings.decode_tokens = std::max<int64_t>(0, static_cast<int64_t>(res.output.size()) - 1);
  res.spec = dec.stats();
  return res;
}

}  // namespace spool::engine
