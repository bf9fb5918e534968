// BatchEngine: continuous batching for `spool serve --parallel N` (llama-server's -np).
//
// N slots, each with its own models::State, PromptCache (memory checkpoints; the DiskCache is
// shared) and GenStepper (sampler and seed, stop ids and strings, logprobs, logit_bias, output
// parsing, --tool-syntax-greedy). One engine thread runs forward steps with
// Model::forward_batch; HTTP threads submit requests and read their messages from a GenTicket.
//
// Admission: requests wait in a FIFO queue (its length is bounded by the HTTP server, which
// answers 503 beyond it). Before each step, queued requests take the free slots in arrival
// order; each takes the free slot whose prompt cache reuses the most of its prompt (ties: the
// lowest slot). A request joins the running batch at the next step and leaves it when done.
//
// Schedule of one step: the next token of every decoding slot, plus the next prefill chunk of
// at most one prefilling slot (round robin among the prefilling slots). A chunk is at most
// --prefill-step-size tokens and ends at a multiple of it (or at the prompt's end), as the
// prompt cache's checkpoints require, so a prompt is computed by exactly the chunks a run
// alone computes. Decoding thus never waits behind a long prompt for more than one chunk per
// token, and a step has at most prefill_step + N - 1 token rows over N sequences (the
// workspace the engine reserves).
//
// Speculative decoding (BatchOptions::spec, --spec mtp): a decoding slot's row becomes its
// pending token plus up to draft_max drafts of the model's MTP head (greedy drafts over the
// draft vocabulary), verified in the same batched step; each verified row's logits go through
// the slot's GenStepper in order, and a draft is kept while it equals the token the stepper
// chose (so every request parameter — sampling, logit_bias, grammars, budgets, stop strings —
// applies unchanged and the output has the distribution of plain decoding; greedy output is
// identical). What was not kept is cut back (models::State::rewind_in_step). Per request, the
// drafting stops when the acceptance stays below SpecParams::min_acceptance.
//
// Cancellation: GenTicket::cancel() (the HTTP thread noticed a disconnect) removes a queued
// request at once; a running one is dropped before the next step. Failures: non-finite logits
// (or any error sampling) fail that request only; a failed forward step fails every request
// of the step (their states are poisoned) and the engine goes on with the next requests.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/speculative.h"
#include "experts/routing_trace.h"
#include "models/model.h"
#include "server/disk_cache.h"
#include "server/generator.h"
#include "server/prompt_cache.h"
#include "server/request.h"
#include "tokenizer/tokenizer.h"

namespace spool::server {

/// One message from the engine to the thread that submitted a request. A ticket receives
/// kStarted once (a slot took the request), kEvent messages (only when events were asked for),
/// then exactly one of kDone or kFailed.
struct GenMessage {
  enum Kind { kStarted, kEvent, kDone, kFailed };
  Kind kind = kStarted;
  GenEvent event;        ///< kEvent: what became known
  GenResult result;      ///< kDone
  int status = 500;      ///< kFailed: HTTP status (400 bad request values, 500 model failure, 503 shutdown)
  std::string error;     ///< kFailed: message
  /// kStarted / kDone / kFailed: the engine's event number (admissions and ends, counted in the
  /// order they happened; tests check FIFO and the slot limit with it).
  uint64_t order = 0;
};

/// A submitted request: the engine pushes messages, the submitting thread reads them.
/// Thread-safe.
class GenTicket {
 public:
  /// Waits up to `timeout_ms` for the next message; false when none came.
  bool next(GenMessage& out, int timeout_ms);
  /// True once cancel() was called.
  bool cancelled() const { return cancel_.load(); }

