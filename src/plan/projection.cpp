#include "plan/projection.h"

#include "dist/expert_parallel.h"
#include "experts/expert_profile.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "common/sysinfo.h"
#include "models/model.h"
#include "plan/arch.h"

namespace spool::plan {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string gb_arg(uint64_t bytes) {
  // Rounded down to 0.01 GiB so the engine never gets more than was planned.
  const double g = std::floor(static_cast<double>(bytes) / kGiB * 100.0) / 100.0;
  return strfmt("%.2f", g);
}

// Layer index of a normalised tensor name "layers.N.*", else -1.
int layer_of(const std::string& name) {
  if (name.rfind("layers.", 0) != 0) return -1;
  size_t i = 7;
  int n = 0;
  bool digit = false;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i, digit = true) n = n * 10 + (name[i] - '0');
  return digit && i < name.size() && name[i] == '.' ? n : -1;
}

}  // namespace

GpuProjection project_gpu(const Placement& placement, uint64_t expert_bytes_per_token, uint64_t expert_count,
                          std::optional<double> h2d_gbps) {
  GpuProjection g;
  if (placement.gpu) g.placement = *placement.gpu;
  g.vram = placement.vram;
  g.h2d_gbps = h2d_gbps;
  if (placement.vram == VramTier::kStatic || placement.vram == VramTier::kSlots) {
    g.vram_slots = placement.vram_slots;
    g.vram_hit_rate = expert_count > 0 ? static_cast<double>(g.vram_slots) / static_cast<double>(expert_count) : 0;
    g.h2d_bytes_per_token = static_cast<uint64_t>(static_cast<double>(expert_bytes_per_token) * (1.0 - g.vram_hit_rate) + 0.5);
    if (h2d_gbps && *h2d_gbps > 0 && g.h2d_bytes_per_token > 0) g.tok_s_h2d_bound = *h2d_gbps * 1e9 / static_cast<double>(g.h2d_bytes_per_token);
  }
  return g;
}

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::kResident: return "resident";
    case Verdict::kStream: return "stream";
    case Verdict::kNoFit: return "no_fit";
  }
  return "no_fit";
}

BaseNeeds base_needs(const WeightBytes& w, const models::ModelSpec& spec, const RunShape& sh) {
  BaseNeeds b;
  // A kept multi-token-prediction head (--spec mtp) has its own KV cache: the state of the
  // stack with the MTP layers after it (models::mtp_spec).
  const models::ModelSpec full = models::mtp_spec(spec);
  const StateBytes st = state_bytes(full, kv_capacities(full, sh.ctx, sh.ctx, sh.prefill_step), sh.kv_bits);
  b.dense = w.resident_dense + w.f32_copies;
  const uint64_t n = static_cast<uint64_t>(std::max(sh.parallel, 1));
  // (speculation: each sequence's step trail holds draft_max more copies of its recurrent state)
  b.state = n * (st.kv + st.recurrent * (1 + static_cast<uint64_t>(std::max(sh.draft_max, 0)))) + st.grow_transient;
  const int64_t chunk = std::min(sh.prefill_step, sh.ctx), rows = step_rows(chunk, sh.parallel);
  b.workspace = workspace_bytes(spec, rows, sh.ctx, sh.threads, w.any_quantized);
  if (n > 1) {
    // The arena's per-sequence part (last rows' normed input and logits) and each further
    // slot's logits and sampler buffers (batch_engine.cpp Slot::logits, GenStepper's copy, the
    // sampler's cand_ and counts_: what workspace_bytes counts once).
    const uint64_t V = static_cast<uint64_t>(spec.vocab_size);
    b.workspace += models::workspace_arena_bytes(spec, rows, sh.parallel) - models::workspace_arena_bytes(spec, rows, 1);
    b.workspace += (n - 1) * (2 * V * sizeof(float) + V * (sizeof(float) + sizeof(int32_t)) + V * sizeof(int32_t));
  }
  b.tokenizer = sh.tokenizer_json_bytes ? tokenizer_bytes(sh.tokenizer_json_bytes) : 0;
  // The tables are added to the tokenizer's heap, not folded into it: measured on the demo,
  // only part of them lands in the holes its parse leaves (the TensorRef array is one block
  // of ~1 MB for 8,000 tensors, which glibc maps on its own), so the sum is an upper bound.
  b.tables = w.tables;
  b.runtime = runtime_base_bytes(sh.threads, sh.start_rss);
  return b;
}

