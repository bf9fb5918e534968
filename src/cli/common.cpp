#include "cli/common.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/error.h"
#include "common/files.h"
#include "common/log.h"
#include "common/sysinfo.h"
#include "ops/ggml_q8.h"

namespace spool::cli {

namespace fs = std::filesystem;

void ModelOptions::add_to(CLI::App* app, bool runs_model) {
  app->add_option("-m,--model", model, "Model directory (HF layout: config.json, *.safetensors, tokenizer.json); default: the demo model");
  if (!runs_model) return;
  app->add_option("-t,--threads", threads, "Threads for compute (default 0 = all hardware threads)");
  app->add_flag("--stream", stream, "Stream routed experts from disk through a cache (default: only when the model does not fit in memory)");
  app->add_flag("--no-stream", no_stream, "Keep every expert resident even if the model looks too big");
  app->add_option("--cache-budget-gb", cache_budget, "Expert cache size in GB, or 'auto' (available memory - resident weights - KV - reserve)");
  app->add_option("--cache-policy", cache_policy,
                  "Which cached expert makes room for a read: lru (least recently used, default) or lfu (fewest requests, "
                  "decayed by --cache-half-life; seeded with --expert-profile's counts). Outputs do not change");
  app->add_flag("--no-hits-first", no_hits_first,
                "Streamed experts: compute a layer's experts only once all of them are read (default: the cached ones "
                "compute while the misses are read). Outputs do not change");
  app->add_option("--cache-half-life", cache_half_life,
                  "--cache-policy lfu: tokens after which a request counts half (default 100000; a token is MoE layers x "
                  "top-k requests)");
  app->add_option("--prefetch-workers", prefetch_workers, "Threads reading missing experts in parallel (default 8)");
  app->add_option("--io-engine", io_engine, "How experts are read: pread or uring (default pread)");
  app->add_flag("--use-page-cache", use_page_cache, "Read experts through the OS page cache (default: when the model files are < 0.6 x available memory)");
  app->add_flag("--no-page-cache", no_page_cache, "Read experts with O_DIRECT, bypassing the page cache");
  app->add_option("--prefetch-ahead", prefetch_ahead, "Read the next N layers' likely experts in the background (default 0 = off)");
  app->add_option("--prefetch-next", prefetch_next,
                  "Exact next-layer prefetch: apply the next MoE layer's router to each MoE layer's input and read its M best "
                  "experts per token into a staging area beside the cache (2M buffers; CPU; default 0 = off)");
  app->add_option("--predictor", predictor,
                  "Trained expert predictor (spool calibrate --train-predictor): --prefetch-next reads its heads' M best experts "
                  "instead of the next router's guess (exact; CPU)");
  app->add_flag("--route-by-predictor", route_by_predictor,
                "Route each MoE layer that has a --predictor head among the head's top-k experts only (the router weighs "
                "them): its experts are known and read one layer ahead, no stall; changes the model (docs/predictor.md)");
  app->add_option("--pin-file", pin_file,
                  "JSON {\"pin\": [[layer, expert], ...]} of hot experts (from spool calibrate): kept resident in the streaming cache, or "
                  "placed in VRAM first by --vram-experts static");
  app->add_option("--kv-bits", kv_bits, "KV cache entries: 32 (f32, exact; default), 16 (f16) or 8 (int8 with group scales)");
  app->add_option("--act-bits", act_bits,
                  "Activations of Q4_K / Q6_K (GGUF) and spool q4 / q8 products: 8 (int8 per 256 columns for GGUF, per 8 for spool; integer dots as llama.cpp's "
                  "CPU backend: faster, not exact; x86 with AVX2 or AVX-512, NEON for GGUF), 32 (f32, exact against the "
                  "dequantized weights) or auto (8 where measured faster: Q4_K / Q6_K GGUF weights, spool q4 / q8 on x86; else 32; default)");
  app->add_option("--device", device, "Where the model runs: cpu, cuda, cuda:N or auto (default: cuda:0 when this build has CUDA and a GPU is present, else cpu)");
  app->add_flag("--strict-device", strict_device,
                "GPU runs: fail instead of running an op on the host or copying a host weight to the GPU per use (the load "
                "fails when the model needs an op the GPU backend runs on the host); also SPOOL_STRICT_DEVICE=1");
  app->add_option("--vram-budget-gb", vram_budget,
                  "GPU memory for dense weights + KV + workspace + routed experts, in GB, or 'auto' (the GPU's free memory less 512 MiB, at most 90% of it); routed experts that do not all fit get VRAM slots in what is left");
  app->add_option("--vram-experts", vram_experts,
                  "GPU runs whose routed experts do not all fit VRAM: 'static' (a fixed share in VRAM: each layer's equal share, or "
                  "--pin-file's hot experts first; the rest in page-locked host memory the GPU reads in place: no copies, no "
                  "per-layer waits), 'slots' (LRU expert "
                  "slots in VRAM over the RAM tier and disk) or 'auto' (static when every expert fits in host memory; default)")
      ->check(CLI::IsMember({"auto", "static", "slots"}));
  app->add_option("--expert-owners", expert_owners,
                  "Under mpirun: place each MoE layer's experts on the ranks balanced by the routing in FILE (an --expert-profile "
                  "file or a routing trace), at most ceil(E / ranks) per rank; every rank must read the same file (default: "
                  "contiguous blocks; docs/distributed.md)");
  app->add_option("--comm", comm,
                  "Under mpirun: the communicator of the MoE layers' exchange: 'mpi' (host memory; CPU runs), 'nccl' (GPU memory, "
                  "one GPU per rank; --device cuda) or 'auto' (nccl with --device cuda when this build has NCCL, else mpi; default; "
                  "docs/distributed.md)")
      ->check(CLI::IsMember({"auto", "mpi", "nccl"}));
  app->add_option("--max-active-experts", max_active_experts,
                  "Use only the K best experts per token (0 = the model's top-k). Changes the model: only 0 is exact");
  app->add_option("--host-expert-slots", host_expert_slots,
                  "Tests: N expert slots in host memory in front of the experts on a CPU run (a GPU run's VRAM tier)")
      ->group("");  // hidden
}

void ModelOptions::add_lora_to(CLI::App* app, bool server) {
  app->add_option("--lora", lora,
                  server ? "LoRA adapter applied unmerged (PEFT: its directory or adapter_model.safetensors; or a llama.cpp .gguf "
                           "LoRA), optionally with its default scale: FILE[:SCALE] (default 1); repeatable: adapter ids 0, 1, ... in order, names from their "
                           "directories. Requests choose adapters and scales with `lora: [{\"id\", \"scale\"}]` or a `model` "
                           "naming one; GET/POST /lora-adapters read/set the defaults (docs/lora.md)"
                         : "LoRA adapter applied unmerged (PEFT: its directory or adapter_model.safetensors; or a llama.cpp .gguf LoRA), "
                           "optionally with a scale: "
                           "FILE[:SCALE] (default 1; 0 loads it without effect); repeatable, the adapters add up (docs/lora.md)")
      ->allow_extra_args(false);
  if (server)
    app->add_flag("--lora-init-without-apply", lora_init_without_apply,
                  "Load the --lora adapters with default scale 0 (requests or POST /lora-adapters turn them on)");
}

void ModelOptions::add_warm_start_to(CLI::App* app) {
  app->add_option("--expert-profile", expert_profile,
                  "JSON file of decayed routing counts kept across restarts: at start its hottest experts are read into the "
                  "streaming cache (ordinary LRU entries; a missing file starts cold), and the run's routing is recorded into "
                  "it (serve: every 60 s and at shutdown; generate, bench: at the end). A profile of another model is left "
                  "untouched. Outputs do not change (docs/streaming.md#warm-starts)");
  app->add_option("--expert-profile-half-life", expert_profile_half_life,
                  strfmt("Tokens after which a routing decision counts half in the --expert-profile (default %.0f)",
                         experts::kDefaultProfileHalfLife));
  app->add_flag("--warm-page-cache", warm_page_cache,
                "Read the model files into the OS page cache in the background (lowest CPU and I/O priority) when the "
                "experts stream through the page cache and the files fit in the memory the run leaves free; the log says "
                "when it is skipped and why, and how long it took");
}

void ModelOptions::add_spec_to(CLI::App* app) {
  app->add_option("--spec", spec,
                  "Speculative decoding: 'mtp' drafts with the model's own multi-token-prediction head (Qwen3.5/3.6, "
                  "Qwen3-Next, DeepSeek-V3, GLM-4.5 nextn layers) and verifies the drafts in one forward; output as without it "
                  "(greedy: identical; sampled: the same distribution). 'none' (default)")
      ->check(CLI::IsMember({"none", "mtp"}));
  app->add_option("--draft-max", draft_max, "With --spec mtp: tokens drafted per step, 1..16 (default 1; more run the head on its own output)");
  app->add_option("--draft-vocab", draft_vocab,
                  "With --spec mtp: the head drafts only token ids below N (its output rows read for those alone; BPE ids run "
                  "roughly by frequency); 0 = auto (a quarter of the vocabulary, at least 4096), -1 = all");
  app->add_option("--spec-min-acceptance", spec_min_acceptance,
                  "With --spec mtp: stop speculating for the rest of a generation when the draft acceptance rate after 8 "
                  "verify steps (and every 8 after) is below this, or (generate, bench) when 8 plain steps after the first 8 "
                  "verify steps make tokens faster; 0 = never (default 0.25, docs/speculative.md)");
}

engine::LoadOptions ModelOptions::load_options() const {
  if (stream && no_stream) throw UsageError("--stream and --no-stream contradict each other");
  if (use_page_cache && no_page_cache) throw UsageError("--use-page-cache and --no-page-cache contradict each other");
  if (max_active_experts < 0) throw UsageError(strfmt("--max-active-experts must be >= 0 (got %d)", max_active_experts));
  engine::LoadOptions o;
  o.model_dir = dir();
  o.threads = thread_count();
  if (stream) o.stream = true;
  if (no_stream) o.stream = false;
  o.cache_budget = cache_budget;
  o.cache_policy = experts::parse_cache_policy(cache_policy);
  o.cache_half_life = cache_half_life;
  o.hits_first = !no_hits_first;
  o.prefetch_workers = prefetch_workers;
  o.io_engine = io_engine;
  if (use_page_cache) o.page_cache = true;
  if (no_page_cache) o.page_cache = false;
  o.prefetch_ahead = prefetch_ahead;
  o.prefetch_next = prefetch_next;
  o.predictor = predictor;
  o.route_by_predictor = route_by_predictor;
  o.pin_file = pin_file;
  o.expert_owners = expert_owners;
  o.comm = comm;
  o.max_active_experts = max_active_experts;
  o.strict_device = strict_device;
  ops::kv_type_from_bits(kv_bits);  // UsageError for other values
  o.kv_bits = kv_bits;
  o.act_bits = act_bits == "auto" ? 0 : act_bits == "8" ? 8 : act_bits == "32" ? 32 : -1;
  if (o.act_bits < 0) throw UsageError(strfmt("--act-bits must be 8, 32 or auto (got '%s')", act_bits.c_str()));
  o.device = device;
  o.vram_budget = vram_budget;
  o.vram_experts = vram_experts;
  o.host_expert_slots = host_expert_slots;
  o.expert_profile = expert_profile;
  o.expert_profile_half_life = expert_profile_half_life;
  o.warm_page_cache = warm_page_cache;
  o.mtp = spec_params().mtp;
  o.draft_max = o.mtp ? draft_max : 0;
  for (const std::string& a : lora) o.lora.push_back(engine::parse_lora_option(a));
  if (lora_init_without_apply)
    for (engine::LoraOption& a : o.lora) a.scale = 0.0f;  // loaded, off until a request or POST /lora-adapters asks
  return o;
}

engine::SpecParams ModelOptions::spec_params() const {
  engine::SpecParams p;
  if (spec != "none" && spec != "mtp") throw UsageError(strfmt("--spec must be none or mtp (got '%s')", spec.c_str()));
  p.mtp = spec == "mtp";
  p.draft_max = draft_max;
  p.draft_vocab = draft_vocab;
  p.min_acceptance = spec_min_acceptance;
  p.validate();
  if (!p.mtp && (draft_max != 1 || draft_vocab != 0 || spec_min_acceptance != engine::SpecParams{}.min_acceptance))
    throw UsageError("--draft-max, --draft-vocab and --spec-min-acceptance need --spec mtp");
  return p;
}

std::string ModelOptions::dir() const {
  if (!model.empty()) {
    if (!fs::exists(model)) throw Error(strfmt("model directory '%s' does not exist", model.c_str()));
    const bool gguf = model.size() > 5 && model.compare(model.size() - 5, 5, ".gguf") == 0 && fs::is_regular_file(model);
    if (!fs::is_directory(model) && !gguf)
      throw Error(strfmt("--model '%s' is neither a checkpoint directory nor a .gguf file", model.c_str()));
    return model;
  }
  // The demo model the build unpacked, or one next to the executable (installed layouts).
  std::vector<std::string> candidates = {SPOOL_DEFAULT_MODEL_DIR};
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) candidates.push_back((exe.parent_path() / "models/spool-demo-moe").string());
  for (const auto& c : candidates)
    if (fs::exists(c + "/config.json")) return c;
  throw Error(strfmt("no --model given and the demo model is missing at %s (run the build to unpack it)", SPOOL_DEFAULT_MODEL_DIR));
}

