#include "engine/loader.h"

#include "experts/predictor.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/log.h"
#include "common/sysinfo.h"
#include "dist/comm.h"
#include "dist/nccl_comm.h"
#include "ops/ggml_q8.h"
#include "ops/quant_q8.h"
#include "ops/matmul.h"
#include "engine/device.h"
#include "experts/device_experts.h"
#include "lora/adapter.h"
#include "models/bind.h"
#include "models/family.h"
#include "ops/cpu_backend.h"
#include "plan/budget.h"
#include "plan/gpu.h"
#include "plan/placement.h"
#include "plan/projection.h"

namespace spool::engine {

namespace {

constexpr uint64_t kGiB = 1ull << 30;

// Which layers have a routed-expert FFN ([n_layers + mtp_layers]: the multi-token-prediction
// layers after the stack too), as the expert stores take them.
std::vector<bool> moe_layer_mask(const models::ModelSpec& main) {
  const models::ModelSpec spec = models::mtp_spec(main);
  std::vector<bool> m(spec.n_layers);
  for (int i = 0; i < spec.n_layers; ++i) m[i] = spec.ffns[i] == models::FfnKind::kMoE;
  return m;
}

}  // namespace

uint64_t state_bytes(const models::ModelSpec& s, int64_t ctx, int kv_bits, int64_t prefill_step) {
  const plan::StateBytes b = plan::state_bytes(s, plan::kv_capacities(s, ctx, ctx, prefill_step), kv_bits);
  return b.kv + b.recurrent;
}

// The tokenizer metadata of a GGUF file (tokenizer.ggml.*, tokenizer.chat_template).
tokenizer::GgufVocab gguf_vocab(const io::GgufFile& g) {
  tokenizer::GgufVocab v;
  v.label = g.path();
  v.model = g.get_string("tokenizer.ggml.model").value_or("");
  v.pre = g.get_string("tokenizer.ggml.pre").value_or("default");
  v.tokens = g.find_key("tokenizer.ggml.tokens")->to_strings("tokenizer.ggml.tokens");
  if (const io::GgufValue* m = g.find_key("tokenizer.ggml.merges")) v.merges = m->to_strings("tokenizer.ggml.merges");
  if (const io::GgufValue* t = g.find_key("tokenizer.ggml.token_type"))
    for (int64_t x : t->to_ints("tokenizer.ggml.token_type")) v.token_types.push_back(static_cast<int32_t>(x));
  v.bos = g.get_int("tokenizer.ggml.bos_token_id");
  v.eos = g.get_int("tokenizer.ggml.eos_token_id");
  v.pad = g.get_int("tokenizer.ggml.padding_token_id");
  v.unk = g.get_int("tokenizer.ggml.unknown_token_id");
  if (const io::GgufValue* s = g.find_key("tokenizer.ggml.scores"))
    for (double x : s->to_floats("tokenizer.ggml.scores")) v.scores.push_back(static_cast<float>(x));
  if (const io::GgufValue* b = g.find_key("tokenizer.ggml.add_bos_token")) v.add_bos = b->to_bool("tokenizer.ggml.add_bos_token");
  if (const io::GgufValue* b = g.find_key("tokenizer.ggml.add_eos_token")) v.add_eos = b->to_bool("tokenizer.ggml.add_eos_token");
  if (const io::GgufValue* b = g.find_key("tokenizer.ggml.add_space_prefix"))
    v.add_space_prefix = b->to_bool("tokenizer.ggml.add_space_prefix");
  v.chat_template = g.get_string("tokenizer.chat_template").value_or("");
  return v;
}

uint64_t page_cache_resident_bytes(const io::Checkpoint& ckpt) {
  const long page = sysconf(_SC_PAGESIZE);
  uint64_t resident = 0;
  std::vector<unsigned char> vec;
  for (const auto& s : ckpt.shards()) {
    if (s.mapping() == nullptr || s.file_size() == 0) continue;
    const size_t pages = (s.file_size() + page - 1) / page;
    vec.resize(pages);
    if (mincore(const_cast<uint8_t*>(s.mapping()), s.file_size(), vec.data()) != 0) continue;
    uint64_t shard = 0;
    for (size_t i = 0; i < pages; ++i)
      if (vec[i] & 1) shard += static_cast<uint64_t>(page);
    resident += std::min<uint64_t>(shard, s.file_size());  // the last page is partly past EOF
  }
  return resident;
}

LoraOption parse_lora_option(const std::string& arg) {
  LoraOption o{arg, 1.0f};
  const size_t colon = arg.rfind(':');
  if (colon != std::string::npos && colon + 1 < arg.size()) {
    const std::string tail = arg.substr(colon + 1);
    char* end = nullptr;
    const float v = std::strtof(tail.c_str(), &end);
    if (end != nullptr && *end == '\0' && std::isfinite(v)) o = {arg.substr(0, colon), v};
  }
  if (o.path.empty()) throw UsageError(strfmt("--lora '%s': no adapter path (FILE[:SCALE])", arg.c_str()));
  return o;
}

std::vector<std::pair<int, int>> read_pin_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) fail("%s: cannot open pin file", path.c_str());
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    fail("%s: not valid JSON (%s)", path.c_str(), e.what());
  }
  if (!j.is_object() || !j.contains("pin") || !j["pin"].is_array()) fail("%s: expected {\"pin\": [[layer, expert], ...]}", path.c_str());
  std::vector<std::pair<int, int>> pins;
  for (const auto& p : j["pin"]) {
    if (!p.is_array() || p.size() != 2 || !p[0].is_number_integer() || !p[1].is_number_integer())
      fail("%s: each pin must be [layer, expert] (got %s)", path.c_str(), p.dump().c_str());
    pins.emplace_back(p[0].get<int>(), p[1].get<int>());
  }
  return pins;
}