 private:
  friend class BatchEngine;
  void push(GenMessage m);
  std::shared_ptr<const GenRequest> req_;
  bool events_ = false;
  std::atomic<bool> cancel_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<GenMessage> q_;
};

/// Settings of the batched engine.
struct BatchOptions {
  int parallel = 1;                 ///< slots (sequences decoded together), >= 1
  int64_t prefill_step = 512;       ///< --prefill-step-size: chunk and checkpoint spacing
  int64_t ctx_size = 0;             ///< longest sequence (caps a chunk's rows in the workspace); 0 = no cap
  size_t cache_checkpoints = 16;    ///< prompt-cache memory checkpoints per slot
  DiskCache* disk = nullptr;        ///< shared by every slot (thread-safe); not owned
  bool tool_syntax_greedy = false;
  engine::SpecParams spec;          ///< --spec mtp: draft with the model's MTP head (the model must have one)
  /// --trace-out: every step's routing, its rows numbered on from the previous step's (prefill
  /// chunks, decode and draft rows as the step runs them; docs/routing-trace.md); flushed after
  /// each step. A write error is logged and ends the trace, never a request.
  std::shared_ptr<experts::TraceWriter> trace;
};

/// Counters of the engine since it started (for /metrics).
struct BatchStats {
  int slots = 0;                    ///< N
  int busy = 0;                     ///< slots running a request now
  int waiting = 0;                  ///< requests queued now (cancelled ones not counted)
  uint64_t steps = 0;               ///< forward steps run
  uint64_t step_tokens = 0;         ///< token rows over all steps
  uint64_t step_seqs = 0;           ///< sequences over all steps
  /// Steps by token rows: counts of steps with rows <= kTokenBuckets[i] (cumulative, as a
  /// Prometheus histogram); the last entry counts every step.
  static constexpr int kTokenBuckets[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
  std::vector<uint64_t> tokens_le;  ///< size(kTokenBuckets) + 1
  /// Routed-expert acquisitions the steps made (distinct experts per MoE layer and step) and
  /// those the same sequences would have made alone (distinct per layer, sequence and step):
  /// alone - batched is what sharing saved.
  uint64_t expert_acquisitions = 0, expert_acquisitions_alone = 0;
  /// Speculative decoding: verify rows run (a pending token with its drafts), drafts in them,
  /// drafts kept.
  uint64_t spec_steps = 0, spec_drafted = 0, spec_accepted = 0;
};

/// The engine thread and its slots. The model is used only by the engine thread while the
/// BatchEngine lives (other users, e.g. a Generator, must not run concurrently with it).
class BatchEngine {
 public:
  /// Starts the engine thread. Reserves the model's workspace for min(prefill_step, ctx_size)
  /// + parallel - 1 rows over `parallel` sequences (as the loader does for LoadOptions::parallel). UsageError for parallel < 1 or prefill_step < 1. Installs
  /// model.hooks.on_route (expert-sharing counters, --trace-out) in front of the one already
  /// there (which it calls first; restored at destruction).
  BatchEngine(models::Model& model, const tokenizer::Tokenizer& tok, BatchOptions opt);
  /// Fails queued and running requests with 503 and joins the thread.
  ~BatchEngine();
  BatchEngine(const BatchEngine&) = delete;
  BatchEngine& operator=(const BatchEngine&) = delete;

  /// Queues `req` (FIFO). With `events`, kEvent messages carry the output as it is generated
  /// (streaming); without, only kStarted and the final message come.
  std::shared_ptr<GenTicket> submit(std::shared_ptr<const GenRequest> req, bool events);
  /// Gives up `t`: removed from the queue if still there (no message follows), else dropped
  /// from its slot before the next step (it then gets kDone with result.cancelled).
  void cancel(const std::shared_ptr<GenTicket>& t);
  /// Called on the engine thread with every result (done, cancelled while running); set it
  /// before submitting.
  void set_on_result(std::function<void(const GenResult&)> f);
  BatchStats stats() const;
  int parallel() const { return static_cast<int>(slots_.size()); }
  /// Checkpoint positions of slot `i`'s prompt cache (tests).
  std::vector<int64_t> checkpoint_positions(int i) const;

 private:
  struct Slot;
  void loop();
  void start(Slot& s);
  void step();
  // Feeds `logits` to the slot's stepper: false when the request ended (the slot is free).
  bool after_logits(Slot& s, const float* logits);
  // Speculative decoding: the head over the slot's pending hidden rows and its drafts.
  void draft(Slot& s);
  // The head over the hidden rows of a prefill chunk whose next tokens are known.
  void head_follow_prompt(Slot& s);
  void release(Slot& s);
  void fail(Slot& s, int status, const std::string& msg);

  models::Model& model_;
  tokenizer::Tokenizer tok_;
  BatchOptions opt_;
  std::vector<std::unique_ptr<Slot>> slots_;
  size_t rr_ = 0;  // round robin among prefilling slots: first slot index to consider
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<GenTicket>> queue_;
  bool stop_ = false;
  std::function<void(const GenResult&)> on_result_;
  BatchStats stats_;
  uint64_t order_ = 0;  // last event number (under mu_)
  // Routing of the step being run: (layer, sequence index in the step, expert).
  std::atomic<bool> counting_{false};
  std::vector<int64_t> row_seq_;  // row of the step -> sequence index
  std::vector<std::tuple<int, int, int>> routes_;
  int64_t trace_row0_ = 0;  // --trace-out: trace token of the step's row 0
  std::vector<experts::TraceRecord> trace_step_;  // --trace-out: the step's records (token = row) until it succeeds
  models::RouteObserver prev_route_;  // the model's on_route before this engine's (called by it)
  bool prev_any_order_ = false;
  std::thread thread_;
};

}  // namespace spool::server
