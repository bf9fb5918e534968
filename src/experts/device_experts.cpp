#include "experts/device_experts.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "common/sysinfo.h"
#include "ops/quant_matmul.h"

namespace spool::experts {

uint64_t weight_view_bytes(const ops::WeightView& w) {
  if (w.type != ops::WType::kQuant) return static_cast<uint64_t>(w.rows * w.cols) * ops::wtype_size(w.type);
  const ops::QuantView& q = w.quant;
  uint64_t n = static_cast<uint64_t>(q.rows * q.row_bytes()) + static_cast<uint64_t>(q.rows * q.groups_per_row()) * 2 +
               static_cast<uint64_t>(ops::qtype_levels(q.type)) * 4;
  if (q.signs) n += static_cast<uint64_t>(q.cols);
  return n;
}

void DeviceExperts::upload_expert(ops::Backend& be, size_t l, int e, const experts::ExpertWeights& w) {
  experts::ExpertWeights& d = experts_[l][static_cast<size_t>(e)];
  d.gate = be.upload(w.gate);
  d.up = be.upload(w.up);
  d.down = be.upload(w.down);
  bytes_ += weight_view_bytes(w.gate) + weight_view_bytes(w.up) + weight_view_bytes(w.down);
  ++n_device_;
}

void DeviceExperts::make_tables(ops::Backend& be, const std::vector<bool>& moe_layers) {
  tables_.assign(moe_layers.size(), nullptr);
  for (size_t l = 0; l < moe_layers.size(); ++l)
    if (moe_layers[l]) tables_[l] = be.make_expert_table(experts_[l]);
}

namespace {
// Calls fn(w) with expert e of layer l acquired from `source` (released after, also on error).
template <class Fn>
void with_expert(experts::ExpertProvider& source, size_t l, int e, Fn&& fn) {
  experts::ExpertWeights w;
  source.acquire(static_cast<int>(l), std::span<const int>(&e, 1), std::span<experts::ExpertWeights>(&w, 1));
  try {
    fn(w);
  } catch (...) {
    source.release(static_cast<int>(l));
    throw;
  }
  source.release(static_cast<int>(l));
}
uint64_t packed_expert_bytes(const experts::ExpertWeights& w) {
  return ops::packed_weight_bytes(w.gate) + ops::packed_weight_bytes(w.up) + ops::packed_weight_bytes(w.down);
}
}  // namespace

DeviceExperts::DeviceExperts(experts::ExpertProvider& source, ops::Backend& be, const std::vector<bool>& moe_layers, int n_experts)
    : device_(ops::device_name(be.device())) {
  experts_.resize(moe_layers.size());
  for (size_t l = 0; l < moe_layers.size(); ++l) {
    if (!moe_layers[l]) continue;
    experts_[l].resize(static_cast<size_t>(n_experts));
    for (int e = 0; e < n_experts; ++e) with_expert(source, l, e, [&](const experts::ExpertWeights& w) { upload_expert(be, l, e, w); });
  }
  make_tables(be, moe_layers);
}

DeviceExperts::DeviceExperts(experts::ExpertProvider& source, ops::Backend& be, const std::vector<bool>& moe_layers, int n_experts,
                             uint64_t vram_bytes, std::span<const std::pair<int, int>> hot)
    : device_(ops::device_name(be.device())) {
  experts_.resize(moe_layers.size());
  const uint64_t n_moe = static_cast<uint64_t>(std::count(moe_layers.begin(), moe_layers.end(), true));
  if (n_moe == 0 || n_experts <= 0) fail("device experts: the model has no routed experts");
  // Pass 1 (views only): each expert's packed bytes.
  std::vector<std::vector<uint64_t>> size(moe_layers.size());
  for (size_t l = 0; l < moe_layers.size(); ++l) {
    if (!moe_layers[l]) continue;
    size[l].resize(static_cast<size_t>(n_experts));
    for (int e = 0; e < n_experts; ++e)
      with_expert(source, l, e, [&](const experts::ExpertWeights& w) { size[l][static_cast<size_t>(e)] = packed_expert_bytes(w); });
  }
  // Which experts the VRAM holds: the hot list's first (hottest first, while the budget holds them),
  // then, without a hot list, experts [0, n_l) of each layer within an equal share of the budget;
  // with one, the rest of the budget filled by id, a layer at a time in turn.
  in_vram_.resize(moe_layers.size());
  for (size_t l = 0; l < moe_layers.size(); ++l)
    if (moe_layers[l]) in_vram_[l].assign(static_cast<size_t>(n_experts), false);
  uint64_t device = 0, host = 0;
  for (const auto& [l, e] : hot) {
    if (l < 0 || static_cast<size_t>(l) >= moe_layers.size() || !moe_layers[static_cast<size_t>(l)] || e < 0 || e >= n_experts)
      fail("device experts: the hot list names expert %d of layer %d, which this model does not have (a pin file of another model?)", e, l);
    if (in_vram_[static_cast<size_t>(l)][static_cast<size_t>(e)]) continue;  // (named twice)
    const uint64_t b = size[static_cast<size_t>(l)][static_cast<size_t>(e)];
    if (device + b > vram_bytes) continue;
    in_vram_[static_cast<size_t>(l)][static_cast<size_t>(e)] = true;
    device += b;
    ++n_hot_;
  }
  if (hot.empty()) {
    const uint64_t share = vram_bytes / n_moe;
    for (size_t l = 0; l < moe_layers.size(); ++l) {
      if (!moe_layers[l]) continue;
      uint64_t used = 0;
      for (int e = 0; e < n_experts && used + size[l][static_cast<size_t>(e)] <= share; ++e) {
        used += size[l][static_cast<size_t>(e)];
        in_vram_[l][static_cast<size_t>(e)] = true;
      }
      device += used;
    }
  } else {
    for (int e = 0; e < n_experts; ++e)
      for (size_t l = 0; l < moe_layers.size(); ++l) {
        if (!moe_layers[l] || in_vram_[l][static_cast<size_t>(e)] || device + size[l][static_cast<size_t>(e)] > vram_bytes) continue;
        in_vram_[l][static_cast<size_t>(e)] = true;
        device += size[l][static_cast<size_t>(e)];
      }
  }
  for (size_t l = 0; l < moe_layers.size(); ++l)
    for (size_t e = 0; e < in_vram_[l].size(); ++e)
      if (!in_vram_[l][e]) host += size[l][e];
  char* mem = nullptr;
  if (host > 0) {
    mem = static_cast<char*>(be.alloc_host_mapped(host));
    if (mem == nullptr)
      fail("device experts: %s of page-locked host memory that %s reads in place could not be had", format_bytes(host).c_str(), device_);
  }
  // The device share in one allocation (as the slot tier's): exactly its packed bytes, no
  // per-weight allocation overhead against a budget taken from the free memory.
  char* vmem = device > 0 ? static_cast<char*>(be.alloc_weight_slot(device)) : nullptr;
  // Pass 2: copy the device share into it, the rest into the mapped block.
  uint64_t at = 0, vat = 0;
  const ops::Device dev = be.device();
  for (size_t l = 0; l < moe_layers.size(); ++l) {
    if (!moe_layers[l]) continue;
    experts_[l].resize(static_cast<size_t>(n_experts));
    for (int e = 0; e < n_experts; ++e)
      with_expert(source, l, e, [&](const experts::ExpertWeights& w) {
        const uint64_t b = packed_expert_bytes(w);
        if (b != size[l][static_cast<size_t>(e)]) fail("device experts: expert %d of layer %zu changed size between two reads", e, l);
        if (in_vram_[l][static_cast<size_t>(e)]) {
          if (vat + b > device) fail("device experts: expert %d of layer %zu changed size between two reads", e, l);
          experts::ExpertWeights& d = experts_[l][static_cast<size_t>(e)];
          d.gate = be.copy_weight_into(w.gate, vmem + vat);
          d.up = be.copy_weight_into(w.up, vmem + vat + ops::packed_weight_bytes(w.gate));
          d.down = be.copy_weight_into(w.down, vmem + vat + ops::packed_weight_bytes(w.gate) + ops::packed_weight_bytes(w.up));
          be.weight_copies_done(be.weight_copy_fence(), true);  // (the source's bytes are released next)
          vat += b;
          bytes_ += weight_view_bytes(w.gate) + weight_view_bytes(w.up) + weight_view_bytes(w.down);
          ++n_device_;
          return;
        }
        if (at + b > host) fail("device experts: expert %d of layer %zu changed size between two reads", e, l);
        const auto copy = [](void* to, const void* from, size_t n) { std::memcpy(to, from, n); };
        experts::ExpertWeights& d = experts_[l][static_cast<size_t>(e)];
        d.gate = ops::pack_weight(w.gate, mem + at, dev, copy);
        d.up = ops::pack_weight(w.up, mem + at + ops::packed_weight_bytes(w.gate), dev, copy);
        d.down = ops::pack_weight(w.down, mem + at + ops::packed_weight_bytes(w.gate) + ops::packed_weight_bytes(w.up), dev, copy);
        at += b;
        host_bytes_ += weight_view_bytes(w.gate) + weight_view_bytes(w.up) + weight_view_bytes(w.down);
        ++n_host_;
      });
  }
  be.wait_weight_copies(be.weight_copy_fence());  // later kernels see the copies
  make_tables(be, moe_layers);
}

void DeviceExperts::acquire(int layer, std::span<const int> ids, std::span<experts::ExpertWeights> out) {
  if (layer < 0 || static_cast<size_t>(layer) >= experts_.size() || experts_[layer].empty())
    fail("device experts: layer %d has no routed experts", layer);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || static_cast<size_t>(ids[i]) >= experts_[layer].size()) fail("device experts: expert %d of layer %d does not exist", ids[i], layer);
    out[i] = experts_[layer][static_cast<size_t>(ids[i])];
  }
}