nlohmann::ordered_json memory_json(const MemoryDecision& m) {
  nlohmann::ordered_json j;
  j["available_bytes"] = m.available;
  j["available_source"] = m.source;
  j["ctx_size"] = m.ctx_size;
  j["prefill_step"] = m.prefill_step;
  j["parallel"] = m.parallel;
  j["dense_resident"] = m.base.dense;
  j["state"] = m.base.state;
  j["workspace"] = m.base.workspace;
  j["tokenizer"] = m.base.tokenizer;
  j["tables"] = m.base.tables;
  j["runtime"] = m.base.runtime;
  j["reserve_bytes"] = m.reserve;
  j["streaming"] = m.streaming;
  j["cache_budget_auto"] = m.budget_auto;
  j["cache_budget_bytes"] = m.cache_budget;
  return j;
}

namespace {

// With --no-page-cache the experts are read with O_DIRECT, but the dense tensors stay mapped:
// the kernel's readahead around their page faults would pull the neighbouring expert bytes of
// the same shard into the page cache. MADV_RANDOM turns fault readahead off for the mappings,
// and MADV_WILLNEED reads exactly the dense ranges ahead instead.
void keep_experts_out_of_page_cache(const io::Checkpoint& ck) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  for (const auto& sh : ck.shards())
    if (sh.mapping() != nullptr) madvise(const_cast<uint8_t*>(sh.mapping()), sh.file_size(), MADV_RANDOM);
  for (const auto& t : ck.tensors()) {
    if (t.expert_layer >= 0 || t.nbytes == 0) continue;
    const auto& sh = ck.shards()[t.shard];
    if (sh.mapping() == nullptr) continue;
    const uint64_t lo = t.offset / page * page, hi = t.offset + t.nbytes;
    madvise(const_cast<uint8_t*>(sh.mapping()) + lo, hi - lo, MADV_WILLNEED);
  }
}

// Resident experts: every weight the forward pass reads from the mapping is made resident at
// load (MADV_POPULATE_READ, or one read per page on kernels before 5.14), so the run holds the
// whole model from the start, as `spool plan` counts it (plan::WeightBytes::resident_dense +
// experts), whatever the prompt happens to route to. The embedding table read row by row
// (WeightBytes::embed_on_demand) stays out, and so do the routed experts outside `owned` (expert
// ids [first, last): under expert parallelism a rank reads only its own; a layer's experts fused
// in one tensor are populated whole).
// Populates the pages of every tensor but the routed experts `owned` says this rank does not hold
// (owned(layer, expert); empty: all).
void populate_resident_weights(const io::Checkpoint& ck, const std::function<bool(int, int)>& owned = {}) {
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  // (float: embed_tokens.weight; spool-quantized: its .qweight and .scales)
  const bool embed_on_demand = ck.find("lm_head.weight") != nullptr || ck.find("lm_head.qweight") != nullptr;
  const std::vector<const io::TensorRef*> embed = embed_on_demand ? models::embed_row_tensors(ck) : std::vector<const io::TensorRef*>{};
  // Page ranges per shard, merged (neighbouring tensors share pages).
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> ranges(ck.shards().size());
  for (const auto& t : ck.tensors()) {
    if (t.nbytes == 0 || std::find(embed.begin(), embed.end(), &t) != embed.end()) continue;
    if (owned && t.expert_layer >= 0 && t.expert_id >= 0 && !owned(t.expert_layer, t.expert_id)) continue;
    ranges[t.shard].emplace_back(t.offset / page * page, (t.offset + t.nbytes + page - 1) / page * page);
  }
  for (size_t s = 0; s < ranges.size(); ++s) {
    const auto& sh = ck.shards()[s];
    if (sh.mapping() == nullptr || ranges[s].empty()) continue;
    auto& r = ranges[s];
    std::sort(r.begin(), r.end());
    std::vector<std::pair<uint64_t, uint64_t>> merged;
    for (const auto& x : r) {
      if (!merged.empty() && x.first <= merged.back().second) merged.back().second = std::max(merged.back().second, x.second);
      else merged.push_back(x);
    }
    uint8_t* base = const_cast<uint8_t*>(sh.mapping());
    for (auto [lo, hi] : merged) {
      hi = std::min<uint64_t>(hi, (sh.file_size() + page - 1) / page * page);
      if (hi <= lo) continue;
      if (madvise(base + lo, hi - lo, MADV_POPULATE_READ) == 0) continue;
      volatile uint8_t sink = 0;
      for (uint64_t at = lo; at < std::min<uint64_t>(hi, sh.file_size()); at += page) sink = sink + base[at];
    }
  }
}

}  // namespace


std::optional<tokenizer::Tokenizer> load_tokenizer(const std::string& model) {
  if (model.size() > 5 && model.compare(model.size() - 5, 5, ".gguf") == 0 && std::filesystem::is_regular_file(model)) {
    const io::GgufFile g = io::GgufFile::open(model, /*map=*/false);
    if (g.find_key("tokenizer.ggml.tokens") == nullptr) return std::nullopt;
    return tokenizer::Tokenizer::from_gguf(gguf_vocab(g));
  }
  if (std::filesystem::exists(model + "/tokenizer.json")) return tokenizer::Tokenizer::load(model);
  return std::nullopt;
}

