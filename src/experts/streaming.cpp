#include "experts/streaming.h"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstring>
#include <unordered_set>

#include "common/error.h"
#include "common/log.h"
#include "common/sysinfo.h"
#include "experts/weight_views.h"
#include "ops/thread_pool.h"
#include "ops/cpu_backend.h"

namespace spool::experts {

namespace {
constexpr uint64_t kPrefetchJudgeAfter = 2000;  // prefetches before judging usefulness
constexpr double kPrefetchMinRescue = 0.03;
}  // namespace

StreamingStats StreamingStats::operator-(const StreamingStats& o) const {
  StreamingStats d = *this;
  d.requests -= o.requests;
  d.hits -= o.hits;
  d.misses -= o.misses;
  d.bytes_read -= o.bytes_read;
  d.reads -= o.reads;
  d.prefetch_issued -= o.prefetch_issued;
  d.prefetch_rescued -= o.prefetch_rescued;
  d.evictions -= o.evictions;
  d.stall_s -= o.stall_s;
  d.staged -= o.staged;
  d.staged_used -= o.staged_used;
  return d;
}

StreamingExperts::StreamingExperts(std::shared_ptr<const io::Checkpoint> ckpt, const std::vector<bool>& moe_layers,
                                   int n_experts, int hidden, int intermediate, StreamingOptions opt)
    : ckpt_(std::move(ckpt)),
      opt_(std::move(opt)),
      store_(*ckpt_, moe_layers, n_experts, opt_.direct),
      cache_(opt_.hold_all ? store_.slot_bytes() * static_cast<uint64_t>(std::count(moe_layers.begin(), moe_layers.end(), true)) *
                                 static_cast<uint64_t>(n_experts)
                           : opt_.cache_budget_bytes,
             store_.slot_bytes(), opt_.policy) {
  // Each expert's storage (type, group, shapes): a calibrated conversion (spool convert
  // --calibration) gives the experts of one layer different formats; the slot is as large as the
  // largest (io::ExpertStore). expert_views() checks each expert's shapes.
  bool any = false;
  proto_.resize(moe_layers.size());
  for (int l = 0; l < static_cast<int>(moe_layers.size()); ++l) {
    if (!moe_layers[l]) continue;
    any = true;
    proto_[l].resize(static_cast<size_t>(n_experts));
    for (int e = 0; e < n_experts; ++e) {
      // Expert 0's data (codebooks, shared signs) is checked here; the others' shapes only, from
      // the headers: their bytes are checked when read (check_slot), never faulted in at load.
      const ExpertWeights v = expert_views(*ckpt_, l, e, hidden, intermediate, /*check_data=*/e == 0);
      proto_[l][e] = {v.gate, v.up, v.down};
    }
  }
  if (!any) fail("%s: streaming was requested but the model has no routed experts", ckpt_->dir().c_str());
  if (opt_.pin_with != nullptr) {
    const int64_t all = static_cast<int64_t>(std::count(moe_layers.begin(), moe_layers.end(), true)) * n_experts;
    const auto [block, bytes] = cache_.reserve_block(all);
    if (opt_.pin_with->pin_host(block, bytes)) {
      locked_ = block;
      locked_bytes_ = bytes;
    } else {
      log_warn("could not page-lock the %s expert cache: copies to the GPU read pageable memory (slower, same bytes)",
               format_bytes(bytes).c_str());
    }
  }
  try {  // a failure from here on must not leave the cache's block page-locked (no destructor runs)
    std::vector<std::string> paths;
    for (const auto& s : ckpt_->shards()) paths.push_back(s.path());
    reader_ = std::make_unique<io::ExpertReader>(paths, io::ExpertReader::Options{opt_.engine, opt_.workers, opt_.direct});
    in_use_.resize(moe_layers.size());
    prepared_.resize(moe_layers.size());
    last_ids_.resize(moe_layers.size());
    begun_.resize(moe_layers.size());
    for (int i = 0; i < opt_.stage_slots; ++i) {
      Stage st;
      st.data = static_cast<uint8_t*>(std::aligned_alloc(4096, (store_.slot_bytes() + 4095) / 4096 * 4096));
      if (st.data == nullptr) fail("out of memory allocating the expert staging area (--prefetch-next)");
      stage_.push_back(std::move(st));
    }
    if (cache_.capacity() < opt_.top_k)
      log_warn("--cache-budget-gb holds %lld experts, fewer than the %d a token uses; the cache will exceed it",
               (long long)cache_.capacity(), opt_.top_k);
    for (const ExpertCount& c : opt_.seed) cache_.seed(c.layer, c.expert, c.count);
    load_pins();
    load_warm();
  } catch (...) {
    reader_.reset();
    for (Stage& st : stage_) std::free(st.data);
    if (locked_ != nullptr) opt_.pin_with->unpin_host(locked_);
    throw;
  }
}

StreamingExperts::~StreamingExperts() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    closing_ = true;  // a finishing guess read submits no next one (reader_ is going away)
    spec_queue_.clear();
  }
  reader_.reset();  // joins I/O threads: no callback touches the cache after this
  for (Stage& st : stage_) std::free(st.data);
  if (locked_ != nullptr) opt_.pin_with->unpin_host(locked_);
}