std::string DeviceExperts::describe() const {
  if (n_host_ == 0) return strfmt("experts resident on %s: %s", device_, format_bytes(bytes_).c_str());
  return strfmt("experts placed statically: %lld of %lld on %s (%s%s), %lld in page-locked host memory read in place over the host link (%s)",
                (long long)n_device_, (long long)(n_device_ + n_host_), device_, format_bytes(bytes_).c_str(),
                n_hot_ > 0 ? strfmt("; %lld of them from the hot list, hottest first", (long long)n_hot_).c_str() : "", (long long)n_host_,
                format_bytes(host_bytes_).c_str());
}

bool DeviceExperts::on_device(int layer, int expert) const {
  if (layer < 0 || static_cast<size_t>(layer) >= experts_.size() || expert < 0 || static_cast<size_t>(expert) >= experts_[layer].size())
    return false;
  return in_vram_.empty() || in_vram_[static_cast<size_t>(layer)][static_cast<size_t>(expert)];
}

DeviceExpertCache::DeviceExpertCache(std::shared_ptr<experts::ExpertProvider> source, ops::Backend& be,
                                     const std::vector<bool>& moe_layers, int n_experts, uint64_t budget_bytes, int min_slots)
    : source_(std::move(source)), be_(be), n_experts_(n_experts) {
  if (!source_) fail("device expert cache: no source provider");
  where_.resize(moe_layers.size());
  for (size_t l = 0; l < moe_layers.size(); ++l)
    if (moe_layers[l]) where_[l].assign(static_cast<size_t>(n_experts), -1);
  slot_bytes_ = slot_bytes_for(*source_, moe_layers);
  if (slot_bytes_ == 0) fail("device expert cache: the model has no routed experts");
  const uint64_t n = budget_bytes / slot_bytes_;
  if (n < static_cast<uint64_t>(std::max(min_slots, 1)))
    fail("device expert cache: a budget of %s holds %llu experts of %s; one token needs %d", format_bytes(budget_bytes).c_str(),
         (unsigned long long)n, format_bytes(slot_bytes_).c_str(), min_slots);
  const uint64_t all = static_cast<uint64_t>(std::count(moe_layers.begin(), moe_layers.end(), true)) * static_cast<uint64_t>(n_experts);
  slots_.resize(static_cast<size_t>(std::min(n, all)));
  prepared_.resize(moe_layers.size());
  held_.assign(moe_layers.size(), 0);
  hold_ticket_.assign(moe_layers.size(), 0);
  stall0_ = be_.weight_copy_stall_seconds();
  // One allocation for every slot: it either succeeds or holds nothing.
  char* mem = static_cast<char*>(be_.alloc_weight_slot(slot_bytes_ * slots_.size()));
  for (size_t i = 0; i < slots_.size(); ++i) slots_[i].mem = mem + i * slot_bytes_;
}

