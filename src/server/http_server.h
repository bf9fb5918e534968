// HttpServer: the OpenAI-compatible HTTP API of `spool serve` on cpp-httplib.
//
// Routes: POST /v1/chat/completions, POST /v1/completions, POST /v1/responses (JSON or SSE),
// GET / DELETE /v1/responses/{id} (stored responses, responses_store.h), GET /v1/models,
// GET /v1/models/{id} (the base model and each --lora adapter by name), GET / POST /lora-adapters
// (llama-server's: the adapters and their default scales; server/lora_adapters.h), GET /health (503 while loading), GET /metrics (Prometheus), POST /tokenize,
// /detokenize, /apply-template; the Anthropic Messages API's POST /v1/messages and
// /v1/messages/count_tokens. Every error is an OpenAI error object with a 4xx/5xx status (an
// Anthropic error object under /v1/messages); with an API key, every route but /health needs
// "Authorization: Bearer KEY" or "x-api-key: KEY" (else 401). Generation
// requests go to the engine's BatchEngine: up to N run together (--parallel), the rest wait in
// its FIFO queue (503 when max_waiting already wait); a client that disconnects (while queued
// or generating) cancels its request, and stopping the server ends queued and running ones
// with 503. The HTTP thread of a request reads its messages from a GenTicket and writes the
// JSON or SSE response itself.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "server/json_body.h"
#include "server/metrics.h"
#include "server/responses_store.h"
#include "server/serving_engine.h"
#include "server/ticket_reader.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace spool::server {

/// Largest request body accepted (413 beyond), whatever its Content-Type (a JSON body sent as
/// form-encoded by `curl -d` too).
inline constexpr size_t kMaxBodyBytes = 16u << 20;

/// Network settings.
struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8080;          ///< 0 = any free port (see bind())
  std::string api_key;      ///< "" = no authentication
  size_t max_body_bytes = kMaxBodyBytes;  ///< at most kMaxBodyBytes
  /// Generation requests waiting for the engine at most (besides the running one); more are
  /// refused at once with 503 instead of tying up a connection thread.
  int max_waiting = 32;
  /// Generation requests running at once (the engine's --parallel slots).
  int parallel = 1;
  /// Connection threads. Each queued or running generation holds one, so this must exceed
  /// max_waiting + parallel for other routes (/health, /metrics) to answer while the queue is full.
  int threads = 64;
  /// Responses kept for previous_response_id and GET /v1/responses/{id} (--responses-store;
  /// 0 keeps none). See ResponsesStore for the byte bound.
  size_t responses_store = kDefaultResponsesStore;
};

/// The HTTP server: owns the listening socket, the routes, the request queue and the metrics;
/// the engine arrives later through set_engine() (routes that need it answer 503 until then).
class HttpServer {
 public:
  /// Installs the routes; does not bind (see bind()). UsageError when `threads` is not above
  /// `max_waiting` + `parallel` or a limit is out of range.
  explicit HttpServer(HttpOptions opt);
  /// Stops the server (stop()); listen() must have returned before the object is destroyed.
  ~HttpServer();

  /// Binds the listening socket and returns the port. Throws spool::Error when it cannot.
  int bind();
  /// Serves until stop() (blocking). Requires bind().
  void listen();
  /// Stops listen() (thread-safe, also before listen() started).
  void stop();
  /// Installs the loaded engine: /health turns 200 and model routes start serving. Throws
  /// UsageError when it has no BatchEngine or more slots than HttpOptions::parallel.
  void set_engine(std::unique_ptr<ServingEngine> engine);

 private:
  void routes();
  bool authorized(const httplib::Request& req) const;
  void send_error(httplib::Response& res, int status, const std::string& type, const std::string& message,
                  const std::string& param = "") const;
  ServingEngine& engine_or_503() const;
  /// Counts a generation request in until the returned handle is destroyed; 503 when
  /// max_waiting + parallel are already in (running or queued).
  std::shared_ptr<void> admit();
  // Shared by the generation routes (completions.cpp, responses_http.cpp, anthropic_routes.cpp):
  /// The sampler seed of a request that names none: the next splitmix64 draw of the server's
  /// seed state (thread-safe).
  uint64_t next_seed();
  /// Whether a response to `req` is still worth writing: the server is not stopping and the
  /// client's connection (ConnectionProbe) is open; when the connection can't be probed, only
  /// the first holds.
  std::function<bool()> liveness(const httplib::Request& req) const;
  /// A non-streamed response's result (TicketReader::result with `alive`); nullopt when the
  /// request was cancelled, after setting res.status to kClientClosed; throws shutting_down()
  /// when the server's stop cancelled it.
  std::optional<GenResult> finished(const TicketReader& ticket, const std::function<bool()>& alive, httplib::Response& res) const;
  /// A streamed response's next message (TicketReader::next with `keep_going`); nullopt when the
  /// request ended cancelled (the stream provider then returns false); throws shutting_down()
  /// when the server's stop cancelled it while the stream still wrote (`writing`, read after
  /// the wait).
  std::optional<GenMessage> next_streamed(const TicketReader& ticket, const std::function<bool()>& keep_going, const bool& writing) const;
  /// Sets `res` to `status` with `j` as its JSON body.
  static void send_json(httplib::Response& res, int status, const json& j);
  void handle_generation(const httplib::Request& req, const std::string& body, httplib::Response& res, bool chat);
  // Anthropic Messages routes (anthropic_routes.cpp): /v1/messages and its count_tokens; on
  // these paths every error is an Anthropic error object (anthropic_error / _exception).
  void handle_messages(const httplib::Request& req, const std::string& body, httplib::Response& res);
  void handle_count_tokens(const std::string& body, httplib::Response& res);
  static bool anthropic_route(const std::string& path);
  static void anthropic_error(httplib::Response& res, int status, const std::string& message);
  static void anthropic_exception(httplib::Response& res, std::exception_ptr ep);
  void handle_responses(const httplib::Request& req, const std::string& body, httplib::Response& res);  // responses_http.cpp
  void handle_get_response(const std::string& id, httplib::Response& res);
  void handle_delete_response(const std::string& id, httplib::Response& res);
  /// POST /lora-adapters: [{"id", "scale"}] sets the default scales (LoraAdapters::set_defaults).
  void handle_set_lora(const std::string& body, httplib::Response& res);
  void handle_tokenize(const std::string& body, httplib::Response& res);
  void handle_detokenize(const std::string& body, httplib::Response& res);
  void handle_apply_template(const std::string& body, httplib::Response& res);
  std::string metrics_text() const;

  HttpOptions opt_;
  std::unique_ptr<httplib::Server> http_;
  std::unique_ptr<ServingEngine> engine_;
  std::unique_ptr<ResponsesStore> responses_;
  std::atomic<bool> ready_{false};
  std::atomic<bool> stopping_{false};
  std::mutex run_mu_;                      // orders listen() against stop()
  bool listen_entered_ = false;
  std::atomic<bool> listen_done_{false};
  std::atomic<int> admitted_{0};           // generation requests between admit() and their end
  mutable Metrics metrics_;
  std::mutex seed_mu_;
  uint64_t seed_state_;
};

}  // namespace spool::server
