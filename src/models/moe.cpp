#include "models/moe.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <cmath>

#include "common/error.h"
#include "common/log.h"
#include "dist/comm.h"
#include "dist/expert_parallel.h"
#include "ops/lora.h"
#include "models/bind.h"
#include "ops/cpu_backend.h"

namespace spool::models {

void MoeBlock::bind(const io::Checkpoint& ck, const std::string& prefix, const ModelSpec& spec) {
  m_ = spec.moe;
  hidden_ = spec.hidden_size;
  eps_ = spec.rms_norm_eps;
  const int64_t E = m_.n_experts;
  router_ = bind_matrix(ck, prefix + m_.router_weight, E, hidden_);
  if (m_.router_bias) {  // {router}.weight -> {router}.bias
    const std::string& w = m_.router_weight;
    const std::string base = w.ends_with(".weight") ? w.substr(0, w.size() - 7) : w;
    router_bias_ = bind_f32(ck, prefix + base + ".bias", {E});
    router_bias_p_ = router_bias_.data();
  }
  if (m_.expert_bias) {
    gate_up_bias_ = bind_f32(ck, prefix + "experts.gate_up_proj_bias", {E, 2 * static_cast<int64_t>(m_.intermediate)});
    down_bias_ = bind_f32(ck, prefix + "experts.down_proj_bias", {E, hidden_});
    gate_up_bias_p_ = gate_up_bias_.data();
    down_bias_p_ = down_bias_.data();
  }
  act_ = glu_activation(spec.activation);
  if ((act_ == ops::Activation::kClampedSwiGLU) != (m_.gate_up == GateUpLayout::kFusedInterleaved))
    fail("%s: the clamped SwiGLU experts need the interleaved fused gate_up layout and vice versa", ck.dir().c_str());
  if (m_.router_input_scale) {  // u = RMSNorm_noweight(r) * scale * H^-1/2: one norm weight
    router_norm_ = bind_f32(ck, prefix + "router.scale", {hidden_});
    const float root = 1.0f / std::sqrt(static_cast<float>(hidden_));
    for (float& w : router_norm_) w *= root;
    router_norm_p_ = router_norm_.data();
  }
  if (m_.per_expert_scale) expert_scale_ = bind_f32(ck, prefix + "router.per_expert_scale", {m_.n_experts});
  if (m_.score_bias) score_bias_ = bind_f32(ck, prefix + "gate.e_score_correction_bias", {m_.n_experts});
  score_bias_p_ = score_bias_.empty() ? nullptr : score_bias_.data();
  if (m_.shared_intermediate > 0) {
    shared_.bind(ck, prefix + m_.shared_name + ".", hidden_, m_.shared_intermediate, act_);
    if (m_.shared_expert_gate) shared_gate_ = bind_f32(ck, prefix + "shared_expert_gate.weight", {1, hidden_});
  }
  shared_gate_p_ = shared_gate_.empty() ? nullptr : shared_gate_.data();
  expert_lora_ = nullptr;
  if (lora::LoraSet* set = lora_binding()) {
    expert_lora_ = set->experts(prefix + "experts", m_.n_experts, hidden_, m_.intermediate);
    if (expert_lora_ != nullptr && m_.gate_up == GateUpLayout::kFusedInterleaved)
      fail("%s: LoRA on %sexperts: experts with an interleaved gate_up (gpt-oss) are not supported yet", ck.dir().c_str(),
           prefix.c_str());
  }
}

void MoeBlock::place(ops::Backend& be) {
  router_ = be.upload(router_);
  if (m_.router_input_scale) router_norm_p_ = be.upload_floats(router_norm_);
  if (m_.router_bias) router_bias_p_ = be.upload_floats(router_bias_);
  if (!score_bias_.empty()) score_bias_p_ = be.upload_floats(score_bias_);
  if (m_.expert_bias) {
    gate_up_bias_p_ = be.upload_floats(gate_up_bias_);
    down_bias_p_ = be.upload_floats(down_bias_);
  }
  if (shared_.bound()) shared_.place(be);
  if (!shared_gate_.empty()) shared_gate_p_ = be.upload_floats(shared_gate_);
}

MoeBlock::Scratch MoeBlock::Scratch::take(ops::Workspace& ws, const MoeSpec& m, int64_t H, int64_t T, int top_k) {
  Scratch s;
  s.logits = ws.floats(T * m.n_experts);
  s.ids = ws.ints(T * top_k);
  s.ids_device = reinterpret_cast<int*>(ws.floats(T * top_k));
  s.weights = ws.floats(T * top_k);
  s.margins = ws.floats(T);
  // (+ T rows for the shared expert's output where forward() folds it into the routed experts' call:
  // decode-sized calls, T (top_k + 1) <= ops::kSplitRows)
  s.y = ws.floats((T * top_k + (m.shared_intermediate > 0 && T * (top_k + 1) <= ops::kSplitRows ? T : 0)) * H);
  if (m.router_input_scale) s.router_in = ws.floats(T * H);
  if (m.shared_intermediate > 0) {
    s.shared = ws.floats(T * H);
    s.shared_mlp = DenseMlp::Scratch::take(ws, T, m.shared_intermediate);
  }
  return s;
}

std::vector<int> best_first_union(std::span<const int> ranked, int64_t T, int m, int n_experts) {
  std::vector<char> seen(static_cast<size_t>(n_experts), 0);
  std::vector<int> ids;
  for (int r = 0; r < m; ++r)
    for (int64_t t = 0; t < T; ++t) {
      const int e = ranked[static_cast<size_t>(t * m + r)];
      if (e >= 0 && e < n_experts && !seen[e]) seen[e] = 1, ids.push_back(e);
    }
  return ids;
}

void MoeBlock::router_logits(const float* x, int64_t T, ops::Backend& be, float* out) const {
  if (m_.router_input_scale) fail("MoeBlock: this router reads the residual stream; it has no logits of the FFN input");
  be.matmul(router_, x, T, out);
  if (router_bias_p_ != nullptr) be.add_bias(out, router_bias_p_, T, m_.n_experts);
}

void MoeBlock::selection_scores(const float* x, int64_t T, ops::Backend& be, float* out) const {
  const int E = m_.n_experts;
  router_logits(x, T, be, out);
  if (!sigmoid_router()) return;
  for (int64_t i = 0; i < T * E; ++i)
    out[i] = 1.0f / (1.0f + std::exp(-out[i])) + (score_bias_.empty() ? 0.0f : score_bias_[i % E]);
}

std::vector<int> MoeBlock::predict(const float* x, int64_t T, int m, ops::Backend& be) const {
  const int E = m_.n_experts;
  if (m_.router_input_scale || T <= 0 || m <= 0) return {};
  std::vector<float> logits(static_cast<size_t>(T * E));
  selection_scores(x, T, be, logits.data());
  std::vector<int> order(static_cast<size_t>(E)), ranked(static_cast<size_t>(T * std::min(m, E)));
  const int mm = std::min(m, E);
  for (int64_t t = 0; t < T; ++t) {
    const float* l = logits.data() + t * E;
    for (int e = 0; e < E; ++e) order[e] = e;
    std::partial_sort(order.begin(), order.begin() + mm, order.end(), [&](int a, int b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    std::copy_n(order.begin(), mm, ranked.begin() + t * mm);
  }
  return best_first_union(ranked, T, mm, E);
}

ops::RouterParams MoeBlock::router_params() const {
  ops::RouterParams r;  // sigmoid / softmax scores, selection bias, groups, scaling
  r.sigmoid = m_.score == RouterScore::kSigmoid;
  r.bias = score_bias_p_;
  r.n_group = m_.selection == RouterSelection::kGroupedTopK ? m_.n_group : 1;
  r.topk_group = m_.selection == RouterSelection::kGroupedTopK ? m_.topk_group : 1;
  r.group_top2_sum = m_.group_top2_sum;
  r.mask_neg_inf = m_.group_mask_neg_inf;
  r.renormalize = m_.norm_topk_prob;
  r.scaling = m_.routed_scaling_factor;
  return r;
}

namespace {
void announce(const dist::ExpertParallel& ep, int layer, const float* x, int64_t T, int K, int64_t H, const int* ids, bool expert_lora);
}  // namespace

void MoeBlock::forward(const float* x, int64_t T, int layer, int top_k, experts::ExpertProvider& provider,
                       const RouteObserver& observer, const MarginObserver& margins, float* out, ops::Backend& be,
                       ops::Workspace& ws, const std::function<void()>& between, const float* residual,
                       const RouteOverride* route_override, int64_t row0,
                       const std::function<void()>* after_prepare, const RouteWithin* within, const dist::ExpertParallel* epp) const {
  ops::WorkspaceScope scope(ws);
  const int E = m_.n_experts, K = top_k, H = hidden_;
  const Scratch s = Scratch::take(ws, m_, H, T, K);
  if (m_.router_input_scale) {
    if (residual == nullptr) fail("MoeBlock: this router reads the residual stream, and none was given");
    be.rms_norm(residual, router_norm_p_, T, H, eps_, s.router_in);
    be.matmul(router_, s.router_in, T, s.logits);  // [T, E]
  } else {
    be.matmul(router_, x, T, s.logits);  // [T, E]
  }
  if (router_bias_p_ != nullptr) be.add_bias(s.logits, router_bias_p_, T, E);
  const bool restricted = within != nullptr && within->layer == layer;
  if (restricted) {  // --route-by-predictor: only the listed experts stay selectable
    if (be.device() != ops::Device::kCpu) fail("MoeBlock: routing restricted to predicted experts runs on CPU backends only");
    if (!can_route_within()) fail("MoeBlock: layer %d's router cannot be restricted to predicted experts (selection bias or residual-stream input)", layer);
    if (within->k < K || static_cast<int64_t>(within->ids.size()) < T * within->k)
      fail("MoeBlock: layer %d's predicted experts do not cover its %lld rows of %d experts", layer, (long long)T, K);
    std::vector<char> keep(static_cast<size_t>(E));
    for (int64_t t = 0; t < T; ++t) {
      std::fill(keep.begin(), keep.end(), 0);
      for (int i = 0; i < within->k; ++i) {
        const int e = within->ids[static_cast<size_t>(t * within->k + i)];
        if (e < 0 || e >= E) fail("MoeBlock: predicted expert %d of layer %d is outside 0..%d", e, layer, E - 1);
        keep[e] = 1;
      }
      float* l = s.logits + t * E;
      for (int e = 0; e < E; ++e)
        if (!keep[e]) l[e] = -1e30f;  // finite: softmax gives 0, sigmoid gives 0, group sums stay finite
    }
  }
  // Experts the backend reaches through a device table (every expert uploaded to a GPU): routing
  // ids and weights stay on the device and the experts run from there (no host round trip).
  // Any router (softmax top-k, or the general one of route_grouped_top_k), SwiGLU experts without biases.
  const bool plain = !m_.expert_bias && !m_.per_expert_scale && act_ == ops::Activation::kSwiGLU;
  const bool forced = route_override != nullptr && *route_override;
  const bool ep = epp != nullptr && epp->active();  // expert parallelism: this rank's experts only
  // (A GPU backend's rows are device memory: its communicator must move device memory, NcclComm.)
  const bool ep_device = ep && be.device() != ops::Device::kCpu;
  if (ep && ep_device != epp->comm->device_memory())
    fail("MoeBlock: expert parallelism on the %s backend with the %s communicator (%s memory): use --comm %s", ops::device_name(be.device()),
         epp->comm->name(), epp->comm->device_memory() ? "device" : "host", ep_device ? "nccl" : "mpi");
  if (ep_device && epp->lead) fail("MoeBlock: a leading rank 0 (serve over ranks) runs on CPU backends");
  const void* table = ep || margins || observer || forced || restricted || !plain || expert_lora_ != nullptr ? nullptr : provider.device_table(layer);
  if (table != nullptr && T * K <= be.max_routed_pairs()) {
    if (m_.general_router()) {
      be.route_grouped_top_k(s.logits, T, E, K, router_params(), s.ids_device, s.weights, nullptr);
    } else {
      be.route_softmax_top_k(s.logits, T, E, K, m_.norm_topk_prob, s.ids_device, s.weights, nullptr);
    }
    // The shared expert joins the routed experts' launches where the backend takes it (the same
    // bits as its own forward; a decode step saves its four launches).
    const ops::ExpertMats sm = shared_.bound() ? shared_.mats() : ops::ExpertMats{};
    const bool fused = shared_.bound() && be.routed_takes_shared(table, sm, T);
    if (shared_.bound() && !fused) shared_.forward(x, T, s.shared, be, s.shared_mlp);
    if (between) between();
    be.expert_ffn_routed(table, x, T, H, s.ids_device, s.weights, K, out, fused ? &sm : nullptr, fused ? s.shared : nullptr);
    if (shared_.bound()) be.add_gated_rows(out, s.shared, x, shared_gate_p_, T, H);
    return;
  }
  if (m_.general_router()) {
    be.route_grouped_top_k(s.logits, T, E, K, router_params(), s.ids, s.weights, margins ? s.margins : nullptr);
  } else {
    be.route_softmax_top_k(s.logits, T, E, K, m_.norm_topk_prob, s.ids, s.weights, margins ? s.margins : nullptr);
  }
  if (m_.per_expert_scale) be.mul_indexed(s.weights, s.ids, expert_scale_.data(), T * K);  // after the renormalisation
  if (forced) {  // the caller's routing replaces the router's (weights through host memory)
    std::vector<float> wh(static_cast<size_t>(T * K));
    be.to_host(s.weights, T * K, wh.data());
    for (int64_t t = 0; t < T; ++t) {
      int* ids = s.ids + t * K;
      (*route_override)(layer, row0 + t, std::span<int>(ids, K), std::span<float>(wh.data() + t * K, K));
      for (int i = 0; i < K; ++i) {
        if (ids[i] < 0 || ids[i] >= E) fail("forced routing: expert %d of layer %d is outside 0..%d", ids[i], layer, E - 1);
        for (int j = 0; j < i; ++j)
          if (ids[j] == ids[i]) fail("forced routing: expert %d of layer %d chosen twice for one token", ids[i], layer);
      }
    }
    be.row_to_f32(ops::WType::kF32, wh.data(), T * K, s.weights);
  }
  if (margins || observer) {
    // Observers get host memory: on a GPU backend the weights and margins are copied down.
    const float* wts = s.weights;
    const float* mgs = s.margins;
    std::vector<float> wh, mh;
    if (be.device() != ops::Device::kCpu) {
      wh.resize(static_cast<size_t>(T * K));
      be.to_host(s.weights, T * K, wh.data());
      wts = wh.data();
      if (margins) {
        mh.resize(static_cast<size_t>(T));
        be.to_host(s.margins, T, mh.data());
        mgs = mh.data();
      }
    }
    for (int64_t t = 0; t < T; ++t) {
      if (margins) margins(layer, row0 + t, mgs[t]);
      if (observer) observer(layer, row0 + t, std::span<const int>(s.ids + t * K, K), std::span<const float>(wts + t * K, K));
    }
  }

  // Expert path: pairs grouped by expert (ascending id); experts acquired in batches the
  // provider can hold at once (a streaming cache may be smaller than a prefill chunk's expert
  // set), each batch released before the next.
  const ops::ExpertGroups groups = ops::group_by_expert(s.ids, T, K, E);
  if (ep) {  // this rank's experts' rows, every rank's gathered (run_owned), then the one-process combine
    if (epp->lead) announce(*epp, layer, x, T, K, H, s.ids, expert_lora_ != nullptr);
    const std::function<void()> while_reading = [&] {
      if (after_prepare != nullptr && *after_prepare) (*after_prepare)();
      if (shared_.bound()) shared_.forward(x, T, s.shared, be, s.shared_mlp);
      if (between) between();
    };
    ops::ExpertGroups rank_order;  // (device: the rows as gathered, rank by rank)
    run_owned(groups, x, layer, provider, be, s.y, *epp, while_reading, nullptr, ep_device ? &rank_order : nullptr);
    be.moe_combine(s.y, ep_device ? rank_order : groups, s.weights, H, out);
    if (shared_.bound()) be.add_gated_rows(out, s.shared, x, shared_gate_p_, T, H);
    return;
  }
  const size_t a_lo = 0, a_hi = groups.active.size();
  const size_t batch = static_cast<size_t>(std::max(1, provider.max_batch()));
  // On a CPU backend with every expert in memory (no reads to hide) the shared expert runs as one
  // more expert, with every token's row, in the routed experts' expert_ffn call: the same kernels
  // on the same inputs (the bits of its own forward), and a decode step's MoE layer takes two jobs
  // for all its experts instead of five (ops::CpuBackend::expert_ffn). Decode-sized calls only (the
  // split path's ops::kSplitRows rows): in a prefill the shared expert's T rows would be one task on one thread
  // (its own forward splits them over the pool) and that thread's expert scratch would grow to T rows
  // of the shared expert's width, more than the planner's workspace terms count
  // (ops::expert_ffn_thread_bytes of the routed width). Not with expert parallelism: the shared
  // expert's group would follow the last active expert, not this rank's range.
  const ops::ExpertMats shared_mats = shared_.bound() ? shared_.mats() : ops::ExpertMats{};
  const bool fold_shared = shared_.bound() && be.device() == ops::Device::kCpu && provider.in_memory() && !between && !ep && T * (K + 1) <= ops::kSplitRows &&
                           groups.active.size() <= batch && act_ != ops::Activation::kClampedSwiGLU && shared_mats.gate.lora == nullptr &&
                           shared_mats.up.lora == nullptr && shared_mats.down.lora == nullptr;
  float* shared_out = fold_shared ? s.y + T * K * H : s.shared;
  // A streaming provider starts reading the first batch's misses now; the shared expert
  // (and whatever `between` runs: another group of sequences) computes while they load.
  const std::span<const int> first(groups.active.data() + a_lo, std::min(batch, a_hi - a_lo));
  provider.prepare(layer, first);
  try {
    if (after_prepare != nullptr && *after_prepare) (*after_prepare)();
    if (shared_.bound() && !fold_shared) shared_.forward(x, T, s.shared, be, s.shared_mlp);
    if (between) between();
  } catch (...) {
    provider.unprepare(layer, first);
    throw;
  }
  std::vector<experts::ExpertWeights> w(std::min(batch, a_hi - a_lo) + (fold_shared ? 1 : 0));
  ops::ExpertGroups with_shared;  // groups plus the shared expert's group: rows t * K for every token t
  if (fold_shared) {
    with_shared = groups;
    with_shared.active.push_back(E);
    with_shared.first.push_back(with_shared.first.back() + T);
    for (int64_t t = 0; t < T; ++t) with_shared.rows.push_back(t * K);
  }
  // Sets the LoRA terms and biases of w[j] for expert `e` (resident, whatever the provider).
  auto bind_extras = [&](experts::ExpertWeights& wj, int e) {
    if (expert_lora_ != nullptr) {
      wj.gate.lora = expert_lora_->gate_of(e);
      wj.up.lora = expert_lora_->up_of(e);
      wj.down.lora = expert_lora_->down_of(e);
    }
    if (m_.expert_bias) {  // the experts' biases: rows of the layer's resident bias tables
      const int64_t I2 = 2 * static_cast<int64_t>(m_.intermediate);
      wj.gate_bias = gate_up_bias_p_ + e * I2;
      wj.down_bias = down_bias_p_ + static_cast<int64_t>(e) * H;
    }
  };
  // Hits first (ExpertProvider::compute_while_reading): begin_acquire() hands out the experts of
  // a batch already in memory, which compute while the batch's misses are still being read;
  // finish_acquire() waits for the misses, which compute then. Each expert's rows
  // of s.y depend on that expert and its rows only, so the order changes no bit.
  const bool hits_first = provider.compute_while_reading() && !fold_shared && !ep && be.device() == ops::Device::kCpu;
  std::vector<uint8_t> got;
  std::vector<experts::ExpertWeights> w2;
  for (size_t b0 = a_lo; b0 < a_hi; b0 += batch) {
    const size_t nb = std::min(batch, a_hi - b0);
    const std::span<const int> ids(groups.active.data() + b0, nb);
    if (hits_first) {
      got.assign(nb, 0);
      try {
        provider.begin_acquire(layer, ids, std::span<experts::ExpertWeights>(w.data(), nb), got);
      } catch (...) {
        provider.release(layer);
        throw;
      }
      const size_t n_avail = static_cast<size_t>(std::count(got.begin(), got.end(), uint8_t{1}));
      if (n_avail > 0 && n_avail < nb) {
        try {
          // The two parts as groups of their own, available then the rest, each computed into
          // `tmp` (rows in the part's order) and copied to the rows of s.y the whole grouping has.
          ops::ExpertGroups part[2];
          std::vector<int64_t> pos[2];  // [part] row position in s.y of each of the part's rows
          std::vector<int> rest;
          w2.clear();
          std::vector<experts::ExpertWeights> wa;
          for (int pass = 0; pass < 2; ++pass) {
            ops::ExpertGroups& g = part[pass];
            g.T = groups.T, g.K = groups.K;
            g.first.push_back(0);
            for (size_t j = 0; j < nb; ++j) {
              if ((got[j] != 0) != (pass == 0)) continue;
              const size_t gi = b0 + j;
              g.active.push_back(groups.active[gi]);
              g.rows.insert(g.rows.end(), groups.rows.begin() + groups.first[gi], groups.rows.begin() + groups.first[gi + 1]);
              for (int64_t r = groups.first[gi]; r < groups.first[gi + 1]; ++r) pos[pass].push_back(r);
              g.first.push_back(static_cast<int64_t>(g.rows.size()));
              if (pass == 0) {
                wa.push_back(w[j]);
                bind_extras(wa.back(), groups.active[gi]);
              } else {
                rest.push_back(groups.active[gi]);
              }
            }
          }
          thread_local std::vector<float> tmp;
          auto scatter = [&](int pass) {
            for (size_t r = 0; r < pos[pass].size(); ++r)
              std::copy_n(tmp.data() + r * static_cast<size_t>(H), H, s.y + pos[pass][r] * H);
          };
          tmp.resize(std::max(pos[0].size(), pos[1].size()) * static_cast<size_t>(H));
          be.expert_ffn(std::span<const ops::ExpertMats>(wa.data(), wa.size()), part[0], 0, x, H, act_, tmp.data());
          scatter(0);
          provider.finish_acquire(layer, ids, std::span<experts::ExpertWeights>(w.data(), nb), got);
          for (size_t j = 0; j < nb; ++j)
            if (!got[j]) w2.push_back(w[j]);
          for (size_t j = 0; j < rest.size(); ++j) bind_extras(w2[j], rest[j]);
          be.expert_ffn(std::span<const ops::ExpertMats>(w2.data(), w2.size()), part[1], 0, x, H, act_, tmp.data());
          scatter(1);
        } catch (...) {
          provider.release(layer);
          throw;
        }
        provider.release(layer);
        continue;
      }
      {  // every expert in memory, or none: one call after the wait, as below
        try {
          provider.finish_acquire(layer, ids, std::span<experts::ExpertWeights>(w.data(), nb), got);
          for (size_t j = 0; j < nb; ++j) bind_extras(w[j], groups.active[b0 + j]);
          be.expert_ffn(std::span<const ops::ExpertMats>(w.data(), nb), groups, b0, x, H, act_, s.y);
        } catch (...) {
          provider.release(layer);
          throw;
        }
        provider.release(layer);
        continue;
      }
    }
    provider.acquire(layer, ids, std::span<experts::ExpertWeights>(w.data(), nb));
    for (size_t j = 0; j < nb; ++j) bind_extras(w[j], groups.active[b0 + j]);
    try {
      if (fold_shared) {  // (one batch: every active expert)
        w[nb] = shared_mats;
        be.expert_ffn(std::span<const ops::ExpertMats>(w.data(), nb + 1), with_shared, b0, x, H, act_, s.y);
      } else {
        be.expert_ffn(std::span<const ops::ExpertMats>(w.data(), nb), groups, b0, x, H, act_, s.y);
      }
    } catch (...) {
      provider.release(layer);
      throw;
    }
    provider.release(layer);
  }

  // out[t] = sum over the token's experts in routing-rank order (best first) of w * y.
  // (HF adds in ascending expert id; rank order differs only by float rounding and makes
  // the result independent of how experts are numbered, so a repacked checkpoint whose
  // experts and router rows are permuted together gives bit-identical output.)
  be.moe_combine(s.y, groups, s.weights, H, out);
  if (shared_.bound()) be.add_gated_rows(out, shared_out, x, shared_gate_p_, T, H);
}

namespace {

// The leader's announcement of one MoE layer (ExpertParallel::lead): the step descriptor, then
// the input rows, the routing and the rows' LoRA scales. An MPI error here leaves the ranks out
// of step: every rank's process ends (Comm::abort).
void announce(const dist::ExpertParallel& ep, int layer, const float* x, int64_t T, int K, int64_t H, const int* ids, bool expert_lora) {
  const ops::LoraRowScales* lr = expert_lora ? ops::lora_rows() : nullptr;
  if (lr != nullptr && lr->rows < T) lr = nullptr;  // (not this step's rows: the defaults)
  dist::ExpertStep st;
  st.op = dist::StepOp::kExperts;
  st.layer = layer;
  st.rows = T;
  st.top_k = K;
  st.hidden = H;
  st.lora_n = lr != nullptr ? lr->n_adapters : 0;
  try {
    std::array<int64_t, dist::ExpertStep::kWords> w = st.encode();
    ep.comm->broadcast_idle(w.data(), sizeof(w), 0);
    ep.comm->broadcast(const_cast<float*>(x), static_cast<size_t>(T * H) * sizeof(float), 0);
    ep.comm->broadcast(const_cast<int*>(ids), static_cast<size_t>(T * K) * sizeof(int), 0);
    if (lr != nullptr) ep.comm->broadcast(const_cast<float*>(lr->scales), static_cast<size_t>(T * lr->n_adapters) * sizeof(float), 0);
  } catch (const std::exception& e) {
    log_warn("expert parallelism: announcing MoE layer %d to the other ranks failed (%s); ending every rank", layer, e.what());
    ep.comm->abort(1);
  }
}

}  // namespace

void MoeBlock::run_owned(const ops::ExpertGroups& groups, const float* x, int layer, experts::ExpertProvider& provider, ops::Backend& be,
                         float* y, const dist::ExpertParallel& ep, const std::function<void()>& while_reading, std::exception_ptr failed,
                         ops::ExpertGroups* rank_order) const {
  dist::Comm& comm = *ep.comm;
  const int me = comm.rank(), R = comm.size(), E = m_.n_experts;
  const int64_t H = hidden_, total = groups.T * groups.K;
  // This rank's experts' pairs as groups of their own (ascending experts, rows from 0), and every
  // rank's row count (all ranks compute all of them: the gather's expected layout).
  ops::ExpertGroups mine;
  mine.T = groups.T;
  mine.K = groups.K;
  mine.first.push_back(0);
  std::vector<int64_t> want(static_cast<size_t>(R), 0);
  int64_t r0 = -1;  // the first row of s.y this rank's rows start at (contiguous owners)
  for (size_t a = 0; a < groups.active.size(); ++a) {
    const int e = groups.active[a];
    const int o = ep.owner(layer, e, E);
    const int64_t n = groups.first[a + 1] - groups.first[a];
    want[static_cast<size_t>(o)] += n;
    if (o != me) continue;
    if (r0 < 0) r0 = groups.first[a];
    mine.active.push_back(e);
    mine.rows.insert(mine.rows.end(), groups.rows.begin() + groups.first[a], groups.rows.begin() + groups.first[a + 1]);
    mine.first.push_back(static_cast<int64_t>(mine.rows.size()));
  }
  const int64_t n_mine = static_cast<int64_t>(mine.rows.size());
  // Contiguous owners: each rank's rows are one range of y in rank order, gathered in place.
  // A map: this rank's rows go to a buffer of their own, and the gathered rows are put back
  // where one process has them.
  // (rank_order: always in place, in rank order; the combine follows that order.)
  const bool in_place = ep.owners == nullptr || ep.owners->contiguous() || rank_order != nullptr;
  if (r0 < 0 || rank_order != nullptr) {
    r0 = 0;
    for (int r = 0; r < me; ++r) r0 += want[static_cast<size_t>(r)];
  }
  thread_local std::vector<float> own_rows, gathered;
  if (!in_place) own_rows.resize(static_cast<size_t>(n_mine * H));
  float* dst = in_place ? y + r0 * H : own_rows.data();
  if (!failed) {
    try {
      const size_t batch = static_cast<size_t>(std::max(1, provider.max_batch()));
      const std::span<const int> first(mine.active.data(), std::min(batch, mine.active.size()));
      provider.prepare(layer, first);
      try {
        if (while_reading) while_reading();
      } catch (...) {
        provider.unprepare(layer, first);
        throw;
      }
      std::vector<experts::ExpertWeights> w(std::min(batch, mine.active.size()));
      for (size_t b0 = 0; b0 < mine.active.size(); b0 += batch) {
        const size_t nb = std::min(batch, mine.active.size() - b0);
        provider.acquire(layer, std::span<const int>(mine.active.data() + b0, nb), std::span<experts::ExpertWeights>(w.data(), nb));
        for (size_t j = 0; j < nb; ++j) {
          const int e = mine.active[b0 + j];
          if (expert_lora_ != nullptr) {
            w[j].gate.lora = expert_lora_->gate_of(e);
            w[j].up.lora = expert_lora_->up_of(e);
            w[j].down.lora = expert_lora_->down_of(e);
          }
          if (m_.expert_bias) {
            w[j].gate_bias = gate_up_bias_p_ + static_cast<int64_t>(e) * 2 * static_cast<int64_t>(m_.intermediate);
            w[j].down_bias = down_bias_p_ + static_cast<int64_t>(e) * H;
          }
        }
        try {
          be.expert_ffn(std::span<const ops::ExpertMats>(w.data(), nb), mine, b0, x, H, act_, dst);
        } catch (...) {
          provider.release(layer);
          throw;
        }
        provider.release(layer);
      }
    } catch (...) {
      failed = std::current_exception();
    }
  }
  // The gather, whatever happened here: a failed rank sends no rows, so every rank sees counts
  // that do not add up and throws (none is left waiting in a collective).
  const auto mismatch = [&](const char* what) {
    if (failed) std::rethrow_exception(failed);
    fail("expert parallelism: MoE layer %d: the ranks' expert rows do not add up (%s): another rank failed computing its experts (see "
         "its log), or the ranks do not run the same model and inputs",
         layer, what);
  };
  if (in_place) {
    try {
      comm.allgather_rows_in_place(y, r0, failed ? 0 : n_mine, total, H);
    } catch (const Error& e) {
      mismatch(e.what());
    }
    if (rank_order != nullptr && !failed) {  // groups in the gathered order: rank by rank, each rank's experts ascending
      ops::ExpertGroups& g = *rank_order;
      g.T = groups.T;
      g.K = groups.K;
      g.active.clear();
      g.rows.clear();
      g.first.assign(1, 0);
      for (int r = 0; r < R; ++r)
        for (size_t a = 0; a < groups.active.size(); ++a) {
          if (ep.owner(layer, groups.active[a], E) != r) continue;
          g.active.push_back(groups.active[a]);
          g.rows.insert(g.rows.end(), groups.rows.begin() + groups.first[a], groups.rows.begin() + groups.first[a + 1]);
          g.first.push_back(static_cast<int64_t>(g.rows.size()));
        }
      g.row_of.assign(g.rows.size(), 0);
      for (size_t i = 0; i < g.rows.size(); ++i) g.row_of[static_cast<size_t>(g.rows[i])] = static_cast<int64_t>(i);
    }
  } else {
    const std::vector<int64_t> got = comm.allgather_rows(own_rows.data(), failed ? 0 : n_mine, H, gathered);
    if (got != want) mismatch("row counts per rank");
    // Rank r's rows are its experts' in ascending order; each expert's rows go back to its group.
    std::vector<const float*> from(static_cast<size_t>(R));
    const float* at = gathered.data();
    for (int r = 0; r < R; ++r) {
      from[static_cast<size_t>(r)] = at;
      at += want[static_cast<size_t>(r)] * H;
    }
    for (size_t a = 0; a < groups.active.size(); ++a) {
      const int o = ep.owner(layer, groups.active[a], E);
      const int64_t n = groups.first[a + 1] - groups.first[a];
      std::memcpy(y + groups.first[a] * H, from[static_cast<size_t>(o)], static_cast<size_t>(n * H) * sizeof(float));
      from[static_cast<size_t>(o)] += n * H;
    }
  }
  if (failed) std::rethrow_exception(failed);
}

void MoeBlock::serve_step(const float* x, const int* ids, int64_t T, int K, const float* lora, int lora_n, int layer,
                          experts::ExpertProvider& provider, ops::Backend& be, ops::Workspace& ws, const dist::ExpertParallel& ep) const {
  ops::WorkspaceScope scope(ws);
  std::exception_ptr failed;
  ops::ExpertGroups groups;
  float* y = nullptr;
  try {
    if (K < 1 || K > m_.top_k) fail("expert step: %d experts per row (the model routes to %d)", K, m_.top_k);
    groups = ops::group_by_expert(ids, T, K, m_.n_experts);
    y = ws.floats(T * K * hidden_);
  } catch (...) {
    failed = std::current_exception();
    groups = ops::ExpertGroups{};
    groups.T = T;
    groups.K = std::max(K, 1);
    groups.first.push_back(0);
  }
  const ops::LoraRowScales rows{lora, T, lora_n};
  const ops::LoraRowsScope lora_scope(lora != nullptr && lora_n > 0 ? &rows : nullptr);
  run_owned(groups, x, layer, provider, be, y, ep, {}, failed);
}

}  // namespace spool::models