uint64_t DeviceExpertCache::slot_bytes_for(experts::ExpertProvider& source, const std::vector<bool>& moe_layers) {
  uint64_t bytes = 0;
  for (size_t l = 0; l < moe_layers.size(); ++l) {
    if (!moe_layers[l]) continue;
    const int e = 0;
    experts::ExpertWeights w;
    source.acquire(static_cast<int>(l), std::span<const int>(&e, 1), std::span<experts::ExpertWeights>(&w, 1));
    bytes = std::max(bytes, ops::packed_weight_bytes(w.gate) + ops::packed_weight_bytes(w.up) + ops::packed_weight_bytes(w.down));
    source.release(static_cast<int>(l));
  }
  return bytes;
}

DeviceExpertCache::~DeviceExpertCache() {
  try {
    poll_holds(/*block=*/true);
  } catch (...) {  // a failed device: nothing more to wait for
  }
}

DeviceExpertCache::Stats DeviceExpertCache::Stats::operator-(const Stats& o) const {
  Stats d = *this;
  d.hits -= o.hits;
  d.misses -= o.misses;
  d.early -= o.early;
  d.bytes_copied -= o.bytes_copied;
  d.stall_s -= o.stall_s;
  return d;
}

DeviceExpertCache::Stats DeviceExpertCache::stats() const {
  std::lock_guard<std::mutex> lk(stats_mu_);
  return stats_;
}