void StreamingExperts::unpin() {
  if (locked_ == nullptr) return;
  opt_.pin_with->unpin_host(locked_);
  locked_ = nullptr;
  locked_bytes_ = 0;
}

void StreamingExperts::load_pins() {
  if (opt_.pins.empty()) return;
  std::vector<ExpertCache::Entry*> entries;
  const int64_t limit = cache_.capacity() - std::max(opt_.top_k, 1);
  for (const auto& [l, e] : opt_.pins) {
    if (!store_.has_layer(l) || e < 0 || e >= store_.n_experts())
      fail("pin file names expert (%d, %d), which the model does not have", l, e);
    if (static_cast<int64_t>(entries.size()) >= limit) {
      log_warn("pin file: %zu pins fit in the cache budget; the remaining %zu are ignored", entries.size(),
               opt_.pins.size() - entries.size());
      break;
    }
    if (cache_.find(l, e) != nullptr) continue;
    ExpertCache::Entry* en = cache_.insert(l, e);
    en->pinned = true;
    entries.push_back(en);
  }
  reader_->read_all(plan_reads(entries));
  for (auto* en : entries) {
    if (std::string why = check_slot(en->layer, en->expert, en->data); !why.empty()) fail("%s", why.c_str());
    en->state = ExpertCache::State::kReady;
  }
  pinned_count_ = static_cast<int>(entries.size());
  log_info("pinned %d experts (%s) resident", pinned_count_, format_bytes(entries.size() * store_.slot_bytes()).c_str());
}

void StreamingExperts::load_warm() {
  if (opt_.warm.empty()) return;
  const double t0 = now_seconds();
  const int64_t room = cache_.capacity() - static_cast<int64_t>(cache_.size());
  std::vector<std::pair<int, int>> take;  // hottest first
  std::unordered_set<uint64_t> seen;
  for (const auto& [l, e] : opt_.warm) {
    if (!store_.has_layer(l) || e < 0 || e >= store_.n_experts())
      fail("expert profile names expert (%d, %d), which the model does not have", l, e);
    if (static_cast<int64_t>(take.size()) >= room) break;
    if (cache_.find(l, e) == nullptr && seen.insert((static_cast<uint64_t>(l) << 32) | static_cast<uint32_t>(e)).second)
      take.emplace_back(l, e);
  }
  if (take.empty()) return;
  // Coldest first: each insert becomes the most recently used, so the hottest end up evicted last.
  std::vector<ExpertCache::Entry*> entries;
  for (auto it = take.rbegin(); it != take.rend(); ++it) entries.push_back(cache_.insert(it->first, it->second));
  try {
    reader_->read_all(plan_reads(entries));
  } catch (...) {
    for (auto* en : entries) cache_.erase(en);
    throw;
  }
  for (auto* en : entries) {
    if (std::string why = check_slot(en->layer, en->expert, en->data); !why.empty()) fail("%s", why.c_str());
    en->state = ExpertCache::State::kReady;
  }
  stats_.preloaded = entries.size();
  log_info("expert profile: preloaded the %zu hottest of %zu profiled experts (%s) into the cache in %.2f s", entries.size(),
           opt_.warm.size(), format_bytes(entries.size() * store_.slot_bytes()).c_str(), now_seconds() - t0);
}

ExpertWeights StreamingExperts::slot_views(int layer, int expert, const uint8_t* slot) const {
  const io::ExpertLocation& loc = store_.at(layer, expert);
  const std::array<ops::WeightView, 3>& pv = proto_[layer][expert];
  ExpertWeights w{pv[0], pv[1], pv[2]};
  ops::WeightView* views[3] = {&w.gate, &w.up, &w.down};
  for (int p = 0; p < 3; ++p) {
    ops::WeightView& v = *views[p];
    const uint64_t* off = loc.part_offset[p];
    if (v.empty() && v.rows == 0) continue;  // gpt-oss: no separate up projection
    if (v.type == ops::WType::kMxfp4) {  // blocks and E8M0 scales from the slot
      v.data = slot + off[static_cast<int>(io::ExpertPart::kMxBlocks)];
      v.mx_scales = slot + off[static_cast<int>(io::ExpertPart::kMxScales)];
    } else if (v.type == ops::WType::kQuant) {  // codes, scales and codebook from the slot; signs stay resident
      v.quant.qweight = slot + off[static_cast<int>(io::ExpertPart::kQWeight)];
      v.quant.scales = reinterpret_cast<const uint16_t*>(slot + off[static_cast<int>(io::ExpertPart::kScales)]);
      const uint64_t cb = off[static_cast<int>(io::ExpertPart::kCodebook)];
      if (cb != UINT64_MAX) v.quant.codebook = reinterpret_cast<const float*>(slot + cb);  // else q8's grid (proto)
    } else {
      v.data = slot + off[static_cast<int>(io::ExpertPart::kWeight)];
    }
  }
  return w;
}

