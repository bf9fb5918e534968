// spool plan: will a model fit, and with which flags? From safetensors headers alone (local
// directory or HTTP(S) Range requests), or of a synth preset at its released size (--preset:
// the headers `spool synth` would write, made in memory), projected against this machine or a
// stated one.
// --trace FILE (docs/routing-trace.md): the expert cache's hit rate, bytes read per token and
// decode tok/s predicted by replaying a routing trace through a simulation of the cache
// (experts::simulate_tg: what `spool bench -p 0 --routing-trace FILE` measures).
// Exit 0: fits (resident or streaming); 1: does not fit, or files missing; 2: usage error.
#include <cmath>
#include <cstdio>
#include <optional>
#include <cstdlib>
#include <thread>

#include "cli/common.h"
#include "common/error.h"
#include "common/sysinfo.h"
#include "io/checkpoint.h"
#include "experts/cache_sim.h"
#include "experts/expert_profile.h"
#include "experts/routing_trace.h"
#include "engine/loader.h"
#include "lora/adapter.h"
#include "models/state.h"
#include "models/family.h"
#include "models/synth.h"
#include "plan/gpu.h"
#include "plan/placement.h"
#include "cli/probe.h"
#include "plan/projection.h"
#include "cli/plan_source.h"

namespace spool::cli {

namespace {

struct PlanOptions {
  std::string model;
  std::string preset;  // --preset: a synth preset at its released size, headers only
  int64_t ctx = 4096;
  int kv_bits = 32;
  bool kv_bits_given = false;
  int64_t prefill_step = 512;
  int parallel = 1;
  double ram_gb = 0;
  double disk_gbps = 0, mem_gbps = 0;
  int64_t mem_probe_mib = 0;  // --mem-probe-mib: the memory probe's buffer (0 = auto, plan::memory_probe_bytes)
  int threads = 0;
  bool stream = false, no_stream = false;
  std::string cache_budget = "auto";
  std::string device = "auto";  // --device: plan the GPU part for this device (auto: cuda:0 when present)
  double vram_gb = -1;          // --vram-gb: plan for a GPU with this VRAM budget (GiB) instead
  double h2d_gbps = 0;          // --h2d-gbps: host-to-device bandwidth instead of measuring it
  bool json = false;
  std::string spec = "none";    // --spec mtp: count the multi-token-prediction head (kept by the run)
  int draft_max = 1;            // --draft-max: the step trail's copies of the recurrent state per sequence
  std::string trace;            // --trace: predict the cache from this routing trace
  int n_gen = 128, reps = 5;    // --n-gen / --repetitions: the bench tg test the trace prediction is for
  std::string cache_policy = "lru";  // --cache-policy: the policy the simulated cache evicts by
  double cache_half_life = 100000;   // --cache-half-life TOKENS (lfu)
  std::string expert_profile;        // --expert-profile FILE: lfu's prior counts, as the run seeds its cache
  bool no_hits_first = false;        // --no-hits-first: the run computes a layer's experts once all are read
  double compute_gbps = 0;           // --compute-gbps: the CPU kernels' rate over weight bytes (0 = measure with --trace)
  std::vector<std::string> lora;  // --lora FILE[:SCALE]: adapters the run loads (their bytes stay resident)
  int ranks = 1;                  // --ranks: expert parallelism over N ranks (mpirun -n N)
  std::optional<double> link_latency_us, link_gbps;  // --link-latency-us / --link-gbps (spool doctor under mpirun)
  std::string expert_owners;       // --expert-owners FILE: the ranks' experts balanced by FILE's routing
};

// --trace's prediction (TracePlan::from): the simulated cache over bench's tg test.
struct TracePlan {
  std::string file;
  experts::TraceShape shape;
  int64_t trace_tokens = 0;
  int n_gen = 0, reps = 0, parallel = 1;
  int64_t slots = 0;                 // cache entries (ExpertCache::capacity())
  experts::CachePolicy policy = experts::CachePolicy::kLru;  // the simulated replacement policy
  bool seeded = false;               // lfu seeded with --expert-profile's counts
  experts::TraceSimResult sim;
  bool resident = false;             // experts resident (not streamed): no cache, nothing read
  double hit_rate() const { return resident ? 1.0 : sim.hit_rate(); }
  uint64_t expert_bytes = 0;         // what one miss reads (the expert; its aligned slot with O_DIRECT)
  double read_per_token = 0;         // bytes read from disk per token (all sequences' tokens)
  std::optional<double> tok_s_disk_bound, tok_s;  // tok/s: compute time + modelled stall per step (experts::model_decode_time)
  std::optional<double> stall_ms;    // modelled stall per token, ms
  std::optional<double> compute_gbps;  // the kernels' rate over weight bytes (measured, or --compute-gbps)
};

std::string gib(uint64_t b) { return format_bytes(b); }

// mem_probe_bytes: the buffer the memory probe read (0 when p.mem_gbps was given, not measured).
void print_text(const plan::Projection& p, const plan::ModelSource& src, const std::optional<plan::GpuProjection>& gpu,
                const std::optional<TracePlan>& tp, uint64_t mem_probe_bytes) {
  const auto& s = p.spec;
  const auto& w = p.weights;
  const int n_attn = s.n_layers_of(models::MixerKind::kAttention) + s.n_layers_of(models::MixerKind::kMLA);
  std::printf("model      %s\n", src.location.c_str());
  std::printf("           %s, %d layers (%d full attention), %d experts top-%d; %s in %d shard(s)%s\n", s.model_type.c_str(),
              s.n_layers, n_attn, s.moe.n_experts, s.moe.top_k, format_bytes(w.file_bytes).c_str(), w.shards,
              src.remote ? strfmt("; headers read with %d requests, %s fetched", src.requests, format_bytes(src.bytes_fetched).c_str()).c_str() : "");
  if (!p.architecture.empty()) std::printf("           %s\n", p.architecture.c_str());
  std::printf("projection at %lld tokens of context, --kv-bits %d, --prefill-step-size %lld, %d threads%s\n", (long long)p.shape.ctx,
              p.shape.kv_bits, (long long)p.shape.prefill_step, p.shape.threads,
              p.shape.parallel > 1 ? strfmt(", --parallel %d (sequences)", p.shape.parallel).c_str() : "");
  std::printf("  weights            %12s   routed experts %s, dense %s%s\n", gib(w.total).c_str(), gib(w.experts).c_str(),
              gib(w.dense).c_str(),
              w.embed_on_demand ? strfmt(" (embedding table %s read row by row, not resident)", gib(w.embed_on_demand).c_str()).c_str() : "");
  std::printf("  resident dense     %12s   mapped weights + f32 copies%s\n", gib(p.base.dense).c_str(),
              p.lora_bytes ? strfmt(" + LoRA adapters %s (--lora)", format_bytes(p.lora_bytes).c_str()).c_str() : "");
  if (p.verdict == plan::Verdict::kStream)
    std::printf("  expert cache       %12s   %llu slots of %s (budget %s), %s\n", gib(p.cache_bytes).c_str(),
                (unsigned long long)(p.slot_bytes ? p.cache_bytes / p.slot_bytes : 0), format_bytes(p.slot_bytes).c_str(),
                gib(p.cache_budget).c_str(), p.use_page_cache ? "reads through the page cache" : "O_DIRECT reads");
  else
    std::printf("  routed experts     %12s   resident\n", gib(w.experts).c_str());
  const uint64_t seqs = static_cast<uint64_t>(std::max(p.shape.parallel, 1));
  const std::string times = seqs > 1 ? strfmt(" x %d sequences", p.shape.parallel) : "";
  int n_windowed = 0;
  for (int i = 0; i < s.n_layers; ++i) n_windowed += models::State::kv_window(s, i) > 0;
  const std::string held = n_windowed == 0 ? strfmt("%lld positions allocated", (long long)p.kv_capacity)
                           : n_windowed == n_attn
                               ? strfmt("%lld positions allocated (sliding window)", (long long)p.kv_capacity_windowed)
                               : strfmt("%lld positions allocated, %lld in the %d sliding-window layers", (long long)p.kv_capacity,
                                        (long long)p.kv_capacity_windowed, n_windowed);
  std::printf("  KV cache           %12s   %s/token over %d of %d layers%s, %s%s\n", gib(seqs * p.state.kv).c_str(),
              format_bytes(p.state.kv_per_token).c_str(), n_attn, s.n_layers,
              s.mtp_layers > 0 ? strfmt(" + %d MTP layer(s)", s.mtp_layers).c_str() : "", held.c_str(), times.c_str());
  if (p.state.recurrent)
    std::printf("  recurrent state    %12s   Gated DeltaNet conv + state per sequence%s\n", gib(seqs * p.state.recurrent).c_str(), times.c_str());
  if (p.state.recurrent && p.shape.draft_max > 0)
    std::printf("  speculation trail  %12s   %d cop%s of the recurrent state per sequence (--spec mtp --draft-max)%s\n",
                gib(seqs * p.state.recurrent * static_cast<uint64_t>(p.shape.draft_max)).c_str(), p.shape.draft_max,
                p.shape.draft_max == 1 ? "y" : "ies", times.c_str());
  std::printf("  prefill workspace  %12s   activations of %lld-token steps, logits, sampler%s\n", gib(p.base.workspace).c_str(),
              (long long)plan::step_rows(std::min(p.shape.prefill_step, p.shape.ctx), p.shape.parallel),
              seqs > 1 ? strfmt(" (one chunk + %d decode tokens)", p.shape.parallel - 1).c_str() : "");
  std::printf("  tokenizer+runtime  %12s   tokenizer heap, tensor tables (%s), executable, libraries, stacks\n",
              gib(p.base.tokenizer + p.base.tables + p.base.runtime).c_str(), format_bytes(p.base.tables).c_str());
  std::printf("  ---------------------------------\n");
  const int64_t headroom = static_cast<int64_t>(p.available) - static_cast<int64_t>(p.reserve) - static_cast<int64_t>(p.peak);
  std::printf("  peak (VmHWM)       %12s   of %s available, %s kept free; headroom %s%s\n", gib(p.peak).c_str(),
              gib(p.available).c_str(), gib(p.reserve).c_str(), headroom < 0 ? "-" : "",
              gib(static_cast<uint64_t>(headroom < 0 ? -headroom : headroom)).c_str());
  switch (p.verdict) {
    case plan::Verdict::kResident: std::printf("verdict    RESIDENT: everything fits in memory\n"); break;
    case plan::Verdict::kStream:
      std::printf("verdict    STREAM: dense part resident, experts from disk through a %s cache (expected hit rate >= %.0f%%)\n",
                  gib(p.cache_budget).c_str(), 100.0 * p.expected_hit_rate);
      break;
    case plan::Verdict::kNoFit: std::printf("verdict    DOES NOT FIT: even streaming needs %s\n", gib(p.peak + p.reserve).c_str()); break;
  }
  if (p.tok_s_mem_bound || p.tok_s_disk_bound) {
    std::printf("decode     ");
    if (p.tok_s_mem_bound)
      std::printf("<= %.1f tok/s from memory bandwidth (%.1f GB/s%s, %s read per token%s)", *p.tok_s_mem_bound, *p.mem_gbps,
                  mem_probe_bytes ? (" measured over " + format_bytes(mem_probe_bytes)).c_str() : "",
                  format_bytes(p.ranks > 1 ? p.rank_active_bytes_per_token : p.active_bytes_per_token).c_str(),
                  p.ranks > 1 ? " by one rank" : "");
    if (p.tok_s_disk_bound)
      std::printf("%s<= %.1f tok/s from disk (%.2f GB/s direct reads, %s of experts per token, %.0f%% missing)",
                  p.tok_s_mem_bound ? "; " : "", *p.tok_s_disk_bound, *p.disk_gbps, format_bytes(p.expert_bytes_per_token).c_str(),
                  100.0 * (1.0 - p.expected_hit_rate));
    std::printf("\n");
  }
  if (p.ranks > 1) {
    std::printf("ranks      %d (expert parallelism, docs/distributed.md): the figures above are one rank's, the one with the most "
                "routed experts (%s of %s); dense part and KV on every rank\n",
                p.ranks, gib(p.rank_experts).c_str(), gib(p.weights.experts).c_str());
    if (p.rank_load_share)
      std::printf("load       the busiest rank takes %.1f%% of a MoE layer's routings (mean over the layers; experts balanced by "
                  "--expert-owners; contiguous blocks: %.1f%%, even: %.1f%%)\n",
                  100.0 * *p.rank_load_share, 100.0 * *p.contiguous_load_share, 100.0 / p.ranks);
    std::printf("network    %s between the ranks per token (all ranks; %s into each), %d exchanges per token (%s)",
                format_bytes(p.net_bytes_per_token).c_str(), format_bytes(p.net_bytes_per_token / static_cast<uint64_t>(p.ranks)).c_str(),
                p.exchanges_per_token, p.exchanges_per_token > 0 && p.leader_broadcasts ? "two per MoE layer: rank 0's broadcast, the gather" : "one per MoE layer");
    if (p.tok_s_ranks)
      std::printf("; decode ~%.1f tok/s (%s read per rank per token at %.1f GB/s, %.1f us per exchange, %.2f GB/s into a rank)\n",
                  *p.tok_s_ranks, format_bytes(p.rank_active_bytes_per_token).c_str(), *p.mem_gbps, *p.link_latency_us, *p.link_gbps);
    else if (!p.link_latency_us || !p.link_gbps)
      std::printf("; give --link-latency-us and --link-gbps (spool doctor under mpirun measures them) for a decode estimate\n");
    else
      std::printf("; give --mem-gbps (the memory bandwidth of a rank's machine) for a decode estimate\n");
  }
  if (gpu) {
    const plan::GpuPlacement& g = gpu->placement;
    std::printf("gpu        %s%s: VRAM budget %s; dense %s + KV/state %s + workspace %s", gpu->device.c_str(),
                gpu->name.empty() ? "" : strfmt(" %s (%s)", gpu->name.c_str(), gib(gpu->vram_total).c_str()).c_str(),
                gib(g.budget).c_str(), gib(g.dense).c_str(), gib(g.state).c_str(), gib(g.workspace).c_str());
    if (!g.fits) {
      std::printf(": DOES NOT FIT (%s needed)\n", gib(g.dense + g.state + g.workspace).c_str());
    } else if (g.experts_in_vram) {
      std::printf(" + routed experts %s in VRAM (%s used)\n", gib(g.experts).c_str(), gib(g.used()).c_str());
    } else {
      std::printf("; routed experts (%s) in host memory", gib(g.experts).c_str());
      if (gpu->vram == plan::VramTier::kStatic)
        std::printf(", %llu of them fixed in VRAM (--vram-experts static; hit rate >= %.0f%%), the rest read in place",
                    (unsigned long long)gpu->vram_slots, 100.0 * gpu->vram_hit_rate);
      else if (gpu->vram_slots)
        std::printf(" behind %llu VRAM expert slots (hit rate >= %.0f%%)", (unsigned long long)gpu->vram_slots, 100.0 * gpu->vram_hit_rate);
      std::printf(", %s %s per token", format_bytes(gpu->h2d_bytes_per_token).c_str(),
                  gpu->vram == plan::VramTier::kStatic ? "read by the GPU over the link" : "copied to the GPU");
      if (gpu->tok_s_h2d_bound) std::printf(": <= %.1f tok/s at %.1f GB/s host->device", *gpu->tok_s_h2d_bound, *gpu->h2d_gbps);
      std::printf("\n");
    }
  }
  if (tp) {
    std::printf("trace      %s: %lld tokens of %s (%d experts top-%d) onto %d experts top-%d; bench tg%d x%d, %d repetitions after a "
                "warm-up, %s\n",
                tp->file.c_str(), (long long)tp->trace_tokens, tp->shape.model_type.c_str(), tp->shape.n_experts, tp->shape.top_k,
                p.spec.moe.n_experts, p.spec.moe.top_k, tp->n_gen, tp->parallel, tp->reps,
                tp->resident ? "every expert resident (no cache to simulate)"
                             : strfmt("through %lld cache slots (%s simulated%s)", (long long)tp->slots,
                                      tp->policy == experts::CachePolicy::kLfu ? "LFU" : "LRU",
                                      tp->seeded ? ", seeded with the expert profile" : "").c_str());
    std::printf("           hit rate %.1f%% (uniform-routing estimate %.0f%%), %.2f experts and %s read per token",
                100.0 * tp->hit_rate(), 100.0 * p.expected_hit_rate, tp->sim.misses_per_token(),
                format_bytes(static_cast<uint64_t>(tp->read_per_token)).c_str());
    if (tp->tok_s_disk_bound) std::printf(", <= %.1f tok/s from disk", *tp->tok_s_disk_bound);
    if (tp->tok_s)
      std::printf(", ~%.1f tok/s decode (compute at %.1f GB/s of weights + %.1f ms stall per token)", *tp->tok_s,
                  tp->compute_gbps && p.mem_gbps ? std::min(*tp->compute_gbps, *p.mem_gbps) : p.mem_gbps.value_or(0), tp->stall_ms.value_or(0));
    std::printf("\n");
  }
  for (const auto& n : p.notes) std::printf("note       %s\n", n.c_str());
  if (p.verdict != plan::Verdict::kNoFit) {
    if (src.remote) std::printf("download   huggingface-cli download <repo> --local-dir %s   (or any copy of %s)\n", src.suggested_dir.c_str(), src.location.c_str());
    std::printf("command    %s\n", p.command.c_str());
  }
}

void print_json(const plan::Projection& p, const plan::ModelSource& src, const CgroupMemory& cg,
                const std::optional<plan::GpuProjection>& gpu, const std::optional<TracePlan>& tp, uint64_t mem_probe_bytes) {
  nlohmann::ordered_json j;
  j["verdict"] = plan::verdict_name(p.verdict);
  j["peak_bytes"] = p.peak;
  j["resident_weight_bytes"] = p.base.dense;
  j["lora_bytes"] = p.lora_bytes;
  j["expert_bytes"] = p.weights.experts;
  j["kv_bytes_per_token"] = p.state.kv_per_token;
  j["cache_budget_bytes"] = p.cache_budget;
  j["command"] = p.verdict == plan::Verdict::kNoFit ? "" : p.command;
  j["model"] = src.location;
  j["remote"] = src.remote;
  j["bytes_fetched"] = src.bytes_fetched;
  j["model_type"] = p.spec.model_type;
  j["architecture"] = p.architecture;
  j["ctx_size"] = p.shape.ctx;
  j["kv_bits"] = p.shape.kv_bits;
  j["prefill_step"] = p.shape.prefill_step;
  j["parallel"] = p.shape.parallel;
  j["threads"] = p.shape.threads;
  j["available_bytes"] = p.available;
  // The binding memory cgroup as read (limit − (usage − inactive file)); null outside one or with --ram-gb.
  if (cg.version != 0) {
    j["cgroup"] = {{"version", cg.version}, {"dir", cg.dir}, {"limit_bytes", cg.limit}, {"usage_bytes", cg.usage},
                   {"inactive_file_bytes", cg.inactive_file}, {"available_bytes", cg.available()}};
  } else {
    j["cgroup"] = nullptr;
  }
  j["reserve_bytes"] = p.reserve;
  j["components"] = {{"weights_total", p.weights.total},
                     {"dense_resident", p.base.dense},
                     {"embedding_on_demand", p.weights.embed_on_demand},
                     {"experts_resident", p.verdict == plan::Verdict::kStream ? 0 : p.weights.experts},
                     {"expert_cache", p.cache_bytes},
                     {"expert_slot", p.slot_bytes},
                     {"kv", p.state.kv},
                     {"kv_positions", p.kv_capacity},
                     {"kv_positions_windowed", p.kv_capacity_windowed},
                     {"recurrent_state", p.state.recurrent},
                     {"kv_grow_transient", p.state.grow_transient},
                     {"spec_trail", static_cast<uint64_t>(std::max(p.shape.draft_max, 0)) * p.state.recurrent *
                                        static_cast<uint64_t>(std::max(p.shape.parallel, 1))},
                     {"workspace", p.base.workspace},
                     {"tokenizer", p.base.tokenizer},
                     {"tables", p.base.tables},
                     {"runtime", p.base.runtime}};
  j["use_page_cache"] = p.use_page_cache;
  j["expected_hit_rate"] = p.expected_hit_rate;
  j["active_bytes_per_token"] = p.active_bytes_per_token;
  j["expert_bytes_per_token"] = p.expert_bytes_per_token;
  j["mem_gbps"] = p.mem_gbps ? nlohmann::ordered_json(*p.mem_gbps) : nlohmann::ordered_json();
  j["mem_probe_bytes"] = mem_probe_bytes ? nlohmann::ordered_json(mem_probe_bytes) : nlohmann::ordered_json();
  if (p.ranks > 1) {
    nlohmann::ordered_json r;
    r["ranks"] = p.ranks;
    r["rank_expert_bytes"] = p.rank_experts;
    r["rank_active_bytes_per_token"] = p.rank_active_bytes_per_token;
    r["net_bytes_per_token"] = p.net_bytes_per_token;
    r["exchanges_per_token"] = p.exchanges_per_token;
    r["link_latency_us"] = p.link_latency_us ? nlohmann::ordered_json(*p.link_latency_us) : nlohmann::ordered_json();
    r["link_gbps"] = p.link_gbps ? nlohmann::ordered_json(*p.link_gbps) : nlohmann::ordered_json();
    r["decode_tok_s"] = p.tok_s_ranks ? nlohmann::ordered_json(*p.tok_s_ranks) : nlohmann::ordered_json();
    r["rank_load_share"] = p.rank_load_share ? nlohmann::ordered_json(*p.rank_load_share) : nlohmann::ordered_json();
    r["contiguous_load_share"] = p.contiguous_load_share ? nlohmann::ordered_json(*p.contiguous_load_share) : nlohmann::ordered_json();
    j["expert_parallel"] = std::move(r);
  }
  j["disk_gbps"] = p.disk_gbps ? nlohmann::ordered_json(*p.disk_gbps) : nlohmann::ordered_json();
  j["decode_tok_s_mem_bound"] = p.tok_s_mem_bound ? nlohmann::ordered_json(*p.tok_s_mem_bound) : nlohmann::ordered_json();
  j["decode_tok_s_disk_bound"] = p.tok_s_disk_bound ? nlohmann::ordered_json(*p.tok_s_disk_bound) : nlohmann::ordered_json();
  if (gpu) {
    const plan::GpuPlacement& g = gpu->placement;
    auto opt = [](const std::optional<double>& v) { return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(); };
    j["gpu"] = {{"device", gpu->device},
                {"name", gpu->name},
                {"vram_total_bytes", gpu->vram_total},
                {"vram_budget_bytes", g.budget},
                {"dense_bytes", g.dense},
                {"state_bytes", g.state},
                {"workspace_bytes", g.workspace},
                {"expert_bytes", g.experts},
                {"fits", g.fits},
                {"experts_in_vram", g.experts_in_vram},
                {"vram_experts", plan::vram_tier_name(gpu->vram)},
                {"vram_used_bytes", g.fits ? g.used() : 0},
                {"vram_expert_slots", gpu->vram_slots},
                {"vram_hit_rate", gpu->vram_hit_rate},
                {"h2d_bytes_per_token", gpu->h2d_bytes_per_token},
                {"h2d_gbps", opt(gpu->h2d_gbps)},
                {"decode_tok_s_h2d_bound", opt(gpu->tok_s_h2d_bound)}};
  } else {
    j["gpu"] = nullptr;
  }
  if (tp) {
    auto opt = [](const std::optional<double>& v) { return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(); };
    j["trace"] = {{"file", tp->file},
                  {"trace_tokens", tp->trace_tokens},
                  {"trace_model_type", tp->shape.model_type},
                  {"trace_n_experts", tp->shape.n_experts},
                  {"trace_top_k", tp->shape.top_k},
                  {"n_gen", tp->n_gen},
                  {"repetitions", tp->reps},
                  {"parallel", tp->parallel},
                  {"cache_slots", tp->slots},
                  {"cache_policy", experts::cache_policy_name(tp->policy)},
                  {"profile_seeded", tp->seeded},
                  {"requests", tp->sim.requests},
                  {"hits", tp->sim.hits},
                  {"hit_rate", tp->hit_rate()},
                  {"resident", tp->resident},
                  {"experts_read_per_token", tp->sim.misses_per_token()},
                  {"bytes_read_per_token", tp->read_per_token},
                  {"decode_tok_s_disk_bound", opt(tp->tok_s_disk_bound)},
                  {"decode_tok_s", opt(tp->tok_s)},
                  {"stall_ms_per_token", opt(tp->stall_ms)},
                  {"compute_gbps", opt(tp->compute_gbps)}};
  } else {
    j["trace"] = nullptr;
  }
  j["notes"] = p.notes;
  std::printf("%s\n", j.dump(2).c_str());
}

// A synth preset as a header-only checkpoint: the config.json and the one safetensors header
// `spool synth --preset NAME` (bf16, all layers) would write; no file is read or written.
// Throws spool::UsageError for an unknown preset (listing the known ones).
plan::ModelSource preset_source(const std::string& name) {
  models::SynthOptions so;
  so.preset = name;
  const models::SynthHeaders h = models::synthetic_headers(so);
  const std::string label = "preset " + name;
  std::vector<io::SafetensorsFile> shards;
  const uint64_t data_start = 8 + h.safetensors_header.size();
  shards.push_back(io::SafetensorsFile::parse_header(h.safetensors_header, data_start, data_start + h.bytes, label));
  plan::ModelSource m;
  m.ckpt = io::Checkpoint::from_parts(label, io::Config(nlohmann::json::parse(h.config.dump()), label + " config.json"), nullptr,
                                      std::move(shards), models::checkpoint_rules());
  m.location = label;
  m.suggested_dir = "./" + name;  // where `spool synth --preset NAME -o ./NAME` writes it
  return m;
}

void run(const PlanOptions& o) {
  const uint64_t start_rss = current_rss_bytes();  // this binary before it reads anything: the runtime base
  // Available memory before the model's headers are read, as the loader measures it.
  const uint64_t available_now = o.ram_gb == 0 ? available_memory_bytes() : 0;
  const CgroupMemory cgroup_now = o.ram_gb == 0 ? cgroup_memory() : CgroupMemory{};  // read with available_now
  if (o.model.empty() == o.preset.empty()) throw UsageError("give one of --model DIR|URL or --preset NAME");
  if (o.ctx < 1 || o.ctx > (int64_t{1} << 24)) throw UsageError(strfmt("--ctx-size must be 1..16777216 (got %lld)", (long long)o.ctx));
  if (o.kv_bits != 8 && o.kv_bits != 16 && o.kv_bits != 32) throw UsageError(strfmt("--kv-bits must be 8, 16 or 32 (got %d)", o.kv_bits));
  if (o.prefill_step < 1) throw UsageError(strfmt("--prefill-step-size must be positive (got %lld)", (long long)o.prefill_step));
  if (o.parallel < 1 || o.parallel > 256) throw UsageError(strfmt("--parallel must be between 1 and 256 (got %d)", o.parallel));
  if (o.ram_gb < 0 || o.ram_gb > 1e6) throw UsageError("--ram-gb must be in (0, 1e6]");
  if (o.disk_gbps < 0 || o.mem_gbps < 0) throw UsageError("--disk-gbps and --mem-gbps must be positive");
  if (o.mem_probe_mib < 0 || o.mem_probe_mib > (int64_t{1} << 20))
    throw UsageError(strfmt("--mem-probe-mib must be 1..1048576, or 0 for auto (got %lld)", (long long)o.mem_probe_mib));
  if (o.mem_probe_mib > 0 && (o.mem_gbps > 0 || o.ram_gb > 0))
    throw UsageError("--mem-probe-mib sizes the memory probe of this machine: it does not go with --mem-gbps or --ram-gb");
  if (o.threads < 0 || o.threads > 1024) throw UsageError("--threads must be 1..1024, or 0 for all hardware threads");
  if (o.ranks < 1 || o.ranks > 4096) throw UsageError(strfmt("--ranks must be 1..4096 (got %d)", o.ranks));
  if ((o.link_latency_us && !(*o.link_latency_us >= 0 && *o.link_latency_us <= 1e7)) || (o.link_gbps && !(*o.link_gbps > 0 && *o.link_gbps <= 1e6)))
    throw UsageError("--link-latency-us must be in [0, 1e7] and --link-gbps in (0, 1e6]");
  if ((o.link_latency_us || o.link_gbps) && o.ranks < 2) throw UsageError("--link-latency-us and --link-gbps need --ranks 2 or more");
  if (!o.expert_owners.empty() && o.ranks < 2) throw UsageError("--expert-owners needs --ranks 2 or more");
  if (o.ranks > 1 && (o.vram_gb != -1 || (o.device != "auto" && o.device != "cpu")))
    throw UsageError("--ranks plans CPU runs (--device cpu): GPU runs over several ranks (NCCL) load, but cannot be planned yet");
  experts::parse_cache_policy(o.cache_policy);  // UsageError for another name
  if (!(o.cache_half_life > 0) || !std::isfinite(o.cache_half_life))
    throw UsageError(strfmt("--cache-half-life must be a positive number of tokens (got %g)", o.cache_half_life));
  if ((o.cache_policy != "lru" || !o.expert_profile.empty()) && o.trace.empty())
    throw UsageError("--cache-policy and --expert-profile are simulated with --trace only");
  if (o.compute_gbps < 0) throw UsageError(strfmt("--compute-gbps must be positive, or 0 to measure (got %g)", o.compute_gbps));
  if (o.trace.empty() && (o.compute_gbps > 0 || o.no_hits_first))
    throw UsageError("--compute-gbps and --no-hits-first go into the decode-time model of --trace: give --trace FILE");
  if (o.ranks > 1 && !o.trace.empty()) throw UsageError("--trace simulates one process's cache: it cannot be combined with --ranks yet");
  if (o.vram_gb != -1 && !(o.vram_gb > 0 && o.vram_gb <= 1e6)) throw UsageError("--vram-gb must be in (0, 1e6]");
  if (o.h2d_gbps < 0) throw UsageError("--h2d-gbps must be positive");
  // --vram-gb alone plans for a stated GPU; with --device cuda[:N] (or a GPU found by auto) the
  // GPU's name and memory come from the device, --vram-gb then standing for --vram-budget-gb.
  if (o.device == "cpu" && o.vram_gb > 0) throw UsageError("--vram-gb plans a GPU run: it contradicts --device cpu");
  // (--ranks: a CPU run on every rank, whatever GPU this machine has)
  const int gpu_index = o.ranks > 1 || (o.device == "auto" && o.vram_gb > 0 && engine::cuda_devices() == 0) ? -1 : engine::resolve_device(o.device);

  if (o.stream && o.no_stream) throw UsageError("--stream and --no-stream contradict each other");
  std::optional<uint64_t> budget;
  if (o.cache_budget != "auto") {
    char* end = nullptr;
    const double g = std::strtod(o.cache_budget.c_str(), &end);
    if (end == o.cache_budget.c_str() || *end != '\0' || !(g >= 0) || !(g <= 1e6))
      throw UsageError(strfmt("--cache-budget-gb must be a number of GB in [0, 1e6] or 'auto' (got '%s')", o.cache_budget.c_str()));
    budget = static_cast<uint64_t>(g * (1ull << 30));
  }
  if (o.spec != "none" && o.spec != "mtp") throw UsageError(strfmt("--spec must be none or mtp (got '%s')", o.spec.c_str()));
  const bool mtp = o.spec == "mtp";
  if (mtp && (o.draft_max < 1 || o.draft_max > 16)) throw UsageError(strfmt("--draft-max must be 1..16 (got %d)", o.draft_max));
  if (!mtp && o.draft_max != 1) throw UsageError("--draft-max needs --spec mtp");
  if (o.n_gen < 1 || o.n_gen > 1000000) throw UsageError(strfmt("--n-gen must be 1..1000000 (got %d)", o.n_gen));
  if (o.reps < 1 || o.reps > 1000) throw UsageError(strfmt("--repetitions must be 1..1000 (got %d)", o.reps));
  if (mtp && !o.preset.empty()) throw UsageError("--spec mtp plans a model's own head: give --model, not --preset");
  plan::ModelSource src = o.preset.empty() ? plan::open_source(o.model, 1 << 20, mtp) : preset_source(o.preset);
  if (mtp && src.ckpt.mtp_layers() == 0)
    fail("%s: --spec mtp: the model has no multi-token-prediction layers%s", src.location.c_str(),
         src.ckpt.gguf() ? " (a GGUF keeps them as {arch}.nextn_predict_layers and blk.N.nextn.*; llama.cpp's converter drops them with --no-mtp)" : "");
  plan::PlanInputs in;
  if (!o.lora.empty() && !o.preset.empty()) throw UsageError("--lora plans adapters over a model: give --model, not --preset");
  for (const std::string& arg : o.lora) {  // (validated as the run does; adapters are local files)
    const engine::LoraOption a = engine::parse_lora_option(arg);
    in.lora_bytes += lora::load_adapter(a.path, src.ckpt, models::checkpoint_rules()).run_bytes();
    in.lora_args.push_back(arg);
  }
  in.shape.ctx = o.ctx;
  in.shape.kv_bits = o.kv_bits;
  in.shape.prefill_step = o.prefill_step;
  in.shape.parallel = o.parallel;
  in.shape.draft_max = mtp ? o.draft_max : 0;
  const unsigned hw = std::thread::hardware_concurrency();
  in.shape.threads = o.threads > 0 ? o.threads : (hw ? static_cast<int>(hw) : 1);
  in.shape.tokenizer_json_bytes = src.tokenizer_json_bytes;
  in.shape.start_rss = start_rss;
  in.kv_bits_given = o.kv_bits_given;
  in.model_arg = src.suggested_dir;
  if (o.stream || budget) in.stream = true;
  if (o.no_stream) in.stream = false;
  in.cache_budget = budget;
  in.ranks = o.ranks;
  in.link_latency_us = o.link_latency_us;
  in.link_gbps = o.link_gbps;
  in.expert_owners = o.expert_owners;
  const bool this_machine = o.ram_gb == 0;
  in.available = this_machine ? available_now : static_cast<uint64_t>(o.ram_gb * (1ull << 30));
  uint64_t mem_probe_bytes = 0;  // the buffer the probe read; 0 = not measured
  if (o.mem_gbps > 0) {
    in.mem_gbps = o.mem_gbps;
  } else if (this_machine) {
    // A buffer several times the last-level cache, so the probe reads DRAM as a decode's weights do.
    mem_probe_bytes = o.mem_probe_mib > 0 ? static_cast<uint64_t>(o.mem_probe_mib) << 20
                                          : plan::memory_probe_bytes(plan::last_level_cache_bytes(), available_now);
    in.mem_gbps = plan::measure_memory_gbps(mem_probe_bytes, in.shape.threads, 0.3);
  }
  if (o.disk_gbps > 0) {
    in.disk_gbps = o.disk_gbps;
  } else if (this_machine && !src.remote && o.preset.empty() && !src.ckpt.shards().empty()) {
    const auto& shards = src.ckpt.shards();
    const auto big = std::max_element(shards.begin(), shards.end(), [](const auto& a, const auto& b) { return a.file_size() < b.file_size(); });
    const plan::DiskProbe d = plan::measure_disk_gbps(big->path(), 256ull << 20, 4ull << 20, 4, 1.0);
    if (d.ok && d.direct) in.disk_gbps = d.gbps;
  }
  // The GPU run to plan: a device (its memory; --vram-gb standing for --vram-budget-gb) or a stated budget.
  const bool plan_gpu = gpu_index >= 0 || o.vram_gb > 0;
  const engine::GpuInfo info = engine::gpu_info(gpu_index);
  if (plan_gpu)
    in.vram_budget = o.vram_gb > 0 ? static_cast<uint64_t>(o.vram_gb * (1ull << 30))
                                   : plan::auto_vram_budget(info.total_bytes, info.free_bytes);  // as the loader
  plan::Projection p = plan::project(src.ckpt, in);
  std::optional<plan::GpuProjection> gpu;
  if (plan_gpu) {
    std::optional<double> h2d;
    if (o.h2d_gbps > 0) h2d = o.h2d_gbps;
    else if (gpu_index >= 0) h2d = engine::h2d_gbps(gpu_index, 256ull << 20, /*pinned=*/true);
    gpu = plan::project_gpu(p.placement, p.expert_bytes_per_token, p.expert_count, h2d);
    gpu->device = gpu_index >= 0 ? strfmt("cuda:%d", gpu_index) : "stated";
    gpu->name = info.name;
    gpu->vram_total = info.total_bytes;
    if (!gpu->placement.fits)
      p.notes.push_back("the dense weights, KV/state and workspace do not fit the VRAM budget: run with --device cpu, or a smaller --ctx-size");
    else if (gpu->vram == plan::VramTier::kStatic && !p.command.empty())
      p.notes.push_back("the routed experts do not all fit in VRAM: a fixed share of them stays in VRAM, the rest is copied once to "
                        "page-locked host memory that the GPU reads in place (--vram-experts static, auto's choice when every "
                        "expert fits in host memory; --vram-experts slots: LRU VRAM slots over the pinned RAM tier)");
    else if (gpu->vram == plan::VramTier::kSlots && !p.command.empty())
      p.notes.push_back("the routed experts stay in host memory: VRAM slots keep the most recently used ones, each miss is "
                        "copied to the GPU when used from the pinned RAM tier (the streaming cache: every expert when they fit "
                        "in the memory left; --no-stream: the pageable mapping)");
  }
  if (src.ckpt.mtp_bytes() > 0)
    p.notes.push_back(mtp ? strfmt("the multi-token-prediction head (%s) is counted (--spec mtp)", format_bytes(src.ckpt.mtp_bytes()).c_str())
                          : strfmt("the multi-token-prediction head (%s) is not counted: plan with --spec mtp for speculative decoding",
                                   format_bytes(src.ckpt.mtp_bytes()).c_str()));
  if (!this_machine) p.notes.push_back(strfmt("planned for %.1f GiB available (--ram-gb), not this machine", o.ram_gb));
  if (!in.disk_gbps && p.verdict == plan::Verdict::kStream) p.notes.push_back("give --disk-gbps for a decode bound from disk bandwidth");
  std::optional<TracePlan> tp;
  if (!o.trace.empty()) {
    const experts::Trace trace = experts::read_trace(o.trace);
    if (p.spec.moe.n_experts <= 0) fail("%s: --trace: the model has no routed experts", src.location.c_str());
    const experts::TraceMap map(trace, moe_layers_of(p.spec), p.spec.moe.n_experts);
    tp.emplace();
    tp->file = o.trace;
    tp->shape = trace.shape;
    tp->trace_tokens = trace.n_tokens;
    tp->n_gen = o.n_gen;
    tp->reps = o.reps;
    tp->parallel = o.parallel;
    // What one miss reads: the expert's bytes through the page cache, its whole 4096-aligned
    // slot with O_DIRECT (the reader's aligned extents).
    tp->expert_bytes = p.verdict == plan::Verdict::kStream && !p.use_page_cache && p.slot_bytes ? p.slot_bytes
                       : p.expert_count                                                     ? p.weights.experts / p.expert_count
                                                                                            : 0;
    // A streaming run's cache holds budget / slot entries (ExpertCache::capacity()); resident
    // experts never miss (bench reports a 100% hit rate without streaming).
    if (p.verdict == plan::Verdict::kStream && p.slot_bytes) {
      tp->slots = std::max<int64_t>(1, static_cast<int64_t>(p.cache_budget / p.slot_bytes));
      const std::vector<int> moe = moe_layers_of(p.spec);
      tp->policy = experts::parse_cache_policy(o.cache_policy);
      const experts::CachePolicyOptions pol =
          experts::cache_policy_options(tp->policy, o.cache_half_life, static_cast<int>(moe.size()), p.spec.moe.top_k);
      std::vector<experts::ExpertCount> seed;
      if (!o.expert_profile.empty() && tp->policy == experts::CachePolicy::kLfu) {  // as the loader seeds the run's cache
        const experts::ProfileData d = experts::read_profile(o.expert_profile);
        if (d.shape.moe_layers != moe || d.shape.n_experts != p.spec.moe.n_experts)
          fail("--expert-profile %s: a profile of another model (%zu MoE layers of %d experts; this one has %zu of %d)",
               o.expert_profile.c_str(), d.shape.moe_layers.size(), d.shape.n_experts, moe.size(), p.spec.moe.n_experts);
        seed = experts::profile_counts(d);
        tp->seeded = true;
      }
      tp->sim = experts::simulate_tg(map, p.spec.moe.top_k, tp->slots, o.n_gen, o.reps, o.parallel, pol, seed);
    } else {
      tp->slots = static_cast<int64_t>(p.expert_count);
      tp->resident = true;
      tp->sim.tokens = static_cast<int64_t>(o.reps) * o.n_gen * std::max(o.parallel, 1);
    }
    tp->read_per_token = tp->sim.misses_per_token() * static_cast<double>(tp->expert_bytes);
    // A step of --parallel sequences: the active bytes read from memory once (the dense weights
    // dominate them), plus what each acquire waits for its misses beyond the work that overlaps
    // their reads (experts::model_decode_time); tok/s over all sequences.
    const double seqs = static_cast<double>(std::max(o.parallel, 1));
    // The routed experts' compute rate: memory bandwidth, or the CPU kernels' rate over expert
    // weights when that is lower (few cores, small matrices: the kernels, not memory, bound them;
    // measured on this checkpoint's experts unless --compute-gbps gives it).
    if (o.compute_gbps > 0) {
      tp->compute_gbps = o.compute_gbps;
    } else if (this_machine && !src.remote && o.preset.empty() && p.spec.moe.n_experts > 0 && gpu_index < 0 && !plan_gpu) {
      const std::vector<int> moe = moe_layers_of(p.spec);
      try {
        std::vector<bool> is_moe(static_cast<size_t>(p.spec.n_layers), false);
        for (int l : moe) is_moe[static_cast<size_t>(l)] = true;
        const double g = experts::measure_expert_gbps(std::shared_ptr<const io::Checkpoint>(&src.ckpt, [](const io::Checkpoint*) {}), is_moe,
                                                      moe.front(), p.spec.moe.n_experts, static_cast<int>(p.spec.hidden_size),
                                                      p.spec.moe.intermediate, in.shape.threads, 0.3);
        if (g > 0) tp->compute_gbps = g;
      } catch (const Error& e) {  // (a layout the probe does not bind: memory bandwidth stands for compute)
        p.notes.push_back(std::string("the expert compute probe did not run: ") + e.what());
      }
    }
    const std::optional<double> rate = tp->compute_gbps && p.mem_gbps ? std::min(*tp->compute_gbps, *p.mem_gbps) : p.mem_gbps;
    const double t_mem = rate && p.active_bytes_per_token ? static_cast<double>(p.active_bytes_per_token) / (*rate * 1e9) : 0;
    const double t_disk = p.disk_gbps ? seqs * tp->read_per_token / (*p.disk_gbps * 1e9) : 0;
    if (p.disk_gbps && t_disk > 0) tp->tok_s_disk_bound = seqs / t_disk;
    if (p.mem_gbps && tp->read_per_token == 0 && t_mem > 0) {
      tp->tok_s = seqs / t_mem;
      tp->stall_ms = 0.0;
    } else if (p.mem_gbps && p.disk_gbps && t_mem > 0) {
      experts::DecodeTimeInputs di;
      di.n_seqs = std::max(o.parallel, 1);
      di.n_moe_layers = static_cast<int>(moe_layers_of(p.spec).size());
      // The step's compute apart from the routed experts (read once per step); the experts are
      // counted per acquire by the model: several sequences compute every expert they route to.
      // The dense part runs as large products at memory bandwidth; the routed experts (and the
      // overlaps, all experts) at the experts' kernel rate (the lower of it and memory).
      di.compute_s = static_cast<double>(p.active_bytes_per_token - std::min(p.active_bytes_per_token, p.expert_bytes_per_token)) /
                     (*p.mem_gbps * 1e9);
      di.read_bytes = static_cast<double>(tp->expert_bytes);
      di.expert_bytes = p.expert_count ? static_cast<double>(p.weights.experts) / static_cast<double>(p.expert_count) : 0;
      di.shared_bytes = p.spec.moe.n_experts > 0 && p.spec.moe.intermediate > 0
                            ? di.expert_bytes * p.spec.moe.shared_intermediate / p.spec.moe.intermediate
                            : 0;
      di.mem_gbps = *rate;
      di.disk_gbps = *p.disk_gbps;
      di.hits_first = !o.no_hits_first;
      const experts::DecodeTime dt = experts::model_decode_time(tp->sim, di);
      tp->tok_s = dt.tok_s;
      tp->stall_ms = dt.stall_s_per_token * 1e3;
    }
  }
  if (o.json) print_json(p, src, cgroup_now, gpu, tp, mem_probe_bytes);
  else print_text(p, src, gpu, tp, mem_probe_bytes);
  std::fflush(stdout);
  // documented exit status: does not fit (host memory, or VRAM on a GPU run)
  if (p.verdict == plan::Verdict::kNoFit || (gpu && !gpu->placement.fits)) std::exit(1);
}

}  // namespace

void register_plan(CLI::App& app) {
  auto o = std::make_shared<PlanOptions>();
  CLI::App* c = app.add_subcommand("plan", "Project memory and speed of a model from its safetensors headers (local dir or URL)");
  CLI::Option* om = c->add_option("-m,--model", o->model, "Model directory or .gguf file, or a base URL (e.g. https://huggingface.co/ORG/NAME/resolve/main/) or a .gguf URL (GGUF headers only, by Range requests)");
  std::string presets;
  for (const auto& p : models::presets()) presets += (presets.empty() ? "" : ", ") + p.name;
  c->add_option("--preset", o->preset,
                "Plan a synth preset at its released size (bf16, all layers; no files needed) instead of --model: " + presets)
      ->excludes(om);
  c->add_option("-c,--ctx-size", o->ctx, "Tokens of context to plan for (default 4096)");
  CLI::Option* kv = c->add_option("--kv-bits", o->kv_bits, "KV cache bits: 32 (exact, default), 16 or 8");
  c->add_option("--prefill-step-size", o->prefill_step, "Prompt tokens per forward pass (default 512)");
  c->add_option("--parallel", o->parallel, "Sequences run together, as `spool serve --parallel N` (-np N): KV/state per sequence (default 1)");
  c->add_option("--ram-gb", o->ram_gb, "Plan for this much available memory (GiB) instead of this machine's");
  c->add_option("--disk-gbps", o->disk_gbps, "Direct-read disk bandwidth, GB/s (default: measured on a local model's shard)");
  c->add_option("--mem-gbps", o->mem_gbps, "Memory read bandwidth, GB/s (default: measured on this machine)");
  c->add_option("--mem-probe-mib", o->mem_probe_mib,
                "Buffer of the memory bandwidth probe, MiB (default 0 = auto: 4x the last-level cache, 256 MiB to 2 GiB, at most "
                "a quarter of the available memory)");
  c->add_option("-t,--threads", o->threads, "Threads the run will use (default 0 = all hardware threads)");
  c->add_flag("--stream", o->stream, "Plan a streaming run even if the experts would fit");
  c->add_flag("--no-stream", o->no_stream, "Plan with every expert resident");
  c->add_option("--cache-budget-gb", o->cache_budget, "Plan a streaming run with this expert cache budget (GB) instead of auto");
  c->add_option("--device", o->device,
                 "Plan the GPU part for cpu, cuda, cuda:N or auto (default: cuda:0 when this build has CUDA and a GPU is present)");
  c->add_option("--vram-gb", o->vram_gb,
                "Plan for a GPU with this VRAM budget (GiB; with a GPU present it stands for --vram-budget-gb, default its auto: the free memory less 512 MiB, at most 90%)");
  c->add_option("--h2d-gbps", o->h2d_gbps, "Host-to-device bandwidth, GB/s (default: measured on the GPU, pinned memory)");
  c->add_flag("--json", o->json, "Print JSON");
  c->add_option("--spec", o->spec, "Plan for speculative decoding: 'mtp' counts the model's multi-token-prediction head (default none)")
      ->check(CLI::IsMember({"none", "mtp"}));
  c->add_option("--draft-max", o->draft_max, "With --spec mtp: drafts per step (1..16, default 1): each sequence keeps that many copies "
                                             "of its Gated DeltaNet state");
  c->add_option("--trace", o->trace,
                "Predict the expert cache's hit rate, bytes read per token and decode tok/s from this routing trace (spool "
                "calibrate --trace-out) by simulating the cache: what spool bench -p 0 -n N -r R --routing-trace FILE measures");
  c->add_option("-n,--n-gen", o->n_gen, "With --trace: tokens per repetition of the bench tg test simulated (default 128)");
  c->add_option("--cache-policy", o->cache_policy, "With --trace: the replacement policy simulated, lru (default) or lfu, as the run's --cache-policy");
  c->add_option("--cache-half-life", o->cache_half_life, "With --trace and --cache-policy lfu: the run's --cache-half-life (tokens, default 100000)");
  c->add_option("--compute-gbps", o->compute_gbps,
                "With --trace: GB/s of routed-expert weights the CPU kernels process (default: measured on the checkpoint's "
                "experts); the experts compute at the lower of this and the memory bandwidth, the dense part at memory bandwidth");
  c->add_flag("--no-hits-first", o->no_hits_first,
              "With --trace: model a run with --no-hits-first (a layer's cached experts do not compute while its misses are read)");
  c->add_option("--expert-profile", o->expert_profile,
                "With --trace and --cache-policy lfu: the run's --expert-profile, whose counts seed the simulated cache as they seed the run's");
  c->add_option("--lora", o->lora,
                "LoRA adapter FILE[:SCALE] the run will load (repeatable; PEFT directory or llama.cpp .gguf): its bytes count "
                "with the resident dense weights, and the command repeats the flag (docs/lora.md)");
  c->add_option("--ranks", o->ranks,
                "Plan expert parallelism over N ranks (mpirun -n N spool ...; docs/distributed.md): one rank's memory with its share "
                "of the routed experts, the bytes between the ranks per token (default 1)");
  c->add_option_function<double>(
      "--link-latency-us", [o](double v) { o->link_latency_us = v; },
      "With --ranks: microseconds of one MoE layer's exchange between the ranks (spool doctor under mpirun measures it)");
  c->add_option("--expert-owners", o->expert_owners,
                 "With --ranks: the experts placed on the ranks balanced by the routing in FILE (an --expert-profile file or a "
                 "routing trace), as the run's --expert-owners: the busiest rank's share of the routings, and its reads");
  c->add_option_function<double>("--link-gbps", [o](double v) { o->link_gbps = v; },
                                 "With --ranks: GB/s one rank receives from the others (spool doctor under mpirun)");
  c->add_option("-r,--repetitions", o->reps, "With --trace: timed repetitions simulated after one warm-up (default 5)");
  c->callback([o, kv] {
    o->kv_bits_given = kv->count() > 0;
    run(*o);
  });
}

}  // namespace spool::cli
