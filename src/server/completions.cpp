// HttpServer's generation routes: /v1/chat/completions and /v1/completions, as one JSON
// response or as Server-Sent Events.
#include <httplib.h>

#include <ctime>

#include "common/error.h"
#include "server/connection_probe.h"
#include "server/http_server.h"
#include "server/json_body.h"
#include "server/openai_format.h"

namespace spool::server {

namespace {

uint64_t splitmix(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// HTTP status for a response nobody receives (the client went away), as nginx logs it.
constexpr int kClientClosed = 499;

}  // namespace

void HttpServer::handle_generation(const httplib::Request& req, httplib::Response& res, bool chat) {
  ServingEngine& e = engine_or_503();
  const json body = parse_body(req.body);
  uint64_t seed;
  {
    std::lock_guard lock(seed_mu_);
    seed = splitmix(seed_state_);
  }
  auto g = std::make_shared<const GenRequest>(chat ? parse_chat_request(body, e.facts, seed) : parse_completion_request(body, e.facts, seed));
  const std::optional<ConnectionProbe> probe = ConnectionProbe::find(req.remote_addr, req.remote_port);
  auto alive = [this, probe] { return !stopping_ && (!probe || probe->alive()); };
  const ResponseMeta meta{new_response_id(chat ? "chatcmpl-" : "cmpl-"), static_cast<int64_t>(std::time(nullptr)), e.facts.name};
  const tokenizer::Tokenizer& tok = *e.facts.tok;
  auto record = [this](const GenResult& r) {
    metrics_.generation(r.prompt_tokens, r.cached_tokens, r.completion_tokens, r.prefill_s, r.decode_s, r.cancelled);
  };

  if (!g->stream) {
    std::optional<RequestQueue::Turn> turn = queue_.wait(alive);
    if (!turn) {
      res.status = kClientClosed;
      return;
    }
    GenResult r = e.gen->run(*g, nullptr, alive);
    record(r);
    if (r.cancelled) {
      res.status = kClientClosed;
      return;
    }
    const json j = chat ? chat_completion_json(meta, r, g->logprobs, tok) : completion_json(meta, r, g->logprobs, tok);
    res.set_content(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), "application/json");
    return;
  }

  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", [this, &e, &tok, g, meta, alive, chat, record](size_t, httplib::DataSink& sink) {
    bool ok = true;
    auto write = [&](const std::string& s) {
      if (ok && !sink.write(s.data(), s.size())) ok = false;
      return ok;
    };
    try {
      std::optional<RequestQueue::Turn> turn = queue_.wait(alive);
      if (!turn) return false;
      if (chat) write(sse_data(chat_chunk_json(meta, json{{"role", "assistant"}, {"content", ""}}, "", nullptr, tok)));
      GenResult r = e.gen->run(
          *g,
          [&](const GenEvent& ev) {
            const std::vector<TokenLogprob>* lp = g->logprobs ? &ev.logprobs : nullptr;
            if (chat) {
              const json delta = delta_json(ev.delta);
              if (!delta.empty() || !ev.logprobs.empty()) write(sse_data(chat_chunk_json(meta, delta, "", lp, tok)));
            } else if (!ev.delta.content.empty() || !ev.logprobs.empty()) {
              write(sse_data(completion_chunk_json(meta, ev.delta.content, "", lp, tok)));
            }
            return ok;
          },
          [&] { return ok && alive(); });
      record(r);
      if (r.cancelled || !ok) return false;
      write(sse_data(chat ? chat_chunk_json(meta, json::object(), r.finish_reason, nullptr, tok)
                          : completion_chunk_json(meta, "", r.finish_reason, nullptr, tok)));
      if (g->include_usage) write(sse_data(usage_chunk_json(meta, r, chat)));
      write("data: [DONE]\n\n");
    } catch (const ApiError& ex) {
      write(sse_data(error_json(ex)));
    } catch (const std::bad_alloc&) {
      write(sse_data(error_json("out of memory", "server_error")));
    } catch (const std::exception& ex) {
      write(sse_data(error_json(ex.what(), "server_error")));
    }
    if (ok) sink.done();
    return ok;
  });
}

}  // namespace spool::server
