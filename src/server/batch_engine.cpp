#include "server/batch_engine.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "common/error.h"
#include "common/log.h"
#include "common/sysinfo.h"
#include "plan/projection.h"

namespace spool::server {

bool GenTicket::next(GenMessage& out, int timeout_ms) {
  std::unique_lock lock(mu_);
  if (!cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return !q_.empty(); })) return false;
  out = std::move(q_.front());
  q_.pop_front();
  return true;
}

void GenTicket::push(GenMessage m) {
  {
    std::lock_guard lock(mu_);
    q_.push_back(std::move(m));
  }
  cv_.notify_all();
}

struct BatchEngine::Slot {
  explicit Slot(models::Model& m, const BatchOptions& o)
      : state(m.new_state()), cache(o.prefill_step, o.cache_checkpoints, o.disk), logits(static_cast<size_t>(m.spec().vocab_size)) {
    if (!o.spec.mtp) return;
    const size_t V = static_cast<size_t>(m.spec().vocab_size), H = static_cast<size_t>(m.spec().hidden_size);
    const size_t k = static_cast<size_t>(o.spec.draft_max);
    state.keep_step_trail(o.spec.draft_max);
    vlogits.resize((k + 1) * V);
    vhidden.resize((k + 1) * H);
    qlogits.resize(V);
  }
  models::State state;
  PromptCache cache;
  std::vector<float> logits;
  // The request running here (null: free).
  std::shared_ptr<GenTicket> ticket;
  std::optional<GenStepper> gen;
  bool started = false;   // start() ran
  int64_t fed = 0;        // prompt tokens the state holds
  int64_t cached = 0;     // of which reused
  int32_t next_id = -1;   // decoding: the token to feed next
  double t_start = 0, t_prefilled = 0;
  uint64_t admitted = 0;  // event number of the admission
  // Speculative decoding (BatchOptions::spec): the main model's hidden rows the head has not
  // seen (positions [state.mtp_pos, state.pos)), this step's row (next_id, then the drafts), the
  // verify logits and hidden rows, the head's outputs, and this request's counters.
  std::vector<float> hidden;
  int64_t hidden_rows = 0;
  std::vector<int32_t> row;
  std::vector<float> vlogits, vhidden, qlogits, qhidden;
  int64_t spec_steps = 0, drafted = 0, accepted = 0;
  bool spec_off = false;
  bool prefilling() const { return fed < static_cast<int64_t>(ticket->req_->prompt.size()); }
};

BatchEngine::BatchEngine(models::Model& model, const tokenizer::Tokenizer& tok, BatchOptions opt)
    : model_(model), tok_(tok), opt_(opt) {
  if (opt.parallel < 1) throw UsageError(strfmt("--parallel must be >= 1 (got %d)", opt.parallel));
  if (opt.prefill_step < 1) throw UsageError(strfmt("--prefill-step-size must be positive (got %lld)", (long long)opt.prefill_step));
  if (opt.spec.mtp) {
    opt.spec.validate();
    if (model.mtp_layers() == 0) spool::fail("--spec mtp: the model has no multi-token-prediction layers");
  }
  for (int i = 0; i < opt.parallel; ++i) slots_.push_back(std::make_unique<Slot>(model, opt_));
  const int64_t chunk = opt.ctx_size > 0 ? std::min(opt.prefill_step, opt.ctx_size) : opt.prefill_step;
  // A step: one chunk, and each other slot's token (with its drafts when speculating).
  const int64_t per_slot = opt.spec.mtp ? opt.spec.draft_max + 1 : 1;
  model_.reserve_workspace(plan::step_rows(chunk, opt.parallel) + (opt.parallel - 1) * (per_slot - 1), opt.parallel);
  stats_.slots = opt.parallel;
  stats_.tokens_le.assign(std::size(BatchStats::kTokenBuckets) + 1, 0);
  // The observer already installed (the loader's --expert-profile recorder) sees every row too.
  prev_route_ = model_.hooks.on_route;
  prev_any_order_ = model_.hooks.on_route_any_order;
  model_.hooks.on_route_any_order = false;
  model_.hooks.on_route = [this](int layer, int64_t row, std::span<const int> experts, std::span<const float> weights) {
    if (prev_route_) prev_route_(layer, row, experts, weights);
    if (!counting_ || row < 0 || row >= static_cast<int64_t>(row_seq_.size())) return;
    for (int e : experts) routes_.emplace_back(layer, static_cast<int>(row_seq_[static_cast<size_t>(row)]), e);
    if (opt_.trace)  // written once the step succeeded (a failed step leaves no partial token)
      trace_step_.push_back({layer, row, std::vector<int>(experts.begin(), experts.end()), std::vector<float>(weights.begin(), weights.end())});
  };
  thread_ = std::thread([this] { loop(); });
}

