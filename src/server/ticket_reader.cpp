#include "server/ticket_reader.h"

namespace spool::server {

ApiError shutting_down() { return ApiError(503, "server_error", "the server is shutting down; the request was not completed"); }

TicketReader::TicketReader(BatchEngine& engine, std::shared_ptr<const GenRequest> req, bool events)
    : engine_(&engine), ticket_(engine.submit(std::move(req), events)) {
  give_up_ = std::shared_ptr<void>(nullptr, [e = engine_, t = ticket_](void*) { e->cancel(t); });
}

std::optional<GenMessage> TicketReader::next(const std::function<bool()>& keep_going) const {
  GenMessage m;
  for (;;) {
    if (!keep_going()) {
      cancel();
      return std::nullopt;
    }
    if (ticket_->next(m, 50)) return m;
  }
}

std::optional<GenResult> TicketReader::result(const std::function<bool()>& keep_going) const {
  for (;;) {
    std::optional<GenMessage> m = next(keep_going);
    if (!m || (m->kind == GenMessage::kDone && m->result.cancelled)) return std::nullopt;
    if (m->kind == GenMessage::kFailed) throw failed(*m);
    if (m->kind == GenMessage::kDone) return std::move(m->result);
  }
}

void TicketReader::cancel() const { engine_->cancel(ticket_); }

ApiError TicketReader::failed(const GenMessage& m) {
  return ApiError(m.status, m.status == 400 ? "invalid_request_error" : "server_error", m.error);
}

}  // namespace spool::server
