// Server metrics in the Prometheus text exposition format (GET /metrics).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "experts/streaming.h"
#include "experts/device_experts.h"
#include "server/batch_engine.h"
#include "server/disk_cache.h"

namespace spool::server {

/// Values read at scrape time from the engine and the process.
struct EngineGauges {
  bool ready = false;                 ///< model loaded
  BatchStats batch;                   ///< slots, queue and step counters of the BatchEngine
  bool streaming = false;             ///< experts are streamed from disk
  experts::StreamingStats experts;    ///< expert-cache (RAM tier) and disk counters (streaming only)
  uint64_t vram_slots = 0;            ///< expert slots of the VRAM tier (experts::DeviceExpertCache; 0: none)
  experts::DeviceExpertCache::Stats slots;  ///< VRAM-tier counters (with vram_slots)
  uint64_t rss_bytes = 0;             ///< VmRSS
  std::optional<DiskCacheStats> disk_cache;  ///< with --disk-cache
};

/// The /metrics `endpoint` label of a request: its route from a fixed set ("/v1/models/{id}"
/// for a model id), "other" for a path no route serves (404) — never the raw path, so the
/// series stay few and label values hold no client bytes.
std::string route_label(const std::string& path);

/// `v` escaped as a Prometheus label value (backslash, double quote and newline).
std::string escape_label(const std::string& v);

/// Request and token counters, updated by the handlers (thread-safe).
class Metrics {
 public:
  /// Counts one finished HTTP request on `endpoint` (a route_label) with HTTP `status`.
  void request(const std::string& endpoint, int status);
  /// Adds one generation's tokens and seconds (cancelled ones too: they used the engine).
  void generation(int64_t prompt_tokens, int64_t cached_tokens, int64_t generated_tokens, double prefill_s, double decode_s,
                  bool cancelled);
  /// The exposition text.
  std::string render(const EngineGauges& g) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  uint64_t prompt_tokens_ = 0, cached_tokens_ = 0, generated_tokens_ = 0, generations_ = 0, cancelled_ = 0;
  double prefill_s_ = 0, decode_s_ = 0;
  double last_prefill_tok_s_ = 0, last_decode_tok_s_ = 0;
};

}  // namespace spool::server