BatchEngine::~BatchEngine() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  model_.hooks.on_route = prev_route_;
  model_.hooks.on_route_any_order = prev_any_order_;
}

std::shared_ptr<GenTicket> BatchEngine::submit(std::shared_ptr<const GenRequest> req, bool events) {
  auto t = std::make_shared<GenTicket>();
  t->req_ = std::move(req);
  t->events_ = events;
  {
    std::lock_guard lock(mu_);
    if (stop_) {
      t->push(GenMessage{GenMessage::kFailed, {}, {}, 503, "the server is shutting down; the request was not completed"});
      return t;
    }
    queue_.push_back(t);
  }
  cv_.notify_all();
  return t;
}

void BatchEngine::cancel(const std::shared_ptr<GenTicket>& t) {
  {
    std::lock_guard lock(mu_);
    t->cancel_ = true;
    std::erase(queue_, t);
  }
  cv_.notify_all();
}

void BatchEngine::set_on_result(std::function<void(const GenResult&)> f) {
  std::lock_guard lock(mu_);
  on_result_ = std::move(f);
}

BatchStats BatchEngine::stats() const {
  std::lock_guard lock(mu_);
  BatchStats s = stats_;
  s.busy = 0;
  for (const auto& sl : slots_) s.busy += sl->ticket != nullptr;
  s.waiting = static_cast<int>(queue_.size());
  return s;
}

std::vector<int64_t> BatchEngine::checkpoint_positions(int i) const {
  std::lock_guard lock(mu_);
  return slots_.at(static_cast<size_t>(i))->cache.checkpoint_positions();
}

void BatchEngine::release(Slot& s) {
  std::lock_guard lock(mu_);
  s.gen.reset();  // refers to the ticket's request
  s.ticket.reset();
  s.started = false;
}

void BatchEngine::fail(Slot& s, int status, const std::string& msg) {
  GenMessage m{GenMessage::kFailed, {}, {}, status, msg};
  {
    std::lock_guard lock(mu_);
    m.order = ++order_;
  }
  // The slot is free before the client hears of the end (stats and metrics read after a
  // response never see the finished request as running).
  auto ticket = s.ticket;
  release(s);
  ticket->push(std::move(m));
}

