// An in-process `spool serve` for HTTP tests: an HttpServer on a free loopback port, serving
// (on its own thread) until destroyed, with the demo model loaded (context 512, prefill step
// 32) unless told otherwise. Used by the Anthropic and Responses HTTP tests.
#pragma once

#include <httplib.h>

#include <memory>
#include <string>
#include <thread>

#include "engine/loader.h"
#include "server/http_server.h"
#include "server/serving_engine.h"

namespace spool::test_support {

/// A running server; `client()` talks to it.
struct DemoServer {
  /// Binds `ho` on a free port (ho.port is replaced by 0) and starts listening; loads the demo
  /// model when `with_engine` (else /health says loading and call load() later).
  explicit DemoServer(server::HttpOptions ho, bool with_engine = true) {
    ho.port = 0;
    server = std::make_unique<server::HttpServer>(ho);
    port = server->bind();
    thread = std::thread([this] { server->listen(); });
    if (with_engine) load();
  }
  /// Loads the demo model (2 threads, context 512, prefill step 32) and hands it to the server.
  void load() {
    engine::LoadOptions o;
    o.model_dir = SPOOL_DEFAULT_MODEL_DIR;
    o.threads = 2;
    server::EngineOptions eo;
    eo.model_name = "demo";
    eo.ctx_size = 512;
    eo.prefill_step = 32;
    server->set_engine(server::make_serving_engine(engine::load(o), eo));
  }
  ~DemoServer() {
    server->stop();
    thread.join();
  }
  DemoServer(const DemoServer&) = delete;
  DemoServer& operator=(const DemoServer&) = delete;
  /// A client of the server; `read_timeout_s` is a deadline for hangs only.
  httplib::Client client(int read_timeout_s = 600) const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(read_timeout_s, 0);
    return c;
  }
  std::unique_ptr<server::HttpServer> server;
  int port = 0;
  std::thread thread;
};

}  // namespace spool::test_support
