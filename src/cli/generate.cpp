// spool generate: prompt in, text (or ids) out, streamed to stdout; stats to stderr.
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/common.h"
#include "common/error.h"
#include "dist/comm.h"
#include "common/log.h"
#include "common/sysinfo.h"
#include "engine/session.h"
#include "template/chat_template.h"
#include "tokenizer/stream_decoder.h"

namespace spool::cli {

namespace {

struct GenerateOptions {
  ModelOptions model;
  std::string prompt, prompt_ids, file;
  int max_tokens = 256;
  std::optional<float> temp, top_p, min_p, repeat_penalty;
  std::optional<int> top_k;
  int64_t seed = -1;  // -1 = random
  bool has_prompt = false, has_ids = false, has_file = false;
  int64_t prefill_step = 512;
  int64_t ctx_size = 0;             // --ctx-size; 0 = the prompt's tokens + --max-tokens
  bool json = false;
  bool chat = false;                // --chat: the prompt is a user message rendered with the chat template
  std::string system;               // --system: a system message before it (with --chat)
  std::string chat_template_kwargs; // --chat-template-kwargs JSON object (with --chat)
  bool ignore_eos = false;          // --ignore-eos: end-of-sequence ids do not end generation
};

// The prompt text as one user turn (after an optional system turn) rendered with the model's
// chat template, ending with the assistant header (add_generation_prompt).
std::string chat_prompt(const GenerateOptions& o, const tokenizer::Tokenizer& tok, const std::string& user, const std::string& dir) {
  if (tok.chat_template().empty()) throw Error(strfmt("%s has no chat template (chat_template.jinja or tokenizer_config.json); drop --chat", dir.c_str()));
  tmpl::Template t = tmpl::Template::parse(tok.chat_template(), dir + " chat template");
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!o.system.empty()) messages.push_back({{"role", "system"}, {"content", o.system}});
  messages.push_back({{"role", "user"}, {"content", user}});
  tmpl::ChatOptions opt;
  opt.add_generation_prompt = true;
  if (!o.chat_template_kwargs.empty()) opt.extra_kwargs = nlohmann::ordered_json::parse(o.chat_template_kwargs);
  return tmpl::apply_chat_template(t, messages, opt, tmpl::special_tokens_from_config(nlohmann::ordered_json(tok.config())));
}

engine::SamplingParams sampling_from(const GenerateOptions& o, const io::GenerationDefaults& g) {
  // spool defaults under generation_config.json (a bad file is an error naming it, not a usage
  // error), then the flags.
  engine::SamplingParams p = engine::sampling_defaults(g);
  if (o.temp) p.temperature = *o.temp;
  if (o.top_p) p.top_p = *o.top_p;
  if (o.top_k) p.top_k = *o.top_k;
  if (o.min_p) p.min_p = *o.min_p;
  if (o.repeat_penalty) p.repetition_penalty = *o.repeat_penalty;
  p.seed = o.seed >= 0 ? static_cast<uint64_t>(o.seed) : std::random_device{}();
  // Expert-parallel ranks sample in lockstep: rank 0's seed everywhere (the logits are the same bits).
  if (dist::launched_by_mpi()) dist::world().broadcast(&p.seed, sizeof(p.seed), 0);
  p.validate();
  return p;
}

void run(const GenerateOptions& o) {
  // Memory available before this process reads any of the model's files (the tokenizer is
  // read first, to count the prompt's tokens): the budget `spool plan` computes at its start.
  const uint64_t available = available_memory_bytes();
  const uint64_t start_rss = current_rss_bytes();
  const int sources = o.has_prompt + o.has_ids + o.has_file;
  if (sources != 1) throw UsageError("give exactly one of --prompt, --prompt-ids or --file");
  if (o.has_prompt && o.prompt.empty()) throw UsageError("--prompt is empty");
  if (o.seed < -1) throw UsageError(strfmt("--seed must be >= 0, or -1 for a random seed (got %lld)", (long long)o.seed));
  // Check what can be checked before loading (a big model takes a while to load).
  std::vector<int32_t> given_ids;
  if (o.has_ids) given_ids = parse_id_list(o.prompt_ids);
  const std::string file_text = o.has_file ? read_file(o.file) : std::string();
  if (o.has_file && file_text.empty()) throw Error(strfmt("%s is empty", o.file.c_str()));
  if (o.max_tokens < 0) throw UsageError(strfmt("--max-tokens must be >= 0 (got %d)", o.max_tokens));
  if (o.prefill_step <= 0) throw UsageError(strfmt("--prefill-step-size must be positive (got %lld)", (long long)o.prefill_step));
  if (o.ctx_size < 0 || o.ctx_size > (int64_t{1} << 24))
    throw UsageError(strfmt("--ctx-size must be 1..16777216, or 0 for the prompt's tokens + --max-tokens (got %lld)", (long long)o.ctx_size));
  if (!o.chat && (!o.system.empty() || !o.chat_template_kwargs.empty())) throw UsageError("--system and --chat-template-kwargs need --chat");
  if (o.chat && o.has_ids) throw UsageError("--chat takes text (--prompt or --file), not --prompt-ids");
  if (!o.chat_template_kwargs.empty() && !nlohmann::ordered_json::parse(o.chat_template_kwargs, nullptr, false).is_object())
    throw UsageError("--chat-template-kwargs must be a JSON object, e.g. '{\"enable_thinking\": false}'");
  // Validate the parameters before loading anything.
  sampling_from(o, {});
  engine::LoadOptions lo = o.model.load_options();
  lo.available = available;
  lo.start_rss = start_rss;
  const std::string dir = lo.model_dir;

  // The prompt's tokens first: the context they and --max-tokens need sizes the KV cache and
  // workspace the loader keeps out of the expert-cache budget.
  engine::GenerateRequest req;
  std::optional<tokenizer::Tokenizer> tok;
  tok = engine::load_tokenizer(dir);  // tokenizer.json, or a .gguf's tokenizer.ggml.* metadata
  if (o.has_ids) {
    req.prompt = given_ids;
  } else {
    if (!tok) throw Error(strfmt("%s has no tokenizer.json; use --prompt-ids to give token ids", dir.c_str()));
    const std::string& text = o.has_file ? file_text : o.prompt;
    // A chat prompt is the template's text (which writes its own BOS); a plain prompt gets what the
    // tokenizer adds to a plain encode (HF tokenizer(text), llama.cpp): Llama/DeepSeek's BOS, Qwen nothing.
    req.prompt = o.chat ? tok->encode(chat_prompt(o, *tok, text, dir), /*add_special=*/false) : tok->encode_prompt(text);
  }
  const int64_t prompt_len = static_cast<int64_t>(req.prompt.size());
  if (o.ctx_size > 0 && prompt_len > o.ctx_size)
    throw UsageError(strfmt("the prompt has %lld tokens, more than --ctx-size %lld", (long long)prompt_len, (long long)o.ctx_size));
  lo.ctx_size = o.ctx_size > 0 ? o.ctx_size : std::max<int64_t>(prompt_len + o.max_tokens, 1);
  lo.prefill_step = o.prefill_step;
  Loaded l = engine::load(lo, std::move(tok));
  const auto& spec = l.model->spec();

  for (int32_t id : req.prompt)
    if (id >= spec.vocab_size) throw Error(strfmt("prompt token id %d is outside the vocabulary (%lld tokens)", id, (long long)spec.vocab_size));
  req.max_tokens = o.max_tokens;
  req.sampling = sampling_from(o, l.ckpt->generation());
  req.prefill_step = o.prefill_step;
  req.ctx_size = lo.ctx_size;
  req.spec = o.model.spec_params();
  for (int64_t e : spec.eos_token_ids) req.stop_ids.push_back(static_cast<int32_t>(e));
  // A chat turn also ends at the tokenizer's eos_token (e.g. <|im_end|>).
  if (o.chat && l.tok->eos_id() && *l.tok->eos_id() < spec.vocab_size) req.stop_ids.push_back(*l.tok->eos_id());
  // --ignore-eos (llama.cpp's flag): an end-of-sequence id is output like any token and
  // generation goes on to --max-tokens (benchmarks of a fixed length).
  if (o.ignore_eos) req.stop_ids.clear();

  std::optional<tokenizer::StreamDecoder> dec;
  if (l.tok && !o.json) dec.emplace(*l.tok);
  bool first_id = true, prefilled = false;
  TierStats after_prefill = stats_snapshot(l);
  engine::Session session(*l.model);
  engine::GenerateResult res = session.generate(req, [&](int32_t id) {
    if (!prefilled) {  // first callback: the prompt has been processed
      after_prefill = stats_snapshot(l);
      prefilled = true;
    }
    if (o.json) return true;
    if (dec) {
      // Stop ids end the text; they are not printed.
      if (std::find(req.stop_ids.begin(), req.stop_ids.end(), id) == req.stop_ids.end() && id < l.tok->vocab_size()) {
        std::string piece = dec->push(id);
        std::fwrite(piece.data(), 1, piece.size(), stdout);
      }
    } else {
      std::printf(first_id ? "%d" : ",%d", id);
      first_id = false;
    }
    std::fflush(stdout);
    return true;
  });
  const uint64_t rss = peak_rss_bytes();
  engine::save_expert_profile(l);
  // Expert statistics of the decode phase (per decode forward), or of the prompt if none.
  const TierStats end = stats_snapshot(l);
  const bool decoded = res.timings.decode_forwards > 0;
  const TierStats window = decoded ? end - after_prefill : end;
  const int64_t window_tokens = decoded ? std::max<int64_t>(res.timings.decode_tokens, 1) : res.timings.prompt_tokens;
  if (o.json) {
    nlohmann::ordered_json j;
    j["prompt_ids"] = req.prompt;
    j["output_ids"] = res.output;
    if (l.tok) {
      std::vector<int32_t> text_ids = res.output;
      if (!text_ids.empty() && res.finish_reason == "stop" &&
          std::find(req.stop_ids.begin(), req.stop_ids.end(), text_ids.back()) != req.stop_ids.end())
        text_ids.pop_back();
      // Ids the tokenizer does not know (a synthetic model's vocabulary can be larger) are
      // skipped, as transformers' decode does.
      std::erase_if(text_ids, [&](int32_t id) { return id >= l.tok->vocab_size(); });
      j["text"] = l.tok->decode(text_ids);
    }
    j["finish_reason"] = res.finish_reason;
    j["seed"] = req.sampling.seed;
    j["timings"] = {{"load_s", l.load_s},
                    {"prefill_s", res.timings.prefill_s},
                    {"prefill_tok_s", res.timings.prefill_tok_s()},
                    {"decode_s", res.timings.decode_s},
                    {"decode_tok_s", res.timings.decode_tok_s()}};
    j["stats"] = stats_json(l, window, window_tokens);
    if (req.spec.mtp)
      j["speculative"] = {{"type", "mtp"},
                          {"draft_max", req.spec.draft_max},
                          {"steps", res.spec.steps},
                          {"drafted", res.spec.drafted},
                          {"accepted", res.spec.accepted},
                          {"acceptance", res.spec.acceptance()},
                          {"tokens_per_step", res.spec.tokens_per_step()},
                          {"auto_off", res.spec.auto_off},
                          {"probe_spec_tok_s", res.spec.spec_tok_s},
                          {"probe_plain_tok_s", res.spec.plain_tok_s}};
    j["peak_rss_bytes"] = rss;
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    if (dec) {
      std::string rest = dec->flush();
      std::fwrite(rest.data(), 1, rest.size(), stdout);
    }
    std::printf("\n");
  }
  std::fflush(stdout);
  std::fprintf(stderr,
               "spool: load %.2f s | prompt %lld tok, %.1f tok/s | decode %zu tok, %.1f tok/s | finish %s | peak RSS %s\n",
               l.load_s, (long long)res.timings.prompt_tokens, res.timings.prefill_tok_s(), res.output.size(),
               res.timings.decode_tok_s(), res.finish_reason.c_str(), format_bytes(rss).c_str());
  std::fprintf(stderr, "spool: %s\n", stats_line(l, window, window_tokens).c_str());
  if (req.spec.mtp)
    std::fprintf(stderr, "spool: speculative mtp: %lld steps, %lld of %lld drafts accepted (%.2f), %.2f tokens per step%s\n",
                 (long long)res.spec.steps, (long long)res.spec.accepted, (long long)res.spec.drafted, res.spec.acceptance(),
                 res.spec.tokens_per_step(),
                 !res.spec.auto_off ? ""
                 : res.spec.plain_tok_s > res.spec.spec_tok_s && res.spec.plain_tok_s > 0 &&
                         !(res.spec.acceptance() < req.spec.min_acceptance)
                     ? strfmt(", auto-off: plain steps were faster (%.1f against %.1f tok/s)", res.spec.plain_tok_s, res.spec.spec_tok_s).c_str()
                     : ", auto-off for low acceptance");
}

}  // namespace

