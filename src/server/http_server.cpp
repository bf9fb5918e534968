#include "server/http_server.h"

#include <httplib.h>

#include <chrono>
#include <random>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "common/splitmix.h"
#include "common/sysinfo.h"
#include "server/api_error.h"
#include "server/chat_prompt.h"
#include "server/connection_probe.h"
#include "server/json_body.h"

namespace spool::server {

namespace {

json model_json(const ServingEngine& e) {
  return json{{"id", e.facts.name}, {"object", "model"}, {"created", 0}, {"owned_by", "spool"}, {"max_model_len", e.facts.ctx_size}};
}

// A LoRA adapter as a model (its name selects it: LoraAdapters::for_request), on the base.
json adapter_model_json(const ServingEngine& e, size_t id) {
  const LoraAdapters::Info& a = e.facts.lora->adapters()[id];
  return json{{"id", a.name}, {"object", "model"}, {"created", 0}, {"owned_by", "spool"}, {"max_model_len", e.facts.ctx_size},
              {"parent", e.facts.name}, {"root", a.path}, {"lora_id", id}};
}

bool equal_const_time(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

}  // namespace

HttpServer::HttpServer(HttpOptions opt) : opt_(std::move(opt)), http_(std::make_unique<httplib::Server>()), seed_state_(std::random_device{}()) {
  if (opt_.max_body_bytes == 0 || opt_.max_body_bytes > kMaxBodyBytes)
    throw UsageError(strfmt("the body limit must be in [1, %zu] bytes (got %zu)", kMaxBodyBytes, opt_.max_body_bytes));
  if (opt_.max_waiting < 0) throw UsageError(strfmt("the queue length must be >= 0 (got %d)", opt_.max_waiting));
  if (opt_.parallel < 1) throw UsageError(strfmt("--parallel must be >= 1 (got %d)", opt_.parallel));
  if (opt_.threads < opt_.max_waiting + opt_.parallel + 1)
    throw UsageError(strfmt("%d connection threads leave none for other routes with %d queued and %d running requests (need > %d)",
                            opt_.threads, opt_.max_waiting, opt_.parallel, opt_.max_waiting + opt_.parallel));
  const size_t threads = static_cast<size_t>(opt_.threads);
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  responses_ = std::make_unique<ResponsesStore>(opt_.responses_store);
  routes();
}

HttpServer::~HttpServer() {
  stop();
  engine_.reset();  // joins the engine thread while metrics_ (its on_result target) still exists
}

int HttpServer::bind() {
  const int port = opt_.port == 0 ? http_->bind_to_any_port(opt_.host) : (http_->bind_to_port(opt_.host, opt_.port) ? opt_.port : -1);
  if (port <= 0) fail("cannot listen on %s:%d (address in use or not available)", opt_.host.c_str(), opt_.port);
  return port;
}

void HttpServer::listen() {
  {
    std::lock_guard lock(run_mu_);
    if (stopping_) return;
    listen_entered_ = true;
  }
  http_->listen_after_bind();
  listen_done_ = true;
}

void HttpServer::stop() {
  {
    std::lock_guard lock(run_mu_);
    stopping_ = true;
    if (!listen_entered_) return;  // listen() will not start
  }
  // httplib's stop() acts only once its loop runs: wait for that (or for listen() to end).
  while (!http_->is_running() && !listen_done_) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  http_->stop();
}

void HttpServer::set_engine(std::unique_ptr<ServingEngine> engine) {
  if (!engine->batch) throw UsageError("the serving engine has no batch engine (parallel 0)");
  if (engine->batch->parallel() > opt_.parallel)
    throw UsageError(strfmt("the engine has %d slots but the HTTP server was sized for %d", engine->batch->parallel(), opt_.parallel));
  engine->batch->set_on_result([this](const GenResult& r) {
    metrics_.generation(r.prompt_tokens, r.cached_tokens, r.completion_tokens, r.prefill_s, r.decode_s, r.cancelled);
  });
  engine_ = std::move(engine);
  ready_ = true;
}

bool HttpServer::authorized(const httplib::Request& req) const {
  if (opt_.api_key.empty()) return true;
  const std::string h = req.get_header_value("Authorization");
  const std::string prefix = "Bearer ";
  // Anthropic's header, or OpenAI's bearer token.
  if (req.has_header("x-api-key") && equal_const_time(req.get_header_value("x-api-key"), opt_.api_key)) return true;
  return h.size() > prefix.size() && h.compare(0, prefix.size(), prefix) == 0 && equal_const_time(h.substr(prefix.size()), opt_.api_key);
}

void HttpServer::send_error(httplib::Response& res, int status, const std::string& type, const std::string& message,
                            const std::string& param) const {
  send_json(res, status, error_json(message, type, param));
}

ServingEngine& HttpServer::engine_or_503() const {
  if (!ready_) throw ApiError(503, "unavailable_error", "the model is still loading; retry when GET /health returns 200");
  return *engine_;
}

std::shared_ptr<void> HttpServer::admit() {
  if (admitted_.fetch_add(1) >= opt_.max_waiting + engine_->batch->parallel()) {
    --admitted_;
    throw ApiError(503, "server_error",
                   strfmt("the server is busy: %d requests are already waiting for the model; retry later", opt_.max_waiting));
  }
  return std::shared_ptr<void>(nullptr, [this](void*) { --admitted_; });
}

uint64_t HttpServer::next_seed() {
  std::lock_guard lock(seed_mu_);
  return splitmix64(seed_state_);
}

std::function<bool()> HttpServer::liveness(const httplib::Request& req) const {
  const std::optional<ConnectionProbe> probe = ConnectionProbe::find(req.remote_addr, req.remote_port);
  return [this, probe] { return !stopping_ && (!probe || probe->alive()); };
}

std::optional<GenResult> HttpServer::finished(const TicketReader& ticket, const std::function<bool()>& alive, httplib::Response& res) const {
  std::optional<GenResult> r = ticket.result(alive);
  if (!r) {
    if (stopping_) throw shutting_down();
    res.status = kClientClosed;
  }
  return r;
}

std::optional<GenMessage> HttpServer::next_streamed(const TicketReader& ticket, const std::function<bool()>& keep_going, const bool& writing) const {
  std::optional<GenMessage> m = ticket.next(keep_going);
  if (!m || (m->kind == GenMessage::kDone && m->result.cancelled)) {
    if (writing && stopping_) throw shutting_down();
    return std::nullopt;
  }
  return m;
}

void HttpServer::send_json(httplib::Response& res, int status, const json& j) {
  res.status = status;
  res.set_content(dump_json(j), "application/json");
}

std::string HttpServer::metrics_text() const {
  EngineGauges g;
  g.ready = ready_;
  g.rss_bytes = current_rss_bytes();
  if (ready_) {
    g.batch = engine_->batch->stats();
    g.streaming = engine_->loaded.streaming != nullptr;
    if (g.streaming) g.experts = engine_->loaded.streaming->stats();
    if (const auto& slots = engine_->loaded.expert_slots) {
      g.vram_slots = slots->slots();
      g.slots = slots->stats();
    }
    if (engine_->disk) g.disk_cache = engine_->disk->stats();
  }
  return metrics_.render(g);
}

void HttpServer::routes() {
  httplib::Server& s = *http_;
  s.set_payload_max_length(opt_.max_body_bytes);
  s.set_read_timeout(30, 0);
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (req.path == "/health" || authorized(req)) return httplib::Server::HandlerResponse::Unhandled;
    if (anthropic_route(req.path)) {
      anthropic_error(res, 401, "invalid or missing API key (send \"x-api-key: KEY\" or \"Authorization: Bearer KEY\")");
      return httplib::Server::HandlerResponse::Handled;
    }
    send_json(res, 401, error_json("invalid or missing API key (send \"Authorization: Bearer KEY\")", "authentication_error", "", "invalid_api_key"));
    return httplib::Server::HandlerResponse::Handled;
  });
  // Counted before the response is written (the logger runs after it, so a client could read
  // /metrics before its own last request was counted).
  s.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) { metrics_.request(route_label(req.path), res.status); });
  s.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    const std::string msg = res.status == 404   ? "no route for " + req.method + " " + req.path
                            : res.status == 413 ? "the request body is too large"
                                                : "the request failed (HTTP " + std::to_string(res.status) + ")";
    const int status = res.status;
    if (anthropic_route(req.path)) return anthropic_error(res, status, msg);
    send_error(res, status, status == 404 ? "not_found_error" : status >= 500 ? "server_error" : "invalid_request_error", msg);
  });
  s.set_exception_handler([this](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    if (anthropic_route(req.path)) return anthropic_exception(res, ep);
    try {
      std::rethrow_exception(ep);
    } catch (const ApiError& e) {
      send_json(res, e.status, error_json(e));
    } catch (const UsageError& e) {
      send_error(res, 400, "invalid_request_error", e.what());
    } catch (const Error& e) {
      send_error(res, 500, "server_error", e.what());
    } catch (const std::bad_alloc&) {
      send_error(res, 500, "server_error", "out of memory");
    } catch (const std::exception& e) {
      send_error(res, 500, "server_error", e.what());
    } catch (...) {
      send_error(res, 500, "server_error", "unknown error");
    }
  });

  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (ready_) send_json(res, 200, json{{"status", "ok"}});
    else send_json(res, 503, json{{"status", "loading"}});
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_text(), "text/plain; version=0.0.4");
  });
  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    const ServingEngine& e = engine_or_503();
    json data = json::array({model_json(e)});
    if (e.facts.lora)  // the LoRA adapters, by name (a request's `model` naming one selects it)
      for (size_t i = 0; i < e.facts.lora->size(); ++i) data.push_back(adapter_model_json(e, i));
    send_json(res, 200, json{{"object", "list"}, {"data", data}});
  });
  s.Get("/v1/models/(.+)", [this](const httplib::Request& req, httplib::Response& res) {
    const ServingEngine& e = engine_or_503();
    const std::string id = req.matches[1];
    if (id == e.facts.name) return send_json(res, 200, model_json(e));
    if (const int a = e.facts.lora ? e.facts.lora->find(id) : -1; a >= 0) return send_json(res, 200, adapter_model_json(e, static_cast<size_t>(a)));
    throw ApiError(404, "invalid_request_error", "The model '" + id + "' does not exist", "model");
  });
  // llama-server's LoRA routes: the adapters with their default scales; POST sets those.
  s.Get("/lora-adapters", [this](const httplib::Request&, httplib::Response& res) {
    const ServingEngine& e = engine_or_503();
    send_json(res, 200, e.facts.lora ? e.facts.lora->list_json() : json::array());
  });
  // POST routes read the body themselves: httplib's own reader answers 413 to a form-encoded
  // body over 8 KB (a limit built into the shared library), and `curl -d` sends JSON as
  // form-encoded. The body size limit (set_payload_max_length) still applies.
  auto post = [&s](const char* path, std::function<void(const httplib::Request&, const std::string&, httplib::Response&)> handler) {
    s.Post(path, [handler](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& read) {
      if (req.is_multipart_form_data()) throw bad_request("multipart bodies are not accepted; send a JSON object");
      std::string body;
      const bool complete = read([&body](const char* data, size_t n) {
        body.append(data, n);
        return true;
      });
      if (!complete) {  // too large (httplib set 413) or the connection failed
        if (res.status < 400) res.status = 400;
        return;
      }
      handler(req, body, res);
    });
  };
  post("/v1/chat/completions", [this](const httplib::Request& req, const std::string& body, httplib::Response& res) {
    handle_generation(req, body, res, true);
  });
  post("/v1/completions", [this](const httplib::Request& req, const std::string& body, httplib::Response& res) {
    handle_generation(req, body, res, false);
  });
  post("/v1/messages", [this](const httplib::Request& req, const std::string& body, httplib::Response& res) {
    handle_messages(req, body, res);
  });
  post("/v1/messages/count_tokens",
       [this](const httplib::Request&, const std::string& body, httplib::Response& res) { handle_count_tokens(body, res); });
  post("/v1/responses", [this](const httplib::Request& req, const std::string& body, httplib::Response& res) {
    handle_responses(req, body, res);
  });
  s.Get("/v1/responses/([^/]+)", [this](const httplib::Request& req, httplib::Response& res) { handle_get_response(req.matches[1], res); });
  s.Delete("/v1/responses/([^/]+)",
           [this](const httplib::Request& req, httplib::Response& res) { handle_delete_response(req.matches[1], res); });
  post("/lora-adapters", [this](const httplib::Request&, const std::string& body, httplib::Response& res) {
    handle_set_lora(body, res);
  });
  post("/tokenize", [this](const httplib::Request&, const std::string& body, httplib::Response& res) { handle_tokenize(body, res); });
  post("/detokenize", [this](const httplib::Request&, const std::string& body, httplib::Response& res) { handle_detokenize(body, res); });
  post("/apply-template",
       [this](const httplib::Request&, const std::string& body, httplib::Response& res) { handle_apply_template(body, res); });
}