void DeviceExpertCache::update_stall() {
  const double s = be_.weight_copy_stall_seconds() - stall0_;
  std::lock_guard<std::mutex> lk(stats_mu_);
  stats_.stall_s = s;
}

bool DeviceExpertCache::valid(int layer, int id) const {
  return layer >= 0 && static_cast<size_t>(layer) < where_.size() && id >= 0 && static_cast<size_t>(id) < where_[layer].size();
}

size_t DeviceExpertCache::take_slot() {
  // The least recently used slot not handed out and not reserved (empty slots have used == 0).
  size_t best = slots_.size();
  for (size_t s = 0; s < slots_.size(); ++s)
    if (!slots_[s].in_use && !slots_[s].reserved && (best == slots_.size() || slots_[s].used < slots_[best].used)) best = s;
  if (best == slots_.size()) fail("device expert cache: every slot is in use");
  Slot& s = slots_[best];
  if (s.layer >= 0) where_[s.layer][static_cast<size_t>(s.expert)] = -1;
  s.layer = s.expert = -1;  // empty until the copies are issued
  s.used = 0;
  return best;
}

void DeviceExpertCache::fill(size_t si, int layer, int id, const experts::ExpertWeights& h) {
  const uint64_t gate = ops::packed_weight_bytes(h.gate), up = h.up.empty() ? 0 : ops::packed_weight_bytes(h.up),
                 down = ops::packed_weight_bytes(h.down);
  if (gate + up + down > slot_bytes_)
    fail("device expert cache: expert %d of layer %d takes %s, more than a slot (%s)", id, layer, format_bytes(gate + up + down).c_str(),
         format_bytes(slot_bytes_).c_str());
  Slot& s = slots_[si];
  experts::ExpertWeights v = h;
  v.gate = be_.copy_weight_into(h.gate, s.mem);
  if (!h.up.empty()) v.up = be_.copy_weight_into(h.up, s.mem + gate);
  v.down = be_.copy_weight_into(h.down, s.mem + gate + up);
  s.views = v;
  {
    std::lock_guard<std::mutex> lk(stats_mu_);
    stats_.bytes_copied += gate + up + down;
  }
  s.layer = layer;
  s.expert = id;
  s.used = ++clock_;
  where_[layer][static_cast<size_t>(id)] = static_cast<int>(si);
}

uint64_t DeviceExpertCache::finish_fills(int layer) {
  const uint64_t t = be_.weight_copy_fence();
  hold_ticket_[layer] = std::max(hold_ticket_[layer], t);
  held_[layer] = 1;
  if (be_.weight_copies_done(hold_ticket_[layer], false)) {
    held_[layer] = 0;
    source_->release(layer);  // the slots hold copies; the source's memory may change now
  }
  return t;
}

