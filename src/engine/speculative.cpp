#include "engine/speculative.h"

#include <algorithm>

#include "common/error.h"
#include "common/sysinfo.h"

namespace spool::engine {

int64_t auto_draft_vocab(int64_t vocab) {
  // A quarter of the vocabulary (at least 4096 ids), in whole 256-row blocks.
  const int64_t q = std::max<int64_t>(4096, (vocab / 4 + 255) / 256 * 256);
  return std::min(vocab, q);
}

void SpecParams::validate() const {
  if (draft_max < 1 || draft_max > 16) throw UsageError(strfmt("--draft-max must be 1..16 (got %d)", draft_max));
  if (!(min_acceptance >= 0 && min_acceptance <= 1))
    throw UsageError(strfmt("--spec-min-acceptance must be in [0, 1] (got %g)", min_acceptance));
  if (draft_vocab < -1) throw UsageError(strfmt("--draft-vocab must be >= 1, 0 (auto) or -1 (the whole vocabulary) (got %lld)", (long long)draft_vocab));
  if (probe_steps < 1) throw UsageError(strfmt("the auto-off probe must be at least one step (got %d)", probe_steps));
}

MtpDecoder::MtpDecoder(models::Model& model, models::State& state, const SpecParams& params)
    : model_(model), state_(state), p_(params), H_(model.spec().hidden_size), V_(model.spec().vocab_size) {
  p_.validate();
  if (model.mtp_layers() == 0)
    fail("--spec mtp: the model has no multi-token-prediction layers (config mtp_num_hidden_layers / num_nextn_predict_layers)");
  state_.keep_step_trail(p_.draft_max);
  vocab_limit_ = p_.draft_vocab < 0 ? 0 : p_.draft_vocab > 0 ? std::min(p_.draft_vocab, V_) : auto_draft_vocab(V_);
  logits_.resize(static_cast<size_t>(V_));
  q_logits_.resize(static_cast<size_t>(V_));
  verify_logits_.resize(static_cast<size_t>((p_.draft_max + 1) * V_));
  verify_h_.resize(static_cast<size_t>((p_.draft_max + 1) * H_));
  qd_.resize(static_cast<size_t>(p_.draft_max));
}

void MtpDecoder::prefill(std::span<const int32_t> ids, int64_t step) {
  if (step <= 0) throw UsageError(strfmt("prefill step size must be positive (got %lld)", (long long)step));
  hidden_rows_ = 0;
  for (size_t i = 0; i < ids.size(); i += static_cast<size_t>(step)) {
    const size_t n = std::min<size_t>(static_cast<size_t>(step), ids.size() - i);
    const bool last = i + n == ids.size();
    hidden_.resize(static_cast<size_t>((hidden_rows_ + static_cast<int64_t>(n)) * H_));
    const models::SeqStep s{ids.subspan(i, n), &state_, last ? models::LogitsMode::kLast : models::LogitsMode::kNone,
                            logits_.data(), hidden_.data() + hidden_rows_ * H_};
    model_.forward_batch(std::span<const models::SeqStep>(&s, 1));
    hidden_rows_ += static_cast<int64_t>(n);
    // The head sees every row whose next token is known: all but the prompt's last.
    const int64_t rows = last ? hidden_rows_ - 1 : hidden_rows_;
    if (rows > 0) {
      const int64_t p0 = state_.mtp_pos;
      models::MtpStep m;
      m.ids = ids.subspan(static_cast<size_t>(p0 + 1), static_cast<size_t>(rows));
      m.hidden = hidden_.data();
      m.state = &state_;
      m.pos0 = p0;
      m.mode = models::LogitsMode::kNone;
      model_.mtp_forward(m);
      state_.mtp_pos = p0 + rows;
      std::copy(hidden_.begin() + rows * H_, hidden_.begin() + hidden_rows_ * H_, hidden_.begin());
      hidden_rows_ -= rows;
    }
  }
}

void MtpDecoder::catch_up(std::span<const int32_t> context) {
  const int64_t p0 = state_.mtp_pos, P = state_.pos;
  if (P - p0 != hidden_rows_ || static_cast<int64_t>(context.size()) != P + 1)
    fail("speculative decoding: the head is out of step (%lld rows pending for positions %lld..%lld)", (long long)hidden_rows_,
         (long long)p0, (long long)P);
  draft_h_.resize(static_cast<size_t>(hidden_rows_ * H_));
  draft_forward(context.subspan(static_cast<size_t>(p0 + 1), static_cast<size_t>(hidden_rows_)), hidden_.data(), p0);
  state_.mtp_pos = P;
  // The last row's output drafts further (draft_max > 1).
  std::copy(draft_h_.end() - H_, draft_h_.end(), draft_h_.begin());
  hidden_rows_ = 0;
}

void MtpDecoder::draft_forward(std::span<const int32_t> ids, const float* hidden, int64_t pos0) {
  models::MtpStep m;
  m.ids = ids;
  m.hidden = hidden;
  m.state = &state_;
  m.pos0 = pos0;
  m.mode = models::LogitsMode::kLast;
  m.logits = q_logits_.data();
  m.hidden_out = draft_h_.data();
  m.vocab_limit = vocab_limit_;
  model_.mtp_forward(m);
}

int32_t MtpDecoder::step(int32_t t, Sampler& sampler, std::vector<int32_t>& context, std::vector<int32_t>& generated, int room,
                         const std::function<bool(int32_t)>& emit, bool* stopped) {
  *stopped = false;
  const int k = std::min(p_.draft_max, room - 1);
  const double t0 = now_seconds();
  const bool probing = plain_left_ > 0;  // a plain step of the timing probe
  if (stats_.auto_off || k <= 0 || probing) {
    // A plain decode step (keeping the hidden row for the head unless speculation is off).
    hidden_.resize(static_cast<size_t>((hidden_rows_ + 1) * H_));
    const models::SeqStep s{std::span<const int32_t>(&t, 1), &state_, models::LogitsMode::kLast, logits_.data(),
                            stats_.auto_off ? nullptr : hidden_.data() + hidden_rows_ * H_};
    model_.forward_batch(std::span<const models::SeqStep>(&s, 1));
    if (!stats_.auto_off) ++hidden_rows_;
    const int32_t id = sampler.sample(logits_.data(), context, generated);
    context.push_back(id);
    generated.push_back(id);
    if (probing) {
      plain_s_ += now_seconds() - t0;
      ++plain_tokens_;
      if (--plain_left_ == 0) {  // the probe's verdict: the faster way on, for the rest
        stats_.spec_tok_s = spec_s_ > 0 ? spec_tokens_ / spec_s_ : 0;
        stats_.plain_tok_s = plain_s_ > 0 ? plain_tokens_ / plain_s_ : 0;
        if (stats_.plain_tok_s > stats_.spec_tok_s) stats_.auto_off = true;
      }
    }
    *stopped = !emit(id);
    return id;
  }
  const int64_t P = state_.pos;
  catch_up(context);
  // Drafts: d_1 from the head's last row; d_j (j > 1) from the head run on d_{j-1} and its own
  // output (positions P, P + 1, ... of its cache: overwritten by the next catch-up).
  std::vector<int32_t> ids(static_cast<size_t>(k + 1));
  ids[0] = t;
  std::vector<int32_t> ctx = context, gen = generated;
  for (int j = 0; j < k; ++j) {
    if (j > 0) {
      draft_forward(std::span<const int32_t>(&ids[static_cast<size_t>(j)], 1), draft_h_.data(), P + j - 1);
    }
    sampler.distribution(q_logits_.data(), ctx, gen, qd_[static_cast<size_t>(j)]);
    const int32_t d = sampler.draw(qd_[static_cast<size_t>(j)]);
    ids[static_cast<size_t>(j + 1)] = d;
    ctx.push_back(d);
    gen.push_back(d);
  }
  state_.mtp_pos = P;  // the chained rows are speculative
  // Verify t and the drafts in one forward: row i's logits judge draft i + 1.
  const models::SeqStep s{ids, &state_, models::LogitsMode::kAll, verify_logits_.data(), verify_h_.data()};
  state_.arm_step_trail();
  model_.forward_batch(std::span<const models::SeqStep>(&s, 1));
  ++stats_.steps;
  stats_.drafted += k;
  int a = 0;
  int32_t next = -1;
  for (int i = 0; i < k; ++i) {
    const int32_t d = ids[static_cast<size_t>(i + 1)];
    sampler.distribution(verify_logits_.data() + i * V_, context, generated, pd_);
    const double pd = pd_.p(d), qd = qd_[static_cast<size_t>(i)].p(d);
    // Accept with probability min(1, p(d) / q(d)) (no random number when it is 1: greedy).
    const bool ok = pd >= qd || (pd > 0 && sampler.uniform() * qd < pd);
    if (!ok) {
      // Rejected: sample from the residual max(0, p - q), normalised (q spread over the vocabulary
      // once: O(V), not a search per candidate).
      const Sampler::Distribution& q = qd_[static_cast<size_t>(i)];
      q_dense_.assign(static_cast<size_t>(V_), 0.0);
      for (size_t c = 0; c < q.ids.size(); ++c) q_dense_[static_cast<size_t>(q.ids[c])] = q.prob[c] / q.total;
      residual_.assign(pd_.ids.size(), 0.0);
      double total = 0;
      for (size_t c = 0; c < pd_.ids.size(); ++c) {
        residual_[c] = std::max(0.0, pd_.prob[c] / pd_.total - q_dense_[static_cast<size_t>(pd_.ids[c])]);
        total += residual_[c];
      }
      if (total > 0) {
        pd_.prob = residual_;
        pd_.total = total;
      }
      next = sampler.draw(pd_);
      break;
    }
    ++a;
    context.push_back(d);
    generated.push_back(d);
    ++stats_.accepted;
    ++stats_.emitted;
    if (!emit(d)) {  // stopped on an accepted draft: it is the pending token
      state_.rewind_in_step(P + a);
      hidden_.assign(verify_h_.begin(), verify_h_.begin() + a * H_);
      hidden_rows_ = a;
      *stopped = true;
      return d;
    }
  }
  if (next < 0) {  // every draft accepted: one more token from the last row
    sampler.distribution(verify_logits_.data() + k * V_, context, generated, pd_);
    next = sampler.draw(pd_);
  }
  if (a < k) state_.rewind_in_step(P + 1 + a);
  hidden_.assign(verify_h_.begin(), verify_h_.begin() + (a + 1) * H_);
  hidden_rows_ = a + 1;
  context.push_back(next);
  generated.push_back(next);
  ++stats_.emitted;
  if (p_.min_acceptance > 0) {
    if (stats_.steps % p_.probe_steps == 0 && stats_.acceptance() < p_.min_acceptance) stats_.auto_off = true;
    if (plain_left_ < 0) {  // the timing probe's speculative half
      spec_s_ += now_seconds() - t0;
      spec_tokens_ += a + 1;
      if (stats_.steps == p_.probe_steps) plain_left_ = p_.probe_steps;
    }
  }
  *stopped = !emit(next);
  return next;
}

}  // namespace spool::engine
