// Speculative decoding with the model's own multi-token-prediction (MTP) head (--spec mtp):
// the head drafts the token after next from the main model's last hidden state and the token
// just sampled; one batched forward verifies the pending token and the drafts; the longest
// agreeing prefix is kept (greedy) or each draft is accepted by rejection sampling, so the
// output distribution is the plain sampler's (Leviathan et al. 2023, "Fast Inference from
// Transformers via Speculative Decoding", algorithm 1; Chen et al. 2023). What was not accepted
// is rolled back: the attention rows are left to be overwritten, the Gated DeltaNet states come
// from the step's trail (models::State::keep_step_trail / rewind_in_step).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "engine/sampler.h"
#include "models/model.h"

namespace spool::engine {

/// Speculative decoding settings (llama.cpp's names where the concept is the same).
struct SpecParams {
  bool mtp = false;  ///< --spec mtp: draft with the model's MTP head
  int draft_max = 1; ///< --draft-max: drafts per step (the head runs on its own output after the first), 1..16
  /// --draft-vocab: the head drafts only ids [0, n) (its output matrix read for those rows alone:
  /// BPE vocabularies number tokens roughly by frequency, so the first ids cover most text; the
  /// verify step keeps the output exact whatever the draft). 0 = auto (see docs/speculative.md), -1 = the whole vocabulary.
  int64_t draft_vocab = 0;
  /// Auto-off (0 = never): after `probe_steps` verify steps, and every `probe_steps` after that,
  /// speculation stops for the rest of the generation when the acceptance rate of the steps so
  /// far is below this. MtpDecoder (generate) also times it: after the first `probe_steps` verify
  /// steps it runs `probe_steps` plain steps and stops speculating when they made tokens faster
  /// (the break-even acceptance depends on the machine and the model: docs/speculative.md).
  double min_acceptance = 0.25;
  int probe_steps = 8;
  /// Throws spool::UsageError for draft_max outside 1..16, min_acceptance outside [0, 1] or
  /// probe_steps < 1.
  void validate() const;
};

/// The draft vocabulary --draft-vocab 0 (auto) gives for a vocabulary of `vocab` ids: a quarter
/// of it, at least 4096 ids (all of a smaller one). On the demo model (8256 ids) 2048 and 4096 ids
/// keep the greedy acceptance of the whole vocabulary (0.58 against 0.59) and cut the draft's
/// output product to a quarter; 1024 ids lose a tenth of it (0.50).
int64_t auto_draft_vocab(int64_t vocab);

/// What speculation did in one generation.
struct SpecStats {
  int64_t steps = 0;      ///< verify forwards (each: the pending token + its drafts)
  int64_t drafted = 0;    ///< draft tokens verified
  int64_t accepted = 0;   ///< of them accepted
  int64_t emitted = 0;    ///< tokens produced by verify steps (accepted drafts + one sampled per step)
  bool auto_off = false;  ///< speculation stopped (low acceptance, or plain steps were faster)
  double spec_tok_s = 0;  ///< tokens per second of the first probe_steps verify steps (generate's timing probe; 0 = not run)
  double plain_tok_s = 0; ///< tokens per second of the plain steps of the timing probe (0 = not run)
  double acceptance() const { return drafted > 0 ? static_cast<double>(accepted) / drafted : 0; }
  double tokens_per_step() const { return steps > 0 ? static_cast<double>(emitted) / steps : 0; }
};

/// One sequence's speculative decoder over `model` (which must have an MTP head:
/// Model::mtp_layers() > 0) and `state` (made by the model; its step trail is set to
/// draft_max). Usage: prefill(), then step() until the caller stops; each step emits one or
/// more tokens through `emit` (returning false stops the step early; the state then holds
/// every emitted token but the last, which is pending as after a plain decode's sample).
class MtpDecoder {
 public:
  MtpDecoder(models::Model& model, models::State& state, const SpecParams& params);
  /// Runs the prompt (chunks of `step` tokens) keeping every row's hidden state for the head;
  /// logits() then holds the last token's next-token logits.
  void prefill(std::span<const int32_t> ids, int64_t step);
  /// Next-token logits of the last position processed (after prefill(), or the plain decode of
  /// an auto-off step).
  std::vector<float>& logits() { return logits_; }
  /// One step from pending token `t` (sampled from logits() or the last step, already emitted,
  /// not yet run): drafts, verifies, accepts, emits the accepted drafts and one more token. The
  /// last token emitted is the next pending one (returned). `context` is the prompt + every
  /// emitted token (t included) and `generated` the emitted ones: both grow by what this step
  /// emits. `room` caps the tokens this step may emit (>= 1; the positions left in the context).
  /// After auto-off a step is one plain decode: it runs t and samples one token.
  int32_t step(int32_t t, Sampler& sampler, std::vector<int32_t>& context, std::vector<int32_t>& generated, int room,
               const std::function<bool(int32_t)>& emit, bool* stopped);
  const SpecStats& stats() const { return stats_; }

 private:
  // Runs the head over the pending hidden rows (positions [state.mtp_pos, state.pos)) with the
  // ids after them (the tail of `context`); leaves the last row's logits in q_logits_ and its
  // output hidden state in draft_h_.
  void catch_up(std::span<const int32_t> context);
  /// One drafting call of the head: rows `ids` (ids[t] at position pos0 + t + 1) from the hidden
  /// rows `hidden`, the last row's logits into q_logits_ (the draft vocabulary), every row's
  /// output into draft_h_.
  void draft_forward(std::span<const int32_t> ids, const float* hidden, int64_t pos0);

  models::Model& model_;
  models::State& state_;
  SpecParams p_;
  int64_t H_, V_;
  std::vector<float> logits_;      // [V]
  std::vector<float> hidden_;      // [rows, H]: the main model's hidden rows not yet seen by the head
  int64_t hidden_rows_ = 0;
  std::vector<float> q_logits_, draft_h_, verify_logits_, verify_h_;
  Sampler::Distribution pd_;
  std::vector<Sampler::Distribution> qd_;  // [draft_max] the drafts' distributions
  std::vector<double> residual_, q_dense_;
  SpecStats stats_;
  int64_t vocab_limit_ = 0;  // MtpStep::vocab_limit of the drafts
  // The timing probe (SpecParams::min_acceptance > 0): seconds and tokens of the first verify
  // steps, then of as many plain steps.
  double spec_s_ = 0, plain_s_ = 0;
  int64_t spec_tokens_ = 0, plain_left_ = -1, plain_tokens_ = 0;
};

}  // namespace spool::engine
