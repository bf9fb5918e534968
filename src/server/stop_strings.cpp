#include "server/stop_strings.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"

namespace spool::server {

bool valid_utf8(std::string_view s) {
  size_t i = 0, n = s.size();
  while (i < n) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    unsigned cp;
    if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; }
    else return false;
    if (i + len > n) return false;
    for (size_t k = 1; k < len; ++k) {
      auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
        (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))) {
      return false;
    }
    i += len;
  }
  return true;
}

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (size_t i = 0; i < stops_.size(); ++i) {
    if (stops_[i].empty()) fail("stop string %zu is empty", i);
    if (!valid_utf8(stops_[i])) fail("stop string %zu is not valid UTF-8", i);
    max_len_ = std::max(max_len_, stops_[i].size());
  }
}

// Earliest position q < limit from which the held text (to its end) is a proper prefix of
// some stop string; held_.size() if none.
size_t StopMatcher::earliest_partial(size_t limit) const {
  size_t n = held_.size();
  size_t from = n >= max_len_ ? n - max_len_ + 1 : 0;
  for (size_t q = from; q < limit && q < n; ++q) {
    size_t rest = n - q;
    for (const auto& s : stops_) {
      if (s.size() > rest && std::memcmp(held_.data() + q, s.data(), rest) == 0) return q;
    }
  }
  return n;
}

std::string StopMatcher::release(bool eof) {
  size_t match = std::string::npos;
  int which = -1;
  for (size_t i = 0; i < stops_.size(); ++i) {
    size_t p = held_.find(stops_[i]);
    if (p < match) {
      match = p;
      which = static_cast<int>(i);
    }
  }
  std::string out;
  if (match != std::string::npos) {
    size_t q = eof ? held_.size() : earliest_partial(match);
    if (q < match) {  // an earlier, longer stop string may still complete
      out = held_.substr(0, q);
      held_.erase(0, q);
      return out;
    }
    out = held_.substr(0, match);
    held_.clear();
    stopped_ = true;
    matched_ = which;
    return out;
  }
  size_t q = eof ? held_.size() : earliest_partial(held_.size());
  out = held_.substr(0, q);
  held_.erase(0, q);
  return out;
}

std::string StopMatcher::push(std::string_view text) {
  if (stopped_) return {};
  if (stops_.empty()) return std::string(text);
  held_.append(text);
  return release(false);
}

std::string StopMatcher::finish() {
  if (stopped_) return {};
  return release(true);
}

}  // namespace spool::server
