// ResponsesStore: the server-side memory of /v1/responses — stored response objects (for GET /
// DELETE /v1/responses/{id}) and the conversation each one ends (for `previous_response_id`).
// In memory only, least-recently-used first out, bounded by a count (`spool serve
// --responses-store N`, default kDefaultResponsesStore) and by the bytes of the JSON it holds
// (kResponsesStoreMaxBytes). Thread-safe.
#pragma once

#include <cstddef>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>

namespace spool::server {

/// Responses kept by default (--responses-store).
inline constexpr size_t kDefaultResponsesStore = 128;
/// Bytes of stored JSON (response objects plus conversations, as compact text) kept at most.
/// Every entry holds its whole conversation, so a long chain of turns costs the sum of its
/// prefixes: this cap keeps that bounded whatever the count.
inline constexpr size_t kResponsesStoreMaxBytes = size_t{256} << 20;

/// One stored response.
struct StoredResponse {
  nlohmann::ordered_json response;      ///< the response object as returned to the client
  nlohmann::ordered_json conversation;  ///< input items of the whole chain plus this response's output items (an array)
};

/// LRU map from response id ("resp_...") to StoredResponse.
class ResponsesStore {
 public:
  /// Keeps at most `capacity` responses (0: nothing is ever kept) and `max_bytes` of JSON.
  explicit ResponsesStore(size_t capacity = kDefaultResponsesStore, size_t max_bytes = kResponsesStoreMaxBytes);

  /// Stores `r` under `id` (replacing an entry of that id) as the most recently used, then
  /// evicts the least recently used entries until both bounds hold. An entry larger than
  /// max_bytes on its own is not kept. Returns whether `id` is stored afterwards.
  bool put(const std::string& id, StoredResponse r);
  /// The entry of `id` (a copy; marks it most recently used), or nullopt.
  std::optional<StoredResponse> get(const std::string& id);
  /// Removes `id`; false when it was not stored.
  bool erase(const std::string& id);
  /// Entries stored now.
  size_t size() const;
  /// Bytes accounted to the entries stored now.
  size_t bytes() const;
  /// The count bound.
  size_t capacity() const { return capacity_; }

 private:
  struct Entry {
    std::string id;
    StoredResponse value;
    size_t bytes = 0;
  };
  void evict_locked();

  size_t capacity_, max_bytes_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
  size_t bytes_ = 0;
};

}  // namespace spool::server
