// ServingEngine: a loaded model plus everything `spool serve` runs requests with — the chat
// template and model facts requests are validated against, the optional disk cache and the
// BatchEngine (N slots, continuous batching) the HTTP server submits to. A Session with its
// own prompt cache and Generator runs requests one at a time on the calling thread (tests and
// reference runs; never while the BatchEngine has work).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/loader.h"
#include "engine/session.h"
#include "server/batch_engine.h"
#include "server/disk_cache.h"
#include "server/generator.h"
#include "server/prompt_cache.h"
#include "engine/speculative.h"
#include "server/request.h"
#include "template/chat_template.h"

namespace spool::server {

/// Settings of the serving engine (from `spool serve` flags).
struct EngineOptions {
  std::string model_name;               ///< id reported by /v1/models and in responses
  std::string chat_template_file;       ///< overrides the model's template when set
  std::string chat_format;              ///< --chat-format: a chat_format.h name; "" = detect from the template
  nlohmann::ordered_json template_kwargs;  ///< --chat-template-kwargs: an object or null
  int64_t ctx_size = 0;                 ///< 0 = the model's max_position_embeddings (4096 if unset)
  int64_t prefill_step = 512;
  bool tool_syntax_greedy = false;
  int reasoning_budget = -1;            ///< --reasoning-budget (ModelFacts::reasoning_budget)
  size_t cache_checkpoints = 16;        ///< prompt-cache GDN checkpoints in memory (0 = no reuse)
  std::string disk_cache_dir;           ///< "" = no disk cache
  double disk_cache_budget_gb = 10;
  int kv_bits = 32, max_active_experts = 0;  ///< part of the disk-cache fingerprint
  int parallel = 1;                     ///< --parallel: BatchEngine slots (0 = no BatchEngine, tests)
  engine::SpecParams spec;              ///< --spec mtp / --draft-max / --draft-vocab / --spec-min-acceptance (BatchOptions::spec)
  std::string trace_out;                ///< --trace-out: the served steps' routing trace (BatchOptions::trace); "" = none
};

/// Everything one loaded model serves with. Built by make_serving_engine(); members refer to
/// each other (facts.tok into loaded, gen into session and cache), so it is never copied or moved.
/// HTTP threads use facts (read-only) and batch (thread-safe).
struct ServingEngine {
  engine::LoadedModel loaded;           ///< model, tokenizer, checkpoint and expert streaming
  std::optional<tmpl::Template> tmpl;   ///< the parsed chat template (none: chat refuses requests)
  ModelFacts facts;                     ///< what requests are validated against
  std::unique_ptr<engine::Session> session;  ///< the one inference state
  std::unique_ptr<DiskCache> disk;      ///< --disk-cache snapshots (null without the flag)
  std::unique_ptr<PromptCache> cache;   ///< prefix reuse for `session`
  std::unique_ptr<Generator> gen;       ///< runs requests on `session` through `cache`
  std::unique_ptr<BatchEngine> batch;   ///< the serving path (null when parallel == 0); destroyed first
};

/// Builds the engine around a loaded model. Throws spool::Error when the model has no
/// tokenizer, the chat template (file or model's) does not parse, or the disk cache directory
/// cannot be used; UsageError for bad option values.
std::unique_ptr<ServingEngine> make_serving_engine(engine::LoadedModel loaded, const EngineOptions& opt);

}  // namespace spool::server
