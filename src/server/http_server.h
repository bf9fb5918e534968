// HttpServer: the OpenAI-compatible HTTP API of `spool serve` on cpp-httplib.
//
// Routes: POST /v1/chat/completions, POST /v1/completions (JSON or SSE), GET /v1/models,
// GET /health (503 while loading), GET /metrics (Prometheus), POST /tokenize, /detokenize,
// /apply-template. Every error is an OpenAI error object with a 4xx/5xx status; with an API
// key, every route but /health needs "Authorization: Bearer KEY" (else 401). Generation
// requests wait in a FIFO queue and run one at a time; a client that disconnects (while
// queued or generating) cancels its request.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "server/metrics.h"
#include "server/request_queue.h"
#include "server/serving_engine.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace spool::server {

/// Network settings.
struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8080;          ///< 0 = any free port (see bind())
  std::string api_key;      ///< "" = no authentication
  size_t max_body_bytes = 64u << 20;
};

class HttpServer {
 public:
  explicit HttpServer(HttpOptions opt);
  ~HttpServer();

  /// Binds the listening socket and returns the port. Throws spool::Error when it cannot.
  int bind();
  /// Serves until stop() (blocking). Requires bind().
  void listen();
  /// Stops listen() (thread-safe, also before listen() started).
  void stop();
  /// Installs the loaded engine: /health turns 200 and model routes start serving.
  void set_engine(std::unique_ptr<ServingEngine> engine);

 private:
  void routes();
  bool authorized(const httplib::Request& req) const;
  void send_error(httplib::Response& res, int status, const std::string& type, const std::string& message,
                  const std::string& param = "") const;
  ServingEngine& engine_or_503() const;
  void handle_generation(const httplib::Request& req, httplib::Response& res, bool chat);
  void handle_tokenize(const httplib::Request& req, httplib::Response& res);
  void handle_detokenize(const httplib::Request& req, httplib::Response& res);
  void handle_apply_template(const httplib::Request& req, httplib::Response& res);
  std::string metrics_text() const;

  HttpOptions opt_;
  std::unique_ptr<httplib::Server> http_;
  std::unique_ptr<ServingEngine> engine_;
  std::atomic<bool> ready_{false};
  std::atomic<bool> stopping_{false};
  std::mutex run_mu_;                      // orders listen() against stop()
  bool listen_entered_ = false;
  std::atomic<bool> listen_done_{false};
  RequestQueue queue_;
  mutable Metrics metrics_;
  std::mutex seed_mu_;
  uint64_t seed_state_;
};

}  // namespace spool::server