namespace {

// --cache-budget-gb / --vram-budget-gb: a number of GB in [0, 1e6], or "auto" (nullopt).
std::optional<uint64_t> parse_gb(const std::string& v, const char* flag) {
  if (v == "auto") return std::nullopt;
  char* end = nullptr;
  const double gb = std::strtod(v.c_str(), &end);
  if (end == v.c_str() || *end != '\0' || !(gb >= 0) || !(gb <= 1e6))
    throw UsageError(strfmt("%s must be a number of GB in [0, 1e6] or 'auto' (got '%s')", flag, v.c_str()));
  return static_cast<uint64_t>(gb * static_cast<double>(kGiB));
}

// The options of `opt` that need no file, checked before anything is read (UsageError).
void validate(const LoadOptions& opt) {
  if (opt.prefetch_workers < 1 || opt.prefetch_workers > 256)
    throw UsageError(strfmt("--prefetch-workers must be between 1 and 256 (got %d)", opt.prefetch_workers));
  if (opt.prefetch_ahead < 0 || opt.prefetch_ahead > 64) throw UsageError("--prefetch-ahead must be between 0 and 64");
  if (opt.prefetch_next < 0 || opt.prefetch_next > 1024) throw UsageError("--prefetch-next must be between 0 and 1024");
  if (opt.route_by_predictor && opt.predictor.empty()) throw UsageError("--route-by-predictor needs --predictor FILE");
  if (opt.host_expert_slots < 0) throw UsageError(strfmt("--host-expert-slots must be >= 0 (got %d)", opt.host_expert_slots));
  if (opt.ctx_size < 1) throw UsageError(strfmt("--ctx-size must be positive (got %lld)", (long long)opt.ctx_size));
  if (opt.prefill_step < 1) throw UsageError(strfmt("--prefill-step-size must be positive (got %lld)", (long long)opt.prefill_step));
  if (opt.vram_experts != "auto" && opt.vram_experts != "static" && opt.vram_experts != "slots")
    throw UsageError(strfmt("--vram-experts must be auto, static or slots (got '%s')", opt.vram_experts.c_str()));
  if (opt.io_engine != "pread" && opt.io_engine != "uring")
    throw UsageError(strfmt("--io-engine must be pread or uring (got '%s')", opt.io_engine.c_str()));
  if (opt.parallel < 1 || opt.parallel > 256) throw UsageError(strfmt("--parallel must be between 1 and 256 (got %d)", opt.parallel));
  if (opt.state_copies < 0) throw UsageError(strfmt("state copies must be >= 0 (got %lld)", (long long)opt.state_copies));
  parse_gb(opt.cache_budget, "--cache-budget-gb");
  parse_gb(opt.vram_budget, "--vram-budget-gb");
  ops::int8_activations_from_bits(opt.act_bits, false);
  if (!(opt.cache_half_life > 0) || !std::isfinite(opt.cache_half_life))
    throw UsageError(strfmt("--cache-half-life must be a positive number of tokens (got %g)", opt.cache_half_life));
  if (!(opt.expert_profile_half_life > 0) || !std::isfinite(opt.expert_profile_half_life))
    throw UsageError(strfmt("--expert-profile-half-life must be a positive number of tokens (got %g)", opt.expert_profile_half_life));
  if (!opt.expert_profile.empty()) {  // its directory must take the file: found now, not at the first save
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path dir = fs::path(opt.expert_profile).parent_path().empty() ? fs::path(".") : fs::path(opt.expert_profile).parent_path();
    if (!fs::is_directory(dir, ec)) fail("--expert-profile %s: the directory %s does not exist", opt.expert_profile.c_str(), dir.c_str());
    if (fs::exists(opt.expert_profile, ec) && !fs::is_regular_file(opt.expert_profile, ec))
      fail("--expert-profile %s: not a regular file", opt.expert_profile.c_str());
    if (access(dir.c_str(), W_OK) != 0) fail("--expert-profile %s: the directory %s is not writable", opt.expert_profile.c_str(), dir.c_str());
  }
}

// The log lines of a placement (what was decided and why), before the providers are built.
void log_placement(const plan::Placement& p, const plan::PlacementFacts& f, const LoadedModel& l, const LoadOptions& opt) {
  if (p.vram == plan::VramTier::kStatic)
    log_info("the routed experts (%s) do not all fit the VRAM budget %s: %s in VRAM, the rest in page-locked host memory the "
             "GPU reads in place (--vram-experts static)",
             format_bytes(f.experts).c_str(), format_bytes(l.vram_budget).c_str(),
             opt.pin_file.empty() ? "a share of each layer's" : "--pin-file's hot experts first");
  if (p.pinned_tier)
    log_info("the routed experts (%s) stay in host memory (VRAM budget %s, or --stream): %s", format_bytes(f.experts).c_str(),
             format_bytes(l.vram_budget).c_str(), plan::kHostTierRule);
  if (p.auto_streamed)
    log_info("the model (%s) does not fit in the memory available (%s): streaming experts from disk",
             format_bytes(l.ckpt->total_bytes()).c_str(), format_bytes(f.available).c_str());
  if (p.stream && p.cache_budget_auto) {
    const plan::BaseNeeds& base = f.base;
    log_info("memory available: %s (%s)", format_bytes(f.available).c_str(), l.memory.source.c_str());
    const bool capped = p.cache_budget == f.experts;
    log_info("cache budget auto: %s = available %s - resident weights %s - KV/state %s%s - workspace %s - runtime %s - reserve %s%s",
             format_bytes(p.cache_budget).c_str(), format_bytes(f.available).c_str(), format_bytes(base.dense).c_str(),
             format_bytes(base.state).c_str(), opt.parallel > 1 ? strfmt(" (%d sequences)", opt.parallel).c_str() : "",
             format_bytes(base.workspace).c_str(), format_bytes(base.runtime + base.tokenizer + base.tables).c_str(),
             format_bytes(p.reserve).c_str(),
             capped ? strfmt(", capped at the experts' total size %s", format_bytes(f.experts).c_str()).c_str() : "");
  }
}

// The streaming expert provider of a streamed placement, in front of the model.
void build_streaming(LoadedModel& l, const LoadOptions& opt, const plan::Placement& p, const std::vector<bool>& moe_layers,
                     const std::shared_ptr<ops::Backend>& backend, const experts::ProfileData* stored) {
  const models::ModelSpec& spec = l.model->spec();
  experts::StreamingOptions so;
  so.cache_budget_bytes = p.cache_budget;
  so.hold_all = p.hold_all;  // the pinned RAM tier holds every expert (the padding of its 4096-byte aligned slots included)
  so.workers = opt.prefetch_workers;
  so.engine = opt.io_engine == "uring" ? io::IoEngine::kUring : io::IoEngine::kPread;
  so.direct = !p.use_page_cache;
  if (so.direct) keep_experts_out_of_page_cache(*l.ckpt);
  so.prefetch_ahead = opt.prefetch_ahead;
  // The guesses of two layers in flight (--route-by-predictor reads the head's top-k ahead).
  so.stage_slots = 2 * std::max(opt.prefetch_next, opt.route_by_predictor ? spec.moe.top_k : 0);
  so.top_k = spec.moe.top_k;
  if (!opt.pin_file.empty()) so.pins = read_pin_file(opt.pin_file);
  if (stored != nullptr) so.warm = experts::hottest(*stored);
  if (l.expert_parallel.active()) {  // (this rank holds and reads only its own experts)
    const dist::ExpertParallel& ep = l.expert_parallel;
    const auto foreign = [&](const std::pair<int, int>& le) { return ep.owner(le.first, le.second, spec.moe.n_experts) != ep.comm->rank(); };
    std::erase_if(so.warm, foreign);
    std::erase_if(so.pins, foreign);
  }
  const int n_moe = static_cast<int>(std::count(moe_layers.begin(), moe_layers.end(), true));
  so.hits_first = opt.hits_first;
  so.policy = experts::cache_policy_options(opt.cache_policy, opt.cache_half_life, n_moe, spec.moe.top_k);
  if (stored != nullptr && opt.cache_policy == experts::CachePolicy::kLfu) so.seed = experts::profile_counts(*stored);
  if (p.pinned_tier) so.pin_with = backend.get();
  l.streaming = std::make_shared<experts::StreamingExperts>(l.ckpt, moe_layers, spec.moe.n_experts, spec.hidden_size,
                                                            spec.moe.intermediate, so);
  l.memory.cache_budget = l.streaming->cache_budget();
  l.model->set_expert_provider(l.streaming);
  l.model->set_next_layer_prefetch(opt.prefetch_next);
  log_info("%s", l.streaming->describe().c_str());
}

// The VRAM tier of a GPU placement (experts::DeviceExperts for every expert or a static share,
// experts::DeviceExpertCache slots), in front of the host provider.
void build_vram_tier(LoadedModel& l, const LoadOptions& opt, const plan::Placement& p, const std::vector<bool>& moe_layers,
                     ops::Backend& backend, const std::vector<std::pair<int, int>>& hot) {
  const models::ModelSpec& spec = l.model->spec();
  const plan::GpuPlacement& g = *p.gpu;
  if (!g.fits)
    fail("--vram-budget-gb: the dense weights (%s), KV/state of %d sequence(s) at --ctx-size %lld (%s) and workspace (%s) need "
         "more than the VRAM budget of %s on %s",
         format_bytes(g.dense).c_str(), opt.parallel, (long long)opt.ctx_size, format_bytes(g.state).c_str(),
         format_bytes(g.workspace).c_str(), format_bytes(l.vram_budget).c_str(), l.device.c_str());
  if (p.vram == plan::VramTier::kAll) {
    auto dev = std::make_shared<experts::DeviceExperts>(l.model->expert_provider(), backend, moe_layers, spec.moe.n_experts);
    log_info("%s", dev->describe().c_str());
    l.model->set_expert_provider(dev);
    l.experts_on_device = true;
    l.vram_expert_share = 1.0;
  } else if (p.vram == plan::VramTier::kStatic || p.vram == plan::VramTier::kSlots) {
    log_info("routed experts (%s) stay in host memory: dense %s + KV/state %s + workspace %s + experts exceed the VRAM budget %s%s",
             format_bytes(g.experts).c_str(), format_bytes(g.dense).c_str(), format_bytes(g.state).c_str(),
             format_bytes(g.workspace).c_str(), format_bytes(l.vram_budget).c_str(), p.stream ? " (or --stream was given)" : "");
    if (p.vram == plan::VramTier::kStatic) {
      // --pin-file (spool calibrate's hot experts, hottest first) chooses the experts the VRAM share holds.
      auto dev = std::make_shared<experts::DeviceExperts>(l.model->expert_provider(), backend, moe_layers, spec.moe.n_experts,
                                                          p.vram_left, hot);
      log_info("%s", dev->describe().c_str());
      l.model->set_expert_provider(dev);
      l.experts_static = true;
      const int64_t n = dev->experts_on_device() + dev->experts_in_host();
      l.vram_expert_share = n > 0 ? static_cast<double>(dev->experts_on_device()) / static_cast<double>(n) : 0.0;
    } else {
      const int one_token = opt.max_active_experts > 0 ? opt.max_active_experts : spec.moe.top_k;
      try {
        auto slots = std::make_shared<experts::DeviceExpertCache>(l.model->shared_expert_provider(), backend, moe_layers,
                                                                  spec.moe.n_experts, p.vram_left, one_token);
        log_info("%s", slots->describe().c_str());
        l.expert_slots = slots;
        l.model->set_expert_provider(slots);
      } catch (const Error& e) {
        log_info("no VRAM expert slots (%s): each routed expert is copied to the GPU when used", e.what());
        // Those copies are not waited for before the cache may reuse their source: pageable
        // memory, which the copy stages before it returns.
        if (l.streaming) l.streaming->unpin();
      }
    }
  }
  l.vram_used = device_uploaded_bytes(backend);
  log_info("device %s (%s): %s uploaded of a %s VRAM budget", l.device.c_str(), l.device_name.c_str(),
           format_bytes(l.vram_used).c_str(), format_bytes(l.vram_budget).c_str());
}

// --expert-profile with experts streamed through a cache: the profile of this model (seeded from
// the file when it is this model's), its recorder on the model's routing, and the stored counts
// to warm the cache with (nullopt: start cold). A file of another model is left as it is and
// nothing is recorded; a corrupt one is an error.
std::optional<experts::ProfileData> open_profile(LoadedModel& l, const LoadOptions& opt) {
  const models::ModelSpec& spec = l.model->spec();
  const experts::TraceShape ts = trace_shape_of(spec, opt.max_active_experts, "");
  experts::ProfileShape shape;
  shape.model_type = ts.model_type;
  shape.n_layers = ts.n_layers;
  shape.moe_layers = ts.moe_layers;
  shape.n_experts = ts.n_experts;
  shape.top_k = ts.top_k;
  const std::string& w = spec.moe.router_weight;
  shape.router_hash = experts::router_fingerprint(*l.ckpt, shape.moe_layers, w.ends_with(".weight") ? w.substr(0, w.size() - 7) : w);
  shape.expert_bytes = l.ckpt->expert_bytes();
  std::optional<experts::ProfileData> stored;
  std::error_code ec;
  if (std::filesystem::exists(opt.expert_profile, ec)) {
    experts::ProfileData d = experts::read_profile(opt.expert_profile);  // spool::Error when corrupt
    if (const std::string why = shape.mismatch(d.shape); !why.empty()) {
      log_warn("--expert-profile %s is the profile of another model (%s): starting with a cold cache; the file is left as it is "
               "and this run records no profile (give another path, or delete the file)",
               opt.expert_profile.c_str(), why.c_str());
      return std::nullopt;
    }
    stored = std::move(d);
  }
  l.profile = std::make_shared<experts::ExpertProfile>(shape, opt.expert_profile_half_life);
  l.profile_path = opt.expert_profile;
  if (stored) {
    l.profile->seed(*stored);
    log_info("expert profile %s: %llu tokens recorded (%.0f after decay, half-life %.0f tokens)%s", opt.expert_profile.c_str(),
             (unsigned long long)stored->tokens_total, stored->weight, opt.expert_profile_half_life,
             stored->half_life != opt.expert_profile_half_life ? strfmt("; it was recorded with a half-life of %.0f", stored->half_life).c_str() : "");
  } else {
    log_info("expert profile %s does not exist yet: starting with a cold cache; this run's routing is recorded into it",
             opt.expert_profile.c_str());
  }
  std::shared_ptr<experts::ExpertProfile> p = l.profile;
  l.model->hooks.on_route = [p](int layer, int64_t, std::span<const int> experts, std::span<const float>) { p->record(layer, experts); };
  l.model->hooks.on_route_any_order = true;  // counts only: pipelined steps stay pipelined
  return stored;
}

// --warm-page-cache: starts the background reader when the expert reads go through the page cache
// and the experts' file bytes fit in the memory the run's plan leaves free; logs why not otherwise.
void start_warmer(LoadedModel& l) {
  if (!l.streaming) {
    log_info("--warm-page-cache: the experts are resident (read into memory at load): nothing to warm");
    return;
  }
  if (l.streaming->store().direct()) {
    log_info("--warm-page-cache: skipped: expert reads bypass the page cache (O_DIRECT: --no-page-cache, or the model files "
             "are >= 0.6 x available memory; --use-page-cache reads through it)");
    return;
  }
  const MemoryDecision& m = l.memory;
  const uint64_t used = m.reserve + m.base.sum() + m.cache_budget;
  const uint64_t free = m.available > used ? m.available - used : 0;
  const uint64_t need = l.ckpt->expert_bytes();  // the dense part is resident already (plan: base.dense)
  if (need > free) {
    log_info("--warm-page-cache: skipped: the experts' %s do not fit in the %s the run leaves free (available %s (%s) - reserve %s - "
             "resident weights, KV/state, workspace %s - expert cache %s)",
             format_bytes(need).c_str(), format_bytes(free).c_str(), format_bytes(m.available).c_str(), m.source.c_str(),
             format_bytes(m.reserve).c_str(), format_bytes(m.base.sum()).c_str(), format_bytes(m.cache_budget).c_str());
    return;
  }
  std::vector<std::string> paths;
  for (const auto& sh : l.ckpt->shards()) paths.push_back(sh.path());
  log_info("--warm-page-cache: reading the model's files (%s) into the page cache in the background (%s free for them)",
           format_bytes(l.ckpt->file_bytes()).c_str(), format_bytes(free).c_str());
  l.warmer = std::make_unique<io::PageCacheWarmer>(std::move(paths));
}

}  // namespace