void DeviceExpertCache::poll_holds(bool block) {
  for (size_t l = 0; l < held_.size(); ++l)
    if (held_[l] && be_.weight_copies_done(hold_ticket_[l], block)) {
      held_[l] = 0;
      source_->release(static_cast<int>(l));
    }
}

void DeviceExpertCache::prepare(int layer, std::span<const int> ids) {
  if (layer < 0 || static_cast<size_t>(layer) >= where_.size() || where_[layer].empty()) return;  // acquire() reports it
  poll_holds(false);
  for (int id : ids)
    if (!valid(layer, id)) return;  // acquire() reports it; nothing is reserved or started for a bad set
  std::vector<int> missing;  // distinct ids not in a slot
  for (int id : ids) {
    const int s = where_[layer][static_cast<size_t>(id)];
    if (s >= 0) {
      slots_[s].reserved = true;  // the fills below must not take it
    } else if (std::find(missing.begin(), missing.end(), id) == missing.end()) {
      missing.push_back(id);
    }
  }
  if (missing.empty()) return;
  // Experts the source has in memory now are copied at once, into the slots that are free.
  const size_t free_slots = static_cast<size_t>(
      std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return !s.in_use && !s.reserved; }));
  const size_t n_now = std::min(free_slots, missing.size());
  std::vector<experts::ExpertWeights> host(n_now);
  std::vector<uint8_t> got(n_now, 0);
  if (n_now > 0) source_->acquire_available(layer, std::span<const int>(missing.data(), n_now), host, got);
  std::vector<int> rest;
  for (size_t m = 0; m < missing.size(); ++m)
    if (m >= n_now || !got[m]) rest.push_back(missing[m]);
  if (!rest.empty()) {
    source_->prepare(layer, rest);
    // Each forwarded prepare is owed an acquire or an unprepare at the source.
    prepared_[layer].insert(prepared_[layer].end(), rest.begin(), rest.end());
  }
  if (rest.size() == missing.size()) return;
  try {
    for (size_t m = 0; m < n_now; ++m) {
      if (!got[m]) continue;
      const size_t si = take_slot();
      fill(si, layer, missing[m], host[m]);
      slots_[si].reserved = slots_[si].early = true;
      {
        std::lock_guard<std::mutex> lk(stats_mu_);
        ++stats_.early;
      }
    }
    const uint64_t t = finish_fills(layer);
    for (size_t m = 0; m < n_now; ++m)
      if (got[m]) slots_[where_[layer][static_cast<size_t>(missing[m])]].ticket = t;
  } catch (...) {
    // Not an error here: the acquire() that follows copies again and reports it. The source's
    // views are released once every copy issued so far has finished reading them.
    try {
      for (size_t m = 0; m < n_now; ++m)
        if (got[m] && where_[layer][static_cast<size_t>(missing[m])] >= 0) {
          Slot& s = slots_[where_[layer][static_cast<size_t>(missing[m])]];
          where_[layer][static_cast<size_t>(missing[m])] = -1;
          s.layer = s.expert = -1;
          s.used = 0;
          s.reserved = s.early = false;
        }
      be_.weight_copies_done(be_.weight_copy_fence(), true);
    } catch (...) {
    }
    held_[layer] = 0;
    source_->release(layer);
  }
}

void DeviceExpertCache::unprepare(int layer, std::span<const int> ids) {
  if (layer < 0 || static_cast<size_t>(layer) >= prepared_.size()) return;
  for (int id : ids)  // reserved or early-filled slots become ordinary LRU slots (their bytes are right)
    if (valid(layer, id) && where_[layer][static_cast<size_t>(id)] >= 0) {
      Slot& s = slots_[where_[layer][static_cast<size_t>(id)]];
      s.reserved = s.early = false;
    }
  std::vector<int>& owed = prepared_[layer];
  std::vector<int> back;
  for (int id : ids)
    if (auto it = std::find(owed.begin(), owed.end(), id); it != owed.end()) {
      owed.erase(it);
      back.push_back(id);
    }
  if (!back.empty()) source_->unprepare(layer, back);
}