Projection project(const io::Checkpoint& ck, const PlanInputs& in) {
  Projection p;
  PlanModel pm = plan_model(ck);
  p.spec = std::move(pm.spec);
  p.architecture = std::move(pm.architecture);
  p.notes = std::move(pm.notes);
  p.weights = weight_bytes(ck, p.spec);
  if (ck.mtp_layers() == 0) {
    // Layers past num_hidden_layers (DeepSeek-V3's multi-token-prediction layer, stored as
    // layers.61) are not used to decode without --spec mtp (a checkpoint opened keeping them,
    // io::Checkpoint::Options::mtp, counts them): left out of every figure.
    uint64_t extra = 0, extra_experts = 0;
    for (const auto& t : ck.tensors()) {
      if (layer_of(t.name) < p.spec.n_layers) continue;
      extra += t.nbytes;
      if (t.expert_layer >= 0) extra_experts += t.nbytes;
    }
    p.weights.total -= extra;
    p.weights.experts -= extra_experts;
    p.weights.dense -= extra - extra_experts;
    p.weights.resident_dense -= extra - extra_experts;
  }
  p.shape = in.shape;
  p.available = in.available;
  p.reserve = reserve_bytes(in.available);
  p.mem_gbps = in.mem_gbps;
  p.disk_gbps = in.disk_gbps;
  const int n_moe = static_cast<int>(std::count(p.spec.ffns.begin(), p.spec.ffns.end(), models::FfnKind::kMoE));
  p.expert_count = static_cast<uint64_t>(n_moe) * std::max(p.spec.moe.n_experts, 0);

  // One expert cache slot through the page cache and with O_DIRECT (aligned): the policy is the placement's.
  const uint64_t slot_page_cache = expert_slot_bytes(ck, p.spec, /*direct=*/false);
  const uint64_t slot_direct = expert_slot_bytes(ck, p.spec, /*direct=*/true);

  auto evaluate = [&](int kv_bits) {
    RunShape sh = in.shape;
    sh.kv_bits = kv_bits;
    p.shape = sh;
    const KvCapacity cap = kv_capacities(p.spec, sh.ctx, sh.ctx, sh.prefill_step);
    p.kv_capacity = cap.full;
    p.kv_capacity_windowed = p.spec.attn.window_bounds_kv && p.spec.attn.sliding_window > 0 ? cap.windowed : 0;
    p.state = state_bytes(models::mtp_spec(p.spec), cap, kv_bits);  // (with a kept MTP head: its KV too, as base_needs)
    p.base = base_needs(p.weights, p.spec, sh);
    p.base.dense += in.lora_bytes;  // as engine::load: the adapters' f32 matrices stay resident (docs/lora.md)
    p.lora_bytes = in.lora_bytes;
    // The placement engine::load would decide (plan::decide_placement) from these figures.
    PlacementFacts f;
    f.base = p.base;
    f.available = in.available;
    f.experts = p.weights.experts;
    f.expert_count = p.expert_count;
    f.slot_bytes_page_cache = slot_page_cache;
    f.slot_bytes_direct = slot_direct;
    f.top_k = p.spec.moe.top_k;
    f.file_bytes = p.weights.file_bytes;
    if (in.vram_budget) {
      const uint64_t seqs = static_cast<uint64_t>(std::max(sh.parallel, 1));
      f.gpu = GpuFacts{.budget = *in.vram_budget,
                       .dense = p.base.dense,
                       .state = seqs * (p.state.kv + p.state.recurrent),
                       .workspace = p.base.workspace,
                       .expert_slot_bytes = p.expert_count ? p.weights.experts / p.expert_count : 0,  // one routed expert
                       .one_token = p.spec.moe.top_k};
    }
    f = rank_facts(f, p.spec.moe.n_experts, in.ranks);  // (one rank: unchanged)
    PlacementOptions o;
    o.stream = in.stream;
    o.cache_budget = in.cache_budget;
    p.placement = decide_placement(f, o);
    const Placement& pl = p.placement;
    p.use_page_cache = pl.use_page_cache;
    if (pl.stream) p.slot_bytes = pl.cache_slot_bytes;
    p.cache_budget = pl.cache_budget;
    p.cache_bytes = pl.cache_peak;
    p.peak = pl.peak;
    p.verdict = !pl.host_fits ? Verdict::kNoFit : pl.stream ? Verdict::kStream : Verdict::kResident;
  };
  evaluate(in.shape.kv_bits);
  if (!in.kv_bits_given && !in.stream && !in.cache_budget && in.shape.kv_bits == 32 && p.verdict != Verdict::kResident && p.state.kv > 0) {
    const Verdict before = p.verdict;
    const uint64_t budget_before = p.cache_budget;
    Projection keep = p;
    evaluate(8);
    if (p.verdict < before || (p.verdict == before && p.cache_budget > budget_before + (256ull << 20))) {
      p.notes.push_back(strfmt("--kv-bits 8 chosen: int8 KV (%s less at %lld tokens) %s; it changes outputs slightly (32 is exact)",
                               format_bytes(keep.state.kv - p.state.kv).c_str(), (long long)in.shape.ctx,
                               p.verdict < before ? strfmt("turns '%s' into '%s'", verdict_name(before), verdict_name(p.verdict)).c_str()
                                                  : "leaves more memory for the expert cache"));
    } else {
      p = std::move(keep);
    }
  }

  // Bytes read per decoded token: the resident dense weights (lm_head included; it is the
  // embedding table itself when tied), one row of an untied embedding table (read on demand),
  // the top-k experts of every MoE layer and the KV cache over the context.
  const uint64_t per_expert = p.expert_count ? p.weights.experts / p.expert_count : 0;
  p.expert_bytes_per_token = per_expert * static_cast<uint64_t>(p.spec.moe.top_k) * n_moe;
  // KV read: every attention layer over the context, a windowed layer over its window only
  // (gpt-oss windows every other layer: AttentionSpec::windowed).
  int n_attn = 0;
  for (int i = 0; i < p.spec.n_layers; ++i)
    n_attn += p.spec.mixers[i] == models::MixerKind::kAttention || p.spec.mixers[i] == models::MixerKind::kMLA;
  const uint64_t kv_layer = n_attn > 0 ? p.state.kv_per_token / static_cast<uint64_t>(n_attn) : 0;
  uint64_t kv_read = 0;
  for (int i = 0; i < p.spec.n_layers; ++i) {
    if (p.spec.mixers[i] != models::MixerKind::kAttention && p.spec.mixers[i] != models::MixerKind::kMLA) continue;
    const int64_t seen = p.spec.attn.windowed(i) ? std::min(in.shape.ctx, p.spec.attn.sliding_window) : in.shape.ctx;
    kv_read += kv_layer * static_cast<uint64_t>(seen);
  }
  const uint64_t embed_row = p.spec.vocab_size > 0 ? p.weights.embed_on_demand / static_cast<uint64_t>(p.spec.vocab_size) : 0;
  p.active_bytes_per_token = p.weights.resident_dense + embed_row + p.expert_bytes_per_token + kv_read;
  p.ranks = std::max(in.ranks, 1);
  p.rank_experts = static_cast<uint64_t>(static_cast<double>(p.weights.experts) * rank_expert_share(p.spec.moe.n_experts, p.ranks));
  const uint64_t experts_here = p.ranks > 1 ? p.rank_experts : p.weights.experts;  // what this (largest) rank caches
  p.expected_hit_rate = p.verdict == Verdict::kStream && experts_here
                            ? std::min(1.0, static_cast<double>(p.cache_bytes) / static_cast<double>(experts_here))
                            : 1.0;
  if (in.mem_gbps && p.active_bytes_per_token) p.tok_s_mem_bound = *in.mem_gbps * 1e9 / static_cast<double>(p.active_bytes_per_token);
  if (in.disk_gbps && p.verdict == Verdict::kStream && p.expert_bytes_per_token) {
    const double miss = std::max(1e-9, 1.0 - p.expected_hit_rate);
    p.tok_s_disk_bound = *in.disk_gbps * 1e9 / (static_cast<double>(p.expert_bytes_per_token) / p.ranks * miss);
  }
  if (p.ranks > 1) {
    p.rank_active_bytes_per_token = p.active_bytes_per_token - p.expert_bytes_per_token + p.expert_bytes_per_token / static_cast<uint64_t>(p.ranks);
    if (!in.expert_owners.empty() && p.spec.moe.n_experts >= p.ranks) {
      const int E = p.spec.moe.n_experts;
      const std::vector<std::vector<double>> load = experts::routing_load(in.expert_owners, p.spec.n_layers + p.spec.mtp_layers, E);
      const dist::ExpertOwners balanced = dist::ExpertOwners::balanced(load, E, p.ranks), blocks(E, p.ranks);
      double b = 0, c = 0;
      int n = 0;
      for (size_t l = 0; l < load.size(); ++l) {
        if (load[l].empty()) continue;
        b += balanced.max_load_share(static_cast<int>(l), load[l]);
        c += blocks.max_load_share(static_cast<int>(l), load[l]);
        ++n;
      }
      p.rank_load_share = b / n;
      p.contiguous_load_share = c / n;
      p.rank_active_bytes_per_token = p.active_bytes_per_token - p.expert_bytes_per_token +
                                      static_cast<uint64_t>(static_cast<double>(p.expert_bytes_per_token) * *p.rank_load_share);
    }
    if (in.mem_gbps && p.rank_active_bytes_per_token)  // (the memory figures are one rank's: so is this bound)
      p.tok_s_mem_bound = *in.mem_gbps * 1e9 / static_cast<double>(p.rank_active_bytes_per_token);
    const uint64_t row = static_cast<uint64_t>(std::max<int64_t>(p.spec.hidden_size, 0)) * sizeof(float);
    p.net_bytes_per_token = static_cast<uint64_t>(n_moe) * static_cast<uint64_t>(std::max(p.spec.moe.top_k, 0)) * row *
                            static_cast<uint64_t>(p.ranks - 1);
    p.exchanges_per_token = n_moe;
    if (in.shape.parallel > 1) {  // a server: rank 0 broadcasts each MoE layer's rows (hidden floats) and routing (top-k ints)
      p.net_bytes_per_token += static_cast<uint64_t>(n_moe) * (row + static_cast<uint64_t>(std::max(p.spec.moe.top_k, 0)) * sizeof(int32_t)) *
                               static_cast<uint64_t>(p.ranks - 1);
      p.exchanges_per_token = 2 * n_moe;
      p.leader_broadcasts = true;
    }
    p.link_latency_us = in.link_latency_us;
    p.link_gbps = in.link_gbps;
    if (in.mem_gbps && in.link_latency_us && in.link_gbps && *in.mem_gbps > 0 && *in.link_gbps > 0) {
      const double t = static_cast<double>(p.rank_active_bytes_per_token) / (*in.mem_gbps * 1e9) +
                       p.exchanges_per_token * *in.link_latency_us * 1e-6 +
                       static_cast<double>(p.net_bytes_per_token) / p.ranks / (*in.link_gbps * 1e9);
      p.tok_s_ranks = 1.0 / t;
    }
    if (p.spec.moe.n_experts <= 0) p.notes.push_back("--ranks: the model has no routed experts; every rank would run the whole model");
  }

  // The command line.
  const bool serve = in.shape.parallel > 1;  // several sequences: the server's command
  std::string cmd = (p.ranks > 1 ? strfmt("mpirun -n %d ", p.ranks) : std::string()) + (serve ? "spool serve" : "spool generate") +
                    " --model " + in.model_arg;
  if (p.verdict == Verdict::kStream) cmd += " --stream --cache-budget-gb " + gb_arg(p.cache_budget);
  if (p.verdict == Verdict::kResident && p.weights.experts > 0) cmd += " --no-stream";
  if (p.ranks > 1 && !in.expert_owners.empty()) cmd += " --expert-owners " + in.expert_owners;
  if (p.verdict == Verdict::kStream && !p.use_page_cache) cmd += " --no-page-cache";
  if (p.shape.kv_bits != 32) cmd += strfmt(" --kv-bits %d", p.shape.kv_bits);
  if (in.shape.prefill_step != 512) cmd += strfmt(" --prefill-step-size %lld", (long long)in.shape.prefill_step);
  for (const std::string& a : in.lora_args) cmd += " --lora " + a;
  if (serve) cmd += strfmt(" --ctx-size %lld --parallel %d", (long long)in.shape.ctx, in.shape.parallel);
  if (in.shape.ctx > p.spec.max_position_embeddings && p.spec.max_position_embeddings > 0)
    p.notes.push_back(strfmt("--ctx-size %lld is beyond the model's max_position_embeddings %lld", (long long)in.shape.ctx,
                             (long long)p.spec.max_position_embeddings));
  if (!serve) cmd += " --prompt \"...\"";
  p.command = cmd;
  if (p.verdict == Verdict::kStream && p.cache_bytes < static_cast<uint64_t>(p.spec.moe.top_k) * n_moe * p.slot_bytes)
    p.notes.push_back("the cache holds fewer experts than one token uses: every token reads most of its experts from disk");
  return p;
}

}  // namespace spool::plan
