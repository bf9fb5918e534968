// HttpServer's Responses API routes: POST /v1/responses (JSON or Server-Sent Events), GET and
// DELETE /v1/responses/{id} (stored responses). The request is turned into a chat request
// (responses_request.h) and run like /v1/chat/completions; the output is formatted as a
// response object or its event stream (responses_format.h) and, unless `store` is false,
// kept in the ResponsesStore with its conversation for previous_response_id.
#include <httplib.h>

#include <ctime>

#include "common/error.h"
#include "server/http_server.h"
#include "server/json_body.h"
#include "server/openai_format.h"
#include "server/responses_format.h"
#include "server/responses_request.h"
#include "server/ticket_reader.h"

namespace spool::server {

namespace {

// Errors that name chat's `messages` (prompt too long, template errors) name `input` here.
ApiError as_responses_error(const ApiError& e) {
  std::string param = e.param;
  if (param.starts_with("messages")) param = "input";
  return ApiError(e.status, e.type, e.what(), param);
}

ApiError not_found(const std::string& id) {
  return ApiError(404, "invalid_request_error", "No response found with id '" + id + "'.", "response_id");
}

}  // namespace

void HttpServer::handle_responses(const httplib::Request& req, const std::string& body_text, httplib::Response& res) {
  ServingEngine& e = engine_or_503();
  const json body = parse_body(body_text);
  const ResponsesRequest rr = parse_responses_request(body);
  json history = json::array();
  if (rr.previous_response_id) {
    std::optional<StoredResponse> prev = responses_->get(*rr.previous_response_id);
    if (!prev) {
      // OpenAI's answer: 400 with code previous_response_not_found.
      send_json(res, 400, error_json("Previous response with id '" + *rr.previous_response_id + "' not found.", "invalid_request_error",
                                    "previous_response_id", "previous_response_not_found"));
      return;
    }
    history = std::move(prev->conversation);
  }
  const uint64_t seed = next_seed();
  std::shared_ptr<const GenRequest> g;
  try {
    GenRequest parsed = parse_chat_request(responses_chat_body(rr, history, e.facts.chat.source), e.facts, seed);
    parsed.lora = request_lora(e.facts.lora.get(), body);  // (the Responses body's own `lora` / `model`)
    g = std::make_shared<const GenRequest>(std::move(parsed));
  } catch (const ApiError& ex) {
    throw as_responses_error(ex);
  }

  ResponsesEcho echo;
  echo.id = new_response_id("resp_");
  echo.created_at = static_cast<int64_t>(std::time(nullptr));
  echo.model = e.facts.name;
  echo.instructions = rr.instructions ? json(*rr.instructions) : json();
  echo.max_output_tokens = rr.max_output_tokens ? json(*rr.max_output_tokens) : json();
  echo.previous_response_id = rr.previous_response_id ? json(*rr.previous_response_id) : json();
  echo.reasoning = json{{"effort", rr.reasoning_effort ? json(*rr.reasoning_effort) : json()},
                        {"summary", rr.reasoning_summary ? json(*rr.reasoning_summary) : json()}};
  echo.tools = rr.tools;
  echo.tool_choice = rr.tool_choice;
  echo.metadata = rr.metadata;
  // The request's values, else the model's defaults the sampler uses.
  echo.temperature = rr.temperature.value_or(g->sampling.temperature);
  echo.top_p = rr.top_p.value_or(g->sampling.top_p);
  echo.parallel_tool_calls = rr.parallel_tool_calls;
  echo.store = rr.store;
  const tokenizer::Tokenizer& tok = *e.facts.tok;
  auto reasoning_tokens = [&tok](const GenResult& r) {
    return r.reasoning.empty() ? int64_t{0} : static_cast<int64_t>(tok.encode(r.reasoning, false).size());
  };
  // The conversation a later turn continues: the history, this input, this output.
  auto keep = [this, rr, history](const json& response) {
    if (!rr.store) return;
    StoredResponse s{response, history};
    for (const json& it : rr.input) s.conversation.push_back(it);
    for (const json& it : response["output"]) s.conversation.push_back(it);
    responses_->put(response["id"].get<std::string>(), std::move(s));
  };
  ItemIdSource ids = [](const std::string& prefix) { return new_response_id(prefix); };

  const std::function<bool()> alive = liveness(req);
  std::shared_ptr<void> slot = admit();
  const TicketReader ticket(*e.batch, g, g->stream);  // gives the request up when the response ends

  if (!g->stream) {
    const std::optional<GenResult> r = finished(ticket, alive, res);
    if (!r) return;
    const json j = finished_response(echo, *r, output_items(*r, ids), reasoning_tokens(*r));
    keep(j);
    send_json(res, 200, j);
    return;
  }

  auto stream = std::make_shared<ResponsesStream>(echo, ids);
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, stream, alive, slot, ticket, keep, reasoning_tokens](size_t, httplib::DataSink& sink) {
        bool ok = true;
        auto write = [&](const std::vector<json>& events) {
          for (const json& ev : events) {
            const std::string s = sse_event(ev);
            if (ok && !sink.write(s.data(), s.size())) ok = false;
          }
          return ok;
        };
        try {
          write(stream->start());
          for (;;) {
            std::optional<GenMessage> m = next_streamed(ticket, [&] { return ok && alive(); }, ok);
            if (!m) return false;
            if (m->kind == GenMessage::kFailed) throw TicketReader::failed(*m);
            if (m->kind == GenMessage::kStarted) continue;
            if (m->kind == GenMessage::kEvent) {
              write(stream->on_delta(m->event.delta));
              if (!ok) ticket.cancel();
              continue;
            }
            if (!ok) return false;
            std::vector<json> last = stream->finish(m->result, reasoning_tokens(m->result));
            keep(last.back()["response"]);
            write(last);
            break;
          }
        } catch (const ApiError& ex) {
          write(stream->error(ex.what(), ex.param));
        } catch (const std::exception& ex) {
          write(stream->error(ex.what(), ""));
        }
        if (ok) sink.done();
        return ok;
      });
}

void HttpServer::handle_get_response(const std::string& id, httplib::Response& res) {
  std::optional<StoredResponse> s = responses_->get(id);
  if (!s) throw not_found(id);
  send_json(res, 200, s->response);
}

void HttpServer::handle_delete_response(const std::string& id, httplib::Response& res) {
  if (!responses_->erase(id)) throw not_found(id);
  send_json(res, 200, json{{"id", id}, {"object", "response.deleted"}, {"deleted", true}});
}

}  // namespace spool::server
