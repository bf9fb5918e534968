#include "experts/cache_sim.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace spool::experts {

CacheSim::CacheSim(int64_t capacity, int top_k, CachePolicyOptions policy)
    : capacity_(capacity), top_k_(top_k), policy_(policy), freq_(policy.half_life) {
  if (capacity < 1 || top_k < 1) fail("cache simulation: capacity %lld and top_k %d must be >= 1", (long long)capacity, top_k);
}

int CacheSim::max_batch() const { return static_cast<int>(std::max<int64_t>(top_k_, capacity_)); }

CacheSim::It CacheSim::insert(uint64_t k) {
  // ExpertCache::insert: while at capacity, evict (scanning from the LRU end, skipping pinned
  // entries) the least recently used, or kLfu's lowest score (the least recent of equal ones).
  while (static_cast<int64_t>(map_.size()) >= capacity_) {
    It victim = lru_.end();
    double best = 0;
    for (It it = lru_.end(); it != lru_.begin();) {
      --it;
      if (it->pins != 0) continue;
      if (policy_.policy == CachePolicy::kLru) {
        victim = it;
        break;
      }
      const double s = freq_.score(it->key);
      if (victim == lru_.end() || s < best) victim = it, best = s;
    }
    if (victim == lru_.end()) break;  // everything pinned: grow past capacity
    map_.erase(victim->key);
    lru_.erase(victim);
    ++evictions_;
  }
  lru_.push_front(Entry{k});
  map_[k] = lru_.begin();
  return lru_.begin();
}

void CacheSim::prepare(int layer, std::span<const int> ids) {
  // Cached experts pinned and touched first, so the new entries cannot evict them.
  const size_t most = std::min(ids.size(), static_cast<size_t>(max_batch()));
  std::vector<int> missing;
  for (size_t i = 0; i < most; ++i) {
    auto f = map_.find(key(layer, ids[i]));
    if (f == map_.end()) {
      missing.push_back(ids[i]);
      continue;
    }
    ++f->second->pins;
    touch(f->second);
    prepared_[layer].push_back(f->second);
  }
  for (int id : missing) {
    if (map_.count(key(layer, id))) continue;  // an id listed twice
    It e = insert(key(layer, id));
    e->prepared = true;
    ++e->pins;
    prepared_[layer].push_back(e);
  }
}

void CacheSim::acquire(int layer, std::span<const int> ids) {
  const uint64_t h0 = hits_, r0 = requests_;
  std::vector<It> entries;
  for (int id : ids) {
    ++requests_;
    if (policy_.policy == CachePolicy::kLfu) freq_.request(key(layer, id));  // StreamingExperts: ExpertCache::count
    auto f = map_.find(key(layer, id));
    It e;
    if (f != map_.end() && f->second->prepared) {  // read by prepare() for this acquire: a miss
      e = f->second;
      e->prepared = false;
    } else if (f != map_.end()) {
      e = f->second;
      ++hits_;
    } else {
      e = insert(key(layer, id));
    }
    ++e->pins;
    touch(e);
    entries.push_back(e);
  }
  if (record_) acquires.push_back({static_cast<int>(hits_ - h0), static_cast<int>((requests_ - r0) - (hits_ - h0))});
  auto& use = in_use_[layer];
  use.insert(use.end(), entries.begin(), entries.end());
  auto& prep = prepared_[layer];
  for (It e : entries) {  // acquire's own pin replaces prepare's
    auto p = std::find(prep.begin(), prep.end(), e);
    if (p == prep.end()) continue;
    prep.erase(p);
    --e->pins;
  }
}

void CacheSim::release(int layer) {
  auto& use = in_use_[layer];
  for (It e : use) --e->pins;
  use.clear();
}

void CacheSim::layer_step(int layer, std::span<const int> experts) {
  std::vector<int> active(experts.begin(), experts.end());  // ops::group_by_expert: ascending, distinct
  std::sort(active.begin(), active.end());
  active.erase(std::unique(active.begin(), active.end()), active.end());
  const size_t batch = static_cast<size_t>(max_batch());
  prepare(layer, std::span<const int>(active.data(), std::min(batch, active.size())));
  for (size_t b0 = 0; b0 < active.size(); b0 += batch) {
    acquire(layer, std::span<const int>(active.data() + b0, std::min(batch, active.size() - b0)));
    release(layer);
  }
}