void BatchEngine::loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    auto busy = [&] {
      for (const auto& s : slots_)
        if (s->ticket) return true;
      return false;
    };
    auto free_slot = [&] {
      for (const auto& s : slots_)
        if (!s->ticket) return true;
      return false;
    };
    cv_.wait(lock, [&] { return stop_ || busy() || (!queue_.empty() && free_slot()); });
    if (stop_) break;
    // Cancelled requests leave their slots (the state keeps what it holds: the prompt cache
    // stays consistent with it and serves the next request).
    for (auto& sp : slots_) {
      Slot& s = *sp;
      if (!s.ticket || !s.ticket->cancelled()) continue;
      GenResult r;
      r.cancelled = true;
      r.prompt_tokens = static_cast<int64_t>(s.ticket->req_->prompt.size());
      r.cached_tokens = s.cached;
      r.completion_tokens = s.gen ? s.gen->generated() : 0;
      const double now = now_seconds();
      r.prefill_s = (s.t_prefilled > 0 ? s.t_prefilled : now) - s.t_start;
      r.decode_s = s.t_prefilled > 0 ? now - s.t_prefilled : 0;
      if (on_result_) on_result_(r);
      auto ticket = std::move(s.ticket);
      s.gen.reset();
      s.ticket.reset();
      s.started = false;
      ticket->push(GenMessage{GenMessage::kDone, {}, r, 0, "", ++order_});
    }
    // Admission, FIFO: each takes the free slot that reuses most of its prompt.
    while (!queue_.empty()) {
      Slot* best = nullptr;
      int64_t best_reuse = -1;
      const auto& prompt = queue_.front()->req_->prompt;
      const std::string variant = lora_variant(model_, queue_.front()->req_->lora);  // (its adapters: reuse only under the same)
      for (auto& sp : slots_) {
        if (sp->ticket) continue;
        const int64_t r = sp->cache.reusable(prompt, variant);
        if (r > best_reuse) {
          best_reuse = r;
          best = sp.get();
        }
      }
      if (!best) break;
      best->ticket = std::move(queue_.front());
      best->admitted = ++order_;
      queue_.pop_front();
    }
    lock.unlock();
    for (auto& sp : slots_)
      if (sp->ticket && !sp->started) start(*sp);
    step();
    lock.lock();
  }
  // Shutting down: everything still here ends with 503.
  const GenMessage bye{GenMessage::kFailed, {}, {}, 503, "the server is shutting down; the request was not completed"};
  for (auto& t : queue_) t->push(bye);
  queue_.clear();
  for (auto& sp : slots_)
    if (sp->ticket) {
      sp->ticket->push(bye);
      sp->ticket.reset();
    }
}

void BatchEngine::start(Slot& s) {
  s.started = true;
  s.t_start = now_seconds();
  s.t_prefilled = 0;
  const GenRequest& req = *s.ticket->req_;
  try {
    s.gen.emplace(req, tok_, model_.spec().vocab_size, opt_.tool_syntax_greedy);
    s.cache.set_variant(lora_variant(model_, req.lora));  // a prefix computed with other adapters is not reused
    s.cached = s.fed = s.cache.begin(s.state, req.prompt);
    // The head continues from the reused prefix (its cache rows there are those of the run that
    // computed the prefix, or stale: drafts may then miss, the output stays exact).
    s.state.mtp_pos = s.fed;
    s.hidden_rows = 0;
    s.spec_steps = s.drafted = s.accepted = 0;
    s.spec_off = false;
  } catch (const UsageError& e) {
    fail(s, 400, e.what());
    return;
  } catch (const std::exception& e) {
    s.cache.abort(s.state);
    fail(s, 500, e.what());
    return;
  }
  GenMessage m{GenMessage::kStarted, {}, {}, 0, ""};
  m.order = s.admitted;
  s.ticket->push(std::move(m));
}

