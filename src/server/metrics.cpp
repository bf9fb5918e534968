#include "server/metrics.h"

#include "common/error.h"

namespace spool::server {

std::string route_label(const std::string& path) {
  static const char* kRoutes[] = {"/health",        "/metrics",     "/v1/models", "/v1/chat/completions", "/v1/completions",
                                  "/tokenize",      "/detokenize",  "/apply-template", "/lora-adapters"};
  for (const char* r : kRoutes)
    if (path == r) return r;
  if (path.starts_with("/v1/models/")) return "/v1/models/{id}";
  return "other";
}

std::string escape_label(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

void Metrics::request(const std::string& endpoint, int status) {
  std::lock_guard lock(mu_);
  ++requests_[{endpoint, status}];
}

void Metrics::generation(int64_t prompt_tokens, int64_t cached_tokens, int64_t generated_tokens, double prefill_s, double decode_s,
                         bool cancelled) {
  std::lock_guard lock(mu_);
  ++generations_;
  if (cancelled) ++cancelled_;
  prompt_tokens_ += static_cast<uint64_t>(prompt_tokens);
  cached_tokens_ += static_cast<uint64_t>(cached_tokens);
  generated_tokens_ += static_cast<uint64_t>(generated_tokens);
  prefill_s_ += prefill_s;
  decode_s_ += decode_s;
  const int64_t computed = prompt_tokens - cached_tokens;
  if (prefill_s > 0 && computed > 0) last_prefill_tok_s_ = computed / prefill_s;
  if (decode_s > 0 && generated_tokens > 1) last_decode_tok_s_ = (generated_tokens - 1) / decode_s;
}

namespace {

void metric(std::string& out, const char* name, const char* type, const char* help, double value) {
  out += strfmt("# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, value);
}

}  // namespace

std::string Metrics::render(const EngineGauges& g) const {
  std::lock_guard lock(mu_);
  std::string out;
  out += "# HELP spool_requests_total HTTP requests by endpoint and status.\n# TYPE spool_requests_total counter\n";
  for (const auto& [k, n] : requests_)
    out += "spool_requests_total{endpoint=\"" + escape_label(k.first) + "\",status=\"" + std::to_string(k.second) + "\"} " +
           std::to_string(n) + "\n";
  metric(out, "spool_generations_total", "counter", "Generations run (chat and text completions).", static_cast<double>(generations_));
  metric(out, "spool_generations_cancelled_total", "counter", "Generations cancelled by a client disconnect.", static_cast<double>(cancelled_));
  metric(out, "spool_prompt_tokens_total", "counter", "Prompt tokens of all generations.", static_cast<double>(prompt_tokens_));
  metric(out, "spool_prompt_tokens_cached_total", "counter", "Prompt tokens reused from the prompt cache.", static_cast<double>(cached_tokens_));
  metric(out, "spool_generated_tokens_total", "counter", "Generated tokens.", static_cast<double>(generated_tokens_));
  metric(out, "spool_prefill_seconds_total", "counter", "Seconds spent on prompt processing.", prefill_s_);
  metric(out, "spool_decode_seconds_total", "counter", "Seconds spent generating.", decode_s_);
  metric(out, "spool_prompt_tokens_per_second", "gauge", "Prompt tokens computed per second, last generation.", last_prefill_tok_s_);
  metric(out, "spool_generation_tokens_per_second", "gauge", "Decode tokens per second, last generation.", last_decode_tok_s_);
  metric(out, "spool_ready", "gauge", "1 when the model is loaded.", g.ready ? 1 : 0);
  const BatchStats& b = g.batch;
  metric(out, "spool_requests_waiting", "gauge", "Requests waiting for a slot.", b.waiting);
  metric(out, "spool_requests_running", "gauge", "Requests running (busy slots).", b.busy);
  metric(out, "spool_slots", "gauge", "Slots: requests that can run together (--parallel).", b.slots);
  metric(out, "spool_slots_busy", "gauge", "Slots running a request now.", b.busy);
  metric(out, "spool_batch_steps_total", "counter", "Forward steps run by the batching engine.", static_cast<double>(b.steps));
  metric(out, "spool_batch_step_sequences_total", "counter", "Sequences over all forward steps (sum; / steps = mean batch).",
         static_cast<double>(b.step_seqs));
  out += "# HELP spool_batch_step_tokens Token rows per forward step (decode tokens + one prefill chunk).\n"
         "# TYPE spool_batch_step_tokens histogram\n";
  if (b.tokens_le.size() == std::size(BatchStats::kTokenBuckets) + 1) {
    for (size_t i = 0; i < std::size(BatchStats::kTokenBuckets); ++i)
      out += strfmt("spool_batch_step_tokens_bucket{le=\"%d\"} %llu\n", BatchStats::kTokenBuckets[i], (unsigned long long)b.tokens_le[i]);
    out += strfmt("spool_batch_step_tokens_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)b.tokens_le.back());
  }
  out += strfmt("spool_batch_step_tokens_sum %llu\nspool_batch_step_tokens_count %llu\n", (unsigned long long)b.step_tokens,
                (unsigned long long)b.steps);
  metric(out, "spool_expert_acquisitions_total", "counter",
         "Routed-expert acquisitions of the forward steps (distinct experts per MoE layer and step).",
         static_cast<double>(b.expert_acquisitions));
  metric(out, "spool_expert_acquisitions_saved_total", "counter",
         "Acquisitions saved by batching: sum over steps and MoE layers of per-sequence distinct experts minus the step's distinct experts.",
         static_cast<double>(b.expert_acquisitions_alone - b.expert_acquisitions));
  metric(out, "spool_spec_steps_total", "counter", "Speculative verify rows run (a pending token with its MTP drafts, --spec mtp).",
         static_cast<double>(b.spec_steps));
  metric(out, "spool_spec_draft_tokens_total", "counter", "Draft tokens verified (--spec mtp).", static_cast<double>(b.spec_drafted));
  metric(out, "spool_spec_accepted_tokens_total", "counter", "Draft tokens kept (--spec mtp); / drafted = acceptance rate.",
         static_cast<double>(b.spec_accepted));
  metric(out, "spool_expert_streaming", "gauge", "1 when routed experts are streamed from disk.", g.streaming ? 1 : 0);
  metric(out, "spool_expert_cache_hit_rate", "gauge", "Expert cache hits / lookups since start (1 when experts are resident).",
         g.streaming ? g.experts.hit_rate() : 1.0);
  metric(out, "spool_expert_cache_requests_total", "counter", "Expert cache lookups.", static_cast<double>(g.experts.requests));
  metric(out, "spool_expert_cache_misses_total", "counter", "Expert cache misses.", static_cast<double>(g.experts.misses));
  metric(out, "spool_expert_cache_hits_total", "counter", "Expert cache hits (RAM tier).", static_cast<double>(g.experts.hits));
  metric(out, "spool_expert_cache_stall_seconds_total", "counter", "Seconds expert acquisitions waited for disk reads (RAM tier).",
         g.experts.stall_s);
  metric(out, "spool_expert_cache_pinned_bytes", "gauge", "Page-locked bytes of the expert cache (RAM tier of a GPU run).",
         static_cast<double>(g.experts.pinned_bytes));
  metric(out, "spool_expert_cache_preloaded", "gauge", "Experts read into the cache at start from --expert-profile.",
         static_cast<double>(g.experts.preloaded));
  metric(out, "spool_disk_read_bytes_total", "counter", "Bytes of expert weights read from disk.", static_cast<double>(g.experts.bytes_read));
  metric(out, "spool_vram_expert_slots", "gauge", "Expert slots of the VRAM tier (0 when experts are all resident or on the CPU).",
         static_cast<double>(g.vram_slots));
  metric(out, "spool_vram_expert_hits_total", "counter", "Routed experts found in a VRAM slot.", static_cast<double>(g.slots.hits));
  metric(out, "spool_vram_expert_misses_total", "counter", "Routed experts copied into a VRAM slot for their use.",
         static_cast<double>(g.slots.misses));
  metric(out, "spool_vram_expert_copied_bytes_total", "counter", "Bytes copied host -> device into VRAM slots.",
         static_cast<double>(g.slots.bytes_copied));
  metric(out, "spool_vram_expert_stall_seconds_total", "counter", "Seconds compute waited for copies into VRAM slots.", g.slots.stall_s);
  metric(out, "spool_resident_memory_bytes", "gauge", "Resident set size (VmRSS).", static_cast<double>(g.rss_bytes));
  if (g.disk_cache) {
    const DiskCacheStats& d = *g.disk_cache;
    metric(out, "spool_disk_cache_files", "gauge", "Prompt snapshots on disk.", static_cast<double>(d.files));
    metric(out, "spool_disk_cache_bytes", "gauge", "Bytes of prompt snapshots on disk.", static_cast<double>(d.bytes));
    metric(out, "spool_disk_cache_hits_total", "counter", "Prompt snapshots loaded from disk.", static_cast<double>(d.hits));
    metric(out, "spool_disk_cache_saves_total", "counter", "Prompt snapshots written.", static_cast<double>(d.saves));
    metric(out, "spool_disk_cache_evictions_total", "counter", "Snapshots deleted to stay under the budget.", static_cast<double>(d.evictions));
    metric(out, "spool_disk_cache_corrupt_total", "counter", "Snapshots deleted because they failed a check.", static_cast<double>(d.corrupt));
  }
  return out;
}

}  // namespace spool::server