std::string StreamingExperts::check_slot(int layer, int expert, const uint8_t* slot) const {
  const io::ExpertLocation& loc = store_.at(layer, expert);
  for (int p = 0; p < 3; ++p) {
    const ops::WeightView& v = proto_[layer][expert][p];
    const uint64_t cb_off = loc.part_offset[p][static_cast<int>(io::ExpertPart::kCodebook)];
    if (v.type != ops::WType::kQuant || cb_off == UINT64_MAX) continue;  // no codebook stored: q8's fixed grid
    float cb[256];
    std::memcpy(cb, slot + cb_off, sizeof(float) * ops::qtype_levels(v.quant.type));
    if (!codebook_ok(cb, ops::qtype_levels(v.quant.type)))
      return strfmt("%s: tensor '%s' read from disk is not a valid codebook (corrupt file?)", ckpt_->dir().c_str(),
                    io::expert_tensor_name(layer, expert, static_cast<io::ExpertProj>(p), io::ExpertPart::kCodebook).c_str());
  }
  return "";
}

std::vector<io::ReadRequest> StreamingExperts::plan_reads(const std::vector<ExpertCache::Entry*>& entries) const {
  // One request per extent, then merge requests whose file ranges touch (same shard).
  std::vector<io::ReadRequest> reqs;
  for (const auto* e : entries) {
    const io::ExpertLocation& loc = store_.at(e->layer, e->expert);
    for (const auto& x : loc.extents) {
      io::ReadRequest r;
      r.shard = x.shard;
      r.offset = x.file_offset;
      r.iov.push_back({e->data + x.buf_offset, x.length});
      reqs.push_back(std::move(r));
    }
  }
  std::sort(reqs.begin(), reqs.end(), [](const io::ReadRequest& a, const io::ReadRequest& b) {
    return a.shard != b.shard ? a.shard < b.shard : a.offset < b.offset;
  });
  std::vector<io::ReadRequest> merged;
  for (auto& r : reqs) {
    if (!merged.empty() && merged.back().shard == r.shard && merged.back().offset + merged.back().length() == r.offset &&
        merged.back().iov.size() < 64) {
      merged.back().iov.insert(merged.back().iov.end(), r.iov.begin(), r.iov.end());
    } else {
      merged.push_back(std::move(r));
    }
  }
  return merged;
}

// Under mu_: finds or inserts an entry for every id and pins it. New entries (misses) and
// entries still loading (prefetches in flight) are returned for the caller to read / wait on.
void StreamingExperts::lookup_and_pin(int layer, std::span<const int> ids, std::vector<ExpertCache::Entry*>& entries,
                                      std::vector<ExpertCache::Entry*>& misses, std::vector<ExpertCache::Entry*>& waits) {
  size_t i = 0;
  try {
    for (; i < ids.size(); ++i) {
      ExpertCache::Entry* e = cache_.find(layer, ids[i]);
      ++stats_.requests;
      cache_.count(layer, ids[i]);
      if (e != nullptr && e->state == ExpertCache::State::kFailed && e->pins == 0) {
        cache_.erase(e);  // a failed read never serves data: read it again
        e = nullptr;
      }
      if (e != nullptr && e->prepared) {  // read by prepare() for this acquire: a demand miss
        ++stats_.misses;
        e->prepared = false;
        if (e->state != ExpertCache::State::kReady) waits.push_back(e);
      } else if (e != nullptr) {
        ++stats_.hits;
        if (e->prefetched) {
          ++stats_.prefetch_rescued;
          e->prefetched = false;
        }
        if (e->state != ExpertCache::State::kReady) waits.push_back(e);  // loading (or failed: reported)
      } else {
        ++stats_.misses;
        e = cache_.insert(layer, ids[i]);
        const int st = stage_.empty() ? -1 : find_stage(layer, ids[i]);
        if (st >= 0) {  // read by hint(): its bytes now, or when that read completes
          if (!adopt_stage(st, e)) waits.push_back(e);
        } else {
          misses.push_back(e);
        }
      }
      ++e->pins;
      cache_.touch(e);
      entries[i] = e;
    }
  } catch (...) {  // e.g. out of memory for a slot: undo this call's pins and new entries
    for (size_t j = 0; j < i; ++j) --entries[j]->pins;
    for (auto* e : misses) cache_.erase(e);
    throw;
  }
  in_use_[layer].insert(in_use_[layer].end(), entries.begin(), entries.end());
  for (auto* e : entries) drop_prepared_pin(e);  // acquire's own pin replaces prepare's
}

