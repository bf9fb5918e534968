// PromptCache: reuse of the previous requests' prompt prefix in one engine::Session.
//
// Attention KV caches can be cut back to any position, but Gated DeltaNet layers keep a
// recurrent state that cannot be rewound. So the prompt is prefilled in chunks of `step`
// aligned to absolute positions (0, step, 2*step, ...), and after each full chunk a KV-less
// models::StateSnapshot (the GDN states only) is kept as a checkpoint. A new prompt restores the
// nearest checkpoint at or before min(longest common prefix, prompt length - 1) (at least one
// token is always run to get logits) with State::restore, which keeps the KV rows before it, and
// prefills the rest in the same aligned chunks. The session state is only ever touched through
// State's snapshot / restore / reset / serialize interface.
// Because the restored state was computed by exactly the chunks a fresh run computes, reuse
// never changes the output (bit for bit). Checkpoints are kept only for full chunks of prefill
// (decoded tokens and partial chunks are never restored). With a DiskCache, the last checkpoint
// of each prompt is also persisted, and loaded when it reaches further than memory does.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "engine/session.h"
#include "server/disk_cache.h"

namespace spool::server {

/// The PromptCache variant of a sequence that runs `model` with LoRA user scales `scales`
/// (models::SeqStep::lora; empty = the adapters' defaults): lora::LoraSet::fingerprint, ""
/// without adapters or when every scale is 0 (the base model's states).
std::string lora_variant(const models::Model& model, const std::vector<float>& scales);

/// Prefix reuse for one Session: the tokens its state holds, state snapshots at chunk
/// boundaries, and the optional DiskCache. Not thread-safe (one per sequence, used by one thread).
class PromptCache {
 public:
  /// `step`: prefill chunk (--prefill-step-size) > 0; `max_checkpoints`: checkpoints kept
  /// in memory (0 disables reuse); `disk`: optional persistent snapshots (not owned).
  PromptCache(int64_t step, size_t max_checkpoints, DiskCache* disk);

  /// Brings `session` to the state after `prompt` (non-empty), reusing what it can, with the
  /// next-token logits in session.logits(). Returns the number of prompt tokens reused.
  /// `keep_going` is asked between chunks; when it returns false, prefill stops and
  /// spool::Error is not thrown: the return value is then -1. A failed forward rethrows after
  /// clear().
  int64_t prefill(engine::Session& session, std::span<const int32_t> prompt, const std::function<bool()>& keep_going);

  /// Stepwise prefill (the batched engine, which runs the chunks itself): brings `st` to the
  /// longest reusable prefix of `prompt` (non-empty) and returns its length `from` (a multiple
  /// of step(), below prompt.size()). The caller then runs the chunks [from, from + step),
  /// [from + step, ...) up to the prompt's end on `st`, reports each with chunk_done(), and
  /// after the last calls done() (disk snapshot). On a failure or cancellation: abort().
  int64_t begin(models::State& st, std::span<const int32_t> prompt);
  /// Records that chunk `ids` (the next one of the prompt) was run on `st` (checkpoint after a
  /// full chunk).
  void chunk_done(const models::State& st, std::span<const int32_t> ids);
  /// After the last chunk: persists the last checkpoint to the DiskCache (when there is one and
  /// it reaches further than what was loaded from it).
  void done(const models::State& st);
  /// Forgets everything and resets `st` (a cancelled or failed prefill).
  void abort(models::State& st);
  /// Prompt tokens a prefill of `prompt` under `variant` (see set_variant) could reuse from
  /// memory (longest common prefix with the tokens the state holds, capped at prompt.size() -
  /// 1; 0 under another variant); for choosing among slots.
  int64_t reusable(std::span<const int32_t> prompt, const std::string& variant = "") const;
  /// What the next prompts' states depend on besides the model (the request's LoRA adapters
  /// and scales, lora::LoraSet::fingerprint; "" = none). Another variant than the current one
  /// forgets the memory checkpoints and held tokens (a prefix computed with adapter X is never
  /// reused for Y) and keys the disk snapshots (DiskCache `variant`). Call before begin().
  void set_variant(const std::string& variant);
  const std::string& variant() const { return variant_; }
  /// The prefill chunk (checkpoint spacing).
  int64_t step() const { return step_; }

  /// Records that `id` was run by session.decode(id) after prefill().
  void append(int32_t id) { tokens_.push_back(id); }

  /// Forgets all reuse information (the next prefill starts from an empty state).
  void clear();

  /// Positions of the checkpoints held (ascending; tests and metrics).
  std::vector<int64_t> checkpoint_positions() const;
  /// Tokens the session state currently holds.
  const std::vector<int32_t>& tokens() const { return tokens_; }

 private:
  void add_checkpoint(const models::State& st);

  int64_t step_;
  size_t max_cps_;
  DiskCache* disk_;
  std::string variant_;           // set_variant
  int64_t saved_ = -1;            // position of the disk snapshot loaded or saved by this prefill
  std::vector<int32_t> tokens_;   // tokens whose effect the session state holds (state.pos == size)
  std::vector<models::StateSnapshot> cps_;  // KV-less; ascending pos, multiples of step_ <= tokens_.size()
};

}  // namespace spool::server
