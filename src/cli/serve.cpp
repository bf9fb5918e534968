// spool serve: the OpenAI-compatible HTTP server (src/server/http_server.h). The socket is
// bound first (so a busy port fails at once and /health answers 503 while the model loads),
// then the model is loaded and the server turns ready. SIGINT / SIGTERM stop it (an --expert-profile
// is written then, and every 60 s while it serves).
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <algorithm>
#include <array>
#include <exception>
#include <filesystem>
#include <optional>
#include <thread>

#include "cli/common.h"
#include "common/error.h"
#include "dist/comm.h"
#include "dist/expert_parallel.h"
#include "common/files.h"
#include "common/log.h"
#include "server/chat_format.h"
#include "server/http_server.h"
#include "server/serving_engine.h"

namespace spool::cli {

namespace {

// How often a running server writes its --expert-profile (when tokens were served since).
constexpr double kProfileSaveSeconds = 60;

struct ServeOptions {
  ModelOptions model;
  std::string host = "127.0.0.1";
  int port = 8080;
  int64_t ctx_size = 0;
  int64_t prefill_step = 512;
  int parallel = 1;
  bool tool_syntax_greedy = false;
  int reasoning_budget = -1;
  std::string disk_cache;
  double disk_cache_budget_gb = 10;
  size_t cache_checkpoints = 16;
  std::string api_key;
  std::string chat_template_file;
  std::string chat_template_kwargs;
  std::string chat_format;
  size_t responses_store = server::kDefaultResponsesStore;
  std::string trace_out;  // --trace-out
};

// Under mpirun with several ranks (docs/distributed.md#serving-over-ranks): a start-up step that
// may fail on one rank alone (binding the port, loading the model) ends with this agreement, so
// every rank leaves together instead of some waiting in a collective for one that has gone.
// Called once per rank; throws spool::Error on the ranks that did not fail when another did.
void agree_started(bool failed) {
  float f = failed ? 1.0f : 0.0f;
  dist::world().allreduce_sum(&f, 1);
  if (!failed && f > 0) fail("%g other rank(s) of this mpirun failed to start serving (see their log lines)", static_cast<double>(f));
}

// Rank 0 of a serve over ranks: when destroyed (after the server and its engine are gone, so no
// model step runs any more), tells the following ranks to leave their loop, with exit status 1
// when the server is ending on an error.
struct StopFollowers {
  ~StopFollowers() {
    dist::ExpertStep st;
    st.op = dist::StepOp::kExit;
    st.code = std::uncaught_exceptions() > 0 ? 1 : 0;
    try {
      std::array<int64_t, dist::ExpertStep::kWords> w = st.encode();
      dist::world().broadcast_idle(w.data(), sizeof(w), 0);
    } catch (const std::exception& e) {
      log_warn("serve: telling the other ranks to stop failed (%s): ending every rank", e.what());
      dist::world().abort(1);
    }
  }
};

// A following rank (1 .. N-1) of `mpirun -n N spool serve`: loads the same model with the same
// options (holding its own share of the experts), then runs its experts' rows of every MoE layer
// rank 0 announces until rank 0 says stop (Model::serve_experts). SIGINT / SIGTERM (which mpirun
// forwards to every rank) are left to rank 0, which stops the server and then this loop.
void follow(const engine::LoadOptions& lo) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::optional<engine::LoadedModel> loaded;
  try {
    loaded.emplace(engine::load(lo));
  } catch (...) {
    agree_started(true);
    throw;
  }
  agree_started(false);
  int code = 0;
  try {
    code = loaded->model->serve_experts();
  } catch (const std::exception& e) {  // the ranks are out of step: nothing can go on
    log_warn("serve: rank %d cannot follow rank 0 (%s): ending every rank", dist::world().rank(), e.what());
    dist::world().abort(1);
  }
  if (code != 0) fail("rank 0 stopped serving on an error (exit status %d; see its log)", code);
}

void run(const ServeOptions& o) {
  // Everything that can be checked before loading (the same on every rank under mpirun).
  const bool ranks = dist::launched_by_mpi();
  if (o.port < 0 || o.port > 65535) throw UsageError(strfmt("--port must be in [0, 65535] (got %d)", o.port));
  if (o.ctx_size < 0) throw UsageError(strfmt("--ctx-size must be >= 0 (got %lld)", (long long)o.ctx_size));
  if (o.prefill_step <= 0) throw UsageError(strfmt("--prefill-step-size must be positive (got %lld)", (long long)o.prefill_step));
  if (o.reasoning_budget < -1) throw UsageError(strfmt("--reasoning-budget must be -1 (unlimited) or >= 0 (got %d)", o.reasoning_budget));
  if (o.parallel < 1 || o.parallel > 256) throw UsageError(strfmt("--parallel must be between 1 and 256 (got %d)", o.parallel));
  if (!(o.disk_cache_budget_gb > 0)) throw UsageError(strfmt("--disk-cache-budget-gb must be > 0 (got %g)", o.disk_cache_budget_gb));
  server::EngineOptions eo;
  if (!o.chat_template_kwargs.empty()) {
    eo.template_kwargs = nlohmann::ordered_json::parse(o.chat_template_kwargs, nullptr, /*allow_exceptions=*/false);
    if (!eo.template_kwargs.is_object()) throw UsageError("--chat-template-kwargs must be a JSON object, e.g. '{\"enable_thinking\": false}'");
  }
  if (!o.chat_template_file.empty()) read_whole_file(o.chat_template_file);  // exists and is readable
  engine::LoadOptions lo = o.model.load_options();
  const std::string dir = lo.model_dir;
  eo.model_name = std::filesystem::path(dir).filename().string();
  if (eo.model_name.empty()) eo.model_name = std::filesystem::path(dir).parent_path().filename().string();
  eo.chat_template_file = o.chat_template_file;
  if (!o.chat_format.empty() && server::find_chat_format(o.chat_format) == nullptr)
    throw UsageError("--chat-format: unknown format '" + o.chat_format + "'");
  eo.chat_format = o.chat_format;
  eo.ctx_size = o.ctx_size;
  eo.prefill_step = o.prefill_step;
  eo.parallel = o.parallel;
  eo.tool_syntax_greedy = o.tool_syntax_greedy;
  eo.reasoning_budget = o.reasoning_budget;
  eo.cache_checkpoints = o.cache_checkpoints;
  eo.disk_cache_dir = o.disk_cache;
  eo.disk_cache_budget_gb = o.disk_cache_budget_gb;
  eo.kv_bits = lo.kv_bits;
  eo.max_active_experts = lo.max_active_experts;
  eo.spec = o.model.spec_params();
  eo.trace_out = o.trace_out;
  // The loader keeps the KV cache of the whole context out of the expert-cache budget: give it the
  // context requests may use (the model's max_position_embeddings unless --ctx-size says).
  // The prompt cache's memory checkpoints each copy the whole Gated DeltaNet state: keep them
  // out of the budget too (each slot has its own). Each slot's KV/state at the whole context
  // and the workspace of a batched step come out of it as well (LoadOptions::parallel).
  lo.state_copies = static_cast<int64_t>(o.cache_checkpoints) * o.parallel;
  lo.parallel = o.parallel;
  lo.prefill_step = o.prefill_step;
  if (o.ctx_size > 0) {
    lo.ctx_size = o.ctx_size;
  } else {
    auto cfg = nlohmann::json::parse(read_whole_file(dir + "/config.json"), nullptr, /*allow_exceptions=*/false);
    const auto& text = cfg.is_object() && cfg.contains("text_config") ? cfg["text_config"] : cfg;
    if (text.is_object() && text.contains("max_position_embeddings") && text["max_position_embeddings"].is_number_unsigned())
      lo.ctx_size = text["max_position_embeddings"].get<int64_t>();
  }

  if (ranks && !dist::world().serialized())
    fail("serve over MPI ranks needs an MPI library with MPI_THREAD_SERIALIZED (this one gives less); generate, bench and "
         "perplexity run over ranks with it");
  lo.expert_lead = ranks;
  if (ranks && dist::world().rank() > 0) {
    follow(lo);
    return;
  }

  // Signals go to one thread that stops the server.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  server::HttpOptions ho;
  ho.host = o.host;
  ho.port = o.port;
  ho.api_key = o.api_key;
  ho.parallel = o.parallel;
  ho.responses_store = o.responses_store;
  ho.threads = std::max(ho.threads, ho.max_waiting + o.parallel + 8);
  // --expert-profile: saved every kProfileSaveSeconds while traffic comes, and once more when the
  // server stops (declared before `http`: destroyed after it, so after the last step has run).
  std::optional<experts::ProfileSaver> profile_saver;
  // Over ranks: once every rank has started, the followers are told to stop when this run ends
  // (declared before `http`: after the engine's last step).
  std::optional<StopFollowers> stop_followers;
  server::HttpServer http(ho);
  int port = 0;
  try {
    port = http.bind();
  } catch (...) {
    if (ranks) agree_started(true);
    throw;
  }
  // The signal thread is joined before `http` goes away: when run() ends for another reason
  // (a load error), it is woken with SIGUSR1 sent to it alone and exits without touching `http`.
  sigaddset(&set, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread signals([&http, set] {
    int sig = 0;
    sigwait(&set, &sig);
    if (sig == SIGUSR1) return;
    log_info("signal %d: stopping", sig);
    http.stop();
  });
  struct JoinSignals {
    std::thread& t;
    ~JoinSignals() {
      pthread_kill(t.native_handle(), SIGUSR1);
      t.join();
    }
  } join_signals{signals};
  std::thread listener([&http] { http.listen(); });
  std::fprintf(stderr, "spool: listening on http://%s:%d (loading %s)\n", o.host.c_str(), port, dir.c_str());
  bool agreed = false;
  try {
    engine::LoadedModel loaded = engine::load(lo);
    if (ranks) {
      agreed = true;
      agree_started(false);
      stop_followers.emplace();
    }
    if (loaded.profile) profile_saver.emplace(loaded.profile, loaded.profile_path, kProfileSaveSeconds);
    auto e = server::make_serving_engine(std::move(loaded), eo);
    std::fprintf(stderr, "spool: ready: model %s, context %lld, %d slot(s), load %.2f s\n", eo.model_name.c_str(),
                 (long long)e->facts.ctx_size, o.parallel,
                 e->loaded.load_s);
    http.set_engine(std::move(e));
  } catch (...) {
    if (ranks && !agreed) agree_started(true);
    http.stop();
    listener.join();
    throw;
  }
  listener.join();
}

}  // namespace

void register_serve(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* c = app.add_subcommand("serve", "OpenAI-compatible HTTP server (chat/completions, tools, streaming, prompt cache)");
  o->model.add_to(c);
  o->model.add_lora_to(c, /*server=*/true);
  o->model.add_spec_to(c);
  o->model.add_warm_start_to(c);
  c->add_option("--host", o->host, "Address to listen on (default 127.0.0.1)");
  c->add_option("--port", o->port, "Port (default 8080; 0 = any free port, printed at start)");
  c->add_option("--ctx-size", o->ctx_size, "Prompt + output tokens per request at most (default: the model's max_position_embeddings)");
  c->add_option("--prefill-step-size", o->prefill_step, "Prompt tokens per forward pass; also the prompt-cache checkpoint spacing (default 512)");
  c->add_option("--parallel", o->parallel,
                 "Requests decoded together (slots, continuous batching; llama-server's -np, also accepted). Each slot holds its own "
                 "KV cache and state at --ctx-size; more wait in the queue (default 1)");
  c->add_option("--reasoning-budget", o->reasoning_budget,
                "Reasoning tokens per chat request before the server ends the reasoning with the family's closer "
                "(-1 unlimited, the default; 0 ends it at once); a request's thinking_budget_tokens overrides it");
  c->add_flag("--tool-syntax-greedy", o->tool_syntax_greedy, "Choose tokens by argmax inside tool-call markup (tags, keys, punctuation)");
  c->add_option("--disk-cache", o->disk_cache, "Directory for prompt-prefix snapshots kept across restarts");
  c->add_option("--disk-cache-budget-gb", o->disk_cache_budget_gb, "Disk cache size limit in GB; least recently used snapshots go first (default 10)");
  c->add_option("--prompt-cache-checkpoints", o->cache_checkpoints,
                "Prompt-cache state checkpoints kept in memory (default 16; 0 = no prefix reuse)");
  c->add_option("--api-key", o->api_key, "Require \"Authorization: Bearer KEY\" on every route but /health");
  c->add_option("--chat-template-file", o->chat_template_file, "Jinja chat template to use instead of the model's");
  c->add_option("--chat-format", o->chat_format,
                "Output format for reasoning and tool calls (qwen3_json, qwen3_xml, deepseek_v3, kimi_k2, glm4_5, minimax_m2, gpt_oss, "
                "mistral, ernie4_5, gemma4, none; default: detected from the chat template)");
  c->add_option("--chat-template-kwargs", o->chat_template_kwargs, "JSON object of template variables, e.g. '{\"enable_thinking\": false}'");
  c->add_option("--responses-store", o->responses_store,
                strfmt("/v1/responses kept in memory for previous_response_id and GET /v1/responses/{id}, least recently used "
                       "dropped first (default %zu; 0 = none; at most %zu MiB of JSON in all)",
                       server::kDefaultResponsesStore, server::kResponsesStoreMaxBytes >> 20));
  c->add_option("--trace-out", o->trace_out,
                "Record the routing of every served step here (JSON lines, docs/routing-trace.md; rows of the steps in the order "
                "they ran: prefill chunks, decode tokens); replay with spool bench --routing-trace, plan with spool plan --trace");
  c->callback([o] { run(*o); });
}

}  // namespace spool::cli