void StreamingExperts::acquire(int layer, std::span<const int> ids, std::span<ExpertWeights> out) {
  std::vector<ExpertCache::Entry*> entries(ids.size()), misses, waits;
  {
    std::lock_guard<std::mutex> lk(mu_);
    lookup_and_pin(layer, ids, entries, misses, waits);
    drop_queued_guesses(layer);
  }
  std::exception_ptr err;
  const auto t0 = std::chrono::steady_clock::now();
  if (!misses.empty()) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      ++demand_in_flight_;
    }
    struct Done {  // the demand read is over (however it ends): queued guesses may go
      StreamingExperts* s;
      ~Done() {
        std::lock_guard<std::mutex> lk(s->mu_);
        --s->demand_in_flight_;
        try {
          s->pump_stage();
        } catch (...) {  // (a guess read that cannot start is only a lost guess)
        }
      }
    } done{this};
    try {
      reader_->read_all(plan_reads(misses));
      for (auto* e : misses)  // corrupt data is a failed read: never cached, never served
        if (std::string why = check_slot(layer, e->expert, e->data); !why.empty()) throw Error(why);
    } catch (...) {
      err = std::current_exception();
    }
  }
  {
    std::unique_lock<std::mutex> lk(mu_);
    for (auto* e : misses) e->state = err ? ExpertCache::State::kFailed : ExpertCache::State::kReady;
    for (auto* e : waits) {
      ready_cv_.wait(lk, [&] { return e->state != ExpertCache::State::kLoading; });
      if (e->state == ExpertCache::State::kFailed && !err)
        err = std::make_exception_ptr(
            Error(strfmt("reading expert %d of layer %d failed (read error or corrupt data; see the earlier message)", e->expert, layer)));
    }
    if (!misses.empty() || !waits.empty()) stats_.stall_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (err) {
      // Unpin what this call pinned and drop every failed entry (ours, and prefetches we
      // waited on): a failed read must never serve data later.
      for (auto* e : entries) --e->pins;
      std::vector<ExpertCache::Entry*> failed;
      for (auto* e : entries)
        if (e->state == ExpertCache::State::kFailed && e->pins == 0 &&
            std::find(failed.begin(), failed.end(), e) == failed.end())
          failed.push_back(e);
      auto& use = in_use_[layer];
      use.erase(std::remove_if(use.begin(), use.end(), [&](ExpertCache::Entry* x) {
                  return std::find(entries.begin(), entries.end(), x) != entries.end();
                }),
                use.end());
      for (auto* e : failed) cache_.erase(e);
    }
  }
  if (err) std::rethrow_exception(err);
  for (size_t i = 0; i < ids.size(); ++i) out[i] = slot_views(layer, ids[i], entries[i]->data);
  if (opt_.prefetch_ahead > 0 && static_cast<int>(ids.size()) <= opt_.top_k) {
    std::lock_guard<std::mutex> lk(mu_);
    last_ids_[layer].assign(ids.begin(), ids.end());
    prefetch_after(layer);
  }
}

void StreamingExperts::begin_acquire(int layer, std::span<const int> ids, std::span<ExpertWeights> out, std::span<uint8_t> got) {
  std::vector<ExpertCache::Entry*> entries(ids.size()), misses, waits;
  {
    std::lock_guard<std::mutex> lk(mu_);
    lookup_and_pin(layer, ids, entries, misses, waits);
    drop_queued_guesses(layer);
    if (!misses.empty()) {
      try {
        submit_background(misses);  // ready (or failed, kept while pinned) when the read lands
      } catch (...) {  // the read could not be queued: undo this call as acquire()'s error path does
        for (auto* e : entries) --e->pins;
        auto& use = in_use_[layer];
        use.erase(use.end() - static_cast<std::ptrdiff_t>(entries.size()), use.end());
        for (auto* e : misses)
          if (e->pins == 0) cache_.erase(e);
        throw;
      }
    }
    for (size_t i = 0; i < ids.size(); ++i) got[i] = entries[i]->state == ExpertCache::State::kReady ? 1 : 0;
    begun_[layer] = entries;
  }
  for (size_t i = 0; i < ids.size(); ++i)
    if (got[i]) out[i] = slot_views(layer, ids[i], entries[i]->data);
}

