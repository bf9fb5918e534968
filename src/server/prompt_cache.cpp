#include "server/prompt_cache.h"

#include <algorithm>

#include "common/error.h"
#include "common/log.h"

namespace spool::server {

PromptCache::PromptCache(int64_t step, size_t max_checkpoints, DiskCache* disk) : step_(step), max_cps_(max_checkpoints), disk_(disk) {
  if (step <= 0) throw UsageError(strfmt("prefill step size must be positive (got %lld)", (long long)step));
}

void PromptCache::clear() {
  tokens_.clear();
  cps_.clear();
}

std::vector<int64_t> PromptCache::checkpoint_positions() const {
  std::vector<int64_t> v;
  for (const auto& c : cps_) v.push_back(c.pos());
  return v;
}

void PromptCache::add_checkpoint(const models::State& st) {
  if (max_cps_ == 0) return;
  cps_.push_back(st.snapshot());
  if (cps_.size() <= max_cps_) return;
  // Over the limit: drop the checkpoint whose removal leaves the smallest gap (never the newest),
  // which keeps early prefixes (shared system prompts) and recent ones reachable.
  size_t drop = 0;
  int64_t best = INT64_MAX;
  for (size_t i = 0; i + 1 < cps_.size(); ++i) {
    const int64_t gap = cps_[i + 1].pos() - (i > 0 ? cps_[i - 1].pos() : 0);
    if (gap < best) {
      best = gap;
      drop = i;
    }
  }
  cps_.erase(cps_.begin() + static_cast<std::ptrdiff_t>(drop));
}

int64_t PromptCache::begin(models::State& st, std::span<const int32_t> prompt) {
  if (prompt.empty()) fail("the prompt is empty (at least one token is needed)");
  if (st.poisoned || st.pos != static_cast<int64_t>(tokens_.size())) clear();
  const int64_t n = static_cast<int64_t>(prompt.size());
  const int64_t lcp = std::mismatch(tokens_.begin(), tokens_.end(), prompt.begin(), prompt.end()).first - tokens_.begin();
  const int64_t limit = std::min(lcp, n - 1);
  // Nearest memory checkpoint at or before the limit.
  int ci = -1;
  for (size_t i = 0; i < cps_.size(); ++i)
    if (cps_[i].pos() <= limit) ci = static_cast<int>(i);
  int64_t from = ci >= 0 ? cps_[ci].pos() : 0;
  bool loaded_from_disk = false;
  // A disk snapshot reaching further replaces the state. DiskCache::load checks the file before
  // it touches `st`, so a corrupt one (0) leaves the state and the memory checkpoints usable:
  // the memory checkpoint is restored below as if there were no disk cache.
  if (disk_ && disk_->best_match(prompt, n - 1, variant_) > from) {
    const int64_t got = disk_->load(prompt, n - 1, st, variant_);
    if (got > from) {
      // Memory checkpoints stay valid up to where the old tokens agree with the new prompt.
      std::erase_if(cps_, [&](const models::StateSnapshot& c) { return c.pos() > std::min(lcp, got); });
      tokens_.assign(prompt.begin(), prompt.begin() + got);
      if (max_cps_ > 0 && (cps_.empty() || cps_.back().pos() < got)) add_checkpoint(st);
      from = got;
      loaded_from_disk = true;
    }
  }
  if (!loaded_from_disk && from > 0) {
    try {
      st.restore(cps_[ci]);
      tokens_.resize(from);
      cps_.resize(ci + 1);
    } catch (const Error& e) {
      // Only when something else moved the session's state behind this cache's back (restore
      // checks that the KV rows the checkpoint relies on are still there): start over.
      log_warn("prompt cache: %s; prefilling from the start", e.what());
      from = 0;
    }
  }
  if (!loaded_from_disk && from == 0) {
    st.reset();
    tokens_.clear();
    cps_.clear();
  }
  saved_ = loaded_from_disk ? from : -1;
  return from;
}

std::string lora_variant(const models::Model& model, const std::vector<float>& scales) {
  if (model.lora == nullptr || model.lora->empty()) return "";
  return scales.empty() ? model.lora->fingerprint() : model.lora->fingerprint(scales);
}

void PromptCache::set_variant(const std::string& variant) {
  if (variant == variant_) return;
  clear();
  variant_ = variant;
}

int64_t PromptCache::reusable(std::span<const int32_t> prompt, const std::string& variant) const {
  if (prompt.empty() || variant != variant_) return 0;
  const int64_t lcp = std::mismatch(tokens_.begin(), tokens_.end(), prompt.begin(), prompt.end()).first - tokens_.begin();
  return std::min<int64_t>(lcp, static_cast<int64_t>(prompt.size()) - 1);
}

void PromptCache::chunk_done(const models::State& st, std::span<const int32_t> ids) {
  tokens_.insert(tokens_.end(), ids.begin(), ids.end());
  if (static_cast<int64_t>(ids.size()) == step_) add_checkpoint(st);
}

void PromptCache::done(const models::State& st) {
  if (disk_ && !cps_.empty() && cps_.back().pos() > saved_ && cps_.back().pos() > 0)
    disk_->save(std::span<const int32_t>(tokens_).first(cps_.back().pos()), st, cps_.back(), variant_);
}

void PromptCache::abort(models::State& st) {
  clear();
  st.reset();
}

int64_t PromptCache::prefill(engine::Session& s, std::span<const int32_t> prompt, const std::function<bool()>& keep_going) {
  models::State& st = s.state();
  const int64_t n = static_cast<int64_t>(prompt.size());
  const int64_t from = begin(st, prompt);
  try {
    for (int64_t i = from; i < n; i += step_) {
      if (keep_going && !keep_going()) {
        abort(st);
        return -1;
      }
      const int64_t e = std::min(i + step_, n);
      s.prefill(prompt.subspan(i, e - i), step_);
      chunk_done(st, prompt.subspan(i, e - i));
    }
  } catch (...) {
    abort(st);
    throw;
  }
  done(st);
  return from;
}

}  // namespace spool::server
