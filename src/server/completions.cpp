// HttpServer's generation routes: /v1/chat/completions and /v1/completions, as one JSON
// response or as Server-Sent Events.
#include <httplib.h>

#include <ctime>

#include "common/error.h"
#include "server/http_server.h"
#include "server/json_body.h"
#include "server/openai_format.h"
#include "server/ticket_reader.h"

namespace spool::server {

void HttpServer::handle_generation(const httplib::Request& req, const std::string& body_text, httplib::Response& res, bool chat) {
  ServingEngine& e = engine_or_503();
  const json body = parse_body(body_text);
  const uint64_t seed = next_seed();
  auto g = std::make_shared<const GenRequest>(chat ? parse_chat_request(body, e.facts, seed) : parse_completion_request(body, e.facts, seed));
  const std::function<bool()> alive = liveness(req);
  const ResponseMeta meta{new_response_id(chat ? "chatcmpl-" : "cmpl-"), static_cast<int64_t>(std::time(nullptr)), e.facts.name};
  const tokenizer::Tokenizer& tok = *e.facts.tok;
  // Counted in from here until the response is done (the stream's provider holds it).
  std::shared_ptr<void> slot = admit();
  // Whatever ends this response gives the request up (TicketReader).
  const TicketReader ticket(*e.batch, g, g->stream);

  if (!g->stream) {
    const std::optional<GenResult> r = finished(ticket, alive, res);
    if (!r) return;
    const json j = chat ? chat_completion_json(meta, *r, g->logprobs, tok) : completion_json(meta, *r, g->logprobs, tok);
    res.set_content(dump_json(j), "application/json");
    return;
  }

  // With include_usage every chunk but the last carries "usage": null, as OpenAI sends them.
  auto chunk = [g](json j) {
    if (g->include_usage) j["usage"] = nullptr;
    return sse_data(j);
  };
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream", [this, &tok, g, meta, alive, chat, chunk, slot, ticket](size_t, httplib::DataSink& sink) {
        bool ok = true;
        auto write = [&](const std::string& s) {
          if (ok && !sink.write(s.data(), s.size())) ok = false;
          return ok;
        };
        try {
          for (;;) {
            std::optional<GenMessage> m = next_streamed(ticket, [&] { return ok && alive(); }, ok);
            if (!m) return false;
            if (m->kind == GenMessage::kFailed) throw TicketReader::failed(*m);
            if (m->kind == GenMessage::kStarted) {
              if (chat) write(chunk(chat_chunk_json(meta, json{{"role", "assistant"}, {"content", ""}}, "", nullptr, tok)));
              continue;
            }
            if (m->kind == GenMessage::kEvent) {
              const GenEvent& ev = m->event;
              const std::vector<TokenLogprob>* lp = g->logprobs ? &ev.logprobs : nullptr;
              if (chat) {
                const json delta = delta_json(ev.delta);
                if (!delta.empty() || !ev.logprobs.empty()) write(chunk(chat_chunk_json(meta, delta, "", lp, tok)));
              } else if (!ev.delta.content.empty() || !ev.logprobs.empty()) {
                write(chunk(completion_chunk_json(meta, ev.delta.content, "", lp, tok)));
              }
              if (!ok) ticket.cancel();
              continue;
            }
            const GenResult& r = m->result;  // kDone
            if (!ok) return false;
            write(chunk(chat ? chat_chunk_json(meta, json::object(), r.finish_reason, nullptr, tok)
                             : completion_chunk_json(meta, "", r.finish_reason, nullptr, tok)));
            if (g->include_usage) write(sse_data(usage_chunk_json(meta, r, chat)));
            write("data: [DONE]\n\n");
            break;
          }
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