void StreamingExperts::finish_acquire(int layer, std::span<const int> ids, std::span<ExpertWeights> out, std::span<const uint8_t> got) {
  std::exception_ptr err;
  std::vector<ExpertCache::Entry*> entries;
  {
    std::unique_lock<std::mutex> lk(mu_);
    entries.swap(begun_[layer]);
    if (entries.size() != ids.size()) fail("finish_acquire(layer %d) without its begin_acquire", layer);
    const auto t0 = std::chrono::steady_clock::now();
    bool waited = false;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (got[i]) continue;
      ExpertCache::Entry* e = entries[i];
      waited = true;
      ready_cv_.wait(lk, [&] { return e->state != ExpertCache::State::kLoading; });
      if (e->state == ExpertCache::State::kFailed && !err)
        err = std::make_exception_ptr(
            Error(strfmt("reading expert %d of layer %d failed (read error or corrupt data; see the log)", e->expert, layer)));
    }
    if (waited) stats_.stall_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (err) {  // as acquire(): unpin this call's entries and drop every failed one
      for (auto* e : entries) --e->pins;
      std::vector<ExpertCache::Entry*> failed;
      for (auto* e : entries)
        if (e->state == ExpertCache::State::kFailed && e->pins == 0 && std::find(failed.begin(), failed.end(), e) == failed.end())
          failed.push_back(e);
      auto& use = in_use_[layer];
      use.erase(std::remove_if(use.begin(), use.end(),
                               [&](ExpertCache::Entry* x) { return std::find(entries.begin(), entries.end(), x) != entries.end(); }),
                use.end());
      for (auto* e : failed) cache_.erase(e);
    }
  }
  if (err) std::rethrow_exception(err);
  for (size_t i = 0; i < ids.size(); ++i)
    if (!got[i]) out[i] = slot_views(layer, ids[i], entries[i]->data);
  if (opt_.prefetch_ahead > 0 && static_cast<int>(ids.size()) <= opt_.top_k) {
    std::lock_guard<std::mutex> lk(mu_);
    last_ids_[layer].assign(ids.begin(), ids.end());
    prefetch_after(layer);
  }
}

size_t StreamingExperts::acquire_available(int layer, std::span<const int> ids, std::span<ExpertWeights> out,
                                           std::span<uint8_t> got) {
  std::fill(got.begin(), got.end(), uint8_t{0});
  std::lock_guard<std::mutex> lk(mu_);
  if (!store_.has_layer(layer)) return 0;
  size_t n = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= store_.n_experts()) continue;  // acquire() reports it
    ExpertCache::Entry* e = cache_.find(layer, ids[i]);
    if (e == nullptr || e->state != ExpertCache::State::kReady) continue;
    // As lookup_and_pin() counts it: read by prepare() for this acquire is a miss, else a hit.
    ++stats_.requests;
    cache_.count(layer, ids[i]);
    if (e->prepared) {
      ++stats_.misses;
      e->prepared = false;
    } else {
      ++stats_.hits;
      if (e->prefetched) {
        ++stats_.prefetch_rescued;
        e->prefetched = false;
      }
    }
    ++e->pins;
    cache_.touch(e);
    in_use_[layer].push_back(e);
    drop_prepared_pin(e);  // acquire's pin replaces prepare's
    out[i] = slot_views(layer, ids[i], e->data);
    got[i] = 1;
    ++n;
  }
  return n;
}

void StreamingExperts::prefetch_after(int layer) {
  // Called with mu_ held. Predict layers layer+1 .. layer+N from their last routing.
  if (stats_.prefetch_disabled) return;
  if (stats_.prefetch_issued >= kPrefetchJudgeAfter && stats_.rescue_rate() < kPrefetchMinRescue) {
    stats_.prefetch_disabled = true;
    log_info("prefetch-ahead disabled: after %llu prefetches it rescued %.1f%% of the misses (< %.0f%%)",
             (unsigned long long)stats_.prefetch_issued, 100.0 * stats_.rescue_rate(), 100.0 * kPrefetchMinRescue);
    return;
  }
  std::vector<ExpertCache::Entry*> todo;
  for (int l = layer + 1; l <= layer + opt_.prefetch_ahead && l < store_.n_layers(); ++l) {
    if (!store_.has_layer(l)) continue;
    for (int id : last_ids_[l]) {
      if (cache_.find(l, id) != nullptr) continue;
      ExpertCache::Entry* e = cache_.insert(l, id);
      e->prefetched = true;
      todo.push_back(e);
    }
  }
  if (todo.empty()) return;
  stats_.prefetch_issued += todo.size();
  submit_background(std::move(todo));
}