void BatchEngine::step() {
  std::vector<models::SeqStep> batch;
  std::vector<Slot*> who;
  Slot* pre = nullptr;
  int64_t pre_end = 0;
  const bool spec = opt_.spec.mtp;
  const int64_t H = model_.spec().hidden_size;
  for (auto& sp : slots_) {
    Slot& s = *sp;
    if (!s.ticket || !s.gen || s.prefilling()) continue;
    s.row.assign(1, s.next_id);
    if (spec && !s.spec_off) {
      try {
        draft(s);
      } catch (const std::exception& e) {
        s.cache.abort(s.state);
        fail(s, 500, e.what());
        continue;
      }
    }
    if (s.row.size() > 1) {  // verify: every row's logits, every row's hidden state
      s.state.arm_step_trail();
      batch.push_back({s.row, &s.state, models::LogitsMode::kAll, s.vlogits.data(), s.vhidden.data(), s.ticket->req_->lora});
    } else {
      float* h = nullptr;
      if (spec && !s.spec_off) {  // a plain step keeps its hidden row for the head
        s.hidden.resize(static_cast<size_t>((s.hidden_rows + 1) * H));
        h = s.hidden.data() + s.hidden_rows * H;
      }
      batch.push_back({s.row, &s.state, models::LogitsMode::kLast, s.logits.data(), h, s.ticket->req_->lora});
    }
    who.push_back(&s);
  }
  // One prefill chunk, round robin among the prefilling slots.
  const size_t n = slots_.size();
  for (size_t k = 0; k < n && !pre; ++k) {
    Slot& s = *slots_[(rr_ + k) % n];
    if (!s.ticket || !s.gen || !s.prefilling()) continue;
    pre = &s;
    rr_ = (rr_ + k + 1) % n;
  }
  if (pre) {
    const auto& prompt = pre->ticket->req_->prompt;
    const int64_t len = static_cast<int64_t>(prompt.size());
    pre_end = std::min(pre->fed + opt_.prefill_step, len);
    float* h = nullptr;
    if (spec) {  // the chunk's hidden rows, for the head
      pre->hidden.resize(static_cast<size_t>((pre->hidden_rows + pre_end - pre->fed) * H));
      h = pre->hidden.data() + pre->hidden_rows * H;
    }
    batch.push_back({std::span<const int32_t>(prompt.data() + pre->fed, static_cast<size_t>(pre_end - pre->fed)), &pre->state,
                     pre_end == len ? models::LogitsMode::kLast : models::LogitsMode::kNone, pre->logits.data(), h,
                     pre->ticket->req_->lora});  // (each sequence its own adapters: ops/lora.h per-row scales)
    who.push_back(pre);
  }
  if (batch.empty()) return;
  row_seq_.clear();
  for (size_t i = 0; i < batch.size(); ++i) row_seq_.insert(row_seq_.end(), batch[i].ids.size(), static_cast<int64_t>(i));
  routes_.clear();
  trace_step_.clear();
  counting_ = true;
  try {
    model_.forward_batch(batch);
  } catch (const std::exception& e) {
    counting_ = false;
    // Every state of the step is poisoned (or unchanged for a bad id): all of them fail.
    for (Slot* s : who) {
      s->cache.abort(s->state);
      fail(*s, 500, e.what());
    }
    return;
  }
  counting_ = false;
  if (opt_.trace) {
    try {
      for (const experts::TraceRecord& r : trace_step_) opt_.trace->write(r.layer, trace_row0_ + r.token, r.experts, r.weights);
      opt_.trace->flush();
      trace_row0_ += static_cast<int64_t>(row_seq_.size());
    } catch (const std::exception& e) {
      log_warn("--trace-out: %s; the routing trace ends here", e.what());
      opt_.trace.reset();
    }
  }
  {
    // Expert sharing: distinct (layer, expert) of the step vs distinct (layer, sequence, expert).
    std::sort(routes_.begin(), routes_.end());
    routes_.erase(std::unique(routes_.begin(), routes_.end()), routes_.end());
    uint64_t alone = routes_.size(), together = 0;
    for (size_t i = 0; i < routes_.size(); ++i) {
      bool seen = false;  // same (layer, expert) from an earlier sequence of this layer
      for (size_t j = i; j-- > 0 && std::get<0>(routes_[j]) == std::get<0>(routes_[i]);)
        if (std::get<2>(routes_[j]) == std::get<2>(routes_[i])) {
          seen = true;
          break;
        }
      together += !seen;
    }
    std::lock_guard lock(mu_);
    const uint64_t rows = row_seq_.size();
    ++stats_.steps;
    stats_.step_tokens += rows;
    stats_.step_seqs += batch.size();
    for (size_t b = 0; b < std::size(BatchStats::kTokenBuckets); ++b)
      if (rows <= static_cast<uint64_t>(BatchStats::kTokenBuckets[b])) ++stats_.tokens_le[b];
    ++stats_.tokens_le.back();
    stats_.expert_acquisitions += together;
    stats_.expert_acquisitions_alone += alone;
  }
  for (Slot* s : who) {
    if (s == pre) {
      const auto& prompt = s->ticket->req_->prompt;
      const int64_t n = pre_end - s->fed;
      s->cache.chunk_done(s->state, std::span<const int32_t>(prompt.data() + s->fed, static_cast<size_t>(n)));
      s->fed = pre_end;
      if (spec) {
        s->hidden_rows += n;
        try {
          head_follow_prompt(*s);
        } catch (const std::exception& e) {
          s->cache.abort(s->state);
          fail(*s, 500, e.what());
          continue;
        }
      }
      if (s->prefilling()) continue;
      try {
        s->cache.done(s->state);
      } catch (const std::exception& e) {
        log_warn("prompt cache: could not save a disk snapshot: %s", e.what());
      }
      s->t_prefilled = now_seconds();
      after_logits(*s, s->logits.data());
      continue;
    }
    s->cache.append(s->next_id);
    if (s->row.size() == 1) {
      if (spec && !s->spec_off) ++s->hidden_rows;
      after_logits(*s, s->logits.data());
      continue;
    }
    // Verify: row i's logits choose the token after row i; draft i + 1 is kept while it is that token.
    const int64_t V = model_.spec().vocab_size, k = static_cast<int64_t>(s->row.size()) - 1;
    const int64_t P = s->state.pos - (k + 1);
    int64_t a = 0;
    bool alive = true;
    for (int64_t i = 0; i <= k; ++i) {
      alive = after_logits(*s, s->vlogits.data() + i * V);
      if (!alive || i == k || s->next_id != s->row[static_cast<size_t>(i + 1)]) break;
      s->cache.append(s->row[static_cast<size_t>(i + 1)]);
      ++a;
    }
    {
      std::lock_guard lock(mu_);
      ++stats_.spec_steps;
      stats_.spec_drafted += static_cast<uint64_t>(k);
      stats_.spec_accepted += static_cast<uint64_t>(a);
    }
    // The state keeps the token and the kept drafts (what the prompt cache was told).
    if (a < k) s->state.rewind_in_step(P + 1 + a);
    if (!alive) continue;
    s->hidden.assign(s->vhidden.begin(), s->vhidden.begin() + (a + 1) * H);
    s->hidden_rows = a + 1;
    ++s->spec_steps;
    s->drafted += k;
    s->accepted += a;
    const engine::SpecParams& sp = opt_.spec;
    if (sp.min_acceptance > 0 && s->spec_steps % sp.probe_steps == 0 &&
        static_cast<double>(s->accepted) < sp.min_acceptance * static_cast<double>(s->drafted))
      s->spec_off = true;
  }
}