int ModelOptions::thread_count() const {
  if (threads < 0 || threads > 1024) throw UsageError(strfmt("--threads must be 1..1024, or 0 for all hardware threads (got %d)", threads));
  if (threads > 0) return threads;
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

bool has_tokenizer(const std::string& dir) { return fs::exists(dir + "/tokenizer.json"); }

Loaded load_model(const ModelOptions& opt) { return engine::load(opt.load_options()); }

TierStats stats_snapshot(const Loaded& l) {
  TierStats t;
  if (l.streaming) t.ram = l.streaming->stats();
  if (l.expert_slots) {
    l.expert_slots->update_stall();  // (the commands call this on the thread that runs the model)
    t.vram = l.expert_slots->stats();
  }
  return t;
}

nlohmann::ordered_json stats_json(const Loaded& l, const TierStats& tw, int64_t tokens) {
  const experts::StreamingStats& w = tw.ram;
  nlohmann::ordered_json j;
  const double per = tokens > 0 ? 1.0 / static_cast<double>(tokens) : 0.0;
  j["streaming"] = l.streaming != nullptr;
  j["cache_hit_rate"] = l.streaming ? w.hit_rate() : 1.0;
  j["experts_read_per_token"] = static_cast<double>(w.experts_read()) * per;
  j["bytes_read"] = w.bytes_read;
  j["bytes_read_per_token"] = static_cast<double>(w.bytes_read) * per;
  j["prefetch_rescue_rate"] = w.rescue_rate();
  j["prefetch_issued"] = w.prefetch_issued;
  j["cache_peak_bytes"] = w.cache_peak_bytes;
  j["page_cache_resident_bytes"] = engine::page_cache_resident_bytes(*l.ckpt);
  j["model_file_bytes"] = l.ckpt->file_bytes();
  j["tokens"] = tokens;
  if (l.expert_slots) {
    const experts::DeviceExpertCache::Stats& v = tw.vram;
    j["vram_tier"] = {{"slots", l.expert_slots->slots()},
                      {"slot_bytes", l.expert_slots->slot_bytes()},
                      {"hits", v.hits},
                      {"misses", v.misses},
                      {"hit_rate", v.hit_rate()},
                      {"early_copies", v.early},
                      {"bytes_copied", v.bytes_copied},
                      {"bytes_copied_per_token", static_cast<double>(v.bytes_copied) * per},
                      {"stall_s", v.stall_s}};
  }
  if (l.streaming)
    j["ram_tier"] = {{"requests", w.requests},
                     {"hits", w.hits},
                     {"misses", w.misses},
                     {"hit_rate", w.hit_rate()},
                     {"bytes_read", w.bytes_read},
                     {"bytes_read_per_token", static_cast<double>(w.bytes_read) * per},
                     {"stall_s", w.stall_s},
                     {"pinned_bytes", w.pinned_bytes},
                     {"preloaded", w.preloaded}};
  j["memory"] = engine::memory_json(l.memory);
  j["device"] = l.device;
  if (l.device != "cpu") {
    j["device_name"] = l.device_name;
    j["experts_on_device"] = l.experts_on_device;
    j["experts_static"] = l.experts_static;
    j["vram_expert_share"] = l.vram_expert_share;
    j["vram_budget_bytes"] = l.vram_budget;
    j["vram_uploaded_bytes"] = l.vram_used;
  }
  return j;
}

std::string stats_line(const Loaded& l, const TierStats& tw, int64_t tokens) {
  const experts::StreamingStats& w = tw.ram;
  const uint64_t pc = engine::page_cache_resident_bytes(*l.ckpt);
  const std::string dev = l.device == "cpu" ? "device cpu; "
                          : strfmt("device %s (%s), experts %s; ", l.device.c_str(), l.device_name.c_str(),
                                   l.experts_on_device ? "in VRAM"
                                   : l.experts_static ? strfmt("static (%.0f%% in VRAM, the rest read in place from pinned host memory)",
                                                               100.0 * l.vram_expert_share).c_str()
                                   : l.expert_slots   ? "in VRAM slots"
                                                      : "copied from host per use");
  const double per = tokens > 0 ? 1.0 / static_cast<double>(tokens) : 0.0;
  std::string slots;
  if (l.expert_slots) {
    const experts::DeviceExpertCache::Stats& v = tw.vram;
    slots = strfmt("%s slots: hit rate %.1f%% (%llu hits, %llu misses, %llu copied early), %s/token copied (%s total), stall %.3f s; ",
                   l.device == "cpu" ? "host" : "VRAM", 100.0 * v.hit_rate(), (unsigned long long)v.hits, (unsigned long long)v.misses,
                   (unsigned long long)v.early, format_bytes(static_cast<uint64_t>(v.bytes_copied * per)).c_str(),
                   format_bytes(v.bytes_copied).c_str(), v.stall_s);
  }
  if (!l.streaming)
    return dev + slots + strfmt("experts resident; page cache holds %s of the %s model", format_bytes(pc).c_str(),
                  format_bytes(l.ckpt->file_bytes()).c_str());
  return dev + slots + strfmt("%sexperts: hit rate %.1f%% (%llu hits, %llu misses), %.2f read/token, %s/token from disk (%s total), stall %.3f s%s; page cache holds %s of the %s model",
                w.pinned_bytes ? strfmt("RAM tier pinned (%s), ", format_bytes(w.pinned_bytes).c_str()).c_str() : "",
                100.0 * w.hit_rate(), (unsigned long long)w.hits, (unsigned long long)w.misses, w.experts_read() * per,
                format_bytes(static_cast<uint64_t>(w.bytes_read * per)).c_str(), format_bytes(w.bytes_read).c_str(), w.stall_s,
                w.prefetch_issued ? strfmt(", prefetch rescued %.1f%% of misses (%llu prefetched)", 100.0 * w.rescue_rate(), (unsigned long long)w.prefetch_issued).c_str() : "",
                format_bytes(pc).c_str(), format_bytes(l.ckpt->file_bytes()).c_str());
}

std::vector<int32_t> parse_id_list(const std::string& s) {
  std::vector<int32_t> ids;
  std::string tok;
  std::stringstream ss(s);
  while (std::getline(ss, tok, ',')) {
    size_t b = tok.find_first_not_of(" \t"), e = tok.find_last_not_of(" \t");
    if (b == std::string::npos) throw UsageError(strfmt("--prompt-ids: empty entry in '%s'", s.c_str()));
    tok = tok.substr(b, e - b + 1);
    char* end = nullptr;
    long long v = std::strtoll(tok.c_str(), &end, 10);
    if (end == tok.c_str() || *end != '\0' || v < 0 || v > INT32_MAX)
      throw UsageError(strfmt("--prompt-ids: '%s' is not a token id", tok.c_str()));
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) throw UsageError("--prompt-ids: no ids given");
  return ids;
}

std::string read_file(const std::string& path) { return read_whole_file(path); }

}  // namespace spool::cli