void register_generate(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  CLI::App* c = app.add_subcommand("generate", "Generate text from a prompt (raw text, or a chat turn with --chat)");
  o->model.add_to(c);
  o->model.add_lora_to(c);
  o->model.add_spec_to(c);
  o->model.add_warm_start_to(c);
  CLI::Option* op = c->add_option("-p,--prompt", o->prompt, "Prompt text (encoded as is, no special tokens added)");
  CLI::Option* oi = c->add_option("--prompt-ids", o->prompt_ids, "Prompt as comma-separated token ids, e.g. 1,2,3");
  CLI::Option* of = c->add_option("-f,--file", o->file, "Read the prompt from a file");
  c->add_option("-n,--max-tokens", o->max_tokens, "Tokens to generate at most (default 256)");
  c->add_option("--temp", o->temp, "Temperature; 0 = greedy (default: generation_config.json, else 0.8)");
  c->add_option("--top-p", o->top_p, "Nucleus sampling mass (default: generation_config.json, else 0.95)");
  c->add_option("--top-k", o->top_k, "Keep the k most likely tokens, 0 = off (default: generation_config.json, else 40)");
  c->add_option("--min-p", o->min_p, "Drop tokens below min_p x p(best) (default 0.05)");
  c->add_option("--repeat-penalty", o->repeat_penalty, "Repetition penalty, 1 = off (default: generation_config.json, else 1.0)");
  c->add_option("-s,--seed", o->seed, "Random seed; -1 = random (default; the seed used is reported with --json)");
  c->add_option("--prefill-step-size", o->prefill_step, "Prompt tokens per forward pass (default 512)");
  c->add_option("-c,--ctx-size", o->ctx_size,
                "Prompt + generated tokens at most; sizes the KV cache the expert-cache budget leaves room for "
                "(default 0 = the prompt's tokens + --max-tokens)");
  c->add_flag("--ignore-eos", o->ignore_eos, "Keep generating past end-of-sequence tokens, up to --max-tokens");
  c->add_flag("--json", o->json, "Print one JSON object instead of streaming text");
  c->add_flag("--chat", o->chat, "Send the prompt as a user message through the model's chat template");
  c->add_option("--system", o->system, "System message before the prompt (with --chat)");
  c->add_option("--chat-template-kwargs", o->chat_template_kwargs, "JSON object of template variables (with --chat), e.g. '{\"enable_thinking\": false}'");
  c->callback([o, op, oi, of] {
    o->has_prompt = op->count() > 0;
    o->has_ids = oi->count() > 0;
    o->has_file = of->count() > 0;
    run(*o);
  });
}

}  // namespace spool::cli