void BatchEngine::head_follow_prompt(Slot& s) {
  // Rows whose next token is known: all but the prompt's last while it is the last chunk.
  const auto& prompt = s.ticket->req_->prompt;
  const int64_t H = model_.spec().hidden_size;
  const int64_t rows = s.prefilling() ? s.hidden_rows : s.hidden_rows - 1;
  if (rows <= 0) return;
  const int64_t p0 = s.state.mtp_pos;
  models::MtpStep m;
  m.ids = std::span<const int32_t>(prompt.data() + p0 + 1, static_cast<size_t>(rows));
  m.hidden = s.hidden.data();
  m.state = &s.state;
  m.pos0 = p0;
  m.mode = models::LogitsMode::kNone;
  m.lora = s.ticket->req_->lora;
  model_.mtp_forward(m);
  s.state.mtp_pos = p0 + rows;
  std::copy(s.hidden.begin() + rows * H, s.hidden.begin() + s.hidden_rows * H, s.hidden.begin());
  s.hidden_rows -= rows;
}

void BatchEngine::draft(Slot& s) {
  const GenRequest& req = *s.ticket->req_;
  const int64_t left = static_cast<int64_t>(req.max_tokens) - s.gen->generated();  // tokens this request may still emit
  const int64_t k = std::min<int64_t>(opt_.spec.draft_max, left - 1);
  const int64_t P = s.state.pos, p0 = s.state.mtp_pos, H = model_.spec().hidden_size, V = model_.spec().vocab_size;
  if (k <= 0 || s.hidden_rows != P - p0 || s.hidden_rows == 0) return;
  // The head over the pending rows: ids at positions p0 + 1 .. P (the state's tokens, then next_id).
  const std::vector<int32_t>& held = s.cache.tokens();
  std::vector<int32_t> ids(held.begin() + p0 + 1, held.begin() + P);
  ids.push_back(s.next_id);
  s.qhidden.resize(static_cast<size_t>(s.hidden_rows * H));
  const int64_t vocab = opt_.spec.draft_vocab < 0 ? 0
                        : opt_.spec.draft_vocab > 0 ? std::min(opt_.spec.draft_vocab, V)
                                                    : engine::auto_draft_vocab(V);
  models::MtpStep m;
  m.ids = ids;
  m.hidden = s.hidden.data();
  m.state = &s.state;
  m.pos0 = p0;
  m.mode = models::LogitsMode::kLast;
  m.logits = s.qlogits.data();
  m.hidden_out = s.qhidden.data();
  m.vocab_limit = vocab;
  m.lora = req.lora;
  model_.mtp_forward(m);
  s.hidden_rows = 0;
  std::copy(s.qhidden.end() - H, s.qhidden.end(), s.qhidden.begin());
  // Greedy drafts (the stepper decides what is kept), further ones from the head's own output.
  auto best = [&] { return static_cast<int32_t>(std::max_element(s.qlogits.begin(), s.qlogits.end()) - s.qlogits.begin()); };
  s.row.push_back(best());
  for (int64_t j = 1; j < k; ++j) {
    models::MtpStep c = m;
    c.ids = std::span<const int32_t>(&s.row.back(), 1);
    c.hidden = s.qhidden.data();
    c.pos0 = P + j - 1;
    model_.mtp_forward(c);
    s.row.push_back(best());
  }
  s.state.mtp_pos = P;  // rows from P on are the drafts' (overwritten by the next catch-up)
}