void save_expert_profile(const LoadedModel& l) {
  if (l.profile == nullptr || l.profile->tokens_this_run() == 0) return;
  experts::ProfileSaver(l.profile, l.profile_path, 0).finish();
}

LoadedModel load(const LoadOptions& opt, std::optional<tokenizer::Tokenizer> tok) {
  // Before anything of the model is read: pages this process maps and touches turn active and
  // then count as used in a cgroup (see common/sysinfo.h).
  const uint64_t available = opt.available.value_or(available_memory_bytes());
  const CgroupMemory cg = cgroup_memory();
  validate(opt);
  const std::optional<uint64_t> cache_budget = parse_gb(opt.cache_budget, "--cache-budget-gb");
  const std::optional<uint64_t> vram_budget = parse_gb(opt.vram_budget, "--vram-budget-gb");
  int cuda_index = resolve_device(opt.device);  // -1: the CPU
  LoadedModel l;
  const double t0 = now_seconds();
  const uint64_t start_rss = opt.start_rss.value_or(current_rss_bytes());  // the runtime base of plan::base_needs
  l.ckpt = std::make_shared<io::Checkpoint>(models::open_checkpoint(opt.model_dir, {.mtp = opt.mtp}));
  if (opt.mtp && l.ckpt->mtp_layers() == 0)
    fail("%s: --spec mtp: the model has no multi-token-prediction layers (config mtp_num_hidden_layers / num_nextn_predict_layers%s)",
         opt.model_dir.c_str(),
         l.ckpt->gguf() ? "; GGUF: {arch}.nextn_predict_layers and the blk.N.nextn.* head, which llama.cpp's converter leaves out "
                          "with --no-mtp and for deepseek2 always" : "");
  l.pool = std::make_unique<ops::ThreadPool>(opt.threads);
  const bool kquant = std::any_of(l.ckpt->tensors().begin(), l.ckpt->tensors().end(),
                                  [](const io::TensorRef& t) { return t.ggml && ops::q8_supported(t.ggml_type); });
  // spool's own q4 matrices (a 16-entry codebook) and q8 ones (no codebook tensor: the format's grid) take int8
  // activations (ops/quant_q8.h).
  // (A spool matrix: U8 .qweight beside .scales; q4 has a 16-entry .codebook and packs 2 columns per byte, q8
  // none or the format's grid; both need a multiple of 128 input columns: ops::quant_q8_supported.)
  const bool spool_q4 = std::any_of(l.ckpt->tensors().begin(), l.ckpt->tensors().end(), [&](const io::TensorRef& t) {
    if (!t.name.ends_with(".qweight") || t.shape.empty() || t.dtype != io::DType::U8) return false;
    const std::string base = t.name.substr(0, t.name.size() - 7);
    if (l.ckpt->find(base + "scales") == nullptr) return false;
    const io::TensorRef* cb = l.ckpt->find(base + "codebook");
    const bool q4 = cb != nullptr && cb->numel() == 16;
    const bool q8 = cb == nullptr || (cb->numel() == 256 && cb->dtype == io::DType::F32 && cb->data != nullptr &&
                                      std::memcmp(cb->data, ops::q8_grid(), 256 * sizeof(float)) == 0);
    return (q4 || q8) && t.shape.back() * (q4 ? 2 : 1) % 128 == 0;
  });
  // auto: int8 for Q4_K / Q6_K where q8_auto() says so, and for spool q4 / q8 on the CPUs with their int8 kernels
  // (x86 AVX2 / AVX-512: measured 1.15x (AVX-512 VNNI) to 2.2x (AVX2) faster decode, KL +0.1%; docs/quantization.md).
  const bool int8_acts = ops::int8_activations_from_bits(opt.act_bits, kquant) || (opt.act_bits == 0 && spool_q4 && ops::quant_q8_auto());
  if (opt.act_bits == 8) {  // an explicit --act-bits 8: say when it changes nothing
    if (!ops::q8_fast())
      log_warn("--act-bits 8: no int8 kernels for this CPU (%s: AVX2, AVX-512 or NEON needed); products keep f32 activations", ops::q8_variant());
    else if (!kquant && !spool_q4)
      log_warn("--act-bits 8 applies to Q4_K / Q6_K GGUF weights and spool q4 / q8 matrices; %s has none, so it has no effect",
               opt.model_dir.c_str());
  }
  const auto first_ggml = std::find_if(l.ckpt->tensors().begin(), l.ckpt->tensors().end(), [](const io::TensorRef& t) { return t.ggml; });
  if (cuda_index >= 0 && first_ggml != l.ckpt->tensors().end()) {
    if (opt.device != "auto")
      throw UsageError(strfmt("--device %s: %s holds ggml block weights (GGUF; e.g. '%s' in %s), which the CUDA backend cannot run "
                              "yet; use --device cpu",
                              opt.device.c_str(), opt.model_dir.c_str(), first_ggml->name.c_str(), ggml_type_name(first_ggml->ggml_type)));
    cuda_index = -1;
  }

  // The backend: the GPU's, or the CPU's with --act-bits as its option (a model loaded beside
  // this one has its own).
  std::shared_ptr<ops::Backend> backend;
  if (cuda_index >= 0) {
    GpuBackend g = make_gpu_backend(cuda_index, vram_budget);
    backend = std::move(g.backend);
    l.device = std::move(g.device);
    l.device_name = std::move(g.name);
    l.vram_budget = g.vram_budget;
  } else {
    backend = std::make_shared<ops::CpuBackend>(l.pool.get(), ops::CpuOptions{.int8_activations = int8_acts});
  }
  const bool on_gpu = cuda_index >= 0;
  std::shared_ptr<lora::LoraSet> adapters;
  if (!opt.lora.empty()) {
    adapters = std::make_shared<lora::LoraSet>();
    for (const LoraOption& a : opt.lora) {
      lora::Adapter ad = lora::load_adapter(a.path, *l.ckpt, models::checkpoint_rules());
      log_info("LoRA adapter %zu: %s (%zu matrices, %zu expert layers, %.1f MB, scale %g)", adapters->adapters().size(), a.path.c_str(),
               ad.dense.size(), ad.experts.size(), static_cast<double>(ad.bytes()) / 1e6, static_cast<double>(a.scale));
      adapters->add(std::move(ad), a.scale);
    }
  }
  l.model = models::load_model(l.ckpt, backend, adapters);
  l.lora = adapters;
  // On a GPU the adapters' matrices go to device memory now, so the VRAM placement below counts them.
  if (adapters != nullptr && on_gpu) adapters->for_each_delta([&](const ops::LoraDelta& d) { backend->upload_lora(d); });
  const models::ModelSpec& spec = l.model->spec();
  if (on_gpu) {  // what of this model the device leaves on the host
    std::vector<std::string> fallbacks;
    const std::string line = host_fallback_line(*backend, spec, &fallbacks);
    log_info("%s", line.c_str());
    if ((opt.strict_device || backend->strict_device()) && !fallbacks.empty())
      fail("--strict-device / SPOOL_STRICT_DEVICE: %s would run ops on the host (%s); run without strict device mode or with --device cpu",
           opt.model_dir.c_str(), line.c_str());
  }
  if (opt.strict_device) backend->set_strict_device(true);
  // Started by mpirun with several ranks: expert parallelism over them (docs/distributed.md).
  if (dist::launched_by_mpi()) {
    dist::Comm& w = dist::world();
    dist::ExpertParallel ep;
    ep.comm = &w;
    // The exchange's communicator (--comm): MPI's world (host memory) or NCCL over its ranks
    // (device memory, on the backend's stream); auto: NCCL on a GPU when this build has it.
    const std::string comm = opt.comm == "auto" ? (on_gpu && dist::have_nccl() ? "nccl" : "mpi") : opt.comm;
    if (comm != "mpi" && comm != "nccl") throw UsageError(strfmt("--comm must be auto, mpi or nccl (got '%s')", opt.comm.c_str()));
    if (comm == "nccl") {
      if (!on_gpu) throw UsageError("--comm nccl moves GPU memory: it needs --device cuda (the CPU backend takes --comm mpi)");
      l.device_comm = make_device_comm(*backend, w);
      ep.comm = l.device_comm.get();
    }
    ep.lead = opt.expert_lead;
    if (!opt.expert_owners.empty())
      ep.owners = std::make_shared<const dist::ExpertOwners>(dist::ExpertOwners::balanced(
          experts::routing_load(opt.expert_owners, spec.n_layers + spec.mtp_layers, spec.moe.n_experts), spec.moe.n_experts, w.size()));
    l.model->set_expert_parallel(ep);
    l.expert_parallel = ep;
    if (ep.owners != nullptr) {
      int most = 0;
      for (int layer : moe_layers_of(spec)) most = std::max(most, static_cast<int>(ep.owners->owned(layer, w.rank()).size()));
      log_info("expert parallelism: rank %d of %d (%s), experts %s (--expert-owners %s): at most %d of %d per layer here%s", w.rank(),
               w.size(), ep.comm->name(), ep.owners->describe().c_str(), opt.expert_owners.c_str(), most, spec.moe.n_experts,
               ep.lead ? "; rank 0 leads" : "");
    } else {
      const auto [lo, hi] = dist::owned_experts(w.rank(), spec.moe.n_experts, w.size());
      log_info("expert parallelism: rank %d of %d (%s), experts [%d, %d) of %d here%s", w.rank(), w.size(), ep.comm->name(), lo, hi,
               spec.moe.n_experts, ep.lead ? "; rank 0 leads" : "");
    }
  } else if (!opt.expert_owners.empty()) {
    log_warn("--expert-owners places experts on the ranks of an mpirun; this is one process: it has no effect");
  }
  if (!dist::launched_by_mpi() && opt.comm != "auto")
    log_warn("--comm %s chooses the communicator of the ranks of an mpirun; this is one process: it has no effect", opt.comm.c_str());
  l.model->set_kv_type(ops::kv_type_from_bits(opt.kv_bits));
  // The workspace arena for the steps this run feeds: one chunk plus a decode token of each
  // other sequence (plan::base_needs counts the same).
  l.model->reserve_workspace(plan::step_rows(std::min(opt.prefill_step, opt.ctx_size), opt.parallel), opt.parallel);
  if (opt.max_active_experts != 0) {
    if (opt.max_active_experts < 0 || opt.max_active_experts > spec.moe.top_k)
      throw UsageError(strfmt("--max-active-experts %d is out of range: the model routes to %d experts per token (0 = native)",
                              opt.max_active_experts, spec.moe.top_k));
    l.model->set_max_active_experts(opt.max_active_experts);
  }
  const uint64_t experts = l.ckpt->expert_bytes();
  if (experts == 0 && opt.stream.value_or(false))
    fail("%s: --stream was given but the model has no routed experts to stream", opt.model_dir.c_str());
  if (experts == 0 && opt.host_expert_slots != 0)
    fail("%s: --host-expert-slots was given but the model has no routed experts", opt.model_dir.c_str());
  if (opt.host_expert_slots != 0 && on_gpu)
    throw UsageError("--host-expert-slots is for CPU runs (a GPU run sizes its slots from --vram-budget-gb)");

  // The facts of the placement: the memory rule is plan/'s, shared with `spool plan` (same
  // components, same numbers).
  plan::RunShape shape;
  shape.ctx = opt.ctx_size;
  shape.prefill_step = opt.prefill_step;
  shape.kv_bits = opt.kv_bits;
  shape.parallel = opt.parallel;
  shape.threads = opt.threads;
  shape.draft_max = opt.mtp ? opt.draft_max : 0;
  shape.start_rss = start_rss;
  std::error_code ec;
  shape.tokenizer_json_bytes = std::filesystem::exists(opt.model_dir + "/tokenizer.json", ec)
                                   ? std::filesystem::file_size(opt.model_dir + "/tokenizer.json", ec) : 0;
  if (const io::GgufFile* g = l.ckpt->gguf()) shape.tokenizer_json_bytes = plan::gguf_tokenizer_json_bytes(*g);  // as `spool plan`
  plan::PlacementFacts facts;
  facts.base = plan::base_needs(plan::weight_bytes(*l.ckpt, spec), spec, shape);
  facts.base.state += static_cast<uint64_t>(opt.state_copies) * plan::state_bytes(spec, plan::KvCapacity{}, opt.kv_bits).snapshot;
  if (l.lora != nullptr) facts.base.dense += l.lora->bytes();  // --lora: the adapters' f32 A and B stay resident (docs/lora.md)
  facts.available = available;
  facts.experts = experts;
  facts.top_k = spec.moe.top_k;
  facts.file_bytes = l.ckpt->file_bytes();
  if (on_gpu)
    facts.gpu = plan::GpuFacts{.budget = l.vram_budget,
                               .dense = device_uploaded_bytes(*backend),
                               .state = state_bytes(spec, opt.ctx_size, opt.kv_bits, opt.prefill_step) * opt.parallel,
                               .workspace = l.model->workspace_capacity()};
  plan::PlacementOptions popt;
  popt.stream = opt.stream;
  popt.cache_budget = cache_budget;
  popt.page_cache = opt.page_cache;
  popt.vram_experts = opt.vram_experts == "static" ? plan::VramExperts::kStatic
                      : opt.vram_experts == "slots" ? plan::VramExperts::kSlots : plan::VramExperts::kAuto;
  l.memory.available = available;
  l.memory.source = cg.version != 0 && cg.available() <= available ? cg.describe() : "MemAvailable";
  l.memory.base = facts.base;
  l.memory.reserve = plan::reserve_bytes(available);
  l.memory.ctx_size = opt.ctx_size;
  l.memory.prefill_step = opt.prefill_step;
  l.memory.parallel = opt.parallel;

  // Under expert parallelism a rank reads, caches and keeps resident only its own experts.
  // (A GPU rank still uploads every expert to its VRAM tier — DeviceExperts has no owner filter
  // yet — so its plan counts them all.)
  if (dist::launched_by_mpi() && !on_gpu) facts = plan::rank_facts(facts, spec.moe.n_experts, dist::world().size());
  const plan::Placement placement = plan::decide_placement(facts, popt);
  log_placement(placement, facts, l, opt);

  // The providers: the streaming cache or the resident mapping, then the VRAM tier of a GPU run
  // (or the tests' host slots).
  const std::vector<bool> moe_layers = moe_layer_mask(spec);
  std::vector<std::pair<int, int>> hot;  // --pin-file's experts, hottest first (static placement)
  l.memory.streaming = placement.stream;
  l.memory.budget_auto = placement.stream && placement.cache_budget_auto;
  // --expert-profile: only a streaming cache (the CPU's, or the RAM tier behind VRAM slots) has
  // anything to warm; experts resident in RAM or VRAM, or placed statically, have not.
  const bool cached = placement.stream && placement.vram != plan::VramTier::kAll && placement.vram != plan::VramTier::kStatic;
  std::optional<experts::ProfileData> stored;
  if (!opt.expert_profile.empty() && cached) stored = open_profile(l, opt);
  if (!opt.expert_profile.empty() && !cached)
    log_info("--expert-profile: the routed experts are not streamed through a cache (%s): nothing to warm; %s is neither read nor "
             "written",
             placement.stream ? "placed in VRAM" : "resident", opt.expert_profile.c_str());
  if (placement.stream) {
    build_streaming(l, opt, placement, moe_layers, backend, stored ? &*stored : nullptr);
  } else {
    const dist::ExpertParallel& ep = l.expert_parallel;
    populate_resident_weights(*l.ckpt, ep.active() ? std::function<bool(int, int)>([&](int layer, int e) {
                                return ep.owner(layer, e, spec.moe.n_experts) == ep.comm->rank();
                              })
                                                   : std::function<bool(int, int)>{});
    if (!opt.pin_file.empty()) {
      hot = read_pin_file(opt.pin_file);  // (a clear error if the file is missing or malformed, used or not)
      if (placement.vram != plan::VramTier::kStatic)
        log_warn("--pin-file applies only when streaming experts (--stream) or placing them statically on a GPU (--vram-experts static); "
                 "all experts are resident, so it has no effect");
    }
    if (opt.prefetch_next > 0)
      log_warn("--prefetch-next applies only when streaming experts (--stream); all experts are resident, so it has no effect");
    if (opt.prefetch_ahead > 0)
      log_warn("--prefetch-ahead applies only when streaming experts (--stream); all experts are resident, so it has no effect");
  }
  if (!opt.predictor.empty()) {
    auto pred = std::make_shared<const experts::ExpertPredictor>(experts::ExpertPredictor::load(opt.predictor));
    l.model->set_expert_predictor(pred, opt.route_by_predictor);
    log_info("expert predictor %s: %zu heads%s", opt.predictor.c_str(), pred->heads().size(),
             opt.route_by_predictor ? "; routing by its predictions (--route-by-predictor: not exact)" : "");
    if (!placement.stream && !opt.route_by_predictor)
      log_warn("--predictor guides --prefetch-next when streaming experts; all experts are resident, so it has no effect");
    else if (placement.stream && !opt.route_by_predictor && opt.prefetch_next == 0)
      log_warn("--predictor guides --prefetch-next M, which is 0: it has no effect");
  }
  if (placement.gpu) build_vram_tier(l, opt, placement, moe_layers, *backend, hot);
  if (opt.host_expert_slots != 0) {
    // Tests: the slot tier over host memory on a CPU run (the same code as a GPU run's VRAM tier).
    auto src = l.model->shared_expert_provider();
    const uint64_t slot = experts::DeviceExpertCache::slot_bytes_for(*src, moe_layers);
    const int one_token = opt.max_active_experts > 0 ? opt.max_active_experts : spec.moe.top_k;
    auto slots = std::make_shared<experts::DeviceExpertCache>(src, *backend, moe_layers, spec.moe.n_experts,
                                                              slot * static_cast<uint64_t>(opt.host_expert_slots), one_token);
    log_info("%s", slots->describe().c_str());
    l.expert_slots = slots;
    l.model->set_expert_provider(slots);
  }
  if (tok) l.tok = std::move(tok);
  else if (const io::GgufFile* g = l.ckpt->gguf(); g != nullptr && g->find_key("tokenizer.ggml.tokens") != nullptr)
    l.tok = tokenizer::Tokenizer::from_gguf(gguf_vocab(*g));
  else if (std::filesystem::exists(opt.model_dir + "/tokenizer.json")) l.tok = tokenizer::Tokenizer::load(opt.model_dir);
  l.load_s = now_seconds() - t0;
  if (opt.warm_page_cache) start_warmer(l);
  l.int8_activations = int8_acts && ((kquant && ops::q8_fast()) || (spool_q4 && ops::quant_q8_fast())) && !on_gpu;
  log_info("loaded %s (%s, %d layers, %.1fM params, %.1fM active) from %s in %.2f s; %d threads, %s %s%s", spec.model_type.c_str(),
           spec.family.c_str(), spec.n_layers, spec.params_total / 1e6, spec.params_active / 1e6, opt.model_dir.c_str(), l.load_s,
           opt.threads, on_gpu ? "device" : "SIMD", on_gpu ? l.device.c_str() : ops::simd_target_name(),
           l.int8_activations ? "; int8 activations for Q4_K / Q6_K / q4 / q8 (--act-bits 32: f32, exact)" : "");
  return l;
}

std::vector<int> moe_layers_of(const models::ModelSpec& spec) {
  std::vector<int> v;
  for (int i = 0; i < spec.n_layers; ++i)
    if (spec.ffns[i] == models::FfnKind::kMoE) v.push_back(i);
  return v;
}

experts::TraceShape trace_shape_of(const models::ModelSpec& spec, int active_k, const std::string& source) {
  experts::TraceShape t;
  t.model_type = spec.model_type;
  t.n_layers = spec.n_layers;
  t.moe_layers = moe_layers_of(spec);
  t.n_experts = spec.moe.n_experts;
  t.top_k = active_k > 0 ? std::min(active_k, spec.moe.top_k) : spec.moe.top_k;
  t.source = source;
  return t;
}

}  // namespace spool::engine