void StreamingExperts::prepare(int layer, std::span<const int> ids) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!store_.has_layer(layer)) return;
  for (int id : ids)
    if (id < 0 || id >= store_.n_experts()) return;  // acquire() reports it
  // Cached experts are pinned first, so the new entries below cannot evict them.
  const size_t most = std::min(ids.size(), static_cast<size_t>(max_batch()));
  std::vector<int> missing;
  for (size_t i = 0; i < most; ++i) {
    if (ExpertCache::Entry* e = cache_.find(layer, ids[i]); e != nullptr) {
      ++e->pins;
      cache_.touch(e);
      prepared_[layer].push_back(e);
    } else {
      missing.push_back(ids[i]);
    }
  }
  std::vector<ExpertCache::Entry*> todo;
  for (int id : missing) {
    if (cache_.find(layer, id) != nullptr) continue;  // (an id listed twice)
    ExpertCache::Entry* e;
    try {
      e = cache_.insert(layer, id);
    } catch (...) {  // no memory for a slot: acquire() will say so
      break;
    }
    e->prepared = true;
    ++e->pins;
    prepared_[layer].push_back(e);
    const int st = stage_.empty() ? -1 : find_stage(layer, id);
    if (st >= 0) {  // read by hint(): no second read
      adopt_stage(st, e);
    } else {
      todo.push_back(e);
    }
  }
  if (!todo.empty()) submit_background(std::move(todo));
}

int StreamingExperts::find_stage(int layer, int expert) const {
  for (size_t i = 0; i < stage_.size(); ++i)
    if (stage_[i].layer == layer && stage_[i].expert == expert) return static_cast<int>(i);
  return -1;
}

bool StreamingExperts::adopt_stage(int slot, ExpertCache::Entry* e) {
  Stage& st = stage_[static_cast<size_t>(slot)];
  if (st.state == ExpertCache::State::kLoading) {
    st.adopters.push_back(e);
    if (st.queued) {  // a guess not read yet, asked for now: read at once, as a demand miss
      auto it = std::find(spec_queue_.begin(), spec_queue_.end(), slot);
      if (it != spec_queue_.end()) spec_queue_.erase(it);
      submit_stage(slot, false);
    } else {
      ++stats_.staged_used;  // its guess read is under way
    }
    return false;
  }
  ++stats_.staged_used;
  std::memcpy(e->data, st.data, store_.slot_bytes());
  e->state = ExpertCache::State::kReady;
  st.layer = st.expert = -1;  // the bytes live in the cache now
  return true;
}

void StreamingExperts::hint(int layer, std::span<const int> ids) {
  std::lock_guard<std::mutex> lk(mu_);
  if (stage_.empty() || !store_.has_layer(layer)) return;

  std::vector<int> slots;
  for (int id : ids) {
    if (id < 0 || id >= store_.n_experts() || cache_.find(layer, id) != nullptr || find_stage(layer, id) >= 0) continue;
    // A free buffer, else the oldest staged expert nobody waits for; none: the staging area is
    // all in flight (the disk is behind), and the remaining guesses are dropped.
    int pick = -1;
    for (size_t i = 0; i < stage_.size(); ++i) {
      const Stage& st = stage_[i];
      if (st.layer < 0) {
        pick = static_cast<int>(i);
        break;
      }
      if (st.state != ExpertCache::State::kLoading && st.adopters.empty() &&
          (pick < 0 || st.seq < stage_[static_cast<size_t>(pick)].seq))
        pick = static_cast<int>(i);
    }
    if (pick < 0) break;
    Stage& st = stage_[static_cast<size_t>(pick)];
    st.layer = layer;
    st.expert = id;
    st.state = ExpertCache::State::kLoading;
    st.seq = ++stage_seq_;
    st.queued = true;
    slots.push_back(pick);
  }
  for (int slot : slots) spec_queue_.push_back(slot);
  pump_stage();
}

void StreamingExperts::drop_queued_guesses(int layer) {
  // Every group of the step prepared this layer before any acquires it (run_pipelined's order),
  // adopting the guesses it needed: those still waiting for their turn were wrong.
  for (auto it = spec_queue_.begin(); it != spec_queue_.end();) {
    Stage& st = stage_[static_cast<size_t>(*it)];
    if (st.layer == layer && st.queued && st.adopters.empty()) {
      st.queued = false, st.layer = st.expert = -1, st.state = ExpertCache::State::kReady;
      it = spec_queue_.erase(it);
    } else {
      ++it;
    }
  }
}