void DeviceExpertCache::acquire(int layer, std::span<const int> ids, std::span<experts::ExpertWeights> out) {
  if (layer < 0 || static_cast<size_t>(layer) >= where_.size() || where_[layer].empty())
    fail("device expert cache: layer %d has no routed experts", layer);
  if (ids.size() > slots_.size())
    fail("device expert cache: %zu experts acquired at once, more than its %zu slots", ids.size(), slots_.size());
  for (int id : ids)
    if (!valid(layer, id)) fail("device expert cache: expert %d of layer %d does not exist", id, layer);
  poll_holds(false);
  std::vector<int>& where = where_[layer];
  std::vector<int>& owed = prepared_[layer];
  std::vector<size_t> marked;  // slots this call handed out: freed again if it fails
  try {
    // Hits first: they are marked in use so that the misses' evictions cannot take them. A hit
    // whose prepare() went to the source gives that prepare back (the source pinned it). A slot
    // prepare() filled for this acquire counts as a miss (its copy was made for it).
    std::vector<int> missing;  // distinct ids not in a slot
    std::vector<int> back;
    for (size_t i = 0; i < ids.size(); ++i) {
      const int s = where[static_cast<size_t>(ids[i])];
      if (s >= 0) {
        Slot& sl = slots_[s];
        if (!sl.in_use) marked.push_back(static_cast<size_t>(s));
        sl.in_use = true;
        sl.used = ++clock_;
        out[i] = sl.views;
        {
          std::lock_guard<std::mutex> lk(stats_mu_);
          ++(sl.early ? stats_.misses : stats_.hits);
        }
        sl.early = false;
        sl.reserved = false;
        if (auto it = std::find(owed.begin(), owed.end(), ids[i]); it != owed.end()) {
          owed.erase(it);
          back.push_back(ids[i]);
        }
      } else if (std::find(missing.begin(), missing.end(), ids[i]) == missing.end()) {
        missing.push_back(ids[i]);
      }
    }
    if (!back.empty()) source_->unprepare(layer, back);
    if (!missing.empty()) {
      for (int id : missing)  // the source's acquire takes over a forwarded prepare
        if (auto it = std::find(owed.begin(), owed.end(), id); it != owed.end()) owed.erase(it);
      std::vector<experts::ExpertWeights> host(missing.size());
      source_->acquire(layer, missing, host);
      try {
        for (size_t m = 0; m < missing.size(); ++m) {
          const size_t si = take_slot();
          fill(si, layer, missing[m], host[m]);
          slots_[si].in_use = true;
          marked.push_back(si);
          std::lock_guard<std::mutex> lk(stats_mu_);
          ++stats_.misses;
        }
      } catch (...) {
        be_.weight_copies_done(be_.weight_copy_fence(), true);  // nothing reads the source's views any more
        held_[layer] = 0;
        source_->release(layer);
        throw;
      }
      const uint64_t t = finish_fills(layer);
      for (int id : missing) slots_[where[static_cast<size_t>(id)]].ticket = t;
      for (size_t i = 0; i < ids.size(); ++i) out[i] = slots_[where[static_cast<size_t>(ids[i])]].views;
    }
    // The backend's later work (the expert kernels) runs after the copies of every slot handed out.
    uint64_t need = 0;
    for (int id : ids) need = std::max(need, slots_[where[static_cast<size_t>(id)]].ticket);
    if (need > waited_) {
      be_.wait_weight_copies(need);
      waited_ = need;
    }
  } catch (...) {
    for (size_t s : marked) slots_[s].in_use = false;
    throw;
  }
}

void DeviceExpertCache::release(int layer) {
  for (Slot& s : slots_)
    if (s.layer == layer) s.in_use = false;
  poll_holds(false);
  update_stall();
}

std::string DeviceExpertCache::describe() const {
  return strfmt("expert slots on %s: %zu of %s (%s) in front of %s", ops::device_name(be_.device()), slots_.size(),
                format_bytes(slot_bytes_).c_str(), format_bytes(slot_bytes_ * slots_.size()).c_str(), source_->describe().c_str());
}

}  // namespace spool::experts
