#include "cli/http_client.h"

#include <curl/curl.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "common/error.h"

namespace spool::plan {

namespace {

struct Sink {
  std::string* body;
  uint64_t max_bytes;
  bool cut = false;
  uint64_t* received;
};

size_t on_body(char* data, size_t size, size_t n, void* user) {
  Sink* s = static_cast<Sink*>(user);
  const size_t len = size * n;
  *s->received += len;
  const uint64_t room = s->max_bytes > s->body->size() ? s->max_bytes - s->body->size() : 0;
  if (len > room) {
    s->body->append(data, static_cast<size_t>(room));
    s->cut = true;
    return 0;  // abort the transfer: we have what we asked for
  }
  s->body->append(data, len);
  return len;
}

struct Headers {
  std::optional<uint64_t> range_begin, range_total, content_length;
};

// Parses "Content-Range: bytes B-E/T" and "Content-Length: N" (case-insensitive names);
// the last response of a redirect chain wins (each new status line resets).
size_t on_header(char* data, size_t size, size_t n, void* user) {
  Headers* h = static_cast<Headers*>(user);
  const std::string line(data, size * n);
  auto starts = [&](const char* p) { return strncasecmp(line.c_str(), p, std::strlen(p)) == 0; };
  if (starts("HTTP/")) {
    *h = Headers{};
  } else if (starts("content-range:")) {
    unsigned long long b = 0, e = 0, t = 0;
    if (std::sscanf(line.c_str() + 14, " bytes %llu-%llu/%llu", &b, &e, &t) == 3) {
      h->range_begin = b;
      h->range_total = t;
    }
  } else if (starts("content-length:")) {
    h->content_length = std::strtoull(line.c_str() + 15, nullptr, 10);
  }
  return size * n;
}

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

}  // namespace

HttpClient::HttpClient() {
  global_init();
  curl_ = curl_easy_init();
  if (curl_ == nullptr) fail("libcurl: cannot create a handle");
}

HttpClient::~HttpClient() { curl_easy_cleanup(static_cast<CURL*>(curl_)); }

HttpResponse HttpClient::get(const std::string& url, uint64_t max_bytes, std::optional<uint64_t> range_begin,
                             std::optional<uint64_t> range_end) {
  CURL* c = static_cast<CURL*>(curl_);
  curl_easy_reset(c);
  HttpResponse r;
  Sink sink{&r.body, max_bytes, false, &received_};
  Headers hdr;
  char err[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 20L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);   // abort if < 1 B/s ...
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 30L);   // ... for 30 s
  curl_easy_setopt(c, CURLOPT_USERAGENT, "spool-plan/0.1");
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, err);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &sink);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &hdr);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  std::string range;
  if (range_begin) {
    range = std::to_string(*range_begin) + "-" + (range_end ? std::to_string(*range_end) : std::string());
    curl_easy_setopt(c, CURLOPT_RANGE, range.c_str());
  }
  curl_slist* headers = nullptr;
  if (const char* tok = std::getenv("HF_TOKEN"); tok != nullptr && *tok != '\0') {
    headers = curl_slist_append(headers, (std::string("Authorization: Bearer ") + tok).c_str());
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  }
  ++requests_;
  const CURLcode rc = curl_easy_perform(c);
  curl_slist_free_all(headers);
  if (rc != CURLE_OK && !(rc == CURLE_WRITE_ERROR && sink.cut))
    fail("%s: %s", url.c_str(), err[0] ? err : curl_easy_strerror(rc));
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
  r.cut_short = sink.cut;
  if (r.status == 206 && hdr.range_begin && range_begin && *hdr.range_begin == *range_begin) {
    r.range_honored = true;
    r.total_size = hdr.range_total;
  } else if (r.status == 200 && hdr.content_length) {
    r.total_size = hdr.content_length;
  }
  return r;
}

}  // namespace spool::plan