bool BatchEngine::after_logits(Slot& s, const float* logits) {
  GenStepper& g = *s.gen;
  bool more = false;
  try {
    more = s.ticket->req_->max_tokens > 0 && g.on_logits(logits);
  } catch (const std::exception& e) {
    fail(s, 500, e.what());  // non-finite logits: this request only
    return false;
  }
  if (more) {
    s.next_id = g.token();
    if (s.ticket->events_) {
      GenEvent ev = g.take_event();
      if (!ev.delta.empty() || !ev.logprobs.empty()) s.ticket->push(GenMessage{GenMessage::kEvent, std::move(ev), {}, 0, ""});
    }
    return true;
  }
  GenResult r = g.finish();
  r.cached_tokens = s.cached;
  r.prefill_s = s.t_prefilled - s.t_start;
  r.decode_s = now_seconds() - s.t_prefilled;
  if (s.ticket->events_) {
    GenEvent ev = g.take_event();
    if (!ev.delta.empty() || !ev.logprobs.empty()) s.ticket->push(GenMessage{GenMessage::kEvent, std::move(ev), {}, 0, ""});
  }
  GenMessage m{GenMessage::kDone, {}, {}, 0, ""};
  {
    std::lock_guard lock(mu_);
    if (on_result_) on_result_(r);
    m.order = ++order_;
  }
  m.result = std::move(r);
  auto ticket = s.ticket;  // the slot is free before the client hears of the end (see fail())
  release(s);
  ticket->push(std::move(m));
  return false;
}

}  // namespace spool::server