DecodeTime model_decode_time(const TraceSimResult& sim, const DecodeTimeInputs& in) {
  if (in.disk_gbps <= 0 || in.mem_gbps <= 0 || in.n_seqs < 1 || sim.tokens <= 0) fail("decode time model: needs positive bandwidths, sequences and tokens");
  const double disk = in.disk_gbps * 1e9, mem = in.mem_gbps * 1e9;
  const double steps = static_cast<double>(sim.tokens) / in.n_seqs;
  double experts = 0;  // experts computed over all steps
  for (const SimAcquire& a : sim.acquires) experts += a.hits + a.misses;
  const double compute = in.compute_s + experts * in.expert_bytes / mem / steps;  // one step's
  const double pipelined = in.n_seqs > 1 ? compute / (2.0 * std::max(1, in.n_moe_layers)) : 0.0;
  double stall = 0, read = 0;
  for (const SimAcquire& a : sim.acquires) {
    const double overlap = (in.shared_bytes + (in.hits_first ? a.hits * in.expert_bytes : 0.0)) / mem + pipelined;
    const double t_read = a.misses * in.read_bytes / disk;
    stall += std::max(0.0, t_read - overlap);
    read += t_read;
  }
  DecodeTime d;
  d.stall_s_per_token = stall / static_cast<double>(sim.tokens);
  const double step = std::max(compute + stall / steps, read / steps);
  d.tok_s = step > 0 ? in.n_seqs / step : 0.0;
  return d;
}

int64_t tg_trace_token(int64_t n_tokens, int q, int n_seqs, int rep, int n_gen, int i) {
  const int64_t stride = n_seqs > 0 ? n_tokens / n_seqs : 0;
  const int64_t t = static_cast<int64_t>(q) * stride + static_cast<int64_t>(rep + 1) * n_gen + i;
  return n_tokens > 0 ? t % n_tokens : 0;
}

namespace {

// The distinct experts, ascending, that rows [q0, q1) of a step route to at `layer`.
std::vector<int> group_experts(const TraceMap& map, int layer, int top_k, int q0, int q1, int n_seqs, int rep, int n_gen, int i) {
  std::vector<int> ids(static_cast<size_t>(q1 - q0) * top_k);
  std::vector<float> w(top_k);
  for (int q = q0; q < q1; ++q)
    map.route(layer, tg_trace_token(map.trace().n_tokens, q, n_seqs, rep, n_gen, i),
              std::span<int>(ids.data() + static_cast<size_t>(q - q0) * top_k, top_k), w);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

}  // namespace

TraceSimResult simulate_tg(const TraceMap& map, int top_k, int64_t capacity, int n_gen, int reps, int n_seqs,
                           CachePolicyOptions policy, std::span<const ExpertCount> seed) {
  if (n_gen < 1 || reps < 1 || n_seqs < 1) fail("cache simulation: n_gen, reps and n_seqs must be >= 1");
  CacheSim sim(capacity, top_k, policy);
  for (const ExpertCount& s : seed) sim.seed(s.layer, s.expert, s.count);
  const std::vector<int>& layers = map.target_moe_layers();
  const size_t batch = static_cast<size_t>(sim.max_batch());
  for (int rep = -1; rep < reps; ++rep) {
    if (rep == 0) {
      sim.reset_counters();
      sim.record(true);
    }
    for (int i = 0; i < n_gen; ++i) {
      if (n_seqs == 1) {
        for (int layer : layers) sim.layer_step(layer, group_experts(map, layer, top_k, 0, 1, 1, rep, n_gen, i));
        continue;
      }
      // run_pipelined: group g's MoE layer = prepare (first batch), hand over, then on its next
      // turn acquire + release each batch. The turns: P0(l0) P1(l0) A0(l0) P0(l1) A1(l0) P1(l1) ...
      const int m = n_seqs / 2;
      const int q0[2] = {0, m}, q1[2] = {m, n_seqs};
      std::vector<int> pending[2];
      int pending_layer[2] = {-1, -1};
      auto finish = [&](int g) {  // the acquires of group g's prepared layer
        if (pending_layer[g] < 0) return;
        const std::vector<int>& a = pending[g];
        for (size_t b0 = 0; b0 < a.size(); b0 += batch) {
          sim.acquire(pending_layer[g], std::span<const int>(a.data() + b0, std::min(batch, a.size() - b0)));
          sim.release(pending_layer[g]);
        }
        pending_layer[g] = -1;
      };
      for (int layer : layers)
        for (int g = 0; g < 2; ++g) {
          finish(g);  // the group's previous MoE layer completes when its turn comes back
          pending[g] = group_experts(map, layer, top_k, q0[g], q1[g], n_seqs, rep, n_gen, i);
          pending_layer[g] = layer;
          sim.prepare(layer, std::span<const int>(pending[g].data(), std::min(batch, pending[g].size())));
        }
      finish(0);
      finish(1);
    }
  }
  TraceSimResult r;
  r.requests = sim.requests();
  r.hits = sim.hits();
  r.misses = sim.misses();
  r.tokens = static_cast<int64_t>(reps) * n_gen * n_seqs;
  r.acquires = std::move(sim.acquires);
  return r;
}

}  // namespace spool::experts
