// HttpServer's Anthropic Messages routes: POST /v1/messages (one JSON message or Server-Sent
// Events) and POST /v1/messages/count_tokens, with Anthropic-shaped errors for every failure
// on these paths (see anthropic_format.h).
#include <httplib.h>

#include <chrono>

#include "common/error.h"
#include "server/anthropic_format.h"
#include "server/anthropic_request.h"
#include "server/http_server.h"
#include "server/json_body.h"
#include "server/openai_format.h"
#include "server/ticket_reader.h"

namespace spool::server {

namespace {

// Seconds without an event after which a stream gets a ping (keeps proxies from timing out
// while the request waits in the queue or a long prompt is computed).
constexpr double kPingAfterS = 10;

void set_anthropic_error(httplib::Response& res, int status, const std::string& message) {
  status = anthropic_status(status);
  res.status = status;
  res.set_content(dump_json(anthropic_error_json(anthropic_error_type(status), message)), "application/json");
}

double seconds_now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

bool HttpServer::anthropic_route(const std::string& path) { return path == "/v1/messages" || path.rfind("/v1/messages/", 0) == 0; }

void HttpServer::anthropic_error(httplib::Response& res, int status, const std::string& message) { set_anthropic_error(res, status, message); }

void HttpServer::anthropic_exception(httplib::Response& res, std::exception_ptr ep) {
  try {
    std::rethrow_exception(ep);
  } catch (const ApiError& e) {
    set_anthropic_error(res, e.status, e.what());
  } catch (const UsageError& e) {
    set_anthropic_error(res, 400, e.what());
  } catch (const std::bad_alloc&) {
    set_anthropic_error(res, 500, "out of memory");
  } catch (const std::exception& e) {
    set_anthropic_error(res, 500, e.what());
  } catch (...) {
    set_anthropic_error(res, 500, "unknown error");
  }
}

void HttpServer::handle_count_tokens(const std::string& body_text, httplib::Response& res) {
  ServingEngine& e = engine_or_503();
  const AnthropicRequest a = parse_anthropic_request(parse_body(body_text), /*count_tokens=*/true);
  if (!e.facts.tok) throw bad_request("the model has no tokenizer.json; token counts need one");
  const ChatPrompt p = render_chat(a.chat, e.facts.chat, /*allow_template_override=*/false);
  res.set_content(dump_json(json{{"input_tokens", e.facts.tok->encode(p.text, /*add_special=*/false).size()}}), "application/json");
}

void HttpServer::handle_messages(const httplib::Request& req, const std::string& body_text, httplib::Response& res) {
  ServingEngine& e = engine_or_503();
  const json body = parse_body(body_text);
  const AnthropicRequest a = parse_anthropic_request(body, /*count_tokens=*/false);
  const uint64_t seed = next_seed();
  GenRequest parsed = parse_chat_request(a.chat, e.facts, seed);
  parsed.lora = request_lora(e.facts.lora.get(), body);  // (the Messages body's own `lora` / `model`)
  parsed.parser.stop = a.stop_sequences;
  parsed.parser.id_prefix = "toolu_";
  auto g = std::make_shared<const GenRequest>(std::move(parsed));
  const std::function<bool()> alive = liveness(req);
  const std::string id = new_response_id("msg_");
  std::shared_ptr<void> slot = admit();
  const TicketReader ticket(*e.batch, g, g->stream);  // gives the request up when the response ends

  if (!g->stream) {
    const std::optional<GenResult> r = finished(ticket, alive, res);
    if (!r) return;
    res.set_content(dump_json(anthropic_message_json(id, e.facts.name, *r)), "application/json");
    return;
  }

  auto stream = std::make_shared<AnthropicStream>(id, e.facts.name, static_cast<int64_t>(g->prompt.size()));
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream", [this, stream, alive, slot, ticket](size_t, httplib::DataSink& sink) {
        bool ok = true;
        double last = seconds_now();
        auto write = [&](const std::string& s) {
          if (ok && !s.empty() && !sink.write(s.data(), s.size())) ok = false;
          last = seconds_now();
          return ok;
        };
        auto keep_going = [&] {
          if (ok && seconds_now() - last > kPingAfterS) write(AnthropicStream::ping());
          return ok && alive();
        };
        try {
          write(stream->start());
          for (;;) {
            std::optional<GenMessage> m = next_streamed(ticket, keep_going, ok);
            if (!m) return false;
            if (m->kind == GenMessage::kFailed) {
              write(AnthropicStream::error(m->status, m->error));
              break;
            }
            if (m->kind == GenMessage::kStarted) continue;
            if (m->kind == GenMessage::kEvent) {
              write(stream->delta(m->event.delta));
              if (!ok) ticket.cancel();
              continue;
            }
            if (!ok) return false;  // kDone
            write(stream->finish(m->result));
            break;
          }
        } catch (const ApiError& ex) {
          write(AnthropicStream::error(ex.status, ex.what()));
        } catch (const std::bad_alloc&) {
          write(AnthropicStream::error(500, "out of memory"));
        } catch (const std::exception& ex) {
          write(AnthropicStream::error(500, ex.what()));
        }
        if (ok) sink.done();
        return ok;
      });
}

}  // namespace spool::server
