// TicketReader: how an HTTP handler reads the request it submitted to the BatchEngine — the
// ticket's messages polled with a liveness check (the client is there, the stream writes),
// cancellation when that check fails or when the last copy of the reader goes away (an
// exception, a stream provider httplib drops unread), and a failed generation as an ApiError.
// Shared by /v1/chat/completions and /v1/completions (completions.cpp), /v1/responses
// (responses_http.cpp) and /v1/messages (anthropic_routes.cpp).
#pragma once

#include <functional>
#include <memory>
#include <optional>

#include "server/api_error.h"
#include "server/batch_engine.h"

namespace spool::server {

/// HTTP status of a response nobody receives (the client went away), as nginx logs it.
inline constexpr int kClientClosed = 499;

/// The error of a request the server's shutdown cut off: 503 "server_error".
ApiError shutting_down();

/// The handler's side of one submitted request. Copies share the ticket; the request is given up
/// (BatchEngine::cancel, no effect once it finished) when the last copy is destroyed. `engine`
/// must outlive every copy.
class TicketReader {
 public:
  /// Submits `req` to `engine` (with `events`: streaming kEvent messages, see BatchEngine::submit).
  TicketReader(BatchEngine& engine, std::shared_ptr<const GenRequest> req, bool events);

  /// The next message, waiting in steps of 50 ms and calling `keep_going` before each wait;
  /// when it returns false the request is cancelled and nullopt returned.
  std::optional<GenMessage> next(const std::function<bool()>& keep_going) const;

  /// Non-streaming: waits for the end. The result, or nullopt when the request was cancelled
  /// (`keep_going` returned false, or the engine dropped it); throws failed() of a kFailed message.
  std::optional<GenResult> result(const std::function<bool()>& keep_going) const;

  /// Gives the request up now (as when the last copy goes).
  void cancel() const;

  /// The ApiError of a kFailed message: its status, "invalid_request_error" for a 400, else
  /// "server_error", and its message.
  static ApiError failed(const GenMessage& m);

 private:
  BatchEngine* engine_;
  std::shared_ptr<GenTicket> ticket_;
  std::shared_ptr<void> give_up_;  // cancels the ticket when the last copy goes
};

}  // namespace spool::server