void StreamingExperts::pump_stage() {
  while (!closing_ && demand_in_flight_ == 0 && spec_in_flight_ < std::max(1, opt_.stage_in_flight) && !spec_queue_.empty()) {
    const int slot = spec_queue_.front();
    spec_queue_.pop_front();
    if (stage_[static_cast<size_t>(slot)].queued) submit_stage(slot, true);
  }
}

void StreamingExperts::submit_stage(int slot, bool guess) {
  Stage& s0 = stage_[static_cast<size_t>(slot)];
  s0.queued = false;
  ExpertCache::Entry view;  // plan_reads reads layer, expert and data only
  view.layer = s0.layer;
  view.expert = s0.expert;
  view.data = s0.data;
  std::vector<ExpertCache::Entry*> one{&view};
  std::vector<io::ReadRequest> reqs;
  try {
    reqs = plan_reads(one);
    if (reqs.empty()) throw Error("no bytes to read");  // (never: an expert has extents)
  } catch (...) {  // (out of memory) the slot fails; whoever waits on it reports the error
    s0.state = ExpertCache::State::kFailed;
    for (ExpertCache::Entry* e : s0.adopters) e->state = ExpertCache::State::kFailed;
    s0.adopters.clear();
    s0.layer = s0.expert = -1;
    ready_cv_.notify_all();
    return;
  }
  if (guess) {
    ++stats_.staged;
    ++spec_in_flight_;
  } else {
    ++demand_in_flight_;  // a guess asked for before its turn: a demand read now
  }
  // Each staged expert is usable as soon as its own read lands.
  try {
    reader_->submit(std::move(reqs), [this, slot, guess](std::exception_ptr err) {
      {
        std::lock_guard<std::mutex> lk2(mu_);
        Stage& st = stage_[static_cast<size_t>(slot)];
        const std::string why = err ? "" : check_slot(st.layer, st.expert, st.data);
        if (!why.empty()) log_warn("%s", why.c_str());
        const bool ok = !err && why.empty();
        st.state = ok ? ExpertCache::State::kReady : ExpertCache::State::kFailed;
        for (ExpertCache::Entry* e : st.adopters) {
          if (ok) std::memcpy(e->data, st.data, store_.slot_bytes());
          e->state = ok ? ExpertCache::State::kReady : ExpertCache::State::kFailed;
        }
        if (!ok || !st.adopters.empty()) st.layer = st.expert = -1;  // failed, or moved into the cache
        st.adopters.clear();
        if (guess)
          --spec_in_flight_;
        else
          --demand_in_flight_;
        pump_stage();
      }
      ready_cv_.notify_all();
    });
  } catch (...) {  // the read could not be queued (out of memory): the slot fails, counters undone
    if (guess)
      --spec_in_flight_, --stats_.staged;
    else
      --demand_in_flight_;
    s0.state = ExpertCache::State::kFailed;
    for (ExpertCache::Entry* e : s0.adopters) e->state = ExpertCache::State::kFailed;
    s0.adopters.clear();
    s0.layer = s0.expert = -1;
    ready_cv_.notify_all();
  }
}

bool StreamingExperts::drop_prepared_pin(ExpertCache::Entry* e) {
  auto& p = prepared_[e->layer];
  auto it = std::find(p.begin(), p.end(), e);
  if (it == p.end()) return false;
  p.erase(it);
  --e->pins;
  return true;
}

void StreamingExperts::unprepare(int layer, std::span<const int> ids) {
  std::lock_guard<std::mutex> lk(mu_);
  if (layer < 0 || layer >= static_cast<int>(prepared_.size())) return;
  for (int id : ids) {
    ExpertCache::Entry* e = cache_.find(layer, id);
    if (e == nullptr || !drop_prepared_pin(e)) continue;
    e->prepared = false;
    if (e->state == ExpertCache::State::kFailed && e->pins == 0) cache_.erase(e);
  }
}

void StreamingExperts::submit_background(std::vector<ExpertCache::Entry*> todo) {
  ++demand_in_flight_;  // (called with mu_ held)
  reader_->submit(plan_reads(todo), [this, todo](std::exception_ptr err) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      --demand_in_flight_;
      pump_stage();
      for (auto* e : todo) {
        std::string why = err ? "" : check_slot(e->layer, e->expert, e->data);
        if (!why.empty()) log_warn("%s", why.c_str());
        e->state = err || !why.empty() ? ExpertCache::State::kFailed : ExpertCache::State::kReady;
      }
      // A failed background read is dropped unless someone is waiting on it (they report the error).
      for (auto* e : todo)
        if (e->state == ExpertCache::State::kFailed && e->pins == 0) cache_.erase(e);
    }
    ready_cv_.notify_all();
  });
}

