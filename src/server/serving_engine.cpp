#include "server/serving_engine.h"

#include <algorithm>

#include "common/error.h"
#include "common/files.h"
#include "common/log.h"
#include "models/family.h"
#include "server/chat_format.h"

namespace spool::server {

std::unique_ptr<ServingEngine> make_serving_engine(engine::LoadedModel loaded, const EngineOptions& opt) {
  auto e = std::make_unique<ServingEngine>();
  e->loaded = std::move(loaded);
  engine::LoadedModel& l = e->loaded;
  if (!l.tok) fail("%s has no tokenizer.json; spool serve needs one", l.ckpt->dir().c_str());
  const models::ModelSpec& spec = l.model->spec();
  ModelFacts& f = e->facts;
  f.name = opt.model_name;
  f.tok = &*l.tok;
  f.token_index = std::make_shared<constrain::LazyTokenIndex>(*l.tok, spec.vocab_size);
  f.defaults = engine::sampling_defaults(l.ckpt->generation());
  f.vocab_size = spec.vocab_size;
  if (opt.reasoning_budget < -1) throw UsageError(strfmt("--reasoning-budget must be -1 (unlimited) or >= 0 (got %d)", opt.reasoning_budget));
  f.reasoning_budget = opt.reasoning_budget;
  f.ctx_size = opt.ctx_size > 0 ? opt.ctx_size : (spec.max_position_embeddings > 0 ? spec.max_position_embeddings : 4096);
  for (int64_t id : spec.eos_token_ids) f.stop_ids.push_back(static_cast<int32_t>(id));
  if (auto eos = l.tok->eos_id(); eos && *eos < spec.vocab_size &&
                                  std::find(f.stop_ids.begin(), f.stop_ids.end(), *eos) == f.stop_ids.end())
    f.stop_ids.push_back(*eos);
  std::string text = opt.chat_template_file.empty() ? l.tok->chat_template() : read_whole_file(opt.chat_template_file);
  if (!text.empty()) {
    const std::string label = opt.chat_template_file.empty() ? l.ckpt->dir() + " chat template" : opt.chat_template_file;
    e->tmpl.emplace(tmpl::Template::parse(text, label));
    f.chat.tmpl = &*e->tmpl;
    std::string note;
    f.chat.tool_syntax = resolve_chat_format(text, models::family_named(spec.family), &note);
    if (!note.empty() && opt.chat_format.empty()) log_info("%s", note.c_str());
    f.chat.source = text;
  } else {
    log_warn("%s has no chat template: /v1/chat/completions will refuse requests", l.ckpt->dir().c_str());
  }
  if (!opt.chat_format.empty()) {
    const ChatFormat* cf = find_chat_format(opt.chat_format);
    if (cf == nullptr) {
      std::string names;
      for (const auto& x : chat_formats()) names += (names.empty() ? "" : ", ") + std::string(x.name);
      throw UsageError("--chat-format: unknown format '" + opt.chat_format + "' (one of: " + names + ")");
    }
    f.chat.tool_syntax = cf->id;
  }
  if (l.lora != nullptr && !l.lora->empty()) {  // --lora: ids in order, names, default scales (server/lora_adapters.h)
    std::vector<LoraAdapters::Info> info;
    for (const lora::Adapter& a : l.lora->adapters()) info.push_back({a.name, a.path});
    f.lora = std::make_shared<LoraAdapters>(std::move(info), l.lora->scales());
  }
  f.chat.special_tokens = tmpl::special_tokens_from_config(nlohmann::ordered_json(l.tok->config()));
  f.chat.default_kwargs = opt.template_kwargs;
  e->session = std::make_unique<engine::Session>(*l.model);
  if (!opt.disk_cache_dir.empty()) {
    if (!(opt.disk_cache_budget_gb > 0)) throw UsageError("--disk-cache-budget-gb must be > 0");
    const uint64_t budget = static_cast<uint64_t>(opt.disk_cache_budget_gb * 1e9);
    // (--lora: each request's adapters and scales key its snapshots: PromptCache::set_variant)
    const std::string fp = model_fingerprint(*l.ckpt, opt.kv_bits, opt.prefill_step, opt.max_active_experts);
    e->disk = std::make_unique<DiskCache>(opt.disk_cache_dir, budget, fp);
  }
  e->cache = std::make_unique<PromptCache>(opt.prefill_step, opt.cache_checkpoints, e->disk.get());
  e->gen = std::make_unique<Generator>(*e->session, *e->cache, *l.tok, opt.tool_syntax_greedy);
  if (opt.parallel < 0) throw UsageError(strfmt("--parallel must be >= 1 (got %d)", opt.parallel));
  if (opt.parallel == 0 && !opt.trace_out.empty()) throw UsageError("--trace-out records the batch engine's steps: it needs --parallel >= 1");
  if (opt.parallel > 0) {
    BatchOptions bo;
    bo.parallel = opt.parallel;
    bo.prefill_step = opt.prefill_step;
    bo.ctx_size = f.ctx_size;
    bo.cache_checkpoints = opt.cache_checkpoints;
    bo.disk = e->disk.get();
    bo.tool_syntax_greedy = opt.tool_syntax_greedy;
    bo.spec = opt.spec;
    if (!opt.trace_out.empty()) {
      const experts::TraceShape ts = engine::trace_shape_of(spec, opt.max_active_experts, "serve");
      bo.trace = std::make_shared<experts::TraceWriter>(opt.trace_out, ts);
    }
    e->batch = std::make_unique<BatchEngine>(*l.model, *l.tok, bo);
  }
  return e;
}

}  // namespace spool::server