void HttpServer::handle_set_lora(const std::string& body_text, httplib::Response& res) {
  ServingEngine& e = engine_or_503();
  const json body = parse_json_value(body_text);  // (the limits of every request body; any JSON value)
  if (!e.facts.lora) {
    if (!body.is_array()) throw bad_request("the body must be an array of {\"id\", \"scale\"} objects", "lora");
    if (!body.empty()) throw bad_request("the server runs no LoRA adapters (spool serve --lora FILE)", "lora");
  } else {
    e.facts.lora->set_defaults(body);
  }
  send_json(res, 200, json{{"success", true}});
}

void HttpServer::handle_tokenize(const std::string& body_text, httplib::Response& res) {
  ServingEngine& e = engine_or_503();
  json body = parse_body(body_text);
  std::optional<std::string> content = get_string(body, "content");
  if (!content) throw bad_request("'content' is required", "content");
  const bool add_special = get_bool(body, "add_special").value_or(false);
  send_json(res, 200, json{{"tokens", e.facts.tok->encode(*content, add_special)}});
}

void HttpServer::handle_detokenize(const std::string& body_text, httplib::Response& res) {
  ServingEngine& e = engine_or_503();
  json body = parse_body(body_text);
  auto it = body.find("tokens");
  if (it == body.end() || !it->is_array()) throw bad_request("'tokens' must be an array of token ids", "tokens");
  std::vector<int32_t> ids;
  for (const auto& v : *it) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= e.facts.tok->vocab_size())
      throw bad_request(strfmt("'tokens' must hold token ids in [0, %d)", e.facts.tok->vocab_size()), "tokens");
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  send_json(res, 200, json{{"content", e.facts.tok->decode(ids)}});
}

void HttpServer::handle_apply_template(const std::string& body_text, httplib::Response& res) {
  ServingEngine& e = engine_or_503();
  json body = parse_body(body_text);
  ChatPrompt p = render_chat(body, e.facts.chat, /*allow_template_override=*/true);
  send_json(res, 200, json{{"prompt", p.text}});
}

}  // namespace spool::server