void StreamingExperts::release(int layer) {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto* e : in_use_[layer]) --e->pins;
  in_use_[layer].clear();
}

int StreamingExperts::max_batch() const {
  const int64_t free_slots = cache_.capacity() - pinned_count_;
  return static_cast<int>(std::max<int64_t>(std::max(opt_.top_k, 1), free_slots));
}

StreamingStats StreamingExperts::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  StreamingStats s = stats_;
  s.bytes_read = reader_->bytes_read();
  s.reads = reader_->reads_issued();
  s.evictions = cache_.evictions();
  s.cache_peak_bytes = cache_.peak_bytes();
  s.pinned_bytes = locked_bytes_;
  return s;
}

std::string StreamingExperts::describe() const {
  return strfmt("streaming %lld expert tensors (%s) through a %s%s %s cache (%lld experts of %s), %s %s, %d workers%s",
                (long long)store_.tensor_count(), format_bytes(store_.total_bytes()).c_str(),
                format_bytes(cache_.budget()).c_str(),
                locked_ != nullptr ? strfmt(" pinned (%s page-locked)", format_bytes(locked_bytes_).c_str()).c_str() : "",
                opt_.policy.policy == CachePolicy::kLfu ? "LFU" : "LRU", (long long)cache_.capacity(), format_bytes(store_.slot_bytes()).c_str(),
                opt_.engine == io::IoEngine::kUring ? "io_uring" : "pread",
                reader_->direct() ? "O_DIRECT" : (opt_.direct ? "buffered+DONTNEED" : "page cache"), opt_.workers,
                opt_.prefetch_ahead > 0 ? strfmt(", prefetch-ahead %d", opt_.prefetch_ahead).c_str() : "")
         + (stage_.empty() ? "" : strfmt(", %zu staging buffers for next-layer prefetch", stage_.size()));
}

double measure_expert_gbps(std::shared_ptr<const io::Checkpoint> ck, const std::vector<bool>& moe_layers, int layer, int n_experts,
                           int hidden, int inter, int threads, double seconds) {
  const int n = std::min(n_experts, 64), k = std::min(n, 8);
  if (n < 1 || hidden < 1 || inter < 1 || threads < 1) fail("expert compute probe: needs experts, shapes and threads");
  StreamingOptions so;
  so.workers = 2;
  so.hits_first = false;
  StreamingExperts src(ck, moe_layers, n_experts, hidden, inter, so);
  so.cache_budget_bytes = src.store().slot_bytes() * static_cast<uint64_t>(n);
  StreamingExperts st(std::move(ck), moe_layers, n_experts, hidden, inter, so);
  std::vector<int> ids(static_cast<size_t>(n));
  for (int e = 0; e < n; ++e) ids[static_cast<size_t>(e)] = e;
  std::vector<ExpertWeights> w(static_cast<size_t>(n));
  st.acquire(layer, ids, w);  // read once; held until release
  double bytes_all = 0;
  for (const ExpertWeights& x : w)
    for (const ops::WeightView* v : {&x.gate, &x.up, &x.down}) bytes_all += static_cast<double>(v->nbytes());
  ops::ThreadPool pool(threads);
  ops::CpuBackend be(&pool);
  ops::ExpertGroups g;  // one token, k experts: row j of y is expert j's
  g.T = 1, g.K = k;
  for (int j = 0; j < k; ++j) g.active.push_back(j), g.first.push_back(j), g.rows.push_back(j), g.row_of.push_back(j);
  g.first.push_back(k);
  std::vector<float> x(static_cast<size_t>(hidden)), y(static_cast<size_t>(k) * hidden);
  for (int i = 0; i < hidden; ++i) x[static_cast<size_t>(i)] = std::sin(0.37f * static_cast<float>(i));
  const ops::Activation act = w[0].up.rows == 0 ? ops::Activation::kClampedSwiGLU : ops::Activation::kSwiGLU;  // gpt-oss: fused gate_up
  auto pass = [&] {  // every expert of the set once, k per call
    for (int e0 = 0; e0 + k <= n; e0 += k)
      be.expert_ffn(std::span<const ops::ExpertMats>(w.data() + e0, static_cast<size_t>(k)), g, 0, x.data(), hidden, act, y.data());
  };
  pass();
  const double bytes = bytes_all * static_cast<double>(n / k * k) / n;
  double best = 0;
  const double t_end = now_seconds() + seconds;
  do {
    const double t0 = now_seconds();
    pass();
    const double dt = now_seconds() - t0;
    if (dt > 0) best = std::max(best, bytes / dt / 1e9);
  } while (now_seconds() < t_end);
  st.release(layer);
  return best;
}

}  // namespace spool::experts
