// Minimal HTTP(S) GET with byte ranges over libcurl, for reading safetensors headers and
// small JSON files of a remote checkpoint without downloading its weights.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace spool::plan {

/// One response. `body` holds at most the byte limit given to get().
struct HttpResponse {
  long status = 0;              // HTTP status (after redirects)
  std::string body;
  bool range_honored = false;   // 206 with a Content-Range starting at the requested offset
  std::optional<uint64_t> total_size;  // whole resource size: Content-Range total, else Content-Length of a 200
  bool cut_short = false;       // the body was stopped at the byte limit
};

/// GETs `url`, following redirects. With `range_begin` set, asks for bytes
/// [range_begin, range_end] (inclusive). Stops reading after `max_bytes` body bytes (the
/// transfer is aborted, not an error). Throws spool::Error naming the URL for network
/// errors (DNS, TLS, connection, timeout). Sends "Authorization: Bearer $HF_TOKEN" when
/// HF_TOKEN is set. Counts every body byte received in bytes_received().
class HttpClient {
 public:
  HttpClient();
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  HttpResponse get(const std::string& url, uint64_t max_bytes, std::optional<uint64_t> range_begin = std::nullopt,
                   std::optional<uint64_t> range_end = std::nullopt);
  /// Body bytes received by all requests so far.
  uint64_t bytes_received() const { return received_; }
  /// Requests made so far.
  int requests() const { return requests_; }

 private:
  void* curl_ = nullptr;
  uint64_t received_ = 0;
  int requests_ = 0;
};

}  // namespace spool::plan
